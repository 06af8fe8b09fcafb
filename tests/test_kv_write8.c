/*
 * The cache write into 8-bit K/V caches (issue 31, write side): sdpa_kv_write_ex into q8_0 and
 * FP8 E4M3FN / E5M2 caches, white box for the conversion tables (every ISA table the CPU runs),
 * and through the public entry for everything else.
 *
 * The oracles are this file's own, written from the formats' documentation, not from the
 * library's code:
 *  - q8_0: ggml's quantize_row_q8_0_ref as documented (amax = max |x| over the 32 elements,
 *    d = amax / 127 in float, id = d ? 1/d : 0, q = roundf(x * id), d stored with
 *    GGML_FP32_TO_FP16, round to nearest even); the binary16 rounding of d and the
 *    round-half-away of q are computed here in double with nearbyint / floor;
 *  - FP8: the nearest of the 256 encodings' exact values (decoded with ldexp), found by a
 *    scan in double, ties to the even encoding, saturating to the largest finite value;
 *    y = x / scale in float32 first (vLLM's scaled_fp8_conversion).
 *
 * Tests:
 *  - q8_0 bit-exact against the reference: random blocks of many magnitudes, ties
 *    x * id = k + 0.5, an all-zero block, tiny and subnormal amax, a negative maximum,
 *    E = 64 / 128 / 256 / 4160 (chunked), strided and reversed rows, paged slots, -1 skips
 *    (untouched bytes), every conversion table; and the stated per-element error bound;
 *  - FP8: every encoding decoded and re-encoded returns itself (NaN: the canonical s.1111111),
 *    every midpoint between neighbours ties to the even encoding (and a float either side of
 *    it rounds to the nearer), saturation (Inf included), random floats against the double
 *    reference and within the stated relative / absolute bounds, per-tensor [1] and per-head
 *    [Hkv] scales, every conversion table;
 *  - validation: bad scales, a scale on a non-FP8 cache, positions without rope, struct_size:
 *    the status, and the caches untouched;
 *  - RoPE: kv_write_ex with rope (tables; both conventions, full and partial rotary_dim) into
 *    q8_0 / FP8 / f16 / f32 caches equals this file's float32 rotation then its narrowing; with
 *    theta, the f32 cache equals sdpa_rope's rows and a float64 rotation within 2^-17; a position
 *    outside the tables is SDPA_ERR_INDEX with the cache untouched;
 *  - round trip: kv_write_ex into a paged q8_0 cache (block table) -> sdpa_attention decode,
 *    against float64 on the dequantized cache bytes (the float32 bound of sdpa_precision)
 *    and against float64 on the unquantized rows (the quantization bound propagated).
 */
#include <math.h>
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
#include "sdpa.h"

/* max of two doubles by compare and select, not fmax: gcc 12 for aarch64 stops with an internal
 * compiler error (vect_transform_reduction) vectorising fmax reductions (the aarch64 CI job);
 * NaN in b is ignored as fmax ignores it. */
static inline double dmax(double a, double b) { return b > a ? b : a; }

/* ------------------------------------------------------------------ helpers */

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static float urand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float ffrom(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static void expect(sdpa_status got, sdpa_status want, const char *needle) {
    if (got != want)
        fail_msg("status %s, expected %s: %s", sdpa_status_string(got), sdpa_status_string(want),
                 sdpa_last_error_message());
    if (needle && !strstr(sdpa_last_error_message(), needle))
        fail_msg("message \"%s\" does not name \"%s\"", sdpa_last_error_message(), needle);
}

/* Every conversion table this build has and the CPU runs. */
static int tables_of(const sdpa__convert **t) {
    int n = 0;
    t[n++] = &sdpa__convert_portable;
#if defined(SDPA_HAVE_CONVERT_AVX2)
    if (sdpa__cpu_has_isa(SDPA__ISA_AVX2))
        t[n++] = &sdpa__convert_avx2;
#endif
#if defined(SDPA_HAVE_CONVERT_AVX512)
    if (sdpa__cpu_has_isa(SDPA__ISA_AVX512))
        t[n++] = &sdpa__convert_avx512;
#endif
#if defined(SDPA_HAVE_AVX512BF16)
    if (sdpa__cpu_features()->avx512bf16 && sdpa__cpu_has_isa(SDPA__ISA_AVX512))
        t[n++] = &sdpa__convert_avx512bf16;
#endif
    return n;
}

/* ------------------------------------------------- the formats, from their documentation */

/* binary16 (finite) value */
static double half_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -v : v;
}

/* GGML_FP32_TO_FP16 of a float d >= 0 that is finite: nearest binary16, ties to even, Inf from
 * 65520 up; computed in double (exact) with nearbyint (the default mode rounds ties to even). */
static uint16_t ref_f16(float f) {
    const double d = f;
    if (d == 0.0)
        return 0;
    if (d >= 65520.0)
        return 0x7C00;
    int e2;
    frexp(d, &e2);
    int E = e2 - 1; /* floor(log2 d) */
    if (E < -14)
        E = -14;
    double q = nearbyint(ldexp(d, 10 - E)); /* d / 2^(E - 10), in [0, 2048] */
    if (q >= 2048.0) {
        q /= 2.0;
        E += 1;
    }
    if (q < 1024.0)
        return (uint16_t)q; /* subnormal (E = -14) or 0 */
    return (uint16_t)(((E + 15) << 10) | ((int)q - 1024));
}

/* roundf: nearest, ties away from zero (v is a float, v + 0.5 exact in double). */
static double round_away(double v) { return v < 0 ? -floor(-v + 0.5) : floor(v + 0.5); }

/* One q8_0 block from 32 floats, ggml's algorithm; the library's documented rule where ggml's
 * is undefined (a product beyond int8: saturate to +-127, NaN to 0; a NaN in the block: d NaN
 * 0x7E00, q 0; an Inf: d +Inf, q 0). */
static void ref_q8_0(const float *x, unsigned char *blk) {
    float amax = 0.0f;
    int nan = 0, inf = 0;
    for (int j = 0; j < 32; ++j) {
        const float a = fabsf(x[j]);
        if (isnan(a))
            nan = 1;
        else if (isinf(a))
            inf = 1;
        else if (a > amax)
            amax = a;
    }
    uint16_t dh;
    if (nan || inf) {
        dh = nan ? 0x7E00 : 0x7C00;
        memset(blk + 2, 0, 32);
    } else {
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        dh = ref_f16(d);
        for (int j = 0; j < 32; ++j) {
            const float v = x[j] * id;
            double q = isnan(v) ? 0.0 : round_away((double)v);
            if (q > 127.0)
                q = 127.0;
            if (q < -127.0)
                q = -127.0;
            blk[2 + j] = (unsigned char)(int8_t)(int)q;
        }
    }
    blk[0] = (unsigned char)(dh & 0xFF); /* little-endian, as ggml stores ggml_half on x86/arm */
    blk[1] = (unsigned char)(dh >> 8);
}

