/* The kernel interface: every attention kernel is one sdpa__kernel entry, registered in ONE
 * table (sdpa__kernels, kernel.c's order of preference) that SDPA_KERNEL_AUTO walks; a forced
 * kernel (options->kernel) is looked up in the same table by id. A new kernel (paged, AMX, ...)
 * is one entry here plus its file; attention.c does not change.
 *
 * Data flow: attention.c (entry) -> plan.c -> check.c -> kernel->run -> loaders / micro-kernels.
 * A kernel reads the plan only; it never calls back into attention.c, plan.c or check.c. */
#ifndef SDPA_KERNEL_H
#define SDPA_KERNEL_H

#include "internal.h"

/* How well a kernel fits a plan. */
typedef enum sdpa__fit {
    SDPA__FIT_NO = 0,     /* cannot run it (*why says why, for SDPA_ERR_UNSUPPORTED) */
    SDPA__FIT_FORCED = 1, /* runs it when forced, but AUTO should look further */
    SDPA__FIT_AUTO = 2    /* runs it, and AUTO takes it */
} sdpa__fit;

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
    /* Workspace bytes for that many threads (SIZE_MAX = overflow). */
    size_t (*workspace_bytes)(const sdpa__plan *p, int threads);
    /* Compute out (and weights, lse as the plan asks); ws is 64-byte aligned, ws_bytes at
     * least workspace_bytes(p, threads). Sets sdpa_last_kernel(). */
    sdpa_status (*run)(const sdpa__plan *p, int threads, void *ws, size_t ws_bytes);
} sdpa__kernel;

/* The kernels, in AUTO's order of preference, NULL-terminated (kernel.c). */
extern const sdpa__kernel *const sdpa__kernels[];

/* The entries (one per kernel file). */
extern const sdpa__kernel sdpa__kernel_decode;
extern const sdpa__kernel sdpa__kernel_tiled;
extern const sdpa__kernel sdpa__kernel_reference;

#endif
