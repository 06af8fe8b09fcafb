/* Shared by the files of src/; never installed. Internal non-static names use sdpa__.
 *
 * The data flow is one-way (DESIGN.md section 2): a file includes and calls only files of its
 * own stage or of a stage below it, and the files of one stage make no circle. The stages
 * (tests/layering/check_layering.py reads this list and fails on an arrow up):
 *
 * Stages, top to bottom (a stage: its src/ files):
 *   entries: mha.c, merge.c, kv_write.c, rope.c, mask.c, cost.c
 *   driver: attention.c
 *   plan: plan.c, options.c, view.c
 *   context: context.c
 *   checks: check.c
 *   kernels: kernel.c, kernel_*.c, fallback_double.c, dropout.c, softmax.c
 *   rules: rules.c
 *   loaders: load.c
 *   dispatch: dispatch.c
 *   micro-kernels: microkernel_*.c, convert_*.c, matmul.c
 *   execution: threads.c, threadpool.c
 *   platform: cpu.c, status.c
 *
 * Interface headers, implemented by several files, are no arrow by being included (a file
 * that uses a name defined in one of them is): kernel.h, microkernel.h, microkernel_bf16.h,
 * convert.h, load.h. */
#ifndef SDPA_INTERNAL_H
#define SDPA_INTERNAL_H

#include "sdpa.h"
#include "rules.h"
#include "convert.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define SDPA__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define SDPA__PRINTF(f, a)
#endif

/* ---- status.c: thread-local detail message and kernel name ---- */

/* Record a failure detail ("printf" style) for sdpa_last_error_message(); returns status.
 * Messages begin with the public entry's name, which travels as a parameter (fn, or the plan's
 * fn): an entry that reuses another's validation passes its own name. */
sdpa_status sdpa__fail(sdpa_status status, const char *fmt, ...) SDPA__PRINTF(2, 3);
/* What a failure is about, as data for a caller that words its own message (mha.c): */
enum { SDPA__SUBJECT_NONE = 0, SDPA__SUBJECT_BIAS = 1 };
/* sdpa__fail, also recording the subject that sdpa__last_subject() returns (sdpa__fail and
 * sdpa__clear_error reset it to NONE). */
sdpa_status sdpa__fail_on(sdpa_status status, int subject, const char *fmt, ...) SDPA__PRINTF(3, 4);
int sdpa__last_subject(void);
void sdpa__clear_error(void);
/* Forward a failure: `SDPA__TRY(expr);` returns expr's status from the calling function unless
 * it is SDPA_OK (zstd's FORWARD_IF_ERROR). */
#define SDPA__TRY(expr)                                                                                            \
    do {                                                                                                           \
        const sdpa_status sdpa__try_st = (expr);                                                                   \
        if (sdpa__try_st != SDPA_OK)                                                                               \
            return sdpa__try_st;                                                                                   \
    } while (0)
void sdpa__set_kernel(const char *name);
/* sdpa_last_kernel() = name followed by tag ("tiled-avx512" + "-f16"; tag "" or NULL: name). */
void sdpa__set_kernel_path(const char *name, const char *tag);
/* The finite check's failure for key (value = false) or value row j of (b, kv head g), as
 * sdpa_attention reports it (used by check.c and by kernels that check K/V rows inline). */
sdpa_status sdpa__fail_kv_row(const char *fn, int64_t b, int64_t g, int64_t j, bool value);

/* ---- view.c: validation of views ---- */

