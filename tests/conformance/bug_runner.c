/*
 * Bug-report conformance runner.
 *
 * Usage: bug_runner DATA_DIR
 *   DATA_DIR = tests/data/bug-reports, holding one JSON case per file
 *   (format: tests/data/bug-reports/README.md).
 *
 * Runs every case whose op is "sdpa" through sdpa_attention() (there must be exactly 9) and
 * every case whose op is "mha" through sdpa_mha_forward() (exactly 1), and compares output,
 * weights and lse where the case gives them, with the case's own tolerance.
 * A case expecting an error must fail with the mapped status and leave the canary-filled
 * outputs untouched. Parameters the runner cannot map make the case fail, never skip.
 * Cases of other ops (mask builders) are not run by this runner yet; they are listed on one
 * line. Ends with "N passed, M failed"; exits non-zero on any failure.
 */
#include "conf_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#define EXPECTED_SDPA_CASES 9
#define EXPECTED_MHA_CASES 1

typedef struct farray {
    int rank;
    int64_t shape[SDPA_MAX_RANK];
    int64_t n;
    float *data;
} farray;

/* An output buffer filled with a canary pattern, and a copy of that pattern: a case that
 * expects an error checks that the call left the buffer as it was. */
typedef struct canary {
    int64_t n;
    float *data, *copy;
} canary;

typedef struct bug_case {
    farray q, k, v;
    farray exp_out, exp_w, exp_lse;
    uint8_t *mask;
    int64_t mask_shape[SDPA_MASK_MAX_RANK];
    int mask_rank;
    int64_t *key_lengths, *query_lengths;
    canary out, w, lse;               /* results */
} bug_case;

static void free_canary(canary *b)
{
    free(b->data);
    free(b->copy);
}

static void free_case(bug_case *c)
{
    free(c->q.data);
    free(c->k.data);
    free(c->v.data);
    free(c->exp_out.data);
    free(c->exp_w.data);
    free(c->exp_lse.data);
    free(c->mask);
    free(c->key_lengths);
    free(c->query_lengths);
    free_canary(&c->out);
    free_canary(&c->w);
    free_canary(&c->lse);
}

/* A JSON number, or one of the strings "NaN", "Infinity", "-Infinity". */
static int json_float(const cJSON *it, float *out)
{
    if (cJSON_IsNumber(it)) {
        *out = (float)it->valuedouble;
        return 0;
    }
    if (cJSON_IsString(it)) {
        if (strcmp(it->valuestring, "NaN") == 0)
            *out = NAN;
        else if (strcmp(it->valuestring, "Infinity") == 0)
            *out = INFINITY;
        else if (strcmp(it->valuestring, "-Infinity") == 0)
            *out = -INFINITY;
        else
            return -1;
        return 0;
    }
    return -1;
}

/* {shape, data} -> farray. */
static int load_farray(const cJSON *obj, const char *what, farray *a, char *err, size_t errlen)
{
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(obj, "shape");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(obj, "data");
    a->rank = conf_json_shape(shape, a->shape, SDPA_MAX_RANK);
    a->n = a->rank < 0 ? -1 : conf_numel(a->shape, a->rank);
    if (a->n < 0 || !cJSON_IsArray(data) || cJSON_GetArraySize(data) != a->n) {
        snprintf(err, errlen, "%s: bad shape or data length", what);
        return -1;
    }
    a->data = malloc((size_t)(a->n ? a->n : 1) * sizeof(float));
    if (!a->data) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int64_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, data)
    {
        if (i >= a->n || json_float(it, &a->data[i]) != 0) {
            snprintf(err, errlen, "%s: element %lld is not a number", what, (long long)i);
            return -1;
        }
        i++;
    }
    return 0;
}

/* [B] int64 lengths. */
static int load_lengths(const cJSON *arr, int64_t B, const char *what, int64_t **out, char *err,
                        size_t errlen)
{
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != B) {
        snprintf(err, errlen, "%s must be an array of B=%lld integers", what, (long long)B);
        return -1;
    }
    *out = malloc((size_t)(B ? B : 1) * sizeof **out);
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int64_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (i >= B || conf_json_int(it, INT32_MIN, INT32_MAX, &(*out)[i]) != 0) {
            snprintf(err, errlen, "%s[%lld] is not an integer", what, (long long)i);
            return -1;
        }
        i++;
    }
    return 0;
}

