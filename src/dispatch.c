/* ISA detection once per process and the registry of micro-kernel tables (dispatch.h). */
#include "dispatch.h"
#include "convert.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

/* [isa][dtype]; NULL where not compiled in (lookup falls back to a lower ISA). */
static const sdpa__mk *const g_tables[SDPA__ISA_COUNT][SDPA__MK_DTYPE_COUNT] = {
    [SDPA__ISA_PORTABLE] = {[SDPA__MK_F32] = &sdpa__mk_portable},
#if defined(SDPA_HAVE_AVX2)
    [SDPA__ISA_AVX2] = {[SDPA__MK_F32] = &sdpa__mk_avx2},
#endif
#if defined(SDPA_HAVE_AVX2) && defined(SDPA_HAVE_AVX512)
    [SDPA__ISA_AVX512] = {[SDPA__MK_F32] = &sdpa__mk_avx512},
#endif
#if defined(SDPA_HAVE_NEON)
    [SDPA__ISA_NEON] = {[SDPA__MK_F32] = &sdpa__mk_neon},
#endif
};

#if defined(SDPA_HAVE_MK_AVX512BF16) && defined(SDPA_HAVE_AVX512)
#include "microkernel_bf16.h"
static const sdpa__mk_bf16 g_mk_avx512bf16 = {"tiled-avx512bf16", "decode-avx512bf16", "decode-split-avx512bf16",
                                              sdpa__bf16_dot_rows_avx512bf16, sdpa__bf16_lanes_scores_pairs_avx512bf16,
                                              sdpa__bf16_lanes_pv_avx512bf16, sdpa__bf16_pack_p_avx512bf16,
                                              sdpa__bf16_pack_v_avx512bf16, NULL, NULL, false, NULL, 0, 0};
#endif
#if defined(SDPA_HAVE_MK_AMX) && defined(SDPA_HAVE_MK_AVX512BF16) && defined(SDPA_HAVE_AVX512)
/* AMX-BF16 for the tiled kernel's products; its decode members are the AVX512-BF16 ones. */
_Static_assert(SDPA__AMX_VP_LD * 2 == SDPA__AMX_TILE_K, "a packed value column holds one key tile's pairs");
static const sdpa__mk_bf16 g_mk_amx = {"tiled-amx-bf16",        "decode-avx512bf16",
                                       "decode-split-avx512bf16", sdpa__bf16_dot_rows_avx512bf16,
                                       sdpa__amx_lanes_scores,  sdpa__amx_lanes_pv,
                                       sdpa__amx_pack_p,        sdpa__amx_pack_v,
                                       sdpa__amx_begin,         sdpa__amx_end,
                                       true,                    sdpa__amx_softmax_pack,
                                       SDPA__AMX_TILE_Q,        SDPA__AMX_TILE_K};
#endif
/* [isa] of the bf16 column; NULL where there is none. */
static const sdpa__mk_bf16 *const g_bf16_tables[SDPA__ISA_COUNT] = {
    [SDPA__ISA_PORTABLE] = NULL,
#if defined(SDPA_HAVE_MK_AVX512BF16) && defined(SDPA_HAVE_AVX512)
    [SDPA__ISA_AVX512] = &g_mk_avx512bf16,
#endif
};

/* pthread_once, not C11 call_once: ThreadSanitizer does not see glibc's call_once (a false race
 * report on a concurrent first call); cpu.c and threads.c do the same. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static sdpa__isa g_cpu_isa = SDPA__ISA_PORTABLE;     /* best the CPU (and the build) supports */
static sdpa__isa g_process_isa = SDPA__ISA_PORTABLE; /* g_cpu_isa capped by SDPA_MAX_ISA */
static atomic_int g_test_cap = -1;                   /* sdpa__dispatch_set_max_isa_for_testing */
static bool g_process_amx = true;                    /* SDPA_MAX_ISA unset or "amx" */
static atomic_int g_test_amx = 1;                    /* sdpa__dispatch_set_amx_for_testing */