/* FP8 decoding: 0 finite (*v), 1 Inf, 2 NaN. */
static int fp8_value(int dt, uint8_t b, double *v) {
    const int s = b >> 7;
    if (dt == SDPA_DTYPE_FP8_E4M3) {
        const int e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7)
            return 2;
        *v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    } else {
        const int e = (b >> 2) & 31, m = b & 3;
        if (e == 31)
            return m == 0 ? 1 : 2;
        *v = e == 0 ? ldexp(m / 4.0, -14) : ldexp(1.0 + m / 4.0, e - 15);
    }
    if (s)
        *v = -*v;
    return 0;
}
static double fp8_max(int dt) { return dt == SDPA_DTYPE_FP8_E4M3 ? 448.0 : 57344.0; }

/* The FP8 encoding of float y: nearest finite value by a scan, ties to the even encoding,
 * saturating beyond the largest finite value; NaN -> s.1111111. */
static uint8_t ref_fp8(int dt, float y) {
    const uint8_t sign = (fbits(y) >> 31) ? 0x80 : 0x00;
    if (isnan(y))
        return (uint8_t)(sign | 0x7F);
    const double a = fabs((double)y);
    int best = -1;
    double bd = 0.0;
    for (int b = 0; b < 128; ++b) {
        double v;
        if (fp8_value(dt, (uint8_t)b, &v) != 0)
            continue;
        const double dd = fabs(a - v);
        if (best < 0 || dd < bd || (dd == bd && (b & 1) == 0)) {
            best = b;
            bd = dd;
        }
    }
    if (a > fp8_max(dt)) /* saturation (Inf too) */
        best = dt == SDPA_DTYPE_FP8_E4M3 ? 0x7E : 0x7B;
    return (uint8_t)(sign | best);
}

/* ---------------------------------------------------------- views of a cache */

enum { NB = 5, HKV = 2, BS = 4 };

/* A cache [NB, HKV, BS, w] of dtype dt, contiguous (storage units: q8_0 blocks). */
typedef struct cache {
    int dt;
    int64_t w, units; /* elements per row, storage units per row */
    size_t unit, bytes;
    unsigned char *mem;
    sdpa_tensor t;
} cache;

static void cache_make(cache *c, int dt, int64_t w) {
    c->dt = dt;
    c->w = w;
    c->unit = sdpa_dtype_size((sdpa_dtype)dt);
    c->units = dt == SDPA_DTYPE_Q8_0 ? w / 32 : w;
    c->bytes = (size_t)(NB * HKV * BS * c->units) * c->unit;
    c->mem = aligned_alloc(64, (c->bytes + 63) / 64 * 64);
    memset(c->mem, 0xCD, c->bytes);
    const int64_t shape[4] = {NB, HKV, BS, w}, st[4] = {HKV * BS * c->units, BS * c->units, c->units, 1};
    assert_int_equal(sdpa_tensor_init_strided(&c->t, c->mem, (sdpa_dtype)dt, 4, shape, st), SDPA_OK);
}

static unsigned char *cache_row(const cache *c, int64_t slot, int64_t h) {
    return c->mem + (size_t)(((slot / BS) * HKV + h) * BS + slot % BS) * (size_t)c->units * c->unit;
}

/* ============================================================== q8_0 */

/* Random block contents of magnitude about 2^k, k in [-30, 20]; special blocks by kind. */
static void fill_block(float *x, int kind) {
    const double mag = ldexp(1.0, (int)(rnd() % 51) - 30);
    for (int j = 0; j < 32; ++j)
        x[j] = (float)(urand() * mag);
    switch (kind) {
    case 1: /* ties: amax 127 gives d = 1, id = 1: x = k + 0.5 exactly */
        for (int j = 0; j < 32; ++j)
            x[j] = (float)((int)(rnd() % 253) - 126) + (j % 2 ? 0.5f : -0.5f);
        x[0] = 127.0f;
        break;
    case 2: /* all zero (and signed zeros) */
        for (int j = 0; j < 32; ++j)
            x[j] = j % 3 ? 0.0f : -0.0f;
        break;
    case 3: /* tiny amax: d a binary16 subnormal */
        for (int j = 0; j < 32; ++j)
            x[j] = (float)(urand() * 1e-5);
        break;
    case 4: /* subnormal float32 amax: 1 / d overflows (the saturation rule) */
        for (int j = 0; j < 32; ++j)
            x[j] = ffrom((uint32_t)(rnd() % 0x7FFFFF) | ((rnd() & 1) << 31));
        break;
    case 5: /* the maximum is negative */
        x[7] = -(float)(4.0 * mag);
        break;
    case 6: /* ties at other d: x * id = k + 0.5 with d a power of two times 1/127 */
        for (int j = 0; j < 32; ++j)
            x[j] = (float)ldexp((double)((int)(rnd() % 254) - 127) + 0.5, -3);
        x[3] = (float)ldexp(127.0, -3);
        break;
    default:
        break;
    }
}

static void check_block(const unsigned char *got, const float *x, const char *where, int64_t at) {
    unsigned char want[34];
    ref_q8_0(x, want);
    if (memcmp(got, want, 34) != 0) {
        for (int j = 0; j < 34; ++j)
            if (got[j] != want[j])
                fail_msg("%s (block %lld): byte %d is 0x%02x, reference 0x%02x (x[%d] = %a)", where, (long long)at, j,
                         got[j], want[j], j < 2 ? 0 : j - 2, j < 2 ? 0.0 : (double)x[j - 2]);
    }
}

/* Every table's narrow_q8_0 on many blocks of every kind (and its error bound). */
static void kvw8_q8_0_every_table_matches_ggml_reference(void **state) {
    (void)state;
    enum { NBLK = 64 };
    const sdpa__convert *tabs[4];
    const int nt = tables_of(tabs);
    float x[NBLK * 32];
    unsigned char got[NBLK * 34];
    double worst = 0.0;
    for (int round = 0; round < 200; ++round) {
        for (int i = 0; i < NBLK; ++i)
            fill_block(x + 32 * i, (int)((i + round) % 8));
        for (int ti = 0; ti < nt; ++ti) {
            memset(got, 0xCD, sizeof got);
            tabs[ti]->narrow_q8_0(x, NBLK, got);
            for (int i = 0; i < NBLK; ++i)
                check_block(got + 34 * i, x + 32 * i, tabs[ti]->name, i);
        }
        /* the per-element bound of the header: |x - q * D| <= amax (1/254 + 2^-11)(1 + 2^-14) + 127 * 2^-25 */
        for (int i = 0; i < NBLK; ++i) {
            const unsigned char *b = got + 34 * i;
            const uint16_t dh = (uint16_t)(b[0] | (b[1] << 8));
            double amax = 0.0;
            for (int j = 0; j < 32; ++j)
                amax = dmax(amax, fabs((double)x[32 * i + j]));
            const double bound = amax * (1.0 / 254.0 + ldexp(1.0, -11)) * (1.0 + ldexp(1.0, -14)) + 127.0 * ldexp(1.0, -25);
            for (int j = 0; j < 32; ++j) {
                const double xh = (double)((float)(int8_t)b[2 + j] * (float)half_value(dh));
                const double err = fabs(xh - (double)x[32 * i + j]);
                if (err > bound)
                    fail_msg("q8_0 block %d element %d: error %g above the bound %g (amax %g)", i, j, err, bound, amax);
                if (amax >= 127.0 * ldexp(1.0, -14) && err / amax > worst)
                    worst = err / amax;
            }
        }
    }
    printf("# q8_0: %d tables x 12800 blocks bit-exact; largest error / amax (normal d) %.6f (bound %.6f)\n", nt,
           worst, (1.0 / 254.0 + ldexp(1.0, -11)) * (1.0 + ldexp(1.0, -14)));
}

