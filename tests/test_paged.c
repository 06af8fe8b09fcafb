/*
 * Paged K/V (block_table), packed variable-length batches (cu_seqlens_q / cu_seqlens_k) and
 * the cache write (sdpa_kv_write), against dense equivalents (bit-equal on each kernel), an
 * independent float64 evaluation written from the engine contracts (vLLM block tables and
 * slot_mapping, FlashAttention varlen, ONNX Runtime GroupQueryAttention's seqlens_k), and the
 * statuses of every bad index with canary outputs untouched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

/* ------------------------------------------------------------ small helpers */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float urand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }
static void fill(float *x, size_t n) {
    for (size_t t = 0; t < n; ++t)
        x[t] = urand();
}
static void fill_nan(float *x, size_t n) {
    for (size_t t = 0; t < n; ++t)
        x[t] = NAN;
}
static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    return p;
}
static void canary(float *x, size_t n) { memset(x, 0x7F, n * sizeof *x); }
static int is_canary(const float *x, size_t n) {
    const unsigned char *b = (const unsigned char *)x;
    for (size_t t = 0; t < n * sizeof *x; ++t)
        if (b[t] != 0x7F)
            return 0;
    return 1;
}
static sdpa_tensor view4(const float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const int64_t *st) {
    sdpa_tensor t;
    const int64_t shape[4] = {d0, d1, d2, d3};
    int64_t def[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
    assert_int_equal(sdpa_tensor_init_strided(&t, data, SDPA_DTYPE_F32, 4, shape, st ? st : def), SDPA_OK);
    return t;
}
static void expect(sdpa_status got, sdpa_status want, const char *needle) {
    if (got != want)
        fail_msg("status %s, expected %s: %s", sdpa_status_string(got), sdpa_status_string(want), sdpa_last_error_message());
    if (needle && !strstr(sdpa_last_error_message(), needle))
        fail_msg("message \"%s\" does not name \"%s\"", sdpa_last_error_message(), needle);
}
static void bits_equal(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, n * sizeof *a) != 0)
        for (size_t t = 0; t < n; ++t)
            if (memcmp(&a[t], &b[t], sizeof *a) != 0)
                fail_msg("%s: element %zu differs: %.9g vs %.9g", what, t, (double)a[t], (double)b[t]);
}

/* ----------------------------------------------------- a paged cache fixture
 * Sequences with key_lengths len[b], E, Ev, Hkv; a pool of NB blocks of BS slots in layout
 * 0 = [NB, Hkv, BS, E] or 1 = [NB, BS, Hkv, E] (vLLM's); a dense copy [B, Hkv, Smax, E]. The
 * block table is shuffled, sequences 0 and 2 share their first `shared` blocks (a common
 * prefix), and every unused block, slot past a length and table entry past a sequence's last
 * block holds NaN / garbage. */
enum { MAXB = 8 };
typedef struct fix {
    int64_t B, Hkv, E, Ev, BS, NB, MB; /* MB = max_blocks_per_seq */
    int layout;
    int64_t len[MAXB];
    int32_t *table;
    float *pk, *pv; /* pools */
    float *dk, *dv; /* dense [B, Hkv, S = MB * BS, E] */
} fix;

static void pool_strides(const fix *f, int64_t w, int64_t st[4]) {
    if (f->layout == 0) {
        st[0] = f->Hkv * f->BS * w; st[1] = f->BS * w; st[2] = w; st[3] = 1;
    } else {
        st[0] = f->BS * f->Hkv * w; st[1] = w; st[2] = f->Hkv * w; st[3] = 1;
    }
}
static float *pool_at(const fix *f, float *pool, int64_t w, int64_t blk, int64_t h, int64_t slot) {
    int64_t st[4];
    pool_strides(f, w, st);
    return pool + blk * st[0] + h * st[1] + slot * st[2];
}

static void fix_make(fix *f, int64_t B, int64_t Hkv, int64_t E, int64_t Ev, int64_t BS, const int64_t *len, int layout,
                     int shared) {
    memset(f, 0, sizeof *f);
    f->B = B; f->Hkv = Hkv; f->E = E; f->Ev = Ev; f->BS = BS; f->layout = layout;
    int64_t used = 0;
    for (int64_t b = 0; b < B; ++b) {
        f->len[b] = len[b];
        const int64_t nb = (len[b] + BS - 1) / BS;
        f->MB = nb > f->MB ? nb : f->MB;
        used += nb;
    }
    f->MB += 1; /* one spare column: garbage past every sequence's last block */
    f->NB = used + 3; /* 3 blocks no table names */
    const int64_t S = f->MB * BS;
    f->table = malloc((size_t)(B * f->MB) * sizeof(int32_t));
    f->pk = falloc((size_t)(f->NB * Hkv * BS * E));
    f->pv = falloc((size_t)(f->NB * Hkv * BS * Ev));
    f->dk = falloc((size_t)(B * Hkv * S * E));
    f->dv = falloc((size_t)(B * Hkv * S * Ev));
    fill_nan(f->pk, (size_t)(f->NB * Hkv * BS * E));
    fill_nan(f->pv, (size_t)(f->NB * Hkv * BS * Ev));
    fill(f->dk, (size_t)(B * Hkv * S * E));
    fill(f->dv, (size_t)(B * Hkv * S * Ev));
    /* A shuffled permutation of the pool's blocks. */
    int32_t perm[256];
    assert_true(f->NB <= 256);
    for (int32_t t = 0; t < f->NB; ++t)
        perm[t] = t;
    for (int64_t t = f->NB - 1; t > 0; --t) {
        const int64_t u = (int64_t)(rnd() % (uint64_t)(t + 1));
        const int32_t x = perm[t]; perm[t] = perm[u]; perm[u] = x;
    }
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t nb = (len[b] + BS - 1) / BS;
        for (int64_t c = 0; c < f->MB; ++c) {
            int32_t *e = &f->table[b * f->MB + c];
            if (c >= nb) {
                *e = (c & 1) ? -7 : 1 << 30; /* never reached: any value */
            } else if (b == 2 && c < shared && c < (f->len[0] + BS - 1) / BS) {
                *e = f->table[0 * f->MB + c]; /* shared prefix block of sequence 0 */
                /* the dense copy of sequence 2 gets the same keys there */
                for (int64_t h = 0; h < Hkv; ++h)
                    for (int64_t s = 0; s < BS; ++s) {
                        memcpy(f->dk + ((2 * Hkv + h) * S + c * BS + s) * E, f->dk + ((0 * Hkv + h) * S + c * BS + s) * E,
                               (size_t)E * sizeof(float));
                        memcpy(f->dv + ((2 * Hkv + h) * S + c * BS + s) * Ev, f->dv + ((0 * Hkv + h) * S + c * BS + s) * Ev,
                               (size_t)Ev * sizeof(float));
                    }
            } else {
                *e = perm[next++];
            }
        }
    }
    /* The pool holds the dense keys < len[b]; everything else stays NaN. */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < len[b]; ++j) {
                const int64_t blk = f->table[b * f->MB + j / BS];
                memcpy(pool_at(f, f->pk, E, blk, h, j % BS), f->dk + ((b * Hkv + h) * S + j) * E, (size_t)E * sizeof(float));
                memcpy(pool_at(f, f->pv, Ev, blk, h, j % BS), f->dv + ((b * Hkv + h) * S + j) * Ev, (size_t)Ev * sizeof(float));
            }
}
static void fix_free(fix *f) {
    free(f->table); free(f->pk); free(f->pv); free(f->dk); free(f->dv);
}
static sdpa_tensor fix_pool(const fix *f, int value) {
    int64_t st[4];
    const int64_t w = value ? f->Ev : f->E;
    pool_strides(f, w, st);
    return view4(value ? f->pv : f->pk, f->NB, f->Hkv, f->BS, w, st);
}
static void fix_paged_options(const fix *f, sdpa_options *o) {
    o->block_table = f->table;
    o->max_blocks_per_seq = f->MB;
    o->key_lengths = f->len;
}

/* ------------------------------------- paged vs dense views, bit-equal per kernel */

static const int g_kernels[] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE, SDPA_KERNEL_AUTO};

static void paged_vs_dense_case(int layout, int64_t L, int rule) {
    const int64_t B = 3, Hq = 8, Hkv = 2, E = 64, Ev = 32, BS = 16;
    const int64_t len[3] = {37, 1, 80};
    fix f;
    fix_make(&f, B, Hkv, E, Ev, BS, len, layout, 2);
    const int64_t S = f.MB * BS;
    float *q = falloc((size_t)(B * Hq * L * E));
    fill(q, (size_t)(B * Hq * L * E));
    const size_t no = (size_t)(B * Hq * L * Ev), nl = (size_t)(B * Hq * L);
    float *o1 = falloc(no), *o2 = falloc(no), *l1 = falloc(nl), *l2 = falloc(nl);
    sdpa_tensor tq = view4(q, B, Hq, L, E, NULL);
    sdpa_tensor tdk = view4(f.dk, B, Hkv, S, E, NULL), tdv = view4(f.dv, B, Hkv, S, Ev, NULL);
    sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
    sdpa_tensor to1 = view4(o1, B, Hq, L, Ev, NULL), to2 = view4(o2, B, Hq, L, Ev, NULL);
    sdpa_tensor tl1, tl2;
    const int64_t lshape[3] = {B, Hq, L};
    assert_int_equal(sdpa_tensor_init_dtype(&tl1, l1, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tl2, l2, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
    for (size_t kk = 0; kk < sizeof g_kernels / sizeof g_kernels[0]; ++kk) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = g_kernels[kk];
        o.key_lengths = f.len;
        o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        if (rule >= 1) {
            o.causal = 1;
            o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        }
        if (rule == 2) {
            o.sliding_window = 1;
            o.window_left = 20;
            o.window_right = 0;
        }
        sdpa_allow_mask am;
        float *bias = NULL;
        uint8_t *mk = NULL;
        sdpa_tensor tb;
        if (rule == 3) { /* an allow-mask [B, 1, L, S] and a bias [Hq, L, S] with -inf entries */
            const int64_t ms[4] = {B, 1, L, S}, bs3[3] = {Hq, L, S};
            mk = malloc((size_t)(B * L * S));
            bias = falloc((size_t)(Hq * L * S));
            for (int64_t t = 0; t < B * L * S; ++t)
                mk[t] = (rnd() % 4) != 0;
            for (int64_t t = 0; t < Hq * L * S; ++t)
                bias[t] = (rnd() % 7) == 0 ? -INFINITY : urand();
            assert_int_equal(sdpa_allow_mask_init(&am, mk, 4, ms), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&tb, bias, SDPA_DTYPE_F32, 3, bs3), SDPA_OK);
            o.allow_mask = &am;
            o.bias = &tb;
        }
        canary(o1, no); canary(o2, no); canary(l1, nl); canary(l2, nl);
        expect(sdpa_attention(&tq, &tdk, &tdv, &o, &to1, NULL, &tl1), SDPA_OK, NULL);
        const char *k1 = sdpa_last_kernel();
        char name[64];
        snprintf(name, sizeof name, "%s", k1);
        fix_paged_options(&f, &o);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, NULL, &tl2), SDPA_OK, NULL);
        assert_string_equal(name, sdpa_last_kernel());
        bits_equal(o1, o2, no, "out paged vs dense");
        bits_equal(l1, l2, nl, "lse paged vs dense");
        free(mk);
        free(bias);
    }
    free(q); free(o1); free(o2); free(l1); free(l2);
    fix_free(&f);
}

