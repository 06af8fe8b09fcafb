/* aarch64 Advanced SIMD (NEON) micro-kernels: the f32 FMA counterparts of microkernel_avx2.c,
 * with the same structure and tile sizes (SDPA__TILE_Q / SDPA__TILE_K of the call context, 16
 * lanes per lanes-tile chunk, 6 x 16 register tiles in lanes_gemm, 8 keys per step in the
 * decode scores). Compiled only for aarch64 (meson.build); ASIMD is part of armv8-a, and
 * dispatch.c still registers the table only where getauxval(AT_HWCAP) reports it. Called only
 * through a call context (context.c): nothing here tests an ISA or a dtype at run time (the DT
 * of the rows kernels is a constant of each instantiation).
 *
 * exp and tanh are microkernel_avx2.c's (same reduction, same polynomials): x clamped to
 * [-88, 88], x = n ln2 + r (Cody-Waite), e^r by its degree-7 Taylor polynomial, 2^n in the
 * exponent field; n by FRINTN (to nearest even, as _MM_FROUND_TO_NEAREST_INT), so inputs
 * <= -87.7 give exactly 0 and -inf (a blocked score) gives 0. Results are within a few float32
 * ulp of the portable path, not equal to it (other exp, FMA contraction): the documented f32
 * bound holds (tests/test_kernels.c, test_dtypes_kernels.c).
 *
 * K/V rows as stored: f32 by LDR, f16 widened in the register by FCVTL / FCVTL2 (exact), bf16
 * by SHLL #16; 0.6: q8_0 by SXTL + SCVTF and one FMUL by the block's d (ggml's d * q), FP8 E5M2
 * as the top byte of a binary16 (USHLL #8, FCVTL), E4M3FN moved into a binary16 (exponent bias
 * 15 for 7: FCVTL then times 2^8, exact; NaN s.1111.111 made the binary16 quiet NaN first, which
 * FCVTL and FMUL keep: convert.h's 0x7FC00000 with the sign). The products and sums then run as
 * for f32, in the same order, so the stored-K/V column of each dtype equals, bit for bit, the f32
 * member on the widened rows (microkernel.h). */
#include "microkernel.h"

#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI float32x4_t exp4(float32x4_t x) {
    x = vmaxq_f32(x, vdupq_n_f32(-88.0f)); /* NaN stays NaN (FMAX), as with expf; caught as bad elsewhere */
    x = vminq_f32(x, vdupq_n_f32(88.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

AI float32x4_t tanh4(float32x4_t x) {
    const float32x4_t ax = vabsq_f32(x);
    const float32x4_t e = exp4(vmulq_f32(ax, vdupq_n_f32(-2.0f)));
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t big = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
    const float32x4_t z = vmulq_f32(ax, ax);
    float32x4_t s = vdupq_n_f32(-1382.0f / 155925.0f);
    s = vfmaq_f32(vdupq_n_f32(62.0f / 2835.0f), s, z);
    s = vfmaq_f32(vdupq_n_f32(-17.0f / 315.0f), s, z);
    s = vfmaq_f32(vdupq_n_f32(2.0f / 15.0f), s, z);
    s = vfmaq_f32(vdupq_n_f32(-1.0f / 3.0f), s, z);
    s = vfmaq_f32(ax, vmulq_f32(s, z), ax);
    float32x4_t t = vbslq_f32(vcltq_f32(ax, vdupq_n_f32(0.3f)), s, big);
    t = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t),
                                        vandq_u32(vreinterpretq_u32_f32(x), vdupq_n_u32(0x80000000u))));
    return vbslq_f32(vceqq_f32(x, x), t, x); /* NaN stays NaN */
}

/* Lanes where x is NaN or +-Inf: all bits set (|x| <= FLT_MAX is false for both). */
AI uint32x4_t not_finite4(float32x4_t x) { return vmvnq_u32(vcaleq_f32(x, vdupq_n_f32(FLT_MAX))); }

/* ---------------------------------------------------------------- lanes */

