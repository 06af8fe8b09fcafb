/* sdpa-kv8-bench: issue 31's table (0.6 8-bit K/V caches and RoPE in the cache write), in one
 * process, every row against baselines measured in the same run:
 *
 *   decode   (B, Hq, Hkv, L = 1, S, E = Ev = 128) with K/V caches of f16, bf16, q8_0, FP8 E4M3
 *            / E5M2 (unscaled, and E4M3 with k_scale = v_scale = [1] 0.5), DEFAULT precision, and
 *            REDUCED on the GQA shape. K/V bytes are evicted before every call (a 64 MiB buffer
 *            is written in between), as a serving step finds them. Columns: the kernel the
 *            library chose, median and p10/p90 ms, the floor (one read of the same cache bytes,
 *            scales included, with the same thread count, after the same eviction), floor / time
 *            (1 = at the floor) and f16 / time (the speed-up over the f16 cache of that shape).
 *   prefill  (1, 32, 8, L = S = 1024, 128), causal, f16 vs 8-bit K/V: time / f16's time.
 *   kv_write T = 256 rows, Hkv = 8, E = 128 into a paged pool (block_size 16, 4096 slots), f16
 *            and q8_0 caches, plain vs with RoPE on the keys (NeoX, float32 tables): rope / plain.
 *
 * The cache contents are the same values in every dtype: float32 rows in [-1, 1) written into
 * each cache by sdpa_kv_write_ex (round to nearest even; q8_0 as ggml quantizes).
 *
 *   sdpa-kv8-bench [--threads N] [--reps R] [--quick]
 *     --threads N  the library's threads (a caller sdpa_threadpool of N, no per-call thread
 *                  start-up) and the floor's (default 2)
 *     --reps R     timed calls per decode row (default 21; prefill 5; kv_write 10 R + 1)
 *     --quick      the smoke run: small shapes, 3 reps (meson test, suite bench)
 * Output: one line per row, "key=value" fields (bench/README.md). */
#define _POSIX_C_SOURCE 200809L
#include <sdpa.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_clock.h"

#define FLUSH_BYTES ((size_t)64 << 20)

static int g_threads = 2, g_reps = 21, g_quick = 0;
static sdpa_threadpool *g_pool;
static unsigned char *g_flush;

static void die(const char *what, sdpa_status st) {
    fprintf(stderr, "sdpa-kv8-bench: %s: %s: %s\n", what, sdpa_status_string(st), sdpa_last_error_message());
    exit(1);
}
#define CHECK(what, call)                                                                                         \
    do {                                                                                                          \
        const sdpa_status st_ = (call);                                                                           \
        if (st_ != SDPA_OK)                                                                                       \
            die(what, st_);                                                                                       \
    } while (0)

