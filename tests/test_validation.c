/*
 * sdpa_attention validation: every malformed call returns its specific status, leaves every
 * byte of the outputs (and inputs) untouched and explains itself in
 * sdpa_last_error_message(). Also status strings, version, views and workspace sizing.
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

#include "test_common.h"

/* ------------------------------------------------------------------ fixture */

/* A valid GQA problem: B=2, Hq=4, Hkv=2, L=3, S=5, E=4, Ev=3, with weights and lse.
 * Every buffer lives in one arena (with gaps) so that a failing call can be checked to
 * leave all of it byte-for-byte intact. */
enum { B = 2, HQ = 4, HKV = 2, L = 3, S = 5, E = 4, EV = 3 };
enum {
    N_Q = B * HQ * L * E,
    N_K = B * HKV * S * E,
    N_V = B * HKV * S * EV,
    N_OUT = B * HQ * L * EV,
    N_W = B * HQ * L * S,
    N_LSE = B * HQ * L,
    N_BIAS = B * HQ * L * S,
    GAP = 16,
    OFF_Q = GAP,
    OFF_K = OFF_Q + N_Q + GAP,
    OFF_V = OFF_K + N_K + GAP,
    OFF_OUT = OFF_V + N_V + GAP,
    OFF_W = OFF_OUT + N_OUT + GAP,
    OFF_LSE = OFF_W + N_W + GAP,
    OFF_BIAS = OFF_LSE + N_LSE + GAP,
    N_ARENA = OFF_BIAS + N_BIAS + GAP,
};

typedef struct fx {
    float arena[N_ARENA];
    float before[N_ARENA];
    uint8_t mask[B * HQ * L * S];
    uint8_t mask_before[B * HQ * L * S];
    float *q, *k, *v, *out, *w, *lse, *bias;
    sdpa_tensor tq, tk, tv, to, tw, tl, tb;
    sdpa_allow_mask m;
    sdpa_options opt;
    int pass_w, pass_lse;
} fx;

static void fx_init(fx *f)
{
    memset(f, 0, sizeof *f);
    tc_fill_canary(f->arena, sizeof f->arena);
    f->q = f->arena + OFF_Q;
    f->k = f->arena + OFF_K;
    f->v = f->arena + OFF_V;
    f->out = f->arena + OFF_OUT;
    f->w = f->arena + OFF_W;
    f->lse = f->arena + OFF_LSE;
    f->bias = f->arena + OFF_BIAS;
    tc_rng r;
    tc_rng_seed(&r, 1234);
    tc_fill_uniform(f->q, N_Q, &r, -1, 1);
    tc_fill_uniform(f->k, N_K, &r, -1, 1);
    tc_fill_uniform(f->v, N_V, &r, -1, 1);
    tc_fill_uniform(f->bias, N_BIAS, &r, -1, 1);
    memset(f->mask, 1, sizeof f->mask);
    f->tq = tc_view4(f->q, B, HQ, L, E);
    f->tk = tc_view4(f->k, B, HKV, S, E);
    f->tv = tc_view4(f->v, B, HKV, S, EV);
    f->to = tc_view4(f->out, B, HQ, L, EV);
    f->tw = tc_view4(f->w, B, HQ, L, S);
    f->tb = tc_view4(f->bias, B, HQ, L, S);
    int64_t ls[3] = {B, HQ, L};
    assert_int_equal(sdpa_tensor_init(&f->tl, f->lse, 3, ls), SDPA_OK);
    int64_t ms[4] = {B, HQ, L, S};
    f->m = tc_mask_view(f->mask, 4, ms);
    sdpa_options_init(&f->opt);
    f->pass_w = f->pass_lse = 1;
}

static sdpa_status fx_call(fx *f, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                           const sdpa_options *opt, const sdpa_tensor *out)
{
    return sdpa_attention(q, k, v, opt, out, f->pass_w ? &f->tw : NULL, f->pass_lse ? &f->tl : NULL);
}

/* Run with the fixture's views/options (or the given overrides) and check the failure. */
static void check_fail_views(fx *f, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                             const sdpa_options *opt, const sdpa_tensor *out, sdpa_status expected,
                             const char *what, int line)
{
    memcpy(f->before, f->arena, sizeof f->arena);
    memcpy(f->mask_before, f->mask, sizeof f->mask);
    sdpa_status st = fx_call(f, q, k, v, opt, out);
    if (st != expected) {
        fail_msg("line %d, %s: expected %s, got %s (\"%s\")", line, what, sdpa_status_string(expected),
                 sdpa_status_string(st), sdpa_last_error_message());
    }
    if (memcmp(f->before, f->arena, sizeof f->arena) != 0) {
        size_t at = 0;
        while (memcmp(&f->before[at], &f->arena[at], sizeof(float)) == 0) {
            ++at;
        }
        fail_msg("line %d, %s: a byte was written although the call failed (float %zu of the arena)",
                 line, what, at);
    }
    if (memcmp(f->mask_before, f->mask, sizeof f->mask) != 0) {
        fail_msg("line %d, %s: the mask was written", line, what);
    }
    const char *msg = sdpa_last_error_message();
    if (msg == NULL || msg[0] == '\0') {
        fail_msg("line %d, %s: sdpa_last_error_message() is empty after %s", line, what,
                 sdpa_status_string(st));
    }
}

#define CHECK_FAIL(f, expected, what) \
    check_fail_views((f), &(f)->tq, &(f)->tk, &(f)->tv, &(f)->opt, &(f)->to, (expected), (what), __LINE__)

static void check_ok(fx *f, const char *what, int line)
{
    sdpa_status st = fx_call(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to);
    if (st != SDPA_OK) {
        fail_msg("line %d, %s: expected SDPA_OK, got %s (\"%s\")", line, what, sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    assert_string_equal(sdpa_last_error_message(), "");
}

#define CHECK_OK(f, what) check_ok((f), (what), __LINE__)

static fx *fx_new(void)
{
    fx *f = malloc(sizeof *f);
    assert_non_null(f);
    fx_init(f);
    return f;
}

/* -------------------------------------------------------------- the baseline */

static void validation_fixture_baseline_succeeds(void **state)
{
    (void)state;
    fx *f = fx_new();
    CHECK_OK(f, "baseline");
    f->opt.allow_mask = &f->m;
    f->opt.bias = &f->tb;
    CHECK_OK(f, "baseline with mask and bias");
    assert_int_equal(sdpa_attention(&f->tq, &f->tk, &f->tv, NULL, &f->to, NULL, NULL), SDPA_OK);
    free(f);
}

/* ---------------------------------------------------------------- pointers */

static void validation_null_pointers_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    check_fail_views(f, NULL, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_NULL_POINTER, "q NULL", __LINE__);
    check_fail_views(f, &f->tq, NULL, &f->tv, &f->opt, &f->to, SDPA_ERR_NULL_POINTER, "k NULL", __LINE__);
    check_fail_views(f, &f->tq, &f->tk, NULL, &f->opt, &f->to, SDPA_ERR_NULL_POINTER, "v NULL", __LINE__);
    check_fail_views(f, &f->tq, &f->tk, &f->tv, &f->opt, NULL, SDPA_ERR_NULL_POINTER, "out NULL", __LINE__);
    sdpa_tensor t = f->tq;
    t.data = NULL;
    check_fail_views(f, &t, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_NULL_POINTER, "q.data NULL", __LINE__);
    t = f->tv;
    t.data = NULL;
    check_fail_views(f, &f->tq, &f->tk, &t, &f->opt, &f->to, SDPA_ERR_NULL_POINTER, "v.data NULL", __LINE__);
    f->tw.data = NULL;
    CHECK_FAIL(f, SDPA_ERR_NULL_POINTER, "weights.data NULL");
    free(f);

    f = fx_new();
    f->opt.causal = 1;
    f->opt.alignment = SDPA_ALIGN_OFFSETS; /* query_offsets required */
    CHECK_FAIL(f, SDPA_ERR_NULL_POINTER, "OFFSETS alignment without query_offsets");
    free(f);
}

/* ------------------------------------------------------------------- ranks */

static void validation_rank_out_of_range_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    /* rank 2 everywhere */
    sdpa_tensor q = f->tq, k = f->tk, v = f->tv, o = f->to;
    q.rank = k.rank = v.rank = o.rank = 2;
    q.shape[0] = L, q.shape[1] = E, q.strides[0] = E, q.strides[1] = 1;
    k.shape[0] = S, k.shape[1] = E, k.strides[0] = E, k.strides[1] = 1;
    v.shape[0] = S, v.shape[1] = EV, v.strides[0] = EV, v.strides[1] = 1;
    o.shape[0] = L, o.shape[1] = EV, o.strides[0] = EV, o.strides[1] = 1;
    for (int d = 2; d < SDPA_MAX_RANK; ++d) {
        q.shape[d] = k.shape[d] = v.shape[d] = o.shape[d] = 0;
        q.strides[d] = k.strides[d] = v.strides[d] = o.strides[d] = 0;
    }
    f->pass_w = f->pass_lse = 0;
    check_fail_views(f, &q, &k, &v, &f->opt, &o, SDPA_ERR_RANK, "rank 2", __LINE__);

    /* rank 5 everywhere: a leading 1 */
    sdpa_tensor *views[4] = {&q, &k, &v, &o};
    const sdpa_tensor *src[4] = {&f->tq, &f->tk, &f->tv, &f->to};
    for (int t = 0; t < 4; ++t) {
        sdpa_tensor x = *src[t];
        x.rank = 5;
        for (int d = 4; d >= 1; --d) {
            x.shape[d] = x.shape[d - 1];
            x.strides[d] = x.strides[d - 1];
        }
        x.shape[0] = 1;
        x.strides[0] = 0;
        *views[t] = x;
    }
    check_fail_views(f, &q, &k, &v, &f->opt, &o, SDPA_ERR_RANK, "rank 5", __LINE__);

    /* mismatched ranks: q rank 3, others rank 4 */
    f->pass_w = f->pass_lse = 1;
    q = tc_view3(f->q, B * HQ, L, E);
    check_fail_views(f, &q, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_RANK, "q rank 3, k rank 4", __LINE__);
    o = tc_view3(f->out, B * HQ, L, EV);
    check_fail_views(f, &f->tq, &f->tk, &f->tv, &f->opt, &o, SDPA_ERR_RANK, "out rank 3, q rank 4", __LINE__);
    free(f);
}

