/* AVX512-BF16 micro-kernel primitives (VDPBF16PS: 16 lanes, each adding two exact bf16 products
 * to an f32 accumulator). Built with -mavx512bf16 into its own static library; call only where
 * the CPU reports AVX512-BF16. Tails are masked loads that read zeros, so nothing beyond a row's
 * ne (or nev) elements is touched. See microkernel_bf16.h. */
#include "microkernel_bf16.h"

#include <immintrin.h>
#include <stdbool.h>

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

/* ------------------------------------------------ lanes tiles (tiled kernel) */

/* 32 bits (a bf16 pair) at x, any alignment. */
AI int ld32(const uint16_t *x) {
    uint32_t u;
    __builtin_memcpy(&u, x, sizeof u);
    return (int)u;
}

/* mr rows x (16 nv) lanes, mr <= 8, nv <= 2: 16 accumulators, as the float32 lanes_gemm.
 * c[r * ld + l] = sum_{k < kp} pair(a + r * ars + k * aks) . b[k * ldb + l], where a pair is
 * the two bf16 at that address; with odd, one more step whose pair holds a's single bf16
 * (a + r * ars + kp * aks) in its low half and 0 above (the element after it is never read).
 * Then times *scale (scores) or, with beta, added to beta[l] * c (P.V), else stored. Per
 * element the steps run in k order whatever mr, nv or the lane offset, so a result does not
 * depend on the blocking. */
AI void pg_tile(int mr, int nv, int64_t kp, bool odd, const uint16_t *a, ptrdiff_t ars, ptrdiff_t aks,
                const uint32_t *b, int64_t ldb, float *c, int64_t ld, const float *beta, const float *scale) {
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kp; ++k) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + k * ldb);
        const __m512bh b1 = nv > 1 ? (__m512bh)_mm512_loadu_si512(b + k * ldb + 16) : b0;
        const uint16_t *ak = a + k * aks;
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
            if (r < mr) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32(ld32(ak + r * ars));
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
                if (nv > 1)
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
            }
        }
    }
    if (odd) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kp * ldb);
        const __m512bh b1 = nv > 1 ? (__m512bh)_mm512_loadu_si512(b + kp * ldb + 16) : b0;
        const uint16_t *ak = a + kp * aks;
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
            if (r < mr) {
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)(uint32_t)ak[r * ars]);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
                if (nv > 1)
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
        if (r < mr) {
            float *cr = c + r * ld;
#pragma GCC unroll 2
            for (int v = 0; v < 2; ++v) {
                if (v < nv) {
                    __m512 x = acc[r][v];
                    if (scale != NULL)
                        x = _mm512_mul_ps(x, _mm512_set1_ps(*scale));
                    else if (beta != NULL)
                        x = _mm512_fmadd_ps(_mm512_loadu_ps(beta + 16 * v), _mm512_loadu_ps(cr + 16 * v), x);
                    _mm512_storeu_ps(cr + 16 * v, x);
                }
            }
        }
    }
}

typedef void (*pg_fn)(int64_t, bool, const uint16_t *, ptrdiff_t, ptrdiff_t, const uint32_t *, int64_t, float *,
                      int64_t, const float *, const float *);

#define PG(MR, NV)                                                                                              \
    static void pg_##MR##_##NV(int64_t kp, bool odd, const uint16_t *a, ptrdiff_t ars, ptrdiff_t aks,          \
                               const uint32_t *b, int64_t ldb, float *c, int64_t ld, const float *beta,        \
                               const float *scale) {                                                           \
        pg_tile(MR, NV, kp, odd, a, ars, aks, b, ldb, c, ld, beta, scale);                                     \
    }
PG(1, 1)
PG(2, 1)
PG(3, 1)
PG(4, 1)
PG(5, 1)
PG(6, 1)
PG(7, 1)
PG(8, 1)
PG(1, 2)
PG(2, 2)
PG(3, 2)
PG(4, 2)
PG(5, 2)
PG(6, 2)
PG(7, 2)
PG(8, 2)

/* m rows of c over w lanes (a multiple of 16), 8 rows x 32 lanes per block. */
/* With pf > 0, the rows of a at pf elements ahead (the next key tile's, for scores) are
 * prefetched, pfb bytes of each, spread over the row blocks of the first lane block. A prefetch
 * never faults, so the rows need not exist. */
