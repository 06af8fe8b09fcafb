/*
 * ONNX Attention conformance runner.
 *
 * Usage: onnx_runner DATA_DIR
 *   DATA_DIR = tests/data/onnx-attention, holding opset23-24/ and opset25-window-generated/
 *   (format: tests/data/onnx-attention/README.md).
 *
 * Every case directory (87 in all, sorted by name) is mapped onto sdpa_attention():
 *   - 3D inputs (B, S, H*D) become 4D strided views [B, H, S, D] of the same buffer (no copy);
 *     Y is written through such a view too.
 *   - past_key/past_value are concatenated in front of K/V along the sequence axis; that
 *     buffer is also what present_key/present_value are compared against.
 *   - a float/float16 attn_mask is options.bias (rank as given); a bool one is an allow-mask;
 *     opset >= 24 masks shorter than T on the last axis are padded with -inf (bool: 0).
 *   - is_causal and the window attributes use the ONNX alignment: top-left without a cache,
 *     offset P with past, offset nonpad[b] - Sq with nonpad_kv_seqlen (which also gives
 *     key_lengths).
 *   - fully masked rows are zero in ONNX: options.empty_rows = SDPA_EMPTY_ROWS_ZERO.
 *   - qk_matmul_output_mode 0/1/2/3 -> weights_stage SCORES/SOFTCAPPED/MASKED/PROBABILITIES.
 *   - softmax_precision is accepted and ignored: libsdpa computes the softmax in float32
 *     (precision 1); the one case with 11 (double) still holds the float32 tolerance.
 *   - float16 cases read the widened .as_f32.f32 copies and use rtol 2e-3 / atol 2e-3; those
 *     whose Q, K and V are float16 then run again natively: Q, K, V (past concatenated), a float16
 *     attn_mask as an f16 bias and Y as float16 views of the raw .f16 files (weights float32),
 *     Y compared, widened here, with the same tolerance.
 * A case that cannot be expressed counts as failed, never skipped.
 * Prints one line per case and ends with "N passed, M failed"; exits non-zero on any failure.
 */
#include "conf_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#define EXPECTED_CASES 87
#define EXPECTED_NATIVE_F16 5 /* float16 cases also run natively in float16 */
static int g_native_f16;
#define RTOL_F32 1e-4
#define ATOL_F32 1e-5
#define RTOL_F16 2e-3
#define ATOL_F16 2e-3
#define MAX_RANK 8

static const char *const subdirs[] = {"opset23-24", "opset25-window-generated"};

enum { IN_Q, IN_K, IN_V, IN_MASK, IN_PAST_K, IN_PAST_V, IN_NONPAD, N_IN };
static const char *const in_roles[N_IN] = {"Q",        "K",          "V",
                                           "attn_mask", "past_key",   "past_value",
                                           "nonpad_kv_seqlen"};
enum { OUT_Y, OUT_PRESENT_K, OUT_PRESENT_V, OUT_QK, N_OUT };
static const char *const out_roles[N_OUT] = {"Y", "present_key", "present_value",
                                             "qk_matmul_output"};

enum { DT_F32, DT_F16, DT_BOOL, DT_I64 };

typedef struct array {
    int present;
    int dtype;
    int rank;
    int64_t shape[MAX_RANK];
    int64_t n;
    float *f;      /* DT_F32, DT_F16 (widened) */
    uint16_t *h;   /* DT_F16: the raw binary16 encodings of `file` */
    uint8_t *u8;   /* DT_BOOL */
    int64_t *i64;  /* DT_I64 */
} array;

typedef struct onnx_case {
    char name[200];
    int opset;
    array in[N_IN];
    array out[N_OUT];
    /* attributes */
    int is_causal;
    int has_scale;
    double scale;
    double softcap;
    int64_t qk_mode;
    int64_t q_num_heads, kv_num_heads; /* 0 = absent */
    int has_window; /* left_window_size or right_window_size given */
    int64_t window_left, window_right;
    int64_t softmax_precision; /* 0 = absent */
    int any_f16;
} onnx_case;

/* One failure reason per case, appended to. */
typedef struct reason {
    char text[1024];
} reason;

static void add_reason(reason *r, const char *piece)
{
    size_t used = strlen(r->text);
    if (used + 3 >= sizeof r->text)
        return;
    snprintf(r->text + used, sizeof r->text - used, "%s%s", used ? "; " : "", piece);
}

static void free_array(array *a)
{
    free(a->f);
    free(a->h);
    free(a->u8);
    free(a->i64);
    memset(a, 0, sizeof *a);
}

static void free_case(onnx_case *c)
{
    for (int i = 0; i < N_IN; i++)
        free_array(&c->in[i]);
    for (int i = 0; i < N_OUT; i++)
        free_array(&c->out[i]);
}

static int is_little_endian(void)
{
    const uint16_t one = 1;
    uint8_t b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* A malloc'd copy of size bytes (at least one byte allocated); NULL on allocation failure. */
static void *dup_bytes(const void *src, size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p)
        memcpy(p, src, size);
    return p;
}

