/* The tiled kernel (FlashAttention-2 style). One work item is (batch b, query head h, block of up
 * to SDPA__TILE_Q query rows); its rows are the vector lanes of every tile (microkernel.h).
 *
 *   Qt = scale * Q_block^T, packed once per item (zero lanes for rows that read nothing)
 *   for each tile of SDPA__TILE_K keys that some row of the block may attend:
 *     St = K_tile Qt                      (lanes_gemm; K rows from the loader, load.h)
 *     softcap; bias, allow-mask and the structural rules (causal, window, key lengths) set
 *     blocked scores to -inf, but only in tiles that are not fully allowed
 *     online softmax: running max m, alpha = exp(m_old - m_new), P = exp(S - m_new),
 *     l = alpha l + sum P (pre-dropout; l in double)
 *     dropout zeroes P where the (b, h, i, j) keep bit says so
 *     Ot = alpha Ot + V_tile^T P          (lanes_gemm; V rows from the loader)
 *   out = Ot / l (times 1/(1-p) under dropout), lse = m + log l
 *
 * Tiles that no row may attend (causal, window, key/query lengths, an all-zero stretch of the
 * allow-mask) are never computed; tiles every row may fully attend skip the per-element work.
 * A key that no row of the tile may attend is never read into P.V: its V row is left out (the
 * used keys are gathered), so NaN stored there cannot reach out through 0 * NaN.
 * A row whose float32 scores or P.V sums are not finite although the inputs are (overflow) is
 * recomputed in double (fallback_double.c).
 * Q, K and V reach the micro-kernels only through the plan's loaders: float32 rows with unit
 * inner stride in place, anything else copied (widened) into the thread's loader tiles.
 * SDPA_PRECISION_REDUCED (AVX512-BF16, sdpa.h's bound): with bf16 q and k, Q is packed as bf16
 * pairs and St = K_tile Qt runs on VDPBF16PS over K rows read in place; with bf16 v, P is
 * rounded to bf16 (nearest even) and packed in key pairs, the tile's V rows are packed in key
 * pairs once per (item, kv tile), and Ot = alpha Ot + V_tile^T P runs on VDPBF16PS. Softmax,
 * l and Ot stay float32. DEFAULT / F32 never take these paths (exact widening, same bits as f32).
 * With AMX granted (the AMX column, dispatch.h) items are 256 query rows and tiles 128 keys
 * (tile_q, tile_k: more rows per packed V tile, more key pairs per load and store of the
 * accumulator tiles); P.V of a causal diagonal tile runs over all its keys (pv_whole_tile);
 * fully allowed tiles without softcap, ALiBi or dropout take raw scores and the column's fused
 * softmax_pack (scale, lazy reference point, P packed to bf16 pairs in one pass); the column's
 * begin/end configure and release this thread's tiles around the item's tile loop.
 * Extra memory: per thread, tiles of (E + TILE_K + Ev) x TILE_Q floats, TILE_K x Ev floats and
 * the loader tiles (TILE_Q x E, TILE_K x E, TILE_K x Ev floats; the last one also holds the
 * f16/bf16 out rows before they are narrowed), under REDUCED with bf16 v also TILE_K / 2 x
 * (TILE_Q + Ev) pairs; under REDUCED every tile is sized for 256 rows and 128 keys (whatever
 * the AMX permission: it may be granted between planning and the run);
 * nothing grows with L or S. Work items are the same for every thread count, so results are
 * bit-identical for any num_threads. */
#include "kernel.h"
#include "dispatch.h" /* the sdpa__mk_bf16 type (the context resolved which one) */
#include "load.h"

#include <math.h>
#include <string.h>

#define BM SDPA__TILE_Q /* query rows per work item, unless the bf16 column asks for more (ctx tile_q) */
#define BM_MAX 256     /* the most a column may ask for (the context's tile_q_size under REDUCED) */
#define BN_MAX 128     /* keys per tile: the most a column may ask for (ctx tile_k_size) */

enum { LANE_OFF = 0, LANE_VALID = 1, LANE_PADDING = 2, LANE_EMPTY = 3 };

typedef struct layout {
    size_t qt, st, ot, vg, qtile, ktile, vtile, m, alpha, tsum, l, acc, bad, lo, hi, cnt, state, used, keep, pp, vp, idx,
        total;
} layout;

static size_t take(size_t *at, size_t bytes) {
    size_t here = *at;
    *at = sdpa__add_sat(*at, sdpa__align64(bytes));
    return here;
}

/* Rows per item and keys per tile that the layout must hold: the context's (a workspace-size
 * query: what any column may ask for, whatever the AMX permission, which may be granted
 * between the query and the call). */
static size_t layout_rows(const sdpa__plan *p) { return (size_t)(p->exec.sizing ? p->ctx.tile_q_size : p->ctx.tile_q); }
static size_t layout_keys(const sdpa__plan *p) { return (size_t)(p->exec.sizing ? p->ctx.tile_k_size : p->ctx.tile_k); }