/* A rank-4 float view after validation and normalisation (rank-3 views get H = 1). */
struct sdpa__convert;
typedef struct sdpa__view4 {
    float *data;     /* elements of `dtype` (read through a loader, load.h, for q/k/v) */
    int32_t dtype;   /* sdpa_dtype */
    int64_t shape[4];
    int64_t strides[4];
    /* Paged addressing (0.5, load.h SDPA__ADDR_PAGED; block_size 0 = not paged): data and
     * strides are the block pool's [num_blocks, Hkv, block_size, E], shape is the logical
     * [B, Hkv, S, E]; row j of batch b is block block_table[b * block_table_stride + j /
     * block_size], slot j % block_size; rows j >= key_lengths[b] are never read. */
    const int32_t *block_table;
    int64_t block_table_stride, block_size;
    const int64_t *key_lengths;
    const struct sdpa__convert *cv; /* q/k/v: the call context's conversion table (plan.c sets it) */
    /* 0.6, FP8 k / v (options->k_scale, v_scale): element value = fp8 * scale[h * scale_stride]
     * for kv head h (stride 0: one scale per tensor); NULL = 1 (no multiply). Other dtypes: NULL. */
    const float *scale;
    int64_t scale_stride;
} sdpa__view4;

/* Byte interval [lo, hi) covered by a view; empty when lo == hi. */
typedef struct sdpa__span {
    uintptr_t lo, hi;
} sdpa__span;

/* Check a tensor view: non-NULL, float32 (see sdpa__check_view below), rank in [rank_min, rank_max], sizes >= 0,
 * reserved zero, span without overflow. `name` is used in messages. */
sdpa_status sdpa__check_tensor(const sdpa_tensor *t, const char *fn, const char *name,
                               int32_t rank_min, int32_t rank_max);
/* The split behind sdpa__check_tensor (0.4): sdpa__check_view says "this is a valid view of
 * its dtype" (non-NULL, a known sdpa_dtype, rank, reserved and beyond-rank zero, geometry in
 * bytes of that dtype, data); sdpa__check_dtype_supported says "this entry point computes that
 * dtype" (dtypes: a bit mask of 1u << SDPA_DTYPE_*), failing with SDPA_ERR_DTYPE and a message
 * naming the view. sdpa__check_tensor is both with float32 only (the 0.3 rule). */
#define SDPA__DTYPES_F32 (1u << SDPA_DTYPE_F32)
#define SDPA__DTYPES_ALL ((1u << SDPA_DTYPE_F32) | (1u << SDPA_DTYPE_F16) | (1u << SDPA_DTYPE_BF16))
/* 0.6: the 8-bit K/V cache dtypes (sdpa_attention's key and value only). */
#define SDPA__DTYPES_8BIT ((1u << SDPA_DTYPE_Q8_0) | (1u << SDPA_DTYPE_FP8_E4M3) | (1u << SDPA_DTYPE_FP8_E5M2))
#define SDPA__DTYPES_KV (SDPA__DTYPES_ALL | SDPA__DTYPES_8BIT)
/* A view's shape in storage units: as it is, except a q8_0 view's last axis, in blocks
 * (elements / SDPA_Q8_0_BLOCK; include/sdpa.h SDPA_DTYPE_Q8_0). out has rank entries. */
void sdpa__storage_shape(int32_t dtype, int32_t rank, const int64_t *shape, int64_t *out);
sdpa_status sdpa__check_view(const sdpa_tensor *t, const char *fn, const char *name, int32_t rank_min,
                             int32_t rank_max);
sdpa_status sdpa__check_dtype_supported(const sdpa_tensor *t, const char *fn, const char *name, unsigned dtypes);
/* 0.6: ptr (NULL: nothing to check) must be a multiple of align bytes (a view's element size,
 * or the element size of an array of the options); else SDPA_ERR_ALIGNMENT naming `name`.
 * sdpa__check_view checks every non-empty view's data with it. */
sdpa_status sdpa__check_aligned(const char *fn, const char *name, const void *ptr, size_t align);
/* Check an allow-mask: rank 1..4, reserved and beyond-rank entries 0, geometry, data. */
sdpa_status sdpa__check_mask(const char *fn, const char *name, const sdpa_allow_mask *m);
/* Extra rules for outputs: strides > 0 on dims of size > 1 and no self-overlap. */
sdpa_status sdpa__check_output_layout(const sdpa_tensor *t, const char *fn, const char *name);
sdpa__span sdpa__tensor_span(const sdpa_tensor *t);
sdpa__span sdpa__mask_span(const sdpa_allow_mask *m);
bool sdpa__spans_overlap(sdpa__span a, sdpa__span b);
/* A named byte interval of a call (for messages). */
typedef struct sdpa__named_span {
    const char *name;
    sdpa__span s;
} sdpa__named_span;
/* The one overlap rule of every entry point: no output (written) may overlap an input or
 * another output; SDPA_ERR_OVERLAP naming the first pair found (outputs in order). */
