/*
 * The f16/bf16 conversion primitives (src/convert*.c) on every ISA table this CPU can run:
 * widening and the finite scans over all 65536 encodings of each dtype, narrowing against an
 * independent float64 reference (quantum arithmetic, not bit manipulation) on every halfway
 * case of both targets, every bf16 high half with the low halves that decide its rounding, edge
 * values and millions of random float32 patterns. Tables the CPU lacks print "not run".
 * White-box: links the internal objects (convert.h, cpu.h).
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif
#if defined(__aarch64__) && defined(__GNUC__)
#define HAVE_FPCR 1
#if defined(__linux__)
#include <sys/auxv.h>
#endif
static uint64_t get_fpcr(void)
{
    uint64_t r;
    __asm__ volatile("mrs %0, fpcr" : "=r"(r));
    return r;
}
static void set_fpcr(uint64_t r) { __asm__ volatile("msr fpcr, %0" : : "r"(r)); }
#endif

#include "convert.h"
#include "cpu.h"
#include "sdpa.h"

/* ------------------------------------------------------------- tables */

typedef struct table_entry {
    const sdpa__convert *t; /* NULL = not run */
    const char *name;
    const char *missing; /* why not, when t is NULL */
} table_entry;

static table_entry g_tables[5];
static int g_ntables;

static void collect_tables(void)
{
    if (g_ntables)
        return;
    const sdpa__cpu *c = sdpa__cpu_features();
    g_tables[g_ntables++] = (table_entry){&sdpa__convert_portable, "portable", NULL};
#if defined(__aarch64__)
    (void)c;
#if defined(SDPA_HAVE_CONVERT_NEON)
    g_tables[g_ntables++] = (table_entry){sdpa__cpu_has_isa(SDPA__ISA_NEON) ? &sdpa__convert_neon : NULL, "neon",
                                          "CPU lacks ASIMD"};
#else
    g_tables[g_ntables++] = (table_entry){NULL, "neon", "not built"};
#endif
#else /* x86-64 */
#if defined(SDPA_HAVE_CONVERT_AVX2)
    g_tables[g_ntables++] = (table_entry){sdpa__cpu_has_isa(SDPA__ISA_AVX2) ? &sdpa__convert_avx2 : NULL,
                                          "avx2-f16c", "CPU lacks AVX2/FMA/F16C"};
#else
    g_tables[g_ntables++] = (table_entry){NULL, "avx2-f16c", "not built (compiler lacks -mf16c)"};
#endif
#if defined(SDPA_HAVE_CONVERT_AVX512)
    g_tables[g_ntables++] = (table_entry){sdpa__cpu_has_isa(SDPA__ISA_AVX512) ? &sdpa__convert_avx512 : NULL,
                                          "avx512", "CPU lacks AVX-512 F/BW/VL"};
#else
    g_tables[g_ntables++] = (table_entry){NULL, "avx512", "not built"};
#endif
#if defined(SDPA_HAVE_AVX512BF16)
    g_tables[g_ntables++] =
        (table_entry){sdpa__cpu_has_isa(SDPA__ISA_AVX512) && c->avx512bf16 ? &sdpa__convert_avx512bf16 : NULL,
                      "avx512-bf16", "CPU lacks AVX512-BF16"};
#else
    (void)c;
    g_tables[g_ntables++] = (table_entry){NULL, "avx512-bf16", "not built (compiler lacks -mavx512bf16)"};
#endif
#endif /* x86-64 */
    int run = 0;
    for (int i = 0; i < g_ntables; ++i) {
        if (g_tables[i].t != NULL) {
            ++run;
            printf("convert table %-12s run\n", g_tables[i].name);
        } else {
            printf("convert table %-12s not run: %s\n", g_tables[i].name, g_tables[i].missing);
        }
    }
    printf("convert tables exercised: %d of %d\n", run, g_ntables);
}

/* ------------------------------------------------------- references */

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float ffrom(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Expected f32 bits of widening f16 h: the value in double from its fields, NaN quiet with payload. */
static uint32_t ref_widen_f16(uint16_t h)
{
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) {
        if (m == 0)
            return s ? 0xFF800000u : 0x7F800000u;
        return ((uint32_t)s << 31) | 0x7FC00000u | ((uint32_t)m << 13);
    }
    double v = e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, e - 25);
    return fbits((float)(s ? -v : v));
}

static uint32_t ref_widen_bf16(uint16_t h)
{
    const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    if (e == 255) {
        if (m == 0)
            return s ? 0xFF800000u : 0x7F800000u;
        return (uint32_t)h << 16; /* payload, quiet or signalling, kept */
    }
    double v = e == 0 ? ldexp((double)m, -133) : ldexp(128.0 + m, e - 134);
    return fbits((float)(s ? -v : v));
}

/* Round |x| to a multiple of 2^qexp, nearest even (exact in double: x has 24 bits). */
static double round_quantum(double a, int qexp)
{
    const double r = ldexp(a, -qexp);
    double n = floor(r);
    const double frac = r - n;
    if (frac > 0.5 || (frac == 0.5 && fmod(n, 2.0) != 0.0))
        n += 1.0;
    return n;
}

