/* aarch64 Advanced SIMD (NEON) conversions of the storage dtypes; compiled only for aarch64
 * (meson.build) and called only where the CPU has ASIMD (dispatch.c, sdpa__convert_exact).
 * Same results, bit for bit, as the portable table (convert.h; tests/test_convert.c checks all
 * 65536 encodings and the rounding cases):
 *  - widen f16: FCVTL / FCVTL2 (exact; a signalling NaN comes back quiet with its payload, as
 *    convert.h says; FPCR.DN, the default-NaN mode, would replace NaN payloads: Linux starts
 *    every program with it clear and the library never sets it). bf16: SHLL #16, the shift.
 *  - narrow f16 and bf16: integer lanes computing the scalar rules of convert.h (FCVTN would
 *    round in FPCR's mode, which the caller may have changed).
 *  - finite scans: the exponent-field compare, OR-accumulated (no early exit).
 *  - the 8-bit K/V dtypes (q8_0, FP8 E4M3FN / E5M2): the portable members.
 * Unit stride runs 8 elements per step; other strides and tails use the scalar rules. */
#include "convert.h"

#include <arm_neon.h>

#define AI static inline __attribute__((always_inline))

/* ---- widen ---- */

AI void widen8_f16(const uint16_t *src, float *dst) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src));
    vst1q_f32(dst, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(dst + 4, vcvt_high_f32_f16(h));
}

static void n_widen_f16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 8 <= n; t += 8)
            widen8_f16(src + t, dst + t);
    for (; t < n; ++t)
        dst[t] = sdpa__f16_to_f32(src[t * stride]);
}

static void n_widen_bf16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 8 <= n; t += 8) {
            const uint16x8_t h = vld1q_u16(src + t);
            vst1q_f32(dst + t, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
            vst1q_f32(dst + t + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
        }
    for (; t < n; ++t)
        dst[t] = sdpa__bf16_to_f32(src[t * stride]);
}

/* ---- narrow: convert.h's sdpa__f32_to_f16 / sdpa__f32_to_bf16 on four lanes ---- */

AI uint32x4_t sel(uint32x4_t mask, uint32x4_t a, uint32x4_t b) { return vbslq_u32(mask, a, b); }

AI uint16x4_t f32_to_f16x4(float32x4_t x) {
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t sign = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x8000u));
    const uint32x4_t a = vandq_u32(u, vdupq_n_u32(0x7FFFFFFFu));
    const uint32x4_t one = vdupq_n_u32(1u);
    /* NaN: quiet, the top 10 payload bits */
    const uint32x4_t nan = vorrq_u32(vdupq_n_u32(0x7E00u), vandq_u32(vshrq_n_u32(a, 13), vdupq_n_u32(0x3FFu)));
    /* normal f16: rebias (exponent - 112), round 13 bits to nearest even */
    const uint32x4_t r = vsubq_u32(a, vdupq_n_u32(0x38000000u));
    const uint32x4_t normal =
        vshrq_n_u32(vaddq_u32(vaddq_u32(r, vdupq_n_u32(0xFFFu)), vandq_u32(vshrq_n_u32(r, 13), one)), 13);
    /* subnormal f16: m >> shift rounded to nearest even, shift = 126 - e in [14, 24]; lanes
     * outside that range compute garbage that the selects below drop (vshlq by a count of 32
     * or more gives 0, no trap) */
    const int32x4_t shift = vsubq_s32(vdupq_n_s32(126), vreinterpretq_s32_u32(vshrq_n_u32(a, 23)));
    const uint32x4_t m = vorrq_u32(vandq_u32(a, vdupq_n_u32(0x7FFFFFu)), vdupq_n_u32(0x800000u));
    const uint32x4_t half = vshlq_u32(one, vsubq_s32(shift, vdupq_n_s32(1)));
    const int32x4_t right = vnegq_s32(shift);
    const uint32x4_t lsb = vandq_u32(vshlq_u32(m, right), one);
    const uint32x4_t sub = vshlq_u32(vaddq_u32(vaddq_u32(m, vsubq_u32(half, one)), lsb), right);
    uint32x4_t res = sub;
    res = sel(vcltq_u32(a, vdupq_n_u32(0x33000000u)), vdupq_n_u32(0), res); /* < 2^-25: zero */
    res = sel(vcgeq_u32(a, vdupq_n_u32(0x38800000u)), normal, res);         /* >= 2^-14 */
    res = sel(vcgeq_u32(a, vdupq_n_u32(0x477FF000u)), vdupq_n_u32(0x7C00u), res); /* >= 65520: Inf */
    res = sel(vcgtq_u32(a, vdupq_n_u32(0x7F800000u)), nan, res);
    return vmovn_u32(vorrq_u32(res, sign));
}

AI uint16x4_t f32_to_bf16x4(float32x4_t x) {
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t hi = vshrq_n_u32(u, 16);
    const uint32x4_t rounded =
        vshrq_n_u32(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7FFFu)), vandq_u32(hi, vdupq_n_u32(1u))), 16);
    const uint32x4_t is_nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7FFFFFFFu)), vdupq_n_u32(0x7F800000u));
    return vmovn_u32(vbslq_u32(is_nan, vorrq_u32(hi, vdupq_n_u32(0x40u)), rounded));
}

static void n_narrow_f16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 8 <= n; t += 8)
            vst1q_u16(dst + t, vcombine_u16(f32_to_f16x4(vld1q_f32(src + t)), f32_to_f16x4(vld1q_f32(src + t + 4))));
    for (; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_f16(src[t]);
}

static void n_narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride) {
    int64_t t = 0;
    if (stride == 1)
        for (; t + 8 <= n; t += 8)
            vst1q_u16(dst + t,
                      vcombine_u16(f32_to_bf16x4(vld1q_f32(src + t)), f32_to_bf16x4(vld1q_f32(src + t + 4))));
    for (; t < n; ++t)
        dst[t * stride] = sdpa__f32_to_bf16(src[t]);
}

/* ---- finite scans ---- */

AI bool finite_t(const uint16_t *x, ptrdiff_t stride, int64_t n, uint16_t exp_mask) {
    const uint16x8_t em = vdupq_n_u16(exp_mask);
    uint16x8_t acc = vdupq_n_u16(0);
    int64_t t = 0;
    if (stride == 1)
        for (; t + 8 <= n; t += 8)
            acc = vorrq_u16(acc, vceqq_u16(vandq_u16(vld1q_u16(x + t), em), em));
    unsigned bad = vmaxvq_u16(acc) != 0;
    for (; t < n; ++t)
        bad |= (x[t * stride] & exp_mask) == exp_mask;
    return bad == 0;
}

static bool n_finite_f16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite_t(x, stride, n, 0x7C00u); }
static bool n_finite_bf16(const uint16_t *x, ptrdiff_t stride, int64_t n) { return finite_t(x, stride, n, 0x7F80u); }

/* Designated: the table grew the 8-bit members (0.6), which are the portable ones here (exact,
 * so bit for bit what any table gives; the decode kernel reads 8-bit rows in place through
 * microkernel_neon.c's columns, and these serve the loaders' f32 copies). */
const sdpa__convert sdpa__convert_neon = {
    .name = "neon",
    .widen_f16 = n_widen_f16,
    .widen_bf16 = n_widen_bf16,
    .narrow_f16 = n_narrow_f16,
    .narrow_bf16 = n_narrow_bf16,
    .finite_f16 = n_finite_f16,
    .finite_bf16 = n_finite_bf16,
    SDPA__CONVERT_8BIT_PORTABLE,
    SDPA__CONVERT_8BIT_NARROW_PORTABLE,
};
