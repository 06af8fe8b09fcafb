/*
 * Storage dtypes in the public API (0.4): sdpa_dtype_size/name, the strided and dtype-taking
 * view constructors (geometry in bytes of the element), sdpa_attention's rejection of float16 /
 * bfloat16 views until their kernels exist (naming the view, writing nothing), and the
 * options.precision field (values, validation, 0.3-sized structs).
 */
#include <math.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "sdpa.h"

static void expect_status(sdpa_status got, sdpa_status want, const char *needle, const char *what)
{
    if (got != want)
        fail_msg("%s: expected %s, got %s (\"%s\")", what, sdpa_status_string(want), sdpa_status_string(got),
                 sdpa_last_error_message());
    if (want != SDPA_OK && sdpa_last_error_message()[0] == '\0')
        fail_msg("%s: no error message", what);
    if (needle != NULL && strstr(sdpa_last_error_message(), needle) == NULL)
        fail_msg("%s: message \"%s\" does not mention \"%s\"", what, sdpa_last_error_message(), needle);
}

static void expect_empty_view(const sdpa_tensor *t, const char *what)
{
    const sdpa_tensor zero = {0};
    if (t->data != NULL || t->rank != 0 || t->dtype != SDPA_DTYPE_F32 || memcmp(t->shape, zero.shape, sizeof t->shape) ||
        memcmp(t->strides, zero.strides, sizeof t->strides) || t->reserved[0] || t->reserved[1])
        fail_msg("%s: the view was not left empty", what);
}

/* ------------------------------------------------------------ dtype facts */

static void dtype_size_and_name(void **state)
{
    (void)state;
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_F32), 4);
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_F16), 2);
    assert_int_equal(sdpa_dtype_size(SDPA_DTYPE_BF16), 2);
    assert_int_equal(sdpa_dtype_size((sdpa_dtype)6), 0);
    assert_int_equal(sdpa_dtype_size((sdpa_dtype)-1), 0);
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_F32), "float32");
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_F16), "float16");
    assert_string_equal(sdpa_dtype_name(SDPA_DTYPE_BF16), "bfloat16");
    assert_string_equal(sdpa_dtype_name((sdpa_dtype)7), "unknown");
}

/* ------------------------------------------------------------ constructors */

static void init_strided_builds_any_layout(void **state)
{
    (void)state;
    /* A BSHD f16 buffer [B=2, S=5, H=3, E=4] seen as [B, H, S, E]. */
    static const uint16_t buf[2 * 5 * 3 * 4];
    const int64_t shape[4] = {2, 3, 5, 4}, strides[4] = {5 * 3 * 4, 4, 3 * 4, 1};
    sdpa_tensor t;
    memset(&t, 0xFF, sizeof t);
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 4, shape, strides), SDPA_OK, NULL, "bshd f16");
    assert_string_equal(sdpa_last_error_message(), "");
    assert_ptr_equal(t.data, buf);
    assert_int_equal(t.dtype, SDPA_DTYPE_F16);
    assert_int_equal(t.rank, 4);
    for (int d = 0; d < 4; ++d) {
        assert_int_equal(t.shape[d], shape[d]);
        assert_int_equal(t.strides[d], strides[d]);
    }
    for (int d = 4; d < SDPA_MAX_RANK; ++d) {
        assert_int_equal(t.shape[d], 0);
        assert_int_equal(t.strides[d], 0);
    }
    assert_int_equal(t.reserved[0], 0);
    assert_int_equal(t.reserved[1], 0);

    /* negative and zero strides (inputs), bf16, rank 1 and SDPA_MAX_RANK */
    const int64_t s2[2] = {3, 4}, st2[2] = {-4, 0};
    expect_status(sdpa_tensor_init_strided(&t, buf + 8, SDPA_DTYPE_BF16, 2, s2, st2), SDPA_OK, NULL, "negative/zero");
    assert_int_equal(t.strides[0], -4);
    assert_int_equal(t.strides[1], 0);
    const int64_t s8[SDPA_MAX_RANK] = {1, 1, 1, 1, 1, 1, 2, 3}, st8[SDPA_MAX_RANK] = {0, 0, 0, 0, 0, 0, 3, 1};
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F32, SDPA_MAX_RANK, s8, st8), SDPA_OK, NULL, "rank 8");
    /* empty views may have NULL data */
    const int64_t s0[2] = {0, 4}, st0[2] = {4, 1};
    expect_status(sdpa_tensor_init_strided(&t, NULL, SDPA_DTYPE_F16, 2, s0, st0), SDPA_OK, NULL, "empty NULL");
}

