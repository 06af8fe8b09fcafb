/* sdpa-bench: times libsdpa's attention paths against two floors, in one process.
 *
 * For every shape (B, H, L, S, E) it runs these candidates, each at every thread count of
 * --threads (default 1,2):
 *   blas-floor  the two sgemm products of the same shape through OpenBLAS alone: for each
 *               (b, h) S = Q.K^T [L, S], then O = S.V (no scale, no softmax); the score
 *               buffer is allocated outside the timing. OpenBLAS's thread count is set to the
 *               row's thread count for these calls only and restored right after, so the
 *               library rows run under OpenBLAS's own default.
 *   bw-floor    (L <= 4 only) a plain sequential read of the K and V bytes: the sum of all
 *               floats, split into contiguous chunks over the row's thread count (pthreads).
 *   reference, tiled, decode (L <= 4 only), auto
 *               sdpa_attention() with options.kernel = REFERENCE / TILED / DECODE / AUTO and
 *               options.num_threads = the row's thread count; everything else at defaults
 *               (finite check on, internal workspace), as a user calls it.
 *
 * Each candidate gets --warmup untimed calls and one untimed memory probe, then the
 * candidates of a shape run round-robin (one call each per round, the starting candidate
 * rotating) for the shape's repetitions, BLAS-free candidates in a first phase and those that
 * use OpenBLAS in a second (see the rep loop); a row reports the median. Every library call's
 * output is compared with the reference path's output (max_abs_diff_ref) and, on a sample
 * of rows, with a double-precision evaluation written here (max_abs_diff_naive).
 * A forced kernel that answers SDPA_ERR_UNSUPPORTED is reported as "unsupported".
 *
 * Exit status: 0 when every library row is ok or unsupported and within --tol; 1 when a
 * call failed otherwise or an output differs beyond --tol; 2 on a usage error.
 */
#include <sdpa.h>

#include <cblas.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS_LIST 16
#define MAX_REPS 1000
#define NAIVE_ROWS 8

/* ------------------------------------------------------------------ shapes */

typedef struct shape {
    const char *kind; /* dense, causal, cross, decode, memory */
    int64_t B, H, L, S, E;
    int causal;
} shape;

static const shape full_shapes[] = {
    {"dense", 1, 8, 128, 128, 64, 0},
    {"dense", 1, 8, 512, 512, 64, 0},
    {"dense", 1, 8, 1024, 1024, 64, 0},
    {"dense", 1, 16, 2048, 2048, 64, 0},
    {"dense", 1, 8, 4096, 4096, 128, 0},
    {"causal", 1, 8, 512, 512, 64, 1},
    {"causal", 1, 8, 1024, 1024, 64, 1},
    {"causal", 1, 16, 2048, 2048, 64, 1},
    {"causal", 1, 8, 4096, 4096, 128, 1},
    {"cross", 2, 8, 64, 1024, 64, 0},
    {"decode", 1, 32, 1, 4096, 128, 0},
    {"decode", 8, 32, 1, 1024, 128, 0},
    {"memory", 1, 8, 8192, 8192, 64, 0},
};

static const shape smoke_shapes[] = {
    {"dense", 1, 2, 16, 16, 8, 0},
    {"dense", 2, 3, 70, 70, 16, 0},
    {"causal", 1, 2, 33, 33, 8, 1},
    {"cross", 2, 2, 5, 40, 8, 0},
    {"decode", 1, 4, 1, 64, 16, 0},
    {"decode", 2, 2, 3, 17, 8, 0},
};

static void shape_name(const shape *s, char *buf, size_t n) {
    snprintf(buf, n, "%s-%lldx%lldx%lldx%lldx%lld", s->kind, (long long)s->B, (long long)s->H, (long long)s->L,
             (long long)s->S, (long long)s->E);
}

/* Query-key pairs per (b, h) that the shape allows (top-left causal: row i sees min(i+1, S)). */
static double allowed_pairs(const shape *s) {
    if (!s->causal)
        return (double)s->L * (double)s->S;
    double n = 0;
    for (int64_t i = 0; i < s->L; ++i)
        n += (double)(i + 1 < s->S ? i + 1 : s->S);
    return n;
}

/* ------------------------------------------------------------------- paths */

typedef enum path {
    PATH_BLAS_FLOOR,
    PATH_BW_FLOOR,
    PATH_REFERENCE,
    PATH_TILED,
    PATH_DECODE,
    PATH_AUTO,
    PATH_COUNT
} path;

static const char *const path_names[PATH_COUNT] = {"blas-floor", "bw-floor", "reference", "tiled", "decode", "auto"};

static int path_is_library(path p) { return p >= PATH_REFERENCE; }