static void pairs_gemm(int64_t m, int64_t kp, bool odd, const uint16_t *a, ptrdiff_t ars, ptrdiff_t aks,
                       const uint32_t *b, int64_t ldb, float *c, int64_t ld, const float *beta, const float *scale,
                       int64_t w, ptrdiff_t pf, int64_t pfb) {
    static const pg_fn one[9] = {NULL, pg_1_1, pg_2_1, pg_3_1, pg_4_1, pg_5_1, pg_6_1, pg_7_1, pg_8_1};
    static const pg_fn two[9] = {NULL, pg_1_2, pg_2_2, pg_3_2, pg_4_2, pg_5_2, pg_6_2, pg_7_2, pg_8_2};
    for (int64_t l0 = 0; l0 < w;) {
        const int wide = w - l0 >= 32;
        const pg_fn *fns = wide ? two : one;
        const float *gl = beta != NULL ? beta + l0 : NULL;
        int64_t r = 0;
        for (; r + 8 <= m; r += 8) {
            if (pf != 0 && l0 == 0)
                for (int u = 0; u < 8; ++u)
                    for (int64_t by = 0; by < pfb; by += 64)
                        _mm_prefetch((const char *)(a + (r + u) * ars + pf) + by, _MM_HINT_T0);
            fns[8](kp, odd, a + r * ars, ars, aks, b + l0, ldb, c + r * ld + l0, ld, gl, scale);
        }
        if (r < m)
            fns[m - r](kp, odd, a + r * ars, ars, aks, b + l0, ldb, c + r * ld + l0, ld, gl, scale);
        l0 += wide ? 32 : 16;
    }
}

void sdpa__bf16_lanes_scores_pairs_avx512bf16(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w,
                                              const uint16_t *k, ptrdiff_t ks, int64_t nk, float scale, float *st,
                                              int64_t ld) {
    /* the next tile's key rows (contiguous keys of a strided view follow these) */
    pairs_gemm(nk, ne / 2, (ne & 1) != 0, k, ks, 2, qp, ldq, st, ld, NULL, &scale, w, nk * ks, 2 * ne);
}

void sdpa__bf16_lanes_pv_avx512bf16(int64_t nev, int64_t tp0, int64_t np, const uint32_t *vp, const uint32_t *pp,
                                    int64_t ldp, float *o, const float *beta, int64_t w, int64_t ld) {
    vp += tp0 * nev;
    if (np == 0) { /* no key: o = beta * o (or 0) */
        for (int64_t d = 0; d < nev; ++d)
            for (int64_t l = 0; l < w; l += 16) {
                const __m512 x = beta != NULL ? _mm512_mul_ps(_mm512_loadu_ps(beta + l), _mm512_loadu_ps(o + d * ld + l))
                                              : _mm512_setzero_ps();
                _mm512_storeu_ps(o + d * ld + l, x);
            }
        return;
    }
    pairs_gemm(nev, np, false, (const uint16_t *)(const void *)vp, 2, 2 * nev, pp, ldp, o, ld, beta, NULL, w, 0, 0);
}

/* bf16 of x rounded to nearest even (VCVTNEPS2BF16: f32 subnormals read as 0), in the low
 * 16 bits of each 32-bit lane. */
AI __m512i rne16(__m512 x) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)); }

void sdpa__bf16_pack_p_avx512bf16(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp) {
    for (int64_t tp = 0; 2 * tp < n; ++tp) {
        const float *r0 = st + 2 * tp * ld;
        const bool two = 2 * tp + 1 < n;
        for (int64_t l = 0; l < w; l += 16) {
            const __m512i lo = rne16(_mm512_loadu_ps(r0 + l));
            const __m512i hi = two ? _mm512_slli_epi32(rne16(_mm512_loadu_ps(r0 + ld + l)), 16) : _mm512_setzero_si512();
            _mm512_storeu_si512(pp + tp * ldp + l, _mm512_or_si512(lo, hi));
        }
    }
}

void sdpa__bf16_pack_v_avx512bf16(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev,
                                  uint32_t *vp) {
    /* 32 columns per step: unpacklo/hi on 16-bit elements interleave the two rows within
     * 128-bit lanes (columns 0-3, 8-11, ... and 4-7, 12-15, ...); two permutes restore order. */
    const __m512i idx0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i idx1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t tp = 0; 2 * tp < n; ++tp) {
        const int64_t j0 = idx != NULL ? idx[2 * tp] : 2 * tp;
        const bool two = 2 * tp + 1 < n;
        const uint16_t *r0 = v + j0 * vs;
        const uint16_t *r1 = two ? v + (idx != NULL ? idx[2 * tp + 1] : 2 * tp + 1) * vs : r0;
        uint32_t *dst = vp + tp * nev;
        /* the next tile's rows (a prefetch never faults) */
        for (int64_t by = 0; by < 2 * nev; by += 64) {
            _mm_prefetch((const char *)(r0 + 64 * vs) + by, _MM_HINT_T0);
            _mm_prefetch((const char *)(r1 + 64 * vs) + by, _MM_HINT_T0);
        }
        for (int64_t d = 0; d < nev; d += 32) {
            const __mmask32 m = tail32(nev - d);
            const __m512i a0 = _mm512_maskz_loadu_epi16(m, r0 + d);
            const __m512i a1 = two ? _mm512_maskz_loadu_epi16(m, r1 + d) : _mm512_setzero_si512();
            const __m512i lo = _mm512_unpacklo_epi16(a0, a1), hi = _mm512_unpackhi_epi16(a0, a1);
            _mm512_mask_storeu_epi32(dst + d, (__mmask16)(m & 0xFFFFu), _mm512_permutex2var_epi32(lo, idx0, hi));
            _mm512_mask_storeu_epi32(dst + d + 16, (__mmask16)(m >> 16), _mm512_permutex2var_epi32(lo, idx1, hi));
        }
    }
}
