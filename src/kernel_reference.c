/* The reference kernel: for each (batch, head, block of query rows) one score tile
 * [rows, keys] from the matmul core, then a masked softmax per row and P.V over allowed keys
 * only (a blocked key's V row is never multiplied, so NaN there cannot leak).
 * Extra memory: one tile of row_block x S floats, not B*H*L*S. */
#include "internal.h"

#include <math.h>
#include <string.h>

#define ALIGN_UP(x) (((x) + 63u) & ~(size_t)63u)

/* Add with saturation to SIZE_MAX (an overflowed size is reported by the caller). */
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t mul_sat(size_t a, size_t b) { return (b != 0 && a > SIZE_MAX / b) ? SIZE_MAX : a * b; }

static sdpa__mat q_block(const sdpa__plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows) {
    sdpa__mat m = {p->q.data + b * p->q.strides[0] + h * p->q.strides[1] + i0 * p->q.strides[2], rows, p->E,
                   p->q.strides[2], p->q.strides[3]};
    return m;
}

/* K^T restricted to keys [j0, j0 + n): a logical [E, n] matrix. */
static sdpa__mat kt_block(const sdpa__plan *p, int64_t b, int64_t g, int64_t j0, int64_t n) {
    sdpa__mat m = {p->k.data + b * p->k.strides[0] + g * p->k.strides[1] + j0 * p->k.strides[2], p->E, n,
                   p->k.strides[3], p->k.strides[2]};
    return m;
}

size_t sdpa__reference_workspace_bytes(const sdpa__plan *p) {
    size_t rb = (size_t)p->row_block, S = (size_t)p->S;
    sdpa__mat a = q_block(p, 0, 0, 0, p->row_block);
    sdpa__mat kt = kt_block(p, 0, 0, 0, p->S);
    size_t n = ALIGN_UP(S);                                        /* row flags (and check_values) */
    n = add_sat(n, ALIGN_UP(mul_sat(mul_sat(rb, S), sizeof(float)))); /* score tile */
    n = add_sat(n, ALIGN_UP((size_t)p->Ev * sizeof(double)));          /* P.V accumulator */
    n = add_sat(n, mul_sat(add_sat(sdpa__matmul_pack_floats(&a), sdpa__matmul_pack_floats(&kt)), sizeof(float)));
    return n;
}

static void write_weights_row(const sdpa__plan *p, float *w, const float *s, const uint8_t *allowed,
                              int64_t jlo, int64_t jhi, float fill, bool masked_fill) {
    const int64_t ws = p->weights.strides[3];
    for (int64_t j = 0; j < p->S; ++j) {
        float x = fill;
        if (j >= jlo && j < jhi && (!masked_fill || allowed[j - jlo]))
            x = s[j - jlo];
        w[j * ws] = x;
    }
}

/* Score of allowed pair (i, j) in double precision: scale, softcap, bias. */
static double score_double(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    const float *qr = p->q.data + b * p->q.strides[0] + h * p->q.strides[1] + i * p->q.strides[2];
    const float *kr = p->k.data + b * p->k.strides[0] + (h / p->group) * p->k.strides[1] + j * p->k.strides[2];
    double d = 0.0;
    for (int64_t e = 0; e < p->E; ++e)
        d += (double)qr[e * p->q.strides[3]] * (double)kr[e * p->k.strides[3]];
    d *= (double)p->scale;
    if (p->softcap > 0.0f)
        d = (double)p->softcap * tanh(d / (double)p->softcap);
    if (p->has_bias)
        d += (double)sdpa__bias_row(p, b, h, i)[j * p->bias.strides[3]];
    return d;
}

/* One row whose float32 scores overflowed (|scale q.k| beyond FLT_MAX with finite inputs):
 * softmax, P.V and lse in double from recomputed scores. Rare, so scores are recomputed
 * per pass instead of stored. */