static int32_t path_kernel(path p) {
    switch (p) {
    case PATH_REFERENCE: return SDPA_KERNEL_REFERENCE;
    case PATH_TILED: return SDPA_KERNEL_TILED;
    case PATH_DECODE: return SDPA_KERNEL_DECODE;
    default: return SDPA_KERNEL_AUTO;
    }
}

typedef enum cand_state { CAND_OK, CAND_UNSUPPORTED, CAND_ERROR } cand_state;

typedef struct candidate {
    path path;
    int threads;
    cand_state state;
    char kernel[48];
    char note[160];
    double times[MAX_REPS];
    int ntimes;
    double cpu_ms_sum, wall_ms_sum; /* over the timed calls: CPU time of the process / wall time */
    size_t ws_bytes;
    long long rss_growth; /* bytes; -1 = not measured */
    double diff_ref;      /* max over calls; NAN = not applicable */
    double diff_naive;
    float *out;
} candidate;

/* ------------------------------------------------------------------ config */

typedef struct config {
    int smoke;
    int reps;
    int warmup;
    double min_time_ms; /* raise a cheap shape's repetitions until a candidate's total reaches this */
    double blas_quiet_ms; /* pause after an OpenBLAS-using call before a call that uses no BLAS */
    int threads[MAX_THREADS_LIST];
    int nthreads;
    const char *csv_path;
    const char *shapes_filter;
    double tol;
    int flush_mode; /* 0 none, 1 decode shapes, 2 all shapes */
    size_t flush_bytes;
    int rss_probe;
} config;

/* ------------------------------------------------------------------ helpers */

/* CPU time (user + system) of the whole process, all threads, in ms. */
static double cpu_ms(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

static double last_cpu_ms; /* CPU time of the last call_candidate() */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void *xalloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "sdpa-bench: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_uniform(void) { /* splitmix64 -> [-1, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(const double *v, int n) {
    double tmp[MAX_REPS];
    memcpy(tmp, v, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* Replace characters that would break a CSV field or a whitespace-separated row. */
static void sanitize(char *s) {
    for (; *s; ++s)
        if (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '"')
            *s = (*s == ' ') ? '_' : ';';
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) /* also catches NaN */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* --------------------------------------------------- peak memory (RSS) probe */
/* Peak RSS growth of one call: return freed heap pages to the system (malloc_trim), reset the
 * kernel's peak-RSS mark (write "5" to /proc/self/clear_refs, Linux >= 4.0), read VmRSS, make
 * the call, read VmHWM. Without clear_refs the probe is reported as not measured. */

static long long proc_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

static int reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f)
        return 0;
    int ok = fputs("5", f) >= 0;
    ok = (fclose(f) == 0) && ok;
    return ok;
}

static long long rss_probe_begin(void) {
    malloc_trim(0);
    if (!reset_peak_rss())
        return -1;
    return proc_status_kib("VmRSS");
}

static long long rss_probe_end(long long before_kib) {
    if (before_kib < 0)
        return -1;
    long long hwm = proc_status_kib("VmHWM");
    if (hwm < 0)
        return -1;
    return hwm > before_kib ? (hwm - before_kib) * 1024 : 0;
}

/* -------------------------------------------------------- bandwidth floor */

/* Sum of n floats with 64 independent partial sums, so the compiler vectorises the reduction
 * without reassociating and keeps several vector add chains in flight (4 with AVX-512);
 * one clone per ISA level, picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static float sum_floats(const float *x, size_t n) {
    float acc[64] = {0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; ++j)
            acc[j] += x[i + j];
    for (; i < n; ++i)
        acc[0] += x[i];
    float s = 0;
    for (int j = 0; j < 64; ++j)
        s += acc[j];
    return s;
}

typedef struct bw_task {
    const float *a, *b;
    size_t na, nb;
    float result;
} bw_task;

static void *bw_main(void *arg) {
    bw_task *t = (bw_task *)arg;
    t->result = sum_floats(t->a, t->na) + sum_floats(t->b, t->nb);
    return NULL;
}

static volatile float bw_sink;

/* Read k[0..nk) and v[0..nv) once, split into `threads` contiguous chunks of each. */
static void bandwidth_floor(const float *k, size_t nk, const float *v, size_t nv, int threads) {
    bw_task tasks[64];
    pthread_t tid[64];
    int started[64] = {0};
    if (threads > 64)
        threads = 64;
    for (int t = 0; t < threads; ++t) {
        size_t ka = nk * (size_t)t / (size_t)threads, kb = nk * (size_t)(t + 1) / (size_t)threads;
        size_t va = nv * (size_t)t / (size_t)threads, vb = nv * (size_t)(t + 1) / (size_t)threads;
        tasks[t] = (bw_task){k + ka, v + va, kb - ka, vb - va, 0.0f};
    }
    for (int t = 1; t < threads; ++t)
        started[t] = pthread_create(&tid[t], NULL, bw_main, &tasks[t]) == 0;
    bw_main(&tasks[0]);
    float s = tasks[0].result;
    for (int t = 1; t < threads; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            bw_main(&tasks[t]);
        s += tasks[t].result;
    }
    bw_sink = s;
}

