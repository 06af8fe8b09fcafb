/* AMX-BF16 micro-kernel primitives of the tiled kernel's bf16 column (SDPA_PRECISION_REDUCED):
 * TDPBF16PS on 16 x 16 float32 tiles, each step adding 16 bf16 pairs per element (two exact
 * products per pair, float32 sums, bf16 subnormal inputs read as 0, subnormal results flushed,
 * nearest even), accumulated in pair order. Built with -mamx-tile -mamx-bf16 -mavx512bf16 into
 * its own static library; call only where sdpa_amx_available() (the CPU has AMX-TILE/AMX-BF16
 * and Linux granted this process XTILEDATA), between sdpa__amx_begin() and sdpa__amx_end() on
 * the calling thread. See microkernel_bf16.h for the shapes each primitive accepts (ne a
 * multiple of 32 up to SDPA__AMX_MAX_E, nev a multiple of 16).
 *
 * Tiles: every tile register is configured 16 rows x 64 bytes (palette 1), once per work item
 * (sdpa__amx_begin). Scores: C = K_rows (A: 16 keys x 32 elements, read in place) times the
 * packed Q pairs (B: 16 pairs x 16 lanes); P.V: C = V^T in key pairs (A: 16 value columns x 16
 * pairs, packed by sdpa__amx_pack_v) times the packed P pairs (B: 16 pairs x 16 lanes). Key rows
 * beyond a tile's end are never read: a last block of fewer than 16 keys is copied into a zeroed
 * 16-row buffer, and its scores stored through a buffer, so nothing outside the caller's rows is
 * touched. */
#include "microkernel_bf16.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#include "simd_avx512.h"

/* The LDTILECFG operand (Intel SDM vol. 1, 3.2: palette 1). */
typedef struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;
_Static_assert(sizeof(tilecfg) == 64, "LDTILECFG reads 64 bytes");

/* Every tile 16 rows x 64 bytes. A constant object: GCC 12's _tile_loadconfig does not tell the
 * compiler that it reads its operand, so stores to a local configuration may be dropped. */