static layout make_layout(const sdpa__plan *p) {
    const size_t E = (size_t)p->E, Ev = (size_t)p->Ev, f = sizeof(float), BMX = layout_rows(p), BNX = layout_keys(p);
    const size_t VR = BMX > BNX ? BMX : BNX; /* the V loader tile also holds an item's out rows */
    layout l;
    size_t at = 0;
    l.qt = take(&at, sdpa__mul_sat(sdpa__mul_sat(E, BMX), f));
    l.st = take(&at, BNX * BMX * f);
    l.ot = take(&at, sdpa__mul_sat(sdpa__mul_sat(Ev, BMX), f));
    l.vg = take(&at, sdpa__mul_sat(sdpa__mul_sat(Ev, BNX), f));
    l.qtile = take(&at, sdpa__mul_sat(sdpa__mul_sat(E, BMX), f)); /* loader tiles (load.h) */
    l.ktile = take(&at, sdpa__mul_sat(sdpa__mul_sat(E, BNX), f));
    l.vtile = take(&at, sdpa__mul_sat(sdpa__mul_sat(Ev, VR), f));
    l.m = take(&at, BMX * f);
    l.alpha = take(&at, BMX * f);
    l.tsum = take(&at, BMX * f);
    l.l = take(&at, BMX * sizeof(double));
    l.acc = take(&at, sdpa__fallback_scratch_bytes(p)); /* the double fallback's scratch */
    l.bad = take(&at, BMX * sizeof(int32_t));
    l.lo = take(&at, BMX * sizeof(int32_t));
    l.hi = take(&at, BMX * sizeof(int32_t));
    l.cnt = take(&at, (BNX + 1) * sizeof(int32_t));
    l.state = take(&at, BMX);
    l.used = take(&at, BNX);
    l.keep = take(&at, BNX);
    /* bf16 P.V (REDUCED with bf16 V): probabilities and value rows in key pairs, used keys */
    const bool pairs = p->exec.sizing ? p->ctx.pv16_size : p->ctx.pv16 != NULL;
    l.pp = take(&at, pairs ? (BNX / 2) * BMX * sizeof(uint32_t) : 0);
    l.vp = take(&at, pairs ? sdpa__mul_sat(sdpa__mul_sat(Ev, BNX / 2), sizeof(uint32_t)) : 0);
    l.idx = take(&at, pairs ? BNX * sizeof(int32_t) : 0);
    l.total = at;
    return l;
}

static int64_t num_tasks(const sdpa__plan *p, int64_t bm) { return p->B * p->Hq * ((p->L + bm - 1) / bm); }

static int tiled_threads(const sdpa__plan *p) {
    const int64_t tasks = num_tasks(p, BM); /* a cap: an item of a column's tile_q rows is larger */
    /* About 4 MFLOP per thread at least (times the cost of starting one, threads.c): below
     * that, a thread costs more than it saves. */
    const double flops = 2.0 * (double)p->B * (double)p->Hq * (double)p->L * (double)p->S * (double)(p->E + p->Ev);
    double cap = flops / (4e6 * sdpa__thread_work_scale(&p->exec, p->num_threads));
    int64_t t = p->num_threads < SDPA__MAX_THREADS ? p->num_threads : SDPA__MAX_THREADS;
    if (t > tasks)
        t = tasks;
    if ((double)t > cap)
        t = (int64_t)cap;
    return t < 1 ? 1 : (int)t;
}

static size_t tiled_thread_bytes(const sdpa__plan *p) { return make_layout(p).total; }

struct item;  /* one work item's working set (below) */
struct ktile; /* a K tile as the score operation reads it (below) */

typedef struct tctx {
    const sdpa__plan *p;
    const sdpa__mk *mk;
    const sdpa__mk_bf16 *mk16; /* REDUCED with bf16 q and k: scores by bf16 dot products; else NULL */
    const sdpa__mk_bf16 *pv16; /* REDUCED with bf16 v: P rounded to bf16, P.V by bf16 dot products; else NULL */
    void (*tiles_begin)(void), (*tiles_end)(void); /* the column's begin / end, where mk16 or pv16 uses it */
    bool fused; /* fully allowed tiles: raw scores, then the column's softmax_pack (no softcap, ALiBi, dropout) */
    sdpa__dropout drop;
    layout lay;
    unsigned char *ws;
    size_t tstride; /* thread t's scratch: ws + t * tstride */
    float qscale;
    int64_t bm, bn; /* query rows per item, keys per tile (the context's tile_q, tile_k) */
    /* The operations of the context's columns (tiled_prepare): Q packing, K tiles and scores
     * (float32, or score16's bf16 products), P.V (float32, or pv16's). */
    void (*pack_q)(struct item *it);
    struct ktile (*load_k)(struct item *it, int64_t ta, int64_t tc);
    void (*scores)(const struct item *it, struct ktile kt, int64_t t0, int64_t n, int64_t l0, int64_t w, float scale,
                   float *sc);
    void (*pv)(struct item *it, int64_t ta, int64_t tc, bool ranged, bool all_used, bool packed);
} tctx;

/* SDPA_PRECISION_REDUCED with bf16 q and k: Q rows (raw bf16) packed in pairs for the lanes
 * scores, qp[pi * nl + l] = q_l[2 pi] | q_l[2 pi + 1] << 16; lanes that read nothing get zeros
 * (as their zero Q lanes do on the float32 path). */