static void test_paged_vs_dense(void **state) {
    (void)state;
    for (int layout = 0; layout < 2; ++layout)
        for (int rule = 0; rule < 4; ++rule) {
            paged_vs_dense_case(layout, 1, rule);
            paged_vs_dense_case(layout, 5, rule);
            paged_vs_dense_case(layout, 70, rule);
        }
}

/* The reference kernel with weights: paged weights equal dense ones on every allowed key. */
static void test_paged_weights(void **state) {
    (void)state;
    const int64_t B = 3, Hq = 2, Hkv = 1, E = 8, Ev = 8, BS = 4, L = 3;
    const int64_t len[3] = {5, 2, 9};
    fix f;
    fix_make(&f, B, Hkv, E, Ev, BS, len, 0, 1);
    const int64_t S = f.MB * BS;
    float *q = falloc((size_t)(B * Hq * L * E));
    fill(q, (size_t)(B * Hq * L * E));
    const size_t no = (size_t)(B * Hq * L * Ev), nw = (size_t)(B * Hq * L * S);
    float *o1 = falloc(no), *o2 = falloc(no), *w1 = falloc(nw), *w2 = falloc(nw);
    sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), tdk = view4(f.dk, B, Hkv, S, E, NULL), tdv = view4(f.dv, B, Hkv, S, Ev, NULL);
    sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
    sdpa_tensor to1 = view4(o1, B, Hq, L, Ev, NULL), to2 = view4(o2, B, Hq, L, Ev, NULL);
    sdpa_tensor tw1 = view4(w1, B, Hq, L, S, NULL), tw2 = view4(w2, B, Hq, L, S, NULL);
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = 1;
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.key_lengths = f.len;
    o.empty_rows = SDPA_EMPTY_ROWS_ZERO; /* sequence 1 (2 keys, 3 queries): row 0 sees none */
    expect(sdpa_attention(&tq, &tdk, &tdv, &o, &to1, &tw1, NULL), SDPA_OK, NULL);
    fix_paged_options(&f, &o);
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, &tw2, NULL), SDPA_OK, NULL);
    bits_equal(o1, o2, no, "out");
    bits_equal(w1, w2, nw, "weights");
    free(q); free(o1); free(o2); free(w1); free(w2);
    fix_free(&f);
}

/* -------------------------------------------- float64 evaluation from the contract */

/* Row (b, h, i) of attention in double over logical keys j < S_b of sequence b, key j read
 * through the block table (vLLM: block_table[b][j / block_size], offset j % block_size), with
 * the position p = i + S_b - L_b (bottom-right) when causal. */
static void ref_row(const fix *f, const float *qrow, int64_t b, int64_t g, int64_t i, int64_t Lb, int causal,
                    double scale, double *out, double *lse) {
    const int64_t Sb = f->len[b], p = i + Sb - Lb;
    double m = -INFINITY;
    double *s = malloc((size_t)(Sb ? Sb : 1) * sizeof *s);
    for (int64_t j = 0; j < Sb; ++j) {
        s[j] = -INFINITY;
        if (causal && j > p)
            continue;
        const float *kr = pool_at(f, f->pk, f->E, f->table[b * f->MB + j / f->BS], g, j % f->BS);
        double d = 0;
        for (int64_t e = 0; e < f->E; ++e)
            d += (double)qrow[e] * (double)kr[e];
        s[j] = d * scale;
        m = s[j] > m ? s[j] : m;
    }
    double z = 0;
    for (int64_t e = 0; e < f->Ev; ++e)
        out[e] = 0;
    for (int64_t j = 0; j < Sb; ++j) {
        if (s[j] == -INFINITY)
            continue;
        const double w = exp(s[j] - m);
        z += w;
        const float *vr = pool_at(f, f->pv, f->Ev, f->table[b * f->MB + j / f->BS], g, j % f->BS);
        for (int64_t e = 0; e < f->Ev; ++e)
            out[e] += w * (double)vr[e];
    }
    for (int64_t e = 0; e < f->Ev; ++e)
        out[e] /= z;
    *lse = m + log(z);
    free(s);
}

static void close_to(double want, float got, double tol, const char *what, int64_t a, int64_t b) {
    if (!(fabs(want - (double)got) <= tol * (1.0 + fabs(want))))
        fail_msg("%s (%lld, %lld): %.9g, expected %.9g", what, (long long)a, (long long)b, (double)got, want);
}

/* vLLM paged decode (one query token per sequence, GQA 4/1, block size 4) on written-out
 * numbers: q, K, V with small integers so the float64 evaluation is exact-ish; and ONNX
 * Runtime GroupQueryAttention's contract for a prompt continuing a cache (seqlens_k: the
 * last query sees every key; causal bottom-right) as a packed call of two sequences. */
static void test_conformance_vllm_decode(void **state) {
    (void)state;
    const int64_t B = 2, Hq = 4, Hkv = 1, E = 4, BS = 4;
    const int64_t len[2] = {6, 3};
    fix f;
    fix_make(&f, B, Hkv, E, E, BS, len, 1, 0);
    /* keys k_j = (j mod 3 - 1, 0.5 j, 1, -1) / 4, values v_j = (j, 1, -j, 0.25) written in. */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < len[b]; ++j) {
            float *kr = pool_at(&f, f.pk, E, f.table[b * f.MB + j / BS], 0, j % BS);
            float *vr = pool_at(&f, f.pv, E, f.table[b * f.MB + j / BS], 0, j % BS);
            const float kv[4] = {(float)((j % 3) - 1) / 4, 0.125f * (float)j + (float)b, 0.25f, -0.25f};
            const float vv[4] = {(float)j, 1.0f, -(float)j - (float)b, 0.25f};
            memcpy(kr, kv, sizeof kv);
            memcpy(vr, vv, sizeof vv);
        }
    float q[2 * 4 * 4];
    for (int t = 0; t < 32; ++t)
        q[t] = (float)((t * 7) % 5 - 2) * 0.5f;
    float out[2 * 4 * 4], lse[8];
    sdpa_tensor tq = view4(q, B, Hq, 1, E, NULL), to = view4(out, B, Hq, 1, E, NULL);
    sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1), tl;
    const int64_t ls[3] = {B, Hq, 1};
    assert_int_equal(sdpa_tensor_init_dtype(&tl, lse, SDPA_DTYPE_F32, 3, ls), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    fix_paged_options(&f, &o);
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, &tl), SDPA_OK, NULL);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            double ro[4], rl;
            ref_row(&f, q + (b * Hq + h) * E, b, 0, 0, 1, 0, 0.5, ro, &rl);
            for (int e = 0; e < 4; ++e)
                close_to(ro[e], out[(b * Hq + h) * E + e], 1e-6, "out", b * Hq + h, e);
            close_to(rl, lse[b * Hq + h], 1e-6, "lse", b, h);
        }
    /* ONNX Runtime GQA-style: sequence 0 appends 2 new tokens to a cache of 4 (total 6),
     * sequence 1 one token to 2 (total 3); causal bottom-right: new token i of sequence b
     * sees keys j <= i + S_b - L_b. Packed queries [1, Hq, 3, E]. */
    const int32_t cuq[3] = {0, 2, 3};
    float q2[4 * 3 * 4], out2[4 * 3 * 4];
    for (int t = 0; t < 48; ++t)
        q2[t] = (float)((t * 5) % 7 - 3) * 0.25f;
    sdpa_tensor tq2 = view4(q2, 1, Hq, 3, E, NULL), to2 = view4(out2, 1, Hq, 3, E, NULL);
    o.causal = 1;
    o.cu_seqlens_q = cuq;
    o.num_seqs = 2;
    expect(sdpa_attention(&tq2, &tpk, &tpv, &o, &to2, NULL, NULL), SDPA_OK, NULL);
    for (int64_t h = 0; h < Hq; ++h)
        for (int64_t t = 0; t < 3; ++t) {
            const int64_t b = t < 2 ? 0 : 1, i = t - cuq[b], Lb = cuq[b + 1] - cuq[b];
            double ro[4], rl;
            ref_row(&f, q2 + (h * 3 + t) * E, b, 0, i, Lb, 1, 0.5, ro, &rl);
            for (int e = 0; e < 4; ++e)
                close_to(ro[e], out2[(h * 3 + t) * E + e], 1e-6, "packed out", h * 3 + t, e);
        }
    fix_free(&f);
}

/* ----------------------------------------------- packed vs per-sequence calls */

static void serial_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    (void)ctx;
    for (int64_t t = ntasks - 1; t >= 0; --t) /* any order is valid */
        task(task_ctx, t);
}

