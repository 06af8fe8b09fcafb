/*
 * f16 / bf16 storage on every kernel and ISA (issue 9, sections 2-4), white box: the ISA is
 * capped through the internal hook sdpa__dispatch_set_max_isa_for_testing (src/dispatch.h).
 *
 * For every (q, k, v) dtype combination in {f32, f16, bf16}^3, with out (and bias) dtypes
 * rotated over the three, on random shapes straddling the 64-row / 64-key tiles, with BSHD /
 * BHSD / padded strides, GQA and every mask kind, every kernel (REFERENCE, TILED, DECODE, AUTO)
 * at every ISA cap the CPU has:
 *   - out and lse lie within the sdpa_precision bound of sdpa.h against the float64 reference
 *     (tests/ref/sdpa_ref.c), fed with values decoded here by our own bit-level conversion;
 *   - the result equals, bit for bit, the float32 run on the widened inputs with out rounded
 *     once (nearest even) to its dtype (widening is exact; one rounding at writeback);
 *   - it is bit-identical across 1, 2 and 3 threads.
 * Then: NaN/Inf encodings in blocked rows, beyond key lengths, in padding query rows and in
 * stride gaps change nothing; in attended rows they fail with SDPA_ERR_NON_FINITE and write
 * nothing; the golden facts (2, 3, 14/3) in f16 and bf16; dropout agrees with the widened f32
 * run; SDPA_PRECISION_REDUCED stays within its (wider) bound.
 * The number of (kernel, ISA, dtype) paths exercised is printed; ISAs the CPU lacks and AMX
 * print "not run".
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

#include "cpu.h"
#include "dispatch.h"
#include "ref/sdpa_ref.h"
#include "sdpa.h"

enum { F32 = SDPA_DTYPE_F32, F16 = SDPA_DTYPE_F16, BF16 = SDPA_DTYPE_BF16 };
static const char *const DN[3] = {"f32", "f16", "bf16"};
static size_t esize(int dt) { return dt == F32 ? 4 : 2; }

/* ---------------------------------------------- our own bit-level conversions */

static double dec16(uint16_t h) /* IEEE binary16, by its definition */
{
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double x;
    if (e == 31)
        x = m ? NAN : INFINITY;
    else if (e == 0)
        x = ldexp((double)m, -24);
    else
        x = ldexp(1.0 + m / 1024.0, e - 15);
    return s ? -x : x;
}
static uint16_t enc16(double x) /* round to nearest (ties away: any encoding is a valid input) */
{
    uint16_t s = x < 0 ? 0x8000 : 0;
    x = fabs(x);
    if (x < ldexp(1.0, -14))
        return (uint16_t)(s | (uint16_t)floor(x / ldexp(1.0, -24) + 0.5));
    int e;
    (void)frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
    e -= 1;             /* x = (1 + mant) * 2^e */
    long m = lround((x / ldexp(1.0, e) - 1.0) * 1024.0);
    if (m == 1024) {
        m = 0;
        ++e;
    }
    if (e > 15)
        return (uint16_t)(s | 0x7C00);
    return (uint16_t)(s | (uint16_t)((e + 15) << 10) | (uint16_t)m);
}
static double decb16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}
static uint16_t encb16(double x) /* truncation of the float32 */
{
    const float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}
/* Store x as dtype dt at element idx of base; returns the stored value as a double. */
static double put(int dt, void *base, int64_t idx, double x)
{
    if (dt == F32) {
        ((float *)base)[idx] = (float)x;
        return (double)(float)x;
    }
    uint16_t *p = (uint16_t *)base + idx;
    *p = dt == F16 ? enc16(x) : encb16(x);
    return dt == F16 ? dec16(*p) : decb16(*p);
}
static double get(int dt, const void *base, int64_t idx)
{
    if (dt == F32)
        return (double)((const float *)base)[idx];
    const uint16_t h = ((const uint16_t *)base)[idx];
    return dt == F16 ? dec16(h) : decb16(h);
}
static void put_raw(int dt, void *base, int64_t idx, int nan)
{
    if (dt == F32)
        ((float *)base)[idx] = nan ? NAN : -INFINITY;
    else if (dt == F16)
        ((uint16_t *)base)[idx] = nan ? 0x7E01 : 0xFC00;
    else
        ((uint16_t *)base)[idx] = nan ? 0x7FC1 : 0xFF80;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) /* [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}
static int64_t irand(int64_t n) { return (int64_t)((urand() + 1.0) * 0.5 * (double)n) % n; }

/* ------------------------------------------------------------------- a case */

enum { LAY_BHSD = 0, LAY_BSHD = 1, LAY_PAD = 2 };
enum { MK_NONE, MK_ALLOW, MK_CAUSAL_TL, MK_CAUSAL_BR, MK_WINDOW, MK_KEYLEN, MK_QLEN, MK_BIAS, MK_COUNT };
static const char *const MKN[MK_COUNT] = {"none", "allow-mask", "causal-tl", "causal-br", "window", "key-lengths",
                                          "query-lengths", "bias"};

typedef struct tensor {
    int dt;
    int64_t shape[4], strides[4], nelem; /* nelem: allocated elements (gaps included) */
    void *data;
    double *val; /* decoded values, contiguous [d0, d1, d2, d3] */
    sdpa_tensor view;
} tensor;

typedef struct cas {
    int64_t B, Hq, Hkv, L, S, E, Ev;
    int mk, lay;
    tensor q, k, v, bias;
    int out_dt;
    int64_t klen[4], qlen[4];
    uint8_t *mask;
    sdpa_allow_mask mview;
    sdpa_options opt;
    double *ref_out, *ref_lse;
    uint8_t *row_kind;
} cas;

/* Strides of a [d0, d1, d2, d3] tensor in a layout; returns the elements to allocate. */
static int64_t layout(int lay, const int64_t *sh, int64_t *st)
{
    const int64_t d3 = lay == LAY_PAD ? sh[3] + 3 : sh[3];
    if (lay == LAY_BSHD) { /* [B, S, H, E] memory */
        st[3] = 1;
        st[1] = d3;
        st[2] = sh[1] * d3;
        st[0] = sh[2] * sh[1] * d3;
    } else {
        st[3] = 1;
        st[2] = d3;
        st[1] = sh[2] * d3;
        st[0] = sh[1] * sh[2] * d3;
    }
    return sh[0] * st[0] > 0 ? sh[0] * st[0] : 1;
}

