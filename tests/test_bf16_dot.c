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

#define U32 (1.0 / 16777216.0)

#if defined(SDPA_HAVE_MK_AVX512BF16)
static uint64_t g_rng = 12345;
static double urand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

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

/* The tiled kernel's bf16 lanes path: scores blocked 8 x 32 equal, bit for bit, the one-key
 * kernel; probabilities are rounded to bf16 to nearest even (below 2^-126: 0) and paired; value
 * rows are paired through an index list (the rows it skips hold NaN and are never read); the
 * pair product with and without beta is within the f32 summation bound of a float64 evaluation
 * of the rounded P times V, and writes nothing beyond its w lanes and nev rows. */
static void lanes_pairs_match_reference(void **state)
{
    (void)state;
#if defined(SDPA_HAVE_MK_AVX512BF16)
    if (!have_bf16()) {
        printf("bf16 lanes pairs avx512-bf16 not run: CPU lacks AVX512-BF16\n");
        return;
    }
    const int64_t nes[] = {1, 2, 7, 64, 65, 128};
    const int64_t ws[] = {16, 32, 48, 64};
    const int64_t ns[] = {0, 1, 2, 7, 8, 9, 33, 64};
    int cases = 0;
    for (size_t a = 0; a < sizeof nes / sizeof nes[0]; ++a)
        for (size_t b = 0; b < sizeof ws / sizeof ws[0]; ++b)
            for (size_t c = 0; c < sizeof ns / sizeof ns[0]; ++c) {
                const int64_t ne = nes[a], w = ws[b], n = ns[c], ld = w + 16, ks = ne + 3, np = (ne + 1) / 2;
                const int64_t nk = n > 0 ? n : 1;
                /* scores */
                uint32_t *qp = calloc((size_t)(np * ld), 4);
                uint16_t *k = malloc((size_t)(nk * ks) * 2);
                float *s1 = malloc((size_t)(nk * ld) * 4), *s2 = malloc((size_t)(nk * ld) * 4);
                assert_true(qp && k && s1 && s2);
                for (int64_t pi = 0; pi < np; ++pi)
                    for (int64_t l = 0; l < w; ++l) {
                        const uint32_t lo = sdpa__f32_to_bf16((float)urand());
                        const uint32_t hi = 2 * pi + 1 < ne ? sdpa__f32_to_bf16((float)urand()) : 0u;
                        qp[pi * ld + l] = lo | hi << 16;
                    }
                for (int64_t i = 0; i < nk * ks; ++i)
                    k[i] = (i % ks) < ne ? sdpa__f32_to_bf16((float)(urand() * 2.0)) : 0x7FC0;
                for (int64_t i = 0; i < nk * ld; ++i)
                    s1[i] = s2[i] = -7.0f;
                sdpa__bf16_lanes_scores_avx512bf16(qp, ld, ne, w, k, ks, n, 0.125f, s1, ld);
                sdpa__bf16_lanes_scores_pairs_avx512bf16(qp, ld, ne, w, k, ks, n, 0.125f, s2, ld);
                assert_memory_equal(s1, s2, (size_t)(nk * ld) * 4);
                /* P rounded and paired; V paired through idx; P.V */
                const int64_t nev = ne, cnt = n, vs = nev + 2, rows = 2 * cnt + 1;
                float *st = malloc((size_t)((cnt + 1) * ld) * 4), *o = malloc((size_t)((nev + 1) * ld) * 4);
                double *o0 = malloc((size_t)(nev * ld) * 8);
                uint32_t *pp = malloc((size_t)((cnt / 2 + 1) * ld) * 4), *vp = malloc((size_t)((cnt / 2 + 1) * nev) * 4);
                uint16_t *v = malloc((size_t)(rows * vs) * 2);
                int32_t *idx = malloc((size_t)(cnt + 1) * 4);
                float *beta = malloc((size_t)ld * 4);
                assert_true(st && o && o0 && pp && vp && v && idx && beta);
                for (int64_t t = 0; t < cnt; ++t) {
                    idx[t] = (int32_t)(2 * t + (t & 1)); /* rows 2t or 2t+1: the others hold NaN */
                    for (int64_t l = 0; l < w; ++l) {
                        const int kind = (int)((t * 7 + l) % 11);
                        st[t * ld + l] = kind == 0 ? 0x1p-130f : kind == 1 ? 1.0f + 0x1p-8f : kind == 2 ? 1.0f + 3 * 0x1p-8f
                                                                                           : (float)fabs(urand());
                    }
                }
                for (int64_t i = 0; i < rows * vs; ++i)
                    v[i] = 0x7FC0;
                for (int64_t t = 0; t < cnt; ++t)
                    for (int64_t d = 0; d < nev; ++d)
                        v[idx[t] * vs + d] = sdpa__f32_to_bf16((float)(urand() * 8.0));
                sdpa__bf16_pack_p_avx512bf16(st, ld, cnt, w, pp, ld);
                sdpa__bf16_pack_v_avx512bf16(v, vs, idx, cnt, nev, vp);
                for (int64_t t = 0; t < cnt + (cnt & 1); ++t) {
                    for (int64_t l = 0; l < w; ++l) {
                        const float x = t < cnt ? st[t * ld + l] : 0.0f;
                        const uint16_t want = x < 0x1p-126f ? 0 : sdpa__f32_to_bf16(x);
                        assert_int_equal((pp[t / 2 * ld + l] >> (16 * (t & 1))) & 0xFFFFu, want);
                    }
                    for (int64_t d = 0; d < nev; ++d)
                        assert_int_equal((vp[t / 2 * nev + d] >> (16 * (t & 1))) & 0xFFFFu,
                                         t < cnt ? v[idx[t] * vs + d] : 0);
                }
                for (int with_beta = 0; with_beta < 2; ++with_beta) {
                    for (int64_t l = 0; l < ld; ++l)
                        beta[l] = (float)fabs(urand());
                    for (int64_t i = 0; i < (nev + 1) * ld; ++i)
                        o[i] = (float)urand();
                    for (int64_t d = 0; d < nev; ++d)
                        for (int64_t l = 0; l < w; ++l)
                            o0[d * ld + l] = with_beta ? (double)beta[l] * (double)o[d * ld + l] : 0.0;
                    const float guard = o[nev * ld], guard2 = o[w];
                    sdpa__bf16_lanes_pv_avx512bf16(nev, 0, (cnt + 1) / 2, vp, pp, ld, o, with_beta ? beta : NULL, w, ld);
                    for (int64_t d = 0; d < nev; ++d)
                        for (int64_t l = 0; l < w; ++l) {
                            double ref = o0[d * ld + l], mag = fabs(ref);
                            for (int64_t t = 0; t < cnt; ++t) {
                                const double pr = (double)sdpa__bf16_to_f32((uint16_t)((pp[t / 2 * ld + l] >> (16 * (t & 1))) & 0xFFFFu));
                                const double x = pr * (double)sdpa__bf16_to_f32(v[idx[t] * vs + d]);
                                ref += x;
                                mag += fabs(x);
                            }
                            const double bound = (double)(2 * cnt + 3) * U32 * mag;
                            if (!(fabs((double)o[d * ld + l] - ref) <= bound))
                                fail_msg("ne=%lld w=%lld n=%lld d=%lld l=%lld: %.9g vs %.9g", (long long)ne,
                                         (long long)w, (long long)n, (long long)d, (long long)l,
                                         (double)o[d * ld + l], ref);
                        }
                    assert_true(o[nev * ld] == guard); /* nothing beyond nev rows */
                    assert_true(o[w] == guard2);       /* nor beyond w lanes */
                }
                free(qp); free(k); free(s1); free(s2); free(st); free(o); free(o0); free(pp); free(vp); free(v);
                free(idx); free(beta);
                ++cases;
            }
    printf("bf16 lanes pairs avx512-bf16: %d shapes run\n", cases);
#else
    printf("bf16 lanes pairs avx512-bf16 not run: not built (compiler lacks -mavx512bf16)\n");
#endif
}

int main(void)
{
#if !defined(SDPA_HAVE_MK_AVX512BF16)
    /* a build without the column (another architecture, or a compiler without -mavx512bf16):
     * nothing to test, reported as not run (exit 77: meson's SKIP), not as passed */
    printf("test_bf16_dot: not run: this build has no AVX512-BF16 column\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dot_rows_matches_reference),
        cmocka_unit_test(axpy_rows_matches_reference),
        cmocka_unit_test(lanes_pairs_match_reference),
    };
    return cmocka_run_group_tests_name("bf16_dot", tests, NULL, NULL);
}
