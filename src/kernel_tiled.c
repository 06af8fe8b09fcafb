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
#include "dispatch.h"
#include "load.h"
#include "convert.h"

#include <math.h>
#include <string.h>

#define BM SDPA__TILE_Q /* query rows per work item, unless the bf16 column asks for more (tile_q) */
#define BM_MAX 256     /* the most a column may ask for: the layout of a REDUCED call holds it */
#define BN SDPA__TILE_K /* keys per tile, unless the bf16 column asks for more (tile_k) */
#define BN_MAX 128     /* the most a column may ask for */

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

/* Rows per item and keys per tile that the layout must hold: under REDUCED a bf16 column may
 * ask for up to BM_MAX and BN_MAX (decided in prepare; sized here whatever the AMX permission,
 * which may change in between). */
static size_t layout_rows(const sdpa__plan *p) { return p->precision == SDPA_PRECISION_REDUCED ? BM_MAX : BM; }
static size_t layout_keys(const sdpa__plan *p) { return p->precision == SDPA_PRECISION_REDUCED ? BN_MAX : BN; }

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
    const bool pairs = p->precision == SDPA_PRECISION_REDUCED && p->v.dtype == SDPA_DTYPE_BF16;
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

typedef struct tctx {
    const sdpa__plan *p;
    const sdpa__mk *mk;
    const sdpa__mk_bf16 *mk16; /* REDUCED with bf16 q and k: scores by bf16 dot products; else NULL */
    const sdpa__mk_bf16 *pv16; /* REDUCED with bf16 v: P rounded to bf16, P.V by bf16 dot products; else NULL */
    void (*tiles_begin)(void), (*tiles_end)(void); /* the column's (AMX), where mk16 or pv16 uses it */
    bool fused; /* fully allowed tiles: raw scores, then the column's softmax_pack (no softcap, ALiBi, dropout) */
    sdpa__dropout drop;
    layout lay;
    unsigned char *ws;
    size_t tstride; /* thread t's scratch: ws + t * tstride */
    float qscale;
    int64_t bm, bn; /* query rows per item, keys per tile: BM, BN, or the bf16 column's tile_q, tile_k */
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

static void tiled_task(void *vctx, int64_t task, int tid) {
    const tctx *c = (const tctx *)vctx;
    const sdpa__plan *p = c->p;
    const sdpa__mk *mk = c->mk;
    const layout *lay = &c->lay;
    unsigned char *ws = c->ws + (size_t)tid * c->tstride;
    float *qt = (float *)(ws + lay->qt), *st = (float *)(ws + lay->st), *ot = (float *)(ws + lay->ot);
    float *qtile = (float *)(ws + lay->qtile), *ktile = (float *)(ws + lay->ktile), *vtile = (float *)(ws + lay->vtile);
    float *vg = (float *)(ws + lay->vg), *m = (float *)(ws + lay->m), *alpha = (float *)(ws + lay->alpha);
    float *tsum = (float *)(ws + lay->tsum);
    double *l = (double *)(ws + lay->l);
    void *acc = ws + lay->acc;
    int32_t *bad = (int32_t *)(ws + lay->bad), *lo = (int32_t *)(ws + lay->lo), *hi = (int32_t *)(ws + lay->hi);
    int32_t *cnt = (int32_t *)(ws + lay->cnt), cs[BM_MAX / SDPA__LANES], ce[BM_MAX / SDPA__LANES];
    uint8_t *state = ws + lay->state, *used = ws + lay->used, *keep = ws + lay->keep;
    uint32_t *pp = (uint32_t *)(ws + lay->pp), *vp = (uint32_t *)(ws + lay->vp);
    int32_t *idx = (int32_t *)(ws + lay->idx);

    /* Head-major, so that consecutive tasks (on one thread or on neighbours) reuse the head's K
     * and V from cache; within a head the heaviest blocks first (the last ones under a causal
     * rule), so that light tasks end the call. */
    const int64_t bm = c->bm, bn = c->bn, nqb = (p->L + bm - 1) / bm;
    const int64_t qb = nqb - 1 - task % nqb, bh = task / nqb;
    const int64_t b = bh / p->Hq, h = bh % p->Hq, g = h / p->group;
    const int64_t i0 = qb * bm, rows = p->L - i0 < bm ? p->L - i0 : bm;
    const int64_t nl = (rows + SDPA__LANES - 1) / SDPA__LANES * SDPA__LANES;
    const int64_t E = p->E, Ev = p->Ev;

    int64_t jmin = p->S, jmax = 0;
    bool any_valid = false;
    const float *beta = alpha; /* NULL until the item's first P.V */
    for (int64_t r = 0; r < nl; ++r) {
        lo[r] = hi[r] = 0;
        state[r] = LANE_OFF;
        if (r >= rows)
            continue;
        if (sdpa__rule_is_padding(&p->rules, b, i0 + r)) {
            state[r] = LANE_PADDING;
            continue;
        }
        int64_t a, e;
        sdpa__rule_range(&p->rules, b, i0 + r, &a, &e);
        if (a >= e || a >= p->S) {
            state[r] = LANE_EMPTY;
            continue;
        }
        state[r] = LANE_VALID;
        any_valid = true;
        lo[r] = (int32_t)a;
        hi[r] = (int32_t)e;
        jmin = a < jmin ? a : jmin;
        jmax = e > jmax ? e : jmax;
    }

    if (any_valid) {
        /* Qt[e][lane] = scale * q[i0 + lane][e]; lanes that read nothing get zeros (a padding or
         * fully blocked query row is never inspected and may hold NaN). */
        for (int64_t r = 0; r < nl; ++r) {
            m[r] = -INFINITY;
            l[r] = 0.0;
            bad[r] = 0;
        }
        if (c->mk16 != NULL) { /* raw bf16 q rows, packed in pairs into Qt's space */
            const sdpa__rows16 q16 = p->load_q->rows_bf16(&p->q, b, h, i0, i0 + rows, (uint16_t *)qtile);
            bf16_pack_pairs(q16, E, rows, nl, state, (uint32_t *)qt);
        } else { /* float32 rows from the loader: SIMD transpose, then clear the idle lanes */
            const sdpa__rows qr = p->load_q->rows(&p->q, b, h, i0, i0 + rows, qtile);
            mk->pack_lanes(qr.data, qr.stride, rows, E, c->qscale, qt, nl);
            for (int64_t r = 0; r < nl; ++r)
                if (state[r] != LANE_VALID)
                    for (int64_t e = 0; e < E; ++e)
                        qt[e * nl + r] = 0.0f;
        }
        beta = NULL; /* the first P.V overwrites Ot (its alpha is 0: m was -inf) */
        if (c->tiles_begin != NULL) /* AMX: this thread's tile configuration, for this item */
            c->tiles_begin();

        for (int64_t a = jmin / bn * bn; a < jmax; a += bn) {
            const int64_t ta = a > jmin ? a : jmin, tc = a + bn < jmax ? a + bn : jmax, n = tc - ta;
            const sdpa__tile_class tcl = sdpa__rule_classify_tile(&p->rules, b, h, i0, nl, lo, hi, ta, tc);
            if (tcl == SDPA__TILE_NONE)
                continue;

            /* Structural rules only: each chunk of rows (mk->range_lanes of them) computes just
             * the keys its rows can reach, [s0, e0); the rest of its column is P = 0. A causal
             * diagonal tile then costs about 5/8 (16-row chunks) or 3/4 (32) of a full one. */
            const bool ranged = tcl == SDPA__TILE_PARTIAL_RANGE;
            bool packed = false; /* P already in pp (softmax_pack) */
            sdpa__rows kr = {NULL, 0};
            sdpa__rows16 kr16 = {NULL, 0};
            if (c->mk16 != NULL)
                kr16 = p->load_k->rows_bf16(&p->k, b, g, ta, tc, (uint16_t *)ktile);
            else
                kr = p->load_k->rows(&p->k, b, g, ta, tc, ktile);
            bool all_used = true;
            if (ranged) {
                all_used = range_used(nl, state, lo, hi, ta, n, cnt, used);
                int nc = 0;
                for (int64_t l0 = 0; l0 < nl; l0 += mk->range_lanes, ++nc) {
                    const int64_t w = nl - l0 < mk->range_lanes ? nl - l0 : mk->range_lanes;
                    int64_t s0 = tc, e0 = ta;
                    for (int64_t r = l0; r < l0 + w; ++r) {
                        if (state[r] != LANE_VALID)
                            continue;
                        s0 = lo[r] < s0 ? lo[r] : s0;
                        e0 = hi[r] > e0 ? hi[r] : e0;
                    }
                    s0 = s0 > ta ? s0 : ta;
                    e0 = e0 < tc ? e0 : tc;
                    if (e0 < s0)
                        e0 = s0;
                    cs[nc] = (int32_t)s0;
                    ce[nc] = (int32_t)e0;
                    for (int64_t t = 0; t < n; ++t) /* outside the chunk's reach: blocked */
                        if (ta + t < s0 || ta + t >= e0)
                            for (int64_t r = l0; r < l0 + w; ++r)
                                st[t * nl + r] = 0.0f;
                    float *sc = st + (s0 - ta) * nl + l0;
                    if (s0 < e0) {
                        if (c->mk16 != NULL) {
                            c->mk16->lanes_scores((const uint32_t *)qt + l0, nl, E, w,
                                                  kr16.data + (s0 - ta) * kr16.stride, kr16.stride, e0 - s0,
                                                  c->qscale, sc, nl);
                        } else {
                            mk->lanes_gemm(e0 - s0, E, kr.data + (s0 - ta) * kr.stride, kr.stride, 1, qt + l0, sc,
                                           NULL, w, nl);
                        }
                        if (p->softcap > 0.0f)
                            for (int64_t t = 0; t < e0 - s0; ++t)
                                mk->softcap(sc + t * nl, w, p->softcap);
                        if (p->rules.alibi_slopes != NULL) /* ALiBi (rules.c), a bias */
                            alibi_lanes(p, mk, b, h, i0, state, l0, l0 + w, s0, e0 - s0, st + (s0 - ta) * nl, nl);
                        mk->lanes_range_mask(sc, e0 - s0, w, nl, (int32_t)s0, lo + l0, hi + l0, bad + l0);
                    }
                    mk->lanes_softmax(sc, e0 - s0, w, nl, m + l0, alpha + l0, tsum + l0, NULL);
                }
            } else if (c->fused && tcl == SDPA__TILE_FULL) { /* raw scores; softmax scales and packs P */
                c->mk16->lanes_scores((const uint32_t *)qt, nl, E, nl, kr16.data, kr16.stride, n, 1.0f, st, nl);
                c->pv16->softmax_pack(st, n, nl, nl, c->qscale, m, alpha, tsum, bad, pp, nl);
                packed = true;
            } else {
                if (c->mk16 != NULL)
                    c->mk16->lanes_scores((const uint32_t *)qt, nl, E, nl, kr16.data, kr16.stride, n, c->qscale, st,
                                          nl);
                else
                    mk->lanes_gemm(n, E, kr.data, kr.stride, 1, qt, st, NULL, nl, nl);
                if (p->softcap > 0.0f)
                    mk->softcap(st, n * nl, p->softcap);
                if (p->rules.alibi_slopes != NULL) /* ALiBi (rules.c), a bias */
                    alibi_lanes(p, mk, b, h, i0, state, 0, nl, ta, n, st, nl);
                int32_t *check = bad;
                if (tcl == SDPA__TILE_PARTIAL) {
                    all_used = apply_rules(p, b, h, i0, nl, state, lo, hi, ta, n, st, used, bad);
                    check = NULL;
                }
                mk->lanes_softmax(st, n, nl, nl, m, alpha, tsum, check);
            }
            for (int64_t r = 0; r < nl; ++r)
                l[r] = l[r] * (double)alpha[r] + (double)tsum[r];
            if (c->drop.on) {
                for (int64_t r = 0; r < nl; ++r) {
                    if (state[r] != LANE_VALID)
                        continue;
                    sdpa__dropout_keep(&c->drop, b, h, i0 + r, ta, n, keep);
                    for (int64_t t = 0; t < n; ++t)
                        if (!keep[t])
                            st[t * nl + r] = 0.0f;
                }
            }
            if (Ev == 0)
                continue;
            if (c->pv16 != NULL) { /* P rounded to bf16; keys in pairs (the unused ones left out) */
                const sdpa__rows16 vr16 = p->load_v->rows_bf16(&p->v, b, g, ta, tc, (uint16_t *)vtile);
                int64_t cu = n;
                const int32_t *ix = NULL;
                if (!all_used) {
                    cu = 0;
                    for (int64_t t = 0; t < n; ++t) {
                        if (!used[t])
                            continue;
                        if (cu != t)
                            memcpy(st + cu * nl, st + t * nl, (size_t)nl * sizeof(float));
                        idx[cu++] = (int32_t)t;
                    }
                    ix = idx;
                }
                if (!packed)
                    c->pv16->pack_p(st, nl, cu, nl, pp, nl);
                c->pv16->pack_v(vr16.data, vr16.stride, ix, cu, Ev, vp);
                if (all_used && ranged && !c->pv16->pv_whole_tile) { /* per chunk, the pairs that hold its keys (P = 0 beside them) */
                    int nc = 0;
                    for (int64_t l0 = 0; l0 < nl; l0 += mk->range_lanes, ++nc) {
                        const int64_t w = nl - l0 < mk->range_lanes ? nl - l0 : mk->range_lanes;
                        const int64_t s0 = cs[nc], e0 = ce[nc];
                        const int64_t tp0 = s0 < e0 ? (s0 - ta) / 2 : 0, tp1 = s0 < e0 ? (e0 - ta + 1) / 2 : 0;
                        c->pv16->lanes_pv(Ev, tp0, tp1 - tp0, vp, pp + tp0 * nl + l0, nl, ot + l0,
                                          beta ? beta + l0 : NULL, w, nl);
                    }
                } else {
                    c->pv16->lanes_pv(Ev, 0, (cu + 1) / 2, vp, pp, nl, ot, beta, nl, nl);
                }
                beta = alpha;
                continue;
            }
            const sdpa__rows vr = p->load_v->rows(&p->v, b, g, ta, tc, vtile);
            if (all_used && ranged) { /* keys outside a chunk's reach have P = 0 there: skipped */
                int nc = 0;
                for (int64_t l0 = 0; l0 < nl; l0 += mk->range_lanes, ++nc) {
                    const int64_t w = nl - l0 < mk->range_lanes ? nl - l0 : mk->range_lanes;
                    const int64_t s0 = cs[nc], e0 = ce[nc];
                    mk->lanes_gemm(Ev, e0 - s0, vr.data + ((s0 < e0 ? s0 : ta) - ta) * vr.stride, 1, vr.stride,
                                   st + (s0 < e0 ? s0 - ta : 0) * nl + l0, ot + l0, beta ? beta + l0 : NULL, w, nl);
                }
            } else if (all_used) {
                mk->lanes_gemm(Ev, n, vr.data, 1, vr.stride, st, ot, beta, nl, nl);
            } else { /* gather the used keys: the others' V rows are never read */
                int64_t cu = 0;
                for (int64_t t = 0; t < n; ++t) {
                    if (!used[t])
                        continue;
                    if (cu != t)
                        memcpy(st + cu * nl, st + t * nl, (size_t)nl * sizeof(float));
                    memcpy(vg + cu * Ev, vr.data + t * vr.stride, (size_t)Ev * sizeof(float));
                    ++cu;
                }
                mk->lanes_gemm(Ev, cu, vg, 1, (ptrdiff_t)Ev, st, ot, beta, nl, nl);
            }
            beta = alpha;
        }
        if (c->tiles_end != NULL)
            c->tiles_end();
    }

    if (beta == NULL) /* no tile ran: Ot was never written (every lane ends as a zero row) */
        memset(ot, 0, (size_t)(Ev * nl) * sizeof(float));
    /* Normalise in place, lanes in the inner loop (vectorised): out = Ot * (1/(1-p)) / l, and
     * note per lane whether every result is finite (x * inv is not finite if x is not). */
    float *inv = alpha;
    int32_t *nonfin = (int32_t *)tsum;
    const float sink = sdpa__sink(p->sinks, h);
    for (int64_t r = 0; r < nl; ++r) {
        const bool live = state[r] == LANE_VALID && !bad[r] && l[r] > 0.0;
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
    for (int64_t d = 0; d < (any_valid ? Ev : 0); ++d) {
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
    const bool bulk = any_valid && os3 == 1 && Ev > 0;
    if (bulk && p->out.dtype == SDPA_DTYPE_F32) {
        mk->unpack_lanes(ot, nl, rows, Ev,
                         p->out.data + b * p->out.strides[0] + h * p->out.strides[1] + i0 * p->out.strides[2],
                         (ptrdiff_t)p->out.strides[2]);
    } else if (bulk) { /* f16/bf16 out: rows in the V loader tile (rows x Ev floats), rounded once */
        mk->unpack_lanes(ot, nl, rows, Ev, vtile, (ptrdiff_t)Ev);
        sdpa__narrow_rows(p->q.cv != NULL ? p->q.cv : &sdpa__convert_portable, p->out.dtype, vtile, Ev, rows, Ev,
                          sdpa__out_row(p, b, h, i0), (ptrdiff_t)p->out.strides[2], 1);
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        void *orow = sdpa__out_row(p, b, h, i);
        float *lrow = p->has_lse ? p->lse + b * p->lse_strides[0] + h * p->lse_strides[1] + i * p->lse_strides[2]
                                 : NULL;
        if (state[r] != LANE_VALID) { /* padding, or no key in the row's range */
            write_zero_row(p, orow, lrow, state[r] == LANE_PADDING ? -INFINITY : sink);
            continue;
        }
        if (bad[r]) { /* a float32 score overflowed */
            sdpa__fallback_row_double(p, &c->drop, b, h, i, acc, orow, NULL, lrow);
            continue;
        }
        if (l[r] == 0.0) { /* every key blocked by the mask or bias: policy ZERO (Ot may be unset) */
            write_zero_row(p, orow, lrow, sink);
            continue;
        }
        if (nonfin[r]) { /* the float32 P.V sum overflowed */
            sdpa__fallback_row_double(p, &c->drop, b, h, i, acc, orow, NULL, lrow);
            continue;
        }
        if (!bulk)
            for (int64_t d = 0; d < Ev; ++d)
                sdpa__out_put(p, orow, d, ot[d * nl + r]);
        if (lrow)
            *lrow = (float)((double)m[r] + log(l[r]));
    }
}

static size_t tiled_shared_bytes(const sdpa__plan *p) {
    (void)p;
    return sdpa__align64(sizeof(tctx));
}

/* The bf16 columns of a plan: mk16 for the scores (REDUCED, bf16 q and k), pv16 for P.V
 * (REDUCED, bf16 v); NULL where float32 arithmetic runs. */
static void tiled_columns(const sdpa__plan *p, const sdpa__mk_bf16 **mk16, const sdpa__mk_bf16 **pv16) {
    const sdpa__mk_bf16 *col = p->precision == SDPA_PRECISION_REDUCED ? sdpa__dispatch_mk_bf16_tiled(p->E, p->Ev) : NULL;
    *mk16 = p->q.dtype == SDPA_DTYPE_BF16 && p->k.dtype == SDPA_DTYPE_BF16 && p->load_q->rows_bf16 != NULL &&
                    p->load_k->rows_bf16 != NULL
                ? col
                : NULL;
    *pv16 = p->v.dtype == SDPA_DTYPE_BF16 && p->load_v->rows_bf16 != NULL ? col : NULL;
}

static const char *tiled_name(const sdpa__plan *p) {
    const sdpa__mk_bf16 *mk16, *pv16;
    tiled_columns(p, &mk16, &pv16);
    const sdpa__mk_bf16 *col = mk16 != NULL ? mk16 : pv16;
    return col != NULL ? col->tiled_name : sdpa__dispatch_mk(SDPA__MK_F32)->tiled_name;
}

static sdpa_status tiled_finish(void *vctx) {
    const tctx *c = (const tctx *)vctx;
    sdpa__set_kernel_path(tiled_name(c->p), sdpa__dtype_tag(c->p));
    return SDPA_OK;
}

/* The call's context in shared; items = (b, h, block of query rows), written out by each item. */
static void tiled_prepare(const sdpa__plan *p, void *shared, unsigned char *tws, size_t tstride, sdpa__work *w) {
    tctx *c = (tctx *)shared;
    c->p = p;
    c->mk = sdpa__dispatch_mk(SDPA__MK_F32);
    tiled_columns(p, &c->mk16, &c->pv16);
    const sdpa__mk_bf16 *used = c->mk16 != NULL ? c->mk16 : c->pv16;
    c->tiles_begin = used != NULL ? used->begin : NULL;
    c->tiles_end = used != NULL ? used->end : NULL;
    c->bm = used != NULL && used->tile_q > 0 ? used->tile_q : BM;
    c->bn = used != NULL && used->tile_k > 0 ? used->tile_k : BN;
    if (c->bm > (int64_t)layout_rows(p) || c->bn > (int64_t)layout_keys(p)) {
        c->bm = BM;
        c->bn = BN;
    }
    c->lay = make_layout(p);
    c->ws = tws;
    c->tstride = tstride;
    sdpa__dropout_init(&c->drop, p);
    c->qscale = p->softcap > 0.0f ? (float)((double)p->scale / (double)p->softcap) : p->scale;
    c->fused = c->mk16 != NULL && c->pv16 == c->mk16 && c->mk16->softmax_pack != NULL && p->softcap <= 0.0f &&
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