static void tensor_make(tensor *t, int dt, int lay, int64_t d0, int64_t d1, int64_t d2, int64_t d3, double amp,
                        int gap_nan)
{
    t->dt = dt;
    t->shape[0] = d0; t->shape[1] = d1; t->shape[2] = d2; t->shape[3] = d3;
    t->nelem = layout(lay, t->shape, t->strides);
    t->data = calloc((size_t)t->nelem, esize(dt));
    t->val = calloc((size_t)(d0 * d1 * d2 * d3 + 1), sizeof(double));
    assert_true(t->data && t->val);
    for (int64_t i = 0; i < t->nelem; ++i) /* stride gaps hold NaN encodings: they must never be read */
        put_raw(dt, t->data, i, 1);
    (void)gap_nan;
    int64_t c = 0;
    for (int64_t a = 0; a < d0; ++a)
        for (int64_t b = 0; b < d1; ++b)
            for (int64_t r = 0; r < d2; ++r)
                for (int64_t e = 0; e < d3; ++e)
                    t->val[c++] = put(dt, t->data, a * t->strides[0] + b * t->strides[1] + r * t->strides[2] + e,
                                      amp * urand());
    assert_int_equal(sdpa_tensor_init_strided(&t->view, t->data, (sdpa_dtype)dt, 4, t->shape, t->strides), SDPA_OK);
}
static void tensor_free(tensor *t)
{
    free(t->data);
    free(t->val);
    memset(t, 0, sizeof *t);
}
static int64_t tidx(const tensor *t, int64_t a, int64_t b, int64_t r, int64_t e)
{
    return a * t->strides[0] + b * t->strides[1] + r * t->strides[2] + e * t->strides[3];
}
/* Element (a, b, r, e) := x as stored (its decoded value kept for the reference). */
static void tensor_set(tensor *t, int64_t a, int64_t b, int64_t r, int64_t e, double x)
{
    t->val[((a * t->shape[1] + b) * t->shape[2] + r) * t->shape[3] + e] = put(t->dt, t->data, tidx(t, a, b, r, e), x);
}

static const int64_t EDGE[] = {1, 2, 3, 4, 31, 63, 64, 65, 127, 128, 129};

/* Head sizes for the next case_make calls (0: random, never a multiple of 16). */
static int64_t g_force_e, g_force_ev, g_force_s;

/* A random case: prefill (L around the tile edges) or decode (L <= 4). */
static void case_make(cas *c, int dq, int dk, int dv, int dout, int dbias, int decode, int mk, int lay)
{
    memset(c, 0, sizeof *c);
    c->B = 1 + irand(2);
    c->Hkv = 1 + irand(2);
    c->Hq = c->Hkv * (1 + irand(3));
    c->L = decode ? 1 + irand(4) : EDGE[5 + irand(6)];
    c->S = EDGE[3 + irand(8)];
    if (c->B * c->Hq * c->L * c->S > 60000) /* keep the default suite fast */
        c->S = 65;
    c->E = 5 + irand(60);
    c->Ev = 3 + irand(50);
    if (c->E % 16 == 0) ++c->E;
    if (g_force_e > 0) { /* head sizes the AMX column takes (amx_tiles_within_their_bound) */
        c->E = g_force_e;
        c->Ev = g_force_ev;
    }
    if (g_force_s > 0) { /* keys around AMX's 128-key tiles; fewer query rows keep it fast */
        c->S = g_force_s;
        if (c->B * c->Hq * c->L * c->S > 200000)
            c->L = 33;
    }
    c->mk = mk;
    c->lay = lay;
    c->out_dt = dout;
    const double amp = 1.0 + 2.0 * (urand() + 1.0);
    tensor_make(&c->q, dq, lay, c->B, c->Hq, c->L, c->E, amp, 1);
    tensor_make(&c->k, dk, lay, c->B, c->Hkv, c->S, c->E, amp, 1);
    tensor_make(&c->v, dv, lay, c->B, c->Hkv, c->S, c->Ev, 1.0, 1);
    sdpa_options_init(&c->opt);
    c->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    switch (mk) {
    case MK_ALLOW: {
        const int64_t n = c->B * c->L * c->S; /* [B, 1, L, S] */
        c->mask = malloc((size_t)n);
        for (int64_t t = 0; t < n; ++t)
            c->mask[t] = urand() > -0.5;
        const int64_t ms[4] = {c->B, 1, c->L, c->S};
        assert_int_equal(sdpa_allow_mask_init(&c->mview, c->mask, 4, ms), SDPA_OK);
        c->opt.allow_mask = &c->mview;
        break;
    }
    case MK_CAUSAL_TL: c->opt.causal = 1; break;
    case MK_CAUSAL_BR: c->opt.causal = 1; c->opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT; break;
    case MK_WINDOW:
        c->opt.sliding_window = 1;
        c->opt.window_left = 1 + irand(20);
        c->opt.window_right = irand(5);
        c->opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        break;
    case MK_KEYLEN:
        for (int64_t b = 0; b < c->B; ++b)
            c->klen[b] = irand(c->S + 1);
        c->opt.key_lengths = c->klen;
        break;
    case MK_QLEN:
        for (int64_t b = 0; b < c->B; ++b)
            c->qlen[b] = irand(c->L + 1);
        c->opt.query_lengths = c->qlen;
        break;
    case MK_BIAS: { /* [1, Hq, L, S], some -inf */
        tensor_make(&c->bias, dbias, LAY_BHSD, 1, c->Hq, c->L, c->S, 2.0, 0);
        for (int64_t t = 0; t < c->Hq * c->L * c->S; ++t)
            if (urand() < -0.8) {
                ((dbias == F32) ? (void)(((float *)c->bias.data)[t] = -INFINITY)
                                : (void)(((uint16_t *)c->bias.data)[t] = dbias == F16 ? 0xFC00 : 0xFF80));
                c->bias.val[t] = -INFINITY;
            }
        c->opt.bias = &c->bias.view;
        break;
    }
    default: break;
    }
}
static void case_free(cas *c)
{
    tensor_free(&c->q);
    tensor_free(&c->k);
    tensor_free(&c->v);
    tensor_free(&c->bias);
    free(c->mask);
    free(c->ref_out);
    free(c->ref_lse);
    free(c->row_kind);
}

static void ref_setup(const cas *c, ref_problem *rp, ref_view *rb, ref_mask *rm)
{
    ref_problem_init(rp);
    rp->B = c->B; rp->Hq = c->Hq; rp->Hkv = c->Hkv; rp->L = c->L; rp->S = c->S; rp->E = c->E; rp->Ev = c->Ev;
    ref_view_contiguous4(&rp->q, c->q.val, c->B, c->Hq, c->L, c->E);
    ref_view_contiguous4(&rp->k, c->k.val, c->B, c->Hkv, c->S, c->E);
    ref_view_contiguous4(&rp->v, c->v.val, c->B, c->Hkv, c->S, c->Ev);
    rp->causal = c->opt.causal;
    rp->alignment = c->opt.alignment;
    rp->sliding_window = c->opt.sliding_window;
    rp->window_left = c->opt.sliding_window ? c->opt.window_left : -1;
    rp->window_right = c->opt.sliding_window ? c->opt.window_right : -1;
    rp->key_lengths = c->opt.key_lengths;
    rp->query_lengths = c->opt.query_lengths;
    rp->empty_rows_zero = 1;
    if (c->mask) {
        rm->data = c->mask;
        rm->rank = 4;
        rm->shape[0] = c->B; rm->shape[1] = 1; rm->shape[2] = c->L; rm->shape[3] = c->S;
        rm->strides[3] = 1; rm->strides[2] = c->S; rm->strides[1] = c->L * c->S; rm->strides[0] = c->L * c->S;
        rp->mask = rm;
    }
    if (c->opt.bias) {
        ref_view_contiguous4(rb, c->bias.val, 1, c->Hq, c->L, c->S);
        rp->bias = rb;
    }
}