static const tilecfg g_cfg = {.palette = 1,
                              .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                              .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

void sdpa__amx_begin(void) { _tile_loadconfig(&g_cfg); }

void sdpa__amx_end(void) { _tile_release(); }

/* C tiles 0-3 (2 row blocks x 2 lane blocks), A tiles 4-5, B tiles 6-7. */

/* s[r * ld + l] (+)= sum over kp pairs of a(r) . b(l), rows r < 16 * nr (nr 1 or 2), lanes
 * l < 16 * nl (nl 1 or 2); a rows at stride as bytes, its pair step 64 bytes per 16 pairs;
 * b rows (pairs) at stride bs bytes, 64 bytes per lane block. With load, C starts from c. */
AI void block(int nr, int nl, int64_t steps, const void *a, ptrdiff_t as, ptrdiff_t astep, const void *b,
              ptrdiff_t bs, ptrdiff_t bstep, float *c, ptrdiff_t cs, bool load) {
    char *c0 = (char *)c;
    /* GCC 12's _tile_loadd does not declare that it reads memory: make every store before it
     * (packed operands, the scaled o, a copied key block) happen first. */
    __asm__ volatile("" ::: "memory");
    if (load) {
        _tile_loadd(0, c0, cs);
        if (nl > 1)
            _tile_loadd(1, c0 + 64, cs);
        if (nr > 1) {
            _tile_loadd(2, c0 + 16 * cs, cs);
            if (nl > 1)
                _tile_loadd(3, c0 + 16 * cs + 64, cs);
        }
    } else {
        _tile_zero(0);
        if (nl > 1)
            _tile_zero(1);
        if (nr > 1) {
            _tile_zero(2);
            if (nl > 1)
                _tile_zero(3);
        }
    }
    const char *ap = (const char *)a, *bp = (const char *)b;
    for (int64_t s = 0; s < steps; ++s, ap += astep, bp += bstep) {
        _tile_loadd(6, bp, bs);
        if (nl > 1)
            _tile_loadd(7, bp + 64, bs);
        _tile_loadd(4, ap, as);
        _tile_dpbf16ps(0, 4, 6);
        if (nl > 1)
            _tile_dpbf16ps(1, 4, 7);
        if (nr > 1) {
            _tile_loadd(5, ap + 16 * as, as);
            _tile_dpbf16ps(2, 5, 6);
            if (nl > 1)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c0, cs);
    if (nl > 1)
        _tile_stored(1, c0 + 64, cs);
    if (nr > 1) {
        _tile_stored(2, c0 + 16 * cs, cs);
        if (nl > 1)
            _tile_stored(3, c0 + 16 * cs + 64, cs);
    }
}

/* Rows [r0, r0 + nr) x lanes [0, w) of a row-major float tile times x (in place). */
static void scale_rows(float *c, int64_t ld, int64_t nr, int64_t w, float x) {
    const __m512 s = _mm512_set1_ps(x);
    for (int64_t r = 0; r < nr; ++r)
        for (int64_t l = 0; l < w; l += 16)
            _mm512_storeu_ps(c + r * ld + l, _mm512_mul_ps(s, _mm512_loadu_ps(c + r * ld + l)));
}

void sdpa__amx_lanes_scores(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w, const uint16_t *k, ptrdiff_t ks,
                            int64_t nk, float scale, float *st, int64_t ld) {
    const int64_t steps = ne / 32; /* 16 pairs (32 elements) per step */
    const ptrdiff_t as = ks * 2, bs = ldq * 4, cs = ld * 4;
    const int64_t full = nk / 16 * 16;
    for (int64_t l0 = 0; l0 < w; l0 += 32) {
        const int nl = w - l0 >= 32 ? 2 : 1;
        int64_t t = 0;
        for (; t + 32 <= full; t += 32)
            block(2, nl, steps, k + t * ks, as, 64, qp + l0, bs, 16 * bs, st + t * ld + l0, cs, false);
        if (t < full) {
            block(1, nl, steps, k + t * ks, as, 64, qp + l0, bs, 16 * bs, st + t * ld + l0, cs, false);
            t += 16;
        }
        if (t < nk) { /* fewer than 16 keys left: rows copied (zeros beyond), scores through a buffer */
            uint16_t kb[16 * SDPA__AMX_MAX_E];
            float cb[16 * 32];
            const int64_t n = nk - t;
            for (int64_t r = 0; r < 16; ++r) {
                if (r < n)
                    memcpy(kb + r * ne, k + (t + r) * ks, (size_t)ne * sizeof(uint16_t));
                else
                    memset(kb + r * ne, 0, (size_t)ne * sizeof(uint16_t));
            }
            block(1, nl, steps, kb, ne * 2, 64, qp + l0, bs, 16 * bs, cb, 32 * 4, false);
            for (int64_t r = 0; r < n; ++r)
                memcpy(st + (t + r) * ld + l0, cb + r * 32, (size_t)(16 * nl) * sizeof(float));
        }
    }
    if (scale != 1.0f) /* 1: raw scores for sdpa__amx_softmax_pack, which scales them itself */
        scale_rows(st, ld, nk, w, scale);
}

void sdpa__amx_lanes_pv(int64_t nev, int64_t tp0, int64_t np, const uint32_t *vp, const uint32_t *pp, int64_t ldp,
                        float *o, const float *beta, int64_t w, int64_t ld) {
    (void)tp0; /* always 0: the column computes whole tiles (pv_whole_tile) */
    if (np == 0) { /* no key: o = beta o, or 0 */
        for (int64_t d = 0; d < nev; ++d)
            for (int64_t l = 0; l < w; l += 16)
                _mm512_storeu_ps(o + d * ld + l, beta != NULL ? _mm512_mul_ps(_mm512_loadu_ps(beta + l),
                                                                              _mm512_loadu_ps(o + d * ld + l))
                                                              : _mm512_setzero_ps());
        return;
    }
    const int64_t steps = (np + 15) / 16; /* pack_p / pack_v zero the pairs up to a multiple of 16 */
    const ptrdiff_t as = SDPA__AMX_VP_LD * 4, bs = ldp * 4, cs = ld * 4;
    /* With beta: where beta is exactly 1 on a block's lanes, the tiles start from o and add the
     * pairs to it; elsewhere the pair sums land in t, then o = beta o + t (one rounding, FMA). */
    float t[32 * 32] __attribute__((aligned(64)));
    for (int64_t l0 = 0; l0 < w; l0 += 32) {
        const int nl = w - l0 >= 32 ? 2 : 1;
        /* beta exactly 1 on these lanes (sdpa__amx_softmax_pack keeps the reference point) */
        bool ones = beta != NULL && _mm512_cmp_ps_mask(_mm512_loadu_ps(beta + l0), _mm512_set1_ps(1.0f), _CMP_EQ_OQ) ==
                                        (__mmask16)0xFFFF;
        if (ones && nl > 1)
            ones = _mm512_cmp_ps_mask(_mm512_loadu_ps(beta + l0 + 16), _mm512_set1_ps(1.0f), _CMP_EQ_OQ) ==
                   (__mmask16)0xFFFF;
        for (int64_t d = 0; d < nev; d += 32) {
            const int nr = nev - d >= 32 ? 2 : 1;
            float *od = o + d * ld + l0;
            if (beta == NULL || ones) { /* stored, or accumulated onto o in the tiles (beta = 1) */
                block(nr, nl, steps, vp + d * SDPA__AMX_VP_LD, as, 64, pp + l0, bs, 16 * bs, od, cs, ones);
                continue;
            }
            block(nr, nl, steps, vp + d * SDPA__AMX_VP_LD, as, 64, pp + l0, bs, 16 * bs, t, 32 * 4, false);
            for (int r = 0; r < 16 * nr; ++r)
                for (int l = 0; l < 16 * nl; l += 16)
                    _mm512_storeu_ps(od + r * ld + l, _mm512_fmadd_ps(_mm512_loadu_ps(beta + l0 + l),
                                                                      _mm512_loadu_ps(od + r * ld + l),
                                                                      _mm512_load_ps(t + r * 32 + l)));
        }
    }
}

void sdpa__amx_pack_p(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp) {
    sdpa__bf16_pack_p_avx512bf16(st, ld, n, w, pp, ldp);
    const int64_t np = (n + 1) / 2, npr = (np + 15) / 16 * 16;
    for (int64_t tp = np; tp < npr; ++tp)
        memset(pp + tp * ldp, 0, (size_t)w * sizeof(uint32_t));
}

/* 16 x 16 transpose of 32-bit elements: r[i] lane j -> r[j] lane i. */
AI void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4 q + c] now holds, in 128-bit lane x, elements (4 x .. 4 x + 3) of column 4 (x-block) ...:
     * rows 4 q .. 4 q + 3 of the input, column c of each 4-column group. Exchange 128-bit lanes. */
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

void sdpa__amx_pack_v(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev, uint32_t *vp) {
    const int64_t np = (n + 1) / 2, npr = (np + 15) / 16 * 16;
    for (int64_t tb = 0; tb < npr; tb += 16) {
        const uint16_t *r0[16], *r1[16];
        bool has0[16], has1[16];
        for (int i = 0; i < 16; ++i) {
            const int64_t j0 = 2 * (tb + i), j1 = j0 + 1;
            has0[i] = j0 < n;
            has1[i] = j1 < n;
            r0[i] = has0[i] ? v + (idx != NULL ? idx[j0] : j0) * vs : v;
            r1[i] = has1[i] ? v + (idx != NULL ? idx[j1] : j1) * vs : v;
        }
        /* word l of the row-2tp half, then word l of the row-2tp+1 half */
        const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                               6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (int64_t d = 0; d < nev; d += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) { /* pair tb + i of columns d .. d + 15 */
                const __m256i a0 = has0[i] ? _mm256_loadu_si256((const __m256i *)(r0[i] + d)) : _mm256_setzero_si256();
                const __m256i a1 = has1[i] ? _mm256_loadu_si256((const __m256i *)(r1[i] + d)) : _mm256_setzero_si256();
                r[i] = _mm512_permutexvar_epi16(inter, _mm512_inserti64x4(_mm512_castsi256_si512(a0), a1, 1));
            }
            transpose16(r);
            for (int c = 0; c < 16; ++c)
                _mm512_storeu_si512(vp + (d + c) * SDPA__AMX_VP_LD + tb, r[c]);
        }
    }
}