static void *xalloc(size_t n) {
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (p == NULL) {
        fprintf(stderr, "sdpa-kv8-bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void evict(void) {
    for (size_t i = 0; i < FLUSH_BYTES; i += 64)
        g_flush[i]++;
}

/* ---------------------------------------------------------------- the floor */

typedef struct rd_task {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} rd_task;

static void *rd_main(void *arg) {
    rd_task *t = (rd_task *)arg;
    uint64_t acc[16] = {0};
    size_t i = 0;
    for (; i + 16 <= t->n; i += 16)
        for (int j = 0; j < 16; ++j)
            acc[j] += t->p[i + j];
    for (; i < t->n; ++i)
        acc[0] += t->p[i];
    uint64_t s = 0;
    for (int j = 0; j < 16; ++j)
        s += acc[j];
    t->sum = s;
    return NULL;
}

static volatile uint64_t g_sink;

/* The floor's threads are started once (as the library's pool is), so a floor read pays no
 * thread start-up: workers wait at a barrier, read their share of every buffer, meet again. */
static pthread_barrier_t g_start, g_done;
static rd_task g_task[64][2];
static int g_nbuf, g_stop;

static void *floor_worker(void *arg) {
    const int t = (int)(intptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&g_start);
        if (g_stop)
            return NULL;
        for (int b = 0; b < g_nbuf; ++b)
            rd_main(&g_task[t][b]);
        pthread_barrier_wait(&g_done);
    }
}

static pthread_t g_workers[64];

static void floor_start(void) {
    pthread_barrier_init(&g_start, NULL, (unsigned)g_threads);
    pthread_barrier_init(&g_done, NULL, (unsigned)g_threads);
    for (int t = 1; t < g_threads; ++t)
        if (pthread_create(&g_workers[t], NULL, floor_worker, (void *)(intptr_t)t) != 0) {
            fprintf(stderr, "sdpa-kv8-bench: pthread_create failed\n");
            exit(1);
        }
}

static void floor_stop(void) {
    g_stop = 1;
    pthread_barrier_wait(&g_start);
    for (int t = 1; t < g_threads; ++t)
        pthread_join(g_workers[t], NULL);
}

/* Read nbuf (<= 2) buffers once, each split across the threads. */
static void read_once(const void *const *buf, const size_t *bytes, int nbuf) {
    const int nt = g_threads;
    g_nbuf = nbuf;
    for (int b = 0; b < nbuf; ++b)
        for (int t = 0; t < nt; ++t) {
            const size_t words = bytes[b] / 8, a = words * (size_t)t / (size_t)nt, z = words * (size_t)(t + 1) / (size_t)nt;
            g_task[t][b] = (rd_task){(const uint64_t *)buf[b] + a, z - a, 0};
        }
    pthread_barrier_wait(&g_start);
    for (int b = 0; b < nbuf; ++b)
        rd_main(&g_task[0][b]);
    pthread_barrier_wait(&g_done);
    uint64_t s = 0;
    for (int t = 0; t < nt; ++t)
        for (int b = 0; b < nbuf; ++b)
            s += g_task[t][b].sum;
    g_sink = s;
}

/* ----------------------------------------------------------------- caches */

typedef struct kvtype {
    const char *name;
    sdpa_dtype dt;
    float scale; /* FP8 scale (0: none) */
} kvtype;

static const kvtype KV_TYPES[] = {
    {"f16", SDPA_DTYPE_F16, 0}, {"bf16", SDPA_DTYPE_BF16, 0}, {"q8_0", SDPA_DTYPE_Q8_0, 0},
    {"fp8_e4m3", SDPA_DTYPE_FP8_E4M3, 0}, {"fp8_e5m2", SDPA_DTYPE_FP8_E5M2, 0},
    {"fp8_e4m3*0.5", SDPA_DTYPE_FP8_E4M3, 0.5f},
};
#define N_KV (sizeof KV_TYPES / sizeof KV_TYPES[0])

/* Bytes of a [B, Hkv, S, E] cache of dtype dt. */
static size_t cache_bytes(sdpa_dtype dt, int64_t n_rows, int64_t E) {
    return dt == SDPA_DTYPE_Q8_0 ? (size_t)n_rows * (size_t)(E / SDPA_Q8_0_BLOCK) * SDPA_Q8_0_BLOCK_BYTES
                                 : (size_t)n_rows * (size_t)E * sdpa_dtype_size(dt);
}

/* A dense [B, Hkv, S, E] cache view of dtype dt (a q8_0 view's strides count blocks). */
static void cache_view(sdpa_tensor *t, void *data, sdpa_dtype dt, int64_t B, int64_t Hkv, int64_t S, int64_t E) {
    const int64_t shape[4] = {B, Hkv, S, E};
    if (dt == SDPA_DTYPE_Q8_0) {
        const int64_t nb = E / SDPA_Q8_0_BLOCK, strides[4] = {Hkv * S * nb, S * nb, nb, 1};
        CHECK("q8_0 cache view", sdpa_tensor_init_strided(t, data, dt, 4, shape, strides));
    } else {
        CHECK("cache view", sdpa_tensor_init_dtype(t, data, dt, 4, shape));
    }
}

/* Write float rows src [B, Hkv, S, E] into the cache (sdpa_kv_write_ex; the dense cache is the
 * pool with num_blocks = B, block_size = S; one call per sequence). */
static void fill_cache(const sdpa_tensor *cache, const float *src, int64_t B, int64_t Hkv, int64_t S, int64_t E,
                       float scale) {
    int64_t *slots = xalloc((size_t)S * sizeof(int64_t));
    float sc[1] = {scale};
    sdpa_tensor tscale;
    CHECK("scale", sdpa_tensor_init(&tscale, sc, 1, (int64_t[]){1}));
    sdpa_kv_write_options o;
    sdpa_kv_write_options_init(&o);
    if (scale != 0.0f)
        o.k_scale = &tscale;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t s = 0; s < S; ++s)
            slots[s] = b * S + s;
        sdpa_tensor rows;
        CHECK("rows view", sdpa_tensor_init_strided(&rows, src + b * Hkv * S * E, SDPA_DTYPE_F32, 3,
                                                    (int64_t[]){S, Hkv, E}, (int64_t[]){E, S * E, 1}));
        CHECK("fill cache", sdpa_kv_write_ex(cache, NULL, &rows, NULL, slots, &o));
    }
    free(slots);
}

