/* The registry of attention kernels (kernel.h): AUTO takes the first entry whose supports()
 * says SDPA__FIT_AUTO, so the order is the order of preference. */
#include "kernel.h"

const sdpa__kernel *const sdpa__kernels[] = {
    &sdpa__kernel_decode,    /* few query rows (L <= 4), no weights: one pass over the KV cache */
    &sdpa__kernel_tiled,     /* no weights: FlashAttention-2 style tiles */
    &sdpa__kernel_reference, /* everything, including weights (whole probability rows) */
    NULL,
};

/* The kernel for the plan: the forced one if it can serve the call, else the first of the
 * table AUTO takes. */
sdpa_status sdpa__kernel_for(const char *fn, const sdpa__plan *p, const sdpa__kernel **out) {
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
    *out = k;
    return SDPA_OK;
}
