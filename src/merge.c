/* sdpa_merge: combine attention computed over two disjoint key sets of the same query rows.
 *
 * Per row r, with m = max(lse_a, lse_b), wa = exp(lse_a - m), wb = exp(lse_b - m):
 *     out = (wa * out_a + wb * out_b) / (wa + wb),   lse = m + log(wa + wb)
 * in double precision. A side whose lse is -inf (no allowed key there; +inf is read as -inf,
 * side_lse) contributes nothing and its out row is never read: the row takes the other side's
 * values exactly. Both -inf gives a zero row and lse = -inf, as sdpa_attention's
 * SDPA_EMPTY_ROWS_ZERO.
 *
 * Order: pointers -> each view (dtype, rank, reserved, geometry) -> ranks -> shapes -> output
 * layout -> overlap -> values (non-finite) -> write. Nothing is written before the last check.
 * In place: `out` may be exactly out_a or out_b (same element addresses), `lse` exactly lse_a
 * or lse_b. Each element of a row is read before it is written, and a row's lse pair is read
 * before the row is written, so the aliasing is safe. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char FN[] = "sdpa_merge";

/* The six views, by role. */
enum { OA = 0, LA = 1, OB = 2, LB = 3, OUT = 4, LSE = 5, NVIEWS = 6 };
static const char *const NAMES[NVIEWS] = {"out_a", "lse_a", "out_b", "lse_b", "out", "lse"};

/* Same element addresses: same data and same strides on every dimension of size > 1
 * (the shapes are already known to be equal). */
static bool same_view(const sdpa_tensor *x, const sdpa_tensor *y) {
    if (x->data != y->data || x->rank != y->rank)
        return false;
    for (int32_t d = 0; d < x->rank; ++d)
        if (x->shape[d] != y->shape[d] || (x->shape[d] > 1 && x->strides[d] != y->strides[d]))
            return false;
    return true;
}

/* A side's lse as the merge reads it: +inf, FlashAttention-2's lse of a row with no key (its
 * non-split forward writes +inf there, FA3 -inf), is -inf, as vLLM's merge_attn_states reads
 * it; a finite float32 score cannot give +inf. The checks and the merge both read it here. */
static float side_lse(float l) { return l == INFINITY ? -INFINITY : l; }

static const char *describe_value(float x) { return isnan(x) ? "NaN" : (x > 0 ? "+inf" : "-inf"); }

/* Row-major walk over the row index (every axis of `out` but the last). */
typedef struct row_iter {
    int32_t nd;                     /* number of row axes */
    int64_t shape[SDPA_MAX_RANK];   /* sizes of the row axes */
    int64_t idx[SDPA_MAX_RANK];     /* current row index */
    int64_t off[NVIEWS];            /* element offset of the current row in each view */
    int64_t step[NVIEWS][SDPA_MAX_RANK]; /* stride of each row axis in each view */
} row_iter;

static void row_iter_init(row_iter *it, const sdpa_tensor *const v[NVIEWS], int32_t rank) {
    memset(it, 0, sizeof *it);
    it->nd = rank - 1;
    for (int32_t d = 0; d < it->nd; ++d)
        it->shape[d] = v[OUT]->shape[d];
    for (int k = 0; k < NVIEWS; ++k) {
        if (v[k] == NULL)
            continue;
        for (int32_t d = 0; d < it->nd; ++d)
            it->step[k][d] = v[k]->strides[d];
    }
}