/* A K and a V cache [B, Hkv, S, E] of kt's dtype holding the float rows kf / vf (kt's scale). */
typedef struct kvpair {
    void *k, *v;
    size_t bytes; /* of each */
    sdpa_tensor tk, tv;
} kvpair;

static kvpair make_caches(const kvtype *kt, const float *kf, const float *vf, int64_t B, int64_t Hkv, int64_t S,
                          int64_t E) {
    kvpair c;
    c.bytes = cache_bytes(kt->dt, B * Hkv * S, E);
    c.k = xalloc(c.bytes);
    c.v = xalloc(c.bytes);
    cache_view(&c.tk, c.k, kt->dt, B, Hkv, S, E);
    cache_view(&c.tv, c.v, kt->dt, B, Hkv, S, E);
    fill_cache(&c.tk, kf, B, Hkv, S, E, kt->scale);
    fill_cache(&c.tv, vf, B, Hkv, S, E, kt->scale);
    return c;
}

static void randf(float *x, size_t n, unsigned *seed) {
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)rand_r(seed) / (float)RAND_MAX * 2.0f - 1.0f;
}

static double median_of(double *t, int n, double *p10, double *p90) {
    qsort(t, (size_t)n, sizeof t[0], bench_cmp_double);
    if (p10) *p10 = t[n / 10];
    if (p90) *p90 = t[n - 1 - n / 10];
    return t[n / 2];
}

/* ----------------------------------------------------------------- decode */

typedef struct dshape {
    const char *name;
    int64_t B, Hq, Hkv, S;
} dshape;

static void decode_shape(const dshape *sh) {
    const int64_t B = sh->B, Hq = sh->Hq, Hkv = sh->Hkv, S = sh->S, E = 128;
    const size_t nrows = (size_t)(B * Hkv * S), nel = nrows * (size_t)E, nq = (size_t)(B * Hq * E);
    unsigned seed = 31;
    float *kf = xalloc(nel * 4), *vf = xalloc(nel * 4), *q = xalloc(nq * 4), *out = xalloc(nq * 4);
    randf(kf, nel, &seed);
    randf(vf, nel, &seed);
    randf(q, nq, &seed);
    sdpa_tensor tq, to;
    CHECK("q", sdpa_tensor_init(&tq, q, 4, (int64_t[]){B, Hq, 1, E}));
    CHECK("out", sdpa_tensor_init(&to, out, 4, (int64_t[]){B, Hq, 1, E}));
    double f16_time[2] = {0, 0};
    for (int prec = 0; prec < 2; ++prec) {
        if (prec == 1 && Hq == Hkv)
            continue; /* REDUCED rows: the GQA shape */
        for (size_t k = 0; k < N_KV; ++k) {
            const kvtype *kt = &KV_TYPES[k];
            if (prec == 1 && (kt->dt == SDPA_DTYPE_FP8_E5M2 || kt->scale != 0.0f))
                continue;
            kvpair c = make_caches(kt, kf, vf, B, Hkv, S, E);
            const sdpa_tensor tk = c.tk, tv = c.tv;
            void *kc = c.k, *vc = c.v;
            const size_t bytes = c.bytes;
            float sc[1] = {kt->scale};
            sdpa_tensor tscale;
            CHECK("scale", sdpa_tensor_init(&tscale, sc, 1, (int64_t[]){1}));
            sdpa_options o;
            sdpa_options_init(&o);
            o.threadpool = g_pool;
            o.precision = prec ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
            if (kt->scale != 0.0f)
                o.k_scale = o.v_scale = &tscale;
            double *t = xalloc((size_t)g_reps * sizeof(double)), *f = xalloc((size_t)g_reps * sizeof(double));
            CHECK("warm-up", sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL));
            char kernel[64];
            snprintf(kernel, sizeof kernel, "%s", sdpa_last_kernel());
            const void *bufs[2] = {kc, vc};
            const size_t sizes[2] = {bytes, bytes};
            for (int r = 0; r < g_reps; ++r) {
                evict();
                double a = bench_now_s();
                CHECK("decode", sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL));
                t[r] = bench_now_s() - a;
                evict();
                a = bench_now_s();
                read_once(bufs, sizes, 2);
                f[r] = bench_now_s() - a;
            }
            double p10, p90;
            const double med = median_of(t, g_reps, &p10, &p90), fl = median_of(f, g_reps, NULL, NULL);
            if (kt->dt == SDPA_DTYPE_F16)
                f16_time[prec] = med;
            printf("decode shape=%s B=%lld Hq=%lld Hkv=%lld S=%lld E=128 kv=%s precision=%s threads=%d kernel=%s "
                   "ms=%.3f p10=%.3f p90=%.3f floor_ms=%.3f of_floor=%.2f vs_f16=%.2f cache_MiB=%.1f\n",
                   sh->name, (long long)B, (long long)Hq, (long long)Hkv, (long long)S, kt->name,
                   prec ? "reduced" : "default", g_threads, kernel, med * 1e3, p10 * 1e3, p90 * 1e3, fl * 1e3,
                   fl / med, f16_time[prec] / med, 2.0 * (double)bytes / 1048576.0);
            fflush(stdout);
            free(t);
            free(f);
            free(kc);
            free(vc);
        }
    }
    free(kf);
    free(vf);
    free(q);
    free(out);
}

