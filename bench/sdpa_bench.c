/* sdpa-bench: times libsdpa's attention paths against floors, in one process.
 *
 * For every case (a shape (B, H, L, S, E) with Hkv key/value heads, and a dtype combination
 * of q / k,v / out) it runs these candidates, each at every thread count of --threads
 * (default 1,2):
 *   blas-floor  (f32 only) the two sgemm products of the same shape through OpenBLAS alone:
 *               for each (b, h) S = Q.K^T [L, S], then O = S.V (no scale, no softmax); the
 *               score buffer is allocated outside the timing. OpenBLAS's thread count is set
 *               to the row's thread count for these calls only and restored right after, so
 *               the library rows run under OpenBLAS's own default.
 *   bw-floor    (L <= 4 only) a plain sequential read of the K and V bytes as stored (f32, or
 *               16-bit words for f16/bf16), split into contiguous chunks over the row's
 *               thread count (pthreads).
 *   reference, tiled, decode (L <= 4 only), auto
 *               sdpa_attention() with options.kernel = REFERENCE / TILED / DECODE / AUTO and
 *               options.num_threads = the row's thread count; everything else at defaults
 *               (finite check on, internal workspace), as a user calls it. For f16/bf16
 *               cases the reference path is run once, untimed, as the comparison output.
 *   prev-0.3:auto, prev-0.3:tiled, prev-0.3:decode (f32 only; L <= 4 for decode)
 *               the same calls into a previous release of the library (--baseline PATH or
 *               the meson option bench_baseline), loaded with dlopen(RTLD_LOCAL |
 *               RTLD_DEEPBIND) into this process and called through dlsym'd pointers with
 *               that release's sdpa_options size. The rows are named after its release:
 *               prev-0.5:* for a 0.5.x baseline (bench/build_baseline.sh 9892fff), which
 *               also runs the f16/bf16 rows and their precision.
 * and one pseudo-shape "peak-fma": fma-avx512 / fma-avx2, a loop of independent FMA
 * accumulator chains (no memory traffic) at every thread count: the FMA peak in GF/s of this
 * machine in the same run. A candidate the CPU lacks is "unsupported" (note: not run).
 *
 * Each candidate gets --warmup untimed calls and one untimed memory probe, then the
 * candidates of a case run round-robin (one call each per round, the starting candidate
 * rotating) for the case's repetitions, BLAS-free candidates in a first phase and those that
 * use OpenBLAS in a second (see the rep loop); a row reports the median. Every library call's
 * output is compared with the reference path's output (max_abs_diff_ref) and, on a sample
 * of rows, with a double-precision evaluation on the (widened) inputs written here
 * (max_abs_diff_naive), within a tolerance that depends on the case's dtypes.
 * A forced kernel that answers SDPA_ERR_UNSUPPORTED, and an f16/bf16 case the library answers
 * with SDPA_ERR_DTYPE, are reported as "unsupported".
 *
 * Exit status: 0 when every library row is ok or unsupported and within its tolerance; 1 when
 * a call failed otherwise or an output differs beyond it; 2 on a usage error.
 */
#include <sdpa.h>

#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SDPA_BENCH_X86 1
#endif

#include "bench_clock.h" /* every platform (it was inside the x86 block: no build elsewhere) */

#define MAX_THREADS_LIST 16
#define MAX_REPS 1000
#define NAIVE_ROWS 8

/* ------------------------------------------------------------------ dtypes */

/* A case's storage: q, k and v (one dtype for both), out. weights/lse are not requested. */
typedef struct dtype_combo {
    const char *name;
    int32_t q, kv, out;
    int32_t precision; /* sdpa_options.precision of the library's calls */
    int amx;           /* run after sdpa_request_amx() (the AMX-BF16 tiled path); the other combos before it */
} dtype_combo;

enum { DT_F32, DT_F16KV, DT_BF16KV, DT_BF16, DT_BF16R, DT_BF16AMX, DT_COUNT };
static const dtype_combo dtype_combos[DT_COUNT] = {
    {"f32", SDPA_DTYPE_F32, SDPA_DTYPE_F32, SDPA_DTYPE_F32, 0, 0},
    {"f16kv", SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_F32, 0, 0},   /* f32 Q, f16 KV cache, f32 out */
    {"bf16kv", SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F32, 0, 0}, /* f32 Q, bf16 KV cache, f32 out */
    {"bf16", SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, 0, 0}, /* bf16 throughout */
    /* bf16 throughout, SDPA_PRECISION_REDUCED (bf16 dot products, P rounded to bf16) */
    {"bf16r", SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_PRECISION_REDUCED, 0},
    /* bf16r once this process has asked for AMX (sdpa_request_amx: the application's opt-in).
     * Linux's permission cannot be returned, so every bf16amx row runs after all other rows. */
    {"bf16amx", SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_PRECISION_REDUCED, 1},
};
#define DT_BIT(d) (1u << (d))
#define DT_ALL                                                                                              \
    (DT_BIT(DT_F32) | DT_BIT(DT_F16KV) | DT_BIT(DT_BF16KV) | DT_BIT(DT_BF16) | DT_BIT(DT_BF16R) |             \
     DT_BIT(DT_BF16AMX))

static const char *dtype_name(int32_t dt) {
    return dt == SDPA_DTYPE_F16 ? "f16" : dt == SDPA_DTYPE_BF16 ? "bf16" : "f32";
}
static size_t dtype_size(int32_t dt) { return dt == SDPA_DTYPE_F32 ? 4 : 2; }

/* Machine epsilon of a dtype (spacing of values at 1): f32 2^-23, f16 2^-10, bf16 2^-7. */
static double dtype_eps(int32_t dt) {
    return dt == SDPA_DTYPE_F16 ? 0x1p-10 : dt == SDPA_DTYPE_BF16 ? 0x1p-7 : 0x1p-23;
}

/* Conversions (portable C, no F16C / AVX512-BF16 needed): widening is exact; narrowing
 * rounds to nearest, ties to even; overflow gives +-Inf; NaN stays a (quiet) NaN. */
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: keep the sign and the top payload, quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (carries into the exponent) */
    return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 (halfway from 65504 up to 2^16) rounds to Inf; Inf stays */
        return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) { /* below 2^-14: an f16 subnormal or zero */
        uint32_t e = a >> 23;
        if (e < 102) /* below 2^-25: rounds to zero */
            return sign;
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m * 2^(e-150); in units of 2^-24: m >> shift */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            ++r; /* may round up to the smallest normal, 0x0400: the right encoding */
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
    uint32_t rem = r & 0x1FFFu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        ++r; /* a carry into the exponent is right, up to 65504 (Inf handled above) */
    return (uint16_t)(sign | r);
}
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -v : v;
    }
    if (e == 31)
        return f32_from_bits(sign | 0x7F800000u | (m << 13));
    return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

/* Store n floats as dtype dt (dst holds n elements of that dtype). */
static void narrow_into(void *dst, const float *src, size_t n, int32_t dt) {
    if (dt == SDPA_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (size_t i = 0; i < n; ++i)
        d[i] = dt == SDPA_DTYPE_F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
}
/* Widen n elements of dtype dt to floats (exact). */
static void widen_into(float *dst, const void *src, size_t n, int32_t dt) {
    if (dt == SDPA_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    for (size_t i = 0; i < n; ++i)
        dst[i] = dt == SDPA_DTYPE_F16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
}

/* --self-test: the conversions against their definition. Every f16 and bf16 value widens and
 * narrows back to itself (NaNs: to a NaN); ties round to even; the f16 range edges. */
static int conversion_self_test(void) {
    int bad = 0;
    for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
        float f = f16_to_f32((uint16_t)h), g = bf16_to_f32((uint16_t)h);
        int f_nan = ((h >> 10) & 0x1F) == 31 && (h & 0x3FF);
        uint16_t back = f32_to_f16(f), gback = f32_to_bf16(g);
        if (f_nan ? !isnan(f) || !(((back >> 10) & 0x1F) == 31 && (back & 0x3FF)) : back != h)
            ++bad;
        if (isnan(g) ? !isnan(bf16_to_f32(gback)) : gback != h)
            ++bad;
    }
    const struct {
        float in;
        uint16_t f16, bf16;
    } cases[] = {
        {1.0f, 0x3C00, 0x3F80},
        {1.0f + 0x1p-11f, 0x3C00, 0x3F80},             /* f16 tie, even below */
        {1.0f + 3 * 0x1p-11f, 0x3C02, 0x3F80},         /* f16 tie, even above */
        {1.0f + 0x1p-8f, 0x3C04, 0x3F80},              /* bf16 tie, even below */
        {1.0f + 3 * 0x1p-8f, 0x3C0C, 0x3F82},          /* bf16 tie, even above */
        {65504.0f, 0x7BFF, 0x4780},                    /* f16 max */
        {65519.996f, 0x7BFF, 0x4780},                  /* just below the f16 overflow tie */
        {65520.0f, 0x7C00, 0x4780},                    /* f16 overflow tie: Inf */
        {0x1p-24f, 0x0001, 0x3380},                    /* smallest f16 subnormal */
        {0x1p-25f, 0x0000, 0x3300},                    /* tie between 0 and 2^-24: 0 */
        {0x1.8p-25f, 0x0001, 0x3340},                  /* above the tie: 2^-24 */
        {0x1.ff8p-15f, 0x03FF, 0x3880},                /* largest f16 subnormal; bf16 rounds up */
        {-2.0f, 0xC000, 0xC000},
        {3.4e38f, 0x7C00, 0x7F80},                     /* bf16 overflow to Inf */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        if (f32_to_f16(cases[i].in) != cases[i].f16) {
            fprintf(stderr, "self-test: f32_to_f16(%a) = 0x%04x, want 0x%04x\n", (double)cases[i].in,
                    f32_to_f16(cases[i].in), cases[i].f16);
            ++bad;
        }
        if (f32_to_bf16(cases[i].in) != cases[i].bf16) {
            fprintf(stderr, "self-test: f32_to_bf16(%a) = 0x%04x, want 0x%04x\n", (double)cases[i].in,
                    f32_to_bf16(cases[i].in), cases[i].bf16);
            ++bad;
        }
    }
    printf("self-test: conversions %s (%d failure(s))\n", bad ? "FAILED" : "ok", bad);
    return bad == 0;
}

/* ------------------------------------------------------------------ shapes */

typedef struct shape {
    const char *kind; /* dense, causal, cross, decode, gqa (decode with Hkv < H), memory, peak */
    int64_t B, H, L, S, E;
    int causal;
    int64_t Hkv;      /* key/value heads; 0 = H */
    unsigned dtypes;  /* DT_BIT set of the dtype combinations this shape runs with */
} shape;

#define DT_PREFILL (DT_BIT(DT_F32) | DT_BIT(DT_BF16) | DT_BIT(DT_BF16R) | DT_BIT(DT_BF16AMX) | DT_BIT(DT_F16KV))
#define DT_DECODE (DT_BIT(DT_F32) | DT_BIT(DT_F16KV) | DT_BIT(DT_BF16KV))
#define F32_ONLY DT_BIT(DT_F32)

static const shape full_shapes[] = {
    {"peak", 0, 0, 0, 0, 0, 0, 0, F32_ONLY},
    {"dense", 1, 8, 128, 128, 64, 0, 0, F32_ONLY},
    {"dense", 1, 8, 512, 512, 64, 0, 0, F32_ONLY},
    {"dense", 1, 8, 1024, 1024, 64, 0, 0, DT_PREFILL},
    {"dense", 1, 16, 2048, 2048, 64, 0, 0, F32_ONLY},
    {"dense", 1, 8, 4096, 4096, 128, 0, 0, DT_PREFILL},
    {"causal", 1, 8, 512, 512, 64, 1, 0, F32_ONLY},
    {"causal", 1, 8, 1024, 1024, 64, 1, 0, F32_ONLY},
    {"causal", 1, 16, 2048, 2048, 64, 1, 0, F32_ONLY},
    {"causal", 1, 8, 4096, 4096, 128, 1, 0, F32_ONLY},
    {"cross", 2, 8, 64, 1024, 64, 0, 0, F32_ONLY},
    {"decode", 1, 32, 1, 4096, 128, 0, 0, DT_DECODE},
    {"decode", 8, 32, 1, 1024, 128, 0, 0, DT_DECODE},
    {"gqa", 1, 32, 1, 4096, 128, 0, 8, DT_DECODE},
    {"gqa", 8, 32, 1, 1024, 128, 0, 8, DT_DECODE},
    {"memory", 1, 8, 8192, 8192, 64, 0, 0, F32_ONLY},
};

static const shape smoke_shapes[] = {
    {"peak", 0, 0, 0, 0, 0, 0, 0, F32_ONLY},
    {"dense", 1, 2, 16, 16, 8, 0, 0, DT_ALL},
    {"dense", 2, 3, 70, 70, 16, 0, 0, F32_ONLY},
    /* E = 32: a head size the AMX column takes (bf16amx), 200 keys: a partial 128-key tile */
    {"dense", 1, 2, 72, 200, 32, 0, 0, DT_BIT(DT_F32) | DT_BIT(DT_BF16R) | DT_BIT(DT_BF16AMX)},
    {"causal", 1, 2, 33, 33, 8, 1, 0, F32_ONLY},
    {"cross", 2, 2, 5, 40, 8, 0, 0, F32_ONLY},
    {"decode", 1, 4, 1, 64, 16, 0, 0, DT_ALL},
    {"decode", 2, 2, 3, 17, 8, 0, 0, F32_ONLY},
    {"gqa", 2, 4, 1, 33, 16, 0, 2, DT_DECODE},
};

static int64_t shape_hkv(const shape *s) { return s->Hkv > 0 ? s->Hkv : s->H; }

static void shape_name(const shape *s, char *buf, size_t n) {
    if (!strcmp(s->kind, "peak")) {
        snprintf(buf, n, "peak-fma");
        return;
    }
    snprintf(buf, n, "%s-%lldx%lldx%lldx%lldx%lld", s->kind, (long long)s->B, (long long)s->H, (long long)s->L,
             (long long)s->S, (long long)s->E);
    if (s->Hkv > 0 && s->Hkv != s->H) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "-kv%lld", (long long)s->Hkv);
    }
}

/* Query-key pairs per (b, h) that the shape allows (top-left causal: row i sees min(i+1, S)). */
static double allowed_pairs(const shape *s) {
    if (!s->causal)
        return (double)s->L * (double)s->S;
    double n = 0;
    for (int64_t i = 0; i < s->L; ++i)
        n += (double)(i + 1 < s->S ? i + 1 : s->S);
    return n;
}

/* ------------------------------------------------------------------- paths */

typedef enum path {
    PATH_BLAS_FLOOR,
    PATH_BW_FLOOR,
    PATH_REFERENCE,
    PATH_TILED,
    PATH_DECODE,
    PATH_AUTO,
    PATH_PREV_TILED,
    PATH_PREV_DECODE,
    PATH_PREV_AUTO,
    PATH_FMA_AVX512,
    PATH_FMA_AVX2,
    PATH_COUNT
} path;

/* The prev rows are named after the baseline's minor release ("prev-0.3:tiled", "prev-0.5:tiled";
 * prev_load sets them). */
static char prev_tag[16] = "prev-0.3", prev_names[3][32] = {"prev-0.3:tiled", "prev-0.3:decode", "prev-0.3:auto"};
static const char *const path_names[PATH_COUNT] = {"blas-floor",    "bw-floor",    "reference",   "tiled",
                                                   "decode",        "auto",        prev_names[0], prev_names[1],
                                                   prev_names[2],   "fma-avx512",  "fma-avx2"};

/* Rows that call a libsdpa (this one or the previous release) and are checked for accuracy. */
static int path_is_library(path p) { return p >= PATH_REFERENCE && p <= PATH_PREV_AUTO; }
static int path_is_prev(path p) { return p >= PATH_PREV_TILED && p <= PATH_PREV_AUTO; }
static int path_is_fma(path p) { return p == PATH_FMA_AVX512 || p == PATH_FMA_AVX2; }

