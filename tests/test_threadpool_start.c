/* Regression: a caller thread pool used right after sdpa_threadpool_create(), before its
 * workers have reached their wait, must still run every job. The workers used to read the
 * pool's call generation when they started, so a call made earlier was never seen by them and
 * the caller waited forever (found by the fuzzer under load). alarm() turns a hang into a
 * failure; every call's out is checked against the golden values. */
#include <sdpa.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* pthread_create interposed: every new thread starts 2 ms late, so the first call on a fresh
 * pool comes before its workers wait. Before the fix the hang showed in a standalone stress
 * program (2000 calls on fresh 16-thread pools, alarm after 20 s) but this test did not hit
 * it on every run: a stress test, not a deterministic one. */
typedef struct late_start {
    void *(*fn)(void *);
    void *arg;
} late_start;

static void *late_main(void *p) {
    late_start ls = *(late_start *)p;
    free(p);
    const struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    return ls.fn(ls.arg);
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    typedef int (*real_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    static real_fn real;
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
    late_start *ls = malloc(sizeof *ls);
    if (ls == NULL || real == NULL)
        return 11; /* EAGAIN */
    ls->fn = fn;
    ls->arg = arg;
    const int rc = real(t, attr, late_main, ls);
    if (rc != 0)
        free(ls);
    return rc;
}

int main(void) {
    enum { H = 4, L = 256, E = 8, POOL = 16, CALLS = 200 };
    static float q[H * L * E], k[H * L * E], v[H * L], out[H * L];
    for (int h = 0; h < H; ++h)
        for (int j = 0; j < L; ++j)
            v[h * L + j] = (float)(j % 3 == 0 ? 2 : j % 3 == 1 ? 4 : 8);
    sdpa_tensor tq, tk, tv, to;
    if (sdpa_tensor_init_4d(&tq, q, 1, H, L, E) || sdpa_tensor_init_4d(&tk, k, 1, H, L, E) ||
        sdpa_tensor_init_4d(&tv, v, 1, H, L, 1) || sdpa_tensor_init_4d(&to, out, 1, H, L, 1))
        return 2;
    /* a hang becomes a failure: 100 s, below meson's 120 s timeout; under qemu on a loaded
     * 2-core machine the calls took 12-38 s (aarch64 CI job), so 30 s was too tight */
    alarm(100);
    for (int it = 0; it < CALLS; ++it) {
        sdpa_threadpool *pool = NULL;
        if (sdpa_threadpool_create(POOL, &pool) != SDPA_OK) {
            printf("sdpa_threadpool_create: %s\n", sdpa_last_error_message());
            return 1;
        }
        sdpa_options o;
        sdpa_options_init(&o);
        o.threadpool = pool;
        o.num_threads = POOL;
        o.causal = 1;
        o.kernel = SDPA_KERNEL_TILED;
        for (int t = 0; t < H * L; ++t)
            out[t] = -1.0f;
        const sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
        sdpa_threadpool_destroy(pool);
        /* zero q, k under causal: row i averages v[0..i] = 2, 3, 14/3, ... */
        if (st != SDPA_OK || out[0] != 2.0f || out[1] != 3.0f || out[2] < 4.6666f || out[2] > 4.6667f ||
            out[(H - 1) * L] != 2.0f) {
            printf("call %d: %s (%s), out[0..2] = %g %g %g\n", it, sdpa_status_string(st), sdpa_last_error_message(),
                   (double)out[0], (double)out[1], (double)out[2]);
            return 1;
        }
    }
    printf("test_threadpool_start: %d calls on fresh %d-thread pools: 1 passed, 0 failed\n", CALLS, POOL);
    return 0;
}
