/* The library's own threads: a fork-join loop over independent tasks, per call.
 * No pool, no global state: threads are created for one call and joined before it returns. */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

int sdpa__online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n > SDPA__MAX_THREADS ? SDPA__MAX_THREADS : (int)n);
}

typedef struct worker {
    sdpa__task_fn fn;
    void *ctx;
    int64_t ntasks;
    atomic_llong next;
} worker;

typedef struct worker_arg {
    worker *w;
    int thread_index;
} worker_arg;

static void run_tasks(worker *w, int thread_index) {
    for (;;) {
        int64_t t = (int64_t)atomic_fetch_add_explicit(&w->next, 1, memory_order_relaxed);
        if (t >= w->ntasks)
            return;
        w->fn(w->ctx, t, thread_index);
    }
}

static void *thread_main(void *arg) {
    worker_arg *a = (worker_arg *)arg;
    run_tasks(a->w, a->thread_index);
    return NULL;
}

void sdpa__parallel_for(int nthreads, int64_t ntasks, sdpa__task_fn fn, void *ctx) {
    if (ntasks <= 0)
        return;
    if (nthreads > SDPA__MAX_THREADS)
        nthreads = SDPA__MAX_THREADS;
    if ((int64_t)nthreads > ntasks)
        nthreads = (int)ntasks;
    worker w = {.fn = fn, .ctx = ctx, .ntasks = ntasks};
    atomic_init(&w.next, 0);
    pthread_t tid[SDPA__MAX_THREADS];
    worker_arg args[SDPA__MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nthreads; ++t) {
        args[t].w = &w;
        args[t].thread_index = t;
        if (pthread_create(&tid[t], NULL, thread_main, &args[t]) != 0)
            break; /* fewer threads: the tasks still all run, on the threads we have */
        started = t;
    }
    run_tasks(&w, 0);
    for (int t = 1; t <= started; ++t)
        pthread_join(tid[t], NULL);
}

/* ---- a caller's hook or pool (threadpool.c): the library creates no thread ---- */

static void claim_job(void *ctx, int64_t k) { run_tasks((worker *)ctx, (int)k); }

void sdpa__run_tasks(const sdpa__exec *ex, int nthreads, int64_t ntasks, sdpa__task_fn fn, void *ctx) {
    if (ex == NULL || (ex->hook == NULL && ex->pool == NULL)) {
        sdpa__parallel_for(nthreads, ntasks, fn, ctx);
        return;
    }
    if (ntasks <= 0)
        return;
    if (nthreads > SDPA__MAX_THREADS)
        nthreads = SDPA__MAX_THREADS;
    if ((int64_t)nthreads > ntasks)
        nthreads = (int)ntasks;
    if (nthreads < 1)
        nthreads = 1;
    worker w = {.fn = fn, .ctx = ctx, .ntasks = ntasks};
    atomic_init(&w.next, 0);
    if (nthreads == 1) { /* nothing to share: the calling thread */
        run_tasks(&w, 0);
        return;
    }
    /* nthreads workers, each claiming tasks with its own number as thread_index. */
    if (ex->pool != NULL)
        sdpa__threadpool_run(ex->pool, nthreads, claim_job, &w);
    else
        ex->hook(ex->hook_ctx, nthreads, claim_job, &w);
}
