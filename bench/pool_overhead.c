/* pool-overhead: per-call cost of the library's built-in per-call threads against a caller
 * sdpa_threadpool (and a serial caller hook) on small decode calls, all at the same thread
 * count. Prints one line per executor: median and quartiles of the per-call time over
 * --reps repetitions of --calls calls each, and the bandwidth floor of the call (K and V
 * bytes / --gbps). Usage:
 *   pool-overhead [--shape B,H,L,S,E] [--threads N] [--calls N] [--reps N] [--gbps G]
 * Default shape (1,32,1,256,128), 2 threads. Results of the executors are compared bit for
 * bit (exit 1 on a difference), so the smoke run is also a check. */
#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void serial_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    (void)ctx;
    for (int64_t t = 0; t < ntasks; ++t)
        task(task_ctx, t);
}

int main(int argc, char **argv) {
    long B = 1, H = 32, L = 1, S = 256, E = 128;
    int threads = 2, calls = 2000, reps = 9;
    double gbps = 20.0;
    for (int a = 1; a + 1 < argc; a += 2) {
        if (!strcmp(argv[a], "--shape") && sscanf(argv[a + 1], "%ld,%ld,%ld,%ld,%ld", &B, &H, &L, &S, &E) == 5) continue;
        if (!strcmp(argv[a], "--threads")) { threads = atoi(argv[a + 1]); continue; }
        if (!strcmp(argv[a], "--calls")) { calls = atoi(argv[a + 1]); continue; }
        if (!strcmp(argv[a], "--reps")) { reps = atoi(argv[a + 1]); continue; }
        if (!strcmp(argv[a], "--gbps")) { gbps = atof(argv[a + 1]); continue; }
        fprintf(stderr, "pool-overhead: bad argument %s\n", argv[a]);
        return 2;
    }
    if (reps < 1 || reps > 99 || calls < 1 || threads < 1) return 2;
    const int64_t qs[4] = {B, H, L, E}, ks[4] = {B, H, S, E}, os[4] = {B, H, L, E};
    const size_t nq = (size_t)(B * H * L * E), nk = (size_t)(B * H * S * E);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *out[3];
    srand(1);
    for (size_t t = 0; t < nq; ++t) q[t] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t t = 0; t < nk; ++t) { k[t] = (float)rand() / (float)RAND_MAX - 0.5f; v[t] = (float)rand() / (float)RAND_MAX; }
    sdpa_tensor tq, tk, tv, to;
    if (sdpa_tensor_init(&tq, q, 4, qs) || sdpa_tensor_init(&tk, k, 4, ks) || sdpa_tensor_init(&tv, v, 4, ks)) return 1;
    sdpa_threadpool *pool = NULL;
    if (sdpa_threadpool_create(threads, &pool) != SDPA_OK) return 1;
    const char *names[3] = {"builtin", "threadpool", "hook-serial"};
    double floor_us = 2.0 * (double)nk * 4.0 / (gbps * 1e9) * 1e6;
    printf("shape (%ld,%ld,%ld,%ld,%ld) threads %d calls %d reps %d; bandwidth floor at %.0f GB/s: %.2f us\n", B, H, L,
           S, E, threads, calls, reps, gbps, floor_us);
    for (int x = 0; x < 3; ++x) {
        out[x] = malloc(nq * 4);
        if (sdpa_tensor_init(&to, out[x], 4, os)) return 1;
        sdpa_options o;
        sdpa_options_init(&o);
        o.num_threads = threads;
        o.kernel = SDPA_KERNEL_DECODE;
        if (x == 1) o.threadpool = pool;
        if (x == 2) { o.parallel_for = serial_hook; o.parallel_for_threads = 1; o.num_threads = 0; }
        double t[99];
        for (int r = 0; r < reps; ++r) {
            const double t0 = now();
            for (int c = 0; c < calls; ++c)
                if (sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL) != SDPA_OK) {
                    fprintf(stderr, "%s\n", sdpa_last_error_message());
                    return 1;
                }
            t[r] = (now() - t0) / calls * 1e6;
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp);
        printf("%-12s median %8.2f us/call  (q1 %.2f, q3 %.2f)  %.2fx floor  kernel %s\n", names[x], t[reps / 2],
               t[reps / 4], t[(3 * reps) / 4], t[reps / 2] / floor_us, sdpa_last_kernel());
    }
    sdpa_threadpool_destroy(pool);
    for (int x = 1; x < 3; ++x)
        if (memcmp(out[0], out[x], nq * 4) != 0) {
            fprintf(stderr, "pool-overhead: %s differs from builtin\n", names[x]);
            return 1;
        }
    return 0;
}