static void case_ref(cas *c)
{
    ref_problem rp;
    ref_view rb;
    ref_mask rm;
    ref_setup(c, &rp, &rb, &rm);
    const int64_t rows = c->B * c->Hq * c->L;
    c->ref_out = malloc((size_t)(rows * c->Ev + 1) * sizeof(double));
    c->ref_lse = malloc((size_t)(rows + 1) * sizeof(double));
    c->row_kind = malloc((size_t)rows + 1);
    const ref_report rep = ref_attention(&rp, c->ref_out, NULL, c->ref_lse, c->row_kind);
    assert_int_equal(rep.status, REF_OK);
}

/* u_V, t_V of the header (REDUCED) and the out rounding quantum. */
static double uV(int dt) { return dt == F16 ? ldexp(1, -11) : dt == BF16 ? ldexp(1, -8) : 0.0; }
static double tV(int dt) { return dt == F16 ? ldexp(1, -25) : dt == BF16 ? ldexp(1, -126) : 0.0; }

static double g_worst[3][3]; /* [precision: 0 F32/default, 1 REDUCED][out dtype]: error / bound */

/* Check out (dtype c->out_dt, contiguous [B, Hq, L, Ev]) and lse against the reference within
 * the header's bound for `precision`. */
static void check_bound(const cas *c, const void *out, const float *lse, int precision, const char *what)
{
    ref_problem rp;
    ref_view rb;
    ref_mask rm;
    ref_setup(c, &rp, &rb, &rm);
    const double u = ldexp(1, -24), scale = 1.0 / sqrt((double)c->E);
    const int reduced = precision == SDPA_PRECISION_REDUCED;
    const int group = (int)(c->Hq / c->Hkv);
    double *Vd = malloc((size_t)(c->Ev + 1) * sizeof(double));
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t h = 0; h < c->Hq; ++h)
            for (int64_t i = 0; i < c->L; ++i) {
                const int64_t row = (b * c->Hq + h) * c->L + i;
                const int64_t hk = h / group;
                if (c->row_kind[row] != REF_ROW_NORMAL) {
                    for (int64_t d = 0; d < c->Ev; ++d)
                        if (get(c->out_dt, out, row * c->Ev + d) != 0.0)
                            fail_msg("%s: padding/empty row %lld not zero", what, (long long)row);
                    if (!(isinf(lse[row]) && lse[row] < 0))
                        fail_msg("%s: padding/empty row %lld lse %g", what, (long long)row, (double)lse[row]);
                    continue;
                }
                double A = 0, T = 0;
                int64_t n = 0;
                for (int64_t d = 0; d < c->Ev; ++d)
                    Vd[d] = 0;
                for (int64_t j = 0; j < c->S; ++j) {
                    if (!ref_structurally_allowed(&rp, b, h, i, j))
                        continue;
                    double bv = 0;
                    if (c->opt.bias) {
                        bv = c->bias.val[(h * c->L + i) * c->S + j];
                        if (isinf(bv))
                            continue;
                    }
                    double dot = 0, mag = 0;
                    for (int64_t e = 0; e < c->E; ++e) {
                        const double x = c->q.val[row * c->E + e] * c->k.val[((b * c->Hkv + hk) * c->S + j) * c->E + e];
                        dot += x;
                        mag += fabs(x);
                    }
                    A = fmax(A, scale * mag);
                    T = fmax(T, fabs(scale * dot + bv));
                    ++n;
                    for (int64_t d = 0; d < c->Ev; ++d)
                        Vd[d] = fmax(Vd[d], fabs(c->v.val[((b * c->Hkv + hk) * c->S + j) * c->Ev + d]));
                }
                double delta = (double)(c->E + 2) * u * A + 8.0 * u * T;
                if (reduced && c->q.dt == BF16 && c->k.dt == BF16) /* bf16 dot products (no subnormals here) */
                    delta += scale * (double)c->E * ldexp(1, -126);
                double lb = delta + (double)(n + 32) * u + u * fabs(c->ref_lse[row]);
                if (reduced)
                    lb += uV(c->v.dt) + (double)n * tV(c->v.dt);
                const double le = fabs((double)lse[row] - c->ref_lse[row]);
                if (!(le <= lb))
                    fail_msg("%s: lse row %lld error %.3g > bound %.3g", what, (long long)row, le, lb);
                g_worst[reduced][c->out_dt] = fmax(g_worst[reduced][c->out_dt], le / lb);
                for (int64_t d = 0; d < c->Ev; ++d) {
                    const double V = Vd[d];
                    double err = V * (expm1(2.0 * delta) + (double)(3 * n + 32) * u) +
                                 (double)(3 * n + 32) * ldexp(1, -150); /* float32 subnormal results */
                    if (reduced)
                        err += 2.0 * (uV(c->v.dt) + (double)n * tV(c->v.dt)) * V;
                    if (reduced && c->v.dt == BF16) /* P.V by bf16 dot products: subnormals read/flushed as 0 */
                        err += (double)(2 * n + 1) * ldexp(1, -126);
                    double r = 0;
                    if (c->out_dt == F16)
                        r = ldexp(1, -11) * (V + err) + ldexp(1, -25);
                    else if (c->out_dt == BF16)
                        r = ldexp(1, -8) * (V + err) + ldexp(1, -134);
                    const double bound = err + r;
                    const double x = get(c->out_dt, out, row * c->Ev + d);
                    const double e = fabs(x - c->ref_out[row * c->Ev + d]);
                    if (!(e <= bound))
                        fail_msg("%s: out (row %lld, d %lld) = %.9g, ref %.9g: error %.3g > bound %.3g", what,
                                 (long long)row, (long long)d, x, c->ref_out[row * c->Ev + d], e, bound);
                    if (bound > 0)
                        g_worst[reduced][c->out_dt] = fmax(g_worst[reduced][c->out_dt], e / bound);
                }
            }
    free(Vd);
}

/* ------------------------------------------------------------- running paths */

static const int KERNELS[4] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE, SDPA_KERNEL_AUTO};
static const char *const KN[4] = {"REFERENCE", "TILED", "DECODE", "AUTO"};

#define MAX_PATHS 4096
static char g_paths[MAX_PATHS][80];
static int g_npaths;
static long g_runs, g_bf16dot_runs, g_bf16pv_runs, g_amx_runs;
/* AMX: requested in main (the application's opt-in); g_amx says whether Linux granted it. */
static int g_amx;
static char g_amx_why[200] = "not requested";
/* The levels run_case walks: every ISA cap, then AVX512 with the AMX column allowed. */
#define LEVEL_AMX SDPA__ISA_COUNT
static int level_isa(int lv) { return lv == LEVEL_AMX ? SDPA__ISA_AVX512 : lv; }
static const char *level_name(int lv) { return lv == LEVEL_AMX ? "avx512+amx" : sdpa__isa_name(lv); }
static void note_path(int lv, int dq, int dk, int dv, int dout)
{
    char s[80];
    snprintf(s, sizeof s, "%s@%s q%s k%s v%s o%s", sdpa_last_kernel(), level_name(lv), DN[dq], DN[dk], DN[dv],
             DN[dout]);
    for (int t = 0; t < g_npaths; ++t)
        if (strcmp(g_paths[t], s) == 0)
            return;
    if (g_npaths < MAX_PATHS)
        strcpy(g_paths[g_npaths++], s);
}

