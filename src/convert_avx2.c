/* AVX2 + F16C conversions of the storage dtypes. Built with -mavx2 -mfma -mf16c into its own
 * static library; used only where sdpa__cpu_has_isa(SDPA__ISA_AVX2) holds. Same results, bit
 * for bit, as the portable table (convert.h); tails use the scalar helpers.
 *
 * f16: VCVTPH2PS / VCVTPS2PH with the rounding in the immediate (nearest even), so MXCSR's
 * rounding mode does not matter; f32 denormals (the only inputs MXCSR.DAZ could change) are far
 * below f16's smallest subnormal and round to +-0 either way.
 * bf16: integer shifts; narrowing adds 0x7FFF + lsb to round to nearest even. */
#include "convert.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))
#include "simd_avx2.h"

/* 16 bf16 or f16 -> as 32-bit integers in lanes: widen 8 uint16 to 8 uint32. */
AI __m256 bf16x8_to_f32(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

/* 8 f32 -> 8 bf16 in the low 128 bits (nearest even; NaN quiet). */
AI __m128i f32x8_to_bf16(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* 8 x u32 (<= 0xFFFF) -> 8 x u16: pack within 128-bit halves, then gather the halves. */
    const __m256i p = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

AI __m128i f32x8_to_f16(__m256 x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

AI __m128i load8_strided(const uint16_t *src, ptrdiff_t stride) {
    uint16_t tmp[8];
    for (int k = 0; k < 8; ++k)
        tmp[k] = src[k * stride];
    return _mm_loadu_si128((const __m128i *)tmp);
}

static void widen_f16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1) {
        for (; t + 16 <= n; t += 16) {
            _mm256_storeu_ps(dst + t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + t))));
            _mm256_storeu_ps(dst + t + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + t + 8))));
        }
        for (; t + 8 <= n; t += 8)
            _mm256_storeu_ps(dst + t, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + t))));
    } else {
        for (; t + 8 <= n; t += 8)
            _mm256_storeu_ps(dst + t, _mm256_cvtph_ps(load8_strided(src + t * stride, stride)));
    }
    for (; t < n; ++t)
        dst[t] = sdpa__f16_to_f32(src[t * stride]);
}

static void widen_bf16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1) {
        for (; t + 8 <= n; t += 8)
            _mm256_storeu_ps(dst + t, bf16x8_to_f32(_mm_loadu_si128((const __m128i *)(src + t))));
    } else {
        for (; t + 8 <= n; t += 8)
            _mm256_storeu_ps(dst + t, bf16x8_to_f32(load8_strided(src + t * stride, stride)));
    }
    for (; t < n; ++t)
        dst[t] = sdpa__bf16_to_f32(src[t * stride]);
}

AI void store8(uint16_t *dst, ptrdiff_t stride, __m128i h) {
    if (stride == 1) {
        _mm_storeu_si128((__m128i *)dst, h);
        return;
    }
    uint16_t tmp[8];
    _mm_storeu_si128((__m128i *)tmp, h);
    for (int k = 0; k < 8; ++k)
        dst[k * stride] = tmp[k];
}

static void narrow_f16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        store8(dst + t * stride, stride, f32x8_to_f16(_mm256_loadu_ps(src + t)));
    for (; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_f16(src[t]);
}

static void narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        store8(dst + t * stride, stride, f32x8_to_bf16(_mm256_loadu_ps(src + t)));
    for (; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_bf16(src[t]);
}

/* Any lane whose exponent field (mask) is all ones. */
AI bool finite16(const uint16_t *x, ptrdiff_t stride, int64_t n, uint16_t mask) {
    int64_t t = 0;
    unsigned bad = 0;
    if (stride == 1) {
        const __m256i m = _mm256_set1_epi16((short)mask);
        __m256i acc = _mm256_setzero_si256();
        for (; t + 16 <= n; t += 16) {
            const __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + t)), m);
            acc = _mm256_or_si256(acc, _mm256_cmpeq_epi16(v, m));
        }
        bad = !_mm256_testz_si256(acc, acc);
    }
    for (; t < n; ++t)
        bad |= (x[t * stride] & mask) == mask;
    return bad == 0;
}

static bool finite_f16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite16(x, stride, n, 0x7C00u); }
static bool finite_bf16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite16(x, stride, n, 0x7F80u); }

/* ---- 0.6: the 8-bit K/V dtypes (read side): fp8x8_to_f32 and q8_0_d8 (simd_avx2.h, shared
 * with the decode rows kernels), then times the scale ---- */
AI void widen_fp8(int e4m3, const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    int64_t t = 0;
    if (stride == 1) {
        const __m256 sc = _mm256_set1_ps(scale);
        for (; t + 8 <= n; t += 8)
            _mm256_storeu_ps(dst + t,
                             _mm256_mul_ps(fp8x8_to_f32(e4m3, _mm_loadl_epi64((const __m128i *)(const void *)(src + t))), sc));
    }
    (e4m3 ? sdpa__portable_widen_e4m3 : sdpa__portable_widen_e5m2)(src + t * stride, stride, n - t, dst + t, scale);
}

static void widen_e4m3(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    widen_fp8(1, src, stride, n, dst, scale);
}

static void widen_e5m2(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale) {
    widen_fp8(0, src, stride, n, dst, scale);
}

static void widen_q8_0(const void *src, int64_t nblocks, float *dst) {
    const char *blk = (const char *)src;
    for (int64_t i = 0; i < nblocks; ++i, blk += SDPA__Q8_0_BYTES, dst += SDPA__Q8_0_QK) {
        const __m256 d = q8_0_d8(blk);
        for (int j = 0; j < 4; ++j) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * j));
            _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

const sdpa__convert sdpa__convert_avx2 = {
    "avx2-f16c", widen_f16, widen_bf16, narrow_f16, narrow_bf16, finite_f16, finite_bf16,
    /* 0.6: the 8-bit widening of this ISA; the finite scans are the portable ones */
    .finite_e4m3 = sdpa__portable_finite_e4m3,
    .finite_e5m2 = sdpa__portable_finite_e5m2,
    .finite_q8_0 = sdpa__portable_finite_q8_0,
    .widen_e4m3 = widen_e4m3,
    .widen_e5m2 = widen_e5m2,
    .widen_q8_0 = widen_q8_0,
    SDPA__CONVERT_8BIT_NARROW_PORTABLE, /* 0.6: the 8-bit write side (portable, exact) */
};
