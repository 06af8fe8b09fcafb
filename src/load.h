/* Loaders: the only code that knows how Q, K and V are stored (dtype x addressing). A kernel
 * asks a loader for rows [r0, r1) of one (b, head) of a view and gets float32 rows, contiguous
 * along the last axis (E or Ev), that the micro-kernels read; scores, softmax and accumulation
 * never see the storage. The plan picks one loader per input (plan.c: sdpa__loader_for), so q,
 * k and v may each be stored differently.
 *
 * float32 rows with unit inner stride are handed out in place (a pointer into the caller's
 * buffer and its row stride: no copy, so f32 costs what it did in 0.3); any other layout is
 * copied (widened) into the caller's tile.
 * rows_raw (0.5) hands out rows of any dtype in place, as stored, for micro-kernels that read
 * the storage dtype themselves (the decode kernel's sdpa__mk_kv); it reads nothing.
 *
 * Adding a storage dtype (f16, bf16) is one addition here:
 *   1. write its loader in load.c (or load_<isa>.c for SIMD conversions): a `rows` function
 *      that widens exactly to float32 into `tile` (f16/bf16 -> f32 is exact), and a
 *      `row_finite` function that tests the stored encodings (f16 Inf/NaN: exponent all ones);
 *   2. put it in the table g_loaders[addressing][dtype] of load.c, at [SDPA__ADDR_STRIDED]
 *      [SDPA_DTYPE_F16] (the table is indexed by the public sdpa_dtype value);
 *   3. let view validation (view.c) accept the dtype for q/k/v.
 * No kernel body changes: kernels reserve tile space of sdpa__LOAD_TILE_FLOATS(rows, width)
 * floats per tile whatever the dtype. A micro-kernel column that reads reduced-precision tiles
 * directly (bf16 dot products) is registered in dispatch.c by [isa][dtype] instead.
 * Adding an addressing (paged KV: block table + page size) is one more row of the table
 * (SDPA__ADDR_PAGED) whose rows() gathers rows page by page into the tile, and a plan field
 * holding the block table; kernels ask for the same row ranges as for a strided cache. */
#ifndef SDPA_LOAD_H
#define SDPA_LOAD_H

#include "internal.h"

struct sdpa__mk;

/* float32 rows handed to a kernel: row t (t < r1 - r0) at data + t * stride, its elements
 * contiguous. */
typedef struct sdpa__rows {
    const float *data;
    ptrdiff_t stride;
} sdpa__rows;

/* How a view's elements are addressed. */
typedef enum sdpa__addressing {
    SDPA__ADDR_STRIDED = 0, /* shape and strides (sdpa_tensor) */
    SDPA__ADDR_PAGED = 1,   /* block pool + block table (sdpa__view4's paged fields; 0.5) */
    SDPA__ADDR_COUNT
} sdpa__addressing;

/* Raw bf16 rows (SDPA_PRECISION_REDUCED's bf16 dot products): row t at data + t * stride
 * (stride >= the row width), elements contiguous. */
typedef struct sdpa__rows16 {
    const uint16_t *data;
    ptrdiff_t stride;
} sdpa__rows16;

/* Rows as stored, in place (the decode kernel's stored-K/V micro-kernels, microkernel.h
 * sdpa__mk_kv): the first n rows from r0, row t at element t * stride of data (elements of the
 * view's dtype), each contiguous along the last axis. n = 0: not in place (use rows()). */
typedef struct sdpa__raw_rows {
    const void *data;
    ptrdiff_t stride;
    int64_t n;
    bool runs_on; /* the following rows continue at the same stride (strided: a hardware-friendly stream) */
} sdpa__raw_rows;

typedef struct sdpa__loader {
    const char *name; /* "f32-strided" */
    /* Rows [r0, r1) (axis 2) of (b, h) (axes 0, 1) of v, each of v->shape[3] elements, as
     * float32 rows; may fill tile, which holds (r1 - r0) * v->shape[3] floats. r0 < r1. */
    sdpa__rows (*rows)(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, float *tile);
    /* Whether row r of (b, h) of v holds no NaN or Inf (the finite check). */
    bool (*row_finite)(const struct sdpa__mk *mk, const sdpa__view4 *v, int64_t b, int64_t h, int64_t r);
    /* bf16 storage only (NULL for the others): rows [r0, r1) as their raw bf16 encodings, in
     * place when contiguous along the last axis (and rows do not overlap), else copied into
     * tile ((r1 - r0) * v->shape[3] uint16_t; the f32 tile has room for that). */
    sdpa__rows16 (*rows_bf16)(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1, uint16_t *tile);
    /* Rows [r0, r0 + n) of (b, h) in place, for the largest n <= r1 - r0 this addressing can
     * give at once: strided, all of them; paged, up to the end of r0's block and of the
     * sequence's keys (key_lengths[b]), so a caller walks a range block by block. n = 0 when the
     * last axis is not contiguous (the caller copies through rows()) or r0 is past the keys.
     * Reads nothing. */
    sdpa__raw_rows (*rows_raw)(const sdpa__view4 *v, int64_t b, int64_t h, int64_t r0, int64_t r1);
} sdpa__loader;

/* The loader for a validated view (its dtype) under an addressing. */
const sdpa__loader *sdpa__loader_for(const sdpa__view4 *v, sdpa__addressing addressing);

#endif
