/*
 * sdpa_attention numerics: the golden 3x3 causal case, random configurations against the
 * double-precision reference (tests/ref), and properties (row sums, causality,
 * permutation invariance, determinism, masked NaN never leaking).
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

#include "test_case.h"
#include "test_common.h"

#define RTOL 1e-5
#define N_RANDOM_CASES 240

/* ------------------------------------------------------------- golden 3x3 */

static void attention_golden_causal_3x3_matches_averages(void **state)
{
    (void)state;
    float q[3 * 4] = {0}, k[3 * 4] = {0};
    float v[3] = {2.0f, 4.0f, 8.0f};
    float out[3], w[9], lse[3];
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(w, sizeof w);
    tc_fill_canary(lse, sizeof lse);

    sdpa_tensor tq = tc_view4(q, 1, 1, 3, 4), tk = tc_view4(k, 1, 1, 3, 4);
    sdpa_tensor tv = tc_view4(v, 1, 1, 3, 1), to = tc_view4(out, 1, 1, 3, 1);
    sdpa_tensor tw = tc_view4(w, 1, 1, 3, 3), tl;
    int64_t lshape[3] = {1, 1, 3};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, lshape), SDPA_OK);

    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = 1;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &opt, &to, &tw, &tl), SDPA_OK);
    assert_string_equal(sdpa_last_error_message(), "");
    assert_true(sdpa_last_kernel()[0] != '\0');

    assert_float_equal(out[0], 2.0f, 1e-6);
    assert_float_equal(out[1], 3.0f, 1e-6);
    assert_float_equal(out[2], 14.0f / 3.0f, 1e-5);

    const float expect_w[9] = {1.0f, 0.0f, 0.0f, 0.5f, 0.5f, 0.0f, 1.0f / 3, 1.0f / 3, 1.0f / 3};
    for (int e = 0; e < 9; ++e) {
        assert_float_equal(w[e], expect_w[e], 1e-6);
    }
    /* masked weights are exactly zero, not tiny */
    assert_true(w[1] == 0.0f && w[2] == 0.0f && w[5] == 0.0f);

    assert_float_equal(lse[0], 0.0f, 1e-6);
    assert_float_equal(lse[1], (float)log(2.0), 1e-6);
    assert_float_equal(lse[2], (float)log(3.0), 1e-6);
}

static void attention_golden_rank3_matches_rank4(void **state)
{
    (void)state;
    float q[3 * 2] = {0}, k[3 * 2] = {0};
    float v[3] = {2.0f, 4.0f, 8.0f};
    float out[3], lse[3];
    sdpa_tensor tq = tc_view3(q, 1, 3, 2), tk = tc_view3(k, 1, 3, 2);
    sdpa_tensor tv = tc_view3(v, 1, 3, 1), to = tc_view3(out, 1, 3, 1), tl;
    int64_t lshape[2] = {1, 3};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 2, lshape), SDPA_OK);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = 1;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, &tl), SDPA_OK);
    assert_float_equal(out[0], 2.0f, 1e-6);
    assert_float_equal(out[1], 3.0f, 1e-6);
    assert_float_equal(out[2], 14.0f / 3.0f, 1e-5);
    assert_float_equal(lse[2], (float)log(3.0), 1e-6);
}

static void attention_reference_golden_causal_matches_averages(void **state)
{
    (void)state;
    /* The oracle itself must know the golden facts. */
    double q[3] = {0}, k[3] = {0}, v[3] = {2, 4, 8};
    double out[3], w[9], lse[3];
    ref_problem p;
    ref_problem_init(&p);
    p.B = p.Hq = p.Hkv = 1;
    p.L = p.S = 3;
    p.E = p.Ev = 1;
    ref_view_contiguous4(&p.q, q, 1, 1, 3, 1);
    ref_view_contiguous4(&p.k, k, 1, 1, 3, 1);
    ref_view_contiguous4(&p.v, v, 1, 1, 3, 1);
    p.causal = 1;
    ref_report r = ref_attention(&p, out, w, lse, NULL);
    assert_int_equal(r.status, REF_OK);
    assert_true(fabs(out[0] - 2.0) < 1e-12);
    assert_true(fabs(out[1] - 3.0) < 1e-12);
    assert_true(fabs(out[2] - 14.0 / 3.0) < 1e-12);
    assert_true(w[1] == 0.0 && w[2] == 0.0 && w[5] == 0.0);
    assert_true(fabs(lse[2] - log(3.0)) < 1e-12);
}

/* ------------------------------------------------------- random vs reference */

typedef struct rcase {
    tc_case t;  /* the problem (shared generator, test_case.h) */
    void *ws;
    size_t ws_bytes;
} rcase;

/* Features of these cases (sizes are drawn in gen_case). */
static const tc_case_params g_params = {
    .qk_range = 1.0,
    .bcast_p = 0.08,
    .weights_p = 0.6,
    .lse_p = 0.6,
    .softcap_p = 0.3,
    .bias_p = 0.4,
    .bias_neginf_p = 0.12,
    .mask_p = 0.45,
    .causal_p = 0.35,
    .offset_lo_div = 1,
    .window_right_div = 1,
    .zero_rows_p = 0.6,
    .run_opts = 1,
};

static void gen_case(rcase *rc, int index, uint64_t seed, int large)
{
    tc_rng rng, *r = &rng;
    tc_rng_seed(r, seed);
    memset(rc, 0, sizeof *rc);
    tc_case *c = &rc->t;
    c->rank = tc_rng_chance(r, 0.3) ? 3 : 4;
    c->B = tc_rng_int(r, 1, 3);
    if (c->rank == 4) {
        c->Hkv = tc_rng_int(r, 1, 3);
        c->Hq = c->Hkv * tc_rng_int(r, 1, 3);
        if (tc_rng_chance(r, 0.15)) {
            c->Hkv = 1; /* MQA */
        }
    } else {
        c->Hq = c->Hkv = 1;
    }
    if (large) {
        /* crosses row/key block boundaries of tiled kernels */
        c->B = tc_rng_int(r, 1, 2);
        c->L = tc_rng_int(r, 1, 150);
        c->S = tc_rng_int(r, 1, 300);
        c->E = tc_rng_int(r, 1, 72);
        c->Ev = tc_rng_chance(r, 0.5) ? c->E : tc_rng_int(r, 1, 72);
    } else {
        c->L = tc_rng_int(r, 1, 9);
        c->S = tc_rng_int(r, 1, 12);
        c->E = tc_rng_int(r, 1, 16);
        c->Ev = tc_rng_chance(r, 0.5) ? c->E : tc_rng_int(r, 1, 16);
    }
    char label[64];
    snprintf(label, sizeof label, "case %d seed %llu", index, (unsigned long long)seed);
    tc_case_build(c, r, &g_params, label);
}

static void free_case(rcase *rc)
{
    tc_case_free(&rc->t);
    free(rc->ws);
}

static double g_max_err; /* largest error over all random cases (reported) */

/* What the successful random cases covered; each feature must appear a few times. */
enum {
    COV_RANK3, COV_RANK4, COV_GQA, COV_MQA, COV_EV_NE_E, COV_SCALE, COV_SOFTCAP,
    COV_BIAS_R1, COV_BIAS_R2, COV_BIAS_R3, COV_BIAS_R4, COV_BIAS_NEG_INF,
    COV_MASK_R1, COV_MASK_R2, COV_MASK_R3, COV_MASK_R4, COV_MASK_STRIDE0,
    COV_INPUT_STRIDE0, COV_INPUT_NEGATIVE, COV_PERMUTED_LAYOUT,
    COV_CAUSAL_TL, COV_CAUSAL_BR, COV_CAUSAL_OFF, COV_WINDOW, COV_WINDOW_OFF, COV_KEY_LENGTHS,
    COV_QUERY_LENGTHS, COV_BR_QUERY_LENGTHS, COV_ZERO_EMPTY_ROW, COV_PADDED_ROW,
    COV_STAGE0, COV_STAGE1, COV_STAGE2, COV_STAGE3, COV_LSE, COV_WORKSPACE, COV_COUNT
};
static const char *const cov_names[COV_COUNT] = {
    "rank3", "rank4", "gqa", "mqa", "ev!=e", "scale", "softcap",
    "bias rank1", "bias rank2", "bias rank3", "bias rank4", "bias -inf",
    "mask rank1", "mask rank2", "mask rank3", "mask rank4", "mask stride0",
    "input stride0", "input negative stride", "permuted layout",
    "causal top-left", "causal bottom-right", "causal offsets", "window", "window sides without sliding_window",
    "key_lengths", "query_lengths", "bottom-right with query_lengths", "ZERO empty row", "padded row",
    "stage probabilities", "stage scores", "stage softcapped", "stage masked", "lse", "workspace",
};
static int g_cov[COV_COUNT];

static int any_stride(const tc_buf *b, int zero, int negative)
{
    for (int d = 0; d < b->rank; ++d) {
        if (b->shape[d] > 1 && ((zero && b->strides[d] == 0) || (negative && b->strides[d] < 0))) {
            return 1;
        }
    }
    return 0;
}

static int permuted(const tc_buf *b)
{
    for (int d = 0; d + 1 < b->rank; ++d) {
        if (b->shape[d] > 1 && b->shape[d + 1] > 1 && b->strides[d] > 0 && b->strides[d + 1] > 0 &&
            b->strides[d] < b->strides[d + 1]) {
            return 1;
        }
    }
    return 0;
}

typedef struct cmp_state {
    double max_err;
    char where[256];
} cmp_state;

static void note(cmp_state *s, double err, const char *what, int64_t b, int64_t h, int64_t i,
                 int64_t j, float got, double ref)
{
    if (err > s->max_err || (isinf(err) && !isinf(s->max_err))) {
        s->max_err = err;
        snprintf(s->where, sizeof s->where, "%s[b=%lld,h=%lld,i=%lld,%lld] got %.9g ref %.9g", what,
                 (long long)b, (long long)h, (long long)i, (long long)j, (double)got, ref);
    }
}

