/* The thread start-up rule (threads.c sdpa__thread_work_scale): a call starts a thread of its
 * own only for work worth what starting one costs. The cost comes from SDPA_THREAD_START_US,
 * set here before the first call from argv[1] (read once per process; "measure" leaves it
 * unset, so the library probes it). pthread_create is interposed to count the library's threads.
 *   test_thread_start 1000     the largest cost: a small call runs on the calling thread alone,
 *                              a large one still starts threads; a caller pool is always used
 *   test_thread_start 0        no cost: the small call starts its thread (0.5.0's rule)
 *   test_thread_start measure  the probe: whatever it measured, the results are the same
 *   test_thread_start abc      not a number in [0, 1000]: ignored, so the library probes
 * Every call's output must equal, bit for bit, the same call with num_threads = 1, and the
 * workspace size must not depend on the cost. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#include "pthread_counter.h" /* g_creates: the threads this process created */

static int failures;

#define CHECK(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            ++failures;                                                                                                \
        }                                                                                                              \
    } while (0)

typedef struct shape {
    const char *name;
    int64_t B, H, L, S, E;
} shape;

/* The views and options of the shape's call at num_threads (pool: through it); false (and a
 * failure counted) if a view cannot be made. */
typedef struct call {
    sdpa_tensor q, k, v, out;
    sdpa_options o;
} call;

static int make_call(const shape *sh, const float *q, const float *k, const float *v, float *out, int threads,
                     sdpa_threadpool *pool, call *c) {
    const int64_t qs[4] = {sh->B, sh->H, sh->L, sh->E}, ks[4] = {sh->B, sh->H, sh->S, sh->E};
    if (sdpa_tensor_init(&c->q, (float *)q, 4, qs) != SDPA_OK || sdpa_tensor_init(&c->k, (float *)k, 4, ks) != SDPA_OK ||
        sdpa_tensor_init(&c->v, (float *)v, 4, ks) != SDPA_OK || sdpa_tensor_init(&c->out, out, 4, qs) != SDPA_OK) {
        CHECK(0, "%s: tensor init: %s", sh->name, sdpa_last_error_message());
        return 0;
    }
    sdpa_options_init(&c->o);
    c->o.num_threads = threads;
    c->o.threadpool = pool;
    c->o.causal = 1;
    c->o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    return 1;
}

/* One call of the shape; returns the library's thread creations during the call; out gets
 * the result. */
static long run(const shape *sh, const float *q, const float *k, const float *v, float *out, int threads,
                sdpa_threadpool *pool) {
    call c;
    if (!make_call(sh, q, k, v, out, threads, pool, &c))
        return -1;
    g_creates = 0;
    const sdpa_status st = sdpa_attention(&c.q, &c.k, &c.v, &c.o, &c.out, NULL, NULL);
    CHECK(st == SDPA_OK, "%s: %s", sh->name, sdpa_last_error_message());
    return g_creates;
}

/* sdpa_attention_workspace_size of the shape's call (no data is read). */
static size_t ws_size(const shape *sh, int threads, sdpa_threadpool *pool) {
    static float dummy[1];
    call c;
    if (!make_call(sh, dummy, dummy, dummy, dummy, threads, pool, &c))
        return 0;
    size_t n = 0;
    const sdpa_status st = sdpa_attention_workspace_size(&c.q, &c.k, &c.v, &c.o, 0, &n);
    CHECK(st == SDPA_OK, "%s: workspace size: %s", sh->name, sdpa_last_error_message());
    return n;
}

