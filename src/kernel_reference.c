/* The reference kernel. For each (batch, head, block of query rows):
 *   1. one score tile [rows, keys] from the matmul core (keys: the union of the rows'
 *      structural ranges, every key when `weights` holds raw scores);
 *   2. per row: softcap, bias, the allowed set, a masked softmax into probabilities
 *      (exact 0 where blocked), lse and the requested weights;
 *   3. out = P.V through the matmul core. A key whose probability is 0 in every row of the
 *      block (blocked, or outside some rows' ranges) is never read: if there is one, the V
 *      rows of the range are gathered into the workspace with such rows replaced by zeros,
 *      so a NaN stored there cannot reach out (0 * NaN would). Which path runs depends on
 *      the probabilities only, never on the values stored in blocked rows, so those values
 *      cannot change a single bit of the result.
 * Extra memory: tiles of row_block x S and row_block x Ev floats and S x Ev floats of
 * gathered V, never B*H*L*S. */
#include "kernel.h"

#include <math.h>
#include <string.h>

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* Row states after step 2. */
enum { ROW_PV = 0, ROW_DONE = 1 };
/* Per-key flags of the row being processed (S bytes of workspace). */
enum { KEY_ALLOWED = 1, KEY_RAW_NOT_FINITE = 2 };

/* Add with saturation to SIZE_MAX (an overflowed size is reported by the caller). */
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t mul_sat(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }

/* base + off, without arithmetic on the NULL data of an empty view. */
static float *at(float *base, int64_t off) { return base ? base + off : NULL; }

static sdpa__mat q_block(const sdpa__plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows) {
    sdpa__mat m = {at(p->q.data, b * p->q.strides[0] + h * p->q.strides[1] + i0 * p->q.strides[2]), rows, p->E,
                   p->q.strides[2], p->q.strides[3]};
    return m;
}

/* K^T restricted to keys [j0, j0 + n): a logical [E, n] matrix. */
static sdpa__mat kt_block(const sdpa__plan *p, int64_t b, int64_t g, int64_t j0, int64_t n) {
    sdpa__mat m = {at(p->k.data, b * p->k.strides[0] + g * p->k.strides[1] + j0 * p->k.strides[2]), p->E, n,
                   p->k.strides[3], p->k.strides[2]};
    return m;
}

/* V restricted to keys [j0, j0 + n): a logical [n, Ev] matrix. */
static sdpa__mat v_block(const sdpa__plan *p, int64_t b, int64_t g, int64_t j0, int64_t n) {
    sdpa__mat m = {at(p->v.data, b * p->v.strides[0] + g * p->v.strides[1] + j0 * p->v.strides[2]), n, p->Ev,
                   p->v.strides[2], p->v.strides[3]};
    return m;
}

/* Workspace layout, in this order, each part 64-byte aligned. */
typedef struct layout {
    size_t flags, tile, otile, state, acc, vgather, pack, total;
} layout;

static layout make_layout(const sdpa__plan *p) {
    const size_t rb = (size_t)p->row_block, S = (size_t)p->S, Ev = (size_t)p->Ev;
    const sdpa__mat a = q_block(p, 0, 0, 0, p->row_block), kt = kt_block(p, 0, 0, 0, p->S),
                    vb = v_block(p, 0, 0, 0, p->S);
    const size_t pack_scores = add_sat(sdpa__matmul_pack_floats(&a), sdpa__matmul_pack_floats(&kt));
    const size_t pack_pv = sdpa__matmul_pack_floats(&vb); /* the gathered copy never needs packing */
    layout l;
    l.flags = 0;                                                            /* S bytes (also check_values) */
    l.tile = ALIGN_UP(S);                                                   /* scores, then probabilities */
    l.otile = add_sat(l.tile, ALIGN_UP(mul_sat(mul_sat(rb, S), sizeof(float))));
    l.state = add_sat(l.otile, ALIGN_UP(mul_sat(mul_sat(rb, Ev), sizeof(float))));
    l.acc = add_sat(l.state, ALIGN_UP(rb));
    l.vgather = add_sat(l.acc, ALIGN_UP(mul_sat(Ev, sizeof(double))));
    l.pack = add_sat(l.vgather, ALIGN_UP(mul_sat(mul_sat(S, Ev), sizeof(float))));
    l.total = add_sat(l.pack, mul_sat(pack_scores > pack_pv ? pack_scores : pack_pv, sizeof(float)));
    return l;
}



