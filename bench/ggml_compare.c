/* ggml-compare: libsdpa's decode beside ggml's flash_attn_ext (CPU backend) on the same q8_0
 * (and f16) K/V bytes, in one process (issue 31's comparison). Not built by meson: ggml is
 * never a dependency of libsdpa. Build it against a ggml checkout (bench/README.md):
 *
 *   git clone https://github.com/ggml-org/ggml /tmp/ggml && cd /tmp/ggml && mkdir build && cd build
 *   cmake .. -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON && make -j2 ggml
 *   cc -O2 -std=c11 bench/ggml_compare.c -Iinclude -I/tmp/ggml/include -Lbuild -lsdpa \
 *      -L/tmp/ggml/build/src -lggml -lggml-base -lggml-cpu -lm -lpthread -o /tmp/ggml-compare
 *   LD_LIBRARY_PATH=build:/tmp/ggml/build/src /tmp/ggml-compare [THREADS]
 *
 * Per shape (B, Hq, Hkv, S, E = 128, L = 1): the K/V rows are written once by sdpa_kv_write_ex
 * (q8_0: checked byte for byte against ggml's own quantizer, ggml_quantize_chunk), and the
 * same bytes are given to both libraries (ggml's k/v [E, S, Hkv, B] q8_0 tensors are our
 * [B, Hkv, S, E] cache). Timed with the K/V bytes evicted before each call (a 64 MiB write),
 * medians over REPS calls, THREADS threads each (ggml_graph_compute_with_ctx; our caller
 * sdpa_threadpool). Both outputs are compared with a float64 attention over the dequantized
 * K/V values: ours (DEFAULT) within its stated bound; ggml quantizes q to q8_0 for its K dot
 * product (as our REDUCED VNNI path does), so its error is reported beside ours. */
#define _POSIX_C_SOURCE 200809L
#include <ggml-cpu.h>
#include <ggml.h>
#include <sdpa.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_clock.h"

#define REPS 15
#define FLUSH_BYTES ((size_t)64 << 20)

static unsigned char *g_flush;
static void evict(void) {
    for (size_t i = 0; i < FLUSH_BYTES; i += 64)
        g_flush[i]++;
}

static void check(sdpa_status st, const char *what) {
    if (st != SDPA_OK) {
        fprintf(stderr, "ggml-compare: %s: %s: %s\n", what, sdpa_status_string(st), sdpa_last_error_message());
        exit(1);
    }
}

static float f16_to_f32(uint16_t h) { return ggml_fp16_to_fp32((ggml_fp16_t)h); }

/* float64 attention of one (b, h) query row over dequantized q8_0 K/V rows. */
static void ref_row(const float *q, const unsigned char *k, const unsigned char *v, int64_t S, int64_t E, double *out) {
    const int64_t nb = E / 32;
    double *s = malloc((size_t)S * sizeof(double)), m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < S; ++j) {
        double x = 0;
        for (int64_t b = 0; b < nb; ++b) {
            const unsigned char *blk = k + (j * nb + b) * 34;
            uint16_t d;
            memcpy(&d, blk, 2);
            for (int i = 0; i < 32; ++i)
                x += (double)q[b * 32 + i] * (double)((float)(int8_t)blk[2 + i] * f16_to_f32(d));
        }
        s[j] = x / sqrt((double)E);
        m = s[j] > m ? s[j] : m;
    }
    for (int64_t e = 0; e < E; ++e)
        out[e] = 0;
    for (int64_t j = 0; j < S; ++j) {
        const double p = exp(s[j] - m);
        sum += p;
        for (int64_t b = 0; b < nb; ++b) {
            const unsigned char *blk = v + (j * nb + b) * 34;
            uint16_t d;
            memcpy(&d, blk, 2);
            for (int i = 0; i < 32; ++i)
                out[b * 32 + i] += p * (double)((float)(int8_t)blk[2 + i] * f16_to_f32(d));
        }
    }
    for (int64_t e = 0; e < E; ++e)
        out[e] /= sum;
    free(s);
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof t[0], bench_cmp_double);
    return t[n / 2];
}

