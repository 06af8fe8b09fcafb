/* sdpa_rope (0.6, issue 31): rotary position embedding against the two published conventions,
 * each written here from its formula, not from src/rope.c:
 *   - HF transformers apply_rotary_pos_emb: emb = cat(freqs, freqs), rotate_half(x) =
 *     cat(-x2, x1), out = x * cos(emb) + rotate_half(x) * sin(emb)   (NeoX, interleaved = 0);
 *   - FlashAttention apply_rotary_emb_torch(interleaved=True): pairs (x[2i], x[2i+1]), cos / sin
 *     repeated per pair, rotate_half = stack(-x[1::2], x[::2])        (GPT-J, interleaved = 1).
 * In float32 both are elementwise products then one add, so the library's result must equal
 * them bit for bit; a float64 reference bounds the theta path. Errors leave out untouched. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sdpa.h"

/* max of two doubles by compare and select, not fmax: gcc 12 for aarch64 stops with an internal
 * compiler error (vect_transform_reduction) vectorising fmax reductions (the aarch64 CI job);
 * NaN in b is ignored as fmax ignores it. */
static inline double dmax(double a, double b) { return b > a ? b : a; }

/* ---- independent conversions (round to nearest even; the tests use no NaN) ---- */
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint16_t to_bf16(float f) {
    const uint32_t u = f2u(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) { return u2f((uint32_t)h << 16); }
static float from_f16(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}
/* nearest f16 by search over the neighbours of a double estimate (exact; finite range only) */
static uint16_t to_f16(float f) {
    const uint16_t sign = f < 0 ? 0x8000 : 0;
    const double a = fabs((double)f);
    uint16_t best = 0;
    double bd = INFINITY;
    for (uint16_t h = 0; h < 0x7C00; ++h) { /* 31744 candidates: fine for the few values here */
        const double d = fabs((double)from_f16(h) - a);
        if (d < bd || (d == bd && (h & 1) == 0)) {
            bd = d;
            best = h;
        }
        if ((double)from_f16(h) > a && d > bd)
            break;
    }
    return (uint16_t)(sign | best);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* HF's NeoX formula on one row (float32, as PyTorch evaluates it elementwise). */
static void ref_hf(const float *x, int64_t E, int64_t rd, const float *c, const float *s, float *out) {
    const int64_t half = rd / 2;
    for (int64_t j = 0; j < E; ++j) {
        if (j >= rd) { out[j] = x[j]; continue; }
        const float C = c[j % half], S = s[j % half];
        const float rot = j < half ? -x[j + half] : x[j - half];
        const float p1 = x[j] * C, p2 = rot * S;
        out[j] = p1 + p2;
    }
}
/* FlashAttention's interleaved formula on one row. */
static void ref_fa_interleaved(const float *x, int64_t E, int64_t rd, const float *c, const float *s, float *out) {
    for (int64_t j = 0; j < E; ++j) {
        if (j >= rd) { out[j] = x[j]; continue; }
        const float C = c[j / 2], S = s[j / 2];
        const float rot = (j % 2 == 0) ? -x[j + 1] : x[j - 1];
        const float p1 = x[j] * C, p2 = rot * S;
        out[j] = p1 + p2;
    }
}

typedef struct tables {
    float *cos, *sin;
    int64_t max_pos, half;
    sdpa_tensor tc, ts;
} tables;

static tables make_tables(int64_t max_pos, int64_t rd, double theta) {
    tables t;
    t.max_pos = max_pos;
    t.half = rd / 2;
    t.cos = malloc((size_t)(max_pos * t.half) * sizeof(float));
    t.sin = malloc((size_t)(max_pos * t.half) * sizeof(float));
    for (int64_t p = 0; p < max_pos; ++p)
        for (int64_t i = 0; i < t.half; ++i) {
            const double a = (double)p * pow(theta, -2.0 * (double)i / (double)rd);
            t.cos[p * t.half + i] = (float)cos(a);
            t.sin[p * t.half + i] = (float)sin(a);
        }
    assert_int_equal(sdpa_tensor_init(&t.tc, t.cos, 2, (int64_t[]){max_pos, t.half}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&t.ts, t.sin, 2, (int64_t[]){max_pos, t.half}), SDPA_OK);
    return t;
}
static void free_tables(tables *t) { free(t->cos); free(t->sin); }

/* Both conventions, rotary_dim = E and < E, f32 in / out, bit for bit. */
static void test_conventions_bit_exact(void **state) {
    (void)state;
    const int64_t T = 5, H = 3, E = 64;
    const int64_t rds[] = {64, 32, 2};
    for (int conv = 0; conv < 2; ++conv)
        for (size_t k = 0; k < sizeof rds / sizeof rds[0]; ++k) {
            const int64_t rd = rds[k];
            tables tb = make_tables(50, rd, 10000.0);
            float x[5 * 3 * 64], out[5 * 3 * 64], ref[64];
            for (int64_t i = 0; i < T * H * E; ++i) x[i] = frand() * 4.0f;
            const int64_t pos[5] = {0, 1, 7, 31, 49};
            sdpa_tensor vx, vo;
            assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){T, H, E}), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
            sdpa_rope_params rp;
            sdpa_rope_params_init(&rp);
            rp.rotary_dim = rd == E ? 0 : rd;
            rp.interleaved = conv;
            rp.cos = &tb.tc;
            rp.sin = &tb.ts;
            assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < H; ++h) {
                    const float *xr = x + (t * H + h) * E;
                    const float *c = tb.cos + pos[t] * tb.half, *s = tb.sin + pos[t] * tb.half;
                    (conv ? ref_fa_interleaved : ref_hf)(xr, E, rd, c, s, ref);
                    for (int64_t e = 0; e < E; ++e)
                        if (f2u(ref[e]) != f2u(out[(t * H + h) * E + e]))
                            fail_msg("conv %d rd %lld t %lld h %lld e %lld: %.9g != ref %.9g", conv, (long long)rd,
                                     (long long)t, (long long)h, (long long)e, (double)out[(t * H + h) * E + e],
                                     (double)ref[e]);
                }
            /* position 0 is the identity (cos 1, sin 0) */
            for (int64_t e = 0; e < H * E; ++e)
                assert_true(f2u(out[e]) == f2u(x[e]));
            free_tables(&tb);
        }
}

