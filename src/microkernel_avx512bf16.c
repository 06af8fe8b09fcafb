/* AVX512-BF16 micro-kernel primitives (VDPBF16PS: 16 lanes, each adding two exact bf16 products
 * to an f32 accumulator). Built with -mavx512bf16 into its own static library; call only where
 * the CPU reports AVX512-BF16. Tails are masked loads that read zeros, so nothing beyond a row's
 * ne (or nev) elements is touched. See microkernel_bf16.h. */
#include "microkernel_bf16.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

AI __mmask32 tail32(int64_t r) { return r >= 32 ? 0xFFFFFFFFu : (__mmask32)((1ull << r) - 1u); }

AI __m512bh ld(const uint16_t *x, __mmask32 k) { return (__m512bh)_mm512_maskz_loadu_epi16(k, x); }

void sdpa__bf16_dot_rows_avx512bf16(const uint16_t *q, int64_t ne, const uint16_t *k, ptrdiff_t ks, int64_t n,
                                    float *s) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const uint16_t *k0 = k + t * ks;
        for (int64_t e = 0; e < ne; e += 32) {
            const __mmask32 m = tail32(ne - e);
            const __m512bh qv = ld(q + e, m);
            a0 = _mm512_dpbf16_ps(a0, qv, ld(k0 + e, m));
            a1 = _mm512_dpbf16_ps(a1, qv, ld(k0 + ks + e, m));
            a2 = _mm512_dpbf16_ps(a2, qv, ld(k0 + 2 * ks + e, m));
            a3 = _mm512_dpbf16_ps(a3, qv, ld(k0 + 3 * ks + e, m));
        }
        s[t] = _mm512_reduce_add_ps(a0);
        s[t + 1] = _mm512_reduce_add_ps(a1);
        s[t + 2] = _mm512_reduce_add_ps(a2);
        s[t + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; t < n; ++t) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t e = 0; e < ne; e += 32) {
            const __mmask32 m = tail32(ne - e);
            a = _mm512_dpbf16_ps(a, ld(q + e, m), ld(k + t * ks + e, m));
        }
        s[t] = _mm512_reduce_add_ps(a);
    }
}

void sdpa__bf16_axpy_rows_avx512bf16(float *o, int64_t nev, float alpha, const uint16_t *p, int64_t cnt,
                                     const uint16_t *v, ptrdiff_t vs) {
    /* VDPBF16PS pairs adjacent bf16 elements: interleave rows t and t+1 of V (unpacklo/hi on
     * 16-bit elements, within 128-bit lanes), multiply by the broadcast pair (p[t], p[t+1]).
     * Lane j of the "lo" accumulator then holds column 8 * (j / 4) + j % 4, of "hi" the same
     * plus 4; two permutes restore column order. */
    const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i idx1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t d = 0; d < nev; d += 32) {
        const __mmask32 m = tail32(nev - d);
        __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
        int64_t t = 0;
        for (; t + 2 <= cnt; t += 2) {
            const __m512i r0 = _mm512_maskz_loadu_epi16(m, v + t * vs + d);
            const __m512i r1 = _mm512_maskz_loadu_epi16(m, v + (t + 1) * vs + d);
            const __m512bh pp = (__m512bh)_mm512_set1_epi32((int)((uint32_t)p[t] | ((uint32_t)p[t + 1] << 16)));
            lo = _mm512_dpbf16_ps(lo, (__m512bh)_mm512_unpacklo_epi16(r0, r1), pp);
            hi = _mm512_dpbf16_ps(hi, (__m512bh)_mm512_unpackhi_epi16(r0, r1), pp);
        }
        if (t < cnt) { /* odd count: pair the last row with a zero row and a zero probability */
            const __m512i r0 = _mm512_maskz_loadu_epi16(m, v + t * vs + d);
            const __m512i z = _mm512_setzero_si512();
            const __m512bh pp = (__m512bh)_mm512_set1_epi32((int)(uint32_t)p[t]);
            lo = _mm512_dpbf16_ps(lo, (__m512bh)_mm512_unpacklo_epi16(r0, z), pp);
            hi = _mm512_dpbf16_ps(hi, (__m512bh)_mm512_unpackhi_epi16(r0, z), pp);
        }
        const __m512 c0 = _mm512_permutex2var_ps(lo, idx0, hi), c1 = _mm512_permutex2var_ps(lo, idx1, hi);
        const __mmask16 m0 = (__mmask16)(m & 0xFFFFu), m1 = (__mmask16)(m >> 16);
        const __m512 av = _mm512_set1_ps(alpha);
        const __m512 o0 = _mm512_maskz_loadu_ps(m0, o + d), o1 = _mm512_maskz_loadu_ps(m1, o + d + 16);
        _mm512_mask_storeu_ps(o + d, m0, _mm512_fmadd_ps(av, o0, c0));
        _mm512_mask_storeu_ps(o + d + 16, m1, _mm512_fmadd_ps(av, o1, c1));
    }
}

void sdpa__bf16_lanes_scores_avx512bf16(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w, const uint16_t *k,
                                        ptrdiff_t ks, int64_t nk, float scale, float *st, int64_t ld) {
    const int64_t np = (ne + 1) / 2;
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t t = 0; t < nk; ++t) {
        const uint16_t *kr = k + t * ks;
        float *out = st + t * ld;
        int64_t l0 = 0;
        for (; l0 + 64 <= w; l0 += 64) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t pi = 0; pi < np; ++pi) {
                const uint32_t hi = 2 * pi + 1 < ne ? (uint32_t)kr[2 * pi + 1] : 0u;
                const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)((uint32_t)kr[2 * pi] | (hi << 16)));
                const uint32_t *q = qp + pi * ldq + l0;
                a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(q), kb);
                a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(q + 16), kb);
                a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(q + 32), kb);
                a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(q + 48), kb);
            }
            _mm512_storeu_ps(out + l0, _mm512_mul_ps(a0, sc));
            _mm512_storeu_ps(out + l0 + 16, _mm512_mul_ps(a1, sc));
            _mm512_storeu_ps(out + l0 + 32, _mm512_mul_ps(a2, sc));
            _mm512_storeu_ps(out + l0 + 48, _mm512_mul_ps(a3, sc));
        }
        for (; l0 < w; l0 += 16) {
            __m512 a = _mm512_setzero_ps();
            for (int64_t pi = 0; pi < np; ++pi) {
                const uint32_t hi = 2 * pi + 1 < ne ? (uint32_t)kr[2 * pi + 1] : 0u;
                const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)((uint32_t)kr[2 * pi] | (hi << 16)));
                a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(qp + pi * ldq + l0), kb);
            }
            _mm512_storeu_ps(out + l0, _mm512_mul_ps(a, sc));
        }
    }
}
