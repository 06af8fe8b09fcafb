/*
 * sdpa_merge: attention over keys split at every position equals attention over all keys
 * (against sdpa_attention and the float64 reference in tests/ref); one empty side takes the
 * other bit for bit; both empty give zeros and -inf; in place; order independence;
 * associativity; a hand-computed golden case; every error family with untouched outputs.
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

/* A strided view built by hand (the constructors only make contiguous ones). */
static sdpa_tensor view_strided(float *data, int rank, const int64_t *shape, const int64_t *strides)
{
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = SDPA_DTYPE_F32;
    t.rank = rank;
    for (int d = 0; d < rank; ++d) {
        t.shape[d] = shape[d];
        t.strides[d] = strides[d];
    }
    return t;
}

static sdpa_tensor view_contig(float *data, int rank, const int64_t *shape)
{
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init(&t, data, rank, shape), SDPA_OK);
    return t;
}

static float *xmalloc_f(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    assert_non_null(p);
    return p;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ------------------------------------------------------------ golden case */

static void merge_golden_hand_computed(void **state)
{
    (void)state;
    /* lse_a = 0 (sum of exp = 1), lse_b = ln 3 (sum 3): weights 1/4 and 3/4.
     * out = (1 * [1, 2] + 3 * [5, -2]) / 4 = [4, -1]; lse = ln 4. */
    float oa[2] = {1.0f, 2.0f}, ob[2] = {5.0f, -2.0f}, la[1] = {0.0f}, lb[1] = {(float)log(3.0)};
    float o[2], l[1];
    tc_fill_canary(o, sizeof o);
    tc_fill_canary(l, sizeof l);
    const int64_t s1[1] = {2}, s0[1] = {1};
    sdpa_tensor ta = view_contig(oa, 1, s1), tb = view_contig(ob, 1, s1), to = view_contig(o, 1, s1);
    sdpa_tensor tla = view_contig(la, 1, s0), tlb = view_contig(lb, 1, s0), tl = view_contig(l, 1, s0);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    assert_string_equal(sdpa_last_error_message(), "");
    assert_float_equal(o[0], 4.0f, 2e-7);
    assert_float_equal(o[1], -1.0f, 2e-7);
    assert_float_equal(l[0], (float)log(4.0), 2e-7);
    /* The same without an lse output. */
    tc_fill_canary(o, sizeof o);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, NULL), SDPA_OK);
    assert_float_equal(o[0], 4.0f, 2e-7);
    assert_float_equal(o[1], -1.0f, 2e-7);
}

/* ------------------------------------------------- split keys vs all keys */

typedef struct split_cfg {
    const char *name;
    int rank; /* 3 or 4 */
    int64_t B, Hq, Hkv, L, S, E, Ev;
    int causal;
    int alignment; /* of the full call */
    int64_t offsets[3];
    int sliding_window;
    int64_t wl, wr;
    int mask;   /* random [B, Hq, L, S] allow-mask (rank 4) / [B, L, S] (rank 3) */
    int bias;   /* random [L, S] bias with some -inf */
    int key_lengths;
    int64_t kl[3];
    int query_lengths;
    int64_t ql[3];
    float softcap;
} split_cfg;