static int run_case(rcase *rc)
{
    tc_case *c = &rc->t;
    const int64_t rows = c->B * c->Hq * c->L;
    double *rout = calloc((size_t)(rows * c->Ev + 1), sizeof(double));
    double *rw = calloc((size_t)(rows * c->S + 1), sizeof(double));
    double *rlse = calloc((size_t)(rows + 1), sizeof(double));
    uint8_t *kind = calloc((size_t)(rows + 1), 1);
    assert_true(rout && rw && rlse && kind);

    ref_report rep = ref_attention(&c->rp, rout, c->want_w ? rw : NULL, rlse, kind);
    const int expect_empty = rep.status == REF_EMPTY_ROW;
    if (rep.status < 0 || rep.status == REF_NON_FINITE) {
        fail_msg("reference failed (%d) on %s", rep.status, c->desc);
    }

    sdpa_tensor tq = tc_buf_view(&c->q), tk = tc_buf_view(&c->k), tv = tc_buf_view(&c->v);
    sdpa_tensor to = tc_buf_view(&c->out), tw, tl;
    if (c->want_w) {
        tw = tc_buf_view(&c->w);
    }
    if (c->want_lse) {
        tl = tc_buf_view(&c->lse);
    }
    if (c->has_bias) {
        static sdpa_tensor tb;
        tb = tc_buf_view(&c->bias);
        c->opt.bias = &tb;
    }
    if (c->use_ws) {
        size_t bytes = 0;
        sdpa_status ss = sdpa_attention_workspace_size(&tq, &tk, &tv, &c->opt, c->want_w, &bytes);
        if (ss != SDPA_OK) {
            fail_msg("workspace_size returned %s (%s) on %s", sdpa_status_string(ss),
                     sdpa_last_error_message(), c->desc);
        }
        rc->ws = malloc(bytes ? bytes : 1);
        assert_non_null(rc->ws);
        rc->ws_bytes = bytes;
        c->opt.workspace = rc->ws;
        c->opt.workspace_bytes = bytes;
    }

    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &c->opt, &to, c->want_w ? &tw : NULL,
                                    c->want_lse ? &tl : NULL);
    c->opt.bias = NULL;

    if (rep.status == REF_EMPTY_ROW) {
        if (st != SDPA_ERR_EMPTY_ROW) {
            fail_msg("expected SDPA_ERR_EMPTY_ROW (row b=%lld h=%lld i=%lld), got %s on %s",
                     (long long)rep.empty_b, (long long)rep.empty_h, (long long)rep.empty_i,
                     sdpa_status_string(st), c->desc);
        }
        if (sdpa_last_error_message()[0] == '\0') {
            fail_msg("empty error message on %s", c->desc);
        }
        if (!tc_buf_all_canary(&c->out) || (c->want_w && !tc_buf_all_canary(&c->w)) ||
            (c->want_lse && !tc_buf_all_canary(&c->lse))) {
            fail_msg("output written although the call failed: %s", c->desc);
        }
        goto done;
    }
    if (st != SDPA_OK) {
        fail_msg("expected SDPA_OK, got %s (%s) on %s", sdpa_status_string(st),
                 sdpa_last_error_message(), c->desc);
    }
    if (!tc_buf_holes_intact(&c->out) || (c->want_w && !tc_buf_holes_intact(&c->w)) ||
        (c->want_lse && !tc_buf_holes_intact(&c->lse))) {
        fail_msg("write outside the output view: %s", c->desc);
    }

    cmp_state s;
    s.max_err = 0.0;
    s.where[0] = '\0';
    for (int64_t b = 0; b < c->B; ++b) {
        for (int64_t h = 0; h < c->Hq; ++h) {
            for (int64_t i = 0; i < c->L; ++i) {
                const int64_t row = (b * c->Hq + h) * c->L + i;
                const int special = kind[row] != REF_ROW_NORMAL;
                for (int64_t e = 0; e < c->Ev; ++e) {
                    float g = tc_case_at(&c->out, b, h, i, e);
                    note(&s, tc_elem_err(g, rout[row * c->Ev + e], special), "out", b, h, i, e, g,
                         rout[row * c->Ev + e]);
                }
                if (c->want_lse) {
                    float g = tc_case_lse_at(c, b, h, i);
                    note(&s, tc_elem_err(g, rlse[row], special), "lse", b, h, i, 0, g, rlse[row]);
                }
                if (c->want_w) {
                    /* Empty rows (ZERO policy): probabilities are zeros; SCORES / SOFTCAPPED
                     * still hold every pair's score and MASKED is all -inf (the reference's
                     * reading of "zero weights" for the score stages; see sdpa_ref.h). */
                    double sum = 0.0;
                    for (int64_t j = 0; j < c->S; ++j) {
                        float g = tc_case_at(&c->w, b, h, i, j);
                        double ref = rw[row * c->S + j];
                        int exact = kind[row] == REF_ROW_PADDING ||
                                    (c->opt.weights_stage == SDPA_WEIGHTS_PROBABILITIES && ref == 0.0);
                        note(&s, tc_elem_err(g, ref, exact), "weights", b, h, i, j, g, ref);
                        sum += g;
                    }
                    if (c->opt.weights_stage == SDPA_WEIGHTS_PROBABILITIES && kind[row] == REF_ROW_NORMAL &&
                        fabs(sum - 1.0) > 1e-6) {
                        fail_msg("weights row b=%lld h=%lld i=%lld sums to %.9g on %s", (long long)b,
                                 (long long)h, (long long)i, sum, c->desc);
                    }
                }
            }
        }
    }
    {
        int64_t n_empty = 0, n_pad = 0, n_neg_inf = 0;
        for (int64_t row = 0; row < rows; ++row) {
            n_empty += kind[row] == REF_ROW_EMPTY;
            n_pad += kind[row] == REF_ROW_PADDING;
        }
        if (c->has_bias) {
            int64_t idx[4] = {0};
            do {
                n_neg_inf += isinf(*tc_buf_fptr(&c->bias, idx)) != 0;
            } while (tc_index_next(c->bias.rank, c->bias.shape, idx));
        }
        int *g = g_cov;
        g[COV_RANK3] += c->rank == 3;
        g[COV_RANK4] += c->rank == 4;
        g[COV_GQA] += c->Hq > c->Hkv && c->Hkv > 1;
        g[COV_MQA] += c->Hq > 1 && c->Hkv == 1;
        g[COV_EV_NE_E] += c->Ev != c->E;
        g[COV_SCALE] += c->opt.scale > 0;
        g[COV_SOFTCAP] += c->opt.softcap > 0;
        if (c->has_bias) {
            g[COV_BIAS_R1 + c->bias.rank - 1]++;
            g[COV_BIAS_NEG_INF] += n_neg_inf > 0;
        }
        if (c->has_mask) {
            g[COV_MASK_R1 + c->mask.rank - 1]++;
            for (int d = 0; d < c->mask.rank; ++d) {
                if (c->mask.shape[d] > 1 && c->mask.strides[d] == 0) {
                    g[COV_MASK_STRIDE0]++;
                    break;
                }
            }
        }
        g[COV_INPUT_STRIDE0] += any_stride(&c->q, 1, 0) || any_stride(&c->k, 1, 0) || any_stride(&c->v, 1, 0);
        g[COV_INPUT_NEGATIVE] += any_stride(&c->q, 0, 1) || any_stride(&c->k, 0, 1) || any_stride(&c->v, 0, 1);
        g[COV_PERMUTED_LAYOUT] += permuted(&c->q) || permuted(&c->k) || permuted(&c->out);
        g[COV_CAUSAL_TL] += c->opt.causal && c->opt.alignment == SDPA_ALIGN_TOP_LEFT;
        g[COV_CAUSAL_BR] += c->opt.causal && c->opt.alignment == SDPA_ALIGN_BOTTOM_RIGHT;
        g[COV_CAUSAL_OFF] += c->opt.causal && c->opt.alignment == SDPA_ALIGN_OFFSETS;
        g[COV_WINDOW] += c->opt.sliding_window && (c->opt.window_left >= 0 || c->opt.window_right >= 0);
        g[COV_WINDOW_OFF] += !c->opt.sliding_window && (c->opt.window_left >= 0 || c->opt.window_right >= 0);
        g[COV_KEY_LENGTHS] += c->opt.key_lengths != NULL;
        g[COV_QUERY_LENGTHS] += c->opt.query_lengths != NULL;
        g[COV_BR_QUERY_LENGTHS] += (c->opt.causal || c->opt.sliding_window) &&
                                   c->opt.alignment == SDPA_ALIGN_BOTTOM_RIGHT && c->opt.query_lengths != NULL;
        g[COV_ZERO_EMPTY_ROW] += n_empty > 0;
        g[COV_PADDED_ROW] += n_pad > 0;
        if (c->want_w) {
            g[COV_STAGE0 + c->opt.weights_stage]++;
        }
        g[COV_LSE] += c->want_lse;
        g[COV_WORKSPACE] += c->use_ws;
    }
    if (s.max_err > g_max_err) {
        g_max_err = s.max_err;
    }
    if (s.max_err > RTOL) {
        fail_msg("max error %.3g > %.1g at %s on %s", s.max_err, RTOL, s.where, c->desc);
    }
done:
    free(rout);
    free(rw);
    free(rlse);
    free(kind);
    return expect_empty;
}

static void attention_random_configs_match_reference(void **state)
{
    (void)state;
    int empty_expected = 0, ok_expected = 0;
    /* SDPA_TEST_RANDOM_CASES / SDPA_TEST_SEED widen or move the search (stress runs). */
    int n_cases = N_RANDOM_CASES;
    uint64_t base = 0xA77E11u;
    const char *env_n = getenv("SDPA_TEST_RANDOM_CASES"), *env_seed = getenv("SDPA_TEST_SEED");
    if (env_n && atoi(env_n) > 0) {
        n_cases = atoi(env_n);
    }
    if (env_seed) {
        base = strtoull(env_seed, NULL, 0);
    }
    for (int n = 0; n < n_cases; ++n) {
        rcase c;
        gen_case(&c, n, base + (uint64_t)n * 7919u, 0);
        if (run_case(&c)) {
            ++empty_expected;
        } else {
            ++ok_expected;
        }
        free_case(&c);
    }
    /* both outcomes must stay exercised by the generator */
    print_message("random cases: %d succeeded, %d expected SDPA_ERR_EMPTY_ROW, max error %.3g\n",
                  ok_expected, empty_expected, g_max_err);
    assert_true(ok_expected > n_cases / 2 && empty_expected > n_cases / 50);
    char cov[2048] = "";
    for (int f = 0; f < COV_COUNT; ++f) {
        tc_append(cov, sizeof cov, "%s%s=%d", f ? ", " : "", cov_names[f], g_cov[f]);
    }
    print_message("coverage: %s\n", cov);
    for (int f = 0; f < COV_COUNT; ++f) {
        if (g_cov[f] < 3) {
            fail_msg("the random generator covered \"%s\" only %d times", cov_names[f], g_cov[f]);
        }
    }
}

static void attention_random_large_configs_match_reference(void **state)
{
    (void)state;
    /* Fewer, bigger cases: L up to 150, S up to 300, E up to 72. */
    int n_cases = 24;
    const char *env_n = getenv("SDPA_TEST_RANDOM_LARGE_CASES");
    if (env_n && atoi(env_n) > 0) {
        n_cases = atoi(env_n);
    }
    int ok = 0;
    for (int n = 0; n < n_cases; ++n) {
        rcase c;
        gen_case(&c, n, 0x1A46Eu + (uint64_t)n * 104729u, 1);
        ok += !run_case(&c);
        free_case(&c);
    }
    print_message("large random cases: %d of %d succeeded, max error %.3g\n", ok, n_cases, g_max_err);
    assert_true(ok >= n_cases / 2);
}