/* theta (no tables): HF's float32 recipe; and within a float64 bound of the exact rotation. */
static void test_theta_against_float64(void **state) {
    (void)state;
    const int64_t T = 4, H = 2, E = 128;
    const double thetas[] = {10000.0, 500000.0};
    for (size_t k = 0; k < 2; ++k)
        for (int conv = 0; conv < 2; ++conv) {
            float x[4 * 2 * 128], out[4 * 2 * 128];
            for (int64_t i = 0; i < T * H * E; ++i) x[i] = frand();
            const int64_t pos[4] = {0, 3, 100, 1000};
            sdpa_tensor vx, vo;
            assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){T, H, E}), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
            sdpa_rope_params rp;
            sdpa_rope_params_init(&rp);
            rp.interleaved = conv;
            rp.theta = k == 0 ? 0.0 : thetas[k]; /* 0 = 10000 */
            assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
            double maxerr = 0.0;
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < H; ++h)
                    for (int64_t i = 0; i < E / 2; ++i) {
                        const double ang = (double)pos[t] * pow(thetas[k], -2.0 * (double)i / (double)E);
                        const int64_t ia = conv ? 2 * i : i, ib = conv ? 2 * i + 1 : i + E / 2;
                        const float *xr = x + (t * H + h) * E;
                        const double a = xr[ia], b = xr[ib];
                        const double ra = a * cos(ang) - b * sin(ang), rb = a * sin(ang) + b * cos(ang);
                        const float *o = out + (t * H + h) * E;
                        maxerr = dmax(maxerr, dmax(fabs(o[ia] - ra), fabs(o[ib] - rb)));
                    }
            /* float32 angle (HF): |error| <= |pos * inv_freq| * 2^-22 + a few ulps of |x| <= 1 */
            assert_true(maxerr <= 1000.0 * 2.4e-7 + 4e-7);
            assert_true(maxerr > 0.0 || pos[3] == 0); /* not vacuous: the float32 recipe is not exact */
        }
}

/* theta: the recipe the header defines, computed here step by step, bit for bit: b =
 * float32(theta), inv = 1.0f / float32(pow(b, float32(2i) / float32(rd))), angle = float32(p) *
 * inv in float32, cos / sin in double rounded once. Rows e_i (1 at a, 0 at b) give the
 * (cos, sin) pair exactly (1 * c - 0 * s = c, 0 * c + 1 * s = s). */
