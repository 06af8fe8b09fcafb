/* The kernel interface: every attention kernel is one sdpa__kernel entry, registered in ONE
 * table (sdpa__kernels, kernel.c's order of preference) that SDPA_KERNEL_AUTO walks; a forced
 * kernel (options->kernel) is looked up in the same table by id (sdpa__kernel_for). A new
 * kernel (paged, AMX, ...) is one entry here plus its file; attention.c does not change.
 * Every kernel runs in one mode: prepare() describes its work as items, which run as a phase
 * of the call's one parallel region after the value checks, then finish() on the calling
 * thread.
 *
 * Data flow: attention.c (entry, driver) -> plan.c -> context.c -> check.c -> kernel items ->
 * loaders / micro-kernels (the stage order at the top of internal.h; tests/layering checks
 * it). A kernel reads the plan and its call context (plan->ctx) only; it never calls back into
 * attention.c, plan.c or check.c, and never consults dispatch, the environment or a dtype.
 *
 * Adding a storage dtype (the 8-bit K/V caches of the companion issue, q8_0 and FP8) touches:
 *   1. the dtype enum (include/sdpa.h) and view validation (view.c: its element size, which
 *      entry points compute it);
 *   2. its loaders (load.c, and load.h if a new raw-row form is needed): rows widened exactly
 *      to float32 for every addressing (strided, paged), row_finite, rows_raw in place;
 *   3. its conversions (convert*.c: widen, narrow for sdpa_kv_write, finite scans), per ISA;
 *   4. its micro-kernel entries (microkernel*.c): the decode rows kernels on K/V as stored
 *      (sdpa__mk_kv, one column per dtype and ISA), and a column that reads it raw if one is
 *      wanted (as the bf16 column, dispatch.h sdpa__mk_bf16), registered in dispatch.c;
 *   5. the context builder (context.c): which entries, element sizes and tile sizes a call of
 *      that dtype gets (decode's kv_k / kv_v and k_elem / v_elem, the tiled column, the
 *      write-back if out may have it, the sdpa_last_kernel() tag);
 *   6. docs (sdpa.h, DESIGN.md, README) and tests (test_load.c for the loaders, test_convert.c,
 *      the kernels' and serving tests, tests/bitid for the other dtypes' bits).
 * Nothing in kernel_tiled.c, kernel_decode.c, kernel_reference.c, plan.c or check.c changes:
 * the kernels read rows through the plan's loaders and call the operations the context chose
 * (tiled: Q packing, K tiles, scores and P.V, f32 or the column's; decode: q rows and scores on
 * K as stored or the column's, P.V on V as stored), and write rows through the context's
 * write-back. A new addressing is a loader. */
#ifndef SDPA_KERNEL_H
#define SDPA_KERNEL_H

#include "internal.h"

/* The *why of a kernel that produces no weights, asked for them (tiled, decode). */
#define SDPA__WHY_NO_WEIGHTS                                                                                       \
    "does not produce weights; pass weights=NULL (weights_requested=0), or use SDPA_KERNEL_AUTO or "               \
    "SDPA_KERNEL_REFERENCE"

/* How well a kernel fits a plan. */
typedef enum sdpa__fit {
    SDPA__FIT_NO = 0,     /* cannot run it (*why says why, for SDPA_ERR_UNSUPPORTED) */
    SDPA__FIT_FORCED = 1, /* runs it when forced, but AUTO should look further */
    SDPA__FIT_AUTO = 2    /* runs it, and AUTO takes it */
} sdpa__fit;

/* The work of an itemised kernel, as prepare() leaves it: items independent tasks (any order,
 * any thread; the same items for every thread count, so results do not depend on it), run
 * in one phase of the caller's region (sdpa__run_phases), possibly next to other calls' items
 * (a packed batch); then finish on the calling thread: what is left to check and write
 * (decode's split-KV merge), and sdpa_last_kernel(). Items write only their own outputs (or
 * the shared state), and only after the call's value checks have passed. */
typedef struct sdpa__work {
    int64_t items;
    sdpa__task_fn item; /* item(ctx, i, thread_index) */
    void *ctx;
    sdpa_status (*finish)(void *ctx);
} sdpa__work;