static void zero_row(float *row, int64_t n, int64_t stride) {
    for (int64_t d = 0; d < n; ++d)
        row[d * stride] = 0.0f;
}

/* A score-stage weights row over all S keys: s[j - jlo] inside [jlo, jhi) (for MASKED only
 * where allowed, -inf elsewhere; the other stages cover every key). An entry whose float32
 * value, or raw score before softcap, is not finite is recomputed in double, so a finite
 * score never shows as inf or as a clipped softcap. */
static void write_scores_row(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, float *w, const float *s,
                             const uint8_t *flags, int64_t jlo, int64_t jhi, int stage) {
    const int64_t ws = p->weights.strides[3];
    for (int64_t j = 0; j < p->S; ++j) {
        float x = -INFINITY;
        if (j >= jlo && j < jhi && (stage != SDPA_WEIGHTS_MASKED || (flags[j - jlo] & KEY_ALLOWED))) {
            x = s[j - jlo];
            if (!isfinite(x) || (flags[j - jlo] & KEY_RAW_NOT_FINITE))
                x = (float)sdpa__fallback_score_double(p, b, h, i, j, stage);
        }
        w[j * ws] = x;
    }
}

/* A probabilities weights row over all S keys: p[j - jlo] inside [jlo, jhi), 0 elsewhere. */
static void write_probs_row(const sdpa__plan *p, float *w, const float *prob, int64_t jlo, int64_t jhi) {
    const int64_t ws = p->weights.strides[3];
    for (int64_t j = 0; j < p->S; ++j)
        w[j * ws] = j >= jlo && j < jhi ? prob[j - jlo] : 0.0f;
}

/* Step 2 for row i: turns its scores s[0, n) (keys jlo + [0, n)) into probabilities, exact 0
 * where blocked, writes lse and weights, and returns ROW_PV if out still needs P.V, or
 * ROW_DONE if the row is complete (padding, empty, or redone in double). */
