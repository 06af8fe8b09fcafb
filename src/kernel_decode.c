/* The decode kernel, for a few query rows (KV-cache decode, L = 1..4): one pass over K and V.
 *
 * A work item is (batch b, kv head g, group of up to RMAX query rows of that kv head's query
 * heads, chunk of keys). All the rows of an item share each K and V tile it reads, so a GQA
 * group streams its K/V once. Scores are dot products along E (vectors along E), P.V is an
 * axpy along Ev; each row keeps its own running max m, sum l (double) and output accumulator,
 * as in the tiled kernel. Tiles no row may attend are skipped before K or V is touched, and a
 * key no row may attend is never read into P.V.
 *
 * When there are few (b, kv head, row group) items for the machine to share (fewer than
 * SPLIT_ITEMS), the keys are split into chunks, each an item of its own; every chunk leaves
 * (m, l, unnormalised out) per row, and the chunks are merged in order with the exact
 * logsumexp rule: M = max m_c, l = sum l_c exp(m_c - M), out = sum o_c exp(m_c - M) / l.
 * The chunking depends on the shape only, so results are bit-identical for any thread count.
 *
 * K and V are read as stored (0.5): the loader's rows_raw hands out runs of rows in place
 * (strided: the tile; paged: one run per block), and the [isa][dtype] rows kernels
 * (microkernel.h sdpa__mk_kv) widen f16/bf16 in the register they load, so a 16-bit cache
 * costs its own bytes and a paged one is not copied. Where a run is not in place (E not
 * contiguous) or would split the keys differently from one call over the tile, the tile goes
 * through the loader's f32 copy and the f32 column, which computes the same bits.
 *
 * Outputs are assembled in the workspace and written only at the end. That gives the finite
 * check's K/V part for free, so this kernel's entry says checks_kv_inline (kernel.h) and the
 * check stage leaves the K/V rows to it: a NaN/Inf in a K row that some row attends makes that
 * row's score non-finite (0 * Inf is NaN too), and one in a V row of a used key makes some
 * row's output accumulator non-finite, as P.V reads the used keys for every row of the item.
 * Only when some row came out non-finite does the kernel look at the K/V rows themselves: it
 * walks the attended keys of each (b, kv head) in the check stage's order (rules.c decides
 * which) and fails on the first non-finite K or V row, writing nothing; if there is none, the
 * non-finite rows are float32 overflows of finite inputs and are recomputed in double. The
 * cache is read once in the common case. */
#include "kernel.h"
#include "dispatch.h" /* the sdpa__mk_bf16 type (the context resolved which one) */
#include "load.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Keys per tile: twice the tiled path's, so that the per-tile work (rules, row max, rescale)
 * is small next to streaming the tile's K and V rows. */
#define BN (2 * SDPA__TILE_K)
/* With several rows per item, the rows' dot products and P.V run over sub-tiles of about
 * L1_BYTES of K (V) rows, so that each row of the group re-reads them from L1, not L2. */
#define L1_BYTES 8192
#define RMAX 8             /* query rows per work item */
#define SPLIT_ITEMS 16     /* below this many items, split the keys */
#define SPLIT_MIN_KEYS 512 /* ... into chunks of at least this many keys */
#define DECODE_AUTO_MAX_L 4 /* AUTO takes this kernel for L <= this */
/* The multi-row micro-kernels (same bits as the per-row ones) pay off when K/V come from cache;
 * streaming a larger cache from memory they measured ~10% slower than the per-row loop (whose
 * first row's pass over a sub-tile overlaps the memory traffic better), so they are used only
 * when the call's K and V bytes are at most this. */
#define MULTI_MAX_KV_BYTES ((double)(16 << 20))

enum { ROW_OFF = 0, ROW_VALID = 1 };
enum { MODE_NONE = 0, MODE_FULL = 1, MODE_PART = 2 };

typedef struct dplan {
    int64_t rows_per_g, nrg, nchunks, chunk, items;
} dplan;

/* The keys a call can attend: S, or the longest key_lengths[b] when given (a paged call's S is
 * its block table's width). The key split below depends on this count only, so a paged call
 * and a dense call over the same keys split them alike (bit-equal results). */
static int64_t attended_keys(const sdpa__plan *p) {
    if (p->rules.key_lengths == NULL)
        return p->S;
    int64_t most = 0;
    for (int64_t b = 0; b < p->B; ++b)
        if (p->rules.key_lengths[b] > most)
            most = p->rules.key_lengths[b];
    return most < p->S ? most : p->S;
}

static dplan decode_plan(const sdpa__plan *p) {
    dplan d;
    const int64_t S = attended_keys(p);
    d.rows_per_g = p->group * p->L;
    d.nrg = (d.rows_per_g + RMAX - 1) / RMAX;
    const int64_t base = p->B * p->Hkv * d.nrg;
    d.nchunks = 1;
    if (base > 0 && base < SPLIT_ITEMS) {
        int64_t want = (SPLIT_ITEMS + base - 1) / base, most = S / SPLIT_MIN_KEYS;
        d.nchunks = want < most ? want : most;
        if (d.nchunks < 1)
            d.nchunks = 1;
    }
    d.chunk = (S + d.nchunks - 1) / d.nchunks;
    d.chunk = (d.chunk + BN - 1) / BN * BN;
    if (d.chunk < BN)
        d.chunk = BN;
    d.nchunks = S > 0 ? (S + d.chunk - 1) / d.chunk : 1;
    d.items = base * d.nchunks;
    return d;
}

