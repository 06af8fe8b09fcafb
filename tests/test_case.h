/*
 * Random attention problems for the unit tests that compare sdpa_attention with the float64
 * reference (test_attention, test_kernels): random strided layouts, q/k/v/out/weights/lse
 * buffers, options mirrored into a ref_problem (scale, softcap, bias, allow-mask, causal,
 * alignment, offsets, sliding window, key/query lengths, empty-row policy), and a readable
 * description for failure messages. Each test picks its shapes and its feature mix through
 * tc_case_params; the draws happen in a fixed order so that a seed names one case.
 */
#ifndef SDPA_TEST_CASE_H
#define SDPA_TEST_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "test_common.h"

/* Probabilities and ranges of the random features. A probability of 0 means "never" and
 * draws nothing, so that cases of callers that never use a feature stay what they were. */
typedef struct tc_case_params {
    double qk_range;         /* q and k uniform in [-qk_range, qk_range); v in [-2, 2) */
    double bcast_p;          /* chance of a stride-0 axis of an input (q, k, v, bias) */
    double weights_p;        /* chance of a weights output */
    double lse_p;            /* chance of an lse output; >= 1: always (no draw) */
    double softcap_p;
    double bias_p;
    double bias_neginf_p;    /* chance of -inf per bias element */
    double bias_neginf_dense_p; /* chance that the -inf chance is 0.6 instead */
    double mask_p;
    int mask_tiles;          /* sparse or dense masks of any nonzero byte and blocked runs of 70
                                (every tile class of the tiled kernel); else values {1,2,128,255}
                                with 20% zeros */
    double causal_p;
    int64_t offset_lo_div;   /* query offsets in [-S / offset_lo_div, S] */
    int64_t window_right_div; /* window_right in [-1, S / window_right_div] */
    double zero_rows_p;      /* chance of SDPA_EMPTY_ROWS_ZERO */
    int run_opts;            /* also draw weights_stage, num_threads, use_ws and window sides
                                without sliding_window */
} tc_case_params;

typedef struct tc_case {
    int rank;
    int64_t B, Hq, Hkv, L, S, E, Ev;
    tc_buf q, k, v, out, w, lse, bias;
    int has_bias, has_mask, want_w, want_lse, use_ws;
    uint8_t *mask_base;
    sdpa_allow_mask mask;
    ref_mask rmask;
    ref_view rbias;
    sdpa_tensor tbias;
    int64_t offsets[4], kl[4], ql[4];
    sdpa_options opt;  /* bias and allow_mask point into this case */
    ref_problem rp;    /* the same problem for ref_attention */
    char desc[2048];
} tc_case;

/* Layout of a random kind (contiguous, BSHD for rank 4, or a random permutation) with random
 * padding; inputs also get negative strides and, with chance bcast_p, stride-0 axes. */
void tc_random_layout(tc_rng *r, tc_layout *lay, int rank, const int64_t *shape, int is_input,
                      double bcast_p);

/* Shapes of q [B,Hq,L,E], k [B,Hkv,S,E], v [B,Hkv,S,Ev], out [B,Hq,L,Ev], weights [B,Hq,L,S] and
 * lse [B,Hq,L]; rank 3 drops the head axis. A NULL output is skipped. */
void tc_attention_shapes(int rank, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E,
                         int64_t Ev, int64_t *qs, int64_t *ks, int64_t *vs, int64_t *os, int64_t *ws,
                         int64_t *ls);

/* Build the buffers and options of a case whose rank and sizes (rank, B, Hq, Hkv, L, S, E, Ev)
 * the caller has set (from r), drawing the rest from r; label starts the description. */
void tc_case_build(tc_case *c, tc_rng *r, const tc_case_params *p, const char *label);
void tc_case_free(tc_case *c);

/* Element [b, h, i, last] of a rank-3 or rank-4 buffer of the case (h ignored for rank 3). */
float tc_case_at(const tc_buf *buf, int64_t b, int64_t h, int64_t i, int64_t last);
/* lse element [b, h, i]. */
float tc_case_lse_at(const tc_case *c, int64_t b, int64_t h, int64_t i);

/* Error of one element: exact match required where the reference is not finite or exact is
 * set; otherwise relative to max(1, |ref|). Returns +inf on a hard mismatch. */
double tc_elem_err(float got, double ref, int exact);

/* strcat with printf formatting, truncating at cap. */
int tc_append(char *buf, size_t cap, const char *fmt, ...);

#endif /* SDPA_TEST_CASE_H */
