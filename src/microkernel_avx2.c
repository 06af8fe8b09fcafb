/* AVX2 + FMA micro-kernels. Built with -mavx2 -mfma into its own static library; called only
 * through a call context (context.c) whose table dispatch.c chose after seeing both features
 * at run time.
 *
 * exp: x clamped to [-88, 88], x = n ln2 + r (Cody-Waite split of ln2, |r| <= ln2/2), e^r by
 * its Taylor polynomial of degree 7 (truncation error < 6e-9 relative), times 2^n built in the
 * exponent field. Inputs <= -87.7 (n = -127) give exactly 0, so -inf (a blocked score) gives 0.
 * tanh: odd Taylor polynomial to x^11 for |x| < 0.3, (1 - e)/(1 + e) with e = exp(-2|x|)
 * above; NaN stays NaN. Both are within a few float32 ulp. */
#include "microkernel.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#include "simd_avx2.h"

AI __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f)); /* NaN becomes -88: NaN lanes are caught as bad elsewhere */
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AI __m256 tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 ax = _mm256_andnot_ps(sign, x);
    const __m256 e = exp8(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 z = _mm256_mul_ps(ax, ax);
    __m256 s = _mm256_set1_ps(-1382.0f / 155925.0f);
    s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(62.0f / 2835.0f));
    s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(-17.0f / 315.0f));
    s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(2.0f / 15.0f));
    s = _mm256_fmadd_ps(s, z, _mm256_set1_ps(-1.0f / 3.0f));
    s = _mm256_fmadd_ps(_mm256_mul_ps(s, z), ax, ax);
    __m256 t = _mm256_blendv_ps(big, s, _mm256_cmp_ps(ax, _mm256_set1_ps(0.3f), _CMP_LT_OQ));
    t = _mm256_or_ps(t, _mm256_and_ps(sign, x));
    return _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Lanes where x is NaN or +-Inf: all bits set. */
AI __m256 not_finite8(__m256 x) {
    return _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ);
}

/* Mask of the first n (0..8) lanes. */
AI __m256i head_mask(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), idx);
}

/* ---------------------------------------------------------------- lanes */

/* mr rows x 16 lanes, mr <= 6: 12 accumulators, two B vectors, one broadcast. */
AI void lg_tile(int mr, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b, int64_t ld,
                float *c, const float *beta) {
    __m256 c0[6], c1[6];
#pragma GCC unroll 6
    for (int r = 0; r < 6; ++r)
        c0[r] = c1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kk; ++k) {
        const __m256 b0 = _mm256_loadu_ps(b + k * ld), b1 = _mm256_loadu_ps(b + k * ld + 8);
        const float *ak = a + k * aks;
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                const __m256 x = _mm256_broadcast_ss(ak + r * ars);
                c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
                c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
            }
        }
    }
    if (beta != NULL) {
        const __m256 g0 = _mm256_loadu_ps(beta), g1 = _mm256_loadu_ps(beta + 8);
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                float *cr = c + r * ld;
                _mm256_storeu_ps(cr, _mm256_fmadd_ps(g0, _mm256_loadu_ps(cr), c0[r]));
                _mm256_storeu_ps(cr + 8, _mm256_fmadd_ps(g1, _mm256_loadu_ps(cr + 8), c1[r]));
            }
        }
    } else {
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                _mm256_storeu_ps(c + r * ld, c0[r]);
                _mm256_storeu_ps(c + r * ld + 8, c1[r]);
            }
        }
    }
}

#define LG(MR)                                                                                                   \
    static void lg_##MR(int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b, int64_t ld,   \
                        float *c, const float *beta) {                                                           \
        lg_tile(MR, kk, a, ars, aks, b, ld, c, beta);                                                            \
    }
LG(1)
LG(2)
LG(3)
LG(4)
LG(5)
LG(6)

static void x_lanes_gemm(int64_t m, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
                         float *c, const float *beta, int64_t nl, int64_t ld) {
    typedef void (*tile_fn)(int64_t, const float *, ptrdiff_t, ptrdiff_t, const float *, int64_t, float *,
                            const float *);
    static const tile_fn tails[6] = {NULL, lg_1, lg_2, lg_3, lg_4, lg_5};
    for (int64_t l0 = 0; l0 < nl; l0 += SDPA__LANES) {
        const float *bl = b + l0, *gl = beta != NULL ? beta + l0 : NULL;
        int64_t r = 0;
        for (; r + 6 <= m; r += 6)
            lg_6(kk, a + r * ars, ars, aks, bl, ld, c + r * ld + l0, gl);
        if (r < m)
            tails[m - r](kk, a + r * ars, ars, aks, bl, ld, c + r * ld + l0, gl);
    }
}