static uint16_t ref_narrow_f16(float x)
{
    const uint32_t u = fbits(x);
    const uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(x))
        return (uint16_t)(s | 0x7E00u | ((u >> 13) & 0x3FFu));
    const double a = fabs((double)x);
    if (a >= 65520.0)
        return (uint16_t)(s | 0x7C00u);
    if (a < 0x1p-14)
        return (uint16_t)(s | (uint16_t)round_quantum(a, -24)); /* 1024 = the smallest normal */
    int e;
    (void)frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    const double n = round_quantum(a, e - 10); /* in [1024, 2048] */
    return (uint16_t)(s | (uint16_t)(((e + 15) << 10) + (int)n - 1024));
}

static uint16_t ref_narrow_bf16(float x)
{
    const uint32_t u = fbits(x);
    const uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40u);
    const double a = fabs((double)x);
    if (a >= 0x1p128 - 0x1p119)
        return (uint16_t)(s | 0x7F80u);
    if (a < 0x1p-126)
        return (uint16_t)(s | (uint16_t)round_quantum(a, -133)); /* 128 = the smallest normal */
    int e;
    (void)frexp(a, &e);
    e -= 1;
    const double n = round_quantum(a, e - 7); /* in [128, 256] */
    return (uint16_t)(s | (uint16_t)(((e + 127) << 7) + (int)n - 128));
}

/* ------------------------------------------------------------- PRNG */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------- the reference itself */

/* The two references against hand-computed encodings (so a wrong reference cannot agree with a
 * wrong implementation by accident). */
static void reference_known_values(void **state)
{
    (void)state;
    assert_int_equal(ref_widen_f16(0x3C00), fbits(1.0f));
    assert_int_equal(ref_widen_f16(0xC000), fbits(-2.0f));
    assert_int_equal(ref_widen_f16(0x7BFF), fbits(65504.0f));
    assert_int_equal(ref_widen_f16(0x0001), fbits(0x1p-24f));
    assert_int_equal(ref_widen_f16(0x0400), fbits(0x1p-14f));
    assert_int_equal(ref_widen_f16(0x8000), 0x80000000u);
    assert_int_equal(ref_widen_bf16(0x3F80), fbits(1.0f));
    assert_int_equal(ref_widen_bf16(0x0001), fbits(0x1p-133f));
    assert_int_equal(ref_narrow_f16(1.0f), 0x3C00);
    assert_int_equal(ref_narrow_f16(65504.0f), 0x7BFF);
    assert_int_equal(ref_narrow_f16(65519.996f), 0x7BFF);
    assert_int_equal(ref_narrow_f16(65520.0f), 0x7C00);
    assert_int_equal(ref_narrow_f16(0x1p-24f), 0x0001);
    assert_int_equal(ref_narrow_f16(0x1p-25f), 0x0000);              /* tie to even: 0 */
    assert_int_equal(ref_narrow_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(ref_narrow_f16(0x1.8p-24f), 0x0002);            /* 1.5 quanta: tie to 2 */
    assert_int_equal(ref_narrow_f16(1.0f + 0x1p-11f), 0x3C00);       /* tie to even */
    assert_int_equal(ref_narrow_f16(1.0f + 0x1.8p-10f), 0x3C02);     /* tie to even (up) */
    assert_int_equal(ref_narrow_f16(-0.0f), 0x8000);
    assert_int_equal(ref_narrow_f16(ffrom(0x7F800001u)), 0x7E00);
    assert_int_equal(ref_narrow_f16(ffrom(0xFFFFFFFFu)), 0xFFFF);
    assert_int_equal(ref_narrow_bf16(1.0f + 0x1p-8f), 0x3F80);       /* tie to even */
    assert_int_equal(ref_narrow_bf16(1.0f + 0x1.8p-7f), 0x3F82);
    assert_int_equal(ref_narrow_bf16(FLT_MAX), 0x7F80);
    assert_int_equal(ref_narrow_bf16(ffrom(0x7F7F7FFFu)), 0x7F7F);
    assert_int_equal(ref_narrow_bf16(ffrom(0x7F7F8000u)), 0x7F80);   /* tie, odd -> up -> Inf */
    assert_int_equal(ref_narrow_bf16(ffrom(0x00400000u)), 0x0040);   /* denormal in, subnormal out */
    assert_int_equal(ref_narrow_bf16(ffrom(0x00008000u)), 0x0000);   /* tie to even: 0 */
    assert_int_equal(ref_narrow_bf16(ffrom(0x00018000u)), 0x0002);
    assert_int_equal(ref_narrow_bf16(ffrom(0x7F800001u)), 0x7FC0);
}

/* The header's scalar helpers equal the references on every encoding / halfway case class. */
static void scalar_helpers_match_reference(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; ++h) {
        if (fbits(sdpa__f16_to_f32((uint16_t)h)) != ref_widen_f16((uint16_t)h))
            fail_msg("sdpa__f16_to_f32(0x%04x) = 0x%08x, expected 0x%08x", h, fbits(sdpa__f16_to_f32((uint16_t)h)),
                     ref_widen_f16((uint16_t)h));
        if (fbits(sdpa__bf16_to_f32((uint16_t)h)) != ref_widen_bf16((uint16_t)h))
            fail_msg("sdpa__bf16_to_f32(0x%04x) wrong", h);
    }
    for (int i = 0; i < 1 << 20; ++i) {
        const float x = ffrom((uint32_t)rnd());
        if (sdpa__f32_to_f16(x) != ref_narrow_f16(x))
            fail_msg("sdpa__f32_to_f16(0x%08x) = 0x%04x, expected 0x%04x", fbits(x), sdpa__f32_to_f16(x), ref_narrow_f16(x));
        if (sdpa__f32_to_bf16(x) != ref_narrow_bf16(x))
            fail_msg("sdpa__f32_to_bf16(0x%08x) = 0x%04x, expected 0x%04x", fbits(x), sdpa__f32_to_bf16(x),
                     ref_narrow_bf16(x));
    }
}

