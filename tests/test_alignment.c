/* Alignment (0.6, issue 29 part 3): a view whose data pointer is not a multiple of its element
 * size, or an options array not aligned to its element type, is SDPA_ERR_ALIGNMENT on every
 * entry point, for every dtype and every role, before anything is read or written through it.
 * Run in the sanitizer build too (CI: ASan + UBSan with halt_on_error): a misaligned load or
 * store anywhere would fail the test there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sdpa.h"

#define ARENA_BYTES (1u << 20)
#define GAP 4096 /* bytes between regions: a shifted view never reaches the next one */

static const sdpa_dtype DTYPES[] = {SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_BF16};

/* A 64-byte aligned arena cut into regions of GAP-separated buffers. */
typedef struct arena {
    unsigned char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes) {
    void *p = a->base + a->used;
    a->used += (bytes + GAP + 63) & ~(size_t)63;
    assert_true(a->used <= ARENA_BYTES);
    memset(p, 0, bytes);
    return p;
}

static arena arena_new(void) {
    arena a = {aligned_alloc(64, ARENA_BYTES), 0};
    assert_non_null(a.base);
    return a;
}

/* A contiguous view of `dtype` over fresh zeroed memory (values 0.25 for float32 inputs). */
static sdpa_tensor make(arena *a, sdpa_dtype dtype, int32_t rank, const int64_t *shape) {
    int64_t n = 1;
    for (int32_t d = 0; d < rank; ++d)
        n *= shape[d];
    void *data = take(a, (size_t)n * sdpa_dtype_size(dtype));
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init_dtype(&t, data, dtype, rank, shape), SDPA_OK);
    return t;
}

/* The same view with its data moved by `bytes` (built by hand: the constructors refuse it). */
static sdpa_tensor shifted(const sdpa_tensor *t, size_t bytes) {
    sdpa_tensor s = *t;
    s.data = (unsigned char *)t->data + bytes;
    return s;
}

static void expect_alignment(sdpa_status st, const char *needle) {
    if (st != SDPA_ERR_ALIGNMENT)
        fail_msg("expected SDPA_ERR_ALIGNMENT for %s, got %s: %s", needle, sdpa_status_string(st),
                 sdpa_last_error_message());
    if (strstr(sdpa_last_error_message(), needle) == NULL)
        fail_msg("message does not name %s: %s", needle, sdpa_last_error_message());
}

/* Byte offsets that misalign an element of `dtype`. */
static int misaligning(sdpa_dtype dtype, size_t *offs) {
    if (dtype == SDPA_DTYPE_F32) {
        offs[0] = 1; offs[1] = 2; offs[2] = 3;
        return 3;
    }
    offs[0] = 1; offs[1] = 3;
    return 2;
}

static int all_bytes_are(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; ++i)
        if (b[i] != v)
            return 0;
    return 1;
}

/* ---- constructors ---- */

static void test_constructors_refuse_misaligned_data(void **state) {
    (void)state;
    unsigned char *buf = aligned_alloc(64, 256);
    assert_non_null(buf);
    const int64_t shape[2] = {2, 3}, strides[2] = {3, 1}, empty[2] = {0, 3};
    for (size_t t = 0; t < 3; ++t) {
        size_t offs[3];
        const int n = misaligning(DTYPES[t], offs);
        for (int o = 0; o < n; ++o) {
            sdpa_tensor v;
            expect_alignment(sdpa_tensor_init_strided(&v, buf + offs[o], DTYPES[t], 2, shape, strides), "view");
            expect_alignment(sdpa_tensor_init_dtype(&v, buf + offs[o], DTYPES[t], 2, shape), "view");
            /* an empty view reads nothing: any address */
            assert_int_equal(sdpa_tensor_init_dtype(&v, buf + offs[o], DTYPES[t], 2, empty), SDPA_OK);
            const int64_t inner_empty[2] = {2, 0}; /* empty through any axis, not only the first */
            assert_int_equal(sdpa_tensor_init_dtype(&v, buf + offs[o], DTYPES[t], 2, inner_empty), SDPA_OK);
        }
        /* aligned to the element, not to more: accepted */
        sdpa_tensor v;
        assert_int_equal(sdpa_tensor_init_dtype(&v, buf + sdpa_dtype_size(DTYPES[t]), DTYPES[t], 2, shape), SDPA_OK);
    }
    sdpa_tensor v;
    expect_alignment(sdpa_tensor_init(&v, (float *)(void *)(buf + 2), 2, shape), "view");
    expect_alignment(sdpa_tensor_init_4d(&v, (float *)(void *)(buf + 1), 1, 1, 2, 3), "view");
    expect_alignment(sdpa_tensor_init_3d(&v, (float *)(void *)(buf + 3), 1, 2, 3), "view");
    /* allow-masks are uint8: any address */
    sdpa_allow_mask m;
    assert_int_equal(sdpa_allow_mask_init(&m, buf + 1, 2, shape), SDPA_OK);
    free(buf);
}

