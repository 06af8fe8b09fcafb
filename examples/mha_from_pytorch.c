/*
 * mha_from_pytorch: run a torch.nn.MultiheadAttention layer exported from PyTorch with
 * sdpa_mha_forward() and check the result against PyTorch's own output.
 *
 *   mha_from_pytorch [FIXTURE_DIR]     (default tests/golden/mha_cross_kdim_vdim_padding)
 *
 * Without an argument the fixture is looked up relative to the repository root (where
 * `./build/examples/mha_from_pytorch` is run from, and where meson test runs it), then
 * relative to examples/ (../tests/golden/...).
 *
 * A fixture directory (tests/golden/README.md) holds manifest.json and one raw little-endian
 * float32 (or uint8 mask) file per array, named after the module's state_dict keys:
 * in_proj_weight or q/k/v_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias, plus the
 * inputs (query, key, value, key_padding_mask) and PyTorch's results (out, attn_weights).
 * This program handles the usual layer: packed or separate projection weights, with or
 * without biases, batch_first True or False, an optional key_padding_mask, head-averaged
 * weights (mha_self_packed, mha_cross_kdim_vdim_padding, mha_no_bias, mha_seq_first).
 * Exit status: 0 = matches PyTorch within rtol 1e-4 / atol 1e-5, 1 = does not, 2 = error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sdpa.h>

/* ---- a deliberately tiny reader for the manifest: not a general JSON parser ---- */

static char manifest[1 << 16];

/* Integer or bool value of "key" in the manifest's params (bools read as 0/1). */
static long param(const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(manifest, pat);
    if (!p) { fprintf(stderr, "manifest has no %s\n", key); exit(2); }
    p += strlen(pat);
    while (*p == ' ') p++;
    if (strncmp(p, "true", 4) == 0) return 1;
    if (strncmp(p, "false", 5) == 0) return 0;
    return strtol(p, NULL, 10);
}

/* Shape of the array called `name`; returns its rank, or 0 if the fixture has no such array. */
static int shape_of(const char *name, int64_t shape[4]) {
    char pat[96];
    snprintf(pat, sizeof pat, "\"name\": \"%s\"", name);
    const char *p = strstr(manifest, pat);
    if (!p) return 0;
    p = strchr(strstr(p, "\"shape\":"), '[') + 1; /* the writer puts "shape" after "name" */
    int rank = 0;
    while (*p != ']' && rank < 4) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) { p++; continue; } /* skip ',', spaces, newlines */
        shape[rank++] = v;
        p = end;
    }
    return rank;
}

/* Every buffer this program allocates, freed at the end. */
static void *allocated[32];
static int n_allocated;

static void *alloc(size_t bytes) {
    void *p = malloc(bytes);
    if (!p || n_allocated == 32) { fprintf(stderr, "out of memory\n"); exit(2); }
    return allocated[n_allocated++] = p;
}

/* Read <dir>/<name>.bin (the generator names each file after its array) into a new buffer. */
static void *load(const char *dir, const char *name, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "rb");
    void *buf = alloc(bytes + 1);
    if (!f || fread(buf, 1, bytes + 1, f) != bytes) { /* exactly `bytes` long */
        fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
        exit(2);
    }
    fclose(f);
    return buf; /* float32 files are little-endian: this assumes a little-endian host */
}

/* A contiguous view of array `name`, loaded from the fixture; data NULL if it is absent. */
static sdpa_tensor tensor(const char *dir, const char *name) {
    sdpa_tensor t;
    int64_t shape[4];
    int rank = shape_of(name, shape);
    size_t n = 1;
    for (int d = 0; d < rank; d++) n *= (size_t)shape[d];
    memset(&t, 0, sizeof t);
    if (rank > 0 && sdpa_tensor_init(&t, load(dir, name, n * sizeof(float)), rank, shape) != SDPA_OK) exit(2);
    return t;
}

static double max_diff(const float *got, const float *want, int64_t n, int *bad) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= 1e-5 + 1e-4 * fabs((double)want[i]))) *bad = 1;
        if (d > m || d != d) m = d;
    }
    return m;
}

#define TRY(call) do { sdpa_status s_ = (call); if (s_ != SDPA_OK) { \
    fprintf(stderr, "%s: %s\n", sdpa_status_string(s_), sdpa_last_error_message()); return 2; } } while (0)