static int softmax_row(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i, float *s,
                       int64_t jlo, int64_t n, uint8_t *allowed, double *acc, float *orow, float *wrow,
                       float *lrow) {
    const int64_t jhi = jlo + n;
    if (sdpa__rule_is_padding(&p->rules, b, i)) {
        zero_row(orow, p->Ev, p->out.strides[3]);
        if (wrow)
            zero_row(wrow, p->S, p->weights.strides[3]);
        if (lrow)
            *lrow = -INFINITY;
        return ROW_DONE;
    }
    int64_t lo, hi;
    sdpa__rule_range(&p->rules, b, i, &lo, &hi);
    /* Flags: allowed by the rule; raw float32 score not finite (an overflow that softcap would
     * hide: tanh(inf) = 1). */
    sdpa__rule_row_flags(&p->rules, b, h, i, lo, hi, jlo, n, allowed); /* KEY_ALLOWED or 0 */
    for (int64_t j = 0; j < n; ++j)
        allowed[j] = (uint8_t)(allowed[j] | (isfinite(s[j]) ? 0 : KEY_RAW_NOT_FINITE));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_SCORES)
        write_scores_row(p, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_SCORES);
    const float c = p->softcap;
    if (c > 0.0f)
        for (int64_t j = 0; j < n; ++j)
            s[j] = c * tanhf(s[j] / c);
    if (wrow && p->weights_stage == SDPA_WEIGHTS_SOFTCAPPED)
        write_scores_row(p, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_SOFTCAPPED);
    /* Bias is read and added where allowed only; -inf blocks. */
    const float *brow = p->rules.has_bias ? sdpa__rule_bias_row(&p->rules, b, h, i) : NULL;
    bool any = false, overflow = false;
    for (int64_t j = 0; j < n; ++j) {
        if (!(allowed[j] & KEY_ALLOWED))
            continue;
        if (brow) /* a -inf bias already blocked the key */
            s[j] += brow[(jlo + j) * p->rules.bias.strides[3]];
        overflow = overflow || (allowed[j] & KEY_RAW_NOT_FINITE) || !isfinite(s[j]);
        any = true;
    }
    if (wrow && p->weights_stage == SDPA_WEIGHTS_MASKED)
        write_scores_row(p, b, h, i, wrow, s, allowed, jlo, jhi, SDPA_WEIGHTS_MASKED);
    for (int64_t j = 0; j < n; ++j) /* plain 0/1 from here on */
        allowed[j] &= KEY_ALLOWED;
    if (!any) { /* policy ZERO (ERROR was rejected before any write) */
        zero_row(orow, p->Ev, p->out.strides[3]);
        if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
            zero_row(wrow, p->S, p->weights.strides[3]);
        if (lrow)
            *lrow = -INFINITY;
        return ROW_DONE;
    }
    if (overflow) { /* a float32 score overflowed: redo this row in double */
        sdpa__fallback_row_double(p, drop, b, h, i, acc, orow, wrow, lrow);
        return ROW_DONE;
    }
    const float mx = sdpa__masked_max(s, allowed, n);
    const double sum = sdpa__masked_exp_sum(s, allowed, n, mx); /* s[j] = exp(s[j] - mx), 0 if blocked */
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; ++j)
        s[j] *= inv;
    if (lrow)
        *lrow = (float)((double)mx + log(sum));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
        write_probs_row(p, wrow, s, jlo, jhi); /* pre-dropout, as documented */
    sdpa__dropout_apply(drop, b, h, i, jlo, n, s);
    return ROW_PV;
}

/* Row (b, h, i) of out, weights (NULL if not requested) and lse (NULL if not requested). */
static void row_outputs(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, float **orow, float **wrow,
                        float **lrow) {
    *orow = at(p->out.data, b * p->out.strides[0] + h * p->out.strides[1] + i * p->out.strides[2]);
    *wrow = p->has_weights
                ? at(p->weights.data, b * p->weights.strides[0] + h * p->weights.strides[1] + i * p->weights.strides[2])
                : NULL;
    *lrow = p->has_lse ? at(p->lse, b * p->lse_strides[0] + h * p->lse_strides[1] + i * p->lse_strides[2]) : NULL;
}