/* ------------------------------------------------------------------ shapes */

static void validation_mismatched_shapes_are_rejected(void **state)
{
    (void)state;
    fx *f;
#define SHAPE_CASE(stmt, what)                      \
    do {                                            \
        f = fx_new();                               \
        stmt;                                       \
        CHECK_FAIL(f, SDPA_ERR_SHAPE, what);        \
        free(f);                                    \
    } while (0)
    SHAPE_CASE(f->tk.shape[0] = 1, "k batch 1 vs q batch 2");
    SHAPE_CASE(f->to.shape[0] = 1, "out batch 1");
    SHAPE_CASE(f->tv.shape[1] = 1, "v heads 1 vs k heads 2");
    SHAPE_CASE(f->to.shape[1] = 2, "out heads 2 vs q heads 4");
    SHAPE_CASE(f->tk.shape[3] = 3, "k E 3 vs q E 4");
    SHAPE_CASE(f->tv.shape[2] = 4, "v S 4 vs k S 5");
    SHAPE_CASE(f->to.shape[3] = 2, "out Ev 2 vs v Ev 3");
    SHAPE_CASE(f->to.shape[2] = 2, "out L 2 vs q L 3");
    SHAPE_CASE(f->tw.shape[3] = 4, "weights S 4");
    SHAPE_CASE(f->tw.shape[2] = 2, "weights L 2");
    SHAPE_CASE(f->tl.shape[2] = 2, "lse L 2");
    SHAPE_CASE(f->tl.shape[1] = 2, "lse H 2");
    /* Hq % Hkv != 0: 3 query heads over 2 kv heads */
    SHAPE_CASE((f->tq.shape[1] = 3, f->to.shape[1] = 3, f->tw.shape[1] = 3, f->tl.shape[1] = 3),
               "Hq 3 % Hkv 2");
#undef SHAPE_CASE
}

static void validation_unbroadcastable_mask_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->opt.allow_mask = &f->m;
    int64_t s4[1] = {4};
    f->m = tc_mask_view(f->mask, 1, s4);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "mask [4] vs S 5");
    int64_t s3[3] = {2, L, S};
    f->m = tc_mask_view(f->mask, 3, s3);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "mask [2,3,5] vs Hq 4");
    int64_t s2[2] = {2, S};
    f->m = tc_mask_view(f->mask, 2, s2);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "mask [2,5] vs L 3");
    int64_t s44[4] = {3, 1, 1, S};
    f->m = tc_mask_view(f->mask, 4, s44);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "mask [3,1,1,5] vs B 2");

    int64_t ok[4] = {B, 1, L, S};
    f->m = tc_mask_view(f->mask, 4, ok);
    f->m.rank = 0;
    CHECK_FAIL(f, SDPA_ERR_RANK, "mask rank 0");
    f->m.rank = 5;
    CHECK_FAIL(f, SDPA_ERR_RANK, "mask rank 5");
    f->m.rank = 4;
    f->m.reserved0 = 1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "mask reserved0");
    f->m.reserved0 = 0;
    f->m.data = NULL;
    CHECK_FAIL(f, SDPA_ERR_NULL_POINTER, "mask data NULL");
    free(f);
}

static void validation_unbroadcastable_bias_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->opt.bias = &f->tb;
    int64_t s4[1] = {4};
    assert_int_equal(sdpa_tensor_init(&f->tb, f->bias, 1, s4), SDPA_OK);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "bias [4] vs S 5");
    int64_t s3[3] = {3, L, S};
    assert_int_equal(sdpa_tensor_init(&f->tb, f->bias, 3, s3), SDPA_OK);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "bias [3,3,5] vs Hq 4");
    int64_t s2[2] = {L + 1, S};
    assert_int_equal(sdpa_tensor_init(&f->tb, f->bias, 2, s2), SDPA_OK);
    CHECK_FAIL(f, SDPA_ERR_BROADCAST, "bias [4,5] vs L 3");

    f->tb = tc_view4(f->bias, B, HQ, L, S);
    f->tb.rank = 0;
    CHECK_FAIL(f, SDPA_ERR_RANK, "bias rank 0");
    int64_t s5[5] = {1, B, HQ, L, S};
    assert_int_equal(sdpa_tensor_init(&f->tb, f->bias, 5, s5), SDPA_OK);
    CHECK_FAIL(f, SDPA_ERR_RANK, "bias rank 5");
    f->tb = tc_view4(f->bias, B, HQ, L, S);
    f->tb.dtype = 6; /* 3..5: the 8-bit K/V dtypes (0.6) */
    CHECK_FAIL(f, SDPA_ERR_DTYPE, "bias dtype 6");
    free(f);
}

/* ----------------------------------------------------------- output layout */

static void validation_bad_output_strides_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    /* negative stride on L: data at the last row, walking backwards (in bounds) */
    f->to.strides[2] = -EV;
    f->to.data = f->out + (L - 1) * EV;
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "out negative stride");
    free(f);

    f = fx_new();
    f->to.strides[2] = 0;
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "out stride 0 on L=3");
    free(f);

    f = fx_new();
    f->to.strides[2] = 1; /* rows of 3 overlap each other */
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "out self-overlapping rows");
    free(f);

    f = fx_new();
    f->to.strides[0] = 0; /* batch 0 and 1 land on the same memory */
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "out stride 0 on B=2");
    free(f);

    f = fx_new();
    f->tw.strides[3] = 0;
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "weights stride 0 on S");
    free(f);

    f = fx_new();
    f->tl.strides[1] = 1; /* heads and rows overlap: [4 heads x 3 rows] in 6 floats */
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "lse self-overlap");
    free(f);

    f = fx_new();
    f->to.strides[3] = -1;
    f->to.data = f->out + EV - 1;
    CHECK_FAIL(f, SDPA_ERR_STRIDE, "out negative innermost stride");
    free(f);
}

static void validation_overlapping_outputs_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->to.data = f->q;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "out over q");
    free(f);

    f = fx_new();
    f->to.data = f->k + 8;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "out over k");
    free(f);

    f = fx_new();
    f->to.data = f->v + 40; /* partial: the tail of v */
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "out over the tail of v");
    free(f);

    f = fx_new();
    f->opt.bias = &f->tb;
    f->to.data = f->bias + 1;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "out over bias");
    free(f);

    f = fx_new();
    f->tw.data = f->out + 10;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "weights over out");
    free(f);

    f = fx_new();
    f->tl.data = f->out + 5;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "lse over out");
    free(f);

    f = fx_new();
    f->tl.data = f->w + N_W - 3;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "lse over the tail of weights");
    free(f);

    f = fx_new();
    f->tw.data = f->q + 2;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "weights over q");
    free(f);

}

static void validation_output_overlapping_mask_is_rejected(void **state)
{
    (void)state;
    /* the allow-mask is an input too: its bytes inside the output buffer */
    fx *f = fx_new();
    int64_t ms[2] = {L, S};
    f->m = tc_mask_view((const uint8_t *)(void *)(f->out + 4), 2, ms);
    memset(f->out + 4, 1, L * S);
    f->opt.allow_mask = &f->m;
    CHECK_FAIL(f, SDPA_ERR_OVERLAP, "out over the allow-mask");
    free(f);
}