static void bf16_pack_pairs(sdpa__rows16 q16, int64_t E, int64_t rows, int64_t nl, const uint8_t *state,
                            uint32_t *qp) {
    const int64_t np = (E + 1) / 2, full = E / 2;
    for (int64_t l = 0; l < nl; ++l) {
        if (l >= rows || state[l] != LANE_VALID) {
            for (int64_t pi = 0; pi < np; ++pi)
                qp[pi * nl + l] = 0u;
            continue;
        }
        const uint16_t *q = q16.data + l * q16.stride;
        for (int64_t pi = 0; pi < full; ++pi) { /* two adjacent encodings, low one first (x86: little endian) */
            uint32_t x;
            memcpy(&x, q + 2 * pi, sizeof x);
            qp[pi * nl + l] = x;
        }
        if (full < np)
            qp[full * nl + l] = (uint32_t)q[E - 1];
    }
}

/* A zero out row; lse = lse_value (-inf, or the head's sink for an empty row). */
static void write_zero_row(const sdpa__plan *p, void *orow, float *lrow, float lse_value) {
    sdpa__out_zero_row(p, orow);
    if (lrow)
        *lrow = lse_value;
}

/* Per-element rules for a tile: structure, allow-mask, bias (-inf blocks; added where allowed).
 * Blocked elements become -inf; used[t] = some lane may attend key ta + t; bad lanes flagged. */
/* The ALiBi term on lanes [l0, l1) of a tile (keys j0 .. j0 + n - 1): rules.c gives its lane form,
 * the micro-kernel applies it where it has a vector loop for it (the same bits either way). */
static void alibi_lanes(const sdpa__plan *p, const sdpa__mk *mk, int64_t b, int64_t h, int64_t i0, const uint8_t *state,
                        int64_t l0, int64_t l1, int64_t j0, int64_t n, float *s, int64_t ld) {
    for (int64_t c0 = l0; c0 < l1; c0 += SDPA__ALIBI_LANES) { /* the lane form takes 64 lanes at most */
        const int64_t c1 = l1 - c0 < SDPA__ALIBI_LANES ? l1 : c0 + SDPA__ALIBI_LANES;
        float sl[SDPA__ALIBI_LANES], lf[SDPA__ALIBI_LANES], base;
        if (mk->lanes_sub_abs != NULL &&
            sdpa__rule_alibi_lanes_form(&p->rules, b, h, i0, state, LANE_VALID, c0, c1, j0, n, sl, lf, &base)) {
            mk->lanes_sub_abs(s + c0, ld, n, c1 - c0, sl, lf, base);
            continue;
        }
        sdpa__rule_alibi_add_lanes(&p->rules, b, h, i0, state, LANE_VALID, c0, c1, j0, n, s, ld);
    }
}

static bool apply_rules(const sdpa__plan *p, int64_t b, int64_t h, int64_t i0, int64_t nl, const uint8_t *state,
                        const int32_t *lo, const int32_t *hi, int64_t ta, int64_t n, float *st, uint8_t *used,
                        int32_t *bad) {
    memset(used, 0, (size_t)n);
    for (int64_t r = 0; r < nl; ++r) {
        if (state[r] != LANE_VALID) {
            for (int64_t t = 0; t < n; ++t)
                st[t * nl + r] = -INFINITY;
            continue;
        }
        const int64_t i = i0 + r;
        uint8_t ok[BN_MAX];
        sdpa__rule_row_flags(&p->rules, b, h, i, lo[r], hi[r], ta, n, ok);
        const void *brow = p->rules.has_bias ? sdpa__rule_bias_row(&p->rules, b, h, i) : NULL;
        for (int64_t t = 0; t < n; ++t) {
            float *x = &st[t * nl + r];
            if (ok[t]) {
                if (brow != NULL)
                    *x += sdpa__rule_bias_at(&p->rules, brow, ta + t);
                used[t] = 1;
                if (!isfinite(*x))
                    bad[r] = -1;
            } else {
                *x = -INFINITY;
            }
        }
    }
    for (int64_t t = 0; t < n; ++t)
        if (!used[t])
            return false;
    return true;
}

/* used[t] for a tile with structural rules only: some valid lane's [lo, hi) holds ta + t. */
static bool range_used(int64_t nl, const uint8_t *state, const int32_t *lo, const int32_t *hi, int64_t ta,
                       int64_t n, int32_t *cnt, uint8_t *used) {
    memset(cnt, 0, (size_t)(n + 1) * sizeof *cnt);
    for (int64_t r = 0; r < nl; ++r) {
        if (state[r] != LANE_VALID)
            continue;
        const int64_t s = (lo[r] > ta ? lo[r] : ta) - ta, e = (hi[r] < ta + n ? hi[r] : ta + n) - ta;
        if (s < e) {
            cnt[s]++;
            cnt[e]--;
        }
    }
    bool all = true;
    int32_t run = 0;
    for (int64_t t = 0; t < n; ++t) {
        run += cnt[t];
        used[t] = run > 0;
        all = all && run > 0;
    }
    return all;
}