/* Status an "expected.error" string stands for: the part before ':' names the family. */
static int error_status(const char *msg, sdpa_status *st)
{
    static const struct {
        const char *prefix;
        sdpa_status status;
    } map[] = {
        {"invalid_mask", SDPA_ERR_EMPTY_ROW},       /* "invalid_mask: query row ... no key" */
        {"empty_row", SDPA_ERR_EMPTY_ROW},
        {"invalid_argument", SDPA_ERR_INVALID_ARGUMENT},
        {"shape", SDPA_ERR_SHAPE},
        {"broadcast", SDPA_ERR_BROADCAST},
        {"rank", SDPA_ERR_RANK},
        {"dtype", SDPA_ERR_DTYPE},
        {"non_finite", SDPA_ERR_NON_FINITE},
        {"unsupported", SDPA_ERR_UNSUPPORTED},
        {"null_pointer", SDPA_ERR_NULL_POINTER},
    };
    const char *colon = strchr(msg, ':');
    size_t len = colon ? (size_t)(colon - msg) : strlen(msg);
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strlen(map[i].prefix) == len && strncmp(msg, map[i].prefix, len) == 0) {
            *st = map[i].status;
            return 0;
        }
    }
    return -1;
}

/* Allocate b for n floats and fill it with the canary; 0, or -1 with err on allocation
 * failure. */
static int canary_alloc(canary *b, int64_t n, char *err, size_t errlen)
{
    b->n = n;
    b->data = malloc((size_t)(n ? n : 1) * sizeof(float));
    b->copy = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!b->data || !b->copy) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* A recognisable pattern, NaN payloads mixed with finite values. */
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (i % 2) ? 0x7FC0A5A5u : 0x4E6E6B28u; /* NaN / 1e9 */
        memcpy(&b->data[i], &bits, sizeof bits);
    }
    memcpy(b->copy, b->data, (size_t)(n ? n : 1) * sizeof(float));
    return 0;
}

/* Whether any of the n buffers (those with data) differs from its canary copy. */
static int canary_touched(const canary *const *bufs, int n)
{
    for (int i = 0; i < n; i++)
        if (bufs[i]->data &&
            memcmp(bufs[i]->data, bufs[i]->copy, (size_t)bufs[i]->n * sizeof(float)) != 0)
            return 1;
    return 0;
}

/* The sections every case has: inputs, params, expected (objects) and tolerance {rtol, atol}.
 * 0, or -1 with err. */
static int case_sections(const cJSON *root, const cJSON **inputs, const cJSON **params,
                         const cJSON **expected, double *rtol, double *atol, char *err,
                         size_t errlen)
{
    *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    *params = cJSON_GetObjectItemCaseSensitive(root, "params");
    *expected = cJSON_GetObjectItemCaseSensitive(root, "expected");
    const cJSON *tol = cJSON_GetObjectItemCaseSensitive(root, "tolerance");
    if (!cJSON_IsObject(*inputs) || !cJSON_IsObject(*params) || !cJSON_IsObject(*expected) ||
        !cJSON_IsObject(tol)) {
        snprintf(err, errlen, "case lacks inputs/params/expected/tolerance");
        return -1;
    }
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(tol, "rtol");
    const cJSON *ja = cJSON_GetObjectItemCaseSensitive(tol, "atol");
    if (!cJSON_IsNumber(jr) || !cJSON_IsNumber(ja)) {
        snprintf(err, errlen, "tolerance lacks rtol/atol");
        return -1;
    }
    *rtol = jr->valuedouble;
    *atol = ja->valuedouble;
    return 0;
}

/* A bool param into *out; 0, or -1 with err. */
static int param_bool(const cJSON *p, int32_t *out, char *err, size_t errlen)
{
    if (!cJSON_IsBool(p)) {
        snprintf(err, errlen, "%s is not a bool", p->string);
        return -1;
    }
    *out = cJSON_IsTrue(p) ? 1 : 0;
    return 0;
}

/* The "empty_row_policy" param into *out; 0, or -1 with err. */
static int param_empty_rows(const cJSON *p, int32_t *out, char *err, size_t errlen)
{
    if (cJSON_IsString(p) && strcmp(p->valuestring, "error") == 0) {
        *out = SDPA_EMPTY_ROWS_ERROR;
    } else if (cJSON_IsString(p) && strcmp(p->valuestring, "zero") == 0) {
        *out = SDPA_EMPTY_ROWS_ZERO;
    } else {
        snprintf(err, errlen, "empty_row_policy cannot be expressed");
        return -1;
    }
    return 0;
}

/* The members of obj (but the one named skip, nullable) into farrays: the member named
 * names[i] into dsts[i]. A member of another name, or one given twice, fails with "<what>
 * '<name>' cannot be expressed". 0, or -1 with err. */
