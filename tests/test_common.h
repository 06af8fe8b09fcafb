/*
 * Helpers shared by the unit tests: a seeded PRNG, strided float buffers with a double
 * mirror for the reference, canary-filled outputs and element comparison.
 */
#ifndef SDPA_TEST_COMMON_H
#define SDPA_TEST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa.h"
#include "ref/sdpa_ref.h"

#define TC_CANARY_BYTE 0x7F

/* ------------------------------------------------------------------- PRNG */

typedef struct tc_rng {
    uint64_t state;
} tc_rng;

void tc_rng_seed(tc_rng *rng, uint64_t seed);
uint64_t tc_rng_next(tc_rng *rng);
/* Uniform in [lo, hi). */
double tc_rng_uniform(tc_rng *rng, double lo, double hi);
/* Uniform integer in [lo, hi] (inclusive). */
int64_t tc_rng_int(tc_rng *rng, int64_t lo, int64_t hi);
/* 1 with probability p. */
int tc_rng_chance(tc_rng *rng, double p);
/* x[0..n) = uniform in [lo, hi), drawn in index order. */
void tc_fill_uniform(float *x, int64_t n, tc_rng *rng, double lo, double hi);

/* ---------------------------------------------------------------- buffers */

/*
 * How a logical tensor is laid out in memory.
 *   perm[k]  : logical dimension stored at physical position k (0 = outermost).
 *   pad[d]   : extra elements after dimension d's extent (holes that must never be touched).
 *   reverse[d]: negative stride along d (inputs only).
 *   bcast[d] : stride 0 along d (inputs only).
 */
typedef struct tc_layout {
    int perm[SDPA_MAX_RANK];
    int64_t pad[SDPA_MAX_RANK];
    int reverse[SDPA_MAX_RANK];
    int bcast[SDPA_MAX_RANK];
} tc_layout;

/* Contiguous row-major layout for `rank` dimensions. */
void tc_layout_contiguous(tc_layout *lay, int rank);

typedef struct tc_buf {
    float *fbase;   /* allocation of n floats */
    double *dbase;  /* mirror of n doubles (same physical layout) */
    size_t n;
    int64_t offset; /* element offset of logical [0, ..., 0] */
    int rank;
    int64_t shape[SDPA_MAX_RANK];
    int64_t strides[SDPA_MAX_RANK];
} tc_buf;

/* Allocate a buffer (never fails: aborts the test on OOM). Every element of the
 * allocation is set to hole_value (floats and doubles). */
void tc_buf_alloc(tc_buf *buf, int rank, const int64_t *shape, const tc_layout *lay,
                  float hole_value);
/* Allocate and fill every allocation byte of the floats with TC_CANARY_BYTE (outputs). */
void tc_buf_alloc_canary(tc_buf *buf, int rank, const int64_t *shape, const tc_layout *lay);
void tc_buf_free(tc_buf *buf);

/* Offset (in elements, from the logical origin) of a logical index. */
int64_t tc_buf_offset(const tc_buf *buf, const int64_t *idx);
float *tc_buf_fptr(const tc_buf *buf, const int64_t *idx);
/* Set element idx in both the float and the double mirror (double = (double)(float)value). */
void tc_buf_set(tc_buf *buf, const int64_t *idx, float value);
/* Fill every logical element with uniform values in [lo, hi). */
void tc_buf_fill_uniform(tc_buf *buf, tc_rng *rng, double lo, double hi);

/* A library view of the buffer. */
sdpa_tensor tc_buf_view(const tc_buf *buf);
/* A reference view; rank-3 [B, X, Y] becomes [B, 1, X, Y]. Bias views keep their rank. */
ref_view tc_buf_ref4(const tc_buf *buf);
ref_view tc_buf_ref_same_rank(const tc_buf *buf);

/* Iterate logical indices: start with all zeros; returns 0 after the last one. */
int tc_index_next(int rank, const int64_t *shape, int64_t *idx);
int64_t tc_numel(int rank, const int64_t *shape);

/* 1 if every float in the allocation that no logical element covers still holds the canary. */
int tc_buf_holes_intact(const tc_buf *buf);
/* 1 if every byte of the allocation still holds the canary. */
int tc_buf_all_canary(const tc_buf *buf);

/* ------------------------------------------------------------------- misc */

void tc_fill_canary(void *p, size_t bytes);
int tc_is_canary(const void *p, size_t bytes);

/* Build a contiguous sdpa_tensor quickly; fails the test on error. */
sdpa_tensor tc_view4(float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
sdpa_tensor tc_view3(float *data, int64_t d0, int64_t d1, int64_t d2);
sdpa_allow_mask tc_mask_view(const uint8_t *data, int rank, const int64_t *shape);

#endif /* SDPA_TEST_COMMON_H */
