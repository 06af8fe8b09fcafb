/* sdpa_threadpool: a caller-owned pool of persistent workers (DESIGN section 7). The pool's
 * threads sleep on a condition variable between calls; a call hands them one job each (job 0
 * runs on the calling thread) and waits until all are done. Calls from several application
 * threads take the pool one after the other (call_lock). No global state. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

struct sdpa_threadpool {
    int n;                      /* threads of a call, the caller's included */
    pthread_t *tid;             /* n - 1 workers */
    pthread_mutex_t call_lock;  /* one call at a time */
    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t go, done;
    uint64_t gen;               /* incremented per call (and on stop) */
    int njobs, remaining;       /* jobs of this call; workers' jobs not yet finished */
    int stop;
    void (*job)(void *ctx, int64_t k);
    void *ctx;
};

typedef struct worker_start {
    sdpa_threadpool *pool;
    int index;
} worker_start;

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
        while (pool->gen == seen && !pool->stop)
            pthread_cond_wait(&pool->go, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->gen;
        if (k < pool->njobs) {
            void (*job)(void *, int64_t) = pool->job;
            void *ctx = pool->ctx;
            pthread_mutex_unlock(&pool->mu);
            job(ctx, k);
            pthread_mutex_lock(&pool->mu);
            if (--pool->remaining == 0)
                pthread_cond_signal(&pool->done);
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void stop_and_join(sdpa_threadpool *pool, int started) {
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pool->gen++;
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
    pool->remaining = njobs - 1;
    pool->gen++;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    job(ctx, 0);
    pthread_mutex_lock(&pool->mu);
    while (pool->remaining > 0)
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->call_lock);
}