/* Evict the caches before a call: read a buffer larger than the last-level cache. */
static float *flush_buf;
static size_t flush_floats;
static void flush_caches(void) {
    if (flush_buf)
        bw_sink = sum_floats(flush_buf, flush_floats);
}

/* ------------------------------------------------------------ the BLAS floor */

#ifdef SDPA_BENCH_OPENBLAS_THREADS
static int openblas_default_threads = 0;
#endif
static char blas_core[64] = "unknown"; /* OpenBLAS's kernel family (openblas_get_corename) */

static void blas_floor(const shape *s, const float *q, const float *k, const float *v, float *scores, float *o,
                       int threads) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
    const int64_t L = s->L, S = s->S, E = s->E;
    for (int64_t bh = 0; bh < s->B * s->H; ++bh) {
        const float *qb = q + bh * L * E, *kb = k + bh * S * E, *vb = v + bh * S * E;
        float *ob = o + bh * L * E;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)L, (int)S, (int)E, 1.0f, qb, (int)E, kb, (int)E, 0.0f,
                    scores, (int)S);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)L, (int)E, (int)S, 1.0f, scores, (int)S, vb, (int)E,
                    0.0f, ob, (int)E);
    }
}

static void blas_floor_restore(void) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_set_num_threads(openblas_default_threads);
#endif
}

/* ------------------------------------------- naive double-precision check */

/* Max abs difference of `out` from a double-precision evaluation on NAIVE_ROWS sampled rows
 * (first and last rows included). */
static double naive_check(const shape *s, const float *q, const float *k, const float *v, const float *out) {
    const int64_t L = s->L, S = s->S, E = s->E;
    const double scale = 1.0 / sqrt((double)E);
    double *w = (double *)xalloc((size_t)S * sizeof(double));
    double worst = 0;
    for (int idx = 0; idx < NAIVE_ROWS; ++idx) {
        int64_t b = idx % s->B, h = (idx * 7) % s->H;
        int64_t i = L > 1 ? (int64_t)idx * (L - 1) / (NAIVE_ROWS - 1) : 0;
        const float *qr = q + ((b * s->H + h) * L + i) * E;
        const float *kb = k + (b * s->H + h) * S * E, *vb = v + (b * s->H + h) * S * E;
        int64_t hi = s->causal ? (i + 1 < S ? i + 1 : S) : S;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < hi; ++j) {
            double d = 0;
            for (int64_t e = 0; e < E; ++e)
                d += (double)qr[e] * (double)kb[j * E + e];
            w[j] = d * scale;
            if (w[j] > mx)
                mx = w[j];
        }
        for (int64_t j = 0; j < hi; ++j)
            sum += (w[j] = exp(w[j] - mx));
        const float *orow = out + ((b * s->H + h) * L + i) * E;
        for (int64_t e = 0; e < E; ++e) {
            double acc = 0;
            for (int64_t j = 0; j < hi; ++j)
                acc += w[j] * (double)vb[j * E + e];
            double d = fabs(acc / sum - (double)orow[e]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
    }
    free(w);
    return worst;
}

/* ------------------------------------------------------------- one shape */

typedef struct shape_data {
    const shape *s;
    float *q, *k, *v, *ref_out, *floor_out, *scores;
    sdpa_tensor tq, tk, tv;
    size_t n_qo, n_kv;
    int have_ref;
} shape_data;

static sdpa_status run_library(shape_data *d, candidate *c, float *out) {
    sdpa_tensor tout;
    sdpa_status st = sdpa_tensor_init_4d(&tout, out, d->s->B, d->s->H, d->s->L, d->s->E);
    if (st != SDPA_OK)
        return st;
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = d->s->causal;
    o.num_threads = c->threads;
    o.kernel = path_kernel(c->path);
    return sdpa_attention(&d->tq, &d->tk, &d->tv, &o, &tout, NULL, NULL);
}

/* One call of candidate c; returns its time in ms, or a negative value if it failed. */
static double call_candidate(shape_data *d, candidate *c, const config *cfg, int record_diff) {
    const shape *s = d->s;
    if (cfg->flush_mode == 2 || (cfg->flush_mode == 1 && s->L <= 4))
        flush_caches();
    double t0, t1, c0, c1;
    switch (c->path) {
    case PATH_BLAS_FLOOR:
        c0 = cpu_ms();
        t0 = now_ms();
        blas_floor(s, d->q, d->k, d->v, d->scores, d->floor_out, c->threads);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        blas_floor_restore();
        return t1 - t0;
    case PATH_BW_FLOOR:
        c0 = cpu_ms();
        t0 = now_ms();
        bandwidth_floor(d->k, d->n_kv, d->v, d->n_kv, c->threads);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        return t1 - t0;
    default: {
        c0 = cpu_ms();
        t0 = now_ms();
        sdpa_status st = run_library(d, c, c->out);
        t1 = now_ms();
        c1 = cpu_ms();
        last_cpu_ms = c1 - c0;
        if (st != SDPA_OK) {
            c->state = st == SDPA_ERR_UNSUPPORTED ? CAND_UNSUPPORTED : CAND_ERROR;
            snprintf(c->note, sizeof c->note, "%s:%s", sdpa_status_string(st), sdpa_last_error_message());
            sanitize(c->note);
            return -1;
        }
        snprintf(c->kernel, sizeof c->kernel, "%s", sdpa_last_kernel());
        sanitize(c->kernel);
        if (c->kernel[0] == '\0')
            snprintf(c->kernel, sizeof c->kernel, "?");
        if (record_diff && d->have_ref) {
            double diff = max_abs_diff(c->out, d->ref_out, d->n_qo);
            if (isnan(c->diff_ref) || diff > c->diff_ref)
                c->diff_ref = diff;
        }
        return t1 - t0;
    }
    }
}

static size_t workspace_for(shape_data *d, const candidate *c) {
    if (c->path == PATH_BLAS_FLOOR)
        return (size_t)d->s->L * (size_t)d->s->S * sizeof(float);
    if (c->path == PATH_BW_FLOOR)
        return 0;
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = d->s->causal;
    o.num_threads = c->threads;
    o.kernel = path_kernel(c->path);
    size_t bytes = 0;
    return sdpa_attention_workspace_size(&d->tq, &d->tk, &d->tv, &o, 0, &bytes) == SDPA_OK ? bytes : 0;
}

static FILE *csv_file;
static int any_failure;

static void fmt_num(char *buf, size_t n, double v, const char *fmt) {
    if (isnan(v))
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, fmt, v);
}

