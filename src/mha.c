/* The multi-head attention layer (torch.nn.MultiheadAttention, batch_first=True, and the
 * Llama-style GQA variant): validate -> project -> attention (the internal entries behind
 * sdpa_attention: sdpa__plan_make, sdpa__attention_planned) -> output projection.
 *
 * Data flow, all inside one workspace (caller's or allocated here and freed before return):
 *   Qp [B*L, Dq], Kp/Vp [B*S', Dkv]: one GEMM each over all rows (y = x W^T + b) through the
 *     matmul core. The rows of an input are taken in the order its strides give them: b-major
 *     ([B, L, E] buffers) or sequence-major (PyTorch batch_first=False [L, B, E] buffers), so
 *     both need one GEMM and no copy. Only an input whose rows fit neither order (a slice of
 *     a longer buffer) is projected batch by batch. The appended keys (bias_k, zero row) are
 *     rows S.. of Kp/Vp: in sequence-major order they follow the projected rows; in b-major
 *     order the projected rows are moved apart in place to make room.
 *   Heads are strided views into Qp/Kp/Vp (head h = columns h*Dh .. h*Dh+Dh-1), handed to
 *     sdpa_attention with its workspace carved from ours. Its output Ao [B*L, Dq] is laid out
 *     in the row order of `out`, so the output projection is again one GEMM written straight
 *     into `out` (or, for unusual `out` strides, blocks of 64 rows through a small buffer).
 *   Masks: passed through as views where possible; with appended keys (which every query may
 *     attend) or with both attn_mask and key_padding_mask, one uint8 mask [B?, H?, L?, S'] is
 *     built in the workspace (a dimension is kept only if some rule varies along it), and an
 *     attn_bias is copied with zero columns for the appended keys.
 * Nothing is written to `out` or `attn_weights` before every check (including the empty-row
 * and finite checks of sdpa_attention over the projected heads) has passed. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MHA_PARAMS_V1_SIZE (offsetof(sdpa_mha_params, reserved0) + sizeof(int32_t))
#define MHA_OPTIONS_V1_SIZE (offsetof(sdpa_mha_options, workspace_bytes) + sizeof(size_t))
#define MHA_ALIGN 64u
#define MHA_OUT_BLOCK 64 /* rows per block of the output projection through a buffer */

/* How the rows (b, n) of a [B, N, W] input are walked by one GEMM. */
enum { ORDER_B = 0, ORDER_N = 1, ORDER_BATCH = 2 };

/* How the attention gets its allow-mask. */
enum { MASK_NONE = 0, MASK_ATTN = 1, MASK_KPM = 2, MASK_BUILD = 3 };

/* Workspace regions, in this order. */
enum { R_Q, R_K, R_V, R_AO, R_WH, R_MASK, R_BIAS, R_TMP, R_PACK, R_ATTN, R_COUNT };

/* One input projection Y = X W^T + b over a [B, N, in] view X. */
typedef struct mha_proj {
    const sdpa_tensor *x; /* [B, N, in] */
    sdpa__mat wt;         /* W^T as a logical [in, out] matrix */
    const float *bias;    /* [out] with stride bias_stride, NULL = none */
    int64_t bias_stride;
    int64_t N, Np;        /* rows per batch in X, rows per batch in Y (N + appended keys) */
    int64_t in, out;
    int order;            /* ORDER_* */
    int64_t yb, yn;       /* strides (elements) of Y's batch and row axes; columns contiguous */
    bool expand;          /* b-major GEMM into compact rows, then moved to batch stride Np*out */
} mha_proj;

typedef struct mha_plan {
    const char *fn;
    sdpa_mha_params p;
    sdpa_mha_options o;
    int64_t B, L, S, X, Sp, E, H, Hkv, Dh, Dq, Dkv, kdim, vdim;
    const sdpa_tensor *query, *key, *value;
    mha_proj pq, pk, pv;
    sdpa__mat wot; /* W_o^T [Dq, E] */
    const float *bo;
    int64_t bo_stride;
    const float *bias_k, *bias_v;
    int64_t bias_k_stride, bias_v_stride;
    bool want_weights, per_head, avg_weights;
    /* masks over [B, H, L, S] (broadcast strides) */
    bool has_am, has_kpm, has_ab;
    int64_t am_strides[4], kpm_strides[2], ab_strides[4];
    int mask_mode;
    bool mask_causal, mask_klen; /* folded into the built mask (else passed as options) */
    int64_t mshape[4];
    bool build_bias;
    int64_t bshape[4];
    size_t reg_off[R_COUNT], reg_size[R_COUNT], total; /* bytes; total includes alignment slack */
} mha_plan;

/* --------------------------------------------------------------- structs */

SDPA_API void sdpa_mha_params_init_sized(sdpa_mha_params *params, size_t struct_size) {
    if (params == NULL || struct_size < sizeof(size_t))
        return;
    memset(params, 0, struct_size);
    params->struct_size = struct_size;
}

SDPA_API void sdpa_mha_options_init_sized(sdpa_mha_options *options, size_t struct_size) {
    if (options == NULL || struct_size < sizeof(size_t))
        return;
    memset(options, 0, struct_size);
    options->struct_size = struct_size;
}

/* ------------------------------------------------------------ validation */

static sdpa_status check_matrix(const char *fn, const char *name, const sdpa_tensor *t, int64_t rows,
                                const char *rows_name, int64_t cols, const char *cols_name) {
    sdpa_status st = sdpa__check_tensor(t, fn, name, 2, 2);
    if (st != SDPA_OK)
        return st;
    if (t->shape[0] != rows || t->shape[1] != cols)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape=[%lld, %lld], expected [%s=%lld, %s=%lld]", fn, name,
                          (long long)t->shape[0], (long long)t->shape[1], rows_name, (long long)rows, cols_name,
                          (long long)cols);
    return SDPA_OK;
}

static sdpa_status check_vector(const char *fn, const char *name, const sdpa_tensor *t, int64_t n,
                                const char *n_name) {
    sdpa_status st = sdpa__check_tensor(t, fn, name, 1, 1);
    if (st != SDPA_OK)
        return st;
    if (t->shape[0] != n)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape=[%lld], expected [%s=%lld]", fn, name, (long long)t->shape[0],
                          n_name, (long long)n);
    return SDPA_OK;
}

/* bias_k / bias_v: any rank, last size Dkv, all others 1 (PyTorch [1, 1, Dkv]). */
static sdpa_status check_bias_kv(const char *fn, const char *name, const sdpa_tensor *t, int64_t Dkv,
                                 const float **data, int64_t *stride) {
    sdpa_status st = sdpa__check_tensor(t, fn, name, 1, SDPA_MAX_RANK);
    if (st != SDPA_OK)
        return st;
    for (int32_t d = 0; d < t->rank; ++d) {
        int64_t want = d == t->rank - 1 ? Dkv : 1;
        if (t->shape[d] != want) {
            char shape[SDPA_MAX_RANK * 22 + 2];
            int at = 0;
            for (int32_t x = 0; x < t->rank; ++x)
                at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%lld", x ? ", " : "", (long long)t->shape[x]);
            return sdpa__fail(SDPA_ERR_SHAPE,
                              "%s: %s has shape [%s], expected [1, 1, Dkv=%lld] (any rank: the last size Dkv, the "
                              "others 1); shape[%d]=%lld should be %lld",
                              fn, name, shape, (long long)Dkv, (int)d, (long long)t->shape[d], (long long)want);
        }
    }
    *data = (const float *)t->data;
    *stride = t->strides[t->rank - 1];
    return SDPA_OK;
}