static int32_t path_kernel(path p) {
    switch (p) {
    case PATH_REFERENCE: return SDPA_KERNEL_REFERENCE;
    case PATH_TILED:
    case PATH_PREV_TILED: return SDPA_KERNEL_TILED;
    case PATH_DECODE:
    case PATH_PREV_DECODE: return SDPA_KERNEL_DECODE;
    default: return SDPA_KERNEL_AUTO;
    }
}

typedef enum cand_state { CAND_OK, CAND_UNSUPPORTED, CAND_ERROR } cand_state;

typedef struct candidate {
    path path;
    int threads;
    cand_state state;
    char kernel[48];
    char note[200];
    double times[MAX_REPS];
    int ntimes;
    double cpu_ms_sum, wall_ms_sum; /* over the timed calls: CPU time of the process / wall time */
    size_t ws_bytes;
    long long rss_growth; /* bytes; -1 = not measured */
    double diff_ref;      /* max over calls; NAN = not applicable */
    double diff_naive;
    void *out;            /* out_dtype elements */
} candidate;

/* ------------------------------------------------- the previous release (dlopen) */
/* The 0.3 ABI: sdpa_tensor is frozen; sdpa_options is read for its first struct_size bytes, and
 * 0.3's struct ends with the 0.2 fields kernel and reserved0 (int32 each). The fields the bench
 * sets (causal, num_threads, kernel) sit at the same offsets in every later header. */
#define PREV_OPTIONS_SIZE (offsetof(sdpa_options, kernel) + 2 * sizeof(int32_t))
/* Fields are only appended, so 0.3's struct is a prefix of this header's (144 bytes on LP64; a
 * wrong size would make every prev-0.3 call fail with SDPA_ERR_STRUCT_VERSION, an error row). */
_Static_assert(PREV_OPTIONS_SIZE <= sizeof(sdpa_options), "0.3's sdpa_options is a prefix of this header's");

typedef struct prev_lib {
    void *handle;
    char path[512];
    char version[32];
    sdpa_status (*attention)(const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *, const sdpa_options *,
                             const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *);
    sdpa_status (*workspace_size)(const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *,
                                  const sdpa_options *, int32_t, size_t *);
    void (*options_init_sized)(sdpa_options *, size_t);
    const char *(*last_kernel)(void);
    const char *(*last_error_message)(void);
    const char *(*status_string)(sdpa_status);
    const char *(*version_string)(void);
} prev_lib;

static prev_lib prev;

static int prev_sym(void *fn_ptr, size_t size, const char *name) {
    void *sym = dlsym(prev.handle, name);
    if (!sym) {
        fprintf(stderr, "sdpa-bench: baseline %s lacks %s: %s\n", prev.path, name, dlerror());
        return 0;
    }
    memcpy(fn_ptr, &sym, size); /* POSIX: a dlsym'd object pointer converts to the function */
    return 1;
}

/* Load the previous release from `path` into this process without letting either library's
 * symbols satisfy the other's (RTLD_LOCAL; RTLD_DEEPBIND so its own calls to its exported
 * functions stay inside it). Sanitizer runtimes refuse RTLD_DEEPBIND: there it is left out. */
static int prev_load(const char *lib_path) {
    int flags = RTLD_NOW | RTLD_LOCAL;
#if defined(RTLD_DEEPBIND) && !defined(__SANITIZE_ADDRESS__) && !defined(SDPA_BENCH_SANITIZED)
    flags |= RTLD_DEEPBIND;
#endif
    snprintf(prev.path, sizeof prev.path, "%s", lib_path);
    prev.handle = dlopen(lib_path, flags);
    if (!prev.handle) {
        fprintf(stderr, "sdpa-bench: cannot load baseline %s: %s\n", lib_path, dlerror());
        return 0;
    }
    int ok = prev_sym(&prev.attention, sizeof prev.attention, "sdpa_attention") &&
             prev_sym(&prev.workspace_size, sizeof prev.workspace_size, "sdpa_attention_workspace_size") &&
             prev_sym(&prev.options_init_sized, sizeof prev.options_init_sized, "sdpa_options_init_sized") &&
             prev_sym(&prev.last_kernel, sizeof prev.last_kernel, "sdpa_last_kernel") &&
             prev_sym(&prev.last_error_message, sizeof prev.last_error_message, "sdpa_last_error_message") &&
             prev_sym(&prev.status_string, sizeof prev.status_string, "sdpa_status_string") &&
             prev_sym(&prev.version_string, sizeof prev.version_string, "sdpa_version_string");
    if (!ok) {
        dlclose(prev.handle);
        prev.handle = NULL;
        return 0;
    }
    /* The symbols must come from the file just loaded, not from the library this program links. */
    Dl_info mine, theirs;
    void *mine_p, *theirs_p;
    sdpa_status (*mine_fn)(const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *, const sdpa_options *,
                           const sdpa_tensor *, const sdpa_tensor *, const sdpa_tensor *) = sdpa_attention;
    memcpy(&mine_p, &mine_fn, sizeof mine_p);
    memcpy(&theirs_p, &prev.attention, sizeof theirs_p);
    if (dladdr(mine_p, &mine) && dladdr(theirs_p, &theirs) && mine.dli_fbase == theirs.dli_fbase) {
        fprintf(stderr, "sdpa-bench: baseline %s resolved to the library this program links (%s)\n", lib_path,
                mine.dli_fname);
        dlclose(prev.handle);
        prev.handle = NULL;
        return 0;
    }
    snprintf(prev.version, sizeof prev.version, "%s", prev.version_string());
    if (strncmp(prev.version, "0.3.", 4) != 0 && strncmp(prev.version, "0.4.", 4) != 0 &&
        strncmp(prev.version, "0.5.", 4) != 0) {
        fprintf(stderr, "sdpa-bench: baseline %s is libsdpa %s; the prev candidates need a 0.3.x, 0.4.x or 0.5.x build\n",
                lib_path, prev.version);
        dlclose(prev.handle);
        prev.handle = NULL;
        return 0;
    }
    snprintf(prev_tag, sizeof prev_tag, "prev-%.3s", prev.version);
    static const char *const kinds[3] = {"tiled", "decode", "auto"};
    for (int t = 0; t < 3; ++t)
        snprintf(prev_names[t], sizeof prev_names[t], "%s:%s", prev_tag, kinds[t]);
    return 1;
}

/* 0.4 and later read f16/bf16 views and options.precision; 0.3 reads float32 only. */
static int prev_has_dtypes(void) { return prev.handle != NULL && strncmp(prev.version, "0.3.", 4) != 0; }

/* The options struct size the baseline is given: 0.3's (its fields a prefix of this header's),
 * or this header's for 0.4 / 0.5 (their library zeroes, and accepts as zero, the fields it does
 * not know). */
static size_t prev_options_size(void) { return prev_has_dtypes() ? sizeof(sdpa_options) : PREV_OPTIONS_SIZE; }

static void prev_options(sdpa_options *o) {
    memset(o, 0, sizeof *o);
    prev.options_init_sized(o, prev_options_size());
}

/* ---------------------------------------------------------- the FMA peak probe */
/* A loop of independent multiply-add chains a = a * x + y on registers only (16 zmm chains for
 * AVX-512, 12 ymm chains for AVX2: more than latency x issue width on current cores), 2 flops per
 * lane; every thread runs its own loop. The values stay near y / (1 - x) = 0.1: no denormals. */

static long fma_iters = 4000000; /* per call and thread */
static volatile float fma_sink;

#ifdef SDPA_BENCH_X86
__attribute__((target("avx512f"))) static void fma_loop_avx512(long iters) {
    __m512 acc[16];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < 16; ++j)
        acc[j] = _mm512_set1_ps((float)j * 0.01f);
    for (long i = 0; i < iters; ++i)
        for (int j = 0; j < 16; ++j)
            acc[j] = _mm512_fmadd_ps(acc[j], x, y);
    for (int j = 1; j < 16; ++j)
        acc[0] = _mm512_add_ps(acc[0], acc[j]);
    fma_sink = _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) static void fma_loop_avx2(long iters) {
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < 12; ++j)
        acc[j] = _mm256_set1_ps((float)j * 0.01f);
    for (long i = 0; i < iters; ++i)
        for (int j = 0; j < 12; ++j)
            acc[j] = _mm256_fmadd_ps(acc[j], x, y);
    for (int j = 1; j < 12; ++j)
        acc[0] = _mm256_add_ps(acc[0], acc[j]);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[0]);
    fma_sink = lanes[0] + lanes[7];
}
#endif

/* Flops of one call at one thread; 0 when this build or CPU cannot run the loop. */
static double fma_flops_per_thread(path p) {
#ifdef SDPA_BENCH_X86
    __builtin_cpu_init();
    if (p == PATH_FMA_AVX512 && __builtin_cpu_supports("avx512f"))
        return (double)fma_iters * 16 * 16 * 2;
    if (p == PATH_FMA_AVX2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return (double)fma_iters * 12 * 8 * 2;
#else
    (void)p;
#endif
    return 0;
}

static void *fma_main(void *arg) {
#ifdef SDPA_BENCH_X86
    if (*(const path *)arg == PATH_FMA_AVX512)
        fma_loop_avx512(fma_iters);
    else
        fma_loop_avx2(fma_iters);
#else
    (void)arg;
#endif
    return NULL;
}

static void fma_peak(path p, int threads) {
    pthread_t tid[64];
    int started[64] = {0};
    path arg = p;
    if (threads > 64)
        threads = 64;
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&tid[t], NULL, fma_main, &arg) == 0;
    fma_main(&arg);
    for (int t = 1; t < threads; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            fma_main(&arg);
    }
}

/* CPU flags that name the reduced-precision hardware paths (Linux /proc/cpuinfo), for the
 * rows' notes: what a target "with AVX512-BF16" / "with AMX" can be measured on. */
static char cpu_flags[160] = "unknown";
static char amx_status[120] = "not_requested"; /* what sdpa_request_amx() answered (bf16amx rows) */
static void read_cpu_flags(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    static const char *const wanted[] = {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16",
                                         "amx_tile", "amx_bf16"};
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        size_t used = 0;
        cpu_flags[0] = '\0';
        for (size_t i = 0; i < sizeof wanted / sizeof *wanted; ++i) {
            char pat[32];
            snprintf(pat, sizeof pat, " %s", wanted[i]);
            const char *hit = strstr(line, pat);
            size_t wl = strlen(pat);
            if (hit && (hit[wl] == ' ' || hit[wl] == '\n' || hit[wl] == '\0'))
                used += (size_t)snprintf(cpu_flags + used, sizeof cpu_flags - used, "%s%s", used ? "+" : "",
                                         wanted[i]);
        }
        if (used == 0)
            snprintf(cpu_flags, sizeof cpu_flags, "none");
        break;
    }
    fclose(f);
}

/* ------------------------------------------------------------------ config */

typedef struct config {
    int smoke;
    int reps;
    int warmup;
    double min_time_ms; /* raise a cheap shape's repetitions until a candidate's total reaches this */
    double blas_quiet_ms; /* pause after an OpenBLAS-using call before a call that uses no BLAS */
    int threads[MAX_THREADS_LIST];
    int nthreads;
    const char *csv_path;
    const char *shapes_filter;
    double tol;
    int flush_mode; /* 0 none, 1 decode shapes, 2 all shapes */
    size_t flush_bytes;
    int rss_probe;
    unsigned dtypes;       /* DT_BIT set from --dtypes */
    const char *isa_cap;   /* SDPA_MAX_ISA as this process sees it, or "native" */
} config;

/* ------------------------------------------------------------------ helpers */

/* CPU time (user + system) of the whole process, all threads, in ms. */
static double cpu_ms(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

static double last_cpu_ms; /* CPU time of the last call_candidate() */

static double now_ms(void) { return bench_now_s() * 1e3; }

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "sdpa-bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_uniform(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static double median_of(const double *v, int n) {
    double tmp[MAX_REPS];
    memcpy(tmp, v, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, bench_cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* Replace characters that would break a CSV field or a whitespace-separated row. */
static void sanitize(char *s) {
    for (; *s; ++s)
        if (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '"')
            *s = (*s == ' ') ? '_' : ';';
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) /* also catches NaN */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* --------------------------------------------------- peak memory (RSS) probe */
/* Peak RSS growth of one call: return freed heap pages to the system (malloc_trim), reset the
 * kernel's peak-RSS mark (write "5" to /proc/self/clear_refs, Linux >= 4.0), read VmRSS, make
 * the call, read VmHWM. Without clear_refs the probe is reported as not measured. */

static long long proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static int reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return 0;
    int ok = fputs("5", f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok;
}

static long long rss_probe_begin(void) {
    malloc_trim(0);
    if (!reset_peak_rss())
        return -1;
    return proc_status_kib("VmRSS");
}

static long long rss_probe_end(long long before_kib) {
    if (before_kib < 0)
        return -1;
    long long hwm = proc_status_kib("VmHWM");
    if (hwm < 0)
        return -1;
    return hwm > before_kib ? (hwm - before_kib) * 1024 : 0;
}

/* -------------------------------------------------------- bandwidth floor */

/* Sum of n floats with 64 independent partial sums, so the compiler vectorises the reduction
 * without reassociating and keeps several vector add chains in flight (4 with AVX-512);
 * one clone per ISA level, picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static float sum_floats(const float *x, size_t n) {
    float acc[64] = {0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; ++j)
            acc[j] += x[i + j];
    for (; i < n; ++i)
        acc[0] += x[i];
    float s = 0;
    for (int j = 0; j < 64; ++j)
        s += acc[j];
    return s;
}

/* The same read for 16-bit words (f16/bf16 storage), summed as integers (no float
 * interpretation of the bits: no denormal or NaN arithmetic). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint32_t sum_words(const uint16_t *x, size_t n) {
    uint32_t acc[64] = {0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; ++j)
            acc[j] += x[i + j];
    for (; i < n; ++i)
        acc[0] += x[i];
    uint32_t s = 0;
    for (int j = 0; j < 64; ++j)
        s += acc[j];
    return s;
}

typedef struct bw_task {
    const void *a, *b;
    size_t na, nb; /* elements */
    size_t elem;   /* 4 (float) or 2 (16-bit words) */
    float result;
} bw_task;

static void *bw_main(void *arg) {
    bw_task *t = (bw_task *)arg;
    if (t->elem == 4)
        t->result = sum_floats((const float *)t->a, t->na) + sum_floats((const float *)t->b, t->nb);
    else
        t->result = (float)(sum_words((const uint16_t *)t->a, t->na) + sum_words((const uint16_t *)t->b, t->nb));
    return NULL;
}

static volatile float bw_sink;

/* Read k[0..nk) and v[0..nv) (elements of `elem` bytes) once, split into `threads` contiguous
 * chunks of each. */
static void bandwidth_floor(const void *k, size_t nk, const void *v, size_t nv, size_t elem, int threads) {
    bw_task tasks[64];
    pthread_t tid[64];
    int started[64] = {0};
    if (threads > 64)
        threads = 64;
    for (int t = 0; t < threads; ++t) {
        size_t ka = nk * (size_t)t / (size_t)threads, kb = nk * (size_t)(t + 1) / (size_t)threads;
        size_t va = nv * (size_t)t / (size_t)threads, vb = nv * (size_t)(t + 1) / (size_t)threads;
        tasks[t] = (bw_task){(const char *)k + ka * elem, (const char *)v + va * elem, kb - ka, vb - va, elem, 0.0f};
    }
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&tid[t], NULL, bw_main, &tasks[t]) == 0;
    bw_main(&tasks[0]);
    float s = tasks[0].result;
    for (int t = 1; t < threads; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            bw_main(&tasks[t]);
        s += tasks[t].result;
    }
    bw_sink = s;
}

/* Evict the caches before a call: read a buffer larger than the last-level cache. */
static float *flush_buf;
static size_t flush_floats;
static void flush_caches(void) {
    if (flush_buf)
        bw_sink = sum_floats(flush_buf, flush_floats);
}