static int decode_threads(const sdpa__plan *p) {
    const dplan d = decode_plan(p);
    const double flops = 2.0 * (double)p->B * (double)p->Hq * (double)p->L * (double)p->S * (double)(p->E + p->Ev);
    /* Memory traffic matters as much as arithmetic here: count K and V bytes too. */
    const double bytes = 4.0 * (double)p->B * (double)p->Hkv * (double)p->S * (double)(p->E + p->Ev);
    const double cap = (flops / 4e6 + bytes / 2e6) / sdpa__thread_work_scale(&p->exec, p->num_threads); /* (threads.c) */
    int64_t t = p->num_threads < SDPA__MAX_THREADS ? p->num_threads : SDPA__MAX_THREADS;
    if (t > d.items)
        t = d.items;
    if ((double)t > cap)
        t = (int64_t)cap;
    return t < 1 ? 1 : (int)t;
}

typedef struct layout {
    /* per thread */
    size_t qp, s, allowed, kp, vp, o, m, l, alpha, bad, mode, state, used, idx, total;
    /* shared, after threads * total */
    size_t pm, pl, pbad, po, acc, kvcnt, kvused, shared;
} layout;

static size_t take(size_t *at, size_t bytes) {
    size_t here = *at;
    *at = sdpa__add_sat(*at, sdpa__align64(bytes));
    return here;
}

static layout make_layout(const sdpa__plan *p, const dplan *d) {
    const size_t E = (size_t)p->E, Ev = (size_t)p->Ev, f = sizeof(float);
    layout l;
    size_t at = 0;
    l.qp = take(&at, sdpa__mul_sat(E, RMAX * f));
    l.s = take(&at, (size_t)RMAX * BN * f);
    l.allowed = take(&at, (size_t)RMAX * BN);
    l.kp = take(&at, sdpa__mul_sat(E, BN * f));
    l.vp = take(&at, sdpa__mul_sat(Ev, BN * f));
    l.o = take(&at, sdpa__mul_sat(Ev, RMAX * f));
    l.m = take(&at, RMAX * f);
    l.l = take(&at, RMAX * sizeof(double));
    l.alpha = take(&at, RMAX * f);
    l.bad = take(&at, RMAX * sizeof(int32_t));
    l.mode = take(&at, RMAX);
    l.state = take(&at, RMAX);
    l.used = take(&at, BN);
    l.idx = take(&at, BN * sizeof(int32_t));
    l.total = at;
    const size_t slots = sdpa__mul_sat(sdpa__mul_sat(sdpa__mul_sat((size_t)p->B, (size_t)p->Hq), (size_t)p->L),
                                       (size_t)d->nchunks);
    at = 0;
    l.pm = take(&at, sdpa__mul_sat(slots, f));
    l.pl = take(&at, sdpa__mul_sat(slots, sizeof(double)));
    l.pbad = take(&at, sdpa__mul_sat(slots, sizeof(int32_t)));
    l.po = take(&at, sdpa__mul_sat(sdpa__mul_sat(slots, Ev), f));
    l.acc = take(&at, sdpa__fallback_scratch_bytes(p)); /* the double fallback's scratch */
    l.kvcnt = take(&at, sdpa__mul_sat((size_t)p->S + 1, sizeof(int32_t)));
    l.kvused = take(&at, (size_t)p->S);
    l.shared = at;
    return l;
}

static size_t decode_thread_bytes(const sdpa__plan *p) {
    const dplan d = decode_plan(p);
    return make_layout(p, &d).total;
}

struct ditem; /* one work item's working set (below) */

typedef struct dctx {
    const sdpa__plan *p;
    const sdpa__mk *mk;
    /* Rows kernels on stored K and V rows (microkernel.h), and their f32 column (for the
     * loader's f32 copies); kvk is NULL on the mk16 path. kes: bytes per element of the K rows
     * handed to them ([0]: an f32 copy, [1]: K as stored). */
    const sdpa__mk_kv *kvk, *kvv, *kv_f32;
    ptrdiff_t kes[2], ves[2];
    const sdpa__mk_bf16 *mk16; /* REDUCED with bf16 q and k: scores by bf16 dot products; else NULL */
    sdpa__dropout drop;
    dplan d;
    layout lay;
    unsigned char *ws, *shared;
    size_t tstride; /* thread t's scratch: ws + t * tstride */
    int64_t spread;  /* claims spread over this many ranges of items (spread_item) */
    float qscale;
    bool use_multi; /* the multi-row micro-kernels serve this call (decode_prepare) */
    /* The score operations of the context's columns (decode_prepare): q rows and scores on K
     * as stored (float32 rows kernels), or the bf16 column's dot products. */
    void (*load_q)(struct ditem *it);
    void (*scores)(struct ditem *it, int64_t ta, int64_t tc);
} dctx;

/* The call's context, then the layout's shared part (partial results, the merge's scratch). */
static size_t decode_shared_bytes(const sdpa__plan *p) {
    const dplan d = decode_plan(p);
    return sdpa__add_sat(sdpa__align64(sizeof(dctx)), make_layout(p, &d).shared);
}


/* A run of K (V) rows of a tile in place: tile rows [t0, t0 + n) at data, row stride in elements. */
typedef struct kvseg {
    int64_t t0, n;
    const void *data;
    ptrdiff_t stride;
    bool runs_on; /* rows continue past it in memory (the micro-kernels prefetch along them) */
} kvseg;

/* How far the micro-kernels' prefetch runs ahead of the stream (microkernel_avx512.c): the keys
 * of PF_AHEAD_BYTES of float32 rows, whatever the dtype (16 keys at E = 128, so 4 KiB ahead on
 * f16/bf16 rows: measured better than 8 KiB for f16 GQA decode, 0.68-0.71 -> 0.74-0.78 of the
 * floor at (8,32,1,1024,128) kv 8, and the same at (1,32,1,4096,128)). */
