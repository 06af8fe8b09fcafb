/* sdpa_attention_cost (0.6, issue 29 part 4). The pair counts are checked against a brute-force
 * count written here from DESIGN.md section 4 (an independent double loop over the allow rule:
 * allow-mask, causal at TOP_LEFT / BOTTOM_RIGHT / OFFSETS, key lengths, window, bias -inf, query
 * padding), for random dense, broadcast-mask, paged and packed calls; the kernel the query
 * names is the one sdpa_last_kernel() reports after the real call; the query writes no output
 * or workspace byte; its status is the call's for structural errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sdpa.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static int64_t irand(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }
static int chance(int percent) { return (int)(rnd() % 100) < percent; }

#define SENTINEL 0xA5

static void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    assert_non_null(p);
    return p;
}

/* n elements of dtype with finite random values in (-2, 2) (any dtype: bits with a small exponent). */
static void *random_values(sdpa_dtype dt, int64_t n) {
    void *p = xalloc((size_t)(n > 0 ? n : 1) * 4);
    if (dt == SDPA_DTYPE_F32) {
        float *f = p;
        for (int64_t t = 0; t < n; ++t)
            f[t] = (float)((double)(rnd() % 2001) / 1000.0 - 1.0);
    } else {
        uint16_t *h = p; /* exponent field at most 0x3F.. below the top bits: finite in f16 and bf16 */
        for (int64_t t = 0; t < n; ++t)
            h[t] = (uint16_t)((rnd() & 0x3FFF) | (rnd() & 1 ? 0x8000 : 0));
    }
    return p;
}

static sdpa_tensor view(void *data, sdpa_dtype dt, int32_t rank, const int64_t *shape) {
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init_dtype(&t, data, dt, rank, shape), SDPA_OK);
    return t;
}

static int64_t numel(int32_t rank, const int64_t *shape) {
    int64_t n = 1;
    for (int32_t d = 0; d < rank; ++d)
        n *= shape[d];
    return n;
}

static int all_bytes(const void *p, size_t n, unsigned char v) {
    for (size_t t = 0; t < n; ++t)
        if (((const unsigned char *)p)[t] != v)
            return 0;
    return 1;
}

/* ------------------------------------------------------------ brute force */

/* One B-batch call (or one packed sequence as B = 1) described plainly. */
typedef struct rule {
    int64_t B, Hq, Hkv, L, S;
    int causal, alignment, window;
    int64_t wl, wr;
    const int64_t *offsets, *klen, *qlen;     /* [B] or NULL */
    const uint8_t *mask; int64_t ms[4];       /* [ms0, ms1, ms2, ms3], each 1 or the full size */
    const uint8_t *bias_blocks; int64_t bs[4];/* 1 where the bias is -inf, same broadcast scheme */
} rule;

typedef struct counts {
    int64_t rows, allowed, empty, logical, kv_rows, mask_pairs, bias_pairs;
    int64_t s_allowed, s_empty, s_kv_rows; /* structural only (no mask, no bias) */
    int64_t score_pairs, score_k_rows;     /* SCORES / SOFTCAPPED weights */
} counts;

static int64_t bidx(const int64_t *sh, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t x[4] = {sh[0] == 1 ? 0 : b, sh[1] == 1 ? 0 : h, sh[2] == 1 ? 0 : i, sh[3] == 1 ? 0 : j};
    return ((x[0] * sh[1] + x[1]) * sh[2] + x[2]) * sh[3] + x[3];
}

/* DESIGN.md section 4, step 4 and 8, written out. */
static int structural(const rule *r, int64_t b, int64_t i, int64_t j) {
    const int64_t Sb = r->klen ? r->klen[b] : r->S, Lb = r->qlen ? r->qlen[b] : r->L;
    int64_t p = i;
    if (r->alignment == SDPA_ALIGN_BOTTOM_RIGHT)
        p = i + Sb - Lb;
    else if (r->alignment == SDPA_ALIGN_OFFSETS)
        p = i + r->offsets[b];
    if (j >= Sb)
        return 0;
    if (r->causal && j > p)
        return 0;
    if (r->window && r->wl >= 0 && j < p - r->wl)
        return 0;
    if (r->window && r->wr >= 0 && j > p + r->wr)
        return 0;
    return 1;
}
static int padding(const rule *r, int64_t b, int64_t i) { return r->qlen != NULL && i >= r->qlen[b]; }
static int mask_ok(const rule *r, int64_t b, int64_t h, int64_t i, int64_t j) {
    return r->mask == NULL || r->mask[bidx(r->ms, b, h, i, j)] != 0;
}
static int bias_ok(const rule *r, int64_t b, int64_t h, int64_t i, int64_t j) {
    return r->bias_blocks == NULL || r->bias_blocks[bidx(r->bs, b, h, i, j)] == 0;
}