static void report(const shape_data *d, const candidate *c, const config *cfg) {
    const shape *s = d->s;
    char name[96];
    shape_name(s, name, sizeof name);
    const char *status = c->state == CAND_OK ? "ok" : c->state == CAND_UNSUPPORTED ? "unsupported" : "error";
    double med = NAN, mn = NAN, mx = NAN, gfd = NAN, gfe = NAN, gbs = NAN, cores = NAN;
    if (c->state == CAND_OK && c->ntimes > 0) {
        med = median_of(c->times, c->ntimes);
        mn = mx = c->times[0];
        for (int i = 1; i < c->ntimes; ++i) {
            mn = c->times[i] < mn ? c->times[i] : mn;
            mx = c->times[i] > mx ? c->times[i] : mx;
        }
        double bh = (double)s->B * (double)s->H;
        double dense = 4.0 * bh * (double)s->L * (double)s->S * (double)s->E;
        double eff = 4.0 * bh * allowed_pairs(s) * (double)s->E;
        if (c->path != PATH_BW_FLOOR) {
            gfd = dense / (med * 1e6);
            gfe = (c->path == PATH_BLAS_FLOOR ? dense : eff) / (med * 1e6);
        }
        if (s->L <= 4)
            gbs = 2.0 * (double)d->n_kv * sizeof(float) / (med * 1e6);
        if (c->wall_ms_sum >= 100) /* process CPU time is accounted per scheduler tick: '-' below 100 ms */
            cores = c->cpu_ms_sum / c->wall_ms_sum;
    }
    int wrong = path_is_library(c->path) && c->state == CAND_OK &&
                (!(c->diff_ref <= cfg->tol || isnan(c->diff_ref)) || !(c->diff_naive <= cfg->tol));
    if (wrong) {
        status = "wrong";
        any_failure = 1;
    }
    if (c->state == CAND_ERROR)
        any_failure = 1;
    char smed[32], smin[32], smax[32], sgfd[32], sgfe[32], sgbs[32], scores[32], sdr[32], sdn[32], sws[32], srss[32];
    fmt_num(smed, sizeof smed, med, "%.4f");
    fmt_num(smin, sizeof smin, mn, "%.4f");
    fmt_num(smax, sizeof smax, mx, "%.4f");
    fmt_num(sgfd, sizeof sgfd, gfd, "%.2f");
    fmt_num(sgfe, sizeof sgfe, gfe, "%.2f");
    fmt_num(sgbs, sizeof sgbs, gbs, "%.2f");
    fmt_num(scores, sizeof scores, cores, "%.2f");
    fmt_num(sdr, sizeof sdr, c->diff_ref, "%.3g");
    fmt_num(sdn, sizeof sdn, c->diff_naive, "%.3g");
    snprintf(sws, sizeof sws, "%.2f", (double)c->ws_bytes / 1048576.0);
    fmt_num(srss, sizeof srss, c->rss_growth < 0 ? NAN : (double)c->rss_growth / 1048576.0, "%.2f");
    char srss_bytes[32];
    if (c->rss_growth < 0)
        snprintf(srss_bytes, sizeof srss_bytes, "-");
    else
        snprintf(srss_bytes, sizeof srss_bytes, "%lld", c->rss_growth);
    const char *kernel = c->kernel[0] ? c->kernel : "-";
    const char *note = c->note[0] ? c->note : "-";
    printf("%-30s %-11s %3d %-11s %-16s %4d %11s %11s %9s %9s %8s %5s %9s %9s %9s %9s  %s\n", name,
           path_names[c->path], c->threads, status, kernel, c->ntimes, smed, smin, sgfd, sgfe, sgbs, scores, sws, srss,
           sdr, sdn, note);
    fflush(stdout);
    if (csv_file) {
        fprintf(csv_file, "%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%s,%s,%d,%s,%s,%s,%s,%s,%s,%s,%zu,%s,%s,%s,%s,%s\n",
                name,
                s->kind, (long long)s->B, (long long)s->H, (long long)s->L, (long long)s->S, (long long)s->E,
                (long long)s->E, s->causal, path_names[c->path], c->threads, status, kernel, c->ntimes, smed, smin, smax,
                sgfd, sgfe, sgbs, scores, c->ws_bytes, srss_bytes, sdr, sdn, blas_core, note);
        fflush(csv_file);
    }
}

