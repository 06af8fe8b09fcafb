/* AVX-512F micro-kernels for the tiled path's "lanes" tiles (16 lanes per register). Built with
 * -mavx512f -mavx2 -mfma into its own static library; used only through a call context whose
 * table dispatch.c chose after seeing AVX-512F (and AVX2 + FMA) at run time. The decode path's "rows" kernels are here too
 * (one 64-byte load per cache line of K and V, software prefetch ahead of the stream, masked
 * tails instead of scalar loops); softcap keeps the AVX2 code (a side path).
 *
 * exp is the AVX2 file's algorithm (same clamp, Cody-Waite split, degree-7 Taylor polynomial,
 * 2^n built in the exponent field so that inputs <= -87.7, -inf included, give exactly 0). */
#include "microkernel.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#include "simd_avx512.h"

/* mr rows x (16 nv) lanes, mr <= 8, nv <= 2: up to 16 accumulators. */
AI void lg_tile(int mr, int nv, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
                int64_t ld, float *c, const float *beta) {
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
        acc[r][0] = _mm512_setzero_ps();
        acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kk; ++k) {
        const __m512 b0 = _mm512_loadu_ps(b + k * ld);
        const __m512 b1 = nv > 1 ? _mm512_loadu_ps(b + k * ld + 16) : b0;
        const float *ak = a + k * aks;
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) {
            if (r < mr) {
                const __m512 x = _mm512_set1_ps(ak[r * ars]);
                acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
                if (nv > 1)
                    acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
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
                    if (beta != NULL)
                        x = _mm512_fmadd_ps(_mm512_loadu_ps(beta + 16 * v), _mm512_loadu_ps(cr + 16 * v), x);
                    _mm512_storeu_ps(cr + 16 * v, x);
                }
            }
        }
    }
}

typedef void (*tile_fn)(int64_t, const float *, ptrdiff_t, ptrdiff_t, const float *, int64_t, float *, const float *);

#define LG(MR, NV)                                                                                              \
    static void lg_##MR##_##NV(int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,       \
                               int64_t ld, float *c, const float *beta) {                                      \
        lg_tile(MR, NV, kk, a, ars, aks, b, ld, c, beta);                                                      \
    }
LG(1, 1)
LG(2, 1)
LG(3, 1)
LG(4, 1)
LG(5, 1)
LG(6, 1)
LG(7, 1)
LG(8, 1)
LG(1, 2)
LG(2, 2)
LG(3, 2)
LG(4, 2)
LG(5, 2)
LG(6, 2)
LG(7, 2)
LG(8, 2)

static void z_lanes_gemm(int64_t m, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
                         float *c, const float *beta, int64_t nl, int64_t ld) {
    static const tile_fn one[9] = {NULL, lg_1_1, lg_2_1, lg_3_1, lg_4_1, lg_5_1, lg_6_1, lg_7_1, lg_8_1};
    static const tile_fn two[9] = {NULL, lg_1_2, lg_2_2, lg_3_2, lg_4_2, lg_5_2, lg_6_2, lg_7_2, lg_8_2};
    for (int64_t l0 = 0; l0 < nl;) {
        const int wide = nl - l0 >= 32;
        const tile_fn *fns = wide ? two : one;
        const float *bl = b + l0, *gl = beta != NULL ? beta + l0 : NULL;
        int64_t r = 0;
        for (; r + 8 <= m; r += 8)
            fns[8](kk, a + r * ars, ars, aks, bl, ld, c + r * ld + l0, gl);
        if (r < m)
            fns[m - r](kk, a + r * ars, ars, aks, bl, ld, c + r * ld + l0, gl);
        l0 += wide ? 32 : 16;
    }
}