static void init_strided_rejects_bad_input(void **state)
{
    (void)state;
    uint16_t buf[16] = {0};
    const int64_t shape[2] = {2, 3}, strides[2] = {3, 1};
    sdpa_tensor t;
    expect_status(sdpa_tensor_init_strided(NULL, buf, SDPA_DTYPE_F16, 2, shape, strides), SDPA_ERR_NULL_POINTER,
                  "view", "NULL view");
#define BAD(call, status, needle, what)                                                                                \
    do {                                                                                                               \
        memset(&t, 0x5A, sizeof t);                                                                                    \
        expect_status((call), (status), (needle), (what));                                                             \
        expect_empty_view(&t, (what));                                                                                 \
    } while (0)
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 2, NULL, strides), SDPA_ERR_NULL_POINTER, "shape",
        "NULL shape");
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 2, shape, NULL), SDPA_ERR_NULL_POINTER, "strides",
        "NULL strides");
    BAD(sdpa_tensor_init_strided(&t, NULL, SDPA_DTYPE_F16, 2, shape, strides), SDPA_ERR_NULL_POINTER, "data",
        "NULL data");
    BAD(sdpa_tensor_init_strided(&t, buf, (sdpa_dtype)6, 2, shape, strides), SDPA_ERR_DTYPE, "dtype=6",
        "unknown dtype");
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 0, shape, strides), SDPA_ERR_RANK, "rank=0", "rank 0");
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, SDPA_MAX_RANK + 1, shape, strides), SDPA_ERR_RANK, "rank=9",
        "rank 9");
    const int64_t neg[2] = {2, -3};
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 2, neg, strides), SDPA_ERR_SHAPE, "negative", "negative size");
    const int64_t big[2] = {INT64_MAX / 2, 3};
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 2, big, strides), SDPA_ERR_SIZE_OVERFLOW, NULL,
        "element count");
    const int64_t minst[2] = {3, INT64_MIN};
    BAD(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 2, shape, minst), SDPA_ERR_SIZE_OVERFLOW, "strides[1]",
        "INT64_MIN stride");
#undef BAD
}

/* The byte span limit is counted in elements of the view's dtype: a stride that is too wide for
 * float32 elements still fits with 2-byte elements. */
static void geometry_uses_element_size(void **state)
{
    (void)state;
    uint16_t buf[4] = {0};
    const int64_t limit = PTRDIFF_MAX / 2; /* the library's largest accepted span, in bytes */
    const int64_t shape[1] = {2};
    const int64_t st[1] = {limit / 4}; /* span (st + 1) elements: > limit as f32, < limit as f16 */
    sdpa_tensor t;
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F32, 1, shape, st), SDPA_ERR_SIZE_OVERFLOW, "bytes",
                  "f32 span");
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 1, shape, st), SDPA_OK, NULL, "f16 span");
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_BF16, 1, shape, st), SDPA_OK, NULL, "bf16 span");
    const int64_t st2[1] = {limit / 2};
    expect_status(sdpa_tensor_init_strided(&t, buf, SDPA_DTYPE_F16, 1, shape, st2), SDPA_ERR_SIZE_OVERFLOW, "bytes",
                  "f16 span too");
}

