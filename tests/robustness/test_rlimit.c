/*
 * Regression test (issue 8): a call that reaches BLAS must return a status when memory is
 * short, never hang. OpenBLAS 0.3.21 maps a 128 MiB buffer on first use and retries a failed
 * mmap forever. Each case runs in a forked child (which has not touched BLAS yet) under
 * setrlimit(RLIMIT_AS, current size + 100 MiB): the library's own small allocations fit,
 * OpenBLAS's buffer does not. alarm(10) turns a hang into a FAIL (SIGALRM), never a CI hang.
 *   1. sdpa_attention with a weights output on [1,2,128,64] views (reference kernel);
 *   2. sdpa_mha_forward, E = 64, 2 heads, L = S = 128;
 *   3. the same MHA call with 1 GiB of headroom must succeed (the probe is not over-eager).
 * Each must end with SDPA_OK or SDPA_ERR_OUT_OF_MEMORY (outputs untouched then) within the alarm.
 * Not run under AddressSanitizer or ThreadSanitizer (their shadow memory cannot live under an
 * address-space limit).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rb_util.h"

int rb_failures = 0;

enum { HEADROOM_MIB = 100, ALARM_S = 10 };

static size_t vm_size_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmSize:", 7) == 0)
            kib = (size_t)strtoull(line + 7, NULL, 10);
    if (f)
        fclose(f);
    return kib * 1024;
}

static int canary_intact(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t t = 0; t < n * sizeof(float); ++t)
        if (b[t] != 0xA5)
            return 0;
    return 1;
}

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_OOM = 1, CHILD_BAD = 2, CHILD_SETUP = 3 };

static int case_reference(void)
{
    enum { B = 1, H = 2, L = 128, E = 64 };
    const size_t nq = (size_t)B * H * L * E, nw = (size_t)B * H * L * L;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nq * 4), *o = malloc(nq * 4), *w = malloc(nw * 4);
    if (!q || !k || !v || !o || !w)
        return CHILD_SETUP;
    for (size_t t = 0; t < nq; ++t) {
        q[t] = (float)((t * 7) % 13) * 0.05f - 0.3f;
        k[t] = (float)((t * 5) % 11) * 0.05f - 0.25f;
        v[t] = (float)((t * 3) % 17) * 0.1f - 0.8f;
    }
    memset(o, 0xA5, nq * 4);
    memset(w, 0xA5, nw * 4);
    sdpa_tensor tq, tk, tv, to, tw;
    if (sdpa_tensor_init_4d(&tq, q, B, H, L, E) || sdpa_tensor_init_4d(&tk, k, B, H, L, E) ||
        sdpa_tensor_init_4d(&tv, v, B, H, L, E) || sdpa_tensor_init_4d(&to, o, B, H, L, E) ||
        sdpa_tensor_init_4d(&tw, w, B, H, L, L))
        return CHILD_SETUP;
    sdpa_options opt;
    sdpa_options_init(&opt);
    opt.kernel = SDPA_KERNEL_REFERENCE;
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &opt, &to, &tw, NULL);
    printf("  reference kernel with weights [1,2,128,64]: %s%s%s\n", sdpa_status_string(st),
           st != SDPA_OK ? ": " : "", sdpa_last_error_message());
    if (st == SDPA_ERR_OUT_OF_MEMORY)
        return canary_intact(o, nq) && canary_intact(w, nw) && sdpa_last_error_message()[0] ? CHILD_OOM : CHILD_BAD;
    return st == SDPA_OK ? CHILD_OK : CHILD_BAD;
}

static int case_mha(void)
{
    enum { B = 1, L = 128, E = 64 };
    float *x = malloc((size_t)B * L * E * 4), *win = malloc((size_t)3 * E * E * 4), *wout = malloc((size_t)E * E * 4);
    float *o = malloc((size_t)B * L * E * 4);
    if (!x || !win || !wout || !o)
        return CHILD_SETUP;
    for (int t = 0; t < B * L * E; ++t)
        x[t] = (float)(t % 9) * 0.1f - 0.4f;
    for (int t = 0; t < 3 * E * E; ++t)
        win[t] = (float)(t % 7) * 0.01f - 0.03f;
    for (int t = 0; t < E * E; ++t)
        wout[t] = (float)(t % 5) * 0.01f - 0.02f;
    memset(o, 0xA5, (size_t)B * L * E * 4);
    sdpa_tensor tx, twin, twout, to;
    const int64_t sin_[2] = {3 * E, E}, sout[2] = {E, E};
    if (sdpa_tensor_init_3d(&tx, x, B, L, E) || sdpa_tensor_init(&twin, win, 2, sin_) ||
        sdpa_tensor_init(&twout, wout, 2, sout) || sdpa_tensor_init_3d(&to, o, B, L, E))
        return CHILD_SETUP;
    sdpa_mha_params prm;
    sdpa_mha_params_init(&prm);
    prm.embed_dim = E;
    prm.num_heads = 2;
    prm.in_proj_weight = &twin;
    prm.out_proj_weight = &twout;
    sdpa_status st = sdpa_mha_forward(&prm, &tx, &tx, &tx, NULL, &to, NULL);
    printf("  sdpa_mha_forward E=64 H=2 L=S=128: %s%s%s\n", sdpa_status_string(st), st != SDPA_OK ? ": " : "",
           sdpa_last_error_message());
    if (st == SDPA_ERR_OUT_OF_MEMORY)
        return canary_intact(o, (size_t)B * L * E) && sdpa_last_error_message()[0] ? CHILD_OOM : CHILD_BAD;
    return st == SDPA_OK ? CHILD_OK : CHILD_BAD;
}

/* Run fn in a child under RLIMIT_AS = its size + headroom; returns the child's code or -signal. */
static int in_child(int (*fn)(void), size_t headroom)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return CHILD_SETUP;
    }
    if (pid == 0) {
        const size_t lim = vm_size_bytes() + headroom;
        struct rlimit r = {lim, lim};
        if (setrlimit(RLIMIT_AS, &r) != 0)
            _exit(CHILD_SETUP);
        alarm(ALARM_S);
        int code = fn();
        fflush(stdout);
        _exit(code);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
    }
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return WEXITSTATUS(status);
}