/* The tie rule in isolation: amax 127 (d = 1, id = 1), x = k + 0.5 rounds away from zero. */
static void kvw8_q8_0_ties_round_away(void **state) {
    (void)state;
    float x[32];
    unsigned char b[34];
    for (int j = 0; j < 32; ++j)
        x[j] = (float)(j - 16) + 0.5f;
    x[31] = 127.0f;
    sdpa__convert_portable.narrow_q8_0(x, 1, b);
    assert_int_equal(b[0] | (b[1] << 8), 0x3C00); /* d = 1 */
    for (int j = 0; j < 31; ++j) {
        const int want = j - 16 >= 0 ? j - 16 + 1 : j - 16; /* (k + 0.5) away from zero */
        assert_int_equal((int8_t)b[2 + j], want);
    }
    /* non-finite blocks: NaN -> d NaN, Inf -> d Inf; qs 0 */
    x[5] = NAN;
    sdpa__convert_portable.narrow_q8_0(x, 1, b);
    assert_int_equal(b[0] | (b[1] << 8), 0x7E00);
    x[5] = -INFINITY;
    sdpa__convert_portable.narrow_q8_0(x, 1, b);
    assert_int_equal(b[0] | (b[1] << 8), 0x7C00);
    for (int j = 0; j < 32; ++j)
        assert_int_equal(b[2 + j], 0);
}

/* Rows [T, HKV, w] of float32 with strides (possibly negative: reversed rows). */
static void q8_0_write_case(int64_t w, int rdtype, bool reversed, bool strided) {
    const int64_t T = 7;
    cache kc, vc;
    cache_make(&kc, SDPA_DTYPE_Q8_0, w);
    cache_make(&vc, SDPA_DTYPE_Q8_0, w);
    const int64_t es = strided ? 3 : 1; /* element stride of the rows */
    const size_t n = (size_t)(T * HKV * w * es);
    float *kf = malloc(n * sizeof(float)), *vf = malloc(n * sizeof(float));
    uint16_t *k16 = malloc(n * sizeof(uint16_t)), *v16 = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i += 32)
        fill_block(kf + i, (int)(rnd() % 8)), fill_block(vf + i, (int)(rnd() % 8));
    for (size_t i = 0; i < n; ++i) { /* an f16/bf16 row holds the value it rounds to */
        if (rdtype == SDPA_DTYPE_F16) {
            k16[i] = sdpa__f32_to_f16(kf[i]), kf[i] = sdpa__f16_to_f32(k16[i]);
            v16[i] = sdpa__f32_to_f16(vf[i]), vf[i] = sdpa__f16_to_f32(v16[i]);
        } else if (rdtype == SDPA_DTYPE_BF16) {
            k16[i] = sdpa__f32_to_bf16(kf[i]), kf[i] = sdpa__bf16_to_f32(k16[i]);
            v16[i] = sdpa__f32_to_bf16(vf[i]), vf[i] = sdpa__bf16_to_f32(v16[i]);
        }
    }
    /* row (t, h) element e at ((t * HKV + h) * w + e) * es, or reversed in t */
    const int64_t shape[3] = {T, HKV, w};
    int64_t st[3] = {HKV * w * es, w * es, es};
    ptrdiff_t base = 0;
    if (reversed) {
        st[0] = -st[0];
        base = (ptrdiff_t)((T - 1) * HKV * w * es);
    }
    const void *kd = rdtype == SDPA_DTYPE_F32 ? (const void *)(kf + base) : (const void *)(k16 + base);
    const void *vd = rdtype == SDPA_DTYPE_F32 ? (const void *)(vf + base) : (const void *)(v16 + base);
    sdpa_tensor tk, tv;
    assert_int_equal(sdpa_tensor_init_strided(&tk, kd, (sdpa_dtype)rdtype, 3, shape, st), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&tv, vd, (sdpa_dtype)rdtype, 3, shape, st), SDPA_OK);
    const int64_t slots[7] = {17, 3, -1, 0, 19, -1, 8}; /* paged: blocks 4, 0, 0, 4, 2 */
    unsigned char *kbefore = malloc(kc.bytes);
    memcpy(kbefore, kc.mem, kc.bytes);
    sdpa_kv_write_options o;
    sdpa_kv_write_options_init(&o);
    expect(sdpa_kv_write_ex(&kc.t, &vc.t, &tk, &tv, slots, &o), SDPA_OK, NULL);
    bool written[NB * BS] = {false};
    for (int64_t t = 0; t < T; ++t) {
        if (slots[t] < 0)
            continue;
        written[slots[t]] = true;
        const int64_t tt = reversed ? T - 1 - t : t; /* the memory row */
        for (int64_t h = 0; h < HKV; ++h) {
            float row[4160];
            for (int64_t e = 0; e < w; ++e)
                row[e] = kf[((tt * HKV + h) * w + e) * es];
            for (int64_t bk = 0; bk < w / 32; ++bk)
                check_block(cache_row(&kc, slots[t], h) + bk * 34, row + bk * 32, "key_cache", bk);
            for (int64_t e = 0; e < w; ++e)
                row[e] = vf[((tt * HKV + h) * w + e) * es];
            for (int64_t bk = 0; bk < w / 32; ++bk)
                check_block(cache_row(&vc, slots[t], h) + bk * 34, row + bk * 32, "value_cache", bk);
        }
    }
    for (int64_t s = 0; s < NB * BS; ++s) /* slots no row names (the -1 rows included) are untouched */
        if (!written[s])
            for (int64_t h = 0; h < HKV; ++h)
                assert_memory_equal(cache_row(&kc, s, h), kbefore + (cache_row(&kc, s, h) - kc.mem),
                                    (size_t)kc.units * kc.unit);
    /* sdpa_kv_write (no options) is the same function */
    memset(kc.mem, 0, kc.bytes);
    expect(sdpa_kv_write(&kc.t, NULL, &tk, NULL, slots), SDPA_OK, NULL);
    for (int64_t t = 0; t < T; ++t)
        if (slots[t] >= 0) {
            const int64_t tt = reversed ? T - 1 - t : t;
            float row[4160];
            for (int64_t e = 0; e < w; ++e)
                row[e] = kf[((tt * HKV) * w + e) * es];
            for (int64_t bk = 0; bk < w / 32; ++bk)
                check_block(cache_row(&kc, slots[t], 0) + bk * 34, row + bk * 32, "key_cache (sdpa_kv_write)", bk);
        }
    free(kbefore);
    free(kf), free(vf), free(k16), free(v16);
    free(kc.mem), free(vc.mem);
}

static void kvw8_q8_0_write_paged_strided_reversed_bit_exact(void **state) {
    (void)state;
    static const int64_t widths[5] = {64, 128, 256, 4160, 32};
    for (int wi = 0; wi < 5; ++wi)
        for (int rd = SDPA_DTYPE_F32; rd <= SDPA_DTYPE_BF16; ++rd)
            for (int v = 0; v < 4; ++v)
                q8_0_write_case(widths[wi], rd, v & 1, v & 2);
    printf("# q8_0 write: E = 32/64/128/256/4160 x f32/f16/bf16 rows x plain/reversed/strided, paged, -1 skips\n");
}