void sdpa__avx2_softcap(float *x, int64_t n, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    int64_t t = 0;
    /* + (v - v): NaN where v is not finite, +0 otherwise. */
    for (; t + 8 <= n; t += 8) {
        const __m256 v = _mm256_loadu_ps(x + t);
        _mm256_storeu_ps(x + t, _mm256_add_ps(_mm256_mul_ps(c, tanh8(v)), _mm256_sub_ps(v, v)));
    }
    if (t < n) {
        const __m256i mk = head_mask(n - t);
        const __m256 v = _mm256_maskload_ps(x + t, mk);
        _mm256_maskstore_ps(x + t, mk, _mm256_add_ps(_mm256_mul_ps(c, tanh8(v)), _mm256_sub_ps(v, v)));
    }
}

static void x_lanes_range_mask(float *t, int64_t n, int64_t nl, int64_t ld, int32_t j0, const int32_t *lo,
                               const int32_t *hi, int32_t *bad) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t l = 0; l < nl; l += 8) {
        const __m256i lom1 = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(lo + l)), _mm256_set1_epi32(1));
        const __m256i hiv = _mm256_loadu_si256((const __m256i *)(hi + l));
        __m256 bv = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(bad + l)));
        for (int64_t j = 0; j < n; ++j) {
            const __m256i key = _mm256_set1_epi32(j0 + (int32_t)j);
            const __m256 ok = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_cmpgt_epi32(key, lom1), _mm256_cmpgt_epi32(hiv, key)));
            float *row = t + j * ld + l;
            const __m256 x = _mm256_loadu_ps(row);
            bv = _mm256_or_ps(bv, _mm256_and_ps(ok, not_finite8(x)));
            _mm256_storeu_ps(row, _mm256_blendv_ps(ninf, x, ok));
        }
        _mm256_storeu_si256((__m256i *)(bad + l), _mm256_castps_si256(bv));
    }
}

static void x_lanes_softmax(float *t, int64_t n, int64_t nl, int64_t ld, float *m, float *alpha, float *tsum,
                            int32_t *bad) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t l = 0; l < nl; l += 8) {
        __m256 mx = ninf, bv = _mm256_setzero_ps();
        if (bad != NULL) {
            for (int64_t j = 0; j < n; ++j) {
                const __m256 x = _mm256_loadu_ps(t + j * ld + l);
                mx = _mm256_max_ps(mx, x);
                bv = _mm256_or_ps(bv, not_finite8(x));
            }
            const __m256 old = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(bad + l)));
            _mm256_storeu_si256((__m256i *)(bad + l), _mm256_castps_si256(_mm256_or_ps(old, bv)));
        } else {
            for (int64_t j = 0; j < n; ++j)
                mx = _mm256_max_ps(mx, _mm256_loadu_ps(t + j * ld + l));
        }
        const __m256 mo = _mm256_loadu_ps(m + l);
        const __m256 mn = _mm256_max_ps(mx, mo);
        const __m256 u = _mm256_andnot_ps(_mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ), mn); /* -inf -> 0 */
        _mm256_storeu_ps(alpha + l, exp8(_mm256_sub_ps(mo, u)));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
            float *row = t + j * ld + l;
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row), u));
            _mm256_storeu_ps(row, e);
            sum = _mm256_add_ps(sum, e);
        }
        _mm256_storeu_ps(tsum + l, sum);
        _mm256_storeu_ps(m + l, mn);
    }
}

/* ----------------------------------------------------------------- rows */

AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The rows kernels read K/V rows as stored (float32, or f16 / bf16 encodings widened exactly in
 * the register: vcvtph2ps, or zero-extend and shift left by 16); DT is the row's sdpa_dtype (a
 * constant in each instantiation), strides in elements. */