static void brute(const rule *r, counts *c) {
    const int64_t group = r->Hq / r->Hkv;
    uint8_t *seen = calloc((size_t)r->S + 1, 1), *sseen = calloc((size_t)r->S + 1, 1);
    for (int64_t b = 0; b < r->B; ++b) {
        c->logical += r->Hq * r->L * r->S;
        int64_t rows_b = 0;
        for (int64_t g = 0; g < r->Hkv; ++g) {
            memset(seen, 0, (size_t)r->S + 1);
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
                for (int64_t i = 0; i < r->L; ++i) {
                    if (padding(r, b, i))
                        continue;
                    ++c->rows;
                    if (g == 0 && h == 0)
                        ++rows_b;
                    int64_t a = 0, sa = 0;
                    for (int64_t j = 0; j < r->S; ++j) {
                        if (!structural(r, b, i, j))
                            continue;
                        ++sa;
                        if (r->mask)
                            ++c->mask_pairs;
                        if (!mask_ok(r, b, h, i, j))
                            continue;
                        if (r->bias_blocks)
                            ++c->bias_pairs;
                        if (!bias_ok(r, b, h, i, j))
                            continue;
                        ++a;
                        seen[j] = 1;
                    }
                    c->allowed += a;
                    c->s_allowed += sa;
                    c->empty += a == 0;
                    c->s_empty += sa == 0;
                }
            for (int64_t j = 0; j < r->S; ++j)
                c->kv_rows += seen[j];
        }
        memset(sseen, 0, (size_t)r->S + 1);
        for (int64_t i = 0; i < r->L; ++i)
            for (int64_t j = 0; j < r->S; ++j)
                if (!padding(r, b, i) && structural(r, b, i, j))
                    sseen[j] = 1;
        for (int64_t j = 0; j < r->S; ++j)
            c->s_kv_rows += r->Hkv * sseen[j];
        if (rows_b > 0) {
            const int64_t Sb = r->klen ? r->klen[b] : r->S;
            c->score_pairs += r->Hq * rows_b * Sb;
            c->score_k_rows += r->Hkv * Sb;
        }
    }
    free(seen);
    free(sseen);
}

/* ------------------------------------------------------------ one random call */

static const sdpa_dtype DT[3] = {SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_BF16};

typedef struct rcall {
    sdpa_tensor q, k, v, out, weights, lse, bias;
    sdpa_allow_mask mask;
    sdpa_options o;
    int has_w, has_l;
    void *bufs[16];
    int nbufs;
    int64_t klen[4], qlen[4], offs[4];
    int32_t table[64];
    int32_t cuq[8], cuk[8];
    size_t out_bytes, w_bytes, l_bytes;
} rcall;

static void *keep(rcall *c, void *p) {
    c->bufs[c->nbufs++] = p;
    return p;
}
static void rcall_free(rcall *c) {
    for (int t = 0; t < c->nbufs; ++t)
        free(c->bufs[t]);
}

static void fill_sentinel(rcall *c) {
    memset(c->out.data, SENTINEL, c->out_bytes);
    if (c->has_w)
        memset(c->weights.data, SENTINEL, c->w_bytes);
    if (c->has_l)
        memset(c->lse.data, SENTINEL, c->l_bytes);
}
static void expect_untouched(const rcall *c) {
    assert_true(all_bytes(c->out.data, c->out_bytes, SENTINEL));
    if (c->has_w)
        assert_true(all_bytes(c->weights.data, c->w_bytes, SENTINEL));
    if (c->has_l)
        assert_true(all_bytes(c->lse.data, c->l_bytes, SENTINEL));
}

/* Compare a cost with the brute-force counts (E, Ev, element sizes given). */
static void expect_counts(const sdpa_cost *cost, const counts *bc, int scan, int valued, int score_stage, int64_t E,
                          int64_t Ev, size_t eq, size_t ek, size_t ev, size_t eb, int has_mask) {
    const int exact = scan || !valued;
    assert_int_equal(cost->exact, exact);
    assert_int_equal(cost->query_rows, bc->rows);
    const int64_t allowed = exact ? bc->allowed : bc->s_allowed;
    assert_int_equal(cost->allowed_pairs, allowed);
    assert_int_equal(cost->skipped_pairs, bc->logical - allowed);
    assert_int_equal(cost->empty_rows, exact ? bc->empty : bc->s_empty);
    assert_int_equal(cost->flops, 2 * E * (score_stage ? bc->score_pairs : allowed) + 2 * Ev * allowed);
    assert_int_equal(cost->bytes_read_q, bc->rows * E * (int64_t)eq);
    const int64_t kv = exact ? bc->kv_rows : bc->s_kv_rows;
    assert_int_equal(cost->bytes_read_k, (score_stage ? bc->score_k_rows : kv) * E * (int64_t)ek);
    assert_int_equal(cost->bytes_read_v, kv * Ev * (int64_t)ev);
    assert_int_equal(cost->bytes_read_mask, has_mask ? bc->mask_pairs : 0);
    if (eb > 0) { /* without the scan every structural pair counts (the mask is not read); the
                     * brute force's bias_pairs are those the mask allows */
        const int64_t structural_pairs = has_mask ? bc->mask_pairs : bc->bias_pairs;
        assert_int_equal(cost->bytes_read_bias, (exact ? bc->bias_pairs : structural_pairs) * (int64_t)eb);
    } else {
        assert_int_equal(cost->bytes_read_bias, 0);
    }
}

/* A random dense call (broadcast masks, bias, lengths, every alignment, windows, dtypes,
 * kernels, precision, weights / lse), the cost with and without the scan against the brute
 * force, then the call itself. */
