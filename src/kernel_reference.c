/* The reference kernel. For each (batch, head, block of query rows):
 *   1. one score tile [rows, keys] (keys: the union of the rows' structural ranges, every key
 *      when `weights` holds raw scores), tile by tile of SDPA__TILE_K keys from the library's
 *      micro-kernels (lanes_gemm on Q packed as lanes; K rows through the plan's loader);
 *   2. per row: softcap, bias, the allowed set, a masked softmax into probabilities
 *      (exact 0 where blocked), lse and the requested weights;
 *   3. out = P.V through the micro-kernels, key tile by key tile. A key whose probability is
 *      0 in every row of the block (blocked, or outside some rows' ranges) is never read: its
 *      V row and its P row are left out (the used keys are gathered), so a NaN stored there
 *      cannot reach out (0 * NaN would). Which keys are read depends on the probabilities
 *      only, never on the values stored in blocked rows, so those values cannot change a
 *      single bit of the result.
 * No BLAS: OpenBLAS 0.3.21 retries its buffer allocation forever when the address space is
 * capped (setrlimit(RLIMIT_AS)); the tile products here allocate nothing.
 * Extra memory: tiles of row_block x S floats (scores) and S x lanes floats (P as lanes), and
 * per-key-tile buffers; never B*H*L*S. */
#include "microkernel.h"
#include "kernel.h"
#include "load.h"

#include <math.h>
#include <string.h>

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* Row states after step 2. */
enum { ROW_PV = 0, ROW_DONE = 1 };
/* Per-key flags of the row being processed (S bytes of workspace). */
enum { KEY_ALLOWED = 1, KEY_RAW_NOT_FINITE = 2 };

/* Add with saturation to SIZE_MAX (an overflowed size is reported by the caller). */
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t mul_sat(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }

/* base + off, without arithmetic on the NULL data of an empty view. */
static float *at(float *base, int64_t off) { return base ? base + off : NULL; }

#define BN SDPA__TILE_K

/* Lanes of a block: row_block rounded up to the lane quantum. */
static int64_t block_lanes(const sdpa__plan *p) {
    return (p->row_block + SDPA__LANES - 1) / SDPA__LANES * SDPA__LANES;
}

/* Workspace layout, in this order, each part 64-byte aligned. */
typedef struct layout {
    size_t flags, tile, otile, state, acc, qt, st, pt, ot, ktile, vtile, vg, ones, total;
} layout;

static size_t take(size_t *at, size_t bytes) {
    size_t here = *at;
    *at = add_sat(*at, ALIGN_UP(bytes));
    return here;
}

static layout make_layout(const sdpa__plan *p) {
    const size_t rb = (size_t)p->row_block, S = (size_t)p->S, E = (size_t)p->E, Ev = (size_t)p->Ev;
    const size_t nl = (size_t)block_lanes(p), f = sizeof(float);
    layout l;
    size_t at = 0;
    l.flags = take(&at, S);                              /* per-key flags of a row, then used keys */
    l.tile = take(&at, mul_sat(mul_sat(rb, S), f));      /* [rows, n] scores, then probabilities */
    l.otile = take(&at, mul_sat(mul_sat(rb, Ev), f));    /* [rows, Ev] P.V */
    l.state = take(&at, rb);
    l.acc = take(&at, sdpa__fallback_scratch_bytes(p)); /* the double fallback's scratch */
    l.qt = take(&at, mul_sat(mul_sat(E, nl), f));        /* scale * Q^T as lanes */
    l.st = take(&at, mul_sat(mul_sat((size_t)BN, nl), f)); /* one key tile of scores / gathered P */
    l.pt = take(&at, mul_sat(mul_sat(S, nl), f));        /* P^T as lanes */
    l.ot = take(&at, mul_sat(mul_sat(Ev, nl), f));       /* (P.V)^T as lanes */
    l.ktile = take(&at, mul_sat(mul_sat(E, (size_t)BN > rb ? (size_t)BN : rb), f)); /* loader tiles (Q, then K) */
    l.vtile = take(&at, mul_sat(mul_sat(Ev, (size_t)BN), f));
    l.vg = take(&at, mul_sat(mul_sat(Ev, (size_t)BN), f));
    l.ones = take(&at, mul_sat(nl, f));
    l.total = at;
    return l;
}