/* ---------------------------------------------------------------- prefill */

static void prefill(void) {
    const int64_t Hq = 32, Hkv = 8, L = g_quick ? 128 : 1024, E = 128;
    const size_t nrows = (size_t)(Hkv * L), nel = nrows * (size_t)E, nq = (size_t)(Hq * L * E);
    unsigned seed = 7;
    float *kf = xalloc(nel * 4), *vf = xalloc(nel * 4), *q = xalloc(nq * 4), *out = xalloc(nq * 4);
    randf(kf, nel, &seed);
    randf(vf, nel, &seed);
    randf(q, nq, &seed);
    sdpa_tensor tq, to;
    CHECK("q", sdpa_tensor_init(&tq, q, 4, (int64_t[]){1, Hq, L, E}));
    CHECK("out", sdpa_tensor_init(&to, out, 4, (int64_t[]){1, Hq, L, E}));
    const int reps = g_quick ? 3 : 5;
    double f16 = 0;
    for (size_t k = 0; k < N_KV; ++k) {
        const kvtype *kt = &KV_TYPES[k];
        if (kt->dt == SDPA_DTYPE_BF16 || kt->scale != 0.0f)
            continue;
        kvpair c = make_caches(kt, kf, vf, 1, Hkv, L, E); /* no scaled dtype here */
        const sdpa_tensor tk = c.tk, tv = c.tv;
        void *kc = c.k, *vc = c.v;
        sdpa_options o;
        sdpa_options_init(&o);
        o.threadpool = g_pool;
        o.causal = 1;
        CHECK("prefill", sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL));
        char kernel[64];
        snprintf(kernel, sizeof kernel, "%s", sdpa_last_kernel());
        double t[8];
        for (int r = 0; r < reps; ++r) {
            const double a = bench_now_s();
            CHECK("prefill", sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL));
            t[r] = bench_now_s() - a;
        }
        double p10, p90;
        const double med = median_of(t, reps, &p10, &p90);
        if (kt->dt == SDPA_DTYPE_F16)
            f16 = med;
        printf("prefill B=1 Hq=32 Hkv=8 L=S=%lld E=128 causal kv=%s precision=default threads=%d kernel=%s ms=%.2f "
               "min=%.2f max=%.2f vs_f16_time=%.2f\n",
               (long long)L, kt->name, g_threads, kernel, med * 1e3, p10 * 1e3, p90 * 1e3, med / f16);
        fflush(stdout);
        free(kc);
        free(vc);
    }
    free(kf);
    free(vf);
    free(q);
    free(out);
}

/* --------------------------------------------------------------- kv_write */