/* One item's working set: the thread's scratch (layout) and the item's geometry. */
typedef struct item {
    const tctx *c;
    const sdpa__plan *p;
    const sdpa__mk *mk;
    float *qt, *st, *ot, *qtile, *ktile, *vtile, *vg, *m, *alpha, *tsum;
    double *l;
    void *acc;
    int32_t *bad, *lo, *hi, *cnt, *idx;
    uint32_t *pp, *vp;
    uint8_t *state, *used, *keep;
    int32_t cs[BM_MAX / SDPA__LANES], ce[BM_MAX / SDPA__LANES]; /* per lane chunk: its keys [cs, ce) */
    int64_t b, h, g, i0, rows, nl, jmin, jmax;
    bool any_valid;
    const float *beta; /* NULL until the item's first P.V (which then overwrites Ot) */
} item;

/* A K tile as the score operation reads it: row t at data + t * stride elements (f32 rows from
 * the loader, or raw bf16 rows for the bf16 column). */
typedef struct ktile {
    const void *data;
    ptrdiff_t stride;
} ktile;

/* Lanes [l0, l0 + w) of the lane chunk starting at l0 (mk->range_lanes wide, the last one
 * shorter): w. */
static int64_t chunk_width(const item *it, int64_t l0) {
    const int64_t rl = it->mk->range_lanes;
    return it->nl - l0 < rl ? it->nl - l0 : rl;
}

/* ---- the score and P.V operations: the float32 ones, and the bf16 column's (the context's
 * score16 / pv16 chose which in tiled_prepare) ---- */

/* Qt[e][lane] = scale * q[i0 + lane][e]: the loader's float32 rows, SIMD transpose, then the
 * idle lanes cleared (a padding or fully blocked query row is never inspected and may hold NaN). */
static void pack_q_f32(item *it) {
    const sdpa__plan *p = it->p;
    const int64_t E = p->E, nl = it->nl;
    const sdpa__rows qr = p->load_q->rows(&p->q, it->b, it->h, it->i0, it->i0 + it->rows, it->qtile);
    it->mk->pack_lanes(qr.data, qr.stride, it->rows, E, it->c->qscale, it->qt, nl);
    for (int64_t r = 0; r < nl; ++r)
        if (it->state[r] != LANE_VALID)
            for (int64_t e = 0; e < E; ++e)
                it->qt[e * nl + r] = 0.0f;
}

/* Raw bf16 q rows packed in pairs into Qt's space (the scale is applied to the scores). */
static void pack_q_col(item *it) {
    const sdpa__plan *p = it->p;
    const sdpa__rows16 q16 = p->load_q->rows_bf16(&p->q, it->b, it->h, it->i0, it->i0 + it->rows, (uint16_t *)it->qtile);
    bf16_pack_pairs(q16, p->E, it->rows, it->nl, it->state, (uint32_t *)it->qt);
}

static ktile load_k_f32(item *it, int64_t ta, int64_t tc) {
    const sdpa__rows kr = it->p->load_k->rows(&it->p->k, it->b, it->g, ta, tc, it->ktile);
    return (ktile){kr.data, kr.stride};
}

static ktile load_k_col(item *it, int64_t ta, int64_t tc) {
    const sdpa__rows16 kr = it->p->load_k->rows_bf16(&it->p->k, it->b, it->g, ta, tc, (uint16_t *)it->ktile);
    return (ktile){kr.data, kr.stride};
}

/* Scores of key rows [t0, t0 + n) of kt on lanes [l0, l0 + w) into sc (row stride nl): float32
 * lanes_gemm (the scale is in Qt: scale is not used), or the column's bf16 products times scale. */
static void scores_f32(const item *it, ktile kt, int64_t t0, int64_t n, int64_t l0, int64_t w, float scale, float *sc) {
    (void)scale;
    it->mk->lanes_gemm(n, it->p->E, (const float *)kt.data + t0 * kt.stride, kt.stride, 1, it->qt + l0, sc, NULL, w,
                       it->nl);
}

static void scores_col(const item *it, ktile kt, int64_t t0, int64_t n, int64_t l0, int64_t w, float scale,
                        float *sc) {
    it->c->mk16->lanes_scores((const uint32_t *)it->qt + l0, it->nl, it->p->E, w,
                              (const uint16_t *)kt.data + t0 * kt.stride, kt.stride, n, scale, sc, it->nl);
}

/* The keys of the tile some lane uses (used[t]) moved to the front of St: their count; idx
 * (if not NULL) receives their tile positions. */
static int64_t gather_used(item *it, int64_t n, int32_t *idx) {
    const int64_t nl = it->nl;
    int64_t cu = 0;
    for (int64_t t = 0; t < n; ++t) {
        if (!it->used[t])
            continue;
        if (cu != t)
            memcpy(it->st + cu * nl, it->st + t * nl, (size_t)nl * sizeof(float));
        if (idx != NULL)
            idx[cu] = (int32_t)t;
        ++cu;
    }
    return cu;
}

/* Ot = beta Ot + V_tile^T P in float32: per lane chunk over its keys (a ranged tile whose keys
 * are all used: keys outside a chunk's reach have P = 0 there), over the whole tile, or over
 * the used keys gathered (the others' V rows are never read). */