static sdpa_status check_input(const char *fn, const char *name, const sdpa_tensor *t, int64_t B, int64_t width,
                               const char *width_name) {
    sdpa_status st = sdpa__check_tensor(t, fn, name, 3, 3);
    if (st != SDPA_OK)
        return st;
    if (t->shape[0] != B)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[0]=%lld does not match query.shape[0]=B=%lld", fn, name,
                          (long long)t->shape[0], (long long)B);
    if (t->shape[2] != width)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[2]=%lld, expected %s=%lld", fn, name, (long long)t->shape[2],
                          width_name, (long long)width);
    return SDPA_OK;
}

static sdpa_status check_flag(const char *fn, const char *name, int32_t v) {
    if (v != 0 && v != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s=%d must be 0 or 1", fn, name, (int)v);
    return SDPA_OK;
}

static sdpa_status check_lengths(const char *fn, const int64_t *len, int64_t B, int64_t max, const char *name,
                                 const char *bound) {
    if (len == NULL)
        return SDPA_OK;
    for (int64_t b = 0; b < B; ++b)
        if (len[b] < 0 || len[b] > max)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->%s[%lld]=%lld is outside [0, %s=%lld]", fn,
                              name, (long long)b, (long long)len[b], bound, (long long)max);
    return SDPA_OK;
}

static int64_t numel(const sdpa_tensor *t) {
    int64_t n = 1;
    for (int32_t d = 0; d < t->rank; ++d)
        n *= t->shape[d];
    return n;
}

/* Row order of a [B, N, W] view for one GEMM over all B*N rows (see the ORDER_* enum). */
static int row_order(int64_t B, int64_t N, int64_t sb, int64_t sn) {
    if (B <= 1 || N <= 1 || sb == N * sn)
        return ORDER_B;
    if (sn == B * sb)
        return ORDER_N;
    return ORDER_BATCH;
}

static void make_proj(mha_proj *pr, const sdpa_tensor *x, const sdpa_tensor *w, int64_t w_row0, const sdpa_tensor *bias,
                      int64_t bias0, int64_t B, int64_t Np, int64_t out) {
    pr->x = x;
    pr->N = x->shape[1];
    pr->Np = Np;
    pr->in = x->shape[2];
    pr->out = out;
    /* W rows w_row0 .. w_row0+out-1 of [*, in]; W^T[r, c] = W[w_row0 + c, r]. */
    pr->wt.data = (float *)w->data + w_row0 * w->strides[0];
    pr->wt.rows = pr->in;
    pr->wt.cols = out;
    pr->wt.row_stride = w->strides[1];
    pr->wt.col_stride = w->strides[0];
    pr->bias = bias ? (const float *)bias->data + bias0 * bias->strides[0] : NULL;
    pr->bias_stride = bias ? bias->strides[0] : 0;
    pr->order = row_order(B, pr->N, x->strides[0], x->strides[1]);
    if (pr->order == ORDER_N) {
        pr->yb = out;
        pr->yn = B * out;
    } else {
        pr->yb = Np * out;
        pr->yn = out;
    }
    pr->expand = pr->order == ORDER_B && B > 1 && pr->N > 1 && Np != pr->N;
}

/* A (the input rows) of the GEMM for batch b (ORDER_BATCH) or of the single GEMM. */
static sdpa__mat proj_a(const mha_proj *pr, int64_t B, int64_t b) {
    const sdpa_tensor *x = pr->x;
    sdpa__mat a;
    /* An empty input (S = 0) may have NULL data: no arithmetic on it (UB even for + 0). */
    a.data = x->data == NULL ? NULL : (float *)x->data + (pr->order == ORDER_BATCH ? b * x->strides[0] : 0);
    a.cols = pr->in;
    a.col_stride = x->strides[2];
    if (pr->order == ORDER_BATCH) {
        a.rows = pr->N;
        a.row_stride = x->strides[1];
    } else if (pr->order == ORDER_N) {
        a.rows = B * pr->N;
        a.row_stride = x->strides[0];
    } else {
        a.rows = B * pr->N;
        a.row_stride = pr->N == 1 ? x->strides[0] : x->strides[1];
    }
    return a;
}

static size_t proj_pack_floats(const mha_proj *pr, int64_t B) {
    sdpa__mat a = proj_a(pr, B, 0);
    return sdpa__matmul_pack_floats(&a) + sdpa__matmul_pack_floats(&pr->wt);
}

static size_t align_up(size_t n) { return (n + (MHA_ALIGN - 1)) & ~(size_t)(MHA_ALIGN - 1); }

/* n1 * n2 * ... elements of `elem` bytes, or SIZE_MAX on overflow. */
static size_t bytes_of(size_t elem, int64_t a, int64_t b, int64_t c, int64_t d) {
    size_t r = elem;
    const int64_t f[4] = {a, b, c, d};
    for (int i = 0; i < 4; ++i) {
        if (f[i] != 0 && r > SIZE_MAX / (size_t)f[i])
            return SIZE_MAX;
        r *= (size_t)f[i];
    }
    return r > SIZE_MAX - MHA_ALIGN ? SIZE_MAX : r;
}

/* Attention views and options over the workspace regions at `ws` (64-byte aligned), or over a
 * dummy address for the size query (ws == NULL: shapes and strides only). */
typedef struct mha_attn {
    sdpa_tensor q, k, v, o;
    sdpa_options opt;
    sdpa_allow_mask mask;
    sdpa_tensor bias;
    bool out_n_major; /* Ao rows in (l, b) order */
} mha_attn;

/* Addresses for the views of the size query (never read or written). */
static const float dummy_float;
static const uint8_t dummy_byte;

static void view4(sdpa_tensor *t, float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                  int64_t s2, int64_t s3) {
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = SDPA_DTYPE_F32;
    t->rank = 4;
    t->shape[0] = d0; t->shape[1] = d1; t->shape[2] = d2; t->shape[3] = d3;
    t->strides[0] = s0; t->strides[1] = s1; t->strides[2] = s2; t->strides[3] = s3;
}

