/*
 * The 8-bit K/V caches of issue 31, read side (SDPA_DTYPE_Q8_0, _FP8_E4M3, _FP8_E5M2), white
 * box (the conversion tables, the decode micro-kernels and the ISA cap hook).
 *
 * The oracle is this file's own reading of the formats, written from their documentation and
 * not from the library's code:
 *  - ggml block_q8_0 (ggml-common.h: `typedef struct { ggml_half d; int8_t qs[QK8_0]; }
 *    block_q8_0;`, QK8_0 = 32; dequantize_row_q8_0: y = x.qs[j] * GGML_FP16_TO_FP32(x.d)):
 *    d decoded here from its binary16 fields with ldexp, then one float multiply;
 *  - OCP 8-bit floating point (OFP8) E4M3 (bias 7, no Inf, NaN S.1111.111, max 448) and E5M2
 *    (bias 15, IEEE-like Inf/NaN), decoded with ldexp from sign, exponent and mantissa.
 *
 * Tests:
 *  - every FP8 encoding (256 per format), widened by every conversion table the CPU runs (with
 *    scales 1, 0.5, 3) and by every ISA's decode micro-kernels (dot and axpy, in place), against
 *    the decoding above; finite scans of each encoding (and a scale that overflows);
 *  - q8_0 dequantization bit-exact (tables, loaders, micro-kernels) on random blocks and edge
 *    d values (subnormal, negative zero, largest);
 *  - attention with 8-bit K and/or V (q8_0, E4M3, E5M2, mixed with f16/f32, per-tensor and
 *    per-kv-head scales, GQA), dense, strided (BSHD), paged (shuffled blocks, NaN in unread
 *    slots) and packed, on the reference, tiled and decode kernels at every ISA cap: out and
 *    lse bit-identical to the same call on float32 K/V holding the dequantized values, and
 *    within the float32 bound of a float64 reference on those values;
 *  - NaN/Inf: an attended row with a NaN encoding (or a q8_0 d that is Inf/NaN) is
 *    SDPA_ERR_NON_FINITE with out untouched; the same in a masked row is never read;
 *  - validation: E % 32, the q8_0 last stride, 8-bit q / out / bias, scales (shape, dtype,
 *    rank, NaN, negative, with a non-FP8 cache), each with its status and out untouched;
 *  - sdpa_last_kernel()'s dtype tags.
 * ISA levels the CPU lacks are printed as "not run".
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert.h"
#include "cpu.h"
#include "dispatch.h"
#include "load.h"
#include "ref/sdpa_ref.h"
#include "robustness/guard.h"
#include "sdpa.h"

/* ------------------------------------------------ the formats, from their documentation */

static double half_value(uint16_t h) { /* IEEE binary16 (NaN/Inf not asked for here) */
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

/* 0: finite (*v set), 1: Inf, 2: NaN. */
static int e4m3_value(uint8_t b, double *v) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7)
        return 2;
    *v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    if (s)
        *v = -*v;
    return 0;
}

static int e5m2_value(uint8_t b, double *v) {
    const int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
    if (e == 31)
        return m == 0 ? 1 : 2;
    *v = e == 0 ? ldexp(m / 4.0, -14) : ldexp(1.0 + m / 4.0, e - 15);
    if (s)
        *v = -*v;
    return 0;
}

static int fp8_value(int dt, uint8_t b, double *v) { return dt == SDPA_DTYPE_FP8_E4M3 ? e4m3_value(b, v) : e5m2_value(b, v); }

/* Element j of the q8_0 block at blk: (float)qs[j] * (float)d, one float multiply. */
static float q8_value(const unsigned char *blk, int j) {
    const uint16_t h = (uint16_t)(blk[0] | (blk[1] << 8)); /* little-endian, as ggml stores it */
    const float d = (float)half_value(h);
    return (float)(int8_t)blk[2 + j] * d;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* ------------------------------------------------------------------ random data */

static uint32_t g_rng = 2463534242u;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}
static float frand(void) { return (float)(rnd() % 20001) / 20000.0f - 0.5f; }

/* A random q8_0 block: d a binary16 with exponent field g_q8_exp .. g_q8_exp + g_q8_exps - 1
 * (by default 9..14: about 2^-6 .. 1), any sign; qs any. */
static unsigned g_q8_exp = 9, g_q8_exps = 6;
static void rand_q8_block(unsigned char *blk) {
    const uint16_t h = (uint16_t)(((rnd() & 1) << 15) | ((g_q8_exp + rnd() % g_q8_exps) << 10) | (rnd() & 1023));
    blk[0] = (unsigned char)(h & 0xFF);
    blk[1] = (unsigned char)(h >> 8);
    for (int j = 0; j < 32; ++j)
        blk[2 + j] = (unsigned char)rnd();
}

/* A random finite FP8 byte of moderate size (|v| <= 8). */
static uint8_t rand_fp8(int dt) {
    for (;;) {
        const uint8_t b = (uint8_t)rnd();
        double v;
        if (fp8_value(dt, b, &v) == 0 && fabs(v) <= 8.0)
            return b;
    }
}

/* ------------------------------------------------------------------ ISA loop */

static bool isa_runs(int isa) {
    if (!sdpa__cpu_has_isa(isa)) {
        printf("# isa %d: not run (the CPU lacks it)\n", isa);
        return false;
    }
    return true;
}

/* ============================================================ conversions, exhaustively */

/* Every conversion table this build has, NULL where the CPU lacks it ("not run"). */
static int tables_of(const sdpa__convert **t, const char **names) {
    int n = 0;
    t[n] = &sdpa__convert_portable, names[n++] = "portable";
#if defined(SDPA_HAVE_CONVERT_AVX2)
    t[n] = sdpa__cpu_has_isa(SDPA__ISA_AVX2) ? &sdpa__convert_avx2 : NULL, names[n++] = "avx2-f16c";
#endif
#if defined(SDPA_HAVE_CONVERT_AVX512)
    t[n] = sdpa__cpu_has_isa(SDPA__ISA_AVX512) ? &sdpa__convert_avx512 : NULL, names[n++] = "avx512";
#endif
#if defined(SDPA_HAVE_AVX512BF16)
    t[n] = sdpa__cpu_features()->avx512bf16 && sdpa__cpu_has_isa(SDPA__ISA_AVX512) ? &sdpa__convert_avx512bf16 : NULL;
    names[n++] = "avx512-bf16";
#endif
#if defined(SDPA_HAVE_CONVERT_NEON)
    t[n] = sdpa__cpu_has_isa(SDPA__ISA_NEON) ? &sdpa__convert_neon : NULL, names[n++] = "neon";
#endif
    for (int i = 0; i < n; ++i)
        if (t[i] == NULL)
            printf("# conversion table %s: not run (the CPU lacks it)\n", names[i]);
    return n;
}

static void check_widened(int dt, uint8_t b, float got, float scale, const char *where) {
    double v;
    const int kind = fp8_value(dt, b, &v);
    if (kind == 2) {
        if (!isnan(got) || (bits(got) >> 31) != (uint32_t)(b >> 7))
            fail_msg("%s: dtype %d byte 0x%02x: expected a NaN with sign %d, got %08x", where, dt, b, b >> 7, bits(got));
        return;
    }
    if (kind == 1) {
        const float want = (b >> 7) ? -INFINITY : INFINITY;
        if (bits(got) != bits(want * scale))
            fail_msg("%s: dtype %d byte 0x%02x: expected Inf, got %08x", where, dt, b, bits(got));
        return;
    }
    const float want = (float)v * scale; /* (float)v is exact: every FP8 value is a float32 */
    if (bits(got) != bits(want))
        fail_msg("%s: dtype %d byte 0x%02x scale %g: expected %a, got %a", where, dt, b, (double)scale, (double)want,
                 (double)got);
}

static void kv8_every_fp8_encoding_every_table(void **state) {
    (void)state;
    static const float scales[3] = {1.0f, 0.5f, 3.0f};
    uint8_t all[256], strided[512];
    for (int b = 0; b < 256; ++b) {
        all[b] = (uint8_t)b;
        strided[2 * b] = (uint8_t)b;
        strided[2 * b + 1] = 0xAA;
    }
    int tables = 0;
    const sdpa__convert *tabs[4];
    const char *names[4];
    const int ntab = tables_of(tabs, names);
    for (int ti = 0; ti < ntab; ++ti) {
        const sdpa__convert *cv = tabs[ti];
        if (cv == NULL)
            continue;
        ++tables;
        for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt) {
            for (int si = 0; si < 3; ++si) {
                float out[256], out2[256];
                (dt == SDPA_DTYPE_FP8_E4M3 ? cv->widen_e4m3 : cv->widen_e5m2)(all, 1, 256, out, scales[si]);
                (dt == SDPA_DTYPE_FP8_E4M3 ? cv->widen_e4m3 : cv->widen_e5m2)(strided, 2, 256, out2, scales[si]);
                for (int b = 0; b < 256; ++b) {
                    check_widened(dt, (uint8_t)b, out[b], scales[si], cv->name);
                    check_widened(dt, (uint8_t)b, out2[b], scales[si], cv->name);
                }
            }
            for (int b = 0; b < 256; ++b) {
                double v;
                const bool fin = fp8_value(dt, (uint8_t)b, &v) == 0;
                bool (*fs)(const uint8_t *, ptrdiff_t, int64_t, float) =
                    dt == SDPA_DTYPE_FP8_E4M3 ? cv->finite_e4m3 : cv->finite_e5m2;
                if (fs(all + b, 1, 1, 1.0f) != fin)
                    fail_msg("%s: finite scan of dtype %d byte 0x%02x says %d", cv->name, dt, b, !fin);
                /* a finite encoding times a scale beyond float32 is not a finite value */
                const bool fin_big = fin && isfinite((float)v * 3e38f);
                if (fs(all + b, 1, 1, 3e38f) != fin_big)
                    fail_msg("%s: finite scan of dtype %d byte 0x%02x with scale 3e38 says %d", cv->name, dt, b, !fin_big);
            }
        }
    }
    printf("# FP8 conversions: %d tables x 2 formats x 256 encodings\n", tables);
    assert_true(tables >= 1);
}