static const split_cfg SPLIT_CFGS[] = {
    {"plain", 4, 2, 2, 2, 3, 7, 5, 4, 0, 0, {0}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
    {"gqa", 4, 1, 6, 2, 4, 9, 3, 5, 0, 0, {0}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
    {"mqa causal bottom-right", 4, 2, 4, 1, 3, 8, 4, 2, 1, SDPA_ALIGN_BOTTOM_RIGHT, {0}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
    {"causal top-left L = S", 4, 1, 2, 2, 6, 6, 4, 3, 1, SDPA_ALIGN_TOP_LEFT, {0}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
    {"causal offsets", 4, 3, 2, 1, 4, 10, 3, 3, 1, SDPA_ALIGN_OFFSETS, {-2, 3, 7}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
    {"bottom-right with key/query lengths", 4, 3, 2, 2, 5, 9, 4, 3, 1, SDPA_ALIGN_BOTTOM_RIGHT, {0}, 0, -1, -1, 0, 0, 1, {9, 4, 0}, 1, {5, 2, 3}, 0.0f},
    {"window + mask + bias + softcap", 4, 2, 2, 1, 5, 11, 6, 4, 1, SDPA_ALIGN_BOTTOM_RIGHT, {0}, 1, 3, 1, 1, 1, 0, {0}, 0, {0}, 2.5f},
    {"rank 3 mask", 3, 2, 1, 1, 4, 7, 3, 2, 0, 0, {0}, 0, -1, -1, 1, 0, 1, {7, 5}, 0, {0}, 0.0f},
    {"one key", 4, 1, 1, 1, 2, 1, 2, 3, 0, 0, {0}, 0, -1, -1, 0, 0, 0, {0}, 0, {0}, 0.0f},
};

typedef struct split_case {
    const split_cfg *cfg;
    int64_t qshape[4], kshape[4], vshape[4], oshape[4], lshape[3];
    float *q, *k, *v, *bias;
    uint8_t *mask;
    int64_t n_out, n_lse;
    float *out_full, *lse_full;
    double *ref_out, *ref_lse;
    double *dq, *dk, *dv, *dbias;
} split_case;

static void shapes_of(const split_cfg *c, int64_t Hq, int64_t Hkv, int64_t S, int64_t *qs, int64_t *ks,
                      int64_t *vs, int64_t *os, int64_t *ls)
{
    tc_attention_shapes(c->rank, c->B, Hq, Hkv, c->L, S, c->E, c->Ev, qs, ks, vs, os, NULL, ls);
}

/* Options of the full call. */
static void full_options(const split_cfg *c, sdpa_allow_mask *m, sdpa_tensor *bias, const uint8_t *mask_data,
                         float *bias_data, sdpa_options *o)
{
    sdpa_options_init(o);
    o->empty_rows = SDPA_EMPTY_ROWS_ZERO;
    o->causal = c->causal;
    o->alignment = c->alignment;
    if (c->alignment == SDPA_ALIGN_OFFSETS) {
        o->query_offsets = c->offsets;
    }
    o->sliding_window = c->sliding_window;
    o->window_left = c->wl;
    o->window_right = c->wr;
    o->softcap = c->softcap;
    if (c->key_lengths) {
        o->key_lengths = c->kl;
    }
    if (c->query_lengths) {
        o->query_lengths = c->ql;
    }
    if (c->mask) { /* [B, Hq, L, S] also for rank-3 calls (Hq = 1): a rank-3 mask is [Hq, L, S] */
        const int64_t ms[4] = {c->B, c->Hq, c->L, c->S};
        *m = tc_mask_view(mask_data, 4, ms);
        o->allow_mask = m;
    }
    if (c->bias) {
        const int64_t bs[2] = {c->L, c->S};
        *bias = view_contig(bias_data, 2, bs);
        o->bias = bias;
    }
}

static void split_case_init(split_case *sc, const split_cfg *c, uint64_t seed)
{
    memset(sc, 0, sizeof *sc);
    sc->cfg = c;
    tc_rng rng;
    tc_rng_seed(&rng, seed);
    shapes_of(c, c->Hq, c->Hkv, c->S, sc->qshape, sc->kshape, sc->vshape, sc->oshape, sc->lshape);
    const int64_t nq = c->B * c->Hq * c->L * c->E, nk = c->B * c->Hkv * c->S * c->E,
                  nv = c->B * c->Hkv * c->S * c->Ev;
    sc->q = xmalloc_f((size_t)nq);
    sc->k = xmalloc_f((size_t)nk);
    sc->v = xmalloc_f((size_t)nv);
    tc_fill_uniform(sc->q, nq, &rng, -1.5, 1.5);
    tc_fill_uniform(sc->k, nk, &rng, -1.5, 1.5);
    tc_fill_uniform(sc->v, nv, &rng, -2.0, 2.0);
    sc->dq = malloc((size_t)nq * sizeof(double));
    sc->dk = malloc((size_t)nk * sizeof(double));
    sc->dv = malloc((size_t)nv * sizeof(double));
    assert_true(sc->dq && sc->dk && sc->dv);
    for (int64_t e = 0; e < nq; ++e) sc->dq[e] = sc->q[e];
    for (int64_t e = 0; e < nk; ++e) sc->dk[e] = sc->k[e];
    for (int64_t e = 0; e < nv; ++e) sc->dv[e] = sc->v[e];
    if (c->mask) {
        const int64_t n = c->B * c->Hq * c->L * c->S;
        sc->mask = malloc((size_t)n);
        assert_non_null(sc->mask);
        for (int64_t e = 0; e < n; ++e) {
            sc->mask[e] = (uint8_t)!tc_rng_chance(&rng, 0.3);
        }
    }
    if (c->bias) {
        const int64_t n = c->L * c->S;
        sc->bias = xmalloc_f((size_t)n);
        sc->dbias = malloc((size_t)n * sizeof(double));
        assert_non_null(sc->dbias);
        for (int64_t e = 0; e < n; ++e) {
            sc->bias[e] = tc_rng_chance(&rng, 0.15) ? -INFINITY : (float)tc_rng_uniform(&rng, -1.0, 1.0);
            sc->dbias[e] = sc->bias[e];
        }
    }
    sc->n_out = c->B * c->Hq * c->L * c->Ev;
    sc->n_lse = c->B * c->Hq * c->L;
    sc->out_full = xmalloc_f((size_t)sc->n_out);
    sc->lse_full = xmalloc_f((size_t)sc->n_lse);

    /* sdpa_attention over all keys. */
    sdpa_allow_mask m;
    sdpa_tensor tbias;
    sdpa_options o;
    full_options(c, &m, &tbias, sc->mask, sc->bias, &o);
    sdpa_tensor tq = view_contig(sc->q, c->rank, sc->qshape), tk = view_contig(sc->k, c->rank, sc->kshape);
    sdpa_tensor tv = view_contig(sc->v, c->rank, sc->vshape), to = view_contig(sc->out_full, c->rank, sc->oshape);
    sdpa_tensor tl = view_contig(sc->lse_full, c->rank - 1, sc->lshape);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl), SDPA_OK);

    /* The float64 reference over all keys. */
    ref_problem p;
    ref_problem_init(&p);
    p.B = c->B;
    p.Hq = c->Hq;
    p.Hkv = c->Hkv;
    p.L = c->L;
    p.S = c->S;
    p.E = c->E;
    p.Ev = c->Ev;
    ref_view_contiguous4(&p.q, sc->dq, c->B, c->Hq, c->L, c->E);
    ref_view_contiguous4(&p.k, sc->dk, c->B, c->Hkv, c->S, c->E);
    ref_view_contiguous4(&p.v, sc->dv, c->B, c->Hkv, c->S, c->Ev);
    p.softcap = c->softcap;
    p.causal = c->causal;
    p.alignment = c->alignment;
    p.query_offsets = c->alignment == SDPA_ALIGN_OFFSETS ? c->offsets : NULL;
    p.sliding_window = c->sliding_window;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.key_lengths = c->key_lengths ? c->kl : NULL;
    p.query_lengths = c->query_lengths ? c->ql : NULL;
    p.empty_rows_zero = 1;
    ref_mask rm;
    ref_view rb;
    if (c->mask) {
        memset(&rm, 0, sizeof rm);
        rm.data = sc->mask;
        rm.rank = 4;
        const int64_t sh[4] = {c->B, c->Hq, c->L, c->S}, st[4] = {c->Hq * c->L * c->S, c->L * c->S, c->S, 1};
        memcpy(rm.shape, sh, sizeof sh);
        memcpy(rm.strides, st, sizeof st);
        p.mask = &rm;
    }
    if (c->bias) {
        memset(&rb, 0, sizeof rb);
        rb.data = sc->dbias;
        rb.rank = 2;
        rb.shape[0] = c->L;
        rb.shape[1] = c->S;
        rb.strides[0] = c->S;
        rb.strides[1] = 1;
        p.bias = &rb;
    }
    sc->ref_out = malloc((size_t)sc->n_out * sizeof(double));
    sc->ref_lse = malloc((size_t)sc->n_lse * sizeof(double));
    assert_true(sc->ref_out && sc->ref_lse);
    ref_report r = ref_attention(&p, sc->ref_out, NULL, sc->ref_lse, NULL);
    assert_int_equal(r.status, REF_OK);
}

static void split_case_free(split_case *sc)
{
    free(sc->q);
    free(sc->k);
    free(sc->v);
    free(sc->bias);
    free(sc->mask);
    free(sc->out_full);
    free(sc->lse_full);
    free(sc->ref_out);
    free(sc->ref_lse);
    free(sc->dq);
    free(sc->dk);
    free(sc->dv);
    free(sc->dbias);
}

/* Attention of the full case's queries over keys [j0, j1): views into the full K/V (no
 * copy), the mask and bias sliced along S, key lengths and query offsets shifted so that
 * every rule means the same keys as in the full call. */
static void attend_part(const split_case *sc, int64_t j0, int64_t j1, float *out, float *lse)
{
    const split_cfg *c = sc->cfg;
    const int64_t n = j1 - j0;
    int64_t qs[4], ks[4], vs[4], os[4], ls[3];
    shapes_of(c, c->Hq, c->Hkv, n, qs, ks, vs, os, ls);
    /* K/V strides of the full contiguous buffers. */
    int64_t kst[4], vst[4];
    if (c->rank == 4) {
        const int64_t a[4] = {c->Hkv * c->S * c->E, c->S * c->E, c->E, 1};
        const int64_t b[4] = {c->Hkv * c->S * c->Ev, c->S * c->Ev, c->Ev, 1};
        memcpy(kst, a, sizeof a);
        memcpy(vst, b, sizeof b);
    } else {
        const int64_t a[3] = {c->S * c->E, c->E, 1}, b[3] = {c->S * c->Ev, c->Ev, 1};
        memcpy(kst, a, sizeof a);
        memcpy(vst, b, sizeof b);
    }
    const int sax = c->rank == 4 ? 2 : 1; /* the S axis */
    sdpa_tensor tq = view_contig(sc->q, c->rank, sc->qshape);
    sdpa_tensor tk = view_strided(sc->k + j0 * kst[sax], c->rank, ks, kst);
    sdpa_tensor tv = view_strided(sc->v + j0 * vst[sax], c->rank, vs, vst);
    sdpa_tensor to = view_contig(out, c->rank, os), tl = view_contig(lse, c->rank - 1, ls);

    sdpa_options o;
    sdpa_allow_mask m;
    sdpa_tensor tbias;
    full_options(c, &m, &tbias, sc->mask, sc->bias, &o);
    int64_t offs[3], kl[3];
    for (int64_t b = 0; b < c->B; ++b) {
        const int64_t Sb = c->key_lengths ? c->kl[b] : c->S;
        const int64_t Lb = c->query_lengths ? c->ql[b] : c->L;
        int64_t p0 = 0; /* position of query row 0 among all keys */
        if (c->alignment == SDPA_ALIGN_BOTTOM_RIGHT) {
            p0 = Sb - Lb;
        } else if (c->alignment == SDPA_ALIGN_OFFSETS) {
            p0 = c->offsets[b];
        }
        offs[b] = p0 - j0; /* the same position among the part's keys */
        const int64_t hi = Sb < j1 ? Sb : j1;
        kl[b] = hi > j0 ? hi - j0 : 0;
    }
    o.alignment = SDPA_ALIGN_OFFSETS;
    o.query_offsets = offs;
    if (c->key_lengths) {
        o.key_lengths = kl;
    }
    if (c->mask) {
        m.data = sc->mask + j0;
        m.shape[m.rank - 1] = n;
    }
    if (c->bias) {
        tbias.data = sc->bias + j0;
        tbias.shape[1] = n;
    }
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl), SDPA_OK);
}

/* |got - want| <= atol + rtol |want|, with -inf == -inf and exact zeros where want is an
 * empty row (lse -inf). */
static void expect_close(const char *what, const char *cfg, int64_t split, int64_t e, double got, double want,
                         double atol, double rtol)
{
    int ok;
    if (isinf(want)) {
        ok = got == want;
    } else {
        ok = isfinite(got) && fabs(got - want) <= atol + rtol * fabs(want);
    }
    if (!ok) {
        fail_msg("%s [%s] split %lld element %lld: got %.9g, want %.9g", what, cfg, (long long)split, (long long)e,
                 got, want);
    }
}

static void merge_split_at_every_position_equals_full_attention(void **state)
{
    (void)state;
    int checked_rows = 0, empty_side_rows = 0;
    for (size_t ci = 0; ci < sizeof SPLIT_CFGS / sizeof SPLIT_CFGS[0]; ++ci) {
        const split_cfg *c = &SPLIT_CFGS[ci];
        split_case sc;
        split_case_init(&sc, c, 1000 + ci);
        float *oa = xmalloc_f((size_t)sc.n_out), *ob = xmalloc_f((size_t)sc.n_out), *om = xmalloc_f((size_t)sc.n_out);
        float *la = xmalloc_f((size_t)sc.n_lse), *lb = xmalloc_f((size_t)sc.n_lse), *lm = xmalloc_f((size_t)sc.n_lse);
        for (int64_t s0 = 0; s0 <= c->S; ++s0) {
            attend_part(&sc, 0, s0, oa, la);
            attend_part(&sc, s0, c->S, ob, lb);
            tc_fill_canary(om, (size_t)sc.n_out * sizeof(float));
            tc_fill_canary(lm, (size_t)sc.n_lse * sizeof(float));
            sdpa_tensor ta = view_contig(oa, c->rank, sc.oshape), tb = view_contig(ob, c->rank, sc.oshape);
            sdpa_tensor tm = view_contig(om, c->rank, sc.oshape);
            sdpa_tensor tla = view_contig(la, c->rank - 1, sc.lshape), tlb = view_contig(lb, c->rank - 1, sc.lshape);
            sdpa_tensor tlm = view_contig(lm, c->rank - 1, sc.lshape);
            assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &tm, &tlm), SDPA_OK);
            for (int64_t r = 0; r < sc.n_lse; ++r) {
                const int a_empty = la[r] == -INFINITY, b_empty = lb[r] == -INFINITY;
                empty_side_rows += a_empty != b_empty;
                checked_rows++;
                expect_close("lse vs sdpa_attention", c->name, s0, r, lm[r], sc.lse_full[r], 2e-6, 2e-6);
                expect_close("lse vs float64 reference", c->name, s0, r, lm[r], sc.ref_lse[r], 1e-5, 1e-5);
                for (int64_t d = 0; d < c->Ev; ++d) {
                    const int64_t e = r * c->Ev + d;
                    expect_close("out vs sdpa_attention", c->name, s0, e, om[e], sc.out_full[e], 2e-6, 2e-6);
                    expect_close("out vs float64 reference", c->name, s0, e, om[e], sc.ref_out[e], 1e-5, 1e-5);
                    /* One side without keys: the other side's value, bit for bit. */
                    if (a_empty && !b_empty) {
                        assert_true(same_bits(om[e], ob[e]));
                    }
                    if (b_empty && !a_empty) {
                        assert_true(same_bits(om[e], oa[e]));
                    }
                    if (a_empty && b_empty) {
                        assert_true(same_bits(om[e], 0.0f));
                    }
                }
                if (a_empty && !b_empty) {
                    assert_true(same_bits(lm[r], lb[r]));
                }
                if (b_empty && !a_empty) {
                    assert_true(same_bits(lm[r], la[r]));
                }
                if (a_empty && b_empty) {
                    assert_true(lm[r] == -INFINITY);
                }
            }
        }
        free(oa);
        free(ob);
        free(om);
        free(la);
        free(lb);
        free(lm);
        split_case_free(&sc);
    }
    /* The configurations must exercise rows where exactly one side has no key. */
    assert_true(empty_side_rows > 100);
    assert_true(checked_rows > 1000);
}

