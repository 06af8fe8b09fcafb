/* Portable (exact, scalar C) conversions of the storage dtypes, and the choice of the table by
 * ISA level. See convert.h for the semantics every table shares. */
#include "convert.h"
#include "cpu.h"
#include "sdpa.h"

#include <math.h>

static void widen_f16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    for (int64_t t = 0; t < n; ++t)
        dst[t] = sdpa__f16_to_f32(src[t * stride]);
}

static void widen_bf16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    if (stride == 1) {
        for (int64_t t = 0; t < n; ++t)
            dst[t] = sdpa__bf16_to_f32(src[t]);
        return;
    }
    for (int64_t t = 0; t < n; ++t)
        dst[t] = sdpa__bf16_to_f32(src[t * stride]);
}

static void narrow_f16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    for (int64_t t = 0; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_f16(src[t]);
}

static void narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    for (int64_t t = 0; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_bf16(src[t]);
}

/* OR of the exponent-field test over the elements: no early exit, so the time does not depend
 * on where a non-finite value sits (and the loop vectorises). */
static bool finite_f16(const uint16_t *x, ptrdiff_t stride, int64_t n) {
    unsigned bad = 0;
    if (stride == 1) {
        for (int64_t t = 0; t < n; ++t)
            bad |= (x[t] & 0x7C00u) == 0x7C00u;
        return bad == 0;
    }
    for (int64_t t = 0; t < n; ++t)
        bad |= (x[t * stride] & 0x7C00u) == 0x7C00u;
    return bad == 0;
}

static bool finite_bf16(const uint16_t *x, ptrdiff_t stride, int64_t n) {
    unsigned bad = 0;
    if (stride == 1) {
        for (int64_t t = 0; t < n; ++t)
            bad |= (x[t] & 0x7F80u) == 0x7F80u;
        return bad == 0;
    }
    for (int64_t t = 0; t < n; ++t)
        bad |= (x[t * stride] & 0x7F80u) == 0x7F80u;
    return bad == 0;
}

/* ---- 0.6: the 8-bit K/V dtypes (convert.h) ---- */

void sdpa__portable_widen_e4m3(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    for (int64_t t = 0; t < n; ++t)
        dst[t] = sdpa__e4m3_to_f32(src[t * stride]) * scale;
}

void sdpa__portable_widen_e5m2(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    for (int64_t t = 0; t < n; ++t)
        dst[t] = sdpa__e5m2_to_f32(src[t * stride]) * scale;
}

void sdpa__portable_widen_q8_0(const void *src, int64_t nblocks, float *dst) {
    const unsigned char *blk = (const unsigned char *)src;
    for (int64_t i = 0; i < nblocks; ++i, blk += SDPA__Q8_0_BYTES) {
        const float d = sdpa__q8_0_d(blk);
        const int8_t *qs = (const int8_t *)(const void *)(blk + 2);
        for (int j = 0; j < SDPA__Q8_0_QK; ++j)
            dst[i * SDPA__Q8_0_QK + j] = (float)qs[j] * d;
    }
}

/* No early exit (as the 16-bit scans). A value is finite iff its float32 is (the scale may
 * overflow a finite encoding). */
static bool finite_fp8(float (*widen1)(uint8_t), const uint8_t *x, ptrdiff_t stride, int64_t n, float scale) {
    unsigned bad = 0;
    for (int64_t t = 0; t < n; ++t)
        bad |= (sdpa__f32_bits(widen1(x[t * stride]) * scale) & 0x7F800000u) == 0x7F800000u;
    return bad == 0;
}

bool sdpa__portable_finite_e4m3(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale) {
    return finite_fp8(sdpa__e4m3_to_f32, x, stride, n, scale);
}

bool sdpa__portable_finite_e5m2(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale) {
    return finite_fp8(sdpa__e5m2_to_f32, x, stride, n, scale);
}

