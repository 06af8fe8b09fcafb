/* The library's own threads: one fork-join region per call, in phases of independent tasks
 * (the value checks, then the kernel's work items), run by the calling thread and the workers
 * started for the call; the same region runs on a caller's hook or pool.
 * No pool: threads are created for one call and joined before it returns. The one process-wide
 * value is the measured cost of starting a thread (below), probed once like the CPU (cpu.c). */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <stdatomic.h>
#include <unistd.h>

/* What starting one thread of its own costs a call, measured once per process (the CPU is
 * probed once the same way, cpu.c): the fastest of three pthread_create + join of a thread
 * that does nothing, in seconds, kept in [5 us, 1 ms]; SDPA_THREAD_START_US (0..1000, read
 * once) replaces it. On the 2-vCPU VM this project is measured on it is about 25 us while the
 * other vCPU is busy and 55-220 us when it idles (it is woken through the host). */
static double g_start_s = 1e-4;
static pthread_once_t g_start_once = PTHREAD_ONCE_INIT;

static void *start_probe(void *arg) { return arg; }

static void measure_start(void) {
    const char *env = getenv("SDPA_THREAD_START_US"); /* once per process, like SDPA_MAX_ISA */
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        const double us = strtod(env, &end);
        if (end != NULL && *end == '\0' && us >= 0.0 && us <= 1000.0) { /* else: ignored, measured */
            g_start_s = us * 1e-6;
            return;
        }
    }
    double best = 1e-3;
    for (int i = 0; i < 3; ++i) {
        struct timespec t0, t1;
        pthread_t t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (pthread_create(&t, NULL, start_probe, NULL) != 0)
            break;
        pthread_join(t, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double d = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        best = d < best ? d : best;
    }
    g_start_s = best < 5e-6 ? 5e-6 : best > 1e-3 ? 1e-3 : best;
}

double sdpa__thread_work_scale(const sdpa__exec *ex, int64_t threads) {
    if (ex != NULL && (ex->pool != NULL || ex->hook != NULL))
        return 1.0; /* the caller's threads are there already */
    if (threads <= 1 || (ex != NULL && ex->sizing))
        return 1.0; /* no thread to start; or a size that must not depend on a measurement */
    pthread_once(&g_start_once, measure_start);
    const double s = g_start_s / 20e-6;
    return s < 1.0 ? 1.0 : s > 16.0 ? 16.0 : s;
}

/* ---- regions: phases of tasks, one start of the threads per call ----
 * Phase k's tasks are claimed dynamically by every thread of the region; the thread that
 * finishes phase k's last task runs its gate and then opens the next phase, so a thread waits
 * only for tasks that other running threads have claimed and are executing: a hook that runs
 * its jobs one after the other (or a thread that never started) cannot deadlock the region.
 *
 * Memory ordering (C11; written for weakly ordered CPUs such as aarch64, where a plain store
 * may become visible to another core after a later one). What must be seen, and by whom:
 *  (a) the outputs (and partial results) of phase k's tasks by every task of a later phase
 *      (the gate reads them too): each task ends with a release increment of done[k]
 *      (acq_rel); the increment that completes the phase acquires all of them (the increments
 *      form one release sequence), runs the gate and publishes with a release store of open;
 *      a thread starts phase k + 1's tasks only after an acquire load of open that saw it;
 *  (b) every task's writes by the calling thread when the call returns: the built-in threads
 *      release-increment `left` after their last task and the caller acquire-loads it (then
 *      joins); a pool's workers release-decrement its `remaining` (threadpool.c); a hook's
 *      caller acquire-loads open, which the last phase's completion stored (a);
 *  (c) the region itself (phases, contexts, counters at 0) by every thread: pthread_create, the
 *      pool's mutex, or the hook's own hand-over of its jobs (any of which synchronises).
 * next[k] is a ticket counter (relaxed: a fetch_add is atomic at any ordering and orders
 * nothing else); ran[] and bad_job are diagnostics of a hook's contract, read by the caller
 * after the hook returned (relaxed: a hook that ran jobs without synchronising with its
 * return already leaves the outputs undefined, which the caller then reports). */

