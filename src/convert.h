/* Conversions between the storage dtypes f16 (IEEE binary16), bf16 (bfloat16) and float32.
 *
 * Semantics, identical bit for bit on every ISA (tests/test_convert.c checks all of them):
 *  - widen (f16/bf16 -> f32) is exact. bf16 -> f32 is the 16-bit shift (every payload kept,
 *    a signalling NaN stays signalling). f16 -> f32 keeps sign and payload and returns NaNs
 *    quiet (bit 22 set), as F16C's VCVTPH2PS does.
 *  - narrow (f32 -> f16/bf16) rounds to nearest, ties to even, with subnormal results where
 *    the target has them (never flushed); finite values beyond the target's range round to
 *    +-Inf (f16 from |x| >= 65520; bf16 from |x| >= 2^128 - 2^119); NaN stays NaN, quiet, sign
 *    kept, payload truncated to its top bits (F16C VCVTPS2PH and AVX512-BF16 VCVTNEPS2BF16).
 *    The MXCSR / floating-point environment is never consulted or changed.
 *  - finite scans: f16 is Inf/NaN iff its exponent field (bits 10..14) is all ones; bf16 iff
 *    bits 7..14 are (float32's top half).
 * Element arrays are uint16_t (the raw encodings). Strides are in elements; n may be 0.
 */
#ifndef SDPA_CONVERT_H
#define SDPA_CONVERT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- scalar conversions (exact; the portable table, vector tails and single elements) ---- */

static inline uint32_t sdpa__f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float sdpa__f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float sdpa__bf16_to_f32(uint16_t h) { return sdpa__f32_from_bits((uint32_t)h << 16); }

/* Branch-free (selects, which compilers vectorise in the portable rows kernels' loops: an
 * integer-to-float conversion is the only floating-point operation, and it cannot trap), and
 * no subnormal float32 operand or result anywhere, so FTZ/DAZ modes cannot change it:
 *  - exponent field 1..30: rebias the bits by 127 - 15;
 *  - 31: exponent 255, payload kept, NaN made quiet (bit 22);
 *  - 0: zero, or subnormal m * 2^-24: (float)m (exact, m < 2^10) with 24 taken off its
 *    exponent field (the result, >= 2^-24, is a float32 normal).
 * test_convert checks all 65536 encodings against the definition. */
static inline float sdpa__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7FFFu, m = h & 0x3FFu;
    /* all-ones masks (0 - (0 or 1)) instead of ?:, which GCC 12 leaves as branches here; the
     * compares are signed (em < 2^15), which SSE2 has */
    const uint32_t is_special = 0u - (uint32_t)((int32_t)em > 0x7BFF);
    const uint32_t is_sub = 0u - (uint32_t)((int32_t)em < 0x0400);
    const uint32_t nonzero_m = 0u - (uint32_t)(m != 0);
    const uint32_t normal = (em << 13) + (112u << 23);
    const uint32_t special = 0x7F800000u | (m << 13) | (nonzero_m & 0x00400000u);
    const uint32_t fm = sdpa__f32_bits((float)(int32_t)m); /* exact: m < 2^24 */
    const uint32_t sub = nonzero_m & (fm - (24u << 23));    /* m * 2^-24: the exponent minus 24 */
    const uint32_t r = (is_special & special) | (is_sub & sub) | (~(is_special | is_sub) & normal);
    return sdpa__f32_from_bits(sign | r);
}

static inline uint16_t sdpa__f32_to_bf16(float x) {
    const uint32_t u = sdpa__f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu) != 0)
        return (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet, top payload bits */
    /* Round to nearest even on the low 16 bits; a carry into the exponent is the right
     * answer (up to the next binade, or to Inf from the largest finite values). */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline uint16_t sdpa__f32_to_f16(float x) {
    const uint32_t u = sdpa__f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: quiet, top payload bits */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 = 65504 + half an ulp (a tie that rounds up to 2^16): Inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* >= 2^-14: normal f16; rebias the exponent, round 13 bits */
        const uint32_t r = a - 0x38000000u; /* exponent - 112 */
        return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
    }
    if (a < 0x33000000u) /* < 2^-25 = half the smallest subnormal (the tie rounds to 0, even) */
        return sign;
    /* Subnormal result: value / 2^-24 rounded to an integer (a carry to 1024 is the smallest
     * normal, whose encoding is 1024 too). value = (2^23 + m) * 2^(e-150). */
    const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e; /* value / 2^-24 = m >> shift, with shift in [14, 24] */
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return (uint16_t)(sign | (q + (rem > half || (rem == half && (q & 1u)))));
}