/* ---- sdpa_attention: every view role and every options array ---- */

typedef struct call {
    sdpa_tensor q, k, v, out, weights, lse, bias;
    sdpa_options o;
    int64_t klen[2], qlen[2], qoff[2];
    float sinks[2], slopes[2];
} call;

/* B=2, Hq=2, Hkv=1, L=3, S=4, E=Ev=4 in `dtype` (weights, lse f32). */
static void call_make(arena *a, call *c, sdpa_dtype dtype) {
    const int64_t qs[4] = {2, 2, 3, 4}, ks[4] = {2, 1, 4, 4}, ws[4] = {2, 2, 3, 4}, ls[3] = {2, 2, 3};
    c->q = make(a, dtype, 4, qs);
    c->k = make(a, dtype, 4, ks);
    c->v = make(a, dtype, 4, ks);
    c->out = make(a, dtype, 4, qs);
    c->weights = make(a, SDPA_DTYPE_F32, 4, ws);
    c->lse = make(a, SDPA_DTYPE_F32, 3, ls);
    const int64_t bs[2] = {3, 4};
    c->bias = make(a, dtype, 2, bs);
    sdpa_options_init(&c->o);
    c->o.skip_finite_check = 0;
    c->o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
}

static void test_attention_misaligned_views(void **state) {
    (void)state;
    for (size_t t = 0; t < 3; ++t) {
        arena a = arena_new();
        call c;
        call_make(&a, &c, DTYPES[t]);
        c.o.bias = &c.bias;
        /* the aligned call runs */
        assert_int_equal(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, &c.weights, &c.lse), SDPA_OK);
        const size_t out_bytes = 2 * 2 * 3 * 4 * sdpa_dtype_size(DTYPES[t]);
        size_t offs[3];
        const int n = misaligning(DTYPES[t], offs);
        for (int k = 0; k < n; ++k) {
            const size_t off = offs[k];
            memset(c.out.data, 0x5A, out_bytes);
            sdpa_tensor q = shifted(&c.q, off), kk = shifted(&c.k, off), v = shifted(&c.v, off);
            sdpa_tensor out = shifted(&c.out, off), bias = shifted(&c.bias, off);
            expect_alignment(sdpa_attention(&q, &c.k, &c.v, &c.o, &c.out, NULL, NULL), "query");
            expect_alignment(sdpa_attention(&c.q, &kk, &c.v, &c.o, &c.out, NULL, NULL), "key");
            expect_alignment(sdpa_attention(&c.q, &c.k, &v, &c.o, &c.out, NULL, NULL), "value");
            assert_true(all_bytes_are(c.out.data, out_bytes, 0x5A)); /* nothing written */
            memset(out.data, 0x5A, out_bytes);
            expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &out, NULL, NULL), "out");
            assert_true(all_bytes_are(out.data, out_bytes, 0x5A));
            c.o.bias = &bias;
            expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, NULL, NULL), "bias");
            c.o.bias = &c.bias;
            size_t need = 0;
            expect_alignment(sdpa_attention_workspace_size(&q, &c.k, &c.v, &c.o, 0, &need), "query");
            assert_true(all_bytes_are(c.out.data, out_bytes, 0x5A));
        }
        /* weights and lse are float32 */
        for (size_t off = 1; off < 4; ++off) {
            sdpa_tensor w = shifted(&c.weights, off), l = shifted(&c.lse, off);
            expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, &w, NULL), "weights");
            expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, NULL, &l), "lse");
        }
        free(a.base);
    }
}

/* An options array moved by `off` bytes inside a buffer holding the aligned values. */
static void *moved(void *buf, const void *values, size_t bytes, size_t off) {
    memcpy((unsigned char *)buf + off, values, bytes);
    return (unsigned char *)buf + off;
}