/* mr rows x 16 lanes, mr <= 6: 24 accumulators, four B vectors, FMLA by element of a scalar. */
AI void lg_tile(int mr, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b, int64_t ld,
                float *c, const float *beta) {
    float32x4_t c0[6], c1[6], c2[6], c3[6];
#pragma GCC unroll 6
    for (int r = 0; r < 6; ++r)
        c0[r] = c1[r] = c2[r] = c3[r] = vdupq_n_f32(0.0f);
    for (int64_t k = 0; k < kk; ++k) {
        const float *bk = b + k * ld;
        const float32x4_t b0 = vld1q_f32(bk), b1 = vld1q_f32(bk + 4), b2 = vld1q_f32(bk + 8), b3 = vld1q_f32(bk + 12);
        const float *ak = a + k * aks;
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                const float x = ak[r * ars];
                c0[r] = vfmaq_n_f32(c0[r], b0, x);
                c1[r] = vfmaq_n_f32(c1[r], b1, x);
                c2[r] = vfmaq_n_f32(c2[r], b2, x);
                c3[r] = vfmaq_n_f32(c3[r], b3, x);
            }
        }
    }
    if (beta != NULL) {
        const float32x4_t g0 = vld1q_f32(beta), g1 = vld1q_f32(beta + 4), g2 = vld1q_f32(beta + 8),
                          g3 = vld1q_f32(beta + 12);
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                float *cr = c + r * ld;
                vst1q_f32(cr, vfmaq_f32(c0[r], g0, vld1q_f32(cr)));
                vst1q_f32(cr + 4, vfmaq_f32(c1[r], g1, vld1q_f32(cr + 4)));
                vst1q_f32(cr + 8, vfmaq_f32(c2[r], g2, vld1q_f32(cr + 8)));
                vst1q_f32(cr + 12, vfmaq_f32(c3[r], g3, vld1q_f32(cr + 12)));
            }
        }
    } else {
#pragma GCC unroll 6
        for (int r = 0; r < 6; ++r) {
            if (r < mr) {
                float *cr = c + r * ld;
                vst1q_f32(cr, c0[r]);
                vst1q_f32(cr + 4, c1[r]);
                vst1q_f32(cr + 8, c2[r]);
                vst1q_f32(cr + 12, c3[r]);
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

static void n_lanes_gemm(int64_t m, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
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

static void n_softcap(float *x, int64_t n, float cap) {
    const float32x4_t c = vdupq_n_f32(cap);
    int64_t t = 0;
    /* + (v - v): NaN where v is not finite, +0 otherwise. */
    for (; t + 4 <= n; t += 4) {
        const float32x4_t v = vld1q_f32(x + t);
        vst1q_f32(x + t, vaddq_f32(vmulq_f32(c, tanh4(v)), vsubq_f32(v, v)));
    }
    if (t < n) {
        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(tmp, x + t, (size_t)(n - t) * sizeof(float));
        const float32x4_t v = vld1q_f32(tmp);
        vst1q_f32(tmp, vaddq_f32(vmulq_f32(c, tanh4(v)), vsubq_f32(v, v)));
        memcpy(x + t, tmp, (size_t)(n - t) * sizeof(float));
    }
}

static void n_lanes_range_mask(float *t, int64_t n, int64_t nl, int64_t ld, int32_t j0, const int32_t *lo,
                               const int32_t *hi, int32_t *bad) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int64_t l = 0; l < nl; l += 4) {
        const int32x4_t lom1 = vsubq_s32(vld1q_s32(lo + l), vdupq_n_s32(1));
        const int32x4_t hiv = vld1q_s32(hi + l);
        uint32x4_t bv = vreinterpretq_u32_s32(vld1q_s32(bad + l));
        for (int64_t j = 0; j < n; ++j) {
            const int32x4_t key = vdupq_n_s32(j0 + (int32_t)j);
            const uint32x4_t ok = vandq_u32(vcgtq_s32(key, lom1), vcgtq_s32(hiv, key));
            float *row = t + j * ld + l;
            const float32x4_t x = vld1q_f32(row);
            bv = vorrq_u32(bv, vandq_u32(ok, not_finite4(x)));
            vst1q_f32(row, vbslq_f32(ok, x, ninf));
        }
        vst1q_s32(bad + l, vreinterpretq_s32_u32(bv));
    }
}

static void n_lanes_softmax(float *t, int64_t n, int64_t nl, int64_t ld, float *m, float *alpha, float *tsum,
                            int32_t *bad) {
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int64_t l = 0; l < nl; l += 4) {
        /* FMAXNM: a NaN element does not become the maximum (as the portable x > mx test);
         * it is reported through bad */
        float32x4_t mx = ninf;
        if (bad != NULL) {
            uint32x4_t bv = vdupq_n_u32(0);
            for (int64_t j = 0; j < n; ++j) {
                const float32x4_t x = vld1q_f32(t + j * ld + l);
                mx = vmaxnmq_f32(mx, x);
                bv = vorrq_u32(bv, not_finite4(x));
            }
            const uint32x4_t old = vreinterpretq_u32_s32(vld1q_s32(bad + l));
            vst1q_s32(bad + l, vreinterpretq_s32_u32(vorrq_u32(old, bv)));
        } else {
            for (int64_t j = 0; j < n; ++j)
                mx = vmaxnmq_f32(mx, vld1q_f32(t + j * ld + l));
        }
        const float32x4_t mo = vld1q_f32(m + l);
        const float32x4_t mn = vmaxnmq_f32(mx, mo);
        const float32x4_t u = vbslq_f32(vceqq_f32(mn, ninf), vdupq_n_f32(0.0f), mn); /* -inf -> 0 */
        vst1q_f32(alpha + l, exp4(vsubq_f32(mo, u)));
        float32x4_t sum = vdupq_n_f32(0.0f);
        for (int64_t j = 0; j < n; ++j) {
            float *row = t + j * ld + l;
            const float32x4_t e = exp4(vsubq_f32(vld1q_f32(row), u));
            vst1q_f32(row, e);
            sum = vaddq_f32(sum, e);
        }
        vst1q_f32(tsum + l, sum);
        vst1q_f32(m + l, mn);
    }
}

/* ----------------------------------------------------------------- rows */

/* The rows kernels read K/V rows as stored; DT is the row's sdpa_dtype (a constant in each
 * instantiation). Row offsets (strides) count the view's unit: elements, or q8_0 blocks of 34
 * bytes. The loaders take (row base, row offset, element e): for f32 / f16 / bf16 / FP8 that is
 * the element at row offset + e (the address expressions of the code before the 8-bit dtypes:
 * the f32 / f16 / bf16 loops compile to the same instructions); for q8_0 element e of the row,
 * in block e / 32 (e, and every count of
 * elements, a multiple of 8 there: ne and nev are multiples of 32, so the e tails are dead code
 * for q8_0 but are compiled for it). */
AI ptrdiff_t unit(const int DT) {
    return DT == SDPA_DTYPE_F32    ? 4
           : DT == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_BYTES
           : DT >= SDPA_DTYPE_FP8_E4M3 ? 1
                                       : 2;
}
AI const void *at(const int DT, const void *base, ptrdiff_t off) { return (const char *)base + off * unit(DT); }
AI bool is_fp8(const int DT) { return DT == SDPA_DTYPE_FP8_E4M3 || DT == SDPA_DTYPE_FP8_E5M2; }
/* q8_0: the block of element e of the row at base + roff blocks (the row's address apart: it
 * stays in a register across e), and e's int8 within it. */
AI const char *q8blk(const void *base, ptrdiff_t roff, ptrdiff_t e) {
    return (const char *)base + roff * SDPA__Q8_0_BYTES + (e >> 5) * SDPA__Q8_0_BYTES;
}
AI const int8_t *q8qs(const char *blk, ptrdiff_t e) { return (const int8_t *)(const void *)(blk + 2 + (e & 31)); }
/* The block's d, widened exactly by FCVT (a NaN quiet with its payload, as sdpa__q8_0_d). */
AI float q8d(const char *blk) {
    __fp16 h;
    memcpy(&h, blk, sizeof h);
    return (float)h;
}
/* 8 int8 at p times d: lo = elements 0..3, hi = 4..7 (ggml's (float)q * d, one FMUL). */
AI void q8x4x2(int16x8_t q, float d, float32x4_t *lo, float32x4_t *hi) {
    *lo = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d);
    *hi = vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(q)), d);
}
AI void q8x8(const int8_t *p, float d, float32x4_t *lo, float32x4_t *hi) { q8x4x2(vmovl_s8(vld1_s8(p)), d, lo, hi); }
/* The 32 int8 of a block (at p) times d, in k[0..7]. */
AI void q8x32(const int8_t *p, float d, float32x4_t *k) {
    const int8x16_t b0 = vld1q_s8(p), b1 = vld1q_s8(p + 16);
    q8x4x2(vmovl_s8(vget_low_s8(b0)), d, &k[0], &k[1]);
    q8x4x2(vmovl_high_s8(b0), d, &k[2], &k[3]);
    q8x4x2(vmovl_s8(vget_low_s8(b1)), d, &k[4], &k[5]);
    q8x4x2(vmovl_high_s8(b1), d, &k[6], &k[7]);
}
/* 8 FP8 bytes as binary16 encodings whose FCVTL is the value (E4M3: times 2^8 after it). */
AI uint16x8_t fp8_h(const int DT, uint8x8_t b) {
    if (DT == SDPA_DTYPE_FP8_E5M2)
        return vshll_n_u8(b, 8);
    const uint8x8_t mag = vand_u8(b, vdup_n_u8(0x7F));
    const uint16x8_t nan = vreinterpretq_u16_s16(vmovl_s8(vreinterpret_s8_u8(vceq_u8(mag, vdup_n_u8(0x7F)))));
    const uint16x8_t m = vbslq_u16(nan, vdupq_n_u16(0x7E00), vshll_n_u8(mag, 7));
    return vbslq_u16(vdupq_n_u16(0x8000), vshll_n_u8(b, 8), m); /* sign from the byte's bit 7 */
}
AI float32x4_t fp8_f(const int DT, float16x4_t h) {
    const float32x4_t f = vcvt_f32_f16(h);
    return DT == SDPA_DTYPE_FP8_E4M3 ? vmulq_n_f32(f, 256.0f) : f;
}
AI float32x4_t fp8_f_high(const int DT, float16x8_t h) {
    const float32x4_t f = vcvt_high_f32_f16(h);
    return DT == SDPA_DTYPE_FP8_E4M3 ? vmulq_n_f32(f, 256.0f) : f;
}
/* Eight elements widened: lo = elements 0..3, hi = 4..7. */
AI void ld8(const int DT, const void *base, ptrdiff_t roff, ptrdiff_t e, float32x4_t *lo, float32x4_t *hi) {
    if (DT == SDPA_DTYPE_Q8_0) {
        const char *blk = q8blk(base, roff, e);
        q8x8(q8qs(blk, e), q8d(blk), lo, hi);
        return;
    }
    const void *p = at(DT, base, roff + e);
    if (is_fp8(DT)) {
        const float16x8_t h = vreinterpretq_f16_u16(fp8_h(DT, vld1_u8((const uint8_t *)p)));
        *lo = fp8_f(DT, vget_low_f16(h));
        *hi = fp8_f_high(DT, h);
        return;
    }
    if (DT == SDPA_DTYPE_F32) {
        *lo = vld1q_f32((const float *)p);
        *hi = vld1q_f32((const float *)p + 4);
        return;
    }
    const uint16x8_t h = vld1q_u16((const uint16_t *)p);
    if (DT == SDPA_DTYPE_F16) {
        const float16x8_t f = vreinterpretq_f16_u16(h);
        *lo = vcvt_f32_f16(vget_low_f16(f));
        *hi = vcvt_high_f32_f16(f);
    } else {
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}
/* Four elements widened (8-bit rows: exactly 4 bytes read). */
AI float32x4_t ld4(const int DT, const void *base, ptrdiff_t roff, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0 || is_fp8(DT)) {
        const char *blk = DT == SDPA_DTYPE_Q8_0 ? q8blk(base, roff, e) : NULL;
        const void *p = DT == SDPA_DTYPE_Q8_0 ? (const void *)q8qs(blk, e) : at(DT, base, roff + e);
        uint32_t w;
        memcpy(&w, p, sizeof w);
        const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(w));
        if (DT == SDPA_DTYPE_Q8_0)
            return vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b))))), q8d(blk));
        return fp8_f(DT, vget_low_f16(vreinterpretq_f16_u16(fp8_h(DT, b))));
    }
    const void *p = at(DT, base, roff + e);
    if (DT == SDPA_DTYPE_F32)
        return vld1q_f32((const float *)p);
    const uint16x4_t h = vld1_u16((const uint16_t *)p);
    if (DT == SDPA_DTYPE_F16)
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}
AI float ld1(const int DT, const void *base, ptrdiff_t roff, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_Q8_0) {
        const char *blk = q8blk(base, roff, e);
        return (float)*q8qs(blk, e) * q8d(blk);
    }
    const void *p = at(DT, base, roff + e);
    if (DT == SDPA_DTYPE_FP8_E4M3)
        return sdpa__e4m3_to_f32(*(const uint8_t *)p);
    if (DT == SDPA_DTYPE_FP8_E5M2)
        return sdpa__e5m2_to_f32(*(const uint8_t *)p);
    if (DT == SDPA_DTYPE_F32)
        return *(const float *)p;
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return DT == SDPA_DTYPE_F16 ? vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0)
                                : sdpa__bf16_to_f32(h);
}

