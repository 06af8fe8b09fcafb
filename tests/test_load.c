/*
 * The loaders of src/load.c (white box; links the library's objects): for every storage dtype
 * (f32, f16, bf16; 0.6: q8_0, FP8 E4M3 and E5M2 with per-tensor / per-kv-head scales, a huge
 * one included) x addressing (strided, paged), on random views (any strides, negative and
 * padded ones, a non-contiguous last axis; block pools with a shuffled block table and key
 * lengths), each member against a scalar reading of the stored bytes written here:
 *   rows      - the float32 rows equal the widened elements, bit for bit, and rows past a paged
 *               sequence's keys are zeros;
 *   rows_bf16 - (bf16 only) the raw encodings;
 *   rows_raw  - the in-place run starts at the row's first element, has the view's row stride
 *               and never runs past a block or the keys; none for FP8 rows scaled by != 1;
 *   row_finite- false exactly when some element of the row is Inf or NaN.
 * With the portable conversion table and with the process's (the call context's), which must
 * read the same bits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "load.h"
#include "microkernel.h"

static uint64_t g_state;
static int64_t rnd(int64_t lo, int64_t hi) { /* uniform in [lo, hi] */
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int64_t)((g_state >> 33) % (uint64_t)(hi - lo + 1));
}

/* The scalar reading of one stored element (IEEE binary16 and bfloat16 by their definitions). */
static float scalar_f16(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float x;
    if (e == 0)
        x = ldexpf((float)m, -24);
    else if (e == 31)
        x = m == 0 ? INFINITY : NAN;
    else
        x = ldexpf((float)(m + 1024), e - 25);
    return sign ? -x : x;
}
static float scalar_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* OCP FP8 by its definition: E4M3FN (bias 7, NaN s.1111.111, no Inf), E5M2 (bias 15, IEEE). */
static float scalar_fp8(uint8_t b, int dtype) {
    const int sign = b >> 7;
    float x;
    if (dtype == SDPA_DTYPE_FP8_E4M3) {
        const int e = (b >> 3) & 15, m = b & 7;
        x = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m + 8), e - 10);
    } else {
        const int e = (b >> 2) & 31, m = b & 3;
        x = e == 31 ? (m == 0 ? INFINITY : NAN) : e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(m + 4), e - 17);
    }
    return sign ? -x : x;
}
static float read_elem(const unsigned char *base, int dtype, int64_t at) {
    if (dtype == SDPA_DTYPE_FP8_E4M3 || dtype == SDPA_DTYPE_FP8_E5M2)
        return scalar_fp8(base[at], dtype);
    if (dtype == SDPA_DTYPE_F32) {
        float x;
        memcpy(&x, base + at * 4, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, base + at * 2, 2);
    return dtype == SDPA_DTYPE_F16 ? scalar_f16(h) : scalar_bf16(h);
}
/* Same value, or both NaN (f16 NaNs come back quiet: the payload may differ). */
static int same(float a, float b) {
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

typedef struct lcase {
    sdpa__view4 v;
    unsigned char *mem, *base; /* allocation; element [0, 0, 0, 0] of the pool / view */
    int32_t table[64];
    int64_t kl[4];
    int64_t B, H, S, E, nb, bs;
    int paged, dtype;
    float scales[3]; /* FP8: v.scale points here (or NULL) */
} lcase;

static bool is_fp8(int dt) { return dt == SDPA_DTYPE_FP8_E4M3 || dt == SDPA_DTYPE_FP8_E5M2; }

/* A random view: dense [B, H, S, E] or a pool [nb, H, bs, E] with a block table; random
 * element values (some Inf/NaN encodings); random strides, padded, sometimes reversed or with
 * a non-unit last axis. */
static void make_case(lcase *c, int dtype, int paged) {
    memset(c, 0, sizeof *c);
    c->dtype = dtype;
    c->paged = paged;
    c->B = rnd(1, 3), c->H = rnd(1, 3), c->E = dtype == SDPA_DTYPE_Q8_0 ? 32 * rnd(1, 2) : rnd(1, 40);
    const int64_t es = (int64_t)sdpa_dtype_size((sdpa_dtype)dtype);
    int64_t shape[4];
    if (paged) {
        c->bs = rnd(1, 9);
        const int64_t mb = rnd(1, 5);
        c->nb = c->B * mb + rnd(0, 3);
        c->S = mb * c->bs;
        shape[0] = c->nb, shape[1] = c->H, shape[2] = c->bs, shape[3] = c->E;
        for (int64_t i = 0; i < c->B * mb; ++i)
            c->table[i] = (int32_t)((i * 5 + 1) % c->nb);
        for (int64_t b = 0; b < c->B; ++b)
            c->kl[b] = rnd(0, c->S);
        c->v.block_table = c->table;
        c->v.block_table_stride = mb;
        c->v.block_size = c->bs;
        c->v.key_lengths = c->kl;
    } else {
        c->S = rnd(1, 30);
        shape[0] = c->B, shape[1] = c->H, shape[2] = c->S, shape[3] = c->E;
    }
    /* strides: innermost axis 1 (or 2..3: not contiguous), then padded products, any order */
    /* (q8_0: strides count blocks, the last axis contiguous blocks: include/sdpa.h) */
    const int64_t s3 = dtype != SDPA_DTYPE_Q8_0 && rnd(0, 3) == 0 ? rnd(2, 3) : 1;
    const int64_t row = (dtype == SDPA_DTYPE_Q8_0 ? shape[3] / 32 : shape[3]) * s3 + rnd(0, 3);
    int64_t st[4];
    st[3] = s3;
    if (rnd(0, 1)) { /* [.., H, S, E] */
        st[2] = row, st[1] = shape[2] * row + rnd(0, 2), st[0] = shape[1] * st[1];
    } else { /* [.., S, H, E] */
        st[1] = row, st[2] = shape[1] * row + rnd(0, 2), st[0] = shape[2] * st[2];
    }
    const int64_t n = shape[0] * st[0];
    c->mem = malloc((size_t)(n + 8) * (size_t)es);
    for (int64_t i = 0; i < n + 8; ++i) {
        unsigned char *at = c->mem + i * es;
        const int kind = (int)rnd(0, 40);
        if (dtype == SDPA_DTYPE_F32) {
            float x = kind == 0 ? INFINITY : kind == 1 ? NAN : (float)rnd(-1000, 1000) / 37.0f;
            memcpy(at, &x, 4);
        } else if (dtype == SDPA_DTYPE_Q8_0) { /* d (some Inf/NaN), then 32 int8 */
            uint16_t h = (uint16_t)rnd(0, 0xffff);
            if (kind > 1)
                h &= 0xbfff;
            memcpy(at, &h, 2);
            for (int j = 0; j < 32; ++j)
                at[2 + j] = (unsigned char)rnd(0, 255);
        } else if (is_fp8(dtype)) {
            at[0] = (unsigned char)rnd(0, 255);
            if (kind > 1) /* mostly finite */
                at[0] = dtype == SDPA_DTYPE_FP8_E5M2 ? (unsigned char)(at[0] & 0xbf) : at[0];
        } else {
            uint16_t h = (uint16_t)rnd(0, 0xffff);
            if (kind > 1) /* mostly finite: clear the top exponent bit */
                h &= dtype == SDPA_DTYPE_F16 ? 0xbfff : 0xbfff;
            memcpy(at, &h, 2);
        }
    }
    c->base = c->mem;
    int64_t axis2 = st[2];
    if (!paged && rnd(0, 2) == 0) { /* reversed axis 2: element [.., 0, ..] at the end */
        c->base = c->mem + (shape[2] - 1) * st[2] * es;
        axis2 = -st[2];
    }
    c->v.data = (float *)(void *)c->base;
    c->v.dtype = dtype;
    for (int d = 0; d < 4; ++d)
        c->v.shape[d] = shape[d];
    c->v.strides[0] = st[0], c->v.strides[1] = st[1], c->v.strides[2] = axis2, c->v.strides[3] = st[3];
    if (paged) { /* the plan's logical view: [B, H, S, E] over the pool */
        c->v.shape[0] = c->B;
        c->v.shape[2] = c->S;
    }
    if (is_fp8(dtype)) { /* none, one, per kv head (1 for one head: in place), or one that overflows */
        const int mode = (int)rnd(0, 3);
        c->scales[0] = mode == 3 ? 3e38f : 0.5f, c->scales[1] = 1.0f, c->scales[2] = 2.0f;
        c->v.scale = mode == 0 ? NULL : c->scales;
        c->v.scale_stride = mode == 2 ? 1 : 0;
    }
}

static float scale_of(const lcase *c, int64_t h) { return c->v.scale != NULL ? c->v.scale[h * c->v.scale_stride] : 1.0f; }

/* Element offset (in elements from base) of (b, h, r, e) by the scalar rules. */
static int64_t offset_of(const lcase *c, int64_t b, int64_t h, int64_t r, int64_t e) {
    const sdpa__view4 *v = &c->v;
    if (!c->paged)
        return b * v->strides[0] + h * v->strides[1] + r * v->strides[2] + e * v->strides[3];
    const int64_t blk = c->table[b * v->block_table_stride + r / c->bs];
    return blk * v->strides[0] + h * v->strides[1] + (r % c->bs) * v->strides[2] + e * v->strides[3];
}

static int row_readable(const lcase *c, int64_t b, int64_t r) { return !c->paged || r < c->kl[b]; }

/* The value of element (b, h, r, e) by the scalar rules (q8_0: the row's blocks, d * q; FP8:
 * times the kv head's scale). */
static float value_at(const lcase *c, int64_t b, int64_t h, int64_t r, int64_t e) {
    if (c->dtype == SDPA_DTYPE_Q8_0) {
        const unsigned char *blk = c->base + (offset_of(c, b, h, r, 0) + e / 32) * 34;
        uint16_t d;
        memcpy(&d, blk, 2);
        return (float)(int8_t)blk[2 + e % 32] * scalar_f16(d);
    }
    const float x = read_elem(c->base, c->dtype, offset_of(c, b, h, r, e));
    return is_fp8(c->dtype) ? x * scale_of(c, h) : x;
}

static void check_case(const lcase *c, const sdpa__ctx *ctx) {
    const sdpa__loader *ld = sdpa__loader_for(&c->v, c->paged ? SDPA__ADDR_PAGED : SDPA__ADDR_STRIDED);
    assert_non_null(ld);
    const int64_t E = c->E, es = (int64_t)sdpa_dtype_size((sdpa_dtype)c->dtype);
    float *tile = malloc((size_t)(c->S * E + 16) * sizeof(float));
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t h = 0; h < c->H; ++h) {
            const int64_t r0 = rnd(0, c->S - 1), r1 = rnd(r0 + 1, c->S);
            /* rows */
            const sdpa__rows rows = ld->rows(&c->v, b, h, r0, r1, tile);
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t e = 0; e < E; ++e) {
                    const float got = rows.data[(r - r0) * rows.stride + e];
                    const float want = row_readable(c, b, r) ? value_at(c, b, h, r, e) : 0.0f;
                    if (!same(got, want))
                        fail_msg("%s rows: (b=%lld,h=%lld,r=%lld,e=%lld) = %a, the bytes say %a", ld->name, (long long)b,
                                 (long long)h, (long long)r, (long long)e, (double)got, (double)want);
                }
            /* rows_bf16 */
            if (ld->rows_bf16 != NULL) {
                const sdpa__rows16 r16 = ld->rows_bf16(&c->v, b, h, r0, r1, (uint16_t *)(void *)tile);
                for (int64_t r = r0; r < r1; ++r)
                    for (int64_t e = 0; e < E; ++e) {
                        uint16_t want = 0;
                        if (row_readable(c, b, r))
                            memcpy(&want, c->base + offset_of(c, b, h, r, e) * 2, 2);
                        assert_int_equal(r16.data[(r - r0) * r16.stride + e], want);
                    }
            } else {
                assert_int_not_equal(c->dtype, SDPA_DTYPE_BF16);
            }
            /* rows_raw: in place, from r0, never past a block or the keys */
            const sdpa__raw_rows raw = ld->rows_raw(&c->v, b, h, r0, r1);
            if (c->v.strides[3] != 1 && E > 1) {
                assert_int_equal(raw.n, 0);
            } else if (raw.n > 0) {
                assert_true(raw.n <= r1 - r0);
                assert_ptr_equal(raw.data, c->base + offset_of(c, b, h, r0, 0) * es);
                assert_int_equal(raw.stride, c->v.strides[2]);
                if (c->paged) {
                    assert_true(r0 + raw.n <= c->kl[b]);
                    assert_true((r0 + raw.n - 1) / c->bs == r0 / c->bs);
                }
            } else {
                assert_true((c->paged && r0 >= c->kl[b]) || scale_of(c, h) != 1.0f);
            }
            if (is_fp8(c->dtype) && scale_of(c, h) != 1.0f) /* the micro-kernels read FP8 unscaled */
                assert_int_equal(raw.n, 0);
            /* row_finite */
            for (int64_t r = r0; r < r1; ++r) {
                int finite = 1;
                for (int64_t e = 0; e < E && row_readable(c, b, r); ++e)
                    finite &= isfinite(value_at(c, b, h, r, e)) != 0;
                assert_int_equal(ld->row_finite(ctx->mk, &c->v, b, h, r) ? 1 : 0, finite);
            }
        }
    free(tile);
}