/* ------------------------------------------------------------ widening */

typedef void (*widen_fn)(const uint16_t *, ptrdiff_t, int64_t, float *);
typedef uint32_t (*widen_ref_fn)(uint16_t);

static void check_widen(const char *tname, const char *what, widen_fn f, widen_ref_fn ref)
{
    enum { N = 65536 };
    uint16_t *src = malloc(N * sizeof *src);
    float *dst = malloc((N + 64) * sizeof *dst);
    assert_non_null(src);
    assert_non_null(dst);
    for (uint32_t h = 0; h < N; ++h)
        src[h] = (uint16_t)h;
    /* contiguous, all encodings in one call */
    f(src, 1, N, dst);
    for (uint32_t h = 0; h < N; ++h)
        if (fbits(dst[h]) != ref((uint16_t)h))
            fail_msg("%s %s: 0x%04x -> 0x%08x, expected 0x%08x", tname, what, h, fbits(dst[h]), ref((uint16_t)h));
    /* strided: every encoding again through strides 3 and -1 (the lengths cover tails) */
    const ptrdiff_t strides[] = {3, -1, 7};
    for (int si = 0; si < 3; ++si) {
        const ptrdiff_t st = strides[si];
        const int64_t n = st > 0 ? (N + st - 1) / st : N;
        for (int64_t off = 0; off < (st > 0 ? st : 1); ++off) {
            const uint16_t *base = st > 0 ? src + off : src + N - 1;
            const int64_t cnt = st > 0 ? (N - off + st - 1) / st : n;
            f(base, st, cnt, dst);
            for (int64_t t = 0; t < cnt; ++t) {
                const uint16_t h = base[t * st];
                if (fbits(dst[t]) != ref(h))
                    fail_msg("%s %s stride %td: 0x%04x -> 0x%08x, expected 0x%08x", tname, what, st, h, fbits(dst[t]),
                             ref(h));
            }
        }
    }
    /* stride 0 (broadcast) and every short length at odd offsets: nothing beyond n is written */
    for (int64_t n = 0; n <= 70; ++n) {
        for (int64_t k = 0; k < n + 8; ++k)
            dst[k] = -12345.0f;
        f(src + 0x3C00 + n, 1, n, dst);
        for (int64_t t = 0; t < n; ++t)
            if (fbits(dst[t]) != ref(src[0x3C00 + n + t]))
                fail_msg("%s %s n=%lld t=%lld wrong", tname, what, (long long)n, (long long)t);
        for (int64_t k = n; k < n + 8; ++k)
            if (dst[k] != -12345.0f)
                fail_msg("%s %s n=%lld wrote beyond n", tname, what, (long long)n);
        f(src + 0x7C01, 0, n, dst);
        for (int64_t t = 0; t < n; ++t)
            if (fbits(dst[t]) != ref(0x7C01))
                fail_msg("%s %s stride 0 wrong", tname, what);
    }
    free(src);
    free(dst);
}

static void widen_f16_all_encodings(void **state)
{
    (void)state;
    collect_tables();
    for (int i = 0; i < g_ntables; ++i)
        if (g_tables[i].t)
            check_widen(g_tables[i].name, "widen_f16", g_tables[i].t->widen_f16, ref_widen_f16);
}

static void widen_bf16_all_encodings(void **state)
{
    (void)state;
    collect_tables();
    for (int i = 0; i < g_ntables; ++i)
        if (g_tables[i].t)
            check_widen(g_tables[i].name, "widen_bf16", g_tables[i].t->widen_bf16, ref_widen_bf16);
}

/* ------------------------------------------------------------ finite scans */

typedef bool (*finite_fn)(const uint16_t *, ptrdiff_t, int64_t);