static void attn_setup(const mha_plan *pl, unsigned char *ws, bool out_n_major, mha_attn *a) {
    const int64_t B = pl->B, H = pl->H, L = pl->L, Dh = pl->Dh;
    float *dummy = (float *)(uintptr_t)&dummy_float;
    float *q = ws ? (float *)(ws + pl->reg_off[R_Q]) : dummy;
    float *k = ws ? (float *)(ws + pl->reg_off[R_K]) : dummy;
    float *v = ws ? (float *)(ws + pl->reg_off[R_V]) : dummy;
    float *o = ws ? (float *)(ws + pl->reg_off[R_AO]) : dummy;
    view4(&a->q, q, B, H, L, Dh, pl->pq.yb, Dh, pl->pq.yn, 1);
    view4(&a->k, k, B, pl->Hkv, pl->Sp, Dh, pl->pk.yb, Dh, pl->pk.yn, 1);
    view4(&a->v, v, B, pl->Hkv, pl->Sp, Dh, pl->pv.yb, Dh, pl->pv.yn, 1);
    a->out_n_major = out_n_major;
    if (out_n_major)
        view4(&a->o, o, B, H, L, Dh, pl->Dq, Dh, B * pl->Dq, 1);
    else
        view4(&a->o, o, B, H, L, Dh, L * pl->Dq, Dh, pl->Dq, 1);

    sdpa_options *opt = &a->opt;
    sdpa_options_init(opt);
    opt->causal = pl->o.causal && !pl->mask_causal;
    opt->key_lengths = pl->mask_klen ? NULL : pl->o.key_lengths;
    opt->query_lengths = pl->o.query_lengths;
    opt->empty_rows = pl->o.empty_rows;
    opt->num_threads = pl->o.num_threads;
    opt->dropout_p = pl->o.training ? pl->o.dropout_p : 0.0f;
    opt->dropout_seed = pl->o.dropout_seed;
    opt->dropout_offset = pl->o.dropout_offset;
    /* scale 0 = 1/sqrt(Dh), the head width of q and k. */
    memset(&a->mask, 0, sizeof a->mask);
    if (pl->mask_mode == MASK_ATTN) {
        opt->allow_mask = pl->o.attn_mask;
    } else if (pl->mask_mode == MASK_KPM) {
        const sdpa_allow_mask *m = pl->o.key_padding_mask;
        a->mask.data = m->data;
        a->mask.rank = 4;
        a->mask.shape[0] = pl->B; a->mask.shape[1] = 1; a->mask.shape[2] = 1; a->mask.shape[3] = pl->S;
        a->mask.strides[0] = m->strides[0]; a->mask.strides[3] = m->strides[1];
        opt->allow_mask = &a->mask;
    } else if (pl->mask_mode == MASK_BUILD) {
        a->mask.data = ws ? ws + pl->reg_off[R_MASK] : &dummy_byte;
        a->mask.rank = 4;
        int64_t acc = 1;
        for (int d = 3; d >= 0; --d) {
            a->mask.shape[d] = pl->mshape[d];
            a->mask.strides[d] = acc;
            acc *= pl->mshape[d];
        }
        opt->allow_mask = &a->mask;
    }
    if (pl->has_ab) {
        if (pl->build_bias) {
            float *bb = ws ? (float *)(ws + pl->reg_off[R_BIAS]) : dummy;
            const int64_t *s = pl->bshape;
            view4(&a->bias, bb, s[0], s[1], s[2], s[3], s[1] * s[2] * s[3], s[2] * s[3], s[3], 1);
            opt->bias = &a->bias;
        } else {
            opt->bias = pl->o.attn_bias;
        }
    }
}

/* Re-report a failure of the inner sdpa_attention under this function's name. */
static sdpa_status rewrap(const char *fn, sdpa_status st) {
    char inner[400];
    snprintf(inner, sizeof inner, "%s", sdpa_last_error_message());
    const char *hint = "";
    if (st == SDPA_ERR_NON_FINITE)
        hint = sdpa__last_subject() == SDPA__SUBJECT_BIAS /* the check failed on the bias: the caller's mask */
                   ? " (the bias is options->attn_bias: a float mask that holds NaN or +Inf on a pair no "
                     "other mask blocks; b, h, i, j index its broadcast [B, H, L, S] form)"
                   : " (the projected q/k/v hold NaN or Inf: from the query/key/value inputs, the projection "
                     "weights or biases, bias_k/bias_v, or a float32 overflow in the projection)";
    return sdpa__fail(st, "%s: attention over the projected heads: %s%s", fn, inner, hint);
}

/* make_plan, sizes of the layer: E, H, Hkv, Dh and the projection widths. */
static sdpa_status plan_sizes(const char *fn, mha_plan *pl) {
    const sdpa_mha_params *p = &pl->p;
    if (p->embed_dim < 0 || p->num_heads < 0 || p->num_kv_heads < 0 || p->head_dim < 0 || p->kdim < 0 || p->vdim < 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: params sizes must be >= 0 (embed_dim=%lld, num_heads=%lld, num_kv_heads=%lld, head_dim=%lld, kdim=%lld, vdim=%lld)",
                          fn, (long long)p->embed_dim, (long long)p->num_heads, (long long)p->num_kv_heads,
                          (long long)p->head_dim, (long long)p->kdim, (long long)p->vdim);
    if (p->embed_dim == 0)
        return sdpa__fail(SDPA_ERR_EMPTY_DIMENSION, "%s: params->embed_dim=0", fn);
    if (p->num_heads == 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: params->num_heads=0, expected >= 1", fn);
    SDPA__TRY(check_flag(fn, "params->add_zero_attn", p->add_zero_attn));
    const int64_t E = p->embed_dim, H = p->num_heads;
    const int64_t Hkv = p->num_kv_heads ? p->num_kv_heads : H;
    if (H % Hkv != 0)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: params->num_heads=%lld is not a multiple of num_kv_heads=%lld", fn,
                          (long long)H, (long long)Hkv);
    if (p->head_dim == 0 && E % H != 0)
        return sdpa__fail(SDPA_ERR_SHAPE,
                          "%s: params->embed_dim=%lld is not divisible by num_heads=%lld (set head_dim to use another head width)",
                          fn, (long long)E, (long long)H);
    const int64_t Dh = p->head_dim ? p->head_dim : E / H;
    int64_t Dq, Dkv;
    if (sdpa__mul_overflow(H, Dh, &Dq) || sdpa__mul_overflow(Hkv, Dh, &Dkv))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: num_heads * head_dim overflows", fn);
    const int64_t kdim = p->kdim ? p->kdim : E, vdim = p->vdim ? p->vdim : E;
    if (E > INT32_MAX || Dq > INT32_MAX || Dkv > INT32_MAX || kdim > INT32_MAX || vdim > INT32_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: E=%lld, H*Dh=%lld, Hkv*Dh=%lld, kdim=%lld, vdim=%lld must each fit in 32 bits (BLAS dimensions)",
                          fn, (long long)E, (long long)Dq, (long long)Dkv, (long long)kdim, (long long)vdim);
    pl->E = E; pl->H = H; pl->Hkv = Hkv; pl->Dh = Dh; pl->Dq = Dq; pl->Dkv = Dkv; pl->kdim = kdim; pl->vdim = vdim;
    return SDPA_OK;
}

/* make_plan, inputs: query [B, L, E], key [B, S, kdim], value [B, S, vdim]. */
static sdpa_status plan_inputs(const char *fn, const sdpa_tensor *query, const sdpa_tensor *key,
                               const sdpa_tensor *value, mha_plan *pl) {
    const sdpa_mha_params *p = &pl->p;
    const int64_t E = pl->E, kdim = pl->kdim, vdim = pl->vdim;
    SDPA__TRY(sdpa__check_tensor(query, fn, "query", 3, 3));
    const int64_t B = query->shape[0], L = query->shape[1];
    if (query->shape[2] != E)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: query.shape[2]=%lld, expected embed_dim=%lld", fn,
                          (long long)query->shape[2], (long long)E);
    SDPA__TRY(check_input(fn, "key", key, B, kdim, p->kdim ? "params->kdim" : "embed_dim (params->kdim=0)"));
    SDPA__TRY(check_input(fn, "value", value, B, vdim, p->vdim ? "params->vdim" : "embed_dim (params->vdim=0)"));
    if (value->shape[1] != key->shape[1])
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: value.shape[1]=%lld does not match key.shape[1]=S=%lld", fn,
                          (long long)value->shape[1], (long long)key->shape[1]);
    const int64_t S = key->shape[1];
    pl->query = query; pl->key = key; pl->value = value;
    pl->B = B; pl->L = L; pl->S = S;
    return SDPA_OK;
}