static void test_attention_misaligned_option_arrays(void **state) {
    (void)state;
    arena a = arena_new();
    call c;
    call_make(&a, &c, SDPA_DTYPE_F32);
    unsigned char *buf = take(&a, 256);
    const int64_t len[2] = {3, 2}, off2[2] = {0, 1};
    const float sinks[2] = {0.5f, -1.0f};
    for (size_t off = 1; off < 8; ++off) {
        sdpa_options o = c.o;
        o.key_lengths = moved(buf, len, sizeof len, off);
        expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), "key_lengths");
        o = c.o;
        o.query_lengths = moved(buf, len, sizeof len, off);
        expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), "query_lengths");
        o = c.o;
        o.alignment = SDPA_ALIGN_OFFSETS;
        o.query_offsets = moved(buf, off2, sizeof off2, off);
        expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), "query_offsets");
        if (off % 4 == 0)
            continue; /* 4-byte elements below */
        o = c.o;
        o.sinks = moved(buf, sinks, sizeof sinks, off);
        expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), "sinks");
        o = c.o;
        o.alibi_slopes = moved(buf, sinks, sizeof sinks, off);
        o.alibi_slopes_rank = 1;
        expect_alignment(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), "alibi_slopes");
    }
    /* an ignored query_offsets pointer (alignment not OFFSETS) is not looked at */
    sdpa_options o = c.o;
    o.query_offsets = (const int64_t *)(void *)(buf + 1);
    assert_int_equal(sdpa_attention(&c.q, &c.k, &c.v, &o, &c.out, NULL, NULL), SDPA_OK);
    free(a.base);
}

/* Paged (block_table) and packed (cu_seqlens) calls, every dtype of the pool. */
static void test_attention_misaligned_paged_and_packed(void **state) {
    (void)state;
    for (size_t t = 0; t < 3; ++t) {
        arena a = arena_new();
        const sdpa_dtype dt = DTYPES[t];
        /* pool [num_blocks=4, Hkv=1, bs=2, E=4]; two sequences of 3 and 2 keys; table [2, 2] */
        const int64_t ps[4] = {4, 1, 2, 4}, qs[4] = {2, 2, 1, 4};
        sdpa_tensor kp = make(&a, dt, 4, ps), vp = make(&a, dt, 4, ps);
        sdpa_tensor q = make(&a, dt, 4, qs), out = make(&a, dt, 4, qs);
        int32_t *table = take(&a, 4 * sizeof(int32_t));
        table[0] = 0; table[1] = 1; table[2] = 2; table[3] = 3;
        int64_t *klen = take(&a, 2 * sizeof(int64_t));
        klen[0] = 3; klen[1] = 2;
        sdpa_options o;
        sdpa_options_init(&o);
        o.block_table = table;
        o.max_blocks_per_seq = 2;
        o.key_lengths = klen;
        assert_int_equal(sdpa_attention(&q, &kp, &vp, &o, &out, NULL, NULL), SDPA_OK);
        size_t offs[3];
        const int n = misaligning(dt, offs);
        for (int k = 0; k < n; ++k) {
            sdpa_tensor kk = shifted(&kp, offs[k]), vv = shifted(&vp, offs[k]);
            expect_alignment(sdpa_attention(&q, &kk, &vp, &o, &out, NULL, NULL), "key");
            expect_alignment(sdpa_attention(&q, &kp, &vv, &o, &out, NULL, NULL), "value");
        }
        unsigned char *buf = take(&a, 64);
        for (size_t off = 1; off < 4; ++off) {
            sdpa_options p = o;
            p.block_table = moved(buf, table, 4 * sizeof(int32_t), off);
            expect_alignment(sdpa_attention(&q, &kp, &vp, &p, &out, NULL, NULL), "block_table");
        }
        /* packed: q [1, Hq=2, total_q=3, E], k/v [1, 1, total_k=5, E] */
        const int64_t pq[4] = {1, 2, 3, 4}, pk[4] = {1, 1, 5, 4};
        sdpa_tensor q2 = make(&a, dt, 4, pq), k2 = make(&a, dt, 4, pk), v2 = make(&a, dt, 4, pk);
        sdpa_tensor o2 = make(&a, dt, 4, pq);
        int32_t *cq = take(&a, 3 * sizeof(int32_t)), *ck = take(&a, 3 * sizeof(int32_t));
        cq[0] = 0; cq[1] = 1; cq[2] = 3;
        ck[0] = 0; ck[1] = 3; ck[2] = 5;
        sdpa_options pk_o;
        sdpa_options_init(&pk_o);
        pk_o.cu_seqlens_q = cq;
        pk_o.cu_seqlens_k = ck;
        pk_o.num_seqs = 2;
        pk_o.causal = 1;
        assert_int_equal(sdpa_attention(&q2, &k2, &v2, &pk_o, &o2, NULL, NULL), SDPA_OK);
        for (size_t off = 1; off < 4; ++off) {
            sdpa_options p = pk_o;
            p.cu_seqlens_q = moved(buf, cq, 3 * sizeof(int32_t), off);
            expect_alignment(sdpa_attention(&q2, &k2, &v2, &p, &o2, NULL, NULL), "cu_seqlens_q");
            p = pk_o;
            p.cu_seqlens_k = moved(buf, ck, 3 * sizeof(int32_t), off);
            expect_alignment(sdpa_attention(&q2, &k2, &v2, &p, &o2, NULL, NULL), "cu_seqlens_k");
        }
        for (int k = 0; k < n; ++k) {
            sdpa_tensor qq = shifted(&q2, offs[k]), oo = shifted(&o2, offs[k]);
            expect_alignment(sdpa_attention(&qq, &k2, &v2, &pk_o, &o2, NULL, NULL), "query");
            expect_alignment(sdpa_attention(&q2, &k2, &v2, &pk_o, &oo, NULL, NULL), "out");
        }
        free(a.base);
    }
}