/* ============================================================== FP8 */

static void narrow_fp8(const sdpa__convert *cv, int dt, const float *x, int64_t n, uint8_t *d, ptrdiff_t s, float sc) {
    (dt == SDPA_DTYPE_FP8_E4M3 ? cv->narrow_e4m3 : cv->narrow_e5m2)(x, n, d, s, sc);
}

/* Each of the 256 encodings, decoded exactly, re-encodes to itself (NaNs to s.1111111). */
static void kvw8_fp8_every_encoding_round_trips(void **state) {
    (void)state;
    const sdpa__convert *tabs[4];
    const int nt = tables_of(tabs);
    for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt)
        for (int ti = 0; ti < nt; ++ti) {
            float x[256];
            uint8_t got[512];
            for (int b = 0; b < 256; ++b) {
                double v;
                const int k = fp8_value(dt, (uint8_t)b, &v);
                x[b] = k == 0 ? (float)v : k == 1 ? ((b & 0x80) ? -INFINITY : INFINITY) : ffrom(((uint32_t)(b >> 7) << 31) | 0x7FC00000u);
            }
            memset(got, 0xEE, sizeof got);
            narrow_fp8(tabs[ti], dt, x, 256, got, 2, 1.0f); /* stride 2: the gaps untouched */
            for (int b = 0; b < 256; ++b) {
                double v;
                const int k = fp8_value(dt, (uint8_t)b, &v);
                const int want = k == 0 ? b : k == 2 ? ((b & 0x80) | 0x7F) : ((b & 0x80) | 0x7B); /* Inf saturates */
                if (got[2 * b] != want)
                    fail_msg("%s dtype %d: 0x%02x re-encodes to 0x%02x, expected 0x%02x", tabs[ti]->name, dt, b,
                             got[2 * b], want);
                assert_int_equal(got[2 * b + 1], 0xEE);
            }
        }
}

/* Midpoints of neighbouring encodings tie to the even one; one float either side goes to the
 * nearer; beyond the largest finite value everything saturates. */
static void kvw8_fp8_midpoints_ties_to_even_and_saturation(void **state) {
    (void)state;
    const sdpa__convert *tabs[4];
    const int nt = tables_of(tabs);
    for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt) {
        const int maxb = dt == SDPA_DTYPE_FP8_E4M3 ? 0x7E : 0x7B;
        for (int ti = 0; ti < nt; ++ti) {
            for (int b = 0; b < maxb; ++b)
                for (int sgn = 0; sgn < 2; ++sgn) {
                    double lo, hi;
                    fp8_value(dt, (uint8_t)b, &lo);
                    fp8_value(dt, (uint8_t)(b + 1), &hi);
                    const float mid = (float)((lo + hi) / 2); /* exact in float32 */
                    const float xs[3] = {nextafterf(mid, 0.0f), mid, nextafterf(mid, INFINITY)};
                    const int want[3] = {b, (b & 1) ? b + 1 : b, b + 1};
                    for (int i = 0; i < 3; ++i) {
                        const float x = sgn ? -xs[i] : xs[i];
                        uint8_t got;
                        narrow_fp8(tabs[ti], dt, &x, 1, &got, 1, 1.0f);
                        const int w = want[i] | (sgn ? 0x80 : 0);
                        if (!(b == 0 && i == 0) && got != w) /* below the first midpoint: 0 */
                            fail_msg("%s dtype %d: %a encodes to 0x%02x, expected 0x%02x", tabs[ti]->name, dt,
                                     (double)x, got, w);
                        if (got != ref_fp8(dt, x))
                            fail_msg("%s dtype %d: %a encodes to 0x%02x, reference 0x%02x", tabs[ti]->name, dt,
                                     (double)x, got, ref_fp8(dt, x));
                    }
                }
            const double mx = fp8_max(dt);
            const float big[7] = {(float)mx, (float)(mx * 1.03), (float)(mx * 1.07), (float)(mx * 1.5), 1e30f,
                                  3.4e38f, INFINITY};
            for (int i = 0; i < 7; ++i)
                for (int sgn = 0; sgn < 2; ++sgn) {
                    const float x = sgn ? -big[i] : big[i];
                    uint8_t got;
                    narrow_fp8(tabs[ti], dt, &x, 1, &got, 1, 1.0f);
                    assert_int_equal(got, maxb | (sgn ? 0x80 : 0));
                }
            /* tiny: below half the smallest subnormal -> signed zero; subnormal float32 inputs too */
            const float tiny[3] = {1e-30f, ffrom(1u), -ffrom(0x7FFFFFu)};
            for (int i = 0; i < 3; ++i) {
                uint8_t got;
                narrow_fp8(tabs[ti], dt, &tiny[i], 1, &got, 1, 1.0f);
                assert_int_equal(got, tiny[i] < 0 ? 0x80 : 0x00);
            }
        }
    }
}

/* Random floats of every magnitude (and scales) against the reference, and the bounds. */
static void kvw8_fp8_random_matches_reference_and_bounds(void **state) {
    (void)state;
    const sdpa__convert *tabs[4];
    const int nt = tables_of(tabs);
    enum { N = 4096 };
    static float x[N];
    static uint8_t got[N];
    static const float scales[4] = {1.0f, 0.037f, 3.0f, 1e-3f};
    for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt) {
        const int bias = dt == SDPA_DTYPE_FP8_E4M3 ? 7 : 15, mb = dt == SDPA_DTYPE_FP8_E4M3 ? 3 : 2;
        const double minnorm = ldexp(1.0, 1 - bias), sub_abs = ldexp(1.0, -bias - mb); /* half a subnormal step */
        const double rel = ldexp(1.0, -mb - 1);
        double worst_rel = 0.0, worst_abs = 0.0;
        for (int si = 0; si < 4; ++si)
            for (int round = 0; round < 8; ++round) {
                for (int i = 0; i < N; ++i) /* exponents 2^-30 .. 2^20 around the formats' ranges */
                    x[i] = ffrom((uint32_t)((rnd() & 1) << 31) | (uint32_t)((97 + rnd() % 50) << 23) |
                                 (uint32_t)(rnd() & 0x7FFFFF));
                for (int ti = 0; ti < nt; ++ti) {
                    narrow_fp8(tabs[ti], dt, x, N, got, 1, scales[si]);
                    for (int i = 0; i < N; ++i) {
                        const float y = x[i] / scales[si];
                        if (got[i] != ref_fp8(dt, y))
                            fail_msg("%s dtype %d: %a / %g encodes to 0x%02x, reference 0x%02x", tabs[ti]->name, dt,
                                     (double)x[i], (double)scales[si], got[i], ref_fp8(dt, y));
                    }
                }
                for (int i = 0; i < N; ++i) { /* the header's bounds on y = x / scale */
                    const double y = (double)(x[i] / scales[si]), a = fabs(y);
                    double v;
                    fp8_value(dt, got[i], &v);
                    const double err = fabs(v - y);
                    if (a > fp8_max(dt)) {
                        assert_true(fabs(v) == fp8_max(dt));
                    } else if (a >= minnorm) {
                        if (err > rel * a)
                            fail_msg("dtype %d: %a: relative error %g above %g", dt, y, err / a, rel);
                        worst_rel = dmax(worst_rel, err / a);
                    } else {
                        if (err > sub_abs)
                            fail_msg("dtype %d: %a: absolute error %g above %g", dt, y, err, sub_abs);
                        worst_abs = dmax(worst_abs, err);
                    }
                }
            }
        printf("# fp8 dtype %d: %d tables bit-exact; largest relative error (normal) %g (bound %g), absolute "
               "(subnormal) %g (bound %g)\n",
               dt, nt, worst_rel, rel, worst_abs, sub_abs);
    }
}