/* make_plan, weights: packed or separate projections, biases, bias_k/bias_v; S' = S + the
 * appended keys. */
static sdpa_status plan_weights(const char *fn, mha_plan *pl) {
    sdpa_status st;
    const sdpa_mha_params *p = &pl->p;
    const int64_t E = pl->E, Dq = pl->Dq, Dkv = pl->Dkv, kdim = pl->kdim, vdim = pl->vdim;
    const int64_t B = pl->B, L = pl->L, S = pl->S;
    const bool packed = p->in_proj_weight != NULL;
    if (packed) {
        if (p->q_proj_weight || p->k_proj_weight || p->v_proj_weight)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: params->in_proj_weight and q/k/v_proj_weight are both given (pass one or the other)", fn);
        if (Dq != E || Dkv != E || kdim != E || vdim != E)
            return sdpa__fail(SDPA_ERR_SHAPE,
                              "%s: packed in_proj_weight needs H*Dh = Hkv*Dh = kdim = vdim = embed_dim (here %lld, %lld, %lld, %lld, %lld): pass q/k/v_proj_weight",
                              fn, (long long)Dq, (long long)Dkv, (long long)kdim, (long long)vdim, (long long)E);
        SDPA__TRY(check_matrix(fn, "params->in_proj_weight", p->in_proj_weight, 3 * E, "3*embed_dim", E, "embed_dim"));
    } else {
        if (p->q_proj_weight == NULL)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params->in_proj_weight and q_proj_weight are both NULL", fn);
        if (p->k_proj_weight == NULL)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params->in_proj_weight and k_proj_weight are both NULL", fn);
        if (p->v_proj_weight == NULL)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params->in_proj_weight and v_proj_weight are both NULL", fn);
        if ((st = check_matrix(fn, "params->q_proj_weight", p->q_proj_weight, Dq, "H*Dh", E, "embed_dim")) != SDPA_OK ||
            (st = check_matrix(fn, "params->k_proj_weight", p->k_proj_weight, Dkv, "Hkv*Dh", kdim, "kdim")) != SDPA_OK ||
            (st = check_matrix(fn, "params->v_proj_weight", p->v_proj_weight, Dkv, "Hkv*Dh", vdim, "vdim")) != SDPA_OK)
            return st;
    }
    if (p->in_proj_bias &&
        (st = check_vector(fn, "params->in_proj_bias", p->in_proj_bias, Dq + 2 * Dkv, "H*Dh + 2*Hkv*Dh")) != SDPA_OK)
        return st;
    if (p->out_proj_weight == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params->out_proj_weight is NULL", fn);
    SDPA__TRY(check_matrix(fn, "params->out_proj_weight", p->out_proj_weight, E, "embed_dim", Dq, "H*Dh"));
    if (p->out_proj_bias && (st = check_vector(fn, "params->out_proj_bias", p->out_proj_bias, E, "embed_dim")) != SDPA_OK)
        return st;
    if ((p->bias_k == NULL) != (p->bias_v == NULL))
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params->%s is NULL but %s is given (add_bias_kv needs both)", fn,
                          p->bias_k ? "bias_v" : "bias_k", p->bias_k ? "bias_k" : "bias_v");
    if (p->bias_k) {
        if ((st = check_bias_kv(fn, "params->bias_k", p->bias_k, Dkv, &pl->bias_k, &pl->bias_k_stride)) != SDPA_OK ||
            (st = check_bias_kv(fn, "params->bias_v", p->bias_v, Dkv, &pl->bias_v, &pl->bias_v_stride)) != SDPA_OK)
            return st;
    }
    pl->X = (p->bias_k ? 1 : 0) + p->add_zero_attn;
    pl->Sp = S + pl->X;
    const int64_t Sp = pl->Sp;
    int64_t BL, BSp;
    if (sdpa__mul_overflow(B, L, &BL) || sdpa__mul_overflow(B, Sp, &BSp) || BL > INT32_MAX || BSp > INT32_MAX ||
        L > INT32_MAX || Sp > INT32_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: B*L=%lld*%lld and B*S'=%lld*%lld must fit in 32 bits (BLAS dimensions)",
                          fn, (long long)B, (long long)L, (long long)B, (long long)Sp);
    return SDPA_OK;
}

/* make_plan, options: flags, dropout, lengths, the masks and the additive bias. */
static sdpa_status plan_options(const char *fn, mha_plan *pl) {
    sdpa_status st;
    const sdpa_mha_options *o = &pl->o;
    const int64_t B = pl->B, H = pl->H, L = pl->L, S = pl->S;
    if ((st = check_flag(fn, "options->causal", o->causal)) != SDPA_OK ||
        (st = check_flag(fn, "options->per_head_weights", o->per_head_weights)) != SDPA_OK ||
        (st = check_flag(fn, "options->training", o->training)) != SDPA_OK)
        return st;
    if (!(o->dropout_p >= 0.0f && o->dropout_p < 1.0f))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->dropout_p=%g must be in [0, 1)", fn, (double)o->dropout_p);
    if (o->empty_rows != SDPA_EMPTY_ROWS_ERROR && o->empty_rows != SDPA_EMPTY_ROWS_ZERO)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->empty_rows=%d is not an sdpa_empty_rows", fn,
                          (int)o->empty_rows);
    if (o->num_threads < 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->num_threads=%d must be >= 0", fn, (int)o->num_threads);
    if ((st = sdpa__check_aligned(fn, "options->key_lengths", o->key_lengths, sizeof(int64_t))) != SDPA_OK ||
        (st = sdpa__check_aligned(fn, "options->query_lengths", o->query_lengths, sizeof(int64_t))) != SDPA_OK ||
        (st = check_lengths(fn, o->key_lengths, B, S, "key_lengths", "S")) != SDPA_OK ||
        (st = check_lengths(fn, o->query_lengths, B, L, "query_lengths", "L")) != SDPA_OK)
        return st;
    const int64_t target[4] = {B, H, L, S};
    if (o->attn_mask) {
        const sdpa_allow_mask *m = o->attn_mask;
        if ((st = sdpa__check_mask(fn, "options->attn_mask", m)) != SDPA_OK ||
            (st = sdpa__broadcast4(fn, "options->attn_mask", m->rank, m->shape, m->strides, target, pl->am_strides)) != SDPA_OK)
            return st;
        int64_t n = 1;
        for (int32_t d = 0; d < m->rank; ++d)
            n *= m->shape[d];
        pl->has_am = n > 0;
    }
    if (o->key_padding_mask) {
        const sdpa_allow_mask *m = o->key_padding_mask;
        SDPA__TRY(sdpa__check_mask(fn, "options->key_padding_mask", m));
        if (m->rank != 2)
            return sdpa__fail(SDPA_ERR_RANK, "%s: options->key_padding_mask.rank=%d, expected 2 ([B, S])", fn, (int)m->rank);
        if (m->shape[0] != B || m->shape[1] != S)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: options->key_padding_mask.shape=[%lld, %lld], expected [B=%lld, S=%lld]",
                              fn, (long long)m->shape[0], (long long)m->shape[1], (long long)B, (long long)S);
        pl->kpm_strides[0] = B > 1 ? m->strides[0] : 0;
        pl->kpm_strides[1] = S > 1 ? m->strides[1] : 0;
        pl->has_kpm = B > 0 && S > 0;
    }
    if (o->attn_bias) {
        const sdpa_tensor *t = o->attn_bias;
        if ((st = sdpa__check_tensor(t, fn, "options->attn_bias", 1, 4)) != SDPA_OK ||
            (st = sdpa__broadcast4(fn, "options->attn_bias", t->rank, t->shape, t->strides, target, pl->ab_strides)) != SDPA_OK)
            return st;
        pl->has_ab = numel(t) > 0;
    }
    return SDPA_OK;
}