static float recipe_angle(double theta, int64_t rd, int64_t i, int64_t p) {
    const float b = (float)theta, ex = (float)(2 * i) / (float)rd;
    const float pw = (float)pow((double)b, (double)ex);
    const float inv = 1.0f / pw;
    const float fp = (float)p;
    const float ang = fp * inv;
    return ang;
}
static void test_theta_recipe_bit_exact(void **state) {
    (void)state;
    enum { RD = 96, E = 100, H = RD / 2 };
    const double thetas[] = {0.0, 500000.0, 1e6, 31415.9265}; /* the last is not a float32 (9 of 48 inv_freq differ) */
    const int64_t pos[] = {0, 1, 2, 100, 4095, 100000, 16777217, 123456789};
    enum { T = sizeof pos / sizeof pos[0] };
    static float x[T * H * E], out[T * H * E];
    for (int conv = 0; conv < 2; ++conv)
        for (size_t k = 0; k < sizeof thetas / sizeof thetas[0]; ++k) {
            memset(x, 0, sizeof x);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t i = 0; i < H; ++i) {
                    x[(t * H + i) * E + (conv ? 2 * i : i)] = 1.0f;
                    x[(t * H + i) * E + RD + (i % (E - RD))] = (float)(i + 1); /* tail: copied */
                }
            sdpa_tensor vx, vo;
            assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){T, H, E}), SDPA_OK);
            assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
            sdpa_rope_params rp;
            sdpa_rope_params_init(&rp);
            rp.rotary_dim = RD;
            rp.interleaved = conv;
            rp.theta = thetas[k];
            assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
            const double th = thetas[k] == 0.0 ? 10000.0 : thetas[k];
            for (int64_t t = 0; t < T; ++t)
                for (int64_t i = 0; i < H; ++i) {
                    const float ang = recipe_angle(th, RD, i, pos[t]);
                    const float wc = (float)cos((double)ang), ws = (float)sin((double)ang);
                    const float *o = out + (t * H + i) * E;
                    const float gc = o[conv ? 2 * i : i], gs = o[conv ? 2 * i + 1 : i + RD / 2];
                    if (f2u(gc) != f2u(wc) || f2u(gs) != f2u(ws))
                        fail_msg("conv %d theta %g p %lld i %lld: (%.9g, %.9g) != recipe (%.9g, %.9g)", conv, th,
                                 (long long)pos[t], (long long)i, (double)gc, (double)gs, (double)wc, (double)ws);
                    for (int64_t e = RD; e < E; ++e)
                        assert_true(f2u(o[e]) == f2u(x[(t * H + i) * E + e]));
                }
        }
    /* the base is rounded to float32 first: 10000.0000001 is 10000 */
    sdpa_rope_params rp;
    sdpa_rope_params_init(&rp);
    float y[2 * 8], ya[2 * 8], yb[2 * 8];
    for (int i = 0; i < 16; ++i) y[i] = frand();
    sdpa_tensor vy, va, vb;
    assert_int_equal(sdpa_tensor_init(&vy, y, 3, (int64_t[]){2, 1, 8}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&va, ya, 3, (int64_t[]){2, 1, 8}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vb, yb, 3, (int64_t[]){2, 1, 8}), SDPA_OK);
    const int64_t p2[2] = {77, 5000};
    rp.theta = 10000.0000001;
    assert_int_equal(sdpa_rope(&vy, &va, p2, &rp), SDPA_OK);
    rp.theta = 0.0;
    assert_int_equal(sdpa_rope(&vy, &vb, p2, &rp), SDPA_OK);
    assert_memory_equal(ya, yb, sizeof ya);
}

