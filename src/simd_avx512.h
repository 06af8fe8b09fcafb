/* AVX-512 helpers shared by the files built for AVX-512 (microkernel_avx512.c, microkernel_amx.c,
 * convert_avx512.c; all compiled with -mavx512f -mavx512bw -mavx512vl -mf16c): include only from
 * such a file, after defining AI.
 *
 * exp16 is the AVX2 file's algorithm (same clamp, Cody-Waite split, degree-7 Taylor polynomial,
 * 2^n built in the exponent field so that inputs <= -87.7, -inf included, give exactly 0, and
 * exp16(0) is exactly 1). */
#ifndef SDPA_SIMD_AVX512_H
#define SDPA_SIMD_AVX512_H

#include <float.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

AI __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* Lanes where x is NaN or +-Inf. */
AI __mmask16 not_finite16(__m512 x) {
    return _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ);
}

/* 0.6, the 8-bit K/V dtypes: 16 E4M3FN (e4m3 != 0) or E5M2 bytes widened exactly, as convert.h's
 * scalar definitions: E5M2 is a binary16's top byte (VCVTPH2PS); E4M3 moved into a binary16
 * (exponent bias 15 instead of 7, so times 2^8 after VCVTPH2PS: exact), its NaN (s.1111.111)
 * the quiet NaN with the sign. The one AVX-512 definition: the loaders' conversions and the
 * decode rows kernels both use it. */
AI __m512 fp8x16_to_f32(int e4m3, __m128i b16) {
    const __m256i x = _mm256_cvtepu8_epi16(b16);
    if (!e4m3)
        return _mm512_cvtph_ps(_mm256_slli_epi16(x, 8));
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7F)), sgn = _mm256_and_si256(x, _mm256_set1_epi16(0x80));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(sgn, 8), _mm256_slli_epi16(mag, 7));
    const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
    const __m512i qn = _mm512_or_si512(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sgn), 24), _mm512_set1_epi32(0x7FC00000));
    return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(qn));
}

/* A q8_0 block's d (binary16, its first 2 bytes) in every lane: VCVTPH2PS widens it exactly, as
 * convert.h's sdpa__q8_0_d does, in 2 instructions where the scalar integer conversion took
 * about 20. */
AI __m512 q8_0_d16(const void *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
}

#endif