#define PF_AHEAD_BYTES 8192

/* Where the micro-kernels prefetch for a piece of rows starting at tile key x (segment sg,
 * data at px; microkernel.h, pf): ahead bytes further along a strided run, else (paged) the
 * block holding key ta + x + ahead_keys, through the loader (NULL past the keys to read). */
static const void *prefetch_base(const sdpa__loader *ld, const sdpa__view4 *v, int64_t b, int64_t g, const kvseg *sg,
                                 const void *px, int64_t key, int64_t end, int64_t ahead_bytes) {
    if (sg->runs_on)
        return (const char *)px + ahead_bytes;
    if (key >= end)
        return NULL;
    const sdpa__raw_rows rr = ld->rows_raw(v, b, g, key, end);
    return rr.n > 0 ? rr.data : NULL;
}

/* Rows [ta, tc) of (b, kv head g) as stored, in runs (segments) the loader gives in place
 * (strided: one; paged: one per block). With align8, every segment but the last must end a
 * multiple of 8 rows into the tile (see the scores loop). Returns the count (<= tc - ta), or 0
 * when some row is not in place or a segment is misaligned (the caller copies the tile). */
static int64_t kv_segments(const sdpa__loader *ld, const sdpa__view4 *v, int64_t b, int64_t g, int64_t ta,
                           int64_t tc, bool align8, kvseg *seg) {
    if (ld->rows_raw == NULL)
        return 0;
    int64_t ns = 0;
    for (int64_t x = ta; x < tc;) {
        const sdpa__raw_rows rr = ld->rows_raw(v, b, g, x, tc);
        if (rr.n <= 0 || (align8 && x + rr.n < tc && (x + rr.n - ta) % 8 != 0))
            return 0;
        seg[ns].t0 = x - ta;
        seg[ns].n = rr.n;
        seg[ns].data = rr.data;
        seg[ns].stride = rr.stride;
        seg[ns].runs_on = rr.runs_on;
        ++ns;
        x += rr.n;
    }
    return ns;
}

static int64_t slot_of(const sdpa__plan *p, const dplan *d, int64_t b, int64_t h, int64_t i, int64_t ck) {
    return ((b * p->Hq + h) * p->L + i) * d->nchunks + ck;
}

/* The item a claim takes (a bijection on [0, n)). Threads claim items in order, so T threads
 * run items t, t + 1, ..., t + T - 1 at about the same time. In a paged pool [num_blocks, Hkv,
 * block_size, E] the kv heads g and g + 1 of a block are adjacent, and two threads streaming
 * them side by side measured 1.4-1.5x slower than two threads apart (8 KiB runs of a 2-thread
 * decode at (1,32,1,4096,128), block size 16); so claim t takes item t % T of T equal ranges,
 * position t / T in it: the threads walk T ranges of kv heads, far apart. Results do not
 * depend on which thread runs an item. */
static int64_t spread_item(int64_t t, int64_t n, int64_t T) {
    if (T <= 1 || n <= T)
        return t;
    const int64_t q = n / T, r = n % T, k = t % T, round = t / T;
    return k * q + (k < r ? k : r) + round;
}

/* One item's working set: the thread's scratch (layout), the item's rows and key chunk. */
typedef struct ditem {
    const dctx *c;
    const sdpa__plan *p;
    const sdpa__mk *mk;
    float *qp, *s, *kp, *vp, *o, *m, *alpha;
    double *l;
    int32_t *bad, *idx;
    uint8_t *allowed, *mode, *state, *used;
    int64_t b, g, ck, R, k0, k1, jmin, jmax;
    int64_t hrow[RMAX], irow[RMAX], lo[RMAX], hi[RMAX];
    int64_t kc, vc; /* sub-tile sizes (keys) of the scores and of P.V */
    /* per tile: the rows that attend it (ra[0, na)), and whether they run together (multi) */
    int64_t na, ra[RMAX];
    bool multi;
} ditem;

/* Set-up: the thread's scratch, the item's (b, kv head g, rows, key chunk), each row's state
 * and key range [lo, hi) inside the chunk; jmin, jmax bound the keys of the item. */