static void validation_overlap_is_checked_on_address_ranges(void **state)
{
    (void)state;
    /* sdpa.h: the check is conservative, on address ranges. q and out interleaved in one
     * buffer (q at even, out at odd floats) share no element but their ranges intersect. */
    enum { NL = 4, NE = 3 };
    float buf[2 * NL * NE + 2];
    tc_fill_canary(buf, sizeof buf);
    for (int e = 0; e < NL * NE; ++e) {
        buf[2 * e] = 0.25f * (float)(e % 5);
    }
    float k[NL * NE], v[NL * NE];
    for (int e = 0; e < NL * NE; ++e) {
        k[e] = 0.1f * (float)e;
        v[e] = (float)e;
    }
    sdpa_tensor tq = tc_view3(buf, 1, NL, NE), to = tc_view3(buf + 1, 1, NL, NE);
    for (int d = 0; d < 3; ++d) {
        tq.strides[d] *= 2;
        to.strides[d] *= 2;
    }
    sdpa_tensor tk = tc_view3(k, 1, NL, NE), tv = tc_view3(v, 1, NL, NE);
    float before[sizeof buf / sizeof buf[0]];
    memcpy(before, buf, sizeof buf);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, NULL, &to, NULL, NULL);
    if (st != SDPA_ERR_OVERLAP) {
        fail_msg("out interleaved with q: expected SDPA_ERR_OVERLAP, got %s (\"%s\")", sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    assert_memory_equal(before, buf, sizeof buf);
    assert_true(sdpa_last_error_message()[0] != '\0');
    /* adjacent but disjoint ranges are fine: out right after the end of q */
    float adj[2 * NL * NE];
    memcpy(adj, k, sizeof k);
    sdpa_tensor aq = tc_view3(adj, 1, NL, NE), ao = tc_view3(adj + NL * NE, 1, NL, NE);
    st = sdpa_attention(&aq, &tk, &tv, NULL, &ao, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("out adjacent to q: %s (\"%s\")", sdpa_status_string(st), sdpa_last_error_message());
    }
}

static void validation_output_stride_on_size_one_dim_is_free(void **state)
{
    (void)state;
    /* only dimensions of size > 1 need positive strides */
    float q[3 * 2] = {1, 2, 3, 4, 5, 6}, k[4 * 2] = {1, 0, 0, 1, 1, 1, -1, 0};
    float v[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    float out1[3 * 2], out2[3 * 2];
    sdpa_tensor tq = tc_view4(q, 1, 1, 3, 2), tk = tc_view4(k, 1, 1, 4, 2), tv = tc_view4(v, 1, 1, 4, 2);
    sdpa_tensor o1 = tc_view4(out1, 1, 1, 3, 2), o2 = tc_view4(out2, 1, 1, 3, 2);
    o2.strides[0] = 0;
    o2.strides[1] = -17;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, NULL, &o1, NULL, NULL), SDPA_OK);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, NULL, &o2, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("stride 0 / -17 on size-1 output dims rejected: %s (%s)", sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    assert_memory_equal(out1, out2, sizeof out1);
}

/* ---------------------------------------------------------------- overflow */

static void validation_overflowing_shapes_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    const int64_t big = (int64_t)1 << 40;
    /* q [1, 1, 2^40, 2^40] with real row strides: its extent overflows int64 */
    sdpa_tensor q = f->tq, k = f->tk, v = f->tv, o = f->to;
    q.shape[0] = 1, q.shape[1] = 1, q.shape[2] = big, q.shape[3] = big;
    q.strides[0] = 0, q.strides[1] = 0, q.strides[2] = big, q.strides[3] = 1;
    k.shape[0] = 1, k.shape[1] = 1, k.shape[2] = 1, k.shape[3] = big;
    k.strides[0] = 0, k.strides[1] = 0, k.strides[2] = 0, k.strides[3] = 1;
    v.shape[0] = 1, v.shape[1] = 1, v.shape[2] = 1, v.shape[3] = 1;
    o.shape[0] = 1, o.shape[1] = 1, o.shape[2] = big, o.shape[3] = 1;
    o.strides[0] = 0, o.strides[1] = 0, o.strides[2] = 1, o.strides[3] = 1;
    f->pass_w = f->pass_lse = 0;
    check_fail_views(f, &q, &k, &v, &f->opt, &o, SDPA_ERR_SIZE_OVERFLOW, "q [1,1,2^40,2^40]", __LINE__);

    size_t bytes = 0;
    assert_int_equal(sdpa_attention_workspace_size(&q, &k, &v, &f->opt, 0, &bytes), SDPA_ERR_SIZE_OVERFLOW);

    /* weights [1, 1, 2^40, 2^40]: L and S of 2^40 with broadcast inputs */
    sdpa_tensor q2 = f->tq, k2 = f->tk, v2 = f->tv, o2 = f->to, w2 = f->tw;
    q2.shape[0] = 1, q2.shape[1] = 1, q2.shape[2] = big;
    q2.strides[0] = q2.strides[1] = q2.strides[2] = 0;
    k2.shape[0] = 1, k2.shape[1] = 1, k2.shape[2] = big;
    k2.strides[0] = k2.strides[1] = k2.strides[2] = 0;
    v2.shape[0] = 1, v2.shape[1] = 1, v2.shape[2] = big;
    v2.strides[0] = v2.strides[1] = v2.strides[2] = 0;
    o2.shape[0] = 1, o2.shape[1] = 1, o2.shape[2] = big;
    o2.strides[0] = 0, o2.strides[1] = 0, o2.strides[2] = EV;
    w2.shape[0] = 1, w2.shape[1] = 1, w2.shape[2] = big, w2.shape[3] = big;
    w2.strides[0] = 0, w2.strides[1] = 0, w2.strides[2] = big, w2.strides[3] = 1;
    memcpy(f->before, f->arena, sizeof f->arena);
    sdpa_status st = sdpa_attention(&q2, &k2, &v2, &f->opt, &o2, &w2, NULL);
    assert_int_equal(st, SDPA_ERR_SIZE_OVERFLOW);
    assert_memory_equal(f->before, f->arena, sizeof f->arena);
    assert_true(sdpa_last_error_message()[0] != '\0');

    /* the constructors refuse too */
    sdpa_tensor t;
    int64_t shape2[2] = {big, big};
    assert_int_equal(sdpa_tensor_init(&t, f->q, 2, shape2), SDPA_ERR_SIZE_OVERFLOW);
    sdpa_allow_mask m;
    assert_int_equal(sdpa_allow_mask_init(&m, f->mask, 2, shape2), SDPA_ERR_SIZE_OVERFLOW);
    /* 2^62 floats fit int64 elements but not size_t bytes */
    int64_t shape1[1] = {(int64_t)1 << 62};
    assert_int_equal(sdpa_tensor_init(&t, f->q, 1, shape1), SDPA_ERR_SIZE_OVERFLOW);
    free(f);
}

/* ------------------------------------------------------------------- dtype */

static void validation_non_f32_dtype_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    /* q/k/v/out/bias may be f16 or bf16 (0.4); weights and lse stay float32. */
    f->tq.dtype = 6;
    CHECK_FAIL(f, SDPA_ERR_DTYPE, "q dtype 6");
    f->tq.dtype = SDPA_DTYPE_F32;
    f->tw.dtype = SDPA_DTYPE_F16;
    CHECK_FAIL(f, SDPA_ERR_DTYPE, "weights F16");
    f->tw.dtype = SDPA_DTYPE_F32;
    f->tl.dtype = 7;
    CHECK_FAIL(f, SDPA_ERR_DTYPE, "lse dtype 7");
    free(f);
}

/* ----------------------------------------------------------------- scalars */

static void validation_lengths_out_of_range_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    int64_t kl_neg[B] = {S, -1}, kl_big[B] = {S + 1, 2};
    int64_t ql_neg[B] = {-1, L}, ql_big[B] = {1, L + 1};
    f->opt.key_lengths = kl_neg;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "key_lengths -1");
    f->opt.key_lengths = kl_big;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "key_lengths S+1");
    f->opt.key_lengths = NULL;
    f->opt.query_lengths = ql_neg;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "query_lengths -1");
    f->opt.query_lengths = ql_big;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "query_lengths L+1");
    /* the bounds themselves are fine */
    int64_t kl_ok[B] = {S, 1}, ql_ok[B] = {L, 0};
    f->opt.key_lengths = kl_ok;
    f->opt.query_lengths = ql_ok;
    CHECK_OK(f, "lengths at their bounds");
    free(f);
}

static void validation_bad_scale_and_softcap_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    const float bad_scale[3] = {NAN, -1.0f, INFINITY};
    for (int i = 0; i < 3; ++i) {
        f->opt.scale = bad_scale[i];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "bad scale");
    }
    f->opt.scale = 0.0f;
    const float bad_cap[3] = {NAN, -1.0f, INFINITY};
    for (int i = 0; i < 3; ++i) {
        f->opt.softcap = bad_cap[i];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "bad softcap");
    }
    f->opt.softcap = 0.0f;
    f->opt.sliding_window = 1;
    f->opt.window_left = -2;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "window_left -2");
    f->opt.window_left = -1;
    f->opt.window_right = -5;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "window_right -5");
    f->opt.window_right = -1;
    CHECK_OK(f, "sliding_window 1 with both sides unbounded");
    /* without sliding_window = 1 the sides are ignored (header, README), whatever they hold */
    f->opt.sliding_window = 0;
    f->opt.window_left = -2;
    f->opt.window_right = INT64_MIN;
    CHECK_OK(f, "sides ignored without sliding_window");
    f->opt.window_left = f->opt.window_right = -1;
    f->opt.scale = 0.5f;
    f->opt.softcap = 30.0f;
    CHECK_OK(f, "valid scale and softcap");
    free(f);
}

static void validation_bad_enum_values_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->opt.causal = 1;
    f->opt.alignment = 3;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "alignment 3");
    f->opt.alignment = -1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "alignment -1");
    f->opt.alignment = SDPA_ALIGN_TOP_LEFT;
    f->opt.empty_rows = 2;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "empty_rows 2");
    f->opt.empty_rows = -1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "empty_rows -1");
    f->opt.empty_rows = SDPA_EMPTY_ROWS_ERROR;
    f->opt.weights_stage = 4;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "weights_stage 4");
    f->opt.weights_stage = -1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "weights_stage -1");
    f->opt.weights_stage = SDPA_WEIGHTS_MASKED;
    CHECK_OK(f, "weights_stage MASKED");
    free(f);
}

static void validation_extreme_window_and_offsets_are_safe(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->opt.num_threads = -1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "num_threads -1");
    f->opt.num_threads = 0;

    /* INT64_MAX windows are unbounded in effect (and must not overflow p +- window) */
    CHECK_OK(f, "no window");
    float plain[N_OUT];
    memcpy(plain, f->out, sizeof plain);
    f->opt.sliding_window = 1;
    f->opt.window_left = INT64_MAX;
    f->opt.window_right = INT64_MAX;
    CHECK_OK(f, "window INT64_MAX");
    assert_memory_equal(plain, f->out, sizeof plain);

    /* extreme offsets: either served or rejected as out of range, never undefined
     * (UBSan watches p = i + offset) */
    const int64_t extremes[4] = {INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1};
    for (int e = 0; e < 4; ++e) {
        int64_t off[B] = {extremes[e], 0};
        f->opt.causal = 1;
        f->opt.alignment = SDPA_ALIGN_OFFSETS;
        f->opt.query_offsets = off;
        f->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        memcpy(f->before, f->arena, sizeof f->arena);
        sdpa_status st = fx_call(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to);
        if (st != SDPA_OK) {
            if (st != SDPA_ERR_INVALID_ARGUMENT) {
                fail_msg("query_offsets %lld: %s", (long long)extremes[e], sdpa_status_string(st));
            }
            assert_memory_equal(f->before, f->arena, sizeof f->arena);
        }
    }
    free(f);
}

