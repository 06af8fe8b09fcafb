/*
 * Naive double-precision reference of sdpa_attention(); see sdpa_ref.h.
 * Straight from DESIGN.md section 4: one row at a time, every rule spelled out.
 */
#include "sdpa_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_problem_init(ref_problem *p)
{
    memset(p, 0, sizeof *p);
    p->window_left = -1;
    p->window_right = -1;
}

void ref_view_contiguous4(ref_view *view, const double *data, int64_t d0, int64_t d1, int64_t d2,
                          int64_t d3)
{
    memset(view, 0, sizeof *view);
    view->data = data;
    view->rank = 4;
    view->shape[0] = d0;
    view->shape[1] = d1;
    view->shape[2] = d2;
    view->shape[3] = d3;
    view->strides[3] = 1;
    view->strides[2] = d3;
    view->strides[1] = d2 * d3;
    view->strides[0] = d1 * d2 * d3;
}

static double at4(const ref_view *t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return t->data[a * t->strides[0] + b * t->strides[1] + c * t->strides[2] + d * t->strides[3]];
}

/* Offset of the broadcast element [b, h, i, j] in a right-aligned rank-r view. */
static int64_t broadcast_offset(int rank, const int64_t *shape, const int64_t *strides, int64_t b,
                                int64_t h, int64_t i, int64_t j)
{
    const int64_t full[4] = {b, h, i, j};
    int64_t off = 0;
    for (int d = 0; d < rank; ++d) {
        int64_t idx = full[4 - rank + d];
        if (shape[d] == 1) {
            idx = 0;
        }
        off += idx * strides[d];
    }
    return off;
}

static double bias_at(const ref_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const ref_view *t = p->bias;
    return t->data[broadcast_offset(t->rank, t->shape, t->strides, b, h, i, j)];
}

static int mask_at(const ref_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const ref_mask *m = p->mask;
    return m->data[broadcast_offset(m->rank, m->shape, m->strides, b, h, i, j)] != 0;
}

/* Aligned position p of query row i in batch b. */
static int64_t aligned_position(const ref_problem *p, int64_t b, int64_t i)
{
    switch (p->alignment) {
    case REF_ALIGN_BOTTOM_RIGHT: {
        /* The last valid query of each sequence sees every valid key (FlashAttention varlen). */
        int64_t sb = p->key_lengths ? p->key_lengths[b] : p->S;
        int64_t lb = p->query_lengths ? p->query_lengths[b] : p->L;
        return i + sb - lb;
    }
    case REF_ALIGN_OFFSETS:
        return i + p->query_offsets[b];
    default:
        return i;
    }
}

int ref_structurally_allowed(const ref_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (p->mask && !mask_at(p, b, h, i, j)) {
        return 0;
    }
    if (p->key_lengths && j >= p->key_lengths[b]) {
        return 0;
    }
    int64_t pos = aligned_position(p, b, i);
    if (p->causal && j > pos) {
        return 0;
    }
    if (p->sliding_window && p->window_left >= 0 && j < pos - p->window_left) {
        return 0;
    }
    if (p->sliding_window && p->window_right >= 0 && j > pos + p->window_right) {
        return 0;
    }
    return 1;
}

static int is_padding_row(const ref_problem *p, int64_t b, int64_t i)
{
    return p->query_lengths && i >= p->query_lengths[b];
}

static double raw_score(const ref_problem *p, double scale, int64_t b, int64_t h, int64_t g, int64_t i,
                        int64_t j)
{
    double dot = 0.0;
    for (int64_t e = 0; e < p->E; ++e) {
        dot += at4(&p->q, b, h, i, e) * at4(&p->k, b, g, j, e);
    }
    return scale * dot;
}

static double capped(const ref_problem *p, double s)
{
    if (p->softcap > 0.0) {
        return p->softcap * tanh(s / p->softcap);
    }
    return s;
}