/* Every encoding through each ISA's decode micro-kernels on K/V as stored: a one-hot q picks
 * element e of a row (dot_rows), p = 1 copies a row (axpy_rows). */
static void kv8_every_fp8_encoding_every_microkernel(void **state) {
    (void)state;
    enum { NE = 64 }; /* a whole 16- and 8-lane multiple, plus a masked-tail run below */
    int runs = 0;
    for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
        if (!isa_runs(isa))
            continue;
        sdpa__dispatch_set_max_isa_for_testing(isa);
        for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt) {
            const sdpa__mk_kv *kv = sdpa__dispatch_mk_kv(dt);
            assert_non_null(kv);
            /* 4 rows of NE bytes hold the 256 encodings */
            uint8_t rows[4 * NE];
            for (int i = 0; i < 256; ++i)
                rows[i] = (uint8_t)i;
            /* axpy: o = 0 * o + 1 * row */
            const float one = 1.0f;
            const int32_t idx0 = 0;
            for (int r = 0; r < 4; ++r) {
                float o[NE];
                memset(o, 0, sizeof o);
                kv->axpy_rows(o, NE, 0.0f, &one, &idx0, 1, rows + r * NE, NE, NULL);
                for (int e = 0; e < NE; ++e) {
                    const uint8_t b = (uint8_t)(r * NE + e);
                    double v;
                    const int kind = fp8_value(dt, b, &v);
                    if (kind == 2 ? !isnan(o[e]) : kind == 1 ? !(isinf(o[e]) && (o[e] < 0) == (b >> 7)) : o[e] != (float)v)
                        fail_msg("isa %d dtype %d axpy byte 0x%02x: got %a", isa, dt, b, (double)o[e]);
                    /* a NaN: the bits of convert.h's widening (sign, quiet, payload), which the
                     * one FMA by 1 keeps */
                    const float w = dt == SDPA_DTYPE_FP8_E4M3 ? sdpa__e4m3_to_f32(b) : sdpa__e5m2_to_f32(b);
                    if (kind == 2 && bits(o[e]) != bits(w))
                        fail_msg("isa %d dtype %d axpy byte 0x%02x: bits %08x, want %08x", isa, dt, b,
                                 (unsigned)bits(o[e]), (unsigned)bits(w));
                }
                /* a tail of 13 elements (masked loads) */
                float o2[13] = {0};
                kv->axpy_rows(o2, 13, 0.0f, &one, &idx0, 1, rows + r * NE, NE, NULL);
                for (int e = 0; e < 13; ++e)
                    if (bits(o2[e]) != bits(o[e]) && !(isnan(o2[e]) && isnan(o[e])))
                        fail_msg("isa %d dtype %d axpy tail element %d differs", isa, dt, e);
            }
            /* dot: the finite encodings, one at a time, picked by a one-hot q (the others 0) */
            for (int i = 0; i < 256; ++i) {
                double v;
                if (fp8_value(dt, (uint8_t)i, &v) != 0)
                    continue;
                uint8_t row[NE];
                float q[NE], s = -1.0f;
                memset(row, 0, sizeof row);
                memset(q, 0, sizeof q);
                const int e = i % NE;
                row[e] = (uint8_t)i;
                q[e] = 1.0f;
                kv->dot_rows(q, NE, row, NE, 1, &s, NULL);
                if (s != (float)v)
                    fail_msg("isa %d dtype %d dot byte 0x%02x: got %a, want %a", isa, dt, i, (double)s, v);
            }
            ++runs;
        }
    }
    sdpa__dispatch_set_max_isa_for_testing(-1);
    printf("# FP8 micro-kernels: %d (isa, format) runs\n", runs);
    assert_true(runs >= 2);
}

/* ============================================================ q8_0 dequantization */

static void kv8_q8_0_dequantize_matches_ggml_layout(void **state) {
    (void)state;
    enum { NB = 12 };
    unsigned char blocks[NB * 34] __attribute__((aligned(2)));
    for (int i = 0; i < NB; ++i)
        rand_q8_block(blocks + 34 * i);
    /* edge scales: subnormal, -0, the largest binary16, 1; and qs -128 */
    const uint16_t edge[4] = {0x0001, 0x8000, 0x7BFF, 0x3C00};
    for (int i = 0; i < 4; ++i) {
        blocks[34 * i] = (unsigned char)(edge[i] & 0xFF);
        blocks[34 * i + 1] = (unsigned char)(edge[i] >> 8);
    }
    blocks[2] = 0x80;
    blocks[34 + 5] = 0x80;
    int tables = 0;
    const sdpa__convert *tabs[4];
    const char *names[4];
    const int ntab = tables_of(tabs, names);
    for (int ti = 0; ti < ntab; ++ti) {
        const sdpa__convert *cv = tabs[ti];
        if (cv == NULL)
            continue;
        ++tables;
        float out[NB * 32];
        cv->widen_q8_0(blocks, NB, out);
        for (int i = 0; i < NB; ++i)
            for (int j = 0; j < 32; ++j)
                if (bits(out[32 * i + j]) != bits(q8_value(blocks + 34 * i, j)))
                    fail_msg("%s: block %d element %d: %a, want %a", cv->name, i, j, (double)out[32 * i + j],
                             (double)q8_value(blocks + 34 * i, j));
        assert_true(cv->finite_q8_0(blocks, NB));
    }
    assert_true(tables >= 1);
    /* the loader: a [1, 2, 3, 64] view (2 blocks per row, 6 rows = 12 blocks) */
    sdpa_tensor t;
    const int64_t shape[4] = {1, 2, 3, 64};
    assert_int_equal(sdpa_tensor_init_dtype(&t, blocks, SDPA_DTYPE_Q8_0, 4, shape), SDPA_OK);
    assert_int_equal(t.strides[3], 1);
    assert_int_equal(t.strides[2], 2);
    sdpa__view4 v;
    memset(&v, 0, sizeof v);
    v.data = t.data;
    v.dtype = t.dtype;
    for (int d = 0; d < 4; ++d) {
        v.shape[d] = t.shape[d];
        v.strides[d] = t.strides[d];
    }
    const sdpa__loader *ld = sdpa__loader_for(&v, SDPA__ADDR_STRIDED);
    assert_non_null(ld);
    for (int h = 0; h < 2; ++h) {
        float tile[3 * 64];
        const sdpa__rows r = ld->rows(&v, 0, h, 0, 3, tile);
        for (int i = 0; i < 3; ++i)
            for (int e = 0; e < 64; ++e) {
                const int blk = (h * 3 + i) * 2 + e / 32;
                if (bits(r.data[i * r.stride + e]) != bits(q8_value(blocks + 34 * blk, e % 32)))
                    fail_msg("loader: head %d row %d element %d", h, i, e);
            }
        assert_true(ld->row_finite(NULL, &v, 0, h, 1));
    }
    /* the micro-kernels on stored rows: row 0 with p = 1 (axpy) and one-hot q (dot) */
    int runs = 0;
    for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
        if (!isa_runs(isa))
            continue;
        sdpa__dispatch_set_max_isa_for_testing(isa);
        const sdpa__mk_kv *kv = sdpa__dispatch_mk_kv(SDPA_DTYPE_Q8_0);
        for (int row = 0; row < 6; ++row) {
            float o[64] = {0}, pr[6] = {0};
            pr[row] = 1.0f; /* p is indexed by the key */
            const int32_t idx = (int32_t)row;
            kv->axpy_rows(o, 64, 0.0f, pr, &idx, 1, blocks, 2, NULL);
            for (int e = 0; e < 64; ++e) {
                const float want = q8_value(blocks + 34 * (2 * row + e / 32), e % 32);
                if (o[e] != want)
                    fail_msg("isa %d q8_0 axpy row %d element %d: %a want %a", isa, row, e, (double)o[e], (double)want);
                float q[64] = {0}, s;
                q[e] = 1.0f;
                kv->dot_rows(q, 64, (const char *)blocks + 34 * 2 * row, 2, 1, &s, NULL);
                if (s != want)
                    fail_msg("isa %d q8_0 dot row %d element %d: %a want %a", isa, row, e, (double)s, (double)want);
            }
        }
        ++runs;
    }
    sdpa__dispatch_set_max_isa_for_testing(-1);
    assert_true(runs >= 1);
}

/* ============================================================ attention */

enum { B = 2, HQ = 4, HKV = 2, S = 70, E = 64, EV = 32, LMAX = 40 };

