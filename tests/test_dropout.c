/*
 * Dropout (sdpa_options.dropout_p): Philox4x32-10 known answers; the documented keying
 * reproduced independently with Random123; the same mask for every kernel and thread count;
 * the kept fraction and the mean over seeds; p = 0 equal to no dropout; weights and lse stay
 * pre-dropout; masked pairs stay exactly 0; bad p rejected.
 *
 * The keep pattern is read from the library's output: with V = identity (Ev = S),
 * out[b, h, i, j] = w[b, h, i, j] * keep(b, h, i, j) / (1 - p), so a zero in out is exactly a
 * dropped (or blocked) element, as long as every allowed probability is > 0.
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

#include <Random123/philox.h>

#include "test_common.h"

/* ------------------------------------------------- Philox4x32-10 itself */

/* Random123's tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> output. */
static void dropout_philox4x32_10_known_answers(void **state)
{
    (void)state;
    static const struct {
        uint32_t ctr[4], key[2], want[4];
    } kat[3] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (int t = 0; t < 3; ++t) {
        philox4x32_ctr_t c = {{kat[t].ctr[0], kat[t].ctr[1], kat[t].ctr[2], kat[t].ctr[3]}};
        philox4x32_key_t k = {{kat[t].key[0], kat[t].key[1]}};
        philox4x32_ctr_t r = philox4x32(c, k); /* the 10-round default */
        philox4x32_ctr_t r10 = philox4x32_R(10, c, k);
        for (int w = 0; w < 4; ++w) {
            assert_int_equal(r.v[w], kat[t].want[w]);
            assert_int_equal(r10.v[w], kat[t].want[w]);
        }
    }
}

/* ----------------------------------------- the documented keying, by hand */

typedef struct keying {
    philox4x32_key_t key; /* key' */
    uint32_t threshold;   /* floor(p * 2^32) */
} keying;

