/*
 * The multi-head attention layer (sdpa_mha_forward) against an independent float64
 * implementation written here from the PyTorch definition (projections y = x W^T + b, heads as
 * column groups, bias_k / zero row appended to the projected keys and values with "attend"
 * columns in every mask, softmax per head, head-averaged weights, output projection), plus
 * the error families (every one with canary-checked outputs), the workspace and struct_size
 * rules, and the dropout / training flag.
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

#define ATOL 1e-5
#define RTOL 1e-4

/* How an input or output [B, N, W] lives in memory. */
enum {
    LAY_BATCH_FIRST = 0, /* [B, N, W] contiguous */
    LAY_SEQ_FIRST = 1,   /* PyTorch batch_first=False: an [N, B, W] buffer */
    LAY_SLICE = 2,       /* a [B, N, W] window of a [B, N+2, W+3] buffer (rows fit no single GEMM) */
    LAY_COLS = 3,        /* every other float: column stride 2 */
    LAY_COUNT = 4,       /* layouts for inputs and outputs */
    LAY_REVERSED = 4     /* inputs only: the sequence axis runs backwards (negative stride) */
};
static const char *const LAY_NAME[LAY_COUNT + 1] = {"batch_first", "seq_first", "slice", "col_stride_2",
                                                    "reversed"};

/* ----------------------------------------------------------------- layer */

typedef struct mcase {
    int64_t B, L, S, E, H, Hkv, Dh, kdim, vdim; /* Hkv, Dh, kdim, vdim: 0 = default */
    int packed, bias, bias_kv, zero_attn, self_attn;
    int in_layout;
    uint64_t seed;
} mcase;

typedef struct strided {
    float *base;
    size_t n;
    sdpa_tensor t;
} strided;

typedef struct layer {
    mcase c;
    int64_t Hkv, Dh, Dq, Dkv, kdim, vdim, Sp;
    double *q, *k, *v;                     /* logical [B,L,E], [B,S,kdim], [B,S,vdim] */
    double *Wq, *Wk, *Wv, *Wo, *b_in, *bo, *bk, *bv;
    float *f_in, *f_wq, *f_wk, *f_wv, *f_wo, *f_bin, *f_bo, *f_bk, *f_bv;
    strided xq, xk, xv;
    sdpa_tensor t_in, t_wq, t_wk, t_wv, t_wo, t_bin, t_bo, t_bk, t_bv;
    sdpa_mha_params p;
} layer;

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    assert_non_null(p);
    return p;
}

static void strides_for(int lay, int64_t B, int64_t N, int64_t W, int64_t st[3], size_t *n) {
    switch (lay) {
    case LAY_SEQ_FIRST: st[0] = W; st[1] = B * W; st[2] = 1; *n = (size_t)(B * N * W); break;
    case LAY_SLICE: st[1] = W + 3; st[0] = (N + 2) * (W + 3); st[2] = 1; *n = (size_t)(B * (N + 2) * (W + 3)); break;
    case LAY_COLS: st[2] = 2; st[1] = 2 * W; st[0] = 2 * N * W; *n = (size_t)(2 * B * N * W); break;
    case LAY_REVERSED: st[2] = 1; st[1] = -W; st[0] = N * W; *n = (size_t)(B * N * W); break;
    default: st[2] = 1; st[1] = W; st[0] = N * W; *n = (size_t)(B * N * W); break;
    }
}

/* A strided [B, N, W] buffer: holes hold `hole` (NaN for inputs: a read outside the view shows). */
static void strided_alloc(strided *s, int lay, int64_t B, int64_t N, int64_t W, float hole) {
    int64_t st[3];
    strides_for(lay, B, N, W, st, &s->n);
    s->base = xcalloc(s->n, sizeof(float));
    for (size_t i = 0; i < s->n; ++i)
        s->base[i] = hole;
    const int64_t shape[3] = {B, N, W};
    assert_int_equal(sdpa_tensor_init(&s->t, s->base, 3, shape), SDPA_OK);
    for (int d = 0; d < 3; ++d)
        s->t.strides[d] = st[d];
    if (lay == LAY_REVERSED && N > 0)
        s->t.data = s->base + (N - 1) * W; /* element [0, 0, 0] is the last row of batch 0 */
}

static float *sat(const strided *s, int64_t b, int64_t n, int64_t w) {
    return (float *)s->t.data + b * s->t.strides[0] + n * s->t.strides[1] + w * s->t.strides[2];
}

static void strided_free(strided *s) {
    free(s->base);
    memset(s, 0, sizeof *s);
}

/* A float-exact random value (the double mirror equals the float). */
static double rnd(tc_rng *r, double lo, double hi) { return (double)(float)tc_rng_uniform(r, lo, hi); }

static void fill(tc_rng *r, double *d, float *f, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; ++i) {
        d[i] = rnd(r, lo, hi);
        f[i] = (float)d[i];
    }
}

static void input_from(strided *s, int lay, const double *logical, int64_t B, int64_t N, int64_t W) {
    strided_alloc(s, lay, B, N, W, NAN);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t n = 0; n < N; ++n)
            for (int64_t w = 0; w < W; ++w)
                *sat(s, b, n, w) = (float)logical[(b * N + n) * W + w];
}

static sdpa_tensor vec(float *d, int64_t n) {
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init(&t, d, 1, &n), SDPA_OK);
    return t;
}

static sdpa_tensor mat(float *d, int64_t r, int64_t c) {
    const int64_t shape[2] = {r, c};
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init(&t, d, 2, shape), SDPA_OK);
    return t;
}

static void layer_init(layer *ly, const mcase *c) {
    memset(ly, 0, sizeof *ly);
    ly->c = *c;
    const int64_t B = c->B, L = c->L, S = c->self_attn ? c->L : c->S, E = c->E;
    ly->c.S = S;
    ly->Hkv = c->Hkv ? c->Hkv : c->H;
    ly->Dh = c->Dh ? c->Dh : E / c->H;
    ly->Dq = c->H * ly->Dh;
    ly->Dkv = ly->Hkv * ly->Dh;
    ly->kdim = c->kdim ? c->kdim : E;
    ly->vdim = c->vdim ? c->vdim : E;
    ly->Sp = S + (c->bias_kv ? 1 : 0) + (c->zero_attn ? 1 : 0);
    const int64_t Dq = ly->Dq, Dkv = ly->Dkv, kd = ly->kdim, vd = ly->vdim;
    tc_rng r;
    tc_rng_seed(&r, c->seed);

    ly->q = xcalloc((size_t)(B * L * E), sizeof(double));
    ly->k = xcalloc((size_t)(B * S * kd), sizeof(double));
    ly->v = xcalloc((size_t)(B * S * vd), sizeof(double));
    for (int64_t i = 0; i < B * L * E; ++i)
        ly->q[i] = rnd(&r, -1, 1);
    if (c->self_attn) {
        memcpy(ly->k, ly->q, (size_t)(B * L * E) * sizeof(double));
        memcpy(ly->v, ly->q, (size_t)(B * L * E) * sizeof(double));
    } else {
        for (int64_t i = 0; i < B * S * kd; ++i)
            ly->k[i] = rnd(&r, -1, 1);
        for (int64_t i = 0; i < B * S * vd; ++i)
            ly->v[i] = rnd(&r, -1, 1);
    }

    /* Weights. Packed: one [3E, E] buffer whose row blocks are Wq, Wk, Wv. */
    ly->Wq = xcalloc((size_t)(Dq * E), sizeof(double));
    ly->Wk = xcalloc((size_t)(Dkv * kd), sizeof(double));
    ly->Wv = xcalloc((size_t)(Dkv * vd), sizeof(double));
    ly->Wo = xcalloc((size_t)(E * Dq), sizeof(double));
    ly->b_in = xcalloc((size_t)(Dq + 2 * Dkv), sizeof(double));
    ly->bo = xcalloc((size_t)E, sizeof(double));
    ly->bk = xcalloc((size_t)Dkv, sizeof(double));
    ly->bv = xcalloc((size_t)Dkv, sizeof(double));
    const double wq = 1.0 / sqrt((double)E), wk = 1.0 / sqrt((double)kd), wv = 1.0 / sqrt((double)vd);
    sdpa_mha_params_init(&ly->p);
    ly->p.embed_dim = E;
    ly->p.num_heads = c->H;
    ly->p.num_kv_heads = c->Hkv;
    ly->p.head_dim = c->Dh;
    ly->p.kdim = c->kdim;
    ly->p.vdim = c->vdim;
    if (c->packed) {
        ly->f_in = xcalloc((size_t)(3 * E * E), sizeof(float));
        fill(&r, ly->Wq, ly->f_in, E * E, -wq, wq);
        fill(&r, ly->Wk, ly->f_in + E * E, E * E, -wq, wq);
        fill(&r, ly->Wv, ly->f_in + 2 * E * E, E * E, -wq, wq);
        ly->t_in = mat(ly->f_in, 3 * E, E);
        ly->p.in_proj_weight = &ly->t_in;
    } else {
        ly->f_wq = xcalloc((size_t)(Dq * E), sizeof(float));
        ly->f_wk = xcalloc((size_t)(Dkv * kd), sizeof(float));
        ly->f_wv = xcalloc((size_t)(Dkv * vd), sizeof(float));
        fill(&r, ly->Wq, ly->f_wq, Dq * E, -wq, wq);
        fill(&r, ly->Wk, ly->f_wk, Dkv * kd, -wk, wk);
        fill(&r, ly->Wv, ly->f_wv, Dkv * vd, -wv, wv);
        ly->t_wq = mat(ly->f_wq, Dq, E);
        ly->t_wk = mat(ly->f_wk, Dkv, kd);
        ly->t_wv = mat(ly->f_wv, Dkv, vd);
        ly->p.q_proj_weight = &ly->t_wq;
        ly->p.k_proj_weight = &ly->t_wk;
        ly->p.v_proj_weight = &ly->t_wv;
    }
    ly->f_wo = xcalloc((size_t)(E * Dq), sizeof(float));
    fill(&r, ly->Wo, ly->f_wo, E * Dq, -1.0 / sqrt((double)Dq), 1.0 / sqrt((double)Dq));
    ly->t_wo = mat(ly->f_wo, E, Dq);
    ly->p.out_proj_weight = &ly->t_wo;
    ly->f_bin = xcalloc((size_t)(Dq + 2 * Dkv), sizeof(float));
    ly->f_bo = xcalloc((size_t)E, sizeof(float));
    if (c->bias) {
        fill(&r, ly->b_in, ly->f_bin, Dq + 2 * Dkv, -0.5, 0.5);
        fill(&r, ly->bo, ly->f_bo, E, -0.5, 0.5);
        ly->t_bin = vec(ly->f_bin, Dq + 2 * Dkv);
        ly->t_bo = vec(ly->f_bo, E);
        ly->p.in_proj_bias = &ly->t_bin;
        ly->p.out_proj_bias = &ly->t_bo;
    }
    ly->f_bk = xcalloc((size_t)Dkv, sizeof(float));
    ly->f_bv = xcalloc((size_t)Dkv, sizeof(float));
    if (c->bias_kv) {
        fill(&r, ly->bk, ly->f_bk, Dkv, -1, 1);
        fill(&r, ly->bv, ly->f_bv, Dkv, -1, 1);
        const int64_t shape[3] = {1, 1, Dkv}; /* PyTorch's [1, 1, E] */
        assert_int_equal(sdpa_tensor_init(&ly->t_bk, ly->f_bk, 3, shape), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&ly->t_bv, ly->f_bv, 3, shape), SDPA_OK);
        ly->p.bias_k = &ly->t_bk;
        ly->p.bias_v = &ly->t_bv;
    }
    ly->p.add_zero_attn = c->zero_attn;

    input_from(&ly->xq, c->in_layout, ly->q, B, L, E);
    if (!c->self_attn) {
        input_from(&ly->xk, c->in_layout, ly->k, B, S, kd);
        input_from(&ly->xv, c->in_layout, ly->v, B, S, vd);
    }
}