static void z_lanes_range_mask(float *t, int64_t n, int64_t nl, int64_t ld, int32_t j0, const int32_t *lo,
                               const int32_t *hi, int32_t *bad) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t l = 0; l < nl; l += 16) {
        const __m512i lom1 = _mm512_sub_epi32(_mm512_loadu_si512(lo + l), _mm512_set1_epi32(1));
        const __m512i hiv = _mm512_loadu_si512(hi + l);
        __mmask16 bm = 0;
        for (int64_t j = 0; j < n; ++j) {
            const __m512i key = _mm512_set1_epi32(j0 + (int32_t)j);
            const __mmask16 ok = _mm512_cmpgt_epi32_mask(key, lom1) & _mm512_cmpgt_epi32_mask(hiv, key);
            float *row = t + j * ld + l;
            const __m512 x = _mm512_loadu_ps(row);
            bm |= ok & not_finite16(x);
            _mm512_storeu_ps(row, _mm512_mask_blend_ps(ok, ninf, x));
        }
        const __m512i old = _mm512_loadu_si512(bad + l);
        _mm512_storeu_si512(bad + l, _mm512_mask_mov_epi32(old, bm, _mm512_set1_epi32(-1)));
    }
}

static void z_lanes_softmax(float *t, int64_t n, int64_t nl, int64_t ld, float *m, float *alpha, float *tsum,
                            int32_t *bad) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t l = 0; l < nl; l += 16) {
        __m512 mx = ninf;
        if (bad != NULL) {
            __mmask16 bm = 0;
            for (int64_t j = 0; j < n; ++j) {
                const __m512 x = _mm512_loadu_ps(t + j * ld + l);
                mx = _mm512_max_ps(mx, x);
                bm |= not_finite16(x);
            }
            const __m512i old = _mm512_loadu_si512(bad + l);
            _mm512_storeu_si512(bad + l, _mm512_mask_mov_epi32(old, bm, _mm512_set1_epi32(-1)));
        } else {
            for (int64_t j = 0; j < n; ++j)
                mx = _mm512_max_ps(mx, _mm512_loadu_ps(t + j * ld + l));
        }
        const __m512 mo = _mm512_loadu_ps(m + l);
        const __m512 mn = _mm512_max_ps(mx, mo);
        const __m512 u = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
        _mm512_storeu_ps(alpha + l, exp16(_mm512_sub_ps(mo, u)));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
            float *row = t + j * ld + l;
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(row), u));
            _mm512_storeu_ps(row, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_storeu_ps(tsum + l, sum);
        _mm512_storeu_ps(m + l, mn);
    }
}

/* ----------------------------------------------------------------- rows */

/* The rows kernels read K/V rows as stored: float32, or f16 / bf16 encodings widened exactly
 * in the register they are loaded into (vcvtph2ps; bf16: zero-extend and shift left by 16), so
 * the arithmetic on a row is the same for every dtype and a 16-bit row costs half the bytes.
 * DT is the row's sdpa_dtype (a constant in every instantiation); strides are in elements. */

/* How far ahead of the K/V stream the rows kernels prefetch: 16 rows of E = 128 floats (8 KiB),
 * enough to cover memory latency at one core's bandwidth. Prefetches past the end of the
 * current tile fetch the next one (the cache is contiguous per (b, kv head) in the common
 * layout); a prefetch never faults. */
#define PF_BYTES 8192
#define PF_MULTI (2 * PF_BYTES) /* the multi-row kernels: less work per byte, so further ahead */

AI __mmask16 head16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

AI int64_t esize(const int DT) { return DT == SDPA_DTYPE_F32 ? 4 : 2; }

/* 0.6: bytes of the stride unit (q8_0: a block of 32), row off of a base in that unit, and the
 * bytes of n elements of a row (q8_0: n a multiple of 32). */
AI ptrdiff_t unit(const int DT) {
    return DT == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_BYTES : DT >= SDPA_DTYPE_FP8_E4M3 ? 1 : (ptrdiff_t)esize(DT);
}
AI const void *rowp(const int DT, const void *base, ptrdiff_t off) { return (const char *)base + off * unit(DT); }
AI int64_t rbytes(const int DT, int64_t n) {
    return DT == SDPA_DTYPE_Q8_0 ? n / 32 * SDPA__Q8_0_BYTES : DT >= SDPA_DTYPE_FP8_E4M3 ? n : n * esize(DT);
}

