/* AVX-512F helpers shared by the micro-kernel files built for AVX-512 (microkernel_avx512.c,
 * microkernel_amx.c): include only from a file compiled with -mavx512f, after defining AI.
 *
 * exp16 is the AVX2 file's algorithm (same clamp, Cody-Waite split, degree-7 Taylor polynomial,
 * 2^n built in the exponent field so that inputs <= -87.7, -inf included, give exactly 0, and
 * exp16(0) is exactly 1). */
#ifndef SDPA_SIMD_AVX512_H
#define SDPA_SIMD_AVX512_H

#include <float.h>
#include <immintrin.h>

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

#endif
