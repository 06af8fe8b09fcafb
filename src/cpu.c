/* CPU feature detection (one CPUID/XGETBV read per process on x86-64, one getauxval read on
 * aarch64 Linux) and the application's explicit AMX opt-in (docs/serving.md, "Dtypes and
 * precision"): the library never requests AMX permission on its own. */
#include "cpu.h"
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h> /* sysconf (sdpa__online_cpus) */

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define SDPA__X86 1
#include <cpuid.h>
#endif

#if defined(__linux__) && defined(__aarch64__)
#define SDPA__ARM64 1
#include <sys/auxv.h> /* getauxval; the HWCAP bits are the kernel's ABI (asm/hwcap.h) */
#define SDPA__HWCAP_FP (1ul << 0)
#define SDPA__HWCAP_ASIMD (1ul << 1)
#define SDPA__HWCAP_FPHP (1ul << 9)
#define SDPA__HWCAP_ASIMDHP (1ul << 10)
#define SDPA__HWCAP_ASIMDDP (1ul << 20)
#define SDPA__HWCAP2_BF16 (1ul << 14)
#endif

#if defined(__linux__) && defined(SDPA__X86)
#include <sys/syscall.h>
#include <unistd.h>
#define SDPA__ARCH_GET_XCOMP_PERM 0x1022
#define SDPA__ARCH_REQ_XCOMP_PERM 0x1023
#define SDPA__XFEATURE_XTILEDATA 18
#endif

static sdpa__cpu cpu_features;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

#if defined(SDPA__X86)
static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void detect(void) {
    sdpa__cpu c;
    memset(&c, 0, sizeof c);
#if defined(SDPA__X86)
    unsigned a, b, cx, d;
    if (__get_cpuid(0, &a, &b, &cx, &d) == 0) {
        cpu_features = c;
        return;
    }
    const unsigned max_leaf = a;
    if (__get_cpuid(1, &a, &b, &cx, &d) == 0) {
        cpu_features = c;
        return;
    }
    const bool osxsave = (cx >> 27) & 1u, avx = (cx >> 28) & 1u;
    const bool fma = (cx >> 12) & 1u, f16c = (cx >> 29) & 1u;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    const bool os_ymm = (xcr0 & 0x6u) == 0x6u;                 /* XMM | YMM */
    const bool os_zmm = os_ymm && (xcr0 & 0xE0u) == 0xE0u;     /* opmask | ZMM_Hi256 | Hi16_ZMM */
    const bool os_tile = (xcr0 & 0x60000u) == 0x60000u;        /* XTILECFG | XTILEDATA */
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        b7 = b;
        c7 = cx;
        d7 = d;
        const unsigned max_sub = a;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, cx, d);
            a71 = a;
        }
    }
    if (avx && os_ymm) {
        c.fma = fma;
        c.f16c = f16c;
        c.avx2 = (b7 >> 5) & 1u;
    }
    if (os_zmm) {
        c.avx512f = (b7 >> 16) & 1u;
        c.avx512bw = c.avx512f && ((b7 >> 30) & 1u);
        c.avx512vl = c.avx512f && ((b7 >> 31) & 1u);
        c.avx512bf16 = c.avx512f && ((a71 >> 5) & 1u);
        c.avx512fp16 = c.avx512f && ((d7 >> 23) & 1u);
        c.avx512vnni = c.avx512f && ((c7 >> 11) & 1u);
    }
    if (os_tile) {
        c.amx_tile = (d7 >> 24) & 1u;
        c.amx_bf16 = c.amx_tile && ((d7 >> 22) & 1u);
    }
#endif
#if defined(SDPA__ARM64)
    /* Linux reports what the CPU has and the kernel enables (the SIMD registers are always
     * saved on aarch64): no instruction is probed. */
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    c.asimd = (hw & SDPA__HWCAP_FP) && (hw & SDPA__HWCAP_ASIMD);
    c.fp16 = c.asimd && (hw & SDPA__HWCAP_FPHP) && (hw & SDPA__HWCAP_ASIMDHP);
    c.bf16 = c.asimd && (hw2 & SDPA__HWCAP2_BF16);
    c.dotprod = c.asimd && (hw & SDPA__HWCAP_ASIMDDP);