/* Scores of 8 keys per step: one accumulator per key (8 independent FMA chains), e in steps of
 * 8 (two vectors of q); the 8 sums by pairwise adds (FADDP), then the e tail. q8_0: a block (32
 * elements, 8 vectors of q) per step, a key's whole block at a time (its d widened once): each
 * accumulator takes the same products in the same order as on the f32 rows. */
AI void dot_rows_t(const int DT, const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s) {
    const int64_t ev = ne & ~(int64_t)7;
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const void *kr = at(DT, k, t * ks);
        float32x4_t a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            a[u] = vdupq_n_f32(0.0f);
        if (DT == SDPA_DTYPE_Q8_0) {
            for (int64_t e = 0; e < ev; e += 32) {
                float32x4_t qv[8];
#pragma GCC unroll 8
                for (int c = 0; c < 8; ++c)
                    qv[c] = vld1q_f32(q + e + 4 * c);
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) {
                    const char *blk = q8blk(kr, u * ks, e);
                    float32x4_t kv[8];
                    q8x32(q8qs(blk, 0), q8d(blk), kv);
#pragma GCC unroll 8
                    for (int c = 0; c < 8; ++c)
                        a[u] = vfmaq_f32(a[u], qv[c], kv[c]);
                    /* one key's block at a time: without this fence GCC 12 hoists the next keys'
                     * loads and conversions over it and spills vectors to the stack */
                    __asm__ volatile("" ::: "memory");
                }
            }
        } else {
            for (int64_t e = 0; e < ev; e += 8) {
                const float32x4_t q0 = vld1q_f32(q + e), q1 = vld1q_f32(q + e + 4);
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) {
                    float32x4_t k0, k1;
                    ld8(DT, kr, u * ks, e, &k0, &k1);
                    a[u] = vfmaq_f32(a[u], q0, k0);
                    a[u] = vfmaq_f32(a[u], q1, k1);
                }
            }
        }
        const float32x4_t p01 = vpaddq_f32(a[0], a[1]), p23 = vpaddq_f32(a[2], a[3]);
        const float32x4_t p45 = vpaddq_f32(a[4], a[5]), p67 = vpaddq_f32(a[6], a[7]);
        float32x4_t s0 = vpaddq_f32(p01, p23), s1 = vpaddq_f32(p45, p67);
        if (ev < ne) {
            float tail[8];
            for (int u = 0; u < 8; ++u) {
                float x = 0.0f;
                for (int64_t e = ev; e < ne; ++e)
                    x += q[e] * ld1(DT, kr, u * ks, e);
                tail[u] = x;
            }
            s0 = vaddq_f32(s0, vld1q_f32(tail));
            s1 = vaddq_f32(s1, vld1q_f32(tail + 4));
        }
        vst1q_f32(s + t, s0);
        vst1q_f32(s + t + 4, s1);
    }
    for (; t < n; ++t) {
        const void *kr = at(DT, k, t * ks);
        float32x4_t a = vdupq_n_f32(0.0f);
        for (int64_t e = 0; e < ev; e += 8) {
            float32x4_t k0, k1;
            ld8(DT, kr, 0, e, &k0, &k1);
            a = vfmaq_f32(a, vld1q_f32(q + e), k0);
            a = vfmaq_f32(a, vld1q_f32(q + e + 4), k1);
        }
        float x = vaddvq_f32(a), tail = 0.0f;
        for (int64_t e = ev; e < ne; ++e)
            tail += q[e] * ld1(DT, kr, 0, e);
        s[t] = x + tail;
    }
}