static float *filled(size_t n, unsigned seed) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "measure";
    if (strcmp(mode, "measure") == 0)
        unsetenv("SDPA_THREAD_START_US");
    else
        setenv("SDPA_THREAD_START_US", mode, 1);
    const int high = strcmp(mode, "1000") == 0, zero = strcmp(mode, "0") == 0;
    char *end = NULL;
    const double us = strtod(mode, &end);
    const int probes = !(end != mode && *end == '\0' && us >= 0.0 && us <= 1000.0); /* else ignored */
    /* small prefill: 34 MFLOP (above 2 x 4 MFLOP per thread, below 2 x 16 x 4); decode: 8 MB of
     * K/V (above 2 x 2 MB per thread, below 2 x 16 x 2 MB); large: 268 MFLOP (above 2 x 16 x 4) */
    const shape shapes[] = {
        {"small prefill (1,8,128,128,64)", 1, 8, 128, 128, 64},
        {"small decode (1,8,1,2048,64)", 1, 8, 1, 2048, 64},
        {"large prefill (2,8,256,256,64)", 2, 8, 256, 256, 64},
    };
    /* A call of one thread never probes; the first call that may use more probes the start-up
     * cost (3 empty threads) unless the environment gave it; no later call probes again. A
     * workspace-size query never probes either. */
    {
        const shape warm = {"warm-up (1,1,8,8,8)", 1, 1, 8, 8, 8};
        float *x = filled(64, 3u), *y = calloc(64, sizeof *y);
        g_creates = 0;
        (void)ws_size(&warm, 2, NULL);
        CHECK(g_creates == 0, "a workspace-size query created %ld threads", (long)g_creates);
        const long one = run(&warm, x, x, x, y, 1, NULL);
        const long first = run(&warm, x, x, x, y, 2, NULL), again = run(&warm, x, x, x, y, 2, NULL);
        CHECK(one == 0, "the first call, num_threads = 1, created %ld threads", one);
        CHECK(first == (probes ? 3 : 0), "the first 2-thread call created %ld threads", first);
        CHECK(again == 0, "a second call created %ld threads (the probe runs once)", again);
        free(x);
        free(y);
    }
    sdpa_threadpool *pool = NULL;
    CHECK(sdpa_threadpool_create(2, &pool) == SDPA_OK, "pool: %s", sdpa_last_error_message());
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; ++c) {
        const shape *sh = &shapes[c];
        const size_t nq = (size_t)(sh->B * sh->H * sh->L * sh->E), nk = (size_t)(sh->B * sh->H * sh->S * sh->E);
        float *q = filled(nq, 1u + (unsigned)c), *k = filled(nk, 7u), *v = filled(nk, 11u);
        float *o1 = calloc(nq, sizeof *o1), *o2 = calloc(nq, sizeof *o2), *op = calloc(nq, sizeof *op);
        /* The workspace size does not depend on the start-up cost (the same in every process):
         * it is what the call needs at the most threads, as with a pool of that size. */
        const size_t w2 = ws_size(sh, 2, NULL), wp = ws_size(sh, 2, pool);
        CHECK(w2 == wp && w2 > 0, "%s: workspace %zu without a pool, %zu with one (start cost %s us)", sh->name, w2,
              wp, mode);
        const long c1 = run(sh, q, k, v, o1, 1, NULL);
        const long c2 = run(sh, q, k, v, o2, 2, NULL);
        const long cp = run(sh, q, k, v, op, 2, pool);
        CHECK(c1 == 0, "%s: num_threads=1 created %ld threads", sh->name, c1);
        CHECK(cp == 0, "%s: a caller pool call created %ld threads", sh->name, cp);
        CHECK(memcmp(o1, o2, nq * sizeof *o1) == 0, "%s: 2 threads differ from 1", sh->name);
        CHECK(memcmp(o1, op, nq * sizeof *o1) == 0, "%s: the pool differs from 1 thread", sh->name);
        if (high && c < 2)
            CHECK(c2 == 0, "%s at a start cost of 1 ms: %ld threads created (the work cannot pay for one)", sh->name,
                  c2);
        if ((high && c == 2) || zero)
            CHECK(c2 >= 1, "%s at a start cost of %s us: no thread created", sh->name, mode);
        printf("%s: start cost %s: num_threads=2 created %ld thread(s)\n", sh->name, mode, c2);
        free(q); free(k); free(v); free(o1); free(o2); free(op);
    }
    sdpa_threadpool_destroy(pool);
    if (failures == 0)
        printf("ok\n");
    return failures == 0 ? 0 : 1;
}
