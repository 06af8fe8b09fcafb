/* Rows float32 cannot carry although their inputs are finite (a score or the P.V sum of a
 * row overflowed float32), recomputed in double: DESIGN section 4, step 10. Every kernel
 * calls this file for such rows; it reads the inputs directly (strided float32) and asks
 * rules.c which keys are allowed. */
#include "internal.h"

#include <math.h>
#include <string.h>

/* base + off, without arithmetic on the NULL data of an empty view. */
static float *at(float *base, int64_t off) { return base ? base + off : NULL; }

/* The score of pair (i, j) in double precision up to `stage`: SCORES (scale q.k),
 * SOFTCAPPED, or MASKED (+ bias; the pair must be allowed). */
double sdpa__fallback_score_double(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, int64_t j, int stage) {
    const float *qr = p->q.data + b * p->q.strides[0] + h * p->q.strides[1] + i * p->q.strides[2];
    const float *kr = p->k.data + b * p->k.strides[0] + (h / p->group) * p->k.strides[1] + j * p->k.strides[2];
    double d = 0.0;
    for (int64_t e = 0; e < p->E; ++e)
        d += (double)qr[e * p->q.strides[3]] * (double)kr[e * p->k.strides[3]];
    d *= (double)p->scale;
    if (stage == SDPA_WEIGHTS_SCORES)
        return d;
    if (p->softcap > 0.0f)
        d = (double)p->softcap * tanh(d / (double)p->softcap);
    if (stage == SDPA_WEIGHTS_SOFTCAPPED)
        return d;
    if (p->rules.has_bias)
        d += (double)sdpa__rule_bias_row(&p->rules, b, h, i)[j * p->rules.bias.strides[3]];
    return d;
}

/* A row that float32 cannot carry (a score or the P.V sum overflowed although the inputs are
 * finite): softmax, P.V, lse and probabilities in double from recomputed scores. Rare, so
 * scores are recomputed per pass instead of stored. The row has at least one allowed key. */
void sdpa__fallback_row_double(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i,
                          double *acc, float *orow, float *wrow, float *lrow) {
    const float *vbase = at(p->v.data, b * p->v.strides[0] + (h / p->group) * p->v.strides[1]);
    int64_t lo, hi;
    sdpa__rule_range(&p->rules, b, i, &lo, &hi);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = lo; j < hi; ++j)
        if (sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi)) {
            const double x = sdpa__fallback_score_double(p, b, h, i, j, SDPA_WEIGHTS_MASKED);
            mx = x > mx ? x : mx;
        }
    memset(acc, 0, (size_t)p->Ev * sizeof(double));
    for (int64_t j = lo; j < hi; ++j) {
        if (!sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi))
            continue;
        const double e = exp(sdpa__fallback_score_double(p, b, h, i, j, SDPA_WEIGHTS_MASKED) - mx);
        const float *vrow = at((float *)vbase, j * p->v.strides[2]);
        sum += e;
        uint8_t kept = 1;
        sdpa__dropout_keep(drop, b, h, i, j, 1, &kept);
        if (!kept)
            continue;
        for (int64_t d = 0; d < p->Ev; ++d)
            acc[d] += e * (double)vrow[d * p->v.strides[3]];
    }
    for (int64_t d = 0; d < p->Ev; ++d)
        orow[d * p->out.strides[3]] = (float)(acc[d] / sum * (double)drop->scale);
    if (lrow)
        *lrow = (float)(mx + log(sum));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
        for (int64_t j = 0; j < p->S; ++j)
            wrow[j * p->weights.strides[3]] =
                sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi)
                    ? (float)(exp(sdpa__fallback_score_double(p, b, h, i, j, SDPA_WEIGHTS_MASKED) - mx) / sum)
                    : 0.0f;
}