AI ptrdiff_t esize(const int DT) { return DT == SDPA_DTYPE_F32 ? 4 : 2; }
/* 0.6: bytes of the stride unit (q8_0: a block of 32) and row off of a base, in that unit. */
AI ptrdiff_t unit(const int DT) {
    return DT == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_BYTES : DT >= SDPA_DTYPE_FP8_E4M3 ? 1 : esize(DT);
}
AI const void *rowp(const int DT, const void *base, ptrdiff_t off) { return (const char *)base + off * unit(DT); }
/* 8 E4M3FN / E5M2 bytes widened exactly (simd_avx2.h). */
AI __m256 fp8x8(const int DT, __m128i b8) { return fp8x8_to_f32(DT == SDPA_DTYPE_FP8_E4M3, b8); }
/* Elements [e, e + 8) of a row as stored, widened (q8_0: one block's d * q; e a multiple of 8). */
AI __m256 ld8(const int DT, const void *row, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0) {
        const char *blk = (const char *)row + (e >> 5) * SDPA__Q8_0_BYTES;
        const __m128i q = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + (e & 31)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), q8_0_d8(blk));
    }
    if (DT == SDPA_DTYPE_FP8_E4M3 || DT == SDPA_DTYPE_FP8_E5M2)
        return fp8x8(DT, _mm_loadl_epi64((const __m128i *)(const void *)((const char *)row + e)));
    const void *p = (const char *)row + e * esize(DT);
    if (DT == SDPA_DTYPE_F32)
        return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (DT == SDPA_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
/* Element e of a row as stored, widened (the same values as ld8). */
AI float ld1(const int DT, const void *row, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0) {
        const char *blk = (const char *)row + (e >> 5) * SDPA__Q8_0_BYTES;
        return (float)((const int8_t *)(const void *)(blk + 2))[e & 31] * sdpa__q8_0_d(blk);
    }
    if (DT == SDPA_DTYPE_FP8_E4M3)
        return sdpa__e4m3_to_f32(((const uint8_t *)row)[e]);
    if (DT == SDPA_DTYPE_FP8_E5M2)
        return sdpa__e5m2_to_f32(((const uint8_t *)row)[e]);
    const void *p = (const char *)row + e * esize(DT);
    if (DT == SDPA_DTYPE_F32)
        return *(const float *)p;
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return DT == SDPA_DTYPE_F16 ? _cvtsh_ss(h) : sdpa__bf16_to_f32(h);
}
/* Elements [e, e + n) (n < 8) widened (the others 0); nothing beyond them is read. */
AI __m256 ld8n(const int DT, const void *row, ptrdiff_t e, int64_t n, __m256i mk) {
    if (DT == SDPA_DTYPE_F32)
        return _mm256_maskload_ps((const float *)row + e, mk);
    if (DT == SDPA_DTYPE_F16 || DT == SDPA_DTYPE_BF16) {
        uint16_t h[8] = {0};
        memcpy(h, (const uint16_t *)row + e, (size_t)n * sizeof(uint16_t));
        return ld8(DT, h, 0);
    }
    float x[8] = {0};
    for (int64_t i = 0; i < n; ++i)
        x[i] = ld1(DT, row, e + i);
    return _mm256_loadu_ps(x);
}

AI void dot_rows_t(const int DT, const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s) {
    const int64_t ev = ne & ~(int64_t)7;
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const void *kr = rowp(DT, k, t * ks);
        __m256 a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            a[u] = _mm256_setzero_ps();
        for (int64_t e = 0; e < ev; e += 8) {
            const __m256 qv = _mm256_loadu_ps(q + e);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                a[u] = _mm256_fmadd_ps(qv, ld8(DT, rowp(DT, kr, u * ks), e), a[u]);
        }
        const __m256 h0 = _mm256_hadd_ps(a[0], a[1]), h1 = _mm256_hadd_ps(a[2], a[3]);
        const __m256 h2 = _mm256_hadd_ps(a[4], a[5]), h3 = _mm256_hadd_ps(a[6], a[7]);
        const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
        __m256 sv = _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
        if (ev < ne) {
            float tail[8];
            for (int u = 0; u < 8; ++u) {
                float x = 0.0f;
                for (int64_t e = ev; e < ne; ++e)
                    x += q[e] * ld1(DT, rowp(DT, kr, u * ks), e);
                tail[u] = x;
            }
            sv = _mm256_add_ps(sv, _mm256_loadu_ps(tail));
        }
        _mm256_storeu_ps(s + t, sv);
    }
    for (; t < n; ++t) {
        const void *kr = rowp(DT, k, t * ks);
        __m256 a = _mm256_setzero_ps();
        for (int64_t e = 0; e < ev; e += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), ld8(DT, kr, e), a);
        float x = hsum8(a), tail = 0.0f;
        for (int64_t e = ev; e < ne; ++e)
            tail += q[e] * ld1(DT, kr, e);
        s[t] = x + tail;
    }
}