static void ditem_setup(const dctx *c, int64_t task, int tid, ditem *it) {
    const sdpa__plan *p = c->p;
    const dplan *d = &c->d;
    const layout *lay = &c->lay;
    unsigned char *ws = c->ws + (size_t)tid * c->tstride;
    it->c = c;
    it->p = p;
    it->mk = c->mk;
    it->qp = (float *)(ws + lay->qp), it->s = (float *)(ws + lay->s), it->kp = (float *)(ws + lay->kp);
    it->vp = (float *)(ws + lay->vp), it->o = (float *)(ws + lay->o), it->m = (float *)(ws + lay->m);
    it->alpha = (float *)(ws + lay->alpha);
    it->l = (double *)(ws + lay->l);
    it->bad = (int32_t *)(ws + lay->bad), it->idx = (int32_t *)(ws + lay->idx);
    it->allowed = ws + lay->allowed, it->mode = ws + lay->mode, it->state = ws + lay->state, it->used = ws + lay->used;

    it->ck = task % d->nchunks;
    const int64_t rest = task / d->nchunks;
    const int64_t rg = rest % d->nrg, bg = rest / d->nrg;
    it->b = bg / p->Hkv, it->g = bg % p->Hkv;
    const int64_t r0 = rg * RMAX;
    it->R = d->rows_per_g - r0 < RMAX ? d->rows_per_g - r0 : RMAX;
    it->k0 = it->ck * d->chunk, it->k1 = it->k0 + d->chunk < p->S ? it->k0 + d->chunk : p->S;
    it->jmin = it->k1, it->jmax = it->k0;
    for (int64_t r = 0; r < it->R; ++r) {
        it->hrow[r] = it->g * p->group + (r0 + r) / p->L;
        it->irow[r] = (r0 + r) % p->L;
        it->state[r] = ROW_OFF;
        it->m[r] = -INFINITY;
        it->l[r] = 0.0;
        it->bad[r] = 0;
        it->lo[r] = it->hi[r] = 0;
        if (sdpa__rule_is_padding(&p->rules, it->b, it->irow[r]))
            continue;
        int64_t a, e;
        sdpa__rule_range(&p->rules, it->b, it->irow[r], &a, &e);
        a = a > it->k0 ? a : it->k0;
        e = e < it->k1 ? e : it->k1;
        if (a >= e)
            continue;
        it->state[r] = ROW_VALID;
        it->lo[r] = a;
        it->hi[r] = e;
        it->jmin = a < it->jmin ? a : it->jmin;
        it->jmax = e > it->jmax ? e : it->jmax;
    }
    if (p->Ev > 0)
        memset(it->o, 0, (size_t)(it->R * p->Ev) * sizeof(float));
    /* Sub-tile sizes (keys): all of a tile for one row, or for the rows together (multi). */
    it->kc = BN, it->vc = BN;
    if (it->R > 1 && !(it->R <= 4 && c->use_multi)) {
        const int64_t E = p->E, Ev = p->Ev;
        it->kc = (L1_BYTES / (4 * (E > 0 ? E : 1))) / 8 * 8;
        it->vc = (L1_BYTES / (4 * (Ev > 0 ? Ev : 1))) / 8 * 8;
        it->kc = it->kc < 8 ? 8 : it->kc;
        it->vc = it->vc < 8 ? 8 : it->vc;
    }
}

/* ---- the score operations: q rows and scores on K as stored (float32 rows kernels of the
 * context), or the bf16 column's dot products (the context's dot16) ---- */

/* q rows through the loader, times the scale (kp is free until the first K tile). */
static void load_q_f32(ditem *it) {
    const sdpa__plan *p = it->p;
    const int64_t E = p->E;
    for (int64_t r = 0; r < it->R; ++r) {
        if (it->state[r] != ROW_VALID)
            continue;
        const sdpa__rows qr = p->load_q->rows(&p->q, it->b, it->hrow[r], it->irow[r], it->irow[r] + 1, it->kp);
        for (int64_t e = 0; e < E; ++e)
            it->qp[r * E + e] = qr.data[e] * it->c->qscale;
    }
}

/* Raw bf16 q rows; the scale is applied to the scores. */
static void load_q_col(ditem *it) {
    const sdpa__plan *p = it->p;
    const int64_t E = p->E;
    for (int64_t r = 0; r < it->R; ++r) {
        if (it->state[r] != ROW_VALID)
            continue;
        const sdpa__rows16 q16 =
            p->load_q->rows_bf16(&p->q, it->b, it->hrow[r], it->irow[r], it->irow[r] + 1, (uint16_t *)it->kp);
        memcpy((uint16_t *)it->qp + r * E, q16.data, (size_t)E * sizeof(uint16_t));
    }
}

/* Scores of keys [ta, tc) for the rows that attend the tile, by the bf16 column's dot products
 * on raw bf16 rows (REDUCED), the scale applied to the scores. */
static void scores_col(ditem *it, int64_t ta, int64_t tc) {
    const sdpa__plan *p = it->p;
    const int64_t E = p->E, n = tc - ta;
    const sdpa__rows16 kr16 = p->load_k->rows_bf16(&p->k, it->b, it->g, ta, tc, (uint16_t *)it->kp);
    for (int64_t c0 = 0; c0 < n; c0 += it->kc) {
        const int64_t cn = n - c0 < it->kc ? n - c0 : it->kc;
        for (int64_t r = 0; r < it->R; ++r) {
            if (it->mode[r] == MODE_NONE)
                continue;
            float *sr = it->s + r * BN + c0;
            it->c->mk16->dot_rows((const uint16_t *)it->qp + r * E, E, kr16.data + c0 * kr16.stride, kr16.stride, cn,
                                  sr);
            for (int64_t t = 0; t < cn; ++t)
                sr[t] *= it->c->qscale;
        }
    }
}

/* Scores on K rows as stored, segment by segment (paged: block by block), else the loader's
 * f32 copy of the tile. Scores sub-tile by sub-tile and segment by segment: every piece starts
 * a multiple of 8 keys into the tile and is a multiple of 8 keys long unless it ends the tile,
 * so each key takes the same path through dot_rows as in one call over the tile (the results
 * depend on neither kc nor the segments). */