/* A q8_0 block's values are finite iff its d is (|d * q| <= 65504 * 128). */
bool sdpa__portable_finite_q8_0(const void *x, int64_t nblocks) {
    const unsigned char *blk = (const unsigned char *)x;
    unsigned bad = 0;
    for (int64_t i = 0; i < nblocks; ++i, blk += SDPA__Q8_0_BYTES) {
        uint16_t h;
        memcpy(&h, blk, sizeof h);
        bad |= (h & 0x7C00u) == 0x7C00u;
    }
    return bad == 0;
}

/* ---- 0.6: the 8-bit write side (convert.h: the rules) ---- */

void sdpa__portable_narrow_e4m3(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale) {
    for (int64_t t = 0; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_e4m3(src[t] / scale);
}

void sdpa__portable_narrow_e5m2(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale) {
    for (int64_t t = 0; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_e5m2(src[t] / scale);
}

void sdpa__q8_0_quantize_block(const float *x, void *blk) {
    unsigned char *b = (unsigned char *)blk;
    int8_t *qs = (int8_t *)(void *)(b + 2);
    float amax = 0.0f;
    bool nan = false;
    for (int j = 0; j < SDPA__Q8_0_QK; ++j) {
        const float ax = fabsf(x[j]);
        nan |= ax != ax;
        amax = amax > ax ? amax : ax; /* ggml's MAX(amax, fabsf(v)) */
    }
    uint16_t dh;
    if (nan) {
        dh = 0x7E00u;
        memset(qs, 0, SDPA__Q8_0_QK);
    } else {
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dh = sdpa__f32_to_f16(d);
        for (int j = 0; j < SDPA__Q8_0_QK; ++j) {
            const float v = x[j] * id;
            qs[j] = v != v ? (int8_t)0 : v >= 127.0f ? (int8_t)127 : v <= -127.0f ? (int8_t)-127 : (int8_t)roundf(v);
        }
    }
    memcpy(b, &dh, sizeof dh);
}

void sdpa__portable_narrow_q8_0(const float *src, int64_t nblocks, void *dst) {
    unsigned char *blk = (unsigned char *)dst;
    for (int64_t i = 0; i < nblocks; ++i)
        sdpa__q8_0_quantize_block(src + i * SDPA__Q8_0_QK, blk + i * SDPA__Q8_0_BYTES);
}

const sdpa__convert sdpa__convert_portable = {
    "portable", widen_f16, widen_bf16, narrow_f16, narrow_bf16, finite_f16, finite_bf16,
    SDPA__CONVERT_8BIT_PORTABLE,
    SDPA__CONVERT_8BIT_NARROW_PORTABLE,
};

static size_t unit_bytes(int dtype) {
    return dtype == SDPA_DTYPE_F32 ? 4 : dtype == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_BYTES : dtype >= SDPA_DTYPE_FP8_E4M3 ? 1 : 2;
}

void sdpa__widen_rows_scaled(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs,
                             int64_t rows, int64_t cols, float *dst, int64_t ld, float scale) {
    if (dtype == SDPA_DTYPE_F32 || dtype == SDPA_DTYPE_F16 || dtype == SDPA_DTYPE_BF16) {
        sdpa__widen_rows(cv, dtype, src, rs, cs, rows, cols, dst, ld);
        return;
    }
    const ptrdiff_t rb = rs * (ptrdiff_t)unit_bytes(dtype);
    for (int64_t r = 0; r < rows; ++r) {
        const unsigned char *x = (const unsigned char *)src + r * rb;
        float *d = dst + r * ld;
        if (dtype == SDPA_DTYPE_Q8_0)
            cv->widen_q8_0(x, cols / SDPA__Q8_0_QK, d);
        else
            (dtype == SDPA_DTYPE_FP8_E4M3 ? cv->widen_e4m3 : cv->widen_e5m2)(x, cs, cols, d, scale);
    }
}

bool sdpa__finite_rows_scaled(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs,
                              int64_t rows, int64_t cols, float scale) {
    if (dtype == SDPA_DTYPE_F16 || dtype == SDPA_DTYPE_BF16)
        return sdpa__finite_rows(cv, dtype, src, rs, cs, rows, cols);
    if (dtype != SDPA_DTYPE_Q8_0 && dtype != SDPA_DTYPE_FP8_E4M3 && dtype != SDPA_DTYPE_FP8_E5M2)
        return false;
    const ptrdiff_t rb = rs * (ptrdiff_t)unit_bytes(dtype);
    bool ok = true;
    for (int64_t r = 0; r < rows; ++r) {
        const unsigned char *x = (const unsigned char *)src + r * rb;
        if (dtype == SDPA_DTYPE_Q8_0)
            ok &= cv->finite_q8_0(x, cols / SDPA__Q8_0_QK);
        else
            ok &= (dtype == SDPA_DTYPE_FP8_E4M3 ? cv->finite_e4m3 : cv->finite_e5m2)(x, cs, cols, scale);
    }
    return ok;
}

void sdpa__widen_rows(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs, int64_t rows,
                      int64_t cols, float *dst, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) {
        float *d = dst + r * ld;
        if (dtype == SDPA_DTYPE_F32) {
            const float *x = (const float *)src + r * rs;
            if (cs == 1)
                memcpy(d, x, (size_t)cols * sizeof(float));
            else
                for (int64_t c = 0; c < cols; ++c)
                    d[c] = x[c * cs];
        } else {
            const uint16_t *x = (const uint16_t *)src + r * rs;
            (dtype == SDPA_DTYPE_F16 ? cv->widen_f16 : cv->widen_bf16)(x, cs, cols, d);
        }
    }
}

void sdpa__narrow_rows(const sdpa__convert *cv, int dtype, const float *src, int64_t ld, int64_t rows, int64_t cols,
                       void *dst, ptrdiff_t rs, ptrdiff_t cs) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *x = src + r * ld;
        if (dtype == SDPA_DTYPE_F32) {
            float *d = (float *)dst + r * rs;
            if (cs == 1)
                memcpy(d, x, (size_t)cols * sizeof(float));
            else
                for (int64_t c = 0; c < cols; ++c)
                    d[c * cs] = x[c];
        } else {
            uint16_t *d = (uint16_t *)dst + r * rs;
            (dtype == SDPA_DTYPE_F16 ? cv->narrow_f16 : cv->narrow_bf16)(x, cols, d, cs);
        }
    }
}