/* f16 / bf16 rows in and out: widen exactly, rotate in float32, narrow with RNE. */
static void test_dtypes(void **state) {
    (void)state;
    const int64_t T = 3, H = 2, E = 32, rd = 32;
    tables tb = make_tables(16, rd, 10000.0);
    const sdpa_dtype dts[] = {SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_BF16};
    float xf[3 * 2 * 32];
    for (int64_t i = 0; i < T * H * E; ++i) xf[i] = frand() * 8.0f;
    const int64_t pos[3] = {2, 9, 15};
    for (int di = 0; di < 3; ++di)
        for (int dO = 0; dO < 3; ++dO) {
            uint16_t x16[3 * 2 * 32], o16[3 * 2 * 32];
            float x32[3 * 2 * 32], o32[3 * 2 * 32], xin[32], ref[32];
            for (int64_t i = 0; i < T * H * E; ++i) {
                x32[i] = xf[i];
                x16[i] = dts[di] == SDPA_DTYPE_F16 ? to_f16(xf[i]) : to_bf16(xf[i]);
            }
            sdpa_tensor vx, vo;
            const int64_t shape[3] = {T, H, E};
            assert_int_equal(sdpa_tensor_init_dtype(&vx, dts[di] == SDPA_DTYPE_F32 ? (void *)x32 : (void *)x16,
                                                    dts[di], 3, shape), SDPA_OK);
            assert_int_equal(sdpa_tensor_init_dtype(&vo, dts[dO] == SDPA_DTYPE_F32 ? (void *)o32 : (void *)o16,
                                                    dts[dO], 3, shape), SDPA_OK);
            sdpa_rope_params rp;
            sdpa_rope_params_init(&rp);
            rp.cos = &tb.tc;
            rp.sin = &tb.ts;
            assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
            for (int64_t t = 0; t < T; ++t)
                for (int64_t h = 0; h < H; ++h) {
                    const int64_t r0 = (t * H + h) * E;
                    for (int64_t e = 0; e < E; ++e)
                        xin[e] = dts[di] == SDPA_DTYPE_F32 ? x32[r0 + e]
                                 : dts[di] == SDPA_DTYPE_F16 ? from_f16(x16[r0 + e]) : from_bf16(x16[r0 + e]);
                    ref_hf(xin, E, rd, tb.cos + pos[t] * tb.half, tb.sin + pos[t] * tb.half, ref);
                    for (int64_t e = 0; e < E; ++e) {
                        const uint32_t want = dts[dO] == SDPA_DTYPE_F32 ? f2u(ref[e])
                                              : dts[dO] == SDPA_DTYPE_F16 ? to_f16(ref[e]) : to_bf16(ref[e]);
                        const uint32_t got = dts[dO] == SDPA_DTYPE_F32 ? f2u(o32[r0 + e]) : o16[r0 + e];
                        if (want != got)
                            fail_msg("in %d out %d t %lld h %lld e %lld: 0x%x != 0x%x", di, dO, (long long)t,
                                     (long long)h, (long long)e, (unsigned)got, (unsigned)want);
                    }
                }
        }
    free_tables(&tb);
}

/* A strided (BSHD-like, reversed rows, table with a column stride) view, and in place. */
static void test_strided_and_in_place(void **state) {
    (void)state;
    const int64_t T = 4, H = 2, E = 16, rd = 8;
    /* tables stored transposed: [half, max_pos] memory, viewed as [max_pos, half] */
    const int64_t max_pos = 10, half = rd / 2;
    float ct[4 * 10], st[4 * 10];
    for (int64_t p = 0; p < max_pos; ++p)
        for (int64_t i = 0; i < half; ++i) {
            const double a = (double)p * pow(10000.0, -2.0 * (double)i / (double)rd);
            ct[i * max_pos + p] = (float)cos(a);
            st[i * max_pos + p] = (float)sin(a);
        }
    sdpa_tensor tc, ts;
    assert_int_equal(sdpa_tensor_init_strided(&tc, ct, SDPA_DTYPE_F32, 2, (int64_t[]){max_pos, half},
                                              (int64_t[]){1, max_pos}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&ts, st, SDPA_DTYPE_F32, 2, (int64_t[]){max_pos, half},
                                              (int64_t[]){1, max_pos}), SDPA_OK);
    float buf[4 * 2 * 16 * 2], orig[4 * 2 * 16 * 2], out[4 * 2 * 16];
    for (size_t i = 0; i < sizeof buf / sizeof buf[0]; ++i) buf[i] = orig[i] = frand();
    /* x[t, h, e] = buf[(T-1-t) * 64 + h * 32 + 2 e]: reversed rows, element stride 2 */
    sdpa_tensor vx, vo;
    assert_int_equal(sdpa_tensor_init_strided(&vx, buf + (T - 1) * 64, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, E},
                                              (int64_t[]){-64, 32, 2}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
    sdpa_rope_params rp;
    sdpa_rope_params_init(&rp);
    rp.rotary_dim = rd;
    rp.cos = &tc;
    rp.sin = &ts;
    const int64_t pos[4] = {9, 0, 4, 5};
    assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
    float c[4], s[4], xr[16], ref[16];
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < half; ++i) { c[i] = ct[i * max_pos + pos[t]]; s[i] = st[i * max_pos + pos[t]]; }
            for (int64_t e = 0; e < E; ++e) xr[e] = orig[(T - 1 - t) * 64 + h * 32 + 2 * e];
            ref_hf(xr, E, rd, c, s, ref);
            for (int64_t e = 0; e < E; ++e)
                assert_true(f2u(out[(t * H + h) * E + e]) == f2u(ref[e]));
        }
    /* in place: out is exactly x (an output: strides must be positive, so rows go forward
     * here; a reversed view as out is SDPA_ERR_STRIDE); the gaps (odd elements) stay untouched */
    assert_int_equal(sdpa_rope(&vx, &vx, pos, &rp), SDPA_ERR_STRIDE);
    sdpa_tensor vf;
    assert_int_equal(sdpa_tensor_init_strided(&vf, buf, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, E},
                                              (int64_t[]){64, 32, 2}), SDPA_OK);
    assert_int_equal(sdpa_rope(&vf, &vf, pos, &rp), SDPA_OK);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < half; ++i) { c[i] = ct[i * max_pos + pos[t]]; s[i] = st[i * max_pos + pos[t]]; }
            for (int64_t e = 0; e < E; ++e) xr[e] = orig[t * 64 + h * 32 + 2 * e];
            ref_hf(xr, E, rd, c, s, ref);
            for (int64_t e = 0; e < E; ++e) {
                assert_true(f2u(buf[t * 64 + h * 32 + 2 * e]) == f2u(ref[e]));
                assert_true(f2u(buf[t * 64 + h * 32 + 2 * e + 1]) == f2u(orig[t * 64 + h * 32 + 2 * e + 1]));
            }
        }
}