/* 16 E4M3FN / E5M2 bytes widened exactly (simd_avx512.h). */
AI __m512 fp8x16(const int DT, __m128i b16) { return fp8x16_to_f32(DT == SDPA_DTYPE_FP8_E4M3, b16); }

/* 16 q8_0 values (one block's half: e a multiple of 16) from 16 int8 q and the block's d. */
AI __m512 q8x16(const char *blk, __m128i q) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), q8_0_d16(blk));
}

/* Elements [e, e + 16) of a row as stored, widened to float32. */
AI __m512 ld16(const int DT, const void *row, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0) {
        const char *blk = (const char *)row + (e >> 5) * SDPA__Q8_0_BYTES;
        return q8x16(blk, _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + (e & 31))));
    }
    if (DT == SDPA_DTYPE_FP8_E4M3 || DT == SDPA_DTYPE_FP8_E5M2)
        return fp8x16(DT, _mm_loadu_si128((const __m128i *)(const void *)((const char *)row + e)));
    const void *p = (const char *)row + e * esize(DT);
    if (DT == SDPA_DTYPE_F32)
        return _mm512_loadu_ps((const float *)p);
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (DT == SDPA_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The lanes of m of elements [e, e + 16) (others 0), widened; nothing outside m is read. */
AI __m512 ld16z(const int DT, __mmask16 m, const void *row, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0) {
        if (m == 0)
            return _mm512_setzero_ps();
        const char *blk = (const char *)row + (e >> 5) * SDPA__Q8_0_BYTES;
        return _mm512_maskz_mov_ps(m, q8x16(blk, _mm_maskz_loadu_epi8(m, blk + 2 + (e & 31))));
    }
    if (DT == SDPA_DTYPE_FP8_E4M3 || DT == SDPA_DTYPE_FP8_E5M2)
        return _mm512_maskz_mov_ps(m, fp8x16(DT, _mm_maskz_loadu_epi8(m, (const char *)row + e)));
    const void *p = (const char *)row + e * esize(DT);
    if (DT == SDPA_DTYPE_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)p);
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (DT == SDPA_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* T1 (into L2 and below): a decode reads each K/V line once (the multi-row kernels and the
 * sub-tiles of the per-row loop re-read it from L1 right away). Measured in one process per
 * CPU, 2 threads, medians: on a Sapphire-Rapids-class VM, (1,32,1,4096,128) f32 NTA 13.0 /
 * T0 5.56 / T1 5.28 ms (floor 4.37); on an AMD EPYC (Zen 4) VM, 2 runs alternated, T1 against
 * NTA (which an earlier run there had measured better than T0): (1,32,1,4096,128) f32 4.2-5.0
 * vs 5.9-6.1 ms, f16 K/V 2.4 vs 3.3 ms, (8,32,1,1024,128) f32 9.6-10.2 vs 12.0-12.5 ms, GQA
 * 32/8 (8,32,1,1024,128) f32 2.6-2.7 vs 3.7-3.9 ms, paged (block size 16, random order)
 * f32 5.3-5.5 vs 7.5-7.7 ms. A prefetch never changes a result. */
AI void prefetch_at(const void *r, int64_t bytes, int64_t ahead) {
    const char *c = (const char *)r + ahead;
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch(c + b, _MM_HINT_T1);
}

/* Into every level (T0): for rows a kernel reads in more than one pass (axpym_block reads a V
 * row's halves in two passes over the tile; the second must find it in L2 if L1 let it go). */
AI void prefetch_t0(const void *r, int64_t bytes) {
    const char *c = (const char *)r;
    for (int64_t b = 0; b < bytes; b += 64)
        _mm_prefetch(c + b, _MM_HINT_T0);
}

/* 8 sums of 16 lanes each -> one 8-lane vector (lane u = sum of a[u]). */
AI __m256 hsum8x16(const __m512 *a) {
    __m256 h[8];
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u)
        h[u] = _mm256_add_ps(_mm512_castps512_ps256(a[u]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[u]), 1)));
    const __m256 h0 = _mm256_hadd_ps(h[0], h[1]), h1 = _mm256_hadd_ps(h[2], h[3]);
    const __m256 h2 = _mm256_hadd_ps(h[4], h[5]), h3 = _mm256_hadd_ps(h[6], h[7]);
    const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);
    return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

