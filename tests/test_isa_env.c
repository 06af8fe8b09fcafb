/* SDPA_MAX_ISA=<cap> in the environment (read once per process) caps the micro-kernels: the
 * tiled and decode kernels' names end in the ISA that ran, the best this CPU has under the cap.
 * argv[1] is the cap the test was started with; it must equal the environment's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

static int cpu_level(void) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
#else
    return 0;
#endif
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), w = strlen(tail);
    return n >= w && strcmp(s + n - w, tail) == 0;
}

static int run(int kernel, int64_t L, const char *want_prefix, const char *want_isa) {
    float q[4 * 8] = {0}, k[9 * 8] = {0}, v[9 * 3] = {0}, out[4 * 3];
    sdpa_tensor tq, tk, tv, to;
    if (sdpa_tensor_init_4d(&tq, q, 1, 1, L, 8) != SDPA_OK || sdpa_tensor_init_4d(&tk, k, 1, 1, 9, 8) != SDPA_OK ||
        sdpa_tensor_init_4d(&tv, v, 1, 1, 9, 3) != SDPA_OK || sdpa_tensor_init_4d(&to, out, 1, 1, L, 3) != SDPA_OK) {
        printf("FAIL: view constructors\n");
        return 1;
    }
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = kernel;
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
    const char *name = sdpa_last_kernel();
    const char *isa = want_isa;
    if (st != SDPA_OK || strncmp(name, want_prefix, strlen(want_prefix)) != 0 || !ends_with(name, isa)) {
        printf("FAIL: SDPA_MAX_ISA=%s: got status %s, kernel \"%s\", expected \"%s...%s\"\n", getenv("SDPA_MAX_ISA"),
               sdpa_status_string(st), name, want_prefix, isa);
        return 1;
    }
    printf("SDPA_MAX_ISA=%s: %s\n", getenv("SDPA_MAX_ISA"), name);
    return 0;
}

int main(int argc, char **argv) {
    const char *env = getenv("SDPA_MAX_ISA");
    if (argc != 2 || env == NULL || strcmp(env, argv[1]) != 0) {
        printf("usage: SDPA_MAX_ISA=<cap> test_isa_env <cap>\n");
        return 1;
    }
    static const char *const names[3] = {"portable", "avx2", "avx512"};
    int cap = strcmp(env, "portable") == 0 ? 0 : strcmp(env, "avx2") == 0 ? 1 : 2;
    int level = cpu_level() < cap ? cpu_level() : cap;
    int bad = run(SDPA_KERNEL_TILED, 4, "tiled-", names[level]);
    bad |= run(SDPA_KERNEL_DECODE, 1, "decode-", names[level]);
    return bad;
}