/* An 8-bit (or 16/32-bit) K or V buffer and its dequantized float32 copy, in one of the
 * layouts: BHSD (contiguous) or BSHD (the head axis inside the sequence axis). */
typedef struct store {
    int dt;
    int64_t w;         /* E or Ev */
    bool bshd;
    unsigned char *raw; /* the stored bytes */
    float *deq;         /* [B, Hkv, S, w] dequantized, same layout as raw (element strides) */
    sdpa_tensor t, tf;  /* views of raw and of deq */
    float scale[HKV];   /* FP8: per kv head (scale_mode 2), scale[0] (mode 1) */
} store;

static size_t unit_of(int dt) { return sdpa_dtype_size((sdpa_dtype)dt); }

/* Strides (in the view's unit) of [B, Hkv, S, w] in the layout. */
static void strides_of(const store *s, int64_t *st) {
    const int64_t u = s->dt == SDPA_DTYPE_Q8_0 ? s->w / 32 : s->w; /* units per row */
    if (s->bshd) {
        st[0] = S * HKV * u;
        st[1] = u;
        st[2] = HKV * u;
    } else {
        st[0] = HKV * S * u;
        st[1] = S * u;
        st[2] = u;
    }
    st[3] = 1;
}

/* Fill a store; scale_mode 0: none, 1: one scale, 2: per kv head. */
static void store_make(store *s, int dt, int64_t w, bool bshd, int scale_mode) {
    memset(s, 0, sizeof *s);
    s->dt = dt;
    s->w = w;
    s->bshd = bshd;
    const int64_t rows = (int64_t)B * HKV * S;
    const int64_t unitsz = (int64_t)unit_of(dt), units = dt == SDPA_DTYPE_Q8_0 ? w / 32 : w;
    s->raw = aligned_alloc(64, (size_t)((rows * units * unitsz + 63) / 64 * 64));
    s->deq = aligned_alloc(64, (size_t)(rows * w) * sizeof(float));
    s->scale[0] = scale_mode == 0 ? 1.0f : 0.5f;
    s->scale[1] = scale_mode == 2 ? 2.0f : s->scale[0];
    int64_t st[4];
    strides_of(s, st);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < HKV; ++g)
            for (int64_t j = 0; j < S; ++j) {
                const int64_t off = b * st[0] + g * st[1] + j * st[2]; /* in units */
                unsigned char *r = s->raw + off * unitsz;
                float *f = s->deq + (dt == SDPA_DTYPE_Q8_0 ? off * 32 : off);
                for (int64_t e = 0; e < w; ++e) {
                    if (dt == SDPA_DTYPE_Q8_0) {
                        if (e % 32 == 0)
                            rand_q8_block(r + (e / 32) * 34);
                        f[e] = q8_value(r + (e / 32) * 34, (int)(e % 32));
                    } else if (dt == SDPA_DTYPE_FP8_E4M3 || dt == SDPA_DTYPE_FP8_E5M2) {
                        r[e] = rand_fp8(dt);
                        double v;
                        fp8_value(dt, r[e], &v);
                        f[e] = (float)v * s->scale[g];
                    } else if (dt == SDPA_DTYPE_F16) {
                        /* a small f16: exponent 10..14, as an exactly known value */
                        const uint16_t h = (uint16_t)(((rnd() & 1) << 15) | ((10 + rnd() % 5) << 10) | (rnd() & 1023));
                        memcpy(r + 2 * e, &h, 2);
                        f[e] = (float)half_value(h);
                    } else {
                        f[e] = frand();
                        memcpy(r + 4 * e, &f[e], 4);
                    }
                }
            }
    const int64_t shape[4] = {B, HKV, S, w};
    assert_int_equal(sdpa_tensor_init_strided(&s->t, s->raw, (sdpa_dtype)dt, 4, shape, st), SDPA_OK);
    int64_t fst[4];
    for (int d = 0; d < 4; ++d)
        fst[d] = dt == SDPA_DTYPE_Q8_0 ? st[d] * 32 : st[d];
    fst[3] = 1;
    assert_int_equal(sdpa_tensor_init_strided(&s->tf, s->deq, SDPA_DTYPE_F32, 4, shape, fst), SDPA_OK);
}

static void store_free(store *s) {
    free(s->raw);
    free(s->deq);
}

static bool is_fp8(int dt) { return dt == SDPA_DTYPE_FP8_E4M3 || dt == SDPA_DTYPE_FP8_E5M2; }

/* max |x[i]| (the stores hold no NaN). Not an fmax loop: gcc 12 for aarch64 stops with an
 * internal compiler error (vect_transform_reduction) vectorising an fmax reduction of widened
 * floats at -O2 (as in test_serving.c); a compare-and-select reduction compiles everywhere. */
static double max_abs(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double a = fabs((double)x[i]);
        m = a > m ? a : m;
    }
    return m;
}

/* The float64 reference on the dequantized values (dense views). */
static void reference(const float *q, int64_t L, const store *k, const store *v, const int64_t *klen, double *out) {
    const size_t nq = (size_t)B * HQ * L * E, nk = (size_t)B * HKV * S * E, nv = (size_t)B * HKV * S * EV;
    double *qd = malloc(nq * sizeof(double)), *kd = malloc(nk * sizeof(double)), *vd = malloc(nv * sizeof(double));
    for (size_t i = 0; i < nq; ++i)
        qd[i] = q[i];
    /* dense copies in BHSD order */
    for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < HKV; ++g)
            for (int64_t j = 0; j < S; ++j) {
                for (int64_t e = 0; e < E; ++e)
                    kd[((b * HKV + g) * S + j) * E + e] =
                        k->deq[b * k->tf.strides[0] + g * k->tf.strides[1] + j * k->tf.strides[2] + e];
                for (int64_t e = 0; e < EV; ++e)
                    vd[((b * HKV + g) * S + j) * EV + e] =
                        v->deq[b * v->tf.strides[0] + g * v->tf.strides[1] + j * v->tf.strides[2] + e];
            }
    ref_problem p;
    ref_problem_init(&p);
    p.B = B; p.Hq = HQ; p.Hkv = HKV; p.L = L; p.S = S; p.E = E; p.Ev = EV;
    ref_view_contiguous4(&p.q, qd, B, HQ, L, E);
    ref_view_contiguous4(&p.k, kd, B, HKV, S, E);
    ref_view_contiguous4(&p.v, vd, B, HKV, S, EV);
    p.causal = 1;
    p.alignment = REF_ALIGN_BOTTOM_RIGHT;
    p.key_lengths = klen;
    const ref_report r = ref_attention(&p, out, NULL, NULL, NULL);
    assert_int_equal(r.status, REF_OK);
    free(qd);
    free(kd);
    free(vd);
}

typedef struct result {
    float out[B * HQ * LMAX * EV];
    float lse[B * HQ * LMAX];
    char kernel[96];
} result;