static void dense_case(int iter) {
    rcall c;
    memset(&c, 0, sizeof c);
    const int64_t B = irand(1, 3), Hkv = irand(1, 2), group = irand(1, 3), Hq = Hkv * group;
    const int64_t L = chance(30) ? irand(1, 4) : irand(1, 12), S = irand(1, 14), E = irand(1, 9), Ev = irand(1, 9);
    const sdpa_dtype dq = DT[irand(0, 2)], dk = DT[irand(0, 2)], dv = chance(60) ? dk : DT[irand(0, 2)];
    const sdpa_dtype dout = DT[irand(0, 2)];
    const int64_t qs[4] = {B, Hq, L, E}, ks[4] = {B, Hkv, S, E}, vs[4] = {B, Hkv, S, Ev}, os[4] = {B, Hq, L, Ev};
    c.q = view(keep(&c, random_values(dq, numel(4, qs))), dq, 4, qs);
    c.k = view(keep(&c, random_values(dk, numel(4, ks))), dk, 4, ks);
    c.v = view(keep(&c, random_values(dv, numel(4, vs))), dv, 4, vs);
    c.out_bytes = (size_t)numel(4, os) * sdpa_dtype_size(dout);
    c.out = view(keep(&c, xalloc(c.out_bytes)), dout, 4, os);
    sdpa_options_init(&c.o);
    rule r;
    memset(&r, 0, sizeof r);
    r.B = B; r.Hq = Hq; r.Hkv = Hkv; r.L = L; r.S = S;
    c.o.causal = r.causal = chance(50);
    c.o.alignment = r.alignment = (int)irand(0, 2);
    if (r.alignment == SDPA_ALIGN_OFFSETS) {
        for (int64_t b = 0; b < B; ++b)
            c.offs[b] = irand(-3, S);
        c.o.query_offsets = r.offsets = c.offs;
    }
    if (chance(40)) {
        c.o.sliding_window = r.window = 1;
        c.o.window_left = r.wl = chance(20) ? -1 : irand(0, 4);
        c.o.window_right = r.wr = chance(20) ? -1 : irand(0, 4);
    }
    if (chance(50)) {
        for (int64_t b = 0; b < B; ++b)
            c.klen[b] = irand(0, S);
        c.o.key_lengths = r.klen = c.klen;
    }
    if (chance(40)) {
        for (int64_t b = 0; b < B; ++b)
            c.qlen[b] = irand(0, L);
        c.o.query_lengths = r.qlen = c.qlen;
    }
    if (chance(50)) { /* a mask of random broadcast shape, given at its own rank */
        const int64_t full[4] = {B, Hq, L, S};
        int32_t rank = (int32_t)irand(1, 4);
        for (int d = 0; d < 4; ++d)
            r.ms[d] = d < 4 - rank || chance(30) ? 1 : full[d];
        const int64_t n = numel(4, r.ms);
        uint8_t *m = keep(&c, xalloc((size_t)n));
        const int dens = (int)irand(10, 95);
        for (int64_t t = 0; t < n; ++t)
            m[t] = (uint8_t)(chance(dens) ? irand(1, 255) : 0);
        r.mask = m;
        assert_int_equal(sdpa_allow_mask_init(&c.mask, m, rank, r.ms + (4 - rank)), SDPA_OK);
        c.o.allow_mask = &c.mask;
    }
    size_t eb = 0;
    if (chance(35)) { /* a bias with -inf entries, rank 2 [L, S] or 4 */
        const sdpa_dtype db = DT[irand(0, 2)];
        eb = sdpa_dtype_size(db);
        const int rank4 = chance(50);
        r.bs[0] = rank4 ? B : 1; r.bs[1] = rank4 ? Hq : 1; r.bs[2] = L; r.bs[3] = S;
        const int64_t n = numel(4, r.bs);
        uint8_t *blocks = keep(&c, xalloc((size_t)n));
        void *data = keep(&c, xalloc((size_t)n * eb));
        for (int64_t t = 0; t < n; ++t) {
            blocks[t] = (uint8_t)chance(30);
            if (db == SDPA_DTYPE_F32)
                ((float *)data)[t] = blocks[t] ? -INFINITY : 0.25f;
            else if (db == SDPA_DTYPE_F16)
                ((uint16_t *)data)[t] = blocks[t] ? 0xFC00 : 0x3400;
            else
                ((uint16_t *)data)[t] = blocks[t] ? 0xFF80 : 0x3E80;
        }
        r.bias_blocks = blocks;
        c.bias = view(data, db, rank4 ? 4 : 2, rank4 ? r.bs : r.bs + 2);
        c.o.bias = &c.bias;
    }
    const int valued = r.mask != NULL || r.bias_blocks != NULL;
    c.o.empty_rows = chance(70) ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    c.o.precision = chance(50) ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
    c.o.kernel = chance(60) ? SDPA_KERNEL_AUTO : (int32_t)irand(1, 3);
    c.o.num_threads = (int32_t)irand(0, 3);
    c.has_w = chance(25);
    c.has_l = chance(50);
    if (c.has_w) {
        const int64_t ws[4] = {B, Hq, L, S};
        c.w_bytes = (size_t)numel(4, ws) * 4;
        c.weights = view(keep(&c, xalloc(c.w_bytes)), SDPA_DTYPE_F32, 4, ws);
        c.o.weights_stage = (int32_t)irand(0, 3);
    }
    if (c.has_l) {
        const int64_t ls[3] = {B, Hq, L};
        c.l_bytes = (size_t)numel(3, ls) * 4;
        c.lse = view(keep(&c, xalloc(c.l_bytes)), SDPA_DTYPE_F32, 3, ls);
    }
    sdpa_tensor *w = c.has_w ? &c.weights : NULL, *l = c.has_l ? &c.lse : NULL;
    const int score_stage = c.has_w && (c.o.weights_stage == SDPA_WEIGHTS_SCORES || c.o.weights_stage == SDPA_WEIGHTS_SOFTCAPPED);

    counts bc;
    memset(&bc, 0, sizeof bc);
    brute(&r, &bc);

    for (int scan = 0; scan < 2; ++scan) {
        fill_sentinel(&c);
        sdpa_cost_options co;
        sdpa_cost_options_init(&co);
        co.flags = scan ? SDPA_COST_EXACT : 0;
        sdpa_cost cost;
        sdpa_cost_init(&cost);
        const sdpa_status st = sdpa_attention_cost(&c.q, &c.k, &c.v, &c.o, &c.out, w, l, &co, &cost);
        expect_untouched(&c);
        assert_int_equal(cost.status, st);
        const int forced_no_weights = c.has_w && (c.o.kernel == SDPA_KERNEL_TILED || c.o.kernel == SDPA_KERNEL_DECODE);
        if (forced_no_weights) {
            assert_int_equal(st, SDPA_ERR_UNSUPPORTED);
            assert_string_equal(cost.kernel, "");
            assert_int_equal(cost.allowed_pairs, 0);
            assert_int_equal(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, w, l), SDPA_ERR_UNSUPPORTED);
            expect_untouched(&c);
            break;
        }
        const int exact = scan || !valued;
        const int64_t empty = exact ? bc.empty : bc.s_empty;
        const sdpa_status want = c.o.empty_rows == SDPA_EMPTY_ROWS_ERROR && empty > 0 ? SDPA_ERR_EMPTY_ROW : SDPA_OK;
        if (st != want)
            fail_msg("iter %d scan %d: status %s, expected %s (%s)", iter, scan, sdpa_status_string(st),
                     sdpa_status_string(want), sdpa_last_error_message());
        expect_counts(&cost, &bc, scan, valued, score_stage, E, Ev, sdpa_dtype_size(dq), sdpa_dtype_size(dk),
                      sdpa_dtype_size(dv), eb, r.mask != NULL);
        assert_int_equal(cost.bytes_written_out, (int64_t)c.out_bytes);
        assert_int_equal(cost.bytes_written_weights, (int64_t)c.w_bytes);
        assert_int_equal(cost.bytes_written_lse, (int64_t)c.l_bytes);
        size_t ws = 0;
        assert_int_equal(sdpa_attention_workspace_size(&c.q, &c.k, &c.v, &c.o, c.has_w, &ws), SDPA_OK);
        assert_int_equal(cost.workspace_bytes, ws);
        assert_true(cost.threads >= 1);
        if (st != SDPA_OK)
            continue;
        /* the call itself: same kernel name (under ERROR the call may still find empty rows the
         * unscanned mask hides) */
        const sdpa_status cs = sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, w, l);
        if (exact || c.o.empty_rows == SDPA_EMPTY_ROWS_ZERO) {
            if (cs != SDPA_OK)
                fail_msg("iter %d: the call returned %s: %s", iter, sdpa_status_string(cs), sdpa_last_error_message());
            if (strcmp(cost.kernel, sdpa_last_kernel()) != 0)
                fail_msg("iter %d: cost names kernel %s, the call ran %s", iter, cost.kernel, sdpa_last_kernel());
        }
    }
    rcall_free(&c);
}