static void row_iter_next(row_iter *it) {
    for (int32_t d = it->nd - 1; d >= 0; --d) {
        for (int k = 0; k < NVIEWS; ++k)
            it->off[k] += it->step[k][d];
        if (++it->idx[d] < it->shape[d])
            return;
        for (int k = 0; k < NVIEWS; ++k)
            it->off[k] -= it->step[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

/* "(i0,i1,...)" of the current row, for messages. */
static void row_name(const row_iter *it, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, "(");
    for (int32_t d = 0; d < it->nd && n < cap; ++d)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "," : "", (long long)it->idx[d]);
    if (n < cap)
        snprintf(buf + n, cap - n, ")");
}

static const float *fptr(const sdpa_tensor *t, int64_t off) { return (const float *)t->data + off; }

/* Validate everything; on success *rows is the number of rows and *ev the row width. */
static sdpa_status validate(const sdpa_tensor *const v[NVIEWS], int64_t *rows, int64_t *ev) {
    sdpa_status st;
    for (int k = 0; k < NVIEWS; ++k)
        if (v[k] == NULL && k != LSE)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s is NULL", FN, NAMES[k]);
    for (int k = 0; k < NVIEWS; ++k)
        if (v[k] != NULL && (st = sdpa__check_tensor(v[k], FN, NAMES[k], 1, SDPA_MAX_RANK)) != SDPA_OK)
            return st;

    /* Ranks: the outs agree; the lse views have one axis less (a rank-1 [1] for rank-1 outs). */
    const int32_t rank = v[OA]->rank, lrank = rank > 1 ? rank - 1 : 1;
    for (int k = OB; k <= OUT; k += 2)
        if (v[k]->rank != rank)
            return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d does not match out_a.rank=%d", FN, NAMES[k],
                              (int)v[k]->rank, (int)rank);
    for (int k = LA; k < NVIEWS; k += 2)
        if (v[k] != NULL && v[k]->rank != lrank)
            return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d, expected %d (out_a.rank=%d%s)", FN, NAMES[k],
                              (int)v[k]->rank, (int)lrank, (int)rank,
                              rank > 1 ? " without its last axis" : ": a rank-1 view of shape [1]");

    /* Shapes. */
    for (int k = OB; k <= OUT; k += 2)
        for (int32_t d = 0; d < rank; ++d)
            if (v[k]->shape[d] != v[OA]->shape[d])
                return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld does not match out_a.shape[%d]=%lld", FN,
                                  NAMES[k], (int)d, (long long)v[k]->shape[d], (int)d, (long long)v[OA]->shape[d]);
    for (int k = LA; k < NVIEWS; k += 2) {
        if (v[k] == NULL)
            continue;
        for (int32_t d = 0; d < lrank; ++d) {
            const int64_t want = rank > 1 ? v[OA]->shape[d] : 1;
            if (v[k]->shape[d] != want)
                return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld, expected %lld (%s)", FN, NAMES[k], (int)d,
                                  (long long)v[k]->shape[d], (long long)want,
                                  rank > 1 ? "out_a's shape without its last axis" : "one row for a rank-1 out");
        }
    }

    /* Output layout. */
    SDPA__TRY(sdpa__check_output_layout(v[OUT], FN, "out"));
    if (v[LSE] != NULL && (st = sdpa__check_output_layout(v[LSE], FN, "lse")) != SDPA_OK)
        return st;

    /* Overlap: each output against every input and the other output; the one exception is
     * an output that is exactly its own kind of input (in place). */
    for (int o = OUT; o < NVIEWS; ++o) {
        if (v[o] == NULL)
            continue;
        const sdpa__span so = sdpa__tensor_span(v[o]);
        for (int k = 0; k < NVIEWS; ++k) {
            if (k == o || v[k] == NULL || (k > o && k >= OUT))
                continue;
            if (!sdpa__spans_overlap(so, sdpa__tensor_span(v[k])))
                continue;
            const bool same_kind = (o == OUT && (k == OA || k == OB)) || (o == LSE && (k == LA || k == LB));
            if (same_kind && same_view(v[o], v[k]))
                continue;
            if (k >= OUT)
                return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s overlaps %s (both written)", FN, NAMES[o], NAMES[k]);
            if (same_kind)
                return sdpa__fail(SDPA_ERR_OVERLAP,
                                  "%s: %s (written) overlaps input %s without being exactly that view (in place needs the same data and strides)",
                                  FN, NAMES[o], NAMES[k]);
            return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s (written) overlaps input %s", FN, NAMES[o], NAMES[k]);
        }
    }

    int64_t n = 1;
    for (int32_t d = 0; d + 1 < rank; ++d)
        n *= v[OA]->shape[d]; /* no overflow: these are lse_a's sizes, whose product was checked */
    *rows = n;
    *ev = v[OA]->shape[rank - 1];
    return SDPA_OK;
}