static void validation_reserved_fields_must_be_zero(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->tq.reserved[0] = 1;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "q.reserved[0]");
    f->tq.reserved[0] = 0;
    f->to.reserved[1] = 5;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "out.reserved[1]");
    f->to.reserved[1] = 0;
    free(f);
}

static void validation_shape_beyond_rank_must_be_zero(void **state)
{
    (void)state;
    /* sdpa.h: "Entries at index >= rank and reserved[] must be 0". The status is not pinned
     * by the header (INVALID_ARGUMENT like reserved[], or SHAPE); it must not be SDPA_OK. */
    fx *f = fx_new();
    f->tk.shape[5] = 3;
    memcpy(f->before, f->arena, sizeof f->arena);
    sdpa_status st = fx_call(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to);
    if (st == SDPA_OK) {
        fail_msg("k.shape[5] = 3 on a rank-4 view was accepted");
    }
    assert_memory_equal(f->before, f->arena, sizeof f->arena);
    f->tk.shape[5] = 0;
    f->tk.strides[6] = 2;
    st = fx_call(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to);
    if (st == SDPA_OK) {
        fail_msg("k.strides[6] = 2 on a rank-4 view was accepted");
    }
    free(f);
}

/* ------------------------------------------------------------ struct_size */

static void validation_struct_size_rules_are_enforced(void **state)
{
    (void)state;
    fx *f = fx_new();
    const size_t small_sizes[3] = {0, 8, offsetof(sdpa_options, workspace_bytes)};
    for (int i = 0; i < 3; ++i) {
        f->opt.struct_size = small_sizes[i];
        CHECK_FAIL(f, SDPA_ERR_STRUCT_VERSION, "struct_size smaller than v1");
    }
    /* a size that ends inside a field (half of the sinks pointer, 3 bytes of kernel) is no
     * released layout's: refused, never read as a truncated pointer (new-user trial crash) */
    const size_t mid_sizes[3] = {offsetof(sdpa_options, sinks) + 4, offsetof(sdpa_options, kernel) + 3,
                                 sizeof(sdpa_options) + 1};
    for (int i = 0; i < 3; ++i) {
        sdpa_options_init(&f->opt);
        f->opt.sinks = (const float *)(uintptr_t)0x1234567890ull;
        f->opt.struct_size = mid_sizes[i];
        CHECK_FAIL(f, SDPA_ERR_STRUCT_VERSION, "struct_size ending inside a field");
    }
    sdpa_options_init(&f->opt);
    /* a newer caller's bigger struct: zero tail accepted, non-zero tail rejected */
    unsigned char *big = calloc(1, sizeof(sdpa_options) + 32);
    assert_non_null(big);
    sdpa_options_init(&f->opt);
    memcpy(big, &f->opt, sizeof f->opt);
    ((sdpa_options *)(void *)big)->struct_size = sizeof(sdpa_options) + 32;
    const sdpa_options *bo = (const sdpa_options *)(const void *)big;
    sdpa_status st = fx_call(f, &f->tq, &f->tk, &f->tv, bo, &f->to);
    if (st != SDPA_OK) {
        fail_msg("struct_size + 32 with a zero tail: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    big[sizeof(sdpa_options) + 17] = 1;
    check_fail_views(f, &f->tq, &f->tk, &f->tv, bo, &f->to, SDPA_ERR_STRUCT_VERSION,
                     "struct_size + 32 with a non-zero tail", __LINE__);
    free(big);
    free(f);
}

static void validation_dropout_kernel_and_reserved_ranges(void **state)
{
    (void)state;
    const float bad_p[] = {1.0f, -0.25f, 1.5f, NAN, INFINITY};
    for (size_t t = 0; t < sizeof bad_p / sizeof bad_p[0]; ++t) {
        fx *f = fx_new();
        f->opt.dropout_p = bad_p[t];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "dropout_p outside [0, 1)");
        free(f);
    }
    const int32_t bad_kernel[] = {-1, 4, 1000};
    for (size_t t = 0; t < sizeof bad_kernel / sizeof bad_kernel[0]; ++t) {
        fx *f = fx_new();
        f->opt.kernel = bad_kernel[t];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "kernel not an sdpa_kernel");
        free(f);
    }
    fx *f = fx_new();
    f->opt.reserved0 = 3; /* a later version's field: reported like unknown tail bytes */
    CHECK_FAIL(f, SDPA_ERR_STRUCT_VERSION, "options reserved0 not 0");
    free(f);
}

/* An output with no element (a dimension of size 0) is accepted whatever its other strides:
 * numpy gives np.empty((2, 3, 0, 6)) the strides (0, 0, 0, 0). Found by fuzzing (0.3). */
static void validation_empty_output_with_zero_strides_is_accepted(void **state)
{
    (void)state;
    float qbuf[1] = {0}, obuf[1] = {0};
    float kbuf[2 * 3 * 7 * 4] = {0}, vbuf[2 * 3 * 7 * 6] = {0};
    sdpa_tensor q, k, v, out, lse;
    assert_int_equal(sdpa_tensor_init_4d(&q, qbuf, 2, 3, 0, 4), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&k, kbuf, 2, 3, 7, 4), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&v, vbuf, 2, 3, 7, 6), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&out, obuf, 2, 3, 0, 6), SDPA_OK);
    const int64_t lshape[3] = {2, 3, 0};
    assert_int_equal(sdpa_tensor_init(&lse, obuf, 3, lshape), SDPA_OK);
    for (int d = 0; d < 4; ++d) {
        q.strides[d] = 0;
        out.strides[d] = 0;
    }
    for (int d = 0; d < 3; ++d)
        lse.strides[d] = 0;
    sdpa_status st = sdpa_attention(&q, &k, &v, NULL, &out, NULL, &lse);
    if (st != SDPA_OK) {
        fail_msg("L = 0 with all-zero strides: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    /* the same rule for sdpa_merge: out [2, 0, 6] with zero strides */
    sdpa_tensor ma, la;
    const int64_t oshape[3] = {2, 0, 6}, l2[2] = {2, 0};
    assert_int_equal(sdpa_tensor_init(&ma, obuf, 3, oshape), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&la, qbuf, 2, l2), SDPA_OK);
    sdpa_tensor mo = ma, lo = la;
    mo.data = kbuf;
    lo.data = vbuf;
    for (int d = 0; d < 3; ++d)
        mo.strides[d] = 0;
    for (int d = 0; d < 2; ++d)
        lo.strides[d] = 0;
    st = sdpa_merge(&ma, &la, &ma, &la, &mo, &lo);
    if (st != SDPA_OK) {
        fail_msg("merge of empty views with zero strides: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
}

/* A caller compiled against 0.1 passes the 0.1 struct_size (up to workspace_bytes): the
 * fields appended in 0.2 take their defaults. */
static void validation_options_of_0_1_size_are_accepted(void **state)
{
    (void)state;
    fx *f = fx_new();
    const size_t v01 = offsetof(sdpa_options, workspace_bytes) + sizeof(size_t);
    unsigned char *small = calloc(1, sizeof(sdpa_options));
    assert_non_null(small);
    sdpa_options_init_sized((sdpa_options *)(void *)small, v01);
    assert_int_equal(((sdpa_options *)(void *)small)->struct_size, v01);
    small[v01] = 0xAB; /* beyond the caller's struct: must not be read */
    sdpa_status st = fx_call(f, &f->tq, &f->tk, &f->tv, (const sdpa_options *)(const void *)small, &f->to);
    if (st != SDPA_OK) {
        fail_msg("0.1-sized options: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    free(small);
    free(f);
}

/* --------------------------------------------------------------- workspace */

static void validation_small_workspace_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    float ws_small[4];
    f->opt.workspace = ws_small;
    f->opt.workspace_bytes = 16;
    size_t need = 0;
    assert_int_equal(sdpa_attention_workspace_size(&f->tq, &f->tk, &f->tv, &f->opt, 1, &need), SDPA_OK);
    assert_true(need > 16); /* the fixture needs more than 16 bytes of scratch */
    CHECK_FAIL(f, SDPA_ERR_WORKSPACE_TOO_SMALL, "workspace 16 bytes");
    free(f);
}

/* Run the fixture (mask + causal) with a caller workspace of exactly the queried size at
 * byte offset `misalign` from a malloc'd block; the result must equal the internal one. */
static void run_with_caller_workspace(size_t misalign)
{
    fx *f = fx_new();
    f->opt.allow_mask = &f->m;
    f->opt.causal = 1;
    CHECK_OK(f, "internal workspace");
    float out1[N_OUT], w1[N_W], l1[N_LSE];
    memcpy(out1, f->out, sizeof out1);
    memcpy(w1, f->w, sizeof w1);
    memcpy(l1, f->lse, sizeof l1);

    size_t need = 0;
    assert_int_equal(sdpa_attention_workspace_size(&f->tq, &f->tk, &f->tv, &f->opt, 1, &need), SDPA_OK);
    unsigned char *ws = malloc(need + misalign + 1);
    assert_non_null(ws);
    f->opt.workspace = ws + misalign;
    f->opt.workspace_bytes = need;
    tc_fill_canary(f->out, sizeof out1);
    tc_fill_canary(f->w, sizeof w1);
    tc_fill_canary(f->lse, sizeof l1);
    CHECK_OK(f, "caller workspace of the queried size");
    assert_memory_equal(out1, f->out, sizeof out1);
    assert_memory_equal(w1, f->w, sizeof w1);
    assert_memory_equal(l1, f->lse, sizeof l1);
    if (need > 0) {
        f->opt.workspace_bytes = need - 1;
        CHECK_FAIL(f, SDPA_ERR_WORKSPACE_TOO_SMALL, "workspace one byte short");
    }
    free(ws);
    free(f);
}

static void validation_caller_workspace_of_queried_size_works(void **state)
{
    (void)state;
    run_with_caller_workspace(0);
}

static void validation_caller_workspace_at_odd_address_works(void **state)
{
    (void)state;
    /* sdpa.h: "at least sdpa_attention_workspace_size() bytes, any alignment". A library that
     * uses the pointer as float * unaligned is caught by UBSan (-Db_sanitize=undefined). */
    run_with_caller_workspace(1);
    run_with_caller_workspace(3);
}

static size_t workspace_for(int64_t n, int weights)
{
    static float buf[1024 * 64];
    sdpa_tensor q, k, v;
    assert_int_equal(sdpa_tensor_init_4d(&q, buf, 1, 1, n, 64), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&k, buf, 1, 1, n, 64), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&v, buf, 1, 1, n, 64), SDPA_OK);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.num_threads = 1;
    size_t bytes = 0;
    assert_int_equal(sdpa_attention_workspace_size(&q, &k, &v, &opt, weights, &bytes), SDPA_OK);
    return bytes;
}

static void validation_workspace_does_not_grow_with_l_times_s(void **state)
{
    (void)state;
    size_t small = workspace_for(256, 0), big = workspace_for(1024, 0);
    print_message("workspace L=S=256: %zu bytes, L=S=1024: %zu bytes\n", small, big);
    if (!(big < 8 * small)) {
        fail_msg("workspace grows like L*S: %zu bytes at L=S=256, %zu at L=S=1024", small, big);
    }
}

/* ------------------------------------------------------------------ values */

static void validation_empty_row_error_names_the_row(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->opt.allow_mask = &f->m;
    /* block rows (b=1,h=2,i=1), (b=1,h=2,i=2) and (b=1,h=3,i=0); the first is named */
    memset(&f->mask[((1 * HQ + 2) * L + 1) * S], 0, S);
    memset(&f->mask[((1 * HQ + 2) * L + 2) * S], 0, S);
    memset(&f->mask[((1 * HQ + 3) * L + 0) * S], 0, S);
    CHECK_FAIL(f, SDPA_ERR_EMPTY_ROW, "empty rows under ERROR");
    const char *msg = sdpa_last_error_message();
    if (!strstr(msg, "b=1") || !strstr(msg, "h=2") || !strstr(msg, "i=1")) {
        fail_msg("message does not name row b=1,h=2,i=1: \"%s\"", msg);
    }
    f->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    CHECK_OK(f, "same rows under ZERO");
    for (int c = 0; c < EV; ++c) {
        assert_true(f->out[((1 * HQ + 2) * L + 1) * EV + c] == 0.0f);
    }
    assert_true(isinf(f->lse[(1 * HQ + 3) * L + 0]) && f->lse[(1 * HQ + 3) * L + 0] < 0);
    for (int j = 0; j < S; ++j) {
        assert_true(f->w[((1 * HQ + 2) * L + 2) * S + j] == 0.0f);
    }

    /* query padding exempts a row from the check */
    f->opt.empty_rows = SDPA_EMPTY_ROWS_ERROR;
    memset(f->mask, 1, sizeof f->mask);
    memset(&f->mask[((0 * HQ + 1) * L + 2) * S], 0, S);
    int64_t ql[B] = {2, L};
    f->opt.query_lengths = ql;
    CHECK_OK(f, "empty row that is padding");
    free(f);
}

static void validation_non_finite_inputs_are_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->q[E * 5 + 2] = NAN;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "NaN in q");
    f->opt.skip_finite_check = 1;
    CHECK_OK(f, "NaN in q with skip_finite_check 1");
    free(f);

    f = fx_new();
    f->k[(1 * HKV + 1) * S * E + 3 * E] = INFINITY; /* b=1, kv head 1, key 3: attended */
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "Inf in an attended k row");
    f->opt.skip_finite_check = 1;
    CHECK_OK(f, "Inf in k with skip_finite_check 1");
    free(f);

    f = fx_new();
    f->v[(0 * HKV + 1) * S * EV + 4 * EV + 2] = NAN;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "NaN in an attended v row");
    free(f);

    f = fx_new();
    f->opt.bias = &f->tb;
    f->bias[((1 * HQ + 3) * L + 2) * S + 4] = NAN;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "NaN in an allowed bias entry");
    f->bias[((1 * HQ + 3) * L + 2) * S + 4] = INFINITY;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "+Inf in an allowed bias entry");
    f->bias[((1 * HQ + 3) * L + 2) * S + 4] = -INFINITY; /* blocks: fine */
    CHECK_OK(f, "-inf in a bias entry");
    free(f);

    /* A q row with no allowed key never enters out: its NaN is not inspected. */
    f = fx_new();
    f->opt.allow_mask = &f->m;
    f->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    memset(&f->mask[((0 * HQ + 1) * L + 2) * S], 0, S);
    f->q[((0 * HQ + 1) * L + 2) * E + 1] = NAN;
    CHECK_OK(f, "NaN in a q row that has no allowed key");
    for (int c = 0; c < EV; ++c) {
        assert_true(f->out[((0 * HQ + 1) * L + 2) * EV + c] == 0.0f);
    }
    /* the same NaN in a row that has keys is reported */
    f->mask[((0 * HQ + 1) * L + 2) * S + 3] = 1;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "NaN in a q row with one allowed key");
    free(f);
}