static void scores_kv(ditem *it, int64_t ta, int64_t tc) {
    const dctx *c = it->c;
    const sdpa__plan *p = it->p;
    const int64_t E = p->E, n = tc - ta;
    kvseg seg[BN];
    const float *qa[RMAX];
    float *sa[RMAX];
    const sdpa__mk_kv *kvk = c->kvk;
    int64_t nseg = kv_segments(p->load_k, &p->k, it->b, it->g, ta, tc, true, seg);
    if (nseg == 0) {
        const sdpa__rows kr = p->load_k->rows(&p->k, it->b, it->g, ta, tc, it->kp);
        seg[0] = (kvseg){0, n, kr.data, kr.stride, true};
        nseg = 1;
        kvk = c->kv_f32;
    }
    const ptrdiff_t kes = c->kes[kvk == c->kv_f32 ? 0 : 1];
    const int64_t kpf = E > 0 && E * 4 < PF_AHEAD_BYTES ? PF_AHEAD_BYTES / (E * 4) : 1; /* keys ahead */
    for (int64_t c0 = 0; c0 < n; c0 += it->kc) {
        const int64_t cn = n - c0 < it->kc ? n - c0 : it->kc;
        for (int64_t sg = 0; sg < nseg; ++sg) {
            const int64_t x0 = seg[sg].t0 > c0 ? seg[sg].t0 : c0;
            const int64_t x1 = seg[sg].t0 + seg[sg].n < c0 + cn ? seg[sg].t0 + seg[sg].n : c0 + cn;
            if (x0 >= x1)
                continue;
            const void *kx = (const char *)seg[sg].data + (x0 - seg[sg].t0) * seg[sg].stride * kes;
            const int64_t ahead = it->multi ? 2 * kpf : kpf;
            const void *pf =
                prefetch_base(p->load_k, &p->k, it->b, it->g, &seg[sg], kx, ta + x0 + ahead, it->jmax, ahead * E * kes);
            if (it->multi) { /* all the rows from one read of each K row (same sums as dot_rows) */
                for (int64_t j = 0; j < it->na; ++j) {
                    qa[j] = it->qp + it->ra[j] * E;
                    sa[j] = it->s + it->ra[j] * BN + x0;
                }
                kvk->dot_rows_multi(it->na, qa, E, kx, seg[sg].stride, x1 - x0, sa, pf);
                continue;
            }
            for (int64_t j = 0; j < it->na; ++j)
                kvk->dot_rows(it->qp + it->ra[j] * E, E, kx, seg[sg].stride, x1 - x0, it->s + it->ra[j] * BN + x0, pf);
        }
    }
}

/* ---- the item's paragraphs ---- */

/* Which rows attend keys [ta, tc) and how (mode: every key, some keys (allowed), none); used[t]
 * = some row attends key ta + t; false when no row attends the tile. */
static bool tile_modes(ditem *it, int64_t ta, int64_t tc) {
    const sdpa__plan *p = it->p;
    const int64_t n = tc - ta;
    bool any = false, any_full = false;
    memset(it->used, 0, (size_t)n);
    for (int64_t r = 0; r < it->R; ++r) {
        it->mode[r] = MODE_NONE;
        if (it->state[r] != ROW_VALID || it->lo[r] >= tc || it->hi[r] <= ta)
            continue;
        const int64_t i = it->irow[r], h = it->hrow[r];
        const int32_t lo32 = (int32_t)it->lo[r], hi32 = (int32_t)it->hi[r];
        const sdpa__tile_class tcl = sdpa__rule_classify_tile(&p->rules, it->b, h, i, 1, &lo32, &hi32, ta, tc);
        if (tcl == SDPA__TILE_NONE)
            continue;
        if (tcl == SDPA__TILE_FULL) {
            it->mode[r] = MODE_FULL;
            any = any_full = true;
            continue;
        }
        uint8_t *al = it->allowed + r * BN;
        const bool row_any = sdpa__rule_row_flags(&p->rules, it->b, h, i, it->lo[r], it->hi[r], ta, n, al);
        for (int64_t t = 0; t < n; ++t)
            it->used[t] |= al[t];
        if (row_any) {
            it->mode[r] = MODE_PART;
            any = true;
        }
    }
    if (!any)
        return false;
    if (any_full)
        memset(it->used, 1, (size_t)n);
    it->na = 0;
    for (int64_t r = 0; r < it->R; ++r)
        if (it->mode[r] != MODE_NONE)
            it->ra[it->na++] = r;
    it->multi = it->na > 1 && it->c->use_multi;
    return true;
}

/* Softcap, ALiBi, the rules' -inf and bias, then the online softmax step and dropout of each
 * row that attends keys [ta, tc). */
static void softmax_rows(ditem *it, int64_t ta, int64_t tc) {
    const dctx *c = it->c;
    const sdpa__plan *p = it->p;
    const sdpa__mk *mk = it->mk;
    const int64_t n = tc - ta, b = it->b;
    for (int64_t r = 0; r < it->R; ++r) {
        if (it->mode[r] == MODE_NONE)
            continue;
        float *sr = it->s + r * BN;
        if (p->softcap > 0.0f)
            mk->softcap(sr, n, p->softcap);
        sdpa__rule_alibi_add(&p->rules, b, it->hrow[r], it->irow[r], ta, n, sr, 1); /* ALiBi (rules.c), a bias */
        if (it->mode[r] == MODE_PART) {
            const uint8_t *al = it->allowed + r * BN;
            const void *brow = p->rules.has_bias ? sdpa__rule_bias_row(&p->rules, b, it->hrow[r], it->irow[r]) : NULL;
            for (int64_t t = 0; t < n; ++t) {
                if (!al[t]) {
                    sr[t] = -INFINITY;
                    continue;
                }
                if (brow != NULL)
                    sr[t] += sdpa__rule_bias_at(&p->rules, brow, ta + t);
                if (!isfinite(sr[t]))
                    it->bad[r] = -1;
            }
        }
        const float mx = mk->row_max(sr, n, it->mode[r] == MODE_FULL ? &it->bad[r] : NULL);
        const float mo = it->m[r], mn = mx > mo ? mx : mo, u = mn == -INFINITY ? 0.0f : mn;
        it->alpha[r] = expf(mo - u);
        const float tsum = mk->exp_sum(sr, n, u);
        it->l[r] = it->l[r] * (double)it->alpha[r] + (double)tsum;
        it->m[r] = mn;
        sdpa__dropout_apply(&c->drop, b, it->hrow[r], it->irow[r], ta, n, sr);
    }
}