/* Values: no lse is NaN or +inf; a side with a finite lse has a finite out row. */
static sdpa_status check_values(const sdpa_tensor *const v[NVIEWS], int32_t rank, int64_t rows, int64_t ev) {
    row_iter it;
    row_iter_init(&it, v, rank);
    const int64_t last = rank - 1;
    for (int64_t r = 0; r < rows; ++r, row_iter_next(&it)) {
        for (int side = 0; side < 2; ++side) {
            const int ko = side ? OB : OA, kl = side ? LB : LA;
            const float l = side_lse(*fptr(v[kl], it.off[kl]));
            char where[160];
            if (isnan(l)) {
                row_name(&it, where, sizeof where);
                return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: %s at row %s is NaN (an lse is finite, or -inf / +inf for a row with no key)",
                                  FN, NAMES[kl], where);
            }
            if (l == -INFINITY || ev == 0)
                continue; /* that side's out row is never read (or has no element) */
            const float *o = fptr(v[ko], it.off[ko]);
            for (int64_t d = 0; d < ev; ++d) {
                const float x = o[d * v[ko]->strides[last]];
                if (!isfinite(x)) {
                    row_name(&it, where, sizeof where);
                    return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: %s at row %s, element %lld is %s while %s there is finite (%g)",
                                      FN, NAMES[ko], where, (long long)d, describe_value(x), NAMES[kl], (double)l);
                }
            }
        }
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_merge(const sdpa_tensor *out_a, const sdpa_tensor *lse_a, const sdpa_tensor *out_b,
                                const sdpa_tensor *lse_b, const sdpa_tensor *out, const sdpa_tensor *lse) {
    const sdpa_tensor *const v[NVIEWS] = {out_a, lse_a, out_b, lse_b, out, lse};
    int64_t rows = 0, ev = 0;
    sdpa__clear_error();
    sdpa_status st = validate(v, &rows, &ev);
    if (st != SDPA_OK)
        return st;
    const int32_t rank = out_a->rank;
    SDPA__TRY(check_values(v, rank, rows, ev));

    const int64_t last = rank - 1;
    const int64_t sa = out_a->strides[last], sb = out_b->strides[last], so = out->strides[last];
    row_iter it;
    row_iter_init(&it, v, rank);
    for (int64_t r = 0; r < rows; ++r, row_iter_next(&it)) {
        const float la = side_lse(*fptr(lse_a, it.off[LA])), lb = side_lse(*fptr(lse_b, it.off[LB]));
        /* With Ev = 0 the out views may have NULL data: form no address from them. */
        const float *a = ev > 0 ? fptr(out_a, it.off[OA]) : NULL, *b = ev > 0 ? fptr(out_b, it.off[OB]) : NULL;
        float *o = ev > 0 ? (float *)out->data + it.off[OUT] : NULL;
        float l;
        if (la == -INFINITY && lb == -INFINITY) {
            for (int64_t d = 0; d < ev; ++d)
                o[d * so] = 0.0f;
            l = -INFINITY;
        } else if (lb == -INFINITY) {
            for (int64_t d = 0; d < ev; ++d)
                o[d * so] = a[d * sa];
            l = la;
        } else if (la == -INFINITY) {
            for (int64_t d = 0; d < ev; ++d)
                o[d * so] = b[d * sb];
            l = lb;
        } else {
            const double m = la > lb ? (double)la : (double)lb;
            const double wa = exp((double)la - m), wb = exp((double)lb - m);
            const double sum = wa + wb; /* in [1, 2] */
            for (int64_t d = 0; d < ev; ++d)
                o[d * so] = (float)((wa * (double)a[d * sa] + wb * (double)b[d * sb]) / sum);
            l = (float)(m + log(sum));
        }
        if (lse != NULL)
            *((float *)lse->data + it.off[LSE]) = l;
    }
    return SDPA_OK;
}