static void test_cost_dense_random_matches_brute_force(void **state) {
    (void)state;
    for (int iter = 0; iter < 400; ++iter)
        dense_case(iter);
}

/* Paged K/V (block pools, random block table) and packed batches (cu_seqlens_q with
 * cu_seqlens_k or a block table): per sequence r, the B = 1 rule with bottom-right causal and
 * windows (p = i + S_r - L_r) or OFFSETS. */
static void serving_case(int iter, int packed, int paged) {
    rcall c;
    memset(&c, 0, sizeof c);
    const int64_t R = irand(1, 4), Hkv = irand(1, 2), group = irand(1, 2), Hq = Hkv * group;
    const int64_t E = irand(1, 8), Ev = irand(1, 8), bs = irand(1, 4), maxb = irand(1, 4);
    const sdpa_dtype dt = DT[irand(0, 2)];
    int64_t Lr[4], Sr[4];
    int64_t total_q = 0, total_k = 0;
    for (int64_t r = 0; r < R; ++r) {
        Lr[r] = packed ? (chance(40) ? 1 : irand(0, 6)) : 0;
        Sr[r] = paged ? maxb * bs : irand(0, 9);
        c.cuq[r] = (int32_t)total_q;
        c.cuk[r] = (int32_t)total_k;
        total_q += Lr[r];
        total_k += Sr[r];
    }
    c.cuq[R] = (int32_t)total_q;
    c.cuk[R] = (int32_t)total_k;
    const int64_t Ldense = packed ? 0 : irand(1, 6);
    sdpa_options_init(&c.o);
    c.o.causal = chance(60);
    c.o.alignment = chance(25) ? SDPA_ALIGN_OFFSETS : (packed ? SDPA_ALIGN_TOP_LEFT : (int32_t)irand(0, 1));
    if (chance(40)) {
        c.o.sliding_window = 1;
        c.o.window_left = chance(20) ? -1 : irand(0, 4);
        c.o.window_right = chance(20) ? -1 : irand(0, 3);
    }
    for (int64_t r = 0; r < R; ++r) {
        c.klen[r] = irand(0, paged ? maxb * bs : Sr[r]);
        c.offs[r] = irand(-2, 6);
    }
    if (paged || chance(50))
        c.o.key_lengths = c.klen;
    if (c.o.alignment == SDPA_ALIGN_OFFSETS)
        c.o.query_offsets = c.offs;
    c.o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    c.o.kernel = chance(70) ? SDPA_KERNEL_AUTO : (int32_t)irand(1, 3);
    c.o.precision = chance(50) ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
    if (packed) {
        c.o.cu_seqlens_q = c.cuq;
        c.o.num_seqs = R;
        if (!paged)
            c.o.cu_seqlens_k = c.cuk;
    }
    const int64_t qs[4] = {packed ? 1 : R, Hq, packed ? total_q : Ldense, E};
    const int64_t os[4] = {qs[0], Hq, qs[2], Ev};
    c.q = view(keep(&c, random_values(dt, numel(4, qs))), dt, 4, qs);
    c.out_bytes = (size_t)numel(4, os) * sdpa_dtype_size(dt);
    c.out = view(keep(&c, xalloc(c.out_bytes)), dt, 4, os);
    if (paged) {
        const int64_t nblocks = R * maxb + 2, ks[4] = {nblocks, Hkv, bs, E}, vs[4] = {nblocks, Hkv, bs, Ev};
        c.k = view(keep(&c, random_values(dt, numel(4, ks))), dt, 4, ks);
        c.v = view(keep(&c, random_values(dt, numel(4, vs))), dt, 4, vs);
        for (int64_t t = 0; t < R * maxb; ++t) /* a permutation of distinct blocks, or -1 where no key reaches */
            c.table[t] = (int32_t)((t * 7 + 3) % nblocks);
        for (int64_t r = 0; r < R; ++r)
            for (int64_t m = (c.klen[r] + bs - 1) / bs; m < maxb; ++m)
                if (chance(50))
                    c.table[r * maxb + m] = -1;
        c.o.block_table = c.table;
        c.o.max_blocks_per_seq = maxb;
    } else {
        const int64_t ks[4] = {packed ? 1 : R, Hkv, packed ? total_k : Sr[0], E};
        const int64_t vs[4] = {ks[0], Hkv, ks[2], Ev};
        if (!packed) /* a dense padded batch: every sequence has S = Sr[0] keys */
            for (int64_t r = 0; r < R; ++r) {
                Sr[r] = Sr[0];
                if (c.klen[r] > Sr[0])
                    c.klen[r] = Sr[0];
            }
        c.k = view(keep(&c, random_values(dt, numel(4, ks))), dt, 4, ks);
        c.v = view(keep(&c, random_values(dt, numel(4, vs))), dt, 4, vs);
    }

    counts bc;
    memset(&bc, 0, sizeof bc);
    if (packed) { /* each sequence as the B = 1 call it would be alone */
        for (int64_t r = 0; r < R; ++r) {
            rule q;
            memset(&q, 0, sizeof q);
            q.B = 1; q.Hq = Hq; q.Hkv = Hkv; q.L = Lr[r]; q.S = Sr[r];
            q.causal = c.o.causal;
            q.alignment = c.o.alignment == SDPA_ALIGN_OFFSETS ? SDPA_ALIGN_OFFSETS : SDPA_ALIGN_BOTTOM_RIGHT;
            q.offsets = c.offs + r;
            q.window = c.o.sliding_window;
            q.wl = c.o.window_left;
            q.wr = c.o.window_right;
            q.klen = c.o.key_lengths ? c.klen + r : NULL;
            brute(&q, &bc);
        }
    } else {
        rule q;
        memset(&q, 0, sizeof q);
        q.B = R; q.Hq = Hq; q.Hkv = Hkv; q.L = Ldense; q.S = Sr[0];
        q.causal = c.o.causal;
        q.alignment = c.o.alignment;
        q.offsets = c.offs;
        q.window = c.o.sliding_window;
        q.wl = c.o.window_left;
        q.wr = c.o.window_right;
        q.klen = c.o.key_lengths ? c.klen : NULL;
        brute(&q, &bc);
    }

    for (int scan = 0; scan < 2; ++scan) {
        fill_sentinel(&c);
        sdpa_cost_options co;
        sdpa_cost_options_init(&co);
        co.flags = scan ? SDPA_COST_EXACT | SDPA_COST_LSE : SDPA_COST_LSE;
        sdpa_cost cost;
        sdpa_cost_init(&cost);
        const sdpa_status st = sdpa_attention_cost(&c.q, &c.k, &c.v, &c.o, scan ? &c.out : NULL, NULL, NULL, &co, &cost);
        expect_untouched(&c);
        if (st != SDPA_OK)
            fail_msg("iter %d (packed %d paged %d): %s: %s", iter, packed, paged, sdpa_status_string(st),
                     sdpa_last_error_message());
        expect_counts(&cost, &bc, scan, 0, 0, E, Ev, sdpa_dtype_size(dt), sdpa_dtype_size(dt), sdpa_dtype_size(dt), 0, 0);
        assert_int_equal(cost.bytes_written_out, (int64_t)c.out_bytes);
        assert_int_equal(cost.bytes_written_lse, (int64_t)(c.out_bytes / sdpa_dtype_size(dt) / (size_t)Ev * 4));
        const sdpa_status cs = sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, NULL, NULL);
        if (cs != SDPA_OK)
            fail_msg("iter %d: the call returned %s: %s", iter, sdpa_status_string(cs), sdpa_last_error_message());
        if (strcmp(cost.kernel, sdpa_last_kernel()) != 0)
            fail_msg("iter %d (packed %d paged %d): cost names %s, the call ran %s", iter, packed, paged, cost.kernel,
                     sdpa_last_kernel());
    }
    rcall_free(&c);
}