static const sdpa_tensor *tq(const layer *ly) { return &ly->xq.t; }
static const sdpa_tensor *tk(const layer *ly) { return ly->c.self_attn ? &ly->xq.t : &ly->xk.t; }
static const sdpa_tensor *tv(const layer *ly) { return ly->c.self_attn ? &ly->xq.t : &ly->xv.t; }

static void layer_free(layer *ly) {
    free(ly->q); free(ly->k); free(ly->v);
    free(ly->Wq); free(ly->Wk); free(ly->Wv); free(ly->Wo); free(ly->b_in); free(ly->bo); free(ly->bk); free(ly->bv);
    free(ly->f_in); free(ly->f_wq); free(ly->f_wk); free(ly->f_wv); free(ly->f_wo); free(ly->f_bin); free(ly->f_bo);
    free(ly->f_bk); free(ly->f_bv);
    strided_free(&ly->xq); strided_free(&ly->xk); strided_free(&ly->xv);
}

/* ------------------------------------------------------------- reference */

typedef struct ref_opts {
    const uint8_t *attn;  /* allow [B, H, L, S] (expanded), NULL = all */
    const uint8_t *kpm;   /* allow [B, S], NULL = all */
    const double *bias;   /* additive [B, H, L, S] (expanded), NULL = none */
    const int64_t *klen, *qlen;
    int causal, zero_rows;
} ref_opts;

/* float64 MHA. out [B, L, E]; w [B, H, L, S'] per head. Returns 0, or 1 if some non-padding row
 * has no allowed key (the library's policy ERROR then fails; policy ZERO gives the rows here). */
static int ref_mha(const layer *ly, const ref_opts *o, double *out, double *w) {
    const int64_t B = ly->c.B, L = ly->c.L, S = ly->c.S, E = ly->c.E, H = ly->c.H;
    const int64_t Dh = ly->Dh, Dq = ly->Dq, Dkv = ly->Dkv, kd = ly->kdim, vd = ly->vdim, Sp = ly->Sp;
    const int64_t group = H / ly->Hkv;
    const double scale = 1.0 / sqrt((double)Dh);
    double *qp = xcalloc((size_t)(B * L * Dq), sizeof(double));
    double *kp = xcalloc((size_t)(B * Sp * Dkv), sizeof(double));
    double *vp = xcalloc((size_t)(B * Sp * Dkv), sizeof(double));
    double *att = xcalloc((size_t)(B * L * Dq), sizeof(double));
    double *s = xcalloc((size_t)Sp, sizeof(double));
    uint8_t *ok = xcalloc((size_t)Sp, 1);
    int empty = 0;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < L; ++i)
            for (int64_t c = 0; c < Dq; ++c) {
                double acc = ly->b_in[c];
                for (int64_t e = 0; e < E; ++e)
                    acc += ly->q[(b * L + i) * E + e] * ly->Wq[c * E + e];
                qp[(b * L + i) * Dq + c] = acc;
            }
        for (int64_t j = 0; j < Sp; ++j)
            for (int64_t c = 0; c < Dkv; ++c) {
                double ak = 0.0, av = 0.0;
                if (j < S) {
                    ak = ly->b_in[Dq + c];
                    av = ly->b_in[Dq + Dkv + c];
                    for (int64_t e = 0; e < kd; ++e)
                        ak += ly->k[(b * S + j) * kd + e] * ly->Wk[c * kd + e];
                    for (int64_t e = 0; e < vd; ++e)
                        av += ly->v[(b * S + j) * vd + e] * ly->Wv[c * vd + e];
                } else if (j == S && ly->c.bias_kv) {
                    ak = ly->bk[c];
                    av = ly->bv[c];
                } /* else the zero row */
                kp[(b * Sp + j) * Dkv + c] = ak;
                vp[(b * Sp + j) * Dkv + c] = av;
            }
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / group;
            for (int64_t i = 0; i < L; ++i) {
                double *wrow = w + ((b * H + h) * L + i) * Sp;
                double *arow = att + (b * L + i) * Dq + h * Dh;
                memset(wrow, 0, (size_t)Sp * sizeof(double));
                if (o->qlen && i >= o->qlen[b])
                    continue; /* padding: zeros */
                double m = -INFINITY;
                for (int64_t j = 0; j < Sp; ++j) {
                    const int64_t mi = ((b * H + h) * L + i) * S + j;
                    ok[j] = j >= S || ((!o->attn || o->attn[mi]) && (!o->kpm || o->kpm[b * S + j]) &&
                                       (!o->klen || j < o->klen[b]) && (!o->causal || j <= i) &&
                                       (!o->bias || o->bias[mi] != -INFINITY));
                    if (!ok[j])
                        continue;
                    double acc = 0.0;
                    for (int64_t d = 0; d < Dh; ++d)
                        acc += qp[(b * L + i) * Dq + h * Dh + d] * kp[(b * Sp + j) * Dkv + g * Dh + d];
                    s[j] = acc * scale + (j < S && o->bias ? o->bias[mi] : 0.0);
                    m = s[j] > m ? s[j] : m;
                }
                if (m == -INFINITY) {
                    empty = 1;
                    continue;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < Sp; ++j)
                    if (ok[j])
                        sum += (wrow[j] = exp(s[j] - m));
                for (int64_t j = 0; j < Sp; ++j)
                    wrow[j] /= sum;
                for (int64_t d = 0; d < Dh; ++d) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < Sp; ++j)
                        if (ok[j])
                            acc += wrow[j] * vp[(b * Sp + j) * Dkv + g * Dh + d];
                    arow[d] = acc;
                }
            }
        }
        for (int64_t i = 0; i < L; ++i)
            for (int64_t e = 0; e < E; ++e) {
                double acc = ly->bo[e];
                for (int64_t c = 0; c < Dq; ++c)
                    acc += att[(b * L + i) * Dq + c] * ly->Wo[e * Dq + c];
                out[(b * L + i) * E + e] = o->qlen && i >= o->qlen[b] ? 0.0 : acc;
            }
    }
    free(qp); free(kp); free(vp); free(att); free(s); free(ok);
    return empty;
}

static void ref_average(const layer *ly, const double *w, double *avg) {
    const int64_t B = ly->c.B, H = ly->c.H, L = ly->c.L, Sp = ly->Sp;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < Sp; ++j) {
                double acc = 0.0;
                for (int64_t h = 0; h < H; ++h)
                    acc += w[((b * H + h) * L + i) * Sp + j];
                avg[(b * L + i) * Sp + j] = acc / (double)H;
            }
}

/* ------------------------------------------------------------ comparisons */

static double g_max_err; /* largest |lib - ref| seen, printed per test */
static char g_ctx[160];  /* the configuration being compared, for failure messages */

static void close_or_fail(const char *what, int64_t idx, double got, double want) {
    double d = fabs(got - want);
    if (d > g_max_err)
        g_max_err = d;
    if (!(d <= ATOL + RTOL * fabs(want)))
        fail_msg("%s[%lld]: libsdpa %.9g, float64 reference %.9g (%s)", what, (long long)idx, got, want, g_ctx);
}

static void expect_out(const strided *out, const double *want, int64_t B, int64_t L, int64_t E) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i)
            for (int64_t e = 0; e < E; ++e)
                close_or_fail("out", (b * L + i) * E + e, *sat(out, b, i, e), want[(b * L + i) * E + e]);
}

static void expect_array(const char *what, const float *got, const double *want, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        close_or_fail(what, i, got[i], want[i]);
}

/* ---------------------------------------------------------- one full run */

typedef struct run_spec {
    int out_layout;
    int weights;  /* 0 none, 1 averaged, 2 per head */
    ref_opts ref;
    sdpa_mha_options opt; /* masks etc. already set by the caller */
} run_spec;