/* ------------------------------------------------------------ the BLAS floor */

#ifdef SDPA_BENCH_OPENBLAS_THREADS
static int openblas_default_threads = 0;
#endif
static char blas_core[64] = "unknown"; /* OpenBLAS's kernel family (openblas_get_corename) */

static void blas_floor(const shape *s, const float *q, const float *k, const float *v, float *scores, float *o,
                       int threads) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
    const int64_t L = s->L, S = s->S, E = s->E, group = s->H / shape_hkv(s);
    for (int64_t bh = 0; bh < s->B * s->H; ++bh) {
        const int64_t bkv = bh / group; /* (b * H + h) / group = b * Hkv + h / group */
        const float *qb = q + bh * L * E, *kb = k + bkv * S * E, *vb = v + bkv * S * E;
        float *ob = o + bh * L * E;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L, (int)S, (int)E, 1.0f, qb, (int)E, kb, (int)E, 0.0f,
                    scores, (int)S);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)L, (int)E, (int)S, 1.0f, scores, (int)S, vb, (int)E,
                    0.0f, ob, (int)E);
    }
}

static void blas_floor_restore(void) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_set_num_threads(openblas_default_threads);
#endif
}

/* ------------------------------------------- naive double-precision check */

/* Max abs difference of `out` (widened to float) from a double-precision evaluation on the
 * widened inputs, on NAIVE_ROWS sampled rows (first and last rows included). */
static double naive_check(const shape *s, const float *q, const float *k, const float *v, const float *out) {
    const int64_t L = s->L, S = s->S, E = s->E;
    const double scale = 1.0 / sqrt((double)E);
    double *w = (double *)xalloc((size_t)S * sizeof(double));
    double worst = 0;
    for (int idx = 0; idx < NAIVE_ROWS; ++idx) {
        int64_t b = idx % s->B, h = (idx * 7) % s->H;
        int64_t i = L > 1 ? (int64_t)idx * (L - 1) / (NAIVE_ROWS - 1) : 0;
        const float *qr = q + ((b * s->H + h) * L + i) * E;
        const int64_t hkv = h / (s->H / shape_hkv(s));
        const float *kb = k + (b * shape_hkv(s) + hkv) * S * E, *vb = v + (b * shape_hkv(s) + hkv) * S * E;
        int64_t hi = s->causal ? (i + 1 < S ? i + 1 : S) : S;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < hi; ++j) {
            double d = 0;
            for (int64_t e = 0; e < E; ++e)
                d += (double)qr[e] * (double)kb[j * E + e];
            w[j] = d * scale;
            if (w[j] > mx)
                mx = w[j];
        }
        for (int64_t j = 0; j < hi; ++j)
            sum += (w[j] = exp(w[j] - mx));
        const float *orow = out + ((b * s->H + h) * L + i) * E;
        for (int64_t e = 0; e < E; ++e) {
            double acc = 0;
            for (int64_t j = 0; j < hi; ++j)
                acc += w[j] * (double)vb[j * E + e];
            double d = fabs(acc / sum - (double)orow[e]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
    }
    free(w);
    return worst;
}

/* ------------------------------------------------------------- one case */

typedef struct shape_data {
    const shape *s;
    const dtype_combo *dt;
    float *q, *k, *v;          /* float32 values (for f16/bf16: the stored values, widened) */
    void *qs, *ks, *vs;        /* the stored inputs (== q, k, v for f32) */
    void *ref_out;             /* the reference path's output, out dtype */
    float *ref_f, *out_f;      /* ref_out widened; scratch for a candidate's widened output */
    float *floor_out, *scores;
    sdpa_tensor tq, tk, tv;
    size_t n_qo, n_kv;
    int have_ref;
    double tol;                /* max abs difference allowed for this case's dtypes */
} shape_data;

/* A view of `data` as a contiguous [d0, d1, d2, d3] tensor of dtype dt (strides in elements, so
 * the float32 constructor's strides are right for every dtype). */
static sdpa_status view_4d(sdpa_tensor *t, void *data, int32_t dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    sdpa_status st = sdpa_tensor_init_4d(t, (float *)data, d0, d1, d2, d3);
    t->dtype = dt;
    return st;
}

static sdpa_status run_library(shape_data *d, candidate *c, void *out) {
    const shape *s = d->s;
    sdpa_tensor tout;
    sdpa_status st = view_4d(&tout, out, d->dt->out, s->B, s->H, s->L, s->E);
    if (st != SDPA_OK)
        return st;
    sdpa_options o;
    if (path_is_prev(c->path))
        prev_options(&o);
    else
        sdpa_options_init(&o);
    o.causal = s->causal;
    o.num_threads = c->threads;
    o.kernel = path_kernel(c->path);
    if (!path_is_prev(c->path) || prev_has_dtypes())
        o.precision = d->dt->precision;
    if (path_is_prev(c->path))
        return prev.attention(&d->tq, &d->tk, &d->tv, &o, &tout, NULL, NULL);
    return sdpa_attention(&d->tq, &d->tk, &d->tv, &o, &tout, NULL, NULL);
}

/* One call of candidate c; returns its time in ms, or a negative value if it failed. */
static double call_candidate(shape_data *d, candidate *c, const config *cfg, int record_diff) {
    const shape *s = d->s;
    if (cfg->flush_mode == 2 || (cfg->flush_mode == 1 && s->L <= 4 && s->L > 0))
        flush_caches();
    double t0, t1, c0, c1;
    switch (c->path) {
    case PATH_FMA_AVX512:
    case PATH_FMA_AVX2:
        c0 = cpu_ms();
        t0 = now_ms();
        fma_peak(c->path, c->threads);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        return t1 - t0;
    case PATH_BLAS_FLOOR:
        c0 = cpu_ms();
        t0 = now_ms();
        blas_floor(s, d->q, d->k, d->v, d->scores, d->floor_out, c->threads);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        blas_floor_restore();
        return t1 - t0;
    case PATH_BW_FLOOR:
        c0 = cpu_ms();
        t0 = now_ms();
        bandwidth_floor(d->ks, d->n_kv, d->vs, d->n_kv, dtype_size(d->dt->kv), c->threads);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        return t1 - t0;
    default: {
        c0 = cpu_ms();
        t0 = now_ms();
        sdpa_status st = run_library(d, c, c->out);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        const int prevp = path_is_prev(c->path);
        if (st != SDPA_OK) {
            /* An f16/bf16 case the library does not compute yet is "unsupported", not a failure. */
            int unsupported = st == SDPA_ERR_UNSUPPORTED || (st == SDPA_ERR_DTYPE && d->dt != &dtype_combos[DT_F32]);
            c->state = unsupported ? CAND_UNSUPPORTED : CAND_ERROR;
            snprintf(c->note, sizeof c->note, "%s%s:%s", st == SDPA_ERR_DTYPE && unsupported ? "not_run:" : "",
                     prevp ? prev.status_string(st) : sdpa_status_string(st),
                     prevp ? prev.last_error_message() : sdpa_last_error_message());
            sanitize(c->note);
            return -1;
        }
        snprintf(c->kernel, sizeof c->kernel, "%s", prevp ? prev.last_kernel() : sdpa_last_kernel());
        sanitize(c->kernel);
        if (c->kernel[0] == '\0')
            snprintf(c->kernel, sizeof c->kernel, "?");
        if (record_diff && d->have_ref) {
            widen_into(d->out_f, c->out, d->n_qo, d->dt->out);
            double diff = max_abs_diff(d->out_f, d->ref_f, d->n_qo);
            if (isnan(c->diff_ref) || diff > c->diff_ref)
                c->diff_ref = diff;
        }
        return t1 - t0;
    }
    }
}

static size_t workspace_for(shape_data *d, const candidate *c) {
    if (c->path == PATH_BLAS_FLOOR)
        return (size_t)d->s->L * (size_t)d->s->S * sizeof(float);
    if (!path_is_library(c->path))
        return 0;
    sdpa_options o;
    if (path_is_prev(c->path))
        prev_options(&o);
    else
        sdpa_options_init(&o);
    o.causal = d->s->causal;
    o.num_threads = c->threads;
    o.kernel = path_kernel(c->path);
    if (!path_is_prev(c->path))
        o.precision = d->dt->precision;
    size_t bytes = 0;
    sdpa_status st = path_is_prev(c->path) ? prev.workspace_size(&d->tq, &d->tk, &d->tv, &o, 0, &bytes)
                                           : sdpa_attention_workspace_size(&d->tq, &d->tk, &d->tv, &o, 0, &bytes);
    return st == SDPA_OK ? bytes : 0;
}

static FILE *csv_file;
static int any_failure;

static void fmt_num(char *buf, size_t n, double v, const char *fmt) {
    if (isnan(v))
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, fmt, v);
}

static void report(const shape_data *d, const candidate *c, const config *cfg) {
    const shape *s = d->s;
    char name[96];
    shape_name(s, name, sizeof name);
    const char *status = c->state == CAND_OK ? "ok" : c->state == CAND_UNSUPPORTED ? "unsupported" : "error";
    double med = NAN, mn = NAN, mx = NAN, gfd = NAN, gfe = NAN, gbs = NAN, cores = NAN;
    const double kv_bytes = 2.0 * (double)d->n_kv * (double)dtype_size(d->dt->kv);
    if (c->state == CAND_OK && c->ntimes > 0) {
        med = median_of(c->times, c->ntimes);
        mn = mx = c->times[0];
        for (int i = 1; i < c->ntimes; ++i) {
            mn = c->times[i] < mn ? c->times[i] : mn;
            mx = c->times[i] > mx ? c->times[i] : mx;
        }
        double bh = (double)s->B * (double)s->H;
        double dense = 4.0 * bh * (double)s->L * (double)s->S * (double)s->E;
        double eff = 4.0 * bh * allowed_pairs(s) * (double)s->E;
        if (path_is_fma(c->path)) {
            gfd = gfe = fma_flops_per_thread(c->path) * c->threads / (med * 1e6);
        } else if (c->path != PATH_BW_FLOOR) {
            gfd = dense / (med * 1e6);
            gfe = (c->path == PATH_BLAS_FLOOR ? dense : eff) / (med * 1e6);
        }
        if (s->L <= 4 && s->L > 0)
            gbs = kv_bytes / (med * 1e6);
        if (c->wall_ms_sum >= 100) /* process CPU time is accounted per scheduler tick: '-' below 100 ms */
            cores = c->cpu_ms_sum / c->wall_ms_sum;
    }
    int wrong = path_is_library(c->path) && c->state == CAND_OK &&
                (!(c->diff_ref <= d->tol || isnan(c->diff_ref)) || !(c->diff_naive <= d->tol));
    if (wrong) {
        status = "wrong";
        any_failure = 1;
    }
    if (c->state == CAND_ERROR)
        any_failure = 1;
    char smed[32], smin[32], smax[32], sgfd[32], sgfe[32], sgbs[32], scores[32], sdr[32], sdn[32], sws[32], srss[32];
    fmt_num(smed, sizeof smed, med, "%.4f");
    fmt_num(smin, sizeof smin, mn, "%.4f");
    fmt_num(smax, sizeof smax, mx, "%.4f");
    fmt_num(sgfd, sizeof sgfd, gfd, "%.2f");
    fmt_num(sgfe, sizeof sgfe, gfe, "%.2f");
    fmt_num(sgbs, sizeof sgbs, gbs, "%.2f");
    fmt_num(scores, sizeof scores, cores, "%.2f");
    fmt_num(sdr, sizeof sdr, c->diff_ref, "%.3g");
    fmt_num(sdn, sizeof sdn, c->diff_naive, "%.3g");
    snprintf(sws, sizeof sws, "%.2f", (double)c->ws_bytes / 1048576.0);
    fmt_num(srss, sizeof srss, c->rss_growth < 0 ? NAN : (double)c->rss_growth / 1048576.0, "%.2f");
    char srss_bytes[32];
    if (c->rss_growth < 0)
        snprintf(srss_bytes, sizeof srss_bytes, "-");
    else
        snprintf(srss_bytes, sizeof srss_bytes, "%lld", c->rss_growth);
    const char *kernel = c->kernel[0] ? c->kernel : "-";
    const char *note = c->note[0] ? c->note : "-";
    printf("%-30s %-15s %-6s %3d %-11s %-18s %4d %11s %11s %9s %9s %8s %5s %9s %9s %9s %9s  %s\n", name,
           path_names[c->path], d->dt->name, c->threads, status, kernel, c->ntimes, smed, smin, sgfd, sgfe, sgbs,
           scores, sws, srss, sdr, sdn, note);
    fflush(stdout);
    if (csv_file) {
        fprintf(csv_file,
                "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%s,%s,%d,%s,%s,%s,%s,%s,%s,%s,%zu,%s,%s,%s,%s,%s,"
                "%lld,%s,%s,%s,%s,%s,%g,%.0f,%s,%s\n",
                name, s->kind, (long long)s->B, (long long)s->H, (long long)s->L, (long long)s->S, (long long)s->E,
                (long long)s->E, s->causal, path_names[c->path], c->threads, status, kernel, c->ntimes, smed, smin,
                smax, sgfd, sgfe, sgbs, scores, c->ws_bytes, srss_bytes, sdr, sdn, blas_core, note,
                (long long)shape_hkv(s), d->dt->name, dtype_name(d->dt->q), dtype_name(d->dt->kv),
                dtype_name(d->dt->out), cfg->isa_cap, d->tol, kv_bytes, cpu_flags,
                path_is_prev(c->path) ? prev.version : sdpa_version_string());
        fflush(csv_file);
    }
}

static void add_candidate(candidate *c, path p, int threads, const shape_data *d) {
    c->path = p;
    c->threads = threads;
    c->state = CAND_OK;
    c->rss_growth = -1;
    c->diff_ref = NAN;
    c->diff_naive = NAN;
    if (path_is_library(p)) {
        size_t bytes = d->n_qo * dtype_size(d->dt->out);
        c->out = xalloc(bytes);
        memset(c->out, 0, bytes);
    }
    if (p == PATH_BLAS_FLOOR) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
        snprintf(c->note, sizeof c->note, "openblas_threads=%d", threads);
#else
        snprintf(c->note, sizeof c->note, "blas_default_threads");
#endif
    }
    if (d->dt->amx && path_is_library(p) && !path_is_prev(p) && !sdpa_amx_available()) {
        c->state = CAND_UNSUPPORTED;
        snprintf(c->note, sizeof c->note, "not_run:AMX_unavailable:%s", amx_status);
        sanitize(c->note);
    }
    if (path_is_fma(p)) {
        if (fma_flops_per_thread(p) == 0) {
            c->state = CAND_UNSUPPORTED;
            snprintf(c->note, sizeof c->note, "not_run:CPU_or_build_lacks_%s;cpu=%s", path_names[p] + 4, cpu_flags);
        } else {
            snprintf(c->note, sizeof c->note, "iters=%ld;cpu=%s", fma_iters, cpu_flags);
        }
    }
}

/* Does the case run this path? */
static int case_has_path(const shape *s, const dtype_combo *dt, path p) {
    const int peak = !strcmp(s->kind, "peak"), f32 = dt == &dtype_combos[DT_F32], small_l = s->L <= 4;
    if (peak)
        return path_is_fma(p);
    switch (p) {
    case PATH_BLAS_FLOOR: return f32;
    case PATH_BW_FLOOR: return small_l;
    case PATH_REFERENCE: return f32; /* f16/bf16: the untimed reference output only */
    case PATH_TILED:
    case PATH_AUTO: return 1;
    case PATH_DECODE: return small_l;
    case PATH_PREV_TILED:
    case PATH_PREV_AUTO: return (f32 || prev_has_dtypes()) && prev.handle != NULL;
    case PATH_PREV_DECODE: return (f32 || prev_has_dtypes()) && small_l && prev.handle != NULL;
    default: return 0;
    }
}

