/* AVX2 + F16C helpers shared by the files built for AVX2 (microkernel_avx2.c, convert_avx2.c)
 * and by the 256-bit code of microkernel_avx512vnni.c: include only from a file compiled with
 * -mavx2 -mf16c, after defining AI. */
#ifndef SDPA_SIMD_AVX2_H
#define SDPA_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* 0.6, the 8-bit K/V dtypes: 8 E4M3FN (e4m3 != 0) or E5M2 bytes widened exactly, as convert.h's
 * scalar definitions: E5M2 is a binary16's top byte (VCVTPH2PS); E4M3 moved into a binary16
 * (exponent bias 15 instead of 7, so times 2^8 after VCVTPH2PS: exact), its NaN (s.1111.111) the
 * quiet NaN with the sign. The one AVX2 definition: the loaders' conversions and the decode rows
 * kernels both use it. */
AI __m256 fp8x8_to_f32(int e4m3, __m128i b8) {
    const __m128i x = _mm_cvtepu8_epi16(b8);
    if (!e4m3)
        return _mm256_cvtph_ps(_mm_slli_epi16(x, 8));
    const __m128i mag = _mm_and_si128(x, _mm_set1_epi16(0x7F)), sgn = _mm_and_si128(x, _mm_set1_epi16(0x80));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(sgn, 8), _mm_slli_epi16(mag, 7));
    const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256i nan32 = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F)));
    const __m256i qn = _mm256_or_si256(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sgn), 24), _mm256_set1_epi32(0x7FC00000));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(qn), _mm256_castsi256_ps(nan32));
}

/* A q8_0 block's d (binary16, its first 2 bytes) in every lane: VCVTPH2PS widens it exactly, as
 * convert.h's sdpa__q8_0_d does. */
AI __m256 q8_0_d8(const void *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

#endif