static sdpa_status attend(const float *q, int64_t L, const sdpa_tensor *k, const sdpa_tensor *v, int kernel,
                          const int64_t *klen, const sdpa_tensor *ks, const sdpa_tensor *vs, int threads, result *r) {
    sdpa_tensor tq, to, tl;
    const int64_t qs[4] = {B, HQ, L, E}, os[4] = {B, HQ, L, EV}, ls[3] = {B, HQ, L};
    assert_int_equal(sdpa_tensor_init(&tq, (float *)(uintptr_t)q, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, r->out, 4, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tl, r->lse, 3, ls), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = 1;
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.key_lengths = klen;
    o.kernel = kernel;
    o.num_threads = threads;
    o.k_scale = ks;
    o.v_scale = vs;
    const sdpa_status st = sdpa_attention(&tq, k, v, &o, &to, NULL, &tl);
    snprintf(r->kernel, sizeof r->kernel, "%s", sdpa_last_kernel());
    return st;
}

static void scale_view(sdpa_tensor *t, const store *s, int mode) {
    const int64_t n = mode == 2 ? HKV : 1;
    assert_int_equal(sdpa_tensor_init(t, (float *)(uintptr_t)s->scale, 1, &n), SDPA_OK);
}

static const char *tag_of(int kd, int vd) {
    if (kd != vd)
        return "-mixed";
    return kd == SDPA_DTYPE_Q8_0 ? "-q8_0" : kd == SDPA_DTYPE_FP8_E4M3 ? "-fp8_e4m3" : kd == SDPA_DTYPE_FP8_E5M2 ? "-fp8_e5m2" : "-f16";
}

typedef struct combo {
    int kd, vd, kmode, vmode; /* dtypes and scale modes */
} combo;

static const combo g_combos[] = {
    {SDPA_DTYPE_Q8_0, SDPA_DTYPE_Q8_0, 0, 0},
    {SDPA_DTYPE_FP8_E4M3, SDPA_DTYPE_FP8_E4M3, 0, 0},
    {SDPA_DTYPE_FP8_E4M3, SDPA_DTYPE_FP8_E4M3, 1, 2},
    {SDPA_DTYPE_FP8_E5M2, SDPA_DTYPE_FP8_E5M2, 2, 1},
    {SDPA_DTYPE_Q8_0, SDPA_DTYPE_F16, 0, 0},     /* llama.cpp: q8_0 K, f16 V */
    {SDPA_DTYPE_FP8_E5M2, SDPA_DTYPE_Q8_0, 0, 0},
    {SDPA_DTYPE_F32, SDPA_DTYPE_FP8_E4M3, 0, 2},
};

/* Dense and BSHD calls: 8-bit == float32 on the dequantized values, bit for bit, per kernel,
 * ISA cap, layout and thread count; within the float32 bound of the float64 reference. */
static void kv8_attention_matches_dequantized_f32(void **state) {
    (void)state;
    static const int64_t klen[B] = {70, 45};
    static const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    static const int64_t Ls[2] = {3, LMAX};
    float *q = malloc(sizeof(float) * B * HQ * LMAX * E);
    for (int64_t i = 0; i < B * HQ * LMAX * E; ++i)
        q[i] = frand();
    result *r8 = malloc(sizeof *r8), *rf = malloc(sizeof *rf);
    double *ref = malloc(sizeof(double) * B * HQ * LMAX * EV);
    int cases = 0;
    double worst = 0.0;
    for (size_t c = 0; c < sizeof g_combos / sizeof g_combos[0]; ++c)
        for (int bshd = 0; bshd < 2; ++bshd) {
            const combo *cb = &g_combos[c];
            store k, v;
            store_make(&k, cb->kd, E, bshd, cb->kmode);
            store_make(&v, cb->vd, EV, !bshd, cb->vmode);
            sdpa_tensor ks, vs;
            if (cb->kmode)
                scale_view(&ks, &k, cb->kmode);
            if (cb->vmode)
                scale_view(&vs, &v, cb->vmode);
            for (int li = 0; li < 2; ++li) {
                const int64_t L = Ls[li];
                reference(q, L, &k, &v, klen, ref);
                const double vmax = max_abs(v.deq, (int64_t)B * HKV * S * EV);
                for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
                    if (!sdpa__cpu_has_isa(isa))
                        continue;
                    sdpa__dispatch_set_max_isa_for_testing(isa);
                    for (int kn = 0; kn < 3; ++kn)
                        for (int threads = 1; threads <= 2; ++threads) {
                            memset(r8, 0, sizeof *r8);
                            memset(rf, 0, sizeof *rf);
                            sdpa_status st = attend(q, L, &k.t, &v.t, kernels[kn], klen, cb->kmode ? &ks : NULL,
                                                    cb->vmode ? &vs : NULL, threads, r8);
                            if (st != SDPA_OK)
                                fail_msg("combo %zu bshd %d L %lld isa %d kernel %d: %s (%s)", c, bshd, (long long)L,
                                         isa, kernels[kn], sdpa_status_string(st), sdpa_last_error_message());
                            st = attend(q, L, &k.tf, &v.tf, kernels[kn], klen, NULL, NULL, threads, rf);
                            assert_int_equal(st, SDPA_OK);
                            const size_t no = (size_t)B * HQ * L * EV, nl = (size_t)B * HQ * L;
                            if (memcmp(r8->out, rf->out, no * sizeof(float)) != 0 ||
                                memcmp(r8->lse, rf->lse, nl * sizeof(float)) != 0)
                                fail_msg("combo %zu bshd %d L %lld isa %d kernel %s: 8-bit K/V differ from float32 "
                                         "K/V holding the dequantized values",
                                         c, bshd, (long long)L, isa, r8->kernel);
                            const char *tag = tag_of(cb->kd, cb->vd);
                            const size_t tl = strlen(tag), kl = strlen(r8->kernel);
                            if (kl < tl || strcmp(r8->kernel + kl - tl, tag) != 0)
                                fail_msg("kernel name %s does not end with %s", r8->kernel, tag);
                            for (size_t i = 0; i < no; ++i) {
                                const double err = fabs((double)r8->out[i] - ref[i]);
                                /* the float32 bound's shape (sdpa_precision): a few ulps of the
                                 * value scale times the keys summed */
                                const double bound = 64.0 * 0x1p-24 * (double)S * vmax + 1e-30;
                                worst = fmax(worst, err / bound);
                                if (err > bound)
                                    fail_msg("combo %zu kernel %s: out[%zu] = %.9g, float64 %.9g (error %g > %g)", c,
                                             r8->kernel, i, (double)r8->out[i], ref[i], err, bound);
                            }
                            ++cases;
                        }
                }
                sdpa__dispatch_set_max_isa_for_testing(-1);
            }
            store_free(&k);
            store_free(&v);
        }
    printf("# 8-bit attention: %d cases bit-identical to float32 K/V, largest error/bound %.3g\n", cases, worst);
    free(q);
    free(r8);
    free(rf);
    free(ref);
}

/* Paged: a pool of 8-bit blocks in shuffled order (unreferenced blocks and slots past the keys
 * hold NaN encodings) == the float32 pool of the same values, per kernel and ISA. */
static void fill_nan_unit(int dt, unsigned char *u) {
    if (dt == SDPA_DTYPE_Q8_0) {
        u[0] = 0x00;
        u[1] = 0x7E; /* d = NaN */
        memset(u + 2, 1, 32);
    } else {
        u[0] = 0x7F; /* E4M3 NaN; E5M2 NaN too (exponent all ones, mantissa 3) */
    }
}

static void kv8_paged_and_packed_match_f32(void **state) {
    (void)state;
    enum { BS = 16, NBLK = 12, MAXB = 5 };
    static const int dts[3] = {SDPA_DTYPE_Q8_0, SDPA_DTYPE_FP8_E4M3, SDPA_DTYPE_FP8_E5M2};
    static const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    const int64_t klen[B] = {70, 37};
    const int32_t table[B * MAXB] = {7, 2, 9, 0, 4, 11, 5, 3, -1, -1};
    float *q = malloc(sizeof(float) * B * HQ * 3 * E);
    for (int64_t i = 0; i < B * HQ * 3 * E; ++i)
        q[i] = frand();
    int cases = 0;
    for (int di = 0; di < 3; ++di) {
        const int dt = dts[di];
        const int64_t unit = (int64_t)unit_of(dt);
        /* pools [NBLK, HKV, BS, w] in units; f32 pools of the dequantized values */
        const int64_t ku = dt == SDPA_DTYPE_Q8_0 ? E / 32 : E, vu = dt == SDPA_DTYPE_Q8_0 ? EV / 32 : EV;
        const int64_t nrows = (int64_t)NBLK * HKV * BS;
        unsigned char *kp = aligned_alloc(64, (size_t)((nrows * ku * unit + 63) / 64 * 64));
        unsigned char *vp = aligned_alloc(64, (size_t)((nrows * vu * unit + 63) / 64 * 64));
        float *kf = malloc(sizeof(float) * nrows * E), *vf = malloc(sizeof(float) * nrows * EV);
        const float sc[HKV] = {0.75f, 1.25f};
        for (int64_t row = 0; row < nrows; ++row) {
            const int64_t blk = row / (HKV * BS), g = (row / BS) % HKV;
            bool used = false;
            for (int t = 0; t < B * MAXB; ++t)
                used |= table[t] == blk;
            for (int pass = 0; pass < 2; ++pass) {
                const int64_t w = pass == 0 ? E : EV, uu = pass == 0 ? ku : vu;
                unsigned char *r = (pass == 0 ? kp : vp) + row * uu * unit;
                float *f = (pass == 0 ? kf : vf) + row * w;
                for (int64_t e = 0; e < w; ++e) {
                    if (dt == SDPA_DTYPE_Q8_0) {
                        if (e % 32 == 0)
                            rand_q8_block(r + (e / 32) * 34);
                        f[e] = q8_value(r + (e / 32) * 34, (int)(e % 32));
                    } else {
                        r[e] = rand_fp8(dt);
                        double x;
                        fp8_value(dt, r[e], &x);
                        f[e] = (float)x * (is_fp8(dt) && pass == 1 ? sc[g] : 1.0f);
                    }
                }
                if (!used) { /* never read: NaN everywhere (f32 pool too) */
                    for (int64_t u = 0; u < uu; ++u)
                        fill_nan_unit(dt, r + u * unit);
                    for (int64_t e = 0; e < w; ++e)
                        f[e] = NAN;
                }
            }
        }
        /* slots past key 37 of sequence 1 (its third block, 3: slots 5..15): NaN */
        for (int64_t slot = 37 % BS; slot < BS; ++slot)
            for (int64_t g = 0; g < HKV; ++g) {
                const int64_t row = (3 * HKV + g) * BS + slot;
                for (int64_t u = 0; u < ku; ++u)
                    fill_nan_unit(dt, kp + (row * ku + u) * unit);
                for (int64_t e = 0; e < E; ++e)
                    kf[row * E + e] = NAN;
            }
        sdpa_tensor tk, tv, tkf, tvf, vs;
        const int64_t ksh[4] = {NBLK, HKV, BS, E}, vsh[4] = {NBLK, HKV, BS, EV};
        assert_int_equal(sdpa_tensor_init_dtype(&tk, kp, (sdpa_dtype)dt, 4, ksh), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_dtype(&tv, vp, (sdpa_dtype)dt, 4, vsh), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&tkf, kf, 4, ksh), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&tvf, vf, 4, vsh), SDPA_OK);
        const int64_t two = HKV;
        assert_int_equal(sdpa_tensor_init(&vs, (float *)(uintptr_t)sc, 1, &two), SDPA_OK);
        for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
            if (!sdpa__cpu_has_isa(isa))
                continue;
            sdpa__dispatch_set_max_isa_for_testing(isa);
            for (int kn = 0; kn < 3; ++kn)
                for (int packed = 0; packed < 2; ++packed) {
                    float out8[B * HQ * 3 * EV], outf[B * HQ * 3 * EV];
                    sdpa_tensor tq, to8, tof;
                    sdpa_options o;
                    sdpa_options_init(&o);
                    o.block_table = table;
                    o.max_blocks_per_seq = MAXB;
                    o.key_lengths = klen;
                    o.causal = 1;
                    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
                    o.kernel = kernels[kn];
                    const int32_t cu_q[B + 1] = {0, 3, 6};
                    if (packed) { /* the B = 2 sequences of 3 query rows packed into [1, HQ, 6, E] */
                        const int64_t qsh[4] = {1, HQ, 6, E}, qst[4] = {0, 3 * E, E, 1};
                        const int64_t osh[4] = {1, HQ, 6, EV}, ost[4] = {0, 6 * EV, EV, 1};
                        /* q rows: sequence r's row i at [r * HQ * 3 * E + h * 3 * E + i * E]: use
                         * head stride 3E and row stride E over a copy laid out [HQ][6][E] */
                        static float qp[HQ * 6 * E];
                        for (int r = 0; r < B; ++r)
                            for (int h = 0; h < HQ; ++h)
                                for (int i = 0; i < 3; ++i)
                                    memcpy(qp + ((int64_t)h * 6 + r * 3 + i) * E, q + (((int64_t)r * HQ + h) * 3 + i) * E,
                                           sizeof(float) * E);
                        const int64_t qst2[4] = {0, 6 * E, E, 1};
                        (void)qst;
                        assert_int_equal(sdpa_tensor_init_strided(&tq, qp, SDPA_DTYPE_F32, 4, qsh, qst2), SDPA_OK);
                        assert_int_equal(sdpa_tensor_init_strided(&to8, out8, SDPA_DTYPE_F32, 4, osh, ost), SDPA_OK);
                        assert_int_equal(sdpa_tensor_init_strided(&tof, outf, SDPA_DTYPE_F32, 4, osh, ost), SDPA_OK);
                        o.cu_seqlens_q = cu_q;
                        o.num_seqs = B;
                        o.causal = 1;
                    } else {
                        const int64_t qsh[4] = {B, HQ, 3, E}, osh[4] = {B, HQ, 3, EV};
                        assert_int_equal(sdpa_tensor_init(&tq, q, 4, qsh), SDPA_OK);
                        assert_int_equal(sdpa_tensor_init(&to8, out8, 4, osh), SDPA_OK);
                        assert_int_equal(sdpa_tensor_init(&tof, outf, 4, osh), SDPA_OK);
                    }
                    o.v_scale = is_fp8(dt) ? &vs : NULL;
                    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to8, NULL, NULL);
                    if (st != SDPA_OK)
                        fail_msg("paged dtype %d isa %d kernel %d packed %d: %s (%s)", dt, isa, kernels[kn], packed,
                                 sdpa_status_string(st), sdpa_last_error_message());
                    o.v_scale = NULL;
                    st = sdpa_attention(&tq, &tkf, &tvf, &o, &tof, NULL, NULL);
                    assert_int_equal(st, SDPA_OK);
                    if (memcmp(out8, outf, sizeof out8) != 0)
                        fail_msg("paged dtype %d isa %d kernel %s packed %d: differs from the float32 pool", dt, isa,
                                 sdpa_last_kernel(), packed);
                    ++cases;
                }
        }
        sdpa__dispatch_set_max_isa_for_testing(-1);
        /* packed with cu_seqlens_k over dense [1, HKV, total_k, E] 8-bit keys */
        free(kp);
        free(vp);
        free(kf);
        free(vf);
    }
    printf("# paged/packed 8-bit calls: %d bit-identical to the float32 pool\n", cases);
    free(q);
}