static void pv_f32(item *it, int64_t ta, int64_t tc, bool ranged, bool all_used, bool packed) {
    (void)packed;
    const sdpa__plan *p = it->p;
    const sdpa__mk *mk = it->mk;
    const int64_t Ev = p->Ev, nl = it->nl, n = tc - ta;
    const sdpa__rows vr = p->load_v->rows(&p->v, it->b, it->g, ta, tc, it->vtile);
    if (all_used && ranged) {
        int nc = 0;
        for (int64_t l0 = 0; l0 < nl; l0 += mk->range_lanes, ++nc) {
            const int64_t w = chunk_width(it, l0), s0 = it->cs[nc], e0 = it->ce[nc];
            mk->lanes_gemm(Ev, e0 - s0, vr.data + ((s0 < e0 ? s0 : ta) - ta) * vr.stride, 1, vr.stride,
                           it->st + (s0 < e0 ? s0 - ta : 0) * nl + l0, it->ot + l0, it->beta ? it->beta + l0 : NULL, w,
                           nl);
        }
    } else if (all_used) {
        mk->lanes_gemm(Ev, n, vr.data, 1, vr.stride, it->st, it->ot, it->beta, nl, nl);
    } else {
        int64_t cu = 0;
        for (int64_t t = 0; t < n; ++t) {
            if (!it->used[t])
                continue;
            if (cu != t)
                memcpy(it->st + cu * nl, it->st + t * nl, (size_t)nl * sizeof(float));
            memcpy(it->vg + cu * Ev, vr.data + t * vr.stride, (size_t)Ev * sizeof(float));
            ++cu;
        }
        mk->lanes_gemm(Ev, cu, it->vg, 1, (ptrdiff_t)Ev, it->st, it->ot, it->beta, nl, nl);
    }
}

/* The bf16 column's P.V: P rounded to bf16 and packed in key pairs (unless softmax_pack did),
 * the used keys' V rows packed in pairs, then the pair products, per lane chunk for the pairs
 * that hold its keys (P = 0 beside them) unless the column computes whole tiles only. */
static void pv_col(item *it, int64_t ta, int64_t tc, bool ranged, bool all_used, bool packed) {
    const sdpa__plan *p = it->p;
    const sdpa__mk_bf16 *pv = it->c->pv16;
    const int64_t Ev = p->Ev, nl = it->nl, n = tc - ta;
    const sdpa__rows16 vr16 = p->load_v->rows_bf16(&p->v, it->b, it->g, ta, tc, (uint16_t *)it->vtile);
    const int64_t cu = all_used ? n : gather_used(it, n, it->idx);
    if (!packed)
        pv->pack_p(it->st, nl, cu, nl, it->pp, nl);
    pv->pack_v(vr16.data, vr16.stride, all_used ? NULL : it->idx, cu, Ev, it->vp);
    if (all_used && ranged && !pv->pv_whole_tile) {
        int nc = 0;
        for (int64_t l0 = 0; l0 < nl; l0 += it->mk->range_lanes, ++nc) {
            const int64_t w = chunk_width(it, l0), s0 = it->cs[nc], e0 = it->ce[nc];
            const int64_t tp0 = s0 < e0 ? (s0 - ta) / 2 : 0, tp1 = s0 < e0 ? (e0 - ta + 1) / 2 : 0;
            pv->lanes_pv(Ev, tp0, tp1 - tp0, it->vp, it->pp + tp0 * nl + l0, nl, it->ot + l0,
                         it->beta ? it->beta + l0 : NULL, w, nl);
        }
    } else {
        pv->lanes_pv(Ev, 0, (cu + 1) / 2, it->vp, it->pp, nl, it->ot, it->beta, nl, nl);
    }
}

/* ---- the item's paragraphs ---- */

/* Set-up: the thread's scratch, the item's (b, h, rows) and each lane's state and key range
 * [lo, hi); jmin, jmax bound the keys of the item. Head-major, so that consecutive tasks (on
 * one thread or on neighbours) reuse the head's K and V from cache; within a head the heaviest
 * blocks first (the last ones under a causal rule), so that light tasks end the call. */