static void row_in_double(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, const uint8_t *allowed,
                          int64_t jlo, int64_t jhi, double *acc, float *orow, float *wrow, float *lrow) {
    const float *vbase = p->v.data + b * p->v.strides[0] + (h / p->group) * p->v.strides[1];
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = jlo; j < jhi; ++j)
        if (allowed[j - jlo]) {
            const double x = score_double(p, b, h, i, j);
            mx = x > mx ? x : mx;
        }
    memset(acc, 0, (size_t)p->Ev * sizeof(double));
    for (int64_t j = jlo; j < jhi; ++j) {
        if (!allowed[j - jlo])
            continue;
        const double e = exp(score_double(p, b, h, i, j) - mx);
        const float *vrow = vbase + j * p->v.strides[2];
        sum += e;
        for (int64_t d = 0; d < p->Ev; ++d)
            acc[d] += e * (double)vrow[d * p->v.strides[3]];
    }
    for (int64_t d = 0; d < p->Ev; ++d)
        orow[d * p->out.strides[3]] = (float)(acc[d] / sum);
    if (lrow)
        *lrow = (float)(mx + log(sum));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
        for (int64_t j = 0; j < p->S; ++j)
            wrow[j * p->weights.strides[3]] =
                j >= jlo && j < jhi && allowed[j - jlo] ? (float)(exp(score_double(p, b, h, i, j) - mx) / sum) : 0.0f;
}

