/*
 * A serving engine's decode loop on a paged KV cache: one attention call per layer per step.
 *
 * A small decoder (random weights, 4 layers, GQA with 8 query heads over 2 KV heads, E = 64,
 * no positional encoding) serves 3 prompts of different lengths:
 *   - prefill: the 3 prompts in ONE packed call per layer (cu_seqlens_q; causal is
 *     bottom-right per sequence), their K/V written into the paged cache with sdpa_kv_write;
 *   - decode: 32 steps; each step one new token per sequence, K/V appended with sdpa_kv_write
 *     (slot = block * block_size + offset, vLLM's slot_mapping), then ONE call per layer
 *     over the 3 sequences (cu_seqlens_q = {0, 1, 2, 3}, key_lengths, block_table).
 * The cache is a block pool in vLLM's layout [num_blocks, block_size, Hkv, E] (a strided
 * view [num_blocks, Hkv, block_size, E]) with block size 16; blocks are handed out from a
 * shuffled free list, so a sequence's blocks are scattered through the pool.
 *
 * Every attention output of every layer and step is checked against a dense float64
 * recomputation over that sequence's keys (kept separately, unrounded, in float32).
 * The cache dtype is CACHE_DTYPE (bf16). If this libsdpa cannot compute attention over a
 * bf16 cache (SDPA_ERR_DTYPE), the example says so and runs the same loop with float32.
 * Exits 1 if any output is off by more than the tolerance of the cache dtype.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

#define CACHE_DTYPE SDPA_DTYPE_BF16

enum { LAYERS = 4, HQ = 8, HKV = 2, E = 64, D = HQ * E, BS = 16, NSEQ = 3, STEPS = 32, MAXB = 8, NB = NSEQ * MAXB + 4 };
enum { MAXT = MAXB * BS };
static const int PROMPT[NSEQ] = {5, 17, 40};

static uint32_t g_seed = 2024u;
static float rnd(void) /* deterministic, in [-1, 1) */
{
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) / (float)(1u << 23) - 1.0f;
}

/* Weights of one layer: wq [D, HQ*E], wk, wv [D, HKV*E], wo [HQ*E, D], row-major. */
static float g_wq[LAYERS][D * D], g_wk[LAYERS][D * HKV * E], g_wv[LAYERS][D * HKV * E], g_wo[LAYERS][D * D];
/* The paged pools (bytes for float32 or 16-bit elements) and the dense float32 history. */
static float g_kpool[LAYERS][NB * BS * HKV * E], g_vpool[LAYERS][NB * BS * HKV * E];
static float g_kd[LAYERS][NSEQ][MAXT][HKV * E], g_vd[LAYERS][NSEQ][MAXT][HKV * E];

static void matvec(const float *x, const float *w, int n_in, int n_out, float *y) /* y = x W */
{
    for (int o = 0; o < n_out; o++)
        y[o] = 0.0f;
    for (int i = 0; i < n_in; i++)
        for (int o = 0; o < n_out; o++)
            y[o] += x[i] * w[i * n_out + o];
}

/* The float64 attention of one query row (head h) of sequence r over its first n keys,
 * causal bottom-right (the row is at position n - 1 - (rows after it)). */
static void dense_row(int layer, int r, int h, const float *q, int n_keys, double *out)
{
    const int g = h / (HQ / HKV);
    double s[MAXT], m = -INFINITY, z = 0.0;
    for (int j = 0; j < n_keys; j++) {
        double d = 0.0;
        for (int e = 0; e < E; e++)
            d += (double)q[e] * (double)g_kd[layer][r][j][g * E + e];
        s[j] = d / sqrt((double)E);
        m = s[j] > m ? s[j] : m;
    }
    for (int e = 0; e < E; e++)
        out[e] = 0.0;
    for (int j = 0; j < n_keys; j++) {
        const double w = exp(s[j] - m);
        z += w;
        for (int e = 0; e < E; e++)
            out[e] += w * (double)g_vd[layer][r][j][g * E + e];
    }
    for (int e = 0; e < E; e++)
        out[e] /= z;
}