static void run_shape(const char *name, int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int threads,
                      sdpa_threadpool *pool) {
    const int64_t E = 128, nb = E / 32, rows = B * Hkv * S;
    const size_t kv_bytes = (size_t)rows * (size_t)nb * 34;
    /* float rows in [-1, 1), quantized by sdpa_kv_write_ex; the same bytes checked against ggml */
    float *kf = malloc((size_t)rows * E * 4), *vf = malloc((size_t)rows * E * 4), *q = malloc((size_t)(B * Hq * E) * 4);
    unsigned seed = 5;
    for (int64_t i = 0; i < rows * E; ++i) {
        kf[i] = (float)rand_r(&seed) / (float)RAND_MAX * 2.0f - 1.0f;
        vf[i] = (float)rand_r(&seed) / (float)RAND_MAX * 2.0f - 1.0f;
    }
    for (int64_t i = 0; i < B * Hq * E; ++i)
        q[i] = (float)rand_r(&seed) / (float)RAND_MAX * 2.0f - 1.0f;

    /* ggml context: q f32, k/v q8_0, out */
    const size_t ctx_bytes = 2 * kv_bytes + (size_t)(B * Hq * E) * 8 + ggml_graph_overhead() + 64 * ggml_tensor_overhead() +
                             ((size_t)16 << 20);
    struct ggml_init_params ip = {ctx_bytes, NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *gq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, E, 1, Hq, B);
    struct ggml_tensor *gk = ggml_new_tensor_4d(ctx, GGML_TYPE_Q8_0, E, S, Hkv, B);
    struct ggml_tensor *gv = ggml_new_tensor_4d(ctx, GGML_TYPE_Q8_0, E, S, Hkv, B);
    memcpy(gq->data, q, (size_t)(B * Hq * E) * 4);

    /* our write: the cache [B, Hkv, S, E] in q8_0 = ggml's k tensor's memory */
    const int64_t cshape[4] = {B, Hkv, S, E}, cstr[4] = {Hkv * S * nb, S * nb, nb, 1};
    sdpa_tensor tk, tv;
    check(sdpa_tensor_init_strided(&tk, gk->data, SDPA_DTYPE_Q8_0, 4, cshape, cstr), "k view");
    check(sdpa_tensor_init_strided(&tv, gv->data, SDPA_DTYPE_Q8_0, 4, cshape, cstr), "v view");
    int64_t *slots = malloc((size_t)S * sizeof(int64_t));
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t s = 0; s < S; ++s)
            slots[s] = b * S + s;
        sdpa_tensor rk, rv;
        const int64_t rshape[3] = {S, Hkv, E}, rstr[3] = {E, S * E, 1};
        check(sdpa_tensor_init_strided(&rk, kf + b * Hkv * S * E, SDPA_DTYPE_F32, 3, rshape, rstr), "rows");
        check(sdpa_tensor_init_strided(&rv, vf + b * Hkv * S * E, SDPA_DTYPE_F32, 3, rshape, rstr), "rows");
        check(sdpa_kv_write_ex(&tk, &tv, &rk, &rv, slots, NULL), "kv_write_ex");
    }
    unsigned char *gg = malloc(kv_bytes);
    ggml_quantize_chunk(GGML_TYPE_Q8_0, kf, gg, 0, rows, E, NULL);
    const int same_bytes = memcmp(gg, gk->data, kv_bytes) == 0;

    struct ggml_tensor *fa = ggml_flash_attn_ext(ctx, gq, gk, gv, NULL, 1.0f / sqrtf((float)E), 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, fa);

    float *out = malloc((size_t)(B * Hq * E) * 4);
    sdpa_tensor tq, to;
    check(sdpa_tensor_init(&tq, q, 4, (int64_t[]){B, Hq, 1, E}), "q");
    check(sdpa_tensor_init(&to, out, 4, (int64_t[]){B, Hq, 1, E}), "out");
    double tg[REPS], ts[2][REPS];
    char kernel[2][64];
    double err_ours[2] = {0, 0}, err_ggml = 0, scale_ref = 0;
    for (int r = 0; r < REPS; ++r) {
        evict();
        double a = bench_now_s();
        if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "ggml-compare: ggml_graph_compute failed\n");
            exit(1);
        }
        tg[r] = bench_now_s() - a;
        for (int prec = 0; prec < 2; ++prec) {
            sdpa_options o;
            sdpa_options_init(&o);
            o.threadpool = pool;
            o.precision = prec ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_DEFAULT;
            evict();
            a = bench_now_s();
            check(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), "sdpa_attention");
            ts[prec][r] = bench_now_s() - a;
            snprintf(kernel[prec], sizeof kernel[prec], "%s", sdpa_last_kernel());
            if (r == 0) { /* accuracy against float64 on a sample of rows */
                double ref[128];
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t h = 0; h < Hq; h += Hq / 4) {
                        const int64_t hk = h / (Hq / Hkv);
                        const unsigned char *kr = (const unsigned char *)gk->data + (size_t)((b * Hkv + hk) * S * nb) * 34;
                        const unsigned char *vr = (const unsigned char *)gv->data + (size_t)((b * Hkv + hk) * S * nb) * 34;
                        ref_row(q + (b * Hq + h) * E, kr, vr, S, E, ref);
                        const float *og = (const float *)fa->data + (b * Hq + h) * E; /* [E, Hq, 1, B] */
                        for (int64_t e = 0; e < E; ++e) {
                            err_ours[prec] = fmax(err_ours[prec], fabs(out[(b * Hq + h) * E + e] - ref[e]));
                            if (prec == 0)
                                err_ggml = fmax(err_ggml, fabs(og[e] - ref[e]));
                            scale_ref = fmax(scale_ref, fabs(ref[e]));
                        }
                    }
            }
        }
    }
    const double mg = median(tg, REPS), m0 = median(ts[0], REPS), m1 = median(ts[1], REPS);
    printf("shape=%s B=%lld Hq=%lld Hkv=%lld S=%lld E=128 kv=q8_0 threads=%d q8_0_bytes_equal_ggml_quantizer=%s\n"
           "  ggml flash_attn_ext      ms=%.3f max_abs_err_vs_f64=%.2e\n"
           "  ours %-26s ms=%.3f max_abs_err_vs_f64=%.2e ggml/ours=%.2f\n"
           "  ours %-26s ms=%.3f max_abs_err_vs_f64=%.2e ggml/ours=%.2f (REDUCED)\n",
           name, (long long)B, (long long)Hq, (long long)Hkv, (long long)S, threads, same_bytes ? "yes" : "NO",
           mg * 1e3, err_ggml, kernel[0], m0 * 1e3, err_ours[0], mg / m0, kernel[1], m1 * 1e3, err_ours[1], mg / m1);
    printf("  (max |out| %.3f over the sampled rows)\n", scale_ref);
    fflush(stdout);
    free(kf);
    free(vf);
    free(q);
    free(out);
    free(slots);
    free(gg);
    ggml_free(ctx);
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1) {
        fprintf(stderr, "usage: %s [THREADS]\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    g_flush = malloc(FLUSH_BYTES);
    memset(g_flush, 1, FLUSH_BYTES);
    sdpa_threadpool *pool;
    check(sdpa_threadpool_create(threads, &pool), "threadpool");
    printf("# ggml-compare: libsdpa %s beside ggml (commit: see bench/README.md), %d threads\n", sdpa_version_string(),
           threads);
    run_shape("decode-1x4096", 1, 32, 32, 4096, threads, pool);
    run_shape("decode-8x1024", 8, 32, 32, 1024, threads, pool);
    run_shape("gqa-32/8-4096", 1, 32, 8, 4096, threads, pool);
    sdpa_threadpool_destroy(pool);
    free(g_flush);
    return 0;
}