typedef struct outbuf {
    void *out;
    float *lse;
    sdpa_tensor to, tl;
} outbuf;
static void outbuf_make(outbuf *o, const cas *c, int dt)
{
    const int64_t rows = c->B * c->Hq * c->L;
    o->out = malloc((size_t)(rows * c->Ev + 1) * esize(dt));
    o->lse = malloc((size_t)(rows + 1) * sizeof(float));
    memset(o->out, 0x5A, (size_t)(rows * c->Ev + 1) * esize(dt));
    const int64_t os[4] = {c->B, c->Hq, c->L, c->Ev}, ls[3] = {c->B, c->Hq, c->L};
    assert_int_equal(sdpa_tensor_init_dtype(&o->to, o->out, (sdpa_dtype)dt, 4, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&o->tl, o->lse, 3, ls), SDPA_OK);
}
static void outbuf_free(outbuf *o)
{
    free(o->out);
    free(o->lse);
}
static size_t out_bytes(const cas *c, int dt) { return (size_t)(c->B * c->Hq * c->L * c->Ev) * esize(dt); }
static size_t lse_bytes(const cas *c) { return (size_t)(c->B * c->Hq * c->L) * sizeof(float); }

static int isa_available(int isa) { return sdpa__cpu_has_isa(isa); }

/* The widened float32 copy of a case's tensors (same layout), for the bit-identity check. */
static void widen_copy(const tensor *t, tensor *w)
{
    *w = *t;
    w->dt = F32;
    w->data = malloc((size_t)t->nelem * 4 + 4);
    w->val = NULL;
    for (int64_t i = 0; i < t->nelem; ++i)
        ((float *)w->data)[i] = (float)get(t->dt, t->data, i);
    assert_int_equal(sdpa_tensor_init_strided(&w->view, w->data, SDPA_DTYPE_F32, 4, t->shape, t->strides), SDPA_OK);
}

/* Rounding of a float32 out to dtype dt by the header's rule (nearest even), for comparing. */
static uint16_t round_to(int dt, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dt == BF16) {
        if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu))
            return (uint16_t)((u >> 16) | 0x40);
        return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    /* f16 by exhaustive neighbours: the nearest of the two candidates around enc16(x) */
    const double xd = (double)x;
    if (isnan(xd))
        return 0x7E00;
    uint16_t best = enc16(xd);
    for (int dlt = -1; dlt <= 1; ++dlt) {
        const uint16_t cnd = (uint16_t)(best + dlt);
        const double a = fabs(dec16(cnd) - xd), bb = fabs(dec16(best) - xd);
        if ((cnd & 0x7C00) != 0x7C00 && (a < bb || (a == bb && !(cnd & 1) && (best & 1))))
            best = cnd;
    }
    if (fabs(xd) >= 65520.0)
        best = (uint16_t)((x < 0 ? 0x8000 : 0) | 0x7C00);
    return best;
}

/* Run a case on every kernel and ISA cap; precision as given. */
static void run_case(cas *c, int precision, int threads_check)
{
    const int dq = c->q.dt, dk = c->k.dt, dv = c->v.dt, dout = c->out_dt;
    tensor wq, wk, wv, wb;
    widen_copy(&c->q, &wq);
    widen_copy(&c->k, &wk);
    widen_copy(&c->v, &wv);
    sdpa_options wopt = c->opt;
    if (c->opt.bias) {
        widen_copy(&c->bias, &wb);
        wopt.bias = &wb.view;
    }
    outbuf o, w, t2;
    outbuf_make(&o, c, dout);
    outbuf_make(&w, c, F32);
    outbuf_make(&t2, c, dout);
    for (int lv = 0; lv <= LEVEL_AMX; ++lv) {
        const int isa = level_isa(lv), amx = lv == LEVEL_AMX;
        if (!isa_available(isa) || (amx && !g_amx))
            continue;
        sdpa__dispatch_set_max_isa_for_testing(isa);
        sdpa__dispatch_set_amx_for_testing(amx);
        for (int kk = 0; kk < 4; ++kk) {
            char what[256];
            snprintf(what, sizeof what, "%s@%s q%s k%s v%s o%s b%s %s lay%d B%lld Hq%lld Hkv%lld L%lld S%lld E%lld Ev%lld prec%d",
                     KN[kk], level_name(lv), DN[dq], DN[dk], DN[dv], DN[dout],
                     c->opt.bias ? DN[c->bias.dt] : "-", MKN[c->mk], c->lay, (long long)c->B, (long long)c->Hq,
                     (long long)c->Hkv, (long long)c->L, (long long)c->S, (long long)c->E, (long long)c->Ev,
                     precision);
            sdpa_options opt = c->opt;
            opt.kernel = KERNELS[kk];
            opt.precision = precision;
            opt.num_threads = 1;
            const sdpa_status st = sdpa_attention(&c->q.view, &c->k.view, &c->v.view, &opt, &o.to, NULL, &o.tl);
            if (st == SDPA_ERR_UNSUPPORTED)
                continue; /* the kernel does not serve this shape */
            if (st != SDPA_OK)
                fail_msg("%s: %s (%s)", what, sdpa_status_string(st), sdpa_last_error_message());
            note_path(lv, dq, dk, dv, dout);
            /* AMX allowed: the tiled kernel's bf16 products run on AMX tiles where the head sizes
             * fit the column (E a multiple of 32 up to 256, Ev of 16); decode stays AVX512-BF16 */
            const int amx_fits = c->E % 32 == 0 && c->E <= 256 && c->Ev % 16 == 0;
            const int tiled_ran = strstr(sdpa_last_kernel(), "tiled") != NULL;
            if (amx && precision == SDPA_PRECISION_REDUCED && ((dq == BF16 && dk == BF16) || dv == BF16) &&
                tiled_ran) {
                if ((strstr(sdpa_last_kernel(), "tiled-amx-bf16") != NULL) != amx_fits)
                    fail_msg("%s: REDUCED bf16 tiled ran %s with AMX allowed (head sizes %s the AMX column)", what,
                             sdpa_last_kernel(), amx_fits ? "fit" : "do not fit");
                g_amx_runs += amx_fits;
            }
            if (precision == SDPA_PRECISION_REDUCED && dq == BF16 && dk == BF16 && isa == SDPA__ISA_AVX512 &&
                sdpa__cpu_features()->avx512bf16 && (kk == 1 || kk == 2) && !(amx && amx_fits && tiled_ran)) {
                if (strstr(sdpa_last_kernel(), "avx512bf16") == NULL)
                    fail_msg("%s: REDUCED bf16 q/k ran %s, not the AVX512-BF16 path", what, sdpa_last_kernel());
                ++g_bf16dot_runs;
            }
            /* bf16 V under REDUCED: the tiled kernel rounds P to bf16 for VDPBF16PS P.V */
            if (precision == SDPA_PRECISION_REDUCED && dv == BF16 && isa == SDPA__ISA_AVX512 &&
                sdpa__cpu_features()->avx512bf16 && tiled_ran && !(amx && amx_fits)) {
                if (strstr(sdpa_last_kernel(), "tiled-avx512bf16") == NULL)
                    fail_msg("%s: REDUCED bf16 v ran %s, not the AVX512-BF16 P.V path", what, sdpa_last_kernel());
                ++g_bf16pv_runs;
            }
            ++g_runs;
            check_bound(c, o.out, o.lse, precision, what);
            if (precision != SDPA_PRECISION_REDUCED) {
                /* bit-identical to the f32 run on the widened inputs, out rounded once */
                sdpa_options o2 = wopt;
                o2.kernel = KERNELS[kk];
                o2.num_threads = 1;
                assert_int_equal(sdpa_attention(&wq.view, &wk.view, &wv.view, &o2, &w.to, NULL, &w.tl), SDPA_OK);
                const int64_t n = c->B * c->Hq * c->L * c->Ev;
                for (int64_t t = 0; t < n; ++t) {
                    const float y = ((float *)w.out)[t];
                    int same;
                    if (dout == F32) {
                        same = memcmp(&y, (float *)o.out + t, 4) == 0;
                    } else {
                        const uint16_t g = ((uint16_t *)o.out)[t], r = round_to(dout, y);
                        same = g == r || (y == 0.0f && (g & 0x7FFF) == 0 && (r & 0x7FFF) == 0);
                    }
                    if (!same)
                        fail_msg("%s: element %lld differs from the widened f32 run (%.9g vs %.9g)", what,
                                 (long long)t, get(dout, o.out, t), (double)y);
                }
                if (memcmp(w.lse, o.lse, lse_bytes(c)) != 0)
                    fail_msg("%s: lse differs from the widened f32 run", what);
            }
            if (threads_check)
                for (int nt = 2; nt <= 3; ++nt) {
                    opt.num_threads = nt;
                    memset(t2.out, 0x33, out_bytes(c, dout));
                    assert_int_equal(sdpa_attention(&c->q.view, &c->k.view, &c->v.view, &opt, &t2.to, NULL, &t2.tl),
                                     SDPA_OK);
                    if (memcmp(t2.out, o.out, out_bytes(c, dout)) != 0 || memcmp(t2.lse, o.lse, lse_bytes(c)) != 0)
                        fail_msg("%s: %d threads differ from 1 thread", what, nt);
                }
        }
    }
    sdpa__dispatch_set_max_isa_for_testing(-1);
    sdpa__dispatch_set_amx_for_testing(0);
    outbuf_free(&o);
    outbuf_free(&w);
    outbuf_free(&t2);
    free(wq.data);
    free(wk.data);
    free(wv.data);
    if (c->opt.bias)
        free(wb.data);
}