/* ----------------------------------------------------------- property helpers */

typedef struct small {
    int64_t B, H, L, S, E, Ev;
    float *q, *k, *v, *out, *w, *lse;
    sdpa_tensor tq, tk, tv, to, tw, tl;
} small;

static void small_alloc(small *s, int64_t B, int64_t H, int64_t L, int64_t S, int64_t E, int64_t Ev,
                        uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->B = B, s->H = H, s->L = L, s->S = S, s->E = E, s->Ev = Ev;
    s->q = malloc(sizeof(float) * (size_t)(B * H * L * E));
    s->k = malloc(sizeof(float) * (size_t)(B * H * S * E));
    s->v = malloc(sizeof(float) * (size_t)(B * H * S * Ev));
    s->out = malloc(sizeof(float) * (size_t)(B * H * L * Ev));
    s->w = malloc(sizeof(float) * (size_t)(B * H * L * S));
    s->lse = malloc(sizeof(float) * (size_t)(B * H * L));
    assert_true(s->q && s->k && s->v && s->out && s->w && s->lse);
    tc_rng r;
    tc_rng_seed(&r, seed);
    tc_fill_uniform(s->q, B * H * L * E, &r, -1, 1);
    tc_fill_uniform(s->k, B * H * S * E, &r, -1, 1);
    tc_fill_uniform(s->v, B * H * S * Ev, &r, -1, 1);
    s->tq = tc_view4(s->q, B, H, L, E);
    s->tk = tc_view4(s->k, B, H, S, E);
    s->tv = tc_view4(s->v, B, H, S, Ev);
    s->to = tc_view4(s->out, B, H, L, Ev);
    s->tw = tc_view4(s->w, B, H, L, S);
    int64_t ls[3] = {B, H, L};
    assert_int_equal(sdpa_tensor_init(&s->tl, s->lse, 3, ls), SDPA_OK);
}

static void small_free(small *s)
{
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->out);
    free(s->w);
    free(s->lse);
}

static sdpa_status small_run(small *s, const sdpa_options *opt)
{
    tc_fill_canary(s->out, sizeof(float) * (size_t)(s->B * s->H * s->L * s->Ev));
    tc_fill_canary(s->w, sizeof(float) * (size_t)(s->B * s->H * s->L * s->S));
    tc_fill_canary(s->lse, sizeof(float) * (size_t)(s->B * s->H * s->L));
    return sdpa_attention(&s->tq, &s->tk, &s->tv, opt, &s->to, &s->tw, &s->tl);
}

/* Snapshot of all three outputs. */
typedef struct snap {
    float *out, *w, *lse;
    size_t nout, nw, nlse;
} snap;

static void snap_take(snap *p, const small *s)
{
    p->nout = (size_t)(s->B * s->H * s->L * s->Ev);
    p->nw = (size_t)(s->B * s->H * s->L * s->S);
    p->nlse = (size_t)(s->B * s->H * s->L);
    p->out = malloc(p->nout * sizeof(float));
    p->w = malloc(p->nw * sizeof(float));
    p->lse = malloc(p->nlse * sizeof(float));
    assert_true(p->out && p->w && p->lse);
    memcpy(p->out, s->out, p->nout * sizeof(float));
    memcpy(p->w, s->w, p->nw * sizeof(float));
    memcpy(p->lse, s->lse, p->nlse * sizeof(float));
}

static int snap_equal(const snap *p, const small *s)
{
    return memcmp(p->out, s->out, p->nout * sizeof(float)) == 0 &&
           memcmp(p->w, s->w, p->nw * sizeof(float)) == 0 &&
           memcmp(p->lse, s->lse, p->nlse * sizeof(float)) == 0;
}

static void snap_free(snap *p)
{
    free(p->out);
    free(p->w);
    free(p->lse);
}

/* --------------------------------------------------------------- properties */

static void attention_weights_rows_sum_to_one(void **state)
{
    (void)state;
    small s;
    small_alloc(&s, 2, 3, 17, 301, 24, 8, 11);
    for (int64_t e = 0; e < 2 * 3 * 17 * 24; ++e) {
        s.q[e] *= 3.0f; /* peaky rows too */
    }
    uint8_t *mask = malloc(17 * 301);
    assert_non_null(mask);
    tc_rng r;
    tc_rng_seed(&r, 5);
    for (int e = 0; e < 17 * 301; ++e) {
        mask[e] = (uint8_t)(tc_rng_chance(&r, 0.7) ? 1 : 0);
    }
    int64_t ms[2] = {17, 301};
    sdpa_allow_mask m = tc_mask_view(mask, 2, ms);
    for (int variant = 0; variant < 3; ++variant) {
        sdpa_options opt;
        sdpa_options_init(&opt);
        opt.causal = variant == 1;
        opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        opt.allow_mask = variant == 2 ? &m : NULL;
        assert_int_equal(small_run(&s, &opt), SDPA_OK);
        for (int64_t row = 0; row < 2 * 3 * 17; ++row) {
            double sum = 0.0;
            for (int64_t j = 0; j < 301; ++j) {
                float w = s.w[row * 301 + j];
                assert_true(w >= 0.0f && w <= 1.0f);
                sum += w;
            }
            if (fabs(sum - 1.0) > 1e-6) {
                fail_msg("variant %d row %lld sums to %.9g", variant, (long long)row, sum);
            }
        }
    }
    free(mask);
    small_free(&s);
}

static void attention_causal_future_token_changes_no_earlier_row(void **state)
{
    (void)state;
    small s;
    const int64_t L = 16, S = 16, E = 8;
    small_alloc(&s, 1, 2, L, S, E, E, 21);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = 1;
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    snap before;
    snap_take(&before, &s);

    const int64_t jf = 10;
    for (int64_t h = 0; h < 2; ++h) {
        for (int64_t e = 0; e < E; ++e) {
            s.k[(h * S + jf) * E + e] = 5.0f + (float)e;
            s.v[(h * S + jf) * E + e] = -7.0f - (float)e;
        }
    }
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    for (int64_t h = 0; h < 2; ++h) {
        for (int64_t i = 0; i < L; ++i) {
            const int64_t row = h * L + i;
            int same = memcmp(&before.out[row * E], &s.out[row * E], (size_t)E * sizeof(float)) == 0 &&
                       memcmp(&before.w[row * S], &s.w[row * S], (size_t)S * sizeof(float)) == 0 &&
                       memcmp(&before.lse[row], &s.lse[row], sizeof(float)) == 0;
            if (i < jf && !same) {
                fail_msg("row h=%lld i=%lld changed when only key %lld changed", (long long)h,
                         (long long)i, (long long)jf);
            }
            if (i >= jf && same) {
                fail_msg("row h=%lld i=%lld did not change although it sees key %lld", (long long)h,
                         (long long)i, (long long)jf);
            }
        }
    }
    snap_free(&before);
    small_free(&s);
}

static void attention_key_permutation_leaves_output_unchanged(void **state)
{
    (void)state;
    small s;
    const int64_t L = 7, S = 13, E = 5, Ev = 6;
    small_alloc(&s, 2, 2, L, S, E, Ev, 31);
    assert_int_equal(small_run(&s, NULL), SDPA_OK);
    snap before;
    snap_take(&before, &s);

    /* permutation j -> perm[j] over keys, applied to k and v together */
    int64_t perm[13];
    for (int64_t j = 0; j < S; ++j) {
        perm[j] = (j * 5 + 3) % S;
    }
    float *k2 = malloc(sizeof(float) * (size_t)(4 * S * E));
    float *v2 = malloc(sizeof(float) * (size_t)(4 * S * Ev));
    assert_true(k2 && v2);
    for (int64_t bh = 0; bh < 4; ++bh) {
        for (int64_t j = 0; j < S; ++j) {
            memcpy(&k2[(bh * S + perm[j]) * E], &s.k[(bh * S + j) * E], (size_t)E * sizeof(float));
            memcpy(&v2[(bh * S + perm[j]) * Ev], &s.v[(bh * S + j) * Ev], (size_t)Ev * sizeof(float));
        }
    }
    memcpy(s.k, k2, sizeof(float) * (size_t)(4 * S * E));
    memcpy(s.v, v2, sizeof(float) * (size_t)(4 * S * Ev));
    assert_int_equal(small_run(&s, NULL), SDPA_OK);
    for (size_t e = 0; e < before.nout; ++e) {
        if (fabsf(before.out[e] - s.out[e]) > 1e-6f) {
            fail_msg("out[%zu]: %.9g vs %.9g after permuting keys", e, (double)before.out[e],
                     (double)s.out[e]);
        }
    }
    for (size_t e = 0; e < before.nlse; ++e) {
        assert_float_equal(before.lse[e], s.lse[e], 1e-6);
    }
    /* weights follow the keys */
    for (int64_t row = 0; row < 4 * L; ++row) {
        for (int64_t j = 0; j < S; ++j) {
            assert_float_equal(before.w[row * S + j], s.w[row * S + perm[j]], 1e-6);
        }
    }
    free(k2);
    free(v2);
    snap_free(&before);
    small_free(&s);
}

static void attention_token_permutation_permutes_outputs(void **state)
{
    (void)state;
    /* Self-attention q = k = v = X over the first n valid tokens (key_lengths): permuting the
     * valid tokens permutes the valid output rows. */
    enum { T = 9, E = 6, NVALID = 7 };
    float x[T * E], x2[T * E], out[T * E], out2[T * E];
    tc_rng r;
    tc_rng_seed(&r, 77);
    tc_fill_uniform(x, T * E, &r, -1, 1);
    const int perm[NVALID] = {3, 0, 6, 1, 5, 2, 4}; /* token t goes to perm[t] */
    memcpy(x2, x, sizeof x);
    for (int t = 0; t < NVALID; ++t) {
        memcpy(&x2[perm[t] * E], &x[t * E], E * sizeof(float));
    }
    int64_t kl[1] = {NVALID};
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.key_lengths = kl;
    sdpa_tensor tx = tc_view3(x, 1, T, E), to = tc_view3(out, 1, T, E);
    sdpa_tensor tx2 = tc_view3(x2, 1, T, E), to2 = tc_view3(out2, 1, T, E);
    assert_int_equal(sdpa_attention(&tx, &tx, &tx, &opt, &to, NULL, NULL), SDPA_OK);
    assert_int_equal(sdpa_attention(&tx2, &tx2, &tx2, &opt, &to2, NULL, NULL), SDPA_OK);
    for (int t = 0; t < NVALID; ++t) {
        for (int e = 0; e < E; ++e) {
            if (fabsf(out[t * E + e] - out2[perm[t] * E + e]) > 1e-6f) {
                fail_msg("token %d -> %d: %.9g vs %.9g", t, perm[t], (double)out[t * E + e],
                         (double)out2[perm[t] * E + e]);
            }
        }
    }
}