/* Runs the library and the reference on the same problem and compares out and weights. */
static void run_and_compare(layer *ly, run_spec *rs) {
    const int64_t B = ly->c.B, L = ly->c.L, E = ly->c.E, H = ly->c.H, Sp = ly->Sp;
    strided out;
    strided_alloc(&out, rs->out_layout, B, L, E, 0.0f);
    tc_fill_canary(out.base, out.n * sizeof(float));
    const int64_t nw = rs->weights == 2 ? B * H * L * Sp : B * L * Sp;
    float *w = xcalloc((size_t)nw, sizeof(float));
    tc_fill_canary(w, (size_t)nw * sizeof(float));
    sdpa_tensor tw;
    if (rs->weights == 2) {
        const int64_t shape[4] = {B, H, L, Sp};
        assert_int_equal(sdpa_tensor_init(&tw, w, 4, shape), SDPA_OK);
    } else {
        assert_int_equal(sdpa_tensor_init_3d(&tw, w, B, L, Sp), SDPA_OK);
    }
    rs->opt.per_head_weights = rs->weights == 2;
    snprintf(g_ctx, sizeof g_ctx, "seed %llu, input %s, out %s, weights %s, S'=%lld",
             (unsigned long long)ly->c.seed, LAY_NAME[ly->c.in_layout], LAY_NAME[rs->out_layout],
             rs->weights == 2 ? "per head" : rs->weights ? "averaged" : "none", (long long)Sp);
    sdpa_status st = sdpa_mha_forward(&ly->p, tq(ly), tk(ly), tv(ly), &rs->opt, &out.t, rs->weights ? &tw : NULL);
    if (st != SDPA_OK)
        fail_msg("sdpa_mha_forward: %s: %s (%s)", sdpa_status_string(st), sdpa_last_error_message(), g_ctx);
    assert_string_equal(sdpa_last_error_message(), "");

    double *rout = xcalloc((size_t)(B * L * E), sizeof(double));
    double *rw = xcalloc((size_t)(B * H * L * Sp), sizeof(double));
    double *ravg = xcalloc((size_t)(B * L * Sp), sizeof(double));
    rs->ref.zero_rows = rs->opt.empty_rows == SDPA_EMPTY_ROWS_ZERO;
    int empty = ref_mha(ly, &rs->ref, rout, rw);
    assert_true(!empty || rs->ref.zero_rows);
    expect_out(&out, rout, B, L, E);
    if (rs->weights == 2) {
        expect_array("weights[per head]", w, rw, nw);
    } else if (rs->weights == 1) {
        ref_average(ly, rw, ravg);
        expect_array("weights[averaged]", w, ravg, nw);
    }
    /* Holes of a strided out are never written. */
    size_t covered = 0;
    for (size_t i = 0; i < out.n; ++i)
        covered += !tc_is_canary(out.base + i, sizeof(float));
    assert_int_equal(covered, (size_t)(B * L * E));
    free(rout); free(rw); free(ravg); free(w);
    strided_free(&out);
}

static void spec_init(run_spec *rs, int out_layout, int weights) {
    memset(rs, 0, sizeof *rs);
    rs->out_layout = out_layout;
    rs->weights = weights;
    sdpa_mha_options_init(&rs->opt);
}

static mcase base_case(void) {
    mcase c;
    memset(&c, 0, sizeof c);
    c.B = 2; c.L = 4; c.S = 5; c.E = 8; c.H = 2;
    c.packed = 1; c.bias = 1;
    c.seed = 1;
    return c;
}

/* ------------------------------------------------------------------ tests */

static void mha_self_attention_packed_matches_reference(void **state) {
    (void)state;
    for (int lay = 0; lay <= LAY_REVERSED; ++lay) {
        mcase c = base_case();
        c.B = 3; c.L = 5; c.E = 12; c.H = 3; c.self_attn = 1; c.in_layout = lay; c.seed = 10 + (uint64_t)lay;
        layer ly;
        layer_init(&ly, &c);
        for (int weights = 0; weights <= 2; ++weights) {
            run_spec rs;
            spec_init(&rs, lay % LAY_COUNT, weights); /* outputs cannot run backwards */
            run_and_compare(&ly, &rs);
        }
        layer_free(&ly);
    }
    print_message("  self-attention, 5 layouts x 3 weight modes: max |lib - ref| = %.3g\n", g_max_err);
}

static void mha_cross_attention_kdim_vdim_key_padding(void **state) {
    (void)state;
    mcase c = base_case();
    c.B = 3; c.L = 4; c.S = 6; c.kdim = 5; c.vdim = 7; c.packed = 0; c.seed = 20;
    layer ly;
    layer_init(&ly, &c);
    /* PyTorch key_padding_mask: True = padding. Converted with sdpa_mask_from_ignore. */
    const int64_t lens[3] = {6, 4, 1};
    uint8_t ignore[18], allow[18];
    for (int b = 0; b < 3; ++b)
        for (int j = 0; j < 6; ++j)
            ignore[b * 6 + j] = j >= lens[b];
    assert_int_equal(sdpa_mask_from_ignore(ignore, 18, allow), SDPA_OK);
    const int64_t kshape[2] = {3, 6};
    sdpa_allow_mask kpm = tc_mask_view(allow, 2, kshape);
    for (int weights = 0; weights <= 2; ++weights) {
        run_spec rs;
        spec_init(&rs, LAY_BATCH_FIRST, weights);
        rs.opt.key_padding_mask = &kpm;
        rs.ref.kpm = allow;
        run_and_compare(&ly, &rs);
        /* The same padding as key_lengths. */
        spec_init(&rs, LAY_BATCH_FIRST, weights);
        rs.opt.key_lengths = lens;
        rs.ref.klen = lens;
        run_and_compare(&ly, &rs);
    }
    layer_free(&ly);
    print_message("  kdim=5, vdim=7, key padding: max |lib - ref| = %.3g\n", g_max_err);
}

/* attn_mask [L, S] + key padding + causal + key_lengths + additive bias with -inf, through
 * every input and output layout, with bias_k and/or the zero row. */
static void mha_bias_kv_zero_attn_with_masks(void **state) {
    (void)state;
    for (int variant = 0; variant < 3; ++variant) {
        for (int lay = 0; lay < LAY_COUNT; ++lay) {
            mcase c = base_case();
            c.bias_kv = variant != 1;
            c.zero_attn = variant != 0;
            c.in_layout = lay;
            c.seed = 30 + (uint64_t)(variant * LAY_COUNT + lay);
            layer ly;
            layer_init(&ly, &c);
            const int64_t B = 2, H = 2, L = 4, S = 5;
            tc_rng r;
            tc_rng_seed(&r, c.seed);
            uint8_t am[4 * 5], kpm_allow[2 * 5], am_full[2 * 2 * 4 * 5];
            double bias_full[2 * 2 * 4 * 5];
            float bias[2 * 2 * 4 * 5];
            for (int i = 0; i < 20; ++i)
                am[i] = (uint8_t)tc_rng_chance(&r, 0.7);
            for (int i = 0; i < 10; ++i)
                kpm_allow[i] = (uint8_t)tc_rng_chance(&r, 0.8);
            for (int i = 0; i < 80; ++i) {
                bias_full[i] = tc_rng_chance(&r, 0.15) ? -INFINITY : rnd(&r, -1, 1);
                bias[i] = (float)bias_full[i];
            }
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < H; ++h)
                    for (int64_t i = 0; i < L * S; ++i)
                        am_full[(b * H + h) * L * S + i] = am[i];
            const int64_t amshape[2] = {L, S}, kshape[2] = {B, S}, bshape[4] = {B, H, L, S};
            sdpa_allow_mask tam = tc_mask_view(am, 2, amshape), tkpm = tc_mask_view(kpm_allow, 2, kshape);
            sdpa_tensor tb;
            assert_int_equal(sdpa_tensor_init(&tb, bias, 4, bshape), SDPA_OK);
            const int64_t klen[2] = {4, 0}; /* batch 1: no input key at all, only the appended ones */
            for (int weights = 1; weights <= 2; ++weights) {
                run_spec rs;
                spec_init(&rs, (lay + weights) % LAY_COUNT, weights);
                rs.opt.attn_mask = &tam;
                rs.opt.key_padding_mask = &tkpm;
                rs.opt.attn_bias = &tb;
                rs.opt.causal = 1;
                rs.opt.key_lengths = klen;
                rs.ref.attn = am_full;
                rs.ref.kpm = kpm_allow;
                rs.ref.bias = bias_full;
                rs.ref.causal = 1;
                rs.ref.klen = klen;
                run_and_compare(&ly, &rs);
                /* Each rule alone. */
                spec_init(&rs, LAY_BATCH_FIRST, weights);
                rs.opt.key_padding_mask = &tkpm;
                rs.ref.kpm = kpm_allow;
                run_and_compare(&ly, &rs);
                spec_init(&rs, LAY_SEQ_FIRST, weights);
                rs.opt.attn_bias = &tb;
                rs.ref.bias = bias_full;
                run_and_compare(&ly, &rs);
                spec_init(&rs, LAY_BATCH_FIRST, weights);
                rs.opt.causal = 1;
                rs.ref.causal = 1;
                run_and_compare(&ly, &rs);
            }
            layer_free(&ly);
        }
    }
    print_message("  add_bias_kv/add_zero_attn with masks, 4 layouts: max |lib - ref| = %.3g\n", g_max_err);
}

static void mha_averaged_weights_are_head_mean_and_rows_sum_to_one(void **state) {
    (void)state;
    mcase c = base_case();
    c.H = 4; c.bias_kv = 1; c.seed = 40;
    layer ly;
    layer_init(&ly, &c);
    const int64_t B = 2, H = 4, L = 4, Sp = ly.Sp;
    float *wa = xcalloc((size_t)(B * L * Sp), sizeof(float)), *wh = xcalloc((size_t)(B * H * L * Sp), sizeof(float));
    float *o1 = xcalloc((size_t)(B * L * 8), sizeof(float)), *o2 = xcalloc((size_t)(B * L * 8), sizeof(float));
    sdpa_tensor ta = tc_view3(wa, B, L, Sp), th = tc_view4(wh, B, H, L, Sp);
    sdpa_tensor to1 = tc_view3(o1, B, L, 8), to2 = tc_view3(o2, B, L, 8);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to1, &ta), SDPA_OK);
    o.per_head_weights = 1;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to2, &th), SDPA_OK);
    /* The weights mode does not change out. */
    assert_memory_equal(o1, o2, (size_t)(B * L * 8) * sizeof(float));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
            double row = 0.0;
            for (int64_t j = 0; j < Sp; ++j) {
                double m = 0.0;
                for (int64_t h = 0; h < H; ++h)
                    m += wh[((b * H + h) * L + i) * Sp + j];
                m /= (double)H;
                assert_float_equal(wa[(b * L + i) * Sp + j], m, 1e-7);
                row += wa[(b * L + i) * Sp + j];
            }
            assert_float_equal(row, 1.0, 1e-6);
        }
    /* need_weights = False gives the same out (within rounding: sdpa_attention's kernel may
     * take another path when no weights are requested). */
    float *o3 = xcalloc((size_t)(B * L * 8), sizeof(float));
    sdpa_tensor to3 = tc_view3(o3, B, L, 8);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), NULL, &to3, NULL), SDPA_OK);
    for (int64_t i = 0; i < B * L * 8; ++i)
        assert_float_equal(o1[i], o3[i], 1e-6);
    free(wa); free(wh); free(o1); free(o2); free(o3);
    layer_free(&ly);
}