/* A packed batch of R sequences (Lr query rows, len keys each) against each sequence's call
 * alone, bit for bit, on every executor: 1, 2 and 3 own threads, a caller pool, a serial hook
 * (all sequences' checks and items share one parallel region; DESIGN section 7). */
static void packed_case_of(int paged, int rule, int kernel, int R, const int64_t *Lr, const int64_t *len, int64_t BS,
                           int alone_paged) {
    const int64_t Hq = 4, Hkv = 2, E = 32, Ev = 16;
    fix f;
    fix_make(&f, R, Hkv, E, Ev, BS, len, 1, 0);
    int32_t cuq[16], cuk[16];
    assert_true(R < 16);
    cuq[0] = cuk[0] = 0;
    for (int r = 0; r < R; ++r) {
        cuq[r + 1] = cuq[r] + (int32_t)Lr[r];
        cuk[r + 1] = cuk[r] + (int32_t)len[r];
    }
    const int64_t TQ = cuq[R], TK = cuk[R];
    /* q as FlashAttention's [total_q, Hq, E]: the view [1, Hq, TQ, E] with strides {0, E, Hq E, 1}. */
    float *q = falloc((size_t)(TQ * Hq * E)), *out = falloc((size_t)(TQ * Hq * Ev)), *lse = falloc((size_t)(Hq * TQ));
    float *ko = falloc((size_t)(TK * Hkv * E)), *vo = falloc((size_t)(TK * Hkv * Ev));
    fill(q, (size_t)(TQ * Hq * E));
    const int64_t S = f.MB * BS;
    for (int r = 0; r < R; ++r) /* packed dense keys [total_k, Hkv, E] from the fixture */
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < len[r]; ++j) {
                memcpy(ko + ((cuk[r] + j) * Hkv + h) * E, f.dk + ((r * Hkv + h) * S + j) * E, (size_t)E * sizeof(float));
                memcpy(vo + ((cuk[r] + j) * Hkv + h) * Ev, f.dv + ((r * Hkv + h) * S + j) * Ev, (size_t)Ev * sizeof(float));
            }
    const int64_t qst[4] = {0, E, Hq * E, 1}, ost[4] = {0, Ev, Hq * Ev, 1};
    const int64_t kst[4] = {0, E, Hkv * E, 1}, vst[4] = {0, Ev, Hkv * Ev, 1};
    sdpa_tensor tq = view4(q, 1, Hq, TQ, E, qst), to = view4(out, 1, Hq, TQ, Ev, ost), tl;
    const int64_t ls[3] = {1, Hq, TQ};
    assert_int_equal(sdpa_tensor_init_dtype(&tl, lse, SDPA_DTYPE_F32, 3, ls), SDPA_OK);
    sdpa_tensor tk, tv;
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = kernel;
    o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    o.cu_seqlens_q = cuq;
    o.num_seqs = R;
    if (rule >= 1)
        o.causal = 1;
    if (rule == 2) {
        o.sliding_window = 1;
        o.window_left = 9;
        o.window_right = 0;
    }
    if (paged) {
        tk = fix_pool(&f, 0);
        tv = fix_pool(&f, 1);
        fix_paged_options(&f, &o);
    } else {
        tk = view4(ko, 1, Hkv, TK, E, kst);
        tv = view4(vo, 1, Hkv, TK, Ev, vst);
        o.cu_seqlens_k = cuk;
    }
    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(3, &pool), SDPA_OK);
    for (int ex = 0; ex < 5; ++ex) {
    o.num_threads = ex < 3 ? ex + 1 : 0;
    o.threadpool = ex == 3 ? pool : NULL;
    o.parallel_for = ex == 4 ? serial_hook : NULL;
    o.parallel_for_threads = ex == 4 ? 4 : 0;
    canary(out, (size_t)(TQ * Hq * Ev));
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl), SDPA_OK, NULL);
    /* Each sequence alone: B = 1, its own rows, BOTTOM_RIGHT, the same kernel. */
    for (int r = 0; r < R; ++r) {
        float *o1 = falloc((size_t)(Lr[r] * Hq * Ev)), *l1 = falloc((size_t)(Hq * Lr[r]));
        sdpa_tensor sq = view4(q + cuq[r] * Hq * E, 1, Hq, Lr[r], E, qst), so = view4(o1, 1, Hq, Lr[r], Ev, ost), sl;
        const int64_t ls1[3] = {1, Hq, Lr[r]};
        assert_int_equal(sdpa_tensor_init_dtype(&sl, l1, SDPA_DTYPE_F32, 3, ls1), SDPA_OK);
        sdpa_options s;
        sdpa_options_init(&s);
        s.kernel = kernel;
        s.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        s.causal = o.causal;
        s.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        s.sliding_window = o.sliding_window;
        s.window_left = o.window_left;
        s.window_right = o.window_right;
        sdpa_tensor sk = view4(ko + cuk[r] * Hkv * E, 1, Hkv, len[r], E, kst);
        sdpa_tensor sv = view4(vo + cuk[r] * Hkv * Ev, 1, Hkv, len[r], Ev, vst);
        if (alone_paged) { /* alone with the same addressing: row r of the block table */
            sk = tk;
            sv = tv;
            s.block_table = f.table + r * f.MB;
            s.max_blocks_per_seq = f.MB;
            s.key_lengths = &f.len[r];
        }
        expect(sdpa_attention(&sq, &sk, &sv, &s, &so, NULL, &sl), SDPA_OK, NULL);
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Lr[r]; ++i) {
                bits_equal(o1 + (i * Hq + h) * Ev, out + ((cuq[r] + i) * Hq + h) * Ev, (size_t)Ev, "packed out row");
                bits_equal(l1 + h * Lr[r] + i, lse + h * TQ + cuq[r] + i, 1, "packed lse");
            }
        free(o1); free(l1);
    }
    }
    sdpa_threadpool_destroy(pool);
    free(q); free(out); free(lse); free(ko); free(vo);
    fix_free(&f);
}

static void packed_case(int paged, int rule, int kernel) {
    const int64_t Lr[4] = {7, 1, 1, 20};
    const int64_t len[4] = {30, 17, 1, 50};
    packed_case_of(paged, rule, kernel, 4, Lr, len, 8, 0);
}

static void test_packed_vs_per_sequence(void **state) {
    (void)state;
    for (int paged = 0; paged < 2; ++paged)
        for (int rule = 0; rule < 3; ++rule)
            for (size_t kk = 0; kk < sizeof g_kernels / sizeof g_kernels[0]; ++kk)
                packed_case(paged, rule, g_kernels[kk]);
}

/* A mixed serving batch under AUTO: prefill chunks of several tiled blocks (L > 64) next to
 * decode rows whose caches are long enough for the decode kernel to split its keys (split-KV
 * merge after the region), and an empty sequence; bit-equal to the dense calls alone, for the
 * paged batch too (the decode kernel splits the attended keys, not the block table's width:
 * a paged L = 3 row over 1500 keys once split differently from its dense view). */
static void test_packed_mixed_batch(void **state) {
    (void)state;
    const int64_t Lr[6] = {70, 1, 1, 0, 130, 3};
    const int64_t len[6] = {90, 1100, 2050, 5, 130, 1500};
    for (int paged = 0; paged < 2; ++paged)
        for (int rule = 0; rule < 2; ++rule)
            packed_case_of(paged, rule, SDPA_KERNEL_AUTO, 6, Lr, len, 32, 0);
}

/* ---------------------------------------------------- bad indices, canaries kept */

static void test_bad_block_table(void **state) {
    (void)state;
    const int64_t B = 3, Hq = 2, Hkv = 1, E = 8, BS = 4, L = 1;
    const int64_t len[3] = {5, 2, 9};
    fix f;
    fix_make(&f, B, Hkv, E, E, BS, len, 0, 0);
    float q[3 * 2 * 8], out[3 * 2 * 8];
    fill(q, 48);
    sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), to = view4(out, B, Hq, L, E, NULL);
    sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
    sdpa_options o;
    sdpa_options_init(&o);
    fix_paged_options(&f, &o);
    canary(out, 48);
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_OK, NULL); /* garbage past the last blocks is fine */
    const int32_t keep = f.table[2 * f.MB + 2];
    const int32_t bad[3] = {-1, (int32_t)f.NB, INT32_MAX};
    for (int t = 0; t < 3; ++t) {
        f.table[2 * f.MB + 2] = bad[t]; /* key 8 of sequence 2 lives there */
        char needle[64];
        snprintf(needle, sizeof needle, "block_table[2][2]=%d", (int)bad[t]);
        canary(out, 48);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_INDEX, needle);
        assert_true(is_canary(out, 48));
    }
    f.table[2 * f.MB + 2] = keep;
    o.key_lengths = NULL;
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_NULL_POINTER, "key_lengths");
    o.key_lengths = f.len;
    o.max_blocks_per_seq = 0;
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "max_blocks_per_seq");
    o.max_blocks_per_seq = f.MB;
    o.block_table_stride = f.MB - 1;
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "block_table_stride");
    o.block_table_stride = (int64_t)1 << 62; /* the table's extent overflows: the message names the stride */
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_SIZE_OVERFLOW, "block_table_stride=4611686018427387904");
    o.block_table_stride = 0;
    int64_t toolong[3] = {5, 2, f.MB * BS + 1};
    o.key_lengths = toolong;
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "key_lengths[2]");
    o.key_lengths = f.len;
    assert_true(is_canary(out, 48));
    fix_free(&f);
}

