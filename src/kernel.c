/* The registry of attention kernels (kernel.h): AUTO takes the first entry whose supports()
 * says SDPA__FIT_AUTO, so the order is the order of preference. */
#include "kernel.h"

const sdpa__kernel *const sdpa__kernels[] = {
    &sdpa__kernel_decode,    /* few query rows (L <= 4), no weights: one pass over the KV cache */
    &sdpa__kernel_tiled,     /* no weights: FlashAttention-2 style tiles */
    &sdpa__kernel_reference, /* everything, including weights (whole probability rows) */
    NULL,
};