/* Every validation error, with out untouched. */
static void test_errors_leave_out_untouched(void **state) {
    (void)state;
    const int64_t T = 2, H = 1, E = 8;
    tables tb = make_tables(4, E, 10000.0);
    tables tb6 = make_tables(4, 6, 10000.0);
    float x[16], out[16 + 8];
    for (int i = 0; i < 16; ++i) x[i] = frand();
    sdpa_tensor vx, vo, vo_bad, vo_overlap;
    assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){T, H, E}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vo_bad, out, 3, (int64_t[]){T, H, E - 2}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&vo_overlap, x + 4, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, 4}, (int64_t[]){4, 4, 1}), SDPA_OK);
    int64_t pos[2] = {1, 3}, pos_neg[2] = {1, -1}, pos_big[2] = {4, 0};
    float nan_cos[4 * 4];
    memcpy(nan_cos, tb.cos, sizeof nan_cos);
    nan_cos[3 * 4 + 2] = NAN;
    sdpa_tensor tnan;
    assert_int_equal(sdpa_tensor_init(&tnan, nan_cos, 2, (int64_t[]){4, 4}), SDPA_OK);

    struct {
        const char *what;
        int64_t rotary_dim;
        int32_t interleaved;
        int cos; /* 0 none, 1 tables, 2 cos only, 3 NaN cos (row 3), 4 width-6 tables */
        double theta;
        const int64_t *positions;
        const sdpa_tensor *out;
        size_t struct_size;
        sdpa_status want;
    } cases[] = {
        {"odd rotary_dim", 7, 0, 0, 0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"rotary_dim > E", 10, 0, 0, 0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"negative rotary_dim", -2, 0, 0, 0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"interleaved 2", 0, 2, 0, 0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"cos without sin", 0, 0, 2, 0, pos, &vo, 0, SDPA_ERR_NULL_POINTER},
        {"theta with tables", 0, 0, 1, 500.0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"negative theta", 0, 0, 0, -1.0, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"infinite theta", 0, 0, 0, INFINITY, pos, &vo, 0, SDPA_ERR_INVALID_ARGUMENT},
        {"negative position", 0, 0, 0, 0, pos_neg, &vo, 0, SDPA_ERR_INDEX},
        {"position >= max_pos", 0, 0, 1, 0, pos_big, &vo, 0, SDPA_ERR_INDEX},
        {"positions NULL", 0, 0, 0, 0, NULL, &vo, 0, SDPA_ERR_NULL_POINTER},
        {"NaN in a used table row", 0, 0, 3, 0, pos, &vo, 0, SDPA_ERR_NON_FINITE},
        {"table width != rotary_dim / 2", 0, 0, 4, 0, pos, &vo, 0, SDPA_ERR_SHAPE},
        {"out shape", 0, 0, 0, 0, pos, &vo_bad, 0, SDPA_ERR_SHAPE},
        {"out narrower (and overlapping x)", 0, 0, 0, 0, pos, &vo_overlap, 0, SDPA_ERR_SHAPE},
        {"struct_size too small", 0, 0, 0, 0, pos, &vo, 4, SDPA_ERR_STRUCT_VERSION},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        memset(out, 0x5A, sizeof out);
        float x_before[16];
        memcpy(x_before, x, sizeof x);
        sdpa_rope_params rp;
        sdpa_rope_params_init(&rp);
        rp.rotary_dim = cases[k].rotary_dim;
        rp.interleaved = cases[k].interleaved;
        rp.theta = cases[k].theta;
        if (cases[k].cos == 1 || cases[k].cos == 2) rp.cos = &tb.tc;
        if (cases[k].cos == 1) rp.sin = &tb.ts;
        if (cases[k].cos == 3) { rp.cos = &tnan; rp.sin = &tb.ts; }
        if (cases[k].cos == 4) { rp.cos = &tb6.tc; rp.sin = &tb6.ts; }
        if (cases[k].struct_size) rp.struct_size = cases[k].struct_size;
        const sdpa_status st = sdpa_rope(&vx, cases[k].out, cases[k].positions, &rp);
        if (st != cases[k].want)
            fail_msg("%s: status %d (%s), want %d", cases[k].what, (int)st, sdpa_last_error_message(),
                     (int)cases[k].want);
        assert_true(strlen(sdpa_last_error_message()) > 10);
        for (size_t i = 0; i < sizeof out; ++i)
            if (((unsigned char *)out)[i] != 0x5A)
                fail_msg("%s: out byte %zu written before validation", cases[k].what, i);
        assert_memory_equal(x, x_before, sizeof x);
    }
    /* an overlap with the same shape is SDPA_ERR_OVERLAP (not the in-place case) */
    sdpa_tensor vo_shift;
    assert_int_equal(sdpa_tensor_init_strided(&vo_shift, x + 1, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, E}, (int64_t[]){E, E, 1}), SDPA_OK);
    sdpa_rope_params rp;
    sdpa_rope_params_init(&rp);
    assert_int_equal(sdpa_rope(&vx, &vo_shift, pos, &rp), SDPA_ERR_OVERLAP);
    assert_int_equal(sdpa_rope(&vx, &vo, pos, NULL), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_rope(NULL, &vo, pos, &rp), SDPA_ERR_NULL_POINTER);
    /* an 8-bit x is not a rope dtype */
    unsigned char q8[2 * 34];
    sdpa_tensor vq;
    memset(q8, 0, sizeof q8);
    if (sdpa_tensor_init_dtype(&vq, q8, SDPA_DTYPE_Q8_0, 3, (int64_t[]){2, 1, 32}) == SDPA_OK)
        assert_int_equal(sdpa_rope(&vq, &vq, pos, &rp), SDPA_ERR_DTYPE);
    free_tables(&tb);
    free_tables(&tb6);
}