static void run(int dtype, int paged) {
    sdpa__ctx ctx;
    sdpa__ctx_make_base(&ctx);
    for (int it = 0; it < 300; ++it) {
        lcase c;
        g_state = 0x10adull + (uint64_t)it * 977u + (uint64_t)(dtype * 2 + paged) * 100003u;
        make_case(&c, dtype, paged);
        c.v.cv = it % 2 == 0 ? ctx.cv : NULL; /* the process's table, or the portable fallback */
        check_case(&c, &ctx);
        free(c.mem);
    }
}

static void test_f32_strided(void **state) { (void)state; run(SDPA_DTYPE_F32, 0); }
static void test_f16_strided(void **state) { (void)state; run(SDPA_DTYPE_F16, 0); }
static void test_bf16_strided(void **state) { (void)state; run(SDPA_DTYPE_BF16, 0); }
static void test_f32_paged(void **state) { (void)state; run(SDPA_DTYPE_F32, 1); }
static void test_f16_paged(void **state) { (void)state; run(SDPA_DTYPE_F16, 1); }
static void test_bf16_paged(void **state) { (void)state; run(SDPA_DTYPE_BF16, 1); }
static void test_q8_0_strided(void **state) { (void)state; run(SDPA_DTYPE_Q8_0, 0); }
static void test_q8_0_paged(void **state) { (void)state; run(SDPA_DTYPE_Q8_0, 1); }
static void test_e4m3_strided(void **state) { (void)state; run(SDPA_DTYPE_FP8_E4M3, 0); }
static void test_e4m3_paged(void **state) { (void)state; run(SDPA_DTYPE_FP8_E4M3, 1); }
static void test_e5m2_strided(void **state) { (void)state; run(SDPA_DTYPE_FP8_E5M2, 0); }
static void test_e5m2_paged(void **state) { (void)state; run(SDPA_DTYPE_FP8_E5M2, 1); }