typedef struct region {
    const sdpa__phase *ph;
    int nph;
    atomic_llong next[SDPA__MAX_PHASES], done[SDPA__MAX_PHASES];
    atomic_int open; /* phases [0, open) may be claimed; open > nph: the region is over */
    int njobs;                               /* the jobs handed to a pool or hook: [0, njobs) */
    atomic_uchar ran[SDPA__MAX_THREADS];     /* job k has been started (a hook runs each once) */
    atomic_int bad_job;                      /* a job number out of range or run twice (-1: none) */
} region;

/* The wait of a thread on another's progress: spin, then (the machine may be shared) give the
 * core to the thread we wait for. */
static void relax(int *spins) {
    if (++*spins > 64)
        sched_yield();
}

/* Phase k is complete: its gate, then open the next phase that has tasks (or end the region). */
static void phase_complete(region *r, int k) {
    for (;;) {
        const sdpa__phase *ph = &r->ph[k];
        /* each store of open releases what this thread acquired through done[k] (a) */
        if (ph->gate != NULL && !ph->gate(ph->gate_ctx)) {
            atomic_store_explicit(&r->open, r->nph + 1, memory_order_release);
            return;
        }
        ++k;
        if (k >= r->nph) {
            atomic_store_explicit(&r->open, r->nph + 1, memory_order_release);
            return;
        }
        if (r->ph[k].ntasks > 0) {
            atomic_store_explicit(&r->open, k + 1, memory_order_release);
            return;
        }
    }
}

static void region_work(region *r, int thread_index) {
    for (int k = 0; k < r->nph; ++k) {
        int open, spins = 0;
        /* acquire: pairs with phase_complete's release store (a) */
        while ((open = atomic_load_explicit(&r->open, memory_order_acquire)) <= k)
            relax(&spins);
        if (open > r->nph)
            return;
        const sdpa__phase *ph = &r->ph[k];
        for (;;) {
            const int64_t t = (int64_t)atomic_fetch_add_explicit(&r->next[k], 1, memory_order_relaxed);
            if (t >= ph->ntasks)
                break;
            ph->fn(ph->ctx, t, thread_index);
            /* release: this task's writes; acquire: the other tasks' of the phase, for the
             * thread whose increment completes it (a) */
            if ((int64_t)atomic_fetch_add_explicit(&r->done[k], 1, memory_order_acq_rel) + 1 == ph->ntasks)
                phase_complete(r, k);
        }
    }
}

typedef struct region_arg {
    region *r;
    int thread_index;
    atomic_int *left; /* the built-in threads that have finished their region_work */
} region_arg;

static void *thread_main(void *arg) {
    region_arg *a = (region_arg *)arg;
    atomic_int *left = a->left;
    region_work(a->r, a->thread_index);
    /* release: pairs with the caller's acquire load of left (b); touches nothing of the call
     * after this */
    atomic_fetch_add_explicit(left, 1, memory_order_release);
    return NULL;
}

/* Job k of a pool or hook: its thread_index is k, which selects per-thread scratch, so a job
 * number out of [0, njobs) or one run twice (a hook breaking its contract) is refused, not run. */
static void region_job(void *ctx, int64_t k) {
    region *r = (region *)ctx;
    if (k < 0 || k >= r->njobs || atomic_exchange_explicit(&r->ran[k], 1, memory_order_relaxed)) {
        int none = -1; /* the first bad job is kept (relaxed: a diagnostic, above) */
        atomic_compare_exchange_strong_explicit(&r->bad_job, &none, k < 0 || k >= r->njobs ? -2 : (int)k,
                                                memory_order_relaxed, memory_order_relaxed);
        return;
    }
    region_work(r, (int)k);
}

