/* The golden case through an installed libsdpa: zero Q/K with V = [2, 4, 8] under a 3x3
 * causal mask gives 2, 3, 14/3. Exit status 0 when right. */
#include <math.h>
#include <stdio.h>

#include <sdpa.h>

int main(void) {
    float q[12] = {0}, k[12] = {0}, v[3] = {2, 4, 8}, out[3];
    const float want[3] = {2.0f, 3.0f, 14.0f / 3.0f};
    sdpa_tensor tq, tk, tv, tout;
    sdpa_options opt;
    if (sdpa_version() < SDPA_VERSION_NUMBER) {
        fprintf(stderr, "library %s is older than the header %s\n", sdpa_version_string(), SDPA_VERSION_STRING);
        return 1;
    }
    if (sdpa_tensor_init_4d(&tq, q, 1, 1, 3, 4) || sdpa_tensor_init_4d(&tk, k, 1, 1, 3, 4) ||
        sdpa_tensor_init_4d(&tv, v, 1, 1, 3, 1) || sdpa_tensor_init_4d(&tout, out, 1, 1, 3, 1))
        return 1;
    sdpa_options_init(&opt);
    opt.causal = 1;
    sdpa_status s = sdpa_attention(&tq, &tk, &tv, &opt, &tout, NULL, NULL);
    if (s != SDPA_OK) {
        fprintf(stderr, "%s: %s\n", sdpa_status_string(s), sdpa_last_error_message());
        return 1;
    }
    for (int i = 0; i < 3; i++) {
        if (fabsf(out[i] - want[i]) > 1e-5f) {
            fprintf(stderr, "out[%d] = %g, expected %g\n", i, (double)out[i], (double)want[i]);
            return 1;
        }
    }
    printf("cmake consumer: libsdpa %s: %g %g %g OK\n", sdpa_version_string(), (double)out[0],
           (double)out[1], (double)out[2]);
    return 0;
}