static void attention_same_call_twice_is_bit_identical(void **state)
{
    (void)state;
    small s;
    small_alloc(&s, 2, 4, 33, 70, 16, 12, 41);
    float bias[33 * 70];
    tc_rng r;
    tc_rng_seed(&r, 3);
    for (int e = 0; e < 33 * 70; ++e) {
        bias[e] = tc_rng_chance(&r, 0.1) ? -INFINITY : (float)tc_rng_uniform(&r, -1, 1);
    }
    int64_t bs[2] = {33, 70};
    sdpa_tensor tb;
    assert_int_equal(sdpa_tensor_init(&tb, bias, 2, bs), SDPA_OK);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = 1;
    opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    opt.bias = &tb;
    opt.softcap = 2.0f;
    opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    snap a;
    snap_take(&a, &s);
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    assert_true(snap_equal(&a, &s));
    /* thread count never changes results */
    for (int32_t th = 1; th <= 4; th += 3) {
        opt.num_threads = th;
        assert_int_equal(small_run(&s, &opt), SDPA_OK);
        assert_true(snap_equal(&a, &s));
    }
    /* a caller workspace never changes results */
    size_t bytes = 0;
    opt.num_threads = 0;
    assert_int_equal(sdpa_attention_workspace_size(&s.tq, &s.tk, &s.tv, &opt, 1, &bytes), SDPA_OK);
    void *ws = malloc(bytes ? bytes : 1);
    assert_non_null(ws);
    opt.workspace = ws;
    opt.workspace_bytes = bytes;
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    assert_true(snap_equal(&a, &s));
    free(ws);
    snap_free(&a);
    small_free(&s);
}

/* NaN/Inf at places no allowed pair reads must change nothing and raise no error. */
static void attention_nonfinite_in_masked_values_changes_nothing(void **state)
{
    (void)state;
    const int64_t L = 5, S = 8, E = 4, Ev = 3;
    small s;
    small_alloc(&s, 2, 2, L, S, E, Ev, 51);
    int64_t kl[2] = {6, 8};
    int64_t ql[2] = {5, 4};
    uint8_t mask[8] = {1, 1, 0, 1, 1, 1, 1, 1}; /* key 2 blocked for everyone */
    int64_t ms[1] = {8};
    sdpa_allow_mask m = tc_mask_view(mask, 1, ms);
    float bias[5 * 8];
    for (int e = 0; e < 5 * 8; ++e) {
        bias[e] = 0.25f * (float)(e % 7) - 0.5f;
    }
    int64_t bs[2] = {5, 8};
    sdpa_tensor tb;
    assert_int_equal(sdpa_tensor_init(&tb, bias, 2, bs), SDPA_OK);

    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.key_lengths = kl;
    opt.query_lengths = ql;
    opt.allow_mask = &m;
    opt.bias = &tb;
    opt.causal = 1; /* top-left with L < S: keys 5..7 are never attended by any row */
    assert_int_equal(small_run(&s, &opt), SDPA_OK);
    snap clean;
    snap_take(&clean, &s);

    const float poison[3] = {NAN, INFINITY, -INFINITY};
    for (int pv = 0; pv < 3; ++pv) {
        float *kb = malloc(sizeof(float) * (size_t)(4 * S * E));
        float *vb = malloc(sizeof(float) * (size_t)(4 * S * Ev));
        float *qb = malloc(sizeof(float) * (size_t)(4 * L * E));
        assert_true(kb && vb && qb);
        memcpy(kb, s.k, sizeof(float) * (size_t)(4 * S * E));
        memcpy(vb, s.v, sizeof(float) * (size_t)(4 * S * Ev));
        memcpy(qb, s.q, sizeof(float) * (size_t)(4 * L * E));
        float biasb[5 * 8];
        memcpy(biasb, bias, sizeof bias);
        for (int64_t h = 0; h < 2; ++h) {
            /* batch 0: key 6, 7 beyond key_lengths; key 2 blocked by the mask; key 5 beyond
             * every causal position */
            const int64_t keys[4] = {2, 5, 6, 7};
            for (int t = 0; t < 4; ++t) {
                s.k[((0 * 2 + h) * S + keys[t]) * E + (t % E)] = poison[pv];
                s.v[((0 * 2 + h) * S + keys[t]) * Ev + (t % Ev)] = poison[pv];
            }
            /* batch 1: query row 4 is padding (query_lengths 4) */
            s.q[((1 * 2 + h) * L + 4) * E + 1] = poison[pv];
        }
        /* bias entries at blocked pairs: key 2 (mask), (i=0, j=3) causal-blocked */
        bias[0 * 8 + 2] = poison[pv];
        bias[0 * 8 + 3] = poison[pv];
        bias[4 * 8 + 7] = poison[pv];
        sdpa_status st = small_run(&s, &opt);
        if (st != SDPA_OK) {
            fail_msg("poison %g in masked values: %s (%s)", (double)poison[pv], sdpa_status_string(st),
                     sdpa_last_error_message());
        }
        if (!snap_equal(&clean, &s)) {
            fail_msg("poison %g in masked values changed the result", (double)poison[pv]);
        }
        memcpy(s.k, kb, sizeof(float) * (size_t)(4 * S * E));
        memcpy(s.v, vb, sizeof(float) * (size_t)(4 * S * Ev));
        memcpy(s.q, qb, sizeof(float) * (size_t)(4 * L * E));
        memcpy(bias, biasb, sizeof bias);
        free(kb);
        free(vb);
        free(qb);
    }
    /* sanity: poison in an attended key IS reported */
    s.k[(0 * S + 0) * E] = NAN;
    assert_int_equal(small_run(&s, &opt), SDPA_ERR_NON_FINITE);
    snap_free(&clean);
    small_free(&s);
}

static void attention_bshd_and_bhsd_layouts_are_bit_identical(void **state)
{
    (void)state;
    enum { B = 2, H = 3, L = 9, S = 11, D = 8 };
    tc_rng r;
    tc_rng_seed(&r, 61);
    /* BHSD contiguous buffers and the same values stored as BSHD */
    static float qh[B * H * L * D], kh[B * H * S * D], vh[B * H * S * D];
    static float qs[B * L * H * D], ks[B * S * H * D], vs[B * S * H * D];
    static float o1[B * H * L * D], o2[B * L * H * D];
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < S; ++t)
                for (int d = 0; d < D; ++d) {
                    float a = (float)tc_rng_uniform(&r, -1, 1), c = (float)tc_rng_uniform(&r, -1, 1);
                    float e = (float)tc_rng_uniform(&r, -1, 1);
                    if (t < L) {
                        qh[((b * H + h) * L + t) * D + d] = a;
                        qs[((b * L + t) * H + h) * D + d] = a;
                    }
                    kh[((b * H + h) * S + t) * D + d] = c;
                    ks[((b * S + t) * H + h) * D + d] = c;
                    vh[((b * H + h) * S + t) * D + d] = e;
                    vs[((b * S + t) * H + h) * D + d] = e;
                }
    sdpa_tensor tq = tc_view4(qh, B, H, L, D), tk = tc_view4(kh, B, H, S, D);
    sdpa_tensor tv = tc_view4(vh, B, H, S, D), to = tc_view4(o1, B, H, L, D);
    /* BSHD views: logical [B, H, T, D] with strides [T*H*D, D, H*D, 1] */
    sdpa_tensor sq = tq, sk = tk, sv = tv, so = to;
    sq.data = qs, sk.data = ks, sv.data = vs, so.data = o2;
    sq.strides[0] = L * H * D, sq.strides[1] = D, sq.strides[2] = H * D;
    sk.strides[0] = S * H * D, sk.strides[1] = D, sk.strides[2] = H * D;
    sv.strides[0] = S * H * D, sv.strides[1] = D, sv.strides[2] = H * D;
    so.strides[0] = L * H * D, so.strides[1] = D, so.strides[2] = H * D;
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = 1;
    opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, NULL), SDPA_OK);
    assert_int_equal(sdpa_attention(&sq, &sk, &sv, &opt, &so, NULL, NULL), SDPA_OK);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < L; ++t)
                for (int d = 0; d < D; ++d) {
                    float x = o1[((b * H + h) * L + t) * D + d], y = o2[((b * L + t) * H + h) * D + d];
                    if (memcmp(&x, &y, sizeof x) != 0) {
                        fail_msg("BHSD vs BSHD differ at b=%d h=%d t=%d d=%d: %.9g vs %.9g", b, h, t,
                                 d, (double)x, (double)y);
                    }
                }
}

static void attention_stride0_broadcast_equals_materialised_copy(void **state)
{
    (void)state;
    /* k and v shared across batches and heads through stride 0, vs copied out. */
    enum { B = 3, H = 2, L = 4, S = 6, E = 5 };
    float q[B * H * L * E], k1[S * E], v1[S * E], kf[B * H * S * E], vf[B * H * S * E];
    float o1[B * H * L * E], o2[B * H * L * E];
    tc_rng r;
    tc_rng_seed(&r, 71);
    tc_fill_uniform(q, B * H * L * E, &r, -1, 1);
    for (int e = 0; e < S * E; ++e) {
        k1[e] = (float)tc_rng_uniform(&r, -1, 1);
        v1[e] = (float)tc_rng_uniform(&r, -1, 1);
    }
    for (int bh = 0; bh < B * H; ++bh) {
        memcpy(&kf[bh * S * E], k1, sizeof k1);
        memcpy(&vf[bh * S * E], v1, sizeof v1);
    }
    sdpa_tensor tq = tc_view4(q, B, H, L, E);
    sdpa_tensor tk = tc_view4(k1, B, H, S, E), tv = tc_view4(v1, B, H, S, E);
    tk.strides[0] = tk.strides[1] = 0;
    tv.strides[0] = tv.strides[1] = 0;
    sdpa_tensor fk = tc_view4(kf, B, H, S, E), fv = tc_view4(vf, B, H, S, E);
    sdpa_tensor to1 = tc_view4(o1, B, H, L, E), to2 = tc_view4(o2, B, H, L, E);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, NULL, &to1, NULL, NULL), SDPA_OK);
    assert_int_equal(sdpa_attention(&tq, &fk, &fv, NULL, &to2, NULL, NULL), SDPA_OK);
    for (int e = 0; e < B * H * L * E; ++e) {
        assert_float_equal(o1[e], o2[e], 1e-6);
    }
}