/* key' = words 0..1 of Philox4x32-10({lo(offset), hi(offset), 0x53445041, 0}, {lo(seed), hi(seed)}) */
static keying keying_of(float p, uint64_t seed, uint64_t offset)
{
    keying k;
    philox4x32_ctr_t c = {{(uint32_t)(offset & 0xffffffffu), (uint32_t)(offset >> 32), 0x53445041u, 0u}};
    philox4x32_key_t s = {{(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t r = philox4x32(c, s);
    k.key.v[0] = r.v[0];
    k.key.v[1] = r.v[1];
    k.threshold = (uint32_t)floor((double)p * 4294967296.0);
    return k;
}

/* r = word (j % 4) of Philox4x32-10({j / 4, i, h, b}, key'); kept iff r >= threshold. */
static int expected_kept(const keying *k, int64_t b, int64_t h, int64_t i, int64_t j)
{
    philox4x32_ctr_t c = {{(uint32_t)(j / 4), (uint32_t)i, (uint32_t)h, (uint32_t)b}};
    philox4x32_ctr_t r = philox4x32(c, k->key);
    return r.v[j % 4] >= k->threshold;
}

/* An exact +0.0f (what a blocked probability is). */
static int same_zero(float x)
{
    return x == 0.0f && !signbit(x);
}

/* ------------------------------------------------------- identity-V cases */

static const sdpa_kernel ALL_KERNELS[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
static const char *const KERNEL_PREFIX[4] = {"", "reference", "tiled", "decode"};

/* q [B, Hq, L, E], k [B, Hkv, S, E] with small entries (every probability well above 0),
 * v [B, Hkv, S, S] = identity per head, so out [B, Hq, L, S] shows w * keep / (1 - p). */
typedef struct icase {
    int64_t B, Hq, Hkv, L, S, E;
    float *q, *k, *v, *out, *w, *lse;
    int64_t n_out, n_lse;
    sdpa_tensor tq, tk, tv, to, tw, tl;
} icase;

static void icase_init(icase *c, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->B = B;
    c->Hq = Hq;
    c->Hkv = Hkv;
    c->L = L;
    c->S = S;
    c->E = E;
    tc_rng rng;
    tc_rng_seed(&rng, seed);
    const int64_t nq = B * Hq * L * E, nk = B * Hkv * S * E, nv = B * Hkv * S * S;
    c->n_out = B * Hq * L * S;
    c->n_lse = B * Hq * L;
    c->q = malloc((size_t)nq * sizeof(float));
    c->k = malloc((size_t)nk * sizeof(float));
    c->v = calloc((size_t)nv, sizeof(float));
    c->out = malloc((size_t)c->n_out * sizeof(float));
    c->w = malloc((size_t)c->n_out * sizeof(float));
    c->lse = malloc((size_t)c->n_lse * sizeof(float));
    assert_true(c->q && c->k && c->v && c->out && c->w && c->lse);
    tc_fill_uniform(c->q, nq, &rng, -0.5, 0.5);
    tc_fill_uniform(c->k, nk, &rng, -0.5, 0.5);
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
        for (int64_t j = 0; j < S; ++j) {
            c->v[(bg * S + j) * S + j] = 1.0f;
        }
    }
    c->tq = tc_view4(c->q, B, Hq, L, E);
    c->tk = tc_view4(c->k, B, Hkv, S, E);
    c->tv = tc_view4(c->v, B, Hkv, S, S);
    c->to = tc_view4(c->out, B, Hq, L, S);
    c->tw = tc_view4(c->w, B, Hq, L, S);
    const int64_t ls[3] = {B, Hq, L};
    assert_int_equal(sdpa_tensor_init(&c->tl, c->lse, 3, ls), SDPA_OK);
}

static void icase_free(icase *c)
{
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->out);
    free(c->w);
    free(c->lse);
}

/* Run with canary-filled outputs; weights/lse only if asked. Reports the status. */
static sdpa_status icase_run(icase *c, const sdpa_options *o, int want_w, int want_lse)
{
    tc_fill_canary(c->out, (size_t)c->n_out * sizeof(float));
    tc_fill_canary(c->w, (size_t)c->n_out * sizeof(float));
    tc_fill_canary(c->lse, (size_t)c->n_lse * sizeof(float));
    return sdpa_attention(&c->tq, &c->tk, &c->tv, o, &c->to, want_w ? &c->tw : NULL, want_lse ? &c->tl : NULL);
}

/* A forced kernel must serve the call and report its own name. */
static void expect_kernel_ok(sdpa_status st, sdpa_kernel kern, const char *what)
{
    if (st != SDPA_OK) {
        fail_msg("%s: kernel %s returned %s: %s", what, KERNEL_PREFIX[kern], sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    const char *name = sdpa_last_kernel();
    if (kern != SDPA_KERNEL_AUTO && strncmp(name, KERNEL_PREFIX[kern], strlen(KERNEL_PREFIX[kern])) != 0) {
        fail_msg("%s: forced kernel %s but sdpa_last_kernel() = \"%s\"", what, KERNEL_PREFIX[kern], name);
    }
}

static void dropout_keep_pattern_follows_documented_keying(void **state)
{
    (void)state;
    /* S = 11 is not a multiple of 4 (the counter's j / 4 and word j % 4 both matter); the
     * seed and offset have different high and low halves. */
    icase c;
    icase_init(&c, 2, 4, 2, 6, 11, 5, 31);
    const uint64_t seeds[3] = {0x0123456789abcdefull, 0ull, 0xffffffff00000001ull};
    const uint64_t offsets[3] = {0xfedcba9876543210ull, 7ull, 0x100000000ull};
    const float ps[3] = {0.3f, 0.5f, 0.8f};
    for (int t = 0; t < 3; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = SDPA_KERNEL_REFERENCE;
        o.dropout_p = ps[t];
        o.dropout_seed = seeds[t];
        o.dropout_offset = offsets[t];
        expect_kernel_ok(icase_run(&c, &o, 1, 0), SDPA_KERNEL_REFERENCE, "keying");
        const keying k = keying_of(ps[t], seeds[t], offsets[t]);
        int64_t kept = 0, dropped = 0;
        for (int64_t b = 0; b < c.B; ++b)
            for (int64_t h = 0; h < c.Hq; ++h)
                for (int64_t i = 0; i < c.L; ++i)
                    for (int64_t j = 0; j < c.S; ++j) {
                        const int64_t e = ((b * c.Hq + h) * c.L + i) * c.S + j;
                        const int want = expected_kept(&k, b, h, i, j);
                        assert_true(c.w[e] > 0.0f);
                        if (want != (c.out[e] != 0.0f)) {
                            fail_msg("p=%g seed=%llx offset=%llx (b=%lld,h=%lld,i=%lld,j=%lld): Random123 says %s, out=%g",
                                     (double)ps[t], (unsigned long long)seeds[t], (unsigned long long)offsets[t],
                                     (long long)b, (long long)h, (long long)i, (long long)j,
                                     want ? "kept" : "dropped", (double)c.out[e]);
                        }
                        if (want) {
                            /* kept: the pre-dropout probability scaled by 1 / (1 - p) */
                            const double scaled = (double)c.w[e] / (1.0 - (double)ps[t]);
                            assert_true(fabs(c.out[e] - scaled) <= 1e-6 * scaled);
                            kept++;
                        } else {
                            dropped++;
                        }
                    }
        assert_true(kept > 20 && dropped > 20);
    }
    icase_free(&c);
}

/* A row recomputed in double (a float32 score overflows) drops the same elements. */
static void dropout_double_precision_rows_use_the_same_mask(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 1, 2, 1, 3, 10, 4, 5);
    /* Every q.k = 4e40 > FLT_MAX: all scores equal, probabilities uniform 1/S. */
    for (int64_t e = 0; e < 2 * 3 * 4; ++e) {
        c.q[e] = 1e20f;
    }
    for (int64_t e = 0; e < 10 * 4; ++e) {
        c.k[e] = 1e20f;
    }
    sdpa_options o;
    sdpa_options_init(&o);
    o.scale = 1.0f;
    o.kernel = SDPA_KERNEL_REFERENCE;
    o.dropout_p = 0.4f;
    o.dropout_seed = 99;
    o.dropout_offset = 3;
    expect_kernel_ok(icase_run(&c, &o, 0, 1), SDPA_KERNEL_REFERENCE, "double rows");
    const keying k = keying_of(0.4f, 99, 3);
    int dropped = 0;
    for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 10; ++j) {
                const float x = c.out[(h * 3 + i) * 10 + j];
                if (expected_kept(&k, 0, h, i, j)) {
                    assert_float_equal(x, 0.1f / 0.6f, 1e-6);
                } else {
                    assert_true(x == 0.0f);
                    dropped++;
                }
            }
    assert_true(dropped > 3);
    assert_true(isinf(c.lse[0]) && c.lse[0] > 0); /* lse = 4e40 + log 10 is beyond float32 */
    icase_free(&c);
}

/* --------------------------------------------- kernels and thread counts */

/* The same seed gives bit-identical output at 1 and 2 threads for one kernel, the same keep
 * pattern for every kernel, and values within float32 rounding across kernels. */
static void dropout_same_mask_for_every_kernel_and_thread_count(void **state)
{
    (void)state;
    /* L = 70 rows (more than one row block of 64), and L = 3 for the decode kernel. */
    const int64_t Ls[2] = {70, 3};
    for (int li = 0; li < 2; ++li) {
        icase c;
        icase_init(&c, 2, 4, 2, Ls[li], 37, 16, 77 + (uint64_t)li);
        sdpa_options o;
        sdpa_options_init(&o);
        o.dropout_p = 0.35f;
        o.dropout_seed = 0xC0FFEEull;
        o.dropout_offset = 12345;
        float *first = malloc((size_t)c.n_out * sizeof(float));
        float *per_thread = malloc((size_t)c.n_out * sizeof(float));
        assert_true(first && per_thread);
        int have_first = 0;
        for (int ki = 0; ki < 3; ++ki) {
            const sdpa_kernel kern = ALL_KERNELS[ki];
            if (kern == SDPA_KERNEL_DECODE && c.L > 4) {
                continue;
            }
            o.kernel = kern;
            for (int threads = 1; threads <= 2; ++threads) {
                o.num_threads = threads;
                char what[64];
                snprintf(what, sizeof what, "L=%lld threads=%d", (long long)c.L, threads);
                expect_kernel_ok(icase_run(&c, &o, 0, 0), kern, what);
                if (threads == 1) {
                    memcpy(per_thread, c.out, (size_t)c.n_out * sizeof(float));
                } else if (memcmp(per_thread, c.out, (size_t)c.n_out * sizeof(float)) != 0) {
                    fail_msg("kernel %s, L=%lld: 1 and 2 threads differ", KERNEL_PREFIX[kern], (long long)c.L);
                }
            }
            if (!have_first) {
                memcpy(first, c.out, (size_t)c.n_out * sizeof(float));
                have_first = 1;
                continue;
            }
            for (int64_t e = 0; e < c.n_out; ++e) {
                if ((first[e] == 0.0f) != (c.out[e] == 0.0f)) {
                    fail_msg("kernel %s, L=%lld: element %lld kept by one kernel and dropped by the other", KERNEL_PREFIX[kern],
                             (long long)c.L, (long long)e);
                }
                if (!(fabsf(first[e] - c.out[e]) <= 1e-6f + 1e-5f * fabsf(first[e]))) {
                    fail_msg("kernel %s, L=%lld: element %lld = %g vs %g from the reference", KERNEL_PREFIX[kern],
                             (long long)c.L, (long long)e, (double)c.out[e], (double)first[e]);
                }
            }
        }
        free(first);
        free(per_thread);
        icase_free(&c);
    }
}

/* General values (random V, Ev != S): every kernel agrees with the reference within float32
 * rounding and is bit-identical to itself at 1, 2 and 3 threads. */
static void dropout_random_values_agree_across_kernels(void **state)
{
    (void)state;
    const int64_t B = 2, Hq = 6, Hkv = 3, S = 200, E = 24, Ev = 20;
    const int64_t Ls[2] = {150, 4};
    tc_rng rng;
    tc_rng_seed(&rng, 4242);
    for (int li = 0; li < 2; ++li) {
        const int64_t L = Ls[li];
        const int64_t nq = B * Hq * L * E, nk = B * Hkv * S * E, nv = B * Hkv * S * Ev, no = B * Hq * L * Ev;
        float *q = malloc((size_t)nq * sizeof(float)), *k = malloc((size_t)nk * sizeof(float));
        float *v = malloc((size_t)nv * sizeof(float)), *out = malloc((size_t)no * sizeof(float));
        float *ref = malloc((size_t)no * sizeof(float)), *first = malloc((size_t)no * sizeof(float));
        assert_true(q && k && v && out && ref && first);
        tc_fill_uniform(q, nq, &rng, -1, 1);
        tc_fill_uniform(k, nk, &rng, -1, 1);
        tc_fill_uniform(v, nv, &rng, -1, 1);
        sdpa_tensor tq = tc_view4(q, B, Hq, L, E), tk = tc_view4(k, B, Hkv, S, E), tv = tc_view4(v, B, Hkv, S, Ev);
        sdpa_tensor to = tc_view4(out, B, Hq, L, Ev);
        sdpa_options o;
        sdpa_options_init(&o);
        o.causal = 1;
        o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        o.dropout_p = 0.2f;
        o.dropout_seed = 5;
        o.dropout_offset = 1ull << 40;
        for (int ki = 0; ki < 3; ++ki) {
            const sdpa_kernel kern = ALL_KERNELS[ki];
            if (kern == SDPA_KERNEL_DECODE && L > 4) {
                continue;
            }
            o.kernel = kern;
            for (int threads = 1; threads <= 3; ++threads) {
                o.num_threads = threads;
                tc_fill_canary(out, (size_t)no * sizeof(float));
                expect_kernel_ok(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), kern, "random values");
                if (threads == 1) {
                    memcpy(first, out, (size_t)no * sizeof(float));
                } else if (memcmp(first, out, (size_t)no * sizeof(float)) != 0) {
                    fail_msg("kernel %s, L=%lld: %d threads differ from 1", KERNEL_PREFIX[kern], (long long)L, threads);
                }
            }
            if (kern == SDPA_KERNEL_REFERENCE) {
                memcpy(ref, out, (size_t)no * sizeof(float));
                continue;
            }
            for (int64_t e = 0; e < no; ++e) {
                if (!(fabsf(out[e] - ref[e]) <= 2e-6f + 1e-5f * fabsf(ref[e]))) {
                    fail_msg("kernel %s, L=%lld: out[%lld] = %.9g, reference %.9g", KERNEL_PREFIX[kern], (long long)L,
                             (long long)e, (double)out[e], (double)ref[e]);
                }
            }
        }
        free(q);
        free(k);
        free(v);
        free(out);
        free(ref);
        free(first);
    }
}

/* ------------------------------------------------------------- statistics */

/* Over B*Hq*L*S = 131072 elements the dropped count is Binomial(n, p'), p' = floor(p 2^32) / 2^32:
 * within 4 standard deviations of n p'. */
static void dropout_kept_fraction_is_within_4_sigma(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 2, 4, 4, 64, 256, 8, 1234);
    const float ps[4] = {0.05f, 0.25f, 0.5f, 0.9f};
    for (int t = 0; t < 4; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.dropout_p = ps[t];
        o.dropout_seed = 2024 + (uint64_t)t;
        o.dropout_offset = 0;
        assert_int_equal(icase_run(&c, &o, 0, 0), SDPA_OK);
        int64_t dropped = 0;
        for (int64_t e = 0; e < c.n_out; ++e) {
            dropped += c.out[e] == 0.0f;
        }
        const double n = (double)c.n_out, p = floor((double)ps[t] * 4294967296.0) / 4294967296.0;
        const double sd = sqrt(n * p * (1.0 - p)), dev = fabs((double)dropped - n * p);
        if (!(dev <= 4.0 * sd)) {
            fail_msg("p=%g: %lld of %.0f dropped, expected %.1f +- %.1f (4 sd)", (double)ps[t], (long long)dropped, n,
                     n * p, 4.0 * sd);
        }
    }
    icase_free(&c);
}