static void mha_without_biases_matches_reference(void **state) {
    (void)state;
    for (int packed = 0; packed <= 1; ++packed) {
        mcase c = base_case();
        c.bias = 0; c.packed = packed; c.in_layout = LAY_SEQ_FIRST; c.seed = 50 + (uint64_t)packed;
        layer ly;
        layer_init(&ly, &c);
        assert_null(ly.p.in_proj_bias);
        assert_null(ly.p.out_proj_bias);
        run_spec rs;
        spec_init(&rs, LAY_SEQ_FIRST, 1);
        run_and_compare(&ly, &rs);
        spec_init(&rs, LAY_COLS, 2);
        run_and_compare(&ly, &rs);
        layer_free(&ly);
    }
}

/* PyTorch batch_first=False: the [L, B, E] buffers read through strides, out written the same
 * way; equal (within rounding) to the batch-first result on the same numbers. */
static void mha_seq_first_buffers_through_strides(void **state) {
    (void)state;
    for (int lay = 0; lay < LAY_COUNT; ++lay)
        for (int olay = 0; olay < LAY_COUNT; ++olay) {
            mcase c = base_case();
            c.B = 3; c.L = 3; c.S = 4; c.kdim = 6; c.packed = 0; c.in_layout = lay; c.seed = 60;
            layer ly;
            layer_init(&ly, &c);
            run_spec rs;
            spec_init(&rs, olay, 1);
            run_and_compare(&ly, &rs);
            if (olay == 0) { /* and inputs read backwards */
                layer_free(&ly);
                c.in_layout = LAY_REVERSED;
                layer_init(&ly, &c);
                spec_init(&rs, lay, 2);
                run_and_compare(&ly, &rs);
            }
            layer_free(&ly);
        }
    print_message("  20 input/output layout pairs: max |lib - ref| = %.3g\n", g_max_err);
}

static void mha_gqa_matches_reference(void **state) {
    (void)state;
    /* Llama-style: H=4 query heads, Hkv=2 (and 1: MQA), head_dim 3, Dq=12 != E=10. */
    for (int64_t hkv = 1; hkv <= 4; hkv *= 2) {
        mcase c = base_case();
        c.B = 2; c.L = 3; c.S = 7; c.E = 10; c.H = 4; c.Hkv = hkv; c.Dh = 3; c.kdim = 6; c.vdim = 5;
        c.packed = 0; c.bias_kv = hkv == 1; c.zero_attn = hkv == 1; c.seed = 70 + (uint64_t)hkv;
        layer ly;
        layer_init(&ly, &c);
        assert_int_equal(ly.Dq, 12);
        assert_int_equal(ly.Dkv, 3 * hkv);
        for (int weights = 0; weights <= 2; ++weights) {
            run_spec rs;
            spec_init(&rs, LAY_BATCH_FIRST, weights);
            run_and_compare(&ly, &rs);
            spec_init(&rs, LAY_SEQ_FIRST, weights);
            rs.opt.causal = 1;
            rs.ref.causal = 1;
            run_and_compare(&ly, &rs);
        }
        layer_free(&ly);
    }
    print_message("  GQA H=4, Hkv=1,2,4: max |lib - ref| = %.3g\n", g_max_err);
}

/* GQA equals plain MHA whose k/v projections repeat each kv head's rows for its group. */
static void mha_gqa_equals_repeated_kv_projection(void **state) {
    (void)state;
    mcase c = base_case();
    c.B = 2; c.L = 3; c.S = 5; c.E = 8; c.H = 4; c.Hkv = 2; c.Dh = 2; c.packed = 0; c.seed = 75;
    layer g;
    layer_init(&g, &c);
    const int64_t Dh = 2, H = 4, E = 8, group = 2;
    float wk[8 * 8], wv[8 * 8], bin[8 + 16];
    for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < Dh; ++d) {
            const int64_t src = (h / group) * Dh + d, dst = h * Dh + d;
            memcpy(wk + dst * E, g.f_wk + src * E, (size_t)E * sizeof(float));
            memcpy(wv + dst * E, g.f_wv + src * E, (size_t)E * sizeof(float));
            bin[8 + dst] = g.f_bin[8 + src];
            bin[16 + dst] = g.f_bin[8 + 4 + src];
        }
    memcpy(bin, g.f_bin, 8 * sizeof(float));
    sdpa_tensor twk = mat(wk, 8, 8), twv = mat(wv, 8, 8), tbin = vec(bin, 24);
    sdpa_mha_params p = g.p;
    p.num_kv_heads = 0;
    p.k_proj_weight = &twk;
    p.v_proj_weight = &twv;
    p.in_proj_bias = &tbin;
    float o1[2 * 3 * 8], o2[2 * 3 * 8], w1[2 * 4 * 3 * 5], w2[2 * 4 * 3 * 5];
    sdpa_tensor to1 = tc_view3(o1, 2, 3, 8), to2 = tc_view3(o2, 2, 3, 8);
    sdpa_tensor tw1 = tc_view4(w1, 2, 4, 3, 5), tw2 = tc_view4(w2, 2, 4, 3, 5);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.per_head_weights = 1;
    assert_int_equal(sdpa_mha_forward(&g.p, tq(&g), tk(&g), tv(&g), &o, &to1, &tw1), SDPA_OK);
    assert_int_equal(sdpa_mha_forward(&p, tq(&g), tk(&g), tv(&g), &o, &to2, &tw2), SDPA_OK);
    for (int i = 0; i < 48; ++i)
        assert_float_equal(o1[i], o2[i], 1e-5);
    for (int i = 0; i < 120; ++i)
        assert_float_equal(w1[i], w2[i], 1e-6);
    layer_free(&g);
}

/* Weights given through any strides: transposed storage ([in, out] buffers), every other
 * element, biases with a stride, bias_k/bias_v as rank-1 views. Same numbers, same result. */
static void mha_weight_views_with_any_strides(void **state) {
    (void)state;
    mcase c = base_case();
    c.packed = 0; c.kdim = 6; c.vdim = 5; c.H = 2; c.Hkv = 1; c.Dh = 3; c.bias_kv = 1; c.seed = 190;
    layer ly;
    layer_init(&ly, &c);
    const int64_t E = 8, Dq = 6, Dkv = 3, kd = 6, vd = 5;
    /* Wq stored transposed: buffer [E, Dq], view [Dq, E] with strides {1, Dq}. */
    float *wq_t = xcalloc((size_t)(E * Dq), sizeof(float));
    for (int64_t r = 0; r < Dq; ++r)
        for (int64_t e = 0; e < E; ++e)
            wq_t[e * Dq + r] = ly.f_wq[r * E + e];
    sdpa_tensor twq = mat(wq_t, Dq, E);
    twq.strides[0] = 1;
    twq.strides[1] = Dq;
    /* Wk every other float; Wv with padded rows; Wo transposed. */
    float *wk2 = xcalloc((size_t)(2 * Dkv * kd), sizeof(float)), *wv2 = xcalloc((size_t)(Dkv * (vd + 4)), sizeof(float));
    float *wo_t = xcalloc((size_t)(E * Dq), sizeof(float));
    for (int64_t i = 0; i < Dkv * kd; ++i)
        wk2[2 * i] = ly.f_wk[i], wk2[2 * i + 1] = NAN;
    for (int64_t r = 0; r < Dkv; ++r)
        for (int64_t e = 0; e < vd + 4; ++e)
            wv2[r * (vd + 4) + e] = e < vd ? ly.f_wv[r * vd + e] : NAN;
    for (int64_t r = 0; r < E; ++r)
        for (int64_t e = 0; e < Dq; ++e)
            wo_t[e * E + r] = ly.f_wo[r * Dq + e];
    sdpa_tensor twk = mat(wk2, Dkv, kd), twv = mat(wv2, Dkv, vd), two = mat(wo_t, E, Dq);
    twk.strides[0] = 2 * kd; twk.strides[1] = 2;
    twv.strides[0] = vd + 4;
    two.strides[0] = 1; two.strides[1] = E;
    /* Biases with stride 3 (in_proj_bias), reversed (out_proj_bias), bias_k/v rank 1. */
    const int64_t nb = Dq + 2 * Dkv;
    float *bin3 = xcalloc((size_t)(3 * nb), sizeof(float)), *bo_r = xcalloc((size_t)E, sizeof(float));
    for (int64_t i = 0; i < 3 * nb; ++i)
        bin3[i] = i % 3 ? NAN : ly.f_bin[i / 3];
    for (int64_t i = 0; i < E; ++i)
        bo_r[E - 1 - i] = ly.f_bo[i];
    sdpa_tensor tbin = vec(bin3, nb), tbo = vec(bo_r + E - 1, E), tbk = vec(ly.f_bk, Dkv), tbv = vec(ly.f_bv, Dkv);
    tbin.strides[0] = 3;
    tbo.strides[0] = -1;
    ly.p.q_proj_weight = &twq;
    ly.p.k_proj_weight = &twk;
    ly.p.v_proj_weight = &twv;
    ly.p.out_proj_weight = &two;
    ly.p.in_proj_bias = &tbin;
    ly.p.out_proj_bias = &tbo;
    ly.p.bias_k = &tbk;
    ly.p.bias_v = &tbv;
    for (int weights = 0; weights <= 2; ++weights) {
        run_spec rs;
        spec_init(&rs, weights == 1 ? LAY_SEQ_FIRST : LAY_BATCH_FIRST, weights);
        run_and_compare(&ly, &rs);
    }
    free(wq_t); free(wk2); free(wv2); free(wo_t); free(bin3); free(bo_r);
    layer_free(&ly);
}