/* Packed with cu_seqlens_k: sequences of 30 and 40 keys in one [1, HKV, 70, E] 8-bit view. */
static void kv8_packed_cu_seqlens_k_matches_f32(void **state) {
    (void)state;
    static const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    store k, v;
    store_make(&k, SDPA_DTYPE_Q8_0, E, false, 0);
    store_make(&v, SDPA_DTYPE_FP8_E4M3, EV, false, 0);
    /* use batch 0's [HKV, S, w] as the [1, HKV, 70, w] packed keys */
    sdpa_tensor tk = k.t, tv = v.t, tkf = k.tf, tvf = v.tf;
    tk.shape[0] = tv.shape[0] = tkf.shape[0] = tvf.shape[0] = 1;
    const int32_t cu_q[3] = {0, 2, 3}, cu_k[3] = {0, 30, 70};
    float q[1 * HQ * 3 * E];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i)
        q[i] = frand();
    int cases = 0;
    for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
        if (!sdpa__cpu_has_isa(isa))
            continue;
        sdpa__dispatch_set_max_isa_for_testing(isa);
        for (int kn = 0; kn < 3; ++kn) {
            float o8[HQ * 3 * EV], of[HQ * 3 * EV];
            sdpa_tensor tq, t8, tf;
            const int64_t qsh[4] = {1, HQ, 3, E}, osh[4] = {1, HQ, 3, EV};
            assert_int_equal(sdpa_tensor_init(&tq, q, 4, qsh), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&t8, o8, 4, osh), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&tf, of, 4, osh), SDPA_OK);
            sdpa_options o;
            sdpa_options_init(&o);
            o.cu_seqlens_q = cu_q;
            o.cu_seqlens_k = cu_k;
            o.num_seqs = 2;
            o.causal = 1;
            o.kernel = kernels[kn];
            sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &t8, NULL, NULL);
            if (st != SDPA_OK)
                fail_msg("packed isa %d kernel %d: %s (%s)", isa, kernels[kn], sdpa_status_string(st),
                         sdpa_last_error_message());
            assert_string_equal(sdpa_last_kernel() + strlen(sdpa_last_kernel()) - 6, "-mixed");
            assert_int_equal(sdpa_attention(&tq, &tkf, &tvf, &o, &tf, NULL, NULL), SDPA_OK);
            if (memcmp(o8, of, sizeof o8) != 0)
                fail_msg("packed isa %d kernel %d: differs from float32", isa, kernels[kn]);
            ++cases;
        }
    }
    sdpa__dispatch_set_max_isa_for_testing(-1);
    printf("# packed (cu_seqlens_k) 8-bit calls: %d\n", cases);
    store_free(&k);
    store_free(&v);
}

/* Guard pages: 8-bit caches (every dtype as K and V) placed right before a PROT_NONE page and
 * right after one, on every kernel and ISA: a read one byte past the last block / byte or before
 * the first faults. Results equal the float32 call. */
static void kv8_guard_pages_no_out_of_bounds_read(void **state) {
    (void)state;
    static const int dts[3] = {SDPA_DTYPE_Q8_0, SDPA_DTYPE_FP8_E4M3, SDPA_DTYPE_FP8_E5M2};
    static const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    static const int64_t klen[B] = {70, 45};
    float *q = malloc(sizeof(float) * B * HQ * LMAX * E);
    for (int64_t i = 0; i < B * HQ * LMAX * E; ++i)
        q[i] = frand();
    result *r8 = malloc(sizeof *r8), *rf = malloc(sizeof *rf);
    int cases = 0;
    for (int di = 0; di < 3; ++di)
        for (int at_end = 0; at_end < 2; ++at_end) {
            store k, v;
            store_make(&k, dts[di], E, false, 0);
            store_make(&v, dts[(di + 1) % 3], EV, false, 0);
            store *st[2] = {&k, &v};
            rb_guard g[2];
            sdpa_tensor gt[2];
            for (int t = 0; t < 2; ++t) {
                const size_t bytes = (size_t)st[t]->t.strides[0] * B * unit_of(st[t]->dt);
                void *p = rb_guard_alloc(&g[t], bytes, at_end);
                memcpy(p, st[t]->raw, bytes);
                gt[t] = st[t]->t;
                gt[t].data = p;
            }
            for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
                if (!sdpa__cpu_has_isa(isa))
                    continue;
                sdpa__dispatch_set_max_isa_for_testing(isa);
                for (int kn = 0; kn < 3; ++kn)
                    for (int li = 0; li < 2; ++li) {
                        const int64_t L = li == 0 ? 1 : LMAX;
                        assert_int_equal(attend(q, L, &gt[0], &gt[1], kernels[kn], klen, NULL, NULL, 1, r8), SDPA_OK);
                        assert_int_equal(attend(q, L, &k.tf, &v.tf, kernels[kn], klen, NULL, NULL, 1, rf), SDPA_OK);
                        if (memcmp(r8->out, rf->out, sizeof(float) * (size_t)(B * HQ * L * EV)) != 0)
                            fail_msg("guarded dtype %d isa %d kernel %d: differs from float32", dts[di], isa, kernels[kn]);
                        ++cases;
                    }
            }
            sdpa__dispatch_set_max_isa_for_testing(-1);
            rb_guard_free(&g[0]);
            rb_guard_free(&g[1]);
            store_free(&k);
            store_free(&v);
        }
    printf("# guarded 8-bit calls: %d\n", cases);
    free(q);
    free(r8);
    free(rf);
}

