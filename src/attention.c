/* sdpa_attention: plan -> checks -> choose a kernel -> run it.
 * Nothing is written to an output before every check has passed. */
#include "internal.h"
#include "kernel.h"

#include <stdlib.h>
#include <string.h>

static const char FN[] = "sdpa_attention";

#define SDPA__WS_ALIGN_SLACK 64u

/* The kernel for the plan: the forced one if it can serve the call, else the first of the
 * table AUTO takes; then the threads and workspace of the call (kernel.h). */
sdpa_status sdpa__exec_plan_make(const char *fn, const sdpa__plan *p, sdpa__exec_plan *x) {
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
    const int kt = k->threads(p), ct = sdpa__check_threads(p);
    if (k->prepare != NULL) { /* checks and items in one region: its threads serve both */
        x->threads = kt > ct ? kt : ct;
        const size_t kb = k->thread_bytes(p), cb = sdpa__check_thread_bytes(p);
        x->thread_bytes = sdpa__align64(kb > cb ? kb : cb);
        x->shared_bytes = sdpa__align64(k->shared_bytes(p));
    } else { /* the checks, then the kernel, each with its own threads */
        x->threads = kt;
        const size_t kb = k->workspace_bytes(p, kt), cb = sdpa__check_workspace_bytes(p, ct);
        x->thread_bytes = 0;
        x->shared_bytes = kb > cb ? kb : cb;
    }
    return SDPA_OK;
}

/* Workspace bytes of an exec plan, without the alignment slack (SIZE_MAX = overflow). */
static size_t exec_bytes(const sdpa__exec_plan *x) {
    return sdpa__add_sat(x->shared_bytes, sdpa__mul_sat(x->thread_bytes, (size_t)x->threads));
}

size_t sdpa__exec_plan_need(const sdpa__exec_plan *x) { return sdpa__add_sat(exec_bytes(x), SDPA__WS_ALIGN_SLACK); }

sdpa_status sdpa__attention_workspace_bytes(const char *fn, const sdpa__plan *p, size_t *bytes) {
    const sdpa__plan sp = sdpa__sizing_plan(p);
    sdpa__exec_plan x;
    sdpa_status st = sdpa__exec_plan_make(fn, &sp, &x);
    if (st != SDPA_OK)
        return st;
    const size_t b = sdpa__add_sat(exec_bytes(&x), SDPA__WS_ALIGN_SLACK);
    if (b == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
    *bytes = b;
    return SDPA_OK;
}

/* One region: the value checks (phase 1), then, if they passed, the kernel's items (phase 2);
 * the threads start once and the calling thread works in both. Then the kernel's finish. */
static sdpa_status run_region(const sdpa__plan *p, const sdpa__exec_plan *x, unsigned char *ws, bool check_kv) {
    unsigned char *tws = ws + x->shared_bytes;
    sdpa__check chk;
    sdpa__work w;
    sdpa__phase ph[2];
    sdpa__check_begin(&chk, p, check_kv, tws, x->thread_bytes, x->threads, &ph[0]);
    x->kernel->prepare(p, ws, tws, x->thread_bytes, &w);
    ph[1] = (sdpa__phase){w.items, w.item, w.ctx, NULL, NULL};
    sdpa_status st = sdpa__run_phases(&p->exec, x->threads, ph, 2);
    if (st != SDPA_OK)
        return st; /* a hook that broke its contract: the checks and items may not have run */
    st = sdpa__check_end(&chk);
    if (st == SDPA_OK)
        st = w.finish(w.ctx);
    return st;
}

sdpa_status sdpa__attention_planned(const sdpa__plan *p, void *workspace, size_t workspace_bytes) {
    sdpa__exec_plan x;
    sdpa_status st = sdpa__exec_plan_make(FN, p, &x);
    if (st != SDPA_OK)
        return st;
    size_t need = sdpa__exec_plan_need(&x);
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
    if (x.kernel->prepare != NULL) {
        st = run_region(p, &x, (unsigned char *)ws, !kv_inline);
    } else {
        st = sdpa__check_values(p, !kv_inline, sdpa__check_threads(p), ws);
        if (st == SDPA_OK)
            st = x.kernel->run(p, x.threads, ws, need);
    }
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
    /* the validation of sdpa_attention, its messages naming this function */
    sdpa_status st = sdpa__rename_error(sdpa__plan_make(q, k, v, options, NULL, NULL, NULL, true, &p, &o), FN, fn);
    if (st != SDPA_OK)
        return st;
    p.has_weights = weights_requested != 0;
    if (o.cu_seqlens_q != NULL && p.has_weights)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: weights are not available for a packed batch (cu_seqlens_q); pass weights_requested=0",
                          fn);
    if (o.cu_seqlens_q != NULL)
        return sdpa__rename_error(sdpa__varlen_workspace_bytes(fn, &p, &o, bytes), FN, fn);
    return sdpa__rename_error(sdpa__attention_workspace_bytes(fn, &p, bytes), FN, fn);
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