static void init_dtype_is_contiguous(void **state)
{
    (void)state;
    static const uint16_t buf[2 * 3 * 4];
    const int64_t shape[3] = {2, 3, 4};
    sdpa_tensor t;
    expect_status(sdpa_tensor_init_dtype(&t, buf, SDPA_DTYPE_BF16, 3, shape), SDPA_OK, NULL, "bf16 contiguous");
    assert_int_equal(t.dtype, SDPA_DTYPE_BF16);
    assert_int_equal(t.rank, 3);
    assert_int_equal(t.strides[0], 12);
    assert_int_equal(t.strides[1], 4);
    assert_int_equal(t.strides[2], 1);
    assert_ptr_equal(t.data, buf);
    /* the same as sdpa_tensor_init() for float32 */
    float f[24];
    sdpa_tensor a, b;
    assert_int_equal(sdpa_tensor_init(&a, f, 3, shape), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&b, f, SDPA_DTYPE_F32, 3, shape), SDPA_OK);
    assert_memory_equal(&a, &b, sizeof a);
    /* errors leave an empty view */
    memset(&t, 0x5A, sizeof t);
    expect_status(sdpa_tensor_init_dtype(&t, buf, (sdpa_dtype)9, 3, shape), SDPA_ERR_DTYPE, "dtype=9", "bad dtype");
    expect_empty_view(&t, "bad dtype");
    memset(&t, 0x5A, sizeof t);
    expect_status(sdpa_tensor_init_dtype(&t, NULL, SDPA_DTYPE_F16, 3, shape), SDPA_ERR_NULL_POINTER, "data", "NULL data");
    expect_empty_view(&t, "NULL data");
    memset(&t, 0x5A, sizeof t);
    expect_status(sdpa_tensor_init_dtype(&t, buf, SDPA_DTYPE_F16, 9, shape), SDPA_ERR_RANK, NULL, "rank");
    expect_empty_view(&t, "rank");
    expect_status(sdpa_tensor_init_dtype(&t, buf, SDPA_DTYPE_F16, 3, NULL), SDPA_ERR_NULL_POINTER, "shape", "NULL shape");
    expect_status(sdpa_tensor_init_dtype(NULL, buf, SDPA_DTYPE_F16, 3, shape), SDPA_ERR_NULL_POINTER, "view", "NULL view");
}

/* ------------------------------------------------------------ attention */

/* The golden case: zero Q/K, V = [2, 4, 8], 3x3 causal -> 2, 3, 14/3. */
typedef struct golden {
    float q[3], k[3], v[3], out[3], lse[3];
    sdpa_tensor tq, tk, tv, to, tl;
    uint16_t h[8]; /* an f16/bf16 stand-in buffer */
} golden;

static void golden_init(golden *g)
{
    memset(g, 0, sizeof *g);
    g->v[0] = 2.0f;
    g->v[1] = 4.0f;
    g->v[2] = 8.0f;
    assert_int_equal(sdpa_tensor_init_3d(&g->tq, g->q, 1, 3, 1), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&g->tk, g->k, 1, 3, 1), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&g->tv, g->v, 1, 3, 1), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&g->to, g->out, 1, 3, 1), SDPA_OK);
    const int64_t ls[2] = {1, 3};
    assert_int_equal(sdpa_tensor_init(&g->tl, g->lse, 2, ls), SDPA_OK);
}