/* SDPA_PRECISION_REDUCED with a q8_0 K: where the CPU has AVX512-VNNI the decode kernel scores
 * with int8 dot products on a per-block quantized q ("decode-avx512vnni"), within the header's
 * bound against the float64 reference on the dequantized values (and not the exact result, so
 * the path ran); below AVX512 REDUCED keeps the exact scores (the DEFAULT bits). */
static void kv8_reduced_q8_0_int8_scores_within_bound(void **state) {
    (void)state;
    static const int64_t klen[B] = {70, 45};
    const double u = 0x1p-24, scale = 1.0 / sqrt((double)E);
    int ran = 0;
    double worst = 0.0;
    for (int vd = 0; vd < 2; ++vd) {
        store k, v;
        /* keys of a trained model's size (|k| <= 2: d in [2^-9, 2^-6)), so that the scores are
         * O(1) and the bound is tight enough to tell a wrong int8 product */
        g_q8_exp = 6, g_q8_exps = 3;
        store_make(&k, SDPA_DTYPE_Q8_0, E, false, 0);
        g_q8_exp = 9, g_q8_exps = 6;
        store_make(&v, vd == 0 ? SDPA_DTYPE_F32 : SDPA_DTYPE_Q8_0, EV, false, 0);
        for (int64_t L = 1; L <= 3; L += 2) {
            float *q = malloc(sizeof(float) * B * HQ * L * E);
            for (int64_t i = 0; i < B * HQ * L * E; ++i)
                q[i] = frand() * (L == 3 && i % 7 == 0 ? 8.0f : 1.0f); /* L = 3: outliers, as activations have */
            double *ref = malloc(sizeof(double) * B * HQ * L * EV);
            reference(q, L, &k, &v, klen, ref);
            const double vmax = max_abs(v.deq, (int64_t)B * HKV * S * EV);
            result *rr = malloc(sizeof *rr), *rd = malloc(sizeof *rd);
            for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
                if (!sdpa__cpu_has_isa(isa))
                    continue;
                const bool vnni = isa == SDPA__ISA_AVX512 && sdpa__cpu_features()->avx512vnni;
                sdpa__dispatch_set_max_isa_for_testing(isa);
                sdpa_tensor tq, to;
                const int64_t qsh[4] = {B, HQ, L, E}, osh[4] = {B, HQ, L, EV};
                assert_int_equal(sdpa_tensor_init(&tq, q, 4, qsh), SDPA_OK);
                sdpa_options o;
                sdpa_options_init(&o);
                o.causal = 1;
                o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
                o.key_lengths = klen;
                o.kernel = SDPA_KERNEL_DECODE;
                for (int prec = 0; prec < 2; ++prec) {
                    result *r = prec ? rr : rd;
                    o.precision = prec ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
                    assert_int_equal(sdpa_tensor_init(&to, r->out, 4, osh), SDPA_OK);
                    assert_int_equal(sdpa_attention(&tq, &k.t, &v.t, &o, &to, NULL, NULL), SDPA_OK);
                    snprintf(r->kernel, sizeof r->kernel, "%s", sdpa_last_kernel());
                }
                const size_t no = (size_t)B * HQ * L * EV;
                if (!vnni) {
                    if (memcmp(rr->out, rd->out, no * sizeof(float)) != 0 || strstr(rr->kernel, "vnni") != NULL)
                        fail_msg("isa %d: REDUCED q8_0 without VNNI differs from DEFAULT (%s)", isa, rr->kernel);
                    continue;
                }
                if (strncmp(rr->kernel, "decode-avx512vnni", 17) != 0 && strncmp(rr->kernel, "decode-split-avx512vnni", 23) != 0)
                    fail_msg("REDUCED q8_0 K at AVX512 with VNNI ran %s", rr->kernel);
                bool differs = false;
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t h = 0; h < HQ; ++h)
                        for (int64_t i = 0; i < L; ++i) {
                            const float *qi = q + ((b * HQ + h) * L + i) * E;
                            const int64_t g = h / (HQ / HKV), last = i + klen[b] - L; /* causal bottom-right */
                            double A = 0.0, T = 0.0, dq = 0.0;
                            for (int64_t j = 0; j <= last && j < klen[b]; ++j) {
                                const float *kj = k.deq + b * k.tf.strides[0] + g * k.tf.strides[1] + j * k.tf.strides[2];
                                double a = 0.0, sc = 0.0, dj = 0.0;
                                for (int64_t blk = 0; blk < E / 32; ++blk) {
                                    double amax = 0.0, ks = 0.0;
                                    for (int64_t e = 32 * blk; e < 32 * blk + 32; ++e) {
                                        amax = fmax(amax, fabs((double)qi[e]));
                                        ks += fabs((double)kj[e]);
                                        a += fabs((double)qi[e] * kj[e]);
                                        sc += (double)qi[e] * kj[e];
                                    }
                                    dj += amax / 254.0 * (1.0 + 0x1p-13) * ks;
                                }
                                A = fmax(A, scale * a);
                                T = fmax(T, fabs(scale * sc));
                                dq = fmax(dq, scale * dj);
                            }
                            const double delta = (E + 2) * u * A + 8 * u * T + dq;
                            const double n = (double)(last + 1 < klen[b] ? last + 1 : klen[b]);
                            const double bound = vmax * ((exp(2 * delta) - 1) + (3 * n + 32) * u) + (3 * n + 32) * 0x1p-150;
                            for (int64_t d = 0; d < EV; ++d) {
                                const size_t at = (size_t)(((b * HQ + h) * L + i) * EV + d);
                                const double err = fabs((double)rr->out[at] - ref[at]);
                                worst = fmax(worst, err / bound);
                                if (err > bound)
                                    fail_msg("REDUCED q8_0 out[%zu] = %.9g, float64 %.9g: error %g > bound %g", at,
                                             (double)rr->out[at], ref[at], err, bound);
                                differs |= rr->out[at] != rd->out[at];
                            }
                        }
                if (!differs)
                    fail_msg("REDUCED q8_0 with VNNI gave the exact (DEFAULT) bits: the int8 path did not run");
                ++ran;
            }
            sdpa__dispatch_set_max_isa_for_testing(-1);
            free(rr);
            free(rd);
            free(ref);
            free(q);
        }
        store_free(&k);
        store_free(&v);
    }
    if (ran == 0)
        printf("# REDUCED q8_0 int8 scores: not run (the CPU lacks AVX512-VNNI or AVX-512)\n");
    else
        printf("# REDUCED q8_0 int8 scores: %d runs within the bound (largest error/bound %.3g)\n", ran, worst);
}

/* The int8 score column itself: every score within |s - s64| <= sum_b (amax_b / 254)(1 + 2^-13)
 * sum_{e in b} |k_e| + (E + 2) u sum_e |q_e k_e| (sdpa.h, REDUCED), on random blocks (qs -128
 * included), keys of mixed sizes, and positive q and k (where clipping or a wrong offset would
 * add up). */
static void kv8_reduced_q8_0_score_column_bound(void **state) {
    (void)state;
    if (!sdpa__cpu_has_isa(SDPA__ISA_AVX512) || !sdpa__cpu_features()->avx512vnni) {
        printf("# int8 score column: not run (the CPU lacks AVX512-VNNI)\n");
        return;
    }
    sdpa__dispatch_set_max_isa_for_testing(SDPA__ISA_AVX512);
    const sdpa__mk_kv *col = sdpa__dispatch_mk_kv_q8_0_reduced();
    assert_non_null(col);
    sdpa__dispatch_set_max_isa_for_testing(SDPA__ISA_AVX2);
    assert_null(sdpa__dispatch_mk_kv_q8_0_reduced()); /* below AVX512: none */
    sdpa__dispatch_set_max_isa_for_testing(-1);
    enum { NE = 128, NK = 37 };
    static unsigned char kb[NK * (NE / 32) * 34] __attribute__((aligned(2)));
    float q[NE], s[NK];
    double worst = 0.0;
    for (int round = 0; round < 40; ++round) {
        const bool positive = round % 2 == 1;
        for (int e = 0; e < NE; ++e)
            q[e] = positive ? fabsf(frand()) + 0.01f : frand() * (e % 11 == 0 ? 6.0f : 1.0f);
        for (int t = 0; t < NK; ++t)
            for (int b = 0; b < NE / 32; ++b) {
                unsigned char *blk = kb + (t * (NE / 32) + b) * 34;
                g_q8_exp = 4 + (unsigned)(t % 6), g_q8_exps = 2;
                rand_q8_block(blk);
                if (positive) {
                    blk[1] &= 0x7F;
                    for (int j = 0; j < 32; ++j)
                        blk[2 + j] &= 0x7F;
                }
            }
        g_q8_exp = 9, g_q8_exps = 6;
        col->dot_rows(q, NE, kb, NE / 32, NK, s, NULL);
        for (int t = 0; t < NK; ++t) {
            double exact = 0.0, absqk = 0.0, bq = 0.0;
            for (int b = 0; b < NE / 32; ++b) {
                double amax = 0.0, ks = 0.0;
                for (int j = 0; j < 32; ++j) {
                    const int e = 32 * b + j;
                    const double kv = q8_value(kb + (t * (NE / 32) + b) * 34, j);
                    amax = fmax(amax, fabs((double)q[e]));
                    ks += fabs(kv);
                    exact += (double)q[e] * kv;
                    absqk += fabs((double)q[e] * kv);
                }
                bq += amax / 254.0 * (1.0 + 0x1p-13) * ks;
            }
            const double bound = bq + (NE + 2) * 0x1p-24 * absqk;
            const double err = fabs((double)s[t] - exact);
            worst = fmax(worst, err / bound);
            if (err > bound)
                fail_msg("int8 score round %d key %d: %.9g, exact %.9g (error %g > %g)", round, t, (double)s[t], exact,
                         err, bound);
        }
    }
    printf("# int8 score column: largest error/bound %.3g\n", worst);
}