static int load_named(const cJSON *obj, const char *skip, const char *what,
                      const char *const *names, farray *const *dsts, int n, char *err,
                      size_t errlen)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (skip && strcmp(it->string, skip) == 0)
            continue;
        int idx = 0;
        while (idx < n && strcmp(it->string, names[idx]) != 0)
            idx++;
        if (idx == n || dsts[idx]->data) {
            snprintf(err, errlen, "%s '%s' cannot be expressed", what, it->string);
            return -1;
        }
        if (load_farray(it, it->string, dsts[idx], err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The "expected" section: the optional "error" (into *jerr and *want_status) and the arrays
 * named in names[0..n) (into dsts[0..n)). Without an error, the first of them (the output) is
 * required. 0, or -1 with err. */
static int load_expected(const cJSON *expected, const char *const *names, farray *const *dsts,
                         int n, const cJSON **jerr, sdpa_status *want_status, char *err,
                         size_t errlen)
{
    *jerr = cJSON_GetObjectItemCaseSensitive(expected, "error");
    *want_status = SDPA_OK;
    if (*jerr && (!cJSON_IsString(*jerr) ||
                  error_status((*jerr)->valuestring, want_status) != 0)) {
        snprintf(err, errlen, "expected error '%s' cannot be mapped to a status",
                 cJSON_IsString(*jerr) ? (*jerr)->valuestring : "?");
        return -1;
    }
    if (load_named(expected, "error", "expected", names, dsts, n, err, errlen) != 0)
        return -1;
    if (!*jerr && !dsts[0]->data) {
        snprintf(err, errlen, "expected has neither error nor output");
        return -1;
    }
    return 0;
}

/* A case that expects an error: the call (which returned st) must have failed with
 * want_status, left every buffer in bufs[0..n) untouched and, where require_msg, set an error
 * message. want_text (nullable) is the case's error string, quoted in a mismatch. Returns 0
 * on pass, 1 on failure; err says which. */
static int check_expected_error(sdpa_status st, sdpa_status want_status, const char *want_text,
                                const canary *const *bufs, int n, int require_msg, char *err,
                                size_t errlen)
{
    const char *msg = sdpa_last_error_message();
    if (st != want_status) {
        snprintf(err, errlen, "expected %s%s%s%s, got %s%s%s", sdpa_status_string(want_status),
                 want_text ? " (" : "", want_text ? want_text : "", want_text ? ")" : "",
                 sdpa_status_string(st), st != SDPA_OK ? ": " : "", st != SDPA_OK ? msg : "");
        return 1;
    }
    if (canary_touched(bufs, n)) {
        snprintf(err, errlen, "failed with %s as expected but wrote to an output",
                 sdpa_status_string(st));
        return 1;
    }
    if (require_msg && msg[0] == '\0') {
        snprintf(err, errlen, "failed with %s but sdpa_last_error_message() is empty",
                 sdpa_status_string(st));
        return 1;
    }
    snprintf(err, errlen, "%s as expected: %s", sdpa_status_string(st), msg);
    return 0;
}

static int compare(const char *what, const float *got, const farray *exp, double rtol,
                   double atol, char *err, size_t errlen, double *max_err)
{
    conf_cmp r;
    conf_compare(got, exp->data, exp->n, rtol, atol, &r);
    if (r.max_abs_err > *max_err)
        *max_err = r.max_abs_err;
    if (r.mismatches == 0)
        return 0;
    size_t used = strlen(err);
    snprintf(err + used, errlen - used,
             "%s%s: %lld of %lld out of tolerance, max abs err %.3g, first at %lld (got %.9g, "
             "expected %.9g)",
             used ? "; " : "", what, (long long)r.mismatches, (long long)exp->n, r.max_abs_err,
             (long long)r.first_bad, (double)got[r.first_bad], (double)exp->data[r.first_bad]);
    return 1;
}

static int same_shape(const farray *a, int rank, const int64_t *shape)
{
    return conf_same_shape(a->rank, a->shape, rank, shape);
}

/* Returns 0 on pass, 1 on failure (with the reason in err). */
static int run_case(const cJSON *root, char *err, size_t errlen, double *max_err)
{
    bug_case c;
    memset(&c, 0, sizeof c);
    int failed = 1;
    err[0] = '\0';

    const cJSON *inputs, *params, *expected;
    double rtol, atol;
    if (case_sections(root, &inputs, &params, &expected, &rtol, &atol, err, errlen) != 0)
        goto done;

    /* ---- inputs */
    static const char *const in_names[3] = {"q", "k", "v"};
    farray *const in_dsts[3] = {&c.q, &c.k, &c.v};
    if (load_named(inputs, NULL, "input", in_names, in_dsts, 3, err, errlen) != 0)
        goto done;
    if (!c.q.data || !c.k.data || !c.v.data) {
        snprintf(err, errlen, "q, k or v missing");
        goto done;
    }
    if (c.q.rank != 4 || c.k.rank != 4 || c.v.rank != 4) {
        snprintf(err, errlen, "q, k and v must be 4D (BHLD)");
        goto done;
    }
    const int64_t B = c.q.shape[0], Hq = c.q.shape[1], L = c.q.shape[2];
    const int64_t S = c.k.shape[2], Ev = c.v.shape[3];

    /* ---- params */
    sdpa_options opt;
    sdpa_options_init(&opt);
    int32_t return_weights = 0;
    sdpa_allow_mask allow;
    const cJSON *p;
    cJSON_ArrayForEach(p, params)
    {
        const char *key = p->string;
        if (strcmp(key, "layout") == 0) {
            if (!cJSON_IsString(p) || strcmp(p->valuestring, "BHLD") != 0) {
                snprintf(err, errlen, "layout other than BHLD cannot be expressed");
                goto done;
            }
        } else if (strcmp(key, "is_causal") == 0) {
            if (param_bool(p, &opt.causal, err, errlen) != 0)
                goto done;
        } else if (strcmp(key, "causal_alignment") == 0) {
            if (cJSON_IsString(p) && strcmp(p->valuestring, "top_left") == 0) {
                opt.alignment = SDPA_ALIGN_TOP_LEFT;
            } else if (cJSON_IsString(p) && strcmp(p->valuestring, "bottom_right") == 0) {
                opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            } else {
                snprintf(err, errlen, "causal_alignment cannot be expressed");
                goto done;
            }
        } else if (strcmp(key, "scale") == 0) {
            if (cJSON_IsNull(p)) {
                opt.scale = 0.0f; /* default 1/sqrt(E) */
            } else if (cJSON_IsNumber(p)) {
                opt.scale = (float)p->valuedouble;
            } else {
                snprintf(err, errlen, "scale is neither null nor a number");
                goto done;
            }
        } else if (strcmp(key, "dropout_p") == 0) {
            if (!cJSON_IsNumber(p)) {
                snprintf(err, errlen, "dropout_p is not a number");
                goto done;
            }
            opt.dropout_p = (float)p->valuedouble;
        } else if (strcmp(key, "allow_mask") == 0) {
            const cJSON *ms = cJSON_GetObjectItemCaseSensitive(p, "shape");
            const cJSON *md = cJSON_GetObjectItemCaseSensitive(p, "data");
            c.mask_rank = conf_json_shape(ms, c.mask_shape, SDPA_MASK_MAX_RANK);
            int64_t n = c.mask_rank < 1 ? -1 : conf_numel(c.mask_shape, c.mask_rank);
            if (n < 0 || !cJSON_IsArray(md) || cJSON_GetArraySize(md) != n) {
                snprintf(err, errlen, "allow_mask: bad shape or data length");
                goto done;
            }
            c.mask = malloc((size_t)(n ? n : 1));
            if (!c.mask) {
                snprintf(err, errlen, "out of memory");
                goto done;
            }
            int64_t i = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, md)
            {
                int64_t v;
                if (i >= n || conf_json_int(e, 0, 1, &v) != 0) {
                    snprintf(err, errlen, "allow_mask element %lld is not 0/1", (long long)i);
                    goto done;
                }
                c.mask[i++] = (uint8_t)v;
            }
            sdpa_status st = sdpa_allow_mask_init(&allow, c.mask, c.mask_rank, c.mask_shape);
            if (st != SDPA_OK) {
                snprintf(err, errlen, "sdpa_allow_mask_init: %s: %s", sdpa_status_string(st),
                         sdpa_last_error_message());
                goto done;
            }
            opt.allow_mask = &allow;
        } else if (strcmp(key, "key_lengths") == 0) {
            if (load_lengths(p, B, key, &c.key_lengths, err, errlen) != 0)
                goto done;
            opt.key_lengths = c.key_lengths;
        } else if (strcmp(key, "query_lengths") == 0) {
            if (load_lengths(p, B, key, &c.query_lengths, err, errlen) != 0)
                goto done;
            opt.query_lengths = c.query_lengths;
        } else if (strcmp(key, "empty_row_policy") == 0) {
            if (param_empty_rows(p, &opt.empty_rows, err, errlen) != 0)
                goto done;
        } else if (strcmp(key, "return_weights") == 0) {
            if (param_bool(p, &return_weights, err, errlen) != 0)
                goto done;
        } else if (strcmp(key, "num_heads") == 0 || strcmp(key, "num_kv_heads") == 0) {
            /* Implied by the BHLD shapes; check that they agree. */
            int64_t h;
            int64_t want = key[4] == 'h' ? Hq : c.k.shape[1];
            if (conf_json_int(p, 1, INT32_MAX, &h) != 0 || h != want) {
                snprintf(err, errlen, "%s disagrees with the input shapes", key);
                goto done;
            }
        } else {
            snprintf(err, errlen, "param '%s' cannot be expressed", key);
            goto done;
        }
    }

    /* ---- expected */
    const cJSON *jerr;
    sdpa_status want_status;
    static const char *const exp_names[3] = {"output", "weights", "lse"};
    farray *const exp_dsts[3] = {&c.exp_out, &c.exp_w, &c.exp_lse};
    if (load_expected(expected, exp_names, exp_dsts, 3, &jerr, &want_status, err, errlen) != 0)
        goto done;
    if (c.exp_w.data && !return_weights) {
        snprintf(err, errlen, "expected weights without return_weights");
        goto done;
    }
    const int64_t out_shape[4] = {B, Hq, L, Ev};
    const int64_t w_shape[4] = {B, Hq, L, S};
    const int64_t lse_shape[3] = {B, Hq, L};
    if ((c.exp_out.data && !same_shape(&c.exp_out, 4, out_shape)) ||
        (c.exp_w.data && !same_shape(&c.exp_w, 4, w_shape)) ||
        (c.exp_lse.data && !same_shape(&c.exp_lse, 3, lse_shape))) {
        snprintf(err, errlen, "expected outputs have unexpected shapes");
        goto done;
    }

    /* ---- outputs, canary-filled */
    const int64_t n_out = conf_numel(out_shape, 4), n_w = conf_numel(w_shape, 4);
    const int64_t n_lse = conf_numel(lse_shape, 3);
    if (n_out < 0 || n_w < 0 || n_lse < 0) {
        snprintf(err, errlen, "output sizes overflow");
        goto done;
    }
    int want_w = return_weights, want_lse = c.exp_lse.data != NULL;
    if (canary_alloc(&c.out, n_out, err, errlen) != 0 ||
        (want_w && canary_alloc(&c.w, n_w, err, errlen) != 0) ||
        (want_lse && canary_alloc(&c.lse, n_lse, err, errlen) != 0))
        goto done;

    sdpa_tensor qv, kv, vv, ov, wv, lv;
    sdpa_status st;
    if ((st = sdpa_tensor_init(&qv, c.q.data, 4, c.q.shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&kv, c.k.data, 4, c.k.shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&vv, c.v.data, 4, c.v.shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&ov, c.out.data, 4, out_shape)) != SDPA_OK ||
        (want_w && (st = sdpa_tensor_init(&wv, c.w.data, 4, w_shape)) != SDPA_OK) ||
        (want_lse && (st = sdpa_tensor_init(&lv, c.lse.data, 3, lse_shape)) != SDPA_OK)) {
        snprintf(err, errlen, "sdpa_tensor_init: %s: %s", sdpa_status_string(st),
                 sdpa_last_error_message());
        goto done;
    }

    st = sdpa_attention(&qv, &kv, &vv, &opt, &ov, want_w ? &wv : NULL, want_lse ? &lv : NULL);

    if (jerr) {
        const canary *const bufs[3] = {&c.out, &c.w, &c.lse};
        failed = check_expected_error(st, want_status, jerr->valuestring, bufs, 3, 1, err, errlen);
        goto done;
    }
    if (st != SDPA_OK) {
        snprintf(err, errlen, "sdpa_attention returned %s: %s", sdpa_status_string(st),
                 sdpa_last_error_message());
        goto done;
    }
    int bad = compare("output", c.out.data, &c.exp_out, rtol, atol, err, errlen, max_err);
    if (c.exp_w.data)
        bad |= compare("weights", c.w.data, &c.exp_w, rtol, atol, err, errlen, max_err);
    if (c.exp_lse.data)
        bad |= compare("lse", c.lse.data, &c.exp_lse, rtol, atol, err, errlen, max_err);
    failed = bad;

done:
    free_case(&c);
    return failed;
}

/* ------------------------------------------------------------------ op "mha" */

/* An MHA case: inputs query [B,L,E], key [B,S,kdim], value [B,S,vdim] (layout "BLE") and the
 * projections w_q/b_q, w_k/b_k, w_v/b_v, w_o/b_o as PyTorch stores them ([out, in],
 * y = x W^T + b). The three input biases become the layer's in_proj_bias [q; k; v]. */
enum { MHA_Q, MHA_K, MHA_V, MHA_WQ, MHA_BQ, MHA_WK, MHA_BK, MHA_WV, MHA_BV, MHA_WO, MHA_BO, MHA_N };
static const char *const MHA_NAMES[MHA_N] = {"query", "key", "value", "w_q", "b_q", "w_k",
                                             "b_k", "w_v", "b_v", "w_o", "b_o"};

static int run_mha_case(const cJSON *root, char *err, size_t errlen, double *max_err)
{
    farray a[MHA_N], exp_out, exp_w;
    float *in_bias = NULL;
    canary out = {0, NULL, NULL}, w = {0, NULL, NULL};
    int failed = 1;
    memset(a, 0, sizeof a);
    memset(&exp_out, 0, sizeof exp_out);
    memset(&exp_w, 0, sizeof exp_w);
    err[0] = '\0';

    const cJSON *inputs, *params, *expected;
    double rtol, atol;
    if (case_sections(root, &inputs, &params, &expected, &rtol, &atol, err, errlen) != 0)
        goto done;

    farray *in_dsts[MHA_N];
    for (int i = 0; i < MHA_N; i++)
        in_dsts[i] = &a[i];
    if (load_named(inputs, NULL, "input", MHA_NAMES, in_dsts, MHA_N, err, errlen) != 0)
        goto done;
    for (int i = 0; i < MHA_N; i++) {
        /* b_* may be absent (bias=False); everything else is required. */
        int is_bias = i == MHA_BQ || i == MHA_BK || i == MHA_BV || i == MHA_BO;
        if (!a[i].data && !is_bias) {
            snprintf(err, errlen, "input '%s' missing", MHA_NAMES[i]);
            goto done;
        }
    }
    if ((a[MHA_BQ].data != NULL) != (a[MHA_BK].data != NULL) ||
        (a[MHA_BQ].data != NULL) != (a[MHA_BV].data != NULL)) {
        snprintf(err, errlen, "b_q, b_k, b_v must be given together");
        goto done;
    }
    if (a[MHA_Q].rank != 3 || a[MHA_K].rank != 3 || a[MHA_V].rank != 3) {
        snprintf(err, errlen, "query, key and value must be 3D (BLE)");
        goto done;
    }
    const int64_t B = a[MHA_Q].shape[0], L = a[MHA_Q].shape[1], E = a[MHA_Q].shape[2];

    sdpa_mha_params mp;
    sdpa_mha_params_init(&mp);
    mp.embed_dim = E;
    mp.kdim = a[MHA_K].shape[2];
    mp.vdim = a[MHA_V].shape[2];
    sdpa_mha_options mo;
    sdpa_mha_options_init(&mo);
    int32_t need_weights = 0, average = 1;
    int have_heads = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, params)
    {
        const char *key = p->string;
        int64_t iv;
        if (strcmp(key, "layout") == 0) {
            if (!cJSON_IsString(p) || strcmp(p->valuestring, "BLE") != 0) {
                snprintf(err, errlen, "layout other than BLE cannot be expressed");
                goto done;
            }
        } else if (strcmp(key, "num_heads") == 0) {
            if (conf_json_int(p, 1, INT32_MAX, &iv) != 0) {
                snprintf(err, errlen, "num_heads is not a positive integer");
                goto done;
            }
            mp.num_heads = iv;
            have_heads = 1;
        } else if (strcmp(key, "num_kv_heads") == 0) {
            if (conf_json_int(p, 1, INT32_MAX, &iv) != 0) {
                snprintf(err, errlen, "num_kv_heads is not a positive integer");
                goto done;
            }
            mp.num_kv_heads = iv;
        } else if (strcmp(key, "is_causal") == 0) {
            if (param_bool(p, &mo.causal, err, errlen) != 0)
                goto done;
        } else if (strcmp(key, "scale") == 0) {
            /* The layer always scales by 1/sqrt(head_dim); only null (= default) maps. */
            if (!cJSON_IsNull(p)) {
                snprintf(err, errlen, "an explicit MHA scale cannot be expressed");
                goto done;
            }
        } else if (strcmp(key, "dropout_p") == 0) {
            float dp;
            if (json_float(p, &dp) != 0) {
                snprintf(err, errlen, "dropout_p is not a number");
                goto done;
            }
            mo.dropout_p = dp; /* eval mode (training = 0): no dropout is applied */
        } else if (strcmp(key, "empty_row_policy") == 0) {
            if (param_empty_rows(p, &mo.empty_rows, err, errlen) != 0)
                goto done;
        } else if (strcmp(key, "need_weights") == 0 || strcmp(key, "average_weights") == 0) {
            if (param_bool(p, key[0] == 'n' ? &need_weights : &average, err, errlen) != 0)
                goto done;
        } else {
            snprintf(err, errlen, "param '%s' cannot be expressed", key);
            goto done;
        }
    }
    if (!have_heads) {
        snprintf(err, errlen, "num_heads missing");
        goto done;
    }
    mo.per_head_weights = average ? 0 : 1;
    const int64_t H = mp.num_heads, S = a[MHA_K].shape[1];

    /* ---- expected */
    const cJSON *jerr;
    sdpa_status want_status;
    static const char *const exp_names[2] = {"output", "weights"};
    farray *const exp_dsts[2] = {&exp_out, &exp_w};
    if (load_expected(expected, exp_names, exp_dsts, 2, &jerr, &want_status, err, errlen) != 0)
        goto done;
    if (exp_w.data && !need_weights) {
        snprintf(err, errlen, "expected weights without need_weights");
        goto done;
    }
    const int64_t out_shape[3] = {B, L, E};
    const int64_t w_shape[4] = {B, H, L, S}, wa_shape[3] = {B, L, S};
    const int w_rank = average ? 3 : 4;
    const int64_t *wsh = average ? wa_shape : w_shape;
    if ((exp_out.data && !same_shape(&exp_out, 3, out_shape)) ||
        (exp_w.data && !same_shape(&exp_w, w_rank, wsh))) {
        snprintf(err, errlen, "expected outputs have unexpected shapes");
        goto done;
    }

    /* ---- views */
    sdpa_tensor tq, tk, tv, twq, twk, twv, two, tbo, tib, to, tw;
    sdpa_status st;
    int64_t Dq = a[MHA_WQ].shape[0], Dkv = a[MHA_WK].shape[0];
    int64_t nb = Dq + 2 * Dkv;
    if (a[MHA_BQ].data) {
        if (a[MHA_BQ].n != Dq || a[MHA_BK].n != Dkv || a[MHA_BV].n != Dkv) {
            snprintf(err, errlen, "b_q/b_k/b_v sizes do not match w_q/w_k/w_v rows");
            goto done;
        }
        in_bias = malloc((size_t)nb * sizeof(float));
        if (!in_bias) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        memcpy(in_bias, a[MHA_BQ].data, (size_t)Dq * sizeof(float));
        memcpy(in_bias + Dq, a[MHA_BK].data, (size_t)Dkv * sizeof(float));
        memcpy(in_bias + Dq + Dkv, a[MHA_BV].data, (size_t)Dkv * sizeof(float));
    }
    const int64_t n_out = conf_numel(out_shape, 3), n_w = conf_numel(wsh, w_rank);
    if (canary_alloc(&out, n_out, err, errlen) != 0 ||
        (need_weights && canary_alloc(&w, n_w, err, errlen) != 0))
        goto done;
    if ((st = sdpa_tensor_init(&tq, a[MHA_Q].data, 3, a[MHA_Q].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&tk, a[MHA_K].data, 3, a[MHA_K].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&tv, a[MHA_V].data, 3, a[MHA_V].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&twq, a[MHA_WQ].data, a[MHA_WQ].rank, a[MHA_WQ].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&twk, a[MHA_WK].data, a[MHA_WK].rank, a[MHA_WK].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&twv, a[MHA_WV].data, a[MHA_WV].rank, a[MHA_WV].shape)) != SDPA_OK ||
        (st = sdpa_tensor_init(&two, a[MHA_WO].data, a[MHA_WO].rank, a[MHA_WO].shape)) != SDPA_OK ||
        (a[MHA_BO].data &&
         (st = sdpa_tensor_init(&tbo, a[MHA_BO].data, a[MHA_BO].rank, a[MHA_BO].shape)) != SDPA_OK) ||
        (in_bias && (st = sdpa_tensor_init(&tib, in_bias, 1, &nb)) != SDPA_OK) ||
        (st = sdpa_tensor_init(&to, out.data, 3, out_shape)) != SDPA_OK ||
        (need_weights && (st = sdpa_tensor_init(&tw, w.data, w_rank, wsh)) != SDPA_OK)) {
        snprintf(err, errlen, "sdpa_tensor_init: %s: %s", sdpa_status_string(st),
                 sdpa_last_error_message());
        goto done;
    }
    mp.q_proj_weight = &twq;
    mp.k_proj_weight = &twk;
    mp.v_proj_weight = &twv;
    mp.out_proj_weight = &two;
    mp.out_proj_bias = a[MHA_BO].data ? &tbo : NULL;
    mp.in_proj_bias = in_bias ? &tib : NULL;
    if (Dq % H != 0) {
        snprintf(err, errlen, "w_q rows %lld not divisible by num_heads %lld", (long long)Dq,
                 (long long)H);
        goto done;
    }
    mp.head_dim = Dq == E ? 0 : Dq / H; /* 0 = E / H: the default the case is about */

    st = sdpa_mha_forward(&mp, &tq, &tk, &tv, &mo, &to, need_weights ? &tw : NULL);
    if (jerr) {
        /* As before: the MHA runner neither quotes the case's error string nor requires a
         * non-empty error message. */
        const canary *const bufs[2] = {&out, &w};
        failed = check_expected_error(st, want_status, NULL, bufs, 2, 0, err, errlen);
        goto done;
    }
    if (st != SDPA_OK) {
        snprintf(err, errlen, "sdpa_mha_forward returned %s: %s", sdpa_status_string(st),
                 sdpa_last_error_message());
        goto done;
    }
    int bad = compare("output", out.data, &exp_out, rtol, atol, err, errlen, max_err);
    if (exp_w.data)
        bad |= compare("weights", w.data, &exp_w, rtol, atol, err, errlen, max_err);
    failed = bad;

done:
    for (int i = 0; i < MHA_N; i++)
        free(a[i].data);
    free(exp_out.data);
    free(exp_w.data);
    free(in_bias);
    free_canary(&out);
    free_canary(&w);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DATA_DIR (tests/data/bug-reports)\n", argv[0]);
        return 2;
    }
    char err[1024];
    char **names = NULL;
    int n = conf_list_dir(argv[1], 0, ".json", &names, err, sizeof err);
    if (n < 0) {
        printf("FAIL: %s\n", err);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    int passed = 0, failed = 0, sdpa_cases = 0, mha_cases = 0;
    char later[1024] = "";
    for (int i = 0; i < n; i++) {
        char *path = conf_path_join(argv[1], names[i]);
        if (!path)
            snprintf(err, sizeof err, "out of memory");
        cJSON *root = path ? conf_read_json(path, err, sizeof err) : NULL;
        free(path);
        if (!root) {
            /* A case file we cannot read may be an sdpa case: count it as failed. */
            printf("FAIL %s: %s\n", names[i], err);
            failed++;
            continue;
        }
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(root, "op");
        const char *name = cJSON_IsString(id) ? id->valuestring : names[i];
        if (!cJSON_IsString(op)) {
            printf("FAIL %s: no op\n", name);
            failed++;
        } else if (strcmp(op->valuestring, "sdpa") != 0 && strcmp(op->valuestring, "mha") != 0) {
            size_t used = strlen(later);
            snprintf(later + used, sizeof later - used, "%s%s (op %s)", used ? ", " : "", name,
                     op->valuestring);
        } else {
            const int is_mha = strcmp(op->valuestring, "mha") == 0;
            if (is_mha)
                mha_cases++;
            else
                sdpa_cases++;
            double max_err = 0.0;
            if ((is_mha ? run_mha_case(root, err, sizeof err, &max_err)
                        : run_case(root, err, sizeof err, &max_err)) == 0) {
                passed++;
                if (err[0])
                    printf("ok   %s (%s)\n", name, err);
                else
                    printf("ok   %s (max abs err %.3g)\n", name, max_err);
            } else {
                failed++;
                printf("FAIL %s: %s\n", name, err);
            }
        }
        cJSON_Delete(root);
    }
    conf_free_names(names, n);
    printf("not run here: %s\n", later[0] ? later : "none");
    if (sdpa_cases != EXPECTED_SDPA_CASES) {
        printf("FAIL: found %d sdpa cases, expected %d\n", sdpa_cases, EXPECTED_SDPA_CASES);
        failed += sdpa_cases < EXPECTED_SDPA_CASES ? EXPECTED_SDPA_CASES - sdpa_cases : 0;
    }
    if (mha_cases != EXPECTED_MHA_CASES) {
        printf("FAIL: found %d mha cases, expected %d\n", mha_cases, EXPECTED_MHA_CASES);
        failed += mha_cases < EXPECTED_MHA_CASES ? EXPECTED_MHA_CASES - mha_cases : 0;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return (failed > 0 || sdpa_cases != EXPECTED_SDPA_CASES || mha_cases != EXPECTED_MHA_CASES) ? 1
                                                                                               : 0;
}