static void bench_shape(const shape *s, const config *cfg) {
    shape_data d;
    memset(&d, 0, sizeof d);
    d.s = s;
    d.n_qo = (size_t)(s->B * s->H * s->L * s->E);
    d.n_kv = (size_t)(s->B * s->H * s->S * s->E);
    d.q = (float *)xalloc(d.n_qo * sizeof(float));
    d.k = (float *)xalloc(d.n_kv * sizeof(float));
    d.v = (float *)xalloc(d.n_kv * sizeof(float));
    d.ref_out = (float *)xalloc(d.n_qo * sizeof(float));
    d.floor_out = (float *)xalloc(d.n_qo * sizeof(float));
    d.scores = (float *)xalloc((size_t)(s->L * s->S) * sizeof(float));
    for (size_t i = 0; i < d.n_qo; ++i)
        d.q[i] = rand_uniform();
    for (size_t i = 0; i < d.n_kv; ++i)
        d.k[i] = rand_uniform();
    for (size_t i = 0; i < d.n_kv; ++i)
        d.v[i] = rand_uniform();
    memset(d.ref_out, 0, d.n_qo * sizeof(float));
    memset(d.floor_out, 0, d.n_qo * sizeof(float));
    memset(d.scores, 0, (size_t)(s->L * s->S) * sizeof(float));
    if (sdpa_tensor_init_4d(&d.tq, d.q, s->B, s->H, s->L, s->E) != SDPA_OK ||
        sdpa_tensor_init_4d(&d.tk, d.k, s->B, s->H, s->S, s->E) != SDPA_OK ||
        sdpa_tensor_init_4d(&d.tv, d.v, s->B, s->H, s->S, s->E) != SDPA_OK) {
        fprintf(stderr, "sdpa-bench: cannot build views: %s\n", sdpa_last_error_message());
        exit(1);
    }

    /* The reference output every library call is compared with (untimed). */
    {
        candidate rc;
        memset(&rc, 0, sizeof rc);
        rc.path = PATH_REFERENCE;
        rc.threads = cfg->threads[cfg->nthreads - 1];
        d.have_ref = run_library(&d, &rc, d.ref_out) == SDPA_OK;
        if (!d.have_ref)
            fprintf(stderr, "sdpa-bench: reference path failed: %s\n", sdpa_last_error_message());
    }

    candidate *cands = (candidate *)calloc((size_t)PATH_COUNT * (size_t)cfg->nthreads, sizeof(candidate));
    if (!cands) {
        fprintf(stderr, "sdpa-bench: out of memory\n");
        exit(1);
    }
    int nc = 0;
    for (int p = 0; p < PATH_COUNT; ++p) {
        if ((p == PATH_BW_FLOOR || p == PATH_DECODE) && s->L > 4)
            continue;
        for (int t = 0; t < cfg->nthreads; ++t) {
            candidate *c = &cands[nc++];
            c->path = (path)p;
            c->threads = cfg->threads[t];
            c->state = CAND_OK;
            c->rss_growth = -1;
            c->diff_ref = NAN;
            c->diff_naive = NAN;
            if (path_is_library(c->path)) {
                c->out = (float *)xalloc(d.n_qo * sizeof(float));
                memset(c->out, 0, d.n_qo * sizeof(float));
            }
            if (c->path == PATH_BLAS_FLOOR) {
#ifdef SDPA_BENCH_OPENBLAS_THREADS
                snprintf(c->note, sizeof c->note, "openblas_threads=%d", c->threads);
#else
                snprintf(c->note, sizeof c->note, "blas_default_threads");
#endif
            }
        }
    }

    /* Warm-up, then one untimed memory probe per candidate. */
    double slowest = 0;
    for (int i = 0; i < nc; ++i) {
        candidate *c = &cands[i];
        for (int w = 0; w < cfg->warmup && c->state == CAND_OK; ++w)
            call_candidate(&d, c, cfg, 0);
        if (c->state != CAND_OK)
            continue;
        c->ws_bytes = workspace_for(&d, c);
        long long before = cfg->rss_probe ? rss_probe_begin() : -1;
        double t = call_candidate(&d, c, cfg, 1);
        c->rss_growth = rss_probe_end(before);
        if (t > slowest)
            slowest = t;
    }

    /* Repetitions: raise them for cheap shapes so each candidate runs about min_time_ms. */
    int reps = cfg->reps;
    if (cfg->min_time_ms > 0 && slowest > 0) {
        double want = ceil(cfg->min_time_ms / slowest);
        if (want > reps)
            reps = want > 100 ? 100 : (int)want;
    }
    /* OpenBLAS's worker threads keep spinning for a while (about 0.1 s here) after a threaded
     * call returns, and a BLAS-free call made meanwhile shares the cores with them. So the
     * rounds run in two phases: first the candidates that use no BLAS (tiled, decode, AUTO,
     * bw-floor), after one untimed pause that lets the warm-up's BLAS threads go to sleep, then
     * those that do (blas-floor, reference). Within a phase, candidates interleave round-robin. */
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 0 && cfg->blas_quiet_ms > 0) {
            struct timespec ts = {(time_t)(cfg->blas_quiet_ms / 1000.0),
                                  (long)(fmod(cfg->blas_quiet_ms, 1000.0) * 1e6)};
            nanosleep(&ts, NULL);
        }
        for (int r = 0; r < reps; ++r) {
            for (int j = 0; j < nc; ++j) {
                candidate *c = &cands[(j + r) % nc];
                if (c->state != CAND_OK)
                    continue;
                const bool uses_blas = c->path == PATH_BLAS_FLOOR || c->path == PATH_REFERENCE;
                if (uses_blas != (phase == 1))
                    continue;
                double t = call_candidate(&d, c, cfg, 1);
                if (t >= 0 && c->ntimes < MAX_REPS) {
                    c->times[c->ntimes++] = t;
                    c->cpu_ms_sum += last_cpu_ms;
                    c->wall_ms_sum += t;
                }
            }
        }
    }

    for (int i = 0; i < nc; ++i) {
        candidate *c = &cands[i];
        if (path_is_library(c->path) && c->state == CAND_OK)
            c->diff_naive = naive_check(s, d.q, d.k, d.v, c->out);
        report(&d, c, cfg);
        free(c->out);
    }
    free(cands);
    free(d.q);
    free(d.k);
    free(d.v);
    free(d.ref_out);
    free(d.floor_out);
    free(d.scores);
}