sdpa_status sdpa__run_phases(const sdpa__exec *ex, int nthreads, const sdpa__phase *ph, int nph) {
    if (nph <= 0)
        return SDPA_OK;
    if (nph > SDPA__MAX_PHASES)
        nph = SDPA__MAX_PHASES; /* internal callers stay below; never more */
    region r;
    r.ph = ph;
    r.nph = nph;
    int64_t most = 0;
    for (int k = 0; k < nph; ++k) {
        atomic_init(&r.next[k], 0);
        atomic_init(&r.done[k], 0);
        most = ph[k].ntasks > most ? ph[k].ntasks : most;
    }
    atomic_init(&r.open, 0);
    /* relaxed: no other thread exists yet; their start publishes the region (c) */
    if (ph[0].ntasks > 0)
        atomic_store_explicit(&r.open, 1, memory_order_relaxed);
    else
        phase_complete(&r, 0);
    if (atomic_load_explicit(&r.open, memory_order_relaxed) > nph)
        return SDPA_OK; /* no task in any phase that is open */
    if (nthreads > SDPA__MAX_THREADS)
        nthreads = SDPA__MAX_THREADS;
    if ((int64_t)nthreads > most)
        nthreads = (int)most;
    if (nthreads <= 1) {
        region_work(&r, 0);
        return SDPA_OK;
    }
    r.njobs = nthreads;
    for (int k = 0; k < nthreads; ++k)
        atomic_init(&r.ran[k], 0);
    atomic_init(&r.bad_job, -1);
    if (ex != NULL && ex->pool != NULL) {
        sdpa__threadpool_run(ex->pool, nthreads, region_job, &r);
        return SDPA_OK;
    }
    if (ex != NULL && ex->hook != NULL) {
        ex->hook(ex->hook_ctx, nthreads, region_job, &r);
        const char *fn = ex->fn != NULL ? ex->fn : "libsdpa"; /* the entry's name (the plan's) */
        const int bad = atomic_load_explicit(&r.bad_job, memory_order_relaxed);
        if (bad == -2)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: the parallel_for hook ran a task number outside [0, %d) (the "
                              "outputs are undefined)", fn, nthreads);
        if (bad >= 0)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: the parallel_for hook ran task %d twice (each of [0, %d) runs "
                              "exactly once; the outputs are undefined)", fn, bad, nthreads);
        for (int k = 0; k < nthreads; ++k)
            if (!atomic_load_explicit(&r.ran[k], memory_order_relaxed))
                return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                                  "%s: the parallel_for hook returned without running task %d (it "
                                  "must run every task in [0, %d) exactly once; the outputs are undefined)", fn, k,
                                  nthreads);
        /* acquire: pairs with the release store of the last phase's completion (b) */
        if (atomic_load_explicit(&r.open, memory_order_acquire) <= nph)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: the parallel_for hook returned before its tasks had returned "
                              "(the outputs are undefined)", fn);
        return SDPA_OK;
    }
    pthread_t tid[SDPA__MAX_THREADS];
    region_arg args[SDPA__MAX_THREADS];
    atomic_int left;
    atomic_init(&left, 0);
    int started = 0;
    for (int t = 1; t < nthreads; ++t) {
        args[t].r = &r;
        args[t].thread_index = t;
        args[t].left = &left;
        if (pthread_create(&tid[t], NULL, thread_main, &args[t]) != 0)
            break; /* fewer threads: the tasks still all run, on the threads we have */
        started = t;
    }
    region_work(&r, 0);
    /* Wait for the threads' last tasks awake (as region_work waits for a phase), then join: a
     * joiner asleep in the kernel wakes late on a VM (its vCPU halted), and the join itself is
     * then short (the threads are exiting). */
    for (int spins = 0; atomic_load_explicit(&left, memory_order_acquire) < started;) /* (b) */
        relax(&spins);
    for (int t = 1; t <= started; ++t)
        pthread_join(tid[t], NULL);
    return SDPA_OK;
}