/* One failing call per kernel that can serve the fixture: reference (with weights), tiled and
 * decode (without); each must report `want` in its message. */
static void check_fail_every_kernel(fx *f, sdpa_status expected, const char *want, const char *what, int line)
{
    static const int32_t kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    for (int t = 0; t < 3; ++t) {
        f->opt.kernel = kernels[t];
        f->pass_w = kernels[t] == SDPA_KERNEL_REFERENCE;
        check_fail_views(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to, expected, what, line);
        if (strstr(sdpa_last_error_message(), want) == NULL) {
            fail_msg("line %d, %s (kernel %d): message \"%s\" does not name %s", line, what, (int)kernels[t],
                     sdpa_last_error_message(), want);
        }
    }
    f->opt.kernel = SDPA_KERNEL_AUTO;
    f->pass_w = 1;
}

/* The K-row scan covers all E elements: a NaN in the last one (e = E-1) of an attended key
 * row is reported, without and with a mask (the two scan paths), on every kernel. */
/* Flags documented as 0 or 1 reject every other value (causal 2 is not "more causal"). */
static void validation_causal_must_be_0_or_1(void **state)
{
    (void)state;
    const int32_t bad[4] = {2, -1, 255, INT32_MAX};
    for (int t = 0; t < 4; ++t) {
        fx *f = fx_new();
        f->opt.causal = bad[t];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "causal not 0/1");
        if (!strstr(sdpa_last_error_message(), "causal")) {
            fail_msg("message does not name causal: \"%s\"", sdpa_last_error_message());
        }
        free(f);
    }
}

static void validation_nan_in_last_element_of_key_row_is_rejected(void **state)
{
    (void)state;
    for (int masked = 0; masked < 2; ++masked) {
        fx *f = fx_new();
        if (masked) {
            f->opt.allow_mask = &f->m;
        }
        f->k[((1 * HKV + 1) * S + 3) * E + (E - 1)] = NAN;
        check_fail_every_kernel(f, SDPA_ERR_NON_FINITE, "key row (b=1,h=1,j=3)", "NaN at e = E-1 of a key row", __LINE__);
        f->k[((1 * HKV + 1) * S + 3) * E + (E - 1)] = INFINITY;
        check_fail_every_kernel(f, SDPA_ERR_NON_FINITE, "key row (b=1,h=1,j=3)", "Inf at e = E-1 of a key row", __LINE__);
        free(f);
    }
    /* A query row's last element too. */
    fx *f = fx_new();
    f->q[((0 * HQ + 2) * L + 1) * E + (E - 1)] = NAN;
    check_fail_every_kernel(f, SDPA_ERR_NON_FINITE, "query row (b=0,h=2,i=1)", "NaN at e = E-1 of a query row", __LINE__);
    free(f);
}

/* The V-row check runs whatever else is given: a NaN in an attended value row with an
 * allow-mask, with a bias, or with both, is reported naming the row, on every kernel. */
static void validation_nan_in_value_row_with_mask_or_bias_is_rejected(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; ++mode) {
        fx *f = fx_new();
        if (mode != 1) {
            f->opt.allow_mask = &f->m;
        }
        if (mode != 0) {
            f->opt.bias = &f->tb;
        }
        f->v[((0 * HKV + 1) * S + 4) * EV + (EV - 1)] = NAN;
        check_fail_every_kernel(f, SDPA_ERR_NON_FINITE, "value row (b=0,h=1,j=4)",
                                mode == 0 ? "NaN in a value row, mask" : mode == 1 ? "NaN in a value row, bias"
                                                                               : "NaN in a value row, mask and bias",
                                __LINE__);
        /* the same NaN in a row that no query attends is not read */
        for (int64_t h = 2; h < HQ; ++h) {
            for (int64_t i = 0; i < L; ++i) {
                f->mask[((0 * HQ + h) * L + i) * S + 4] = 0;
            }
        }
        if (mode != 1) {
            f->opt.kernel = SDPA_KERNEL_AUTO;
            CHECK_OK(f, "NaN in a value row no allowed pair reads");
        }
        free(f);
    }
}

/* Negative strides count by their magnitude in a view's extent: shape 3 with stride -2^62
 * (and other large negative strides, alone or against a positive one) overflows. */