/* ------------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f,
            "usage: sdpa-bench [--smoke] [--reps N] [--warmup N] [--min-time-ms T] [--threads 1,2]\n"
            "                  [--shapes SUBSTR[,SUBSTR...]] [--csv FILE] [--tol X]\n"
            "                  [--flush decode|all|none] [--flush-mb N] [--no-rss] [--list]\n"
            "  --smoke        tiny shapes, 2 repetitions (the meson test)\n"
            "  --reps N       timed repetitions per candidate (default 5; smoke 2)\n"
            "  --warmup N     untimed calls per candidate before the memory probe (default 1)\n"
            "  --min-time-ms  raise a cheap shape's repetitions (up to 100) until each candidate\n"
            "                 runs about this long in total (default 300; smoke 0)\n"
            "  --blas-quiet-ms T  untimed pause before the BLAS-free phase of a shape, so that\n"
            "                 OpenBLAS's spinning idle threads do not take its cores (default 200;\n"
            "                 smoke 0)\n"
            "  --threads      thread counts (default 1,2)\n"
            "  --shapes       keep shapes whose name contains one of the substrings\n"
            "                 (names: dense-1x8x128x128x64, causal-..., cross-..., decode-..., memory-...)\n"
            "  --csv FILE     also write the rows as CSV\n"
            "  --tol X        max abs difference allowed against the reference (default 1e-4)\n"
            "  --flush        read a buffer of --flush-mb before each call (default: decode shapes)\n"
            "  --flush-mb N   size of that buffer (default 2x the last-level cache, 64..1024)\n"
            "  --no-rss       skip the peak-RSS probe\n"
            "  --list         print the shape names and exit\n");
}

static int parse_threads(const char *arg, config *cfg) {
    cfg->nthreads = 0;
    const char *p = arg;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 64 || cfg->nthreads >= MAX_THREADS_LIST)
            return 0;
        cfg->threads[cfg->nthreads++] = (int)v;
        p = end;
        if (*p == ',')
            ++p;
        else if (*p)
            return 0;
    }
    return cfg->nthreads > 0;
}

static int shape_selected(const shape *s, const char *filter) {
    if (!filter || !*filter)
        return 1;
    char name[96], tok[96];
    shape_name(s, name, sizeof name);
    const char *p = filter;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof tok) {
            memcpy(tok, p, n);
            tok[n] = '\0';
            if (strstr(name, tok))
                return 1;
        }
        p += n;
        if (*p == ',')
            ++p;
    }
    return 0;
}

int main(int argc, char **argv) {
    config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.reps = -1;
    cfg.warmup = 1;
    cfg.min_time_ms = -1;
    cfg.blas_quiet_ms = -1;
    cfg.threads[0] = 1;
    cfg.threads[1] = 2;
    cfg.nthreads = 2;
    cfg.tol = 1e-4;
    cfg.flush_mode = 1;
    cfg.rss_probe = 1;
    long flush_mb = -1;
    int list = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--smoke"))
            cfg.smoke = 1;
        else if (!strcmp(a, "--list"))
            list = 1;
        else if (!strcmp(a, "--no-rss"))
            cfg.rss_probe = 0;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (val && !strcmp(a, "--reps")) {
            cfg.reps = atoi(val), ++i;
            if (cfg.reps < 1 || cfg.reps > 100) {
                fprintf(stderr, "sdpa-bench: --reps must be in 1..100\n");
                return 2;
            }
        } else if (val && !strcmp(a, "--warmup")) {
            cfg.warmup = atoi(val), ++i;
            if (cfg.warmup < 0) {
                fprintf(stderr, "sdpa-bench: --warmup must be >= 0\n");
                return 2;
            }
        } else if (val && !strcmp(a, "--min-time-ms"))
            cfg.min_time_ms = atof(val), ++i;
        else if (val && !strcmp(a, "--blas-quiet-ms"))
            cfg.blas_quiet_ms = atof(val), ++i;
        else if (val && !strcmp(a, "--threads")) {
            if (!parse_threads(val, &cfg)) {
                fprintf(stderr, "sdpa-bench: --threads wants a list like 1,2 (each 1..64)\n");
                return 2;
            }
            ++i;
        } else if (val && !strcmp(a, "--shapes"))
            cfg.shapes_filter = val, ++i;
        else if (val && !strcmp(a, "--csv"))
            cfg.csv_path = val, ++i;
        else if (val && !strcmp(a, "--tol"))
            cfg.tol = atof(val), ++i;
        else if (val && !strcmp(a, "--flush-mb"))
            flush_mb = atol(val), ++i;
        else if (val && !strcmp(a, "--flush")) {
            cfg.flush_mode = !strcmp(val, "none") ? 0 : !strcmp(val, "decode") ? 1 : !strcmp(val, "all") ? 2 : -1;
            if (cfg.flush_mode < 0) {
                fprintf(stderr, "sdpa-bench: --flush wants decode, all or none\n");
                return 2;
            }
            ++i;
        } else {
            fprintf(stderr, "sdpa-bench: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (cfg.reps < 0)
        cfg.reps = cfg.smoke ? 2 : 5;
    if (cfg.min_time_ms < 0)
        cfg.min_time_ms = cfg.smoke ? 0 : 300;
    if (cfg.blas_quiet_ms < 0)
        cfg.blas_quiet_ms = cfg.smoke ? 0 : 200;
    const shape *shapes = cfg.smoke ? smoke_shapes : full_shapes;
    size_t nshapes = cfg.smoke ? sizeof smoke_shapes / sizeof *smoke_shapes : sizeof full_shapes / sizeof *full_shapes;
    if (list) {
        for (size_t i = 0; i < nshapes; ++i) {
            char name[96];
            shape_name(&shapes[i], name, sizeof name);
            printf("%s\n", name);
        }
        return 0;
    }

#ifdef SDPA_BENCH_OPENBLAS_THREADS
    openblas_default_threads = openblas_get_num_threads();
#endif
#ifdef SDPA_BENCH_OPENBLAS_CORENAME
    snprintf(blas_core, sizeof blas_core, "%s", openblas_get_corename());
    sanitize(blas_core);
#endif
    if (cfg.flush_mode != 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (flush_mb < 0)
            flush_mb = l3 > 0 ? 2 * l3 / (1024 * 1024) : 512;
        if (flush_mb < 64)
            flush_mb = 64;
        if (flush_mb > 1024)
            flush_mb = 1024;
        if (cfg.smoke)
            flush_mb = 1;
        cfg.flush_bytes = (size_t)flush_mb * 1024 * 1024;
        flush_floats = cfg.flush_bytes / sizeof(float);
        flush_buf = (float *)xalloc(cfg.flush_bytes);
        for (size_t i = 0; i < flush_floats; ++i)
            flush_buf[i] = 1.0f;
    }
    if (cfg.csv_path) {
        csv_file = fopen(cfg.csv_path, "w");
        if (!csv_file) {
            fprintf(stderr, "sdpa-bench: cannot write %s: %s\n", cfg.csv_path, strerror(errno));
            return 2;
        }
        fprintf(csv_file, "shape,kind,B,H,L,S,E,Ev,causal,path,threads,status,kernel,reps,median_ms,min_ms,max_ms,"
                          "gflops_dense,gflops_eff,gbps,cpu_cores,ws_bytes,rss_growth_bytes,max_abs_diff_ref,max_abs_diff_naive,"
                          "blas_core,note\n");
    }

    long long rss_check = rss_probe_begin();
#if defined(__x86_64__) && defined(__GNUC__)
    /* OpenBLAS releases older than the CPU fall back to generic kernels (0.3.21 picks
     * "Prescott", SSE3, on Emerald Rapids): every BLAS-based number is then far from what
     * the machine can do. */
    if ((!strcmp(blas_core, "Prescott") || !strcmp(blas_core, "Core2") || !strcmp(blas_core, "Nehalem")) &&
        __builtin_cpu_supports("avx2"))
        printf("# WARNING: OpenBLAS runs its %s kernels on a CPU with AVX2%s; OPENBLAS_CORETYPE=%s selects faster "
               "ones\n",
               blas_core, __builtin_cpu_supports("avx512f") ? " and AVX-512" : "",
               __builtin_cpu_supports("avx512f") ? "SkylakeX (or Cooperlake)" : "Haswell");