static void bench_case(const shape *s, const dtype_combo *dt, const config *cfg) {
    shape_data d;
    memset(&d, 0, sizeof d);
    d.s = s;
    d.dt = dt;
    const int peak = !strcmp(s->kind, "peak");
    const int64_t Hkv = shape_hkv(s);
    d.n_qo = (size_t)(s->B * s->H * s->L * s->E);
    d.n_kv = (size_t)(s->B * Hkv * s->S * s->E);
    /* Tolerance: float32 rounding (--tol) for f32 storage; for f16/bf16 storage twice the machine
     * epsilon of the narrowest dtype among q, k, v and out (values are in [-1, 1), so this covers
     * rounding out once, and probabilities rounded to V's dtype for P.V where a precision setting
     * allows it). */
    d.tol = cfg->tol;
    {
        double eps = dtype_eps(dt->q);
        eps = dtype_eps(dt->kv) > eps ? dtype_eps(dt->kv) : eps;
        eps = dtype_eps(dt->out) > eps ? dtype_eps(dt->out) : eps;
        if (2 * eps > d.tol)
            d.tol = 2 * eps;
    }
    if (!peak) {
        d.q = (float *)xalloc(d.n_qo * sizeof(float));
        d.k = (float *)xalloc(d.n_kv * sizeof(float));
        d.v = (float *)xalloc(d.n_kv * sizeof(float));
        for (size_t i = 0; i < d.n_qo; ++i)
            d.q[i] = rand_uniform();
        for (size_t i = 0; i < d.n_kv; ++i)
            d.k[i] = rand_uniform();
        for (size_t i = 0; i < d.n_kv; ++i)
            d.v[i] = rand_uniform();
        /* Reduced storage: round to the dtype, then widen back, so q/k/v hold the exact values
         * the library sees (the double evaluation and the floors use those). */
        d.qs = d.q;
        d.ks = d.k;
        d.vs = d.v;
        if (dt->q != SDPA_DTYPE_F32) {
            d.qs = xalloc(d.n_qo * dtype_size(dt->q));
            narrow_into(d.qs, d.q, d.n_qo, dt->q);
            widen_into(d.q, d.qs, d.n_qo, dt->q);
        }
        if (dt->kv != SDPA_DTYPE_F32) {
            d.ks = xalloc(d.n_kv * dtype_size(dt->kv));
            d.vs = xalloc(d.n_kv * dtype_size(dt->kv));
            narrow_into(d.ks, d.k, d.n_kv, dt->kv);
            widen_into(d.k, d.ks, d.n_kv, dt->kv);
            narrow_into(d.vs, d.v, d.n_kv, dt->kv);
            widen_into(d.v, d.vs, d.n_kv, dt->kv);
        }
        d.ref_out = xalloc(d.n_qo * dtype_size(dt->out));
        memset(d.ref_out, 0, d.n_qo * dtype_size(dt->out));
        d.ref_f = (float *)xalloc(d.n_qo * sizeof(float));
        d.out_f = (float *)xalloc(d.n_qo * sizeof(float));
        if (dt == &dtype_combos[DT_F32]) {
            d.floor_out = (float *)xalloc(d.n_qo * sizeof(float));
            d.scores = (float *)xalloc((size_t)(s->L * s->S) * sizeof(float));
            memset(d.floor_out, 0, d.n_qo * sizeof(float));
            memset(d.scores, 0, (size_t)(s->L * s->S) * sizeof(float));
        }
        if (view_4d(&d.tq, d.qs, dt->q, s->B, s->H, s->L, s->E) != SDPA_OK ||
            view_4d(&d.tk, d.ks, dt->kv, s->B, Hkv, s->S, s->E) != SDPA_OK ||
            view_4d(&d.tv, d.vs, dt->kv, s->B, Hkv, s->S, s->E) != SDPA_OK) {
            fprintf(stderr, "sdpa-bench: cannot build views: %s\n", sdpa_last_error_message());
            exit(1);
        }

        /* The reference output every library call is compared with (untimed). */
        candidate rc;
        memset(&rc, 0, sizeof rc);
        rc.path = PATH_REFERENCE;
        rc.threads = cfg->threads[cfg->nthreads - 1];
        sdpa_status st = run_library(&d, &rc, d.ref_out);
        d.have_ref = st == SDPA_OK;
        if (d.have_ref)
            widen_into(d.ref_f, d.ref_out, d.n_qo, dt->out);
        else if (!(st == SDPA_ERR_DTYPE && dt != &dtype_combos[DT_F32]))
            fprintf(stderr, "sdpa-bench: reference path failed: %s\n", sdpa_last_error_message());
    }

    candidate *cands = (candidate *)calloc((size_t)PATH_COUNT * (size_t)cfg->nthreads, sizeof(candidate));
    if (!cands) {
        fprintf(stderr, "sdpa-bench: out of memory\n");
        exit(1);
    }
    int nc = 0;
    for (int p = 0; p < PATH_COUNT; ++p) {
        if (!case_has_path(s, dt, (path)p))
            continue;
        for (int t = 0; t < cfg->nthreads; ++t)
            add_candidate(&cands[nc++], (path)p, cfg->threads[t], &d);
    }

    /* Warm-up, then one untimed memory probe per candidate. */
    double slowest = 0;
    for (int i = 0; i < nc; ++i) {
        candidate *c = &cands[i];
        for (int w = 0; w < cfg->warmup && c->state == CAND_OK; ++w)
            call_candidate(&d, c, cfg, 0);
        if (c->state != CAND_OK)
            continue;
        c->ws_bytes = workspace_for(&d, c);
        long long before = cfg->rss_probe ? rss_probe_begin() : -1;
        double t = call_candidate(&d, c, cfg, 1);
        c->rss_growth = rss_probe_end(before);
        if (t > slowest)
            slowest = t;
    }

    /* Repetitions: raise them for cheap cases so each candidate runs about min_time_ms. */
    int reps = cfg->reps;
    if (cfg->min_time_ms > 0 && slowest > 0) {
        double want = ceil(cfg->min_time_ms / slowest);
        if (want > reps)
            reps = want > 100 ? 100 : (int)want;
    }
    /* OpenBLAS's worker threads keep spinning for a while (about 0.1 s here) after a threaded
     * call returns, and a BLAS-free call made meanwhile shares the cores with them. So the
     * rounds run in two phases: first the candidates that use no BLAS (tiled, decode, AUTO,
     * bw-floor, prev-0.3's tiled/decode/AUTO, the FMA probe), after one untimed pause that lets
     * the warm-up's BLAS threads go to sleep, then those that do (blas-floor, reference).
     * Within a phase, candidates interleave round-robin. */
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 0 && cfg->blas_quiet_ms > 0) {
            struct timespec ts = {(time_t)(cfg->blas_quiet_ms / 1000.0),
                                  (long)(fmod(cfg->blas_quiet_ms, 1000.0) * 1e6)};
            nanosleep(&ts, NULL);
        }
        for (int r = 0; r < reps; ++r) {
            for (int j = 0; j < nc; ++j) {
                candidate *c = &cands[(j + r) % nc];
                if (c->state != CAND_OK)
                    continue;
                const bool uses_blas = c->path == PATH_BLAS_FLOOR || c->path == PATH_REFERENCE;
                if (uses_blas != (phase == 1))
                    continue;
                double t = call_candidate(&d, c, cfg, 1);
                if (t >= 0 && c->ntimes < MAX_REPS) {
                    c->times[c->ntimes++] = t;
                    c->cpu_ms_sum += last_cpu_ms;
                    c->wall_ms_sum += t;
                }
            }
        }
    }

    for (int i = 0; i < nc; ++i) {
        candidate *c = &cands[i];
        if (path_is_library(c->path) && c->state == CAND_OK) {
            widen_into(d.out_f, c->out, d.n_qo, dt->out);
            c->diff_naive = naive_check(s, d.q, d.k, d.v, d.out_f);
        }
        report(&d, c, cfg);
        free(c->out);
    }
    free(cands);
    if (d.qs != d.q)
        free(d.qs);
    if (d.ks != d.k)
        free(d.ks);
    if (d.vs != d.v)
        free(d.vs);
    free(d.q);
    free(d.k);
    free(d.v);
    free(d.ref_out);
    free(d.ref_f);
    free(d.out_f);
    free(d.floor_out);
    free(d.scores);
}

/* ============================================================================================
 * Serving rows (issue 10, libsdpa 0.5): paged decode, a mixed packed batch, sinks and ALiBi,
 * a caller thread pool. Same scheme as bench_case() (warm-up, one untimed memory probe, the
 * candidates round-robin in a BLAS-free phase and a BLAS phase, medians and spread, the kernel
 * that ran, every library output checked against the reference path and a double-precision
 * evaluation), but the candidates of a case are different calls over the same keys:
 *
 *   paged-BxHxLxSxE-bsN   (decode, f32 / f16kv / bf16kv caches; key_lengths = S for all rows)
 *       dense        sdpa_attention on the contiguous [B, Hkv, S, E] cache (key_lengths set)
 *       paged        the same keys in a block pool [num_blocks, Hkv, N, E] with a block table:
 *                    blocks in random order, 3 unused blocks and the slots past S full of NaN
 *       bw-floor     one sequential read of the K and V bytes (as the decode rows)
 *   mixed-Px L+Dx1-S..-H..-kv..-E..   (f32; one engine step: P prefill chunks of L queries and
 *                    D decode rows, every sequence over S keys, causal bottom-right)
 *       packed       ONE call: cu_seqlens_q, keys packed [1, Hkv, total_k, E] with cu_seqlens_k
 *       packed-paged ONE call: cu_seqlens_q, keys in a block pool (block size 16, random order)
 *       per-seq      the P + D calls one by one (B = 1 each, strided views of the same buffers)
 *       blas-floor-prefill  the two sgemm per (chunk, head) of the prefill chunks (dense)
 *       bw-floor-decode     a sequential read of the decode rows' K and V bytes
 *   sinkalibi-BxHxLxSxE   (f32, alignment bottom-right, slopes sdpa_alibi_slopes(H, 8))
 *       plain, sinks, alibi, sinks+alibi   the same call with and without them
 *   pool-BxHxLxSxE        (decode: f32; (1,32,1,4096,128) also f16 / bf16 K/V)
 *       builtin      the library's per-call threads (num_threads = the row's count)
 *       threadpool   a caller sdpa_threadpool of the row's thread count, created before timing
 *                    (after the cache flush its workers have stopped polling and sleep)
 *       threadpool-warm  the same pool, its call preceded (untimed, after the flush) by the same
 *                    call over a copy of the inputs: back-to-back calls, the workers polling
 *       bw-floor     as above (its targets use the faster of the 1- and 2-thread floor)
 *
 * The reference output of a case is the reference kernel on an independent form of the same
 * call: dense keys (paged, pool), the per-sequence calls (mixed), the same options (sinkalibi).
 * Library rows whose result the library promises bit for bit (paged vs dense, packed vs
 * per-seq, threadpool vs builtin, same thread count) say so in the note (same_bits_as_X=1|0).
 * =========================================================================================== */

typedef enum sv_kind { SV_PAGED, SV_MIXED, SV_SINKALIBI, SV_POOL } sv_kind;
static const char *const sv_kind_names[] = {"paged", "mixed", "sinkalibi", "pool"};

typedef struct sv_spec {
    sv_kind kind;
    int64_t B, H, Hkv, L, S, E; /* SV_MIXED: B prefill chunks of L queries (plus n_dec decode rows) */
    int64_t n_dec;
    int64_t block_size;         /* paged caches (SV_PAGED, packed-paged) */
    unsigned dtypes;
} sv_spec;

static const sv_spec sv_full_specs[] = {
    {SV_PAGED, 1, 32, 32, 1, 4096, 128, 0, 16, DT_DECODE},
    {SV_PAGED, 8, 32, 32, 1, 1024, 128, 0, 16, DT_DECODE},
    /* A Llama-3-8B-like layer (32 query heads, 8 KV heads, E = 128). */
    {SV_MIXED, 4, 32, 8, 512, 2048, 128, 60, 16, F32_ONLY},
    {SV_SINKALIBI, 1, 8, 8, 1024, 1024, 64, 0, 0, F32_ONLY},
    {SV_SINKALIBI, 1, 32, 32, 1, 4096, 128, 0, 0, F32_ONLY},
    {SV_POOL, 1, 32, 32, 1, 256, 128, 0, 0, F32_ONLY},
    {SV_POOL, 1, 8, 8, 128, 128, 64, 0, 0, F32_ONLY}, /* the small prefill of the issue-9 scaling row */
    /* The issue-9 decode shape on a pool: how much of the decode rows' distance to their floor
     * (f16/bf16 K/V: 0.87-0.89) is the per-call thread start-up rather than the stream. */
    {SV_POOL, 1, 32, 32, 1, 4096, 128, 0, 0, DT_DECODE},
};

static const sv_spec sv_smoke_specs[] = {
    {SV_PAGED, 1, 4, 4, 1, 64, 16, 0, 16, DT_DECODE},
    {SV_PAGED, 2, 4, 2, 1, 40, 8, 0, 16, DT_DECODE}, /* GQA; the last block is partly used */
    {SV_MIXED, 2, 4, 2, 12, 20, 8, 3, 16, F32_ONLY}, /* chunks of 12 > 8: the packed long path too */
    {SV_SINKALIBI, 1, 2, 2, 16, 16, 8, 0, 0, F32_ONLY},
    {SV_SINKALIBI, 1, 4, 4, 1, 64, 16, 0, 0, F32_ONLY},
    {SV_POOL, 1, 4, 4, 1, 32, 16, 0, 0, F32_ONLY},
};

typedef enum sv_var {
    SVP_DENSE, SVP_PAGED, SVP_BW, SVP_PACKED, SVP_PACKED_PAGED, SVP_PERSEQ, SVP_BLAS_PREFILL, SVP_BW_DECODE,
    SVP_PLAIN, SVP_SINKS, SVP_ALIBI, SVP_BOTH, SVP_BUILTIN, SVP_POOL, SVP_BW_PAGED, SVP_POOL_WARM, SVP_COUNT
} sv_var;
static const char *const sv_var_names[SVP_COUNT] = {
    "dense", "paged", "bw-floor", "packed", "packed-paged", "per-seq", "blas-floor-prefill", "bw-floor-decode",
    "plain", "sinks", "alibi", "sinks+alibi", "builtin", "threadpool", "bw-floor-paged", "threadpool-warm"};

static int sv_var_is_floor(sv_var v) {
    return v == SVP_BW || v == SVP_BLAS_PREFILL || v == SVP_BW_DECODE || v == SVP_BW_PAGED;
}

/* The candidates of each kind, in row order. */
static int sv_vars_of(sv_kind kind, sv_var *out) {
    static const sv_var paged[] = {SVP_DENSE, SVP_PAGED, SVP_BW, SVP_BW_PAGED};
    static const sv_var mixed[] = {SVP_PACKED, SVP_PACKED_PAGED, SVP_PERSEQ, SVP_BLAS_PREFILL, SVP_BW_DECODE};
    static const sv_var feat[] = {SVP_PLAIN, SVP_SINKS, SVP_ALIBI, SVP_BOTH};
    static const sv_var pool[] = {SVP_BUILTIN, SVP_POOL, SVP_POOL_WARM, SVP_BW};
    const sv_var *v = kind == SV_PAGED ? paged : kind == SV_MIXED ? mixed : kind == SV_SINKALIBI ? feat : pool;
    int n = kind == SV_PAGED ? 4 : kind == SV_MIXED ? 5 : 4;
    memcpy(out, v, (size_t)n * sizeof *v);
    return n;
}

/* Which reference output a candidate is compared with (sinkalibi: one per option set), and
 * the candidate whose call, with the reference kernel, makes it. */