static void validation_negative_strides_count_in_the_extent(void **state)
{
    (void)state;
    const int64_t one = 1;
    const int64_t neg[4] = {-(one << 62), -(one << 61), -(one << 60), -(one << 59)};
    for (int t = 0; t < 4; ++t) {
        fx *f = fx_new();
        sdpa_tensor q = f->tq; /* [2, 4, 3, 4]: the query axis has 3 entries */
        q.strides[2] = neg[t];
        f->pass_w = f->pass_lse = 0;
        check_fail_views(f, &q, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "q stride -2^k on shape 3",
                         __LINE__);
        /* +2^k on one axis and -2^k on another do not cancel */
        q = f->tq;
        q.strides[2] = neg[t];
        q.strides[1] = -neg[t];
        check_fail_views(f, &q, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "q strides +2^k and -2^k",
                         __LINE__);
        sdpa_tensor v = f->tv; /* [2, 2, 5, 3] */
        v.strides[3] = neg[t];
        check_fail_views(f, &f->tq, &f->tk, &v, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "v stride -2^k on shape 3",
                         __LINE__);
        size_t bytes = 0;
        q = f->tq;
        q.strides[2] = neg[t];
        assert_int_equal(sdpa_attention_workspace_size(&q, &f->tk, &f->tv, &f->opt, 0, &bytes), SDPA_ERR_SIZE_OVERFLOW);
        free(f);
    }
    /* The case only the extent rule catches: a negative stride small enough that the view stays
     * above address 0 (data on the stack, far above 4 GiB), and a positive one that, with the
     * negative one's magnitude, spans 2^60 + 1 floats, 4 bytes past the largest span accepted
     * (PTRDIFF_MAX / 2). Added with its sign, the negative stride would shrink the span below
     * the limit. */
    float data[4] = {0};
    const int64_t shape[2] = {2, 2}, strides[2] = {(one << 60) - (one << 30), -(one << 30)};
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init_strided(&t, data, SDPA_DTYPE_F32, 2, shape, strides), SDPA_ERR_SIZE_OVERFLOW);
    const int64_t fits[2] = {(one << 60) - (one << 31), -(one << 30)}; /* 2^60 - 2^30 + 1 floats: accepted */
    assert_int_equal(sdpa_tensor_init_strided(&t, data, SDPA_DTYPE_F32, 2, shape, fits), SDPA_OK);
}

/* sdpa_attention_workspace_size runs sdpa_attention's validation, and its messages name it. */
static void validation_workspace_size_messages_name_it(void **state)
{
    (void)state;
    fx *f = fx_new();
    size_t bytes = 7;
    assert_int_equal(sdpa_attention_workspace_size(NULL, &f->tk, &f->tv, &f->opt, 0, &bytes), SDPA_ERR_NULL_POINTER);
    assert_string_equal(sdpa_last_error_message(), "sdpa_attention_workspace_size: query is NULL");
    sdpa_tensor k = f->tk;
    k.shape[3] = 3;
    assert_int_equal(sdpa_attention_workspace_size(&f->tq, &k, &f->tv, &f->opt, 0, &bytes), SDPA_ERR_SHAPE);
    assert_non_null(strstr(sdpa_last_error_message(), "sdpa_attention_workspace_size: key.shape[3]=3"));
    f->opt.kernel = SDPA_KERNEL_TILED;
    assert_int_equal(sdpa_attention_workspace_size(&f->tq, &f->tk, &f->tv, &f->opt, 1, &bytes), SDPA_ERR_UNSUPPORTED);
    assert_non_null(strstr(sdpa_last_error_message(), "sdpa_attention_workspace_size: "));
    assert_non_null(strstr(sdpa_last_error_message(), "weights_requested=0"));
    assert_true(bytes == 7);
    free(f);
}

/* A view whose extent fits int64 but whose addresses wrap around the address space (its lowest
 * element below address 0, or its end past the top) is SDPA_ERR_SIZE_OVERFLOW: from the
 * strided constructor, from a hand-built view in sdpa_attention (which read it before: SIGSEGV)
 * and from a mask; nothing is read or written. */
static void validation_view_addresses_must_not_wrap(void **state)
{
    (void)state;
    fx *f = fx_new();
    const int64_t below = -((int64_t)1 << 58); /* 2^60 bytes of f32 below q on the query axis */
    sdpa_tensor q = f->tq;                     /* [2, 4, 3, 4] */
    q.strides[2] = below;
    f->pass_w = f->pass_lse = 0;
    if ((uintptr_t)f->tq.data < ((uintptr_t)1 << 61)) /* user-space addresses: always */
        check_fail_views(f, &q, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "q below address 0",
                         __LINE__);
    sdpa_tensor t;
    const int64_t shape[4] = {2, 4, 3, 4}, strides[4] = {48, 12, below, 1};
    assert_int_equal(sdpa_tensor_init_strided(&t, f->tq.data, SDPA_DTYPE_F32, 4, shape, strides),
                     SDPA_ERR_SIZE_OVERFLOW);
    assert_non_null(strstr(sdpa_last_error_message(), "below address 0"));
    /* the same strides from an address high enough are a valid view (never dereferenced here) */
    void *high = (void *)((uintptr_t)1 << 62);
    assert_int_equal(sdpa_tensor_init_strided(&t, high, SDPA_DTYPE_F32, 4, shape, strides), SDPA_OK);
    /* an empty view is never range-checked (a huge size beside a zero one: nothing to read;
     * the check multiplied the huge size first, which UBSan reported in fuzz_corpus) */
    const int64_t eshape[2] = {((int64_t)1 << 62) + 1, 0}, estr[2] = {-2, 1};
    assert_int_equal(sdpa_tensor_init_strided(&t, f->tq.data, SDPA_DTYPE_F32, 2, eshape, estr), SDPA_OK);
    /* past the top of the address space */
    void *top = (void *)(UINTPTR_MAX - 63); /* 64 bytes below the top: k [2, 2, 5, 4] needs 320 */
    const int64_t up[4] = {48, 12, 4096, 1};
    assert_int_equal(sdpa_tensor_init_strided(&t, top, SDPA_DTYPE_F32, 4, shape, up), SDPA_ERR_SIZE_OVERFLOW);
    sdpa_tensor k = f->tk;
    k.data = top;
    check_fail_views(f, &f->tq, &k, &f->tv, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "k past the top", __LINE__);
    /* an allow-mask the same way */
    uint8_t mbuf[16] = {1};
    sdpa_allow_mask m;
    const int64_t mshape[2] = {3, 5};
    assert_int_equal(sdpa_allow_mask_init(&m, mbuf, 2, mshape), SDPA_OK);
    m.strides[0] = below;
    f->opt.allow_mask = &m;
    check_fail_views(f, &f->tq, &f->tk, &f->tv, &f->opt, &f->to, SDPA_ERR_SIZE_OVERFLOW, "mask below address 0",
                     __LINE__);
    free(f);
}

/* Every byte past sizeof(sdpa_options) that a larger struct_size covers is checked, the first
 * one included. */
static void validation_first_tail_byte_of_larger_options_is_checked(void **state)
{
    (void)state;
    const size_t extra[3] = {1, 8, 64};
    for (int t = 0; t < 3; ++t) {
        fx *f = fx_new();
        unsigned char *big = calloc(1, sizeof(sdpa_options) + extra[t]);
        assert_non_null(big);
        memcpy(big, &f->opt, sizeof f->opt);
        ((sdpa_options *)(void *)big)->struct_size = sizeof(sdpa_options) + extra[t];
        const sdpa_options *bo = (const sdpa_options *)(const void *)big;
        big[sizeof(sdpa_options)] = 1;
        check_fail_views(f, &f->tq, &f->tk, &f->tv, bo, &f->to, SDPA_ERR_STRUCT_VERSION, "first tail byte non-zero",
                         __LINE__);
        big[sizeof(sdpa_options)] = 0;
        big[sizeof(sdpa_options) + extra[t] - 1] = 0x80;
        check_fail_views(f, &f->tq, &f->tk, &f->tv, bo, &f->to, SDPA_ERR_STRUCT_VERSION, "last tail byte non-zero",
                         __LINE__);
        free(big);
        free(f);
    }
}

/* --------------------------------------------------------------- 0/1 flags */

static void validation_skip_finite_check_must_be_0_or_1(void **state)
{
    (void)state;
    fx *f = fx_new();
    assert_int_equal(f->opt.skip_finite_check, 0); /* the default checks */
    const int32_t bad[4] = {2, -1, 255, INT32_MIN};
    for (int i = 0; i < 4; ++i) {
        f->opt.skip_finite_check = bad[i];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "skip_finite_check not 0/1 (finite inputs)");
        if (!strstr(sdpa_last_error_message(), "skip_finite_check")) {
            fail_msg("message does not name skip_finite_check: \"%s\"", sdpa_last_error_message());
        }
    }
    /* with a NaN input the flag is still rejected as a flag, not silently read as "skip" */
    f->v[7] = NAN;
    f->opt.skip_finite_check = 2;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "skip_finite_check 2 with NaN in v");
    f->opt.skip_finite_check = 0;
    CHECK_FAIL(f, SDPA_ERR_NON_FINITE, "skip_finite_check 0 with NaN in v");
    f->opt.skip_finite_check = 1;
    CHECK_OK(f, "skip_finite_check 1 with NaN in v");
    free(f);
}

static void validation_sliding_window_must_be_0_or_1(void **state)
{
    (void)state;
    fx *f = fx_new();
    assert_int_equal(f->opt.sliding_window, 0); /* the default: no window */
    const int32_t bad[4] = {2, -1, 7, INT32_MAX};
    for (int i = 0; i < 4; ++i) {
        f->opt.sliding_window = bad[i];
        CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "sliding_window not 0/1");
        if (!strstr(sdpa_last_error_message(), "sliding_window")) {
            fail_msg("message does not name sliding_window: \"%s\"", sdpa_last_error_message());
        }
    }
    f->opt.window_left = 1;
    f->opt.window_right = 0;
    f->opt.sliding_window = 2;
    CHECK_FAIL(f, SDPA_ERR_INVALID_ARGUMENT, "sliding_window 2 with a window");
    f->opt.sliding_window = 1;
    CHECK_OK(f, "sliding_window 1 with a window");
    f->opt.sliding_window = 0;
    CHECK_OK(f, "sliding_window 0 with window sides set");
    free(f);
}

