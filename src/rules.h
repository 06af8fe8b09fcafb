/* THE allowed-key rule (DESIGN section 4, step 4), shared by every user: the plan fills one
 * sdpa__rules, and the value checks, the kernels, the double fallback, the mask builders
 * (mask.c) and the MHA layer's mask builder (mha.c) ask these functions; nobody re-derives the
 * aligned position, the structural key range or the mask / bias -inf test. The functions live
 * in rules.c; the one-element accessors below are inline because kernels call them per key. */
#ifndef SDPA_RULES_H
#define SDPA_RULES_H

#include "sdpa.h"
#include "convert.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A validated allow-mask or bias broadcast to [B, Hq, L, S]: strides 0 on broadcast dims. */
typedef struct sdpa__bcast4 {
    const void *data;
    int64_t strides[4];
    int32_t dtype; /* bias: sdpa_dtype of its elements (0 = F32); the allow-mask is uint8 */
} sdpa__bcast4;

/* Everything that decides whether key j may take part in query row (b, h, i). */
typedef struct sdpa__rules {
    int64_t L, S;                               /* query rows and keys per (b, h) */
    int causal;                                 /* 0 or 1: j <= p */
    int alignment;                              /* sdpa_alignment: how p is derived from i */
    const int64_t *query_offsets;               /* [B], SDPA_ALIGN_OFFSETS only */
    int64_t window_left, window_right;          /* p - left <= j <= p + right; -1 = unbounded */
    const int64_t *key_lengths, *query_lengths; /* [B] or NULL */
    bool has_mask; sdpa__bcast4 mask;           /* uint8, nonzero = allowed */
    bool has_bias; sdpa__bcast4 bias;           /* f32, f16 or bf16 (widened where read); -inf blocks */
    const float *alibi_slopes;                  /* ALiBi slopes (NULL = none): [Hq] or [B, Hq] */
    int64_t alibi_stride_b;                     /* 0 for [Hq], Hq for [B, Hq] */
} sdpa__rules;

/* Tile classes (sdpa__rule_classify_tile). */
typedef enum sdpa__tile_class {
    SDPA__TILE_NONE = 0,          /* no row may attend a key of the tile: skip it */
    SDPA__TILE_FULL = 1,          /* every row of the tile's row set may attend every key */
    SDPA__TILE_PARTIAL_RANGE = 2, /* partial, by the structural ranges only (mask all 1 there, no bias) */
    SDPA__TILE_PARTIAL = 3        /* partial per element (allow-mask or bias decide) */
} sdpa__tile_class;

/* The aligned position p(b, i): i (TOP_LEFT), i + S_b - L_b (BOTTOM_RIGHT, S_b = key_lengths[b]
 * or S, L_b = query_lengths[b] or L), i + query_offsets[b] (OFFSETS). */
int64_t sdpa__rule_position(const sdpa__rules *r, int64_t b, int64_t i);

/* Keys [lo, hi) of a band pos - left <= j <= pos + right (left, right < 0: unbounded) inside
 * [0, n); lo >= hi means none (then hi == lo, and lo may exceed n). */
void sdpa__rule_band(int64_t pos, int64_t left, int64_t right, int64_t n, int64_t *lo, int64_t *hi);

/* Structural key range [lo, hi) of row i of batch b: causal, window and key lengths; lo >= hi
 * means no key. Padding rows (sdpa__rule_is_padding) are not special-cased here. */
void sdpa__rule_range(const sdpa__rules *r, int64_t b, int64_t i, int64_t *lo, int64_t *hi);

/* Packed variable-length batches (0.5, cu_seqlens_q): the rules of sequence `seq` alone, as
 * one B = 1 call over its L_r queries and S_r keys would have them: key_lengths and
 * query_offsets indexed by seq, and the aligned position bottom-right per sequence
 * (p = i + S_r - L_r, FlashAttention varlen) unless the alignment is OFFSETS (p = i +
 * query_offsets[seq]); TOP_LEFT means bottom-right here. A packed call takes no allow-mask,
 * bias or query_lengths. */
sdpa__rules sdpa__rule_for_sequence(const sdpa__rules *r, int64_t seq, int64_t L_r, int64_t S_r);

/* Rows i >= query_lengths[b] are padding: out and weights zero, lse -inf, never checked. */
static inline bool sdpa__rule_is_padding(const sdpa__rules *r, int64_t b, int64_t i) {
    return r->query_lengths != NULL && i >= r->query_lengths[b];
}

/* The allow-mask row of (b, h, i) (element j at j * mask.strides[3]); has_mask must hold. */
static inline const uint8_t *sdpa__rule_mask_row(const sdpa__rules *r, int64_t b, int64_t h, int64_t i) {
    return (const uint8_t *)r->mask.data + b * r->mask.strides[0] + h * r->mask.strides[1] + i * r->mask.strides[2];
}
static inline bool sdpa__rule_mask_allows(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j) {
    return sdpa__rule_mask_row(r, b, h, i)[j * r->mask.strides[3]] != 0;
}
/* The bias row of (b, h, i) (key j read by sdpa__rule_bias_at); has_bias must hold. */
static inline const void *sdpa__rule_bias_row(const sdpa__rules *r, int64_t b, int64_t h, int64_t i) {
    const int64_t off = b * r->bias.strides[0] + h * r->bias.strides[1] + i * r->bias.strides[2];
    return (const char *)r->bias.data + off * (r->bias.dtype == SDPA_DTYPE_F32 ? 4 : 2);
}
/* The bias of key j in a bias row, as float32: THE place a bias element is read (f16/bf16
 * widened exactly, convert.h). */