static void item_setup(const tctx *c, int64_t task, int tid, item *it) {
    const sdpa__plan *p = c->p;
    const layout *lay = &c->lay;
    unsigned char *ws = c->ws + (size_t)tid * c->tstride;
    it->c = c;
    it->p = p;
    it->mk = c->mk;
    it->qt = (float *)(ws + lay->qt), it->st = (float *)(ws + lay->st), it->ot = (float *)(ws + lay->ot);
    it->qtile = (float *)(ws + lay->qtile), it->ktile = (float *)(ws + lay->ktile), it->vtile = (float *)(ws + lay->vtile);
    it->vg = (float *)(ws + lay->vg), it->m = (float *)(ws + lay->m), it->alpha = (float *)(ws + lay->alpha);
    it->tsum = (float *)(ws + lay->tsum);
    it->l = (double *)(ws + lay->l);
    it->acc = ws + lay->acc;
    it->bad = (int32_t *)(ws + lay->bad), it->lo = (int32_t *)(ws + lay->lo), it->hi = (int32_t *)(ws + lay->hi);
    it->cnt = (int32_t *)(ws + lay->cnt), it->idx = (int32_t *)(ws + lay->idx);
    it->state = ws + lay->state, it->used = ws + lay->used, it->keep = ws + lay->keep;
    it->pp = (uint32_t *)(ws + lay->pp), it->vp = (uint32_t *)(ws + lay->vp);

    const int64_t bm = c->bm, nqb = (p->L + bm - 1) / bm;
    const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
    it->b = bh / p->Hq, it->h = bh % p->Hq, it->g = it->h / p->group;
    it->i0 = qb * bm, it->rows = p->L - it->i0 < bm ? p->L - it->i0 : bm;
    it->nl = (it->rows + SDPA__LANES - 1) / SDPA__LANES * SDPA__LANES;
    it->jmin = p->S, it->jmax = 0;
    it->any_valid = false;
    it->beta = it->alpha;
    for (int64_t r = 0; r < it->nl; ++r) {
        it->lo[r] = it->hi[r] = 0;
        it->state[r] = LANE_OFF;
        if (r >= it->rows)
            continue;
        if (sdpa__rule_is_padding(&p->rules, it->b, it->i0 + r)) {
            it->state[r] = LANE_PADDING;
            continue;
        }
        int64_t a, e;
        sdpa__rule_range(&p->rules, it->b, it->i0 + r, &a, &e);
        if (a >= e || a >= p->S) {
            it->state[r] = LANE_EMPTY;
            continue;
        }
        it->state[r] = LANE_VALID;
        it->any_valid = true;
        it->lo[r] = (int32_t)a;
        it->hi[r] = (int32_t)e;
        it->jmin = a < it->jmin ? a : it->jmin;
        it->jmax = e > it->jmax ? e : it->jmax;
    }
}

/* Score tile: St for keys [ta, tc) (scores, softcap, ALiBi, the rules' -inf, the online
 * softmax step); *all_used says whether every key of the tile is used by some lane, *packed
 * whether P is already in pp (the fused softmax_pack). Structural rules only (ranged): each
 * chunk of rows (mk->range_lanes of them) computes just the keys its rows can reach,
 * [cs, ce); the rest of its column is P = 0. A causal diagonal tile then costs about 5/8
 * (16-row chunks) or 3/4 (32) of a full one. */
static void score_tile(item *it, int64_t ta, int64_t tc, sdpa__tile_class tcl, bool *all_used, bool *packed) {
    const tctx *c = it->c;
    const sdpa__plan *p = it->p;
    const sdpa__mk *mk = it->mk;
    const int64_t nl = it->nl, n = tc - ta;
    float *st = it->st;
    const ktile kt = c->load_k(it, ta, tc);
    *all_used = true;
    *packed = false;
    if (tcl == SDPA__TILE_PARTIAL_RANGE) {
        *all_used = range_used(nl, it->state, it->lo, it->hi, ta, n, it->cnt, it->used);
        int nc = 0;
        for (int64_t l0 = 0; l0 < nl; l0 += mk->range_lanes, ++nc) {
            const int64_t w = chunk_width(it, l0);
            int64_t s0 = tc, e0 = ta;
            for (int64_t r = l0; r < l0 + w; ++r) {
                if (it->state[r] != LANE_VALID)
                    continue;
                s0 = it->lo[r] < s0 ? it->lo[r] : s0;
                e0 = it->hi[r] > e0 ? it->hi[r] : e0;
            }
            s0 = s0 > ta ? s0 : ta;
            e0 = e0 < tc ? e0 : tc;
            if (e0 < s0)
                e0 = s0;
            it->cs[nc] = (int32_t)s0;
            it->ce[nc] = (int32_t)e0;
            for (int64_t t = 0; t < n; ++t) /* outside the chunk's reach: blocked */
                if (ta + t < s0 || ta + t >= e0)
                    for (int64_t r = l0; r < l0 + w; ++r)
                        st[t * nl + r] = 0.0f;
            float *sc = st + (s0 - ta) * nl + l0;
            if (s0 < e0) {
                c->scores(it, kt, s0 - ta, e0 - s0, l0, w, c->qscale, sc);
                if (p->softcap > 0.0f)
                    for (int64_t t = 0; t < e0 - s0; ++t)
                        mk->softcap(sc + t * nl, w, p->softcap);
                if (p->rules.alibi_slopes != NULL) /* ALiBi (rules.c), a bias */
                    alibi_lanes(p, mk, it->b, it->h, it->i0, it->state, l0, l0 + w, s0, e0 - s0, st + (s0 - ta) * nl,
                                nl);
                mk->lanes_range_mask(sc, e0 - s0, w, nl, (int32_t)s0, it->lo + l0, it->hi + l0, it->bad + l0);
            }
            mk->lanes_softmax(sc, e0 - s0, w, nl, it->m + l0, it->alpha + l0, it->tsum + l0, NULL);
        }
        return;
    }
    if (c->fused && tcl == SDPA__TILE_FULL) { /* raw scores; softmax scales and packs P */
        c->scores(it, kt, 0, n, 0, nl, 1.0f, st);
        c->pv16->softmax_pack(st, n, nl, nl, c->qscale, it->m, it->alpha, it->tsum, it->bad, it->pp, nl);
        *packed = true;
        return;
    }
    c->scores(it, kt, 0, n, 0, nl, c->qscale, st);
    if (p->softcap > 0.0f)
        mk->softcap(st, n * nl, p->softcap);
    if (p->rules.alibi_slopes != NULL) /* ALiBi (rules.c), a bias */
        alibi_lanes(p, mk, it->b, it->h, it->i0, it->state, 0, nl, ta, n, st, nl);
    int32_t *check = it->bad;
    if (tcl == SDPA__TILE_PARTIAL) {
        *all_used = apply_rules(p, it->b, it->h, it->i0, nl, it->state, it->lo, it->hi, ta, n, st, it->used, it->bad);
        check = NULL;
    }
    mk->lanes_softmax(st, n, nl, nl, it->m, it->alpha, it->tsum, check);
}