sdpa_status sdpa__check_overlaps(const char *fn, const sdpa__named_span *in, int nin, const sdpa__named_span *outs,
                                 int nout);
/* Broadcast a mask's or bias's (rank, shape, strides) right-aligned onto target[4]. */
sdpa_status sdpa__broadcast4(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                             const int64_t *strides, const int64_t target[4], int64_t out_strides[4]);
/* Overflow-checked helpers. */
bool sdpa__mul_overflow(int64_t a, int64_t b, int64_t *out);
bool sdpa__add_overflow(int64_t a, int64_t b, int64_t *out);
/* Check the (rank, shape, strides) geometry of a view of elements of `elem` bytes. */
sdpa_status sdpa__check_geometry(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                                 const int64_t *strides, size_t elem);

/* ---- options.c: versioned structs and sdpa_options ---- */

/* Copy a caller struct `in` that starts with struct_size into dst (dst_size bytes, defaults
 * already there): reads only what struct_size covers; struct_size below v1_size or above 4096,
 * or a non-zero byte beyond dst_size, is SDPA_ERR_STRUCT_VERSION. what names the struct in
 * messages ("options"), init_name its init function without "_init" ("sdpa_options"). */
sdpa_status sdpa__read_versioned(const char *fn, const char *what, const char *init_name, const void *in,
                                 size_t v1_size, void *dst, size_t dst_size);
/* A reserved field of a versioned struct must be 0; anything else is SDPA_ERR_STRUCT_VERSION
 * (a later version's field, reported as unknown tail bytes are). */
sdpa_status sdpa__check_reserved(const char *fn, const char *field, int64_t value);
/* Read sdpa_options (NULL = the defaults) into *o: sdpa__read_versioned plus reserved0. */
sdpa_status sdpa__options_read(const char *fn, const sdpa_options *in, sdpa_options *o);
/* Range checks of the scalar and enum fields of *o that need no shapes. */
sdpa_status sdpa__options_check(const char *fn, const sdpa_options *o);
/* 0.6: options->k_scale / v_scale against the key and value dtypes and Hkv (include/sdpa.h):
 * each a float32 [1] or [Hkv] view, only with an FP8 k / v, every entry finite and >= 0; sets
 * k->scale / v->scale and their strides (views of the plan, rank 4). */
sdpa_status sdpa__options_kv_scales(const char *fn, const sdpa_options *o, int64_t Hkv, sdpa__view4 *k, sdpa__view4 *v);

/* ---- matmul.c: the only user of cblas (serves mha.c's projections only; attention kernels use the micro-kernels) ---- */

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

/* ---- threads.c / threadpool.c: where a call's tasks run ---- */

/* The executor of a call: the library's own per-call threads (both NULL), the caller's
 * parallel-for hook, or a caller-owned sdpa_threadpool. */
typedef struct sdpa__exec {
    sdpa_parallel_for_fn hook;
    void *hook_ctx;
    sdpa_threadpool *pool;
    bool sizing; /* a workspace-size query: plan for the most threads a call may use (below) */
    const char *fn; /* the public entry's name, for messages (a hook that broke its contract) */
} sdpa__exec;

/* The sink of head h of a plan-like sinks pointer: -inf = none. */
static inline float sdpa__sink(const float *sinks, int64_t h) { return sinks != NULL ? sinks[h] : -INFINITY; }

/* ---- context.c: the call context (0.6; DESIGN.md section 7) ---- */

/* Everything of a call that depends on the process's ISA (and the AMX permission) or on the
 * storage dtypes of q, k, v and out, resolved once, in the plan (sdpa__ctx_make): every later
 * stage reads plan->ctx and never consults dispatch, the environment or a dtype field. A new
 * storage dtype is a loader, conversions, micro-kernel entries and the entries of this struct
 * that the builder fills for it (src/kernel.h says where). Members are pointers into constant
 * tables: the context is copied with the plan (a packed batch's sequences). */