static void test_cost_paged_matches_brute_force(void **state) {
    (void)state;
    for (int iter = 0; iter < 150; ++iter)
        serving_case(iter, 0, 1);
}

static void test_cost_packed_matches_brute_force(void **state) {
    (void)state;
    for (int iter = 0; iter < 150; ++iter)
        serving_case(iter, 1, 0);
}

static void test_cost_packed_paged_matches_brute_force(void **state) {
    (void)state;
    for (int iter = 0; iter < 150; ++iter)
        serving_case(iter, 1, 1);
}

/* ------------------------------------------------------------ fixed cases */

typedef struct small {
    float q[2 * 2 * 5 * 4], k[2 * 1 * 6 * 4], v[2 * 1 * 6 * 3], out[2 * 2 * 5 * 3], ws[8192];
    sdpa_tensor tq, tk, tv, to;
    sdpa_options o;
} small;

static void small_make(small *s) {
    memset(s, 0, sizeof *s);
    for (size_t t = 0; t < sizeof s->q / sizeof s->q[0]; ++t)
        s->q[t] = (float)(t % 7) * 0.1f;
    for (size_t t = 0; t < sizeof s->k / sizeof s->k[0]; ++t)
        s->k[t] = (float)(t % 5) * 0.1f;
    assert_int_equal(sdpa_tensor_init_4d(&s->tq, s->q, 2, 2, 5, 4), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&s->tk, s->k, 2, 1, 6, 4), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&s->tv, s->v, 2, 1, 6, 3), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_4d(&s->to, s->out, 2, 2, 5, 3), SDPA_OK);
    sdpa_options_init(&s->o);
}