static void attention_empty_keys_zero_policy_writes_zero_rows(void **state)
{
    (void)state;
    /* S = 0: every row is empty; ZERO writes zeros and lse = -inf; ERROR fails. */
    float q[2 * 3] = {1, 2, 3, 4, 5, 6};
    float out[2 * 2], lse[2];
    sdpa_tensor tq = tc_view3(q, 1, 2, 3), tk = tc_view3(q, 1, 0, 3), tv = tc_view3(q, 1, 0, 2);
    tk.data = NULL; /* an empty view may have a NULL data pointer */
    tv.data = NULL;
    sdpa_tensor to = tc_view3(out, 1, 2, 2), tl;
    int64_t ls[2] = {1, 2};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 2, ls), SDPA_OK);
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(lse, sizeof lse);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, &tl), SDPA_ERR_EMPTY_ROW);
    assert_true(tc_is_canary(out, sizeof out) && tc_is_canary(lse, sizeof lse));
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, &tl), SDPA_OK);
    for (int e = 0; e < 4; ++e) {
        assert_true(out[e] == 0.0f);
    }
    assert_true(isinf(lse[0]) && lse[0] < 0 && isinf(lse[1]) && lse[1] < 0);
}

static void attention_query_padding_rows_are_exact_zeros(void **state)
{
    (void)state;
    small s;
    small_alloc(&s, 2, 1, 4, 5, 3, 3, 81);
    int64_t ql[2] = {2, 0};
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.query_lengths = ql;
    for (int stage = 0; stage < 4; ++stage) {
        opt.weights_stage = stage;
        assert_int_equal(small_run(&s, &opt), SDPA_OK);
        for (int64_t b = 0; b < 2; ++b) {
            for (int64_t i = 0; i < 4; ++i) {
                const int64_t row = b * 4 + i;
                const int pad = i >= ql[b];
                for (int e = 0; e < 3; ++e) {
                    if (pad) {
                        assert_true(s.out[row * 3 + e] == 0.0f);
                    } else {
                        assert_true(s.out[row * 3 + e] != 0.0f);
                    }
                }
                for (int j = 0; j < 5; ++j) {
                    if (pad) {
                        assert_true(s.w[row * 5 + j] == 0.0f);
                    }
                }
                if (pad) {
                    assert_true(isinf(s.lse[row]) && s.lse[row] < 0);
                } else {
                    assert_true(isfinite(s.lse[row]));
                }
            }
        }
    }
    small_free(&s);
}

static void attention_zero_length_query_and_batch_succeed(void **state)
{
    (void)state;
    float k[6] = {1, 2, 3, 4, 5, 6}, v[6] = {1, 2, 3, 4, 5, 6};
    sdpa_tensor tq = tc_view4(k, 1, 1, 0, 2), tk = tc_view4(k, 1, 1, 3, 2);
    sdpa_tensor tv = tc_view4(v, 1, 1, 3, 2), to = tc_view4(k, 1, 1, 0, 2);
    tq.data = NULL; /* empty views may have NULL data */
    to.data = NULL;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, NULL), SDPA_OK);
    sdpa_tensor bq = tc_view4(k, 0, 1, 2, 2), bk = tc_view4(k, 0, 1, 3, 2);
    sdpa_tensor bv = tc_view4(k, 0, 1, 3, 2), bo = tc_view4(k, 0, 1, 2, 2);
    bq.data = bk.data = bv.data = bo.data = NULL;
    assert_int_equal(sdpa_attention(&bq, &bk, &bv, NULL, &bo, NULL, NULL), SDPA_OK);
}

static void attention_gqa_matches_repeated_kv_heads(void **state)
{
    (void)state;
    enum { B = 1, HQ = 6, HKV = 2, L = 5, S = 7, E = 4 };
    float q[B * HQ * L * E], k[HKV * S * E], v[HKV * S * E], kr[HQ * S * E], vr[HQ * S * E];
    float o1[HQ * L * E], o2[HQ * L * E];
    tc_rng r;
    tc_rng_seed(&r, 91);
    tc_fill_uniform(q, HQ * L * E, &r, -1, 1);
    for (int e = 0; e < HKV * S * E; ++e) {
        k[e] = (float)tc_rng_uniform(&r, -1, 1);
        v[e] = (float)tc_rng_uniform(&r, -1, 1);
    }
    /* contiguous groups: query head h reads kv head h / 3 */
    for (int h = 0; h < HQ; ++h) {
        memcpy(&kr[h * S * E], &k[(h / 3) * S * E], S * E * sizeof(float));
        memcpy(&vr[h * S * E], &v[(h / 3) * S * E], S * E * sizeof(float));
    }
    sdpa_tensor tq = tc_view4(q, B, HQ, L, E);
    sdpa_tensor tk = tc_view4(k, B, HKV, S, E), tv = tc_view4(v, B, HKV, S, E);
    sdpa_tensor rk = tc_view4(kr, B, HQ, S, E), rv = tc_view4(vr, B, HQ, S, E);
    sdpa_tensor to1 = tc_view4(o1, B, HQ, L, E), to2 = tc_view4(o2, B, HQ, L, E);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, NULL, &to1, NULL, NULL), SDPA_OK);
    assert_int_equal(sdpa_attention(&tq, &rk, &rv, NULL, &to2, NULL, NULL), SDPA_OK);
    for (int e = 0; e < HQ * L * E; ++e) {
        assert_float_equal(o1[e], o2[e], 1e-6);
    }
}

/* ------------------------------------------------- defaults and the window flag */

/* A random [B=2, H=3, L=9, S=13] case with a random rank-4 allow-mask (rows may be empty). */
static void random_masked_case(small *s, uint8_t *mask, sdpa_allow_mask *m, uint64_t seed)
{
    enum { MB = 2, MH = 3, ML = 9, MS = 13 };
    small_alloc(s, MB, MH, ML, MS, 8, 5, seed);
    tc_rng r;
    tc_rng_seed(&r, seed + 1);
    for (int e = 0; e < MB * MH * ML * MS; ++e) {
        mask[e] = (uint8_t)(tc_rng_chance(&r, 0.6) ? 1 + tc_rng_int(&r, 0, 254) : 0);
    }
    const int64_t ms[4] = {MB, MH, ML, MS};
    *m = tc_mask_view(mask, 4, ms);
}