static void kv_write_rows(void) {
    const int64_t T = 256, Hkv = 8, E = 128, bs = 16, nblocks = 256;
    unsigned seed = 11;
    float *rows = xalloc((size_t)(T * Hkv * E) * 4);
    randf(rows, (size_t)(T * Hkv * E), &seed);
    int64_t *slots = xalloc((size_t)T * sizeof(int64_t)), *pos = xalloc((size_t)T * sizeof(int64_t));
    for (int64_t t = 0; t < T; ++t) {
        slots[t] = (t * 97) % (nblocks * bs); /* scattered slots */
        pos[t] = 1000 + t;
    }
    const int64_t max_pos = 4096, half = E / 2;
    float *ct = xalloc((size_t)(max_pos * half) * 4), *st = xalloc((size_t)(max_pos * half) * 4);
    for (int64_t p = 0; p < max_pos; ++p)
        for (int64_t i = 0; i < half; ++i) {
            const double a = (double)p * pow(10000.0, -2.0 * (double)i / (double)E);
            ct[p * half + i] = (float)cos(a);
            st[p * half + i] = (float)sin(a);
        }
    sdpa_tensor tr, tc, ts;
    CHECK("rows", sdpa_tensor_init(&tr, rows, 3, (int64_t[]){T, Hkv, E}));
    CHECK("cos", sdpa_tensor_init(&tc, ct, 2, (int64_t[]){max_pos, half}));
    CHECK("sin", sdpa_tensor_init(&ts, st, 2, (int64_t[]){max_pos, half}));
    sdpa_rope_params rp;
    sdpa_rope_params_init(&rp);
    rp.cos = &tc;
    rp.sin = &ts;
    const sdpa_dtype dts[2] = {SDPA_DTYPE_F16, SDPA_DTYPE_Q8_0};
    const int reps = g_quick ? 11 : 10 * g_reps + 1;
    for (int d = 0; d < 2; ++d) {
        const size_t bytes = cache_bytes(dts[d], nblocks * Hkv * bs, E);
        void *cache = xalloc(bytes);
        memset(cache, 0, bytes);
        sdpa_tensor tcache;
        cache_view(&tcache, cache, dts[d], nblocks, Hkv, bs, E);
        double med[2];
        for (int rope = 0; rope < 2; ++rope) {
            sdpa_kv_write_options o;
            sdpa_kv_write_options_init(&o);
            if (rope) {
                o.rope = &rp;
                o.positions = pos;
            }
            double *t = xalloc((size_t)reps * sizeof(double));
            CHECK("kv_write", sdpa_kv_write_ex(&tcache, NULL, &tr, NULL, slots, &o));
            for (int r = 0; r < reps; ++r) {
                const double a = bench_now_s();
                CHECK("kv_write", sdpa_kv_write_ex(&tcache, NULL, &tr, NULL, slots, &o));
                t[r] = bench_now_s() - a;
            }
            double p10, p90;
            med[rope] = median_of(t, reps, &p10, &p90);
            printf("kv_write T=%lld Hkv=%lld E=%lld rows=f32 cache=%s rope=%s threads=1 us=%.1f p10=%.1f p90=%.1f%s",
                   (long long)T, (long long)Hkv, (long long)E, sdpa_dtype_name(dts[d]), rope ? "neox-tables" : "none",
                   med[rope] * 1e6, p10 * 1e6, p90 * 1e6, rope ? "" : "\n");
            if (rope)
                printf(" rope_vs_plain=%.2f\n", med[1] / med[0]);
            fflush(stdout);
            free(t);
        }
        free(cache);
    }
    free(rows);
    free(slots);
    free(pos);
    free(ct);
    free(st);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            g_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            g_quick = 1;
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps R] [--quick]\n", argv[0]);
            return 2;
        }
    }
    if (g_threads < 1 || g_threads > 64 || g_reps < 3) {
        fprintf(stderr, "%s: --threads in [1, 64], --reps >= 3\n", argv[0]);
        return 2;
    }
    if (g_quick)
        g_reps = 3;
    CHECK("threadpool", sdpa_threadpool_create(g_threads, &g_pool));
    g_flush = xalloc(FLUSH_BYTES);
    floor_start();
    memset(g_flush, 1, FLUSH_BYTES);
    printf("# sdpa-kv8-bench libsdpa %s, threads %d (caller pool), reps %d%s\n", sdpa_version_string(), g_threads,
           g_reps, g_quick ? " (quick)" : "");
    const dshape full[] = {{"decode-1x4096", 1, 32, 32, 4096}, {"decode-8x1024", 8, 32, 32, 1024},
                           {"gqa-32/8-4096", 1, 32, 8, 4096}};
    const dshape quick[] = {{"decode-1x256", 1, 8, 8, 256}, {"gqa-8/2-256", 1, 8, 2, 256}};
    const dshape *shapes = g_quick ? quick : full;
    const int nshapes = g_quick ? 2 : 3;
    for (int s = 0; s < nshapes; ++s)
        decode_shape(&shapes[s]);
    prefill();
    kv_write_rows();
    floor_stop();
    sdpa_threadpool_destroy(g_pool);
    free(g_flush);
    return 0;
}