static void attention_names_reduced_precision_views(void **state)
{
    (void)state;
    const sdpa_dtype dts[2] = {SDPA_DTYPE_F16, SDPA_DTYPE_BF16};
    const char *names[5] = {"query", "key", "value", "out", "lse"};
    for (int di = 0; di < 2; ++di) {
        for (int which = 4; which < 5; ++which) { /* q/k/v/out compute since 0.4 (test_dtypes_kernels.c) */
            golden g;
            golden_init(&g);
            memset(g.out, 0x7F, sizeof g.out);
            memset(g.lse, 0x7F, sizeof g.lse);
            const int64_t shp[3] = {1, 3, 1};
            const int64_t lshp[2] = {1, 3};
            sdpa_tensor *views[5] = {&g.tq, &g.tk, &g.tv, &g.to, &g.tl};
            uint16_t buf[3] = {0, 0, 0};
            if (which < 4)
                assert_int_equal(sdpa_tensor_init_dtype(views[which], buf, dts[di], 3, shp), SDPA_OK);
            else
                assert_int_equal(sdpa_tensor_init_dtype(views[which], buf, dts[di], 2, lshp), SDPA_OK);
            sdpa_options o;
            sdpa_options_init(&o);
            o.causal = 1;
            char needle[96];
            snprintf(needle, sizeof needle, "%s.dtype=%s", names[which], sdpa_dtype_name(dts[di]));
            expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, &o, &g.to, NULL, &g.tl), SDPA_ERR_DTYPE, needle, needle);
            assert_non_null(strstr(sdpa_last_error_message(), "float32"));
            for (int e = 0; e < 3; ++e) {
                uint32_t u, w;
                memcpy(&u, &g.out[e], 4);
                memcpy(&w, &g.lse[e], 4);
                if (which != 3 && u != 0x7F7F7F7Fu)
                    fail_msg("%s: out written although the call failed", needle);
                if (which != 4 && w != 0x7F7F7F7Fu)
                    fail_msg("%s: lse written although the call failed", needle);
            }
        }
    }
    /* an f16 bias view is also named */
    golden g;
    golden_init(&g);
    uint16_t bias[9] = {0};
    const int64_t bs[2] = {3, 3};
    sdpa_tensor tb;
    assert_int_equal(sdpa_tensor_init_dtype(&tb, bias, SDPA_DTYPE_F16, 2, bs), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.bias = &tb;
    expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, &o, &g.to, NULL, NULL), SDPA_OK, NULL, "bias f16 (0.4: computed)");
    /* a dtype that is not an sdpa_dtype is named as such */
    g.tk.dtype = 6;
    expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, NULL, &g.to, NULL, NULL), SDPA_ERR_DTYPE, "key.dtype=6",
                  "dtype 6");
}

static void golden_under(const sdpa_options *o, const char *what)
{
    golden g;
    golden_init(&g);
    expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, o, &g.to, NULL, &g.tl), SDPA_OK, NULL, what);
    if (!(fabsf(g.out[0] - 2.0f) <= 1e-6f && fabsf(g.out[1] - 3.0f) <= 1e-6f && fabsf(g.out[2] - 14.0f / 3.0f) <= 1e-5f))
        fail_msg("%s: golden out %g %g %g, expected 2, 3, 14/3", what, (double)g.out[0], (double)g.out[1],
                 (double)g.out[2]);
}

static void precision_values_and_validation(void **state)
{
    (void)state;
    sdpa_options o;
    sdpa_options_init(&o);
    assert_int_equal(o.precision, SDPA_PRECISION_DEFAULT);
    assert_int_equal(o.reserved1, 0);
    o.causal = 1;
    const int ok[3] = {SDPA_PRECISION_DEFAULT, SDPA_PRECISION_F32, SDPA_PRECISION_REDUCED};
    float first[3] = {0};
    for (int i = 0; i < 3; ++i) {
        o.precision = ok[i];
        golden_under(&o, "precision");
        /* float32 storage: every precision is the same computation, bit for bit */
        golden g;
        golden_init(&g);
        assert_int_equal(sdpa_attention(&g.tq, &g.tk, &g.tv, &o, &g.to, NULL, NULL), SDPA_OK);
        if (i == 0)
            memcpy(first, g.out, sizeof first);
        else
            assert_memory_equal(first, g.out, sizeof first);
    }
    golden g;
    golden_init(&g);
    memset(g.out, 0x7F, sizeof g.out);
    const int bad[4] = {3, -1, 100, 0x7FFFFFFF};
    for (int i = 0; i < 4; ++i) {
        o.precision = bad[i];
        expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, &o, &g.to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT,
                      "options->precision", "bad precision");
        size_t bytes = 0;
        expect_status(sdpa_attention_workspace_size(&g.tq, &g.tk, &g.tv, &o, 0, &bytes), SDPA_ERR_INVALID_ARGUMENT,
                      "options->precision", "bad precision (workspace query)");
    }
    o.precision = 0;
    o.reserved1 = 1;
    expect_status(sdpa_attention(&g.tq, &g.tk, &g.tv, &o, &g.to, NULL, NULL), SDPA_ERR_STRUCT_VERSION, "reserved1",
                  "reserved1");
    for (int e = 0; e < 3; ++e) {
        uint32_t u;
        memcpy(&u, &g.out[e], 4);
        assert_int_equal(u, 0x7F7F7F7Fu);
    }
}