/* The item's tiles: Q packed once, then for each tile that some row may attend its scores, the
 * running sums, dropout and P.V. */
static void item_tiles(item *it) {
    const tctx *c = it->c;
    const sdpa__plan *p = it->p;
    const int64_t nl = it->nl, bn = c->bn;
    for (int64_t r = 0; r < nl; ++r) {
        it->m[r] = -INFINITY;
        it->l[r] = 0.0;
        it->bad[r] = 0;
    }
    c->pack_q(it);
    it->beta = NULL; /* the first P.V overwrites Ot (its alpha is 0: m was -inf) */
    if (c->tiles_begin != NULL) /* the column's set-up of this thread for this item (tile configuration) */
        c->tiles_begin();
    for (int64_t a = it->jmin / bn * bn; a < it->jmax; a += bn) {
        const int64_t ta = a > it->jmin ? a : it->jmin, tc = a + bn < it->jmax ? a + bn : it->jmax, n = tc - ta;
        const sdpa__tile_class tcl = sdpa__rule_classify_tile(&p->rules, it->b, it->h, it->i0, nl, it->lo, it->hi, ta, tc);
        if (tcl == SDPA__TILE_NONE)
            continue;
        bool all_used, packed;
        score_tile(it, ta, tc, tcl, &all_used, &packed);
        for (int64_t r = 0; r < nl; ++r)
            it->l[r] = it->l[r] * (double)it->alpha[r] + (double)it->tsum[r];
        if (c->drop.on) {
            for (int64_t r = 0; r < nl; ++r) {
                if (it->state[r] != LANE_VALID)
                    continue;
                sdpa__dropout_keep(&c->drop, it->b, it->h, it->i0 + r, ta, n, it->keep);
                for (int64_t t = 0; t < n; ++t)
                    if (!it->keep[t])
                        it->st[t * nl + r] = 0.0f;
            }
        }
        if (p->Ev == 0)
            continue;
        c->pv(it, ta, tc, tcl == SDPA__TILE_PARTIAL_RANGE, all_used, packed);
        it->beta = it->alpha;
    }
    if (c->tiles_end != NULL)
        c->tiles_end();
}

/* Write rows: out = Ot / l (times 1/(1-p) under dropout), lse = m + log l; zero rows, and the
 * double fallback for rows float32 could not carry. */
static void write_rows(item *it) {
    const tctx *c = it->c;
    const sdpa__plan *p = it->p;
    const sdpa__mk *mk = it->mk;
    const int64_t nl = it->nl, rows = it->rows, Ev = p->Ev, b = it->b, h = it->h, i0 = it->i0;
    float *ot = it->ot, *m = it->m;
    double *l = it->l;
    if (it->beta == NULL) /* no tile ran: Ot was never written (every lane ends as a zero row) */
        memset(ot, 0, (size_t)(Ev * nl) * sizeof(float));
    /* Normalise in place, lanes in the inner loop (vectorised): out = Ot * (1/(1-p)) / l, and
     * note per lane whether every result is finite (x * inv is not finite if x is not). */
    float *inv = it->alpha;
    int32_t *nonfin = (int32_t *)it->tsum;
    const float sink = sdpa__sink(p->sinks, h);
    for (int64_t r = 0; r < nl; ++r) {
        const bool live = it->state[r] == LANE_VALID && !it->bad[r] && l[r] > 0.0;
        double num = (double)c->drop.scale;
        if (live && sink > -INFINITY) { /* the sink joins the denominator (and m) once, here */
            const float mn = sink > m[r] ? sink : m[r];
            const double f = exp((double)m[r] - (double)mn);
            l[r] = l[r] * f + exp((double)sink - (double)mn);
            m[r] = mn;
            num *= f;
        }
        inv[r] = live ? (float)(num / l[r]) : 0.0f;
        nonfin[r] = 0;
    }
    for (int64_t d = 0; d < (it->any_valid ? Ev : 0); ++d) {
        float *row = ot + d * nl;
        for (int64_t r = 0; r < nl; ++r) {
            const float y = row[r] * inv[r];
            uint32_t u;
            memcpy(&u, &y, sizeof u);
            nonfin[r] |= (int32_t)((u & 0x7f800000u) == 0x7f800000u);
            row[r] = y;
        }
    }
    /* Rows of out contiguous along Ev: write all rows with a SIMD transpose; the rows that need
     * other values (zeros, the double fallback) are overwritten below. */
    const int64_t os3 = p->out.strides[3];
    const bool bulk = it->any_valid && os3 == 1 && Ev > 0;
    if (bulk && p->ctx.out_narrow == NULL) { /* float32 out: the lanes straight into its rows */
        mk->unpack_lanes(ot, nl, rows, Ev,
                         p->out.data + b * p->out.strides[0] + h * p->out.strides[1] + i0 * p->out.strides[2],
                         (ptrdiff_t)p->out.strides[2]);
    } else if (bulk) { /* rows in the V loader tile (rows x Ev floats), then narrowed, rounded once */
        mk->unpack_lanes(ot, nl, rows, Ev, it->vtile, (ptrdiff_t)Ev);
        unsigned char *o0 = (unsigned char *)sdpa__out_row(p, b, h, i0);
        const ptrdiff_t rstride = (ptrdiff_t)p->out.strides[2] * (ptrdiff_t)p->ctx.out_elem;
        for (int64_t r = 0; r < rows; ++r)
            p->ctx.out_narrow(it->vtile + r * Ev, Ev, (uint16_t *)(void *)(o0 + r * rstride), 1);
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        void *orow = sdpa__out_row(p, b, h, i);
        float *lrow = p->has_lse ? p->lse + b * p->lse_strides[0] + h * p->lse_strides[1] + i * p->lse_strides[2]
                                 : NULL;
        if (it->state[r] != LANE_VALID) { /* padding, or no key in the row's range */
            write_zero_row(p, orow, lrow, it->state[r] == LANE_PADDING ? -INFINITY : sink);
            continue;
        }
        if (it->bad[r]) { /* a float32 score overflowed */
            sdpa__fallback_row_double(p, &c->drop, b, h, i, it->acc, orow, NULL, lrow);
            continue;
        }
        if (l[r] == 0.0) { /* every key blocked by the mask or bias: policy ZERO (Ot may be unset) */
            write_zero_row(p, orow, lrow, sink);
            continue;
        }
        if (nonfin[r]) { /* the float32 P.V sum overflowed */
            sdpa__fallback_row_double(p, &c->drop, b, h, i, it->acc, orow, NULL, lrow);
            continue;
        }
        if (!bulk)
            for (int64_t d = 0; d < Ev; ++d)
                sdpa__out_put(p, orow, d, ot[d * nl + r]);
        if (lrow)
            *lrow = (float)((double)m[r] + log(l[r]));
    }
}