static void attention_zero_filled_options_equal_the_defaults(void **state)
{
    (void)state;
    small s;
    uint8_t mask[2 * 3 * 9 * 13];
    sdpa_allow_mask m;
    random_masked_case(&s, mask, &m, 4242);

    sdpa_options d;
    sdpa_options_init(&d);
    d.allow_mask = &m;
    d.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(small_run(&s, &d), SDPA_OK);
    snap a;
    snap_take(&a, &s);

    /* sdpa.h: every default is the zero value, so a zero-filled struct with struct_size set
     * means the defaults (window sides 0 without sliding_window = 1 are no window) */
    sdpa_options z = {.struct_size = sizeof z};
    z.allow_mask = &m;
    z.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(z.window_left, 0);
    assert_int_equal(z.window_right, 0);
    sdpa_status st = small_run(&s, &z);
    if (st != SDPA_OK) {
        fail_msg("zero-filled options: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    if (!snap_equal(&a, &s)) {
        fail_msg("a zero-filled sdpa_options gives other bits than sdpa_options_init()");
    }

    /* memset(0) + struct_size is the same thing spelled differently */
    sdpa_options mz;
    memset(&mz, 0, sizeof mz);
    mz.struct_size = sizeof mz;
    mz.allow_mask = &m;
    mz.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(small_run(&s, &mz), SDPA_OK);
    assert_true(snap_equal(&a, &s));

    /* and the defaults' window sides, if set by hand with sliding_window = 0, change nothing */
    z.window_left = 1;
    z.window_right = 0;
    assert_int_equal(small_run(&s, &z), SDPA_OK);
    assert_true(snap_equal(&a, &s));

    /* the same with causal on: zero-filled + causal == init + causal */
    d.causal = z.causal = 1;
    z.window_left = z.window_right = 0;
    assert_int_equal(small_run(&s, &d), SDPA_OK);
    snap c;
    snap_take(&c, &s);
    assert_int_equal(small_run(&s, &z), SDPA_OK);
    assert_true(snap_equal(&c, &s));
    assert_false(snap_equal(&a, &s)); /* causal did change something: the check can fail */

    snap_free(&c);
    snap_free(&a);
    small_free(&s);
}

static void attention_window_applies_only_with_sliding_window(void **state)
{
    (void)state;
    enum { WL = 9, WS = 13 };
    small s;
    uint8_t mask[2 * 3 * WL * WS];
    sdpa_allow_mask m;
    random_masked_case(&s, mask, &m, 777);
    memset(mask, 1, sizeof mask); /* only the window blocks */

    sdpa_options o;
    sdpa_options_init(&o);
    o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    assert_int_equal(small_run(&s, &o), SDPA_OK);
    snap none;
    snap_take(&none, &s);

    /* window (1, 0) bottom-right, without the flag: no window */
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.window_left = 1;
    o.window_right = 0;
    assert_int_equal(small_run(&s, &o), SDPA_OK);
    if (!snap_equal(&none, &s)) {
        fail_msg("window sides took effect with sliding_window = 0");
    }

    /* with the flag: equal to the sliding-window allow-mask of the builder */
    o.sliding_window = 1;
    assert_int_equal(small_run(&s, &o), SDPA_OK);
    snap win;
    snap_take(&win, &s);
    if (snap_equal(&none, &s)) {
        fail_msg("sliding_window = 1 with window (1, 0) changed nothing");
    }
    uint8_t band[WL * WS];
    assert_int_equal(sdpa_mask_sliding_window(band, WL, WS, 1, 0, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const int64_t bs[2] = {WL, WS};
    sdpa_allow_mask mb = tc_mask_view(band, 2, bs);
    sdpa_options viamask;
    sdpa_options_init(&viamask);
    viamask.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    viamask.allow_mask = &mb;
    assert_int_equal(small_run(&s, &viamask), SDPA_OK);
    for (size_t e = 0; e < win.nout; ++e) {
        if (fabsf(win.out[e] - s.out[e]) > 1e-6f) {
            fail_msg("out[%zu]: window option %.9g vs window mask %.9g", e, (double)win.out[e], (double)s.out[e]);
        }
    }
    for (size_t e = 0; e < win.nw; ++e) {
        assert_float_equal(win.w[e], s.w[e], 1e-6);
        if ((win.w[e] == 0.0f) != (s.w[e] == 0.0f)) {
            fail_msg("weights[%zu]: blocked by one and not the other", e);
        }
    }

    /* sliding_window = 1 with both sides -1 is no window either */
    o.window_left = o.window_right = -1;
    assert_int_equal(small_run(&s, &o), SDPA_OK);
    assert_true(snap_equal(&none, &s));

    snap_free(&win);
    snap_free(&none);
    small_free(&s);
}

/* ------------------------------------- bottom-right alignment with query lengths */

/* Compare one sequence b of a padded [B, H, L, S] run with the same sequence run alone,
 * unpadded ([1, H, Lb, Sb]); rows i >= Lb must be padding (0, 0, -inf). */
static void compare_with_alone(const small *pad, int64_t b, int64_t Lb, int64_t Sb, const sdpa_options *opt_alone,
                               const char *what)
{
    const int64_t H = pad->H, L = pad->L, S = pad->S, E = pad->E, Ev = pad->Ev;
    float *q = malloc(sizeof(float) * (size_t)(H * (Lb ? Lb : 1) * E));
    float *k = malloc(sizeof(float) * (size_t)(H * (Sb ? Sb : 1) * E));
    float *v = malloc(sizeof(float) * (size_t)(H * (Sb ? Sb : 1) * Ev));
    float *out = malloc(sizeof(float) * (size_t)(H * (Lb ? Lb : 1) * Ev));
    float *w = malloc(sizeof(float) * (size_t)(H * (Lb ? Lb : 1) * (Sb ? Sb : 1)));
    float *lse = malloc(sizeof(float) * (size_t)(H * (Lb ? Lb : 1)));
    assert_true(q && k && v && out && w && lse);
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < Lb; ++i) {
            memcpy(&q[(h * Lb + i) * E], &pad->q[((b * H + h) * L + i) * E], (size_t)E * sizeof(float));
        }
        for (int64_t j = 0; j < Sb; ++j) {
            memcpy(&k[(h * Sb + j) * E], &pad->k[((b * H + h) * S + j) * E], (size_t)E * sizeof(float));
            memcpy(&v[(h * Sb + j) * Ev], &pad->v[((b * H + h) * S + j) * Ev], (size_t)Ev * sizeof(float));
        }
    }
    sdpa_tensor tq, tk, tv, to, tw, tl;
    assert_int_equal(sdpa_tensor_init_4d(&tq, q, 1, H, Lb, E), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&tk, k, 1, H, Sb, E), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&tv, v, 1, H, Sb, Ev), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&to, out, 1, H, Lb, Ev), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&tw, w, 1, H, Lb, Sb), SDPA_OK);
    const int64_t ls[3] = {1, H, Lb};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, opt_alone, &to, &tw, &tl);
    if (st != SDPA_OK) {
        fail_msg("%s: sequence %lld alone: %s (%s)", what, (long long)b, sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < L; ++i) {
            const int64_t row = (b * H + h) * L + i;
            const float *prow = &pad->out[row * Ev];
            const float *pw = &pad->w[row * S];
            const float pl = pad->lse[row];
            if (i >= Lb) { /* padding row */
                for (int64_t c = 0; c < Ev; ++c) {
                    if (prow[c] != 0.0f) fail_msg("%s: b=%lld h=%lld padding row %lld out not 0", what, (long long)b, (long long)h, (long long)i);
                }
                for (int64_t j = 0; j < S; ++j) {
                    if (pw[j] != 0.0f) fail_msg("%s: b=%lld h=%lld padding row %lld weights not 0", what, (long long)b, (long long)h, (long long)i);
                }
                if (!(isinf(pl) && pl < 0)) fail_msg("%s: b=%lld padding row %lld lse %g", what, (long long)b, (long long)i, (double)pl);
                continue;
            }
            const int64_t arow = h * Lb + i;
            for (int64_t c = 0; c < Ev; ++c) {
                const float x = prow[c], y = out[arow * Ev + c];
                if (!(fabsf(x - y) <= 1e-6f)) {
                    fail_msg("%s: b=%lld h=%lld i=%lld out[%lld]: padded batch %.9g, alone %.9g", what, (long long)b,
                             (long long)h, (long long)i, (long long)c, (double)x, (double)y);
                }
            }
            for (int64_t j = 0; j < S; ++j) {
                const float x = pw[j], y = j < Sb ? w[arow * Sb + j] : 0.0f;
                if (!(fabsf(x - y) <= 1e-6f) || ((x == 0.0f) != (y == 0.0f))) {
                    fail_msg("%s: b=%lld h=%lld i=%lld weights[%lld]: padded batch %.9g, alone %.9g", what,
                             (long long)b, (long long)h, (long long)i, (long long)j, (double)x, (double)y);
                }
            }
            const float y = lse[arow];
            if (!((isinf(pl) && isinf(y) && pl == y) || fabsf(pl - y) <= 1e-6f)) {
                fail_msg("%s: b=%lld h=%lld i=%lld lse: padded batch %.9g, alone %.9g", what, (long long)b,
                         (long long)h, (long long)i, (double)pl, (double)y);
            }
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(w);
    free(lse);
}

static void attention_bottom_right_uses_per_batch_query_length(void **state)
{
    (void)state;
    /* A right-padded batch (query_lengths + key_lengths) under bottom-right causal equals each
     * sequence run alone, unpadded: p = i + S_b - L_b, so the last valid query of every
     * sequence sees every valid key (FlashAttention varlen). With p = i + S_b - L the
     * padded sequences would see fewer keys. */
    enum { NB = 5, H = 2, L = 6, S = 8, E = 5, EV = 3 };
    const int64_t ql[NB] = {6, 3, 1, 4, 2};
    const int64_t kl[NB] = {8, 5, 7, 2, 0}; /* b=3: L_b > S_b (first rows empty); b=4: no key */
    small s;
    small_alloc(&s, NB, H, L, S, E, EV, 2024);
    /* padding holds NaN: nothing may read it */
    for (int64_t b = 0; b < NB; ++b) {
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = ql[b]; i < L; ++i) {
                s.q[((b * H + h) * L + i) * E] = NAN;
            }
            for (int64_t j = kl[b]; j < S; ++j) {
                s.k[((b * H + h) * S + j) * E + 1] = NAN;
                s.v[((b * H + h) * S + j) * EV + 2] = NAN;
            }
        }
    }
    for (int variant = 0; variant < 3; ++variant) {
        sdpa_options o, alone;
        sdpa_options_init(&o);
        o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        const char *what = "causal";
        if (variant == 0) {
            o.causal = 1;
        } else if (variant == 1) {
            o.causal = 1; /* Hugging Face sliding_window = 3 */
            o.sliding_window = 1;
            o.window_left = 2;
            o.window_right = 0;
            what = "causal + window (2, 0)";
        } else {
            o.sliding_window = 1; /* a symmetric band around p */
            o.window_left = 1;
            o.window_right = 1;
            what = "window (1, 1)";
        }
        alone = o;
        o.query_lengths = ql;
        o.key_lengths = kl;
        sdpa_status st = small_run(&s, &o);
        if (st != SDPA_OK) {
            fail_msg("%s: padded batch: %s (%s)", what, sdpa_status_string(st), sdpa_last_error_message());
        }
        for (int64_t b = 0; b < NB; ++b) {
            compare_with_alone(&s, b, ql[b], kl[b], &alone, what);
        }
        /* the last valid query row of a sequence with S_b >= L_b >= 1 sees key S_b - 1 */
        if (variant == 0) {
            for (int64_t b = 0; b < 3; ++b) {
                const float wl = s.w[((b * H + 0) * L + (ql[b] - 1)) * S + (kl[b] - 1)];
                if (!(wl > 0.0f)) {
                    fail_msg("b=%lld: last valid query %lld gives weight %g to the last valid key %lld",
                             (long long)b, (long long)(ql[b] - 1), (double)wl, (long long)(kl[b] - 1));
                }
            }
        }
    }
    small_free(&s);
}

/* ------------------------------------------------ scores that overflow float32 */

static void attention_overflowing_scores_are_recomputed_in_double(void **state)
{
    (void)state;
    /* q . k0 = 1e40 and q . k1 = -1e40: +inf / -inf in float32, finite in double */
    float q[2] = {1e20f, 0.0f};
    float k[4] = {1e20f, 0.0f, -1e20f, 0.0f};
    float v[2] = {5.0f, 7.0f};
    float out[1], w[2], lse[1];
    sdpa_tensor tq = tc_view4(q, 1, 1, 1, 2), tk = tc_view4(k, 1, 1, 2, 2), tv = tc_view4(v, 1, 1, 2, 1);
    sdpa_tensor to = tc_view4(out, 1, 1, 1, 1), tw = tc_view4(w, 1, 1, 1, 2), tl;
    const int64_t ls[3] = {1, 1, 1};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(w, sizeof w);
    tc_fill_canary(lse, sizeof lse);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, NULL, &to, &tw, &tl);
    if (st != SDPA_OK) {
        fail_msg("q = [1e20, 0]: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    if (out[0] != 5.0f) {
        fail_msg("q = [1e20, 0], k = [+-1e20, 0], v = [5, 7]: out %.9g, expected exactly 5", (double)out[0]);
    }
    if (isnan(lse[0]) || (isinf(lse[0]) && lse[0] < 0)) {
        fail_msg("lse %g: expected finite or +inf", (double)lse[0]);
    }
    if (w[0] != 1.0f || w[1] != 0.0f) {
        fail_msg("probabilities [%.9g, %.9g], expected [1, 0]", (double)w[0], (double)w[1]);
    }

    /* q . k0 = 1e40 - 1e40 = 0 in double but inf - inf = NaN in float32; k1 = 0 scores 0 too */
    float q2[2] = {1e20f, 1e20f};
    float k2[4] = {1e20f, -1e20f, 0.0f, 0.0f};
    tq = tc_view4(q2, 1, 1, 1, 2);
    tk = tc_view4(k2, 1, 1, 2, 2);
    st = sdpa_attention(&tq, &tk, &tv, NULL, &to, &tw, &tl);
    if (st != SDPA_OK) {
        fail_msg("q = [1e20, 1e20]: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    if (!(fabsf(out[0] - 6.0f) <= 1e-6f) || !(fabsf(w[0] - 0.5f) <= 1e-6f) || !(fabsf(w[1] - 0.5f) <= 1e-6f)) {
        fail_msg("q . k0 = 1e40 - 1e40: out %.9g (expected 6), weights [%.9g, %.9g] (expected 0.5 each)",
                 (double)out[0], (double)w[0], (double)w[1]);
    }
    if (!(fabsf(lse[0] - (float)log(2.0)) <= 1e-6f)) {
        fail_msg("q . k0 = 1e40 - 1e40: lse %.9g, expected ln 2", (double)lse[0]);
    }

    /* scale 1e-10: q . k = 1e40 overflows float32 but scale * q . k = 1e30 does not */
    float q3[1] = {1e20f}, k3[2] = {1e20f, -1e20f};
    tq = tc_view4(q3, 1, 1, 1, 1);
    tk = tc_view4(k3, 1, 1, 2, 1);
    sdpa_options o;
    sdpa_options_init(&o);
    o.scale = 1e-10f;
    st = sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, &tl);
    if (st != SDPA_OK || out[0] != 5.0f || w[0] != 1.0f || w[1] != 0.0f || !isfinite(lse[0])) {
        fail_msg("scale 1e-10, q . k = +-1e40: %s, out %.9g (expected 5), weights [%.9g, %.9g], lse %g (finite)",
                 sdpa_status_string(st), (double)out[0], (double)w[0], (double)w[1], (double)lse[0]);
    }
}