static void test_bad_cu_seqlens(void **state) {
    (void)state;
    const int64_t Hq = 2, Hkv = 1, E = 8;
    float q[2 * 6 * 8], k[10 * 8], v[10 * 8], out[2 * 6 * 8];
    fill(q, 96); fill(k, 80); fill(v, 80);
    sdpa_tensor tq = view4(q, 1, Hq, 6, E, NULL), tk = view4(k, 1, Hkv, 10, E, NULL), tv = view4(v, 1, Hkv, 10, E, NULL);
    sdpa_tensor to = view4(out, 1, Hq, 6, E, NULL);
    int32_t cuq[4] = {0, 2, 5, 6}, cuk[4] = {0, 4, 7, 10};
    sdpa_options o;
    sdpa_options_init(&o);
    o.cu_seqlens_q = cuq;
    o.cu_seqlens_k = cuk;
    o.num_seqs = 3;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
    struct { int which, idx; int32_t val; sdpa_status st; const char *needle; } cases[] = {
        {0, 0, 1, SDPA_ERR_INDEX, "cu_seqlens_q[0]=1"},
        {0, 2, 1, SDPA_ERR_INDEX, "cu_seqlens_q[2]=1"},   /* decreasing */
        {0, 3, 7, SDPA_ERR_INDEX, "cu_seqlens_q[num_seqs=3]=7"}, /* past total_q */
        {0, 3, 5, SDPA_ERR_INDEX, "total_q"},             /* short of total_q */
        {1, 1, -1, SDPA_ERR_INDEX, "cu_seqlens_k[1]=-1"},
        {1, 3, 11, SDPA_ERR_INDEX, "cu_seqlens_k[num_seqs=3]=11"},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; ++t) {
        int32_t *a = cases[t].which ? cuk : cuq;
        const int32_t keep = a[cases[t].idx];
        a[cases[t].idx] = cases[t].val;
        canary(out, 96);
        expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), cases[t].st, cases[t].needle);
        assert_true(is_canary(out, 96));
        a[cases[t].idx] = keep;
    }
    /* Wrong length: num_seqs one short or long reads an end that is not total_q. */
    o.num_seqs = 2;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INDEX, "num_seqs=2");
    o.num_seqs = -1;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "num_seqs");
    o.num_seqs = 3;
    o.cu_seqlens_k = NULL;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NULL_POINTER, "cu_seqlens_k");
    o.cu_seqlens_k = cuk;
    /* cu_seqlens_k without cu_seqlens_q is a mistake, not an ignored field (it would attend every
     * key of the padded batch). */
    o.cu_seqlens_q = NULL;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "cu_seqlens_q is NULL");
    assert_true(is_canary(out, 96));
    o.cu_seqlens_q = cuq;
    float w[2 * 6 * 10];
    sdpa_tensor tw = view4(w, 1, Hq, 6, 10, NULL);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, NULL), SDPA_ERR_UNSUPPORTED, "weights");
    sdpa_tensor tq3 = view4(q, 2, Hq, 3, E, NULL);
    expect(sdpa_attention(&tq3, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_SHAPE, "total_q");
    /* An empty row in a later sequence fails before the first sequence is written. */
    int64_t kl[3] = {4, 3, 0};
    o.key_lengths = kl;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_EMPTY_ROW, NULL);
    assert_true(is_canary(out, 96));
    kl[2] = 4;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "key_lengths[2]=4");
    kl[2] = 3;
    /* NaN in a key the last sequence attends: nothing written. */
    k[9 * 8 + 3] = NAN;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, NULL);
    assert_true(is_canary(out, 96));
    kl[2] = 2; /* key 9 (local 2) is now beyond sequence 2's length: never read */
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
}

/* The failure reported by a packed call is the lowest failing sequence's, whichever pass
 * (short sequences in parallel, long ones in order) found it. */
static void test_packed_first_failure(void **state) {
    (void)state;
    const int64_t Hq = 2, Hkv = 1, E = 8;
    float q[2 * 11 * 8], k[12 * 8], v[12 * 8], out[2 * 11 * 8];
    fill(q, 176); fill(k, 96); fill(v, 96);
    sdpa_tensor tq = view4(q, 1, Hq, 11, E, NULL), tk = view4(k, 1, Hkv, 12, E, NULL), tv = view4(v, 1, Hkv, 12, E, NULL);
    sdpa_tensor to = view4(out, 1, Hq, 11, E, NULL);
    int32_t cuq[3] = {0, 1, 11}, cuk[3] = {0, 2, 12}; /* sequence 0: a decode row; 1: a chunk of 10 */
    int64_t kl[2] = {0, 10};
    sdpa_options o;
    sdpa_options_init(&o);
    o.cu_seqlens_q = cuq;
    o.cu_seqlens_k = cuk;
    o.num_seqs = 2;
    o.key_lengths = kl;
    k[5 * 8] = NAN; /* key 3 of sequence 1 */
    canary(out, 176);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_EMPTY_ROW, "b=0");
    kl[0] = 2;
    kl[1] = 0;
    k[5 * 8] = 0.5f;
    k[1 * 8] = NAN; /* key 1 of sequence 0 */
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, NULL);
    kl[1] = 10;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, "packed sequence r=0");
    k[1 * 8] = 0.5f;
    k[5 * 8] = NAN;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, "packed sequence r=1");
    k[5 * 8] = 0.5f;
    k[1 * 8] = NAN;
    assert_true(is_canary(out, 176));
    /* The decode row's kernel checks its K/V inline, after the chunk's checks have run: a bad
     * query row of the later sequence still does not hide the decode row's bad key (r=0 comes
     * first in a scan), on every executor, and nothing is written. */
    const float keep = q[4 * 8];
    q[4 * 8] = NAN; /* head 0, row 4: sequence 1 */
    for (int t = 1; t <= 3; ++t) {
        o.num_threads = t;
        expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, "packed sequence r=0");
        assert_true(is_canary(out, 176));
    }
    k[1 * 8] = 0.5f;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, "packed sequence r=1");
    assert_true(is_canary(out, 176));
    q[4 * 8] = keep;
    v[1 * 8] = INFINITY; /* the decode row's value row 1 only: found by its kernel (gate 2) */
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, "packed sequence r=0");
    assert_true(is_canary(out, 176));
    v[1 * 8] = 0.5f;
    o.num_threads = 0;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
}

/* ------------------------------------------------------------- sdpa_kv_write */

