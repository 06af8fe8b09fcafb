/* AVX-512 (F + BW + VL) conversions of the storage dtypes. Built with -mavx512f -mavx512bw
 * -mavx512vl (and -mavx2 -mfma -mf16c) into its own static library; used only where
 * sdpa__cpu_has_isa(SDPA__ISA_AVX512) holds. Same results, bit for bit, as the portable table
 * (convert.h). Tails are masked loads/stores (a masked-off element is never touched).
 * bf16 narrowing here is integer arithmetic (add 0x7FFF + lsb: nearest even, exact for every
 * input including denormals); convert_avx512bf16.c has the VCVTNEPS2BF16 variant. */
#include "convert.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))
#include "simd_avx512.h"

AI __mmask16 tail16(int64_t r) { return (__mmask16)(r >= 16 ? 0xFFFFu : ((1u << r) - 1u)); }

AI __m256i load16(const uint16_t *src, ptrdiff_t stride, __mmask16 k) {
    if (stride == 1)
        return _mm256_maskz_loadu_epi16(k, src);
    uint16_t tmp[16];
    for (int j = 0; j < 16; ++j)
        tmp[j] = ((k >> j) & 1u) ? src[j * stride] : 0;
    return _mm256_loadu_si256((const __m256i *)tmp);
}

AI void store16(uint16_t *dst, ptrdiff_t stride, __mmask16 k, __m256i h) {
    if (stride == 1) {
        _mm256_mask_storeu_epi16(dst, k, h);
        return;
    }
    uint16_t tmp[16];
    _mm256_storeu_si256((__m256i *)tmp, h);
    for (int j = 0; j < 16; ++j)
        if ((k >> j) & 1u)
            dst[j * stride] = tmp[j];
}

AI __m512 bf16x16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

void sdpa__avx512_widen_f16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 32 <= n; t += 32) {
            _mm512_storeu_ps(dst + t, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + t))));
            _mm512_storeu_ps(dst + t + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + t + 16))));
        }
    for (; t < n; t += 16) {
        const __mmask16 k = tail16(n - t);
        _mm512_mask_storeu_ps(dst + t, k, _mm512_cvtph_ps(load16(src + t * stride, stride, k)));
    }
}

void sdpa__avx512_widen_bf16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 32 <= n; t += 32) {
            _mm512_storeu_ps(dst + t, bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(src + t))));
            _mm512_storeu_ps(dst + t + 16, bf16x16_to_f32(_mm256_loadu_si256((const __m256i *)(src + t + 16))));
        }
    for (; t < n; t += 16) {
        const __mmask16 k = tail16(n - t);
        _mm512_mask_storeu_ps(dst + t, k, bf16x16_to_f32(load16(src + t * stride, stride, k)));
    }
}

void sdpa__avx512_narrow_f16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 16 <= n; t += 16)
            _mm256_storeu_si256((__m256i *)(dst + t),
                                _mm512_cvtps_ph(_mm512_loadu_ps(src + t), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; t < n; t += 16) {
        const __mmask16 k = tail16(n - t);
        const __m512 x = _mm512_maskz_loadu_ps(k, src + t);
        store16(dst + t * stride, stride, k, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

/* 16 f32 (as integers) -> 16 bf16 as 32-bit lanes, nearest even, NaN quiet. */
AI __m512i bf16_round(__m512i u) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

void sdpa__avx512_narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 16 <= n; t += 16)
            _mm256_storeu_si256((__m256i *)(dst + t),
                                _mm512_cvtepi32_epi16(bf16_round(_mm512_castps_si512(_mm512_loadu_ps(src + t)))));
    for (; t < n; t += 16) {
        const __mmask16 k = tail16(n - t);
        const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(k, src + t));
        store16(dst + t * stride, stride, k, _mm512_cvtepi32_epi16(bf16_round(u)));
    }
}

AI bool finite16(const uint16_t *x, ptrdiff_t stride, int64_t n, uint16_t mask) {
    int64_t t = 0;
    unsigned bad = 0;
    if (stride == 1) {
        const __m512i m = _mm512_set1_epi16((short)mask);
        __mmask32 acc = 0;
        for (; t + 32 <= n; t += 32) {
            const __m512i v = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + t)), m);
            acc |= _mm512_cmpeq_epi16_mask(v, m);
        }
        if (t < n) {
            const __mmask32 k = (__mmask32)((1ull << (n - t)) - 1u);
            const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi16(k, x + t), m);
            acc |= _mm512_mask_cmpeq_epi16_mask(k, v, m);
            t = n;
        }
        bad = acc != 0;
    }
    for (; t < n; ++t)
        bad |= (x[t * stride] & mask) == mask;
    return bad == 0;
}

bool sdpa__avx512_finite_f16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite16(x, stride, n, 0x7C00u); }
bool sdpa__avx512_finite_bf16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite16(x, stride, n, 0x7F80u); }

/* ---- 0.6: the 8-bit K/V dtypes (read side) ----
 * fp8x16_to_f32 and q8_0_d16 (simd_avx512.h, shared with the decode rows kernels), then times
 * the scale. Strided sources and tails go through the portable members. */
AI void widen_fp8(int e4m3, const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    int64_t t = 0;
    if (stride == 1) {
        const __m512 sc = _mm512_set1_ps(scale);
        for (; t + 16 <= n; t += 16)
            _mm512_storeu_ps(dst + t, _mm512_mul_ps(fp8x16_to_f32(e4m3, _mm_loadu_si128((const __m128i *)(src + t))), sc));
    }
    (e4m3 ? sdpa__portable_widen_e4m3 : sdpa__portable_widen_e5m2)(src + t * stride, stride, n - t, dst + t, scale);
}

void sdpa__avx512_widen_e4m3(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    widen_fp8(1, src, stride, n, dst, scale);
}

void sdpa__avx512_widen_e5m2(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    widen_fp8(0, src, stride, n, dst, scale);
}

/* Each block: 32 int8 widened to float32, times its d (one multiply, as dequantize_row_q8_0). */
void sdpa__avx512_widen_q8_0(const void *src, int64_t nblocks, float *dst) {
    const char *blk = (const char *)src;
    for (int64_t i = 0; i < nblocks; ++i, blk += SDPA__Q8_0_BYTES, dst += SDPA__Q8_0_QK) {
        const __m512 d = q8_0_d16(blk);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
        _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d));
        _mm512_storeu_ps(dst + 16,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d));
    }
}

const sdpa__convert sdpa__convert_avx512 = {
    "avx512",
    sdpa__avx512_widen_f16,
    sdpa__avx512_widen_bf16,
    sdpa__avx512_narrow_f16,
    sdpa__avx512_narrow_bf16,
    sdpa__avx512_finite_f16,
    sdpa__avx512_finite_bf16,
    /* 0.6: the 8-bit widening of this ISA; the finite scans are the portable ones */
    .finite_e4m3 = sdpa__portable_finite_e4m3,
    .finite_e5m2 = sdpa__portable_finite_e5m2,
    .finite_q8_0 = sdpa__portable_finite_q8_0,
    .widen_e4m3 = sdpa__avx512_widen_e4m3,
    .widen_e5m2 = sdpa__avx512_widen_e5m2,
    .widen_q8_0 = sdpa__avx512_widen_q8_0,
    SDPA__CONVERT_8BIT_NARROW_PORTABLE, /* 0.6: the 8-bit write side (portable, exact) */
};
