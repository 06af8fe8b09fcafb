/*
 * Naive double-precision reference of sdpa_attention() (DESIGN.md section 4, without
 * dropout). Written from the specification only, as an independent oracle for the tests:
 * no tiling, no online softmax, no BLAS. Never optimise it.
 *
 * Every tensor is a rank-4 strided view of doubles (strides in elements, any sign, 0 for
 * broadcast). A rank-3 caller passes H = 1 with any stride for the head axis.
 */
#ifndef SDPA_REF_H
#define SDPA_REF_H

#include <stddef.h>
#include <stdint.h>

#define REF_MAX_RANK 4

/* Result codes of ref_attention(). */
enum {
    REF_OK = 0,
    REF_EMPTY_ROW = 1,  /* a non-padding row has no allowed key under policy ERROR */
    REF_NON_FINITE = 2, /* finite check on and a value that enters out is NaN/Inf */
};

/* Weights stages (same numbering as sdpa_weights_stage). */
enum { REF_W_PROB = 0, REF_W_SCORES = 1, REF_W_SOFTCAPPED = 2, REF_W_MASKED = 3 };

/* Alignments (same numbering as sdpa_alignment). */
enum { REF_ALIGN_TOP_LEFT = 0, REF_ALIGN_BOTTOM_RIGHT = 1, REF_ALIGN_OFFSETS = 2 };

/* Row classification written to ref_attention()'s row_kind output. */
enum { REF_ROW_NORMAL = 0, REF_ROW_EMPTY = 1, REF_ROW_PADDING = 2 };

typedef struct ref_view {
    const double *data; /* address of element [0, ..., 0] */
    int rank;           /* 1..4; q, k, v use 4 */
    int64_t shape[REF_MAX_RANK];
    int64_t strides[REF_MAX_RANK];
} ref_view;

typedef struct ref_mask {
    const uint8_t *data; /* element [0, ..., 0]; nonzero = allowed */
    int rank;            /* 1..4, right-aligned against [B, Hq, L, S] */
    int64_t shape[REF_MAX_RANK];
    int64_t strides[REF_MAX_RANK];
} ref_mask;

typedef struct ref_problem {
    int64_t B, Hq, Hkv, L, S, E, Ev;
    ref_view q; /* [B, Hq, L, E] */
    ref_view k; /* [B, Hkv, S, E] */
    ref_view v; /* [B, Hkv, S, Ev] */

    double scale;   /* 0 = 1/sqrt(E) */
    double softcap; /* 0 = off */

    const ref_view *bias;      /* nullable, rank 1..4 broadcast to [B, Hq, L, S] */
    const ref_mask *mask;      /* nullable */

    int causal;
    int alignment;                /* BOTTOM_RIGHT: p = i + S_b - L_b (S_b, L_b: key/query lengths or S, L) */
    const int64_t *query_offsets; /* [B], used with REF_ALIGN_OFFSETS */
    int sliding_window;           /* 0 = no window (window_* ignored), 1 = apply the window */
    int64_t window_left;          /* -1 = unbounded */
    int64_t window_right;         /* -1 = unbounded */
    const int64_t *key_lengths;   /* [B], nullable */
    const int64_t *query_lengths; /* [B], nullable */

    int empty_rows_zero; /* 0 = ERROR policy, 1 = ZERO policy */
    int weights_stage;   /* REF_W_* */
    /* 0 = report NaN/Inf in q rows that have an allowed key, K/V rows some allowed pair reads
     * and allowed bias entries; 1 = skip that check. */
    int skip_finite_check;
} ref_problem;

typedef struct ref_report {
    int status;                         /* REF_OK, REF_EMPTY_ROW or REF_NON_FINITE */
    int64_t empty_b, empty_h, empty_i;  /* first empty row (row-major), -1 if none */
    int64_t empty_rows;                 /* number of non-padding rows with no allowed key */
} ref_report;

/* Fill problem defaults: window -1/-1 (and sliding_window 0), everything else 0/NULL (so the
 * finite check is on). */
void ref_problem_init(ref_problem *p);

/* Set a contiguous rank-4 view. */
void ref_view_contiguous4(ref_view *view, const double *data, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3);

/*
 * Compute attention. Outputs are contiguous doubles:
 *   out [B, Hq, L, Ev], weights [B, Hq, L, S] (nullable), lse [B, Hq, L] (nullable),
 *   row_kind [B, Hq, L] (nullable): REF_ROW_*.
 * Rows are computed even when the report says EMPTY_ROW or NON_FINITE (the library would
 * fail; the caller decides).
 * Stage SCORES / SOFTCAPPED hold the score of every pair (also blocked ones) in
 * non-padding rows; MASKED holds -inf at blocked pairs; PROB holds 0 at blocked pairs.
 * Padding rows: out 0, weights 0, lse -inf. Empty rows: out 0, lse -inf, weights 0
 * (PROB) / per stage otherwise.
 */
ref_report ref_attention(const ref_problem *p, double *out, double *weights, double *lse,
                         uint8_t *row_kind);

/* Element-wise allow decision for (b, h, i, j) ignoring the bias: mask, causal, key lengths
 * and window (only with sliding_window). Exposed for tests that build expectations by hand. */
int ref_structurally_allowed(const ref_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

#endif /* SDPA_REF_H */