static void mha_causal_matches_reference(void **state) {
    (void)state;
    /* Self-attention L = S, and cross-attention L < S (top-left: query i sees keys j <= i). */
    for (int cross = 0; cross <= 1; ++cross) {
        mcase c = base_case();
        c.L = cross ? 3 : 6; c.S = 5; c.self_attn = !cross; c.seed = 80 + (uint64_t)cross;
        layer ly;
        layer_init(&ly, &c);
        run_spec rs;
        spec_init(&rs, LAY_BATCH_FIRST, 2);
        rs.opt.causal = 1;
        rs.ref.causal = 1;
        run_and_compare(&ly, &rs);
        layer_free(&ly);
    }
    /* A future token changes no earlier output row. */
    mcase c = base_case();
    c.L = 5; c.self_attn = 1; c.seed = 85;
    layer ly;
    layer_init(&ly, &c);
    float o1[2 * 5 * 8], o2[2 * 5 * 8];
    sdpa_tensor to1 = tc_view3(o1, 2, 5, 8), to2 = tc_view3(o2, 2, 5, 8);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.causal = 1;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to1, NULL), SDPA_OK);
    for (int e = 0; e < 8; ++e)
        *sat(&ly.xq, 0, 4, e) += 3.0f; /* last token of batch 0 */
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to2, NULL), SDPA_OK);
    assert_memory_equal(o1, o2, 4 * 8 * sizeof(float));
    assert_memory_not_equal(o1 + 4 * 8, o2 + 4 * 8, 8 * sizeof(float));
    assert_memory_equal(o1 + 5 * 8, o2 + 5 * 8, 5 * 8 * sizeof(float));
    layer_free(&ly);
}

static void mha_query_lengths_give_exact_zero_rows(void **state) {
    (void)state;
    mcase c = base_case();
    c.L = 4; c.bias_kv = 1; c.seed = 90;
    layer ly;
    layer_init(&ly, &c);
    const int64_t qlen[2] = {3, 0};
    /* Padding rows of the input may hold anything, NaN included: they are never read. */
    for (int e = 0; e < 8; ++e) {
        *sat(&ly.xq, 0, 3, e) = NAN;
        *sat(&ly.xq, 1, 1, e) = INFINITY;
    }
    for (int weights = 1; weights <= 2; ++weights) {
        run_spec rs;
        spec_init(&rs, LAY_BATCH_FIRST, weights);
        rs.opt.query_lengths = qlen;
        rs.ref.qlen = qlen;
        run_and_compare(&ly, &rs); /* the reference never reads padded rows either */
    }
    float out[2 * 4 * 8], w[2 * 2 * 4 * 6];
    sdpa_tensor to = tc_view3(out, 2, 4, 8), tw = tc_view4(w, 2, 2, 4, 6);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.query_lengths = qlen;
    o.per_head_weights = 1;
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(w, sizeof w);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to, &tw), SDPA_OK);
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = qlen[b]; i < 4; ++i) {
            for (int e = 0; e < 8; ++e) {
                uint32_t bits;
                memcpy(&bits, &out[(b * 4 + i) * 8 + e], 4);
                assert_int_equal(bits, 0u); /* +0.0f exactly, not b_o */
            }
            for (int64_t h = 0; h < 2; ++h)
                for (int j = 0; j < 6; ++j)
                    assert_true(w[((b * 2 + h) * 4 + i) * 6 + j] == 0.0f);
        }
    layer_free(&ly);
}

static void mha_eval_ignores_dropout_bit_for_bit(void **state) {
    (void)state;
    mcase c = base_case();
    c.bias_kv = 1; c.zero_attn = 1; c.seed = 100;
    layer ly;
    layer_init(&ly, &c);
    float o1[2 * 4 * 8], o2[2 * 4 * 8], w1[2 * 4 * 7], w2[2 * 4 * 7];
    sdpa_tensor to1 = tc_view3(o1, 2, 4, 8), to2 = tc_view3(o2, 2, 4, 8);
    sdpa_tensor tw1 = tc_view3(w1, 2, 4, 7), tw2 = tc_view3(w2, 2, 4, 7);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to1, &tw1), SDPA_OK);
    o.dropout_p = 0.5f;
    o.dropout_seed = 7;
    o.dropout_offset = 3;
    o.training = 0;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to2, &tw2), SDPA_OK);
    assert_memory_equal(o1, o2, sizeof o1);
    assert_memory_equal(w1, w2, sizeof w1);
    layer_free(&ly);
}

static void mha_training_dropout_differs_and_reproduces(void **state) {
    (void)state;
    mcase c = base_case();
    c.L = 6; c.S = 9; c.bias_kv = 1; c.seed = 110;
    layer ly;
    layer_init(&ly, &c);
    enum { N = 2 * 6 * 8, NW = 2 * 2 * 6 * 10 };
    float ev[N], t1[N], t2[N], t3[N], wev[NW], w1[NW];
    sdpa_tensor tev = tc_view3(ev, 2, 6, 8), tt1 = tc_view3(t1, 2, 6, 8), tt2 = tc_view3(t2, 2, 6, 8);
    sdpa_tensor tt3 = tc_view3(t3, 2, 6, 8), twev = tc_view4(wev, 2, 2, 6, 10), tw1 = tc_view4(w1, 2, 2, 6, 10);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.per_head_weights = 1;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tev, &twev), SDPA_OK);
    o.training = 1;
    o.dropout_p = 0.3f;
    o.dropout_seed = 42;
    o.dropout_offset = 5;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tt1, NULL), SDPA_OK);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tt2, NULL), SDPA_OK);
    assert_memory_not_equal(ev, t1, sizeof ev);  /* dropout applied */
    assert_memory_equal(t1, t2, sizeof t1);      /* same (seed, offset): same bits */
    o.num_threads = 1;                           /* and whatever the thread count */
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tt2, NULL), SDPA_OK);
    assert_memory_equal(t1, t2, sizeof t1);
    o.dropout_offset = 6;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tt3, NULL), SDPA_OK);
    assert_memory_not_equal(t1, t3, sizeof t1);  /* a new offset: new mask */
    o.dropout_offset = 5;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tt3, &tw1), SDPA_OK);
    /* Returned weights are the pre-dropout probabilities. */
    for (int i = 0; i < NW; ++i)
        assert_float_equal(w1[i], wev[i], 1e-7);
    for (int i = 0; i < N; ++i)
        assert_true(isfinite(t1[i]));
    layer_free(&ly);
}

static void mha_empty_rows_follow_the_policy(void **state) {
    (void)state;
    mcase c = base_case();
    c.seed = 120;
    layer ly;
    layer_init(&ly, &c);
    const int64_t klen[2] = {5, 0}; /* batch 1 has no key */
    float out[2 * 4 * 8], w[2 * 4 * 5];
    sdpa_tensor to = tc_view3(out, 2, 4, 8), tw = tc_view3(w, 2, 4, 5);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.key_lengths = klen;
    tc_fill_canary(out, sizeof out);
    tc_fill_canary(w, sizeof w);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to, &tw), SDPA_ERR_EMPTY_ROW);
    assert_non_null(strstr(sdpa_last_error_message(), "sdpa_mha_forward"));
    assert_true(tc_is_canary(out, sizeof out) && tc_is_canary(w, sizeof w));
    /* Policy ZERO: attention rows 0, so those out rows are b_o (the projection of 0). */
    run_spec rs;
    spec_init(&rs, LAY_BATCH_FIRST, 1);
    rs.opt.key_lengths = klen;
    rs.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    rs.ref.klen = klen;
    run_and_compare(&ly, &rs);
    /* With an appended key no row is empty, whatever the masks say. */
    mcase c2 = c;
    c2.zero_attn = 1;
    layer l2;
    layer_init(&l2, &c2);
    float w2[2 * 4 * 6];
    sdpa_tensor tw2 = tc_view3(w2, 2, 4, 6);
    assert_int_equal(sdpa_mha_forward(&l2.p, tq(&l2), tk(&l2), tv(&l2), &o, &to, &tw2), SDPA_OK);
    for (int i = 0; i < 4; ++i)
        assert_float_equal(w2[(4 + i) * 6 + 5], 1.0f, 1e-6); /* batch 1: all weight on the zero key */
    layer_free(&l2);
    layer_free(&ly);
}

static void mha_non_finite_values(void **state) {
    (void)state;
    mcase c = base_case();
    c.bias_kv = 1; c.seed = 130;
    layer ly;
    layer_init(&ly, &c);
    float out[2 * 4 * 8], w[2 * 4 * 6];
    sdpa_tensor to = tc_view3(out, 2, 4, 8), tw = tc_view3(w, 2, 4, 6);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    struct {
        float *where;
        const char *name;
    } cases[] = {
        {sat(&ly.xq, 1, 2, 3), "query"},
        {sat(&ly.xk, 0, 4, 0), "key"},
        {sat(&ly.xv, 1, 0, 7), "value"},
        {ly.f_in + 5, "in_proj_weight (q rows)"},
        {ly.f_in + 8 * 8 + 9, "in_proj_weight (k rows)"},
        {ly.f_in + 2 * 8 * 8 + 1, "in_proj_weight (v rows)"},
        {ly.f_bin + 20, "in_proj_bias"},
        {ly.f_wo + 13, "out_proj_weight"},
        {ly.f_bo + 2, "out_proj_bias"},
        {ly.f_bk + 1, "bias_k"},
        {ly.f_bv + 6, "bias_v"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        const float saved = *cases[k].where;
        *cases[k].where = k % 2 ? INFINITY : NAN;
        tc_fill_canary(out, sizeof out);
        tc_fill_canary(w, sizeof w);
        sdpa_status st = sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to, &tw);
        if (st != SDPA_ERR_NON_FINITE)
            fail_msg("NaN/Inf in %s: got %s, expected SDPA_ERR_NON_FINITE", cases[k].name, sdpa_status_string(st));
        if (strstr(sdpa_last_error_message(), "attn_bias") != NULL) /* the mask case below */
            fail_msg("NaN/Inf in %s: %s", cases[k].name, sdpa_last_error_message());
        assert_true(tc_is_canary(out, sizeof out) && tc_is_canary(w, sizeof w));
        *cases[k].where = saved;
    }
    /* +Inf in the caller's float mask is named as that, not blamed on the projections. */
    {
        float bias[4 * 5] = {0};
        bias[2 * 5 + 3] = INFINITY;
        sdpa_tensor tb;
        const int64_t bs[2] = {4, 5};
        assert_int_equal(sdpa_tensor_init(&tb, bias, 2, bs), SDPA_OK);
        o.attn_bias = &tb;
        tc_fill_canary(out, sizeof out);
        assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to, &tw), SDPA_ERR_NON_FINITE);
        const char *m = sdpa_last_error_message();
        if (strstr(m, "options->attn_bias") == NULL || strstr(m, "projected q/k/v") != NULL)
            fail_msg("an Inf mask entry reported as: %s", m);
        assert_true(tc_is_canary(out, sizeof out));
        o.attn_bias = NULL;
    }
    /* NaN in a padded key (key padding mask) never reaches out: same bits as a finite value. */
    uint8_t allow[10] = {1, 1, 1, 1, 1, 1, 1, 0, 1, 1};
    const int64_t kshape[2] = {2, 5};
    sdpa_allow_mask kpm = tc_mask_view(allow, 2, kshape);
    o.key_padding_mask = &kpm;
    float ref_out[2 * 4 * 8], ref_w[2 * 4 * 6];
    sdpa_tensor tref = tc_view3(ref_out, 2, 4, 8), trefw = tc_view3(ref_w, 2, 4, 6);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &tref, &trefw), SDPA_OK);
    for (int e = 0; e < 8; ++e) {
        *sat(&ly.xk, 1, 2, e) = NAN;
        *sat(&ly.xv, 1, 2, e) = -INFINITY;
    }
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to, &tw), SDPA_OK);
    assert_memory_equal(out, ref_out, sizeof out);
    assert_memory_equal(w, ref_w, sizeof w);
    layer_free(&ly);
}