/* Poison out, call, and check the status, that the message names the entry and needle, and
 * that out is byte for byte untouched. */
static void expect_error(const char *what, const sdpa_tensor *x, const sdpa_tensor *out, void *outbuf, size_t outbytes,
                         const int64_t *pos, const sdpa_rope_params *rp, sdpa_status want, const char *needle) {
    memset(outbuf, 0xA5, outbytes);
    const sdpa_status st = sdpa_rope(x, out, pos, rp);
    const char *msg = sdpa_last_error_message();
    if (st != want)
        fail_msg("%s: status %d (%s), want %d", what, (int)st, msg, (int)want);
    if (want == SDPA_OK) /* the valid neighbour of an error case */
        return;
    if (strstr(msg, "sdpa_rope") == NULL || strstr(msg, needle) == NULL)
        fail_msg("%s: message \"%s\" does not name sdpa_rope and \"%s\"", what, msg, needle);
    for (size_t i = 0; i < outbytes; ++i)
        if (((unsigned char *)outbuf)[i] != 0xA5)
            fail_msg("%s: out byte %zu written before validation", what, i);
}

/* The errors the table above does not reach: each names its field, out untouched. */
static void test_more_errors_named(void **state) {
    (void)state;
    enum { T = 2, H = 1, E = 8 };
    tables tb = make_tables(4, E, 10000.0);
    float x[T * H * E], out[T * H * E];
    for (int i = 0; i < T * H * E; ++i) x[i] = frand();
    sdpa_tensor vx, vo;
    assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){T, H, E}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){T, H, E}), SDPA_OK);
    int64_t pos[2] = {1, 3};
    sdpa_rope_params rp;