/* make_plan, outputs: out [B, L, E] and the optional attention weights. */
static sdpa_status plan_outputs(const char *fn, const sdpa_tensor *out, const sdpa_tensor *attn_weights, bool for_size,
                                int weights_requested, mha_plan *pl) {
    const sdpa_mha_options *o = &pl->o;
    const int64_t B = pl->B, H = pl->H, L = pl->L, E = pl->E, Sp = pl->Sp;
    pl->want_weights = for_size ? weights_requested != 0 : attn_weights != NULL;
    pl->per_head = o->per_head_weights != 0;
    pl->avg_weights = pl->want_weights && !pl->per_head;
    if (!for_size) {
        if (out == NULL)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
        SDPA__TRY(sdpa__check_tensor(out, fn, "out", 3, 3));
        if (out->shape[0] != B || out->shape[1] != L || out->shape[2] != E)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: out.shape=[%lld, %lld, %lld], expected [B=%lld, L=%lld, E=%lld]", fn,
                              (long long)out->shape[0], (long long)out->shape[1], (long long)out->shape[2], (long long)B,
                              (long long)L, (long long)E);
        SDPA__TRY(sdpa__check_output_layout(out, fn, "out"));
        if (attn_weights) {
            const int32_t want_rank = pl->per_head ? 4 : 3;
            SDPA__TRY(sdpa__check_tensor(attn_weights, fn, "attn_weights", 3, 4));
            if (attn_weights->rank != want_rank)
                return sdpa__fail(SDPA_ERR_RANK, "%s: attn_weights.rank=%d, expected %d (%s with options->per_head_weights=%d)",
                                  fn, (int)attn_weights->rank, (int)want_rank, pl->per_head ? "[B, H, L, S']" : "[B, L, S']",
                                  (int)o->per_head_weights);
            const int64_t w4[4] = {B, H, L, Sp}, w3[3] = {B, L, Sp};
            const int64_t *want = pl->per_head ? w4 : w3;
            for (int32_t d = 0; d < want_rank; ++d)
                if (attn_weights->shape[d] != want[d])
                    return sdpa__fail(SDPA_ERR_SHAPE, "%s: attn_weights.shape[%d]=%lld, expected %lld (shape %s, S'=S+%lld=%lld)",
                                      fn, (int)d, (long long)attn_weights->shape[d], (long long)want[d],
                                      pl->per_head ? "[B, H, L, S']" : "[B, L, S']", (long long)pl->X, (long long)Sp);
            SDPA__TRY(sdpa__check_output_layout(attn_weights, fn, "attn_weights"));
        }
    }
    return SDPA_OK;
}

/* make_plan, projections and masks: the GEMM views, and the mask and bias the attention call
 * gets (built in the workspace when keys are appended or two masks combine). */
static void plan_projections(mha_plan *pl) {
    const sdpa_mha_params *p = &pl->p;
    const sdpa_tensor *query = pl->query, *key = pl->key, *value = pl->value;
    const sdpa_mha_options *o = &pl->o;
    const int64_t B = pl->B, H = pl->H, L = pl->L, E = pl->E, Dq = pl->Dq, Dkv = pl->Dkv, Sp = pl->Sp;
    const bool packed = p->in_proj_weight != NULL;
    if (packed) {
        make_proj(&pl->pq, query, p->in_proj_weight, 0, p->in_proj_bias, 0, B, L, E);
        make_proj(&pl->pk, key, p->in_proj_weight, E, p->in_proj_bias, E, B, Sp, E);
        make_proj(&pl->pv, value, p->in_proj_weight, 2 * E, p->in_proj_bias, 2 * E, B, Sp, E);
    } else {
        make_proj(&pl->pq, query, p->q_proj_weight, 0, p->in_proj_bias, 0, B, L, Dq);
        make_proj(&pl->pk, key, p->k_proj_weight, 0, p->in_proj_bias, Dq, B, Sp, Dkv);
        make_proj(&pl->pv, value, p->v_proj_weight, 0, p->in_proj_bias, Dq + Dkv, B, Sp, Dkv);
    }
    const sdpa_tensor *wo = p->out_proj_weight;
    pl->wot.data = (float *)wo->data;
    pl->wot.rows = Dq;
    pl->wot.cols = E;
    pl->wot.row_stride = wo->strides[1];
    pl->wot.col_stride = wo->strides[0];
    pl->bo = p->out_proj_bias ? (const float *)p->out_proj_bias->data : NULL;
    pl->bo_stride = p->out_proj_bias ? p->out_proj_bias->strides[0] : 0;

    /* masks: what the attention call gets */
    const bool extra = pl->X > 0;
    if (extra && (pl->has_am || pl->has_kpm || o->key_lengths || o->causal)) {
        pl->mask_mode = MASK_BUILD;
        pl->mask_causal = o->causal != 0;
        pl->mask_klen = o->key_lengths != NULL;
    } else if (pl->has_am && pl->has_kpm) {
        pl->mask_mode = MASK_BUILD;
    } else if (pl->has_am) {
        pl->mask_mode = MASK_ATTN;
    } else if (pl->has_kpm) {
        pl->mask_mode = MASK_KPM;
    }
    if (pl->mask_mode == MASK_BUILD) {
        pl->mshape[0] = (pl->has_am && pl->am_strides[0] != 0) || pl->has_kpm || pl->mask_klen ? B : 1;
        pl->mshape[1] = pl->has_am && pl->am_strides[1] != 0 ? H : 1;
        pl->mshape[2] = (pl->has_am && pl->am_strides[2] != 0) || pl->mask_causal ? L : 1;
        pl->mshape[3] = Sp;
    }
    if (pl->has_ab && extra) {
        pl->build_bias = true;
        pl->bshape[0] = pl->ab_strides[0] != 0 ? B : 1;
        pl->bshape[1] = pl->ab_strides[1] != 0 ? H : 1;
        pl->bshape[2] = pl->ab_strides[2] != 0 ? L : 1;
        pl->bshape[3] = Sp;
    }
}

/* make_plan, workspace layout: the regions (projected q/k/v, attention output, weights, masks,
 * packing) and the attention's own workspace (its plan through the internal entries). */