static void tiled_task(void *vctx, int64_t task, int tid) {
    item it;
    item_setup((const tctx *)vctx, task, tid, &it);
    if (it.any_valid)
        item_tiles(&it);
    write_rows(&it);
}

static size_t tiled_shared_bytes(const sdpa__plan *p) {
    (void)p;
    return sdpa__align64(sizeof(tctx));
}

/* The name sdpa_last_kernel() gets (before the dtype tag): the context's. */
static const char *tiled_name(const sdpa__plan *p) { return p->ctx.tiled_name; }

static sdpa_status tiled_finish(void *vctx) {
    const tctx *c = (const tctx *)vctx;
    sdpa__set_kernel_path(tiled_name(c->p), sdpa__dtype_tag(c->p));
    return SDPA_OK;
}

/* The call's context in shared; items = (b, h, block of query rows), written out by each item. */
static void tiled_prepare(const sdpa__plan *p, void *shared, unsigned char *tws, size_t tstride, sdpa__work *w) {
    tctx *c = (tctx *)shared;
    c->p = p;
    c->mk = p->ctx.mk;
    c->mk16 = p->ctx.score16;
    c->pv16 = p->ctx.pv16;
    c->tiles_begin = p->ctx.tiles_begin;
    c->tiles_end = p->ctx.tiles_end;
    c->bm = p->ctx.tile_q;
    c->bn = p->ctx.tile_k;
    c->pack_q = c->mk16 != NULL ? pack_q_col : pack_q_f32;
    c->load_k = c->mk16 != NULL ? load_k_col : load_k_f32;
    c->scores = c->mk16 != NULL ? scores_col : scores_f32;
    c->pv = c->pv16 != NULL ? pv_col : pv_f32;
    c->lay = make_layout(p);
    c->ws = tws;
    c->tstride = tstride;
    sdpa__dropout_init(&c->drop, p);
    c->qscale = p->softcap > 0.0f ? (float)((double)p->scale / (double)p->softcap) : p->scale;
    c->fused = p->ctx.fusable && p->softcap <= 0.0f &&
               p->rules.alibi_slopes == NULL && !c->drop.on && p->Ev > 0 && c->qscale > 0.0f;
    w->items = num_tasks(p, c->bm);
    w->item = tiled_task;
    w->ctx = c;
    w->finish = tiled_finish;
}

static sdpa__fit tiled_supports(const sdpa__plan *p, const char **why) {
    if (p->has_weights) {
        *why = SDPA__WHY_NO_WEIGHTS;
        return SDPA__FIT_NO;
    }
    return SDPA__FIT_AUTO;
}

const sdpa__kernel sdpa__kernel_tiled = {
    .id = SDPA_KERNEL_TILED,
    .enum_name = "SDPA_KERNEL_TILED",
    .checks_kv_inline = false,
    .supports = tiled_supports,
    .threads = tiled_threads,
    .thread_bytes = tiled_thread_bytes,
    .shared_bytes = tiled_shared_bytes,
    .prepare = tiled_prepare,
    .name = tiled_name,
};