struct sdpa__mk;
struct sdpa__mk_kv;
struct sdpa__mk_bf16;
typedef struct sdpa__ctx {
    const struct sdpa__mk *mk;     /* float32 micro-kernels of the call's ISA (microkernel.h) */
    const struct sdpa__convert *cv; /* conversions of the call's ISA (convert.h; loaders, write-back) */
    /* Tiled kernel: the score and P.V operations. score16: scores by bf16 dot products on raw
     * bf16 q and k (REDUCED), else NULL (float32 lanes_gemm on the loaders' f32 rows); pv16: P
     * rounded to bf16 and P.V by bf16 dot products (REDUCED, bf16 v), else NULL. */
    const struct sdpa__mk_bf16 *score16, *pv16;
    void (*tiles_begin)(void), (*tiles_end)(void); /* the column's (AMX) around an item's tiles */
    bool fusable;   /* score16 == pv16 and it has softmax_pack (the fused step, kernel_tiled.c) */
    int64_t tile_q, tile_k;         /* tiled: query rows per item, keys per tile */
    int64_t tile_q_size, tile_k_size; /* what a workspace-size query sizes for (>= tile_q, tile_k,
                                       * whatever column a later call of the process gets) */
    bool pv16_size;                 /* ... and for pv16's pairs (REDUCED with bf16 v) */
    /* Decode kernel: scores by bf16 dot products (REDUCED, bf16 q and k) or NULL; the rows
     * kernels on K and V as stored and their f32 column (for the loaders' f32 copies); bytes
     * per stored K and V element. */
    const struct sdpa__mk_bf16 *dot16;
    const struct sdpa__mk_kv *kv_k, *kv_v, *kv_f32;
    ptrdiff_t k_elem, v_elem;
    const char *tiled_name, *decode_name, *decode_split_name; /* sdpa_last_kernel() stems */
    const char *dtype_tag;          /* sdpa_last_kernel()'s dtype part ("", "-f16", ...) */
    /* Row write-back: out's element size, one element (rounded once, nearest even), and a run
     * of n contiguous floats narrowed to out's dtype (NULL: out is float32, stored as is). */
    size_t out_elem;
    void (*out_put)(void *row, int64_t at, float x);
    void (*out_narrow)(const float *src, int64_t n, uint16_t *dst, ptrdiff_t stride);
} sdpa__ctx;

/* ---- attention plan shared by attention.c and the kernels ---- */

typedef struct sdpa__plan {
    const char *fn;                         /* the public entry's name, for messages */
    int64_t B, Hq, Hkv, L, S, E, Ev, group; /* group = Hq / Hkv */
    int64_t num_blocks;                     /* paged K/V (0.5): blocks of the pool, else 0 */
    sdpa__view4 q, k, v, out;
    const struct sdpa__loader *load_q, *load_k, *load_v; /* how q, k, v are read (load.h) */
    bool has_weights, has_lse;
    sdpa__view4 weights;                    /* [B, Hq, L, S] */
    float *lse; int64_t lse_strides[3];     /* [B, Hq, L] */
    float scale, softcap;
    sdpa__rules rules;                      /* which keys each row may attend (rules.h) */
    int empty_rows, weights_stage;
    bool check_finite;
    int num_threads;                        /* resolved: >= 1 (0 in the options = online CPUs) */
    int kernel;                             /* sdpa_kernel requested (AUTO, or forced) */
    float dropout_p;                        /* 0 = no dropout */
    uint64_t dropout_seed, dropout_offset;
    int64_t dropout_batch0;                 /* added to b in the dropout draws: packed sequence r
                                             * runs as a B = 1 plan and draws as batch row r */
    int64_t row_block;                      /* query rows per tile */
    const float *sinks;                     /* [Hq] sink logits (NULL = none), softmax only */
    sdpa__exec exec;                        /* where tasks run: own threads, hook or pool */
    int precision;                          /* sdpa_precision (DEFAULT resolved to F32) */
    sdpa__ctx ctx;                          /* the call context (context.c), built last */
} sdpa__plan;