#define RESET() (sdpa_rope_params_init(&rp), rp.cos = &tb.tc, rp.sin = &tb.ts)
    RESET();
    rp.reserved0 = 1;
    expect_error("reserved0", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_STRUCT_VERSION, "reserved0");
    /* a struct_size beyond the known layout with a non-zero byte there */
    struct { sdpa_rope_params p; uint64_t tail; } big;
    memset(&big, 0, sizeof big);
    sdpa_rope_params_init_sized(&big.p, sizeof big);
    big.p.cos = &tb.tc;
    big.p.sin = &tb.ts;
    expect_error("zero tail", &vx, &vo, out, sizeof out, pos, &big.p, SDPA_OK, "");
    big.tail = 1;
    expect_error("non-zero tail", &vx, &vo, out, sizeof out, pos, &big.p, SDPA_ERR_STRUCT_VERSION, "rope");
    sdpa_rope_params_init(&rp);
    rp.theta = NAN;
    expect_error("NaN theta", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_INVALID_ARGUMENT, "theta");
    rp.theta = 1e39; /* finite in double, infinite in float32 */
    expect_error("theta beyond float32", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_INVALID_ARGUMENT, "theta");
    rp.theta = 1e-50; /* zero in float32 */
    expect_error("theta zero in float32", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_INVALID_ARGUMENT, "theta");
    /* with theta any position >= 0 is valid, a negative one names its row */
    int64_t far[2] = {INT64_MAX, 0}, neg[2] = {0, -5};
    rp.theta = 0.0;
    expect_error("INT64_MAX with theta", &vx, &vo, out, sizeof out, far, &rp, SDPA_OK, "");
    expect_error("negative with theta", &vx, &vo, out, sizeof out, neg, &rp, SDPA_ERR_INDEX, "positions[1]=-5");
    /* positions outside the tables name the row and the bound */
    RESET();
    int64_t big_pos[2] = {0, 4};
    expect_error("position == max_pos", &vx, &vo, out, sizeof out, big_pos, &rp, SDPA_ERR_INDEX, "positions[1]=4");
    /* tables: dtype, rank, rows */
    uint16_t c16[4 * 4] = {0};
    sdpa_tensor t16, t1, t3rows;
    assert_int_equal(sdpa_tensor_init_dtype(&t16, c16, SDPA_DTYPE_F16, 2, (int64_t[]){4, 4}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&t1, tb.cos, 1, (int64_t[]){16}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&t3rows, tb.sin, 2, (int64_t[]){3, 4}), SDPA_OK);
    RESET();
    rp.cos = &t16;
    expect_error("f16 cos table", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_DTYPE, "rope->cos");
    RESET();
    rp.sin = &t1;
    expect_error("rank-1 sin table", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_RANK, "rope->sin");
    RESET();
    rp.sin = &t3rows;
    expect_error("sin rows != cos rows", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_SHAPE, "rope->sin");
    /* a non-finite entry in a row the call reads: named; in a row it does not read: no error */
    float inf_sin[4 * 4];
    memcpy(inf_sin, tb.sin, sizeof inf_sin);
    inf_sin[1 * 4 + 0] = INFINITY;
    sdpa_tensor tinf;
    assert_int_equal(sdpa_tensor_init(&tinf, inf_sin, 2, (int64_t[]){4, 4}), SDPA_OK);
    RESET();
    rp.sin = &tinf;
    expect_error("Inf in sin row 1", &vx, &vo, out, sizeof out, pos, &rp, SDPA_ERR_NON_FINITE, "rope->sin[1, 0]");
    int64_t pos_skip[2] = {0, 3};
    expect_error("Inf in an unread row", &vx, &vo, out, sizeof out, pos_skip, &rp, SDPA_OK, "");
    /* x: rank, dtype; out: a broadcast (stride 0) output */
    sdpa_tensor vx2, vo0;
    assert_int_equal(sdpa_tensor_init(&vx2, x, 2, (int64_t[]){T, E}), SDPA_OK);
    RESET();
    expect_error("rank-2 x", &vx2, &vo, out, sizeof out, pos, &rp, SDPA_ERR_RANK, "x");
    assert_int_equal(sdpa_tensor_init_strided(&vo0, out, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, E}, (int64_t[]){0, E, 1}),
                     SDPA_OK);
    expect_error("out with stride 0", &vx, &vo0, out, sizeof out, pos, &rp, SDPA_ERR_STRIDE, "out");
    /* positions misaligned */
    unsigned char raw[3 * sizeof(int64_t)];
    memset(raw, 0, sizeof raw);
    expect_error("misaligned positions", &vx, &vo, out, sizeof out, (const int64_t *)(void *)(raw + 1), &rp,
                 SDPA_ERR_ALIGNMENT, "positions");
    /* out overlapping positions (valid ones): out untouched */
    {
        int64_t ob[T * H * E / 2]; /* out's bytes, positions {1, 3} at its start */
        memset(ob, 0xA5, sizeof ob);
        ob[0] = 1;
        ob[1] = 3;
        int64_t ob_before[T * H * E / 2];
        memcpy(ob_before, ob, sizeof ob);
        sdpa_tensor vob;
        assert_int_equal(sdpa_tensor_init_dtype(&vob, (void *)ob, SDPA_DTYPE_F32, 3, (int64_t[]){T, H, E}), SDPA_OK);
        assert_int_equal(sdpa_rope(&vx, &vob, ob, &rp), SDPA_ERR_OVERLAP);
        assert_non_null(strstr(sdpa_last_error_message(), "positions"));
        assert_memory_equal(ob, ob_before, sizeof ob);
    }
    /* out overlapping x (same shape, shifted): x untouched too */
    float xo[T * H * E + 1];
    for (int i = 0; i < T * H * E + 1; ++i) xo[i] = frand();
    float xo_before[T * H * E + 1];
    memcpy(xo_before, xo, sizeof xo);
    sdpa_tensor vxs, vos;
    assert_int_equal(sdpa_tensor_init(&vxs, xo, 3, (int64_t[]){T, H, E}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vos, xo + 1, 3, (int64_t[]){T, H, E}), SDPA_OK);
    assert_int_equal(sdpa_rope(&vxs, &vos, pos, &rp), SDPA_ERR_OVERLAP);
    assert_non_null(strstr(sdpa_last_error_message(), "out"));
    assert_memory_equal(xo, xo_before, sizeof xo);
    /* in place with another dtype is an overlap, not in place */
    sdpa_tensor vxb;
    assert_int_equal(sdpa_tensor_init_dtype(&vxb, x, SDPA_DTYPE_BF16, 3, (int64_t[]){T, H, E}), SDPA_OK);
    float x_before[T * H * E];
    memcpy(x_before, x, sizeof x);
    assert_int_equal(sdpa_rope(&vx, &vxb, pos, &rp), SDPA_ERR_OVERLAP);
    assert_memory_equal(x, x_before, sizeof x);
    /* rotary_dim / 2 above the supported 1024 (E = 2050) */
    static float wx[2 * 2050], wo[2 * 2050];
    sdpa_tensor vwx, vwo;
    assert_int_equal(sdpa_tensor_init(&vwx, wx, 3, (int64_t[]){2, 1, 2050}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vwo, wo, 3, (int64_t[]){2, 1, 2050}), SDPA_OK);
    sdpa_rope_params_init(&rp);
    expect_error("rotary_dim 2050", &vwx, &vwo, wo, sizeof wo, pos, &rp, SDPA_ERR_SHAPE, "rotary_dim");
    rp.rotary_dim = 2048;
    expect_error("rotary_dim 2048 of 2050", &vwx, &vwo, wo, sizeof wo, pos, &rp, SDPA_OK, "");