/* P.V tile: V rows as stored, segment by segment, else the loader's f32 copy of the tile;
 * axpy_rows reads the used rows (idx) only. P.V over pieces of used keys (each inside one
 * segment, at most vc keys): o = alpha o + (first piece), then o = 1 o + (next piece), ...:
 * multiplying by 1 is exact and each element's sum keeps its t order, so this equals one call
 * over all of them. */
static void pv_tile(ditem *it, int64_t ta, int64_t tc) {
    const dctx *c = it->c;
    const sdpa__plan *p = it->p;
    const int64_t n = tc - ta, Ev = p->Ev;
    int32_t *idx = it->idx;
    int32_t idx2[BN]; /* idx relative to a segment */
    kvseg seg[BN];
    float *sa[RMAX], *oa[RMAX], aa[RMAX];
    int64_t cnt = 0;
    for (int64_t t = 0; t < n; ++t)
        if (it->used[t])
            idx[cnt++] = (int32_t)t;
    const sdpa__mk_kv *kvv = c->kvv;
    int64_t nseg = kvv != NULL ? kv_segments(p->load_v, &p->v, it->b, it->g, ta, tc, false, seg) : 0;
    if (nseg == 0) {
        const sdpa__rows vr = p->load_v->rows(&p->v, it->b, it->g, ta, tc, it->vp);
        seg[0] = (kvseg){0, n, vr.data, vr.stride, true};
        nseg = 1;
        kvv = c->kv_f32;
    }
    const ptrdiff_t ves = c->ves[kvv == c->kv_f32 ? 0 : 1];
    const int64_t vpf = Ev > 0 && Ev * 4 < PF_AHEAD_BYTES ? PF_AHEAD_BYTES / (Ev * 4) : 1;
    bool first = true;
    int64_t i = 0;
    for (int64_t sg = 0; sg < nseg || first; ++sg) {
        const bool none = sg >= nseg; /* no used key at all: o = alpha o only */
        const int64_t t0 = none ? 0 : seg[sg].t0;
        int64_t i1 = i;
        while (!none && i1 < cnt && idx[i1] < t0 + seg[sg].n)
            ++i1;
        if (none)
            sg = 0;
        const int64_t ahead = it->multi ? 2 * vpf : vpf;
        const void *pf = none ? NULL
                              : prefetch_base(p->load_v, &p->v, it->b, it->g, &seg[sg], seg[sg].data, ta + t0 + ahead,
                                              it->jmax, ahead * Ev * ves);
        for (int64_t c0 = i; c0 < i1 || (none && first); c0 += it->vc) {
            const int64_t cn = i1 - c0 < it->vc ? i1 - c0 : it->vc;
            const int32_t *ix = idx + c0;
            if (t0 != 0) {
                for (int64_t t = 0; t < cn; ++t)
                    idx2[t] = idx[c0 + t] - (int32_t)t0;
                ix = idx2;
            }
            if (it->multi) {
                for (int64_t j = 0; j < it->na; ++j) {
                    oa[j] = it->o + it->ra[j] * Ev;
                    sa[j] = it->s + it->ra[j] * BN + t0;
                    aa[j] = first ? it->alpha[it->ra[j]] : 1.0f;
                }
                kvv->axpy_rows_multi(it->na, oa, Ev, aa, (const float *const *)sa, ix, cn, seg[sg].data,
                                     seg[sg].stride, pf);
            } else {
                for (int64_t j = 0; j < it->na; ++j)
                    kvv->axpy_rows(it->o + it->ra[j] * Ev, Ev, first ? it->alpha[it->ra[j]] : 1.0f,
                                   it->s + it->ra[j] * BN + t0, ix, cn, seg[sg].data, seg[sg].stride, pf);
            }
            first = false;
        }
        if (none)
            break;
        i = i1;
    }
}

/* Write rows: the item's (m, l, unnormalised out) per row into its slots of the shared partial
 * results (decode_finish merges the chunks and writes out). */
static void save_rows(const ditem *it) {
    const dctx *c = it->c;
    const sdpa__plan *p = it->p;
    const int64_t Ev = p->Ev;
    float *pm = (float *)(c->shared + c->lay.pm), *po = (float *)(c->shared + c->lay.po);
    double *pl = (double *)(c->shared + c->lay.pl);
    int32_t *pbad = (int32_t *)(c->shared + c->lay.pbad);
    for (int64_t r = 0; r < it->R; ++r) {
        const int64_t sl = slot_of(p, &c->d, it->b, it->hrow[r], it->irow[r], it->ck);
        pm[sl] = it->m[r];
        pl[sl] = it->l[r];
        pbad[sl] = it->bad[r];
        if (Ev > 0)
            memcpy(po + sl * Ev, it->o + r * Ev, (size_t)Ev * sizeof(float));
    }
}

static void decode_task(void *vctx, int64_t task, int tid) {
    const dctx *c = (const dctx *)vctx;
    ditem it;
    ditem_setup(c, spread_item(task, c->d.items, c->spread), tid, &it);
    c->load_q(&it);
    for (int64_t a = it.jmin / BN * BN; a < it.jmax; a += BN) {
        const int64_t ta = a > it.jmin ? a : it.jmin, tc = a + BN < it.jmax ? a + BN : it.jmax;
        if (!tile_modes(&it, ta, tc))
            continue;
        c->scores(&it, ta, tc);
        softmax_rows(&it, ta, tc);
        if (c->p->Ev > 0)
            pv_tile(&it, ta, tc);
    }
    save_rows(&it);
}

/* Some row came out non-finite: the first attended K or V row holding NaN/Inf, in the order of
 * the check stage (b, kv head, key; K before V), fails the call; SDPA_OK if there is none. */
