/*
 * Token-by-token decoding against a growing KV cache, checked against one full causal pass.
 *
 * The cache is allocated once for T_MAX positions, [B, H, T_MAX, E] (and Ev for values). At
 * step t the new token's key and value are appended at row t, and the single query row
 * (L = 1) attends over a strided view of the first t + 1 cache rows: no copy, the view's
 * head stride is still T_MAX * E. Causal with SDPA_ALIGN_BOTTOM_RIGHT places the query at
 * the last key (p = i + S - L), as a decoder step needs.
 *
 * Decoding all T tokens must equal one causal pass over the whole sequence (top-left,
 * L = S = T). Prints the largest difference; exits 1 if it is above 1e-5.
 */
#include <math.h>
#include <string.h>

#include "common.h"

enum { B = 1, H = 2, T = 6, T_MAX = 8, E = 4, EV = 3 };

static float next_value(uint32_t *state) /* deterministic, in [-1, 1) */
{
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 23) - 1.0f;
}

int main(void)
{
    /* The sequence's projections, as a model would produce them one token at a time. */
    float q_seq[B * H * T * E], k_seq[B * H * T * E], v_seq[B * H * T * EV];
    /* The cache, sized for T_MAX; rows not yet written hold NaN and are never read. */
    float k_cache[B * H * T_MAX * E], v_cache[B * H * T_MAX * EV];
    float out_decode[B * H * T * EV], out_full[B * H * T * EV];
    uint32_t seed = 12345u;

    check_library_version();
    for (int i = 0; i < B * H * T * E; i++) q_seq[i] = next_value(&seed);
    for (int i = 0; i < B * H * T * E; i++) k_seq[i] = next_value(&seed);
    for (int i = 0; i < B * H * T * EV; i++) v_seq[i] = next_value(&seed);
    for (int i = 0; i < B * H * T_MAX * E; i++) k_cache[i] = NAN;
    for (int i = 0; i < B * H * T_MAX * EV; i++) v_cache[i] = NAN;

    sdpa_options options;
    sdpa_options_init(&options);
    options.causal = 1;
    options.alignment = SDPA_ALIGN_BOTTOM_RIGHT; /* the one query row is the newest token */

    for (int t = 0; t < T; t++) {
        /* Append token t's key and value to the cache (row t of every head). */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                memcpy(&k_cache[((b * H + h) * T_MAX + t) * E], &k_seq[((b * H + h) * T + t) * E],
                       E * sizeof(float));
                memcpy(&v_cache[((b * H + h) * T_MAX + t) * EV],
                       &v_seq[((b * H + h) * T + t) * EV], EV * sizeof(float));
            }
        /* q, out: row t of [B, H, T, *]; k, v: the first t + 1 rows of the cache. */
        sdpa_tensor q = view4(&q_seq[t * E], B, H, 1, E, H * T * E, T * E, E, 1);
        sdpa_tensor k = view4(k_cache, B, H, t + 1, E, H * T_MAX * E, T_MAX * E, E, 1);
        sdpa_tensor v = view4(v_cache, B, H, t + 1, EV, H * T_MAX * EV, T_MAX * EV, EV, 1);
        sdpa_tensor out = view4(&out_decode[t * EV], B, H, 1, EV, H * T * EV, T * EV, EV, 1);
        CHECK(sdpa_attention(&q, &k, &v, &options, &out, NULL, NULL));
    }

    /* One full causal pass (top-left, L = S = T) over the same cache. */
    {
        sdpa_tensor q, out;
        CHECK(sdpa_tensor_init_4d(&q, q_seq, B, H, T, E));
        CHECK(sdpa_tensor_init_4d(&out, out_full, B, H, T, EV));
        sdpa_tensor k = view4(k_cache, B, H, T, E, H * T_MAX * E, T_MAX * E, E, 1);
        sdpa_tensor v = view4(v_cache, B, H, T, EV, H * T_MAX * EV, T_MAX * EV, EV, 1);
        sdpa_options_init(&options);
        options.causal = 1;
        options.alignment = SDPA_ALIGN_TOP_LEFT;
        CHECK(sdpa_attention(&q, &k, &v, &options, &out, NULL, NULL));
    }

    float max_diff = 0.0f;
    for (int i = 0; i < B * H * T * EV; i++) {
        float d = fabsf(out_decode[i] - out_full[i]);
        if (!(d <= max_diff)) /* NaN counts as infinitely wrong */
            max_diff = isnan(d) ? INFINITY : d;
    }
    printf("decoded %d tokens (B=%d, H=%d, E=%d, Ev=%d) against a cache of %d rows\n", T, B, H, E,
           EV, T_MAX);
    printf("last token, head 0: decode [%.6f, %.6f, %.6f]  full [%.6f, %.6f, %.6f]\n",
           (double)out_decode[(T - 1) * EV], (double)out_decode[(T - 1) * EV + 1],
           (double)out_decode[(T - 1) * EV + 2], (double)out_full[(T - 1) * EV],
           (double)out_full[(T - 1) * EV + 1], (double)out_full[(T - 1) * EV + 2]);
    printf("max |decode - full causal pass| = %g\n", (double)max_diff);
    if (!(max_diff <= 1e-5f)) {
        fprintf(stderr, "kv_cache_decode: decode differs from the full pass by %g > 1e-5\n",
                (double)max_diff);
        return EXIT_FAILURE;
    }
    printf("kv_cache_decode: OK\n");
    return EXIT_SUCCESS;
}