static void expect_returns(const char *what, int (*fn)(void), size_t headroom, int must_succeed)
{
    int code = in_child(fn, headroom);
    if (code == -SIGALRM)
        RB_FAIL("%s: no return within %d s under RLIMIT_AS (+%zu MiB): the call hangs", what, ALARM_S, headroom >> 20);
    else if (code < 0)
        RB_FAIL("%s: child killed by signal %d", what, -code);
    else if (code == CHILD_SETUP)
        RB_FAIL("%s: child setup failed (allocation or setrlimit)", what);
    else if (code == CHILD_BAD)
        RB_FAIL("%s: unexpected status, or outputs written / no message on SDPA_ERR_OUT_OF_MEMORY", what);
    else if (must_succeed && code != CHILD_OK)
        RB_FAIL("%s: expected SDPA_OK with %zu MiB of headroom", what, headroom >> 20);
}

#if defined(RB_ASAN) || defined(RB_TSAN)
static const int under_asan = 1;
#else
static const int under_asan = 0;
#endif

int main(int argc, char **argv)
{
    /* argv[1]: "mha" (the MHA projections; this branch's fix) or "reference" (the reference
     * kernel, which stops using BLAS with the micro-kernel restructuring); default both. */
    const char *which = argc > 1 ? argv[1] : "all";
    if (under_asan) {
        printf("test_rlimit %s: not run (AddressSanitizer / ThreadSanitizer build: their shadow memory cannot live under RLIMIT_AS)\n", which);
        return 77;
    }
    const size_t small = (size_t)HEADROOM_MIB << 20, big = (size_t)1 << 30;
    int cases = 0;
    if (strcmp(which, "mha") != 0) {
        expect_returns("sdpa_attention reference kernel with weights, short memory", case_reference, small, 0);
        ++cases;
    }
    if (strcmp(which, "reference") != 0) {
        expect_returns("sdpa_mha_forward, short memory", case_mha, small, 0);
        expect_returns("sdpa_mha_forward, 1 GiB headroom", case_mha, big, 1);
        cases += 2;
    }
    printf("test_rlimit %s: %d cases run, %d failed\n", which, cases, rb_failures);
    return rb_failures ? 1 : 0;
}