/* Load one input/output description of meta.json. Returns 0 or -1 with err. */
static int load_array(const char *case_dir, const cJSON *desc, array *a, int *any_f16, char *err,
                      size_t errlen)
{
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(desc, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(desc, "shape");
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(desc, "file");
    const cJSON *file_f32 = cJSON_GetObjectItemCaseSensitive(desc, "file_f32");
    if (!cJSON_IsString(dtype) || !cJSON_IsString(file)) {
        snprintf(err, errlen, "array without dtype/file");
        return -1;
    }
    a->rank = conf_json_shape(shape, a->shape, MAX_RANK);
    if (a->rank < 0) {
        snprintf(err, errlen, "bad shape for %s", file->valuestring);
        return -1;
    }
    a->n = conf_numel(a->shape, a->rank);
    if (a->n < 0) {
        snprintf(err, errlen, "shape overflow for %s", file->valuestring);
        return -1;
    }
    const char *fname = file->valuestring;
    size_t elem;
    if (strcmp(dtype->valuestring, "float32") == 0) {
        a->dtype = DT_F32;
        elem = 4;
    } else if (strcmp(dtype->valuestring, "float16") == 0) {
        a->dtype = DT_F16;
        elem = 4;
        *any_f16 = 1;
        if (!cJSON_IsString(file_f32)) {
            snprintf(err, errlen, "float16 array %s has no file_f32", fname);
            return -1;
        }
        fname = file_f32->valuestring;
    } else if (strcmp(dtype->valuestring, "bool") == 0) {
        a->dtype = DT_BOOL;
        elem = 1;
    } else if (strcmp(dtype->valuestring, "int64") == 0) {
        a->dtype = DT_I64;
        elem = 8;
    } else {
        snprintf(err, errlen, "dtype %s of %s cannot be expressed", dtype->valuestring, fname);
        return -1;
    }
    if (strchr(fname, '/') || strcmp(fname, "..") == 0) {
        snprintf(err, errlen, "unexpected file name %s", fname);
        return -1;
    }
    char *path = conf_path_join(case_dir, fname);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t size = 0;
    char *bytes = conf_read_file(path, &size, err, errlen);
    free(path);
    if (!bytes)
        return -1;
    if ((uint64_t)a->n > SIZE_MAX / elem || size != (size_t)a->n * elem) {
        snprintf(err, errlen, "%s holds %zu bytes, expected %lld elements of %zu bytes", fname,
                 size, (long long)a->n, elem);
        free(bytes);
        return -1;
    }
    int rc = 0;
    switch (a->dtype) {
    case DT_F32:
    case DT_F16:
        if (!(a->f = dup_bytes(bytes, size)))
            rc = -1;
        break;
    case DT_BOOL:
        if ((a->u8 = dup_bytes(bytes, size)) != NULL) {
            for (int64_t i = 0; i < a->n; i++) {
                if (a->u8[i] > 1) {
                    snprintf(err, errlen, "bool file %s holds byte %u", fname, a->u8[i]);
                    free(bytes);
                    return -1;
                }
            }
        } else {
            rc = -1;
        }
        break;
    default:
        if (!(a->i64 = dup_bytes(bytes, size)))
            rc = -1;
        break;
    }
    free(bytes);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (a->dtype == DT_F16) { /* the raw encodings too, for the native float16 run */
        if (strchr(file->valuestring, '/') || !(path = conf_path_join(case_dir, file->valuestring))) {
            snprintf(err, errlen, "bad float16 file name %s", file->valuestring);
            return -1;
        }
        bytes = conf_read_file(path, &size, err, errlen);
        free(path);
        if (!bytes)
            return -1;
        if (size != (size_t)a->n * 2 || !(a->h = dup_bytes(bytes, size))) {
            snprintf(err, errlen, "%s holds %zu bytes, expected %lld float16 elements", file->valuestring, size,
                     (long long)a->n);
            free(bytes);
            return -1;
        }
        free(bytes);
    }
    a->present = 1;
    return 0;
}

/* Read the arrays listed under key ("inputs"/"outputs") into arr[] by role. */
static int load_role_list(const char *case_dir, const cJSON *meta, const char *key,
                          const char *const *roles, int nroles, array *arr, int *any_f16,
                          char *err, size_t errlen)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!cJSON_IsArray(list)) {
        snprintf(err, errlen, "meta.json has no %s array", key);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, list)
    {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *index = cJSON_GetObjectItemCaseSensitive(it, "index");
        if (!cJSON_IsString(name)) {
            snprintf(err, errlen, "%s entry without a name", key);
            return -1;
        }
        int role = -1;
        for (int r = 0; r < nroles; r++)
            if (strcmp(name->valuestring, roles[r]) == 0)
                role = r;
        if (role < 0) {
            snprintf(err, errlen, "%s role '%s' cannot be expressed", key, name->valuestring);
            return -1;
        }
        int64_t idx;
        if (conf_json_int(index, 0, 64, &idx) != 0 || idx != role) {
            snprintf(err, errlen, "%s '%s' has node index other than %d", key, name->valuestring,
                     role);
            return -1;
        }
        if (arr[role].present) {
            snprintf(err, errlen, "%s '%s' listed twice", key, name->valuestring);
            return -1;
        }
        if (load_array(case_dir, it, &arr[role], any_f16, err, errlen) != 0)
            return -1;
    }
    return 0;
}