/* E[out] over seeds equals the no-dropout output. Per element, one draw has variance
 * p/(1-p) * sum_j w_j^2 v_jd^2; the mean of N seeds must be within 5 standard errors
 * sqrt(var / N) of the no-dropout value (+1e-6 for float32 rounding). */
static void dropout_mean_over_seeds_approaches_no_dropout(void **state)
{
    (void)state;
    enum { B = 1, H = 2, L = 4, S = 8, E = 4, EV = 3, N = 4000 };
    float q[B * H * L * E], k[B * H * S * E], v[B * H * S * EV], out[B * H * L * EV], base[B * H * L * EV];
    float w[B * H * L * S];
    double mean[B * H * L * EV] = {0};
    tc_rng rng;
    tc_rng_seed(&rng, 8);
    tc_fill_uniform(q, B * H * L * E, &rng, -1.5, 1.5);
    tc_fill_uniform(k, B * H * S * E, &rng, -1.5, 1.5);
    tc_fill_uniform(v, B * H * S * EV, &rng, -2, 2);
    sdpa_tensor tq = tc_view4(q, B, H, L, E), tk = tc_view4(k, B, H, S, E), tv = tc_view4(v, B, H, S, EV);
    sdpa_tensor to = tc_view4(out, B, H, L, EV), tb = tc_view4(base, B, H, L, EV), tw = tc_view4(w, B, H, L, S);
    sdpa_options o;
    sdpa_options_init(&o);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &tb, &tw, NULL), SDPA_OK);
    const double p = 0.5;
    o.dropout_p = (float)p;
    o.dropout_offset = 77;
    for (int s = 0; s < N; ++s) {
        o.dropout_seed = (uint64_t)s * 0x9E3779B97F4A7C15ull;
        assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK);
        for (int e = 0; e < B * H * L * EV; ++e) {
            mean[e] += out[e];
        }
    }
    int would_catch_unscaled = 0;
    for (int h = 0; h < H; ++h)
        for (int i = 0; i < L; ++i)
            for (int d = 0; d < EV; ++d) {
                const int e = (h * L + i) * EV + d;
                double var = 0.0;
                for (int j = 0; j < S; ++j) {
                    const double wv = (double)w[(h * L + i) * S + j] * (double)v[(h * S + j) * EV + d];
                    var += wv * wv;
                }
                var *= p / (1.0 - p);
                const double tol = 5.0 * sqrt(var / N) + 1e-6, err = fabs(mean[e] / N - (double)base[e]);
                if (!(err <= tol)) {
                    fail_msg("element (h=%d,i=%d,d=%d): mean %.6f over %d seeds, no-dropout %.6f, tolerance %.2g", h, i,
                             d, mean[e] / N, N, (double)base[e], tol);
                }
                /* Without the 1/(1-p) scaling the mean would be (1-p) * base: off by p * |base|. */
                would_catch_unscaled += p * fabs((double)base[e]) > 2.0 * tol;
            }
    /* The bound is not vacuous: a missing scale (or keeping p instead of 1-p) fails it. */
    assert_true(would_catch_unscaled >= 6);
}