static sdpa_status plan_workspace(const char *fn, mha_plan *pl) {
    sdpa_status st;
    const int64_t B = pl->B, H = pl->H, L = pl->L, E = pl->E, Dq = pl->Dq, Dkv = pl->Dkv, Sp = pl->Sp;
    const int64_t BL = B * L; /* fits: checked in plan_weights */
    size_t sz[R_COUNT];
    memset(sz, 0, sizeof sz);
    sz[R_Q] = bytes_of(sizeof(float), B, L, Dq, 1);
    sz[R_K] = bytes_of(sizeof(float), B, Sp, Dkv, 1);
    sz[R_V] = sz[R_K];
    sz[R_AO] = sz[R_Q];
    if (pl->avg_weights)
        sz[R_WH] = bytes_of(sizeof(float), B, H, L, Sp);
    if (pl->mask_mode == MASK_BUILD)
        sz[R_MASK] = bytes_of(1, pl->mshape[0], pl->mshape[1], pl->mshape[2], pl->mshape[3]);
    if (pl->build_bias)
        sz[R_BIAS] = bytes_of(sizeof(float), pl->bshape[0], pl->bshape[1], pl->bshape[2], pl->bshape[3]);
    sz[R_TMP] = bytes_of(sizeof(float), BL < MHA_OUT_BLOCK ? BL : MHA_OUT_BLOCK, E, 1, 1);
    size_t pack = proj_pack_floats(&pl->pq, B);
    size_t pk = proj_pack_floats(&pl->pk, B), pv = proj_pack_floats(&pl->pv, B);
    size_t po = sdpa__matmul_pack_floats(&pl->wot);
    pack = pack > pk ? pack : pk;
    pack = pack > pv ? pack : pv;
    pack = pack > po ? pack : po;
    sz[R_PACK] = pack > (SIZE_MAX - MHA_ALIGN) / sizeof(float) ? SIZE_MAX : pack * sizeof(float);
    {
        mha_attn a;
        size_t n = 0;
        attn_setup(pl, NULL, false, &a);
        if (BL > 0) { /* the attention's own plan and workspace (internal entries, attention.c) */
            sdpa__plan ap;
            sdpa_options ao;
            st = sdpa__plan_make("sdpa_attention", &a.q, &a.k, &a.v, &a.opt, NULL, NULL, NULL, true, &ap, &ao);
            if (st == SDPA_OK) {
                ap.has_weights = pl->want_weights;
                st = sdpa__attention_workspace_bytes("sdpa_attention_workspace_size", &ap, &n);
            }
            if (st != SDPA_OK)
                return rewrap(fn, st);
        }
        sz[R_ATTN] = n;
    }
    size_t off = 0;
    for (int r = 0; r < R_COUNT; ++r) {
        if (sz[r] > SIZE_MAX / 4 || off > SIZE_MAX / 4)
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
        pl->reg_off[r] = off;
        pl->reg_size[r] = sz[r];
        off += align_up(sz[r]);
    }
    pl->total = off + MHA_ALIGN; /* slack to align a caller buffer of any alignment */
    return SDPA_OK;
}

/* make_plan, overlaps: the outputs and the caller workspace against everything else. */
static sdpa_status plan_overlaps(const char *fn, const sdpa_tensor *query, const sdpa_tensor *key,
                                 const sdpa_tensor *value, const sdpa_tensor *out, const sdpa_tensor *attn_weights,
                                 const mha_plan *pl) {
    const sdpa_mha_params *p = &pl->p;
    const sdpa_mha_options *o = &pl->o;
    const int64_t B = pl->B;
    sdpa__named_span in[20], outs[3];
    int nin = 0, nout = 0;
#define MHA_IN_T(nm, t) do { if ((t) != NULL) { in[nin].name = (nm); in[nin++].s = sdpa__tensor_span(t); } } while (0)
    MHA_IN_T("query", query);
    MHA_IN_T("key", key);
    MHA_IN_T("value", value);
    MHA_IN_T("params->in_proj_weight", p->in_proj_weight);
    MHA_IN_T("params->q_proj_weight", p->q_proj_weight);
    MHA_IN_T("params->k_proj_weight", p->k_proj_weight);
    MHA_IN_T("params->v_proj_weight", p->v_proj_weight);
    MHA_IN_T("params->in_proj_bias", p->in_proj_bias);
    MHA_IN_T("params->out_proj_weight", p->out_proj_weight);
    MHA_IN_T("params->out_proj_bias", p->out_proj_bias);
    MHA_IN_T("params->bias_k", p->bias_k);
    MHA_IN_T("params->bias_v", p->bias_v);
    MHA_IN_T("options->attn_bias", o->attn_bias);
#undef MHA_IN_T
    if (o->attn_mask) { in[nin].name = "options->attn_mask"; in[nin++].s = sdpa__mask_span(o->attn_mask); }
    if (o->key_padding_mask) {
        in[nin].name = "options->key_padding_mask";
        in[nin++].s = sdpa__mask_span(o->key_padding_mask);
    }
    if (o->key_lengths && B > 0) {
        in[nin].name = "options->key_lengths";
        in[nin].s.lo = (uintptr_t)o->key_lengths;
        in[nin++].s.hi = (uintptr_t)(o->key_lengths + B);
    }
    if (o->query_lengths && B > 0) {
        in[nin].name = "options->query_lengths";
        in[nin].s.lo = (uintptr_t)o->query_lengths;
        in[nin++].s.hi = (uintptr_t)(o->query_lengths + B);
    }
    outs[nout].name = "out";
    outs[nout++].s = sdpa__tensor_span(out);
    if (attn_weights) {
        outs[nout].name = "attn_weights";
        outs[nout++].s = sdpa__tensor_span(attn_weights);
    }
    if (o->workspace && o->workspace_bytes > 0) {
        outs[nout].name = "options->workspace";
        outs[nout].s.lo = (uintptr_t)o->workspace;
        outs[nout++].s.hi = (uintptr_t)o->workspace + o->workspace_bytes;
    }
    return sdpa__check_overlaps(fn, in, nin, outs, nout);
}

/* Validate everything that does not depend on values, and lay out the workspace, section by
 * section (the plan_* functions above, in this order). for_size: outputs are not given
 * (workspace-size query). */
static sdpa_status make_plan(const char *fn, const sdpa_mha_params *params, const sdpa_tensor *query,
                             const sdpa_tensor *key, const sdpa_tensor *value, const sdpa_mha_options *options,
                             const sdpa_tensor *out, const sdpa_tensor *attn_weights, bool for_size,
                             int weights_requested, mha_plan *pl) {
    sdpa_status st;
    memset(pl, 0, sizeof *pl);
    pl->fn = fn;
    if (params == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: params is NULL", fn);
    sdpa_mha_params_init(&pl->p);
    sdpa_mha_options_init(&pl->o);
    if ((st = sdpa__read_versioned(fn, "params", "sdpa_mha_params", params, MHA_PARAMS_V1_SIZE, &pl->p,
                                   sizeof pl->p)) != SDPA_OK ||
        (st = sdpa__check_reserved(fn, "params->reserved0", pl->p.reserved0)) != SDPA_OK)
        return st;
    if (options != NULL && (st = sdpa__read_versioned(fn, "options", "sdpa_mha_options", options,
                                                      MHA_OPTIONS_V1_SIZE, &pl->o, sizeof pl->o)) != SDPA_OK)
        return st;
    if ((st = plan_sizes(fn, pl)) != SDPA_OK || (st = plan_inputs(fn, query, key, value, pl)) != SDPA_OK ||
        (st = plan_weights(fn, pl)) != SDPA_OK || (st = plan_options(fn, pl)) != SDPA_OK ||
        (st = plan_outputs(fn, out, attn_weights, for_size, weights_requested, pl)) != SDPA_OK)
        return st;
    plan_projections(pl);
    SDPA__TRY(plan_workspace(fn, pl));
    if (!for_size && (st = plan_overlaps(fn, query, key, value, out, attn_weights, pl)) != SDPA_OK)
        return st;
    return SDPA_OK;
}

/* ------------------------------------------------------------- compute */

static void fill_bias_rows(float *y, int64_t rows, int64_t row_stride, int64_t cols, const float *bias,
                           int64_t bias_stride) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            y[r * row_stride + c] = bias[c * bias_stride];
}