/* The best level of the micro-kernel tables this build has and the CPU runs (cpu.h's one
 * CPUID/XGETBV read: AVX2 needs AVX2 + FMA + F16C, AVX512 also AVX-512 F/BW/VL; on aarch64
 * its one getauxval read: NEON needs ASIMD). */
static sdpa__isa cpu_isa(void) {
    sdpa__isa best = SDPA__ISA_PORTABLE;
#if defined(SDPA_HAVE_NEON)
    if (sdpa__cpu_has_isa(SDPA__ISA_NEON))
        best = SDPA__ISA_NEON;
#endif
#if defined(SDPA_HAVE_AVX2)
    if (sdpa__cpu_has_isa(SDPA__ISA_AVX2))
        best = SDPA__ISA_AVX2;
#if defined(SDPA_HAVE_AVX512)
    if (sdpa__cpu_has_isa(SDPA__ISA_AVX512))
        best = SDPA__ISA_AVX512;
#endif
#endif
    return best;
}

/* The level an SDPA_MAX_ISA value caps at, or -1 for no cap: "portable" everywhere; "avx2"
 * and "avx512" on x86-64, "neon" on aarch64. A name of the other architecture caps nothing,
 * as an unknown value (README: SDPA_MAX_ISA). */
static int cap_level(const char *cap) {
    if (cap == NULL)
        return -1;
    if (strcmp(cap, "portable") == 0)
        return SDPA__ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
    if (strcmp(cap, "avx2") == 0)
        return SDPA__ISA_AVX2;
    if (strcmp(cap, "avx512") == 0)
        return SDPA__ISA_AVX512;
#endif
#if defined(__aarch64__)
    if (strcmp(cap, "neon") == 0)
        return SDPA__ISA_NEON;
#endif
    return -1;
}

static void detect(void) {
    g_cpu_isa = cpu_isa();
    g_process_isa = g_cpu_isa;
    const char *cap = getenv("SDPA_MAX_ISA"); /* once per process */
    const int level = cap_level(cap);
    if (level >= 0 && level < (int)g_process_isa)
        g_process_isa = (sdpa__isa)level;
    /* "avx512" (or lower) leaves AMX out; "amx", unset or another value does not */
    g_process_amx = !(cap != NULL && (strcmp(cap, "portable") == 0 || strcmp(cap, "avx2") == 0 ||
                                      strcmp(cap, "avx512") == 0));
}

sdpa__isa sdpa__dispatch_isa(void) {
    pthread_once(&g_once, detect);
    const int cap = atomic_load_explicit(&g_test_cap, memory_order_relaxed);
    if (cap >= 0)
        return cap < (int)g_cpu_isa ? (sdpa__isa)cap : g_cpu_isa;
    return g_process_isa;
}

const sdpa__mk *sdpa__dispatch_mk(sdpa__mk_dtype dtype) {
    for (int isa = (int)sdpa__dispatch_isa(); isa >= 0; --isa)
        if (g_tables[isa][dtype] != NULL)
            return g_tables[isa][dtype];
    return &sdpa__mk_portable;
}

/* [isa] of the stored-K/V rows columns (each [sdpa_dtype]); NULL where not compiled in. */
static const sdpa__mk_kv *const g_kv_tables[SDPA__ISA_COUNT] = {
    [SDPA__ISA_PORTABLE] = sdpa__mk_kv_portable,
#if defined(SDPA_HAVE_AVX2)
    [SDPA__ISA_AVX2] = sdpa__mk_kv_avx2,
#endif
#if defined(SDPA_HAVE_AVX2) && defined(SDPA_HAVE_AVX512)
    [SDPA__ISA_AVX512] = sdpa__mk_kv_avx512,
#endif
#if defined(SDPA_HAVE_NEON)
    [SDPA__ISA_NEON] = sdpa__mk_kv_neon,
#endif
};

const sdpa__mk_kv *sdpa__dispatch_mk_kv(int dtype) {
    if (dtype < SDPA_DTYPE_F32 || dtype >= SDPA__KV_DTYPES)
        return NULL;
    for (int isa = (int)sdpa__dispatch_isa(); isa >= 0; --isa) /* the same walk as sdpa__dispatch_mk */
        if (g_tables[isa][SDPA__MK_F32] != NULL)
            return g_kv_tables[isa] != NULL ? &g_kv_tables[isa][dtype] : &sdpa__mk_kv_portable[dtype];
    return &sdpa__mk_kv_portable[dtype];
}