static void print_paths(const char *title)
{
    printf("%s: %d distinct (kernel, ISA, dtype) paths exercised in %ld runs\n", title, g_npaths, g_runs);
    for (int isa = 0; isa < SDPA__ISA_COUNT; ++isa)
        if (!isa_available(isa))
            printf("  ISA %s: not run (this CPU lacks it)\n", sdpa__isa_name(isa));
    printf("  AVX512-BF16 (VDPBF16PS): %s\n", sdpa__cpu_features()->avx512bf16 ? "present" : "not run (CPU lacks it)");
    if (g_amx)
        printf("  tiled-amx-bf16 (AMX-BF16 tiles): %ld runs\n", g_amx_runs);
    else
        printf("  tiled-amx-bf16: not run (%s)\n", g_amx_why);
}

/* Every (q, k, v) in {f32, f16, bf16}^3 times every out dtype, a prefill and a decode case
 * each, every kernel and ISA, mask kinds and layouts rotated. */
static void every_dtype_combination_on_every_path(void **state)
{
    (void)state;
    int idx = 0;
    for (int dq = 0; dq < 3; ++dq)
        for (int dk = 0; dk < 3; ++dk)
            for (int dv = 0; dv < 3; ++dv)
                for (int dout = 0; dout < 3; ++dout)
                    for (int decode = 0; decode < 2; ++decode, ++idx) {
                        cas c;
                        const int mk = idx % MK_COUNT, lay = (idx / MK_COUNT) % 3;
                        case_make(&c, dq, dk, dv, dout, (idx / 3) % 3, decode, mk, lay);
                        case_ref(&c);
                        run_case(&c, SDPA_PRECISION_DEFAULT, idx % 3 == 0);
                        case_free(&c);
                    }
    print_paths("default precision");
    for (int r = 0; r < 2; ++r)
        printf("  largest error/bound (%s): out f32 %.3f, out f16 %.3f, out bf16 %.3f\n", r ? "REDUCED" : "F32",
               g_worst[r][0], g_worst[r][1], g_worst[r][2]);
    assert_true(g_npaths > 0);
}

/* SDPA_PRECISION_REDUCED within its bound (bf16 dot products where q and k are bf16 and the
 * CPU has AVX512-BF16; probabilities rounded to V's dtype). */
static void reduced_precision_within_its_bound(void **state)
{
    (void)state;
    const int combos[6][3] = {{BF16, BF16, BF16}, {BF16, BF16, F16}, {BF16, BF16, F32},
                              {F32, F16, F16},    {F16, BF16, BF16}, {F32, BF16, BF16}};
    const long runs0 = g_runs;
    for (int it = 0; it < 4 * 6 * 2; ++it) {
        const int round = it / 12, t = (it / 2) % 6, decode = it % 2;
        {
            cas c;
            case_make(&c, combos[t][0], combos[t][1], combos[t][2], (t + decode + round) % 3, (t + round) % 3, decode,
                      (t * 2 + decode + round * 3) % MK_COUNT, (t + round) % 3);
            case_ref(&c);
            run_case(&c, SDPA_PRECISION_REDUCED, 1);
            case_free(&c);
        }
    }
    printf("REDUCED: %ld runs, %ld on the VDPBF16PS score path, %ld on the tiled bf16 P.V path (P rounded); largest "
           "error/bound: out f32 %.3f, out f16 %.3f, out bf16 %.3f\n",
           g_runs - runs0, g_bf16dot_runs, g_bf16pv_runs, g_worst[1][0], g_worst[1][1], g_worst[1][2]);
    if (sdpa__cpu_has_isa(SDPA__ISA_AVX512) && sdpa__cpu_features()->avx512bf16)
        assert_true(g_bf16pv_runs > 0);
    else
        printf("  tiled bf16 P.V (VDPBF16PS): not run (CPU lacks AVX512-BF16)\n");
    print_paths("all precisions");
}

/* Rows nothing may read: a padding query row in batch 0, the last two keys beyond the key
 * lengths (the case must have been made with MK_KEYLEN). */
static void unread_rows(cas *c)
{
    c->qlen[0] = c->L > 1 ? c->L - 1 : c->L;
    c->qlen[1] = c->L;
    c->opt.query_lengths = c->qlen;
    for (int64_t b = 0; b < c->B; ++b)
        c->klen[b] = c->S > 2 ? c->S - 2 : c->S;
}

/* NaN (nan = 1) or Inf encodings into every K/V row at or beyond a key length and every query
 * row at or beyond a query length (rows nothing may read). */