/* The call context of a validated plan (its views, loaders and precision set): the process's
 * ISA (dispatch.c) and the dtypes' entries. Called by sdpa__plan_make only. */
void sdpa__ctx_make(sdpa__ctx *c, const sdpa__plan *p);
/* The ISA part only (mk, cv), for entries without an attention plan (sdpa_kv_write). */
void sdpa__ctx_make_base(sdpa__ctx *c);

/* ---- plan.c: validated shapes, views and rules; no kernel knowledge ---- */

/* Validate everything of an sdpa_attention call that does not depend on tensor values and
 * fill the plan; *o receives the options read. Outputs may be NULL only when for_size
 * (workspace-size query). Messages name fn (the public entry: sdpa_attention, or
 * sdpa_attention_workspace_size), and so do those of every later stage (p->fn). */
sdpa_status sdpa__plan_make(const char *fn, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                            const sdpa_options *opt_in, const sdpa_tensor *out, const sdpa_tensor *weights,
                            const sdpa_tensor *lse, bool for_size, sdpa__plan *p, sdpa_options *o);

/* The plan a workspace-size query sizes: p with exec.sizing set (the most threads a call with
 * p's options may use, sdpa__thread_work_scale), so the size is the same in every process. */
static inline sdpa__plan sdpa__sizing_plan(const sdpa__plan *p) {
    sdpa__plan sp = *p;
    sp.exec.sizing = true;
    return sp;
}

/* ---- attention.c, packed variable-length batches (0.5, options->cu_seqlens_q) ---- */

/* sdpa_attention of a packed plan (p from sdpa__plan_make with o->cu_seqlens_q): the one
 * driver over its sequences (every sequence's value checks first, then their items). */
sdpa_status sdpa__varlen_run(const sdpa__plan *p, const sdpa_options *o);
/* Workspace bytes of a packed plan (o; NULL: a plain plan, one sequence): what the driver
 * needs for all of its sequences in one region. */
sdpa_status sdpa__varlen_workspace_bytes(const char *fn, const sdpa__plan *p, const sdpa_options *o, size_t *bytes);

/* ---- attention.c: the internal entries behind sdpa_attention (mha.c uses them) ---- */

/* Workspace bytes of a plan (its kernel chosen as sdpa_attention would); messages name fn. */
sdpa_status sdpa__attention_workspace_bytes(const char *fn, const sdpa__plan *p, size_t *bytes);
/* sdpa_attention after its plan: checks -> kernel -> run, with the caller's workspace (NULL =
 * allocated and freed here). The plan must come from sdpa__plan_make with its outputs. */
sdpa_status sdpa__attention_planned(const sdpa__plan *p, void *workspace, size_t workspace_bytes);

/* ---- check.c: value checks before any write (empty rows, finite check), parallel ---- */

/* Threads of the checks (a function of the shape and p->num_threads only). */
int sdpa__check_threads(const sdpa__plan *p);
size_t sdpa__check_workspace_bytes(const sdpa__plan *p, int threads);
/* Empty rows under policy ERROR and, unless p->check_finite is off, the finite check; the K/V
 * rows only with check_kv (else the kernel checks them inline, kernel.h). One task per
 * (b, kv head) on up to `threads` threads; the failure reported is the first of a sequential
 * scan of everything (without check_kv, a failure found makes the K/V rows of the earlier
 * tasks be checked first, so it is still that scan's first). ws: at least
 * sdpa__check_workspace_bytes(p, threads), 64-byte aligned. */
sdpa_status sdpa__check_values(const sdpa__plan *p, bool check_kv, int threads, void *ws);

/* The value checks as a phase of the call's region (attention.c): begin fills ph
 * (one task per (b, kv head); no task when there is nothing to check) and its gate (false once
 * a task failed); thread t's scratch is tws + t * stride (stride >= sdpa__check_thread_bytes,
 * 64-byte aligned, threads >= the region's threads); after the region, sdpa__check_end gives
 * the status and message sdpa__check_values would. */