static void validation_zero_head_width_is_rejected(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->tq.shape[3] = 0;
    f->tk.shape[3] = 0;
    CHECK_FAIL(f, SDPA_ERR_EMPTY_DIMENSION, "E = 0");
    free(f);
}

/* ----------------------------------------------------- status and version */

static void validation_status_strings_name_every_code(void **state)
{
    (void)state;
    static const struct {
        sdpa_status s;
        const char *name;
    } codes[] = {
        {SDPA_OK, "SDPA_OK"},
        {SDPA_ERR_NULL_POINTER, "SDPA_ERR_NULL_POINTER"},
        {SDPA_ERR_INVALID_ARGUMENT, "SDPA_ERR_INVALID_ARGUMENT"},
        {SDPA_ERR_STRUCT_VERSION, "SDPA_ERR_STRUCT_VERSION"},
        {SDPA_ERR_UNSUPPORTED, "SDPA_ERR_UNSUPPORTED"},
        {SDPA_ERR_RANK, "SDPA_ERR_RANK"},
        {SDPA_ERR_SHAPE, "SDPA_ERR_SHAPE"},
        {SDPA_ERR_BROADCAST, "SDPA_ERR_BROADCAST"},
        {SDPA_ERR_STRIDE, "SDPA_ERR_STRIDE"},
        {SDPA_ERR_OVERLAP, "SDPA_ERR_OVERLAP"},
        {SDPA_ERR_SIZE_OVERFLOW, "SDPA_ERR_SIZE_OVERFLOW"},
        {SDPA_ERR_EMPTY_DIMENSION, "SDPA_ERR_EMPTY_DIMENSION"},
        {SDPA_ERR_DTYPE, "SDPA_ERR_DTYPE"},
        {SDPA_ERR_EMPTY_ROW, "SDPA_ERR_EMPTY_ROW"},
        {SDPA_ERR_NON_FINITE, "SDPA_ERR_NON_FINITE"},
        {SDPA_ERR_OUT_OF_MEMORY, "SDPA_ERR_OUT_OF_MEMORY"},
        {SDPA_ERR_WORKSPACE_TOO_SMALL, "SDPA_ERR_WORKSPACE_TOO_SMALL"},
        {SDPA_ERR_INTERNAL, "SDPA_ERR_INTERNAL"},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
        const char *s = sdpa_status_string(codes[i].s);
        assert_non_null(s);
        assert_string_equal(s, codes[i].name);
    }
    const int unknown[5] = {1, 19, 99, -1, 0x7FFFFFFF};
    for (int i = 0; i < 5; ++i) {
        const char *s = sdpa_status_string((sdpa_status)unknown[i]);
        assert_non_null(s);
        assert_string_equal(s, "SDPA_ERR_UNKNOWN");
    }
}

static void validation_version_matches_header(void **state)
{
    (void)state;
    assert_int_equal(sdpa_version(), SDPA_VERSION_NUMBER);
    assert_int_equal(SDPA_VERSION_NUMBER,
                     SDPA_VERSION_MAJOR * 1000000 + SDPA_VERSION_MINOR * 1000 + SDPA_VERSION_PATCH);
    assert_non_null(sdpa_version_string());
    assert_string_equal(sdpa_version_string(), SDPA_VERSION_STRING);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", SDPA_VERSION_MAJOR, SDPA_VERSION_MINOR, SDPA_VERSION_PATCH);
    assert_string_equal(SDPA_VERSION_STRING, expect);
}

static void validation_error_message_clears_on_success(void **state)
{
    (void)state;
    fx *f = fx_new();
    f->tk.shape[3] = 3;
    CHECK_FAIL(f, SDPA_ERR_SHAPE, "k E 3");
    assert_true(strlen(sdpa_last_error_message()) > 0);
    f->tk.shape[3] = E;
    CHECK_OK(f, "after a failure");
    assert_string_equal(sdpa_last_error_message(), "");
    free(f);
}

/* ------------------------------------------------------------------- views */

static void validation_view_constructors_reject_bad_input(void **state)
{
    (void)state;
    float buf[8];
    int64_t shape[SDPA_MAX_RANK + 1] = {2, 4, 1, 1, 1, 1, 1, 1, 1};
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init(NULL, buf, 2, shape), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_tensor_init(&t, buf, 2, NULL), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_tensor_init(&t, buf, 0, shape), SDPA_ERR_RANK);
    assert_int_equal(sdpa_tensor_init(&t, buf, SDPA_MAX_RANK + 1, shape), SDPA_ERR_RANK);
    int64_t neg[2] = {2, -1};
    assert_int_equal(sdpa_tensor_init(&t, buf, 2, neg), SDPA_ERR_SHAPE);
    assert_true(sdpa_last_error_message()[0] != '\0');

    assert_int_equal(sdpa_tensor_init(&t, buf, 2, shape), SDPA_OK);
    assert_int_equal(t.rank, 2);
    assert_int_equal(t.dtype, SDPA_DTYPE_F32);
    assert_ptr_equal(t.data, buf);
    assert_int_equal(t.strides[0], 4);
    assert_int_equal(t.strides[1], 1);
    for (int d = 2; d < SDPA_MAX_RANK; ++d) {
        assert_int_equal(t.shape[d], 0);
        assert_int_equal(t.strides[d], 0);
    }
    assert_int_equal(t.reserved[0], 0);
    assert_int_equal(t.reserved[1], 0);

    sdpa_allow_mask m;
    uint8_t mb[8];
    assert_int_equal(sdpa_allow_mask_init(NULL, mb, 2, shape), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_allow_mask_init(&m, mb, 0, shape), SDPA_ERR_RANK);
    assert_int_equal(sdpa_allow_mask_init(&m, mb, 5, shape), SDPA_ERR_RANK);
    assert_int_equal(sdpa_allow_mask_init(&m, mb, 2, neg), SDPA_ERR_SHAPE);
    assert_int_equal(sdpa_allow_mask_init(&m, mb, 2, shape), SDPA_OK);
    assert_int_equal(m.strides[0], 4);
    assert_int_equal(m.strides[1], 1);
    assert_int_equal(m.reserved0, 0);
}

static void validation_view_constructors_reject_null_data_of_non_empty_views(void **state)
{
    (void)state;
    /* sdpa.h: data may be NULL only if the view has no element. */
    const int64_t full[3] = {2, 3, 4};
    sdpa_tensor t;
    sdpa_allow_mask m;
    for (int32_t rank = 1; rank <= 3; ++rank) {
        sdpa_status st = sdpa_tensor_init(&t, NULL, rank, full);
        if (st != SDPA_ERR_NULL_POINTER) {
            fail_msg("sdpa_tensor_init(NULL data, rank %d, non-empty): %s", (int)rank, sdpa_status_string(st));
        }
        assert_true(sdpa_last_error_message()[0] != '\0');
        st = sdpa_allow_mask_init(&m, NULL, rank, full);
        if (st != SDPA_ERR_NULL_POINTER) {
            fail_msg("sdpa_allow_mask_init(NULL data, rank %d, non-empty): %s", (int)rank, sdpa_status_string(st));
        }
        assert_true(sdpa_last_error_message()[0] != '\0');
    }
    assert_int_equal(sdpa_tensor_init_4d(&t, NULL, 1, 1, 1, 1), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_tensor_init_3d(&t, NULL, 1, 2, 1), SDPA_ERR_NULL_POINTER);

    /* an empty view (a zero anywhere in the shape, outermost or not) may have NULL data */
    const int64_t empties[4][3] = {{0, 3, 4}, {2, 0, 4}, {2, 3, 0}, {0, 0, 0}};
    for (int c = 0; c < 4; ++c) {
        sdpa_status st = sdpa_tensor_init(&t, NULL, 3, empties[c]);
        if (st != SDPA_OK) {
            fail_msg("sdpa_tensor_init(NULL data, [%lld, %lld, %lld]): %s (\"%s\")", (long long)empties[c][0],
                     (long long)empties[c][1], (long long)empties[c][2], sdpa_status_string(st),
                     sdpa_last_error_message());
        }
        assert_null(t.data);
        assert_int_equal(t.rank, 3);
        st = sdpa_allow_mask_init(&m, NULL, 3, empties[c]);
        if (st != SDPA_OK) {
            fail_msg("sdpa_allow_mask_init(NULL data, [%lld, %lld, %lld]): %s (\"%s\")", (long long)empties[c][0],
                     (long long)empties[c][1], (long long)empties[c][2], sdpa_status_string(st),
                     sdpa_last_error_message());
        }
        assert_null(m.data);
    }
    assert_int_equal(sdpa_tensor_init_4d(&t, NULL, 3, 2, 0, 5), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&t, NULL, 3, 2, 5, 0), SDPA_OK);
}

/* ------------------------------------------------- regressions found by fuzzing */

