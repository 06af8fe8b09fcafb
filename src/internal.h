/* Shared by the files of src/; never installed. Internal non-static names use sdpa__. */
#ifndef SDPA_INTERNAL_H
#define SDPA_INTERNAL_H

#include "sdpa.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define SDPA__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define SDPA__PRINTF(f, a)
#endif

/* ---- status.c: thread-local detail message and kernel name ---- */

/* Record a failure detail ("printf" style) for sdpa_last_error_message(); returns status. */
sdpa_status sdpa__fail(sdpa_status status, const char *fmt, ...) SDPA__PRINTF(2, 3);
void sdpa__clear_error(void);
void sdpa__set_kernel(const char *name);

/* ---- view.c: validation of views ---- */

/* A rank-4 float view after validation and normalisation (rank-3 views get H = 1). */
typedef struct sdpa__view4 {
    float *data;
    int64_t shape[4];
    int64_t strides[4];
} sdpa__view4;

/* A validated allow-mask or bias broadcast to [B, Hq, L, S]: strides 0 on broadcast dims. */
typedef struct sdpa__bcast4 {
    const void *data;
    int64_t strides[4];
} sdpa__bcast4;

/* Byte interval [lo, hi) covered by a view; empty when lo == hi. */
typedef struct sdpa__span {
    uintptr_t lo, hi;
} sdpa__span;

/* Check a tensor view: non-NULL, float32, rank in [rank_min, rank_max], sizes >= 0,
 * reserved zero, span without overflow. `name` is used in messages. */
sdpa_status sdpa__check_tensor(const sdpa_tensor *t, const char *fn, const char *name,
                               int32_t rank_min, int32_t rank_max);
/* Check an allow-mask: rank 1..4, reserved and beyond-rank entries 0, geometry, data. */
sdpa_status sdpa__check_mask(const char *fn, const char *name, const sdpa_allow_mask *m);
/* Extra rules for outputs: strides > 0 on dims of size > 1 and no self-overlap. */
sdpa_status sdpa__check_output_layout(const sdpa_tensor *t, const char *fn, const char *name);
sdpa__span sdpa__tensor_span(const sdpa_tensor *t);
sdpa__span sdpa__mask_span(const sdpa_allow_mask *m);
bool sdpa__spans_overlap(sdpa__span a, sdpa__span b);
/* Broadcast a mask's or bias's (rank, shape, strides) right-aligned onto target[4]. */
sdpa_status sdpa__broadcast4(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                             const int64_t *strides, const int64_t target[4], int64_t out_strides[4]);
/* Overflow-checked helpers. */
bool sdpa__mul_overflow(int64_t a, int64_t b, int64_t *out);
bool sdpa__add_overflow(int64_t a, int64_t b, int64_t *out);
/* Check the (rank, shape, strides) geometry of a view of elements of `elem` bytes. */
sdpa_status sdpa__check_geometry(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                                 const int64_t *strides, size_t elem);

/* ---- matmul.c: the only user of cblas ---- */

/* A logical row-major matrix view: element (r, c) at data[r * row_stride + c * col_stride]. */
typedef struct sdpa__mat {
    float *data;
    int64_t rows, cols;
    int64_t row_stride, col_stride;
} sdpa__mat;

/* Floats of packing workspace sdpa__matmul needs for a (as left) or b (as right) operand. */
size_t sdpa__matmul_pack_floats(const sdpa__mat *m);
/* C[m, n] = alpha * A[m, k] B[k, n] + beta * C. C must have col_stride 1 (or cols <= 1).
 * A and B may have any strides; those BLAS cannot take are packed into `ws`, which must hold
 * sdpa__matmul_pack_floats(a) + sdpa__matmul_pack_floats(b) floats. */
void sdpa__matmul(const sdpa__mat *a, const sdpa__mat *b, float alpha, float beta, sdpa__mat *c,
                  float *ws);
/* Whether the BLAS behind sdpa__matmul can obtain the memory it allocates on its own right
 * now. OpenBLAS 0.3.21 maps a 128 MiB GEMM buffer per thread on first use and retries that
 * mmap forever when it fails (an address-space limit, strict overcommit): callers ask this
 * first and fail with SDPA_ERR_OUT_OF_MEMORY instead of hanging. Always true for other BLAS. */
bool sdpa__matmul_memory_available(void);

/* ---- softmax.c ---- */

/* Softmax pieces over a row of n scores restricted to allowed[j] != 0.
 * Returns the maximum over allowed entries (-inf if none). */
float sdpa__masked_max(const float *s, const uint8_t *allowed, int64_t n);
/* e[j] = exp(s[j] - max) for allowed j, 0 otherwise (written in place into s);
 * returns the sum in double precision. */
double sdpa__masked_exp_sum(float *s, const uint8_t *allowed, int64_t n, float max);

/* ---- attention plan shared by attention.c and the kernels ---- */

typedef struct sdpa__plan {
    int64_t B, Hq, Hkv, L, S, E, Ev, group; /* group = Hq / Hkv */
    sdpa__view4 q, k, v, out;
    bool has_weights, has_lse;
    sdpa__view4 weights;                    /* [B, Hq, L, S] */
    float *lse; int64_t lse_strides[3];     /* [B, Hq, L] */
    float scale, softcap;
    int causal;
    int alignment;
    const int64_t *query_offsets;
    int64_t window_left, window_right;
    bool has_mask; sdpa__bcast4 mask;
    bool has_bias; sdpa__bcast4 bias;
    const int64_t *key_lengths, *query_lengths;
    int empty_rows, weights_stage;
    bool check_finite;
    int num_threads;                        /* resolved: >= 1 (0 in the options = online CPUs) */
    int kernel;                             /* sdpa_kernel requested (AUTO, or forced) */
    float dropout_p;                        /* 0 = no dropout */
    uint64_t dropout_seed, dropout_offset;
    int64_t row_block;                      /* query rows per tile */
} sdpa__plan;

