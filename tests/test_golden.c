/*
 * libsdpa against PyTorch: the fixtures in tests/golden/ (format: tests/golden/README.md),
 * written by tests/golden/make_torch_golden.py with torch's own SDPA and nn.MultiheadAttention.
 * Every case listed below must exist (a missing or unreadable fixture fails its test), and
 * every parameter a manifest gives must be understood here (never skipped).
 * Runs with the working directory tests/ (tests/meson.build), so fixtures are golden/<case>/.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <cmocka.h>

#include "sdpa.h"

#define GOLDEN_DIR "golden"
#define GOLDEN_FORMAT "libsdpa-golden-1"
#define RTOL 1e-4
#define ATOL 1e-5
#define MAX_ARRAYS 24

static const char *const CASES[] = {
    "sdpa_bool_mask",
    "sdpa_causal",
    "mha_self_packed",
    "mha_cross_kdim_vdim_padding",
    "mha_bias_kv_zero_attn",
    "mha_per_head_float_mask",
    "mha_no_bias",
    "mha_seq_first",
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

typedef struct garray {
    char name[64];
    char role[16];
    char polarity[16];
    int is_u8;
    int rank;
    int64_t shape[8];
    int64_t n;
    float *f;
    uint8_t *u8;
} garray;

typedef struct gcase {
    cJSON *root;
    const cJSON *params;
    const char *op;
    double rtol, atol;
    int narrays;
    garray arrays[MAX_ARRAYS];
} gcase;

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n + 1);
            if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            }
            if (buf) {
                buf[n] = '\0';
                *size = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

static cJSON *read_json(const char *path) {
    size_t n = 0;
    char *text = read_file(path, &n);
    if (!text)
        fail_msg("cannot read %s (regenerate with /usr/bin/python3 tests/golden/make_torch_golden.py)", path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        fail_msg("%s is not valid JSON", path);
    return root;
}

static void free_case(gcase *c) {
    for (int i = 0; i < c->narrays; ++i) {
        free(c->arrays[i].f);
        free(c->arrays[i].u8);
    }
    cJSON_Delete(c->root);
}

static const char *jstr(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(it))
        fail_msg("manifest: '%s' missing or not a string", key);
    return it->valuestring;
}

static void load_case(const char *name, gcase *c) {
    char path[512];
    memset(c, 0, sizeof *c);
    snprintf(path, sizeof path, "%s/%s/manifest.json", GOLDEN_DIR, name);
    c->root = read_json(path);
    assert_string_equal(jstr(c->root, "format"), GOLDEN_FORMAT);
    assert_string_equal(jstr(c->root, "name"), name);
    c->op = jstr(c->root, "op");
    c->params = cJSON_GetObjectItemCaseSensitive(c->root, "params");
    assert_true(cJSON_IsObject(c->params));
    const cJSON *tol = cJSON_GetObjectItemCaseSensitive(c->root, "tolerance");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(tol, "rtol");
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(tol, "atol");
    assert_true(cJSON_IsNumber(rt) && cJSON_IsNumber(at));
    /* The manifest may not loosen the contract's tolerance. */
    assert_true(rt->valuedouble <= RTOL && at->valuedouble <= ATOL);
    c->rtol = rt->valuedouble;
    c->atol = at->valuedouble;

    const cJSON *arrays = cJSON_GetObjectItemCaseSensitive(c->root, "arrays");
    assert_true(cJSON_IsArray(arrays));
    const cJSON *a;
    cJSON_ArrayForEach(a, arrays) {
        assert_true(c->narrays < MAX_ARRAYS);
        garray *g = &c->arrays[c->narrays++];
        snprintf(g->name, sizeof g->name, "%s", jstr(a, "name"));
        snprintf(g->role, sizeof g->role, "%s", jstr(a, "role"));
        const cJSON *pol = cJSON_GetObjectItemCaseSensitive(a, "polarity");
        if (pol)
            snprintf(g->polarity, sizeof g->polarity, "%s", cJSON_IsString(pol) ? pol->valuestring : "?");
        const char *dtype = jstr(a, "dtype");
        if (strcmp(dtype, "float32") == 0)
            g->is_u8 = 0;
        else if (strcmp(dtype, "uint8") == 0)
            g->is_u8 = 1;
        else
            fail_msg("%s: array %s has unknown dtype %s", name, g->name, dtype);
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(a, "shape");
        assert_true(cJSON_IsArray(shape) && cJSON_GetArraySize(shape) <= 8);
        g->n = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, shape) {
            assert_true(cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < 1e6);
            g->shape[g->rank++] = (int64_t)d->valuedouble;
            g->n *= (int64_t)d->valuedouble;
        }
        snprintf(path, sizeof path, "%s/%s/%s", GOLDEN_DIR, name, jstr(a, "file"));
        size_t bytes = 0;
        char *blob = read_file(path, &bytes);
        if (!blob)
            fail_msg("cannot read %s", path);
        const size_t want = (size_t)g->n * (g->is_u8 ? 1 : 4);
        if (bytes != want) {
            free(blob);
            fail_msg("%s: %zu bytes, expected %zu for shape of %lld elements", path, bytes, want, (long long)g->n);
        }
        if (g->is_u8) {
            g->u8 = malloc(want + 1);
            assert_non_null(g->u8);
            memcpy(g->u8, blob, want);
        } else {
            g->f = malloc(want + 4);
            assert_non_null(g->f);
            for (int64_t i = 0; i < g->n; ++i) { /* little-endian on any host */
                const unsigned char *p = (const unsigned char *)blob + 4 * i;
                uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
                memcpy(&g->f[i], &u, 4);
            }
        }
        free(blob);
    }
}