ref_report ref_attention(const ref_problem *p, double *out, double *weights, double *lse,
                         uint8_t *row_kind)
{
    ref_report rep;
    rep.status = REF_OK;
    rep.empty_b = rep.empty_h = rep.empty_i = -1;
    rep.empty_rows = 0;

    const double scale = p->scale > 0.0 ? p->scale : 1.0 / sqrt((double)p->E);
    const int64_t group = p->Hq / p->Hkv;
    int nonfinite = 0;

    const size_t ns = p->S > 0 ? (size_t)p->S : 1;
    double *score = malloc(ns * sizeof *score);
    double *rawv = malloc(ns * sizeof *rawv);
    unsigned char *allowed = malloc(ns);
    if (!score || !rawv || !allowed) {
        free(score);
        free(rawv);
        free(allowed);
        rep.status = -1;
        return rep;
    }

    for (int64_t b = 0; b < p->B; ++b) {
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t g = h / group;
            for (int64_t i = 0; i < p->L; ++i) {
                const int64_t row = (b * p->Hq + h) * p->L + i;
                double *orow = out + row * p->Ev;
                double *wrow = weights ? weights + row * p->S : NULL;

                if (is_padding_row(p, b, i)) {
                    for (int64_t c = 0; c < p->Ev; ++c) {
                        orow[c] = 0.0;
                    }
                    if (wrow) {
                        for (int64_t j = 0; j < p->S; ++j) {
                            wrow[j] = 0.0;
                        }
                    }
                    if (lse) {
                        lse[row] = -INFINITY;
                    }
                    if (row_kind) {
                        row_kind[row] = REF_ROW_PADDING;
                    }
                    continue;
                }

                const int every_pair = p->weights_stage == REF_W_SCORES ||
                                       p->weights_stage == REF_W_SOFTCAPPED;
                int64_t n_allowed = 0;
                for (int64_t j = 0; j < p->S; ++j) {
                    allowed[j] = 0;
                    score[j] = -INFINITY;
                    rawv[j] = 0.0;
                    int ok = ref_structurally_allowed(p, b, h, i, j);
                    if (ok || (wrow && every_pair)) {
                        rawv[j] = raw_score(p, scale, b, h, g, i, j);
                    }
                    if (!ok) {
                        continue;
                    }
                    double s = capped(p, rawv[j]);
                    if (p->bias) {
                        double bv = bias_at(p, b, h, i, j);
                        if (bv == -INFINITY) {
                            continue;
                        }
                        if (!p->skip_finite_check && !isfinite(bv)) {
                            nonfinite = 1;
                        }
                        s += bv;
                    }
                    if (!p->skip_finite_check) {
                        for (int64_t e = 0; e < p->E; ++e) {
                            if (!isfinite(at4(&p->k, b, g, j, e))) {
                                nonfinite = 1;
                            }
                        }
                        for (int64_t c = 0; c < p->Ev; ++c) {
                            if (!isfinite(at4(&p->v, b, g, j, c))) {
                                nonfinite = 1;
                            }
                        }
                    }
                    allowed[j] = 1;
                    score[j] = s;
                    ++n_allowed;
                }

                /* A q row enters out only if the row has an allowed key. */
                if (n_allowed > 0 && !p->skip_finite_check) {
                    for (int64_t e = 0; e < p->E; ++e) {
                        if (!isfinite(at4(&p->q, b, h, i, e))) {
                            nonfinite = 1;
                        }
                    }
                }

                if (n_allowed == 0) {
                    ++rep.empty_rows;
                    if (!p->empty_rows_zero && rep.empty_b < 0) {
                        rep.empty_b = b;
                        rep.empty_h = h;
                        rep.empty_i = i;
                    }
                    for (int64_t c = 0; c < p->Ev; ++c) {
                        orow[c] = 0.0;
                    }
                    if (lse) {
                        lse[row] = -INFINITY;
                    }
                    if (row_kind) {
                        row_kind[row] = REF_ROW_EMPTY;
                    }
                    if (wrow) {
                        for (int64_t j = 0; j < p->S; ++j) {
                            switch (p->weights_stage) {
                            case REF_W_SCORES: wrow[j] = rawv[j]; break;
                            case REF_W_SOFTCAPPED: wrow[j] = capped(p, rawv[j]); break;
                            case REF_W_MASKED: wrow[j] = -INFINITY; break;
                            default: wrow[j] = 0.0; break;
                            }
                        }
                    }
                    continue;
                }

                double mx = -INFINITY;
                for (int64_t j = 0; j < p->S; ++j) {
                    if (allowed[j] && score[j] > mx) {
                        mx = score[j];
                    }
                }
                double sum = 0.0;
                for (int64_t j = 0; j < p->S; ++j) {
                    if (allowed[j]) {
                        sum += exp(score[j] - mx);
                    }
                }
                for (int64_t c = 0; c < p->Ev; ++c) {
                    orow[c] = 0.0;
                }
                for (int64_t j = 0; j < p->S; ++j) {
                    if (!allowed[j]) {
                        continue;
                    }
                    double w = exp(score[j] - mx) / sum;
                    for (int64_t c = 0; c < p->Ev; ++c) {
                        orow[c] += w * at4(&p->v, b, g, j, c);
                    }
                }
                if (lse) {
                    lse[row] = mx + log(sum);
                }
                if (row_kind) {
                    row_kind[row] = REF_ROW_NORMAL;
                }
                if (wrow) {
                    for (int64_t j = 0; j < p->S; ++j) {
                        switch (p->weights_stage) {
                        case REF_W_SCORES: wrow[j] = rawv[j]; break;
                        case REF_W_SOFTCAPPED: wrow[j] = capped(p, rawv[j]); break;
                        case REF_W_MASKED: wrow[j] = allowed[j] ? score[j] : -INFINITY; break;
                        default: wrow[j] = allowed[j] ? exp(score[j] - mx) / sum : 0.0; break;
                        }
                    }
                }
            }
        }
    }

    free(score);
    free(rawv);
    free(allowed);
    if (nonfinite) {
        rep.status = REF_NON_FINITE;
    } else if (rep.empty_b >= 0) {
        rep.status = REF_EMPTY_ROW;
    }
    return rep;
}