AI void dot_rows_t(const int DT, const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s,
                  const void *pf) {
    const int64_t ev = ne & ~(int64_t)15, rb = rbytes(DT, ne);
    const __mmask16 tm = head16(ne - ev);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const void *kr = rowp(DT, k, t * ks);
        __m512 a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
            a[u] = _mm512_setzero_ps();
            if (pf)
                prefetch_at(rowp(DT, pf, (t + u) * ks), rb, 0);
        }
        for (int64_t e = 0; e < ev; e += 16) {
            const __m512 qv = _mm512_loadu_ps(q + e);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                a[u] = _mm512_fmadd_ps(qv, ld16(DT, rowp(DT, kr, u * ks), e), a[u]);
        }
        if (tm) {
            const __m512 qv = _mm512_maskz_loadu_ps(tm, q + ev);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                a[u] = _mm512_fmadd_ps(qv, ld16z(DT, tm, rowp(DT, kr, u * ks), ev), a[u]);
        }
        _mm256_storeu_ps(s + t, hsum8x16(a));
    }
    for (; t < n; ++t) {
        const void *kr = rowp(DT, k, t * ks);
        if (pf)
            prefetch_at(rowp(DT, pf, t * ks), rb, 0);
        __m512 a = _mm512_setzero_ps();
        for (int64_t e = 0; e < ev; e += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), ld16(DT, kr, e), a);
        if (tm)
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, q + ev), ld16z(DT, tm, kr, ev), a);
        s[t] = _mm512_reduce_add_ps(a);
    }
}

static float z_row_max(const float *s, int64_t n, int32_t *bad) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    __mmask16 bm = 0;
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 m = head16(n - t);
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, s + t);
        mx = _mm512_max_ps(mx, x);
        bm |= m & not_finite16(x);
    }
    if (bad != NULL && bm != 0)
        *bad = -1;
    return _mm512_reduce_max_ps(mx);
}

