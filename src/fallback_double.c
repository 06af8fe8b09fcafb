/* Rows float32 cannot carry although their inputs are finite (a score or the P.V sum of a
 * row overflowed float32), recomputed in double: DESIGN section 4, step 10. Every kernel
 * calls this file for such rows; it reads q, k and v through the plan's loaders (load.h) and
 * asks rules.c which keys are allowed. */
#include "internal.h"
#include "load.h"

#include <math.h>
#include <string.h>

/* Scratch: Ev doubles (the P.V sum), then float32 rows of q, k (E each) and v (Ev). */
typedef struct scratch {
    double *acc;
    float *q, *k, *v;
} scratch;

static scratch carve(const sdpa__plan *p, void *raw) {
    unsigned char *at = (unsigned char *)raw;
    scratch s;
    s.acc = (double *)at;
    at += sdpa__align64((size_t)p->Ev * sizeof(double));
    s.q = (float *)at;
    at += sdpa__align64((size_t)p->E * sizeof(float));
    s.k = (float *)at;
    at += sdpa__align64((size_t)p->E * sizeof(float));
    s.v = (float *)at;
    return s;
}

size_t sdpa__fallback_scratch_bytes(const sdpa__plan *p) {
    const size_t E = (size_t)p->E, Ev = (size_t)p->Ev;
    return sdpa__add_sat(sdpa__add_sat(sdpa__align64(sdpa__mul_sat(Ev, sizeof(double))),
                                       sdpa__mul_sat(2, sdpa__align64(sdpa__mul_sat(E, sizeof(float))))),
                         sdpa__align64(sdpa__mul_sat(Ev, sizeof(float))));
}

/* q row (b, h, i) and k row (b, g, j) as float32 through the loaders; the score in double. */
static double score(const sdpa__plan *p, const scratch *sc, int64_t b, int64_t h, int64_t i, int64_t j, int stage) {
    const float *qr = p->load_q->rows(&p->q, b, h, i, i + 1, sc->q).data;
    const float *kr = p->load_k->rows(&p->k, b, h / p->group, j, j + 1, sc->k).data;
    double d = 0.0;
    for (int64_t e = 0; e < p->E; ++e)
        d += (double)qr[e] * (double)kr[e];
    d *= (double)p->scale;
    if (stage == SDPA_WEIGHTS_SCORES)
        return d;
    if (p->softcap > 0.0f)
        d = (double)p->softcap * tanh(d / (double)p->softcap);
    if (stage == SDPA_WEIGHTS_SOFTCAPPED)
        return d;
    d -= sdpa__rule_alibi_term(&p->rules, b, h, i, j);
    if (p->rules.has_bias)
        d += (double)sdpa__rule_bias_at(&p->rules, sdpa__rule_bias_row(&p->rules, b, h, i), j);
    return d;
}

double sdpa__fallback_score_double(const sdpa__plan *p, int64_t b, int64_t h, int64_t i, int64_t j, int stage,
                                   void *scr) {
    const scratch sc = carve(p, scr);
    return score(p, &sc, b, h, i, j, stage);
}

/* A row that float32 cannot carry (a score or the P.V sum overflowed although the inputs are
 * finite): softmax, P.V, lse and probabilities in double from recomputed scores. Rare, so
 * scores are recomputed per pass instead of stored. The row has at least one allowed key. */
void sdpa__fallback_row_double(const sdpa__plan *p, const sdpa__dropout *drop, int64_t b, int64_t h, int64_t i,
                               void *scr, void *orow, float *wrow, float *lrow) {
    const scratch sc = carve(p, scr);
    double *acc = sc.acc;
    int64_t lo, hi;
    sdpa__rule_range(&p->rules, b, i, &lo, &hi);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = lo; j < hi; ++j)
        if (sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi)) {
            const double x = score(p, &sc, b, h, i, j, SDPA_WEIGHTS_MASKED);
            mx = x > mx ? x : mx;
        }
    const double sink = (double)sdpa__sink(p->sinks, h); /* denominator only */
    mx = sink > mx ? sink : mx;
    if (sink > -INFINITY)
        sum = exp(sink - mx);
    memset(acc, 0, (size_t)p->Ev * sizeof(double));
    for (int64_t j = lo; j < hi; ++j) {
        if (!sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi))
            continue;
        const double e = exp(score(p, &sc, b, h, i, j, SDPA_WEIGHTS_MASKED) - mx);
        sum += e;
        uint8_t kept = 1;
        sdpa__dropout_keep(drop, b, h, i, j, 1, &kept);
        if (!kept)
            continue;
        if (p->Ev == 0)
            continue;
        const float *vrow = p->load_v->rows(&p->v, b, h / p->group, j, j + 1, sc.v).data;
        for (int64_t d = 0; d < p->Ev; ++d)
            acc[d] += e * (double)vrow[d];
    }
    for (int64_t d = 0; d < p->Ev; ++d)
        sdpa__out_put(p, orow, d, (float)(acc[d] / sum * (double)drop->scale));
    if (lrow)
        *lrow = (float)(mx + log(sum));
    if (wrow && p->weights_stage == SDPA_WEIGHTS_PROBABILITIES)
        for (int64_t j = 0; j < p->S; ++j)
            wrow[j * p->weights.strides[3]] =
                sdpa__rule_allows(&p->rules, b, h, i, j, lo, hi)
                    ? (float)(exp(score(p, &sc, b, h, i, j, SDPA_WEIGHTS_MASKED) - mx) / sum)
                    : 0.0f;
}

