/* pool-overhead: per-call cost of the library's built-in per-call threads against a caller
 * sdpa_threadpool (and a serial caller hook) on small decode calls, all at the same thread
 * count. Prints one line per executor: median and quartiles of the per-call time over
 * --reps repetitions of --calls calls each, and the bandwidth floor of the call (K and V
 * bytes / --gbps). Usage:
 *   pool-overhead [--shape B,H,L,S,E] [--threads N] [--calls N] [--reps N] [--gbps G]
 *                 [--features]
 * --features adds rows for the built-in threads with sinks, ALiBi and both (their cost over
 * the plain call).
 * Default shape (1,32,1,256,128), 2 threads. Results of the executors are compared bit for
 * bit (exit 1 on a difference), so the smoke run is also a check. */
#include "sdpa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"

static void serial_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    (void)ctx;
    for (int64_t t = 0; t < ntasks; ++t)
        task(task_ctx, t);
}

int main(int argc, char **argv) {
    long B = 1, H = 32, L = 1, S = 256, E = 128;
    int threads = 2, calls = 2000, reps = 9;
    double gbps = 20.0;
    int features = 0;
    for (int a = 1; a < argc; ++a)
        if (!strcmp(argv[a], "--features")) {
            features = 1;
            for (int b = a; b + 1 < argc; ++b)
                argv[b] = argv[b + 1];
            --argc;
            break;
        }
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
    sdpa_tensor tq, tk, tv;
    if (sdpa_tensor_init(&tq, q, 4, qs) || sdpa_tensor_init(&tk, k, 4, ks) || sdpa_tensor_init(&tv, v, 4, ks)) return 1;
    sdpa_threadpool *pool = NULL;
    if (sdpa_threadpool_create(threads, &pool) != SDPA_OK) return 1;
    const char *names[6] = {"builtin", "threadpool", "hook-serial", "+sinks", "+alibi", "+sinks+alibi"};
    float sinks[4096], slopes[4096];
    if (H > 4096 || sdpa_alibi_slopes(H, 8.0f, slopes) != SDPA_OK) return 1;
    for (long h = 0; h < H; ++h) sinks[h] = 0.5f;
    const int nx = features ? 6 : 3;
    double floor_us = 2.0 * (double)nk * 4.0 / (gbps * 1e9) * 1e6;
    printf("shape (%ld,%ld,%ld,%ld,%ld) threads %d calls %d reps %d; bandwidth floor at %.0f GB/s: %.2f us\n", B, H, L,
           S, E, threads, calls, reps, gbps, floor_us);
    /* Repetitions round-robin over the executors, so a load that drifts during the run
     * weighs on all of them alike. */
    float *scratch = malloc(nq * 4);
    sdpa_options o[6];
    sdpa_tensor tout[6];
    static double t[6][99];
    for (int x = 0; x < nx; ++x) {
        if (x < 3) out[x] = malloc(nq * 4);
        if (sdpa_tensor_init(&tout[x], x < 3 ? out[x] : scratch, 4, os)) return 1;
        sdpa_options_init(&o[x]);
        o[x].num_threads = threads;
        o[x].kernel = SDPA_KERNEL_DECODE;
        if (x == 1) o[x].threadpool = pool;
        if (x == 2) { o[x].parallel_for = serial_hook; o[x].parallel_for_threads = 1; o[x].num_threads = 0; }
        if (x == 3 || x == 5) o[x].sinks = sinks;
        if (x == 4 || x == 5) { o[x].alibi_slopes = slopes; o[x].alibi_slopes_rank = 1; }
    }
    for (int r = 0; r < reps; ++r)
        for (int x = 0; x < nx; ++x) {
            const double t0 = bench_now_s();
            for (int c = 0; c < calls; ++c)
                if (sdpa_attention(&tq, &tk, &tv, &o[x], &tout[x], NULL, NULL) != SDPA_OK) {
                    fprintf(stderr, "%s\n", sdpa_last_error_message());
                    return 1;
                }
            t[x][r] = (bench_now_s() - t0) / calls * 1e6;
        }
    for (int x = 0; x < nx; ++x) {
        qsort(t[x], (size_t)reps, sizeof t[x][0], bench_cmp_double);
        printf("%-12s median %8.2f us/call  (q1 %.2f, q3 %.2f)  %.2fx floor\n", names[x], t[x][reps / 2],
               t[x][reps / 4], t[x][(3 * reps) / 4], t[x][reps / 2] / floor_us);
    }
    sdpa_threadpool_destroy(pool);
    free(scratch);
    int rc = 0;
    for (int x = 1; x < 3; ++x)
        if (memcmp(out[0], out[x], nq * 4) != 0) {
            fprintf(stderr, "pool-overhead: %s differs from builtin\n", names[x]);
            rc = 1;
        }
    for (int x = 0; x < 3; ++x)
        free(out[x]);
    free(q);
    free(k);
    free(v);
    return rc;
}