static void attention_huge_inputs_give_no_nan(void **state)
{
    (void)state;
    /* q = k = +-1e30: every score overflows float32; ties between keys are common. The
     * double-precision reference says what the answer is. */
    enum { HB = 2, HH = 2, HL = 5, HS = 7, HE = 4, HEV = 3 };
    small s;
    small_alloc(&s, HB, HH, HL, HS, HE, HEV, 3030);
    tc_rng r;
    tc_rng_seed(&r, 3031);
    for (int e = 0; e < HB * HH * HL * HE; ++e) {
        s.q[e] = tc_rng_chance(&r, 0.5) ? 1e30f : -1e30f;
    }
    for (int e = 0; e < HB * HH * HS * HE; ++e) {
        s.k[e] = tc_rng_chance(&r, 0.5) ? 1e30f : -1e30f;
    }
    for (int e = 0; e < HE; ++e) {
        s.k[e] = s.q[e]; /* one exact match: score +4e60 * scale */
    }
    double *dq = malloc(sizeof(double) * HB * HH * HL * HE), *dk = malloc(sizeof(double) * HB * HH * HS * HE);
    double *dv = malloc(sizeof(double) * HB * HH * HS * HEV);
    double *rout = malloc(sizeof(double) * HB * HH * HL * HEV), *rw = malloc(sizeof(double) * HB * HH * HL * HS);
    double *rlse = malloc(sizeof(double) * HB * HH * HL);
    assert_true(dq && dk && dv && rout && rw && rlse);
    for (int e = 0; e < HB * HH * HL * HE; ++e) dq[e] = s.q[e];
    for (int e = 0; e < HB * HH * HS * HE; ++e) dk[e] = s.k[e];
    for (int e = 0; e < HB * HH * HS * HEV; ++e) dv[e] = s.v[e];

    for (int variant = 0; variant < 3; ++variant) {
        sdpa_options o;
        sdpa_options_init(&o);
        ref_problem p;
        ref_problem_init(&p);
        p.B = HB, p.Hq = p.Hkv = HH, p.L = HL, p.S = HS, p.E = HE, p.Ev = HEV;
        ref_view_contiguous4(&p.q, dq, HB, HH, HL, HE);
        ref_view_contiguous4(&p.k, dk, HB, HH, HS, HE);
        ref_view_contiguous4(&p.v, dv, HB, HH, HS, HEV);
        if (variant == 1) {
            o.causal = p.causal = 1;
            o.alignment = p.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        } else if (variant == 2) {
            o.softcap = 30.0f; /* caps +-inf to +-30: no overflow left after softcap */
            p.softcap = 30.0;
        }
        ref_report rep = ref_attention(&p, rout, rw, rlse, NULL);
        assert_int_equal(rep.status, REF_OK);
        sdpa_status st = small_run(&s, &o);
        if (st != SDPA_OK) {
            fail_msg("variant %d: %s (%s)", variant, sdpa_status_string(st), sdpa_last_error_message());
        }
        for (int e = 0; e < HB * HH * HL * HEV; ++e) {
            if (isnan(s.out[e])) {
                fail_msg("variant %d: out[%d] is NaN for finite inputs of 1e30", variant, e);
            }
            if (!(fabs((double)s.out[e] - rout[e]) <= 1e-5)) {
                fail_msg("variant %d: out[%d] = %.9g, reference %.9g", variant, e, (double)s.out[e], rout[e]);
            }
        }
        for (int e = 0; e < HB * HH * HL * HS; ++e) {
            if (!(fabs((double)s.w[e] - rw[e]) <= 1e-6)) {
                fail_msg("variant %d: weights[%d] = %.9g, reference %.9g", variant, e, (double)s.w[e], rw[e]);
            }
        }
        for (int e = 0; e < HB * HH * HL; ++e) {
            if (isnan(s.lse[e]) || (isinf(s.lse[e]) && s.lse[e] < 0)) {
                fail_msg("variant %d: lse[%d] = %g", variant, e, (double)s.lse[e]);
            }
        }
    }
    free(dq);
    free(dk);
    free(dv);
    free(rout);
    free(rw);
    free(rlse);
    small_free(&s);
}

/* ------------------------------------------------- regressions found by fuzzing */

/* Relative closeness for expected values far from 1 (scores near FLT_MAX). */
static int close_rel(double got, double want, double rtol)
{
    return isfinite(got) && fabs(got - want) <= rtol * fabs(want);
}

static void attention_softcap_does_not_hide_float32_score_overflow(void **state)
{
    (void)state;
    /* q . k0 = 3e38 + 3e38 - 3e38 - 3e38 - 3e38 = -3e38 (finite), but a float32 sum passes
     * through +inf and softcap turned tanh(+inf) into a plausible +1. The true capped scores
     * are tanh(-3e38) = -1 and 0, so out = e^-1 / (e^-1 + 1) = 1 / (1 + e) and
     * lse = ln(e^-1 + 1). The defect gave 0.731059 (the sign of s0 flipped). */
    float q[5] = {1.5e19f, 1.5e19f, -1.5e19f, -1.5e19f, -1.5e19f};
    float k[10] = {2e19f, 2e19f, 2e19f, 2e19f, 2e19f, 0, 0, 0, 0, 0};
    float v[2] = {1.0f, 0.0f};
    float out[1], lse[1];
    sdpa_tensor tq = tc_view3(q, 1, 1, 5), tk = tc_view3(k, 1, 2, 5), tv = tc_view3(v, 1, 2, 1);
    sdpa_tensor to = tc_view3(out, 1, 1, 1), tl;
    const int64_t ls[2] = {1, 1};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 2, ls), SDPA_OK);
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(lse, sizeof lse);
    sdpa_options o;
    sdpa_options_init(&o);
    o.scale = 1.0f;
    o.softcap = 1.0f;
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
    if (st != SDPA_OK) {
        fail_msg("softcap 1, q . k0 = -3e38: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    const double want_out = 1.0 / (1.0 + exp(1.0)), want_lse = log(exp(-1.0) + 1.0);
    if (!(fabs((double)out[0] - want_out) <= 1e-5)) {
        fail_msg("softcap 1, q . k0 = -3e38: out %.9g, expected 1/(1+e) = %.9g", (double)out[0], want_out);
    }
    if (!(fabs((double)lse[0] - want_lse) <= 1e-5)) {
        fail_msg("softcap 1, q . k0 = -3e38: lse %.9g, expected ln(e^-1 + 1) = %.9g", (double)lse[0], want_lse);
    }
}

/* Rank 3, B = 1, E = Ev = 1, q = k = 0 (uniform weights over the allowed keys), OFFSETS
 * alignment with a sliding window, policy given; out is compared with want[L]. */
/* Fail unless |got[i] - want[i]| <= tol for the 4 entries (tol 0: exact). */
static void expect_close4(const char *what, const float *got, const float *want, float tol)
{
    for (int i = 0; i < 4; ++i) {
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            fail_msg("%s: out[%d] = %.9g, expected %.9g", what, i, (double)got[i], (double)want[i]);
        }
    }
}

static sdpa_status run_offset_window(int64_t L, int64_t S, const float *v, int64_t offset, int64_t left,
                                     int64_t right, int32_t empty_rows, float *out)
{
    float q[8] = {0}, k[8] = {0};
    assert_true(L <= 8 && S <= 8);
    sdpa_tensor tq = tc_view3(q, 1, L, 1), tk = tc_view3(k, 1, S, 1);
    sdpa_tensor tv = tc_view3((float *)(uintptr_t)v, 1, S, 1), to = tc_view3(out, 1, L, 1);
    int64_t off[1] = {offset};
    sdpa_options o;
    sdpa_options_init(&o);
    o.alignment = SDPA_ALIGN_OFFSETS;
    o.query_offsets = off;
    o.sliding_window = 1;
    o.window_left = left;
    o.window_right = right;
    o.causal = 0;
    o.empty_rows = empty_rows;
    tc_fill_canary(out, sizeof(float) * (size_t)L);
    return sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
}