static int sv_ref_id(sv_var v) { return v == SVP_SINKS ? 1 : v == SVP_ALIBI ? 2 : v == SVP_BOTH ? 3 : 0; }
static sv_var sv_ref_var(sv_var v) {
    switch (v) {
    case SVP_PAGED: return SVP_DENSE;
    case SVP_PACKED:
    case SVP_PACKED_PAGED: return SVP_PERSEQ;
    case SVP_POOL:
    case SVP_POOL_WARM: return SVP_BUILTIN;
    default: return v;
    }
}
/* The candidate a library row must match bit for bit at the same thread count, or -1. */
static int sv_same_bits_as(sv_var v) {
    return v == SVP_PAGED ? SVP_DENSE : (v == SVP_PACKED || v == SVP_PACKED_PAGED) ? SVP_PERSEQ
                                      : (v == SVP_POOL || v == SVP_POOL_WARM) ? SVP_BUILTIN : -1;
}

typedef struct sv_cand {
    sv_var var;
    int threads;
    sdpa_threadpool *pool; /* SVP_POOL, SVP_POOL_WARM */
    cand_state state;
    char kernel[96];
    char note[200];
    double times[MAX_REPS];
    int ntimes;
    double cpu_ms_sum, wall_ms_sum;
    size_t ws_bytes;
    long long rss_growth;
    double diff_ref, diff_naive;
    void *out; /* out dtype, n_out elements */
} sv_cand;

typedef struct sv_case {
    const sv_spec *sp;
    const dtype_combo *dt;
    char name[96];
    int64_t R, H, Hkv, E, Tq, Tk; /* sequences, heads, head width, query rows, key rows in all */
    int64_t n_pre;                /* SV_MIXED: the first n_pre sequences are prefill chunks */
    int packed;                   /* q [1, H, Tq, E], k/v [1, Hkv, Tk, E]; else [R, H, L, E], [R, Hkv, S, E] */
    int64_t *Lr, *Sr, *q_r0, *k_r0; /* per sequence: queries, keys, first element of head 0 */
    int64_t qsH, ksH;             /* elements between heads in q (and out) and in k/v */
    int32_t *cu_q, *cu_k;
    int64_t *lens;                /* key_lengths = Sr */
    float *q, *k, *v;             /* float32 values (the stored ones, widened) */
    void *qs, *ks, *vs;           /* as stored (== q, k, v for f32) */
    void *qs2, *ks2, *vs2, *out2; /* SV_POOL: a copy, for threadpool-warm's untimed call */
    void *kpool, *vpool;          /* paged: [num_blocks, Hkv, bs, E] */
    int32_t *table;
    int64_t num_blocks, max_blocks, bs;
    struct sv_seg *pseg;          /* bw-floor-paged: the block runs, built once (not timed) */
    int npseg;
    float *sinks, *slopes;
    float *scores, *floor_out;    /* the BLAS floor's buffers */
    void *ref_out[4];
    float *ref_f[4];
    int have_ref[4];
    float *out_f;
    size_t n_out;
    double tol;
    int decode_like;              /* flushed before each call under --flush decode */
    sdpa_threadpool *pools[MAX_THREADS_LIST];
} sv_case;

static void sv_name(const sv_spec *sp, char *buf, size_t n) {
    if (sp->kind == SV_MIXED) {
        snprintf(buf, n, "mixed-%lldx%lld+%lldx1-S%lld-H%lld-kv%lld-E%lld", (long long)sp->B, (long long)sp->L,
                 (long long)sp->n_dec, (long long)sp->S, (long long)sp->H, (long long)sp->Hkv, (long long)sp->E);
        return;
    }
    int len = snprintf(buf, n, "%s-%lldx%lldx%lldx%lldx%lld", sv_kind_names[sp->kind], (long long)sp->B,
                       (long long)sp->H, (long long)sp->L, (long long)sp->S, (long long)sp->E);
    if (len > 0 && (size_t)len < n && sp->Hkv != sp->H)
        len += snprintf(buf + len, n - (size_t)len, "-kv%lld", (long long)sp->Hkv);
    if (len > 0 && (size_t)len < n && sp->kind == SV_PAGED)
        snprintf(buf + len, n - (size_t)len, "-bs%lld", (long long)sp->block_size);
}

/* Whether a row name matches --shapes (comma-separated substrings; none = every row). */
static int name_selected(const char *name, const char *filter) {
    if (!filter || !*filter)
        return 1;
    char tok[96];
    for (const char *p = filter; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof tok) {
            memcpy(tok, p, n);
            tok[n] = '\0';
            if (strstr(name, tok))
                return 1;
        }
        p += n;
        if (*p == ',')
            ++p;
    }
    return 0;
}

/* Elements of one NaN of a dtype, for the unused slots and blocks of a pool. */
static void sv_store_nan(void *dst, int32_t dt) {
    if (dt == SDPA_DTYPE_F32) {
        const float qnan = NAN;
        memcpy(dst, &qnan, sizeof qnan);
    } else {
        const uint16_t w = dt == SDPA_DTYPE_F16 ? 0x7E00u : 0x7FC0u;
        memcpy(dst, &w, sizeof w);
    }
}

/* A block pool holding the case's keys (and values) in random block order: block_table row r
 * names the blocks of sequence r; 3 more blocks are never named; every slot that holds no key
 * (past S_r, unused blocks) is NaN, which the library must never read. */
static void sv_build_pool(sv_case *c, int64_t bs) {
    const size_t es = dtype_size(c->dt->kv);
    const int64_t E = c->E, Hkv = c->Hkv;
    int64_t maxS = 0;
    for (int64_t r = 0; r < c->R; ++r)
        maxS = c->Sr[r] > maxS ? c->Sr[r] : maxS;
    c->bs = bs;
    c->max_blocks = (maxS + bs - 1) / bs;
    c->num_blocks = c->R * c->max_blocks + 3;
    int64_t *perm = (int64_t *)xalloc((size_t)c->num_blocks * sizeof *perm);
    for (int64_t i = 0; i < c->num_blocks; ++i)
        perm[i] = i;
    for (int64_t i = c->num_blocks - 1; i > 0; --i) { /* Fisher-Yates with the bench's generator */
        int64_t j = (int64_t)((rand_uniform() + 1.0f) * 0.5f * (float)(i + 1));
        j = j > i ? i : j < 0 ? 0 : j;
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    c->table = (int32_t *)xalloc((size_t)(c->R * c->max_blocks) * sizeof *c->table);
    const size_t pool_elems = (size_t)(c->num_blocks * Hkv * bs * E);
    c->kpool = xalloc(pool_elems * es);
    c->vpool = xalloc(pool_elems * es);
    unsigned char *kp = (unsigned char *)c->kpool, *vp = (unsigned char *)c->vpool;
    for (size_t i = 0; i < pool_elems; ++i) {
        sv_store_nan(kp + i * es, c->dt->kv);
        sv_store_nan(vp + i * es, c->dt->kv);
    }
    const unsigned char *ks = (const unsigned char *)c->ks, *vs = (const unsigned char *)c->vs;
    for (int64_t r = 0; r < c->R; ++r)
        for (int64_t b = 0; b < c->max_blocks; ++b) {
            const int64_t blk = perm[r * c->max_blocks + b];
            c->table[r * c->max_blocks + b] = (int32_t)blk;
            for (int64_t h = 0; h < Hkv; ++h)
                for (int64_t s = 0; s < bs && b * bs + s < c->Sr[r]; ++s) {
                    const size_t dst = (size_t)(((blk * Hkv + h) * bs + s) * E) * es;
                    const size_t src = (size_t)(c->k_r0[r] + h * c->ksH + (b * bs + s) * E) * es;
                    memcpy(kp + dst, ks + src, (size_t)E * es);
                    memcpy(vp + dst, vs + src, (size_t)E * es);
                }
        }
    free(perm);
}

/* Work of one candidate: dense-equivalent flops, flops over the allowed pairs, K/V bytes read. */
static void sv_work(const sv_case *c, sv_var v, double *fd, double *fe, double *bytes) {
    const int64_t first = v == SVP_BW_DECODE ? c->n_pre : 0;
    const int64_t last = v == SVP_BLAS_PREFILL ? c->n_pre : c->R;
    const int causal = c->sp->kind == SV_MIXED;
    *fd = *fe = *bytes = 0;
    for (int64_t r = first; r < last; ++r) {
        const double L = (double)c->Lr[r], S = (double)c->Sr[r];
        double pairs = L * S;
        if (causal) /* bottom-right: row i sees S - L + i + 1 keys (at most S) */
            pairs = L * (S - L) + L * (L + 1) / 2;
        *fd += 4.0 * (double)c->H * L * S * (double)c->E;
        *fe += 4.0 * (double)c->H * pairs * (double)c->E;
        *bytes += 2.0 * (double)c->Hkv * S * (double)c->E * (double)dtype_size(c->dt->kv);
    }
}

/* ---- floors */

typedef struct sv_seg {
    const void *p;
    size_t n; /* elements */
} sv_seg;

typedef struct sv_bw_task {
    const sv_seg *segs;
    int nseg;
    size_t lo, hi, elem; /* elements [lo, hi) of the concatenated segments */
    int prefetch;        /* before reading a segment, prefetch the next one (into L2) */
    float result;
} sv_bw_task;

static void *sv_bw_main(void *arg) {
    sv_bw_task *t = (sv_bw_task *)arg;
    size_t base = 0;
    float s = 0;
    for (int i = 0; i < t->nseg; ++i) {
        const size_t a = t->lo > base ? t->lo - base : 0;
        const size_t b = t->hi - base < t->segs[i].n ? t->hi - base : t->segs[i].n;
        if (t->hi > base && a < b) {
            if (t->prefetch && i + 1 < t->nseg) { /* the next run, one run ahead (T1 on x86) */
                const char *np = (const char *)t->segs[i + 1].p;
                for (size_t by = 0; by < t->segs[i + 1].n * t->elem; by += 64)
                    __builtin_prefetch(np + by, 0, 2);
            }
            if (t->elem == 4)
                s += sum_floats((const float *)t->segs[i].p + a, b - a);
            else
                s += (float)sum_words((const uint16_t *)t->segs[i].p + a, b - a);
        }
        base += t->segs[i].n;
        if (base >= t->hi)
            break;
    }
    t->result = s;
    return NULL;
}

/* A sequential read of the segments, split in contiguous equal parts over `threads` pthreads;
 * with prefetch, each segment's read is preceded by a prefetch of the next one. */
static void sv_bw_floor(const sv_seg *segs, int nseg, size_t elem, int threads, int prefetch) {
    sv_bw_task tasks[64];
    pthread_t tid[64];
    int started[64] = {0};
    size_t total = 0;
    for (int i = 0; i < nseg; ++i)
        total += segs[i].n;
    threads = threads > 64 ? 64 : threads;
    for (int t = 0; t < threads; ++t)
        tasks[t] = (sv_bw_task){segs, nseg, total * (size_t)t / (size_t)threads,
                                total * (size_t)(t + 1) / (size_t)threads, elem, prefetch, 0.0f};
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&tid[t], NULL, sv_bw_main, &tasks[t]) == 0;
    sv_bw_main(&tasks[0]);
    float s = tasks[0].result;
    for (int t = 1; t < threads; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            sv_bw_main(&tasks[t]);
        s += tasks[t].result;
    }
    bw_sink = s;
}

static void sv_floor(sv_case *c, const sv_cand *k) {
    const size_t es = dtype_size(c->dt->kv);
    if (k->var == SVP_BW_PAGED) {
        /* The paged decode's own runs: per (sequence, kv head), per 8 blocks (128 keys at block
         * size 16: the decode kernel's tile), the K block runs then the V block runs, in block
         * table order, out of the pools; split in contiguous parts over the threads (the
         * kernel's threads also walk far-apart kv heads). A read of the bytes a paged decode must
         * read, as a paged pool lays them out, each run's read preceded by a prefetch of the next
         * run (into L2: one block ahead, as the kernel's rows kernels prefetch): how the memory
         * system serves these runs, next to bw-floor's contiguous read of the same bytes. */
        if (c->pseg != NULL) {
            sv_bw_floor(c->pseg, c->npseg, es, k->threads, 1);
            return;
        }
        const int64_t tb = c->bs > 0 && c->bs < 128 ? 128 / c->bs : 1;
        size_t cap = 0;
        for (int64_t r = 0; r < c->R; ++r)
            cap += (size_t)(2 * c->Hkv * ((c->Sr[r] + c->bs - 1) / c->bs));
        sv_seg *segs = (sv_seg *)xalloc((cap ? cap : 1) * sizeof *segs);
        int n = 0;
        const unsigned char *kp = (const unsigned char *)c->kpool, *vp = (const unsigned char *)c->vpool;
        for (int64_t r = 0; r < c->R; ++r)
            for (int64_t h = 0; h < c->Hkv; ++h) {
                const int64_t nb = (c->Sr[r] + c->bs - 1) / c->bs;
                for (int64_t j0 = 0; j0 < nb; j0 += tb)
                    for (int t = 0; t < 2; ++t)
                        for (int64_t j = j0; j < j0 + tb && j < nb; ++j) {
                            const int64_t blk = c->table[r * c->max_blocks + j];
                            const int64_t rows = c->Sr[r] - j * c->bs < c->bs ? c->Sr[r] - j * c->bs : c->bs;
                            const size_t off = (size_t)(((blk * c->Hkv + h) * c->bs) * c->E) * es;
                            segs[n++] = (sv_seg){(t ? vp : kp) + off, (size_t)(rows * c->E)};
                        }
            }
        c->pseg = segs; /* the first call (the untimed warm-up) builds the list */
        c->npseg = n;
        sv_bw_floor(segs, n, es, k->threads, 1);
        return;
    }
    if (k->var == SVP_BW || k->var == SVP_BW_DECODE) {
        /* K then V of sequences [first, R): per KV head one contiguous run in either layout
         * (dense: all of them, contiguous; packed: the decode rows are the last sequences). */
        sv_seg segs[2 * 1024];
        int n = 0;
        const int64_t first = k->var == SVP_BW_DECODE ? c->n_pre : 0;
        if (!c->packed) {
            const size_t all = (size_t)(c->R * c->Hkv * c->Sr[0] * c->E);
            segs[n++] = (sv_seg){c->ks, all};
            segs[n++] = (sv_seg){c->vs, all};
        } else {
            for (int t = 0; t < 2; ++t)
                for (int64_t h = 0; h < c->Hkv && n < 2 * 1024; ++h) {
                    const unsigned char *base = (const unsigned char *)(t ? c->vs : c->ks);
                    const int64_t off = c->k_r0[first] + h * c->ksH;
                    segs[n++] = (sv_seg){base + (size_t)off * es, (size_t)((c->Tk - c->cu_k[first]) * c->E)};
                }
        }
        sv_bw_floor(segs, n, es, k->threads, 0);
        return;
    }
    /* SVP_BLAS_PREFILL: S = Q K^T and O = S V per (prefill chunk, query head), float32. */
#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_set_num_threads(k->threads);
#endif
    const int64_t E = c->E, group = c->H / c->Hkv;
    for (int64_t r = 0; r < c->n_pre; ++r)
        for (int64_t h = 0; h < c->H; ++h) {
            const int64_t L = c->Lr[r], S = c->Sr[r];
            const float *qb = c->q + c->q_r0[r] + h * c->qsH;
            const float *kb = c->k + c->k_r0[r] + (h / group) * c->ksH, *vb = c->v + c->k_r0[r] + (h / group) * c->ksH;
            float *ob = c->floor_out + c->q_r0[r] + h * c->qsH;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L, (int)S, (int)E, 1.0f, qb, (int)E, kb, (int)E,
                        0.0f, c->scores, (int)S);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)L, (int)E, (int)S, 1.0f, c->scores, (int)S, vb,
                        (int)E, 0.0f, ob, (int)E);
        }
}

/* ---- library calls */

static void sv_add_kernel(char *list, size_t n, const char *name) {
    char tok[64];
    snprintf(tok, sizeof tok, "%s", name && *name ? name : "?");
    sanitize(tok);
    for (const char *p = list; (p = strstr(p, tok)) != NULL; p += strlen(tok)) /* already listed */
        if ((p == list || p[-1] == '+') && (p[strlen(tok)] == '\0' || p[strlen(tok)] == '+'))
            return;
    size_t len = strlen(list);
    snprintf(list + len, n - len, "%s%s", len ? "+" : "", tok);
}