static void test_kv_write(void **state) {
    (void)state;
    /* vLLM reshape_and_cache: slot = block * block_size + offset; negative = skip. Cache in
     * vLLM's [num_blocks, block_size, Hkv, E] layout as a strided view. */
    const int64_t NB = 3, BS = 4, Hkv = 2, E = 3, T = 4;
    float kc[3 * 4 * 2 * 3] = {0}, vc[3 * 4 * 2 * 3] = {0}, kr[4 * 2 * 3], vr[4 * 2 * 3];
    for (int t = 0; t < 24; ++t) {
        kr[t] = (float)t + 0.5f;
        vr[t] = -(float)t;
    }
    const int64_t cst[4] = {BS * Hkv * E, E, Hkv * E, 1};
    sdpa_tensor tkc = view4(kc, NB, Hkv, BS, E, cst), tvc = view4(vc, NB, Hkv, BS, E, cst), tk, tv;
    const int64_t rs[3] = {T, Hkv, E};
    assert_int_equal(sdpa_tensor_init_dtype(&tk, kr, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tv, vr, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    int64_t slots[4] = {5, -1, 11, 0};
    canary(kc, 72); canary(vc, 72);
    expect(sdpa_kv_write(&tkc, &tvc, &tk, &tv, slots), SDPA_OK, NULL);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t e = 0; e < E; ++e) {
                if (slots[t] < 0)
                    continue;
                const int64_t blk = slots[t] / BS, off = slots[t] % BS;
                assert_true(kc[blk * cst[0] + h * cst[1] + off * cst[2] + e] == kr[(t * Hkv + h) * E + e]);
                assert_true(vc[blk * cst[0] + h * cst[1] + off * cst[2] + e] == vr[(t * Hkv + h) * E + e]);
            }
    /* Skipped row 1 and every other slot untouched. */
    size_t written = 0;
    for (int t = 0; t < 72; ++t)
        written += !is_canary(&kc[t], 1);
    assert_int_equal(written, 3 * Hkv * E);
    /* Bad slot: nothing written, the row named. */
    canary(kc, 72); canary(vc, 72);
    int64_t bad[4] = {1, 2, 12, 3};
    expect(sdpa_kv_write(&tkc, &tvc, &tk, &tv, bad), SDPA_ERR_INDEX, "slot_mapping[2]=12");
    assert_true(is_canary(kc, 72) && is_canary(vc, 72));
    /* Rows inside the cache: overlap. */
    sdpa_tensor tin;
    assert_int_equal(sdpa_tensor_init_dtype(&tin, kc + 48, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    expect(sdpa_kv_write(&tkc, &tvc, &tin, &tv, slots), SDPA_ERR_OVERLAP, "key_cache");
    expect(sdpa_kv_write(&tkc, &tkc, &tk, &tv, slots), SDPA_ERR_OVERLAP, "value_cache");
    /* value rows inside the key cache, and inside the value cache */
    expect(sdpa_kv_write(&tkc, &tvc, &tk, &tin, slots), SDPA_ERR_OVERLAP, "key_cache");
    sdpa_tensor tvin;
    assert_int_equal(sdpa_tensor_init_dtype(&tvin, vc + 24, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    expect(sdpa_kv_write(&tkc, &tvc, &tk, &tvin, slots), SDPA_ERR_OVERLAP, "value_cache");
    expect(sdpa_kv_write(&tkc, &tvc, &tk, &tv, (const int64_t *)(const void *)kc), SDPA_ERR_OVERLAP, "slot_mapping");
    assert_true(is_canary(kc, 72) && is_canary(vc, 72));
    expect(sdpa_kv_write(&tkc, &tvc, &tk, NULL, slots), SDPA_ERR_NULL_POINTER, "value");
    sdpa_tensor tk2;
    const int64_t rs2[3] = {T, Hkv, E + 1};
    float big[4 * 2 * 4];
    assert_int_equal(sdpa_tensor_init_dtype(&tk2, big, SDPA_DTYPE_F32, 3, rs2), SDPA_OK);
    expect(sdpa_kv_write(&tkc, &tvc, &tk2, &tv, slots), SDPA_ERR_SHAPE, "Hkv and E");
    /* Keys only. */
    expect(sdpa_kv_write(&tkc, NULL, &tk, NULL, slots), SDPA_OK, NULL);
    assert_true(is_canary(vc, 72));
}

/* Conversion to a bf16 / f16 cache rounds to nearest, ties to even (values chosen on ties). */
static void test_kv_write_convert(void **state) {
    (void)state;
    const float x[4] = {1.00390625f /* 1 + 2^-8: tie -> 1.0 */, 1.01171875f /* 1 + 3 2^-8: tie -> 1 + 2^-6 */,
                        1.0f + 1.0f / 2048.0f /* f16 tie -> 1.0 */, -3.0f};
    const uint16_t want_bf16[4] = {0x3F80, 0x3F82, 0x3F80, 0xC040};
    uint16_t cache[2 * 4];
    sdpa_tensor tc, tr;
    const int64_t cs[4] = {2, 1, 4, 1}, rs[3] = {4, 1, 1};
    int64_t slots[4] = {0, 1, 2, 3};
    assert_int_equal(sdpa_tensor_init_dtype(&tr, x, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tc, cache, SDPA_DTYPE_BF16, 4, cs), SDPA_OK);
    expect(sdpa_kv_write(&tc, NULL, &tr, NULL, slots), SDPA_OK, NULL);
    for (int t = 0; t < 4; ++t)
        assert_int_equal(cache[t], want_bf16[t]);
    assert_int_equal(sdpa_tensor_init_dtype(&tc, cache, SDPA_DTYPE_F16, 4, cs), SDPA_OK);
    expect(sdpa_kv_write(&tc, NULL, &tr, NULL, slots), SDPA_OK, NULL);
    assert_int_equal(cache[0], 0x3C04); /* 1 + 2^-8 is exact in f16 */
    assert_int_equal(cache[1], 0x3C0C); /* 1 + 3 2^-8 exact too */
    assert_int_equal(cache[2], 0x3C00); /* 1 + 2^-11: tie -> even */
    assert_int_equal(cache[3], 0xC200);
    /* And back: bf16 rows into an f32 cache widen exactly. */
    float back[2 * 4];
    sdpa_tensor tb, tr16;
    assert_int_equal(sdpa_tensor_init_dtype(&tb, back, SDPA_DTYPE_F32, 4, cs), SDPA_OK);
    const uint16_t b16[4] = {0x3F80, 0x3F82, 0x3F81, 0xC040};
    assert_int_equal(sdpa_tensor_init_dtype(&tr16, b16, SDPA_DTYPE_BF16, 3, rs), SDPA_OK);
    expect(sdpa_kv_write(&tb, NULL, &tr16, NULL, slots), SDPA_OK, NULL);
    assert_true(back[0] == 1.0f && back[1] == 1.015625f && back[2] == 1.0078125f && back[3] == -3.0f);
}

/* The first len[b] keys of dense 16-bit [B, Hkv, S, E] K/V (dk, dv) into block pools
 * [NB, Hkv, BS, E] (pk, pv) through table [B, MB]. */
static void pool16_from_dense(uint16_t *pk, uint16_t *pv, const uint16_t *dk, const uint16_t *dv, const int32_t *table,
                              const int64_t *len, int64_t B, int64_t Hkv, int64_t S, int64_t E, int64_t BS, int64_t MB) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t j = 0; j < len[b]; ++j) {
                const int64_t blk = table[b * MB + j / BS];
                memcpy(&pk[((blk * Hkv + h) * BS + j % BS) * E], &dk[((b * Hkv + h) * S + j) * E], (size_t)E * 2);
                memcpy(&pv[((blk * Hkv + h) * BS + j % BS) * E], &dv[((b * Hkv + h) * S + j) * E], (size_t)E * 2);
            }
}

/* Reduced-precision caches: the paged loader serves every dtype the strided loaders do. On a
 * build whose attention computes f16/bf16 K/V, paged and dense views of the same 16-bit keys
 * are bit-equal; on one that does not, both answer SDPA_ERR_DTYPE (never one without the other). */
static void test_paged_16bit_like_dense(void **state) {
    (void)state;
    const sdpa_dtype dts[2] = {SDPA_DTYPE_F16, SDPA_DTYPE_BF16};
    const int64_t B = 2, Hq = 4, Hkv = 2, E = 16, BS = 4, MB = 3, NB = 7, S = MB * BS, L = 2;
    const int64_t len[2] = {9, 4};
    const int32_t table[2 * 3] = {5, 0, 3, 6, -1, 99}; /* sequence 1 uses one block; the rest is never read */
    uint16_t pk[7 * 2 * 4 * 16], pv[7 * 2 * 4 * 16], dk[2 * 2 * 12 * 16], dv[2 * 2 * 12 * 16];
    float q[2 * 4 * 2 * 16], o1[2 * 4 * 2 * 16], o2[2 * 4 * 2 * 16];
    fill(q, sizeof q / sizeof q[0]);
    for (int d = 0; d < 2; ++d) {
        memset(pk, 0xFF, sizeof pk); /* NaN in either 16-bit format */
        memset(pv, 0xFF, sizeof pv);
        for (size_t t = 0; t < sizeof dk / sizeof dk[0]; ++t) {
            dk[t] = (uint16_t)(d == 0 ? 0x3000 + (rnd() & 0x3FF) : 0x3E00 + (rnd() & 0xFF));
            dv[t] = (uint16_t)(d == 0 ? 0xB000 + (rnd() & 0x3FF) : 0xBE00 + (rnd() & 0xFF));
        }
        pool16_from_dense(pk, pv, dk, dv, table, len, B, Hkv, S, E, BS, MB);
        sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), to1 = view4(o1, B, Hq, L, E, NULL), to2 = view4(o2, B, Hq, L, E, NULL);
        sdpa_tensor tdk, tdv, tpk, tpv;
        const int64_t ds[4] = {B, Hkv, S, E}, ps[4] = {NB, Hkv, BS, E};
        assert_int_equal(sdpa_tensor_init_dtype(&tdk, dk, dts[d], 4, ds), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_dtype(&tdv, dv, dts[d], 4, ds), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_dtype(&tpk, pk, dts[d], 4, ps), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_dtype(&tpv, pv, dts[d], 4, ps), SDPA_OK);
        for (size_t kk = 0; kk < sizeof g_kernels / sizeof g_kernels[0]; ++kk) {
            sdpa_options o;
            sdpa_options_init(&o);
            o.kernel = g_kernels[kk];
            o.causal = 1;
            o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            o.key_lengths = len;
            const sdpa_status s1 = sdpa_attention(&tq, &tdk, &tdv, &o, &to1, NULL, NULL);
            o.block_table = table;
            o.max_blocks_per_seq = MB;
            const sdpa_status s2 = sdpa_attention(&tq, &tpk, &tpv, &o, &to2, NULL, NULL);
            assert_int_equal(s1, s2);
            if (s1 == SDPA_ERR_DTYPE) {
                if (kk == 0)
                    printf("%s K/V: attention answers SDPA_ERR_DTYPE for dense and paged alike (16-bit K/V not computed by this build)\n",
                           sdpa_dtype_name(dts[d]));
                continue;
            }
            assert_int_equal(s1, SDPA_OK);
            bits_equal(o1, o2, sizeof o1 / sizeof o1[0], "16-bit paged vs dense");
        }
    }
}

/* bf16 q/k/v at SDPA_PRECISION_REDUCED: the paged loader gives the bf16 dot-product kernels
 * (AVX512-BF16 / AMX) their raw bf16 rows too, so a paged call runs the same kernel as the dense
 * one and gives the same bits (it fell back to the f32-arithmetic kernel: a review found it).
 * Decode and tiled, a block size smaller than a tile (rows gathered across blocks) and one
 * larger (rows in place), sequences ending inside a block (rows past the length zero). */
static void test_paged_bf16_reduced_like_dense(void **state) {
    (void)state;
    enum { B = 2, Hq = 4, Hkv = 2, E = 32, LMAX = 40, SMAX = 160 };
    static uint16_t q[B * Hq * LMAX * E], dk[B * Hkv * SMAX * E], dv[B * Hkv * SMAX * E];
    static uint16_t pk[12 * Hkv * 160 * E], pv[12 * Hkv * 160 * E];
    static float o1[B * Hq * LMAX * E], o2[B * Hq * LMAX * E];
    const int64_t bss[2] = {16, 160}, lens[2] = {1, LMAX};
    int bf16_path = 0;
    for (size_t t = 0; t < sizeof q / sizeof q[0]; ++t)
        q[t] = (uint16_t)(0x3E00 + (rnd() & 0xFF) + ((rnd() & 1) << 15));
    for (size_t t = 0; t < sizeof dk / sizeof dk[0]; ++t) {
        dk[t] = (uint16_t)(0x3E00 + (rnd() & 0xFF) + ((rnd() & 1) << 15));
        dv[t] = (uint16_t)(0x3F00 + (rnd() & 0x7F) + ((rnd() & 1) << 15));
    }
    const int64_t len[B] = {SMAX - 5, 77};
    for (int bi = 0; bi < 2; ++bi) {
        const int64_t BS = bss[bi], MB = (SMAX + BS - 1) / BS, NB = 2 * MB + 1;
        int32_t table[2 * 10];
        for (int64_t t = 0; t < 2 * MB; ++t) /* blocks in reverse order, block 0 never referenced */
            table[t] = (int32_t)(NB - 1 - t);
        memset(pk, 0xFF, sizeof pk); /* NaN: slots past a length and the unused block */
        memset(pv, 0xFF, sizeof pv);
        pool16_from_dense(pk, pv, dk, dv, table, len, B, Hkv, SMAX, E, BS, MB);
        for (int li = 0; li < 2; ++li) {
            const int64_t L = lens[li];
            sdpa_tensor tq, tdk, tdv, tpk, tpv, to1, to2;
            const int64_t qs[4] = {B, Hq, L, E}, ds[4] = {B, Hkv, SMAX, E}, ps[4] = {NB, Hkv, BS, E};
            const int64_t qst[4] = {Hq * LMAX * E, LMAX * E, E, 1};
            assert_int_equal(sdpa_tensor_init_strided(&tq, q, SDPA_DTYPE_BF16, 4, qs, qst), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&tdk, dk, SDPA_DTYPE_BF16, 4, ds), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&tdv, dv, SDPA_DTYPE_BF16, 4, ds), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&tpk, pk, SDPA_DTYPE_BF16, 4, ps), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&tpv, pv, SDPA_DTYPE_BF16, 4, ps), SDPA_OK);
            to1 = view4(o1, B, Hq, L, E, NULL);
            to2 = view4(o2, B, Hq, L, E, NULL);
            sdpa_options o;
            sdpa_options_init(&o);
            o.precision = SDPA_PRECISION_REDUCED;
            o.causal = 1;
            o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            o.key_lengths = len;
            expect(sdpa_attention(&tq, &tdk, &tdv, &o, &to1, NULL, NULL), SDPA_OK, NULL);
            char dense_kernel[64];
            snprintf(dense_kernel, sizeof dense_kernel, "%s", sdpa_last_kernel());
            o.block_table = table;
            o.max_blocks_per_seq = MB;
            expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, NULL, NULL), SDPA_OK, NULL);
            if (strcmp(dense_kernel, sdpa_last_kernel()) != 0)
                fail_msg("block size %lld, L = %lld: dense ran %s, paged %s", (long long)BS, (long long)L, dense_kernel,
                         sdpa_last_kernel());
            bf16_path |= strstr(dense_kernel, "bf16-bf16") != NULL;
            bits_equal(o1, o2, (size_t)(B * Hq * L * E), "bf16 REDUCED paged vs dense");
        }
    }
    printf("bf16 REDUCED paged = dense: %s\n", bf16_path ? "bf16 dot-product kernels ran"
                                                          : "not run on the bf16 dot-product path (AVX512-BF16 absent or "
                                                            "capped by SDPA_MAX_ISA): compared its f32 fallback");
}