static float z_exp_sum(float *s, int64_t n, float u) {
    const __m512 uv = _mm512_set1_ps(u);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 m = head16(n - t);
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), uv)));
        _mm512_mask_storeu_ps(s + t, m, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* Up to 8 vectors (128 elements) of o per pass over the used rows: each V row is read once per
 * pass, so once in all for Ev <= 128. Per element the sum runs in t order, as in every set. */
AI void axpy_rows_t(const int DT, float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,
                    int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {
    const __m512 al = _mm512_set1_ps(alpha);
    int64_t d = 0;
    for (; d + 128 <= nev; d += 128) {
        __m512 a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            a[u] = _mm512_mul_ps(al, _mm512_loadu_ps(o + d + 16 * u));
        for (int64_t t = 0; t < cnt; ++t) {
            const __m512 w = _mm512_set1_ps(p[idx[t]]);
            const void *vr = rowp(DT, v, (ptrdiff_t)idx[t] * vs);
            if (pf)
                prefetch_at((const char *)rowp(DT, pf, (ptrdiff_t)idx[t] * vs) + rbytes(DT, d), rbytes(DT, 128), 0);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                a[u] = _mm512_fmadd_ps(w, ld16(DT, vr, d + 16 * u), a[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            _mm512_storeu_ps(o + d + 16 * u, a[u]);
    }
    if (d < nev) { /* the last < 128 elements: up to 8 masked vectors */
        __mmask16 mk[8];
        __m512 a[8];
        const int64_t rest = nev - d;
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
            mk[u] = 16 * u < rest ? head16(rest - 16 * u) : (__mmask16)0;
            a[u] = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mk[u], o + d + 16 * u));
        }
        for (int64_t t = 0; t < cnt; ++t) {
            const __m512 w = _mm512_set1_ps(p[idx[t]]);
            const void *vr = rowp(DT, v, (ptrdiff_t)idx[t] * vs);
            if (pf)
                prefetch_at((const char *)rowp(DT, pf, (ptrdiff_t)idx[t] * vs) + rbytes(DT, d), rbytes(DT, rest), 0);
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                if (mk[u])
                    a[u] = _mm512_fmadd_ps(w, ld16z(DT, mk[u], vr, d + 16 * u), a[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            _mm512_mask_storeu_ps(o + d + 16 * u, mk[u], a[u]);
    }
}

/* 4 sums of 16 lanes each -> one 4-lane vector, by the same tree per sum as hsum8x16 (so a key's
 * score does not depend on which of the two computes it). */
AI __m128 hsum4x16(const __m512 *a) {
    __m256 h[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
        h[u] = _mm256_add_ps(_mm512_castps512_ps256(a[u]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[u]), 1)));
    const __m256 g = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    return _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps(g, 1));
}

/* dot_rows for NR (<= 4) rows at once: per e step each K vector is loaded once for all rows.
 * Keys in whole blocks of 8 (as dot_rows_t sees them) are summed by hsum4x16 four at a time,
 * the others by _mm512_reduce_add_ps, as in dot_rows_t. */
AI void dotm_block(const int DT, const int NR, const float *const *q, int64_t ne, const void *k, ptrdiff_t ks,
                   int64_t n, float *const *s, const void *pf) {
    const int64_t ev = ne & ~(int64_t)15, rb = rbytes(DT, ne);
    const __mmask16 tm = head16(ne - ev);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        for (int64_t hf = 0; hf < 8; hf += 4) {
            const void *kr = rowp(DT, k, (t + hf) * ks);
            __m512 a[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    a[r][u] = _mm512_setzero_ps();
            if (pf)
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    prefetch_at(rowp(DT, pf, (t + hf + u) * ks), rb, 0);
            for (int64_t e = 0; e < ev; e += 16) {
                __m512 kv[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    kv[u] = ld16(DT, rowp(DT, kr, u * ks), e);
#pragma GCC unroll 4
                for (int r = 0; r < NR; ++r) {
                    const __m512 qv = _mm512_loadu_ps(q[r] + e);
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u)
                        a[r][u] = _mm512_fmadd_ps(qv, kv[u], a[r][u]);
                }
            }
            if (tm) {
                __m512 kv[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    kv[u] = ld16z(DT, tm, rowp(DT, kr, u * ks), ev);
#pragma GCC unroll 4
                for (int r = 0; r < NR; ++r) {
                    const __m512 qv = _mm512_maskz_loadu_ps(tm, q[r] + ev);
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u)
                        a[r][u] = _mm512_fmadd_ps(qv, kv[u], a[r][u]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r)
                _mm_storeu_ps(s[r] + t + hf, hsum4x16(a[r]));
        }
    for (; t < n; ++t) {
        const void *kr = rowp(DT, k, t * ks);
        if (pf)
            prefetch_at(rowp(DT, pf, t * ks), rb, 0);
        __m512 a[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r)
            a[r] = _mm512_setzero_ps();
        for (int64_t e = 0; e < ev; e += 16) {
            const __m512 kv = ld16(DT, kr, e);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r)
                a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(q[r] + e), kv, a[r]);
        }
        if (tm) {
            const __m512 kv = ld16z(DT, tm, kr, ev);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r)
                a[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, q[r] + ev), kv, a[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r)
            s[r][t] = _mm512_reduce_add_ps(a[r]);
    }
}

AI void dot_rows_multi_t(const int DT, int64_t nr, const float *const *q, int64_t ne, const void *k, ptrdiff_t ks,
                         int64_t n, float *const *s, const void *pf) {
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4)
        dotm_block(DT, 4, q + r, ne, k, ks, n, s + r, r == 0 ? pf : NULL);
    switch (nr - r) {
    case 3: dotm_block(DT, 3, q + r, ne, k, ks, n, s + r, r == 0 ? pf : NULL); break;
    case 2: dotm_block(DT, 2, q + r, ne, k, ks, n, s + r, r == 0 ? pf : NULL); break;
    case 1: dotm_block(DT, 1, q + r, ne, k, ks, n, s + r, r == 0 ? pf : NULL); break;
    default: break;
    }
}

/* axpy_rows for NR (<= 4) rows at once, 64 elements of o per pass over the used rows: each V
 * vector is loaded once for all rows. Per element: alpha * o, then the FMAs in t order, as in
 * axpy_rows_t. */
AI void axpym_block(const int DT, const int NR, float *const *o, int64_t nev, const float *alpha,
                    const float *const *p, const int32_t *idx, int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {
    for (int64_t d = 0; d < nev; d += 64) {
        const int64_t rest = nev - d;
        __mmask16 mk[4];
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u)
            mk[u] = 16 * u < rest ? head16(rest - 16 * u) : (__mmask16)0;
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
            const __m512 al = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                a[r][u] = _mm512_mul_ps(al, _mm512_maskz_loadu_ps(mk[u], o[r] + d + 16 * u));
        }
        const bool pfd = pf != NULL && d == 0;
        for (int64_t t = 0; t < cnt; ++t) {
            const void *vr = rowp(DT, v, (ptrdiff_t)idx[t] * vs);
            if (pfd)
                prefetch_t0(rowp(DT, pf, (ptrdiff_t)idx[t] * vs), rbytes(DT, nev));
            __m512 vv[4];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                vv[u] = ld16z(DT, mk[u], vr, d + 16 * u);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r) {
                const __m512 w = _mm512_set1_ps(p[r][idx[t]]);
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u)
                    a[r][u] = _mm512_fmadd_ps(w, vv[u], a[r][u]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
                _mm512_mask_storeu_ps(o[r] + d + 16 * u, mk[u], a[r][u]);
    }
}

AI void axpy_rows_multi_t(const int DT, int64_t nr, float *const *o, int64_t nev, const float *alpha,
                          const float *const *p, const int32_t *idx, int64_t cnt, const void *v, ptrdiff_t vs,
                          const void *pf) {
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4)
        axpym_block(DT, 4, o + r, nev, alpha + r, p + r, idx, cnt, v, vs, r == 0 ? pf : NULL);
    switch (nr - r) {
    case 3: axpym_block(DT, 3, o + r, nev, alpha + r, p + r, idx, cnt, v, vs, r == 0 ? pf : NULL); break;
    case 2: axpym_block(DT, 2, o + r, nev, alpha + r, p + r, idx, cnt, v, vs, r == 0 ? pf : NULL); break;
    case 1: axpym_block(DT, 1, o + r, nev, alpha + r, p + r, idx, cnt, v, vs, r == 0 ? pf : NULL); break;
    default: break;
    }
}

/* One instantiation per storage dtype: X(name suffix, sdpa_dtype). */
#define Z_ROWS(SUF, DT)                                                                                          \
    static void z_dot_rows_##SUF(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s,  \
                                 const void *pf) {                                                               \
        dot_rows_t(DT, q, ne, k, ks, n, s, pf);                                                                  \
    }                                                                                                            \
    static void z_axpy_rows_##SUF(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,       \
                                  int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {                   \
        axpy_rows_t(DT, o, nev, alpha, p, idx, cnt, v, vs, pf);                                                  \
    }                                                                                                            \
    static void z_dot_rows_multi_##SUF(int64_t nr, const float *const *q, int64_t ne, const void *k,            \
                                       ptrdiff_t ks, int64_t n, float *const *s, const void *pf) {               \
        dot_rows_multi_t(DT, nr, q, ne, k, ks, n, s, pf);                                                        \
    }                                                                                                            \
    static void z_axpy_rows_multi_##SUF(int64_t nr, float *const *o, int64_t nev, const float *alpha,           \
                                        const float *const *p, const int32_t *idx, int64_t cnt, const void *v,   \
                                        ptrdiff_t vs, const void *pf) {                                          \
        axpy_rows_multi_t(DT, nr, o, nev, alpha, p, idx, cnt, v, vs, pf);                                        \
    }