/* One library call of candidate k (its variant `var`) into `out`. reference: the same call with
 * options.kernel = REFERENCE and the built-in threads. ws: only the workspace size (for the
 * per-sequence calls, the largest). */
static sdpa_status sv_call(sv_case *c, sv_cand *k, sv_var var, int reference, void *out, size_t *ws) {
    const sv_spec *sp = c->sp;
    const dtype_combo *dt = c->dt;
    sdpa_options o;
    sdpa_options_init(&o);
    o.num_threads = k->threads;
    o.kernel = reference ? SDPA_KERNEL_REFERENCE : SDPA_KERNEL_AUTO;
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.causal = sp->kind == SV_MIXED;
    sdpa_status st;
    if (var == SVP_PERSEQ) {
        const size_t eq = dtype_size(dt->q), ek = dtype_size(dt->kv), eo = dtype_size(dt->out);
        if (!reference && !ws)
            k->kernel[0] = '\0';
        for (int64_t r = 0; r < c->R; ++r) {
            const int64_t qshape[4] = {1, c->H, c->Lr[r], c->E}, kshape[4] = {1, c->Hkv, c->Sr[r], c->E};
            const int64_t qstr[4] = {c->H * c->qsH, c->qsH, c->E, 1}, kstr[4] = {c->Hkv * c->ksH, c->ksH, c->E, 1};
            sdpa_tensor tq, tk, tv, to;
            if ((st = sdpa_tensor_init_strided(&tq, (const unsigned char *)c->qs + (size_t)c->q_r0[r] * eq,
                                               (sdpa_dtype)dt->q, 4, qshape, qstr)) != SDPA_OK ||
                (st = sdpa_tensor_init_strided(&tk, (const unsigned char *)c->ks + (size_t)c->k_r0[r] * ek,
                                               (sdpa_dtype)dt->kv, 4, kshape, kstr)) != SDPA_OK ||
                (st = sdpa_tensor_init_strided(&tv, (const unsigned char *)c->vs + (size_t)c->k_r0[r] * ek,
                                               (sdpa_dtype)dt->kv, 4, kshape, kstr)) != SDPA_OK ||
                (st = sdpa_tensor_init_strided(&to, (unsigned char *)out + (size_t)c->q_r0[r] * eo, (sdpa_dtype)dt->out,
                                               4, qshape, qstr)) != SDPA_OK)
                return st;
            if (ws) {
                size_t b = 0;
                if ((st = sdpa_attention_workspace_size(&tq, &tk, &tv, &o, 0, &b)) != SDPA_OK)
                    return st;
                *ws = b > *ws ? b : *ws;
                continue;
            }
            if ((st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL)) != SDPA_OK)
                return st;
            if (!reference)
                sv_add_kernel(k->kernel, sizeof k->kernel, sdpa_last_kernel());
        }
        return SDPA_OK;
    }
    sdpa_tensor tq, tk, tv, to, tkp, tvp;
    const int64_t Lq = c->packed ? c->Tq : c->Lr[0];
    const int64_t B = c->packed ? 1 : c->R, Skv = c->packed ? c->Tk : c->Sr[0];
    if ((st = view_4d(&tq, c->qs, dt->q, B, c->H, Lq, c->E)) != SDPA_OK ||
        (st = view_4d(&to, out, dt->out, B, c->H, Lq, c->E)) != SDPA_OK ||
        (st = view_4d(&tk, c->ks, dt->kv, B, c->Hkv, Skv, c->E)) != SDPA_OK ||
        (st = view_4d(&tv, c->vs, dt->kv, B, c->Hkv, Skv, c->E)) != SDPA_OK)
        return st;
    const sdpa_tensor *kk = &tk, *vv = &tv;
    if (var == SVP_PAGED || var == SVP_PACKED_PAGED) {
        if ((st = view_4d(&tkp, c->kpool, dt->kv, c->num_blocks, c->Hkv, c->bs, c->E)) != SDPA_OK ||
            (st = view_4d(&tvp, c->vpool, dt->kv, c->num_blocks, c->Hkv, c->bs, c->E)) != SDPA_OK)
            return st;
        kk = &tkp;
        vv = &tvp;
        o.block_table = c->table;
        o.max_blocks_per_seq = c->max_blocks;
    }
    switch (var) {
    case SVP_DENSE:
    case SVP_PAGED: o.key_lengths = c->lens; break;
    case SVP_PACKED:
        o.cu_seqlens_q = c->cu_q;
        o.cu_seqlens_k = c->cu_k;
        o.num_seqs = c->R;
        break;
    case SVP_PACKED_PAGED:
        o.cu_seqlens_q = c->cu_q;
        o.num_seqs = c->R;
        o.key_lengths = c->lens;
        break;
    case SVP_SINKS: o.sinks = c->sinks; break;
    case SVP_ALIBI:
        o.alibi_slopes = c->slopes;
        o.alibi_slopes_rank = 1;
        break;
    case SVP_BOTH:
        o.sinks = c->sinks;
        o.alibi_slopes = c->slopes;
        o.alibi_slopes_rank = 1;
        break;
    case SVP_POOL:
    case SVP_POOL_WARM:
        if (!reference)
            o.threadpool = k->pool;
        break;
    default: break;
    }
    if (ws)
        return sdpa_attention_workspace_size(&tq, kk, vv, &o, 0, ws);
    st = sdpa_attention(&tq, kk, vv, &o, &to, NULL, NULL);
    if (st == SDPA_OK && !reference) {
        snprintf(k->kernel, sizeof k->kernel, "%s", sdpa_last_kernel());
        sanitize(k->kernel);
        if (k->kernel[0] == '\0')
            snprintf(k->kernel, sizeof k->kernel, "?");
    }
    return st;
}

/* Max abs difference of out (widened) from a float64 evaluation of the contract on NAIVE_ROWS
 * sampled rows: causal bottom-right for the mixed batch, the sink in the denominator, ALiBi
 * s -= slope * |p - j| with p = i + S_r - L_r. */