/* ---- 0.6: the 8-bit K/V dtypes (widened exactly; the writer's side is sdpa_kv_write) ----
 *  - E4M3FN (OCP; torch.float8_e4m3fn): s.eeee.mmm, bias 7, no Inf; NaN = s.1111.111, widened
 *    to the quiet NaN 0x7FC00000 with the sign kept; every other encoding is exactly a float32
 *    (normal: (8 + m) * 2^(e - 10); subnormal: m * 2^-9).
 *  - E5M2 (torch.float8_e5m2): the top byte of an IEEE binary16, widened as that binary16
 *    (sdpa__f16_to_f32: Inf kept, NaN quiet with its payload).
 *  - q8_0 (ggml block_q8_0): blocks of 34 bytes {uint16_t d (binary16); int8_t qs[32]};
 *    element i = (float)qs[i] * d (d widened exactly, one float32 multiply: ggml
 *    dequantize_row_q8_0).
 *  - A scale (FP8 k_scale / v_scale) multiplies the widened value once, in float32 (1 leaves
 *    every value as it is). Finite scans test the dequantized value (encoding and scale: a
 *    finite encoding times a large finite scale may overflow). */
#define SDPA__Q8_0_QK 32
#define SDPA__Q8_0_BYTES 34

static inline float sdpa__e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    if ((b & 0x7Fu) == 0x7Fu)
        return sdpa__f32_from_bits(sign | 0x7FC00000u);
    if (e == 0) /* m * 2^-9, exact */
        return sdpa__f32_from_bits(sign | sdpa__f32_bits((float)m * 0x1p-9f));
    return sdpa__f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

static inline float sdpa__e5m2_to_f32(uint8_t b) { return sdpa__f16_to_f32((uint16_t)((unsigned)b << 8)); }

/* ---- 0.6: the 8-bit K/V dtypes, write side (sdpa_kv_write_ex; exact, integer rounding) ----
 *  - FP8: y = x / scale (one float32 division; scale 1 leaves x as it is), then y rounded to
 *    nearest, ties to even, on its float32 bits (no double rounding, no FP environment),
 *    with subnormal results where the format has them (never flushed). |y| beyond the largest
 *    finite value (E4M3FN 448, E5M2 57344), Inf included, saturates to it with the sign kept
 *    (vLLM's scaled_fp8_conversion clamps the same way); NaN becomes the NaN s.1111111 (0x7F
 *    or 0xFF, the sign kept; E4M3FN's only NaN, and torch's E5M2 NaN); -0 stays -0.
 *  - q8_0: each block of 32 as ggml's quantize_row_q8_0_ref: amax = max |x| (float32),
 *    d = amax / 127 (float32 division), id = d != 0 ? 1 / d : 0, qs[j] = roundf(x[j] * id)
 *    (nearest, ties away from zero), d stored as binary16 rounded to nearest even
 *    (sdpa__f32_to_f16, as GGML_FP32_TO_FP16). Bit for bit ggml's for finite blocks. Where
 *    ggml's reference is undefined (a float out of int8's range converted to int8: only when
 *    1 / d overflows, amax < 127 * 2^-128, or with Inf/NaN inputs) the rule is: a product
 *    x * id beyond +-127 saturates to +-127, a NaN product gives 0 (such tiny d round to a
 *    binary16 0, so those blocks read back as zeros either way); a block holding a NaN is
 *    stored as d = NaN (0x7E00) and qs = 0; a block holding an Inf (and no NaN) as d = +Inf
 *    (ggml's d) and qs = 0 (x * 0). Both read back non-finite (the finite check catches them). */
static inline uint8_t sdpa__f32_to_fp8(float x, unsigned mbits, unsigned bias, unsigned maxcode) {
    const uint32_t u = sdpa__f32_bits(x);
    const unsigned sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN */
        return (uint8_t)(sign | 0x7Fu);
    if (a >= (144u << 23)) /* >= 2^17 (Inf too): beyond both formats' range */
        return (uint8_t)(sign | maxcode);
    unsigned code;
    if (a >= ((128u - bias) << 23)) { /* >= 2^(1 - bias): a normal FP8; rebias, round 23 - mbits bits */
        const uint32_t r = a - ((127u - bias) << 23);
        const unsigned sh = 23u - mbits;
        code = (unsigned)((r + ((1u << (sh - 1u)) - 1u) + ((r >> sh) & 1u)) >> sh);
        if (code > maxcode)
            code = maxcode;
    } else if (a <= ((127u - bias - mbits) << 23)) { /* <= half the smallest subnormal: the tie goes to 0 */
        code = 0;
    } else { /* subnormal: value / 2^(1 - bias - mbits) rounded to an integer (8 carries to the smallest normal) */
        const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 151u - bias - mbits - e;
        const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        code = (unsigned)(q + (rem > half || (rem == half && (q & 1u))));
    }
    return (uint8_t)(sign | code);
}