static inline float sdpa__rule_bias_at(const sdpa__rules *r, const void *brow, int64_t j) {
    const int64_t at = j * r->bias.strides[3];
    if (r->bias.dtype == SDPA_DTYPE_F32)
        return ((const float *)brow)[at];
    const uint16_t h = ((const uint16_t *)brow)[at];
    return r->bias.dtype == SDPA_DTYPE_F16 ? sdpa__f16_to_f32(h) : sdpa__bf16_to_f32(h);
}
/* A bias value blocks its key iff it is -inf (any other value is added to the score). */
static inline bool sdpa__rule_bias_blocks(float bv) { return bv == -INFINITY; }

/* ALiBi (DESIGN section 4, step 3): the slope of (b, h), 0 without ALiBi. */
static inline float sdpa__rule_alibi_slope(const sdpa__rules *r, int64_t b, int64_t h) {
    return r->alibi_slopes != NULL ? r->alibi_slopes[b * r->alibi_stride_b + h] : 0.0f;
}
/* THE ALiBi term, a bias that is not scaled or softcapped: s[t * stride] -= slope * |p - j| for
 * the keys j = j0 + t, t < n, of row (b, h, i), p = sdpa__rule_position (in float32: the term is
 * slope * (float)|p - j|, so an explicit bias of -(that) gives the same bits). Does nothing
 * without ALiBi (slope 0). */
void sdpa__rule_alibi_add(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float *s,
                          ptrdiff_t stride);
/* The same term of one pair in double, slope * |p - j| (for the double fallback: finite even
 * where the float32 term overflows, so a huge slope still gives a finite score there). */
/* The same ALiBi term on a lane-major tile (the tiled kernel's layout): s[t * ld + l] is row
 * i0 + l, key j0 + t, for lanes l in [l0, l1) with on[l] == on_value and t in [0, n); the
 * other lanes are left as they are. Bit-identical to sdpa__rule_alibi_add per row. */
void sdpa__rule_alibi_add_lanes(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, const uint8_t *on,
                                uint8_t on_value, int64_t l0, int64_t l1, int64_t j0, int64_t n, float *s, ptrdiff_t ld);
/* The most lanes sdpa__rule_alibi_lanes_form takes. */
#define SDPA__ALIBI_LANES 64
/* The same term in a form a vector loop applies: true when every |p - j| of the tile is an
 * integer below 2^24 (exact in float32) and there is a term (slope != 0, l0 < l1 <= l0 + 64,
 * n > 0); then the term of lane l0 + l, key j0 + t is sl[l] * |base - t + lf[l]| (sl[l] = 0 for
 * a lane that is not on; base - t + lf[l] = p - j exactly), and s -= that term is bit-identical
 * to sdpa__rule_alibi_add_lanes (microkernel.h lanes_sub_abs). False: use
 * sdpa__rule_alibi_add_lanes. sl and lf hold l1 - l0 floats. */
bool sdpa__rule_alibi_lanes_form(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, const uint8_t *on,
                                 uint8_t on_value, int64_t l0, int64_t l1, int64_t j0, int64_t n, float *sl, float *lf,
                                 float *base);
double sdpa__rule_alibi_term(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j);

/* The whole rule for one pair, given the row's structural range [lo, hi): range, allow-mask,
 * bias not -inf. */
bool sdpa__rule_allows(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j, int64_t lo, int64_t hi);

/* allowed[t] = sdpa__rule_allows(.., j0 + t, lo, hi) for t < n; returns whether any is set. */
bool sdpa__rule_row_flags(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi, int64_t j0,
                          int64_t n, uint8_t *allowed);

/* Class of the tile rows i0 + [0, nrows) x keys [j0, j1) of (b, h). lo[t], hi[t] are row
 * i0 + t's structural range (sdpa__rule_range, clipped to the caller's key span if it wants);
 * rows with lo >= hi (padding, empty) take no part. FULL and PARTIAL_RANGE do not read the
 * bias; an allow-mask is scanned over the structurally allowed part only. */
sdpa__tile_class sdpa__rule_classify_tile(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, int64_t nrows,
                                          const int32_t *lo, const int32_t *hi, int64_t j0, int64_t j1);

/* used[j] = 1 for the keys j in [0, S) that some non-padding row i of (b, heads [h0, h1))
 * may attend (the rule: range, mask, bias not -inf), 0 otherwise. cnt: S + 1 int32 of
 * scratch. */
void sdpa__rule_group_keys(const sdpa__rules *r, int64_t b, int64_t h0, int64_t h1, int32_t *cnt, uint8_t *used);

#endif
