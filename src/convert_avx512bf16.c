/* The AVX-512 conversion table with bf16 narrowing by AVX512-BF16's VCVTNEPS2BF16. Built with
 * -mavx512bf16 (and -mavx512f/bw/vl) into its own static library; used only where the CPU
 * reports AVX512-BF16 (sdpa__convert_exact).
 *
 * VCVTNEPS2BF16 rounds to nearest even and quiets NaNs exactly as convert.h specifies, but it
 * reads float32 denormal inputs as zero (the rounding of, say, 0x00400000 to bf16 is 0x0040, not
 * 0): lanes holding a denormal are redone with the integer rounding, so results equal the
 * portable table bit for bit (tests/test_convert.c). */
#include "convert.h"

#include <immintrin.h>

static void narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    for (int64_t t = 0; t < n; t += 16) {
        const int64_t r = n - t;
        const __mmask16 k = (__mmask16)(r >= 16 ? 0xFFFFu : ((1u << r) - 1u));
        const __m512 x = _mm512_maskz_loadu_ps(k, src + t);
        __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
        const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
        /* denormal: 0 < |x| < 2^-126 (as integers: 0 < a < 0x00800000) */
        const __mmask16 den = _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(a, a), a, _mm512_set1_epi32(0x00800000));
        if (den != 0) {
            const __m512i u = _mm512_castps_si512(x);
            const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            const __m512i fix = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
            h = _mm256_mask_blend_epi16(den, h, _mm512_cvtepi32_epi16(fix));
        }
        if (stride == 1) {
            _mm256_mask_storeu_epi16(dst + t, k, h);
        } else {
            uint16_t tmp[16];
            _mm256_storeu_si256((__m256i *)tmp, h);
            for (int j = 0; j < 16 && j < r; ++j)
                dst[(t + j) * stride] = tmp[j];
        }
    }
}

const sdpa__convert sdpa__convert_avx512bf16 = {
    "avx512-bf16",
    sdpa__avx512_widen_f16,
    sdpa__avx512_widen_bf16,
    sdpa__avx512_narrow_f16,
    narrow_bf16,
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