static int read_attributes(const cJSON *meta, onnx_case *c, char *err, size_t errlen)
{
    c->window_left = -1;
    c->window_right = -1;
    const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(meta, "attributes");
    if (!cJSON_IsObject(attrs)) {
        snprintf(err, errlen, "meta.json has no attributes object");
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, attrs)
    {
        const char *k = it->string;
        int64_t v = 0;
        int bad = 0;
        if (!k || !cJSON_IsNumber(it)) {
            bad = 1;
        } else if (strcmp(k, "is_causal") == 0) {
            bad = conf_json_int(it, 0, 1, &v) != 0;
            c->is_causal = (int)v;
        } else if (strcmp(k, "scale") == 0) {
            c->has_scale = 1;
            c->scale = it->valuedouble;
        } else if (strcmp(k, "softcap") == 0) {
            c->softcap = it->valuedouble;
        } else if (strcmp(k, "qk_matmul_output_mode") == 0) {
            bad = conf_json_int(it, 0, 3, &c->qk_mode) != 0;
        } else if (strcmp(k, "q_num_heads") == 0) {
            bad = conf_json_int(it, 1, INT32_MAX, &c->q_num_heads) != 0;
        } else if (strcmp(k, "kv_num_heads") == 0) {
            bad = conf_json_int(it, 1, INT32_MAX, &c->kv_num_heads) != 0;
        } else if (strcmp(k, "left_window_size") == 0) {
            bad = conf_json_int(it, -1, INT64_MAX / 2, &c->window_left) != 0;
            c->has_window = 1;
        } else if (strcmp(k, "right_window_size") == 0) {
            bad = conf_json_int(it, -1, INT64_MAX / 2, &c->window_right) != 0;
            c->has_window = 1;
        } else if (strcmp(k, "softmax_precision") == 0) {
            /* 1 float, 10 fp16, 11 double, 16 bf16: libsdpa's softmax is float32 throughout. */
            bad = conf_json_int(it, 0, 64, &c->softmax_precision) != 0;
        } else {
            snprintf(err, errlen, "attribute '%s' cannot be expressed", k);
            return -1;
        }
        if (bad) {
            snprintf(err, errlen, "attribute '%s' has an unusable value", k ? k : "?");
            return -1;
        }
    }
    return 0;
}

/* A 4D float32 view over data with the given shape and strides. */
static void make_view4(sdpa_tensor *t, float *data, const int64_t shape[4], const int64_t st[4])
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = SDPA_DTYPE_F32;
    t->rank = 4;
    for (int d = 0; d < 4; d++) {
        t->shape[d] = shape[d];
        t->strides[d] = st[d];
    }
}

/* View [B, H, S, D] of a buffer stored (B, S, H*D) when is3d, else contiguous [B, H, S, D]. */
static void make_bhsd_view(sdpa_tensor *t, float *data, int is3d, int64_t B, int64_t H, int64_t S,
                           int64_t D)
{
    const int64_t shape[4] = {B, H, S, D};
    if (is3d) {
        const int64_t st[4] = {S * H * D, D, H * D, 1};
        make_view4(t, data, shape, st);
    } else {
        const int64_t st[4] = {H * S * D, S * D, D, 1};
        make_view4(t, data, shape, st);
    }
}

static float view_at(const sdpa_tensor *t, int64_t b, int64_t h, int64_t s, int64_t d)
{
    const float *p = t->data;
    return p[b * t->strides[0] + h * t->strides[1] + s * t->strides[2] + d * t->strides[3]];
}

/* Contiguous [B, H, P + S, D] = concat(past [B, H, P, D], cur (view [B, H, S, D]), axis 2). */
static float *concat_seq(const float *past, int64_t P, const sdpa_tensor *cur)
{
    const int64_t B = cur->shape[0], H = cur->shape[1], S = cur->shape[2], D = cur->shape[3];
    const int64_t T = P + S;
    size_t n = (size_t)(B * H * T * D);
    float *out = malloc(n ? n * sizeof(float) : 1);
    if (!out)
        return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++) {
                    float v = t < P ? past[((b * H + h) * P + t) * D + d]
                                    : view_at(cur, b, h, t - P, d);
                    out[((b * H + h) * T + t) * D + d] = v;
                }
    return out;
}

/* IEEE binary16 -> float (by its definition; the runner's own, independent of the library). */
static float f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    double x = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return (float)((h & 0x8000) ? -x : x);
}

/* The float16 twin of a float32 view: same shape and strides over f16 data. */
static void f16_twin(sdpa_tensor *t, const sdpa_tensor *f32view, const uint16_t *data)
{
    *t = *f32view;
    t->data = (void *)(uintptr_t)data;
    t->dtype = SDPA_DTYPE_F16;
}