/* Y = X W^T + b into the projected buffer y (layout of pr); for keys and values (append = true)
 * then the appended rows: extra_row (bias_k or bias_v, if any), then the zero row. */
static void project(const mha_plan *pl, const mha_proj *pr, float *y, bool append, const float *extra_row,
                    int64_t extra_stride, float *pack) {
    const int64_t B = pl->B, N = pr->N, D = pr->out;
    const float beta = pr->bias ? 1.0f : 0.0f;
    if (pr->order == ORDER_BATCH) {
        for (int64_t b = 0; b < B; ++b) {
            sdpa__mat a = proj_a(pr, B, b);
            sdpa__mat c = {y + b * pr->yb, N, D, pr->yn, 1};
            if (pr->bias)
                fill_bias_rows(c.data, N, pr->yn, D, pr->bias, pr->bias_stride);
            sdpa__matmul(&a, &pr->wt, 1.0f, beta, &c, pack);
        }
    } else {
        sdpa__mat a = proj_a(pr, B, 0);
        sdpa__mat c;
        c.data = y;
        c.rows = B * N;
        c.cols = D;
        c.col_stride = 1;
        if (pr->order == ORDER_N)
            c.row_stride = pr->yb; /* rows (n, b): consecutive b */
        else if (pr->expand || B == 1)
            c.row_stride = D; /* compact rows, moved apart below when expand */
        else
            c.row_stride = N == 1 ? pr->yb : pr->yn;
        if (pr->bias)
            fill_bias_rows(c.data, c.rows, c.row_stride, D, pr->bias, pr->bias_stride);
        sdpa__matmul(&a, &pr->wt, 1.0f, beta, &c, pack);
        if (pr->expand) /* batch b's N rows from b*N*D to b*Np*D; backwards, so nothing is overwritten early */
            for (int64_t b = B - 1; b >= 1; --b)
                memmove(y + b * pr->yb, y + b * N * D, (size_t)(N * D) * sizeof(float));
    }
    for (int64_t b = 0; append && b < B; ++b) {
        int64_t n = N;
        if (extra_row) {
            float *row = y + b * pr->yb + n * pr->yn;
            for (int64_t c = 0; c < D; ++c)
                row[c] = extra_row[c * extra_stride];
            ++n;
        }
        if (pl->p.add_zero_attn)
            memset(y + b * pr->yb + n * pr->yn, 0, (size_t)D * sizeof(float));
    }
}

static void build_mask(const mha_plan *pl, uint8_t *m) {
    const sdpa_mha_options *o = &pl->o;
    const int64_t *s = pl->mshape;
    const uint8_t *am = o->attn_mask ? o->attn_mask->data : NULL;
    const uint8_t *kpm = o->key_padding_mask ? o->key_padding_mask->data : NULL;
    /* causal and key lengths over the S real keys: the structural rule of rules.c */
    sdpa__rules rules;
    memset(&rules, 0, sizeof rules);
    rules.L = pl->L;
    rules.S = pl->S;
    rules.causal = pl->mask_causal;
    rules.alignment = SDPA_ALIGN_TOP_LEFT;
    rules.window_left = rules.window_right = -1;
    rules.key_lengths = pl->mask_klen ? o->key_lengths : NULL;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i) {
                uint8_t *row = m + ((b * s[1] + h) * s[2] + i) * s[3];
                int64_t lo, hi;
                sdpa__rule_range(&rules, b, i, &lo, &hi);
                for (int64_t j = 0; j < s[3]; ++j) {
                    bool ok = true;
                    if (j < pl->S) { /* the appended keys j >= S are always allowed */
                        ok = j >= lo && j < hi;
                        if (ok && pl->has_am)
                            ok = am[b * pl->am_strides[0] + h * pl->am_strides[1] + i * pl->am_strides[2] +
                                    j * pl->am_strides[3]] != 0;
                        if (ok && pl->has_kpm)
                            ok = kpm[b * pl->kpm_strides[0] + j * pl->kpm_strides[1]] != 0;
                    }
                    row[j] = ok ? 1 : 0;
                }
            }
}

static void build_bias(const mha_plan *pl, float *dst) {
    const int64_t *s = pl->bshape;
    const float *src = (const float *)pl->o.attn_bias->data;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i) {
                float *row = dst + ((b * s[1] + h) * s[2] + i) * s[3];
                const float *srow = src + b * pl->ab_strides[0] + h * pl->ab_strides[1] + i * pl->ab_strides[2];
                for (int64_t j = 0; j < s[3]; ++j)
                    row[j] = j < pl->S ? srow[j * pl->ab_strides[3]] : 0.0f;
            }
}

static bool all_finite(const sdpa_tensor *t) {
    int64_t idx[SDPA_MAX_RANK] = {0};
    if (numel(t) == 0)
        return true;
    const float *d = (const float *)t->data;
    for (;;) {
        int64_t off = 0;
        for (int32_t k = 0; k < t->rank; ++k)
            off += idx[k] * t->strides[k];
        if (!isfinite(d[off]))
            return false;
        int32_t k = t->rank - 1;
        while (k >= 0 && ++idx[k] == t->shape[k])
            idx[k--] = 0;
        if (k < 0)
            return true;
    }
}

static bool row_is_padding(const mha_plan *pl, int64_t b, int64_t i) {
    sdpa__rules r;
    memset(&r, 0, sizeof r);
    r.query_lengths = pl->o.query_lengths;
    return sdpa__rule_is_padding(&r, b, i);
}

/* out = Ao W_o^T + b_o; padding query rows exactly 0. */
static void out_projection(const mha_plan *pl, const mha_attn *a, const sdpa_tensor *out, float *tmp, float *pack) {
    const int64_t B = pl->B, L = pl->L, E = pl->E, Dq = pl->Dq;
    const float beta = pl->bo ? 1.0f : 0.0f;
    float *ao = (float *)a->o.data;
    float *od = (float *)out->data;
    const int64_t ob = out->strides[0], ol = out->strides[1], oe = out->strides[2];
    const int order = row_order(B, L, ob, ol);
    const bool direct = (E == 1 || oe == 1) && order != ORDER_BATCH;
    if (direct) {
        sdpa__mat am = {ao, B * L, Dq, Dq, 1};
        sdpa__mat c;
        c.data = od;
        c.rows = B * L;
        c.cols = E;
        c.col_stride = 1;
        c.row_stride = order == ORDER_N ? ob : (L == 1 ? ob : ol);
        if (pl->bo)
            fill_bias_rows(od, c.rows, c.row_stride, E, pl->bo, pl->bo_stride);
        sdpa__matmul(&am, &pl->wot, 1.0f, beta, &c, pack);
    } else { /* Ao is b-major here: blocks of rows through tmp */
        const int64_t rows = B * L;
        for (int64_t r0 = 0; r0 < rows; r0 += MHA_OUT_BLOCK) {
            const int64_t n = rows - r0 < MHA_OUT_BLOCK ? rows - r0 : MHA_OUT_BLOCK;
            sdpa__mat am = {ao + r0 * Dq, n, Dq, Dq, 1};
            sdpa__mat c = {tmp, n, E, E, 1};
            if (pl->bo)
                fill_bias_rows(tmp, n, E, E, pl->bo, pl->bo_stride);
            sdpa__matmul(&am, &pl->wot, 1.0f, beta, &c, pack);
            for (int64_t t = 0; t < n; ++t) {
                const int64_t b = (r0 + t) / L, i = (r0 + t) % L;
                float *dst = od + b * ob + i * ol;
                for (int64_t e = 0; e < E; ++e)
                    dst[e * oe] = tmp[t * E + e];
            }
        }
    }
    /* A row that float32 cannot carry although its inputs are finite (the products overflow, or
     * inf - inf cancels to NaN) is recomputed in double, as sdpa_attention does for its rows. */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
            float *dst = od + b * ob + i * ol;
            bool finite = true;
            for (int64_t e = 0; e < E && finite; ++e)
                finite = isfinite(dst[e * oe]);
            if (finite)
                continue;
            const float *arow = ao + (a->out_n_major ? i * B + b : b * L + i) * Dq;
            for (int64_t e = 0; e < E; ++e) {
                double acc = pl->bo ? (double)pl->bo[e * pl->bo_stride] : 0.0;
                for (int64_t d = 0; d < Dq; ++d)
                    acc += (double)arow[d] * (double)pl->wot.data[d * pl->wot.row_stride + e * pl->wot.col_stride];
                dst[e * oe] = (float)acc;
            }
        }
    if (pl->o.query_lengths)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = pl->o.query_lengths[b]; i < L; ++i)
                for (int64_t e = 0; e < E; ++e)
                    od[b * ob + i * ol + e * oe] = 0.0f;
}

