/* sdpa_threadpool: a caller-owned pool of persistent workers (DESIGN section 7). A call hands
 * the workers one job each (job 0 runs on the calling thread) and waits until all are done.
 * Calls from several application threads take the pool one after the other (call_lock). No
 * global state.
 * Waiting: a worker that finished a job polls for the next call for spin_ns before it sleeps
 * on a condition variable, and the caller polls for its workers' completion as long before it
 * sleeps (OpenMP's OMP_WAIT_POLICY / GOMP_SPINCOUNT, ggml's threadpool poll level): waking a
 * sleeping thread costs 50-200 us on a VM whose other vCPU idles (the host must wake it), more
 * than a whole small decode call, while back-to-back calls (one per layer) find a polling
 * worker at once. spin_ns is SDPA_POOL_SPIN_US (0..100000 us), read when the pool is created;
 * default 200 us; 0 sleeps at once (the 0.5.0 behaviour). Every write of gen, remaining and
 * stop stays under mu (the condition-variable protocol is unchanged); the polls only read. */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SDPA__CPU_RELAX() _mm_pause()
#else
#define SDPA__CPU_RELAX() ((void)0)
#endif

#define SDPA__POOL_SPIN_US_DEFAULT 200
#define SDPA__POOL_SPIN_US_MAX 100000

struct sdpa_threadpool {
    int n;                      /* threads of a call, the caller's included */
    pthread_t *tid;             /* n - 1 workers */
    pthread_mutex_t call_lock;  /* one call at a time */
    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t go, done;
    atomic_uint_fast64_t gen;   /* incremented per call (and on stop) */
    int njobs;                  /* jobs of this call */
    atomic_int remaining;       /* workers' jobs of this call not yet finished */
    atomic_int stop;
    int64_t spin_ns;            /* how long a waiting thread polls before it sleeps */
    int yield;                  /* more threads than online CPUs: polls give the core away */
    void (*job)(void *ctx, int64_t k);
    void *ctx;
};

typedef struct worker_start {
    sdpa_threadpool *pool;
    int index;
} worker_start;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Poll until *word != value (gen) or, with until_zero, *word == 0 (remaining), or stop, for at
 * most spin_ns. Reads only; returns nonzero if the condition came true while polling. */
static int poll_until(sdpa_threadpool *pool, const atomic_uint_fast64_t *gen, uint64_t seen,
                      const atomic_int *remaining) {
    if (pool->spin_ns <= 0)
        return 0;
    int64_t deadline = 0;
    for (unsigned i = 0;; ++i) {
        if (gen != NULL ? atomic_load_explicit(gen, memory_order_acquire) != seen ||
                              atomic_load_explicit(&pool->stop, memory_order_relaxed)
                        : atomic_load_explicit(remaining, memory_order_acquire) == 0)
            return 1;
        if (pool->yield)
            sched_yield();
        else
            SDPA__CPU_RELAX();
        if ((i & 63u) == 0) { /* the clock every 64 polls (a pause is 10-150 cycles) */
            const int64_t t = now_ns();
            if (deadline == 0)
                deadline = t + pool->spin_ns;
            else if (t >= deadline)
                return 0;
        }
    }
}

