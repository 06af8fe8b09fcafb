/* README.md's usage example, verbatim: it is built and run as a test so the README cannot rot. */
#include <stdio.h>
#include <sdpa.h>

#define TRY(call) do { sdpa_status s_ = (call); if (s_ != SDPA_OK) { \
    fprintf(stderr, "%s: %s\n", sdpa_status_string(s_), sdpa_last_error_message()); return 1; } } while (0)

int main(void) {
    float q[2 * 3 * 4] = {0}, k[2 * 3 * 4] = {0}; /* [B=1, H=2, L=S=3, E=4], all zero */
    float v[2 * 3 * 1] = {2, 4, 8, 1, 2, 3};      /* [B=1, H=2, S=3, Ev=1]           */
    float out[2 * 3 * 1];                         /* [B=1, H=2, L=3, Ev=1]           */
    sdpa_tensor tq, tk, tv, tout;
    sdpa_options opt;

    if (sdpa_version() < SDPA_VERSION_NUMBER) return 1; /* library older than the header */
    TRY(sdpa_tensor_init_4d(&tq, q, 1, 2, 3, 4));
    TRY(sdpa_tensor_init_4d(&tk, k, 1, 2, 3, 4));
    TRY(sdpa_tensor_init_4d(&tv, v, 1, 2, 3, 1));
    TRY(sdpa_tensor_init_4d(&tout, out, 1, 2, 3, 1));
    sdpa_options_init(&opt); /* defaults: scale 1/sqrt(E), no mask, finite check on */
    opt.causal = 1;          /* query i sees keys j <= i (PyTorch is_causal=True)   */
    TRY(sdpa_attention(&tq, &tk, &tv, &opt, &tout, NULL, NULL));

    for (int i = 0; i < 6; i++) printf("%g ", out[i]); /* 2 3 4.66667 1 1.5 2 */
    printf("\n");
    return out[2] > 4.6666f && out[2] < 4.6667f && out[5] > 1.9999f && out[5] < 2.0001f ? 0 : 1;
}