#endif
    cpu_features = c;
}

const sdpa__cpu *sdpa__cpu_features(void) {
    pthread_once(&cpu_once, detect);
    return &cpu_features;
}

bool sdpa__cpu_has_isa(int isa) {
    const sdpa__cpu *c = sdpa__cpu_features();
    switch (isa) {
    case SDPA__ISA_PORTABLE: return true;
    case SDPA__ISA_AVX2: return c->avx2 && c->fma && c->f16c;
    case SDPA__ISA_AVX512: return c->avx2 && c->fma && c->f16c && c->avx512f && c->avx512bw && c->avx512vl;
    case SDPA__ISA_NEON: return c->asimd;
    default: return false;
    }
}

const char *sdpa__isa_name(int isa) {
    switch (isa) {
    case SDPA__ISA_PORTABLE: return "portable";
    case SDPA__ISA_AVX2: return "avx2";
    case SDPA__ISA_AVX512: return "avx512";
    case SDPA__ISA_NEON: return "neon";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------- AMX */

#if defined(__linux__) && defined(SDPA__X86)
/* Permission, once granted, lasts for the life of the process: remember a positive answer. */
static atomic_int amx_granted;

static bool amx_permitted(void) {
    if (atomic_load_explicit(&amx_granted, memory_order_acquire))
        return true;
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, SDPA__ARCH_GET_XCOMP_PERM, &mask) != 0)
        return false;
    if ((mask >> SDPA__XFEATURE_XTILEDATA) & 1ul) {
        atomic_store_explicit(&amx_granted, 1, memory_order_release);
        return true;
    }
    return false;
}
#endif

SDPA_API sdpa_status sdpa_request_amx(void) {
    static const char fn[] = "sdpa_request_amx";
    sdpa__clear_error();
    const sdpa__cpu *c = sdpa__cpu_features();
    if (!c->amx_tile || !c->amx_bf16)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: this CPU lacks AMX (CPUID leaf 7 EDX: AMX-TILE bit 24, AMX-BF16 bit 22, with "
                          "XTILECFG/XTILEDATA enabled in XCR0); AMX kernels are not used",
                          fn);
#if defined(__linux__) && defined(SDPA__X86)
    if (amx_permitted())
        return SDPA_OK;
    if (syscall(SYS_arch_prctl, SDPA__ARCH_REQ_XCOMP_PERM, (unsigned long)SDPA__XFEATURE_XTILEDATA) != 0) {
        const int e = errno;
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: Linux refused arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): %s (errno %d); "
                          "AMX kernels are not used",
                          fn, strerror(e), e);
    }
    if (!amx_permitted())
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: Linux accepted the AMX request but ARCH_GET_XCOMP_PERM does not report "
                          "XTILEDATA; AMX kernels are not used",
                          fn);
    return SDPA_OK;
#else
    return sdpa__fail(SDPA_ERR_UNSUPPORTED, "%s: AMX permission is only requested on x86 Linux", fn);
#endif
}

SDPA_API int sdpa_amx_available(void) {
    const sdpa__cpu *c = sdpa__cpu_features();
    if (!c->amx_tile || !c->amx_bf16)
        return 0;
#if defined(__linux__) && defined(SDPA__X86)
    return amx_permitted() ? 1 : 0;
#else
    return 0;
#endif
}

/* Online CPUs, clamped to [1, SDPA__MAX_THREADS] (internal.h; here so that threads.c and
 * threadpool.c, which both ask, need not call each other). */
int sdpa__online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > SDPA__MAX_THREADS ? SDPA__MAX_THREADS : (int)n);
}