/* ------------------------------------------------------------- semantics */

/* The keep rule is r >= threshold (not >): find a (seed, element) whose draw r is exactly
 * floor(p * 2^32) for a float p, run with that p and check the element is kept, and that every
 * other element follows the documented rule, on every kernel. */
static void dropout_draw_equal_to_threshold_is_kept(void **state)
{
    (void)state;
    enum { LL = 32, SS = 32 };
    icase c;
    icase_init(&c, 1, 1, 1, LL, SS, 4, 77);
    uint64_t seed = 0;
    int64_t hit_i = -1, hit_j = -1;
    float p = 0.0f;
    for (uint64_t sd = 1; sd < 4096 && hit_i < 0; ++sd) {
        const keying k0 = keying_of(0.5f, sd, 3);
        for (int64_t i = 0; i < LL && hit_i < 0; ++i) {
            for (int64_t j = 0; j < SS && hit_i < 0; ++j) {
                philox4x32_ctr_t ctr = {{(uint32_t)(j / 4), (uint32_t)i, 0u, 0u}};
                const uint32_t r = philox4x32(ctr, k0.key).v[j % 4];
                const float pf = (float)((double)r / 4294967296.0);
                /* p exactly r / 2^32, in (0.05, 0.95) so that both outcomes are common */
                if ((double)pf * 4294967296.0 == (double)r && pf > 0.05f && pf < 0.95f) {
                    seed = sd;
                    hit_i = i;
                    hit_j = j;
                    p = pf;
                }
            }
        }
    }
    assert_true(hit_i >= 0);
    const keying k = keying_of(p, seed, 3);
    assert_true(expected_kept(&k, 0, 0, hit_i, hit_j)); /* r == threshold: kept */
    for (int kk = 0; kk < 3; ++kk) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = ALL_KERNELS[kk];
        o.dropout_p = p;
        o.dropout_seed = seed;
        o.dropout_offset = 3;
        const int want_w = ALL_KERNELS[kk] == SDPA_KERNEL_REFERENCE;
        expect_kernel_ok(icase_run(&c, &o, want_w, 0), ALL_KERNELS[kk], "draw equal to the threshold");
        for (int64_t i = 0; i < LL; ++i) {
            for (int64_t j = 0; j < SS; ++j) {
                const float got = c.out[i * SS + j];
                const int want = expected_kept(&k, 0, 0, i, j);
                if (want != (got != 0.0f)) {
                    fail_msg("%s, p=%.9g seed=%llu (i=%lld,j=%lld)%s: Random123 says %s, out=%g", KERNEL_PREFIX[ALL_KERNELS[kk]],
                             (double)p, (unsigned long long)seed, (long long)i, (long long)j,
                             i == hit_i && j == hit_j ? " [draw == threshold]" : "", want ? "kept" : "dropped",
                             (double)got);
                }
            }
        }
    }
    icase_free(&c);
}