static bool nonfinite_kv_at(const sdpa__plan *p, const sdpa__mk *mk, int32_t *cnt, uint8_t *used, int64_t *fb,
                            int64_t *fg, int64_t *fj, bool *fv) {
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t g = 0; g < p->Hkv; ++g) {
            sdpa__rule_group_keys(&p->rules, b, g * p->group, (g + 1) * p->group, cnt, used);
            for (int64_t j = 0; j < p->S; ++j) {
                if (!used[j])
                    continue;
                const bool kbad = !p->load_k->row_finite(mk, &p->k, b, g, j);
                if (kbad || (p->Ev > 0 && !p->load_v->row_finite(mk, &p->v, b, g, j))) {
                    *fb = b;
                    *fg = g;
                    *fj = j;
                    *fv = !kbad;
                    return true;
                }
            }
        }
    return false;
}

static sdpa_status first_nonfinite_kv(const sdpa__plan *p, const sdpa__mk *mk, int32_t *cnt, uint8_t *used) {
    int64_t b, g, j;
    bool isv;
    if (nonfinite_kv_at(p, mk, cnt, used, &b, &g, &j, &isv))
        return sdpa__fail_kv_row(p->fn, b, g, j, isv);
    return SDPA_OK;
}

/* After the items: did some row come out non-finite (the partial results say)? */
static bool decode_suspect(const dctx *c) {
    const float *po = (const float *)(c->shared + c->lay.po);
    const double *pl = (const double *)(c->shared + c->lay.pl);
    const int32_t *pbad = (const int32_t *)(c->shared + c->lay.pbad);
    const int64_t slots = c->p->B * c->p->Hq * c->p->L * c->d.nchunks;
    bool suspect = c->p->Ev > 0 && !c->mk->all_finite(po, slots * c->p->Ev);
    for (int64_t t = 0; t < slots && !suspect; ++t)
        suspect = pbad[t] != 0 || !isfinite(pl[t]);
    return suspect;
}

/* The inline K/V check as a gate of a region (a packed batch: before other sequences' items
 * write): false when an attended K/V row holds NaN/Inf. No message (any thread may run it);
 * decode_finish, on the calling thread, makes it. */
static bool decode_verify(void *vctx) {
    const dctx *c = (const dctx *)vctx;
    if (!c->p->check_finite || !decode_suspect(c))
        return true;
    int64_t b, g, j;
    bool isv;
    return !nonfinite_kv_at(c->p, c->mk, (int32_t *)(c->shared + c->lay.kvcnt), c->shared + c->lay.kvused, &b, &g, &j,
                            &isv);
}

static sdpa_status decode_finish(void *vctx);

/* The name sdpa_last_kernel() gets (before the dtype tag): the context's, split or not. */
static const char *decode_name(const sdpa__plan *p) {
    return decode_plan(p).nchunks > 1 ? p->ctx.decode_split_name : p->ctx.decode_name;
}

/* The call's context in shared; items = (b, kv head, row group, key chunk), each leaving its
 * rows' partial results in shared; decode_finish merges them and writes the outputs. */
static void decode_prepare(const sdpa__plan *p, void *shared, unsigned char *tws, size_t tstride, sdpa__work *w) {
    dctx *c = (dctx *)shared;
    c->p = p;
    c->mk = p->ctx.mk;
    c->mk16 = p->ctx.dot16;
    c->kv_f32 = p->ctx.kv_f32;
    c->kvk = p->ctx.kv_k;
    c->kvv = p->ctx.kv_v;
    c->kes[0] = (ptrdiff_t)sizeof(float);
    c->kes[1] = p->ctx.k_elem;
    c->ves[0] = (ptrdiff_t)sizeof(float);
    c->ves[1] = p->ctx.v_elem;
    c->d = decode_plan(p);
    c->lay = make_layout(p, &c->d);
    c->spread = p->k.block_size > 0 ? decode_threads(p) : 1; /* paged pools (dense: no gain measured) */
    c->ws = tws;
    c->tstride = tstride;
    c->shared = (unsigned char *)shared + sdpa__align64(sizeof(dctx));
    sdpa__dropout_init(&c->drop, p);
    c->qscale = p->softcap > 0.0f ? (float)((double)p->scale / (double)p->softcap) : p->scale;
    c->load_q = c->mk16 != NULL ? load_q_col : load_q_f32;
    c->scores = c->mk16 != NULL ? scores_col : scores_kv;
    /* 16-bit K/V: each row is widened once for all the rows (the per-row loop widens each
     * sub-tile once per row), measured ~12% less CPU time at (8,32,1,1024,128) GQA 32/8 with f16
     * and bf16 K/V, whatever the cache size. The multi-row micro-kernels (same bits as the
     * per-row ones) pay off when K/V come from cache (MULTI_MAX_KV_BYTES). */
    const sdpa__mk *mk = c->mk;
    const bool narrow = c->kes[1] < 4 && c->ves[1] < 4 && c->mk16 == NULL;
    c->use_multi = mk->dot_rows_multi != NULL && mk->axpy_rows_multi != NULL && c->kv_f32->dot_rows_multi != NULL &&
                   c->kv_f32->axpy_rows_multi != NULL && (c->kvk == NULL || c->kvk->dot_rows_multi != NULL) &&
                   c->kvv->axpy_rows_multi != NULL &&
                   (narrow || 4.0 * (double)p->B * (double)p->Hkv * (double)p->S * (double)(p->E + p->Ev) <=
                                  MULTI_MAX_KV_BYTES);
    w->items = c->d.items;
    w->item = decode_task;
    w->ctx = c;
    w->finish = decode_finish;
}

/* Elements [e0, e0 + n) of one row's output from its nc chunk results (po: chunk k's at
 * po + k * ev, w[k] its weight, 0 = left out), times inv: y = (float)((sum_k po_k w_k) * inv)
 * in double, each element's sum in k order from 0.0 (the same bits as one element at a time;
 * written as loops the compiler vectorises). False when some sum or y is not finite. */