int main(int argc, char **argv) {
    static const char *const defaults[] = {"tests/golden/mha_cross_kdim_vdim_padding",
                                           "../tests/golden/mha_cross_kdim_vdim_padding"};
    const char *dir = argc > 1 ? argv[1] : defaults[0];
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f && argc <= 1) { /* run from examples/ */
        dir = defaults[1];
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        f = fopen(path, "rb");
    }
    size_t len = f ? fread(manifest, 1, sizeof manifest - 1, f) : 0;
    if (!f || len == 0) { fprintf(stderr, "cannot read %s\n", path); return 2; }
    fclose(f);
    if (!strstr(manifest, "\"op\": \"mha\"") || param("add_bias_kv") || param("add_zero_attn") ||
        shape_of("attn_mask", (int64_t[4]){0}) || !param("average_attn_weights")) {
        fprintf(stderr, "%s: this example handles plain MHA fixtures only (see its header)\n", dir);
        return 2;
    }
    const int64_t E = param("embed_dim"), H = param("num_heads");
    const int64_t kdim = param("kdim"), vdim = param("vdim");
    const int self = param("self_attention"), batch_first = param("batch_first");

    /* 1. The layer: state_dict tensors as PyTorch stores them ([out, in], y = x W^T + b). */
    sdpa_tensor in_w = tensor(dir, "in_proj_weight"), q_w = tensor(dir, "q_proj_weight");
    sdpa_tensor k_w = tensor(dir, "k_proj_weight"), v_w = tensor(dir, "v_proj_weight");
    sdpa_tensor in_b = tensor(dir, "in_proj_bias"), out_w = tensor(dir, "out_proj.weight");
    sdpa_tensor out_b = tensor(dir, "out_proj.bias");
    sdpa_mha_params params;
    sdpa_mha_params_init(&params);
    params.embed_dim = E;
    params.num_heads = H; /* head width E / H, scale 1/sqrt(E / H), as PyTorch */
    params.kdim = kdim;
    params.vdim = vdim;
    if (in_w.data) {
        params.in_proj_weight = &in_w; /* packed [3E, E]: rows q, k, v */
    } else {
        params.q_proj_weight = &q_w;   /* kdim/vdim != E: PyTorch keeps three matrices */
        params.k_proj_weight = &k_w;
        params.v_proj_weight = &v_w;
    }
    params.in_proj_bias = in_b.data ? &in_b : NULL;   /* NULL = bias=False */
    params.out_proj_weight = &out_w;
    params.out_proj_bias = out_b.data ? &out_b : NULL;

    /* 2. Inputs. batch_first=False buffers are [L, B, E]: view them as [B, L, E] by swapping
     *    the two outer strides; no copy. Self-attention passes the same view three times. */
    sdpa_tensor query = tensor(dir, "query");
    sdpa_tensor key = self ? query : tensor(dir, "key"), value = self ? query : tensor(dir, "value");
    sdpa_tensor *inputs[3] = {&query, &key, &value};
    for (int i = 0; i < (self ? 1 : 3) && !batch_first; i++) {
        sdpa_tensor *t = inputs[i];
        int64_t n0 = t->shape[0], s0 = t->strides[0];
        t->shape[0] = t->shape[1]; t->strides[0] = t->strides[1];
        t->shape[1] = n0;          t->strides[1] = s0;
    }
    if (self) key = value = query;
    const int64_t B = query.shape[0], L = query.shape[1], S = key.shape[1];

    /* 3. Options. PyTorch's bool key_padding_mask means True = IGNORE; libsdpa takes
     *    allow-masks (nonzero = attend), so convert it. */
    sdpa_mha_options opt;
    sdpa_mha_options_init(&opt);  /* eval mode: training = 0, no dropout */
    sdpa_allow_mask kpm;
    int64_t kpm_shape[4];
    if (shape_of("key_padding_mask", kpm_shape) == 2) {
        uint8_t *mask = load(dir, "key_padding_mask", (size_t)(B * S));
        TRY(sdpa_mask_from_ignore(mask, B * S, mask)); /* in place */
        TRY(sdpa_allow_mask_init(&kpm, mask, 2, kpm_shape));
        opt.key_padding_mask = &kpm;
    }

    /* 4. Outputs: out in the layout of query ([L, B, E] when batch_first=False), and the
     *    attention weights averaged over heads, [B, L, S] (need_weights=True). */
    float *out = alloc((size_t)(B * L * E) * sizeof(float));
    float *weights = alloc((size_t)(B * L * S) * sizeof(float));
    sdpa_tensor out_view = query, w_view;
    out_view.data = out;
    TRY(sdpa_tensor_init_3d(&w_view, weights, B, L, S));

    TRY(sdpa_mha_forward(&params, &query, &key, &value, &opt, &out_view, &w_view));

    /* 5. Compare with what PyTorch computed. */
    sdpa_tensor want_out = tensor(dir, "out"), want_w = tensor(dir, "attn_weights");
    int bad = 0;
    double d_out = max_diff(out, want_out.data, B * L * E, &bad);
    double d_w = max_diff(weights, want_w.data, B * L * S, &bad);
    printf("libsdpa %s, kernel \"%s\": %s\n", sdpa_version_string(), sdpa_last_kernel(), dir);
    printf("max |libsdpa - torch|: out %.3g, attn_weights %.3g (tolerance 1e-5 + 1e-4*|torch|)\n", d_out, d_w);
    printf("mha_from_pytorch: %s\n", bad ? "MISMATCH" : "OK");
    while (n_allocated > 0) free(allocated[--n_allocated]);
    return bad;
}