/* Closed forms: causal L = S: L(L+1)/2 pairs per (b, h); FLOPs 2 (E + Ev) per pair. */
static void test_cost_causal_closed_form(void **state) {
    (void)state;
    small *s = malloc(sizeof *s);
    small_make(s);
    s->tk.shape[2] = 5; /* S = L = 5 (a prefix view of the keys) */
    s->tv.shape[2] = 5;
    s->o.causal = 1;
    sdpa_cost c;
    sdpa_cost_init(&c);
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL, NULL, &c), SDPA_OK);
    assert_int_equal(c.allowed_pairs, 2 * 2 * 15);
    assert_int_equal(c.skipped_pairs, 2 * 2 * 10);
    assert_int_equal(c.flops, 2 * (4 + 3) * 60);
    assert_int_equal(c.query_rows, 20);
    assert_int_equal(c.empty_rows, 0);
    assert_int_equal(c.exact, 1);
    assert_int_equal(c.bytes_read_q, 20 * 4 * 4);
    assert_int_equal(c.bytes_read_k, 2 * 5 * 4 * 4);
    assert_int_equal(c.bytes_read_v, 2 * 5 * 3 * 4);
    assert_int_equal(c.bytes_written_out, 20 * 3 * 4);
    assert_int_equal(c.bytes_written_weights, 0);
    assert_int_equal(c.status, SDPA_OK);
    assert_int_equal(sdpa_attention(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL), SDPA_OK);
    assert_string_equal(c.kernel, sdpa_last_kernel());
    /* the query leaves sdpa_last_kernel() alone (its name is a copy in the struct) */
    char before[64];
    snprintf(before, sizeof before, "%s", sdpa_last_kernel());
    s->o.kernel = SDPA_KERNEL_REFERENCE;
    sdpa_cost d;
    sdpa_cost_init(&d);
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, &d), SDPA_OK);
    assert_string_equal(sdpa_last_kernel(), before);
    assert_int_equal(d.kernel_id, SDPA_KERNEL_REFERENCE);
    assert_string_equal(d.kernel, "reference");
    assert_string_equal(c.kernel, before); /* still valid after later calls */
    free(s);
}