#endif
    const char *coretype_env = getenv("OPENBLAS_CORETYPE");
    printf("# sdpa-bench: libsdpa %s, %ld online CPUs, BLAS core %s (OPENBLAS_CORETYPE=%s), OpenBLAS default threads "
           "%d, reps>=%d, warmup %d, min-time %.0f ms, blas-quiet %.0f ms, tol %g\n",
           sdpa_version_string(), sysconf(_SC_NPROCESSORS_ONLN), blas_core, coretype_env ? coretype_env : "unset",
#ifdef SDPA_BENCH_OPENBLAS_THREADS
           openblas_default_threads,
#else
           -1,
#endif
           cfg.reps, cfg.warmup, cfg.min_time_ms, cfg.blas_quiet_ms, cfg.tol);
    printf("# floors: blas-floor = 2 sgemm per (b,h), OpenBLAS threads set to the row's count; "
           "bw-floor = sum of K and V floats over the row's threads; cache flush %s (%zu MiB read before each call)\n",
           cfg.flush_mode == 0 ? "off" : cfg.flush_mode == 1 ? "on decode shapes" : "on all shapes",
           cfg.flush_bytes >> 20);
    printf("# cores = process CPU time / wall time over the timed calls, when they add up to >= 100 ms (OpenBLAS's "
           "idle threads spin for a while after a multi-threaded BLAS call; that shows here too)\n");
    printf("# memory: ws_MiB = sdpa_attention_workspace_size (blas-floor: its score buffer); rss_MiB = peak RSS "
           "growth of one untimed call (%s)\n",
           !cfg.rss_probe ? "disabled" : rss_check >= 0 ? "malloc_trim, /proc/self/clear_refs 5, VmHWM - VmRSS"
                                                         : "unavailable: /proc/self/clear_refs not writable");
    printf("%-30s %-11s %3s %-11s %-16s %4s %11s %11s %9s %9s %8s %5s %9s %9s %9s %9s  %s\n", "shape", "path", "thr",
           "status", "kernel", "reps", "median_ms", "min_ms", "GF/s", "GF/s_eff", "GB/s", "cores", "ws_MiB", "rss_MiB",
           "diff_ref", "diff_naive", "note");
    fflush(stdout);

    double t_start = now_ms();
    for (size_t i = 0; i < nshapes; ++i)
        if (shape_selected(&shapes[i], cfg.shapes_filter))
            bench_shape(&shapes[i], &cfg);
    printf("# done in %.1f s%s\n", (now_ms() - t_start) / 1e3, any_failure ? "; FAILURES (see status column)" : "");
    if (csv_file)
        fclose(csv_file);
    free(flush_buf);
    return any_failure ? 1 : 0;
}