/* Three parts merged in either grouping agree with each other and with the full call. */
static void merge_three_parts_are_associative(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < sizeof SPLIT_CFGS / sizeof SPLIT_CFGS[0]; ++ci) {
        const split_cfg *c = &SPLIT_CFGS[ci];
        if (c->S < 3) {
            continue;
        }
        split_case sc;
        split_case_init(&sc, c, 2000 + ci);
        const size_t no = (size_t)sc.n_out, nl = (size_t)sc.n_lse;
        float *o[3], *l[3], *o_ab = xmalloc_f(no), *l_ab = xmalloc_f(nl), *o_bc = xmalloc_f(no),
                            *l_bc = xmalloc_f(nl), *o1 = xmalloc_f(no), *l1 = xmalloc_f(nl), *o2 = xmalloc_f(no),
                            *l2 = xmalloc_f(nl);
        const int64_t cut[4] = {0, c->S / 3, (2 * c->S) / 3 + 1, c->S};
        sdpa_tensor to[3], tl[3];
        for (int t = 0; t < 3; ++t) {
            o[t] = xmalloc_f(no);
            l[t] = xmalloc_f(nl);
            attend_part(&sc, cut[t], cut[t + 1], o[t], l[t]);
            to[t] = view_contig(o[t], c->rank, sc.oshape);
            tl[t] = view_contig(l[t], c->rank - 1, sc.lshape);
        }
        sdpa_tensor tab = view_contig(o_ab, c->rank, sc.oshape), tlab = view_contig(l_ab, c->rank - 1, sc.lshape);
        sdpa_tensor tbc = view_contig(o_bc, c->rank, sc.oshape), tlbc = view_contig(l_bc, c->rank - 1, sc.lshape);
        sdpa_tensor t1 = view_contig(o1, c->rank, sc.oshape), tl1 = view_contig(l1, c->rank - 1, sc.lshape);
        sdpa_tensor t2 = view_contig(o2, c->rank, sc.oshape), tl2 = view_contig(l2, c->rank - 1, sc.lshape);
        assert_int_equal(sdpa_merge(&to[0], &tl[0], &to[1], &tl[1], &tab, &tlab), SDPA_OK);
        assert_int_equal(sdpa_merge(&tab, &tlab, &to[2], &tl[2], &t1, &tl1), SDPA_OK);
        assert_int_equal(sdpa_merge(&to[1], &tl[1], &to[2], &tl[2], &tbc, &tlbc), SDPA_OK);
        assert_int_equal(sdpa_merge(&to[0], &tl[0], &tbc, &tlbc, &t2, &tl2), SDPA_OK);
        for (int64_t r = 0; r < sc.n_lse; ++r) {
            expect_close("(ab)c vs a(bc) lse", c->name, -1, r, l1[r], l2[r], 1e-6, 1e-6);
            expect_close("(ab)c vs full lse", c->name, -1, r, l1[r], sc.lse_full[r], 2e-6, 2e-6);
            for (int64_t d = 0; d < c->Ev; ++d) {
                const int64_t e = r * c->Ev + d;
                expect_close("(ab)c vs a(bc) out", c->name, -1, e, o1[e], o2[e], 1e-6, 1e-6);
                expect_close("(ab)c vs float64 reference", c->name, -1, e, o1[e], sc.ref_out[e], 1e-5, 1e-5);
            }
        }
        for (int t = 0; t < 3; ++t) {
            free(o[t]);
            free(l[t]);
        }
        free(o_ab);
        free(l_ab);
        free(o_bc);
        free(l_bc);
        free(o1);
        free(l1);
        free(o2);
        free(l2);
        split_case_free(&sc);
    }
}

