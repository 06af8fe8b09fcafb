/* decode-probe: is a decode call bound by arithmetic or by memory on this machine?
 *
 * Times one decode shape (L = 1, E = Ev = 128, Hq = 32) twice: with the K/V bytes evicted from
 * the caches before every call (a 64 MiB buffer is written in between: "stream") and without
 * (the same call again: "cached", K/V resident when they fit in the last-level cache). When the
 * cached time per key is about the streamed one, the call is compute-bound at that thread count;
 * when it is much lower, memory is what the call waits for. Prints, per mode, the kernel the
 * library chose, the median and the 10th/90th percentiles of the call time, ns per (key, kv head)
 * per thread and GB/s of K/V bytes as stored.
 *
 *   decode-probe B S DTYPE [HKV [THREADS]]
 *     DTYPE   f32 | f16 | bf16 (K and V storage; Q and out are f32)
 *     HKV     kv heads (default 8: GQA 32/8; 32 = MHA)
 *     THREADS > 0: the library's own threads; < 0: a caller sdpa_threadpool of -THREADS
 *             workers (no per-call thread start-up; default 1)
 *
 * Example (docs/performance.md, "History"): decode-probe 4 256 f16 8 1 (K/V 4 MiB: cached compute),
 * decode-probe 8 1024 f16 8 1 and ... 8 1024 f16 8 -2 (streamed, 1 and 2 threads).
 * A scratch measurement aid, not a bench row: no floors, no reference check (sdpa-bench does
 * both); every call's status is checked. */
#define _POSIX_C_SOURCE 200809L
#include <sdpa.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_clock.h"

#define REPS 41
#define FLUSH_BYTES ((size_t)64 << 20)

/* Random finite values in [0.25, 0.5): f32, or 16-bit patterns of that range. */
static void fill(void *p, size_t n, sdpa_dtype dt, unsigned *seed) {
    for (size_t i = 0; i < n; ++i) {
        const unsigned r = (unsigned)rand_r(seed);
        if (dt == SDPA_DTYPE_F32)
            ((float *)p)[i] = 0.25f + (float)(r % 1024) / 4096.0f;
        else if (dt == SDPA_DTYPE_F16)
            ((uint16_t *)p)[i] = (uint16_t)(0x3400 + (r & 0x3ff)); /* f16 0.25 .. 0.5 */
        else
            ((uint16_t *)p)[i] = (uint16_t)(0x3e80 + (r & 0x7f)); /* bf16 0.25 .. 0.5 */
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s B S f32|f16|bf16 [HKV [THREADS]]\n", argv[0]);
        return 2;
    }
    const int64_t B = atoll(argv[1]), S = atoll(argv[2]), H = 32, E = 128;
    const int64_t Hkv = argc > 4 ? atoll(argv[4]) : 8;
    const int threads = argc > 5 ? atoi(argv[5]) : 1;
    sdpa_dtype dt;
    if (!strcmp(argv[3], "f32"))
        dt = SDPA_DTYPE_F32;
    else if (!strcmp(argv[3], "f16"))
        dt = SDPA_DTYPE_F16;
    else if (!strcmp(argv[3], "bf16"))
        dt = SDPA_DTYPE_BF16;
    else {
        fprintf(stderr, "%s: dtype must be f32, f16 or bf16\n", argv[0]);
        return 2;
    }
    if (B < 1 || S < 1 || Hkv < 1 || H % Hkv != 0 || threads == 0) {
        fprintf(stderr, "%s: need B, S >= 1, HKV dividing 32, THREADS != 0\n", argv[0]);
        return 2;
    }
    const size_t es = sdpa_dtype_size(dt), nkv = (size_t)(B * Hkv * S * E), nq = (size_t)(B * H * E);
    void *k = malloc(nkv * es), *v = malloc(nkv * es);
    float *q = malloc(nq * sizeof(float)), *out = malloc(nq * sizeof(float));
    char *flush = malloc(FLUSH_BYTES);
    if (!k || !v || !q || !out || !flush) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    unsigned seed = 1;
    fill(k, nkv, dt, &seed);
    fill(v, nkv, dt, &seed);
    fill(q, nq, SDPA_DTYPE_F32, &seed);
    memset(flush, 1, FLUSH_BYTES);

    const int64_t qs[4] = {B, H, 1, E}, ks[4] = {B, Hkv, S, E};
    sdpa_tensor tq, tk, tv, to;
    if (sdpa_tensor_init_dtype(&tq, q, SDPA_DTYPE_F32, 4, qs) != SDPA_OK ||
        sdpa_tensor_init_dtype(&tk, k, dt, 4, ks) != SDPA_OK || sdpa_tensor_init_dtype(&tv, v, dt, 4, ks) != SDPA_OK ||
        sdpa_tensor_init_dtype(&to, out, SDPA_DTYPE_F32, 4, qs) != SDPA_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], sdpa_last_error_message());
        return 1;
    }
    sdpa_options opt;
    sdpa_options_init(&opt);
    sdpa_threadpool *pool = NULL;
    if (threads < 0) {
        if (sdpa_threadpool_create(-threads, &pool) != SDPA_OK) {
            fprintf(stderr, "%s: %s\n", argv[0], sdpa_last_error_message());
            return 1;
        }
        opt.threadpool = pool;
    } else {
        opt.num_threads = threads;
    }
    const int nthreads = threads < 0 ? -threads : threads;
    for (int mode = 0; mode < 2; ++mode) { /* 0: stream (evicted), 1: cached */
        double t[REPS];
        for (int r = 0; r < REPS; ++r) {
            if (mode == 0)
                for (size_t i = 0; i < FLUSH_BYTES; i += 64)
                    flush[i]++;
            const double a = bench_now_s();
            const sdpa_status st = sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, NULL);
            t[r] = bench_now_s() - a;
            if (st != SDPA_OK) {
                fprintf(stderr, "%s: %s: %s\n", argv[0], sdpa_status_string(st), sdpa_last_error_message());
                return 1;
            }
        }
        qsort(t, REPS, sizeof t[0], bench_cmp_double);
        const double med = t[REPS / 2];
        printf("%-6s %-22s B=%lld S=%lld kv=%s Hq=%lld Hkv=%lld threads=%d%s: median %.3f ms (p10 %.3f, p90 %.3f), "
               "%.1f ns per key and kv head per thread, %.1f GB/s\n",
               mode == 0 ? "stream" : "cached", sdpa_last_kernel(), (long long)B, (long long)S, argv[3], (long long)H,
               (long long)Hkv, nthreads, pool ? " (pool)" : "", med * 1e3, t[REPS / 10] * 1e3, t[9 * REPS / 10] * 1e3,
               med * 1e9 * nthreads / (double)(B * Hkv * S), 2.0 * (double)nkv * (double)es / med / 1e9);
    }
    sdpa_threadpool_destroy(pool);
    free(k);
    free(v);
    free(q);
    free(out);
    free(flush);
    return 0;
}
