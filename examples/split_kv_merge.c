/*
 * Attention over a KV cache split in two parts, merged with sdpa_merge().
 *
 * Chunked prefill: a cache already holds P = 6 tokens (the "cached prefix"), and a chunk of
 * N = 4 new tokens arrives. Each new token attends causally over everything before it.
 * Instead of one call over all P + N keys, we
 *   1. attend the new queries over the prefix keys only (every prefix key lies before every
 *      new token, so no causal rule is needed there),
 *   2. attend them over the new keys only, causally (query i sees new keys j <= i),
 *   3. merge the two partial results with their log-sum-exp (lse) values.
 * The two parts could live on two devices, or the prefix part could be computed while the
 * new keys are still being projected: only out and lse of each part are needed to merge.
 *
 * The result must equal one causal call over the whole cache (bottom-right alignment: the
 * last query sees every key). Prints the largest difference; exits 1 if above 1e-5.
 *
 * The same works for any split point: give each part SDPA_ALIGN_OFFSETS with
 * query_offsets[b] = (position of query row 0 among all keys) - (index of the part's first key).
 */
#include <math.h>
#include <string.h>

#include "common.h"

enum { B = 1, HQ = 4, HKV = 2, P = 6, N = 4, T = P + N, E = 8, EV = 8 };

static float next_value(uint32_t *state) /* deterministic, in [-1, 1) */
{
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
}

int main(void)
{
    /* Queries of the N new tokens (GQA: 4 query heads share 2 kv heads); the cache of T tokens. */
    static float q[B * HQ * N * E], k_cache[B * HKV * T * E], v_cache[B * HKV * T * EV];
    /* Partial results: out [B, HQ, N, EV] and lse [B, HQ, N] of each part, and the merge. */
    static float out_prefix[B * HQ * N * EV], lse_prefix[B * HQ * N];
    static float out_new[B * HQ * N * EV], lse_new[B * HQ * N];
    static float out_merged[B * HQ * N * EV], lse_merged[B * HQ * N];
    static float out_full[B * HQ * N * EV], lse_full[B * HQ * N];
    uint32_t seed = 2024u;

    check_library_version();
    for (int i = 0; i < B * HQ * N * E; i++) q[i] = next_value(&seed);
    for (int i = 0; i < B * HKV * T * E; i++) k_cache[i] = next_value(&seed);
    for (int i = 0; i < B * HKV * T * EV; i++) v_cache[i] = 2.0f * next_value(&seed);

    sdpa_tensor tq, l_prefix, l_new, l_merged, l_full; /* l_*: lse views [B, HQ, N] */
    const int64_t lse_shape[3] = {B, HQ, N};
    CHECK(sdpa_tensor_init_4d(&tq, q, B, HQ, N, E));
    CHECK(sdpa_tensor_init(&l_prefix, lse_prefix, 3, lse_shape));
    CHECK(sdpa_tensor_init(&l_new, lse_new, 3, lse_shape));
    CHECK(sdpa_tensor_init(&l_merged, lse_merged, 3, lse_shape));
    CHECK(sdpa_tensor_init(&l_full, lse_full, 3, lse_shape));

    /* Views of the two parts of the cache: rows [0, P) and [P, T), no copy. The strides are
     * the cache's, [B, HKV, T, E] row-major. */
    sdpa_tensor k_prefix = view4(k_cache, B, HKV, P, E, HKV * T * E, T * E, E, 1);
    sdpa_tensor v_prefix = view4(v_cache, B, HKV, P, EV, HKV * T * EV, T * EV, EV, 1);
    sdpa_tensor k_new = view4(k_cache + P * E, B, HKV, N, E, HKV * T * E, T * E, E, 1);
    sdpa_tensor v_new = view4(v_cache + P * EV, B, HKV, N, EV, HKV * T * EV, T * EV, EV, 1);
    sdpa_tensor k_all = view4(k_cache, B, HKV, T, E, HKV * T * E, T * E, E, 1);
    sdpa_tensor v_all = view4(v_cache, B, HKV, T, EV, HKV * T * EV, T * EV, EV, 1);
    sdpa_tensor o_prefix, o_new, o_merged, o_full;
    CHECK(sdpa_tensor_init_4d(&o_prefix, out_prefix, B, HQ, N, EV));
    CHECK(sdpa_tensor_init_4d(&o_new, out_new, B, HQ, N, EV));
    CHECK(sdpa_tensor_init_4d(&o_merged, out_merged, B, HQ, N, EV));
    CHECK(sdpa_tensor_init_4d(&o_full, out_full, B, HQ, N, EV));

    sdpa_options options;

    /* 1. New queries over the prefix: every key is visible. lse is what the merge needs. */
    sdpa_options_init(&options);
    CHECK(sdpa_attention(&tq, &k_prefix, &v_prefix, &options, &o_prefix, NULL, &l_prefix));

    /* 2. New queries over the new keys: causal, query i sees new keys j <= i (L = S = N). */
    sdpa_options_init(&options);
    options.causal = 1;
    CHECK(sdpa_attention(&tq, &k_new, &v_new, &options, &o_new, NULL, &l_new));

    /* 3. Merge: out = (e^lse_p * out_p + e^lse_n * out_n) / (e^lse_p + e^lse_n), in double.
     *    A part whose lse is -inf (no key there) contributes nothing. sdpa_merge may also
     *    write in place: passing &o_prefix, &l_prefix as the outputs is allowed. */
    CHECK(sdpa_merge(&o_prefix, &l_prefix, &o_new, &l_new, &o_merged, &l_merged));

    /* The check: one causal call over the whole cache, bottom-right aligned (query i is the
     * token at position P + i and sees keys j <= P + i). */
    sdpa_options_init(&options);
    options.causal = 1;
    options.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    CHECK(sdpa_attention(&tq, &k_all, &v_all, &options, &o_full, NULL, &l_full));

    float max_out = 0.0f, max_lse = 0.0f;
    for (int i = 0; i < B * HQ * N * EV; i++) {
        float d = fabsf(out_merged[i] - out_full[i]);
        if (!(d <= max_out)) /* NaN counts as infinitely wrong */
            max_out = isnan(d) ? INFINITY : d;
    }
    for (int i = 0; i < B * HQ * N; i++) {
        float d = fabsf(lse_merged[i] - lse_full[i]);
        if (!(d <= max_lse))
            max_lse = isnan(d) ? INFINITY : d;
    }
    printf("cache of %d tokens = %d cached + %d new; %d query heads over %d kv heads\n", T, P, N, HQ, HKV);
    printf("head 0, last token: merged [%.6f, %.6f, ...]  full [%.6f, %.6f, ...]\n",
           (double)out_merged[(N - 1) * EV], (double)out_merged[(N - 1) * EV + 1], (double)out_full[(N - 1) * EV],
           (double)out_full[(N - 1) * EV + 1]);
    printf("max |merged - full| = %g (out), %g (lse)\n", (double)max_out, (double)max_lse);
    if (!(max_out <= 1e-5f) || !(max_lse <= 1e-5f)) {
        fprintf(stderr, "split_kv_merge: the merged result differs from one full call by more than 1e-5\n");
        return EXIT_FAILURE;
    }
    printf("split_kv_merge: OK\n");
    return EXIT_SUCCESS;
}