/* ---------------------------------------------------------- synthetic data */

/* Random partials [R, Ev] with lse in [-6, 6]; rows listed in `empty` get lse -inf and an
 * out row of NaN/Inf garbage (never read). */
typedef struct partials {
    int64_t R, Ev;
    float *oa, *ob, *la, *lb;
} partials;

static void partials_init(partials *p, int64_t R, int64_t Ev, uint64_t seed)
{
    tc_rng rng;
    tc_rng_seed(&rng, seed);
    p->R = R;
    p->Ev = Ev;
    p->oa = xmalloc_f((size_t)(R * Ev));
    p->ob = xmalloc_f((size_t)(R * Ev));
    p->la = xmalloc_f((size_t)R);
    p->lb = xmalloc_f((size_t)R);
    tc_fill_uniform(p->oa, R * Ev, &rng, -3.0, 3.0);
    tc_fill_uniform(p->ob, R * Ev, &rng, -3.0, 3.0);
    tc_fill_uniform(p->la, R, &rng, -6.0, 6.0);
    tc_fill_uniform(p->lb, R, &rng, -6.0, 6.0);
    for (int64_t r = 0; r < R; ++r) {
        const int kind = (int)(r % 5); /* 0: both, 1: a empty, 2: b empty, 3: both empty, 4: far apart */
        if (kind == 1 || kind == 3) {
            p->la[r] = -INFINITY;
            for (int64_t d = 0; d < Ev; ++d) {
                p->oa[r * Ev + d] = d % 2 ? NAN : INFINITY;
            }
        }
        if (kind == 2 || kind == 3) {
            p->lb[r] = -INFINITY;
            for (int64_t d = 0; d < Ev; ++d) {
                p->ob[r * Ev + d] = d % 2 ? -INFINITY : NAN;
            }
        }
        if (kind == 4) {
            p->lb[r] = p->la[r] - 120.0f; /* exp(-120): B's share is below float32 resolution */
        }
    }
}

static void partials_free(partials *p)
{
    free(p->oa);
    free(p->ob);
    free(p->la);
    free(p->lb);
}

static void merge_matches_double_formula_and_empty_sides(void **state)
{
    (void)state;
    partials p;
    partials_init(&p, 40, 5, 7);
    const int64_t os[3] = {4, 10, 5}, ls[2] = {4, 10};
    float *o = xmalloc_f(200), *l = xmalloc_f(40);
    tc_fill_canary(o, 200 * sizeof(float));
    tc_fill_canary(l, 40 * sizeof(float));
    sdpa_tensor ta = view_contig(p.oa, 3, os), tb = view_contig(p.ob, 3, os), to = view_contig(o, 3, os);
    sdpa_tensor tla = view_contig(p.la, 2, ls), tlb = view_contig(p.lb, 2, ls), tl = view_contig(l, 2, ls);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    int n_formula = 0;
    for (int64_t r = 0; r < 40; ++r) {
        const double a = p.la[r], b = p.lb[r];
        if (a == -INFINITY && b == -INFINITY) {
            assert_true(l[r] == -INFINITY);
            for (int64_t d = 0; d < 5; ++d) {
                assert_true(same_bits(o[r * 5 + d], 0.0f));
            }
        } else if (a == -INFINITY) {
            assert_true(same_bits(l[r], p.lb[r]));
            assert_memory_equal(o + r * 5, p.ob + r * 5, 5 * sizeof(float));
        } else if (b == -INFINITY) {
            assert_true(same_bits(l[r], p.la[r]));
            assert_memory_equal(o + r * 5, p.oa + r * 5, 5 * sizeof(float));
        } else {
            /* Independent form: softmax-style weights from the sums exp(lse). */
            const double sa = exp(a), sb = exp(b), want_l = log(sa + sb);
            assert_true(fabs(l[r] - want_l) <= 1e-6 * fmax(1.0, fabs(want_l)));
            for (int64_t d = 0; d < 5; ++d) {
                const double want = (sa * p.oa[r * 5 + d] + sb * p.ob[r * 5 + d]) / (sa + sb);
                assert_true(fabs(o[r * 5 + d] - want) <= 3e-7 * fmax(1.0, fabs(want)));
                if (r % 5 == 4) { /* B's weight exp(-120) is invisible in float32 */
                    assert_true(same_bits(o[r * 5 + d], p.oa[r * 5 + d]));
                }
            }
            n_formula++;
        }
    }
    assert_int_equal(n_formula, 16);
    free(o);
    free(l);
    partials_free(&p);
}

/* The combine runs in double: a nearly cancelling sum (wa*a ~ -wb*b ~ 1e7) keeps the small
 * residual to float32 rounding of the result, where a float32 combine would be off by ~1. */