/* The table: every dtype x addressing has a loader, none for an unknown dtype or addressing. */
static void test_table(void **state) {
    (void)state;
    sdpa__view4 v;
    memset(&v, 0, sizeof v);
    for (int dt = 0; dt <= SDPA_DTYPE_FP8_E5M2; ++dt)
        for (int a = 0; a < SDPA__ADDR_COUNT; ++a) {
            v.dtype = dt;
            assert_non_null(sdpa__loader_for(&v, (sdpa__addressing)a));
        }
    v.dtype = SDPA_DTYPE_FP8_E5M2 + 1;
    assert_null(sdpa__loader_for(&v, SDPA__ADDR_STRIDED));
    v.dtype = 0;
    assert_null(sdpa__loader_for(&v, SDPA__ADDR_COUNT));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_f32_strided), cmocka_unit_test(test_f16_strided), cmocka_unit_test(test_bf16_strided),
        cmocka_unit_test(test_f32_paged),   cmocka_unit_test(test_f16_paged),   cmocka_unit_test(test_bf16_paged),
        cmocka_unit_test(test_q8_0_strided), cmocka_unit_test(test_q8_0_paged), cmocka_unit_test(test_e4m3_strided),
        cmocka_unit_test(test_e4m3_paged),   cmocka_unit_test(test_e5m2_strided), cmocka_unit_test(test_e5m2_paged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