static double sv_naive(const sv_case *c, sv_var var, const float *out) {
    const int sinks = var == SVP_SINKS || var == SVP_BOTH, alibi = var == SVP_ALIBI || var == SVP_BOTH;
    const int causal = c->sp->kind == SV_MIXED;
    const double scale = 1.0 / sqrt((double)c->E);
    int64_t maxS = 0;
    for (int64_t r = 0; r < c->R; ++r)
        maxS = c->Sr[r] > maxS ? c->Sr[r] : maxS;
    double *w = (double *)xalloc((size_t)maxS * sizeof(double));
    double worst = 0;
    for (int idx = 0; idx < NAIVE_ROWS; ++idx) {
        int64_t r;
        if (c->n_pre > 0 && c->R > c->n_pre) /* half prefill rows, half decode rows */
            r = idx < NAIVE_ROWS / 2 ? idx % c->n_pre
                                     : c->n_pre + (int64_t)(idx - NAIVE_ROWS / 2) * (c->R - c->n_pre - 1) /
                                                      (NAIVE_ROWS / 2 - 1);
        else
            r = idx % c->R;
        const int64_t Lr = c->Lr[r], Sr = c->Sr[r], h = (idx * 7) % c->H, hk = h / (c->H / c->Hkv);
        const int64_t i = Lr > 1 ? (int64_t)(idx * 5 % NAIVE_ROWS) * (Lr - 1) / (NAIVE_ROWS - 1) : 0;
        const int64_t p = i + Sr - Lr;
        const int64_t n = causal ? (p + 1 < Sr ? p + 1 : Sr) : Sr;
        const float *qr = c->q + c->q_r0[r] + h * c->qsH + i * c->E;
        const float *kb = c->k + c->k_r0[r] + hk * c->ksH, *vb = c->v + c->k_r0[r] + hk * c->ksH;
        double mx = sinks ? (double)c->sinks[h] : -INFINITY, sum = 0;
        for (int64_t j = 0; j < n; ++j) {
            double d = 0;
            for (int64_t e = 0; e < c->E; ++e)
                d += (double)qr[e] * (double)kb[j * c->E + e];
            w[j] = d * scale - (alibi ? (double)c->slopes[h] * (double)(p > j ? p - j : j - p) : 0.0);
            mx = w[j] > mx ? w[j] : mx;
        }
        if (sinks)
            sum += exp((double)c->sinks[h] - mx);
        for (int64_t j = 0; j < n; ++j)
            sum += (w[j] = exp(w[j] - mx));
        const float *orow = out + c->q_r0[r] + h * c->qsH + i * c->E;
        for (int64_t e = 0; e < c->E; ++e) {
            double acc = 0;
            for (int64_t j = 0; j < n; ++j)
                acc += w[j] * (double)vb[j * c->E + e];
            double d = fabs(acc / sum - (double)orow[e]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
    }
    free(w);
    return worst;
}

/* One call of candidate k, timed; < 0 if it failed (then k->state and k->note say why). */
static double sv_time(sv_case *c, sv_cand *k, const config *cfg, int record_diff) {
    if (cfg->flush_mode == 2 || (cfg->flush_mode == 1 && c->decode_like))
        flush_caches();
    if (k->var == SVP_POOL_WARM) {
        /* The same call on the same pool just before, over a copy of the inputs (so the timed
         * call's own bytes stay as cold as the flush left them): a layer loop's back-to-back
         * calls, whose workers are still polling (SDPA_POOL_SPIN_US) when the next call comes. */
        void *q = c->qs, *kk = c->ks, *v = c->vs;
        c->qs = c->qs2;
        c->ks = c->ks2;
        c->vs = c->vs2;
        (void)sv_call(c, k, SVP_POOL, 0, c->out2, NULL);
        c->qs = q;
        c->ks = kk;
        c->vs = v;
    }
    double c0 = cpu_ms(), t0 = now_ms();
    sdpa_status st = SDPA_OK;
    if (sv_var_is_floor(k->var))
        sv_floor(c, k);
    else
        st = sv_call(c, k, k->var, 0, k->out, NULL);
    double t1 = now_ms(), c1 = cpu_ms();
    last_cpu_ms = c1 - c0;
    if (k->var == SVP_BLAS_PREFILL)
        blas_floor_restore();
    if (st != SDPA_OK) {
        int unsupported = st == SDPA_ERR_UNSUPPORTED || (st == SDPA_ERR_DTYPE && c->dt != &dtype_combos[DT_F32]);
        k->state = unsupported ? CAND_UNSUPPORTED : CAND_ERROR;
        snprintf(k->note, sizeof k->note, "%s%s:%s", unsupported ? "not_run:" : "", sdpa_status_string(st),
                 sdpa_last_error_message());
        sanitize(k->note);
        return -1;
    }
    if (record_diff && !sv_var_is_floor(k->var) && c->have_ref[sv_ref_id(k->var)]) {
        widen_into(c->out_f, k->out, c->n_out, c->dt->out);
        double diff = max_abs_diff(c->out_f, c->ref_f[sv_ref_id(k->var)], c->n_out);
        if (isnan(k->diff_ref) || diff > k->diff_ref)
            k->diff_ref = diff;
    }
    return t1 - t0;
}

static void sv_report(const sv_case *c, const sv_cand *k, const config *cfg) {
    const sv_spec *sp = c->sp;
    const int lib = !sv_var_is_floor(k->var);
    const char *status = k->state == CAND_OK ? "ok" : k->state == CAND_UNSUPPORTED ? "unsupported" : "error";
    double med = NAN, mn = NAN, mx = NAN, gfd = NAN, gfe = NAN, gbs = NAN, cores = NAN, fd, fe, bytes;
    sv_work(c, k->var, &fd, &fe, &bytes);
    if (k->state == CAND_OK && k->ntimes > 0) {
        med = median_of(k->times, k->ntimes);
        mn = mx = k->times[0];
        for (int i = 1; i < k->ntimes; ++i) {
            mn = k->times[i] < mn ? k->times[i] : mn;
            mx = k->times[i] > mx ? k->times[i] : mx;
        }
        if (k->var != SVP_BW && k->var != SVP_BW_DECODE && k->var != SVP_BW_PAGED) {
            gfd = fd / (med * 1e6);
            gfe = (k->var == SVP_BLAS_PREFILL ? fd : fe) / (med * 1e6);
        }
        gbs = bytes / (med * 1e6);
        if (k->wall_ms_sum >= 100)
            cores = k->cpu_ms_sum / k->wall_ms_sum;
    }
    if (lib && k->state == CAND_OK &&
        (!(k->diff_ref <= c->tol || isnan(k->diff_ref)) || !(k->diff_naive <= c->tol))) {
        status = "wrong";
        any_failure = 1;
    }
    if (k->state == CAND_ERROR)
        any_failure = 1;
    char smed[32], smin[32], smax[32], sgfd[32], sgfe[32], sgbs[32], scores[32], sdr[32], sdn[32], sws[32], srss[32];
    char srss_bytes[32];
    fmt_num(smed, sizeof smed, med, "%.4f");
    fmt_num(smin, sizeof smin, mn, "%.4f");
    fmt_num(smax, sizeof smax, mx, "%.4f");
    fmt_num(sgfd, sizeof sgfd, gfd, "%.2f");
    fmt_num(sgfe, sizeof sgfe, gfe, "%.2f");
    fmt_num(sgbs, sizeof sgbs, gbs, "%.2f");
    fmt_num(scores, sizeof scores, cores, "%.2f");
    fmt_num(sdr, sizeof sdr, k->diff_ref, "%.3g");
    fmt_num(sdn, sizeof sdn, k->diff_naive, "%.3g");
    snprintf(sws, sizeof sws, "%.2f", (double)k->ws_bytes / 1048576.0);
    fmt_num(srss, sizeof srss, k->rss_growth < 0 ? NAN : (double)k->rss_growth / 1048576.0, "%.2f");
    if (k->rss_growth < 0)
        snprintf(srss_bytes, sizeof srss_bytes, "-");
    else
        snprintf(srss_bytes, sizeof srss_bytes, "%lld", k->rss_growth);
    char note[sizeof k->note];
    snprintf(note, sizeof note, "%s", k->note[0] ? k->note : "-");
    sanitize(note);
    const char *kernel = k->kernel[0] ? k->kernel : "-";
    const char *pname = sv_var_names[k->var];
    printf("%-30s %-15s %-6s %3d %-11s %-18s %4d %11s %11s %9s %9s %8s %5s %9s %9s %9s %9s  %s\n", c->name, pname,
           c->dt->name, k->threads, status, kernel, k->ntimes, smed, smin, sgfd, sgfe, sgbs, scores, sws, srss, sdr, sdn,
           note);
    fflush(stdout);
    if (csv_file) {
        fprintf(csv_file,
                "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%s,%s,%d,%s,%s,%s,%s,%s,%s,%s,%zu,%s,%s,%s,%s,%s,"
                "%lld,%s,%s,%s,%s,%s,%g,%.0f,%s,%s\n",
                c->name, sv_kind_names[sp->kind], (long long)(sp->kind == SV_MIXED ? c->R : sp->B), (long long)sp->H,
                (long long)sp->L, (long long)sp->S, (long long)sp->E, (long long)sp->E, sp->kind == SV_MIXED, pname,
                k->threads, status, kernel, k->ntimes, smed, smin, smax, sgfd, sgfe, sgbs, scores, k->ws_bytes,
                srss_bytes, sdr, sdn, blas_core, note, (long long)sp->Hkv, c->dt->name, dtype_name(c->dt->q),
                dtype_name(c->dt->kv), dtype_name(c->dt->out), cfg->isa_cap, c->tol, bytes, cpu_flags,
                sdpa_version_string());
        fflush(csv_file);
    }
}

/* Set up the case's data: sequences, inputs in their dtypes, paged pools, sinks, slopes. */
static void sv_setup(sv_case *c, const sv_spec *sp, const dtype_combo *dt, const config *cfg) {
    memset(c, 0, sizeof *c);
    c->sp = sp;
    c->dt = dt;
    sv_name(sp, c->name, sizeof c->name);
    c->H = sp->H;
    c->Hkv = sp->Hkv;
    c->E = sp->E;
    c->packed = sp->kind == SV_MIXED;
    c->n_pre = sp->kind == SV_MIXED ? sp->B : 0;
    c->R = sp->kind == SV_MIXED ? sp->B + sp->n_dec : sp->B;
    c->decode_like = sp->kind != SV_SINKALIBI || sp->L <= 4;
    c->Lr = (int64_t *)xalloc((size_t)c->R * sizeof(int64_t));
    c->Sr = (int64_t *)xalloc((size_t)c->R * sizeof(int64_t));
    c->q_r0 = (int64_t *)xalloc((size_t)c->R * sizeof(int64_t));
    c->k_r0 = (int64_t *)xalloc((size_t)c->R * sizeof(int64_t));
    c->lens = (int64_t *)xalloc((size_t)c->R * sizeof(int64_t));
    c->cu_q = (int32_t *)xalloc((size_t)(c->R + 1) * sizeof(int32_t));
    c->cu_k = (int32_t *)xalloc((size_t)(c->R + 1) * sizeof(int32_t));
    c->cu_q[0] = c->cu_k[0] = 0;
    for (int64_t r = 0; r < c->R; ++r) {
        c->Lr[r] = r < c->n_pre || !c->packed ? sp->L : 1;
        c->Sr[r] = c->lens[r] = sp->S;
        c->cu_q[r + 1] = c->cu_q[r] + (int32_t)c->Lr[r];
        c->cu_k[r + 1] = c->cu_k[r] + (int32_t)c->Sr[r];
    }
    c->Tq = c->cu_q[c->R];
    c->Tk = c->cu_k[c->R];
    for (int64_t r = 0; r < c->R; ++r) {
        if (c->packed) {
            c->q_r0[r] = c->cu_q[r] * c->E;
            c->k_r0[r] = c->cu_k[r] * c->E;
        } else {
            c->q_r0[r] = r * c->H * sp->L * c->E;
            c->k_r0[r] = r * c->Hkv * sp->S * c->E;
        }
    }
    c->qsH = c->packed ? c->Tq * c->E : sp->L * c->E;
    c->ksH = c->packed ? c->Tk * c->E : sp->S * c->E;
    c->n_out = (size_t)(c->H * c->Tq * c->E);
    const size_t n_kv = (size_t)(c->Hkv * c->Tk * c->E);
    c->tol = cfg->tol;
    {
        double eps = dtype_eps(dt->q);
        eps = dtype_eps(dt->kv) > eps ? dtype_eps(dt->kv) : eps;
        eps = dtype_eps(dt->out) > eps ? dtype_eps(dt->out) : eps;
        c->tol = 2 * eps > c->tol ? 2 * eps : c->tol;
    }
    c->q = (float *)xalloc(c->n_out * sizeof(float));
    c->k = (float *)xalloc(n_kv * sizeof(float));
    c->v = (float *)xalloc(n_kv * sizeof(float));
    for (size_t i = 0; i < c->n_out; ++i)
        c->q[i] = rand_uniform();
    for (size_t i = 0; i < n_kv; ++i)
        c->k[i] = rand_uniform();
    for (size_t i = 0; i < n_kv; ++i)
        c->v[i] = rand_uniform();
    c->qs = c->q;
    c->ks = c->k;
    c->vs = c->v;
    if (dt->q != SDPA_DTYPE_F32) {
        c->qs = xalloc(c->n_out * dtype_size(dt->q));
        narrow_into(c->qs, c->q, c->n_out, dt->q);
        widen_into(c->q, c->qs, c->n_out, dt->q);
    }
    if (dt->kv != SDPA_DTYPE_F32) {
        c->ks = xalloc(n_kv * dtype_size(dt->kv));
        c->vs = xalloc(n_kv * dtype_size(dt->kv));
        narrow_into(c->ks, c->k, n_kv, dt->kv);
        widen_into(c->k, c->ks, n_kv, dt->kv);
        narrow_into(c->vs, c->v, n_kv, dt->kv);
        widen_into(c->v, c->vs, n_kv, dt->kv);
    }
    if (sp->block_size > 0)
        sv_build_pool(c, sp->block_size);
    if (sp->kind == SV_POOL) { /* threadpool-warm's untimed call reads these, not the timed inputs */
        const size_t bq = c->n_out * dtype_size(dt->q), bkv = n_kv * dtype_size(dt->kv);
        c->qs2 = xalloc(bq);
        c->ks2 = xalloc(bkv);
        c->vs2 = xalloc(bkv);
        c->out2 = xalloc(c->n_out * dtype_size(dt->out));
        memcpy(c->qs2, c->qs, bq);
        memcpy(c->ks2, c->ks, bkv);
        memcpy(c->vs2, c->vs, bkv);
    }
    if (sp->kind == SV_SINKALIBI) {
        c->sinks = (float *)xalloc((size_t)c->H * sizeof(float));
        c->slopes = (float *)xalloc((size_t)c->H * sizeof(float));
        for (int64_t h = 0; h < c->H; ++h)
            c->sinks[h] = 0.5f + 0.125f * (float)(h % 8);
        if (sdpa_alibi_slopes(c->H, 8.0f, c->slopes) != SDPA_OK) {
            fprintf(stderr, "sdpa-bench: sdpa_alibi_slopes failed: %s\n", sdpa_last_error_message());
            exit(1);
        }
    }
    if (sp->kind == SV_MIXED && dt == &dtype_combos[DT_F32]) {
        c->scores = (float *)xalloc((size_t)(sp->L * sp->S) * sizeof(float));
        c->floor_out = (float *)xalloc(c->n_out * sizeof(float));
        memset(c->scores, 0, (size_t)(sp->L * sp->S) * sizeof(float));
        memset(c->floor_out, 0, c->n_out * sizeof(float));
    }
    c->out_f = (float *)xalloc(c->n_out * sizeof(float));
}

static void sv_free(sv_case *c) {
    free(c->qs2);
    free(c->ks2);
    free(c->vs2);
    free(c->out2);
    if (c->qs != c->q)
        free(c->qs);
    if (c->ks != c->k)
        free(c->ks);
    if (c->vs != c->v)
        free(c->vs);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->kpool);
    free(c->vpool);
    free(c->table);
    free(c->pseg);
    free(c->sinks);
    free(c->slopes);
    free(c->scores);
    free(c->floor_out);
    for (int i = 0; i < 4; ++i) {
        free(c->ref_out[i]);
        free(c->ref_f[i]);
    }
    free(c->out_f);
    free(c->Lr);
    free(c->Sr);
    free(c->q_r0);
    free(c->k_r0);
    free(c->lens);
    free(c->cu_q);
    free(c->cu_k);
    for (int i = 0; i < MAX_THREADS_LIST; ++i)
        sdpa_threadpool_destroy(c->pools[i]);
}

static void sv_bench_case(const sv_spec *sp, const dtype_combo *dt, const config *cfg) {
    sv_case c;
    sv_setup(&c, sp, dt, cfg);
    sv_var vars[8];
    const int nv = sv_vars_of(sp->kind, vars);
    sv_cand *cands = (sv_cand *)calloc((size_t)nv * (size_t)cfg->nthreads, sizeof(sv_cand));
    if (!cands) {
        fprintf(stderr, "sdpa-bench: out of memory\n");
        exit(1);
    }
    int nc = 0;
    for (int i = 0; i < nv; ++i) {
        if (vars[i] == SVP_BLAS_PREFILL && dt != &dtype_combos[DT_F32])
            continue;
        for (int t = 0; t < cfg->nthreads; ++t) {
            sv_cand *k = &cands[nc++];
            k->var = vars[i];
            k->threads = cfg->threads[t];
            k->state = CAND_OK;
            k->rss_growth = -1;
            k->diff_ref = k->diff_naive = NAN;
            if (!sv_var_is_floor(k->var)) {
                const size_t bytes = c.n_out * dtype_size(dt->out);
                k->out = xalloc(bytes);
                memset(k->out, 0, bytes);
            }
            switch (k->var) {
            case SVP_PAGED:
            case SVP_PACKED_PAGED:
                snprintf(k->note, sizeof k->note, "block_size=%lld;blocks=%lld;order=random;unused_blocks=3;nan_in_unused",
                         (long long)c.bs, (long long)c.num_blocks);
                break;
            case SVP_PACKED: snprintf(k->note, sizeof k->note, "cache=dense_cu_seqlens_k;seqs=%lld", (long long)c.R); break;
            case SVP_PERSEQ: snprintf(k->note, sizeof k->note, "calls=%lld", (long long)c.R); break;
            case SVP_BLAS_PREFILL:
#ifdef SDPA_BENCH_OPENBLAS_THREADS
                snprintf(k->note, sizeof k->note, "chunks=%lld;openblas_threads=%d", (long long)c.n_pre, k->threads);
#else
                snprintf(k->note, sizeof k->note, "chunks=%lld;blas_default_threads", (long long)c.n_pre);
#endif
                break;
            case SVP_BW_DECODE:
                snprintf(k->note, sizeof k->note, "decode_rows=%lld", (long long)(c.R - c.n_pre));
                break;
            case SVP_BW_PAGED:
                snprintf(k->note, sizeof k->note, "runs=K_then_V_per_128_keys;prefetch=next_run_T1;block_size=%lld;order=random",
                         (long long)c.bs);
                break;
            case SVP_SINKS:
            case SVP_ALIBI:
            case SVP_BOTH:
            case SVP_PLAIN:
                snprintf(k->note, sizeof k->note, "alignment=bottom_right%s%s",
                         k->var == SVP_SINKS || k->var == SVP_BOTH ? ";sinks=[H]" : "",
                         k->var == SVP_ALIBI || k->var == SVP_BOTH ? ";alibi=sdpa_alibi_slopes(H;8)" : "");
                break;
            case SVP_POOL:
            case SVP_POOL_WARM:
                if (!c.pools[t] && sdpa_threadpool_create(k->threads, &c.pools[t]) != SDPA_OK) {
                    k->state = CAND_ERROR;
                    snprintf(k->note, sizeof k->note, "sdpa_threadpool_create:%s", sdpa_last_error_message());
                    sanitize(k->note);
                }
                k->pool = c.pools[t];
                if (k->state == CAND_OK)
                    snprintf(k->note, sizeof k->note, "sdpa_threadpool(%d)", k->threads);
                break;
            default: break;
            }
        }
    }

    /* The reference outputs (untimed), one per option set. */
    for (int i = 0; i < nc; ++i) {
        const sv_var v = cands[i].var;
        const int id = sv_ref_id(v);
        if (sv_var_is_floor(v) || c.ref_out[id])
            continue;
        c.ref_out[id] = xalloc(c.n_out * dtype_size(dt->out));
        memset(c.ref_out[id], 0, c.n_out * dtype_size(dt->out));
        c.ref_f[id] = (float *)xalloc(c.n_out * sizeof(float));
        sv_cand rk = cands[i];
        rk.threads = cfg->threads[cfg->nthreads - 1];
        sdpa_status st = sv_call(&c, &rk, sv_ref_var(v), 1, c.ref_out[id], NULL);
        c.have_ref[id] = st == SDPA_OK;
        if (c.have_ref[id])
            widen_into(c.ref_f[id], c.ref_out[id], c.n_out, dt->out);
        else if (!(st == SDPA_ERR_DTYPE && dt != &dtype_combos[DT_F32]))
            fprintf(stderr, "sdpa-bench: %s: reference path failed: %s\n", c.name, sdpa_last_error_message());
    }

    /* Warm-up, workspace size, one untimed memory probe per candidate. */
    double slowest = 0;
    for (int i = 0; i < nc; ++i) {
        sv_cand *k = &cands[i];
        for (int w = 0; w < cfg->warmup && k->state == CAND_OK; ++w)
            sv_time(&c, k, cfg, 0);
        if (k->state != CAND_OK)
            continue;
        if (k->var == SVP_BLAS_PREFILL)
            k->ws_bytes = (size_t)(sp->L * sp->S) * sizeof(float);
        else if (!sv_var_is_floor(k->var) && sv_call(&c, k, k->var, 0, k->out, &k->ws_bytes) != SDPA_OK)
            k->ws_bytes = 0;
        long long before = cfg->rss_probe ? rss_probe_begin() : -1;
        double t = sv_time(&c, k, cfg, 1);
        k->rss_growth = rss_probe_end(before);
        slowest = t > slowest ? t : slowest;
    }
    int reps = cfg->reps;
    if (cfg->min_time_ms > 0 && slowest > 0) {
        double want = ceil(cfg->min_time_ms / slowest);
        if (want > reps)
            reps = want > 100 ? 100 : (int)want;
    }
    /* Rounds: BLAS-free candidates first (after a pause for OpenBLAS's spinning threads), then
     * the BLAS floor; within a phase round-robin with the first candidate rotating. */
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 0 && cfg->blas_quiet_ms > 0) {
            struct timespec ts = {(time_t)(cfg->blas_quiet_ms / 1000.0), (long)(fmod(cfg->blas_quiet_ms, 1000.0) * 1e6)};
            nanosleep(&ts, NULL);
        }
        for (int r = 0; r < reps; ++r)
            for (int j = 0; j < nc; ++j) {
                sv_cand *k = &cands[(j + r) % nc];
                if (k->state != CAND_OK || (k->var == SVP_BLAS_PREFILL) != (phase == 1))
                    continue;
                double t = sv_time(&c, k, cfg, 1);
                if (t >= 0 && k->ntimes < MAX_REPS) {
                    k->times[k->ntimes++] = t;
                    k->cpu_ms_sum += last_cpu_ms;
                    k->wall_ms_sum += t;
                }
            }
    }
    for (int i = 0; i < nc; ++i) {
        sv_cand *k = &cands[i];
        if (!sv_var_is_floor(k->var) && k->state == CAND_OK) {
            widen_into(c.out_f, k->out, c.n_out, dt->out);
            k->diff_naive = sv_naive(&c, k->var, c.out_f);
            const int other = sv_same_bits_as(k->var);
            for (int j = 0; other >= 0 && j < nc; ++j)
                if ((int)cands[j].var == other && cands[j].threads == k->threads && cands[j].state == CAND_OK) {
                    size_t len = strlen(k->note);
                    snprintf(k->note + len, sizeof k->note - len, "%ssame_bits_as_%s=%d", len ? ";" : "",
                             sv_var_names[other],
                             memcmp(k->out, cands[j].out, c.n_out * dtype_size(dt->out)) == 0);
                }
        }
    }
    for (int i = 0; i < nc; ++i) {
        sv_report(&c, &cands[i], cfg);
        free(cands[i].out);
    }
    free(cands);
    sv_free(&c);
}

static void sv_specs(const config *cfg, const sv_spec **specs, size_t *n) {
    *specs = cfg->smoke ? sv_smoke_specs : sv_full_specs;
    *n = cfg->smoke ? sizeof sv_smoke_specs / sizeof *sv_smoke_specs : sizeof sv_full_specs / sizeof *sv_full_specs;
}

/* --list: the serving cases and their dtype rows (after --dtypes). */
static void sv_list(const config *cfg) {
    const sv_spec *specs;
    size_t n;
    sv_specs(cfg, &specs, &n);
    for (size_t i = 0; i < n; ++i) {
        char name[96];
        sv_name(&specs[i], name, sizeof name);
        printf("%s", name);
        for (int dt = 0; dt < DT_COUNT; ++dt)
            if (specs[i].dtypes & cfg->dtypes & DT_BIT(dt))
                printf(" %s", dtype_combos[dt].name);
        printf("\n");
    }
}

static void sv_run_all(const config *cfg) {
    const sv_spec *specs;
    size_t n;
    sv_specs(cfg, &specs, &n);
    for (size_t i = 0; i < n; ++i) {
        char name[96];
        sv_name(&specs[i], name, sizeof name);
        if (!name_selected(name, cfg->shapes_filter))
            continue;
        for (int dt = 0; dt < DT_COUNT; ++dt)
            if (specs[i].dtypes & cfg->dtypes & DT_BIT(dt))
                sv_bench_case(&specs[i], &dtype_combos[dt], cfg);
    }
}