static garray *find(gcase *c, const char *name) {
    for (int i = 0; i < c->narrays; ++i)
        if (strcmp(c->arrays[i].name, name) == 0)
            return &c->arrays[i];
    return NULL;
}

static garray *need(gcase *c, const char *name, const char *role) {
    garray *g = find(c, name);
    if (!g)
        fail_msg("fixture lacks array '%s'", name);
    assert_string_equal(g->role, role);
    return g;
}

static int pbool(const gcase *c, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->params, key);
    if (!cJSON_IsBool(it))
        fail_msg("params.%s missing or not a bool", key);
    return cJSON_IsTrue(it);
}

static int64_t pint(const gcase *c, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->params, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble))
        fail_msg("params.%s missing or not an integer", key);
    return (int64_t)it->valuedouble;
}

/* Every param key of the manifest must be one this test maps. */
static void known_params(const gcase *c, const char *const *keys, size_t nkeys) {
    const cJSON *it;
    cJSON_ArrayForEach(it, c->params) {
        size_t k = 0;
        while (k < nkeys && strcmp(keys[k], it->string) != 0)
            ++k;
        if (k == nkeys)
            fail_msg("params.%s is not understood by test_golden.c", it->string);
    }
}

static sdpa_tensor view(float *data, int rank, const int64_t *shape) {
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init(&t, data, rank, shape), SDPA_OK);
    return t;
}

static double compare(const char *cname, const char *what, const float *got, const garray *exp, double rtol,
                      double atol) {
    double max_abs = 0.0;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < exp->n; ++i) {
        double g = got[i], e = exp->f[i], d = fabs(g - e);
        if (!(d <= atol + rtol * fabs(e))) {
            if (first < 0)
                first = i;
            ++bad;
        }
        if (d > max_abs || d != d)
            max_abs = d;
    }
    print_message("  %-28s %-12s %4lld values, max |libsdpa - torch| = %.3g\n", cname, what, (long long)exp->n, max_abs);
    if (bad)
        fail_msg("%s %s: %lld of %lld values outside rtol=%g atol=%g; first [%lld]: got %.9g, torch %.9g", cname, what,
                 (long long)bad, (long long)exp->n, rtol, atol, (long long)first, (double)got[first],
                 (double)exp->f[first]);
    return max_abs;
}

/* ------------------------------------------------------------------ sdpa */