/* Dropout in a packed batch: sequence r draws as batch row r of the padded batch (b = r, i and j
 * counted within the sequence), so two identical sequences get different masks (every sequence
 * drew as b = 0: the same mask; a review found it), and the packed call equals the padded
 * [R, H, max L, max S] call with query/key lengths, bit for bit on the same kernel. */
static void test_packed_dropout_is_per_sequence(void **state) {
    (void)state;
    enum { R = 2, Hq = 2, Hkv = 1, E = 8, LM = 5, SM = 9 };
    const int32_t cuq[R + 1] = {0, 3, 8}, cuk[R + 1] = {0, 6, 15};
    const int64_t ql[R] = {3, 5}, kl[R] = {6, 9};
    float q[Hq * 8 * E], k[Hkv * 15 * E], v[Hkv * 15 * E], out[Hq * 8 * E];
    float pq[R * Hq * LM * E], pk[R * Hkv * SM * E], pv[R * Hkv * SM * E], pout[R * Hq * LM * E];
    fill(q, sizeof q / sizeof q[0]);
    fill(k, sizeof k / sizeof k[0]);
    fill(v, sizeof v / sizeof v[0]);
    memset(pq, 0, sizeof pq);
    memset(pk, 0, sizeof pk);
    memset(pv, 0, sizeof pv);
    for (int r = 0; r < R; ++r) {
        for (int h = 0; h < Hq; ++h)
            for (int i = 0; i < ql[r]; ++i)
                memcpy(&pq[((r * Hq + h) * LM + i) * E], &q[(h * 8 + cuq[r] + i) * E], E * sizeof(float));
        for (int j = 0; j < kl[r]; ++j) {
            memcpy(&pk[(r * SM + j) * E], &k[(cuk[r] + j) * E], E * sizeof(float));
            memcpy(&pv[(r * SM + j) * E], &v[(cuk[r] + j) * E], E * sizeof(float));
        }
    }
    const int kernels[2] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED};
    for (int kk = 0; kk < 2; ++kk) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = kernels[kk];
        o.dropout_p = 0.4f;
        o.dropout_seed = 7;
        o.dropout_offset = 3;
        sdpa_tensor tq = view4(q, 1, Hq, 8, E, NULL), tk = view4(k, 1, Hkv, 15, E, NULL), tv = view4(v, 1, Hkv, 15, E, NULL);
        sdpa_tensor to = view4(out, 1, Hq, 8, E, NULL);
        o.cu_seqlens_q = cuq;
        o.cu_seqlens_k = cuk;
        o.num_seqs = R;
        expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
        sdpa_options_init(&o);
        o.kernel = kernels[kk];
        o.dropout_p = 0.4f;
        o.dropout_seed = 7;
        o.dropout_offset = 3;
        o.query_lengths = ql;
        o.key_lengths = kl;
        sdpa_tensor tpq = view4(pq, R, Hq, LM, E, NULL), tpk = view4(pk, R, Hkv, SM, E, NULL), tpv = view4(pv, R, Hkv, SM, E, NULL);
        sdpa_tensor tpo = view4(pout, R, Hq, LM, E, NULL);
        expect(sdpa_attention(&tpq, &tpk, &tpv, &o, &tpo, NULL, NULL), SDPA_OK, NULL);
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < Hq; ++h)
                bits_equal(&out[(h * 8 + cuq[r]) * E], &pout[((r * Hq + h) * LM) * E], (size_t)(ql[r] * E),
                           "packed dropout vs the padded batch");
    }
    /* Two identical sequences: their masks differ (p = 0.4 over 4 x 8 elements per head). */
    const int32_t cu2[3] = {0, 4, 8};
    float q2[Hq * 8 * E], k2[Hkv * 16 * E], v2[Hkv * 16 * E], o2[Hq * 8 * E];
    fill(q2, 4 * E); /* rows 0-3 of head 0; every (head, sequence) gets the same 4 rows */
    fill(k2, 8 * E);
    fill(v2, 8 * E);
    for (int hs = 1; hs < 2 * Hq; ++hs)
        memcpy(&q2[hs * 4 * E], q2, 4 * E * sizeof(float));
    memcpy(&k2[8 * E], k2, 8 * E * sizeof(float));
    memcpy(&v2[8 * E], v2, 8 * E * sizeof(float));
    sdpa_options o;
    sdpa_options_init(&o);
    o.dropout_p = 0.4f;
    o.dropout_seed = 11;
    o.cu_seqlens_q = cu2;
    o.cu_seqlens_k = (const int32_t[3]){0, 8, 16};
    o.num_seqs = 2;
    sdpa_tensor tq = view4(q2, 1, Hq, 8, E, NULL), tk = view4(k2, 1, Hkv, 16, E, NULL), tv = view4(v2, 1, Hkv, 16, E, NULL);
    sdpa_tensor to = view4(o2, 1, Hq, 8, E, NULL);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
    assert_true(memcmp(&o2[0], &o2[4 * E], 4 * E * sizeof(float)) != 0);
}

/* Packed calls: OFFSETS alignment indexed by sequence, the workspace query, a caller workspace. */
static void test_packed_offsets_workspace(void **state) {
    (void)state;
    const int64_t Hq = 2, Hkv = 1, E = 8;
    float q[2 * 6 * 8], k[10 * 8], v[10 * 8], out[2 * 6 * 8], ref[2 * 6 * 8];
    fill(q, 96); fill(k, 80); fill(v, 80);
    sdpa_tensor tq = view4(q, 1, Hq, 6, E, NULL), tk = view4(k, 1, Hkv, 10, E, NULL), tv = view4(v, 1, Hkv, 10, E, NULL);
    sdpa_tensor to = view4(out, 1, Hq, 6, E, NULL);
    int32_t cuq[4] = {0, 2, 5, 6}, cuk[4] = {0, 4, 7, 10};
    int64_t qo[3] = {1, 0, 2};
    sdpa_options o;
    sdpa_options_init(&o);
    o.cu_seqlens_q = cuq;
    o.cu_seqlens_k = cuk;
    o.num_seqs = 3;
    o.causal = 1;
    o.alignment = SDPA_ALIGN_OFFSETS;
    o.query_offsets = qo;
    o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    size_t bytes = 0;
    expect(sdpa_attention_workspace_size(&tq, &tk, &tv, &o, 0, &bytes), SDPA_OK, NULL);
    assert_true(bytes > 0);
    expect(sdpa_attention_workspace_size(&tq, &tk, &tv, &o, 1, &bytes), SDPA_ERR_UNSUPPORTED, "weights");
    void *ws = malloc(bytes);
    o.workspace = ws;
    o.workspace_bytes = bytes - 1;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_WORKSPACE_TOO_SMALL, NULL);
    assert_true(is_canary(out, 96));
    o.workspace_bytes = bytes;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
    free(ws);
    for (int r = 0; r < 3; ++r) {
        const int64_t Lr = cuq[r + 1] - cuq[r], Sr = cuk[r + 1] - cuk[r];
        const int64_t qst[4] = {Hq * 6 * E, 6 * E, E, 1};
        sdpa_tensor sq = view4(q + cuq[r] * E, 1, Hq, Lr, E, qst), so = view4(ref + cuq[r] * E, 1, Hq, Lr, E, qst);
        sdpa_tensor sk = view4(k + cuk[r] * E, 1, Hkv, Sr, E, NULL), sv = view4(v + cuk[r] * E, 1, Hkv, Sr, E, NULL);
        sdpa_options s;
        sdpa_options_init(&s);
        s.causal = 1;
        s.alignment = SDPA_ALIGN_OFFSETS;
        s.query_offsets = &qo[r];
        s.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        expect(sdpa_attention(&sq, &sk, &sv, &s, &so, NULL, NULL), SDPA_OK, NULL);
    }
    bits_equal(ref, out, 96, "packed OFFSETS vs per-sequence");
}

/* --------------------------------------------- audit gaps (issue 27): paged and packed */

/* Paged weights at the score stages (SCORES, SOFTCAPPED) cover every key of the block table's
 * width: keys past key_lengths[b] are zero rows there (sdpa.h), never a read through the table
 * entries past a sequence's last block (the fixture puts 1 << 30 and -7 there, and NaN in
 * every slot past a length). Keys < len[b] give the dense call's bits. */
