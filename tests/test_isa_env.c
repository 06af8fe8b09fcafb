/* SDPA_MAX_ISA=<cap> in the environment (read once per process) caps the micro-kernels: the
 * tiled and decode kernels' names end in the ISA that ran, the best this CPU has under the cap.
 * argv[1] is the cap the test was started with; it must equal the environment's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* This architecture's caps, lowest first (README: SDPA_MAX_ISA), and the level of the CPU. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
static const char *const names[] = {"portable", "avx2", "avx512"};
static int cpu_level(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
}
#elif defined(__aarch64__) && defined(__linux__)
static const char *const names[] = {"portable", "neon"};
static int cpu_level(void) { return (getauxval(AT_HWCAP) & (1ul << 1)) ? 1 : 0; } /* HWCAP_ASIMD */
#else
static const char *const names[] = {"portable"};
static int cpu_level(void) { return 0; }
#endif
#define NCAPS ((int)(sizeof names / sizeof names[0]))

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
    int cap = -1;
    for (int i = 0; i < NCAPS; ++i)
        if (strcmp(env, names[i]) == 0)
            cap = i;
    if (cap < 0) {
        printf("test_isa_env: not run: %s is not a cap of this architecture\n", env);
        return 77;
    }
    if (cpu_level() < cap) {
        /* the CPU lacks the capped level: the best it has runs; said, not counted as the cap's */
        printf("test_isa_env: SDPA_MAX_ISA=%s: this CPU lacks %s; checking that %s runs\n", env, env,
               names[cpu_level()]);
    }
    int level = cpu_level() < cap ? cpu_level() : cap;
    int bad = run(SDPA_KERNEL_TILED, 4, "tiled-", names[level]);
    bad |= run(SDPA_KERNEL_DECODE, 1, "decode-", names[level]);
    return bad;
}