Z_ROWS(f32, SDPA_DTYPE_F32)
Z_ROWS(f16, SDPA_DTYPE_F16)
Z_ROWS(bf16, SDPA_DTYPE_BF16)
Z_ROWS(q8_0, SDPA_DTYPE_Q8_0)
Z_ROWS(e4m3, SDPA_DTYPE_FP8_E4M3)
Z_ROWS(e5m2, SDPA_DTYPE_FP8_E5M2)

/* The float32 members of the table (the same instantiation as the f32 column of sdpa__mk_kv_avx512). */
static void z_dot_rows(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s) {
    dot_rows_t(SDPA_DTYPE_F32, q, ne, k, ks, n, s, (const char *)k + PF_BYTES);
}
static void z_axpy_rows(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                        const float *v, ptrdiff_t vs) {
    axpy_rows_t(SDPA_DTYPE_F32, o, nev, alpha, p, idx, cnt, v, vs, (const char *)v + PF_BYTES);
}
static void z_dot_rows_multi(int64_t nr, const float *const *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n,
                             float *const *s) {
    dot_rows_multi_t(SDPA_DTYPE_F32, nr, q, ne, k, ks, n, s, (const char *)k + PF_MULTI);
}
static void z_axpy_rows_multi(int64_t nr, float *const *o, int64_t nev, const float *alpha, const float *const *p,
                              const int32_t *idx, int64_t cnt, const float *v, ptrdiff_t vs) {
    axpy_rows_multi_t(SDPA_DTYPE_F32, nr, o, nev, alpha, p, idx, cnt, v, vs, (const char *)v + PF_MULTI);
}