/* Errors: the query returns what the call would, writes nothing, and zeroes its counts. */
static void test_cost_structural_errors_match_the_call(void **state) {
    (void)state;
    small *s = malloc(sizeof *s);
    small_make(s);
    memset(s->out, SENTINEL, sizeof s->out);
    sdpa_cost c;
    sdpa_cost_init(&c);
    /* E mismatch */
    sdpa_tensor bad = s->tk;
    bad.shape[3] = 3;
    assert_int_equal(sdpa_attention_cost(&s->tq, &bad, &s->tv, &s->o, NULL, NULL, NULL, NULL, &c), SDPA_ERR_SHAPE);
    assert_non_null(strstr(sdpa_last_error_message(), "sdpa_attention_cost: key.shape[3]=3"));
    assert_int_equal(c.status, SDPA_ERR_SHAPE);
    assert_string_equal(c.kernel, "");
    assert_int_equal(c.allowed_pairs, 0);
    assert_int_equal(c.struct_size, sizeof c);
    assert_int_equal(sdpa_attention(&s->tq, &bad, &s->tv, &s->o, &s->to, NULL, NULL), SDPA_ERR_SHAPE);
    /* forced kernel that cannot serve weights */
    float w[2 * 2 * 5 * 6];
    sdpa_tensor tw;
    assert_int_equal(sdpa_tensor_init_4d(&tw, w, 2, 2, 5, 6), SDPA_OK);
    s->o.kernel = SDPA_KERNEL_TILED;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &s->to, &tw, NULL, NULL, &c), SDPA_ERR_UNSUPPORTED);
    sdpa_cost_options co;
    sdpa_cost_options_init(&co);
    co.flags = SDPA_COST_WEIGHTS;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, &co, &c), SDPA_ERR_UNSUPPORTED);
    s->o.kernel = SDPA_KERNEL_AUTO;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, &co, &c), SDPA_OK);
    assert_int_equal(c.kernel_id, SDPA_KERNEL_REFERENCE);
    assert_int_equal(c.bytes_written_weights, 2 * 2 * 5 * 6 * 4);
    /* output overlapping an input (needs out) */
    sdpa_tensor alias = s->to;
    alias.data = s->q;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &alias, NULL, NULL, NULL, &c), SDPA_ERR_OVERLAP);
    /* a caller workspace too small; the workspace is not written */
    s->o.workspace = s->ws;
    s->o.workspace_bytes = 16;
    memset(s->ws, SENTINEL, sizeof s->ws);
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL, NULL, &c),
                     SDPA_ERR_WORKSPACE_TOO_SMALL);
    assert_int_equal(sdpa_attention(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL), SDPA_ERR_WORKSPACE_TOO_SMALL);
    s->o.workspace_bytes = sizeof s->ws;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL, NULL, &c), SDPA_OK);
    assert_true(c.workspace_bytes <= sizeof s->ws);
    assert_true(all_bytes(s->ws, sizeof s->ws, SENTINEL));
    s->o.workspace = NULL;
    s->o.workspace_bytes = 0;
    /* misaligned */
    sdpa_tensor mis = s->tq;
    mis.data = (char *)s->q + 2;
    assert_int_equal(sdpa_attention_cost(&mis, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, &c), SDPA_ERR_ALIGNMENT);
    /* an invalid option */
    s->o.dropout_p = 1.5f;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, &c),
                     SDPA_ERR_INVALID_ARGUMENT);
    s->o.dropout_p = 0.0f;
    assert_true(all_bytes(s->out, sizeof s->out, SENTINEL));
    /* empty rows under ERROR are known without values: key_lengths 0 */
    const int64_t klen[2] = {0, 6};
    s->o.key_lengths = klen;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, &c), SDPA_ERR_EMPTY_ROW);
    assert_int_equal(c.status, SDPA_ERR_EMPTY_ROW);
    assert_int_equal(c.empty_rows, 2 * 5);
    assert_int_equal(c.allowed_pairs, 2 * 5 * 6);
    assert_int_equal(sdpa_attention(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL), SDPA_ERR_EMPTY_ROW);
    /* values are not read: NaN in q passes the query, fails the call */
    s->o.key_lengths = NULL;
    s->q[3] = NAN;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL, NULL, &c), SDPA_OK);
    assert_int_equal(sdpa_attention(&s->tq, &s->tk, &s->tv, &s->o, &s->to, NULL, NULL), SDPA_ERR_NON_FINITE);
    free(s);
}

/* The struct rules: struct_size first, what it covers written, a newer layout's tail zeroed. */
static void test_cost_struct_versioning(void **state) {
    (void)state;
    small *s = malloc(sizeof *s);
    small_make(s);
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, NULL), SDPA_ERR_NULL_POINTER);
    _Alignas(16) unsigned char big[512];
    memset(big, SENTINEL, sizeof big);
    sdpa_cost *c = (sdpa_cost *)(void *)big;
    c->struct_size = 16;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, c), SDPA_ERR_STRUCT_VERSION);
    assert_true(all_bytes(big + sizeof(size_t), sizeof big - sizeof(size_t), SENTINEL)); /* untouched */
    c->struct_size = sizeof(sdpa_cost) + 3;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, c), SDPA_ERR_STRUCT_VERSION);
    c->struct_size = sizeof(sdpa_cost) + 64; /* a newer caller's struct */
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, NULL, c), SDPA_OK);
    assert_int_equal(c->struct_size, sizeof(sdpa_cost) + 64);
    assert_true(all_bytes(big + sizeof(sdpa_cost), 64, 0));
    assert_true(all_bytes(big + sizeof(sdpa_cost) + 64, sizeof big - sizeof(sdpa_cost) - 64, SENTINEL));
    assert_true(c->allowed_pairs > 0);
    /* cost options */
    _Alignas(16) unsigned char ob[64];
    memset(ob, 0, sizeof ob);
    sdpa_cost_options *co = (sdpa_cost_options *)(void *)ob;
    co->struct_size = sizeof *co;
    co->flags = 0x80;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, co, c), SDPA_ERR_INVALID_ARGUMENT);
    assert_int_equal(c->status, SDPA_ERR_INVALID_ARGUMENT);
    co->flags = 0;
    co->reserved0 = 1;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, co, c), SDPA_ERR_STRUCT_VERSION);
    co->reserved0 = 0;
    co->struct_size = sizeof *co + 8;
    ob[sizeof *co + 2] = 1; /* a newer field this library does not know, not 0 */
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, co, c), SDPA_ERR_STRUCT_VERSION);
    ob[sizeof *co + 2] = 0;
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, NULL, NULL, co, c), SDPA_OK);
    /* out NULL with weights given */
    float w[2 * 2 * 5 * 6];
    sdpa_tensor tw;
    assert_int_equal(sdpa_tensor_init_4d(&tw, w, 2, 2, 5, 6), SDPA_OK);
    assert_int_equal(sdpa_attention_cost(&s->tq, &s->tk, &s->tv, &s->o, NULL, &tw, NULL, NULL, c), SDPA_ERR_NULL_POINTER);
    free(s);
}