static void poison_unread(cas *c, int nan)
{
    for (int64_t b = 0; b < c->B; ++b) {
        for (int64_t g = 0; g < c->Hkv; ++g)
            for (int64_t j = c->klen[b]; j < c->S; ++j) {
                for (int64_t e = 0; e < c->E; ++e)
                    put_raw(c->k.dt, c->k.data, tidx(&c->k, b, g, j, e), (int)(e + nan) & 1);
                for (int64_t e = 0; e < c->Ev; ++e)
                    put_raw(c->v.dt, c->v.data, tidx(&c->v, b, g, j, e), (int)(e + nan + 1) & 1);
            }
        for (int64_t h = 0; h < c->Hq; ++h)
            for (int64_t i = c->qlen[b]; i < c->L; ++i)
                for (int64_t e = 0; e < c->E; ++e)
                    put_raw(c->q.dt, c->q.data, tidx(&c->q, b, h, i, e), nan);
    }
}

/* One query row (E = 32, bf16, every element qbits) against S = 130 bf16 keys: even keys hold
 * k0bits in their even elements and its negation in the odd ones (or k0bits throughout when
 * k1bits equals it), odd keys k1bits throughout; scale 0 = the default. The AMX tiled kernel
 * must return the mean of V (every key's true score is equal). */
static void amx_overflow_case(uint16_t qbits, uint16_t k0bits, uint16_t k1bits, float scale, const char *what)
{
    enum { S = 130, E = 32, Ev = 16 };
    uint16_t q[E], k[S * E], v[S * Ev];
    float out[Ev], mean[Ev] = {0};
    for (int e = 0; e < E; ++e)
        q[e] = qbits;
    for (int j = 0; j < S; ++j)
        for (int e = 0; e < E; ++e)
            k[j * E + e] = j % 2 ? k1bits : (k1bits == k0bits || e % 2 == 0) ? k0bits : (uint16_t)(k0bits ^ 0x8000);
    for (int t = 0; t < S * Ev; ++t) {
        v[t] = encb16(0.25 * (double)((t * 7) % 9) - 1.0);
        mean[t % Ev] += (float)(decb16(v[t]) / (double)S);
    }
    sdpa_tensor tq, tk, tv, to;
    const int64_t sq[4] = {1, 1, 1, E}, sk[4] = {1, 1, S, E}, sv[4] = {1, 1, S, Ev}, so[4] = {1, 1, 1, Ev};
    const int64_t stq[4] = {E, E, E, 1}, stk[4] = {S * E, S * E, E, 1}, stv[4] = {S * Ev, S * Ev, Ev, 1},
                  sto[4] = {Ev, Ev, Ev, 1};
    assert_int_equal(sdpa_tensor_init_strided(&tq, q, SDPA_DTYPE_BF16, 4, sq, stq), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&tk, k, SDPA_DTYPE_BF16, 4, sk, stk), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&tv, v, SDPA_DTYPE_BF16, 4, sv, stv), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&to, out, SDPA_DTYPE_F32, 4, so, sto), SDPA_OK);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.kernel = SDPA_KERNEL_TILED;
    opt.precision = SDPA_PRECISION_REDUCED;
    opt.scale = scale;
    sdpa__dispatch_set_amx_for_testing(1);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, NULL), SDPA_OK);
    sdpa__dispatch_set_amx_for_testing(0);
    assert_non_null(strstr(sdpa_last_kernel(), "tiled-amx-bf16"));
    for (int d = 0; d < Ev; ++d)
        if (!(fabs(out[d] - mean[d]) <= 1e-5))
            fail_msg("tiled-amx-bf16, %s: out[%d] = %g, want the mean of V %g", what, d, (double)out[d],
                     (double)mean[d]);
}

/* The AMX-BF16 column (tiled-amx-bf16), where Linux grants AMX: head sizes it takes (E a
 * multiple of 32, Ev of 16), L and S around its 128-row / 128-key tiles, every mask kind and
 * layout, GQA, bf16 scores and/or bf16 P.V; within the REDUCED bound, bit-identical across 1-3
 * threads, and every run checked to be on the AMX path (run_case). Then NaN/Inf encodings in K/V
 * rows beyond the key lengths (including a last partial key block, which AMX copies) and in
 * padding query rows change nothing. */
static void amx_tiles_within_their_bound(void **state)
{
    (void)state;
    if (!g_amx) {
        printf("tiled-amx-bf16: not run (%s)\n", g_amx_why);
        skip();
    }
    /* the last pair: E = 48 (a multiple of 16, not 32) is not the AMX column's */
    static const int64_t es[][2] = {{32, 16}, {64, 64}, {96, 48}, {128, 128}, {256, 32}, {64, 80}, {48, 16}};
    static const int64_t ss[] = {0, 129, 203, 256, 257, 400};
    const int combos[4][3] = {{BF16, BF16, BF16}, {BF16, BF16, F32}, {F32, F16, BF16}, {BF16, BF16, F16}};
    const long amx0 = g_amx_runs;
    for (int it = 0; it < 7 * MK_COUNT / 2; ++it) {
        cas c;
        const int t = it % 4, mk = it % MK_COUNT, jump = it % 3 == 1;
        g_force_e = es[it % 7][0];
        g_force_ev = es[it % 7][1];
        g_force_s = ss[it % 6];
        case_make(&c, combos[t][0], combos[t][1], combos[t][2], it % 3, (it / 3) % 3, 0, mk, (it / 2) % 3);
        if (jump && c.S > 128) {
            /* keys of the second 128-key tile score about 20 above the first tile's: the
             * online softmax must move its reference point (and rescale Ot) there */
            for (int64_t b = 0; b < c.B; ++b) {
                for (int64_t h = 0; h < c.Hq; ++h)
                    for (int64_t i = 0; i < c.L; ++i)
                        for (int64_t e = 0; e < c.E; ++e)
                            tensor_set(&c.q, b, h, i, e, 0.75 + 0.25 * fabs(urand()));
                for (int64_t g = 0; g < c.Hkv; ++g)
                    for (int64_t j = 128; j < c.S; ++j)
                        for (int64_t e = 0; e < c.E; ++e)
                            tensor_set(&c.k, b, g, j, e, (20.0 + (double)(j % 7)) / sqrt((double)c.E));
            }
        }
        case_ref(&c);
        run_case(&c, SDPA_PRECISION_REDUCED, 1);
        case_free(&c);
    }
    g_force_s = 0;
    /* float32 scores that are not finite although q and k are: the rows are recomputed in
     * double, where every key scores the same, so out is the mean of V. A scaled score that
     * overflows (scale 2^10, q = k = 2^60, E = 32: q.k = 2^125 but 2^135 scaled), and NaN raw
     * scores (products of +-2^64 overflow to +-Inf: Inf - Inf) beside finite ones (k = 0, which
     * would hide the NaN from a running max) */
    amx_overflow_case(0x5d80, 0x5d80, 0x5d80, 1024.0f, "an overflowed scaled score");
    amx_overflow_case(0x5f80, 0x5f80, 0x0000, 0.0f, "NaN raw scores beside finite ones");
    /* blocked rows: the tiled kernel on AMX, E = 64, S with a partial last key block; key
     * lengths S - 2 = 201: the last tile holds an odd number of keys (73) */
    int checked = 0;
    g_force_e = 64;
    g_force_ev = 32;
    g_force_s = 203;
    for (int nan = 0; nan < 2; ++nan) {
        cas c;
        case_make(&c, BF16, BF16, BF16, BF16, F32, 0, MK_KEYLEN, LAY_PAD);
        unread_rows(&c);
        outbuf clean, dirty;
        outbuf_make(&clean, &c, c.out_dt);
        outbuf_make(&dirty, &c, c.out_dt);
        sdpa__dispatch_set_amx_for_testing(1);
        sdpa_options opt = c.opt;
        opt.kernel = SDPA_KERNEL_TILED;
        opt.precision = SDPA_PRECISION_REDUCED;
        assert_int_equal(sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &clean.to, NULL, &clean.tl), SDPA_OK);
        assert_non_null(strstr(sdpa_last_kernel(), "tiled-amx-bf16"));
        poison_unread(&c, nan);
        memset(dirty.out, 0x11, out_bytes(&c, c.out_dt));
        assert_int_equal(sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &dirty.to, NULL, &dirty.tl), SDPA_OK);
        if (memcmp(clean.out, dirty.out, out_bytes(&c, c.out_dt)) != 0 || memcmp(clean.lse, dirty.lse, lse_bytes(&c)) != 0)
            fail_msg("tiled-amx-bf16: NaN/Inf in blocked rows or gaps changed the result (S %lld)", (long long)c.S);
        ++checked;
        sdpa__dispatch_set_amx_for_testing(0);
        outbuf_free(&clean);
        outbuf_free(&dirty);
        case_free(&c);
    }
    g_force_e = g_force_ev = g_force_s = 0;
    printf("tiled-amx-bf16: %ld runs on AMX tiles within the REDUCED bound (largest error/bound: out f32 %.3f, "
           "f16 %.3f, bf16 %.3f), %d blocked-row checks\n",
           g_amx_runs - amx0, g_worst[1][0], g_worst[1][1], g_worst[1][2], checked);
    assert_true(g_amx_runs > amx0);
}