/* The scale is one float32 division (x / scale), not a multiply by 1 / scale: x near scale times
 * each midpoint between neighbouring encodings, where the two differ in the last bit of y and
 * the rounding to FP8 tells them apart. */
static void kvw8_fp8_scale_is_one_division(void **state) {
    (void)state;
    static const float scales[5] = {3.0f, 0.037f, 7.0f, 1e-3f, 0.3f};
    const sdpa__convert *tabs[4];
    const int nt = tables_of(tabs);
    int differ = 0;
    for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt) {
        const int maxb = dt == SDPA_DTYPE_FP8_E4M3 ? 0x7E : 0x7B;
        for (int si = 0; si < 5; ++si)
            for (int b = 1; b < maxb; ++b) {
                double lo, hi;
                fp8_value(dt, (uint8_t)b, &lo);
                fp8_value(dt, (uint8_t)(b + 1), &hi);
                float x = (float)((lo + hi) / 2) * scales[si];
                for (int k = 0; k < 4; ++k)
                    x = nextafterf(x, 0.0f);
                for (int k = 0; k < 9; ++k, x = nextafterf(x, INFINITY)) {
                    const uint8_t want = ref_fp8(dt, x / scales[si]);
                    differ += want != ref_fp8(dt, x * (1.0f / scales[si]));
                    for (int ti = 0; ti < nt; ++ti) {
                        uint8_t got;
                        narrow_fp8(tabs[ti], dt, &x, 1, &got, 1, scales[si]);
                        if (got != want)
                            fail_msg("%s dtype %d: %a / %g encodes to 0x%02x, expected 0x%02x", tabs[ti]->name, dt,
                                     (double)x, (double)scales[si], got, want);
                    }
                }
            }
    }
    printf("# fp8 scale: %d inputs where x / scale and x * (1 / scale) encode differently\n", differ);
    assert_true(differ > 0);
}

/* Per-tensor [1] and per-kv-head [Hkv] scales through sdpa_kv_write_ex (keys and values). */
static void kvw8_fp8_write_with_scales(void **state) {
    (void)state;
    const int64_t T = 6, w = 48;
    for (int dt = SDPA_DTYPE_FP8_E4M3; dt <= SDPA_DTYPE_FP8_E5M2; ++dt)
        for (int mode = 0; mode < 3; ++mode) {
            cache kc, vc;
            cache_make(&kc, dt, w);
            cache_make(&vc, dt, w);
            float kf[6 * HKV * 48], vf[6 * HKV * 48];
            for (int i = 0; i < 6 * HKV * 48; ++i)
                kf[i] = (float)(urand() * 600.0), vf[i] = (float)(urand() * 3.0);
            kf[5] = NAN, kf[6] = INFINITY, vf[7] = -1e9f;
            const int64_t shape[3] = {T, HKV, w};
            sdpa_tensor tk, tv, ks, vs;
            assert_int_equal(sdpa_tensor_init(&tk, kf, 3, shape), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&tv, vf, 3, shape), SDPA_OK);
            float ksc[HKV] = {2.5f, 0.75f}, vsc[HKV] = {0.01f, 4.0f};
            const int64_t n1 = 1, nh = HKV;
            assert_int_equal(sdpa_tensor_init(&ks, ksc, 1, mode == 2 ? &nh : &n1), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&vs, vsc, 1, mode == 1 ? &nh : &n1), SDPA_OK);
            sdpa_kv_write_options o;
            sdpa_kv_write_options_init(&o);
            o.k_scale = mode ? &ks : NULL;
            o.v_scale = mode ? &vs : NULL;
            const int64_t slots[6] = {0, 5, 9, 2, 19, 12};
            expect(sdpa_kv_write_ex(&kc.t, &vc.t, &tk, &tv, slots, &o), SDPA_OK, NULL);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < HKV; ++h) {
                    const float sk = mode == 0 ? 1.0f : mode == 2 ? ksc[h] : ksc[0];
                    const float sv = mode == 0 ? 1.0f : mode == 1 ? vsc[h] : vsc[0];
                    const uint8_t *kr = cache_row(&kc, slots[t], h), *vr = cache_row(&vc, slots[t], h);
                    for (int64_t e = 0; e < w; ++e) {
                        const float xk = kf[(t * HKV + h) * w + e], xv = vf[(t * HKV + h) * w + e];
                        if (kr[e] != ref_fp8(dt, xk / sk))
                            fail_msg("dtype %d mode %d: key (%lld, %lld, %lld) = %a stored 0x%02x, expected 0x%02x", dt,
                                     mode, (long long)t, (long long)h, (long long)e, (double)xk, kr[e],
                                     ref_fp8(dt, xk / sk));
                        if (vr[e] != ref_fp8(dt, xv / sv))
                            fail_msg("dtype %d mode %d: value (%lld, %lld, %lld) stored 0x%02x, expected 0x%02x", dt,
                                     mode, (long long)t, (long long)h, (long long)e, vr[e], ref_fp8(dt, xv / sv));
                    }
                }
            free(kc.mem), free(vc.mem);
        }
}

/* ============================================================== validation */