static void zero_row(float *row, int64_t n, int64_t stride) {
    for (int64_t d = 0; d < n; ++d)
        row[d * stride] = 0.0f;
}

/* A score-stage weights row over all S keys: s[j - jlo] inside [jlo, jhi) (for MASKED only
 * where allowed, -inf elsewhere; the other stages cover every key). An entry whose float32
 * value, or raw score before softcap, is not finite is recomputed in double, so a finite
 * score never shows as inf or as a clipped softcap. */
static void write_scores_row(const sdpa__plan *p, void *acc, int64_t b, int64_t h, int64_t i, float *w, const float *s,
                             const uint8_t *flags, int64_t jlo, int64_t jhi, int stage) {
    const int64_t ws = p->weights.strides[3];
    for (int64_t j = 0; j < p->S; ++j) {
        float x = -INFINITY;
        if (j >= jlo && j < jhi && (stage != SDPA_WEIGHTS_MASKED || (flags[j - jlo] & KEY_ALLOWED))) {
            x = s[j - jlo];
            if (!isfinite(x) || (flags[j - jlo] & KEY_RAW_NOT_FINITE))
                x = (float)sdpa__fallback_score_double(p, b, h, i, j, stage, acc);
        }
        w[j * ws] = x;
    }
}

/* A probabilities weights row over all S keys: p[j - jlo] inside [jlo, jhi), 0 elsewhere. */
static void write_probs_row(const sdpa__plan *p, float *w, const float *prob, int64_t jlo, int64_t jhi) {
    const int64_t ws = p->weights.strides[3];
    for (int64_t j = 0; j < p->S; ++j)
        w[j * ws] = j >= jlo && j < jhi ? prob[j - jlo] : 0.0f;
}

/* Step 2 for row i: turns its scores s[0, n) (keys jlo + [0, n)) into probabilities, exact 0
 * where blocked, writes lse and weights, and returns ROW_PV if out still needs P.V, or
 * ROW_DONE if the row is complete (padding, empty, or redone in double). */
static int softmax_row(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i, float *s,
                       int64_t jlo, int64_t n, uint8_t *allowed, void *acc, void *orow, float *wrow,
                       float *lrow) {
    const int64_t jhi = jlo + n;
    if (sdpa__rule_is_padding(&p->rules, b, i)) {
        sdpa__out_zero_row(p, orow);
        if (wrow)
            zero_row(wrow, p->S, p->weights.strides[3]);
        if (lrow)
            *lrow = -INFINITY;
        return ROW_DONE;
    }
    int64_t lo, hi;
    sdpa__rule_range(&p->rules, b, i, &lo, &hi);
    /* Flags: allowed by the rule; raw float32 score not finite (an overflow that softcap would
     * hide: tanh(inf) = 1). */
    sdpa__rule_row_flags(&p->rules, b, h, i, lo, hi, jlo, n, allowed); /* KEY_ALLOWED or 0 */
    for (int64_t j = 0; j < n; ++j)
        allowed[j] = (uint8_t)(allowed[j] | (isfinite(s[j]) ? 0 : KEY_RAW_NOT_FINITE));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_SCORES)
        write_scores_row(p, acc, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_SCORES);
    const float c = p->softcap;
    if (c > 0.0f)
        for (int64_t j = 0; j < n; ++j)
            s[j] = c * tanhf(s[j] / c);
    if (wrow && p->weights_stage == SDPA_WEIGHTS_SOFTCAPPED)
        write_scores_row(p, acc, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_SOFTCAPPED);
    sdpa__rule_alibi_add(&p->rules, b, h, i, jlo, n, s, 1); /* ALiBi, a bias (rules.c) */
    /* Bias is read and added where allowed only; -inf blocks. */
    const void *brow = p->rules.has_bias ? sdpa__rule_bias_row(&p->rules, b, h, i) : NULL;
    bool any = false, overflow = false;
    for (int64_t j = 0; j < n; ++j) {
        if (!(allowed[j] & KEY_ALLOWED))
            continue;
        if (brow) /* a -inf bias already blocked the key */
            s[j] += sdpa__rule_bias_at(&p->rules, brow, jlo + j);
        overflow = overflow || (allowed[j] & KEY_RAW_NOT_FINITE) || !isfinite(s[j]);
        any = true;
    }
    if (wrow && p->weights_stage == SDPA_WEIGHTS_MASKED)
        write_scores_row(p, acc, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_MASKED);
    for (int64_t j = 0; j < n; ++j) /* plain 0/1 from here on */
        allowed[j] &= KEY_ALLOWED;
    if (!any) { /* policy ZERO (ERROR was rejected before any write) */
        sdpa__out_zero_row(p, orow);
        if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
            zero_row(wrow, p->S, p->weights.strides[3]);
        if (lrow)
            *lrow = sdpa__sink(p->sinks, h); /* -inf without a sink */
        return ROW_DONE;
    }
    if (overflow) { /* a float32 score overflowed: redo this row in double */
        sdpa__fallback_row_double(p, drop, b, h, i, acc, orow, wrow, lrow);
        return ROW_DONE;
    }
    const float sink = sdpa__sink(p->sinks, h), smx = sdpa__masked_max(s, allowed, n);
    const float mx = sink > smx ? sink : smx; /* the sink joins the max and the denominator only */
    double sum = sdpa__masked_exp_sum(s, allowed, n, mx); /* s[j] = exp(s[j] - mx), 0 if blocked */
    if (sink > -INFINITY)
        sum += exp((double)sink - (double)mx);
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; ++j)
        s[j] *= inv;
    if (lrow)
        *lrow = (float)((double)mx + log(sum));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
        write_probs_row(p, wrow, s, jlo, jhi); /* pre-dropout, as documented */
    sdpa__dropout_apply(drop, b, h, i, jlo, n, s);
    return ROW_PV;
}