static void merge_combines_in_double_precision(void **state)
{
    (void)state;
    const int64_t os[2] = {4, 1}, ls[1] = {4};
    float oa[4], ob[4], la[4], lb[4], o[4], l[4];
    for (int r = 0; r < 4; ++r) {
        oa[r] = 1.0e7f + (float)(r * 1237);
        la[r] = 0.0f;
        lb[r] = -1.0f - 0.25f * (float)r;
        ob[r] = -(float)((double)oa[r] * exp(-(double)lb[r])); /* wb * ob ~ -wa * oa */
    }
    sdpa_tensor ta = view_contig(oa, 2, os), tb = view_contig(ob, 2, os), to = view_contig(o, 2, os);
    sdpa_tensor tla = view_contig(la, 1, ls), tlb = view_contig(lb, 1, ls), tl = view_contig(l, 1, ls);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    for (int r = 0; r < 4; ++r) {
        const long double wa = 1.0L, wb = expl((long double)lb[r]);
        const long double want = (wa * oa[r] + wb * ob[r]) / (wa + wb);
        assert_true(fabsl(want) < 2.0L && fabsl(want) > 1e-4L); /* the case really cancels */
        if (!(fabsl((long double)o[r] - want) <= 1e-7L * fabsl(want) + 1e-9L)) {
            fail_msg("row %d: got %.9g, want %.12Lg", r, (double)o[r], want);
        }
        assert_true(fabsl((long double)l[r] - logl(wa + wb)) <= 1e-7L);
    }
}

static void merge_is_order_independent_bit_for_bit(void **state)
{
    (void)state;
    partials p;
    partials_init(&p, 60, 7, 11);
    const int64_t os[2] = {60, 7}, ls[1] = {60};
    float *o1 = xmalloc_f(420), *o2 = xmalloc_f(420), *l1 = xmalloc_f(60), *l2 = xmalloc_f(60);
    sdpa_tensor ta = view_contig(p.oa, 2, os), tb = view_contig(p.ob, 2, os);
    sdpa_tensor tla = view_contig(p.la, 1, ls), tlb = view_contig(p.lb, 1, ls);
    sdpa_tensor t1 = view_contig(o1, 2, os), t2 = view_contig(o2, 2, os);
    sdpa_tensor tl1 = view_contig(l1, 1, ls), tl2 = view_contig(l2, 1, ls);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &t1, &tl1), SDPA_OK);
    assert_int_equal(sdpa_merge(&tb, &tlb, &ta, &tla, &t2, &tl2), SDPA_OK);
    assert_memory_equal(o1, o2, 420 * sizeof(float));
    assert_memory_equal(l1, l2, 60 * sizeof(float));
    /* Ties (equal lse) too: both weights are 1. */
    for (int64_t r = 0; r < 60; r += 5) {
        p.lb[r] = p.la[r];
    }
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &t1, &tl1), SDPA_OK);
    assert_int_equal(sdpa_merge(&tb, &tlb, &ta, &tla, &t2, &tl2), SDPA_OK);
    assert_memory_equal(o1, o2, 420 * sizeof(float));
    assert_memory_equal(l1, l2, 60 * sizeof(float));
    assert_float_equal(l1[0], p.la[0] + (float)log(2.0), 1e-5);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    partials_free(&p);
}

static void merge_in_place_both_ways_equals_out_of_place(void **state)
{
    (void)state;
    partials p;
    partials_init(&p, 30, 6, 13);
    const int64_t os[3] = {2, 15, 6}, ls[2] = {2, 15};
    float *want_o = xmalloc_f(180), *want_l = xmalloc_f(30);
    {
        sdpa_tensor ta = view_contig(p.oa, 3, os), tb = view_contig(p.ob, 3, os), to = view_contig(want_o, 3, os);
        sdpa_tensor tla = view_contig(p.la, 2, ls), tlb = view_contig(p.lb, 2, ls), tl = view_contig(want_l, 2, ls);
        assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    }
    for (int into = 0; into < 2; ++into) {
        float *oa = xmalloc_f(180), *ob = xmalloc_f(180), *la = xmalloc_f(30), *lb = xmalloc_f(30);
        memcpy(oa, p.oa, 180 * sizeof(float));
        memcpy(ob, p.ob, 180 * sizeof(float));
        memcpy(la, p.la, 30 * sizeof(float));
        memcpy(lb, p.lb, 30 * sizeof(float));
        sdpa_tensor ta = view_contig(oa, 3, os), tb = view_contig(ob, 3, os);
        sdpa_tensor tla = view_contig(la, 2, ls), tlb = view_contig(lb, 2, ls);
        /* out and lse are the very same views as one side's (a fresh struct, same fields). */
        sdpa_tensor to = into ? view_contig(ob, 3, os) : view_contig(oa, 3, os);
        sdpa_tensor tl = into ? view_contig(lb, 2, ls) : view_contig(la, 2, ls);
        assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
        assert_memory_equal(into ? ob : oa, want_o, 180 * sizeof(float));
        assert_memory_equal(into ? lb : la, want_l, 30 * sizeof(float));
        /* The other side is untouched. */
        assert_memory_equal(into ? oa : ob, into ? p.oa : p.ob, 180 * sizeof(float));
        assert_memory_equal(into ? la : lb, into ? p.la : p.lb, 30 * sizeof(float));
        free(oa);
        free(ob);
        free(la);
        free(lb);
    }
    /* out in place into A while lse goes into B's lse (mixed), strided (BSHD-like) views. */
    {
        float *oa = xmalloc_f(180), *lb = xmalloc_f(30);
        /* A stored as [15, 2, 6] physically, viewed as [2, 15, 6]. */
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t i = 0; i < 15; ++i)
                memcpy(oa + (i * 2 + b) * 6, p.oa + (b * 15 + i) * 6, 6 * sizeof(float));
        memcpy(lb, p.lb, 30 * sizeof(float));
        const int64_t st[3] = {6, 12, 1};
        sdpa_tensor ta = view_strided(oa, 3, os, st), to = view_strided(oa, 3, os, st);
        sdpa_tensor tb = view_contig(p.ob, 3, os), tla = view_contig(p.la, 2, ls);
        sdpa_tensor tlb = view_contig(lb, 2, ls), tl = view_contig(lb, 2, ls);
        assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t i = 0; i < 15; ++i)
                assert_memory_equal(oa + (i * 2 + b) * 6, want_o + (b * 15 + i) * 6, 6 * sizeof(float));
        assert_memory_equal(lb, want_l, 30 * sizeof(float));
        free(oa);
        free(lb);
    }
    free(want_o);
    free(want_l);
    partials_free(&p);
}

/* Any strides on the inputs (reversed, broadcast, padded) and padded permuted outputs give
 * the same bits as contiguous views; holes of the outputs are never written. */