static void run_sdpa(const char *name, gcase *c) {
    static const char *const keys[] = {"layout", "is_causal", "scale", "dropout_p", "need_weights"};
    known_params(c, keys, sizeof keys / sizeof keys[0]);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(c->params, "layout")->valuestring, "BHLD");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c->params, "scale")));
    assert_true(pint(c, "dropout_p") == 0);
    assert_true(pbool(c, "need_weights"));
    garray *q = need(c, "query", "input"), *k = need(c, "key", "input"), *v = need(c, "value", "input");
    garray *eo = need(c, "out", "expected"), *ew = need(c, "attn_weights", "expected");
    garray *m = find(c, "attn_mask");
    assert_int_equal(q->rank, 4);
    float *out = malloc((size_t)eo->n * sizeof(float)), *w = malloc((size_t)ew->n * sizeof(float));
    assert_non_null(out);
    assert_non_null(w);
    sdpa_tensor tq = view(q->f, 4, q->shape), tk = view(k->f, 4, k->shape), tv = view(v->f, 4, v->shape);
    sdpa_tensor to = view(out, 4, eo->shape), tw = view(w, 4, ew->shape);
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.causal = pbool(c, "is_causal");
    sdpa_allow_mask am;
    if (m) {
        assert_string_equal(m->role, "input");
        assert_string_equal(m->polarity, "allow"); /* PyTorch SDPA bool: True = attend */
        assert_true(m->is_u8);
        assert_int_equal(sdpa_allow_mask_init(&am, m->u8, m->rank, m->shape), SDPA_OK);
        opt.allow_mask = &am;
    }
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &opt, &to, &tw, NULL);
    if (st != SDPA_OK)
        fail_msg("%s: sdpa_attention: %s: %s", name, sdpa_status_string(st), sdpa_last_error_message());
    compare(name, "out", out, eo, c->rtol, c->atol);
    compare(name, "attn_weights", w, ew, c->rtol, c->atol);
    free(out);
    free(w);
}

/* ------------------------------------------------------------------- mha */