static void check_finite(const char *tname, const char *what, finite_fn f, widen_ref_fn ref, uint16_t one,
                         uint16_t inf)
{
    /* every encoding alone */
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t x = (uint16_t)h;
        const bool want = isfinite(ffrom(ref(x)));
        if (f(&x, 1, 1) != want)
            fail_msg("%s %s: 0x%04x reported %s", tname, what, h, want ? "not finite" : "finite");
    }
    /* each non-finite class at every position of arrays of every length up to 100, both
     * contiguous and strided: the vector bodies and tails all see it */
    enum { MAXN = 100 };
    uint16_t buf[MAXN * 3];
    const uint16_t bads[] = {inf, (uint16_t)(inf | 0x8000u), (uint16_t)(inf | 1u), (uint16_t)(inf | 0x8001u)};
    for (int64_t n = 0; n <= MAXN; ++n) {
        for (int k = 0; k < MAXN * 3; ++k)
            buf[k] = one;
        if (!f(buf, 1, n) || !f(buf, 3, n) || !f(buf + n - (n > 0), -1, n))
            fail_msg("%s %s: all-finite array of %lld reported not finite", tname, what, (long long)n);
        for (int64_t p = 0; p < n; ++p) {
            const uint16_t b = bads[p % 4];
            buf[p] = b;
            if (f(buf, 1, n))
                fail_msg("%s %s: 0x%04x at %lld of %lld missed", tname, what, b, (long long)p, (long long)n);
            buf[p] = one;
            buf[3 * p] = b;
            if (f(buf, 3, n))
                fail_msg("%s %s: 0x%04x at %lld of %lld (stride 3) missed", tname, what, b, (long long)p, (long long)n);
            buf[3 * p] = one;
        }
        /* a non-finite just beyond n is not read into the answer */
        buf[n] = inf;
        if (!f(buf, 1, n))
            fail_msg("%s %s: element beyond n=%lld counted", tname, what, (long long)n);
        buf[n] = one;
    }
    /* all 65536 encodings in one array: not finite; only the finite ones: finite */
    uint16_t *all = malloc(65536 * sizeof *all);
    assert_non_null(all);
    int64_t nf = 0;
    for (uint32_t h = 0; h < 65536; ++h)
        if (isfinite(ffrom(ref((uint16_t)h))))
            all[nf++] = (uint16_t)h;
    if (!f(all, 1, nf))
        fail_msg("%s %s: the %lld finite encodings reported not finite", tname, what, (long long)nf);
    for (uint32_t h = 0; h < 65536; ++h)
        all[h] = (uint16_t)h;
    if (f(all, 1, 65536))
        fail_msg("%s %s: all encodings reported finite", tname, what);
    free(all);
}

static void finite_f16_all_encodings(void **state)
{
    (void)state;
    collect_tables();
    for (int i = 0; i < g_ntables; ++i)
        if (g_tables[i].t)
            check_finite(g_tables[i].name, "finite_f16", g_tables[i].t->finite_f16, ref_widen_f16, 0x3C00, 0x7C00);
}

static void finite_bf16_all_encodings(void **state)
{
    (void)state;
    collect_tables();
    for (int i = 0; i < g_ntables; ++i)
        if (g_tables[i].t)
            check_finite(g_tables[i].name, "finite_bf16", g_tables[i].t->finite_bf16, ref_widen_bf16, 0x3F80, 0x7F80);
}

/* ------------------------------------------------------------ narrowing */

typedef void (*narrow_fn)(const float *, int64_t, uint16_t *, ptrdiff_t);
typedef uint16_t (*narrow_ref_fn)(float);

typedef struct inputs {
    float *x;
    size_t n, cap;
} inputs;

static void push(inputs *in, float x)
{
    if (in->n == in->cap) {
        in->cap = in->cap ? in->cap * 2 : 1 << 16;
        in->x = realloc(in->x, in->cap * sizeof *in->x);
        assert_non_null(in->x);
    }
    in->x[in->n++] = x;
}

static void push_pm(inputs *in, float x)
{
    push(in, x);
    push(in, -x);
}

/* Edge values of both targets and of float32 itself. */
static void push_edges(inputs *in)
{
    const float e[] = {0.0f, 1.0f, 65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f, 1e5f, 0x1p-14f,
                       0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 0x1.ffcp-15f, 0x1.ff8p-15f, FLT_MIN, FLT_TRUE_MIN,
                       FLT_MAX, INFINITY, 0x1p127f, 0x1.fep127f, 0x1.fefffep127f, 0x1.ff0000p127f, 0x1p-126f,
                       0x1p-133f, 0x1p-134f, 0x1.8p-133f, 0x1p-149f, 3.14159265f, 1.0f / 3.0f};
    for (size_t i = 0; i < sizeof e / sizeof e[0]; ++i) {
        push_pm(in, e[i]);
        push_pm(in, nextafterf(e[i], 0.0f));
        push_pm(in, nextafterf(e[i], INFINITY));
    }
    /* NaN payloads: quiet and signalling, each payload bit alone, both signs */
    for (int b = 0; b < 23; ++b) {
        push(in, ffrom(0x7F800000u | (1u << b)));
        push(in, ffrom(0xFF800000u | (1u << b)));
        push(in, ffrom(0x7FC00000u | (1u << b)));
    }
    push(in, ffrom(0x7FFFFFFFu));
    push(in, ffrom(0xFFFFFFFFu));
    /* float32 denormals */
    for (int b = 0; b < 23; ++b) {
        push_pm(in, ffrom(1u << b));
        push_pm(in, ffrom((1u << b) | 1u));
        push_pm(in, ffrom(((1u << (b + 1)) - 1u)));
    }
}