static void average_weights(const mha_plan *pl, const float *wh, const sdpa_tensor *w) {
    const int64_t B = pl->B, H = pl->H, L = pl->L, Sp = pl->Sp;
    float *wd = (float *)w->data;
    const double inv = 1.0 / (double)H;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
            float *dst = wd + b * w->strides[0] + i * w->strides[1];
            for (int64_t j = 0; j < Sp; ++j) {
                double acc = 0.0;
                for (int64_t h = 0; h < H; ++h)
                    acc += (double)wh[((b * H + h) * L + i) * Sp + j];
                dst[j * w->strides[2]] = (float)(acc * inv);
            }
        }
}

/* ---------------------------------------------------------------- public */

SDPA_API sdpa_status sdpa_mha_workspace_size(const sdpa_mha_params *params, const sdpa_tensor *query,
                                             const sdpa_tensor *key, const sdpa_tensor *value,
                                             const sdpa_mha_options *options, int weights_requested, size_t *bytes) {
    static const char fn[] = "sdpa_mha_workspace_size";
    mha_plan pl;
    sdpa__clear_error();
    if (bytes == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    sdpa_status st = make_plan(fn, params, query, key, value, options, NULL, NULL, true, weights_requested, &pl);
    if (st != SDPA_OK)
        return st;
    *bytes = pl.total;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mha_forward(const sdpa_mha_params *params, const sdpa_tensor *query, const sdpa_tensor *key,
                                      const sdpa_tensor *value, const sdpa_mha_options *options, const sdpa_tensor *out,
                                      const sdpa_tensor *attn_weights) {
    static const char fn[] = "sdpa_mha_forward";
    mha_plan pl;
    sdpa__clear_error();
    sdpa_status st = make_plan(fn, params, query, key, value, options, out, attn_weights, false, 0, &pl);
    if (st != SDPA_OK)
        return st;
    const sdpa_mha_options *o = &pl.o;
    if (o->workspace != NULL && o->workspace_bytes < pl.total)
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_mha_workspace_size())",
                          fn, o->workspace_bytes, pl.total);
    if (pl.B == 0 || pl.L == 0) { /* no query row: nothing to write */
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    /* The output projection's weights enter every non-padding row of out. (NaN/Inf in the
     * input projections reach the projected q/k/v, which sdpa_attention checks.) */
    bool any_row = false;
    for (int64_t b = 0; b < pl.B && !any_row; ++b)
        any_row = !row_is_padding(&pl, b, 0);
    if (any_row) {
        if (!all_finite(pl.p.out_proj_weight))
            return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: params->out_proj_weight holds NaN or Inf", fn);
        if (pl.p.out_proj_bias && !all_finite(pl.p.out_proj_bias))
            return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: params->out_proj_bias holds NaN or Inf", fn);
    }

    void *owned = NULL;
    unsigned char *ws = (unsigned char *)o->workspace;
    if (ws == NULL) {
        owned = malloc(pl.total);
        if (owned == NULL)
            return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of workspace", fn, pl.total);
        ws = (unsigned char *)owned;
    }
    /* The projections are BLAS GEMMs: fail here, before anything is written, if the BLAS could
     * not get its own buffer (OpenBLAS would retry forever). */
    if (!sdpa__matmul_memory_available()) {
        free(owned);
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: the BLAS library cannot obtain its GEMM buffer (address space or commit limit)", fn);
    }
    ws = (unsigned char *)(((uintptr_t)ws + (MHA_ALIGN - 1)) & ~(uintptr_t)(MHA_ALIGN - 1));
    float *pack = (float *)(ws + pl.reg_off[R_PACK]);

    /* Ao in the row order of out, so that the output projection is one GEMM into out. */
    const bool out_n_major = (pl.E == 1 || out->strides[2] == 1) &&
                             row_order(pl.B, pl.L, out->strides[0], out->strides[1]) == ORDER_N;
    mha_attn a;
    attn_setup(&pl, ws, out_n_major, &a);
    a.opt.workspace = ws + pl.reg_off[R_ATTN];
    a.opt.workspace_bytes = pl.reg_size[R_ATTN];

    project(&pl, &pl.pq, (float *)a.q.data, false, NULL, 0, pack);
    project(&pl, &pl.pk, (float *)a.k.data, true, pl.bias_k, pl.bias_k_stride, pack);
    project(&pl, &pl.pv, (float *)a.v.data, true, pl.bias_v, pl.bias_v_stride, pack);
    if (pl.mask_mode == MASK_BUILD)
        build_mask(&pl, (uint8_t *)(ws + pl.reg_off[R_MASK]));
    if (pl.build_bias)
        build_bias(&pl, (float *)(ws + pl.reg_off[R_BIAS]));

    sdpa_tensor wh;
    const sdpa_tensor *wout = NULL;
    if (pl.avg_weights) {
        view4(&wh, (float *)(ws + pl.reg_off[R_WH]), pl.B, pl.H, pl.L, pl.Sp, pl.H * pl.L * pl.Sp, pl.L * pl.Sp, pl.Sp, 1);
        wout = &wh;
    } else if (attn_weights) {
        wout = attn_weights; /* per head: written by sdpa_attention only once its checks pass */
    }
    {
        sdpa__plan ap;
        sdpa_options ao;
        st = sdpa__plan_make("sdpa_attention", &a.q, &a.k, &a.v, &a.opt, &a.o, wout, NULL, false, &ap, &ao);
        if (st == SDPA_OK)
            st = sdpa__attention_planned(&ap, ao.workspace, ao.workspace_bytes);
    }
    if (st != SDPA_OK) {
        st = rewrap(fn, st);
        free(owned);
        return st;
    }
    out_projection(&pl, &a, out, (float *)(ws + pl.reg_off[R_TMP]), pack);
    if (pl.avg_weights)
        average_weights(&pl, (const float *)wh.data, attn_weights);
    free(owned);
    return SDPA_OK;
}