/* The oversized call: a head-width mismatch with a huge broadcast query is the shape
 * error, found without touching memory (the query reads no value). */
static void test_cost_oversized_mismatch_is_a_shape_error(void **state) {
    (void)state;
    float one[64] = {0};
    const int64_t qs[4] = {1 << 10, 64, 1 << 14, 64}, qst[4] = {0, 0, 0, 1};
    const int64_t ks[4] = {1 << 10, 1, 8, 32}, kst[4] = {0, 0, 32, 1};
    sdpa_tensor q, k, v;
    float kv[8 * 32] = {0};
    assert_int_equal(sdpa_tensor_init_strided(&q, one, SDPA_DTYPE_F32, 4, qs, qst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&k, kv, SDPA_DTYPE_F32, 4, ks, kst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&v, kv, SDPA_DTYPE_F32, 4, ks, kst), SDPA_OK);
    sdpa_cost c;
    sdpa_cost_init(&c);
    assert_int_equal(sdpa_attention_cost(&q, &k, &v, NULL, NULL, NULL, NULL, NULL, &c), SDPA_ERR_SHAPE);
    assert_non_null(strstr(sdpa_last_error_message(), "key.shape[3]=32 does not match query.shape[3]=64"));
    /* the same shapes with matching E: a valid call whose out would be 2^36 floats */
    const int64_t ks2[4] = {1 << 10, 1, 8, 64}, kst2[4] = {0, 0, 0, 1};
    assert_int_equal(sdpa_tensor_init_strided(&k, one, SDPA_DTYPE_F32, 4, ks2, kst2), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&v, one, SDPA_DTYPE_F32, 4, ks2, kst2), SDPA_OK);
    assert_int_equal(sdpa_attention_cost(&q, &k, &v, NULL, NULL, NULL, NULL, NULL, &c), SDPA_OK);
    assert_int_equal(c.bytes_written_out, ((int64_t)1 << 36) * 4);
    assert_int_equal(c.allowed_pairs, ((int64_t)1 << 30) * 8); /* B * Hq * L * S */
}

/* Larger shapes: the split-KV decode, the tiled kernel over many blocks, every dtype and
 * precision; the name is the call's (under SDPA_MAX_ISA too: meson runs this test per ISA). */
static void test_cost_kernel_names_of_larger_calls(void **state) {
    (void)state;
    const int64_t shapes[3][4] = {{1, 2, 1, 4096}, {2, 2, 3, 600}, {1, 2, 70, 130}};
    for (int sh = 0; sh < 3; ++sh)
        for (int d = 0; d < 3; ++d)
            for (int prec = 0; prec < 2; ++prec) {
                const int64_t B = shapes[sh][0], H = shapes[sh][1], L = shapes[sh][2], S = shapes[sh][3], E = 32;
                const int64_t qs[4] = {B, H, L, E}, ks[4] = {B, H, S, E};
                void *qb = random_values(DT[d], numel(4, qs)), *kb = random_values(DT[d], numel(4, ks));
                void *vb = random_values(DT[d], numel(4, ks)), *ob = xalloc((size_t)numel(4, qs) * 4);
                sdpa_tensor q = view(qb, DT[d], 4, qs), k = view(kb, DT[d], 4, ks), v = view(vb, DT[d], 4, ks);
                sdpa_tensor o = view(ob, DT[d], 4, qs);
                sdpa_options opt;
                sdpa_options_init(&opt);
                opt.precision = prec ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
                opt.causal = sh == 2;
                opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
                sdpa_cost c;
                sdpa_cost_init(&c);
                assert_int_equal(sdpa_attention_cost(&q, &k, &v, &opt, &o, NULL, NULL, NULL, &c), SDPA_OK);
                assert_int_equal(sdpa_attention(&q, &k, &v, &opt, &o, NULL, NULL), SDPA_OK);
                if (strcmp(c.kernel, sdpa_last_kernel()) != 0)
                    fail_msg("shape %d dtype %d precision %d: cost names %s, the call ran %s", sh, d, prec, c.kernel,
                             sdpa_last_kernel());
                if (sh == 0)
                    assert_non_null(strstr(c.kernel, "split"));
                const int64_t pairs = sh == 2 ? B * H * (L * (L + 1) / 2 + L * (S - L)) : B * H * L * S;
                assert_int_equal(c.allowed_pairs, pairs);
                free(qb);
                free(kb);
                free(vb);
                free(ob);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_causal_closed_form),
        cmocka_unit_test(test_cost_structural_errors_match_the_call),
        cmocka_unit_test(test_cost_struct_versioning),
        cmocka_unit_test(test_cost_oversized_mismatch_is_a_shape_error),
        cmocka_unit_test(test_cost_kernel_names_of_larger_calls),
        cmocka_unit_test(test_cost_dense_random_matches_brute_force),
        cmocka_unit_test(test_cost_paged_matches_brute_force),
        cmocka_unit_test(test_cost_packed_matches_brute_force),
        cmocka_unit_test(test_cost_packed_paged_matches_brute_force),
    };
    return cmocka_run_group_tests_name("cost", tests, NULL, NULL);
}