static sdpa_status reference_run(const sdpa__plan *p, int threads, void *ws_raw, size_t ws_bytes) {
    (void)threads; /* the calling thread only */
    const layout l = make_layout(p);
    if (ws_bytes < l.total)
        return sdpa__fail(SDPA_ERR_INTERNAL, "sdpa_attention: internal workspace of %zu bytes is below %zu", ws_bytes,
                          l.total);
    unsigned char *ws = (unsigned char *)ws_raw;
    uint8_t *allowed = ws + l.flags, *state = ws + l.state;
    float *tile = (float *)(ws + l.tile), *otile = (float *)(ws + l.otile), *pack = (float *)(ws + l.pack);
    float *vgather = (float *)(ws + l.vgather);
    double *acc = (double *)(ws + l.acc);
    const bool score_stage = p->has_weights && p->weights_stage != SDPA_WEIGHTS_PROBABILITIES;
    sdpa__dropout drop;
    sdpa__dropout_init(&drop, p->dropout_p, p->dropout_seed, p->dropout_offset);

    for (int64_t b = 0; b < p->B; ++b) {
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t g = h / p->group;
            for (int64_t i0 = 0; i0 < p->L; i0 += p->row_block) {
                const int64_t rows = p->L - i0 < p->row_block ? p->L - i0 : p->row_block;
                /* Keys the block can need: the union of the rows' structural ranges. */
                int64_t jlo = p->S, jhi = 0;
                for (int64_t r = 0; r < rows; ++r) {
                    int64_t lo, hi;
                    if (sdpa__rule_is_padding(&p->rules, b, i0 + r))
                        continue;
                    sdpa__rule_range(&p->rules, b, i0 + r, &lo, &hi);
                    if (lo < hi) {
                        jlo = lo < jlo ? lo : jlo;
                        jhi = hi > jhi ? hi : jhi;
                    }
                }
                if (score_stage) {
                    jlo = 0;
                    jhi = p->S;
                }
                const int64_t n = jhi > jlo ? jhi - jlo : 0;
                if (n > 0) {
                    const sdpa__mat a = q_block(p, b, h, i0, rows), kt = kt_block(p, b, g, jlo, n);
                    sdpa__mat t = {tile, rows, n, n, 1};
                    sdpa__matmul(&a, &kt, p->scale, 0.0f, &t, pack);
                }
                bool need_pv = false;
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = i0 + r;
                    float *orow, *wrow, *lrow;
                    row_outputs(p, b, h, i, &orow, &wrow, &lrow);
                    state[r] = (uint8_t)softmax_row(p, &drop, b, h, i, tile + r * n, jlo, n, allowed, acc, orow,
                                                    wrow, lrow);
                    if (state[r] == ROW_DONE)
                        memset(tile + r * n, 0, (size_t)n * sizeof(float)); /* no contribution to P.V */
                    else
                        need_pv = true;
                }
                if (!need_pv || p->Ev == 0)
                    continue;
                /* Keys with a nonzero probability in some row of the block. */
                uint8_t *used = allowed;
                memset(used, 0, (size_t)n);
                bool all_used = true;
                for (int64_t j = 0; j < n; ++j) {
                    for (int64_t r = 0; r < rows && !used[j]; ++r)
                        used[j] = tile[r * n + j] != 0.0f;
                    all_used = all_used && used[j];
                }
                sdpa__mat vb = v_block(p, b, g, jlo, n);
                if (!all_used) { /* gather, zeros for the keys nothing uses: they are never read */
                    for (int64_t j = 0; j < n; ++j)
                        for (int64_t d = 0; d < p->Ev; ++d)
                            vgather[j * p->Ev + d] = used[j] ? vb.data[j * vb.row_stride + d * vb.col_stride] : 0.0f;
                    const sdpa__mat gathered = {vgather, n, p->Ev, p->Ev, 1};
                    vb = gathered;
                }
                const sdpa__mat pm = {tile, rows, n, n, 1};
                sdpa__mat o = {otile, rows, p->Ev, p->Ev, 1};
                sdpa__matmul(&pm, &vb, 1.0f, 0.0f, &o, pack);
                for (int64_t r = 0; r < rows; ++r) {
                    if (state[r] != ROW_PV)
                        continue;
                    const int64_t i = i0 + r;
                    float *orow, *wrow, *lrow;
                    row_outputs(p, b, h, i, &orow, &wrow, &lrow);
                    bool finite = true;
                    for (int64_t d = 0; d < p->Ev; ++d) {
                        const float x = drop.on ? otile[r * p->Ev + d] * drop.scale : otile[r * p->Ev + d];
                        orow[d * p->out.strides[3]] = x;
                        finite = finite && isfinite(x);
                    }
                    if (!finite) /* the float32 P.V sum overflowed (|v| near FLT_MAX): redo in double */
                        sdpa__fallback_row_double(p, &drop, b, h, i, acc, orow, wrow, lrow);
                }
            }
        }
    }
    sdpa__set_kernel("reference");
    return SDPA_OK;
}

static sdpa__fit reference_supports(const sdpa__plan *p, const char **why) {
    (void)p;
    (void)why;
    return SDPA__FIT_AUTO;
}

static int reference_threads(const sdpa__plan *p) {
    (void)p;
    return 1;
}

static size_t reference_workspace_bytes(const sdpa__plan *p, int threads) {
    (void)threads;
    return make_layout(p).total;
}

const sdpa__kernel sdpa__kernel_reference = {
    SDPA_KERNEL_REFERENCE, "SDPA_KERNEL_REFERENCE", false, reference_supports, reference_threads,
    reference_workspace_bytes, reference_run,
};