static void test_paged_weights_score_stages(void **state) {
    (void)state;
    const int64_t B = 3, Hq = 2, Hkv = 1, E = 8, Ev = 8, BS = 4, L = 3;
    const int64_t len[3] = {5, 2, 9};
    fix f;
    fix_make(&f, B, Hkv, E, Ev, BS, len, 0, 1);
    const int64_t S = f.MB * BS;
    float *q = falloc((size_t)(B * Hq * L * E));
    fill(q, (size_t)(B * Hq * L * E));
    const size_t no = (size_t)(B * Hq * L * Ev), nw = (size_t)(B * Hq * L * S);
    float *o1 = falloc(no), *o2 = falloc(no), *w1 = falloc(nw), *w2 = falloc(nw);
    sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), tdk = view4(f.dk, B, Hkv, S, E, NULL), tdv = view4(f.dv, B, Hkv, S, Ev, NULL);
    sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
    sdpa_tensor to1 = view4(o1, B, Hq, L, Ev, NULL), to2 = view4(o2, B, Hq, L, Ev, NULL);
    sdpa_tensor tw1 = view4(w1, B, Hq, L, S, NULL), tw2 = view4(w2, B, Hq, L, S, NULL);
    const int stages[2] = {SDPA_WEIGHTS_SCORES, SDPA_WEIGHTS_SOFTCAPPED};
    for (int st = 0; st < 2; ++st) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.causal = 1;
        o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        o.key_lengths = f.len;
        o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        o.weights_stage = stages[st];
        o.softcap = stages[st] == SDPA_WEIGHTS_SOFTCAPPED ? 0.75f : 0.0f;
        canary(w1, nw); canary(w2, nw);
        expect(sdpa_attention(&tq, &tdk, &tdv, &o, &to1, &tw1, NULL), SDPA_OK, NULL);
        fix_paged_options(&f, &o);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, &tw2, NULL), SDPA_OK, NULL);
        bits_equal(o1, o2, no, "out");
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < Hq; ++h)
                for (int64_t i = 0; i < L; ++i)
                    for (int64_t j = 0; j < S; ++j) {
                        const size_t at = (size_t)(((b * Hq + h) * L + i) * S + j);
                        if (j < len[b]) {
                            if (memcmp(&w1[at], &w2[at], sizeof(float)) != 0)
                                fail_msg("stage %d: weights[%lld,%lld,%lld,%lld] = %g paged, %g dense", stages[st],
                                         (long long)b, (long long)h, (long long)i, (long long)j, (double)w2[at],
                                         (double)w1[at]);
                        } else if (w2[at] != 0.0f) {
                            fail_msg("stage %d: weights[%lld,%lld,%lld,%lld] = %g past key_lengths[%lld]=%lld, want 0 (a zero row)",
                                     stages[st], (long long)b, (long long)h, (long long)i, (long long)j, (double)w2[at],
                                     (long long)b, (long long)len[b]);
                        }
                    }
    }
    free(q); free(o1); free(o2); free(w1); free(w2);
    fix_free(&f);
}

/* A batched decode (L = 1, paged and dense with key_lengths) whose LAST sequence is the longest
 * and longer than one key split: the split is sized from the longest sequence, wherever it
 * is. Against the float64 evaluation through the block table; paged and dense bit-equal. */
static void test_decode_last_sequence_longest(void **state) {
    (void)state;
    const int64_t lens[2][2] = {{10, 500}, {10, 1500}};
    for (int c = 0; c < 2; ++c) {
        const int64_t B = 2, Hq = 4, Hkv = 2, E = 16, Ev = 8, BS = 16, L = 1;
        fix f;
        fix_make(&f, B, Hkv, E, Ev, BS, lens[c], 1, 0);
        const int64_t S = f.MB * BS;
        float *q = falloc((size_t)(B * Hq * L * E));
        fill(q, (size_t)(B * Hq * L * E));
        const size_t no = (size_t)(B * Hq * L * Ev), nl = (size_t)(B * Hq * L);
        float *o1 = falloc(no), *o2 = falloc(no), *l1 = falloc(nl), *l2 = falloc(nl);
        sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), tdk = view4(f.dk, B, Hkv, S, E, NULL),
                    tdv = view4(f.dv, B, Hkv, S, Ev, NULL), tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
        sdpa_tensor to1 = view4(o1, B, Hq, L, Ev, NULL), to2 = view4(o2, B, Hq, L, Ev, NULL), tl1, tl2;
        const int64_t lshape[3] = {B, Hq, L};
        assert_int_equal(sdpa_tensor_init_dtype(&tl1, l1, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_dtype(&tl2, l2, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = SDPA_KERNEL_DECODE;
        o.key_lengths = f.len;
        o.num_threads = 2;
        expect(sdpa_attention(&tq, &tdk, &tdv, &o, &to1, NULL, &tl1), SDPA_OK, NULL);
        fix_paged_options(&f, &o);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, NULL, &tl2), SDPA_OK, NULL);
        bits_equal(o1, o2, no, "decode out paged vs dense");
        bits_equal(l1, l2, nl, "decode lse paged vs dense");
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < Hq; ++h) {
                double ro[8], rl;
                ref_row(&f, q + (b * Hq + h) * E, b, h / (Hq / Hkv), 0, 1, 0, 1.0 / sqrt((double)E), ro, &rl);
                close_to(rl, l2[b * Hq + h], 1e-5, "lse", b, h);
                for (int64_t e = 0; e < Ev; ++e)
                    close_to(ro[e], o2[(b * Hq + h) * Ev + e], 1e-5, "out", b, h);
            }
        free(q); free(o1); free(o2); free(l1); free(l2);
        fix_free(&f);
    }
}

/* sdpa_kv_write with E > 2048 (the conversion runs in chunks of 2048 elements) and element
 * strides other than 1: rows with stride 2 or -1 on E (and negative strides on T and Hkv),
 * a cache with stride 2 on E; f32 and f16 caches. Every element lands in its slot; the
 * cache's stride gaps and unnamed slots keep their canary. */
static void test_kv_write_wide_strided_rows(void **state) {
    (void)state;
    const int64_t T = 3, Hkv = 2, E = 2100, NB = 2, BS = 2;
    const int64_t nrow = T * Hkv * E;
    float *rbuf = falloc((size_t)(2 * nrow));
    for (int64_t t = 0; t < 2 * nrow; ++t)
        rbuf[t] = (float)((t * 37) % 257 - 128) / 8.0f; /* exact in f16 */
    const int64_t ncache = NB * Hkv * BS * E * 2; /* stride 2 on E */
    float *cf = falloc((size_t)ncache);
    uint16_t *ch = malloc((size_t)ncache * sizeof(uint16_t));
    assert_non_null(ch);
    const int64_t cst[4] = {Hkv * BS * E * 2, BS * E * 2, E * 2, 2};
    const int64_t cshape[4] = {NB, Hkv, BS, E}, rshape[3] = {T, Hkv, E};
    /* rows layouts: stride 2 on E; reversed E (-1); every axis reversed */
    const int64_t rst[3][3] = {{Hkv * E * 2, E * 2, 2}, {Hkv * E, E, -1}, {-Hkv * E, -E, -1}};
    const int64_t r0[3] = {0, E - 1, nrow - 1}; /* element [0, 0, 0] of each layout in rbuf */
    int64_t slots[3] = {3, -1, 0};
    for (int lay = 0; lay < 3; ++lay)
        for (int dt = 0; dt < 2; ++dt) {
            sdpa_tensor tr, tc;
            assert_int_equal(sdpa_tensor_init_strided(&tr, rbuf + r0[lay], SDPA_DTYPE_F32, 3, rshape, rst[lay]), SDPA_OK);
            void *cache = dt == 0 ? (void *)cf : (void *)ch;
            memset(cache, 0x7F, (size_t)ncache * (dt == 0 ? 4 : 2));
            assert_int_equal(sdpa_tensor_init_strided(&tc, cache, dt == 0 ? SDPA_DTYPE_F32 : SDPA_DTYPE_F16, 4, cshape, cst),
                             SDPA_OK);
            expect(sdpa_kv_write(&tc, NULL, &tr, NULL, slots), SDPA_OK, NULL);
            for (int64_t c = 0; c < ncache; ++c) {
                const int64_t blk = c / cst[0], h = c % cst[0] / cst[1], sl = c % cst[1] / cst[2], e = c % cst[2] / 2;
                int64_t from = -1;
                for (int64_t t = 0; t < T; ++t)
                    if (slots[t] == blk * BS + sl)
                        from = t;
                const unsigned char *cb = (const unsigned char *)cache + c * (dt == 0 ? 4 : 2);
                if (c % 2 != 0 || from < 0) { /* a stride gap or an unnamed slot: untouched */
                    if (cb[0] != 0x7F || cb[1] != 0x7F)
                        fail_msg("layout %d dtype %d: cache element %lld was written", lay, dt, (long long)c);
                    continue;
                }
                const float want = rbuf[r0[lay] + from * rst[lay][0] + h * rst[lay][1] + e * rst[lay][2]];
                float got;
                if (dt == 0) {
                    got = cf[c];
                } else { /* f16 -> float, exact for these values */
                    const int ex = ch[c] >> 10 & 31, m = ch[c] & 1023;
                    got = (float)(ex == 0 ? ldexp(m, -24) : ldexp(1024 + m, ex - 25));
                    if (ch[c] & 0x8000)
                        got = -got;
                }
                if (got != want)
                    fail_msg("layout %d dtype %d: row %lld head %lld element %lld is %g, want %g", lay, dt, (long long)from,
                             (long long)h, (long long)e, (double)got, (double)want);
            }
        }
    free(rbuf); free(cf); free(ch);
}

/* A value cache whose block size (or block count) differs from the key cache's: slot s names
 * a different place in each, so the call is SDPA_ERR_SHAPE before anything is written. */