void sdpa__narrow_rows_scaled(const sdpa__convert *cv, int dtype, const float *src, int64_t ld, int64_t rows,
                              int64_t cols, void *dst, ptrdiff_t rs, ptrdiff_t cs, float scale) {
    if (dtype == SDPA_DTYPE_F32 || dtype == SDPA_DTYPE_F16 || dtype == SDPA_DTYPE_BF16) {
        sdpa__narrow_rows(cv, dtype, src, ld, rows, cols, dst, rs, cs);
        return;
    }
    const ptrdiff_t rb = rs * (ptrdiff_t)unit_bytes(dtype);
    for (int64_t r = 0; r < rows; ++r) {
        unsigned char *d = (unsigned char *)dst + r * rb;
        const float *x = src + r * ld;
        if (dtype == SDPA_DTYPE_Q8_0)
            cv->narrow_q8_0(x, cols / SDPA__Q8_0_QK, d);
        else
            (dtype == SDPA_DTYPE_FP8_E4M3 ? cv->narrow_e4m3 : cv->narrow_e5m2)(x, cols, d, cs, scale);
    }
}

bool sdpa__finite_rows(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs, int64_t rows,
                       int64_t cols) {
    if (dtype != SDPA_DTYPE_F16 && dtype != SDPA_DTYPE_BF16)
        return false;
    bool (*f)(const uint16_t *, ptrdiff_t, int64_t) = dtype == SDPA_DTYPE_F16 ? cv->finite_f16 : cv->finite_bf16;
    bool ok = true;
    for (int64_t r = 0; r < rows; ++r)
        ok &= f((const uint16_t *)src + r * rs, cs, cols);
    return ok;
}