void sdpa__dispatch_set_max_isa_for_testing(int isa) {
    atomic_store_explicit(&g_test_cap, isa < 0 ? -1 : isa, memory_order_relaxed);
}

const sdpa__mk_kv *sdpa__dispatch_mk_kv_q8_0_reduced(void) {
#if defined(SDPA_HAVE_MK_AVX512VNNI)
    if (sdpa__dispatch_isa() == SDPA__ISA_AVX512 && sdpa__cpu_features()->avx512vnni)
        return &sdpa__mk_kv_q8_0_avx512vnni;
#endif
    return NULL;
}

const sdpa__mk_bf16 *sdpa__dispatch_mk_bf16(void) {
    const sdpa__isa isa = sdpa__dispatch_isa();
    if (!sdpa__cpu_features()->avx512bf16)
        return NULL;
    return g_bf16_tables[isa];
}

void sdpa__dispatch_set_amx_for_testing(int allow) {
    atomic_store_explicit(&g_test_amx, allow != 0, memory_order_relaxed);
}

const sdpa__mk_bf16 *sdpa__dispatch_mk_bf16_tiled(int64_t E, int64_t Ev) {
    const sdpa__mk_bf16 *col = sdpa__dispatch_mk_bf16();
#if defined(SDPA_HAVE_MK_AMX) && defined(SDPA_HAVE_MK_AVX512BF16) && defined(SDPA_HAVE_AVX512)
    if (col == NULL || sdpa__dispatch_isa() != SDPA__ISA_AVX512 || !g_process_amx ||
        !atomic_load_explicit(&g_test_amx, memory_order_relaxed))
        return col;
    if (E % 32 != 0 || E > SDPA__AMX_MAX_E || Ev % 16 != 0)
        return col;
    /* the cap was checked first: the question to Linux (one syscall until it says yes) is
     * asked only for calls that would use the column */
    if (!sdpa_amx_available())
        return col;
    return &g_mk_amx;
#else
    (void)E;
    (void)Ev;
    return col;
#endif
}

/* ---- the conversion tables (convert.h): the fourth registry, by ISA level ---- */

const sdpa__convert *sdpa__convert_exact(int isa) {
    switch (isa) {
    case SDPA__ISA_PORTABLE:
        return &sdpa__convert_portable;
#if defined(SDPA_HAVE_CONVERT_AVX2)
    case SDPA__ISA_AVX2:
        return sdpa__cpu_has_isa(SDPA__ISA_AVX2) ? &sdpa__convert_avx2 : NULL;
#endif
#if defined(SDPA_HAVE_CONVERT_AVX512)
    case SDPA__ISA_AVX512:
        if (!sdpa__cpu_has_isa(SDPA__ISA_AVX512))
            return NULL;
#if defined(SDPA_HAVE_AVX512BF16)
        if (sdpa__cpu_features()->avx512bf16)
            return &sdpa__convert_avx512bf16;
#endif
        return &sdpa__convert_avx512;
#endif
#if defined(SDPA_HAVE_CONVERT_NEON)
    case SDPA__ISA_NEON:
        return sdpa__cpu_has_isa(SDPA__ISA_NEON) ? &sdpa__convert_neon : NULL;
#endif
    default:
        return NULL;
    }
}

const sdpa__convert *sdpa__convert_for_isa(int isa) {
    if (isa >= SDPA__ISA_COUNT)
        isa = SDPA__ISA_COUNT - 1;
    for (; isa > SDPA__ISA_PORTABLE; --isa) {
        const sdpa__convert *c = sdpa__convert_exact(isa);
        if (c != NULL)
            return c;
    }
    return &sdpa__convert_portable;
}

const sdpa__convert *sdpa__dispatch_convert(void) { return sdpa__convert_for_isa((int)sdpa__dispatch_isa()); }