static void merge_strided_views_equal_contiguous(void **state)
{
    (void)state;
    const int64_t os[4] = {2, 3, 4, 5}, ls[3] = {2, 3, 4};
    tc_rng rng;
    tc_rng_seed(&rng, 99);
    tc_layout lin, lout;
    tc_buf a, b, la, lb, o, l;
    tc_layout_contiguous(&lin, 4);
    lin.reverse[2] = 1;
    lin.pad[3] = 2;
    tc_buf_alloc(&a, 4, os, &lin, NAN);
    tc_buf_fill_uniform(&a, &rng, -1, 1);
    tc_layout_contiguous(&lin, 4);
    lin.perm[1] = 2;
    lin.perm[2] = 1;
    lin.bcast[1] = 1; /* B's out broadcast over heads */
    tc_buf_alloc(&b, 4, os, &lin, NAN);
    tc_buf_fill_uniform(&b, &rng, -1, 1);
    tc_layout_contiguous(&lin, 3);
    lin.reverse[0] = 1;
    tc_buf_alloc(&la, 3, ls, &lin, NAN);
    tc_buf_fill_uniform(&la, &rng, -2, 2);
    tc_layout_contiguous(&lin, 3);
    lin.bcast[2] = 1;
    tc_buf_alloc(&lb, 3, ls, &lin, NAN);
    tc_buf_fill_uniform(&lb, &rng, -2, 2);
    tc_layout_contiguous(&lout, 4);
    lout.perm[0] = 3;
    lout.perm[3] = 0;
    lout.pad[1] = 1;
    tc_buf_alloc_canary(&o, 4, os, &lout);
    tc_layout_contiguous(&lout, 3);
    lout.perm[0] = 2;
    lout.perm[2] = 0;
    lout.pad[0] = 3;
    tc_buf_alloc_canary(&l, 3, ls, &lout);
    sdpa_tensor ta = tc_buf_view(&a), tb = tc_buf_view(&b), tla = tc_buf_view(&la), tlb = tc_buf_view(&lb);
    sdpa_tensor to = tc_buf_view(&o), tl = tc_buf_view(&l);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    assert_true(tc_buf_holes_intact(&o));
    assert_true(tc_buf_holes_intact(&l));

    /* Contiguous copies. */
    float ca[120], cb[120], cla[24], clb[24], co[120], cl[24];
    int64_t idx[4] = {0};
    int64_t e = 0;
    do {
        ca[e] = *tc_buf_fptr(&a, idx);
        cb[e] = *tc_buf_fptr(&b, idx);
        e++;
    } while (tc_index_next(4, os, idx));
    memset(idx, 0, sizeof idx);
    e = 0;
    do {
        cla[e] = *tc_buf_fptr(&la, idx);
        clb[e] = *tc_buf_fptr(&lb, idx);
        e++;
    } while (tc_index_next(3, ls, idx));
    sdpa_tensor ca_t = view_contig(ca, 4, os), cb_t = view_contig(cb, 4, os), co_t = view_contig(co, 4, os);
    sdpa_tensor cla_t = view_contig(cla, 3, ls), clb_t = view_contig(clb, 3, ls), cl_t = view_contig(cl, 3, ls);
    assert_int_equal(sdpa_merge(&ca_t, &cla_t, &cb_t, &clb_t, &co_t, &cl_t), SDPA_OK);
    memset(idx, 0, sizeof idx);
    e = 0;
    do {
        assert_true(same_bits(*tc_buf_fptr(&o, idx), co[e]));
        e++;
    } while (tc_index_next(4, os, idx));
    memset(idx, 0, sizeof idx);
    e = 0;
    do {
        assert_true(same_bits(*tc_buf_fptr(&l, idx), cl[e]));
        e++;
    } while (tc_index_next(3, ls, idx));
    tc_buf_free(&a);
    tc_buf_free(&b);
    tc_buf_free(&la);
    tc_buf_free(&lb);
    tc_buf_free(&o);
    tc_buf_free(&l);
}

static void merge_rank1_and_empty_views(void **state)
{
    (void)state;
    /* Rank-1 outs [Ev] with rank-1 lse views of shape [1]. */
    float oa[3] = {1, 2, 3}, ob[3] = {3, 2, 1}, la = 0.5f, lb = 0.5f, o[3], l;
    const int64_t s3[1] = {3}, s1[1] = {1};
    sdpa_tensor ta = view_contig(oa, 1, s3), tb = view_contig(ob, 1, s3), to = view_contig(o, 1, s3);
    sdpa_tensor tla = view_contig(&la, 1, s1), tlb = view_contig(&lb, 1, s1), tl = view_contig(&l, 1, s1);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &to, &tl), SDPA_OK);
    for (int d = 0; d < 3; ++d) {
        assert_float_equal(o[d], 2.0f, 1e-7);
    }
    assert_float_equal(l, 0.5f + (float)log(2.0), 1e-6);

    /* Ev = 0: no out element, but every row's lse is still merged. NULL data is fine for an
     * empty view. */
    float la2[2] = {0.0f, -INFINITY}, lb2[2] = {0.0f, 1.0f}, l2[2];
    const int64_t os0[2] = {2, 0}, ls2[1] = {2};
    sdpa_tensor e_a = view_contig(NULL, 2, os0), e_b = view_contig(NULL, 2, os0), e_o = view_contig(NULL, 2, os0);
    sdpa_tensor tla2 = view_contig(la2, 1, ls2), tlb2 = view_contig(lb2, 1, ls2), tl2 = view_contig(l2, 1, ls2);
    assert_int_equal(sdpa_merge(&e_a, &tla2, &e_b, &tlb2, &e_o, &tl2), SDPA_OK);
    assert_float_equal(l2[0], (float)log(2.0), 1e-6);
    assert_true(same_bits(l2[1], 1.0f));

    /* No row at all. */
    const int64_t z[3] = {0, 4, 2}, zl[2] = {0, 4};
    sdpa_tensor z_a = view_contig(NULL, 3, z), z_l = view_contig(NULL, 2, zl);
    assert_int_equal(sdpa_merge(&z_a, &z_l, &z_a, &z_l, &z_a, &z_l), SDPA_OK);
}

/* ------------------------------------------------------------------ errors */

typedef struct efx {
    float oa[24], ob[24], la[6], lb[6];
    float out[24], lse[6];
    float oa0[24], ob0[24], la0[6], lb0[6];
    sdpa_tensor ta, tb, tla, tlb, to, tl;
} efx;

static efx *efx_new(void)
{
    efx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tc_rng rng;
    tc_rng_seed(&rng, 5);
    tc_fill_uniform(f->oa, 24, &rng, -1, 1);
    tc_fill_uniform(f->ob, 24, &rng, -1, 1);
    tc_fill_uniform(f->la, 6, &rng, -1, 1);
    tc_fill_uniform(f->lb, 6, &rng, -1, 1);
    memcpy(f->oa0, f->oa, sizeof f->oa);
    memcpy(f->ob0, f->ob, sizeof f->ob);
    memcpy(f->la0, f->la, sizeof f->la);
    memcpy(f->lb0, f->lb, sizeof f->lb);
    tc_fill_canary(f->out, sizeof f->out);
    tc_fill_canary(f->lse, sizeof f->lse);
    const int64_t os[3] = {2, 3, 4}, ls[2] = {2, 3};
    f->ta = view_contig(f->oa, 3, os);
    f->tb = view_contig(f->ob, 3, os);
    f->to = view_contig(f->out, 3, os);
    f->tla = view_contig(f->la, 2, ls);
    f->tlb = view_contig(f->lb, 2, ls);
    f->tl = view_contig(f->lse, 2, ls);
    return f;
}

/* The call fails with `want`, says so in a message that names `needle`, writes no output byte
 * and changes no input. */