/* Every value of the 16-bit target, the midpoint to its successor and the float32 neighbours of
 * that midpoint (the halfway cases of every binade, subnormal ones included). */
static void push_halfway(inputs *in, widen_ref_fn ref)
{
    for (uint32_t h = 0; h < 0x8000u; ++h) {
        const float a = ffrom(ref((uint16_t)h));
        if (!isfinite(a))
            continue;
        const float b = ffrom(ref((uint16_t)(h + 1))); /* successor (Inf after the largest) */
        const double mid = isfinite(b) ? ((double)a + (double)b) / 2.0 : (double)a + ((double)a - (double)ffrom(ref((uint16_t)(h - 1)))) / 2.0;
        const float m = (float)mid; /* exact: midpoints have one more bit than the target */
        push_pm(in, a);
        push_pm(in, m);
        push_pm(in, nextafterf(m, 0.0f));
        push_pm(in, nextafterf(m, INFINITY));
    }
}

static void push_random(inputs *in, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = rnd();
        switch (r & 3) {
        case 0: push(in, ffrom((uint32_t)(r >> 32))); break;                          /* any pattern */
        case 1: push(in, (float)ldexp((double)(r >> 40) / 16777216.0 - 0.5, (int)((r >> 8) & 63) - 40)); break;
        case 2: push(in, ffrom((uint32_t)(((r >> 32) & 0xFFFF0000u) | 0x8000u))); break; /* bf16 ties */
        default: push(in, ffrom((uint32_t)(((r >> 32) & 0xFFFFE000u) | 0x1000u))); break; /* f16-normal ties */
        }
    }
}

static void check_narrow(const char *tname, const char *what, narrow_fn f, narrow_ref_fn ref, const inputs *in)
{
    const size_t n = in->n;
    uint16_t *want = malloc(n * sizeof *want), *got = malloc((2 * n + 64) * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t i = 0; i < n; ++i)
        want[i] = ref(in->x[i]);
    f(in->x, (int64_t)n, got, 1);
    for (size_t i = 0; i < n; ++i)
        if (got[i] != want[i])
            fail_msg("%s %s: 0x%08x (%a) -> 0x%04x, expected 0x%04x", tname, what, fbits(in->x[i]), (double)in->x[i],
                     got[i], want[i]);
    /* stride 2 (the slots between are untouched) and stride -1 */
    for (size_t i = 0; i < 2 * n; ++i)
        got[i] = 0xABCD;
    f(in->x, (int64_t)n, got, 2);
    for (size_t i = 0; i < n; ++i)
        if (got[2 * i] != want[i] || got[2 * i + 1] != 0xABCD)
            fail_msg("%s %s stride 2: element %zu wrong", tname, what, i);
    f(in->x, (int64_t)n, got + n - 1, -1);
    for (size_t i = 0; i < n; ++i)
        if (got[n - 1 - i] != want[i])
            fail_msg("%s %s stride -1: element %zu wrong", tname, what, i);
    /* short lengths: nothing beyond n is written */
    for (int64_t m = 0; m <= 70 && (size_t)m <= n; ++m) {
        for (int64_t k = 0; k < m + 8; ++k)
            got[k] = 0xABCD;
        f(in->x + 5, m, got, 1);
        for (int64_t k = 0; k < m; ++k)
            if (got[k] != want[5 + k])
                fail_msg("%s %s n=%lld wrong", tname, what, (long long)m);
        for (int64_t k = m; k < m + 8; ++k)
            if (got[k] != 0xABCD)
                fail_msg("%s %s n=%lld wrote beyond n", tname, what, (long long)m);
    }
    free(want);
    free(got);
}

static void narrow_against_reference(narrow_ref_fn ref, widen_ref_fn wref, const char *what, int is_f16)
{
    collect_tables();
    inputs in = {0};
    push_edges(&in);
    push_halfway(&in, wref);
    if (!is_f16) {
        /* every bf16 high half with the low halves that decide its rounding */
        const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000};
        for (uint32_t hi = 0; hi < 65536; ++hi)
            for (size_t k = 0; k < sizeof lows / sizeof lows[0]; ++k)
                push(&in, ffrom((hi << 16) | lows[k]));
    } else {
        /* every f16-relevant float32 (sign, exponent, top 10 mantissa bits) with the low 13 bits
         * that decide a normal result's rounding */
        const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF};
        for (uint32_t hi = 0; hi < (1u << 19); ++hi)
            for (size_t k = 0; k < sizeof lows / sizeof lows[0]; ++k)
                push(&in, ffrom((hi << 13) | lows[k]));
    }
    push_random(&in, 4u << 20);
    printf("%s: %zu inputs per table\n", what, in.n);
    for (int i = 0; i < g_ntables; ++i) {
        if (!g_tables[i].t)
            continue;
        check_narrow(g_tables[i].name, what, is_f16 ? g_tables[i].t->narrow_f16 : g_tables[i].t->narrow_bf16, ref, &in);
    }
    free(in.x);
}

