/* The bench programs' shared helpers: a monotonic clock and the comparison qsort() takes to
 * order timings (sdpa-bench, pool-overhead, decode-probe). Header-only, static inline. */
#ifndef SDPA_BENCH_CLOCK_H
#define SDPA_BENCH_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC. */
static inline double bench_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Ascending order of doubles, for qsort(). */
static inline int bench_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