static void n_dot_rows(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s) {
    dot_rows_t(SDPA_DTYPE_F32, q, ne, k, ks, n, s);
}

static float n_row_max(const float *s, int64_t n, int32_t *bad) {
    float32x4_t mx = vdupq_n_f32(-INFINITY);
    uint32x4_t bv = vdupq_n_u32(0);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float32x4_t x = vld1q_f32(s + t);
        mx = vmaxnmq_f32(mx, x);
        bv = vorrq_u32(bv, not_finite4(x));
    }
    float r = vmaxnmvq_f32(mx);
    bool fin = vmaxvq_u32(bv) == 0;
    for (; t < n; ++t) {
        r = s[t] > r ? s[t] : r;
        fin = fin && isfinite(s[t]);
    }
    if (bad != NULL && !fin)
        *bad = -1;
    return r;
}

static float n_exp_sum(float *s, int64_t n, float u) {
    const float32x4_t uv = vdupq_n_f32(u);
    float32x4_t sum = vdupq_n_f32(0.0f);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(s + t), uv));
        vst1q_f32(s + t, e);
        sum = vaddq_f32(sum, e);
    }
    if (t < n) {
        /* the tail in a vector whose unused lanes hold -inf: exp gives 0 there */
        float tmp[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(tmp, s + t, (size_t)(n - t) * sizeof(float));
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(tmp), uv));
        vst1q_f32(tmp, e);
        memcpy(s + t, tmp, (size_t)(n - t) * sizeof(float));
        sum = vaddq_f32(sum, e);
    }
    return vaddvq_f32(sum);
}