static void validation_output_overlapping_query_offsets_is_rejected(void **state)
{
    (void)state;
    /* out [2, 1, 2] floats share their 16 bytes with query_offsets[2]: writing out would
     * change the offsets the call is still reading. */
    union {
        int64_t off[2];
        float f[4];
    } u;
    u.off[0] = 0;
    u.off[1] = 1;
    unsigned char before[sizeof u];
    memcpy(before, &u, sizeof u);
    float q[2] = {0.5f, -0.5f}, k[2] = {1.0f, 2.0f}, v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    sdpa_tensor tq = tc_view3(q, 2, 1, 1), tk = tc_view3(k, 2, 1, 1), tv = tc_view3(v, 2, 1, 2);
    sdpa_tensor to = tc_view3(u.f, 2, 1, 2);
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = 1;
    o.alignment = SDPA_ALIGN_OFFSETS;
    o.query_offsets = u.off;
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    if (st != SDPA_ERR_OVERLAP) {
        fail_msg("out over query_offsets: expected SDPA_ERR_OVERLAP, got %s (\"%s\")", sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    assert_memory_equal(before, &u, sizeof u);
    assert_true(sdpa_last_error_message()[0] != '\0');

    /* the same call with separate buffers is fine */
    int64_t off[2] = {0, 1};
    float out[4];
    o.query_offsets = off;
    to = tc_view3(out, 2, 1, 2);
    st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("separate query_offsets: %s (\"%s\")", sdpa_status_string(st), sdpa_last_error_message());
    }
    for (int e = 0; e < 4; ++e) {
        assert_true(out[e] == v[e]); /* one key per batch */
    }
}

static int all_equal(const float *x, size_t n, float value)
{
    for (size_t e = 0; e < n; ++e) {
        if (memcmp(&x[e], &value, sizeof value) != 0) {
            return 0;
        }
    }
    return 1;
}

static void validation_workspace_overlapping_out_is_rejected(void **state)
{
    (void)state;
    enum { WL = 3, WS = 4, WE = 2, WEV = 2 };
    float q[WL * WE], k[WS * WE], v[WS * WEV];
    for (int e = 0; e < WL * WE; ++e) q[e] = 0.25f * (float)e;
    for (int e = 0; e < WS * WE; ++e) k[e] = 0.5f - 0.125f * (float)e;
    for (int e = 0; e < WS * WEV; ++e) v[e] = (float)e;
    sdpa_tensor tq = tc_view4(q, 1, 1, WL, WE), tk = tc_view4(k, 1, 1, WS, WE), tv = tc_view4(v, 1, 1, WS, WEV);
    sdpa_options o;
    sdpa_options_init(&o);
    size_t need = 0;
    assert_int_equal(sdpa_attention_workspace_size(&tq, &tk, &tv, &o, 0, &need), SDPA_OK);
    assert_true(need > 0);
    /* One buffer big enough for out and for the whole workspace; 64-byte aligned so that the
     * library's aligned scratch starts exactly at out. */
    const size_t nbuf = (need / sizeof(float) + WL * WEV + 16) / 16 * 16;
    float *buf = aligned_alloc(64, nbuf * sizeof(float));
    assert_non_null(buf);

    /* workspace = out's buffer */
    for (size_t e = 0; e < nbuf; ++e) buf[e] = 42.1f;
    sdpa_tensor to = tc_view4(buf, 1, 1, WL, WEV);
    o.workspace = buf;
    o.workspace_bytes = need;
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    if (st != SDPA_ERR_OVERLAP) {
        fail_msg("workspace = out: expected SDPA_ERR_OVERLAP, got %s (\"%s\")", sdpa_status_string(st),
                 sdpa_last_error_message());
    }
    if (!all_equal(buf, nbuf, 42.1f)) {
        fail_msg("workspace = out: the buffer was written although the call failed");
    }
    assert_true(sdpa_last_error_message()[0] != '\0');

    /* ... also when the call would otherwise fail later, with SDPA_ERR_EMPTY_ROW: the value
     * checks borrow the workspace and must not run on one that aliases out */
    int64_t kl[1] = {0};
    o.key_lengths = kl;
    st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    if (st != SDPA_ERR_OVERLAP) {
        fail_msg("workspace = out, key_lengths {0}: expected SDPA_ERR_OVERLAP, got %s (\"%s\")",
                 sdpa_status_string(st), sdpa_last_error_message());
    }
    if (!all_equal(buf, nbuf, 42.1f)) {
        fail_msg("workspace = out, key_lengths {0}: the buffer was scribbled on before the call failed");
    }

    /* a separate workspace of the same size works */
    o.key_lengths = NULL;
    float out[WL * WEV];
    to = tc_view4(out, 1, 1, WL, WEV);
    st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    if (st != SDPA_OK) {
        fail_msg("separate workspace: %s (\"%s\")", sdpa_status_string(st), sdpa_last_error_message());
    }
    free(buf);
}

static void validation_workspace_overlapping_q_is_rejected(void **state)
{
    (void)state;
    /* sdpa.h: SDPA_ERR_OVERLAP also when "the workspace overlaps an input"; the library never
     * writes through an input view. q lives at the (64-byte aligned) start of the workspace. */
    enum { WL = 3, WS = 4, WE = 2, WEV = 2 };
    float k[WS * WE], v[WS * WEV], out[WL * WEV];
    for (int e = 0; e < WS * WE; ++e) k[e] = 0.5f - 0.125f * (float)e;
    for (int e = 0; e < WS * WEV; ++e) v[e] = (float)e;
    sdpa_tensor tk = tc_view4(k, 1, 1, WS, WE), tv = tc_view4(v, 1, 1, WS, WEV);
    sdpa_tensor to = tc_view4(out, 1, 1, WL, WEV);
    sdpa_options o;
    sdpa_options_init(&o);
    size_t need = 0;
    sdpa_tensor probe = tc_view4(k, 1, 1, WL, WE);
    assert_int_equal(sdpa_attention_workspace_size(&probe, &tk, &tv, &o, 0, &need), SDPA_OK);
    const size_t nbuf = (need / sizeof(float) + WL * WE + 16) / 16 * 16;
    float *buf = aligned_alloc(64, nbuf * sizeof(float));
    float *before = malloc(nbuf * sizeof(float));
    assert_true(buf != NULL && before != NULL);
    for (size_t e = 0; e < nbuf; ++e) buf[e] = 42.1f;
    for (int e = 0; e < WL * WE; ++e) buf[e] = 0.25f * (float)e;
    memcpy(before, buf, nbuf * sizeof(float));
    sdpa_tensor tq = tc_view4(buf, 1, 1, WL, WE);
    o.workspace = buf;
    o.workspace_bytes = need;
    tc_fill_canary(out, sizeof out);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    const int q_intact = memcmp(before, buf, nbuf * sizeof(float)) == 0;
    free(before);
    free(buf);
    if (st != SDPA_ERR_OVERLAP || !q_intact) {
        fail_msg("workspace = q: expected SDPA_ERR_OVERLAP with q untouched, got %s (\"%s\"), q %s",
                 sdpa_status_string(st), sdpa_last_error_message(), q_intact ? "intact" : "overwritten");
    }
    assert_true(tc_is_canary(out, sizeof out));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(validation_fixture_baseline_succeeds),
        cmocka_unit_test(validation_null_pointers_are_rejected),
        cmocka_unit_test(validation_rank_out_of_range_is_rejected),
        cmocka_unit_test(validation_mismatched_shapes_are_rejected),
        cmocka_unit_test(validation_unbroadcastable_mask_is_rejected),
        cmocka_unit_test(validation_unbroadcastable_bias_is_rejected),
        cmocka_unit_test(validation_bad_output_strides_are_rejected),
        cmocka_unit_test(validation_overlapping_outputs_are_rejected),
        cmocka_unit_test(validation_output_overlapping_mask_is_rejected),
        cmocka_unit_test(validation_overlap_is_checked_on_address_ranges),
        cmocka_unit_test(validation_output_stride_on_size_one_dim_is_free),
        cmocka_unit_test(validation_overflowing_shapes_are_rejected),
        cmocka_unit_test(validation_non_f32_dtype_is_rejected),
        cmocka_unit_test(validation_lengths_out_of_range_are_rejected),
        cmocka_unit_test(validation_bad_scale_and_softcap_are_rejected),
        cmocka_unit_test(validation_bad_enum_values_are_rejected),
        cmocka_unit_test(validation_extreme_window_and_offsets_are_safe),
        cmocka_unit_test(validation_reserved_fields_must_be_zero),
        cmocka_unit_test(validation_shape_beyond_rank_must_be_zero),
        cmocka_unit_test(validation_struct_size_rules_are_enforced),
        cmocka_unit_test(validation_dropout_kernel_and_reserved_ranges),
        cmocka_unit_test(validation_options_of_0_1_size_are_accepted),
        cmocka_unit_test(validation_empty_output_with_zero_strides_is_accepted),
        cmocka_unit_test(validation_small_workspace_is_rejected),
        cmocka_unit_test(validation_caller_workspace_of_queried_size_works),
        cmocka_unit_test(validation_workspace_does_not_grow_with_l_times_s),
        cmocka_unit_test(validation_empty_row_error_names_the_row),
        cmocka_unit_test(validation_non_finite_inputs_are_rejected),
        cmocka_unit_test(validation_causal_must_be_0_or_1),
        cmocka_unit_test(validation_nan_in_last_element_of_key_row_is_rejected),
        cmocka_unit_test(validation_nan_in_value_row_with_mask_or_bias_is_rejected),
        cmocka_unit_test(validation_negative_strides_count_in_the_extent),
        cmocka_unit_test(validation_first_tail_byte_of_larger_options_is_checked),
        cmocka_unit_test(validation_skip_finite_check_must_be_0_or_1),
        cmocka_unit_test(validation_sliding_window_must_be_0_or_1),
        cmocka_unit_test(validation_zero_head_width_is_rejected),
        cmocka_unit_test(validation_status_strings_name_every_code),
        cmocka_unit_test(validation_version_matches_header),
        cmocka_unit_test(validation_error_message_clears_on_success),
        cmocka_unit_test(validation_view_addresses_must_not_wrap),
        cmocka_unit_test(validation_workspace_size_messages_name_it),
        cmocka_unit_test(validation_view_constructors_reject_bad_input),
        cmocka_unit_test(validation_view_constructors_reject_null_data_of_non_empty_views),
        cmocka_unit_test(validation_output_overlapping_query_offsets_is_rejected),
        cmocka_unit_test(validation_workspace_overlapping_out_is_rejected),
        cmocka_unit_test(validation_workspace_overlapping_q_is_rejected),
        /* last: under UBSan with halt_on_error a misaligned access ends the process */
        cmocka_unit_test(validation_caller_workspace_at_odd_address_works),
    };
    return cmocka_run_group_tests_name("validation", tests, NULL, NULL);
}