/* Row (b, h, i) of out, weights (NULL if not requested) and lse (NULL if not requested). */
static void row_outputs(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, void **orow, float **wrow,
                        float **lrow) {
    *orow = sdpa__out_row(p, b, h, i);
    *wrow = p->has_weights && p->S > 0 /* weights with no element (S = 0): strides never checked */
                ? at(p->weights.data, b * p->weights.strides[0] + h * p->weights.strides[1] + i * p->weights.strides[2])
                : NULL;
    *lrow = p->has_lse ? at(p->lse, b * p->lse_strides[0] + h * p->lse_strides[1] + i * p->lse_strides[2]) : NULL;
}

/* tile[r * n + t] = scale * <q_{i0 + r}, k_{jlo + t}> for r < rows, t < n: Q packed once as
 * lanes (idle lanes zero), then one lanes_gemm per key tile, transposed into the row tile. */
static void scores(const sdpa__plan *p, const sdpa__mk *mk, int64_t b, int64_t h, int64_t g, int64_t i0,
                   int64_t rows, int64_t jlo, int64_t n, float *tile, float *qt, float *st, float *ktile) {
    const int64_t nl = (rows + SDPA__LANES - 1) / SDPA__LANES * SDPA__LANES, E = p->E;
    const sdpa__rows qr = p->load_q->rows(&p->q, b, h, i0, i0 + rows, ktile);
    mk->pack_lanes(qr.data, qr.stride, rows, E, p->scale, qt, nl);
    for (int64_t e = 0; e < E; ++e)
        for (int64_t r = rows; r < nl; ++r)
            qt[e * nl + r] = 0.0f;
    for (int64_t t0 = jlo; t0 < jlo + n; t0 += BN) {
        const int64_t t1 = t0 + BN < jlo + n ? t0 + BN : jlo + n;
        const sdpa__rows kr = p->load_k->rows(&p->k, b, g, t0, t1, ktile);
        mk->lanes_gemm(t1 - t0, E, kr.data, kr.stride, 1, qt, st, NULL, nl, nl);
        mk->unpack_lanes(st, nl, rows, t1 - t0, tile + (t0 - jlo), (ptrdiff_t)n);
    }
}

/* otile[r * Ev + d] = sum_t tile[r * n + t] * v_{jlo + t}[d] for r < rows: P packed as lanes,
 * then per key tile one lanes_gemm over the keys some row uses (P != 0); the other keys' V rows
 * are never read. used: n bytes of scratch. */