/* ---- sdpa_merge (float32 views) ---- */

static void test_merge_misaligned_views(void **state) {
    (void)state;
    arena a = arena_new();
    const int64_t os[3] = {2, 3, 4}, ls[2] = {2, 3};
    sdpa_tensor oa = make(&a, SDPA_DTYPE_F32, 3, os), ob = make(&a, SDPA_DTYPE_F32, 3, os);
    sdpa_tensor la = make(&a, SDPA_DTYPE_F32, 2, ls), lb = make(&a, SDPA_DTYPE_F32, 2, ls);
    sdpa_tensor out = make(&a, SDPA_DTYPE_F32, 3, os), lse = make(&a, SDPA_DTYPE_F32, 2, ls);
    assert_int_equal(sdpa_merge(&oa, &la, &ob, &lb, &out, &lse), SDPA_OK);
    for (size_t off = 1; off < 4; ++off) {
        sdpa_tensor v[6] = {oa, la, ob, lb, out, lse};
        static const char *const names[6] = {"out_a", "lse_a", "out_b", "lse_b", "out", "lse"};
        for (int r = 0; r < 6; ++r) {
            sdpa_tensor w[6];
            memcpy(w, v, sizeof w);
            w[r] = shifted(&v[r], off);
            expect_alignment(sdpa_merge(&w[0], &w[1], &w[2], &w[3], &w[4], &w[5]), names[r]);
        }
    }
    free(a.base);
}

/* ---- sdpa_kv_write: caches, rows (every dtype) and slot_mapping ---- */

static void test_kv_write_misaligned(void **state) {
    (void)state;
    for (size_t t = 0; t < 3; ++t) {
        arena a = arena_new();
        const sdpa_dtype dt = DTYPES[t];
        const int64_t cs[4] = {2, 1, 2, 4}, rs[3] = {2, 1, 4};
        sdpa_tensor kc = make(&a, dt, 4, cs), vc = make(&a, dt, 4, cs);
        sdpa_tensor kr = make(&a, dt, 3, rs), vr = make(&a, dt, 3, rs);
        int64_t *slots = take(&a, 2 * sizeof(int64_t));
        slots[0] = 0; slots[1] = 3;
        assert_int_equal(sdpa_kv_write(&kc, &vc, &kr, &vr, slots), SDPA_OK);
        size_t offs[3];
        const int n = misaligning(dt, offs);
        for (int k = 0; k < n; ++k) {
            sdpa_tensor v[4] = {kc, vc, kr, vr};
            static const char *const names[4] = {"key_cache", "value_cache", "key", "value"};
            for (int r = 0; r < 4; ++r) {
                sdpa_tensor w[4];
                memcpy(w, v, sizeof w);
                w[r] = shifted(&v[r], offs[k]);
                expect_alignment(sdpa_kv_write(&w[0], &w[1], &w[2], &w[3], slots), names[r]);
            }
        }
        unsigned char *buf = take(&a, 64);
        for (size_t off = 1; off < 8; ++off)
            expect_alignment(sdpa_kv_write(&kc, &vc, &kr, &vr, moved(buf, slots, 2 * sizeof(int64_t), off)),
                             "slot_mapping");
        free(a.base);
    }
}

/* ---- sdpa_mha_forward: inputs, outputs, weights, lengths (float32) ---- */

