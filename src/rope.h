/* src/rope.h: rotary position embedding (0.6), the one implementation of the rotation that
 * sdpa_rope() (src/rope.c) and sdpa_kv_write_ex() (src/kv_write.c) both call. Stage: a helper
 * below the entries (like load / convert): it calls nothing above it. */
#ifndef SDPA_ROPE_H
#define SDPA_ROPE_H

#include "internal.h"

/* A validated rope: what the row rotation needs. cos / sin: float32 tables with row stride
 * cs_stride / ss_stride and column stride ccol / scol (elements), max_pos rows; or NULL with
 * inv_freq (rotary_dim / 2 entries, theta^(-2i / rotary_dim), computed once by sdpa__rope_prepare
 * into the caller's array of SDPA__ROPE_MAX_HALF doubles). */
#define SDPA__ROPE_MAX_HALF 1024
typedef struct sdpa__rope {
    int64_t rotary_dim;
    int interleaved;
    const float *cos, *sin;
    ptrdiff_t cs_stride, ccol, ss_stride, scol;
    int64_t max_pos;
    const double *inv_freq; /* when cos == NULL */
} sdpa__rope;

/* Validate params against the row width E and the T positions (each checked against max_pos;
 * fn names the public entry in messages) and fill *r. inv_freq: caller's storage of
 * SDPA__ROPE_MAX_HALF doubles (rotary_dim / 2 > SDPA__ROPE_MAX_HALF is SDPA_ERR_SHAPE). */
sdpa_status sdpa__rope_prepare(const char *fn, const sdpa_rope_params *params, int64_t E, int64_t T,
                               const int64_t *positions, sdpa__rope *r, double *inv_freq);

/* cos_p[i], sin_p[i] for i < rotary_dim / 2 at position pos (the tables' row, or the theta
 * formula): computed once per row position and shared by every head of the row. */
void sdpa__rope_angles(const sdpa__rope *r, int64_t pos, float *cos_p, float *sin_p);

/* Rotate x[0..rotary_dim) (float32, in place) with one position's cos_p / sin_p, as documented
 * at sdpa_rope_params; the elements past rotary_dim are untouched. */
void sdpa__rope_apply(const sdpa__rope *r, const float *cos_p, const float *sin_p, float *x);

#endif