/* E4M3FN: 3 mantissa bits, bias 7, largest finite 0x7E (448). */
static inline uint8_t sdpa__f32_to_e4m3(float x) { return sdpa__f32_to_fp8(x, 3u, 7u, 0x7Eu); }
/* E5M2: 2 mantissa bits, bias 15, largest finite 0x7B (57344). */
static inline uint8_t sdpa__f32_to_e5m2(float x) { return sdpa__f32_to_fp8(x, 2u, 15u, 0x7Bu); }

/* One q8_0 block (34 bytes at blk, 2-byte aligned) from 32 floats, as described above. */
void sdpa__q8_0_quantize_block(const float *x, void *blk);

/* The scale d of the q8_0 block at blk (2-byte aligned). */
static inline float sdpa__q8_0_d(const void *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return sdpa__f16_to_f32(h);
}

/* ---- the per-ISA table ---- */

typedef struct sdpa__convert {
    const char *name; /* "portable", "avx2-f16c", "avx512", "avx512-bf16", "neon" */
    /* dst[t] = widen(src[t * stride]) for t < n; dst contiguous floats. Any stride (0, negative). */
    void (*widen_f16)(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst);
    void (*widen_bf16)(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst);
    /* dst[t * stride] = narrow(src[t]) for t < n; src contiguous floats; stride != 0. */
    void (*narrow_f16)(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride);
    void (*narrow_bf16)(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride);
    /* Whether x[t * stride], t < n, are all finite (no Inf/NaN encoding). */
    bool (*finite_f16)(const uint16_t *x, ptrdiff_t stride, int64_t n);
    bool (*finite_bf16)(const uint16_t *x, ptrdiff_t stride, int64_t n);
    /* 0.6, the 8-bit K/V dtypes (read side): dst[t] = widen(src[t * stride]) * scale (t < n); a
     * q8_0 row of nblocks contiguous blocks into 32 * nblocks floats; finite scans of the
     * dequantized values (scale: as widened). */
    void (*widen_e4m3)(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
    void (*widen_e5m2)(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
    void (*widen_q8_0)(const void *src, int64_t nblocks, float *dst);
    bool (*finite_e4m3)(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale);
    bool (*finite_e5m2)(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale);
    bool (*finite_q8_0)(const void *x, int64_t nblocks);
    /* 0.6, the 8-bit K/V dtypes (write side, sdpa_kv_write_ex): dst[t * stride] =
     * fp8(src[t] / scale) for t < n (stride != 0); a q8_0 row of 32 * nblocks floats into
     * nblocks contiguous blocks. */
    void (*narrow_e4m3)(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale);
    void (*narrow_e5m2)(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale);
    void (*narrow_q8_0)(const float *src, int64_t nblocks, void *dst);
} sdpa__convert;

/* The portable 8-bit members (exact; every table may share them). */
void sdpa__portable_widen_e4m3(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
void sdpa__portable_widen_e5m2(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
void sdpa__portable_widen_q8_0(const void *src, int64_t nblocks, float *dst);
bool sdpa__portable_finite_e4m3(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale);
bool sdpa__portable_finite_e5m2(const uint8_t *x, ptrdiff_t stride, int64_t n, float scale);
bool sdpa__portable_finite_q8_0(const void *x, int64_t nblocks);
#define SDPA__CONVERT_8BIT_PORTABLE                                                                               \
    .widen_e4m3 = sdpa__portable_widen_e4m3, .widen_e5m2 = sdpa__portable_widen_e5m2,                             \
    .widen_q8_0 = sdpa__portable_widen_q8_0, .finite_e4m3 = sdpa__portable_finite_e4m3,                           \
    .finite_e5m2 = sdpa__portable_finite_e5m2, .finite_q8_0 = sdpa__portable_finite_q8_0

/* The portable 8-bit narrowing members (exact; every table shares them: SIMD versions must be
 * bit-identical, tests/test_kv_write8.c). */
void sdpa__portable_narrow_e4m3(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale);
void sdpa__portable_narrow_e5m2(const float *src, int64_t n, uint8_t *dst, ptrdiff_t stride, float scale);
void sdpa__portable_narrow_q8_0(const float *src, int64_t nblocks, void *dst);
#define SDPA__CONVERT_8BIT_NARROW_PORTABLE                                                                        \
    .narrow_e4m3 = sdpa__portable_narrow_e4m3, .narrow_e5m2 = sdpa__portable_narrow_e5m2,                         \
    .narrow_q8_0 = sdpa__portable_narrow_q8_0

extern const sdpa__convert sdpa__convert_portable;     /* src/convert_portable.c */
#if defined(SDPA_HAVE_CONVERT_AVX2)
extern const sdpa__convert sdpa__convert_avx2;         /* src/convert_avx2.c (-mavx2 -mfma -mf16c) */
#endif
#if defined(SDPA_HAVE_CONVERT_AVX512)
extern const sdpa__convert sdpa__convert_avx512;       /* src/convert_avx512.c (-mavx512f/bw/vl) */
/* Its members, shared by the AVX512-BF16 table. */
void sdpa__avx512_widen_f16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst);
void sdpa__avx512_widen_bf16(const uint16_t *src, ptrdiff_t stride, int64_t n, float *dst);
void sdpa__avx512_narrow_f16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride);
void sdpa__avx512_narrow_bf16(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride);
bool sdpa__avx512_finite_f16(const uint16_t *x, ptrdiff_t stride, int64_t n);
bool sdpa__avx512_finite_bf16(const uint16_t *x, ptrdiff_t stride, int64_t n);
void sdpa__avx512_widen_e4m3(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
void sdpa__avx512_widen_e5m2(const uint8_t *src, ptrdiff_t stride, int64_t n, float *dst, float scale);
void sdpa__avx512_widen_q8_0(const void *src, int64_t nblocks, float *dst);
#endif
#if defined(SDPA_HAVE_AVX512BF16)
/* The AVX-512 table whose narrow_bf16 uses VCVTNEPS2BF16 (with a fix-up of denormal inputs,
 * which that instruction reads as zero). src/convert_avx512bf16.c (-mavx512bf16). */
extern const sdpa__convert sdpa__convert_avx512bf16;
#endif

#if defined(SDPA_HAVE_CONVERT_NEON)
/* aarch64 Advanced SIMD: widen f16 by FCVTL, bf16 by SHLL; narrow in integer lanes (the scalar
 * rules above, so neither FPCR's rounding mode nor its flush-to-zero bits can change a result).
 * src/convert_neon.c. */
extern const sdpa__convert sdpa__convert_neon;
#endif

/* ---- row helpers over any storage dtype (what the loaders call) ---- */

/* dst[r * ld + c] = src[r * rs + c * cs] widened to f32, for r < rows, c < cols; `dtype` is the
 * sdpa_dtype of src (F32: a strided copy). Strides in elements of src; any sign, 0 allowed. */
void sdpa__widen_rows(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs, int64_t rows,
                      int64_t cols, float *dst, int64_t ld);
/* 0.6: sdpa__widen_rows for every sdpa_dtype, the FP8 values times scale (ignored for the other
 * dtypes). Q8_0: strides in blocks (rs), cs must be 1 and cols a multiple of 32. */
void sdpa__widen_rows_scaled(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs,
                             int64_t rows, int64_t cols, float *dst, int64_t ld, float scale);
/* 0.6: sdpa__finite_rows for the 16-bit and 8-bit dtypes (FP8: the values times scale). */
bool sdpa__finite_rows_scaled(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs,
                              int64_t rows, int64_t cols, float scale);
/* dst[r * rs + c * cs] = src[r * ld + c] rounded to `dtype` (nearest even; F32: a copy). */
void sdpa__narrow_rows(const sdpa__convert *cv, int dtype, const float *src, int64_t ld, int64_t rows, int64_t cols,
                       void *dst, ptrdiff_t rs, ptrdiff_t cs);
/* 0.6: sdpa__narrow_rows for every sdpa_dtype, FP8 values divided by scale first (ignored for
 * the other dtypes). Q8_0: strides in blocks (rs), cs must be 1 and cols a multiple of 32. */
void sdpa__narrow_rows_scaled(const sdpa__convert *cv, int dtype, const float *src, int64_t ld, int64_t rows,
                              int64_t cols, void *dst, ptrdiff_t rs, ptrdiff_t cs, float scale);
/* Whether every src[r * rs + c * cs] (F16 or BF16 encodings) is finite. F32 data is scanned by
 * the micro-kernel tables' all_finite; passing F32 here is a bug and returns false. */
bool sdpa__finite_rows(const sdpa__convert *cv, int dtype, const void *src, ptrdiff_t rs, ptrdiff_t cs, int64_t rows,
                       int64_t cols);

/* The registry of the tables (defined in dispatch.c, with the micro-kernel registries). The
 * table of ISA level `isa` (SDPA__ISA_* of cpu.h), or NULL if this build or this CPU does
 * not have it. At AVX512 the AVX512-BF16 variant is returned when the CPU has AVX512-BF16. */
const sdpa__convert *sdpa__convert_exact(int isa);
/* The best table at level <= isa that this build and CPU can run; never NULL (loaders). */
const sdpa__convert *sdpa__convert_for_isa(int isa);

#endif