/* o = alpha * o + sum_t p[idx[t]] * v[idx[t]]: 32 outputs per step (8 accumulators), then 4,
 * then single elements. */
AI void axpy_rows_t(const int DT, float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,
                    int64_t cnt, const void *v, ptrdiff_t vs) {
    int64_t d = 0;
    for (; d + 32 <= nev; d += 32) {
        float32x4_t a[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            a[u] = vmulq_n_f32(vld1q_f32(o + d + 4 * u), alpha);
        for (int64_t t = 0; t < cnt; ++t) {
            const float w = p[idx[t]];
            /* q8_0: the block of element d (d a multiple of 32: one block per pass) */
            const char *vr = DT == SDPA_DTYPE_Q8_0 ? q8blk(v, (ptrdiff_t)idx[t] * vs, d)
                                                   : (const char *)at(DT, v, (ptrdiff_t)idx[t] * vs + d);
            /* the row's address in a register of its own: its loads then take base + immediate
             * addressing and pair into LDP (GCC otherwise folds the row offset into each load's
             * register-offset form and adds an address register per vector: 29 instructions
             * per key, now 18 for f32). 32 outputs, not 64: 16 accumulators made GCC 12 spill
             * a loaded vector to the stack in this loop. */
            __asm__("" : "+r"(vr));
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                float32x4_t v0, v1;
                ld8(DT, vr, 0, 8 * u, &v0, &v1);
                a[2 * u] = vfmaq_n_f32(a[2 * u], v0, w);
                a[2 * u + 1] = vfmaq_n_f32(a[2 * u + 1], v1, w);
            }
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            vst1q_f32(o + d + 4 * u, a[u]);
    }
    for (; d + 4 <= nev; d += 4) {
        float32x4_t a0 = vmulq_n_f32(vld1q_f32(o + d), alpha);
        for (int64_t t = 0; t < cnt; ++t)
            a0 = vfmaq_n_f32(a0, ld4(DT, v, (ptrdiff_t)idx[t] * vs, d), p[idx[t]]);
        vst1q_f32(o + d, a0);
    }
    for (; d < nev; ++d) {
        float x = alpha * o[d];
        for (int64_t t = 0; t < cnt; ++t)
            x = fmaf(p[idx[t]], ld1(DT, v, (ptrdiff_t)idx[t] * vs, d), x);
        o[d] = x;
    }
}

static void n_axpy_rows(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                        const float *v, ptrdiff_t vs) {
    axpy_rows_t(SDPA_DTYPE_F32, o, nev, alpha, p, idx, cnt, v, vs);
}

#define N_ROWS(SUF, DT)                                                                                          \
    static void n_dot_rows_##SUF(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s,  \
                                 const void *pf) {                                                               \
        (void)pf; /* no software prefetch in this set */                                                        \
        dot_rows_t(DT, q, ne, k, ks, n, s);                                                                      \
    }                                                                                                            \
    static void n_axpy_rows_##SUF(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,       \
                                  int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {                   \
        (void)pf;                                                                                                \
        axpy_rows_t(DT, o, nev, alpha, p, idx, cnt, v, vs);                                                      \
    }