#undef RESET
    free_tables(&tb);
}

/* A row wider than the library's float32 chunk (E = 2200): only the first rotary_dim elements
 * rotate, the rest of every chunk is copied exactly. */
static void test_wide_row(void **state) {
    (void)state;
    enum { E = 2200, RD = 64 };
    tables tb = make_tables(8, RD, 10000.0);
    static float x[2 * E], out[2 * E];
    float ref[E];
    for (int i = 0; i < 2 * E; ++i) x[i] = frand();
    sdpa_tensor vx, vo;
    assert_int_equal(sdpa_tensor_init(&vx, x, 3, (int64_t[]){2, 1, E}), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&vo, out, 3, (int64_t[]){2, 1, E}), SDPA_OK);
    sdpa_rope_params rp;
    sdpa_rope_params_init(&rp);
    rp.rotary_dim = RD;
    rp.cos = &tb.tc;
    rp.sin = &tb.ts;
    const int64_t pos[2] = {3, 7};
    assert_int_equal(sdpa_rope(&vx, &vo, pos, &rp), SDPA_OK);
    for (int t = 0; t < 2; ++t) {
        ref_hf(x + t * E, E, RD, tb.cos + pos[t] * tb.half, tb.sin + pos[t] * tb.half, ref);
        for (int e = 0; e < E; ++e)
            if (f2u(out[t * E + e]) != f2u(ref[e]))
                fail_msg("t %d e %d: %.9g != %.9g", t, e, (double)out[t * E + e], (double)ref[e]);
    }
    free_tables(&tb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conventions_bit_exact),
        cmocka_unit_test(test_theta_against_float64),
        cmocka_unit_test(test_theta_recipe_bit_exact),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_strided_and_in_place),
        cmocka_unit_test(test_errors_leave_out_untouched),
        cmocka_unit_test(test_more_errors_named),
        cmocka_unit_test(test_wide_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