static void p_times_v(const sdpa__plan *p, const sdpa__mk *mk, int64_t b, int64_t g, int64_t rows, int64_t jlo,
                      int64_t n, const float *tile, uint8_t *used, float *pt, float *pc, float *ot, float *vtile,
                      float *vg, const float *ones, float *otile) {
    const int64_t nl = (rows + SDPA__LANES - 1) / SDPA__LANES * SDPA__LANES, Ev = p->Ev;
    mk->pack_lanes(tile, (ptrdiff_t)n, rows, n, 1.0f, pt, nl);
    for (int64_t t = 0; t < n; ++t) {
        bool u = false;
        for (int64_t r = rows; r < nl; ++r)
            pt[t * nl + r] = 0.0f;
        for (int64_t r = 0; r < rows && !u; ++r)
            u = pt[t * nl + r] != 0.0f;
        used[t] = u;
    }
    const float *beta = NULL; /* the first product overwrites ot */
    for (int64_t t0 = 0; t0 < n; t0 += BN) {
        const int64_t t1 = t0 + BN < n ? t0 + BN : n;
        int64_t cu = 0;
        bool all = true;
        for (int64_t t = t0; t < t1; ++t) {
            cu += used[t];
            all = all && used[t];
        }
        if (cu == 0)
            continue;
        const sdpa__rows vr = p->load_v->rows(&p->v, b, g, jlo + t0, jlo + t1, vtile);
        if (all) {
            mk->lanes_gemm(Ev, t1 - t0, vr.data, 1, vr.stride, pt + t0 * nl, ot, beta, nl, nl);
        } else { /* gather the used keys: P rows and V rows */
            int64_t c = 0;
            for (int64_t t = t0; t < t1; ++t) {
                if (!used[t])
                    continue;
                memcpy(pc + c * nl, pt + t * nl, (size_t)nl * sizeof(float));
                memcpy(vg + c * Ev, vr.data + (t - t0) * vr.stride, (size_t)Ev * sizeof(float));
                ++c;
            }
            mk->lanes_gemm(Ev, cu, vg, 1, (ptrdiff_t)Ev, pc, ot, beta, nl, nl);
        }
        beta = ones;
    }
    if (beta == NULL) /* no key used: every row's P.V is 0 */
        memset(ot, 0, (size_t)(Ev * nl) * sizeof(float));
    mk->unpack_lanes(ot, nl, rows, Ev, otile, (ptrdiff_t)Ev);
}

/* The call's context: items = (b, h, block of row_block query rows), each written out by its
 * item with the thread's scratch (a layout each). */
typedef struct rctx {
    const sdpa__plan *p;
    layout lay;
    unsigned char *ws;
    size_t tstride; /* thread t's scratch: ws + t * tstride */
    sdpa__dropout drop;
    bool score_stage;
    int64_t nblocks; /* query-row blocks per (b, h) */
} rctx;

/* One item: the block's score tile, its rows' softmax and outputs, then P.V for the rows that
 * need it. */