/* NaN/Inf encodings where nothing may read them: K/V rows beyond key lengths, padding query
 * rows, stride gaps (the padded layout holds NaN there from tensor_make) and K/V rows blocked by
 * a causal bottom-right window change nothing; in an attended row: SDPA_ERR_NON_FINITE, out
 * untouched. */
static void nonfinite_encodings_never_leak(void **state)
{
    (void)state;
    const int dts[3][3] = {{F16, F16, F16}, {BF16, BF16, BF16}, {F32, F16, BF16}};
    int checked = 0;
    for (int t = 0; t < 3; ++t)
        for (int decode = 0; decode < 2; ++decode)
            for (int nan = 0; nan < 2; ++nan) {
                cas c;
                case_make(&c, dts[t][0], dts[t][1], dts[t][2], (t + nan) % 3, F32, decode, MK_KEYLEN, LAY_PAD);
                unread_rows(&c);
                outbuf clean, dirty;
                outbuf_make(&clean, &c, c.out_dt);
                outbuf_make(&dirty, &c, c.out_dt);
                for (int isa = 0; isa < SDPA__ISA_COUNT; ++isa) {
                    if (!isa_available(isa))
                        continue;
                    sdpa__dispatch_set_max_isa_for_testing(isa);
                    for (int kk = 0; kk < 4; ++kk) {
                        tensor_free(&c.q); tensor_free(&c.k); tensor_free(&c.v);
                        g_rng = 777u + (uint64_t)t;
                        tensor_make(&c.q, dts[t][0], LAY_PAD, c.B, c.Hq, c.L, c.E, 1.0, 1);
                        tensor_make(&c.k, dts[t][1], LAY_PAD, c.B, c.Hkv, c.S, c.E, 1.0, 1);
                        tensor_make(&c.v, dts[t][2], LAY_PAD, c.B, c.Hkv, c.S, c.Ev, 1.0, 1);
                        sdpa_options opt = c.opt;
                        opt.kernel = KERNELS[kk];
                        sdpa_status st = sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &clean.to, NULL, &clean.tl);
                        if (st == SDPA_ERR_UNSUPPORTED)
                            continue;
                        assert_int_equal(st, SDPA_OK);
                        /* poison every row nothing attends */
                        poison_unread(&c, nan);
                        memset(dirty.out, 0x11, out_bytes(&c, c.out_dt));
                        st = sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &dirty.to, NULL, &dirty.tl);
                        assert_int_equal(st, SDPA_OK);
                        if (memcmp(clean.out, dirty.out, out_bytes(&c, c.out_dt)) != 0 ||
                            memcmp(clean.lse, dirty.lse, lse_bytes(&c)) != 0)
                            fail_msg("%s@%s %s: NaN/Inf in blocked rows or gaps changed the result", KN[kk],
                                     sdpa__isa_name(isa), DN[c.k.dt]);
                        /* an attended K (or V) row: the finite check fails, out untouched */
                        if (c.klen[0] > 0) {
                            tensor *x = nan ? &c.v : &c.k;
                            put_raw(x->dt, x->data, tidx(x, 0, 0, 0, 0), nan);
                            memset(dirty.out, 0x11, out_bytes(&c, c.out_dt));
                            st = sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &dirty.to, NULL, &dirty.tl);
                            if (st != SDPA_ERR_NON_FINITE)
                                fail_msg("%s@%s: attended %s %s row: got %s", KN[kk], sdpa__isa_name(isa),
                                         DN[x->dt], nan ? "value" : "key", sdpa_status_string(st));
                            for (size_t by = 0; by < out_bytes(&c, c.out_dt); ++by)
                                if (((unsigned char *)dirty.out)[by] != 0x11)
                                    fail_msg("out written although the finite check failed");
                        }
                        /* an attended q row (f16/bf16 Inf encodings too) */
                        put_raw(c.q.dt, c.q.data, tidx(&c.q, 0, 0, 0, c.E - 1), !nan);
                        st = sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &dirty.to, NULL, &dirty.tl);
                        if (c.klen[0] > 0 && st != SDPA_ERR_NON_FINITE)
                            fail_msg("%s@%s: attended %s query row: got %s", KN[kk], sdpa__isa_name(isa), DN[c.q.dt],
                                     sdpa_status_string(st));
                        ++checked;
                    }
                }
                sdpa__dispatch_set_max_isa_for_testing(-1);
                outbuf_free(&clean);
                outbuf_free(&dirty);
                case_free(&c);
            }
    printf("non-finite encodings: %d (case, kernel, ISA) checks\n", checked);
    assert_true(checked > 0);
}