/* Concurrency: 4 threads run 8-bit calls (q8_0 / FP8 with scales / mixed, every kernel, 2
 * threads each) on shared read-only caches at the same time; each result equals the one computed
 * alone first (no shared mutable state in the loaders, conversions or micro-kernels). */
typedef struct cjob {
    const float *q;
    const store *k, *v;
    int kernel;
    const sdpa_tensor *vs;
    const result *want;
    int bad;
} cjob;

static void *cjob_run(void *arg) {
    cjob *j = (cjob *)arg;
    static const int64_t klen[B] = {70, 45};
    result *r = malloc(sizeof *r);
    for (int it = 0; it < 20 && !j->bad; ++it) {
        if (attend(j->q, 3, &j->k->t, &j->v->t, j->kernel, klen, NULL, j->vs, 2, r) != SDPA_OK ||
            memcmp(r->out, j->want->out, sizeof(float) * B * HQ * 3 * EV) != 0)
            j->bad = 1;
    }
    free(r);
    return NULL;
}

static void kv8_concurrent_calls_are_independent(void **state) {
    (void)state;
    static const int kernels[4] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE, SDPA_KERNEL_AUTO};
    static const int64_t klen[B] = {70, 45};
    store k, v;
    store_make(&k, SDPA_DTYPE_Q8_0, E, false, 0);
    store_make(&v, SDPA_DTYPE_FP8_E5M2, EV, true, 2);
    sdpa_tensor vs;
    scale_view(&vs, &v, 2);
    float *q = malloc(sizeof(float) * B * HQ * 3 * E);
    for (int64_t i = 0; i < B * HQ * 3 * E; ++i)
        q[i] = frand();
    result *want = malloc(4 * sizeof *want);
    cjob jobs[4];
    pthread_t th[4];
    for (int t = 0; t < 4; ++t) {
        assert_int_equal(attend(q, 3, &k.t, &v.t, kernels[t], klen, NULL, &vs, 1, &want[t]), SDPA_OK);
        jobs[t] = (cjob){q, &k, &v, kernels[t], &vs, &want[t], 0};
    }
    for (int t = 0; t < 4; ++t)
        assert_int_equal(pthread_create(&th[t], NULL, cjob_run, &jobs[t]), 0);
    for (int t = 0; t < 4; ++t) {
        pthread_join(th[t], NULL);
        if (jobs[t].bad)
            fail_msg("thread %d (kernel %d): a concurrent 8-bit call differs from the call alone", t, kernels[t]);
    }
    free(want);
    free(q);
    store_free(&k);
    store_free(&v);
}

/* ============================================================ NaN / Inf */

static void kv8_non_finite_attended_fails_masked_is_never_read(void **state) {
    (void)state;
    static const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    /* (dtype, byte pattern of the poisoned unit) */
    static const struct {
        int dt;
        uint8_t b0, b1;
        int on_v;
    } poison[] = {
        {SDPA_DTYPE_FP8_E4M3, 0x7F, 0, 0}, {SDPA_DTYPE_FP8_E4M3, 0xFF, 0, 1}, {SDPA_DTYPE_FP8_E5M2, 0x7C, 0, 0},
        {SDPA_DTYPE_FP8_E5M2, 0xFE, 0, 1}, {SDPA_DTYPE_Q8_0, 0x00, 0x7C, 0},  {SDPA_DTYPE_Q8_0, 0x01, 0xFE, 1},
    };
    const int64_t klen[B] = {70, 45};
    float q[B * HQ * 3 * E];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i)
        q[i] = frand();
    int cases = 0;
    for (size_t pi = 0; pi < sizeof poison / sizeof poison[0]; ++pi) {
        const int dt = poison[pi].dt;
        for (int masked = 0; masked < 2; ++masked) {
            store k, v;
            store_make(&k, dt, E, false, 0);
            store_make(&v, dt, EV, false, 0);
            store *s = poison[pi].on_v ? &v : &k;
            /* attended: batch 1, kv head 1, key 20; masked: key 60 (>= key_lengths[1] = 45) */
            const int64_t j = masked ? 60 : 20;
            const int64_t off = 1 * s->t.strides[0] + 1 * s->t.strides[1] + j * s->t.strides[2] + 1; /* unit 1 of the row */
            unsigned char *u = s->raw + off * (int64_t)unit_of(dt);
            u[0] = poison[pi].b0;
            if (dt == SDPA_DTYPE_Q8_0)
                u[1] = poison[pi].b1;
            for (int kn = 0; kn < 3; ++kn) {
                result *r = malloc(sizeof *r);
                memset(r->out, 0x5A, sizeof r->out);
                const sdpa_status st = attend(q, 3, &k.t, &v.t, kernels[kn], klen, NULL, NULL, 2, r);
                if (masked) {
                    if (st != SDPA_OK)
                        fail_msg("poison %zu in a masked row: kernel %d returned %s (%s)", pi, kernels[kn],
                                 sdpa_status_string(st), sdpa_last_error_message());
                    for (size_t i = 0; i < (size_t)B * HQ * 3 * EV; ++i)
                        if (!isfinite(r->out[i]))
                            fail_msg("poison %zu in a masked row leaked into out[%zu]", pi, i);
                } else {
                    if (st != SDPA_ERR_NON_FINITE)
                        fail_msg("poison %zu (dtype %d, %s) attended: kernel %d returned %s", pi, dt,
                                 poison[pi].on_v ? "value" : "key", kernels[kn], sdpa_status_string(st));
                    for (size_t i = 0; i < sizeof r->out; ++i)
                        if (((unsigned char *)r->out)[i] != 0x5A)
                            fail_msg("poison %zu: out written on SDPA_ERR_NON_FINITE", pi);
                }
                free(r);
                ++cases;
            }
            store_free(&k);
            store_free(&v);
        }
    }
    /* an FP8 scale that overflows finite encodings: the values are not finite */
    {
        store k, v;
        store_make(&k, SDPA_DTYPE_FP8_E5M2, E, false, 0);
        store_make(&v, SDPA_DTYPE_F32, EV, false, 0);
        k.raw[0] = 0x7B; /* 57344 */
        float big = 3e38f;
        sdpa_tensor ks;
        const int64_t one = 1;
        assert_int_equal(sdpa_tensor_init(&ks, &big, 1, &one), SDPA_OK);
        result *r = malloc(sizeof *r);
        assert_int_equal(attend(q, 3, &k.t, &v.t, SDPA_KERNEL_AUTO, klen, &ks, NULL, 1, r), SDPA_ERR_NON_FINITE);
        free(r);
        store_free(&k);
        store_free(&v);
    }
    printf("# NaN/Inf cases: %d\n", cases);
}

/* ============================================================ validation */

#define EXPECT(call, status, needle)                                                                                 \
    do {                                                                                                             \
        const sdpa_status st_ = (call);                                                                              \
        if (st_ != (status))                                                                                         \
            fail_msg("%s: expected %s, got %s (%s)", #call, sdpa_status_string(status), sdpa_status_string(st_),     \
                     sdpa_last_error_message());                                                                     \
        const char *nd_ = (needle);                                                                                  \
        if (nd_ != NULL && strstr(sdpa_last_error_message(), nd_) == NULL)                                           \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #call, sdpa_last_error_message(), nd_);                     \
    } while (0)