static void reference_item(void *vctx, int64_t task, int tid) {
    const rctx *c = (const rctx *)vctx;
    const sdpa__plan *p = c->p;
    const layout l = c->lay;
    unsigned char *ws = c->ws + (size_t)tid * c->tstride;
    uint8_t *allowed = ws + l.flags, *state = ws + l.state;
    float *tile = (float *)(ws + l.tile), *otile = (float *)(ws + l.otile);
    float *qt = (float *)(ws + l.qt), *st = (float *)(ws + l.st), *pt = (float *)(ws + l.pt);
    float *ot = (float *)(ws + l.ot), *ktile = (float *)(ws + l.ktile), *vtile = (float *)(ws + l.vtile);
    float *vg = (float *)(ws + l.vg), *ones = (float *)(ws + l.ones);
    const sdpa__mk *mk = p->ctx.mk;
    for (int64_t t = 0; t < block_lanes(p); ++t)
        ones[t] = 1.0f;
    void *acc = ws + l.acc;
    const sdpa__dropout *drop = &c->drop;
    const int64_t bh = task / c->nblocks, b = bh / p->Hq, h = bh % p->Hq, g = h / p->group;
    const int64_t i0 = task % c->nblocks * p->row_block;
    const int64_t rows = p->L - i0 < p->row_block ? p->L - i0 : p->row_block;
    /* Keys the block can need: the union of the rows' structural ranges. */
    int64_t jlo = p->S, jhi = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t lo, hi;
        if (sdpa__rule_is_padding(&p->rules, b, i0 + r))
            continue;
        sdpa__rule_range(&p->rules, b, i0 + r, &lo, &hi);
        if (lo < hi) {
            jlo = lo < jlo ? lo : jlo;
            jhi = hi > jhi ? hi : jhi;
        }
    }
    if (c->score_stage) {
        jlo = 0;
        jhi = p->S;
    }
    const int64_t n = jhi > jlo ? jhi - jlo : 0;
    if (n > 0)
        scores(p, mk, b, h, g, i0, rows, jlo, n, tile, qt, st, ktile);
    bool need_pv = false;
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        void *orow;
        float *wrow, *lrow;
        row_outputs(p, b, h, i, &orow, &wrow, &lrow);
        state[r] = (uint8_t)softmax_row(p, drop, b, h, i, tile + r * n, jlo, n, allowed, acc, orow, wrow, lrow);
        if (state[r] == ROW_DONE)
            memset(tile + r * n, 0, (size_t)n * sizeof(float)); /* no contribution to P.V */
        else
            need_pv = true;
    }
    if (!need_pv || p->Ev == 0)
        return;
    p_times_v(p, mk, b, g, rows, jlo, n, tile, allowed, pt, st, ot, vtile, vg, ones, otile);
    for (int64_t r = 0; r < rows; ++r) {
        if (state[r] != ROW_PV)
            continue;
        const int64_t i = i0 + r;
        void *orow;
        float *wrow, *lrow;
        row_outputs(p, b, h, i, &orow, &wrow, &lrow);
        bool finite = true;
        for (int64_t d = 0; d < p->Ev; ++d) {
            const float x = drop->on ? otile[r * p->Ev + d] * drop->scale : otile[r * p->Ev + d];
            sdpa__out_put(p, orow, d, x);
            finite = finite && isfinite(x);
        }
        if (!finite) /* the float32 P.V sum overflowed (|v| near FLT_MAX): redo in double */
            sdpa__fallback_row_double(p, drop, b, h, i, acc, orow, wrow, lrow);
    }
}

static const char *reference_name(const sdpa__plan *p) {
    (void)p;
    return "reference";
}

static sdpa_status reference_finish(void *vctx) {
    const rctx *c = (const rctx *)vctx;
    sdpa__set_kernel_path(reference_name(c->p), sdpa__dtype_tag(c->p));
    return SDPA_OK;
}

static void reference_prepare(const sdpa__plan *p, void *shared, unsigned char *tws, size_t tstride, sdpa__work *w) {
    rctx *c = (rctx *)shared;
    c->p = p;
    c->lay = make_layout(p);
    c->ws = tws;
    c->tstride = tstride;
    sdpa__dropout_init(&c->drop, p);
    c->score_stage = p->has_weights && p->weights_stage != SDPA_WEIGHTS_PROBABILITIES;
    c->nblocks = (p->L + p->row_block - 1) / p->row_block;
    w->items = p->B * p->Hq * c->nblocks;
    w->item = reference_item;
    w->ctx = c;
    w->finish = reference_finish;
}

static sdpa__fit reference_supports(const sdpa__plan *p, const char **why) {
    (void)p;
    (void)why;
    return SDPA__FIT_AUTO;
}

static int reference_threads(const sdpa__plan *p) {
    (void)p;
    return 1;
}

static size_t reference_thread_bytes(const sdpa__plan *p) { return make_layout(p).total; }

static size_t reference_shared_bytes(const sdpa__plan *p) {
    (void)p;
    return sdpa__align64(sizeof(rctx));
}

const sdpa__kernel sdpa__kernel_reference = {
    .id = SDPA_KERNEL_REFERENCE,
    .enum_name = "SDPA_KERNEL_REFERENCE",
    .checks_kv_inline = false,
    .supports = reference_supports,
    .threads = reference_threads,
    .thread_bytes = reference_thread_bytes,
    .shared_bytes = reference_shared_bytes,
    .prepare = reference_prepare,
    .name = reference_name,
};
