/*
 * bf16 x bf16 micro-kernel primitives (src/microkernel_avx512bf16.c) against a float64
 * reference: Q.K^T rows and the P.V accumulation, on lengths straddling the 32-element vector
 * and the 4-row block, with row strides wider than the rows (nothing beyond a row is read: the
 * gaps hold NaN). The bound is the f32 summation bound (products of bf16 values are exact).
 * On a CPU without AVX512-BF16 the paths print "not run".
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"
#include "cpu.h"
#include "microkernel_bf16.h"

static uint64_t g_rng = 12345;
static double urand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

#define U32 (1.0 / 16777216.0)

#if defined(SDPA_HAVE_MK_AVX512BF16)
static int have_bf16(void)
{
    return sdpa__cpu_has_isa(SDPA__ISA_AVX512) && sdpa__cpu_features()->avx512bf16;
}
#endif

static void dot_rows_matches_reference(void **state)
{
    (void)state;
#if defined(SDPA_HAVE_MK_AVX512BF16)
    if (!have_bf16()) {
        printf("bf16 dot_rows avx512-bf16 not run: CPU lacks AVX512-BF16\n");
        return;
    }
    const int64_t nes[] = {1, 7, 31, 32, 33, 64, 96, 100, 128, 129};
    const int64_t ns[] = {1, 3, 4, 5, 8, 17};
    int cases = 0;
    for (size_t a = 0; a < sizeof nes / sizeof nes[0]; ++a) {
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; ++b) {
            const int64_t ne = nes[a], n = ns[b], ks = ne + 5;
            uint16_t *q = malloc((size_t)ne * 2), *k = malloc((size_t)(n * ks) * 2);
            float *s = malloc((size_t)n * 4);
            assert_non_null(q);
            assert_non_null(k);
            assert_non_null(s);
            for (int64_t e = 0; e < ne; ++e)
                q[e] = sdpa__f32_to_bf16((float)(urand() * 4.0));
            for (int64_t i = 0; i < n * ks; ++i)
                k[i] = (i % ks) < ne ? sdpa__f32_to_bf16((float)(urand() * 4.0)) : 0x7FC0; /* NaN in the gaps */
            sdpa__bf16_dot_rows_avx512bf16(q, ne, k, ks, n, s);
            for (int64_t t = 0; t < n; ++t) {
                double ref = 0.0, mag = 0.0;
                for (int64_t e = 0; e < ne; ++e) {
                    const double p = (double)sdpa__bf16_to_f32(q[e]) * (double)sdpa__bf16_to_f32(k[t * ks + e]);
                    ref += p;
                    mag += fabs(p);
                }
                const double bound = (double)(ne + 2) * U32 * mag;
                if (!(fabs((double)s[t] - ref) <= bound))
                    fail_msg("ne=%lld n=%lld row %lld: %.9g vs %.9g (bound %.3g)", (long long)ne, (long long)n,
                             (long long)t, (double)s[t], ref, bound);
            }
            free(q);
            free(k);
            free(s);
            ++cases;
        }
    }
    printf("bf16 dot_rows avx512-bf16: %d shapes run\n", cases);
#else
    printf("bf16 dot_rows avx512-bf16 not run: not built (compiler lacks -mavx512bf16)\n");
#endif
}

static void axpy_rows_matches_reference(void **state)
{
    (void)state;
#if defined(SDPA_HAVE_MK_AVX512BF16)
    if (!have_bf16()) {
        printf("bf16 axpy_rows avx512-bf16 not run: CPU lacks AVX512-BF16\n");
        return;
    }
    const int64_t nevs[] = {1, 5, 16, 31, 32, 33, 64, 80, 128};
    const int64_t cnts[] = {0, 1, 2, 3, 8, 63, 64, 65};
    const float alphas[] = {1.0f, 0.25f};
    int cases = 0;
    for (size_t a = 0; a < sizeof nevs / sizeof nevs[0]; ++a) {
        for (size_t b = 0; b < sizeof cnts / sizeof cnts[0]; ++b) {
            for (size_t c = 0; c < 2; ++c) {
                const int64_t nev = nevs[a], cnt = cnts[b], vs = nev + 3;
                const float alpha = alphas[c];
                uint16_t *p = malloc((size_t)(cnt + 1) * 2), *v = malloc((size_t)((cnt + 1) * vs) * 2);
                float *o = malloc((size_t)(nev + 8) * 4);
                double *o0 = malloc((size_t)nev * 8);
                assert_non_null(p);
                assert_non_null(v);
                assert_non_null(o);
                assert_non_null(o0);
                for (int64_t t = 0; t < cnt; ++t)
                    p[t] = sdpa__f32_to_bf16((float)fabs(urand()));
                p[cnt] = 0x7FC0; /* beyond cnt: never read */
                for (int64_t i = 0; i < (cnt + 1) * vs; ++i)
                    v[i] = (i % vs) < nev && i < cnt * vs ? sdpa__f32_to_bf16((float)(urand() * 8.0)) : 0x7FC0;
                for (int64_t d = 0; d < nev; ++d)
                    o0[d] = (double)(o[d] = (float)urand());
                for (int64_t d = nev; d < nev + 8; ++d)
                    o[d] = 1234.5f;
                sdpa__bf16_axpy_rows_avx512bf16(o, nev, alpha, p, cnt, v, vs);
                for (int64_t d = 0; d < nev; ++d) {
                    double ref = (double)alpha * o0[d], mag = fabs(ref);
                    for (int64_t t = 0; t < cnt; ++t) {
                        const double x = (double)sdpa__bf16_to_f32(p[t]) * (double)sdpa__bf16_to_f32(v[t * vs + d]);
                        ref += x;
                        mag += fabs(x);
                    }
                    const double bound = (double)(cnt + 3) * U32 * mag;
                    if (!(fabs((double)o[d] - ref) <= bound))
                        fail_msg("nev=%lld cnt=%lld alpha=%g d=%lld: %.9g vs %.9g (bound %.3g)", (long long)nev,
                                 (long long)cnt, (double)alpha, (long long)d, (double)o[d], ref, bound);
                }
                for (int64_t d = nev; d < nev + 8; ++d)
                    assert_true(o[d] == 1234.5f); /* nothing written beyond nev */
                free(p);
                free(v);
                free(o);
                free(o0);
                ++cases;
            }
        }
    }
    printf("bf16 axpy_rows avx512-bf16: %d shapes run\n", cases);
#else
    printf("bf16 axpy_rows avx512-bf16 not run: not built (compiler lacks -mavx512bf16)\n");
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dot_rows_matches_reference),
        cmocka_unit_test(axpy_rows_matches_reference),
    };
    return cmocka_run_group_tests_name("bf16_dot", tests, NULL, NULL);
}