static void test_kv_write_cache_geometry_mismatch(void **state) {
    (void)state;
    const int64_t Hkv = 1, E = 4, T = 2;
    float kc[4 * 4 * 4] = {0}, vc[8 * 2 * 4] = {0}, kr[2 * 4], vr[2 * 4];
    fill(kr, 8); fill(vr, 8);
    sdpa_tensor tkc = view4(kc, 4, Hkv, 4, E, NULL), tk, tv;
    const int64_t rs[3] = {T, Hkv, E};
    assert_int_equal(sdpa_tensor_init_dtype(&tk, kr, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tv, vr, SDPA_DTYPE_F32, 3, rs), SDPA_OK);
    int64_t slots[2] = {15, 1}; /* slot 15: block 3, offset 3 of the key cache; block 7, offset 1 of a bs = 2 pool */
    struct { int64_t nb, bs; } bad[3] = {{8, 2}, {4, 2}, {2, 4}};
    for (int c = 0; c < 3; ++c) {
        sdpa_tensor tvc = view4(vc, bad[c].nb, Hkv, bad[c].bs, E, NULL);
        canary(kc, 64); canary(vc, 64);
        expect(sdpa_kv_write(&tkc, &tvc, &tk, &tv, slots), SDPA_ERR_SHAPE, "value_cache");
        assert_true(is_canary(kc, 64) && is_canary(vc, 64));
    }
}

/* An output view that overlaps the block table's LAST row (of a three-sequence call), or the
 * table of a one-sequence call, is SDPA_ERR_OVERLAP: the table is read while out is written.
 * Here out's first element shares its bytes with the last table entry (a column past every
 * sequence's last block: any value is valid there). */
static void test_out_overlaps_block_table(void **state) {
    (void)state;
    for (int c = 0; c < 2; ++c) {
        const int64_t B = c == 0 ? 3 : 1, Hq = 2, Hkv = 1, E = 8, BS = 4, L = 1;
        const int64_t len[3] = {5, 2, 9};
        fix f;
        fix_make(&f, B, Hkv, E, E, BS, len, 0, 0);
        const int64_t nt = B * f.MB, no = B * Hq * L * E;
        /* one buffer: the table's entries, then out from the table's last entry on */
        int32_t *buf = malloc((size_t)(nt - 1 + no) * 4);
        assert_non_null(buf);
        memcpy(buf, f.table, (size_t)nt * 4);
        float q[3 * 2 * 8];
        fill(q, (size_t)(B * Hq * L * E));
        float *out = (float *)(void *)(buf + nt - 1);
        sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), to = view4(out, B, Hq, L, E, NULL);
        sdpa_tensor tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
        sdpa_options o;
        sdpa_options_init(&o);
        fix_paged_options(&f, &o);
        o.block_table = buf;
        canary(out, (size_t)no);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_ERR_OVERLAP, "block_table");
        assert_true(is_canary(out, (size_t)no));
        o.block_table = f.table; /* the same call without the overlap runs */
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to, NULL, NULL), SDPA_OK, NULL);
        free(buf);
        fix_free(&f);
    }
}

/* Packed [num_seqs, Hq] ALiBi slopes are checked in every row, not only the first (the other
 * rows belong to later sequences). */
static void test_packed_alibi_rows_checked(void **state) {
    (void)state;
    const int64_t Hq = 2, Hkv = 1, E = 8;
    float q[2 * 6 * 8], k[10 * 8], v[10 * 8], out[2 * 6 * 8];
    fill(q, 96); fill(k, 80); fill(v, 80);
    sdpa_tensor tq = view4(q, 1, Hq, 6, E, NULL), tk = view4(k, 1, Hkv, 10, E, NULL), tv = view4(v, 1, Hkv, 10, E, NULL);
    sdpa_tensor to = view4(out, 1, Hq, 6, E, NULL);
    int32_t cuq[4] = {0, 2, 5, 6}, cuk[4] = {0, 4, 7, 10};
    float slopes[3 * 2] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.5f, 0.25f};
    sdpa_options o;
    sdpa_options_init(&o);
    o.cu_seqlens_q = cuq;
    o.cu_seqlens_k = cuk;
    o.num_seqs = 3;
    o.alibi_slopes = slopes;
    o.alibi_slopes_rank = 2;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
    const float badv[2] = {NAN, -INFINITY};
    const int at[3] = {3, 4, 5}; /* rows 1 and 2 */
    for (int a = 0; a < 3; ++a)
        for (int t = 0; t < 2; ++t) {
            const float keep = slopes[at[a]];
            slopes[at[a]] = badv[t];
            char needle[32];
            snprintf(needle, sizeof needle, "alibi_slopes[%d]", at[a]);
            canary(out, 96);
            expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_NON_FINITE, needle);
            assert_true(is_canary(out, 96));
            slopes[at[a]] = keep;
        }
}

/* cu_seqlens whose only decrease is in the last pair (the end still equals the total) are
 * SDPA_ERR_INDEX, for the queries and for the keys. */
static void test_cu_seqlens_decrease_in_last_pair(void **state) {
    (void)state;
    const int64_t Hq = 2, Hkv = 1, E = 8;
    float q[2 * 6 * 8], k[10 * 8], v[10 * 8], out[2 * 6 * 8];
    fill(q, 96); fill(k, 80); fill(v, 80);
    sdpa_tensor tq = view4(q, 1, Hq, 6, E, NULL), tk = view4(k, 1, Hkv, 10, E, NULL), tv = view4(v, 1, Hkv, 10, E, NULL);
    sdpa_tensor to = view4(out, 1, Hq, 6, E, NULL);
    int32_t cuq[4] = {0, 2, 7, 6}, cuk[4] = {0, 4, 7, 10};
    sdpa_options o;
    sdpa_options_init(&o);
    o.cu_seqlens_q = cuq;
    o.cu_seqlens_k = cuk;
    o.num_seqs = 3;
    canary(out, 96);
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INDEX, "cu_seqlens_q[3]=6");
    assert_true(is_canary(out, 96));
    cuq[2] = 5;
    cuk[2] = 11;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INDEX, "cu_seqlens_k[3]=10");
    assert_true(is_canary(out, 96));
    cuk[2] = 7;
    expect(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK, NULL);
}

/* A paged decode spreads its work items over the call's threads in T far-apart ranges (the
 * claim -> item map must be a bijection, also when T does not divide the item count): 8 kv
 * heads x 2 key splits = 16 items over a hook of 3 and 5 threads (or a pool of 3) equal the
 * one-thread call bit for bit. The hook runs every task in one thread, so the result does not
 * depend on how many CPUs the machine has. */
static void test_paged_decode_spread_any_thread_count(void **state) {
    (void)state;
    const int64_t B = 1, Hq = 8, Hkv = 8, E = 128, Ev = 128, BS = 32, L = 1;
    const int64_t len[1] = {4096};
    fix f;
    fix_make(&f, B, Hkv, E, Ev, BS, len, 0, 0);
    float *q = falloc((size_t)(B * Hq * L * E));
    fill(q, (size_t)(B * Hq * L * E));
    const size_t no = (size_t)(B * Hq * L * Ev), nl = (size_t)(B * Hq * L);
    float *o1 = falloc(no), *o2 = falloc(no), *l1 = falloc(nl), *l2 = falloc(nl);
    sdpa_tensor tq = view4(q, B, Hq, L, E, NULL), tpk = fix_pool(&f, 0), tpv = fix_pool(&f, 1);
    sdpa_tensor to1 = view4(o1, B, Hq, L, Ev, NULL), to2 = view4(o2, B, Hq, L, Ev, NULL), tl1, tl2;
    const int64_t lshape[3] = {B, Hq, L};
    assert_int_equal(sdpa_tensor_init_dtype(&tl1, l1, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tl2, l2, SDPA_DTYPE_F32, 3, lshape), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = SDPA_KERNEL_DECODE;
    fix_paged_options(&f, &o);
    o.num_threads = 1;
    expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to1, NULL, &tl1), SDPA_OK, NULL);
    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(3, &pool), SDPA_OK);
    const int hook_threads[3] = {3, 5, 0};
    for (int c = 0; c < 3; ++c) {
        o.num_threads = 0;
        o.parallel_for = hook_threads[c] ? serial_hook : NULL;
        o.parallel_for_threads = hook_threads[c];
        o.threadpool = hook_threads[c] ? NULL : pool;
        canary(o2, no); canary(l2, nl);
        expect(sdpa_attention(&tq, &tpk, &tpv, &o, &to2, NULL, &tl2), SDPA_OK, NULL);
        bits_equal(o1, o2, no, "paged decode out, threads vs one thread");
        bits_equal(l1, l2, nl, "paged decode lse, threads vs one thread");
    }
    sdpa_threadpool_destroy(pool);
    free(q); free(o1); free(o2); free(l1); free(l2);
    fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_vs_dense),
        cmocka_unit_test(test_paged_weights),
        cmocka_unit_test(test_conformance_vllm_decode),
        cmocka_unit_test(test_packed_vs_per_sequence),
        cmocka_unit_test(test_packed_mixed_batch),
        cmocka_unit_test(test_bad_block_table),
        cmocka_unit_test(test_bad_cu_seqlens),
        cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_kv_write_convert),
        cmocka_unit_test(test_paged_16bit_like_dense),
        cmocka_unit_test(test_paged_bf16_reduced_like_dense),
        cmocka_unit_test(test_packed_dropout_is_per_sequence),
        cmocka_unit_test(test_packed_offsets_workspace),
        cmocka_unit_test(test_packed_first_failure),
        cmocka_unit_test(test_paged_weights_score_stages),
        cmocka_unit_test(test_decode_last_sequence_longest),
        cmocka_unit_test(test_kv_write_wide_strided_rows),
        cmocka_unit_test(test_kv_write_cache_geometry_mismatch),
        cmocka_unit_test(test_out_overlaps_block_table),
        cmocka_unit_test(test_packed_alibi_rows_checked),
        cmocka_unit_test(test_cu_seqlens_decrease_in_last_pair),
        cmocka_unit_test(test_paged_decode_spread_any_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