/* ------------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f,
            "usage: sdpa-bench [--smoke] [--reps N] [--warmup N] [--min-time-ms T] [--threads 1,2]\n"
            "                  [--shapes SUBSTR[,SUBSTR...]] [--csv FILE] [--tol X]\n"
            "                  [--flush decode|all|none] [--flush-mb N] [--no-rss] [--list]\n"
            "                  [--dtypes f32,f16kv,bf16kv,bf16,bf16r,bf16amx] [--baseline PATH|none] [--self-test]\n"
            "  --smoke        tiny shapes, 2 repetitions (the meson test)\n"
            "  --reps N       timed repetitions per candidate (default 5; smoke 2)\n"
            "  --warmup N     untimed calls per candidate before the memory probe (default 1)\n"
            "  --min-time-ms  raise a cheap shape's repetitions (up to 100) until each candidate\n"
            "                 runs about this long in total (default 300; smoke 0)\n"
            "  --blas-quiet-ms T  untimed pause before the BLAS-free phase of a shape, so that\n"
            "                 OpenBLAS's spinning idle threads do not take its cores (default 200;\n"
            "                 smoke 0)\n"
            "  --threads      thread counts (default 1,2)\n"
            "  --shapes       keep shapes whose name contains one of the substrings (names:\n"
            "                 peak-fma, dense-1x8x128x128x64, causal-..., cross-..., decode-..., gqa-...-kv8,\n"
            "                 memory-...)\n"
            "  --dtypes       dtype combinations to run, where a shape has them (default all):\n"
            "                 f32; f16kv / bf16kv = f32 q and out, f16 / bf16 k and v; bf16 = all bf16;\n"
            "                 bf16r = all bf16 at SDPA_PRECISION_REDUCED (bf16 dot products, P rounded);\n"
            "                 bf16amx = bf16r after sdpa_request_amx() (AMX-BF16 tiles; these rows run last)\n"
            "  --baseline P   a previous release's libsdpa.so (0.3.x, 0.4.x or 0.5.x) for the prev-* candidates;\n"
            "                 default: the meson option bench_baseline; 'none': do not load one\n"
            "  --self-test    check the f16/bf16 conversion helpers and exit\n"
            "  --csv FILE     also write the rows as CSV\n"
            "  --tol X        max abs difference allowed against the reference for f32 storage\n"
            "                 (default 1e-4; f16/bf16 cases: at least 2x the dtype's epsilon)\n"
            "  --flush        read a buffer of --flush-mb before each call (default: decode shapes)\n"
            "  --flush-mb N   size of that buffer (default 2x the last-level cache, 64..1024)\n"
            "  --no-rss       skip the peak-RSS probe\n"
            "  --list         print the shape names and exit\n");
    fprintf(f, "serving rows (issue 10; selected by --shapes and --dtypes like the shapes): paged-... (dense vs\n"
               "  paged decode), mixed-... (one packed call vs per-sequence calls vs floors), sinkalibi-...\n"
               "  (plain / sinks / alibi / sinks+alibi), pool-... (built-in threads vs an sdpa_threadpool)\n");
}

static int parse_threads(const char *arg, config *cfg) {
    cfg->nthreads = 0;
    const char *p = arg;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 64 || cfg->nthreads >= MAX_THREADS_LIST)
            return 0;
        cfg->threads[cfg->nthreads++] = (int)v;
        p = end;
        if (*p == ',')
            ++p;
        else if (*p)
            return 0;
    }
    return cfg->nthreads > 0;
}

static int parse_dtypes(const char *arg, unsigned *out) {
    *out = 0;
    const char *p = arg;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int d = 0; d < DT_COUNT; ++d)
            if (strlen(dtype_combos[d].name) == n && !strncmp(p, dtype_combos[d].name, n)) {
                *out |= DT_BIT(d);
                found = 1;
            }
        if (!found)
            return 0;
        p += n;
        if (*p == ',')
            ++p;
    }
    return *out != 0;
}

static int shape_selected(const shape *s, const char *filter) {
    char name[96];
    shape_name(s, name, sizeof name);
    return name_selected(name, filter);
}

int main(int argc, char **argv) {
    config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.reps = -1;
    cfg.warmup = 1;
    cfg.min_time_ms = -1;
    cfg.blas_quiet_ms = -1;
    cfg.threads[0] = 1;
    cfg.threads[1] = 2;
    cfg.nthreads = 2;
    cfg.tol = 1e-4;
    cfg.flush_mode = 1;
    cfg.rss_probe = 1;
    cfg.dtypes = DT_ALL;
    long flush_mb = -1;
    int list = 0, self_test = 0;
#ifdef SDPA_BENCH_BASELINE_DEFAULT
    const char *baseline = SDPA_BENCH_BASELINE_DEFAULT;
#else
    const char *baseline = "";
#endif
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--smoke"))
            cfg.smoke = 1;
        else if (!strcmp(a, "--list"))
            list = 1;
        else if (!strcmp(a, "--no-rss"))
            cfg.rss_probe = 0;
        else if (!strcmp(a, "--self-test"))
            self_test = 1;
        else if (val && !strcmp(a, "--baseline"))
            baseline = !strcmp(val, "none") ? "" : val, ++i;
        else if (val && !strcmp(a, "--dtypes")) {
            if (!parse_dtypes(val, &cfg.dtypes)) {
                fprintf(stderr, "sdpa-bench: --dtypes wants a list of f32, f16kv, bf16kv, bf16\n");
                return 2;
            }
            ++i;
        }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (val && !strcmp(a, "--reps")) {
            cfg.reps = atoi(val), ++i;
            if (cfg.reps < 1 || cfg.reps > 100) {
                fprintf(stderr, "sdpa-bench: --reps must be in 1..100\n");
                return 2;
            }
        } else if (val && !strcmp(a, "--warmup")) {
            cfg.warmup = atoi(val), ++i;
            if (cfg.warmup < 0) {
                fprintf(stderr, "sdpa-bench: --warmup must be >= 0\n");
                return 2;
            }
        } else if (val && !strcmp(a, "--min-time-ms"))
            cfg.min_time_ms = atof(val), ++i;
        else if (val && !strcmp(a, "--blas-quiet-ms"))
            cfg.blas_quiet_ms = atof(val), ++i;
        else if (val && !strcmp(a, "--threads")) {
            if (!parse_threads(val, &cfg)) {
                fprintf(stderr, "sdpa-bench: --threads wants a list like 1,2 (each 1..64)\n");
                return 2;
            }
            ++i;
        } else if (val && !strcmp(a, "--shapes"))
            cfg.shapes_filter = val, ++i;
        else if (val && !strcmp(a, "--csv"))
            cfg.csv_path = val, ++i;
        else if (val && !strcmp(a, "--tol"))
            cfg.tol = atof(val), ++i;
        else if (val && !strcmp(a, "--flush-mb"))
            flush_mb = atol(val), ++i;
        else if (val && !strcmp(a, "--flush")) {
            cfg.flush_mode = !strcmp(val, "none") ? 0 : !strcmp(val, "decode") ? 1 : !strcmp(val, "all") ? 2 : -1;
            if (cfg.flush_mode < 0) {
                fprintf(stderr, "sdpa-bench: --flush wants decode, all or none\n");
                return 2;
            }
            ++i;
        } else {
            fprintf(stderr, "sdpa-bench: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (cfg.reps < 0)
        cfg.reps = cfg.smoke ? 2 : 5;
    if (cfg.min_time_ms < 0)
        cfg.min_time_ms = cfg.smoke ? 0 : 300;
    if (cfg.blas_quiet_ms < 0)
        cfg.blas_quiet_ms = cfg.smoke ? 0 : 200;
    const shape *shapes = cfg.smoke ? smoke_shapes : full_shapes;
    size_t nshapes = cfg.smoke ? sizeof smoke_shapes / sizeof *smoke_shapes : sizeof full_shapes / sizeof *full_shapes;
    if (self_test)
        return conversion_self_test() ? 0 : 1;
    if (list) { /* shape name, then the dtype combinations it runs with (after --dtypes) */
        for (size_t i = 0; i < nshapes; ++i) {
            char name[96];
            shape_name(&shapes[i], name, sizeof name);
            printf("%s", name);
            for (int dt = 0; dt < DT_COUNT; ++dt)
                if (shapes[i].dtypes & cfg.dtypes & DT_BIT(dt))
                    printf(" %s", dtype_combos[dt].name);
            printf("\n");
        }
        sv_list(&cfg); /* the serving rows (issue 10) */
        return 0;
    }
    const char *isa_env = getenv("SDPA_MAX_ISA");
    cfg.isa_cap = isa_env && *isa_env ? isa_env : "native";
    read_cpu_flags();
    if (cfg.smoke)
        fma_iters = 20000;
    int prev_wanted = baseline[0] != '\0';
    if (prev_wanted && !prev_load(baseline))
        return 2;

#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_default_threads = openblas_get_num_threads();
#endif
#ifdef SDPA_BENCH_OPENBLAS_CORENAME
    snprintf(blas_core, sizeof blas_core, "%s", openblas_get_corename());
    sanitize(blas_core);
#endif
    if (cfg.flush_mode != 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (flush_mb < 0)
            flush_mb = l3 > 0 ? 2 * l3 / (1024 * 1024) : 512;
        if (flush_mb < 64)
            flush_mb = 64;
        if (flush_mb > 1024)
            flush_mb = 1024;
        if (cfg.smoke)
            flush_mb = 1;
        cfg.flush_bytes = (size_t)flush_mb * 1024 * 1024;
        flush_floats = cfg.flush_bytes / sizeof(float);
        flush_buf = (float *)xalloc(cfg.flush_bytes);
        for (size_t i = 0; i < flush_floats; ++i)
            flush_buf[i] = 1.0f;
    }
    if (cfg.csv_path) {
        csv_file = fopen(cfg.csv_path, "w");
        if (!csv_file) {
            fprintf(stderr, "sdpa-bench: cannot write %s: %s\n", cfg.csv_path, strerror(errno));
            return 2;
        }
        fprintf(csv_file, "shape,kind,B,H,L,S,E,Ev,causal,path,threads,status,kernel,reps,median_ms,min_ms,max_ms,"
                          "gflops_dense,gflops_eff,gbps,cpu_cores,ws_bytes,rss_growth_bytes,max_abs_diff_ref,max_abs_diff_naive,"
                          "blas_core,note,Hkv,dtype,q_dtype,kv_dtype,out_dtype,isa_cap,tol,kv_bytes,cpu_flags,"
                          "lib_version\n");
    }

    long long rss_check = rss_probe_begin();
#if defined(__x86_64__) && defined(__GNUC__)
    /* OpenBLAS releases older than the CPU fall back to generic kernels (0.3.21 picks
     * "Prescott", SSE3, on Emerald Rapids): every BLAS-based number is then far from what
     * the machine can do. */
    if ((!strcmp(blas_core, "Prescott") || !strcmp(blas_core, "Core2") || !strcmp(blas_core, "Nehalem")) &&
        __builtin_cpu_supports("avx2"))
        printf("# WARNING: OpenBLAS runs its %s kernels on a CPU with AVX2%s; OPENBLAS_CORETYPE=%s selects faster "
               "ones\n",
               blas_core, __builtin_cpu_supports("avx512f") ? " and AVX-512" : "",
               __builtin_cpu_supports("avx512f") ? "SkylakeX (or Cooperlake)" : "Haswell");
#endif
    const char *coretype_env = getenv("OPENBLAS_CORETYPE");
    printf("# sdpa-bench: libsdpa %s, %ld online CPUs, BLAS core %s (OPENBLAS_CORETYPE=%s), OpenBLAS default threads "
           "%d, reps>=%d, warmup %d, min-time %.0f ms, blas-quiet %.0f ms, tol %g\n",
           sdpa_version_string(), sysconf(_SC_NPROCESSORS_ONLN), blas_core, coretype_env ? coretype_env : "unset",
#ifdef SDPA_BENCH_OPENBLAS_THREADS
           openblas_default_threads,
#else
           -1,
#endif
           cfg.reps, cfg.warmup, cfg.min_time_ms, cfg.blas_quiet_ms, cfg.tol);
    printf("# floors: blas-floor = 2 sgemm per (b,h), OpenBLAS threads set to the row's count; "
           "bw-floor = sum of K and V floats over the row's threads; cache flush %s (%zu MiB read before each call)\n",
           cfg.flush_mode == 0 ? "off" : cfg.flush_mode == 1 ? "on decode shapes" : "on all shapes",
           cfg.flush_bytes >> 20);
    printf("# cores = process CPU time / wall time over the timed calls, when they add up to >= 100 ms (OpenBLAS's "
           "idle threads spin for a while after a multi-threaded BLAS call; that shows here too)\n");
    printf("# memory: ws_MiB = sdpa_attention_workspace_size (blas-floor: its score buffer); rss_MiB = peak RSS "
           "growth of one untimed call (%s)\n",
           !cfg.rss_probe ? "disabled" : rss_check >= 0 ? "malloc_trim, /proc/self/clear_refs 5, VmHWM - VmRSS"
                                                         : "unavailable: /proc/self/clear_refs not writable");
    printf("# SDPA_MAX_ISA=%s; CPU flags %s; FMA probe %ld iterations per thread and call\n", cfg.isa_cap, cpu_flags,
           fma_iters);
    if (prev.handle)
        printf("# %s: libsdpa %s from %s (dlopen RTLD_LOCAL%s; options struct_size %zu)\n", prev_tag, prev.version,
               prev.path,
#if defined(RTLD_DEEPBIND) && !defined(__SANITIZE_ADDRESS__) && !defined(SDPA_BENCH_SANITIZED)
               " | RTLD_DEEPBIND",
#else
               "",
#endif
               prev_options_size());
    else
        printf("# prev-0.3: not run (no baseline library configured: --baseline PATH or meson -Dbench_baseline=PATH; "
               "bench/build_baseline.sh builds one)\n");
    printf("%-30s %-15s %-6s %3s %-11s %-18s %4s %11s %11s %9s %9s %8s %5s %9s %9s %9s %9s  %s\n", "shape", "path",
           "dtype", "thr", "status", "kernel", "reps", "median_ms", "min_ms", "GF/s", "GF/s_eff", "GB/s", "cores",
           "ws_MiB", "rss_MiB", "diff_ref", "diff_naive", "note");
    fflush(stdout);

    double t_start = now_ms();
    int amx_rows = 0;
    for (size_t i = 0; i < nshapes; ++i)
        if (shape_selected(&shapes[i], cfg.shapes_filter))
            for (int dt = 0; dt < DT_COUNT; ++dt)
                if (shapes[i].dtypes & cfg.dtypes & DT_BIT(dt)) {
                    if (dtype_combos[dt].amx)
                        amx_rows = 1;
                    else
                        bench_case(&shapes[i], &dtype_combos[dt], &cfg);
                }
    sv_run_all(&cfg); /* the serving rows (issue 10) */
    if (amx_rows) { /* the application's AMX opt-in, after every row that must not use AMX */
        const sdpa_status ast = sdpa_request_amx();
        snprintf(amx_status, sizeof amx_status, "%s", ast == SDPA_OK ? "granted" : sdpa_last_error_message());
        printf("# sdpa_request_amx(): %s; bf16amx rows follow\n", ast == SDPA_OK ? "SDPA_OK" : amx_status);
        sanitize(amx_status);
        for (size_t i = 0; i < nshapes; ++i)
            if (shape_selected(&shapes[i], cfg.shapes_filter))
                for (int dt = 0; dt < DT_COUNT; ++dt)
                    if (dtype_combos[dt].amx && (shapes[i].dtypes & cfg.dtypes & DT_BIT(dt)))
                        bench_case(&shapes[i], &dtype_combos[dt], &cfg);
    }
    printf("# done in %.1f s%s\n", (now_ms() - t_start) / 1e3, any_failure ? "; FAILURES (see status column)" : "");
    if (csv_file)
        fclose(csv_file);
    free(flush_buf);
    return any_failure ? 1 : 0;
}