typedef struct sdpa__kernel {
    int id;                /* its sdpa_kernel value */
    const char *enum_name; /* "SDPA_KERNEL_TILED", for messages */
    /* The kernel checks the K/V rows it reads itself (p->check_finite): the check stage then
     * leaves them out. Such a kernel writes nothing when it meets a NaN/Inf in an attended K/V
     * row and returns SDPA_ERR_NON_FINITE with the message of the full scan (the first such
     * row in the scan's order, sdpa__fail_kv_row); a row that is non-finite from finite inputs
     * (float32 overflow) it recomputes in double, as every kernel does. */
    bool checks_kv_inline;
    /* Whether (and how well) it serves the plan; on SDPA__FIT_NO *why is the reason. */
    sdpa__fit (*supports)(const sdpa__plan *p, const char **why);
    /* Threads this call runs: a function of the shape and p->num_threads only. */
    int (*threads)(const sdpa__plan *p);
    /* Every kernel runs as work items (one mode): */
    /* Items: scratch bytes per thread (64-byte multiple) and bytes of the call's shared state
     * (the kernel's context and its partial results; SIZE_MAX = overflow). */
    size_t (*thread_bytes)(const sdpa__plan *p);
    size_t (*shared_bytes)(const sdpa__plan *p);
    /* Items: set up the call in shared (64-byte aligned, shared_bytes(p)) and describe its work
     * (sdpa__work); thread t's scratch is tws + t * tstride. Writes no output. */
    void (*prepare)(const sdpa__plan *p, void *shared, unsigned char *tws, size_t tstride, sdpa__work *w);
    /* Items, checks_kv_inline kernels: after the items (which then write no output), false if
     * the inline K/V check fails; any thread may run it, so it makes no message (finish
     * does). A packed batch runs it as a gate before other sequences' items write. */
    bool (*verify)(void *ctx);
    /* The name this kernel gives sdpa_last_kernel() for the plan, before the dtype tag
     * (sdpa__dtype_tag): its run / finish report exactly this, and the cost query (cost.c)
     * asks it without running anything. */
    const char *(*name)(const sdpa__plan *p);
} sdpa__kernel;

/* The kernels, in AUTO's order of preference, NULL-terminated (kernel.c). */
extern const sdpa__kernel *const sdpa__kernels[];

/* The entries (one per kernel file). */
extern const sdpa__kernel sdpa__kernel_decode;
extern const sdpa__kernel sdpa__kernel_tiled;
extern const sdpa__kernel sdpa__kernel_reference;

/* The kernel for the plan: the forced one (options->kernel) if it can serve the call, else the
 * first of sdpa__kernels AUTO takes; SDPA_ERR_UNSUPPORTED naming fn when a forced one cannot. */
sdpa_status sdpa__kernel_for(const char *fn, const sdpa__plan *p, const sdpa__kernel **k);

/* How the driver runs a plan (attention.c, also for each packed sequence): the kernel,
 * threads of the region, per-thread scratch (the checks' and the kernel's, the larger) and
 * shared bytes. */
typedef struct sdpa__exec_plan {
    const sdpa__kernel *kernel;
    int threads;         /* of the region */
    size_t thread_bytes; /* per thread, 64-byte multiple */
    size_t shared_bytes; /* the kernel's shared state */
} sdpa__exec_plan;
sdpa_status sdpa__exec_plan_make(const char *fn, const sdpa__plan *p, sdpa__exec_plan *x);
/* Workspace bytes a call with exec plan x needs (alignment slack included; SIZE_MAX = overflow):
 * what sdpa__attention_planned asks of a caller's workspace. */
size_t sdpa__exec_plan_need(const sdpa__exec_plan *x);

/* attention.c's packed driver, for the cost query (cost.c): the B = 1 plan of packed sequence r, as
 * sdpa__varlen_run runs it; and what that run plans: the region's threads, the workspace it
 * needs (0: no sequence has a query row) and, in *last / *last_x, the run plan and exec plan of
 * the last sequence with query rows (the kernel sdpa_last_kernel() then names; *any false:
 * none). */
void sdpa__varlen_sequence_plan(const sdpa__plan *p, const sdpa_options *o, int64_t r, sdpa__plan *s);
sdpa_status sdpa__varlen_exec(const char *fn, const sdpa__plan *p, const sdpa_options *o, int *threads, size_t *need,
                              sdpa__plan *last, sdpa__exec_plan *last_x, bool *any);

#endif