static void kv8_validation_errors(void **state) {
    (void)state;
    static unsigned char buf[2 * 2 * 8 * 96 * 4] __attribute__((aligned(64)));
    static float qb[2 * 2 * 1 * 96], ob[2 * 2 * 1 * 96], sc[4] = {1, 1, 1, 1};
    sdpa_tensor q, k, v, out, t, s;
    const int64_t qsh[4] = {2, 2, 1, 64}, ksh[4] = {2, 2, 8, 64}, osh[4] = {2, 2, 1, 64};
    for (size_t i = 0; i < sizeof qb / sizeof qb[0]; ++i)
        qb[i] = 0.01f * (float)(i % 7);
    memset(buf, 0, sizeof buf);
    assert_int_equal(sdpa_tensor_init(&q, qb, 4, qsh), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&out, ob, 4, osh), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&k, buf, SDPA_DTYPE_Q8_0, 4, ksh), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&v, buf, SDPA_DTYPE_FP8_E4M3, 4, ksh), SDPA_OK);
    memset(ob, 0x5A, sizeof ob);
    assert_int_equal(sdpa_attention(&q, &k, &v, NULL, &out, NULL, NULL), SDPA_OK); /* all-zero caches */

    /* sizes and names */
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_Q8_0), 34);
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_FP8_E4M3), 1);
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_FP8_E5M2), 1);
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_Q8_0), "q8_0");
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_FP8_E4M3), "fp8_e4m3");
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_FP8_E5M2), "fp8_e5m2");

    /* the q8_0 view rule */
    const int64_t bad_e[2] = {4, 48};
    EXPECT(sdpa_tensor_init_dtype(&t, buf, SDPA_DTYPE_Q8_0, 2, bad_e), SDPA_ERR_SHAPE, "multiple of the block size");
    const int64_t sh2[2] = {4, 64}, st_bad[2] = {4, 2}, st_ok[2] = {2, 1};
    EXPECT(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_Q8_0, 2, sh2, st_bad), SDPA_ERR_STRIDE, "strides[1]=2");
    EXPECT(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_Q8_0, 2, sh2, st_ok), SDPA_OK, NULL);
    EXPECT(sdpa_tensor_init_strided(&t, buf + 1, SDPA_DTYPE_Q8_0, 2, sh2, st_ok), SDPA_ERR_ALIGNMENT, NULL);
    EXPECT(sdpa_tensor_init_strided(&t, buf + 1, SDPA_DTYPE_FP8_E5M2, 2, sh2, st_ok), SDPA_OK, NULL);
    /* a broadcast view with 2^67 logical elements over 2^62 blocks: no int64 overflow on the way */
    const int64_t huge[2] = {(int64_t)1 << 57, 1024}, bcast[2] = {0, 1};
    EXPECT(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_Q8_0, 2, huge, bcast), SDPA_OK, NULL);
    EXPECT(sdpa_tensor_init_strided(&t, NULL, SDPA_DTYPE_Q8_0, 2, huge, bcast), SDPA_ERR_NULL_POINTER, "blocks");
    /* a hand-made view that breaks the rules reaches sdpa_attention */
    sdpa_tensor kb = k;
    kb.shape[3] = 48;
    EXPECT(sdpa_attention(&q, &kb, &v, NULL, &out, NULL, NULL), SDPA_ERR_SHAPE, "key is a q8_0 view");
    kb = k;
    kb.strides[3] = 2;
    EXPECT(sdpa_attention(&q, &kb, &v, NULL, &out, NULL, NULL), SDPA_ERR_STRIDE, "key.strides[3]=2");

    /* a q8_0 view's extent is its blocks: an out right after the cache's last block does not
     * overlap it (2 x 2 x 8 rows x 2 blocks = 2176 bytes, then out) */
    {
        static unsigned char joint[2176 + 2 * 2 * 64 * 4] __attribute__((aligned(64)));
        sdpa_tensor kj, oj;
        assert_int_equal(sdpa_tensor_init_dtype(&kj, joint, SDPA_DTYPE_Q8_0, 4, ksh), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&oj, (float *)(void *)(joint + 2176), 4, osh), SDPA_OK);
        EXPECT(sdpa_attention(&q, &kj, &v, NULL, &oj, NULL, NULL), SDPA_OK, NULL);
        sdpa_tensor oj2;
        assert_int_equal(sdpa_tensor_init(&oj2, (float *)(void *)(joint + 2176 - 64), 4, osh), SDPA_OK);
        EXPECT(sdpa_attention(&q, &kj, &v, NULL, &oj2, NULL, NULL), SDPA_ERR_OVERLAP, "overlaps input key");
    }

    /* 8-bit q, out, bias */
    sdpa_tensor q8;
    assert_int_equal(sdpa_tensor_init_dtype(&q8, buf, SDPA_DTYPE_Q8_0, 4, qsh), SDPA_OK);
    EXPECT(sdpa_attention(&q8, &k, &v, NULL, &out, NULL, NULL), SDPA_ERR_DTYPE, "only sdpa_attention's key and value");
    sdpa_tensor o8;
    static unsigned char ob8[2 * 2 * 64] __attribute__((aligned(64)));
    assert_int_equal(sdpa_tensor_init_dtype(&o8, ob8, SDPA_DTYPE_FP8_E4M3, 4, osh), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &v, NULL, &o8, NULL, NULL), SDPA_ERR_DTYPE, "out.dtype");
    sdpa_options o;
    sdpa_options_init(&o);
    sdpa_tensor bias;
    const int64_t bsh[1] = {8};
    assert_int_equal(sdpa_tensor_init_dtype(&bias, buf, SDPA_DTYPE_FP8_E5M2, 1, bsh), SDPA_OK);
    o.bias = &bias;
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_DTYPE, "bias.dtype");

    /* scales */
    sdpa_options_init(&o);
    const int64_t n1 = 1, n2 = 2, n3 = 3;
    assert_int_equal(sdpa_tensor_init(&s, sc, 1, &n1), SDPA_OK);
    o.k_scale = &s; /* k is q8_0 */
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "options->k_scale");
    o.k_scale = NULL;
    o.v_scale = &s;
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_OK, NULL);
    assert_int_equal(sdpa_tensor_init(&s, sc, 1, &n2), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_OK, NULL); /* [Hkv] */
    assert_int_equal(sdpa_tensor_init(&s, sc, 1, &n3), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_SHAPE, "options->v_scale.shape[0]=3");
    const int64_t sh12[2] = {1, 2};
    assert_int_equal(sdpa_tensor_init(&s, sc, 2, sh12), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_RANK, "options->v_scale");
    assert_int_equal(sdpa_tensor_init_dtype(&s, sc, SDPA_DTYPE_F16, 1, &n1), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_DTYPE, "scales are float32");
    assert_int_equal(sdpa_tensor_init(&s, sc, 1, &n2), SDPA_OK);
    const float bad[3] = {NAN, -1.0f, INFINITY};
    for (int i = 0; i < 3; ++i) {
        sc[1] = bad[i];
        EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "options->v_scale[1]");
    }
    sc[1] = 1.0f;
    /* out untouched by every failure above (the last success wrote out; poison it and fail) */
    memset(ob, 0x5A, sizeof ob);
    sc[0] = NAN;
    EXPECT(sdpa_attention(&q, &k, &v, &o, &out, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, NULL);
    for (size_t i = 0; i < sizeof ob; ++i)
        assert_int_equal(((unsigned char *)ob)[i], 0x5A);
    sc[0] = 1.0f;
    /* a scale with a non-FP8 value cache */
    sdpa_tensor vf16;
    assert_int_equal(sdpa_tensor_init_dtype(&vf16, buf, SDPA_DTYPE_F16, 4, ksh), SDPA_OK);
    EXPECT(sdpa_attention(&q, &k, &vf16, &o, &out, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT, "not an FP8 dtype");
}

/* sdpa_attention_cost counts a q8_0 row as E / 32 blocks of 34 bytes, an FP8 row as E bytes,
 * and names the kernel with the dtype tag the call leaves. */
static void kv8_cost_counts_block_bytes(void **state) {
    (void)state;
    store k, v;
    store_make(&k, SDPA_DTYPE_Q8_0, E, false, 0);
    store_make(&v, SDPA_DTYPE_FP8_E5M2, EV, false, 0);
    float q[B * HQ * 1 * E], out[B * HQ * 1 * EV];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i)
        q[i] = frand();
    sdpa_tensor tq, to;
    const int64_t qsh[4] = {B, HQ, 1, E}, osh[4] = {B, HQ, 1, EV};
    assert_int_equal(sdpa_tensor_init(&tq, q, 4, qsh), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, out, 4, osh), SDPA_OK);
    sdpa_cost c8, cf;
    sdpa_cost_init(&c8);
    sdpa_cost_init(&cf);
    assert_int_equal(sdpa_attention_cost(&tq, &k.t, &v.t, NULL, &to, NULL, NULL, NULL, &c8), SDPA_OK);
    assert_int_equal(sdpa_attention_cost(&tq, &k.tf, &v.tf, NULL, &to, NULL, NULL, NULL, &cf), SDPA_OK);
    assert_int_equal(c8.bytes_read_k, cf.bytes_read_k / 4 / 32 * 34);
    assert_int_equal(c8.bytes_read_v, cf.bytes_read_v / 4);
    assert_int_equal(sdpa_attention(&tq, &k.t, &v.t, NULL, &to, NULL, NULL), SDPA_OK);
    assert_string_equal(c8.kernel, sdpa_last_kernel());
    store_free(&k);
    store_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv8_every_fp8_encoding_every_table),
        cmocka_unit_test(kv8_every_fp8_encoding_every_microkernel),
        cmocka_unit_test(kv8_q8_0_dequantize_matches_ggml_layout),
        cmocka_unit_test(kv8_attention_matches_dequantized_f32),
        cmocka_unit_test(kv8_paged_and_packed_match_f32),
        cmocka_unit_test(kv8_packed_cu_seqlens_k_matches_f32),
        cmocka_unit_test(kv8_guard_pages_no_out_of_bounds_read),
        cmocka_unit_test(kv8_reduced_q8_0_int8_scores_within_bound),
        cmocka_unit_test(kv8_reduced_q8_0_score_column_bound),
        cmocka_unit_test(kv8_concurrent_calls_are_independent),
        cmocka_unit_test(kv8_non_finite_attended_fails_masked_is_never_read),
        cmocka_unit_test(kv8_validation_errors),
        cmocka_unit_test(kv8_cost_counts_block_bytes),
    };
    return cmocka_run_group_tests_name("kv8", tests, NULL, NULL);
}