static void narrow_f16_matches_reference(void **state)
{
    (void)state;
    narrow_against_reference(ref_narrow_f16, ref_widen_f16, "narrow_f16", 1);
}

static void narrow_bf16_matches_reference(void **state)
{
    (void)state;
    narrow_against_reference(ref_narrow_bf16, ref_widen_bf16, "narrow_bf16", 0);
}

/* Widening then narrowing gives every non-NaN encoding back (and NaNs stay NaN). */
static void round_trip_is_identity(void **state)
{
    (void)state;
    collect_tables();
    uint16_t src[65536], back[65536];
    float *mid = malloc(65536 * sizeof *mid);
    assert_non_null(mid);
    for (uint32_t h = 0; h < 65536; ++h)
        src[h] = (uint16_t)h;
    for (int i = 0; i < g_ntables; ++i) {
        const sdpa__convert *t = g_tables[i].t;
        if (!t)
            continue;
        for (int d = 0; d < 2; ++d) {
            (d ? t->widen_bf16 : t->widen_f16)(src, 1, 65536, mid);
            (d ? t->narrow_bf16 : t->narrow_f16)(mid, 65536, back, 1);
            for (uint32_t h = 0; h < 65536; ++h) {
                const bool nan = isnan(mid[h]);
                const uint16_t q = d ? (uint16_t)(h | 0x40u) : (uint16_t)(h | 0x200u); /* NaN made quiet */
                if (back[h] != (nan ? q : h))
                    fail_msg("%s %s: 0x%04x -> 0x%04x", g_tables[i].name, d ? "bf16" : "f16", h, back[h]);
            }
        }
    }
    free(mid);
}

/* The ISA choice: the exact table of a level exists iff the CPU has it, and the fallback never
 * returns NULL and never a level above the one asked for. */
static void table_choice_follows_cpu(void **state)
{
    (void)state;
    collect_tables();
    assert_ptr_equal(sdpa__convert_exact(SDPA__ISA_PORTABLE), &sdpa__convert_portable);
    assert_ptr_equal(sdpa__convert_for_isa(SDPA__ISA_PORTABLE), &sdpa__convert_portable);
    assert_null(sdpa__convert_exact(SDPA__ISA_COUNT));
    for (int isa = 0; isa < SDPA__ISA_COUNT; ++isa) {
        const sdpa__convert *e = sdpa__convert_exact(isa);
        if (!sdpa__cpu_has_isa(isa))
            assert_null(e);
        assert_non_null(sdpa__convert_for_isa(isa));
        if (e)
            assert_ptr_equal(sdpa__convert_for_isa(isa), e);
        printf("isa %-8s conversion table %s\n", sdpa__isa_name(isa), e ? e->name : "none (not run)");
    }
    const sdpa__cpu *c = sdpa__cpu_features();
    assert_ptr_equal(c, sdpa__cpu_features()); /* read once */
    printf("cpu: avx2=%d fma=%d f16c=%d avx512f=%d bw=%d vl=%d avx512bf16=%d avx512fp16=%d amx_tile=%d amx_bf16=%d\n",
           c->avx2, c->fma, c->f16c, c->avx512f, c->avx512bw, c->avx512vl, c->avx512bf16, c->avx512fp16, c->amx_tile,
           c->amx_bf16);
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    /* cross-check against the compiler's own detection */
    __builtin_cpu_init();
    assert_int_equal(c->avx2, __builtin_cpu_supports("avx2") != 0);
    assert_int_equal(c->fma, __builtin_cpu_supports("fma") != 0);
    assert_int_equal(c->avx512f, __builtin_cpu_supports("avx512f") != 0);
    assert_int_equal(c->avx512bw, __builtin_cpu_supports("avx512bw") != 0);
    assert_int_equal(c->avx512vl, __builtin_cpu_supports("avx512vl") != 0);
    assert_int_equal(c->avx512bf16, __builtin_cpu_supports("avx512bf16") != 0);
#endif
#if defined(__aarch64__) && defined(__linux__)
    printf("cpu: asimd=%d fp16=%d bf16=%d dotprod=%d\n", c->asimd, c->fp16, c->bf16, c->dotprod);
    /* cross-check against the auxiliary vector (HWCAP_ASIMD bit 1, HWCAP2_BF16 bit 14) */
    assert_int_equal(c->asimd, (getauxval(AT_HWCAP) & (1ul << 1)) != 0);
    assert_int_equal(c->bf16, (getauxval(AT_HWCAP2) & (1ul << 14)) != 0);
    assert_int_equal(sdpa__cpu_has_isa(SDPA__ISA_NEON), c->asimd);
    assert_false(sdpa__cpu_has_isa(SDPA__ISA_AVX2));
#endif
}

/* The row helpers over every dtype equal the element-wise scalar conversions, with strided,
 * reversed and broadcast sources and strided destinations; nothing outside the rows is touched. */