/* ------------------------------------------------------------ error table */

typedef struct err_env {
    layer ly;
    sdpa_mha_params p;
    sdpa_mha_options o;
    sdpa_tensor q, k, v;
    float out[2 * 4 * 8 + 64], w[2 * 4 * 5 + 64];
    sdpa_tensor to, tw;
} err_env;

static void env_reset(err_env *env) {
    env->p = env->ly.p;
    sdpa_mha_options_init(&env->o);
    env->q = *tq(&env->ly);
    env->k = *tk(&env->ly);
    env->v = *tv(&env->ly);
    env->to = tc_view3(env->out, 2, 4, 8);
    env->tw = tc_view3(env->w, 2, 4, 5);
    tc_fill_canary(env->out, sizeof env->out);
    tc_fill_canary(env->w, sizeof env->w);
}

static void expect_fail(err_env *env, sdpa_status want, const char *what, const char *needle) {
    sdpa_status st = sdpa_mha_forward(&env->p, &env->q, &env->k, &env->v, &env->o, &env->to, &env->tw);
    if (st != want)
        fail_msg("%s: got %s (%s), expected %s", what, sdpa_status_string(st), sdpa_last_error_message(),
                 sdpa_status_string(want));
    const char *msg = sdpa_last_error_message();
    if (msg[0] == '\0' || strstr(msg, "sdpa_mha_forward") == NULL || (needle && strstr(msg, needle) == NULL))
        fail_msg("%s: message \"%s\" should name sdpa_mha_forward and \"%s\"", what, msg, needle ? needle : "");
    if (!tc_is_canary(env->out, sizeof env->out) || !tc_is_canary(env->w, sizeof env->w))
        fail_msg("%s: failed with %s but wrote an output", what, sdpa_status_string(st));
    env_reset(env);
}

static void mha_every_error_family_leaves_outputs_untouched(void **state) {
    (void)state;
    err_env *env = xcalloc(1, sizeof *env);
    mcase c = base_case();
    c.packed = 0; c.seed = 140;
    layer_init(&env->ly, &c);
    env_reset(env);
    assert_int_equal(sdpa_mha_forward(&env->p, &env->q, &env->k, &env->v, &env->o, &env->to, &env->tw), SDPA_OK);
    env_reset(env);

    float junk[64 * 3] = {0};
    sdpa_tensor t_bad;
    uint8_t mbytes[64];
    memset(mbytes, 1, sizeof mbytes);

    /* NULL_POINTER */
    {
        sdpa_status st = sdpa_mha_forward(NULL, &env->q, &env->k, &env->v, NULL, &env->to, NULL);
        assert_int_equal(st, SDPA_ERR_NULL_POINTER);
        assert_true(tc_is_canary(env->out, sizeof env->out));
        st = sdpa_mha_forward(&env->p, NULL, &env->k, &env->v, NULL, &env->to, NULL);
        assert_int_equal(st, SDPA_ERR_NULL_POINTER);
        st = sdpa_mha_forward(&env->p, &env->q, &env->k, &env->v, NULL, NULL, NULL);
        assert_int_equal(st, SDPA_ERR_NULL_POINTER);
        assert_true(tc_is_canary(env->out, sizeof env->out));
    }
    env->p.out_proj_weight = NULL;
    expect_fail(env, SDPA_ERR_NULL_POINTER, "out_proj_weight NULL", "out_proj_weight");
    env->p.k_proj_weight = NULL;
    expect_fail(env, SDPA_ERR_NULL_POINTER, "k_proj_weight NULL", "k_proj_weight");
    env->p.bias_k = env->ly.p.q_proj_weight; /* bias_v missing */
    expect_fail(env, SDPA_ERR_NULL_POINTER, "bias_k without bias_v", "bias_v");
    env->q.data = NULL;
    expect_fail(env, SDPA_ERR_NULL_POINTER, "query data NULL", "query");

    /* STRUCT_VERSION */
    env->p.struct_size = sizeof env->p - 8;
    expect_fail(env, SDPA_ERR_STRUCT_VERSION, "params struct_size too small", "struct_size");
    env->o.struct_size = 16;
    expect_fail(env, SDPA_ERR_STRUCT_VERSION, "options struct_size too small", "struct_size");
    env->o.struct_size = 100000;
    expect_fail(env, SDPA_ERR_STRUCT_VERSION, "options struct_size too large", "struct_size");

    /* RANK */
    {
        int64_t s4[4] = {2, 1, 4, 8};
        assert_int_equal(sdpa_tensor_init(&env->q, env->ly.xq.base, 4, s4), SDPA_OK);
        expect_fail(env, SDPA_ERR_RANK, "query rank 4", "query");
        env->tw = tc_view4(env->w, 2, 1, 4, 5);
        expect_fail(env, SDPA_ERR_RANK, "averaged weights of rank 4", "attn_weights");
        env->o.per_head_weights = 1; /* per head needs rank 4 */
        expect_fail(env, SDPA_ERR_RANK, "per-head weights of rank 3", "attn_weights");
        const int64_t ks[1] = {5};
        sdpa_allow_mask m1 = tc_mask_view(mbytes, 1, ks);
        env->o.key_padding_mask = &m1;
        expect_fail(env, SDPA_ERR_RANK, "key_padding_mask rank 1", "key_padding_mask");
    }

    /* SHAPE */
    env->p.embed_dim = 9;
    expect_fail(env, SDPA_ERR_SHAPE, "E % H != 0", "divisible");
    env->p.num_kv_heads = 3;
    expect_fail(env, SDPA_ERR_SHAPE, "H % Hkv != 0", "num_kv_heads");
    env->p.in_proj_weight = env->ly.p.q_proj_weight;
    env->p.q_proj_weight = env->p.k_proj_weight = env->p.v_proj_weight = NULL;
    env->p.head_dim = 2; /* H * Dh = 4 != E */
    expect_fail(env, SDPA_ERR_SHAPE, "packed weights with H*Dh != E", "packed");
    {
        sdpa_tensor w = mat(junk, 8, 7);
        env->p.k_proj_weight = &w;
        expect_fail(env, SDPA_ERR_SHAPE, "k_proj_weight [8, 7]", "k_proj_weight");
        sdpa_tensor b = vec(junk, 23);
        env->p.in_proj_bias = &b;
        expect_fail(env, SDPA_ERR_SHAPE, "in_proj_bias [23]", "in_proj_bias");
        sdpa_tensor ob = vec(junk, 9);
        env->p.out_proj_bias = &ob;
        expect_fail(env, SDPA_ERR_SHAPE, "out_proj_bias [9]", "out_proj_bias");
        sdpa_tensor wo = mat(junk, 8, 4);
        env->p.out_proj_weight = &wo;
        expect_fail(env, SDPA_ERR_SHAPE, "out_proj_weight [8, 4]", "out_proj_weight");
        const int64_t bks[3] = {2, 1, 8};
        sdpa_tensor bk;
        assert_int_equal(sdpa_tensor_init(&bk, junk, 3, bks), SDPA_OK);
        env->p.bias_k = env->p.bias_v = &bk;
        expect_fail(env, SDPA_ERR_SHAPE, "bias_k [2, 1, 8]", "bias_k has shape [2, 1, 8]");
    }
    env->k.shape[2] = 7;
    expect_fail(env, SDPA_ERR_SHAPE, "key width != kdim", "key");
    env->v.shape[1] = 4;
    expect_fail(env, SDPA_ERR_SHAPE, "value S != key S", "value");
    env->k.shape[0] = 1;
    expect_fail(env, SDPA_ERR_SHAPE, "key B != query B", "key");
    env->to = tc_view3(env->out, 2, 4, 7);
    expect_fail(env, SDPA_ERR_SHAPE, "out [2, 4, 7]", "out");
    env->tw = tc_view3(env->w, 2, 4, 6);
    expect_fail(env, SDPA_ERR_SHAPE, "weights S' = 6 without appended keys", "attn_weights");
    {
        const int64_t ks[2] = {2, 4};
        sdpa_allow_mask m = tc_mask_view(mbytes, 2, ks);
        env->o.key_padding_mask = &m;
        expect_fail(env, SDPA_ERR_SHAPE, "key_padding_mask [2, 4]", "key_padding_mask");
    }

    /* BROADCAST */
    {
        const int64_t ms[2] = {3, 5};
        sdpa_allow_mask m = tc_mask_view(mbytes, 2, ms);
        env->o.attn_mask = &m;
        expect_fail(env, SDPA_ERR_BROADCAST, "attn_mask [3, 5] with L = 4", "attn_mask");
        const int64_t bs[3] = {3, 4, 5};
        assert_int_equal(sdpa_tensor_init(&t_bad, junk, 3, bs), SDPA_OK);
        env->o.attn_bias = &t_bad;
        expect_fail(env, SDPA_ERR_BROADCAST, "attn_bias [3, 4, 5] with H = 2", "attn_bias");
    }

    /* STRIDE */
    env->to.strides[1] = 0;
    expect_fail(env, SDPA_ERR_STRIDE, "out stride 0", "out");
    env->tw.strides[2] = 2; /* weights overlap themselves: [2, 4, 5] with row stride 5 and col stride 2 */
    expect_fail(env, SDPA_ERR_STRIDE, "weights overlapping itself", "attn_weights");

    /* OVERLAP */
    env->to.data = env->ly.xq.base;
    expect_fail(env, SDPA_ERR_OVERLAP, "out over query", "query");
    env->tw.data = env->out + 8;
    expect_fail(env, SDPA_ERR_OVERLAP, "weights over out", "attn_weights");
    env->to.data = env->ly.f_wo;
    expect_fail(env, SDPA_ERR_OVERLAP, "out over out_proj_weight", "out_proj_weight");
    env->o.workspace = env->ly.f_wq;
    env->o.workspace_bytes = 1u << 20;
    expect_fail(env, SDPA_ERR_OVERLAP, "workspace over q_proj_weight", "workspace");
    env->o.workspace = env->w; /* the caller's workspace is the weights buffer */
    env->o.workspace_bytes = 64;
    expect_fail(env, SDPA_ERR_OVERLAP, "workspace over attn_weights", "workspace");

    /* DTYPE */
    env->q.dtype = SDPA_DTYPE_F16;
    expect_fail(env, SDPA_ERR_DTYPE, "query float16", "query");
    t_bad = *env->ly.p.out_proj_weight;
    t_bad.dtype = SDPA_DTYPE_BF16;
    env->p.out_proj_weight = &t_bad;
    expect_fail(env, SDPA_ERR_DTYPE, "out_proj_weight bf16", "out_proj_weight");

    /* INVALID_ARGUMENT */
    env->o.causal = 2;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "causal = 2", "causal");
    env->o.training = -1;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "training = -1", "training");
    env->o.per_head_weights = 2;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "per_head_weights = 2", "per_head_weights");
    env->o.dropout_p = 1.0f;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "dropout_p = 1", "dropout_p");
    env->o.dropout_p = NAN;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "dropout_p = NaN", "dropout_p");
    env->o.empty_rows = 7;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "empty_rows = 7", "empty_rows");
    env->o.num_threads = -2;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "num_threads = -2", "num_threads");
    {
        const int64_t bad_k[2] = {5, 6}, bad_q[2] = {-1, 2};
        env->o.key_lengths = bad_k;
        expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "key_lengths 6 > S", "key_lengths");
        env->o.query_lengths = bad_q;
        expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "query_lengths -1", "query_lengths");
    }
    env->p.num_heads = 0;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "num_heads = 0", "num_heads");
    env->p.head_dim = -4;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "head_dim = -4", "head_dim");
    env->p.add_zero_attn = 2;
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "add_zero_attn = 2", "add_zero_attn");
    env->p.reserved0 = 1; /* a later version's field: reported like unknown tail bytes */
    expect_fail(env, SDPA_ERR_STRUCT_VERSION, "params reserved0", "reserved0");
    env->p.in_proj_weight = env->ly.p.q_proj_weight; /* and the separate ones too */
    expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "packed and separate weights", "both");
    {
        sdpa_allow_mask m = tc_mask_view(mbytes, 1, (const int64_t[1]){5});
        m.reserved0 = 3;
        env->o.attn_mask = &m;
        expect_fail(env, SDPA_ERR_INVALID_ARGUMENT, "attn_mask reserved0", "attn_mask");
    }

    /* EMPTY_DIMENSION, SIZE_OVERFLOW */
    env->p.embed_dim = 0;
    expect_fail(env, SDPA_ERR_EMPTY_DIMENSION, "embed_dim = 0", "embed_dim");
    env->p.head_dim = INT64_MAX / 2 + 1;
    expect_fail(env, SDPA_ERR_SIZE_OVERFLOW, "H * head_dim overflows", "overflow");

    /* EMPTY_ROW and NON_FINITE come after the projections: still nothing written. */
    {
        const int64_t klen[2] = {0, 5};
        env->o.key_lengths = klen;
        expect_fail(env, SDPA_ERR_EMPTY_ROW, "batch 0 without keys", "no allowed key");
        const float saved = *sat(&env->ly.xq, 0, 0, 0);
        *sat(&env->ly.xq, 0, 0, 0) = NAN;
        expect_fail(env, SDPA_ERR_NON_FINITE, "NaN query", "NaN");
        *sat(&env->ly.xq, 0, 0, 0) = saved;
    }

    /* WORKSPACE_TOO_SMALL */
    {
        size_t need = 0;
        assert_int_equal(sdpa_mha_workspace_size(&env->p, &env->q, &env->k, &env->v, &env->o, 1, &need), SDPA_OK);
        void *ws = malloc(need);
        assert_non_null(ws);
        env->o.workspace = ws;
        env->o.workspace_bytes = need - 1;
        expect_fail(env, SDPA_ERR_WORKSPACE_TOO_SMALL, "workspace one byte short", "workspace");
        free(ws);
    }
    layer_free(&env->ly);
    free(env);
}