/* Structural key range [lo, hi) of row i of batch b (causal, window, key lengths);
 * lo >= hi means no key. Rows i >= query_lengths[b] are padding (see sdpa__row_is_padding). */
void sdpa__row_range(const sdpa__plan *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi);
static inline bool sdpa__row_is_padding(const sdpa__plan *p, int64_t b, int64_t i) {
    return p->query_lengths != NULL && i >= p->query_lengths[b];
}
static inline bool sdpa__mask_allows(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    const uint8_t *m = (const uint8_t *)p->mask.data;
    return m[b * p->mask.strides[0] + h * p->mask.strides[1] + i * p->mask.strides[2] +
             j * p->mask.strides[3]] != 0;
}
static inline const float *sdpa__bias_row(const sdpa__plan *p, int64_t b, int64_t h, int64_t i) {
    return (const float *)p->bias.data + b * p->bias.strides[0] + h * p->bias.strides[1] +
           i * p->bias.strides[2];
}

/* ---- threads.c: the library's own fork-join parallelism (no pool, no global state) ---- */

#define SDPA__MAX_THREADS 256
/* Online CPUs, clamped to [1, SDPA__MAX_THREADS]. */
int sdpa__online_cpus(void);
/* fn(ctx, task, thread_index) for every task in [0, ntasks), on up to nthreads threads (the
 * calling thread is thread 0; thread_index < nthreads selects per-thread scratch). Tasks are
 * claimed dynamically, so a task's result must not depend on the thread that runs it. If a
 * thread cannot be created, the remaining threads run its share: this never fails. */
typedef void (*sdpa__task_fn)(void *ctx, int64_t task, int thread_index);
void sdpa__parallel_for(int nthreads, int64_t ntasks, sdpa__task_fn fn, void *ctx);

/* ---- dropout.c: counter-based dropout (Philox4x32-10, Random123); see sdpa_options ---- */

typedef struct sdpa__dropout {
    bool on;            /* p > 0 */
    uint32_t key[2];    /* key' derived from (seed, offset) */
    uint32_t threshold; /* element dropped iff its 32-bit draw < threshold */
    float scale;        /* 1 / (1 - p), applied once to a row's output by the kernel */
} sdpa__dropout;

/* Prepare the dropout state for (p, seed, offset); p = 0 gives on = false. */
void sdpa__dropout_init(sdpa__dropout *d, float p, uint64_t seed, uint64_t offset);
/* keep[t] = 1 if element (b, h, i, j0 + t) is kept, else 0, for t in [0, n). */
void sdpa__dropout_keep(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                        int64_t n, uint8_t *keep);
/* row[t] = 0 where element (b, h, i, j0 + t) is dropped; kept entries are unchanged (the
 * kernel multiplies the row's output by d->scale once). */
void sdpa__dropout_apply(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t n, float *row);

/* ---- kernels ---- */
size_t sdpa__reference_workspace_bytes(const sdpa__plan *p);
sdpa_status sdpa__kernel_reference(const sdpa__plan *p, void *ws, size_t ws_bytes);
/* The reference path's double-precision row (b, h, i): out row, lse (nullable) from scores
 * recomputed in double, dropout applied as everywhere. For rows float32 cannot carry although
 * the inputs are finite. The row must have an allowed key. acc: Ev doubles of scratch. */
void sdpa__reference_row_double(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i,
                                double *acc, float *orow, float *lrow);

/* Saturating size arithmetic (SIZE_MAX = overflow) and 64-byte rounding. */
static inline size_t sdpa__add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static inline size_t sdpa__mul_sat(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }
static inline size_t sdpa__align64(size_t x) { return x > SIZE_MAX - 63u ? SIZE_MAX : (x + 63u) & ~(size_t)63u; }

/* Micro-kernel set (src/microkernel*.c): chosen per call, see microkernel.h. */
struct sdpa__mk;

/* Tiled (FlashAttention-2 style) kernel, src/kernel_tiled.c. Threads: how many this call runs
 * (a function of the shape and p->num_threads only); bytes: its workspace for that many. */
int sdpa__tiled_threads(const sdpa__plan *p);
size_t sdpa__tiled_workspace_bytes(const sdpa__plan *p, int threads);
sdpa_status sdpa__kernel_tiled(const sdpa__plan *p, const struct sdpa__mk *mk, int threads, void *ws,
                               size_t ws_bytes);

/* Decode kernel (small L), src/kernel_decode.c. Work items are (b, kv head, group of query rows,
 * key chunk); the chunking depends on the shape only. Outputs are assembled in the workspace and
 * written at the end. With check_kv (the caller has checked everything but the K/V rows) the
 * kernel returns SDPA_ERR_NON_FINITE, without a message and without writing anything, when any
 * row's scores or output came out non-finite: a NaN/Inf in a K/V row it read, or an overflow of
 * finite inputs; the caller tells them apart with the full scan (see kernel_decode.c). */
int sdpa__decode_threads(const sdpa__plan *p);
size_t sdpa__decode_workspace_bytes(const sdpa__plan *p, int threads);
sdpa_status sdpa__kernel_decode(const sdpa__plan *p, const struct sdpa__mk *mk, int threads, bool check_kv,
                                void *ws, size_t ws_bytes);

#endif