static bool z_all_finite(const float *x, int64_t n) {
    const __m512i ex = _mm512_set1_epi32(0x7f800000);
    __mmask16 bm = 0, bm2 = 0;
    int64_t t = 0;
    for (; t + 32 <= n; t += 32) { /* two independent vectors per step */
        const __m512i u0 = _mm512_and_si512(_mm512_loadu_si512(x + t), ex);
        const __m512i u1 = _mm512_and_si512(_mm512_loadu_si512(x + t + 16), ex);
        bm |= _mm512_cmpeq_epi32_mask(u0, ex);
        bm2 |= _mm512_cmpeq_epi32_mask(u1, ex);
    }
    for (; t < n; t += 16) {
        const __mmask16 m = head16(n - t);
        bm |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(_mm512_maskz_loadu_epi32(m, x + t), ex), ex);
    }
    return (bm | bm2) == 0;
}


/* ----------------------------------------------------------- transposes */

/* In-register transpose of 16 rows of 16 floats. */
AI void transpose16(__m512 *r) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    /* r[4 i + j] now holds, per 128-bit lane k, element j of rows 4 i .. 4 i + 3, columns 4 k + j */
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
        const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88), d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
        t[j] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column j */
        t[8 + j] = _mm512_shuffle_f32x4(a, c, 0xDD);  /* column 8 + j */
        t[4 + j] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + j */
        t[12 + j] = _mm512_shuffle_f32x4(b, d, 0xDD); /* column 12 + j */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
        r[i] = t[i];
}

/* t[c * ld + r] = scale * x[r * rs + c] for r < nrows, c < ncols, in 16 x 16 blocks (masked
 * at the edges: nothing outside the two ranges is read or written). */