static void dropout_p_zero_is_bit_identical_to_none(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 2, 2, 1, 5, 9, 4, 3);
    sdpa_options o;
    sdpa_options_init(&o);
    assert_int_equal(icase_run(&c, &o, 1, 1), SDPA_OK);
    float *out0 = malloc((size_t)c.n_out * sizeof(float)), *w0 = malloc((size_t)c.n_out * sizeof(float));
    float *l0 = malloc((size_t)c.n_lse * sizeof(float));
    assert_true(out0 && w0 && l0);
    memcpy(out0, c.out, (size_t)c.n_out * sizeof(float));
    memcpy(w0, c.w, (size_t)c.n_out * sizeof(float));
    memcpy(l0, c.lse, (size_t)c.n_lse * sizeof(float));
    const float zeros[2] = {0.0f, -0.0f};
    for (int z = 0; z < 2; ++z) {
        for (int t = 0; t < 3; ++t) {
            o.dropout_p = zeros[z];
            o.dropout_seed = (uint64_t)t * 0x1234567890ull;
            o.dropout_offset = (uint64_t)t << 33;
            assert_int_equal(icase_run(&c, &o, 1, 1), SDPA_OK);
            assert_memory_equal(c.out, out0, (size_t)c.n_out * sizeof(float));
            assert_memory_equal(c.w, w0, (size_t)c.n_out * sizeof(float));
            assert_memory_equal(c.lse, l0, (size_t)c.n_lse * sizeof(float));
        }
    }
    free(out0);
    free(w0);
    free(l0);
    icase_free(&c);
}