/* concat_seq over float16 encodings (cur: a float16 view). */
static uint16_t *concat_seq16(const uint16_t *past, int64_t P, const sdpa_tensor *cur)
{
    const int64_t B = cur->shape[0], H = cur->shape[1], S = cur->shape[2], D = cur->shape[3];
    const int64_t T = P + S;
    size_t n = (size_t)(B * H * T * D);
    uint16_t *out = malloc(n ? n * sizeof(uint16_t) : 1);
    const uint16_t *c = cur->data;
    if (!out)
        return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++)
                    out[((b * H + h) * T + t) * D + d] =
                        t < P ? past[((b * H + h) * P + t) * D + d]
                              : c[b * cur->strides[0] + h * cur->strides[1] + (t - P) * cur->strides[2] +
                                  d * cur->strides[3]];
    return out;
}

static int shape_is(const array *a, int rank, const int64_t *shape)
{
    return conf_same_shape(a->rank, a->shape, rank, shape);
}

/* A buffer for n floats, all NaN: anything the call does not write stays NaN and fails the
 * comparison. NULL with err on allocation failure. */
static float *alloc_nan(int64_t n, char *err, size_t errlen)
{
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!p) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static void shape_str(char *buf, size_t len, const int64_t *shape, int rank)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < rank && used + 2 < len; d++) {
        int w = snprintf(buf + used, len - used, "%s%lld", d ? "," : "", (long long)shape[d]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

/* Compare one output; appends to reason and returns 1 when out of tolerance. */
static int compare_output(const char *what, const float *got, const array *exp, double rtol,
                          double atol, reason *r, double *max_err)
{
    conf_cmp res;
    conf_compare(got, exp->f, exp->n, rtol, atol, &res);
    if (res.max_abs_err > *max_err)
        *max_err = res.max_abs_err;
    if (res.mismatches == 0)
        return 0;
    char piece[400];
    int64_t i = res.first_bad;
    snprintf(piece, sizeof piece,
             "%s: %lld of %lld out of tolerance, max abs err %.3g, first at flat index %lld "
             "(got %.9g, expected %.9g)%s",
             what, (long long)res.mismatches, (long long)exp->n, res.max_abs_err, (long long)i,
             (double)got[i], (double)exp->f[i], res.nonfinite_bad ? ", non-finite mismatch" : "");
    add_reason(r, piece);
    return 1;
}

/* Run one case directory. Returns 0 on pass, 1 on failure (line printed). */
static int run_case(const char *case_dir, const char *name)
{
    onnx_case c;
    memset(&c, 0, sizeof c);
    reason r;
    r.text[0] = '\0';
    char err[600] = "";
    double max_err = 0.0;
    int failed = 0;

    float *kcat = NULL, *vcat = NULL, *mask_f_pad = NULL, *y_buf = NULL, *w_buf = NULL;
    uint8_t *mask_b_pad = NULL;
    uint16_t *kcat16 = NULL, *vcat16 = NULL, *mask_h_pad = NULL, *y16 = NULL;
    float *y16f = NULL, *w16buf = NULL;
    int native16 = 0;
    int64_t *offsets = NULL;
    cJSON *meta = NULL;

    char *meta_path = conf_path_join(case_dir, "meta.json");
    if (!meta_path) {
        snprintf(err, sizeof err, "out of memory");
        goto fail_err;
    }
    meta = conf_read_json(meta_path, err, sizeof err);
    free(meta_path);
    if (!meta)
        goto fail_err;

    const cJSON *jname = cJSON_GetObjectItemCaseSensitive(meta, "name");
    const cJSON *jopset = cJSON_GetObjectItemCaseSensitive(meta, "opset");
    const cJSON *jlayout = cJSON_GetObjectItemCaseSensitive(meta, "layout");
    int64_t opset;
    if (!cJSON_IsString(jname) || strcmp(jname->valuestring, name) != 0) {
        snprintf(err, sizeof err, "meta.json name does not match the directory");
        goto fail_err;
    }
    if (conf_json_int(jopset, 1, 1000, &opset) != 0 || !cJSON_IsString(jlayout)) {
        snprintf(err, sizeof err, "meta.json without opset/layout");
        goto fail_err;
    }
    c.opset = (int)opset;
    if (read_attributes(meta, &c, err, sizeof err) != 0)
        goto fail_err;
    if (load_role_list(case_dir, meta, "inputs", in_roles, N_IN, c.in, &c.any_f16, err,
                       sizeof err) != 0 ||
        load_role_list(case_dir, meta, "outputs", out_roles, N_OUT, c.out, &c.any_f16, err,
                       sizeof err) != 0)
        goto fail_err;

    const double rtol = c.any_f16 ? RTOL_F16 : RTOL_F32;
    const double atol = c.any_f16 ? ATOL_F16 : ATOL_F32;

    array *Q = &c.in[IN_Q], *K = &c.in[IN_K], *V = &c.in[IN_V];
    array *M = &c.in[IN_MASK], *PK = &c.in[IN_PAST_K], *PV = &c.in[IN_PAST_V];
    array *NP = &c.in[IN_NONPAD];
    if (!Q->present || !K->present || !V->present || !c.out[OUT_Y].present) {
        snprintf(err, sizeof err, "Q, K, V or Y missing");
        goto fail_err;
    }
    for (int i = IN_Q; i <= IN_V; i++) {
        if (c.in[i].dtype != DT_F32 && c.in[i].dtype != DT_F16) {
            snprintf(err, sizeof err, "%s is not a float tensor", in_roles[i]);
            goto fail_err;
        }
    }
    for (int i = 0; i < N_OUT; i++) {
        if (c.out[i].present && c.out[i].dtype != DT_F32 && c.out[i].dtype != DT_F16) {
            snprintf(err, sizeof err, "output %s is not float", out_roles[i]);
            goto fail_err;
        }
    }

    /* ---- dimensions */
    int is3d;
    int64_t B, Hq, Hkv, Sq, Skv, Dk, Dv;
    if (Q->rank == 3) {
        is3d = 1;
        if (strcmp(jlayout->valuestring, "3d") != 0 || K->rank != 3 || V->rank != 3 ||
            c.q_num_heads == 0 || c.kv_num_heads == 0) {
            snprintf(err, sizeof err,
                     "3D Q needs 3D K and V and both q_num_heads and kv_num_heads");
            goto fail_err;
        }
        Hq = c.q_num_heads;
        Hkv = c.kv_num_heads;
        if (Q->shape[2] % Hq != 0 || K->shape[2] % Hkv != 0 || V->shape[2] % Hkv != 0) {
            snprintf(err, sizeof err, "hidden sizes not divisible by the head counts");
            goto fail_err;
        }
        B = Q->shape[0];
        Sq = Q->shape[1];
        Dk = Q->shape[2] / Hq;
        Skv = K->shape[1];
        Dv = V->shape[2] / Hkv;
        if (K->shape[0] != B || V->shape[0] != B || V->shape[1] != Skv ||
            K->shape[2] / Hkv != Dk) {
            snprintf(err, sizeof err, "3D Q/K/V shapes disagree");
            goto fail_err;
        }
    } else if (Q->rank == 4) {
        is3d = 0;
        if (strcmp(jlayout->valuestring, "4d") != 0 || K->rank != 4 || V->rank != 4 ||
            c.q_num_heads != 0 || c.kv_num_heads != 0) {
            snprintf(err, sizeof err, "4D Q needs 4D K and V and no head-count attributes");
            goto fail_err;
        }
        B = Q->shape[0];
        Hq = Q->shape[1];
        Sq = Q->shape[2];
        Dk = Q->shape[3];
        Hkv = K->shape[1];
        Skv = K->shape[2];
        Dv = V->shape[3];
        if (K->shape[0] != B || V->shape[0] != B || V->shape[1] != Hkv || V->shape[2] != Skv ||
            K->shape[3] != Dk) {
            snprintf(err, sizeof err, "4D Q/K/V shapes disagree");
            goto fail_err;
        }
    } else {
        snprintf(err, sizeof err, "Q of rank %d cannot be expressed", Q->rank);
        goto fail_err;
    }

    sdpa_tensor qv, kv, vv, yv, wv;
    make_bhsd_view(&qv, Q->f, is3d, B, Hq, Sq, Dk);
    make_bhsd_view(&kv, K->f, is3d, B, Hkv, Skv, Dk);
    make_bhsd_view(&vv, V->f, is3d, B, Hkv, Skv, Dv);

    /* ---- past: concatenated in front of K/V */
    int64_t P = 0;
    if (PK->present != PV->present) {
        snprintf(err, sizeof err, "past_key and past_value must come together");
        goto fail_err;
    }
    if (PK->present) {
        if (PK->dtype == DT_BOOL || PK->dtype == DT_I64 || PV->dtype == DT_BOOL ||
            PV->dtype == DT_I64 || PK->rank != 4 || PV->rank != 4) {
            snprintf(err, sizeof err, "past_key/past_value must be 4D float");
            goto fail_err;
        }
        P = PK->shape[2];
        const int64_t pk_shape[4] = {B, Hkv, P, Dk}, pv_shape[4] = {B, Hkv, P, Dv};
        if (!shape_is(PK, 4, pk_shape) || !shape_is(PV, 4, pv_shape)) {
            snprintf(err, sizeof err, "past_key/past_value shapes disagree with K/V");
            goto fail_err;
        }
        kcat = concat_seq(PK->f, P, &kv);
        vcat = concat_seq(PV->f, P, &vv);
        if (!kcat || !vcat) {
            snprintf(err, sizeof err, "out of memory");
            goto fail_err;
        }
        make_bhsd_view(&kv, kcat, 0, B, Hkv, P + Skv, Dk);
        make_bhsd_view(&vv, vcat, 0, B, Hkv, P + Skv, Dv);
    }
    const int64_t T = P + Skv;

    /* ---- options */
    sdpa_options opt;
    sdpa_options_init(&opt);
    if (c.has_scale)
        opt.scale = (float)c.scale;
    opt.softcap = (float)c.softcap;
    opt.causal = c.is_causal;
    /* libsdpa applies window_left/right only with sliding_window = 1 (the zero default is no
     * window); -1 on a side stays unbounded, as in ONNX. */
    opt.sliding_window = c.has_window;
    opt.window_left = c.window_left;
    opt.window_right = c.window_right;
    opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;

    if (NP->present) {
        if (NP->dtype != DT_I64 || NP->rank != 1 || NP->shape[0] != B) {
            snprintf(err, sizeof err, "nonpad_kv_seqlen must be int64 [B]");
            goto fail_err;
        }
        if (P > 0 || PK->present) {
            snprintf(err, sizeof err, "nonpad_kv_seqlen together with past cannot be expressed");
            goto fail_err;
        }
        opt.key_lengths = NP->i64;
    }
    /* Causal and window alignment: top-left without a cache; p = i + offset with one. */
    if (PK->present || NP->present) {
        offsets = malloc((size_t)(B > 0 ? B : 1) * sizeof *offsets);
        if (!offsets) {
            snprintf(err, sizeof err, "out of memory");
            goto fail_err;
        }
        for (int64_t b = 0; b < B; b++)
            offsets[b] = NP->present ? NP->i64[b] - Sq : P;
        opt.alignment = SDPA_ALIGN_OFFSETS;
        opt.query_offsets = offsets;
    } else {
        opt.alignment = SDPA_ALIGN_TOP_LEFT;
    }

    /* ---- attn_mask */
    sdpa_tensor bias_view;
    sdpa_allow_mask allow;
    if (M->present) {
        if (M->rank < 1 || M->rank > 4) {
            snprintf(err, sizeof err, "attn_mask of rank %d cannot be expressed", M->rank);
            goto fail_err;
        }
        int64_t mshape[4];
        for (int d = 0; d < M->rank; d++)
            mshape[d] = M->shape[d];
        const int64_t Tm = M->shape[M->rank - 1];
        const void *mdata = M->dtype == DT_BOOL ? (const void *)M->u8 : (const void *)M->f;
        if (Tm < T && c.opset >= 24) {
            /* opset >= 24: right-pad the key axis to T with -inf (bool: false). */
            const int64_t rows = Tm > 0 ? M->n / Tm : conf_numel(mshape, M->rank - 1);
            const size_t total = (size_t)(rows * T);
            mshape[M->rank - 1] = T;
            if (M->dtype == DT_BOOL) {
                mask_b_pad = calloc(total ? total : 1, 1);
                if (!mask_b_pad) {
                    snprintf(err, sizeof err, "out of memory");
                    goto fail_err;
                }
                for (int64_t i = 0; i < rows; i++)
                    memcpy(mask_b_pad + i * T, M->u8 + i * Tm, (size_t)Tm);
                mdata = mask_b_pad;
            } else {
                mask_f_pad = malloc((total ? total : 1) * sizeof(float));
                if (!mask_f_pad) {
                    snprintf(err, sizeof err, "out of memory");
                    goto fail_err;
                }
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < T; j++)
                        mask_f_pad[i * T + j] = j < Tm ? M->f[i * Tm + j] : -INFINITY;
                mdata = mask_f_pad;
            }
        }
        if (M->dtype == DT_BOOL) {
            sdpa_status st = sdpa_allow_mask_init(&allow, mdata, M->rank, mshape);
            if (st != SDPA_OK) {
                snprintf(err, sizeof err, "sdpa_allow_mask_init: %s: %s", sdpa_status_string(st),
                         sdpa_last_error_message());
                goto fail_err;
            }
            opt.allow_mask = &allow;
        } else if (M->dtype == DT_F32 || M->dtype == DT_F16) {
            sdpa_status st = sdpa_tensor_init(&bias_view, (float *)mdata, M->rank, mshape);
            if (st != SDPA_OK) {
                snprintf(err, sizeof err, "sdpa_tensor_init(bias): %s: %s",
                         sdpa_status_string(st), sdpa_last_error_message());
                goto fail_err;
            }
            opt.bias = &bias_view;
        } else {
            snprintf(err, sizeof err, "int64 attn_mask cannot be expressed");
            goto fail_err;
        }
    }

    /* ---- outputs */
    const array *EY = &c.out[OUT_Y];
    const int64_t y4[4] = {B, Hq, Sq, Dv};
    const int64_t y3[3] = {B, Sq, Hq * Dv};
    if (is3d ? !shape_is(EY, 3, y3) : !shape_is(EY, 4, y4)) {
        snprintf(err, sizeof err, "expected Y has an unexpected shape");
        goto fail_err;
    }
    if (!(y_buf = alloc_nan(EY->n, err, sizeof err)))
        goto fail_err;
    make_bhsd_view(&yv, y_buf, is3d, B, Hq, Sq, Dv);

    const sdpa_tensor *weights = NULL;
    const array *EW = &c.out[OUT_QK];
    if (EW->present) {
        const int64_t w4[4] = {B, Hq, Sq, T};
        if (!shape_is(EW, 4, w4)) {
            snprintf(err, sizeof err, "expected qk_matmul_output has an unexpected shape");
            goto fail_err;
        }
        if (!(w_buf = alloc_nan(EW->n, err, sizeof err)))
            goto fail_err;
        const int64_t wst[4] = {Hq * Sq * T, Sq * T, T, 1};
        make_view4(&wv, w_buf, w4, wst);
        weights = &wv;
        static const int32_t stage_of_mode[4] = {SDPA_WEIGHTS_SCORES, SDPA_WEIGHTS_SOFTCAPPED,
                                                 SDPA_WEIGHTS_MASKED,
                                                 SDPA_WEIGHTS_PROBABILITIES};
        opt.weights_stage = stage_of_mode[c.qk_mode];
    }

    /* present_key/present_value: the concatenation we built (or K/V themselves, as 4D). */
    float *pres_buf[2] = {NULL, NULL};
    for (int w = 0; w < 2; w++) {
        const array *EP = &c.out[w == 0 ? OUT_PRESENT_K : OUT_PRESENT_V];
        if (!EP->present)
            continue;
        const int64_t D = w == 0 ? Dk : Dv;
        const int64_t pshape[4] = {B, Hkv, T, D};
        if (!shape_is(EP, 4, pshape)) {
            snprintf(err, sizeof err, "expected %s has an unexpected shape",
                     out_roles[w == 0 ? OUT_PRESENT_K : OUT_PRESENT_V]);
            goto fail_err;
        }
        if (PK->present) {
            pres_buf[w] = w == 0 ? kcat : vcat;
        } else {
            /* no past: present is K/V itself */
            float *cat = concat_seq(NULL, 0, w == 0 ? &kv : &vv);
            if (!cat) {
                snprintf(err, sizeof err, "out of memory");
                goto fail_err;
            }
            if (w == 0)
                kcat = cat;
            else
                vcat = cat;
            pres_buf[w] = cat;
        }
    }

    /* ---- run */
    sdpa_status st = sdpa_attention(&qv, &kv, &vv, &opt, &yv, weights, NULL);
    if (st != SDPA_OK) {
        snprintf(err, sizeof err, "sdpa_attention returned %s: %s", sdpa_status_string(st),
                 sdpa_last_error_message());
        goto fail_err;
    }

    /* ---- compare */
    failed |= compare_output("Y", y_buf, EY, rtol, atol, &r, &max_err);

    /* ---- float16 natively: the raw encodings, float16 Y (and bias), float32 weights */
    if (c.any_f16 && Q->dtype == DT_F16 && K->dtype == DT_F16 && V->dtype == DT_F16 &&
        (!PK->present || (PK->dtype == DT_F16 && PV->dtype == DT_F16)) &&
        (!M->present || M->dtype != DT_F32)) {
        sdpa_tensor q16, k16, v16, y16v, b16v, w16v;
        sdpa_tensor k16c, v16c;
        make_bhsd_view(&k16c, NULL, is3d, B, Hkv, Skv, Dk);
        make_bhsd_view(&v16c, NULL, is3d, B, Hkv, Skv, Dv);
        make_bhsd_view(&q16, NULL, is3d, B, Hq, Sq, Dk);
        f16_twin(&q16, &q16, Q->h);
        f16_twin(&k16c, &k16c, K->h);
        f16_twin(&v16c, &v16c, V->h);
        f16_twin(&k16, &kv, NULL);
        f16_twin(&v16, &vv, NULL);
        if (PK->present) {
            kcat16 = concat_seq16(PK->h, P, &k16c);
            vcat16 = concat_seq16(PV->h, P, &v16c);
            if (!kcat16 || !vcat16) {
                snprintf(err, sizeof err, "out of memory");
                goto fail_err;
            }
            k16.data = kcat16;
            v16.data = vcat16;
        } else {
            k16 = k16c;
            v16 = v16c;
        }
        sdpa_options opt16 = opt;
        if (M->present && M->dtype == DT_F16) {
            const int64_t Tm = M->shape[M->rank - 1];
            const uint16_t *bdata = M->h;
            if (Tm < T && c.opset >= 24) { /* the same -inf padding, in float16 (0xFC00) */
                const int64_t rows = Tm > 0 ? M->n / Tm : 0;
                if (!(mask_h_pad = malloc((size_t)(rows * T > 0 ? rows * T : 1) * sizeof(uint16_t)))) {
                    snprintf(err, sizeof err, "out of memory");
                    goto fail_err;
                }
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < T; j++)
                        mask_h_pad[i * T + j] = j < Tm ? M->h[i * Tm + j] : (uint16_t)0xFC00;
                bdata = mask_h_pad;
            }
            f16_twin(&b16v, &bias_view, bdata);
            opt16.bias = &b16v;
        }
        if (!(y16 = malloc((size_t)(EY->n ? EY->n : 1) * sizeof(uint16_t))) || !(y16f = alloc_nan(EY->n, err, sizeof err))) {
            snprintf(err, sizeof err, "out of memory");
            goto fail_err;
        }
        for (int64_t i = 0; i < EY->n; i++)
            y16[i] = 0x7E00; /* NaN: what the call does not write fails the comparison */
        f16_twin(&y16v, &yv, y16);
        const sdpa_tensor *w16 = NULL;
        if (weights) {
            if (!(w16buf = alloc_nan(EW->n, err, sizeof err)))
                goto fail_err;
            w16v = wv;
            w16v.data = w16buf;
            w16 = &w16v;
        }
        st = sdpa_attention(&q16, &k16, &v16, &opt16, &y16v, w16, NULL);
        if (st != SDPA_OK) {
            snprintf(err, sizeof err, "native float16 sdpa_attention returned %s: %s", sdpa_status_string(st),
                     sdpa_last_error_message());
            goto fail_err;
        }
        if (strstr(sdpa_last_kernel(), "-f16") == NULL) {
            snprintf(err, sizeof err, "native float16 run reports kernel %s", sdpa_last_kernel());
            goto fail_err;
        }
        for (int64_t i = 0; i < EY->n; i++)
            y16f[i] = f16_value(y16[i]);
        failed |= compare_output("Y (native float16)", y16f, EY, rtol, atol, &r, &max_err);
        if (w16)
            failed |= compare_output("qk_matmul_output (native float16)", w16buf, EW, rtol, atol, &r, &max_err);
        native16 = 1;
        g_native_f16++;
    }
    if (EW->present)
        failed |= compare_output("qk_matmul_output", w_buf, EW, rtol, atol, &r, &max_err);
    if (pres_buf[0])
        failed |= compare_output("present_key", pres_buf[0], &c.out[OUT_PRESENT_K], rtol, atol,
                                 &r, &max_err);
    if (pres_buf[1])
        failed |= compare_output("present_value", pres_buf[1], &c.out[OUT_PRESENT_V], rtol,
                                 atol, &r, &max_err);

    if (failed) {
        printf("FAIL %s: max abs err %.3g: %s\n", name, max_err, r.text);
    } else {
        char qs[64];
        shape_str(qs, sizeof qs, Q->shape, Q->rank);
        printf("ok   %s (max abs err %.3g%s%s)\n", name, max_err,
               c.any_f16 ? (native16 ? ", float16 via float32 and natively in float16, tol 2e-3"
                                     : ", float16 via float32, tol 2e-3")
                         : "",
               c.softmax_precision && c.softmax_precision != 1
                   ? ", softmax_precision computed in float32"
                   : "");
    }
    goto done;

fail_err:
    failed = 1;
    printf("FAIL %s: max abs err n/a: %s\n", name, err);

done:
    free(kcat);
    free(vcat);
    free(mask_f_pad);
    free(mask_b_pad);
    free(kcat16);
    free(vcat16);
    free(mask_h_pad);
    free(y16);
    free(y16f);
    free(w16buf);
    free(y_buf);
    free(w_buf);
    free(offsets);
    cJSON_Delete(meta);
    free_case(&c);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DATA_DIR (tests/data/onnx-attention)\n", argv[0]);
        return 2;
    }
    if (!is_little_endian()) {
        fprintf(stderr, "the conformance data is little-endian; this host is not\n");
        return 2;
    }
    if (sdpa_version() < SDPA_VERSION_NUMBER) {
        fprintf(stderr, "libsdpa %s is older than the header %s\n", sdpa_version_string(),
                SDPA_VERSION_STRING);
        return 2;
    }
    int passed = 0, failed_n = 0, total = 0;
    int listing_failed = 0;
    for (size_t s = 0; s < sizeof subdirs / sizeof subdirs[0]; s++) {
        char *dir = conf_path_join(argv[1], subdirs[s]);
        if (!dir) {
            fprintf(stderr, "out of memory\n");
            return 2;
        }
        char err[600];
        char **names = NULL;
        int n = conf_list_dir(dir, 1, NULL, &names, err, sizeof err);
        if (n < 0) {
            printf("FAIL %s: %s\n", subdirs[s], err);
            listing_failed = 1;
            free(dir);
            continue;
        }
        for (int i = 0; i < n; i++) {
            char *case_dir = conf_path_join(dir, names[i]);
            int f;
            if (!case_dir) {
                printf("FAIL %s: out of memory\n", names[i]);
                f = 1;
            } else {
                f = run_case(case_dir, names[i]);
            }
            free(case_dir);
            total++;
            if (f)
                failed_n++;
            else
                passed++;
        }
        conf_free_names(names, n);
        free(dir);
    }
    fflush(stdout);
    if (total != EXPECTED_CASES)
        printf("FAIL: found %d case directories, expected %d\n", total, EXPECTED_CASES);
    if (g_native_f16 != EXPECTED_NATIVE_F16)
        printf("FAIL: %d float16 cases ran natively in float16, expected %d\n", g_native_f16, EXPECTED_NATIVE_F16);
    printf("%d passed, %d failed (%d float16 cases also natively in float16)\n", passed, failed_n, g_native_f16);
    return (failed_n > 0 || total != EXPECTED_CASES || listing_failed || g_native_f16 != EXPECTED_NATIVE_F16) ? 1 : 0;
}
