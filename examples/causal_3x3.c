/*
 * The golden case: causal attention over three tokens.
 *
 * q and k are all zero, so every score is 0 and each query averages the values it may see.
 * With the causal rule (top-left, as PyTorch is_causal) query i sees keys 0..i:
 *     v = [2, 4, 8]  ->  out = [2, (2+4)/2, (2+4+8)/3] = [2, 3, 4.6667]
 *
 * Exits 0 if the three averages are right, 1 otherwise.
 */
#include <math.h>

#include "common.h"

int main(void)
{
    enum { B = 1, H = 1, L = 3, S = 3, E = 4, EV = 1 };
    float q[B * H * L * E] = {0};        /* [B, H, L, E]  */
    float k[B * H * S * E] = {0};        /* [B, H, S, E]  */
    float v[B * H * S * EV] = {2, 4, 8}; /* [B, H, S, Ev] */
    float out[B * H * L * EV];           /* [B, H, L, Ev] */
    const float expected[L] = {2.0f, 3.0f, 14.0f / 3.0f};

    check_library_version();

    sdpa_tensor tq, tk, tv, tout;
    CHECK(sdpa_tensor_init_4d(&tq, q, B, H, L, E));
    CHECK(sdpa_tensor_init_4d(&tk, k, B, H, S, E));
    CHECK(sdpa_tensor_init_4d(&tv, v, B, H, S, EV));
    CHECK(sdpa_tensor_init_4d(&tout, out, B, H, L, EV));

    sdpa_options options;
    sdpa_options_init(&options);
    options.causal = 1;                        /* key j allowed iff j <= p(i) */
    options.alignment = SDPA_ALIGN_TOP_LEFT;   /* p(i) = i (the default) */

    CHECK(sdpa_attention(&tq, &tk, &tv, &options, &tout, NULL, NULL));

    int ok = 1;
    printf("libsdpa %s, kernel \"%s\"\n", sdpa_version_string(), sdpa_last_kernel());
    for (int i = 0; i < L; i++) {
        int good = fabsf(out[i] - expected[i]) <= 1e-5f;
        printf("out[%d] = %.4f (expected %.4f)%s\n", i, (double)out[i], (double)expected[i],
               good ? "" : "  WRONG");
        ok &= good;
    }
    if (!ok) {
        fprintf(stderr, "causal_3x3: wrong result\n");
        return EXIT_FAILURE;
    }
    printf("causal_3x3: OK\n");
    return EXIT_SUCCESS;
}