static void expect_fail(efx *f, const sdpa_tensor *oa, const sdpa_tensor *la, const sdpa_tensor *ob,
                        const sdpa_tensor *lb, const sdpa_tensor *o, const sdpa_tensor *l, sdpa_status want,
                        const char *needle, int line)
{
    char what[64];
    snprintf(what, sizeof what, "case at line %d", line);
    sdpa_status got = sdpa_merge(oa, la, ob, lb, o, l);
    const char *msg = sdpa_last_error_message();
    if (got != want) {
        fail_msg("%s: got %s, want %s (%s)", what, sdpa_status_string(got), sdpa_status_string(want), msg);
    }
    if (strstr(msg, "sdpa_merge") == NULL || strstr(msg, needle) == NULL) {
        fail_msg("%s: message \"%s\" does not name sdpa_merge and \"%s\"", what, msg, needle);
    }
    if (!tc_is_canary(f->out, sizeof f->out) || !tc_is_canary(f->lse, sizeof f->lse)) {
        fail_msg("%s: an output was written before the call failed", what);
    }
    if (memcmp(f->oa, f->oa0, sizeof f->oa) || memcmp(f->ob, f->ob0, sizeof f->ob) ||
        memcmp(f->la, f->la0, sizeof f->la) || memcmp(f->lb, f->lb0, sizeof f->lb)) {
        fail_msg("%s: an input changed", what);
    }
}

#define EXPECT_FAIL(f, oa, la, ob, lb, o, l, want, needle) \
    expect_fail((f), (oa), (la), (ob), (lb), (o), (l), (want), (needle), __LINE__)

static void merge_rejects_null_dtype_rank_shape(void **state)
{
    (void)state;
    efx *f = efx_new();
    EXPECT_FAIL(f, NULL, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NULL_POINTER, "out_a is NULL");
    EXPECT_FAIL(f, &f->ta, NULL, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NULL_POINTER, "lse_a is NULL");
    EXPECT_FAIL(f, &f->ta, &f->tla, NULL, &f->tlb, &f->to, &f->tl, SDPA_ERR_NULL_POINTER, "out_b is NULL");
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, NULL, &f->to, &f->tl, SDPA_ERR_NULL_POINTER, "lse_b is NULL");
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, NULL, &f->tl, SDPA_ERR_NULL_POINTER, "out is NULL");
    sdpa_tensor t = f->tb;
    t.data = NULL;
    EXPECT_FAIL(f, &f->ta, &f->tla, &t, &f->tlb, &f->to, &f->tl, SDPA_ERR_NULL_POINTER, "out_b.data is NULL");

    t = f->tlb;
    t.dtype = SDPA_DTYPE_F16;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &t, &f->to, &f->tl, SDPA_ERR_DTYPE, "lse_b.dtype");
    t = f->to;
    t.dtype = SDPA_DTYPE_BF16;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &t, &f->tl, SDPA_ERR_DTYPE, "out.dtype");
    t = f->tl;
    t.dtype = 7;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t, SDPA_ERR_DTYPE, "lse.dtype");

    t = f->ta;
    t.rank = 0;
    EXPECT_FAIL(f, &t, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_RANK, "out_a.rank=0");
    t = f->ta;
    t.rank = SDPA_MAX_RANK + 1;
    EXPECT_FAIL(f, &t, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_RANK, "out_a.rank=9");
    /* out_b as [2, 12] (same elements, other rank). */
    const int64_t s2[2] = {2, 12};
    t = view_contig(f->ob, 2, s2);
    EXPECT_FAIL(f, &f->ta, &f->tla, &t, &f->tlb, &f->to, &f->tl, SDPA_ERR_RANK, "out_b.rank=2");
    /* lse as [6] instead of [2, 3]. */
    const int64_t s6[1] = {6};
    t = view_contig(f->lse, 1, s6);
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t, SDPA_ERR_RANK, "lse.rank=1, expected 2");
    t = view_contig(f->la, 1, s6);
    EXPECT_FAIL(f, &f->ta, &t, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_RANK, "lse_a.rank=1");

    const int64_t s324[3] = {3, 2, 4}, s233[3] = {2, 3, 3}, s23[2] = {2, 2}, s32[2] = {3, 2};
    t = view_contig(f->ob, 3, s324);
    EXPECT_FAIL(f, &f->ta, &f->tla, &t, &f->tlb, &f->to, &f->tl, SDPA_ERR_SHAPE, "out_b.shape[0]=3");
    t = view_contig(f->out, 3, s233);
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &t, &f->tl, SDPA_ERR_SHAPE, "out.shape[2]=3");
    t = view_contig(f->lb, 2, s23);
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &t, &f->to, &f->tl, SDPA_ERR_SHAPE, "lse_b.shape[1]=2");
    t = view_contig(f->lse, 2, s32);
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t, SDPA_ERR_SHAPE, "lse.shape[0]=3");
    t = f->ta;
    t.shape[1] = -3;
    EXPECT_FAIL(f, &t, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_SHAPE, "negative");
    /* Rank-1 outs need lse of shape [1]. */
    {
        const int64_t e4[1] = {4}, e2[1] = {2};
        sdpa_tensor a1 = view_contig(f->oa, 1, e4), b1 = view_contig(f->ob, 1, e4), o1 = view_contig(f->out, 1, e4);
        sdpa_tensor la1 = view_contig(f->la, 1, e2), lb1 = view_contig(f->lb, 1, e2);
        EXPECT_FAIL(f, &a1, &la1, &b1, &lb1, &o1, NULL, SDPA_ERR_SHAPE, "lse_a.shape[0]=2, expected 1");
    }
    free(f);
}