sdpa_status sdpa__kernel_reference(const sdpa__plan *p, void *ws_raw, size_t ws_bytes) {
    (void)ws_bytes;
    unsigned char *ws = (unsigned char *)ws_raw;
    const size_t S = (size_t)p->S;
    uint8_t *allowed = ws;
    float *tile = (float *)(ws + ALIGN_UP(S));
    double *acc = (double *)((unsigned char *)tile + ALIGN_UP((size_t)p->row_block * S * sizeof(float)));
    float *pack = (float *)((unsigned char *)acc + ALIGN_UP((size_t)p->Ev * sizeof(double)));
    const bool score_stage = p->has_weights && p->weights_stage != SDPA_WEIGHTS_PROBABILITIES;
    const float c = p->softcap;

    for (int64_t b = 0; b < p->B; ++b) {
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t g = h / p->group;
            const float *vbase = p->v.data + b * p->v.strides[0] + g * p->v.strides[1];
            for (int64_t i0 = 0; i0 < p->L; i0 += p->row_block) {
                const int64_t rows = p->L - i0 < p->row_block ? p->L - i0 : p->row_block;
                /* Keys the block can need: the union of the rows' structural ranges
                 * (every key when the weights hold raw scores). */
                int64_t jlo = p->S, jhi = 0;
                for (int64_t r = 0; r < rows; ++r) {
                    int64_t lo, hi;
                    if (sdpa__row_is_padding(p, b, i0 + r))
                        continue;
                    sdpa__row_range(p, b, i0 + r, &lo, &hi);
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
                    sdpa__mat a = q_block(p, b, h, i0, rows), kt = kt_block(p, b, g, jlo, n);
                    sdpa__mat t = {tile, rows, n, n, 1};
                    sdpa__matmul(&a, &kt, p->scale, 0.0f, &t, pack);
                }
                for (int64_t r = 0; r < rows; ++r) {
                    const int64_t i = i0 + r;
                    float *orow = p->out.data + b * p->out.strides[0] + h * p->out.strides[1] + i * p->out.strides[2];
                    float *wrow = p->has_weights ? p->weights.data + b * p->weights.strides[0] +
                                                       h * p->weights.strides[1] + i * p->weights.strides[2]
                                                 : NULL;
                    float *lrow = p->has_lse ? p->lse + b * p->lse_strides[0] + h * p->lse_strides[1] + i * p->lse_strides[2]
                                             : NULL;
                    if (sdpa__row_is_padding(p, b, i)) {
                        for (int64_t d = 0; d < p->Ev; ++d)
                            orow[d * p->out.strides[3]] = 0.0f;
                        if (wrow)
                            for (int64_t j = 0; j < p->S; ++j)
                                wrow[j * p->weights.strides[3]] = 0.0f;
                        if (lrow)
                            *lrow = -INFINITY;
                        continue;
                    }
                    float *s = tile + r * n; /* s[j - jlo] */
                    int64_t lo, hi;
                    sdpa__row_range(p, b, i, &lo, &hi);
                    if (wrow && p->weights_stage == SDPA_WEIGHTS_SCORES)
                        write_weights_row(p, wrow, s, allowed, jlo, jhi, 0.0f, false);
                    if (c > 0.0f)
                        for (int64_t j = 0; j < n; ++j)
                            s[j] = c * tanhf(s[j] / c);
                    if (wrow && p->weights_stage == SDPA_WEIGHTS_SOFTCAPPED)
                        write_weights_row(p, wrow, s, allowed, jlo, jhi, 0.0f, false);
                    /* Allowed flags over [jlo, jhi); bias added where allowed only. */
                    const float *brow = p->has_bias ? sdpa__bias_row(p, b, h, i) : NULL;
                    bool any = false, overflow = false;
                    for (int64_t j = jlo; j < jhi; ++j) {
                        bool ok = j >= lo && j < hi && (!p->has_mask || sdpa__mask_allows(p, b, h, i, j));
                        if (ok && brow) {
                            float bv = brow[j * p->bias.strides[3]];
                            if (bv == -INFINITY)
                                ok = false;
                            else
                                s[j - jlo] += bv;
                        }
                        allowed[j - jlo] = ok;
                        any = any || ok;
                        overflow = overflow || (ok && !isfinite(s[j - jlo]));
                    }
                    if (wrow && p->weights_stage == SDPA_WEIGHTS_MASKED)
                        write_weights_row(p, wrow, s, allowed, jlo, jhi, -INFINITY, true);
                    if (!any) { /* policy ZERO (ERROR was rejected before any write) */
                        for (int64_t d = 0; d < p->Ev; ++d)
                            orow[d * p->out.strides[3]] = 0.0f;
                        if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
                            for (int64_t j = 0; j < p->S; ++j)
                                wrow[j * p->weights.strides[3]] = 0.0f;
                        if (lrow)
                            *lrow = -INFINITY;
                        continue;
                    }
                    if (overflow) { /* a float32 score overflowed: redo this row in double */
                        row_in_double(p, b, h, i, allowed, jlo, jhi, acc, orow, wrow, lrow);
                        continue;
                    }
                    const float mx = sdpa__masked_max(s, allowed, n);
                    const double sum = sdpa__masked_exp_sum(s, allowed, n, mx);
                    const float inv = (float)(1.0 / sum);
                    memset(acc, 0, (size_t)p->Ev * sizeof(double));
                    for (int64_t j = jlo; j < jhi; ++j) {
                        if (!allowed[j - jlo])
                            continue;
                        const float e = s[j - jlo];
                        const float *vrow = vbase + j * p->v.strides[2];
                        if (p->v.strides[3] == 1)
                            for (int64_t d = 0; d < p->Ev; ++d)
                                acc[d] += (double)e * vrow[d];
                        else
                            for (int64_t d = 0; d < p->Ev; ++d)
                                acc[d] += (double)e * vrow[d * p->v.strides[3]];
                    }
                    for (int64_t d = 0; d < p->Ev; ++d)
                        orow[d * p->out.strides[3]] = (float)(acc[d] * inv);
                    if (lrow)
                        *lrow = (float)((double)mx + log(sum));
                    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES) {
                        for (int64_t j = jlo; j < jhi; ++j)
                            s[j - jlo] = allowed[j - jlo] ? s[j - jlo] * inv : 0.0f;
                        write_weights_row(p, wrow, s, allowed, jlo, jhi, 0.0f, false);
                    }
                }
            }
        }
    }
    sdpa__set_kernel("reference");
    return SDPA_OK;
}