static void test_mha_misaligned(void **state) {
    (void)state;
    arena a = arena_new();
    const int64_t xs[3] = {2, 3, 4}, ws[2] = {12, 4}, os[2] = {4, 4}, bs[1] = {12}, ob[1] = {4}, aw[3] = {2, 3, 3};
    sdpa_tensor x = make(&a, SDPA_DTYPE_F32, 3, xs), out = make(&a, SDPA_DTYPE_F32, 3, xs);
    sdpa_tensor in_w = make(&a, SDPA_DTYPE_F32, 2, ws), in_b = make(&a, SDPA_DTYPE_F32, 1, bs);
    sdpa_tensor out_w = make(&a, SDPA_DTYPE_F32, 2, os), out_b = make(&a, SDPA_DTYPE_F32, 1, ob);
    sdpa_tensor attw = make(&a, SDPA_DTYPE_F32, 3, aw);
    sdpa_mha_params p;
    sdpa_mha_params_init(&p);
    p.embed_dim = 4;
    p.num_heads = 2;
    p.in_proj_weight = &in_w;
    p.in_proj_bias = &in_b;
    p.out_proj_weight = &out_w;
    p.out_proj_bias = &out_b;
    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    assert_int_equal(sdpa_mha_forward(&p, &x, &x, &x, &o, &out, &attw), SDPA_OK);
    for (size_t off = 1; off < 4; ++off) {
        sdpa_tensor xm = shifted(&x, off), om = shifted(&out, off), am = shifted(&attw, off);
        expect_alignment(sdpa_mha_forward(&p, &xm, &x, &x, &o, &out, NULL), "query");
        expect_alignment(sdpa_mha_forward(&p, &x, &xm, &x, &o, &out, NULL), "key");
        expect_alignment(sdpa_mha_forward(&p, &x, &x, &xm, &o, &out, NULL), "value");
        expect_alignment(sdpa_mha_forward(&p, &x, &x, &x, &o, &om, NULL), "out");
        expect_alignment(sdpa_mha_forward(&p, &x, &x, &x, &o, &out, &am), "attn_weights");
        sdpa_mha_params pm = p;
        sdpa_tensor wm = shifted(&in_w, off), bm = shifted(&in_b, off), owm = shifted(&out_w, off);
        pm.in_proj_weight = &wm;
        expect_alignment(sdpa_mha_forward(&pm, &x, &x, &x, &o, &out, NULL), "in_proj_weight");
        pm = p;
        pm.in_proj_bias = &bm;
        expect_alignment(sdpa_mha_forward(&pm, &x, &x, &x, &o, &out, NULL), "in_proj_bias");
        pm = p;
        pm.out_proj_weight = &owm;
        expect_alignment(sdpa_mha_forward(&pm, &x, &x, &x, &o, &out, NULL), "out_proj_weight");
        size_t need;
        expect_alignment(sdpa_mha_workspace_size(&p, &xm, &x, &x, &o, 0, &need), "query");
    }
    unsigned char *buf = take(&a, 64);
    const int64_t len[2] = {3, 2};
    for (size_t off = 1; off < 8; ++off) {
        sdpa_mha_options om = o;
        om.key_lengths = moved(buf, len, sizeof len, off);
        expect_alignment(sdpa_mha_forward(&p, &x, &x, &x, &om, &out, NULL), "key_lengths");
        om = o;
        om.query_lengths = moved(buf, len, sizeof len, off);
        expect_alignment(sdpa_mha_forward(&p, &x, &x, &x, &om, &out, NULL), "query_lengths");
    }
    free(a.base);
}

static void test_status_string_names_alignment(void **state) {
    (void)state;
    assert_string_equal(sdpa_status_string(SDPA_ERR_ALIGNMENT), "SDPA_ERR_ALIGNMENT");
    assert_int_equal((int)SDPA_ERR_ALIGNMENT, 28);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_string_names_alignment),
        cmocka_unit_test(test_constructors_refuse_misaligned_data),
        cmocka_unit_test(test_attention_misaligned_views),
        cmocka_unit_test(test_attention_misaligned_option_arrays),
        cmocka_unit_test(test_attention_misaligned_paged_and_packed),
        cmocka_unit_test(test_merge_misaligned_views),
        cmocka_unit_test(test_kv_write_misaligned),
        cmocka_unit_test(test_mha_misaligned),
    };
    return cmocka_run_group_tests_name("alignment", tests, NULL, NULL);
}