/* One full run with the given cache dtype: prefill then STEPS decode steps. Returns SDPA_OK,
 * SDPA_ERR_DTYPE (this library cannot attend over that cache dtype: nothing checked), or
 * exits on a failed check. *max_err receives the largest difference against float64. */
static sdpa_status run(sdpa_dtype cache_dtype, double *max_err)
{
    const double tol = cache_dtype == SDPA_DTYPE_F32 ? 1e-4 : 2e-2;
    int32_t table[NSEQ][MAXB], free_list[NB];
    int64_t len[NSEQ] = {0, 0, 0};
    int nfree = NB;
    /* Tokens of this step: at most the prefill's sum. */
    enum { TMAX = 5 + 17 + 40 };
    static float x[TMAX][D], q[TMAX][D], k[TMAX][HKV * E], v[TMAX][HKV * E], att[TMAX][D], y[D];
    int64_t slots[TMAX];
    int32_t cu[NSEQ + 1];
    int seq_of[TMAX], pos_of[TMAX];

    *max_err = 0.0;
    for (int b = 0; b < NB; b++)
        free_list[b] = b;
    for (int b = NB - 1; b > 0; b--) { /* shuffle: blocks scattered through the pool */
        const int u = (int)((rnd() + 1.0f) * 0.5f * (float)(b + 1)) % (b + 1);
        const int t = free_list[b];
        free_list[b] = free_list[u];
        free_list[u] = t;
    }
    for (int r = 0; r < NSEQ; r++)
        for (int c = 0; c < MAXB; c++)
            table[r][c] = -1; /* unallocated: never read */

    /* Cache views: vLLM's [NB, BS, HKV, E] storage seen as [NB, HKV, BS, E]. */
    const int64_t cshape[4] = {NB, HKV, BS, E}, cstr[4] = {BS * HKV * E, E, HKV * E, 1};

    for (int step = 0; step <= STEPS; step++) {
        /* The tokens of this step: the prompts (step 0) or one new token per sequence. */
        int T = 0;
        cu[0] = 0;
        for (int r = 0; r < NSEQ; r++) {
            const int n = step == 0 ? PROMPT[r] : 1;
            for (int t = 0; t < n; t++) {
                seq_of[T] = r;
                pos_of[T] = (int)len[r] + t;
                for (int d = 0; d < D; d++)
                    x[T][d] = rnd(); /* the token's embedding */
                T++;
            }
            cu[r + 1] = T;
        }
        /* Allocate blocks as the sequences grow; slot of each new token. */
        for (int t = 0; t < T; t++) {
            const int r = seq_of[t], p = pos_of[t];
            if (p % BS == 0)
                table[r][p / BS] = free_list[--nfree];
            slots[t] = (int64_t)table[r][p / BS] * BS + p % BS;
        }
        for (int r = 0; r < NSEQ; r++)
            len[r] += cu[r + 1] - cu[r];

        for (int l = 0; l < LAYERS; l++) {
            for (int t = 0; t < T; t++) {
                matvec(x[t], g_wq[l], D, D, q[t]);
                matvec(x[t], g_wk[l], D, HKV * E, k[t]);
                matvec(x[t], g_wv[l], D, HKV * E, v[t]);
                memcpy(g_kd[l][seq_of[t]][pos_of[t]], k[t], sizeof k[t]);
                memcpy(g_vd[l][seq_of[t]][pos_of[t]], v[t], sizeof v[t]);
            }
            sdpa_tensor kc, vc, kr, vr, tq, tout;
            const int64_t rshape[3] = {T, HKV, E};
            CHECK(sdpa_tensor_init_strided(&kc, g_kpool[l], cache_dtype, 4, cshape, cstr));
            CHECK(sdpa_tensor_init_strided(&vc, g_vpool[l], cache_dtype, 4, cshape, cstr));
            CHECK(sdpa_tensor_init_dtype(&kr, k, SDPA_DTYPE_F32, 3, rshape));
            CHECK(sdpa_tensor_init_dtype(&vr, v, SDPA_DTYPE_F32, 3, rshape));
            CHECK(sdpa_kv_write(&kc, &vc, &kr, &vr, slots)); /* rounds to the cache dtype */

            /* q and out as FlashAttention's [total, HQ, E]: views [1, HQ, T, E]. */
            const int64_t qshape[4] = {1, HQ, T, E}, qstr[4] = {0, E, D, 1};
            CHECK(sdpa_tensor_init_strided(&tq, q, SDPA_DTYPE_F32, 4, qshape, qstr));
            CHECK(sdpa_tensor_init_strided(&tout, att, SDPA_DTYPE_F32, 4, qshape, qstr));
            sdpa_options o;
            sdpa_options_init(&o);
            o.causal = 1; /* bottom-right per sequence */
            o.cu_seqlens_q = cu;
            o.num_seqs = NSEQ;
            o.block_table = &table[0][0];
            o.max_blocks_per_seq = MAXB;
            o.key_lengths = len;
            const sdpa_status st = sdpa_attention(&tq, &kc, &vc, &o, &tout, NULL, NULL);
            if (st == SDPA_ERR_DTYPE && cache_dtype != SDPA_DTYPE_F32)
                return st;
            CHECK(st);

            /* Check every row against the dense float64 recomputation. */
            for (int t = 0; t < T; t++)
                for (int h = 0; h < HQ; h++) {
                    double ref[E];
                    dense_row(l, seq_of[t], h, &q[t][h * E], pos_of[t] + 1, ref);
                    for (int e = 0; e < E; e++) {
                        const double err = fabs(ref[e] - (double)att[t][h * E + e]);
                        *max_err = err > *max_err ? err : *max_err;
                        if (!(err <= tol)) {
                            fprintf(stderr, "step %d layer %d seq %d pos %d head %d: %.7g, dense %.7g\n", step, l,
                                    seq_of[t], pos_of[t], h, (double)att[t][h * E + e], ref[e]);
                            exit(EXIT_FAILURE);
                        }
                    }
                }
            /* Residual update: x += 0.1 * att Wo (keeps activations bounded). */
            for (int t = 0; t < T; t++) {
                matvec(att[t], g_wo[l], D, D, y);
                for (int d = 0; d < D; d++)
                    x[t][d] += 0.1f * y[d];
            }
        }
    }
    return SDPA_OK;
}