static void row_helpers_match_scalar(void **state)
{
    (void)state;
    collect_tables();
    enum { R = 5, C = 37, RS = 41, N = R * RS * 2 + 64 };
    uint16_t *h = malloc(N * 2);
    float *f = malloc(N * 4), *dst = malloc(N * 4);
    uint16_t *hd = malloc(N * 2);
    float *fd = malloc(N * 4);
    assert_true(h && f && dst && hd && fd);
    for (int i = 0; i < N; ++i) {
        h[i] = (uint16_t)rnd();
        f[i] = (float)((double)(int64_t)(rnd() >> 11) / 1e12);
    }
    const ptrdiff_t css[3] = {1, 2, -1}, rss[2] = {RS * 2, 0};
    for (int ti = 0; ti < g_ntables; ++ti) {
        const sdpa__convert *t = g_tables[ti].t;
        if (!t)
            continue;
        for (int dt = 0; dt < 3; ++dt) {
            for (int a = 0; a < 3; ++a)
                for (int b = 0; b < 2; ++b) {
                    const ptrdiff_t cs = css[a], rs = rss[b];
                    const int64_t base = cs < 0 ? C : 0;
                    for (int i = 0; i < N; ++i)
                        dst[i] = -7.0f;
                    const void *src = dt == SDPA_DTYPE_F32 ? (const void *)(f + base) : (const void *)(h + base);
                    sdpa__widen_rows(t, dt, src, rs, cs, R, C, dst, C + 3);
                    for (int64_t r = 0; r < R; ++r)
                        for (int64_t c = 0; c < C + 3; ++c) {
                            const int64_t si = base + r * rs + c * cs;
                            float want = -7.0f;
                            if (c < C)
                                want = dt == SDPA_DTYPE_F32 ? f[si] : dt == SDPA_DTYPE_F16 ? sdpa__f16_to_f32(h[si]) : sdpa__bf16_to_f32(h[si]);
                            if (fbits(dst[r * (C + 3) + c]) != fbits(want))
                                fail_msg("%s widen_rows dtype %d rs %td cs %td (%lld,%lld) wrong", g_tables[ti].name, dt, rs,
                                         cs, (long long)r, (long long)c);
                        }
                    if (dt != SDPA_DTYPE_F32) {
                        bool want = true;
                        for (int64_t r = 0; r < R; ++r)
                            for (int64_t c = 0; c < C; ++c)
                                want &= isfinite(dt == SDPA_DTYPE_F16 ? sdpa__f16_to_f32(h[base + r * rs + c * cs])
                                                                      : sdpa__bf16_to_f32(h[base + r * rs + c * cs]));
                        assert_int_equal(sdpa__finite_rows(t, dt, h + base, rs, cs, R, C), want);
                    }
                }
            /* narrow into a strided destination (column stride 2, row stride 2 * C + 5) */
            for (int i = 0; i < N; ++i) {
                hd[i] = 0xABCD;
                fd[i] = -7.0f;
            }
            void *d = dt == SDPA_DTYPE_F32 ? (void *)fd : (void *)hd;
            sdpa__narrow_rows(t, dt, f, C + 1, R, C, d, 2 * C + 5, 2);
            for (int64_t r = 0; r < R; ++r)
                for (int64_t c = 0; c < 2 * C + 5; ++c) {
                    const int64_t di = r * (2 * C + 5) + c;
                    const bool in = (c % 2 == 0) && c / 2 < C;
                    const float x = f[r * (C + 1) + c / 2];
                    if (dt == SDPA_DTYPE_F32) {
                        if (fbits(fd[di]) != fbits(in ? x : -7.0f))
                            fail_msg("%s narrow_rows f32 (%lld,%lld) wrong", g_tables[ti].name, (long long)r, (long long)c);
                    } else {
                        const uint16_t want = in ? (dt == SDPA_DTYPE_F16 ? sdpa__f32_to_f16(x) : sdpa__f32_to_bf16(x)) : 0xABCD;
                        if (hd[di] != want)
                            fail_msg("%s narrow_rows dtype %d (%lld,%lld) wrong", g_tables[ti].name, dt, (long long)r,
                                     (long long)c);
                    }
                }
        }
        assert_false(sdpa__finite_rows(t, SDPA_DTYPE_F32, f, 1, 1, 1, 1));
    }
    free(h);
    free(f);
    free(dst);
    free(hd);
    free(fd);
}

/* The caller's floating-point environment does not change a conversion: with MXCSR's DAZ and FTZ
 * set (denormals read and written as zero by SSE/AVX arithmetic), or on aarch64 with FPCR's FZ
 * set and its rounding mode toward zero, every table still gives the portable table's bits,
 * which are computed with integer operations only. */
