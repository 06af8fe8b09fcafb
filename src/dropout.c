/* Counter-based dropout: Philox4x32-10 from Random123 (header-only, Debian librandom123-dev).
 * The keep decision of element (b, h, i, j) is a pure function of (seed, offset, b, h, i, j),
 * as documented on sdpa_options.dropout_p, so no kernel, tiling or thread count changes it. */
#include "internal.h"

#include <Random123/philox.h>

#define SDPA__DROPOUT_DOMAIN 0x53445041u /* "SDPA": separates the key derivation's counters */

void sdpa__dropout_init(sdpa__dropout *d, const sdpa__plan *plan) {
    const float p = plan->dropout_p;
    const uint64_t seed = plan->dropout_seed, offset = plan->dropout_offset;
    d->on = p > 0.0f;
    d->batch0 = plan->dropout_batch0;
    d->key[0] = d->key[1] = 0;
    d->threshold = 0;
    d->scale = 1.0f;
    if (!d->on)
        return;
    philox4x32_ctr_t c = {{(uint32_t)offset, (uint32_t)(offset >> 32), SDPA__DROPOUT_DOMAIN, 0}};
    philox4x32_key_t k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    philox4x32_ctr_t r = philox4x32(c, k);
    d->key[0] = r.v[0];
    d->key[1] = r.v[1];
    /* p < 1 in float, so p * 2^32 <= 2^32 - 256 fits in 32 bits. */
    d->threshold = (uint32_t)((double)p * 4294967296.0);
    d->scale = (float)(1.0 / (1.0 - (double)p));
}

/* Calls visit(t, kept) for t in [0, n): four draws per Philox call. */
#define SDPA__DROPOUT_LOOP(d, b, h, i, j0, n, BODY)                                                  \
    do {                                                                                             \
        philox4x32_key_t k_ = {{(d)->key[0], (d)->key[1]}};                                         \
        int64_t t_ = 0;                                                                              \
        while (t_ < (n)) {                                                                           \
            int64_t j_ = (j0) + t_;                                                                  \
            philox4x32_ctr_t c_ = {{(uint32_t)(j_ >> 2), (uint32_t)(i), (uint32_t)(h), (uint32_t)((b) + (d)->batch0)}}; \
            philox4x32_ctr_t r_ = philox4x32(c_, k_);                                                \
            for (int w_ = (int)(j_ & 3); w_ < 4 && t_ < (n); ++w_, ++t_) {                           \
                const int64_t t = t_;                                                                \
                const int kept = r_.v[w_] >= (d)->threshold;                                         \
                BODY;                                                                                \
            }                                                                                        \
        }                                                                                            \
    } while (0)

void sdpa__dropout_keep(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                        int64_t n, uint8_t *keep) {
    if (!d->on) {
        for (int64_t t = 0; t < n; ++t)
            keep[t] = 1;
        return;
    }
    SDPA__DROPOUT_LOOP(d, b, h, i, j0, n, keep[t] = (uint8_t)kept);
}

void sdpa__dropout_apply(const sdpa__dropout *d, int64_t b, int64_t h, int64_t i, int64_t j0,
                         int64_t n, float *row) {
    if (!d->on)
        return;
    SDPA__DROPOUT_LOOP(d, b, h, i, j0, n, if (!kept) row[t] = 0.0f);
}