static void *worker_main(void *arg) {
    worker_start *ws = (worker_start *)arg;
    sdpa_threadpool *pool = ws->pool;
    const int k = ws->index;
    free(ws);
    pthread_mutex_lock(&pool->mu);
    /* The generation the pool was created with (0), not the current one: a call made before
     * this thread got here has already incremented gen, and its job k must still run here
     * (reading pool->gen here lost that call's wake-up: the caller waited forever). */
    uint64_t seen = 0;
    for (;;) {
        while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
            pthread_cond_wait(&pool->go, &pool->mu);
        if (atomic_load(&pool->stop))
            break;
        seen = atomic_load(&pool->gen);
        if (k < pool->njobs) {
            void (*job)(void *, int64_t) = pool->job;
            void *ctx = pool->ctx;
            pthread_mutex_unlock(&pool->mu);
            job(ctx, k);
            pthread_mutex_lock(&pool->mu);
            if (atomic_fetch_sub(&pool->remaining, 1) == 1)
                pthread_cond_signal(&pool->done);
        }
        /* Poll for the next call before sleeping on go (the loop's condition re-checks it). */
        pthread_mutex_unlock(&pool->mu);
        (void)poll_until(pool, &pool->gen, seen, NULL);
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void stop_and_join(sdpa_threadpool *pool, int started) {
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    atomic_fetch_add(&pool->gen, 1);
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    for (int t = 0; t < started; ++t)
        pthread_join(pool->tid[t], NULL);
}

static void free_pool(sdpa_threadpool *pool) {
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->go);
    pthread_mutex_destroy(&pool->mu);
    pthread_mutex_destroy(&pool->call_lock);
    free(pool->tid);
    free(pool);
}

/* SDPA_POOL_SPIN_US: a decimal integer in [0, SDPA__POOL_SPIN_US_MAX]; else the default. */
static int pool_spin_us(void) {
    const char *env = getenv("SDPA_POOL_SPIN_US");
    if (env == NULL || *env == '\0')
        return SDPA__POOL_SPIN_US_DEFAULT;
    char *end = NULL;
    const long us = strtol(env, &end, 10);
    if (end == NULL || *end != '\0' || us < 0 || us > SDPA__POOL_SPIN_US_MAX)
        return SDPA__POOL_SPIN_US_DEFAULT;
    return (int)us;
}

SDPA_API sdpa_status sdpa_threadpool_create(int nthreads, sdpa_threadpool **out) {
    static const char fn[] = "sdpa_threadpool_create";
    if (out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    if (nthreads < 1 || nthreads > SDPA__MAX_THREADS)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: nthreads=%d must be in [1, %d]", fn, nthreads,
                          SDPA__MAX_THREADS);
    sdpa_threadpool *pool = (sdpa_threadpool *)calloc(1, sizeof *pool);
    if (pool == NULL)
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: cannot allocate the pool", fn);
    pool->n = nthreads;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->remaining, 0);
    atomic_init(&pool->stop, 0);
    pool->spin_ns = (int64_t)pool_spin_us() * 1000;
    pool->yield = nthreads > sdpa__online_cpus();
    pool->tid = (pthread_t *)calloc((size_t)nthreads, sizeof *pool->tid);
    if (pool->tid == NULL) {
        free(pool);
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: cannot allocate the pool", fn);
    }
    pthread_mutex_init(&pool->call_lock, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->go, NULL);
    pthread_cond_init(&pool->done, NULL);
    for (int t = 1; t < nthreads; ++t) {
        worker_start *ws = (worker_start *)malloc(sizeof *ws);
        int rc = -1;
        if (ws != NULL) {
            ws->pool = pool;
            ws->index = t;
            rc = pthread_create(&pool->tid[t - 1], NULL, worker_main, ws);
            if (rc != 0)
                free(ws);
        }
        if (rc != 0) {
            stop_and_join(pool, t - 1);
            free_pool(pool);
            return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not create worker thread %d of %d", fn, t,
                              nthreads - 1);
        }
    }
    *out = pool;
    return SDPA_OK;
}

SDPA_API void sdpa_threadpool_destroy(sdpa_threadpool *pool) {
    if (pool == NULL)
        return;
    stop_and_join(pool, pool->n - 1);
    free_pool(pool);
}

SDPA_API int sdpa_threadpool_size(const sdpa_threadpool *pool) { return pool != NULL ? pool->n : 0; }

void sdpa__threadpool_run(sdpa_threadpool *pool, int njobs, void (*job)(void *ctx, int64_t k), void *ctx) {
    if (njobs > pool->n)
        njobs = pool->n;
    pthread_mutex_lock(&pool->call_lock);
    pthread_mutex_lock(&pool->mu);
    pool->job = job;
    pool->ctx = ctx;
    pool->njobs = njobs;
    atomic_store(&pool->remaining, njobs - 1);
    atomic_fetch_add(&pool->gen, 1);
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    job(ctx, 0);
    (void)poll_until(pool, NULL, 0, &pool->remaining);
    pthread_mutex_lock(&pool->mu);
    while (atomic_load(&pool->remaining) > 0)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->call_lock);
}