static void run_mha(const char *name, gcase *c) {
    static const char *const keys[] = {"embed_dim", "num_heads", "kdim", "vdim", "bias", "add_bias_kv",
                                       "add_zero_attn", "batch_first", "self_attention", "dropout", "training",
                                       "need_weights", "average_attn_weights"};
    known_params(c, keys, sizeof keys / sizeof keys[0]);
    const int64_t E = pint(c, "embed_dim"), H = pint(c, "num_heads");
    const int64_t kdim = pint(c, "kdim"), vdim = pint(c, "vdim");
    const int bias = pbool(c, "bias"), bias_kv = pbool(c, "add_bias_kv"), zero_attn = pbool(c, "add_zero_attn");
    const int batch_first = pbool(c, "batch_first"), self_attn = pbool(c, "self_attention");
    const int average = pbool(c, "average_attn_weights");
    assert_false(pbool(c, "training")); /* eval mode: the module's dropout must not apply */
    assert_true(pbool(c, "need_weights"));

    garray *q = need(c, "query", "input");
    garray *k = self_attn ? q : need(c, "key", "input");
    garray *v = self_attn ? q : need(c, "value", "input");
    garray *eo = need(c, "out", "expected"), *ew = need(c, "attn_weights", "expected");
    assert_int_equal(q->rank, 3);
    /* batch_first=False buffers are [L, B, E]: the [B, L, E] view swaps the outer strides. */
    const int64_t B = batch_first ? q->shape[0] : q->shape[1], L = batch_first ? q->shape[1] : q->shape[0];
    const int64_t S = batch_first ? k->shape[1] : k->shape[0];
    sdpa_tensor tq, tk, tv, to, tw;
    const int64_t qs[3] = {B, L, E}, ks[3] = {B, S, kdim}, vs[3] = {B, S, vdim};
    float *out = malloc((size_t)eo->n * sizeof(float)), *w = malloc((size_t)ew->n * sizeof(float));
    assert_non_null(out);
    assert_non_null(w);
    memset(out, 0x7F, (size_t)eo->n * sizeof(float));
    memset(w, 0x7F, (size_t)ew->n * sizeof(float));
    tq = view(q->f, 3, qs);
    tk = view(k->f, 3, ks);
    tv = view(v->f, 3, vs);
    to = view(out, 3, qs);
    if (!batch_first) {
        tq.strides[0] = E; tq.strides[1] = B * E;
        tk.strides[0] = kdim; tk.strides[1] = B * kdim;
        tv.strides[0] = vdim; tv.strides[1] = B * vdim;
        to.strides[0] = E; to.strides[1] = B * E;
    }
    tw = view(w, ew->rank, ew->shape);

    /* Weights exactly as in the state_dict. */
    sdpa_mha_params p;
    sdpa_mha_params_init(&p);
    p.embed_dim = E;
    p.num_heads = H;
    p.kdim = kdim;
    p.vdim = vdim;
    sdpa_tensor t_in, t_q, t_k, t_v, t_ib, t_o, t_ob, t_bk, t_bv;
    garray *g;
    if ((g = find(c, "in_proj_weight")) != NULL) {
        t_in = view(g->f, g->rank, g->shape);
        p.in_proj_weight = &t_in;
    } else {
        g = need(c, "q_proj_weight", "param"); t_q = view(g->f, g->rank, g->shape); p.q_proj_weight = &t_q;
        g = need(c, "k_proj_weight", "param"); t_k = view(g->f, g->rank, g->shape); p.k_proj_weight = &t_k;
        g = need(c, "v_proj_weight", "param"); t_v = view(g->f, g->rank, g->shape); p.v_proj_weight = &t_v;
    }
    g = need(c, "out_proj.weight", "param");
    t_o = view(g->f, g->rank, g->shape);
    p.out_proj_weight = &t_o;
    if (bias) {
        g = need(c, "in_proj_bias", "param"); t_ib = view(g->f, g->rank, g->shape); p.in_proj_bias = &t_ib;
        g = need(c, "out_proj.bias", "param"); t_ob = view(g->f, g->rank, g->shape); p.out_proj_bias = &t_ob;
    } else {
        assert_null(find(c, "in_proj_bias"));
        assert_null(find(c, "out_proj.bias"));
    }
    if (bias_kv) {
        g = need(c, "bias_k", "param"); t_bk = view(g->f, g->rank, g->shape); p.bias_k = &t_bk;
        g = need(c, "bias_v", "param"); t_bv = view(g->f, g->rank, g->shape); p.bias_v = &t_bv;
    }
    p.add_zero_attn = zero_attn;

    sdpa_mha_options o;
    sdpa_mha_options_init(&o);
    o.per_head_weights = !average;
    o.dropout_p = (float)cJSON_GetObjectItemCaseSensitive(c->params, "dropout")->valuedouble; /* ignored: eval */
    o.dropout_seed = 1234;

    /* PyTorch's bool masks mean "ignore": convert to allow-masks. */
    uint8_t *kpm_allow = NULL, *am_allow = NULL;
    sdpa_allow_mask kpm, am;
    sdpa_tensor t_bias;
    if ((g = find(c, "key_padding_mask")) != NULL) {
        assert_string_equal(g->polarity, "ignore");
        assert_true(g->is_u8 && g->rank == 2);
        kpm_allow = malloc((size_t)g->n);
        assert_non_null(kpm_allow);
        assert_int_equal(sdpa_mask_from_ignore(g->u8, g->n, kpm_allow), SDPA_OK);
        assert_int_equal(sdpa_allow_mask_init(&kpm, kpm_allow, 2, g->shape), SDPA_OK);
        o.key_padding_mask = &kpm;
    }
    if ((g = find(c, "attn_mask")) != NULL) {
        /* [L, S] as is; PyTorch's [B*H, L, S] is [B, H, L, S]. */
        int64_t shape4[4] = {B, H, g->shape[g->rank - 2], g->shape[g->rank - 1]};
        const int rank = g->rank == 3 ? 4 : g->rank;
        const int64_t *shape = g->rank == 3 ? shape4 : g->shape;
        assert_true(g->rank == 2 || (g->rank == 3 && g->shape[0] == B * H));
        if (strcmp(g->polarity, "ignore") == 0) {
            assert_true(g->is_u8);
            am_allow = malloc((size_t)g->n);
            assert_non_null(am_allow);
            assert_int_equal(sdpa_mask_from_ignore(g->u8, g->n, am_allow), SDPA_OK);
            assert_int_equal(sdpa_allow_mask_init(&am, am_allow, rank, shape), SDPA_OK);
            o.attn_mask = &am;
        } else {
            assert_string_equal(g->polarity, "additive");
            assert_false(g->is_u8);
            t_bias = view(g->f, rank, shape);
            o.attn_bias = &t_bias;
        }
    }

    /* Once with an internal workspace, once with a caller workspace: same bits. */
    sdpa_status st = sdpa_mha_forward(&p, &tq, &tk, &tv, &o, &to, &tw);
    if (st != SDPA_OK)
        fail_msg("%s: sdpa_mha_forward: %s: %s", name, sdpa_status_string(st), sdpa_last_error_message());
    compare(name, "out", out, eo, c->rtol, c->atol);
    compare(name, "attn_weights", w, ew, c->rtol, c->atol);

    size_t ws_bytes = 0;
    assert_int_equal(sdpa_mha_workspace_size(&p, &tq, &tk, &tv, &o, 1, &ws_bytes), SDPA_OK);
    void *ws = malloc(ws_bytes);
    float *out2 = malloc((size_t)eo->n * sizeof(float)), *w2 = malloc((size_t)ew->n * sizeof(float));
    assert_non_null(ws);
    assert_non_null(out2);
    assert_non_null(w2);
    sdpa_tensor to2 = to, tw2 = tw;
    to2.data = out2;
    tw2.data = w2;
    o.workspace = ws;
    o.workspace_bytes = ws_bytes;
    st = sdpa_mha_forward(&p, &tq, &tk, &tv, &o, &to2, &tw2);
    if (st != SDPA_OK)
        fail_msg("%s: sdpa_mha_forward (caller workspace): %s: %s", name, sdpa_status_string(st), sdpa_last_error_message());
    assert_memory_equal(out, out2, (size_t)eo->n * sizeof(float));
    assert_memory_equal(w, w2, (size_t)ew->n * sizeof(float));
    free(ws);
    free(out2);
    free(w2);
    free(kpm_allow);
    free(am_allow);
    free(out);
    free(w);
}