static void z_transpose_scaled(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                               ptrdiff_t ld) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < nrows; r0 += 16) {
        const int64_t nr = nrows - r0 < 16 ? nrows - r0 : 16;
        const __mmask16 rm = head16(nr);
        for (int64_t c0 = 0; c0 < ncols; c0 += 16) {
            const int64_t nc = ncols - c0 < 16 ? ncols - c0 : 16;
            const __mmask16 cm = head16(nc);
            __m512 v[16];
#pragma GCC unroll 16
            for (int u = 0; u < 16; ++u)
                v[u] = u < nr ? _mm512_maskz_loadu_ps(cm, x + (r0 + u) * rs + c0) : _mm512_setzero_ps();
            transpose16(v);
#pragma GCC unroll 16
            for (int u = 0; u < 16; ++u)
                if (u < nc)
                    _mm512_mask_storeu_ps(t + (c0 + u) * ld + r0, rm, _mm512_mul_ps(sc, v[u]));
        }
    }
}

static void z_pack_lanes(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                         int64_t ld) {
    z_transpose_scaled(x, rs, nrows, ncols, scale, t, (ptrdiff_t)ld);
}

/* x[r * rs + c] = t[c * ld + r]: the same transpose the other way (scale 1 is exact). */
static void z_unpack_lanes(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs) {
    z_transpose_scaled(t, (ptrdiff_t)ld, ncols, nrows, 1.0f, x, rs);
}

/* s[t * ld + l] -= sl[l] * |(base - t) + lf[l]|: multiply then subtract (no fused form), as the
 * rules.c loop; masked loads and stores keep lanes >= w untouched. */
static void z_lanes_sub_abs(float *s, int64_t ld, int64_t n, int64_t w, const float *sl, const float *lf, float base) {
    for (int64_t t = 0; t < n; ++t) {
        const __m512 bt = _mm512_set1_ps(base - (float)t);
        float *row = s + t * ld;
        for (int64_t l = 0; l < w; l += 16) {
            const __mmask16 m = head16(w - l);
            const __m512 d = _mm512_abs_ps(_mm512_add_ps(bt, _mm512_maskz_loadu_ps(m, lf + l)));
            const __m512 term = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sl + l), d);
            _mm512_mask_storeu_ps(row + l, m, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + l), term));
        }
    }
}

const sdpa__mk sdpa__mk_avx512 = {
    "tiled-avx512", "decode-avx512", "decode-split-avx512",
    z_lanes_gemm, sdpa__avx2_softcap, z_lanes_range_mask, z_lanes_softmax, 2 * SDPA__LANES,
    z_dot_rows, z_row_max, z_exp_sum, z_axpy_rows, z_all_finite,
    z_pack_lanes, z_unpack_lanes,
    z_dot_rows_multi, z_axpy_rows_multi, z_lanes_sub_abs,
};

const sdpa__mk_kv sdpa__mk_kv_avx512[SDPA__KV_DTYPES] = {
    [SDPA_DTYPE_F32] = {z_dot_rows_f32, z_axpy_rows_f32, z_dot_rows_multi_f32, z_axpy_rows_multi_f32},
    [SDPA_DTYPE_F16] = {z_dot_rows_f16, z_axpy_rows_f16, z_dot_rows_multi_f16, z_axpy_rows_multi_f16},
    [SDPA_DTYPE_BF16] = {z_dot_rows_bf16, z_axpy_rows_bf16, z_dot_rows_multi_bf16, z_axpy_rows_multi_bf16},
    [SDPA_DTYPE_Q8_0] = {z_dot_rows_q8_0, z_axpy_rows_q8_0, z_dot_rows_multi_q8_0, z_axpy_rows_multi_q8_0},
    [SDPA_DTYPE_FP8_E4M3] = {z_dot_rows_e4m3, z_axpy_rows_e4m3, z_dot_rows_multi_e4m3, z_axpy_rows_multi_e4m3},
    [SDPA_DTYPE_FP8_E5M2] = {z_dot_rows_e5m2, z_axpy_rows_e5m2, z_dot_rows_multi_e5m2, z_axpy_rows_multi_e5m2},
};