/* Zero Q/K, V = [2, 4, 8], 3x3 causal: 2, 3, 14/3, in f16 and bf16 storage and out. */
static void golden_facts_in_f16_and_bf16(void **state)
{
    (void)state;
    for (int dt = F16; dt <= BF16; ++dt)
        for (int dout = 0; dout < 3; ++dout)
            for (int kk = 0; kk < 4; ++kk) {
                uint16_t q[3] = {0, 0, 0}, k[3] = {0, 0, 0}, v[3];
                double vv[3] = {2, 4, 8};
                for (int t = 0; t < 3; ++t)
                    (void)put(dt, v, t, vv[t]);
                _Alignas(float) unsigned char out[12]; /* a float32 out needs 4-byte alignment (0.6: SDPA_ERR_ALIGNMENT) */
                const int64_t sh[3] = {1, 3, 1};
                sdpa_tensor tq, tk, tv, to;
                assert_int_equal(sdpa_tensor_init_dtype(&tq, q, (sdpa_dtype)dt, 3, sh), SDPA_OK);
                assert_int_equal(sdpa_tensor_init_dtype(&tk, k, (sdpa_dtype)dt, 3, sh), SDPA_OK);
                assert_int_equal(sdpa_tensor_init_dtype(&tv, v, (sdpa_dtype)dt, 3, sh), SDPA_OK);
                assert_int_equal(sdpa_tensor_init_dtype(&to, out, (sdpa_dtype)dout, 3, sh), SDPA_OK);
                sdpa_options o;
                sdpa_options_init(&o);
                o.causal = 1;
                o.kernel = KERNELS[kk];
                const sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
                if (st == SDPA_ERR_UNSUPPORTED)
                    continue;
                assert_int_equal(st, SDPA_OK);
                const double want[3] = {2.0, 3.0, 14.0 / 3.0};
                const double tol = dout == F32 ? 1e-6 : dout == F16 ? ldexp(1, -11) * 5 : ldexp(1, -8) * 5;
                for (int t = 0; t < 3; ++t)
                    if (!(fabs(get(dout, out, t) - want[t]) <= tol))
                        fail_msg("%s %s out %s: golden[%d] = %.9g, expected %.9g", KN[kk], DN[dt], DN[dout], t,
                                 get(dout, out, t), want[t]);
                /* 2 and 3 are exact in every dtype */
                assert_true(get(dout, out, 0) == 2.0 && get(dout, out, 1) == 3.0);
                if (dout != F32) /* 14/3 rounded once to nearest */
                    assert_int_equal(((uint16_t *)(void *)out)[2], round_to(dout, 14.0f / 3.0f));
            }
}

/* Dropout with f16/bf16 storage equals dropout on the widened f32 inputs, bit for bit. */
static void dropout_on_reduced_storage(void **state)
{
    (void)state;
    for (int dt = F16; dt <= BF16; ++dt)
        for (int decode = 0; decode < 2; ++decode) {
            cas c;
            case_make(&c, dt, dt, dt, F32, F32, decode, MK_CAUSAL_BR, LAY_BSHD);
            tensor wq, wk, wv;
            widen_copy(&c.q, &wq);
            widen_copy(&c.k, &wk);
            widen_copy(&c.v, &wv);
            outbuf a, b;
            outbuf_make(&a, &c, F32);
            outbuf_make(&b, &c, F32);
            for (int kk = 0; kk < 4; ++kk) {
                sdpa_options o = c.opt;
                o.kernel = KERNELS[kk];
                o.dropout_p = 0.3f;
                o.dropout_seed = 42;
                const sdpa_status st = sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &o, &a.to, NULL, &a.tl);
                if (st == SDPA_ERR_UNSUPPORTED)
                    continue;
                assert_int_equal(st, SDPA_OK);
                assert_int_equal(sdpa_attention(&wq.view, &wk.view, &wv.view, &o, &b.to, NULL, &b.tl), SDPA_OK);
                assert_memory_equal(a.out, b.out, out_bytes(&c, F32));
            }
            outbuf_free(&a);
            outbuf_free(&b);
            free(wq.data);
            free(wk.data);
            free(wv.data);
            case_free(&c);
        }
}

/* Names: "<kernel>-<isa>-<dtype>" for reduced storage; f32 names unchanged. */
static void kernel_names_carry_the_dtype(void **state)
{
    (void)state;
    cas c;
    case_make(&c, F16, F16, F16, F16, F32, 0, MK_NONE, LAY_BHSD);
    outbuf o;
    outbuf_make(&o, &c, F16);
    sdpa_options opt = c.opt;
    opt.kernel = SDPA_KERNEL_REFERENCE;
    assert_int_equal(sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &o.to, NULL, &o.tl), SDPA_OK);
    assert_string_equal(sdpa_last_kernel(), "reference-f16");
    opt.kernel = SDPA_KERNEL_TILED;
    assert_int_equal(sdpa_attention(&c.q.view, &c.k.view, &c.v.view, &opt, &o.to, NULL, &o.tl), SDPA_OK);
    const size_t n = strlen(sdpa_last_kernel());
    assert_true(n > 4 && strcmp(sdpa_last_kernel() + n - 4, "-f16") == 0 && strncmp(sdpa_last_kernel(), "tiled-", 6) == 0);
    outbuf_free(&o);
    case_free(&c);
}

/* Without arguments: every test but the AMX column's own; with --amx: only that one, and exit
 * status 77 (meson's "skipped") where AMX cannot run, so that the test list says SKIP instead of
 * OK on such machines (a path the CPU lacks is reported as not run, never as passed). */
int main(int argc, char **argv)
{
    const int amx_only = argc > 1 && strcmp(argv[1], "--amx") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_names_carry_the_dtype),
        cmocka_unit_test(golden_facts_in_f16_and_bf16),
        cmocka_unit_test(every_dtype_combination_on_every_path),
        cmocka_unit_test(reduced_precision_within_its_bound),
        cmocka_unit_test(nonfinite_encodings_never_leak),
        cmocka_unit_test(dropout_on_reduced_storage),
    };
    const struct CMUnitTest amx_tests[] = {
        cmocka_unit_test(amx_tiles_within_their_bound),
    };
    /* the application's AMX opt-in (sdpa.h), once for the process; the AMX column is then
     * allowed only where a test says so (run_case's last level) */
    const char *cap = getenv("SDPA_MAX_ISA");
    if (!sdpa__cpu_features()->amx_bf16) {
        snprintf(g_amx_why, sizeof g_amx_why, "this CPU lacks AMX-BF16");
    } else if (!sdpa__cpu_has_isa(SDPA__ISA_AVX512) || !sdpa__cpu_features()->avx512bf16) {
        snprintf(g_amx_why, sizeof g_amx_why, "AVX-512 / AVX512-BF16 not available (valgrind masks them)");
    } else if (cap != NULL && strcmp(cap, "amx") != 0 &&
               (!strcmp(cap, "portable") || !strcmp(cap, "avx2") || !strcmp(cap, "avx512"))) {
        snprintf(g_amx_why, sizeof g_amx_why, "SDPA_MAX_ISA=%s leaves AMX out", cap);
    } else if (sdpa_request_amx() != SDPA_OK) {
        snprintf(g_amx_why, sizeof g_amx_why, "%s", sdpa_last_error_message());
    } else {
#if defined(SDPA_HAVE_MK_AMX)
        g_amx = 1;
#else
        snprintf(g_amx_why, sizeof g_amx_why, "this build has no AMX kernel (compiler lacks -mamx-bf16)");
#endif
    }
    sdpa__dispatch_set_amx_for_testing(0);
    if (amx_only) {
        if (!g_amx) {
            printf("tiled-amx-bf16: not run (%s)\n", g_amx_why);
            return 77;
        }
        return cmocka_run_group_tests_name("dtypes_kernels_amx", amx_tests, NULL, NULL);
    }
    return cmocka_run_group_tests_name("dtypes_kernels", tests, NULL, NULL);
}