struct sdpa__phase;
typedef struct sdpa__check {
    const sdpa__plan *p;
    const void *mk;
    bool need_empty, check_kv;
    unsigned char *ws;
    size_t stride;
    int threads;
    int64_t ntasks;
    _Atomic long long first_bad; /* lowest failing task so far: later tasks cannot be first */
} sdpa__check;
size_t sdpa__check_thread_bytes(const sdpa__plan *p);
void sdpa__check_begin(sdpa__check *c, const sdpa__plan *p, bool check_kv, unsigned char *tws, size_t stride,
                       int threads, struct sdpa__phase *ph);
bool sdpa__check_failed(const sdpa__check *c);
bool sdpa__check_passed_gate(void *c);
sdpa_status sdpa__check_end(sdpa__check *c);

/* ---- threads.c: the library's own fork-join parallelism (no pool, no global state) ---- */

#define SDPA__MAX_THREADS 256
/* Online CPUs, clamped to [1, SDPA__MAX_THREADS]. */
int sdpa__online_cpus(void);
/* A task: fn(ctx, task, thread_index), thread_index < the region's threads selecting
 * per-thread scratch. Tasks are claimed dynamically, so a task's result must not depend on
 * the thread that runs it. */
typedef void (*sdpa__task_fn)(void *ctx, int64_t task, int thread_index);
/* A phase of a region (sdpa__run_phases): ntasks tasks fn(ctx, task, thread_index); after its
 * last task, gate(gate_ctx) (if not NULL) says whether the later phases run (false: the region
 * ends there, e.g. a failed value check before the kernel writes anything). */
struct sdpa__phase {
    int64_t ntasks;
    sdpa__task_fn fn;
    void *ctx;
    bool (*gate)(void *gate_ctx);
    void *gate_ctx;
};
typedef struct sdpa__phase sdpa__phase;
#define SDPA__MAX_PHASES 4
/* One parallel region per call: the phases in order on up to nthreads threads (the calling
 * thread included, thread_index < nthreads), started once (own threads, or the caller's hook /
 * pool: nthreads workers handed to it, each with its worker number as thread_index; the
 * library creates no thread then); every task of phase k finishes (and its writes are visible)
 * before any task of phase k + 1 starts. Threads that cannot be created leave their share to
 * the others. Fails only through a caller's hook that broke its contract (a job number out of
 * range or run twice is refused, not run; a job not run, or the hook returning before its jobs
 * did): SDPA_ERR_INVALID_ARGUMENT, the region's work then possibly incomplete. */
sdpa_status sdpa__run_phases(const sdpa__exec *ex, int nthreads, const sdpa__phase *ph, int nph);
/* How many times more work a thread must get before a call starts one of its own: the kernels'
 * and checks' per-thread minimums (written for about 20 us of work each) times this. 1 with a
 * caller's pool or hook (its threads exist), for a call of at most one thread (threads: the
 * plan's num_threads; nothing is measured then) and for a workspace-size query (ex->sizing: the
 * size is the same in every process, and at least what any call with those options needs);
 * else the cost of starting and joining a thread (measured once per process, or
 * SDPA_THREAD_START_US) over 20 us, in [1, 16]. Results never depend on it (they are the same
 * for every thread count). */
double sdpa__thread_work_scale(const sdpa__exec *ex, int64_t threads);
/* threadpool.c: run job(ctx, k) for k in [0, njobs), njobs <= sdpa_threadpool_size(pool), one
 * per pool thread (job 0 on the calling thread); returns when all are done. Serialized. */
void sdpa__threadpool_run(sdpa_threadpool *pool, int njobs, void (*job)(void *ctx, int64_t k), void *ctx);

/* ---- dropout.c: counter-based dropout (Philox4x32-10, Random123); see sdpa_options ---- */