N_ROWS(f32, SDPA_DTYPE_F32)
N_ROWS(f16, SDPA_DTYPE_F16)
N_ROWS(bf16, SDPA_DTYPE_BF16)
N_ROWS(q8_0, SDPA_DTYPE_Q8_0)
N_ROWS(e4m3, SDPA_DTYPE_FP8_E4M3)
N_ROWS(e5m2, SDPA_DTYPE_FP8_E5M2)

const sdpa__mk_kv sdpa__mk_kv_neon[SDPA__KV_DTYPES] = {
    [SDPA_DTYPE_F32] = {n_dot_rows_f32, n_axpy_rows_f32, NULL, NULL},
    [SDPA_DTYPE_F16] = {n_dot_rows_f16, n_axpy_rows_f16, NULL, NULL},
    [SDPA_DTYPE_BF16] = {n_dot_rows_bf16, n_axpy_rows_bf16, NULL, NULL},
    [SDPA_DTYPE_Q8_0] = {n_dot_rows_q8_0, n_axpy_rows_q8_0, NULL, NULL},
    [SDPA_DTYPE_FP8_E4M3] = {n_dot_rows_e4m3, n_axpy_rows_e4m3, NULL, NULL},
    [SDPA_DTYPE_FP8_E5M2] = {n_dot_rows_e5m2, n_axpy_rows_e5m2, NULL, NULL},
};