static void mha_workspace_query_and_caller_workspace(void **state) {
    (void)state;
    mcase c = base_case();
    c.bias_kv = 1; c.zero_attn = 1; c.in_layout = LAY_SLICE; c.seed = 150;
    layer ly;
    layer_init(&ly, &c);
    const uint8_t allow[5] = {1, 1, 0, 1, 1};
    uint8_t kp[10];
    memcpy(kp, allow, 5);
    memcpy(kp + 5, allow, 5);
    const int64_t kshape[2] = {2, 5}, amshape[1] = {5};
    sdpa_allow_mask kpm = tc_mask_view(kp, 2, kshape), am = tc_mask_view(allow, 1, amshape);
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.key_padding_mask = &kpm;
    o.attn_mask = &am;
    o.causal = 1;
    size_t with_w = 0, without_w = 0, per_head = 0;
    assert_int_equal(sdpa_mha_workspace_size(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, 1, &with_w), SDPA_OK);
    assert_int_equal(sdpa_mha_workspace_size(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, 0, &without_w), SDPA_OK);
    o.per_head_weights = 1;
    assert_int_equal(sdpa_mha_workspace_size(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, 1, &per_head), SDPA_OK);
    o.per_head_weights = 0;
    /* Averaged weights need the per-head probabilities [B, H, L, S'] in the workspace. */
    print_message("  workspace: %zu bytes without weights, %zu averaged, %zu per head\n", without_w, with_w, per_head);
    assert_true(without_w > 0);
    assert_true(with_w >= per_head + 2 * 2 * 4 * 7 * sizeof(float));
    assert_int_equal(sdpa_mha_workspace_size(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, 1, NULL), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_mha_workspace_size(NULL, tq(&ly), tk(&ly), tv(&ly), &o, 1, &with_w), SDPA_ERR_NULL_POINTER);

    float o1[64], o2[64], w1[56], w2[56];
    sdpa_tensor to1 = tc_view3(o1, 2, 4, 8), to2 = tc_view3(o2, 2, 4, 8);
    sdpa_tensor tw1 = tc_view3(w1, 2, 4, 7), tw2 = tc_view3(w2, 2, 4, 7);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to1, &tw1), SDPA_OK);
    /* An exactly sized caller buffer at an odd address: the same bits. */
    unsigned char *ws = malloc(with_w + 1);
    assert_non_null(ws);
    memset(ws, 0xFF, with_w + 1);
    o.workspace = ws + 1;
    o.workspace_bytes = with_w;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to2, &tw2), SDPA_OK);
    assert_memory_equal(o1, o2, sizeof o1);
    assert_memory_equal(w1, w2, sizeof w1);
    assert_int_equal(ws[0], 0xFF); /* nothing before the buffer was touched */
    /* One byte less: refused before anything is written. */
    tc_fill_canary(o2, sizeof o2);
    o.workspace_bytes = with_w - 1;
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), &o, &to2, &tw2), SDPA_ERR_WORKSPACE_TOO_SMALL);
    assert_true(tc_is_canary(o2, sizeof o2));
    free(ws);
    /* Shape errors come from the size query too. */
    sdpa_mha_params p = ly.p;
    p.num_heads = 3;
    assert_int_equal(sdpa_mha_workspace_size(&p, tq(&ly), tk(&ly), tv(&ly), NULL, 0, &with_w), SDPA_ERR_SHAPE);
    layer_free(&ly);
}

static void mha_struct_size_rules(void **state) {
    (void)state;
    /* init_sized zeroes exactly struct_size bytes and records it. */
    union {
        sdpa_mha_params p;
        unsigned char b[sizeof(sdpa_mha_params) + 32];
    } u;
    unsigned char *buf = u.b;
    memset(buf, 0xAB, sizeof u.b);
    sdpa_mha_params_init_sized(&u.p, sizeof(sdpa_mha_params) + 16);
    for (size_t i = sizeof(size_t); i < sizeof(sdpa_mha_params) + 16; ++i)
        assert_int_equal(buf[i], 0);
    assert_int_equal(buf[sizeof(sdpa_mha_params) + 16], 0xAB);
    size_t sz;
    memcpy(&sz, buf, sizeof sz);
    assert_int_equal(sz, sizeof(sdpa_mha_params) + 16);
    sdpa_mha_params_init_sized(NULL, 64);
    sdpa_mha_options_init_sized(NULL, 64);
    sdpa_mha_options oo;
    memset(&oo, 0xCD, sizeof oo);
    sdpa_mha_options_init(&oo);
    assert_int_equal(oo.struct_size, sizeof oo);
    assert_null(oo.attn_mask);
    assert_int_equal(oo.training, 0);
    assert_true(oo.dropout_p == 0.0f);

    mcase c = base_case();
    c.seed = 160;
    layer ly;
    layer_init(&ly, &c);
    float o1[64], o2[64];
    sdpa_tensor to1 = tc_view3(o1, 2, 4, 8), to2 = tc_view3(o2, 2, 4, 8);
    assert_int_equal(sdpa_mha_forward(&ly.p, tq(&ly), tk(&ly), tv(&ly), NULL, &to1, NULL), SDPA_OK);
    /* A newer caller's larger structs with zero tails mean the same call. */
    struct {
        sdpa_mha_params p;
        unsigned char tail[24];
    } bigp;
    struct {
        sdpa_mha_options o;
        unsigned char tail[24];
    } bigo;
    memset(&bigp, 0, sizeof bigp);
    memset(&bigo, 0, sizeof bigo);
    bigp.p = ly.p;
    bigp.p.struct_size = sizeof bigp;
    sdpa_mha_options_init_sized(&bigo.o, sizeof bigo);
    assert_int_equal(sdpa_mha_forward(&bigp.p, tq(&ly), tk(&ly), tv(&ly), &bigo.o, &to2, NULL), SDPA_OK);
    assert_memory_equal(o1, o2, sizeof o1);
    /* ... but a tail byte this library does not know is refused. */
    tc_fill_canary(o2, sizeof o2);
    bigp.tail[5] = 1;
    assert_int_equal(sdpa_mha_forward(&bigp.p, tq(&ly), tk(&ly), tv(&ly), &bigo.o, &to2, NULL), SDPA_ERR_STRUCT_VERSION);
    assert_non_null(strstr(sdpa_last_error_message(), "params"));
    bigp.tail[5] = 0;
    bigo.tail[23] = 9;
    assert_int_equal(sdpa_mha_forward(&bigp.p, tq(&ly), tk(&ly), tv(&ly), &bigo.o, &to2, NULL), SDPA_ERR_STRUCT_VERSION);
    assert_non_null(strstr(sdpa_last_error_message(), "options"));
    assert_true(tc_is_canary(o2, sizeof o2));
    layer_free(&ly);
}