static void dropout_p_outside_0_1_is_rejected(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 1, 1, 1, 2, 3, 2, 4);
    const float bad[] = {1.0f, 1.0000001f, 2.0f, -1e-30f, -0.5f, NAN, -NAN, INFINITY, -INFINITY};
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.dropout_p = bad[t];
        assert_int_equal(icase_run(&c, &o, 1, 1), SDPA_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(sdpa_last_error_message(), "dropout_p"));
        assert_true(tc_is_canary(c.out, (size_t)c.n_out * sizeof(float)));
        assert_true(tc_is_canary(c.w, (size_t)c.n_out * sizeof(float)));
        assert_true(tc_is_canary(c.lse, (size_t)c.n_lse * sizeof(float)));
    }
    /* The largest float below 1 is valid: threshold 2^32 - 256, almost everything dropped. */
    sdpa_options o;
    sdpa_options_init(&o);
    o.dropout_p = nextafterf(1.0f, 0.0f);
    assert_int_equal(icase_run(&c, &o, 0, 0), SDPA_OK);
    for (int64_t e = 0; e < c.n_out; ++e) {
        assert_true(isfinite(c.out[e]));
    }
    icase_free(&c);
}

/* Masks differ when only the offset (low or high half) or only the seed's high half changes. */
static void dropout_offsets_and_seeds_change_the_mask(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 1, 2, 2, 8, 16, 4, 6);
    const uint64_t seeds[5] = {1, 1, 1, 1 | (1ull << 32), 2};
    const uint64_t offsets[5] = {0, 1, 1ull << 32, 0, 0};
    uint8_t *masks = malloc((size_t)(5 * c.n_out));
    assert_non_null(masks);
    for (int t = 0; t < 5; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.dropout_p = 0.5f;
        o.dropout_seed = seeds[t];
        o.dropout_offset = offsets[t];
        assert_int_equal(icase_run(&c, &o, 0, 0), SDPA_OK);
        for (int64_t e = 0; e < c.n_out; ++e) {
            masks[t * c.n_out + e] = c.out[e] != 0.0f;
        }
        /* Repeating the call repeats the mask. */
        assert_int_equal(icase_run(&c, &o, 0, 0), SDPA_OK);
        for (int64_t e = 0; e < c.n_out; ++e) {
            assert_int_equal(masks[t * c.n_out + e], c.out[e] != 0.0f);
        }
    }
    for (int a = 0; a < 5; ++a) {
        for (int b = a + 1; b < 5; ++b) {
            int64_t differ = 0;
            for (int64_t e = 0; e < c.n_out; ++e) {
                differ += masks[a * c.n_out + e] != masks[b * c.n_out + e];
            }
            /* Independent masks at p = 0.5 differ in about half of 256 places. */
            if (differ < c.n_out / 4) {
                fail_msg("(seed %llx, offset %llx) and (seed %llx, offset %llx): masks differ in only %lld of %lld",
                         (unsigned long long)seeds[a], (unsigned long long)offsets[a], (unsigned long long)seeds[b],
                         (unsigned long long)offsets[b], (long long)differ, (long long)c.n_out);
            }
        }
    }
    free(masks);
    icase_free(&c);
}