/* A 0.3 caller's struct ends at reserved0: accepted, and what lies beyond it is not read. */
static void precision_absent_from_older_structs(void **state)
{
    (void)state;
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = 1;
    o.precision = 99; /* beyond the 0.3 struct_size: must not be read */
    o.reserved1 = 7;
    o.struct_size = offsetof(sdpa_options, reserved0) + sizeof(int32_t);
    golden_under(&o, "0.3-sized options");
    /* sdpa_options_init_sized with the 0.3 size writes only those bytes */
    unsigned char raw[sizeof(sdpa_options)];
    memset(raw, 0xA5, sizeof raw);
    sdpa_options_init_sized((sdpa_options *)(void *)raw, offsetof(sdpa_options, precision));
    for (size_t b = offsetof(sdpa_options, precision); b < sizeof raw; ++b)
        assert_int_equal(raw[b], 0xA5);
}

/* ------------------------------------------------- the header's F32 bound */

static uint64_t g_rng = 0x1234567ull;
static double urand(void) /* uniform in [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

/* The float32 paths (every kernel that serves the call, at the ISA SDPA_MAX_ISA allows) stay
 * within the SDPA_PRECISION_F32 bound stated in sdpa.h, against a float64 evaluation here, on
 * random shapes straddling the 64-row/64-key tiles, with causal, softcap and GQA. Prints the
 * largest observed error / bound ratio. */