int main(void)
{
    check_library_version();
    const float ws = 1.0f / sqrtf((float)D);
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < D * D; i++) g_wq[l][i] = rnd() * ws;
        for (int i = 0; i < D * HKV * E; i++) g_wk[l][i] = rnd() * ws;
        for (int i = 0; i < D * HKV * E; i++) g_wv[l][i] = rnd() * ws;
        for (int i = 0; i < D * D; i++) g_wo[l][i] = rnd() * ws;
    }
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < NB * BS * HKV * E; i++)
            g_kpool[l][i] = g_vpool[l][i] = NAN; /* unused slots and blocks: never read */
    double err = 0.0;
    sdpa_dtype dt = CACHE_DTYPE;
    const uint32_t seed = g_seed;
    sdpa_status st = run(dt, &err);
    if (st == SDPA_ERR_DTYPE) {
        printf("bf16 cache not run: this libsdpa answers SDPA_ERR_DTYPE for attention over a bf16 cache; running the float32 cache\n");
        dt = SDPA_DTYPE_F32;
        g_seed = seed;
        st = run(dt, &err);
    }
    CHECK(st);
    printf("paged decode: %d prompts (%d, %d, %d tokens) + %d steps x %d layers, %s cache: max |out - dense float64| = %.3g (kernel %s)\n",
           NSEQ, PROMPT[0], PROMPT[1], PROMPT[2], STEPS, LAYERS, sdpa_dtype_name(dt), err, sdpa_last_kernel());
    return 0;
}