/* weights stay the pre-dropout probabilities and lse does not change, bit for bit, with
 * dropout on; blocked pairs stay exactly 0 in weights and in out. */
static void dropout_leaves_weights_lse_and_blocked_pairs_alone(void **state)
{
    (void)state;
    icase c;
    icase_init(&c, 2, 2, 1, 6, 9, 4, 10);
    /* Causal (bottom-right) plus an allow-mask blocking some more pairs. */
    uint8_t mask[6 * 9];
    tc_rng rng;
    tc_rng_seed(&rng, 10);
    for (int e = 0; e < 6 * 9; ++e) {
        mask[e] = (uint8_t)!tc_rng_chance(&rng, 0.25);
    }
    for (int i = 0; i < 6; ++i) {
        mask[i * 9] = 1; /* key 0 keeps every row non-empty */
    }
    const int64_t ms[2] = {6, 9};
    sdpa_allow_mask m = tc_mask_view(mask, 2, ms);
    const int kernels[2] = {SDPA_KERNEL_AUTO, SDPA_KERNEL_REFERENCE};
    float *w0 = malloc((size_t)c.n_out * sizeof(float)), *l0 = malloc((size_t)c.n_lse * sizeof(float));
    assert_true(w0 && l0);
    for (int ki = 0; ki < 2; ++ki) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = kernels[ki];
        o.causal = 1;
        o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        o.allow_mask = &m;
        assert_int_equal(icase_run(&c, &o, 1, 1), SDPA_OK);
        memcpy(w0, c.w, (size_t)c.n_out * sizeof(float));
        memcpy(l0, c.lse, (size_t)c.n_lse * sizeof(float));
        o.dropout_p = 0.6f;
        o.dropout_seed = 17;
        o.dropout_offset = 4;
        assert_int_equal(icase_run(&c, &o, 1, 1), SDPA_OK);
        assert_memory_equal(c.w, w0, (size_t)c.n_out * sizeof(float));
        assert_memory_equal(c.lse, l0, (size_t)c.n_lse * sizeof(float));
        int64_t blocked = 0, dropped = 0;
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t h = 0; h < 2; ++h)
                for (int64_t i = 0; i < 6; ++i)
                    for (int64_t j = 0; j < 9; ++j) {
                        const int64_t e = ((b * 2 + h) * 6 + i) * 9 + j;
                        const int allowed = j <= i + 3 && mask[i * 9 + j];
                        if (!allowed) {
                            assert_true(same_zero(c.w[e]) && c.out[e] == 0.0f);
                            blocked++;
                        } else {
                            assert_true(c.w[e] > 0.0f);
                            dropped += c.out[e] == 0.0f;
                        }
                    }
        assert_true(blocked > 10 && dropped > 10);
        /* And lse alone (without weights) is unchanged too, for every kernel. */
        for (int kk = 0; kk < 3; ++kk) {
            if (ALL_KERNELS[kk] == SDPA_KERNEL_DECODE) {
                continue; /* L = 6 > 4 */
            }
            o.kernel = ALL_KERNELS[kk];
            o.dropout_p = 0.6f;
            expect_kernel_ok(icase_run(&c, &o, 0, 1), ALL_KERNELS[kk], "lse with dropout");
            float *ld = malloc((size_t)c.n_lse * sizeof(float));
            assert_non_null(ld);
            memcpy(ld, c.lse, (size_t)c.n_lse * sizeof(float));
            o.dropout_p = 0.0f;
            expect_kernel_ok(icase_run(&c, &o, 0, 1), ALL_KERNELS[kk], "lse without dropout");
            assert_memory_equal(ld, c.lse, (size_t)c.n_lse * sizeof(float));
            free(ld);
        }
    }
    free(w0);
    free(l0);
    icase_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dropout_philox4x32_10_known_answers),
        cmocka_unit_test(dropout_keep_pattern_follows_documented_keying),
        cmocka_unit_test(dropout_double_precision_rows_use_the_same_mask),
        cmocka_unit_test(dropout_kept_fraction_is_within_4_sigma),
        cmocka_unit_test(dropout_mean_over_seeds_approaches_no_dropout),
        cmocka_unit_test(dropout_draw_equal_to_threshold_is_kept),
        cmocka_unit_test(dropout_p_zero_is_bit_identical_to_none),
        cmocka_unit_test(dropout_p_outside_0_1_is_rejected),
        cmocka_unit_test(dropout_offsets_and_seeds_change_the_mask),
        cmocka_unit_test(dropout_leaves_weights_lse_and_blocked_pairs_alone),
        cmocka_unit_test(dropout_same_mask_for_every_kernel_and_thread_count),
        cmocka_unit_test(dropout_random_values_agree_across_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