#define MERGE_PIECE 256
static bool merge_piece(const float *po, int64_t ev, const double *w, int64_t nc, double inv, int64_t n, float *y) {
    double x[MERGE_PIECE];
    for (int64_t e = 0; e < n; ++e)
        x[e] = 0.0;
    for (int64_t k = 0; k < nc; ++k) {
        const double wk = w[k];
        if (wk == 0.0)
            continue;
        const float *pk = po + k * ev;
        for (int64_t e = 0; e < n; ++e)
            x[e] += (double)pk[e] * wk;
    }
    int ok = 1;
    for (int64_t e = 0; e < n; ++e) {
        y[e] = (float)(x[e] * inv);
        ok &= (fabs(x[e]) <= DBL_MAX) & (fabsf(y[e]) <= FLT_MAX);
    }
    return ok != 0;
}

/* After every item: the inline K/V check, then merge the chunks of each row and write. */
static sdpa_status decode_finish(void *vctx) {
    const dctx *cp = (const dctx *)vctx;
    const dctx c = *cp;
    const sdpa__plan *p = c.p;
    const sdpa__mk *mk = c.mk;
    const bool check_kv = p->check_finite;
    const float *pm = (const float *)(c.shared + c.lay.pm), *po = (const float *)(c.shared + c.lay.po);
    const double *pl = (const double *)(c.shared + c.lay.pl);
    const int32_t *pbad = (const int32_t *)(c.shared + c.lay.pbad);
    void *acc = c.shared + c.lay.acc;
    const int64_t nc = c.d.nchunks, Ev = p->Ev;
    if (check_kv) { /* a non-finite row: look at the K/V rows (see the comment at the top) */
        if (decode_suspect(&c)) {
            const sdpa_status st = first_nonfinite_kv(p, mk, (int32_t *)(c.shared + c.lay.kvcnt), c.shared + c.lay.kvused);
            if (st != SDPA_OK)
                return st;
        }
    }

    /* Merge the chunks of each row in order and write the outputs. */
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h)
            for (int64_t i = 0; i < p->L; ++i) {
                void *orow = sdpa__out_row(p, b, h, i);
                float *lrow = p->has_lse ? p->lse + b * p->lse_strides[0] + h * p->lse_strides[1] +
                                               i * p->lse_strides[2]
                                         : NULL;
                const int64_t s0 = slot_of(p, &c.d, b, h, i, 0);
                bool anybad = false;
                double M = -INFINITY;
                for (int64_t k = 0; k < nc; ++k) {
                    anybad = anybad || pbad[s0 + k] != 0;
                    if (pl[s0 + k] > 0.0 && (double)pm[s0 + k] > M)
                        M = (double)pm[s0 + k];
                }
                if (anybad) {
                    sdpa__fallback_row_double(p, &c.drop, b, h, i, acc, orow, NULL, lrow);
                    continue;
                }
                const float sink = sdpa__sink(p->sinks, h);
                if (M == -INFINITY) { /* padding, or no allowed key (lse = the sink, -inf without) */
                    sdpa__out_zero_row(p, orow);
                    if (lrow)
                        *lrow = sdpa__rule_is_padding(&p->rules, b, i) ? -INFINITY : sink;
                    continue;
                }
                if ((double)sink > M) /* the sink joins M and lt once per row, whatever the split */
                    M = (double)sink;
                double w[64], lt = 0.0; /* nc <= SPLIT_ITEMS <= 64 */
                for (int64_t k = 0; k < nc; ++k) {
                    w[k] = pl[s0 + k] > 0.0 ? exp((double)pm[s0 + k] - M) : 0.0;
                    lt += pl[s0 + k] * w[k];
                }
                if (sink > -INFINITY)
                    lt += exp((double)sink - M);
                const double inv = (double)c.drop.scale / lt;
                bool fin = true;
                for (int64_t e0 = 0; e0 < Ev && fin; e0 += MERGE_PIECE) {
                    const int64_t ne = Ev - e0 < MERGE_PIECE ? Ev - e0 : MERGE_PIECE;
                    float y[MERGE_PIECE];
                    fin = merge_piece(po + s0 * Ev + e0, Ev, w, nc, inv, ne, y);
                    for (int64_t e = 0; e < ne && fin; ++e)
                        sdpa__out_put(p, orow, e0 + e, y[e]);
                }
                if (!fin) {
                    sdpa__fallback_row_double(p, &c.drop, b, h, i, acc, orow, NULL, lrow);
                    continue;
                }
                if (lrow)
                    *lrow = (float)(M + log(lt));
            }
    sdpa__set_kernel_path(decode_name(p), sdpa__dtype_tag(p)); /* nc > 1: the split name */
    return SDPA_OK;
}

static sdpa__fit decode_supports(const sdpa__plan *p, const char **why) {
    if (p->has_weights) {
        *why = SDPA__WHY_NO_WEIGHTS;
        return SDPA__FIT_NO;
    }
    return p->L <= DECODE_AUTO_MAX_L ? SDPA__FIT_AUTO : SDPA__FIT_FORCED;
}

const sdpa__kernel sdpa__kernel_decode = {
    .id = SDPA_KERNEL_DECODE,
    .enum_name = "SDPA_KERNEL_DECODE",
    .checks_kv_inline = true,
    .supports = decode_supports,
    .threads = decode_threads,
    .thread_bytes = decode_thread_bytes,
    .shared_bytes = decode_shared_bytes,
    .prepare = decode_prepare,
    .verify = decode_verify,
    .name = decode_name,
};
