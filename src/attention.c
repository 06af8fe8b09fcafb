/* sdpa_attention: plan -> checks -> choose a kernel -> run it.
 * Nothing is written to an output before every check has passed. */
#include "internal.h"
#include "kernel.h"

#include <stdlib.h>
#include <string.h>

static const char FN[] = "sdpa_attention";

#define SDPA__WS_ALIGN_SLACK 64u

typedef struct exec {
    const sdpa__kernel *kernel;
    int threads;       /* kernel threads */
    int check_threads; /* threads of the value checks */
    size_t bytes;      /* workspace for the checks and the kernel (they run one after the other) */
} exec;

/* The kernel for the plan: the forced one if it can serve the call, else the first of the
 * table AUTO takes; then its threads and the workspace of the checks and the kernel. */
static sdpa_status choose(const char *fn, const sdpa__plan *p, exec *x) {
    const sdpa__kernel *k = NULL;
    for (int t = 0; sdpa__kernels[t] != NULL && k == NULL; ++t) {
        const sdpa__kernel *c = sdpa__kernels[t];
        const char *why = "cannot serve this call";
        if (p->kernel != SDPA_KERNEL_AUTO && c->id != p->kernel)
            continue;
        const sdpa__fit f = c->supports(p, &why);
        if (p->kernel != SDPA_KERNEL_AUTO && f == SDPA__FIT_NO)
            return sdpa__fail(SDPA_ERR_UNSUPPORTED, "%s: options->kernel=%s %s", fn, c->enum_name, why);
        if (f == SDPA__FIT_AUTO || (p->kernel != SDPA_KERNEL_AUTO && f == SDPA__FIT_FORCED))
            k = c;
    }
    if (k == NULL)
        return sdpa__fail(SDPA_ERR_INTERNAL, "%s: no kernel serves this call", fn);
    x->kernel = k;
    x->threads = k->threads(p);
    x->check_threads = sdpa__check_threads(p);
    const size_t kb = k->workspace_bytes(p, x->threads);
    const size_t cb = sdpa__check_workspace_bytes(p, x->check_threads);
    x->bytes = sdpa__add_sat(kb > cb ? kb : cb, SDPA__WS_ALIGN_SLACK);
    return SDPA_OK;
}

sdpa_status sdpa__attention_workspace_bytes(const char *fn, const sdpa__plan *p, size_t *bytes) {
    exec x = {NULL, 0, 0, 0};
    sdpa_status st = choose(fn, p, &x);
    if (st != SDPA_OK)
        return st;
    if (x.bytes == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
    *bytes = x.bytes;
    return SDPA_OK;
}

sdpa_status sdpa__attention_planned(const sdpa__plan *p, void *workspace, size_t workspace_bytes) {
    exec x = {NULL, 0, 0, 0};
    sdpa_status st = choose(FN, p, &x);
    if (st != SDPA_OK)
        return st;
    size_t need = x.bytes;
    if (need == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", FN);
    if (workspace != NULL && workspace_bytes < need)
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_attention_workspace_size())",
                          FN, workspace_bytes, need);
    if (p->B == 0 || p->Hq == 0 || p->L == 0) { /* no query row: nothing to check or write */
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    void *ws = workspace, *owned = NULL;
    if (ws == NULL) {
        owned = ws = malloc(need);
        if (ws == NULL)
            return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of workspace", FN, need);
    }
    /* Any caller alignment is accepted: the size includes 64 bytes of slack to round up. */
    ws = (void *)(((uintptr_t)ws + 63u) & ~(uintptr_t)63u);
    need -= SDPA__WS_ALIGN_SLACK;
    /* A kernel that checks the K/V rows it streams itself saves the check stage that pass. */
    const bool kv_inline = x.kernel->checks_kv_inline && p->check_finite;
    st = sdpa__check_values(p, !kv_inline, x.check_threads, ws);
    if (st == SDPA_OK)
        st = x.kernel->run(p, x.threads, ws, need);
    free(owned);
    return st;
}

SDPA_API sdpa_status sdpa_attention_workspace_size(const sdpa_tensor *q, const sdpa_tensor *k,
                                                   const sdpa_tensor *v, const sdpa_options *options,
                                                   int weights_requested, size_t *bytes) {
    static const char fn[] = "sdpa_attention_workspace_size";
    sdpa__plan p;
    sdpa_options o;
    sdpa__clear_error();
    if (bytes == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    sdpa_status st = sdpa__plan_make(q, k, v, options, NULL, NULL, NULL, true, &p, &o);
    if (st != SDPA_OK)
        return st;
    p.has_weights = weights_requested != 0;
    if (o.cu_seqlens_q != NULL && p.has_weights)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED, "%s: weights are not available for a packed batch (cu_seqlens_q)", fn);
    if (o.cu_seqlens_q != NULL)
        return sdpa__varlen_workspace_bytes(fn, &p, &o, bytes);
    return sdpa__attention_workspace_bytes(fn, &p, bytes);
}

SDPA_API sdpa_status sdpa_attention(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                    const sdpa_options *options, const sdpa_tensor *out,
                                    const sdpa_tensor *weights, const sdpa_tensor *lse) {
    sdpa__plan p;
    sdpa_options o;
    sdpa__clear_error();
    sdpa_status st = sdpa__plan_make(q, k, v, options, out, weights, lse, false, &p, &o);
    if (st != SDPA_OK)
        return st;
    if (o.cu_seqlens_q != NULL)
        return sdpa__varlen_run(&p, &o);
    return sdpa__attention_planned(&p, o.workspace, o.workspace_bytes);
}