static void mha_empty_batch_and_query_succeed(void **state) {
    (void)state;
    mcase c = base_case();
    c.seed = 170;
    layer ly;
    layer_init(&ly, &c);
    float out[8];
    tc_fill_canary(out, sizeof out);
    sdpa_tensor q0 = *tq(&ly), k0 = *tk(&ly), v0 = *tv(&ly), to = tc_view3(out, 2, 0, 8);
    q0.shape[1] = 0;
    assert_int_equal(sdpa_mha_forward(&ly.p, &q0, tk(&ly), tv(&ly), NULL, &to, NULL), SDPA_OK);
    q0 = *tq(&ly);
    q0.shape[0] = k0.shape[0] = v0.shape[0] = 0;
    to = tc_view3(out, 0, 4, 8);
    assert_int_equal(sdpa_mha_forward(&ly.p, &q0, &k0, &v0, NULL, &to, NULL), SDPA_OK);
    assert_true(tc_is_canary(out, sizeof out));
    layer_free(&ly);
}

/* Larger sizes and the default thread count: the single-GEMM paths with real BLAS blocking. */
static void mha_larger_problem_matches_reference(void **state) {
    (void)state;
    mcase c = base_case();
    c.B = 3; c.L = 37; c.S = 45; c.E = 48; c.H = 6; c.kdim = 40; c.vdim = 24; c.packed = 0;
    c.bias_kv = 1; c.zero_attn = 1; c.in_layout = LAY_SEQ_FIRST; c.seed = 180;
    layer ly;
    layer_init(&ly, &c);
    const int64_t klen[3] = {45, 20, 1}, qlen[3] = {37, 30, 5};
    run_spec rs;
    spec_init(&rs, LAY_SEQ_FIRST, 1);
    rs.opt.key_lengths = klen;
    rs.opt.query_lengths = qlen;
    rs.opt.causal = 1;
    rs.ref.klen = klen;
    rs.ref.qlen = qlen;
    rs.ref.causal = 1;
    run_and_compare(&ly, &rs);
    layer_free(&ly);
    print_message("  B=3 L=37 S=45 E=48 H=6: max |lib - ref| = %.3g\n", g_max_err);
}

/* Finite inputs whose output projection overflows float32 in its partial sums (v = 3.2e38 per
 * element, out_proj rows +1 on one half and -1 on the other: the float32 sum is inf - inf = NaN,
 * the exact answer 0) are recomputed in double: out is exactly 0, never NaN or Inf. A row whose
 * true value is beyond float32 is +inf. Found by a new-user trial (0.3). */
static void mha_out_projection_overflow_is_recomputed_in_double(void **state)
{
    (void)state;
    enum { E = 8, H = 2, B = 1, L = 3 };
    static float w_in[3 * E * E], w_out[E * E], x[B * L * E], out[B * L * E];
    memset(w_in, 0, sizeof w_in);
    for (int r = 2 * E; r < 3 * E; ++r) /* v = x W_v^T = 8 * 4e37 = 3.2e38 per element */
        for (int c = 0; c < E; ++c)
            w_in[r * E + c] = 4e37f;
    for (int r = 0; r < E; ++r)
        for (int c = 0; c < E; ++c)
            w_out[r * E + c] = r == E - 1 ? 1.0f : (c < E / 2 ? 1.0f : -1.0f);
    for (int t = 0; t < B * L * E; ++t)
        x[t] = 1.0f;
    sdpa_tensor tw_in, tw_out, tx, tout;
    const int64_t s_in[2] = {3 * E, E}, s_out[2] = {E, E};
    assert_int_equal(sdpa_tensor_init(&tw_in, w_in, 2, s_in), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tw_out, w_out, 2, s_out), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&tx, x, B, L, E), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&tout, out, B, L, E), SDPA_OK);
    sdpa_mha_params prm;
    sdpa_mha_params_init(&prm);
    prm.embed_dim = E;
    prm.num_heads = H;
    prm.in_proj_weight = &tw_in;
    prm.out_proj_weight = &tw_out;
    sdpa_status st = sdpa_mha_forward(&prm, &tx, &tx, &tx, NULL, &tout, NULL);
    if (st != SDPA_OK) {
        fail_msg("sdpa_mha_forward: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    for (int i = 0; i < L; ++i)
        for (int e = 0; e < E; ++e) {
            const float got = out[i * E + e];
            if (e < E - 1 ? got != 0.0f : !(isinf(got) && got > 0)) {
                fail_msg("out[%d][%d] = %g, expected %s", i, e, (double)got, e < E - 1 ? "0 exactly" : "+inf (8 * 3.2e38)");
            }
        }
}

/* The double-precision recomputation of an overflowing output-projection row keeps
 * out_proj_bias: with v = 3.2e38 per element, W_o rows of +1/-1 halves and a last row of +1
 * (its element is +inf, so the row is recomputed), each output element equals the double sum
 * W_o v + b_o rounded to float32, the bias included. */
static void mha_out_projection_overflow_keeps_the_bias(void **state)
{
    (void)state;
    enum { E = 8, H = 2, B = 2, L = 3 };
    static float w_in[3 * E * E], w_out[E * E], x[B * L * E], out[B * L * E], b_out[E];
    memset(w_in, 0, sizeof w_in);
    for (int r = 2 * E; r < 3 * E; ++r)
        for (int c = 0; c < E; ++c)
            w_in[r * E + c] = 4e37f;
    for (int r = 0; r < E; ++r) {
        for (int c = 0; c < E; ++c) /* the last row sums to +inf: that forces the recomputation */
            w_out[r * E + c] = r == E - 1 || c < E / 2 ? 1.0f : -1.0f;
        /* -3e30 .. 4e30 (0 included): large enough to survive next to the 6.4e38 partial sums
         * of a double accumulation (their ulp is ~1.4e23), small enough to stay finite */
        b_out[r] = 1e30f * (float)(r - 3);
    }
    for (int t = 0; t < B * L * E; ++t)
        x[t] = 1.0f;
    sdpa_tensor tw_in, tw_out, tx, tout, tb;
    const int64_t s_in[2] = {3 * E, E}, s_out[2] = {E, E}, s_b[1] = {E};
    assert_int_equal(sdpa_tensor_init(&tw_in, w_in, 2, s_in), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tw_out, w_out, 2, s_out), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tb, b_out, 1, s_b), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&tx, x, B, L, E), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&tout, out, B, L, E), SDPA_OK);
    sdpa_mha_params prm;
    sdpa_mha_params_init(&prm);
    prm.embed_dim = E;
    prm.num_heads = H;
    prm.in_proj_weight = &tw_in;
    prm.out_proj_weight = &tw_out;
    prm.out_proj_bias = &tb;
    sdpa_status st = sdpa_mha_forward(&prm, &tx, &tx, &tx, NULL, &tout, NULL);
    if (st != SDPA_OK) {
        fail_msg("sdpa_mha_forward: %s (%s)", sdpa_status_string(st), sdpa_last_error_message());
    }
    for (int t = 0; t < B * L; ++t)
        for (int e = 0; e < E; ++e) {
            /* v = 3.2e38 in every element: sum_c W_o[e][c] v = 4 * 3.2e38 - 4 * 3.2e38 = 0 */
            double acc = (double)b_out[e];
            for (int c = 0; c < E; ++c)
                acc += (double)w_out[e * E + c] * (double)(8.0f * 4e37f);
            const float want = (float)acc;
            if (out[t * E + e] != want) {
                fail_msg("out row %d [%d] = %.9g, expected the double result %.9g (bias %.9g included)", t, e,
                         (double)out[t * E + e], (double)want, (double)b_out[e]);
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mha_self_attention_packed_matches_reference),
        cmocka_unit_test(mha_cross_attention_kdim_vdim_key_padding),
        cmocka_unit_test(mha_bias_kv_zero_attn_with_masks),
        cmocka_unit_test(mha_averaged_weights_are_head_mean_and_rows_sum_to_one),
        cmocka_unit_test(mha_without_biases_matches_reference),
        cmocka_unit_test(mha_seq_first_buffers_through_strides),
        cmocka_unit_test(mha_gqa_matches_reference),
        cmocka_unit_test(mha_gqa_equals_repeated_kv_projection),
        cmocka_unit_test(mha_weight_views_with_any_strides),
        cmocka_unit_test(mha_causal_matches_reference),
        cmocka_unit_test(mha_query_lengths_give_exact_zero_rows),
        cmocka_unit_test(mha_eval_ignores_dropout_bit_for_bit),
        cmocka_unit_test(mha_training_dropout_differs_and_reproduces),
        cmocka_unit_test(mha_empty_rows_follow_the_policy),
        cmocka_unit_test(mha_non_finite_values),
        cmocka_unit_test(mha_every_error_family_leaves_outputs_untouched),
        cmocka_unit_test(mha_workspace_query_and_caller_workspace),
        cmocka_unit_test(mha_struct_size_rules),
        cmocka_unit_test(mha_empty_batch_and_query_succeed),
        cmocka_unit_test(mha_larger_problem_matches_reference),
        cmocka_unit_test(mha_out_projection_overflow_is_recomputed_in_double),
        cmocka_unit_test(mha_out_projection_overflow_keeps_the_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