/* 2^y for y <= 128 (below -150 clamped: results below 2^-149 are 0; y = -inf gives 0): n =
 * round(y), 2^(y - n) by its Taylor polynomial of degree 6 in (y - n) ln 2 (relative error at
 * most 2.4e-7, below 2^-21, on [-1/2, 1/2] in float32 Horner steps), scaled by 2^n (VSCALEFPS). The softmax's arguments are at most
 * SDPA__AMX_LAZY_MAX log2(e) (plus rounding) in every lane that is not flagged bad. */
AI __m512 exp2_16(__m512 y) {
    static const float c[7] = {1.000000000e+00f, 6.931471806e-01f, 2.402265070e-01f, 5.550410866e-02f, 9.618129108e-03f, 1.333355815e-03f, 1.540353039e-04f};
    y = _mm512_max_ps(y, _mm512_set1_ps(-150.0f));
    const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(c[6]);
    for (int k = 5; k >= 0; --k)
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
    return _mm512_scalef_ps(p, n);
}

void sdpa__amx_softmax_pack(const float *t, int64_t n, int64_t w, int64_t ld, float scale, float *m, float *alpha,
                            float *tsum, int32_t *bad, uint32_t *pp, int64_t ldp) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    const __m512 sc = _mm512_set1_ps(scale), thr = _mm512_set1_ps(SDPA__AMX_LAZY_MAX);
    const float l2e = 1.44269504088896341f;
    const __m512 c1 = _mm512_set1_ps(scale * l2e); /* exp(scale t - u) = 2^(t scale log2(e) - u log2(e)) */
    /* word l of the low half of a VCVTNE2PS2BF16 result, then word l of its high half */
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int64_t np = (n + 1) / 2, npr = (np + 15) / 16 * 16;
    for (int64_t l = 0; l < w; l += 16) {
        /* max and min of the raw scores (scale > 0: scale rmx is the scaled max), and z = sum of
         * 0 * t, which is NaN iff some t is NaN or infinite */
        __m512 rmx = ninf, rmn = _mm512_set1_ps(INFINITY), z = _mm512_setzero_ps();
        for (int64_t j = 0; j < n; ++j) {
            const __m512 x = _mm512_loadu_ps(t + j * ld + l);
            rmx = _mm512_max_ps(rmx, x);
            rmn = _mm512_min_ps(rmn, x);
            z = _mm512_fmadd_ps(x, _mm512_setzero_ps(), z);
        }
        const __m512 mx = _mm512_mul_ps(sc, rmx);
        /* a scaled score that overflowed (either sign) */
        const __mmask16 bm = not_finite16(z) | not_finite16(mx) | not_finite16(_mm512_mul_ps(sc, rmn));
        const __m512i old = _mm512_loadu_si512(bad + l);
        _mm512_storeu_si512(bad + l, _mm512_mask_mov_epi32(old, bm, _mm512_set1_epi32(-1)));
        /* the reference point moves only where the tile's max exceeds it by more than the
         * threshold (or it was -inf): elsewhere alpha is exactly 1 */
        const __m512 mo = _mm512_loadu_ps(m + l);
        const __mmask16 move = _mm512_cmp_ps_mask(mx, _mm512_add_ps(mo, thr), _CMP_GT_OQ);
        const __m512 mn = _mm512_mask_blend_ps(move, mo, _mm512_max_ps(mx, mo));
        const __m512 u = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
        _mm512_storeu_ps(alpha + l, _mm512_mask_blend_ps(move, one, exp16(_mm512_sub_ps(mo, u))));
        const __m512 nu2 = _mm512_mul_ps(u, _mm512_set1_ps(-l2e));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t tp = 0; tp < np; ++tp) {
            const __m512 e0 = exp2_16(_mm512_fmadd_ps(_mm512_loadu_ps(t + 2 * tp * ld + l), c1, nu2));
            sum = _mm512_add_ps(sum, e0);
            __m512 e1 = _mm512_setzero_ps();
            if (2 * tp + 1 < n) {
                e1 = exp2_16(_mm512_fmadd_ps(_mm512_loadu_ps(t + (2 * tp + 1) * ld + l), c1, nu2));
                sum = _mm512_add_ps(sum, e1);
            }
            const __m512i pr = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
            _mm512_storeu_si512(pp + tp * ldp + l, pr);
        }
        for (int64_t tp = np; tp < npr; ++tp)
            _mm512_storeu_si512(pp + tp * ldp + l, _mm512_setzero_si512());
        _mm512_storeu_ps(tsum + l, sum);
        _mm512_storeu_ps(m + l, mn);
    }
}