static void golden_case(void **state) {
    const char *name = (const char *)*state;
    gcase c;
    load_case(name, &c);
    if (strcmp(c.op, "sdpa") == 0)
        run_sdpa(name, &c);
    else if (strcmp(c.op, "mha") == 0)
        run_mha(name, &c);
    else
        fail_msg("%s: unknown op %s", name, c.op);
    free_case(&c);
}

/* index.json (read by the Python tests too) lists exactly the cases above. */
static void golden_index_lists_every_case(void **state) {
    (void)state;
    cJSON *root = read_json(GOLDEN_DIR "/index.json");
    assert_string_equal(jstr(root, "format"), GOLDEN_FORMAT);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    assert_true(cJSON_IsArray(cases));
    assert_int_equal(cJSON_GetArraySize(cases), N_CASES);
    for (size_t i = 0; i < N_CASES; ++i) {
        int found = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, cases)
            found |= cJSON_IsString(it) && strcmp(it->valuestring, CASES[i]) == 0;
        if (!found)
            fail_msg("golden/index.json does not list %s", CASES[i]);
    }
    cJSON_Delete(root);
}

int main(void) {
    struct CMUnitTest tests[N_CASES + 1];
    for (size_t i = 0; i < N_CASES; ++i) {
        struct CMUnitTest t = {CASES[i], golden_case, NULL, NULL, (void *)CASES[i]};
        tests[i] = t;
    }
    struct CMUnitTest idx = {"golden_index_lists_every_case", golden_index_lists_every_case, NULL, NULL, NULL};
    tests[N_CASES] = idx;
    return _cmocka_run_group_tests("golden", tests, N_CASES + 1, NULL, NULL);
}
