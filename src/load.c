/* Loaders (load.h): storage (dtype x addressing) -> float32 rows for the kernels. */
#include "load.h"
#include "microkernel.h"
#include "convert.h"

#include <string.h>

static const float *f32_row(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    return (const float *)v->data + b * v->strides[0] + h * v->strides[1] + r * v->strides[2];
}

static sdpa__rows f32_strided_rows(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, float *tile) {
    const int64_t n = v->shape[3], s3 = v->strides[3];
    sdpa__rows out;
    if (s3 == 1 || n <= 1) { /* in place: no copy */
        out.data = f32_row(v, b, h, r0);
        out.stride = (ptrdiff_t)v->strides[2];
        return out;
    }
    for (int64_t r = r0; r < r1; ++r) {
        const float *src = f32_row(v, b, h, r);
        float *dst = tile + (r - r0) * n;
        for (int64_t e = 0; e < n; ++e)
            dst[e] = src[e * s3];
    }
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static bool f32_strided_row_finite(const sdpa__mk *mk, const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    return sdpa__finite_strided(mk, f32_row(v, b, h, r), v->shape[3], v->strides[3]);
}

/* Any dtype: in place when the last axis is contiguous. */
static sdpa__raw_rows strided_rows_raw(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1) {
    sdpa__raw_rows out = {NULL, 0, 0, true};
    if (v->strides[3] != 1 && v->shape[3] > 1)
        return out;
    const int64_t off = b * v->strides[0] + h * v->strides[1] + r0 * v->strides[2];
    out.data = (const unsigned char *)v->data + off * (int64_t)sdpa_dtype_size((sdpa_dtype)v->dtype);
    out.stride = (ptrdiff_t)v->strides[2];
    out.n = r1 - r0;
    return out;
}

static const sdpa__loader g_f32_strided = {"f32-strided", f32_strided_rows, f32_strided_row_finite, NULL,
                                           strided_rows_raw};

/* f16 and bf16 (2-byte encodings): always widened into the tile, exactly, through the plan's
 * conversion table (convert.h; the same bits on every ISA). */
static const uint16_t *u16_row(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    return (const uint16_t *)(const void *)v->data + b * v->strides[0] + h * v->strides[1] + r * v->strides[2];
}

static const sdpa__convert *table_of(const sdpa__view4 *v) { return v->cv != NULL ? v->cv : &sdpa__convert_portable; }

static sdpa__rows u16_strided_rows(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, float *tile) {
    const int64_t n = v->shape[3];
    sdpa__widen_rows(table_of(v), v->dtype, u16_row(v, b, h, r0), (ptrdiff_t)v->strides[2], (ptrdiff_t)v->strides[3],
                     r1 - r0, n, tile, n);
    sdpa__rows out;
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static bool u16_strided_row_finite(const sdpa__mk *mk, const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    (void)mk;
    return sdpa__finite_rows(table_of(v), v->dtype, u16_row(v, b, h, r), 0, (ptrdiff_t)v->strides[3], 1, v->shape[3]);
}

/* n 16-bit elements of a row at element stride s3, into a contiguous row. */
static void u16_gather(uint16_t *dst, const uint16_t *src, int64_t n, int64_t s3) {
    for (int64_t e = 0; e < n; ++e)
        dst[e] = src[e * s3];
}

static sdpa__rows16 bf16_strided_rows_bf16(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1,
                                           uint16_t *tile) {
    const int64_t n = v->shape[3], s3 = v->strides[3], s2 = v->strides[2];
    sdpa__rows16 out;
    if ((s3 == 1 || n <= 1) && (s2 >= n || r1 - r0 <= 1)) { /* in place */
        out.data = u16_row(v, b, h, r0);
        out.stride = (ptrdiff_t)(r1 - r0 <= 1 ? n : s2);
        return out;
    }
    for (int64_t r = r0; r < r1; ++r)
        u16_gather(tile + (r - r0) * n, u16_row(v, b, h, r), n, s3);
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static const sdpa__loader g_f16_strided = {"f16-strided", u16_strided_rows, u16_strided_row_finite, NULL,
                                           strided_rows_raw};
static const sdpa__loader g_bf16_strided = {"bf16-strided", u16_strided_rows, u16_strided_row_finite,
                                            bf16_strided_rows_bf16, strided_rows_raw};

/* ---- 0.6: the 8-bit K/V dtypes (q8_0, FP8 E4M3 / E5M2), strided ----
 * Rows are widened (dequantized) exactly into the tile through the plan's conversion table
 * (convert.h: q8_0 d * q, FP8 value * the kv head's scale); in place (rows_raw) for the decode
 * kernel's stored-K/V micro-kernels, except FP8 rows whose scale is not 1 (those micro-kernels
 * widen without a scale: the decode kernel then reads the loader's f32 rows). A q8_0 view's
 * strides count blocks (include/sdpa.h), so a row's address is the same expression with the
 * block size (sdpa_dtype_size) as the unit. */

static const unsigned char *byte_row(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    const int64_t off = b * v->strides[0] + h * v->strides[1] + r * v->strides[2];
    return (const unsigned char *)v->data + off * (int64_t)sdpa_dtype_size((sdpa_dtype)v->dtype);
}

/* The scale of kv head h (1: none; FP8 only, internal.h sdpa__view4). */
static float scale_of(const sdpa__view4 *v, int64_t h) { return v->scale != NULL ? v->scale[h * v->scale_stride] : 1.0f; }

static sdpa__rows kv8_strided_rows(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, float *tile) {
    const int64_t n = v->shape[3];
    sdpa__widen_rows_scaled(table_of(v), v->dtype, byte_row(v, b, h, r0), (ptrdiff_t)v->strides[2],
                            (ptrdiff_t)v->strides[3], r1 - r0, n, tile, n, scale_of(v, h));
    sdpa__rows out;
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static bool kv8_strided_row_finite(const sdpa__mk *mk, const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    (void)mk;
    return sdpa__finite_rows_scaled(table_of(v), v->dtype, byte_row(v, b, h, r), 0, (ptrdiff_t)v->strides[3], 1,
                                    v->shape[3], scale_of(v, h));
}

static sdpa__raw_rows kv8_strided_rows_raw(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1) {
    if (scale_of(v, h) != 1.0f) {
        const sdpa__raw_rows none = {NULL, 0, 0, true};
        return none;
    }
    return strided_rows_raw(v, b, h, r0, r1);
}

static const sdpa__loader g_q8_0_strided = {"q8_0-strided", kv8_strided_rows, kv8_strided_row_finite, NULL,
                                            kv8_strided_rows_raw};
static const sdpa__loader g_e4m3_strided = {"fp8_e4m3-strided", kv8_strided_rows, kv8_strided_row_finite, NULL,
                                            kv8_strided_rows_raw};
static const sdpa__loader g_e5m2_strided = {"fp8_e5m2-strided", kv8_strided_rows, kv8_strided_row_finite, NULL,
                                            kv8_strided_rows_raw};

/* ---- paged addressing (0.5): one loader for every dtype ----
 * Rows are gathered block by block: each run of consecutive rows inside one block is a
 * strided [rows, n] piece of the pool, widened by sdpa__widen_rows (the per-dtype conversion
 * of convert.h; for f32 a strided copy). Rows j >= key_lengths[b] are never read: their tile
 * rows are zeros (the rules never let a query attend them). An f32 range inside one block with
 * unit inner stride is handed out in place. */

static const unsigned char *paged_row(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    const int64_t blk = v->block_table[b * v->block_table_stride + r / v->block_size];
    const int64_t off = blk * v->strides[0] + h * v->strides[1] + (r % v->block_size) * v->strides[2];
    return (const unsigned char *)v->data + off * (int64_t)sdpa_dtype_size((sdpa_dtype)v->dtype);
}

static sdpa__rows paged_rows(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, float *tile) {
    const int64_t n = v->shape[3], bs = v->block_size, len = v->key_lengths[b];
    sdpa__rows out;
    if (v->dtype == SDPA_DTYPE_F32 && (v->strides[3] == 1 || n <= 1) && r1 <= len && r0 / bs == (r1 - 1) / bs) {
        out.data = (const float *)(const void *)paged_row(v, b, h, r0);
        out.stride = (ptrdiff_t)v->strides[2];
        return out;
    }
    const sdpa__convert *cv = table_of(v);
    const float sc = scale_of(v, h); /* FP8 (0.6); 1 and unused for the others */
    const int64_t valid = r1 < len ? r1 : len;
    int64_t r = r0;
    while (r < valid) {
        int64_t e = (r / bs + 1) * bs; /* end of r's block */
        if (e > valid)
            e = valid;
        sdpa__widen_rows_scaled(cv, v->dtype, paged_row(v, b, h, r), (ptrdiff_t)v->strides[2],
                                (ptrdiff_t)v->strides[3], e - r, n, tile + (r - r0) * n, n, sc);
        r = e;
    }
    if (r < r1)
        memset(tile + (r - r0) * n, 0, (size_t)((r1 - r) * n) * sizeof(float));
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static bool paged_row_finite(const sdpa__mk *mk, const sdpa__view4 *v, int64_t b, int64_t h, int64_t r) {
    if (r >= v->key_lengths[b])
        return true; /* never read */
    const void *src = paged_row(v, b, h, r);
    if (v->dtype == SDPA_DTYPE_F32)
        return sdpa__finite_strided(mk, (const float *)src, v->shape[3], v->strides[3]);
    return sdpa__finite_rows_scaled(table_of(v), v->dtype, src, 0, (ptrdiff_t)v->strides[3], 1, v->shape[3],
                                    scale_of(v, h));
}

/* Rows from r0 to the end of its block (and of the keys) in place: one block's slots are a
 * strided run of the pool. */
static sdpa__raw_rows paged_rows_raw(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1) {
    sdpa__raw_rows out = {NULL, 0, 0, false};
    const int64_t bs = v->block_size, len = v->key_lengths[b];
    if ((v->strides[3] != 1 && v->shape[3] > 1) || r0 >= len || scale_of(v, h) != 1.0f)
        return out;
    int64_t e = (r0 / bs + 1) * bs;
    e = e < r1 ? e : r1;
    e = e < len ? e : len;
    out.data = paged_row(v, b, h, r0);
    out.stride = (ptrdiff_t)v->strides[2];
    out.n = e - r0;
    return out;
}

/* bf16 rows as stored, for the bf16 dot-product kernels (SDPA_PRECISION_REDUCED: AVX512-BF16,
 * AMX), as bf16_strided_rows_bf16: in place when [r0, r1) lies inside one block and inside the
 * keys with a contiguous last axis (and rows at a stride >= n), else gathered block by block into
 * the tile; rows past key_lengths[b] are zeros there and never read (as in paged_rows). */
static sdpa__rows16 paged_rows_bf16(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1,
                                    uint16_t *tile) {
    const int64_t n = v->shape[3], bs = v->block_size, len = v->key_lengths[b];
    const int64_t s2 = v->strides[2], s3 = v->strides[3];
    sdpa__rows16 out;
    if (r0 < r1 && (s3 == 1 || n <= 1) && r1 <= len && r0 / bs == (r1 - 1) / bs && (s2 >= n || r1 - r0 <= 1)) {
        out.data = (const uint16_t *)(const void *)paged_row(v, b, h, r0);
        out.stride = (ptrdiff_t)(r1 - r0 <= 1 ? n : s2);
        return out;
    }
    for (int64_t r = r0; r < r1; ++r) {
        uint16_t *dst = tile + (r - r0) * n;
        if (r >= len) {
            memset(dst, 0, (size_t)n * sizeof(uint16_t));
            continue;
        }
        u16_gather(dst, (const uint16_t *)(const void *)paged_row(v, b, h, r), n, s3);
    }
    out.data = tile;
    out.stride = (ptrdiff_t)n;
    return out;
}

static const sdpa__loader g_f32_paged = {"f32-paged", paged_rows, paged_row_finite, NULL, paged_rows_raw};
static const sdpa__loader g_f16_paged = {"f16-paged", paged_rows, paged_row_finite, NULL, paged_rows_raw};
static const sdpa__loader g_bf16_paged = {"bf16-paged", paged_rows, paged_row_finite, paged_rows_bf16,
                                          paged_rows_raw};

static const sdpa__loader g_q8_0_paged = {"q8_0-paged", paged_rows, paged_row_finite, NULL, paged_rows_raw};
static const sdpa__loader g_e4m3_paged = {"fp8_e4m3-paged", paged_rows, paged_row_finite, NULL, paged_rows_raw};
static const sdpa__loader g_e5m2_paged = {"fp8_e5m2-paged", paged_rows, paged_row_finite, NULL, paged_rows_raw};

#define NDTYPES (SDPA_DTYPE_FP8_E5M2 + 1)
/* [addressing][sdpa_dtype]; NULL = not supported (rejected by validation before a plan). */
static const sdpa__loader *const g_loaders[SDPA__ADDR_COUNT][NDTYPES] = {
    [SDPA__ADDR_STRIDED] = {[SDPA_DTYPE_F32] = &g_f32_strided, [SDPA_DTYPE_F16] = &g_f16_strided,
                            [SDPA_DTYPE_BF16] = &g_bf16_strided, [SDPA_DTYPE_Q8_0] = &g_q8_0_strided,
                            [SDPA_DTYPE_FP8_E4M3] = &g_e4m3_strided, [SDPA_DTYPE_FP8_E5M2] = &g_e5m2_strided},
    [SDPA__ADDR_PAGED] = {[SDPA_DTYPE_F32] = &g_f32_paged, [SDPA_DTYPE_F16] = &g_f16_paged,
                          [SDPA_DTYPE_BF16] = &g_bf16_paged, [SDPA_DTYPE_Q8_0] = &g_q8_0_paged,
                          [SDPA_DTYPE_FP8_E4M3] = &g_e4m3_paged, [SDPA_DTYPE_FP8_E5M2] = &g_e5m2_paged},
};

const sdpa__loader *sdpa__loader_for(const sdpa__view4 *v, sdpa__addressing addressing) {
    if ((int)addressing < 0 || addressing >= SDPA__ADDR_COUNT || v->dtype < 0 || v->dtype >= NDTYPES)
        return NULL;
    return g_loaders[addressing][v->dtype];
}