void sdpa__avx2_dot_rows(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s) {
    dot_rows_t(SDPA_DTYPE_F32, q, ne, k, ks, n, s);
}

float sdpa__avx2_row_max(const float *s, int64_t n, int32_t *bad) {
    __m256 mx = _mm256_set1_ps(-INFINITY), bv = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 x = _mm256_loadu_ps(s + t);
        mx = _mm256_max_ps(mx, x);
        bv = _mm256_or_ps(bv, not_finite8(x));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    bool fin = _mm256_movemask_ps(bv) == 0;
    for (; t < n; ++t) {
        r = s[t] > r ? s[t] : r;
        fin = fin && isfinite(s[t]);
    }
    if (bad != NULL && !fin)
        *bad = -1;
    return r;
}

float sdpa__avx2_exp_sum(float *s, int64_t n, float u) {
    const __m256 uv = _mm256_set1_ps(u);
    __m256 sum = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), uv));
        _mm256_storeu_ps(s + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (t < n) {
        const __m256i mk = head_mask(n - t);
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(s + t, mk), uv)), _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(s + t, mk, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum8(sum);
}

AI void axpy_rows_t(const int DT, float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,
                    int64_t cnt, const void *v, ptrdiff_t vs) {
    const __m256 al = _mm256_set1_ps(alpha);
    int64_t d = 0;
    for (; d + 32 <= nev; d += 32) {
        __m256 a0 = _mm256_mul_ps(al, _mm256_loadu_ps(o + d)), a1 = _mm256_mul_ps(al, _mm256_loadu_ps(o + d + 8));
        __m256 a2 = _mm256_mul_ps(al, _mm256_loadu_ps(o + d + 16)), a3 = _mm256_mul_ps(al, _mm256_loadu_ps(o + d + 24));
        for (int64_t t = 0; t < cnt; ++t) {
            const __m256 w = _mm256_broadcast_ss(p + idx[t]);
            const void *vr = rowp(DT, v, (ptrdiff_t)idx[t] * vs);
            a0 = _mm256_fmadd_ps(w, ld8(DT, vr, d), a0);
            a1 = _mm256_fmadd_ps(w, ld8(DT, vr, d + 8), a1);
            a2 = _mm256_fmadd_ps(w, ld8(DT, vr, d + 16), a2);
            a3 = _mm256_fmadd_ps(w, ld8(DT, vr, d + 24), a3);
        }
        _mm256_storeu_ps(o + d, a0);
        _mm256_storeu_ps(o + d + 8, a1);
        _mm256_storeu_ps(o + d + 16, a2);
        _mm256_storeu_ps(o + d + 24, a3);
    }
    for (; d < nev; d += 8) {
        const int64_t w8 = nev - d < 8 ? nev - d : 8;
        const __m256i mk = head_mask(w8);
        __m256 a0 = _mm256_mul_ps(al, _mm256_maskload_ps(o + d, mk));
        for (int64_t t = 0; t < cnt; ++t)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + idx[t]),
                                 ld8n(DT, rowp(DT, v, (ptrdiff_t)idx[t] * vs), d, w8, mk), a0);
        _mm256_maskstore_ps(o + d, mk, a0);
    }
}

void sdpa__avx2_axpy_rows(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                          const float *v, ptrdiff_t vs) {
    axpy_rows_t(SDPA_DTYPE_F32, o, nev, alpha, p, idx, cnt, v, vs);
}

#define X_ROWS(SUF, DT)                                                                                          \
    static void x_dot_rows_##SUF(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s,  \
                                 const void *pf) {                                                               \
        (void)pf; /* no software prefetch in this set */                                                        \
        dot_rows_t(DT, q, ne, k, ks, n, s);                                                                      \
    }                                                                                                            \
    static void x_axpy_rows_##SUF(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,       \
                                  int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {                   \
        (void)pf;                                                                                                \
        axpy_rows_t(DT, o, nev, alpha, p, idx, cnt, v, vs);                                                      \
    }
