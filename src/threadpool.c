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
 * stop stays under mu (the condition-variable protocol is unchanged); the polls only read.
 * Polling pays only while each polling thread has a CPU of its own, so it backs off:
 *  - a pool of more threads than online CPUs never polls;
 *  - a worker preempted since its previous poll (its involuntary context switches went up,
 *    getrusage RUSAGE_THREAD: another thread of this machine wanted its CPU, such as another
 *    process or OpenBLAS's start-up threads; a VM's steal time is no such switch) does not poll
 *    for 20 ms, doubled up to 640 ms while it keeps being preempted: a polling thread has used
 *    its scheduler share, while a sleeping one is run at once when it wakes;
 *  - the caller's budget adapts: a poll that ended without the workers halves the next one's
 *    (down to none), one that saw them done doubles it (up to spin_ns); with none, every 32nd
 *    call tries 8 us again. A long call whose last worker ends well after the caller so sleeps,
 *    which costs it nothing.
 * Measured on 2 vCPUs, back-to-back decode calls (1,32,1,256,128), cache warm, a 2-thread
 * pool, medians of 1200 calls (one process, pools alternating; /tmp harness of the 0.5 work):
 * 118 us polling, 123 us sleeping at once (0), 179 us on a 1-thread pool; with one busy
 * process beside it 200-210 us polling, 193-197 us with 0 (451 us polling before the
 * back-off). After a cache flush (sdpa-bench threadpool-warm) polling gains more: 0.28 vs
 * 0.43 ms.
 * fork(): the workers do not exist in a child; a call there runs on the calling thread alone
 * (the region's tasks are all claimed by it), and destroy frees the memory without joining.
 *
 * Memory ordering (C11, explicit, for weakly ordered CPUs such as aarch64): mu orders every
 * access made under it (a lock acquires, an unlock releases), so the accesses of gen,
 * remaining and stop under mu could be relaxed; the polls read them without mu, so:
 *  - the caller's release increment of gen (after it wrote job, ctx, njobs, remaining) pairs
 *    with a polling worker's acquire load of gen: a worker that saw the new generation sees
 *    the call (it still re-reads everything under mu before it runs the job);
 *  - each worker's release decrement of remaining (after its job returned) pairs with the
 *    polling caller's acquire load that sees 0 (the decrements form one release sequence, so
 *    that load synchronises with every worker's): the caller sees every job's writes (the
 *    region's outputs) before sdpa__threadpool_run returns; the caller then takes mu as well;
 *  - stop: written under mu with release, polled with acquire; a worker that saw it takes mu
 *    before it acts on it. */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SDPA__CPU_RELAX() _mm_pause()
#elif defined(__aarch64__) && defined(__GNUC__)
#define SDPA__CPU_RELAX() __asm__ volatile("yield" ::: "memory") /* the spin-wait hint */
#else
#define SDPA__CPU_RELAX() ((void)0)
#endif

#define SDPA__POOL_SPIN_US_DEFAULT 200
#define SDPA__POOL_SPIN_US_MAX 100000
#define MIN_POLL_NS 4000 /* a caller budget below this is none */
/* A worker preempted since its previous poll stops polling for quiet ns: QUIET_NS, doubled
 * (up to QUIET_MAX_NS) for each preemption that comes within QUIET_NS of the last quiet end. */
#define QUIET_NS 20000000
#define QUIET_MAX_NS 640000000

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
    int64_t spin_ns;            /* how long a waiting thread polls before it sleeps (0: never) */
    int64_t caller_ns;          /* the caller's poll budget (under call_lock; adapts, above) */
    int caller_skips;           /* calls since the caller's budget fell to none */
    pid_t pid;                  /* the process that created the workers (fork: not this one) */
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

/* Poll until *gen != seen or stop (a worker waiting for a call), or *remaining == 0 (the
 * caller waiting for its workers), for at most budget_ns. Reads only; returns nonzero if the
 * condition came true while polling. */
static int poll_until(sdpa_threadpool *pool, int64_t budget_ns, const atomic_uint_fast64_t *gen, uint64_t seen,
                      const atomic_int *remaining) {
    if (budget_ns <= 0)
        return 0;
    int64_t deadline = 0;
    for (unsigned i = 0;; ++i) {
        /* acquire: gen pairs with the caller's release increment, stop with stop_and_join's
         * release store, remaining with the workers' release decrements (top of the file) */
        if (gen != NULL ? atomic_load_explicit(gen, memory_order_acquire) != seen ||
                              atomic_load_explicit(&pool->stop, memory_order_acquire)
                        : atomic_load_explicit(remaining, memory_order_acquire) == 0)
            return 1;
        SDPA__CPU_RELAX();
        if ((i & 63u) == 0) { /* the clock every 64 polls (a pause is 10-150 cycles) */
            const int64_t t = now_ns();
            if (deadline == 0)
                deadline = t + budget_ns;
            else if (t >= deadline)
                return 0;
        }
    }
}

/* Involuntary context switches of the calling thread so far (0 where unknown). */
static long involuntary_switches(void) {
#ifdef RUSAGE_THREAD
    struct rusage u;
    if (getrusage(RUSAGE_THREAD, &u) == 0)
        return u.ru_nivcsw;
#endif
    return 0;
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
    long switches = involuntary_switches();
    int64_t quiet_until = 0, quiet = QUIET_NS;
    for (;;) {
        /* under mu: relaxed loads (mu orders them with the caller's writes) */
        while (atomic_load_explicit(&pool->gen, memory_order_relaxed) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_relaxed))
            pthread_cond_wait(&pool->go, &pool->mu);
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        seen = atomic_load_explicit(&pool->gen, memory_order_relaxed);
        if (k < pool->njobs) {
            void (*job)(void *, int64_t) = pool->job;
            void *ctx = pool->ctx;
            pthread_mutex_unlock(&pool->mu);
            job(ctx, k);
            pthread_mutex_lock(&pool->mu);
            /* release: the job's writes, for the caller's acquire poll of remaining */
            if (atomic_fetch_sub_explicit(&pool->remaining, 1, memory_order_release) == 1)
                pthread_cond_signal(&pool->done);
        }
        /* Poll for the next call before sleeping on go (the loop's condition re-checks it). */
        pthread_mutex_unlock(&pool->mu);
        if (pool->spin_ns > 0) {
            const long sw = involuntary_switches();
            const int64_t t = now_ns();
            if (sw != switches) { /* preempted since the last poll: another thread wants this CPU */
                quiet = quiet_until != 0 && t < quiet_until + QUIET_NS ? (quiet < QUIET_MAX_NS ? 2 * quiet : quiet)
                                                                        : QUIET_NS;
                quiet_until = t + quiet;
            }
            switches = sw; /* the next check covers this poll, the sleep and the next job */
            if (t >= quiet_until)
                (void)poll_until(pool, pool->spin_ns, &pool->gen, seen, NULL);
        }
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void stop_and_join(sdpa_threadpool *pool, int started) {
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->stop, 1, memory_order_release); /* for the workers' polls */
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
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

/* SDPA_POOL_SPIN_US: decimal digits only, in [0, SDPA__POOL_SPIN_US_MAX]; else the default. */
static int pool_spin_us(void) {
    const char *env = getenv("SDPA_POOL_SPIN_US");
    if (env == NULL || *env < '0' || *env > '9') /* unset, empty, a sign or a space: the default */
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
    /* More threads than CPUs: a polling thread would take a CPU a working one needs. */
    pool->spin_ns = nthreads > sdpa__online_cpus() ? 0 : (int64_t)pool_spin_us() * 1000;
    pool->caller_ns = pool->spin_ns;
    pool->pid = getpid();
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
    sdpa__clear_error();
    return SDPA_OK;
}

SDPA_API void sdpa_threadpool_destroy(sdpa_threadpool *pool) {
    if (pool == NULL)
        return;
    if (getpid() != pool->pid) { /* a fork()ed child: no worker to stop, a lock may be held */
        free(pool->tid);
        free(pool);
        return;
    }
    stop_and_join(pool, pool->n - 1);
    free_pool(pool);
}

SDPA_API int sdpa_threadpool_size(const sdpa_threadpool *pool) { return pool != NULL ? pool->n : 0; }

void sdpa__threadpool_run(sdpa_threadpool *pool, int njobs, void (*job)(void *ctx, int64_t k), void *ctx) {
    if (njobs > pool->n)
        njobs = pool->n;
    if (getpid() != pool->pid) { /* a fork()ed child: the workers are the parent's */
        job(ctx, 0);
        return;
    }
    pthread_mutex_lock(&pool->call_lock);
    pthread_mutex_lock(&pool->mu);
    pool->job = job;
    pool->ctx = ctx;
    pool->njobs = njobs;
    atomic_store_explicit(&pool->remaining, njobs - 1, memory_order_relaxed); /* published by: */
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release); /* pairs with the workers' acquire polls */
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    job(ctx, 0);
    if (pool->spin_ns > 0) { /* the caller's adaptive budget (call_lock is held) */
        if (pool->caller_ns == 0 && ++pool->caller_skips >= 32)
            pool->caller_ns = 2 * MIN_POLL_NS;
        if (pool->caller_ns > 0) {
            pool->caller_skips = 0;
            if (poll_until(pool, pool->caller_ns, NULL, 0, &pool->remaining))
                pool->caller_ns = 2 * pool->caller_ns < pool->spin_ns ? 2 * pool->caller_ns : pool->spin_ns;
            else if ((pool->caller_ns /= 2) < MIN_POLL_NS)
                pool->caller_ns = 0;
        }
    }
    pthread_mutex_lock(&pool->mu);
    while (atomic_load_explicit(&pool->remaining, memory_order_relaxed) > 0) /* under mu */
        pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->call_lock);
}