static bool n_all_finite(const float *x, int64_t n) {
    const uint32x4_t ex = vdupq_n_u32(0x7f800000u);
    uint32x4_t acc = vdupq_n_u32(0);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4)
        acc = vorrq_u32(acc, vceqq_u32(vandq_u32(vld1q_u32((const uint32_t *)(const void *)(x + t)), ex), ex));
    bool fin = vmaxvq_u32(acc) == 0;
    for (; t < n; ++t)
        fin = fin && isfinite(x[t]);
    return fin;
}

/* ------------------------------------------------------------ transposes */

/* r[0..3] (rows) -> columns, in place. */
AI void transpose4(float32x4_t *r) {
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* t[c * ld + r] = scale * x[r * rs + c] for r < nrows, c < ncols: a block transpose in 4x4
 * register tiles. Packing Q into lanes and unpacking the output are both this transpose. */
static void transpose_scaled(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                             ptrdiff_t ld) {
    int64_t r0 = 0;
    for (; r0 + 4 <= nrows; r0 += 4) {
        int64_t c0 = 0;
        for (; c0 + 4 <= ncols; c0 += 4) {
            float32x4_t v[4];
            for (int u = 0; u < 4; ++u)
                v[u] = vld1q_f32(x + (r0 + u) * rs + c0);
            transpose4(v);
            for (int u = 0; u < 4; ++u)
                vst1q_f32(t + (c0 + u) * ld + r0, vmulq_n_f32(v[u], scale));
        }
        for (; c0 < ncols; ++c0)
            for (int64_t r = r0; r < r0 + 4; ++r)
                t[c0 * ld + r] = scale * x[r * rs + c0];
    }
    for (; r0 < nrows; ++r0)
        for (int64_t c = 0; c < ncols; ++c)
            t[c * ld + r0] = scale * x[r0 * rs + c];
}

static void n_pack_lanes(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                         int64_t ld) {
    transpose_scaled(x, rs, nrows, ncols, scale, t, (ptrdiff_t)ld);
}

/* x[r * rs + c] = t[c * ld + r]: the same transpose the other way (scale 1 is exact). */
static void n_unpack_lanes(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs) {
    transpose_scaled(t, (ptrdiff_t)ld, ncols, nrows, 1.0f, x, rs);
}

const sdpa__mk sdpa__mk_neon = {
    "tiled-neon", "decode-neon", "decode-split-neon",
    n_lanes_gemm, n_softcap, n_lanes_range_mask, n_lanes_softmax, SDPA__LANES,
    n_dot_rows, n_row_max, n_exp_sum, n_axpy_rows, n_all_finite,
    n_pack_lanes, n_unpack_lanes,
    NULL, NULL, /* no multi-row decode members: kernel_decode loops over the rows */
    NULL,       /* ALiBi: rules.c's loop */
};