X_ROWS(f32, SDPA_DTYPE_F32)
X_ROWS(f16, SDPA_DTYPE_F16)
X_ROWS(bf16, SDPA_DTYPE_BF16)
X_ROWS(q8_0, SDPA_DTYPE_Q8_0)
X_ROWS(e4m3, SDPA_DTYPE_FP8_E4M3)
X_ROWS(e5m2, SDPA_DTYPE_FP8_E5M2)

const sdpa__mk_kv sdpa__mk_kv_avx2[SDPA__KV_DTYPES] = {
    [SDPA_DTYPE_F32] = {x_dot_rows_f32, x_axpy_rows_f32, NULL, NULL},
    [SDPA_DTYPE_F16] = {x_dot_rows_f16, x_axpy_rows_f16, NULL, NULL},
    [SDPA_DTYPE_BF16] = {x_dot_rows_bf16, x_axpy_rows_bf16, NULL, NULL},
    [SDPA_DTYPE_Q8_0] = {x_dot_rows_q8_0, x_axpy_rows_q8_0, NULL, NULL},
    [SDPA_DTYPE_FP8_E4M3] = {x_dot_rows_e4m3, x_axpy_rows_e4m3, NULL, NULL},
    [SDPA_DTYPE_FP8_E5M2] = {x_dot_rows_e5m2, x_axpy_rows_e5m2, NULL, NULL},
};

bool sdpa__avx2_all_finite(const float *x, int64_t n) {
    const __m256i ex = _mm256_set1_epi32(0x7f800000);
    __m256i acc = _mm256_setzero_si256();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m256i u = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + t)), ex);
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(u, ex));
    }
    bool fin = _mm256_testz_si256(acc, acc) != 0;
    for (; t < n; ++t)
        fin = fin && isfinite(x[t]);
    return fin;
}

/* ------------------------------------------------------------ transposes */

AI void transpose8(__m256 *r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* t[c * ld + r] = scale * x[r * rs + c] for r < nrows, c < ncols: a block transpose in 8x8
 * register tiles. Packing Q into lanes and unpacking the output are both this transpose. */
static void transpose_scaled(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                             ptrdiff_t ld) {
    const __m256 sc = _mm256_set1_ps(scale);
    int64_t r0 = 0;
    for (; r0 + 8 <= nrows; r0 += 8) {
        int64_t c0 = 0;
        for (; c0 + 8 <= ncols; c0 += 8) {
            __m256 v[8];
            for (int u = 0; u < 8; ++u)
                v[u] = _mm256_loadu_ps(x + (r0 + u) * rs + c0);
            transpose8(v);
            for (int u = 0; u < 8; ++u)
                _mm256_storeu_ps(t + (c0 + u) * ld + r0, _mm256_mul_ps(sc, v[u]));
        }
        for (; c0 < ncols; ++c0)
            for (int64_t r = r0; r < r0 + 8; ++r)
                t[c0 * ld + r] = scale * x[r * rs + c0];
    }
    for (; r0 < nrows; ++r0)
        for (int64_t c = 0; c < ncols; ++c)
            t[c * ld + r0] = scale * x[r0 * rs + c];
}

void sdpa__avx2_pack_lanes(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                           int64_t ld) {
    transpose_scaled(x, rs, nrows, ncols, scale, t, (ptrdiff_t)ld);
}

/* x[r * rs + c] = t[c * ld + r]: the same transpose the other way (scale 1 is exact). */
void sdpa__avx2_unpack_lanes(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs) {
    transpose_scaled(t, (ptrdiff_t)ld, ncols, nrows, 1.0f, x, rs);
}

const sdpa__mk sdpa__mk_avx2 = {
    "tiled-avx2", "decode-avx2", "decode-split-avx2",
    x_lanes_gemm, sdpa__avx2_softcap, x_lanes_range_mask, x_lanes_softmax, SDPA__LANES,
    sdpa__avx2_dot_rows, sdpa__avx2_row_max, sdpa__avx2_exp_sum, sdpa__avx2_axpy_rows, sdpa__avx2_all_finite,
    sdpa__avx2_pack_lanes, sdpa__avx2_unpack_lanes,
    NULL, NULL, /* no multi-row decode members: kernel_decode loops over the rows */
    NULL,       /* ALiBi: rules.c's loop */
};