static void merge_rejects_bad_layout_and_overlap(void **state)
{
    (void)state;
    efx *f = efx_new();
    sdpa_tensor t;
    /* Output strides. */
    t = f->to;
    t.strides[1] = 0;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &t, &f->tl, SDPA_ERR_STRIDE, "out.strides[1]=0");
    t = f->to;
    t.data = f->out + 12;
    t.strides[0] = -12;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &t, &f->tl, SDPA_ERR_STRIDE, "out.strides[0]=-12");
    t = f->to;
    t.strides[0] = 8; /* rows of batch 0 and 1 share addresses */
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &t, &f->tl, SDPA_ERR_STRIDE, "overlaps itself");
    t = f->tl;
    t.strides[0] = 0;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t, SDPA_ERR_STRIDE, "lse.strides[0]=0");
    /* Size overflow. */
    t = f->ta;
    t.strides[0] = INT64_MAX / 2;
    EXPECT_FAIL(f, &t, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_SIZE_OVERFLOW, "out_a");
    /* Reserved fields and entries beyond rank. */
    t = f->tb;
    t.reserved[1] = 1;
    EXPECT_FAIL(f, &f->ta, &f->tla, &t, &f->tlb, &f->to, &f->tl, SDPA_ERR_INVALID_ARGUMENT, "out_b.reserved");
    t = f->tl;
    t.shape[2] = 1;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t, SDPA_ERR_INVALID_ARGUMENT, "beyond rank");

    /* Overlap: out over an lse input, over another output, shifted over out_a, or the same
     * data as out_a with other strides (not "exactly the view"). */
    const int64_t os[3] = {2, 3, 4}, ls[2] = {2, 3};
    float *big = xmalloc_f(64);
    memset(big, 0, 64 * sizeof(float));
    memcpy(big, f->oa, sizeof f->oa);
    sdpa_tensor a_big = view_contig(big, 3, os);
    t = view_contig(big + 1, 3, os); /* out one element past out_a */
    /* This case writes into `big`, not into f->out: check it separately. */
    float keep[64];
    memcpy(keep, big, sizeof keep);
    assert_int_equal(sdpa_merge(&a_big, &f->tla, &f->tb, &f->tlb, &t, &f->tl), SDPA_ERR_OVERLAP);
    assert_non_null(strstr(sdpa_last_error_message(), "out (written) overlaps input out_a"));
    assert_memory_equal(big, keep, sizeof keep);
    assert_true(tc_is_canary(f->lse, sizeof f->lse));
    /* Same data as out_a, transposed strides. */
    const int64_t tst[3] = {12, 1, 3};
    t = view_strided(big, 3, os, tst);
    assert_int_equal(sdpa_merge(&a_big, &f->tla, &f->tb, &f->tlb, &t, &f->tl), SDPA_ERR_OVERLAP);
    assert_non_null(strstr(sdpa_last_error_message(), "without being exactly that view"));
    assert_memory_equal(big, keep, sizeof keep);
    free(big);

    /* lse written over out (both outputs). */
    const int64_t l6[2] = {2, 3};
    t = view_contig(f->out + 4, 2, l6);
    {
        float keep_out[24];
        memcpy(keep_out, f->out, sizeof keep_out);
        assert_int_equal(sdpa_merge(&f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &t), SDPA_ERR_OVERLAP);
        assert_non_null(strstr(sdpa_last_error_message(), "both written"));
        assert_memory_equal(f->out, keep_out, sizeof keep_out);
    }
    /* out written over lse_a (an input of another kind: never in place). */
    {
        float buf[24] = {0}; /* filled only in part below: the rest must be defined too */
        memcpy(buf, f->la, sizeof f->la);
        sdpa_tensor la_in = view_contig(buf, 2, ls), o_over = view_contig(buf, 3, os);
        float keep2[24];
        memcpy(keep2, buf, sizeof buf);
        assert_int_equal(sdpa_merge(&f->ta, &la_in, &f->tb, &f->tlb, &o_over, &f->tl), SDPA_ERR_OVERLAP);
        assert_non_null(strstr(sdpa_last_error_message(), "out (written) overlaps input lse_a"));
        assert_memory_equal(buf, keep2, sizeof buf);
        /* lse written exactly over out_b's first row: an input of another kind. */
        memcpy(buf, f->ob, sizeof f->ob);
        sdpa_tensor ob_in = view_contig(buf, 3, os), l_over = view_contig(buf, 2, ls);
        memcpy(keep2, buf, sizeof buf);
        assert_int_equal(sdpa_merge(&f->ta, &f->tla, &ob_in, &f->tlb, &f->to, &l_over), SDPA_ERR_OVERLAP);
        assert_non_null(strstr(sdpa_last_error_message(), "lse (written) overlaps input out_b"));
        assert_memory_equal(buf, keep2, sizeof buf);
        assert_true(tc_is_canary(f->out, sizeof f->out));
    }
    /* In place into out_b while lse is shifted by one over lse_b. */
    {
        float lbuf[8];
        memcpy(lbuf, f->lb, sizeof f->lb);
        lbuf[6] = lbuf[7] = 0.0f;
        sdpa_tensor lb_in = view_contig(lbuf, 2, ls), l_shift = view_contig(lbuf + 1, 2, ls);
        float keep3[8];
        memcpy(keep3, lbuf, sizeof lbuf);
        assert_int_equal(sdpa_merge(&f->ta, &f->tla, &f->tb, &lb_in, &f->to, &l_shift), SDPA_ERR_OVERLAP);
        assert_non_null(strstr(sdpa_last_error_message(), "lse (written) overlaps input lse_b"));
        assert_memory_equal(lbuf, keep3, sizeof lbuf);
        assert_true(tc_is_canary(f->out, sizeof f->out));
    }
    free(f);
}

static void merge_rejects_non_finite_values(void **state)
{
    (void)state;
    efx *f = efx_new();
    /* Each case poisons the last row, so a merge that wrote rows before checking would show. */
    /* Inputs are poisoned in the copy that expect_fail compares with too. */
    f->la[5] = f->la0[5] = NAN;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NON_FINITE, "lse_a at row (1,2) is NaN");
    f->la[5] = f->la0[5] = -0.5f;
    f->lb[5] = f->lb0[5] = NAN;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NON_FINITE, "lse_b at row (1,2) is NaN");
    f->lb[5] = f->lb0[5] = 0.25f;
    f->oa[23] = NAN;
    f->oa0[23] = NAN;
    /* memcmp of NaN bits is stable: the same NaN was stored in both. */
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NON_FINITE, "out_a at row (1,2), element 3 is NaN");
    f->oa[23] = f->oa0[23] = 0.5f;
    f->ob[21] = f->ob0[21] = -INFINITY;
    EXPECT_FAIL(f, &f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl, SDPA_ERR_NON_FINITE, "out_b at row (1,2), element 1 is -inf");
    /* The same NaN/Inf with that side's lse = -inf is never read: the call succeeds and the
     * row is A's. */
    f->lb[5] = -INFINITY;
    f->ob[20] = NAN;
    assert_int_equal(sdpa_merge(&f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl), SDPA_OK);
    assert_memory_equal(f->out + 20, f->oa + 20, 4 * sizeof(float));
    assert_true(same_bits(f->lse[5], f->la[5]));
    /* +inf, FlashAttention-2's lse of a row with no key, is read as -inf (vLLM's
     * merge_attn_states): the same row, bit for bit, and its out row is not read either. It
     * used to be SDPA_ERR_NON_FINITE. Both sides +inf: a zero row with lse -inf. */
    f->lb[5] = INFINITY;
    assert_int_equal(sdpa_merge(&f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl), SDPA_OK);
    assert_memory_equal(f->out + 20, f->oa + 20, 4 * sizeof(float));
    assert_true(same_bits(f->lse[5], f->la[5]));
    f->la[5] = INFINITY;
    f->oa[21] = NAN;
    assert_int_equal(sdpa_merge(&f->ta, &f->tla, &f->tb, &f->tlb, &f->to, &f->tl), SDPA_OK);
    for (int d = 0; d < 4; ++d)
        assert_true(same_bits(f->out[20 + d], 0.0f));
    assert_true(f->lse[5] == -INFINITY);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merge_golden_hand_computed),
        cmocka_unit_test(merge_split_at_every_position_equals_full_attention),
        cmocka_unit_test(merge_three_parts_are_associative),
        cmocka_unit_test(merge_matches_double_formula_and_empty_sides),
        cmocka_unit_test(merge_combines_in_double_precision),
        cmocka_unit_test(merge_is_order_independent_bit_for_bit),
        cmocka_unit_test(merge_in_place_both_ways_equals_out_of_place),
        cmocka_unit_test(merge_strided_views_equal_contiguous),
        cmocka_unit_test(merge_rank1_and_empty_views),
        cmocka_unit_test(merge_rejects_null_dtype_rank_shape),
        cmocka_unit_test(merge_rejects_bad_layout_and_overlap),
        cmocka_unit_test(merge_rejects_non_finite_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