typedef struct sdpa__dropout {
    bool on;            /* p > 0 */
    uint32_t key[2];    /* key' derived from (seed, offset) */
    uint32_t threshold; /* element dropped iff its 32-bit draw < threshold */
    float scale;        /* 1 / (1 - p), applied once to a row's output by the kernel */
    int64_t batch0;     /* added to b in every draw (plan's dropout_batch0) */
} sdpa__dropout;

/* Prepare the dropout state for (p, seed, offset); p = 0 gives on = false. */
/* The dropout of a plan: its p, seed, offset and batch0 (one place, so no kernel forgets one). */
void sdpa__dropout_init(sdpa__dropout *d, const sdpa__plan *plan);
/* keep[t] = 1 if element (b, h, i, j0 + t) is kept, else 0, for t in [0, n). */
void sdpa__dropout_keep(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                        int64_t n, uint8_t *keep);
/* row[t] = 0 where element (b, h, i, j0 + t) is dropped; kept entries are unchanged (the
 * kernel multiplies the row's output by d->scale once). */
void sdpa__dropout_apply(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t n, float *row);

/* ---- fallback_double.c: rows float32 cannot carry, recomputed in double ---- */

/* Scratch bytes the two functions below need (64-byte aligned scratch). */
size_t sdpa__fallback_scratch_bytes(const sdpa__plan *p);
/* The score of pair (b, h, i, j) in double up to `stage` (sdpa_weights_stage): SCORES (scale
 * q.k), SOFTCAPPED, or MASKED (+ bias; the pair must be allowed). */
double sdpa__fallback_score_double(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, int64_t j, int stage,
                                   void *scratch);
/* Row (b, h, i) in double: out row, lse (nullable) and, when wrow is not NULL and the stage is
 * PROBABILITIES, the weights row, from scores recomputed in double, dropout applied as
 * everywhere. For rows float32 cannot carry although the inputs are finite; the row must have
 * an allowed key. */
void sdpa__fallback_row_double(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i,
                               void *scratch, void *orow, float *wrow, float *lrow);

/* ---- out writeback: the one place out is stored (every kernel and the double fallback) ---- */

/* Row (b, h, i) of out (element d at d * out.strides[3] elements of out's dtype). */
static inline void *sdpa__out_row(const sdpa__plan *p, int64_t b, int64_t h, int64_t i) {
    if (p->out.data == NULL || p->Ev == 0) /* an empty out (Ev = 0): its strides were never checked */
        return NULL;
    const int64_t off = b * p->out.strides[0] + h * p->out.strides[1] + i * p->out.strides[2];
    return (char *)p->out.data + off * (int64_t)p->ctx.out_elem;
}
/* Element d of an out row = x, rounded once (nearest even) to out's dtype (the context's
 * out_put: sdpa__f32_to_f16 / sdpa__f32_to_bf16 of convert.h, the same bits on every ISA). */
static inline void sdpa__out_put(const sdpa__plan *p, void *orow, int64_t d, float x) {
    p->ctx.out_put(orow, d * p->out.strides[3], x);
}
/* The dtype part of sdpa_last_kernel() (the context's dtype_tag): "" when q, k and v are
 * float32 (the 0.3 names), else the storage dtype of K and V ("-f16", "-bf16", "-f32" for an
 * f32 cache with a reduced q), or "-mixed" when K and V differ. out and bias are not named. */
static inline const char *sdpa__dtype_tag(const sdpa__plan *p) { return p->ctx.dtype_tag; }
/* Every element of an out row = 0 (padding, empty rows). */
static inline void sdpa__out_zero_row(const sdpa__plan *p, void *orow) {
    for (int64_t d = 0; d < p->Ev; ++d)
        sdpa__out_put(p, orow, d, 0.0f);
}

/* Saturating size arithmetic (SIZE_MAX = overflow) and 64-byte rounding. */
static inline size_t sdpa__add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static inline size_t sdpa__mul_sat(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }
static inline size_t sdpa__align64(size_t x) { return x > SIZE_MAX - 63u ? SIZE_MAX : (x + 63u) & ~(size_t)63u; }

#endif