static void kvw8_validation_errors_leave_caches_untouched(void **state) {
    (void)state;
    const int64_t T = 2, w = 32;
    cache e4, f16c, q8;
    cache_make(&e4, SDPA_DTYPE_FP8_E4M3, w);
    cache_make(&f16c, SDPA_DTYPE_F16, w);
    cache_make(&q8, SDPA_DTYPE_Q8_0, w);
    float rows[2 * HKV * 32];
    for (int i = 0; i < 2 * HKV * 32; ++i)
        rows[i] = urand();
    const int64_t shape[3] = {T, HKV, w}, slots[2] = {1, 6};
    sdpa_tensor tr;
    assert_int_equal(sdpa_tensor_init(&tr, rows, 3, shape), SDPA_OK);
    float sc[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    uint16_t sc16[2] = {0x3C00, 0x3C00};
    const int64_t n1 = 1, n3 = 3;
    sdpa_tensor ts, ts3, ts16;
    assert_int_equal(sdpa_tensor_init(&ts, sc, 1, &n1), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&ts3, sc, 1, &n3), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&ts16, sc16, SDPA_DTYPE_F16, 1, &n1, (const int64_t[]){1}), SDPA_OK);
    sdpa_kv_write_options o;
    const float bad[5] = {0.0f, -1.0f, NAN, INFINITY, -0.0f};
    for (int i = 0; i < 5; ++i) {
        sdpa_kv_write_options_init(&o);
        sc[0] = bad[i];
        o.k_scale = &ts;
        expect(sdpa_kv_write_ex(&e4.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "options->k_scale[0]");
    }
    sc[0] = 1.0f;
    sdpa_kv_write_options_init(&o);
    o.k_scale = &ts;
    expect(sdpa_kv_write_ex(&f16c.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "not an FP8 cache");
    expect(sdpa_kv_write_ex(&q8.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "q8_0");
    sdpa_kv_write_options_init(&o);
    o.v_scale = &ts; /* no value cache */
    expect(sdpa_kv_write_ex(&e4.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "options->v_scale");
    sdpa_kv_write_options_init(&o);
    o.k_scale = &ts3;
    expect(sdpa_kv_write_ex(&e4.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_SHAPE, "Hkv=2");
    o.k_scale = &ts16;
    expect(sdpa_kv_write_ex(&e4.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_DTYPE, "float32");
    const int64_t pos[2] = {0, 1};
    sdpa_kv_write_options_init(&o);
    o.positions = pos;
    expect(sdpa_kv_write_ex(&q8.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "positions");
    sdpa_rope_params rp;
    memset(&rp, 0, sizeof rp);
    rp.struct_size = sizeof rp;
    sdpa_kv_write_options_init(&o);
    o.rope = &rp;
    expect(sdpa_kv_write_ex(&q8.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_INVALID_ARGUMENT, "positions");
    /* positions inside the cache: SDPA_ERR_OVERLAP */
    sdpa_kv_write_options_init(&o);
    o.rope = &rp;
    o.positions = (const int64_t *)(const void *)q8.mem;
    expect(sdpa_kv_write_ex(&q8.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_OVERLAP, "options->positions");
    sdpa_kv_write_options_init(&o);
    o.struct_size = 4;
    expect(sdpa_kv_write_ex(&q8.t, NULL, &tr, NULL, slots, &o), SDPA_ERR_STRUCT_VERSION, "struct_size");
    /* a q8_0 cache whose E is not a multiple of 32 cannot be viewed; rows of an 8-bit dtype are not taken */
    sdpa_tensor t8;
    const int64_t sh8[3] = {T, HKV, w};
    assert_int_equal(sdpa_tensor_init_strided(&t8, e4.mem, SDPA_DTYPE_FP8_E4M3, 3, sh8, (const int64_t[]){HKV * w, w, 1}),
                     SDPA_OK);
    expect(sdpa_kv_write_ex(&q8.t, NULL, &t8, NULL, slots, NULL), SDPA_ERR_DTYPE, "key");
    for (int i = 0; i < (int)e4.bytes; ++i)
        assert_int_equal(e4.mem[i], 0xCD);
    for (int i = 0; i < (int)f16c.bytes; ++i)
        assert_int_equal(f16c.mem[i], 0xCD);
    for (int i = 0; i < (int)q8.bytes; ++i)
        assert_int_equal(q8.mem[i], 0xCD);
    free(e4.mem), free(f16c.mem), free(q8.mem);
}

/* ============================================================== RoPE */

/* The documented rotation of one float32 row (sdpa_rope_params): pairs (i, i + rd/2) or
 * (2i, 2i + 1); a' = a c - b s, b' = a s + b c in float32, one rounding per operation. */
static void ref_rope_f32(float *x, int64_t rd, int interleaved, const float *c, const float *sn) {
    for (int64_t i = 0; i < rd / 2; ++i) {
        const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + rd / 2;
        const float a = x[ia], b = x[ib];
        const float ac = a * c[i], bs = b * sn[i], as = a * sn[i], bc = b * c[i];
        x[ia] = ac - bs;
        x[ib] = as + bc;
    }
}

/* The reference narrowing of a float32 row to a cache row (q8_0 blocks, FP8, f16, f32). */
static void ref_store(int dt, const float *x, int64_t w, unsigned char *out) {
    for (int64_t e = 0; e < w; ++e) {
        if (dt == SDPA_DTYPE_Q8_0) {
            if (e % 32 == 0)
                ref_q8_0(x + e, out + (e / 32) * 34);
        } else if (dt == SDPA_DTYPE_FP8_E4M3 || dt == SDPA_DTYPE_FP8_E5M2) {
            out[e] = ref_fp8(dt, x[e]);
        } else if (dt == SDPA_DTYPE_F16) {
            const uint16_t h = (uint16_t)((fbits(x[e]) >> 31 ? 0x8000 : 0) | ref_f16(fabsf(x[e])));
            memcpy(out + 2 * e, &h, 2);
        } else {
            memcpy(out + 4 * e, &x[e], 4);
        }
    }
}

/* kv_write_ex with rope (tables: exact angles) into q8_0 / FP8 / f16 / f32 caches equals the
 * test's RoPE-then-quantize, both conventions, full and partial rotary_dim; values unrotated.
 * With theta (no tables): the f32 cache equals sdpa_rope's rows bit for bit and a float64
 * rotation within 2^-17 relative, and the q8_0 cache is the reference quantization of them. */
static void kvw8_rope_then_quantize_matches_reference(void **state) {
    (void)state;
    enum { T = 5, W = 64, MAXPOS = 40 };
    static const int dts[5] = {SDPA_DTYPE_Q8_0, SDPA_DTYPE_FP8_E4M3, SDPA_DTYPE_FP8_E5M2, SDPA_DTYPE_F16, SDPA_DTYPE_F32};
    const int64_t pos[T] = {3, 17, 0, 39, 8}, slots[T] = {4, 11, -1, 0, 19};
    float kf[T * HKV * W], vf[T * HKV * W];
    for (int i = 0; i < T * HKV * W; ++i)
        kf[i] = urand() * 3.0f, vf[i] = urand();
    const int64_t shape[3] = {T, HKV, W};
    sdpa_tensor tk, tv;
    assert_int_equal(sdpa_tensor_init(&tk, kf, 3, shape), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tv, vf, 3, shape), SDPA_OK);
    static float ct[MAXPOS][W / 2], st[MAXPOS][W / 2];
    int cases = 0;
    for (int il = 0; il < 2; ++il)
        for (int64_t rd = W; rd >= 32; rd -= 32) {
            for (int p = 0; p < MAXPOS; ++p)
                for (int i = 0; i < rd / 2; ++i) {
                    const double ang = p * pow(500.0, -2.0 * i / (double)rd);
                    ct[p][i] = (float)cos(ang), st[p][i] = (float)sin(ang);
                }
            sdpa_tensor tc, ts;
            const int64_t tshape[2] = {MAXPOS, rd / 2}, tstr[2] = {W / 2, 1};
            assert_int_equal(sdpa_tensor_init_strided(&tc, ct, SDPA_DTYPE_F32, 2, tshape, tstr), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_strided(&ts, st, SDPA_DTYPE_F32, 2, tshape, tstr), SDPA_OK);
            sdpa_rope_params rp;
            sdpa_rope_params_init(&rp);
            rp.rotary_dim = rd;
            rp.interleaved = il;
            rp.cos = &tc;
            rp.sin = &ts;
            sdpa_kv_write_options o;
            sdpa_kv_write_options_init(&o);
            o.rope = &rp;
            o.positions = pos;
            for (int di = 0; di < 5; ++di) {
                cache kc, vc;
                cache_make(&kc, dts[di], W);
                cache_make(&vc, dts[di], W);
                expect(sdpa_kv_write_ex(&kc.t, &vc.t, &tk, &tv, slots, &o), SDPA_OK, NULL);
                unsigned char want[W * 4];
                for (int64_t t = 0; t < T; ++t) {
                    if (slots[t] < 0)
                        continue;
                    for (int64_t h = 0; h < HKV; ++h) {
                        float row[W];
                        memcpy(row, kf + (t * HKV + h) * W, sizeof row);
                        ref_rope_f32(row, rd, il, ct[pos[t]], st[pos[t]]);
                        ref_store(dts[di], row, W, want);
                        if (memcmp(cache_row(&kc, slots[t], h), want, (size_t)kc.units * kc.unit) != 0)
                            fail_msg("rope interleaved=%d rotary_dim=%lld dtype %d: key row (%lld, %lld) differs from "
                                     "RoPE-then-narrow",
                                     il, (long long)rd, dts[di], (long long)t, (long long)h);
                        ref_store(dts[di], vf + (t * HKV + h) * W, W, want);
                        assert_memory_equal(cache_row(&vc, slots[t], h), want, (size_t)vc.units * vc.unit);
                    }
                }
                free(kc.mem), free(vc.mem);
                ++cases;
            }
        }
    /* theta 10000, no tables: as sdpa_rope, and near a float64 rotation */
    for (int il = 0; il < 2; ++il) {
        sdpa_rope_params rp;
        sdpa_rope_params_init(&rp);
        rp.interleaved = il;
        sdpa_kv_write_options o;
        sdpa_kv_write_options_init(&o);
        o.rope = &rp;
        o.positions = pos;
        float rot[T * HKV * W];
        sdpa_tensor trot;
        assert_int_equal(sdpa_tensor_init(&trot, rot, 3, shape), SDPA_OK);
        expect(sdpa_rope(&tk, &trot, pos, &rp), SDPA_OK, NULL);
        cache f32c, q8c;
        cache_make(&f32c, SDPA_DTYPE_F32, W);
        cache_make(&q8c, SDPA_DTYPE_Q8_0, W);
        expect(sdpa_kv_write_ex(&f32c.t, NULL, &tk, NULL, slots, &o), SDPA_OK, NULL);
        expect(sdpa_kv_write_ex(&q8c.t, NULL, &tk, NULL, slots, &o), SDPA_OK, NULL);
        double worst = 0.0;
        for (int64_t t = 0; t < T; ++t) {
            if (slots[t] < 0)
                continue;
            for (int64_t h = 0; h < HKV; ++h) {
                const float *r = rot + (t * HKV + h) * W, *x = kf + (t * HKV + h) * W;
                assert_memory_equal(cache_row(&f32c, slots[t], h), r, W * sizeof(float));
                unsigned char want[W / 32 * 34];
                ref_store(SDPA_DTYPE_Q8_0, r, W, want);
                assert_memory_equal(cache_row(&q8c, slots[t], h), want, sizeof want);
                for (int i = 0; i < W / 2; ++i) {
                    const int ia = il ? 2 * i : i, ib = il ? 2 * i + 1 : i + W / 2;
                    const double ang = (double)pos[t] * pow(10000.0, -2.0 * i / W);
                    const double a = x[ia], b = x[ib], ya = a * cos(ang) - b * sin(ang), yb = a * sin(ang) + b * cos(ang);
                    const double mag = fabs(a) + fabs(b);
                    worst = dmax(worst, dmax(fabs(r[ia] - ya), fabs(r[ib] - yb)) / mag);
                }
            }
        }
        printf("# rope theta interleaved=%d: largest |error| / (|a| + |b|) vs float64 %.3g\n", il, worst);
        assert_true(worst <= ldexp(1.0, -17));
        free(f32c.mem), free(q8c.mem);
    }
    /* E = 4160 (two chunks) with rotary_dim 64: only the first 64 elements rotate */
    {
        enum { WB = 4160 };
        float *xb = malloc(sizeof(float) * T * HKV * WB), *rb = malloc(sizeof(float) * T * HKV * WB);
        for (int i = 0; i < T * HKV * WB; ++i)
            xb[i] = urand();
        const int64_t bshape[3] = {T, HKV, WB};
        sdpa_tensor tx, tr;
        assert_int_equal(sdpa_tensor_init(&tx, xb, 3, bshape), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&tr, rb, 3, bshape), SDPA_OK);
        sdpa_rope_params rp;
        sdpa_rope_params_init(&rp);
        rp.rotary_dim = 64;
        expect(sdpa_rope(&tx, &tr, pos, &rp), SDPA_OK, NULL);
        sdpa_kv_write_options o;
        sdpa_kv_write_options_init(&o);
        o.rope = &rp;
        o.positions = pos;
        cache q8c;
        cache_make(&q8c, SDPA_DTYPE_Q8_0, WB);
        expect(sdpa_kv_write_ex(&q8c.t, NULL, &tx, NULL, slots, &o), SDPA_OK, NULL);
        static unsigned char want[WB / 32 * 34];
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; slots[t] >= 0 && h < HKV; ++h) {
                ref_store(SDPA_DTYPE_Q8_0, rb + (t * HKV + h) * WB, WB, want);
                assert_memory_equal(cache_row(&q8c, slots[t], h), want, sizeof want);
            }
        free(xb), free(rb), free(q8c.mem);
    }
    /* a position outside the tables: SDPA_ERR_INDEX, nothing written */
    {
        sdpa_rope_params rp;
        sdpa_rope_params_init(&rp);
        for (int p = 0; p < MAXPOS; ++p)
            for (int i = 0; i < W / 2; ++i)
                ct[p][i] = 1.0f, st[p][i] = 0.0f;
        sdpa_tensor tc, ts;
        const int64_t tshape[2] = {MAXPOS, W / 2};
        assert_int_equal(sdpa_tensor_init(&tc, &ct[0][0], 2, tshape), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&ts, &st[0][0], 2, tshape), SDPA_OK);
        rp.cos = &tc;
        rp.sin = &ts;
        const int64_t badpos[T] = {3, 17, 0, 40, 8};
        sdpa_kv_write_options o;
        sdpa_kv_write_options_init(&o);
        o.rope = &rp;
        o.positions = badpos;
        cache kc;
        cache_make(&kc, SDPA_DTYPE_Q8_0, W);
        expect(sdpa_kv_write_ex(&kc.t, NULL, &tk, NULL, slots, &o), SDPA_ERR_INDEX, NULL);
        for (size_t i = 0; i < kc.bytes; ++i)
            assert_int_equal(kc.mem[i], 0xCD);
        free(kc.mem);
    }
    printf("# rope: %d table cases (2 conventions x 2 rotary_dims x 5 cache dtypes) bit-exact\n", cases);
}

/* ============================================================== round trip */

/* kv_write_ex into a paged q8_0 K/V pool (shuffled block table), then one decode query per
 * sequence through sdpa_attention; float64 references on the dequantized bytes (the float32
 * bound of sdpa_precision) and on the unquantized rows (that bound plus the quantization's). */
static void kvw8_round_trip_paged_q8_0_attention(void **state) {
    (void)state;
    enum { B = 2, HQ = 4, H = 2, E = 64, PBS = 16, NBLK = 8, MAXB = 4, SMAX = 64 };
    const int64_t lens[B] = {50, 37};
    const int32_t table[B][MAXB] = {{5, 2, 7, 0}, {3, 6, 1, 4}};
    const size_t rowb = (size_t)(E / 32) * 34;
    unsigned char *kp = aligned_alloc(64, NBLK * H * PBS * rowb), *vp = aligned_alloc(64, NBLK * H * PBS * rowb);
    memset(kp, 0xFF, NBLK * H * PBS * rowb); /* NaN d in slots no key reaches */
    memset(vp, 0xFF, NBLK * H * PBS * rowb);
    const int64_t pshape[4] = {NBLK, H, PBS, E}, pst[4] = {H * PBS * (E / 32), PBS * (E / 32), E / 32, 1};
    sdpa_tensor tkp, tvp;
    assert_int_equal(sdpa_tensor_init_strided(&tkp, kp, SDPA_DTYPE_Q8_0, 4, pshape, pst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&tvp, vp, SDPA_DTYPE_Q8_0, 4, pshape, pst), SDPA_OK);
    static float kf[B][SMAX][H][E], vf[B][SMAX][H][E];
    for (int b = 0; b < B; ++b) {
        for (int j = 0; j < lens[b]; ++j)
            for (int h = 0; h < H; ++h)
                for (int e = 0; e < E; ++e)
                    kf[b][j][h][e] = urand(), vf[b][j][h][e] = urand() * 2.0f;
        /* one call per sequence, its slots from its block table (vLLM's slot_mapping) */
        int64_t slots[SMAX];
        for (int j = 0; j < lens[b]; ++j)
            slots[j] = (int64_t)table[b][j / PBS] * PBS + j % PBS;
        sdpa_tensor tk, tv;
        const int64_t rs[3] = {lens[b], H, E};
        assert_int_equal(sdpa_tensor_init(&tk, &kf[b][0][0][0], 3, rs), SDPA_OK);
        assert_int_equal(sdpa_tensor_init(&tv, &vf[b][0][0][0], 3, rs), SDPA_OK);
        expect(sdpa_kv_write_ex(&tkp, &tvp, &tk, &tv, slots, NULL), SDPA_OK, NULL);
    }
    float q[B][HQ][1][E], out[B][HQ][1][E];
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < HQ; ++h)
            for (int e = 0; e < E; ++e)
                q[b][h][0][e] = urand();
    sdpa_tensor tq, to;
    const int64_t qs[4] = {B, HQ, 1, E};
    assert_int_equal(sdpa_tensor_init(&tq, &q[0][0][0][0], 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, &out[0][0][0][0], 4, qs), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.block_table = &table[0][0];
    o.block_table_stride = MAXB;
    o.max_blocks_per_seq = MAXB;
    o.key_lengths = lens;
    expect(sdpa_attention(&tq, &tkp, &tvp, &o, &to, NULL, NULL), SDPA_OK, NULL);
    double worst_deq = 0.0, worst_q = 0.0;
    const double u = ldexp(1.0, -24), scale = 1.0 / sqrt((double)E);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < HQ; ++h) {
            const int g = h / (HQ / H), n = (int)lens[b];
            double sd[SMAX], s0[SMAX], kdq[SMAX][E], vdq[SMAX][E];
            double A = 0.0, T = 0.0, V = 0.0, dk = 0.0, dv = 0.0;
            for (int j = 0; j < n; ++j) {
                const unsigned char *kr = kp + ((size_t)(table[b][j / PBS] * H + g) * PBS + j % PBS) * rowb;
                const unsigned char *vr = vp + ((size_t)(table[b][j / PBS] * H + g) * PBS + j % PBS) * rowb;
                double a = 0.0, s = 0.0, s_0 = 0.0;
                for (int e = 0; e < E; ++e) {
                    const unsigned char *kb = kr + (e / 32) * 34, *vb = vr + (e / 32) * 34;
                    kdq[j][e] = (double)((float)(int8_t)kb[2 + e % 32] * (float)half_value((uint16_t)(kb[0] | (kb[1] << 8))));
                    vdq[j][e] = (double)((float)(int8_t)vb[2 + e % 32] * (float)half_value((uint16_t)(vb[0] | (vb[1] << 8))));
                    s += (double)q[b][h][0][e] * kdq[j][e];
                    s_0 += (double)q[b][h][0][e] * kf[b][j][g][e];
                    a += fabs((double)q[b][h][0][e] * kdq[j][e]);
                    V = dmax(V, fabs(vdq[j][e]));
                    dv = dmax(dv, fabs(vdq[j][e] - vf[b][j][g][e]));
                }
                sd[j] = s * scale, s0[j] = s_0 * scale;
                A = dmax(A, a * scale), T = dmax(T, fabs(sd[j]));
                dk = dmax(dk, fabs(sd[j] - s0[j])); /* the score moved by quantizing K */
            }
            double md = -INFINITY, m0 = -INFINITY;
            for (int j = 0; j < n; ++j)
                md = dmax(md, sd[j]), m0 = dmax(m0, s0[j]);
            double zd = 0.0, z0 = 0.0;
            for (int j = 0; j < n; ++j)
                zd += exp(sd[j] - md), z0 += exp(s0[j] - m0);
            for (int e = 0; e < E; ++e) {
                double od = 0.0, o0 = 0.0;
                for (int j = 0; j < n; ++j)
                    od += exp(sd[j] - md) / zd * vdq[j][e], o0 += exp(s0[j] - m0) / z0 * vf[b][j][g][e];
                const double delta = (E + 2) * u * A + 8 * u * T;
                const double bound = V * ((exp(2 * delta) - 1) + (3.0 * n + 32) * u) + (3.0 * n + 32) * ldexp(1.0, -150);
                const double err = fabs((double)out[b][h][0][e] - od);
                if (err > bound)
                    fail_msg("(%d, %d, %d): out %g vs dequantized float64 %g: error %g above %g", b, h, e,
                             (double)out[b][h][0][e], od, err, bound);
                worst_deq = dmax(worst_deq, err / bound);
                /* against the unquantized rows: scores moved by at most dk, values by dv */
                const double qbound = bound + V * (exp(2 * dk) - 1) + dv;
                const double err0 = fabs((double)out[b][h][0][e] - o0);
                if (err0 > qbound)
                    fail_msg("(%d, %d, %d): out %g vs unquantized float64 %g: error %g above %g", b, h, e,
                             (double)out[b][h][0][e], o0, err0, qbound);
                worst_q = dmax(worst_q, err0 / qbound);
            }
        }
    printf("# round trip paged q8_0: error / float32 bound (dequantized) %.3f, error / quantization bound %.3f\n",
           worst_deq, worst_q);
    free(kp), free(vp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kvw8_q8_0_every_table_matches_ggml_reference),
        cmocka_unit_test(kvw8_q8_0_ties_round_away),
        cmocka_unit_test(kvw8_q8_0_write_paged_strided_reversed_bit_exact),
        cmocka_unit_test(kvw8_fp8_every_encoding_round_trips),
        cmocka_unit_test(kvw8_fp8_midpoints_ties_to_even_and_saturation),
        cmocka_unit_test(kvw8_fp8_random_matches_reference_and_bounds),
        cmocka_unit_test(kvw8_fp8_scale_is_one_division),
        cmocka_unit_test(kvw8_fp8_write_with_scales),
        cmocka_unit_test(kvw8_validation_errors_leave_caches_untouched),
        cmocka_unit_test(kvw8_rope_then_quantize_matches_reference),
        cmocka_unit_test(kvw8_round_trip_paged_q8_0_attention),
    };
    return cmocka_run_group_tests_name("kv_write8", tests, NULL, NULL);
}