static void attention_windows_beyond_2_61_bound_keys_at_large_offsets(void **state)
{
    (void)state;
    /* Offsets reach 2^61, so a window of 2^61 + 1 is still a real bound there: with
     * p = i + 2^61 and left = 2^61 + 1, key j is allowed iff j >= i - 1. The defect treated
     * every window beyond 2^61 as unbounded (all rows 2.5). */
    const int64_t two61 = (int64_t)1 << 61;
    const float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float out[4];
    sdpa_status st = run_offset_window(4, 4, v, two61, two61 + 1, -1, SDPA_EMPTY_ROWS_ZERO, out);
    if (st != SDPA_OK) {
        fail_msg("offset 2^61, left 2^61+1: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    const float want_left[4] = {2.5f, 2.5f, 3.0f, 3.5f};
    expect_close4("offset 2^61, window (2^61+1, -1) (keys j >= i-1)", out, want_left, 1e-6f);

    /* mirror: p = i - 2^61, right = 2^61 + 1: key j allowed iff j <= i + 1 */
    st = run_offset_window(4, 4, v, -two61, -1, two61 + 1, SDPA_EMPTY_ROWS_ZERO, out);
    if (st != SDPA_OK) {
        fail_msg("offset -2^61, right 2^61+1: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    const float want_right[4] = {1.5f, 2.0f, 2.5f, 2.5f};
    expect_close4("offset -2^61, window (-1, 2^61+1) (keys j <= i+1)", out, want_right, 1e-6f);

    /* S = 1: key 0 is allowed for rows i <= 1 only, so rows 2 and 3 are empty */
    const float v1[1] = {1.0f};
    st = run_offset_window(4, 1, v1, two61, two61 + 1, -1, SDPA_EMPTY_ROWS_ERROR, out);
    if (st != SDPA_ERR_EMPTY_ROW) {
        fail_msg("S = 1, offset 2^61, left 2^61+1, policy ERROR: expected SDPA_ERR_EMPTY_ROW, got %s (%s)",
                 sdpa_status_string(st), sdpa_last_error_message());
    }
    assert_true(tc_is_canary(out, sizeof out));
    st = run_offset_window(4, 1, v1, two61, two61 + 1, -1, SDPA_EMPTY_ROWS_ZERO, out);
    assert_int_equal(st, SDPA_OK);
    const float want_one[4] = {1.0f, 1.0f, 0.0f, 0.0f};
    expect_close4("S = 1, offset 2^61, left 2^61+1, policy ZERO", out, want_one, 0.0f);
}

static void attention_score_stage_weights_survive_overflowing_dot_product(void **state)
{
    (void)state;
    /* q . k0 = 4e38 overflows float32, scale * q . k0 = 2e38 does not: the score stages must
     * show 2e38 (the defect wrote +inf) and softcap must act on the true score. */
    float q[1] = {2e19f}, k[2] = {2e19f, 0.0f}, v[2] = {1.0f, 2.0f};
    float out[1], w[2], lse[1];
    sdpa_tensor tq = tc_view4(q, 1, 1, 1, 1), tk = tc_view4(k, 1, 1, 2, 1), tv = tc_view4(v, 1, 1, 2, 1);
    sdpa_tensor to = tc_view4(out, 1, 1, 1, 1), tw = tc_view4(w, 1, 1, 1, 2), tl;
    const int64_t ls[3] = {1, 1, 1};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    const int stages[3] = {SDPA_WEIGHTS_SCORES, SDPA_WEIGHTS_SOFTCAPPED, SDPA_WEIGHTS_MASKED};
    for (int t = 0; t < 3; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.scale = 0.5f;
        o.weights_stage = stages[t];
        tc_fill_canary(out, sizeof out);
        tc_fill_canary(w, sizeof w);
        tc_fill_canary(lse, sizeof lse);
        sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, &tl);
        if (st != SDPA_OK) {
            fail_msg("stage %d: %s (%s)", stages[t], sdpa_status_string(st), sdpa_last_error_message());
        }
        if (!close_rel((double)w[0], 0.5 * (double)q[0] * (double)k[0], 1e-6) || w[1] != 0.0f) {
            fail_msg("stage %d, scale 0.5, q . k = [4e38, 0]: weights [%.9g, %.9g], expected [2e38, 0]", stages[t],
                     (double)w[0], (double)w[1]);
        }
        if (out[0] != 1.0f) {
            fail_msg("stage %d: out %.9g, expected 1 (all weight on key 0)", stages[t], (double)out[0]);
        }
        if (!isfinite(lse[0])) {
            fail_msg("stage %d: lse %g, expected finite (2e38)", stages[t], (double)lse[0]);
        }
    }

    /* softcap 1e38: s0 = 1e38 * tanh(2e38 / 1e38) = 1e38 * tanh(2), not 1e38 * tanh(inf) */
    const int capped[2] = {SDPA_WEIGHTS_SOFTCAPPED, SDPA_WEIGHTS_MASKED};
    for (int t = 0; t < 2; ++t) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.scale = 0.5f;
        o.softcap = 1e38f;
        o.weights_stage = capped[t];
        tc_fill_canary(w, sizeof w);
        sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, &tl);
        if (st != SDPA_OK) {
            fail_msg("softcap 1e38, stage %d: %s (%s)", capped[t], sdpa_status_string(st), sdpa_last_error_message());
        }
        const double s0 = 0.5 * (double)q[0] * (double)k[0];
        const double want = (double)1e38f * tanh(s0 / (double)1e38f);
        if (!close_rel((double)w[0], want, 1e-5) || w[1] != 0.0f) {
            fail_msg("softcap 1e38, stage %d: weights [%.9g, %.9g], expected [1e38 * tanh(2) = %.9g, 0]", capped[t],
                     (double)w[0], (double)w[1], want);
        }
        if (out[0] != 1.0f) {
            fail_msg("softcap 1e38, stage %d: out %.9g, expected 1", capped[t], (double)out[0]);
        }
    }
}

/* E = 1, q = k = 0 (uniform weights over the S keys): out[Ev] and lse for values v[S, Ev]. */
static void run_uniform_pv(const float *v, int64_t S, int64_t Ev, float *out, float *lse)
{
    float q[1] = {0.0f}, k[64] = {0};
    assert_true(S <= 64);
    sdpa_tensor tq = tc_view4(q, 1, 1, 1, 1), tk = tc_view4(k, 1, 1, S, 1);
    sdpa_tensor tv = tc_view4((float *)(uintptr_t)v, 1, 1, S, Ev), to = tc_view4(out, 1, 1, 1, Ev), tl;
    const int64_t ls[3] = {1, 1, 1};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    tc_fill_canary(out, sizeof(float) * (size_t)Ev);
    tc_fill_canary(lse, sizeof(float));
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, &tl);
    if (st != SDPA_OK) {
        fail_msg("S = %lld, Ev = %lld, v near FLT_MAX: %s (%s)", (long long)S, (long long)Ev, sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    if (!(fabs((double)lse[0] - log((double)S)) <= 1e-6)) {
        fail_msg("S = %lld, q = k = 0: lse %.9g, expected ln S", (long long)S, (double)lse[0]);
    }
}

static void attention_pv_overflow_is_recomputed_in_double(void **state)
{
    (void)state;
    float out[3], lse[1];
    /* mixed signs near FLT_MAX, weights 1/4 (exact): the answer is exactly 0 */
    const float mixed[4] = {3e38f, 3e38f, -3e38f, -3e38f};
    run_uniform_pv(mixed, 4, 1, out, lse);
    if (out[0] != 0.0f) {
        fail_msg("v = [3e38, 3e38, -3e38, -3e38], uniform weights: out %.9g, expected 0", (double)out[0]);
    }
    const float high[4] = {3e38f, 3e38f, 3e38f, 1e38f};
    const double want_high = 0.25 * (3.0 * (double)3e38f + (double)1e38f);
    run_uniform_pv(high, 4, 1, out, lse);
    if (!close_rel((double)out[0], want_high, 1e-6)) {
        fail_msg("v = [3e38, 3e38, 3e38, 1e38], uniform weights: out %.9g, expected %.9g", (double)out[0], want_high);
    }

    /* Uniform weights (float)(1/S) can sum to slightly more than 1, so the float32 P.V sum
     * over values of +-FLT_MAX can pass FLT_MAX although the answer is +-FLT_MAX (with
     * OpenBLAS here e.g. S = 11 gave +inf; which S overflows depends on the BLAS kernel, so
     * sweep S). A row that overflows is redone in double; the mixed-sign third column
     * (3e38, -3e38, 3e38, ...) must come out right in that row too. */
    static float v[64 * 3];
    for (int64_t Ev = 1; Ev <= 3; ++Ev) {
        for (int64_t S = 2; S <= 64; ++S) {
            for (int64_t j = 0; j < S; ++j) {
                for (int64_t d = 0; d < Ev; ++d) {
                    v[j * Ev + d] = d == 0 ? FLT_MAX : d == 1 ? -FLT_MAX : (j % 2 == 0 ? 3e38f : -3e38f);
                }
            }
            run_uniform_pv(v, S, Ev, out, lse);
            for (int64_t d = 0; d < Ev; ++d) {
                const double want = d == 0 ? (double)FLT_MAX
                                  : d == 1 ? -(double)FLT_MAX
                                           : (S % 2 == 0 ? 0.0 : (double)3e38f / (double)S);
                const double tol = d < 2 ? 1e-6 * (double)FLT_MAX : 1e-6 * (double)3e38f;
                if (!isfinite(out[d]) || !(fabs((double)out[d] - want) <= tol)) {
                    fail_msg("S = %lld, Ev = %lld, uniform weights: out[%lld] = %.9g, expected %.9g", (long long)S,
                             (long long)Ev, (long long)d, (double)out[d], want);
                }
            }
        }
    }
}

static void attention_empty_views_with_null_data_succeed(void **state)
{
    (void)state;
    /* Ev = 0: v and out are empty views with NULL data; lse is still computed (ln S for
     * q = k = 0). */
    float q[2] = {0.0f, 0.0f}, k[2] = {0.0f, 0.0f}, lse[2];
    sdpa_tensor tq = tc_view4(q, 1, 1, 2, 1), tk = tc_view4(k, 1, 1, 2, 1);
    sdpa_tensor tv = tc_view4(NULL, 1, 1, 2, 0), to = tc_view4(NULL, 1, 1, 2, 0), tl;
    const int64_t ls[3] = {1, 1, 2};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("Ev = 0 with NULL v/out data: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    tc_fill_canary(lse, sizeof lse);
    st = sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, &tl);
    if (st != SDPA_OK) {
        fail_msg("Ev = 0 with NULL v/out data and lse: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    for (int i = 0; i < 2; ++i) {
        if (!(fabsf(lse[i] - (float)log(2.0)) <= 1e-6f)) {
            fail_msg("Ev = 0: lse[%d] = %.9g, expected ln 2", i, (double)lse[i]);
        }
    }
    /* L = 2 without weights: AUTO runs the decode path; a kernel did run (not "none"). */
    assert_true(strncmp(sdpa_last_kernel(), "decode-", 7) == 0);

    /* L = 0 with NULL q and out: valid, nothing computed, kernel "none" */
    float kk[6] = {1, 2, 3, 4, 5, 6}, vv[6] = {1, 2, 3, 4, 5, 6};
    sdpa_tensor eq = tc_view4(NULL, 1, 1, 0, 2), ek = tc_view4(kk, 1, 1, 3, 2);
    sdpa_tensor ev = tc_view4(vv, 1, 1, 3, 2), eo = tc_view4(NULL, 1, 1, 0, 2);
    st = sdpa_attention(&eq, &ek, &ev, NULL, &eo, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("L = 0 with NULL q/out data: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    assert_string_equal(sdpa_last_kernel(), "none");
    assert_string_equal(sdpa_last_error_message(), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attention_golden_causal_3x3_matches_averages),
        cmocka_unit_test(attention_golden_rank3_matches_rank4),
        cmocka_unit_test(attention_reference_golden_causal_matches_averages),
        cmocka_unit_test(attention_random_configs_match_reference),
        cmocka_unit_test(attention_random_large_configs_match_reference),
        cmocka_unit_test(attention_weights_rows_sum_to_one),
        cmocka_unit_test(attention_causal_future_token_changes_no_earlier_row),
        cmocka_unit_test(attention_key_permutation_leaves_output_unchanged),
        cmocka_unit_test(attention_token_permutation_permutes_outputs),
        cmocka_unit_test(attention_same_call_twice_is_bit_identical),
        cmocka_unit_test(attention_nonfinite_in_masked_values_changes_nothing),
        cmocka_unit_test(attention_bshd_and_bhsd_layouts_are_bit_identical),
        cmocka_unit_test(attention_stride0_broadcast_equals_materialised_copy),
        cmocka_unit_test(attention_empty_keys_zero_policy_writes_zero_rows),
        cmocka_unit_test(attention_query_padding_rows_are_exact_zeros),
        cmocka_unit_test(attention_zero_length_query_and_batch_succeed),
        cmocka_unit_test(attention_gqa_matches_repeated_kv_heads),
        cmocka_unit_test(attention_zero_filled_options_equal_the_defaults),
        cmocka_unit_test(attention_window_applies_only_with_sliding_window),
        cmocka_unit_test(attention_bottom_right_uses_per_batch_query_length),
        cmocka_unit_test(attention_overflowing_scores_are_recomputed_in_double),
        cmocka_unit_test(attention_huge_inputs_give_no_nan),
        cmocka_unit_test(attention_softcap_does_not_hide_float32_score_overflow),
        cmocka_unit_test(attention_windows_beyond_2_61_bound_keys_at_large_offsets),
        cmocka_unit_test(attention_score_stage_weights_survive_overflowing_dot_product),
        cmocka_unit_test(attention_pv_overflow_is_recomputed_in_double),
        cmocka_unit_test(attention_empty_views_with_null_data_succeed),
    };
    return cmocka_run_group_tests_name("attention", tests, NULL, NULL);
}