static void f32_paths_within_header_bound(void **state)
{
    (void)state;
    const int kernels[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    const char *kn[3] = {"reference", "tiled", "decode"};
    const double u = 1.0 / 16777216.0;
    double worst[3] = {0, 0, 0};
    int runs[3] = {0, 0, 0};
    const char *isa = getenv("SDPA_MAX_ISA");
    for (int c = 0; c < 24; ++c) {
        const int64_t B = 1 + c % 2, Hkv = 1 + (c / 2) % 2, group = 1 + (c / 4) % 2, Hq = Hkv * group;
        const int64_t L = (c % 3 == 0) ? 1 + c % 4 : 50 + (c * 37) % 90, S = L + (c * 53) % 150;
        const int64_t E = 8 + (c * 11) % 70, Ev = 4 + (c * 7) % 60;
        const int causal = c % 2, soft = (c % 5 == 0);
        const double amp = (c % 3 == 1) ? 4.0 : 1.0;
        const double vamp = (c % 6 == 5) ? 1e-42 : 1.0; /* float32-subnormal values and results */
        const size_t nq = (size_t)(B * Hq * L * E), nk = (size_t)(B * Hkv * S * E), nv = (size_t)(B * Hkv * S * Ev);
        const size_t no = (size_t)(B * Hq * L * Ev), nl = (size_t)(B * Hq * L);
        float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *o = malloc(no * 4), *l = malloc(nl * 4);
        assert_true(q && k && v && o && l);
        for (size_t i = 0; i < nq; ++i) q[i] = (float)(amp * urand());
        for (size_t i = 0; i < nk; ++i) k[i] = (float)(amp * urand());
        for (size_t i = 0; i < nv; ++i) v[i] = (float)(vamp * urand());
        sdpa_tensor tq, tk, tv, to, tl;
        assert_int_equal(sdpa_tensor_init_4d(&tq, q, B, Hq, L, E), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_4d(&tk, k, B, Hkv, S, E), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_4d(&tv, v, B, Hkv, S, Ev), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_4d(&to, o, B, Hq, L, Ev), SDPA_OK);
        const int64_t ls[3] = {B, Hq, L};
        assert_int_equal(sdpa_tensor_init(&tl, l, 3, ls), SDPA_OK);
        sdpa_options opt;
        sdpa_options_init(&opt);
        opt.causal = causal;
        opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT; /* every row has a key */
        opt.softcap = soft ? 2.5f : 0.0f;
        opt.precision = SDPA_PRECISION_F32;
        const double scale = 1.0 / sqrt((double)E), cap = soft ? 2.5 : 0.0;
        double *sc = malloc((size_t)S * 8);
        assert_non_null(sc);
        for (int kk = 0; kk < 3; ++kk) {
            opt.kernel = kernels[kk];
            const sdpa_status st = sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, &tl);
            if (st == SDPA_ERR_UNSUPPORTED)
                continue; /* this kernel does not serve the shape */
            expect_status(st, SDPA_OK, NULL, kn[kk]);
            ++runs[kk];
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < Hq; ++h)
                    for (int64_t i = 0; i < L; ++i) {
                        const int64_t hk = h / group, p = i + S - L;
                        const int64_t n = causal ? (p + 1 < S ? p + 1 : S) : S;
                        double A = 0.0, T = 0.0, m = -INFINITY;
                        for (int64_t j = 0; j < n; ++j) {
                            double dot = 0.0, mag = 0.0;
                            for (int64_t e = 0; e < E; ++e) {
                                const double x = (double)q[((b * Hq + h) * L + i) * E + e] *
                                                 (double)k[((b * Hkv + hk) * S + j) * E + e];
                                dot += x;
                                mag += fabs(x);
                            }
                            double sv = scale * dot;
                            if (cap > 0.0)
                                sv = cap * tanh(sv / cap);
                            sc[j] = sv;
                            A = fmax(A, scale * mag);
                            T = fmax(T, fabs(sv));
                            m = fmax(m, sv);
                        }
                        double sum = 0.0;
                        for (int64_t j = 0; j < n; ++j)
                            sum += exp(sc[j] - m);
                        const double delta = (double)(E + 2) * u * A + 8.0 * u * T;
                        const double lref = m + log(sum);
                        const double lerr = fabs((double)l[(b * Hq + h) * L + i] - lref);
                        const double lbound = delta + (double)(n + 32) * u + u * fabs(lref);
                        if (!(lerr <= lbound))
                            fail_msg("%s: lse (%lld,%lld,%lld) error %.3g > bound %.3g", kn[kk], (long long)b,
                                     (long long)h, (long long)i, lerr, lbound);
                        worst[kk] = fmax(worst[kk], lerr / lbound);
                        for (int64_t d = 0; d < Ev; ++d) {
                            double ref = 0.0, V = 0.0;
                            for (int64_t j = 0; j < n; ++j) {
                                const double vj = (double)v[((b * Hkv + hk) * S + j) * Ev + d];
                                ref += exp(sc[j] - m) / sum * vj;
                                V = fmax(V, fabs(vj));
                            }
                            const double bound = V * (expm1(2.0 * delta) + (double)(3 * n + 32) * u) +
                                                 (double)(3 * n + 32) * ldexp(1, -150); /* float32 subnormals */
                            const double err = fabs((double)o[((b * Hq + h) * L + i) * Ev + d] - ref);
                            if (!(err <= bound))
                                fail_msg("%s: out (%lld,%lld,%lld,%lld) error %.3g > bound %.3g", kn[kk], (long long)b,
                                         (long long)h, (long long)i, (long long)d, err, bound);
                            if (bound > 0)
                                worst[kk] = fmax(worst[kk], err / bound);
                        }
                    }
        }
        free(sc);
        free(q);
        free(k);
        free(v);
        free(o);
        free(l);
    }
    for (int kk = 0; kk < 3; ++kk)
        printf("F32 bound (SDPA_MAX_ISA=%s): %s ran %d cases, largest error/bound %.3f\n", isa ? isa : "unset", kn[kk],
               runs[kk], worst[kk]);
    assert_true(runs[0] > 0 && runs[1] > 0 && runs[2] > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dtype_size_and_name),
        cmocka_unit_test(init_strided_builds_any_layout),
        cmocka_unit_test(init_strided_rejects_bad_input),
        cmocka_unit_test(geometry_uses_element_size),
        cmocka_unit_test(init_dtype_is_contiguous),
        cmocka_unit_test(attention_names_reduced_precision_views),
        cmocka_unit_test(precision_values_and_validation),
        cmocka_unit_test(precision_absent_from_older_structs),
        cmocka_unit_test(f32_paths_within_header_bound),
    };
    return cmocka_run_group_tests_name("dtype", tests, NULL, NULL);
}
