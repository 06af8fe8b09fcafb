/* Portable (exact, scalar C) conversions of the storage dtypes, and the choice of the table by
 * ISA level. See convert.h for the semantics every table shares. */
#include "convert.h"
#include "cpu.h"
#include "sdpa.h"

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

const sdpa__convert sdpa__convert_portable = {
    "portable", widen_f16, widen_bf16, narrow_f16, narrow_bf16, finite_f16, finite_bf16,
};

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