static void conversions_ignore_daz_ftz(void **state)
{
    (void)state;
#if defined(HAVE_MXCSR) || defined(HAVE_FPCR)
    collect_tables();
    enum { N = 1 << 18 };
    uint16_t *h = malloc(N * 2), *want16 = malloc(N * 2), *got16 = malloc(N * 2);
    float *f = malloc(N * 4), *wantf = malloc(N * 4), *gotf = malloc(N * 4);
    assert_true(h && want16 && got16 && f && wantf && gotf);
    for (int i = 0; i < N; ++i) {
        h[i] = (uint16_t)i;                                    /* every encoding, 4 times */
        const uint32_t r = (uint32_t)rnd();
        const uint32_t sub16 = (r & 0x807FFFFFu) | ((100u + (r >> 23) % 16u) << 23); /* f16 subnormal range */
        f[i] = ffrom(i % 3 == 0 ? (r & 0x807FFFFFu) : i % 3 == 1 ? sub16 : r); /* f32 denormals, f16 subnormals */
    }
    for (int d = 0; d < 2; ++d) {
        const sdpa__convert *p = &sdpa__convert_portable;
        for (int ti = 0; ti < g_ntables; ++ti) {
            const sdpa__convert *t = g_tables[ti].t;
            if (!t)
                continue;
            (d ? p->widen_bf16 : p->widen_f16)(h, 1, N, wantf);
            (d ? p->narrow_bf16 : p->narrow_f16)(f, N, want16, 1);
#if defined(HAVE_MXCSR)
            const unsigned saved = _mm_getcsr();
            _mm_setcsr(saved | 0x8040u); /* FTZ | DAZ */
            (d ? t->widen_bf16 : t->widen_f16)(h, 1, N, gotf);
            (d ? t->narrow_bf16 : t->narrow_f16)(f, N, got16, 1);
            _mm_setcsr(saved);
#else
            /* FPCR: FZ (bit 24, flush single-precision denormals) and RMode (bits 22-23) =
             * toward zero; FCVTN would round in that mode */
            const uint64_t saved = get_fpcr();
            set_fpcr(saved | (1ull << 24) | (3ull << 22));
            (d ? t->widen_bf16 : t->widen_f16)(h, 1, N, gotf);
            (d ? t->narrow_bf16 : t->narrow_f16)(f, N, got16, 1);
            set_fpcr(saved);
#endif
            for (int i = 0; i < N; ++i) {
                if (fbits(gotf[i]) != fbits(wantf[i]))
                    fail_msg("%s under DAZ/FTZ: widen %s 0x%04x -> 0x%08x, expected 0x%08x", g_tables[ti].name,
                             d ? "bf16" : "f16", h[i], fbits(gotf[i]), fbits(wantf[i]));
                if (got16[i] != want16[i])
                    fail_msg("%s under DAZ/FTZ: narrow %s 0x%08x -> 0x%04x, expected 0x%04x", g_tables[ti].name,
                             d ? "bf16" : "f16", fbits(f[i]), got16[i], want16[i]);
            }
        }
    }
    free(h);
    free(want16);
    free(got16);
    free(f);
    free(wantf);
    free(gotf);
#else
    printf("DAZ/FTZ check not run: neither an x86-64 nor an aarch64 build\n");
#endif
}

/* AMX opt-in (public API): on a CPU without AMX the request fails with UNSUPPORTED and a message
 * and nothing becomes available; with AMX, a granted request makes it available. */
static void amx_request_follows_cpu(void **state)
{
    (void)state;
    const sdpa__cpu *c = sdpa__cpu_features();
    if (!c->amx_tile || !c->amx_bf16) {
        assert_int_equal(sdpa_amx_available(), 0);
        assert_int_equal(sdpa_request_amx(), SDPA_ERR_UNSUPPORTED);
        assert_non_null(strstr(sdpa_last_error_message(), "lacks AMX"));
        assert_int_equal(sdpa_amx_available(), 0);
        printf("AMX not run: CPU lacks AMX (checked: request -> SDPA_ERR_UNSUPPORTED \"%s\", available() = 0)\n",
               sdpa_last_error_message());
        return;
    }
    const int before = sdpa_amx_available();
    const sdpa_status st = sdpa_request_amx();
    if (st == SDPA_OK) {
        assert_int_equal(sdpa_last_error_message()[0], '\0');
        assert_int_equal(sdpa_amx_available(), 1);
        assert_int_equal(sdpa_request_amx(), SDPA_OK); /* idempotent */
        printf("AMX permission: %s, now available\n", before ? "already granted" : "granted by the request");
    } else {
        assert_int_equal(st, SDPA_ERR_UNSUPPORTED);
        assert_true(sdpa_last_error_message()[0] != '\0');
        assert_int_equal(sdpa_amx_available(), 0);
        printf("AMX not run: Linux refused the permission: %s\n", sdpa_last_error_message());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reference_known_values),
        cmocka_unit_test(scalar_helpers_match_reference),
        cmocka_unit_test(table_choice_follows_cpu),
        cmocka_unit_test(widen_f16_all_encodings),
        cmocka_unit_test(widen_bf16_all_encodings),
        cmocka_unit_test(finite_f16_all_encodings),
        cmocka_unit_test(finite_bf16_all_encodings),
        cmocka_unit_test(narrow_f16_matches_reference),
        cmocka_unit_test(narrow_bf16_matches_reference),
        cmocka_unit_test(round_trip_is_identity),
        cmocka_unit_test(row_helpers_match_scalar),
        cmocka_unit_test(conversions_ignore_daz_ftz),
        cmocka_unit_test(amx_request_follows_cpu),
    };
    return cmocka_run_group_tests_name("convert", tests, NULL, NULL);
}
