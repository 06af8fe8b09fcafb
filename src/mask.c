/* Allow-mask builders and polarity converters. Every builder validates all of its inputs
 * before it writes the first byte. */
#include "internal.h"

#include <math.h>
#include <string.h>

/* Check an [rows, cols] output: sizes >= 0, product fits, pointer non-NULL if non-empty. */
static sdpa_status check_matrix(const char *fn, const void *out, int64_t rows, int64_t cols,
                                const char *rname, const char *cname) {
    int64_t n;
    if (rows < 0 || cols < 0)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s=%lld and %s=%lld must be >= 0", fn, rname, (long long)rows, cname,
                          (long long)cols);
    if (sdpa__mul_overflow(rows, cols, &n) || (uint64_t)n > (uint64_t)(PTRDIFF_MAX / 4))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: %s*%s=%lld*%lld overflows", fn, rname, cname, (long long)rows,
                          (long long)cols);
    if (n > 0 && out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    return SDPA_OK;
}

static sdpa_status check_alignment(const char *fn, sdpa_alignment a) {
    if (a != SDPA_ALIGN_TOP_LEFT && a != SDPA_ALIGN_BOTTOM_RIGHT)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: alignment=%d must be SDPA_ALIGN_TOP_LEFT or SDPA_ALIGN_BOTTOM_RIGHT", fn, (int)a);
    return SDPA_OK;
}

/* Fill rows [r0, r0 + rules->L) x keys [c0, c0 + rules->S) of a row-major matrix with `ld`
 * columns from the structural rule of rules.c (batch 0): the mask a builder writes is the one
 * the equivalent options give, bit for bit. */
static void fill_rule(uint8_t *out, int64_t ld, int64_t r0, int64_t c0, const sdpa__rules *r) {
    if (r->S <= 0)
        return; /* nothing to write, however many rows (L may be INT64_MAX when S = 0) */
    for (int64_t i = 0; i < r->L; ++i) {
        uint8_t *row = out + (r0 + i) * ld + c0;
        int64_t lo, hi;
        sdpa__rule_range(r, 0, i, &lo, &hi);
        for (int64_t j = 0; j < r->S; ++j)
            row[j] = j >= lo && j < hi ? 1 : 0;
    }
}

/* The rule of an L x S matrix: no masks, lengths or offsets; window -1 = unbounded. */
static sdpa__rules band_rules(int64_t L, int64_t S, int causal, sdpa_alignment alignment, int64_t left, int64_t right) {
    sdpa__rules r;
    memset(&r, 0, sizeof r);
    r.L = L;
    r.S = S;
    r.causal = causal;
    r.alignment = alignment;
    r.window_left = left;
    r.window_right = right;
    return r;
}

SDPA_API sdpa_status sdpa_mask_causal(uint8_t *out, int64_t L, int64_t S, sdpa_alignment alignment) {
    static const char fn[] = "sdpa_mask_causal";
    sdpa__clear_error();
    SDPA__TRY(check_matrix(fn, out, L, S, "L", "S"));
    SDPA__TRY(check_alignment(fn, alignment));
    const sdpa__rules r = band_rules(L, S, 1, alignment, -1, -1);
    fill_rule(out, S, 0, 0, &r);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_sliding_window(uint8_t *out, int64_t L, int64_t S, int64_t left, int64_t right,
                                              sdpa_alignment alignment) {
    static const char fn[] = "sdpa_mask_sliding_window";
    sdpa__clear_error();
    SDPA__TRY(check_matrix(fn, out, L, S, "L", "S"));
    SDPA__TRY(check_alignment(fn, alignment));
    if (left < -1 || right < -1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: left=%lld, right=%lld must be >= -1 (-1 = unbounded)", fn,
                          (long long)left, (long long)right);
    /* Windows wider than the matrix are unbounded; this keeps pos +- window in range. */
    if (left > L + S) left = -1;
    if (right > L + S) right = -1;
    const sdpa__rules r = band_rules(L, S, 0, alignment, left, right);
    fill_rule(out, S, 0, 0, &r);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_padding(uint8_t *out, int64_t B, int64_t N, const int64_t *lengths,
                                       sdpa_padding_side side) {
    static const char fn[] = "sdpa_mask_padding";
    sdpa__clear_error();
    SDPA__TRY(check_matrix(fn, out, B, N, "B", "N"));
    if (B > 0 && lengths == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: lengths is NULL", fn);
    if (side != SDPA_PAD_RIGHT && side != SDPA_PAD_LEFT)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: side=%d must be SDPA_PAD_RIGHT or SDPA_PAD_LEFT", fn, (int)side);
    for (int64_t b = 0; b < B; ++b)
        if (lengths[b] < 0 || lengths[b] > N)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: lengths[%lld]=%lld is outside [0, N=%lld]", fn,
                              (long long)b, (long long)lengths[b], (long long)N);
    for (int64_t b = 0; b < B; ++b) {
        const int64_t first = side == SDPA_PAD_RIGHT ? 0 : N - lengths[b];
        for (int64_t t = 0; t < N; ++t)
            out[b * N + t] = (t >= first && t < first + lengths[b]) ? 1 : 0;
    }
    return SDPA_OK;
}

static sdpa_status check_cu(const char *fn, const char *name, const int64_t *cu, int64_t num_seqs) {
    if (cu[0] != 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s[0]=%lld must be 0", fn, name, (long long)cu[0]);
    for (int64_t n = 0; n < num_seqs; ++n)
        if (cu[n + 1] < cu[n])
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s[%lld]=%lld is smaller than %s[%lld]=%lld", fn, name,
                              (long long)(n + 1), (long long)cu[n + 1], name, (long long)n, (long long)cu[n]);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_block_diagonal(uint8_t *out, int64_t num_seqs, const int64_t *cu_seqlens_q,
                                              const int64_t *cu_seqlens_k, int32_t causal, sdpa_alignment alignment) {
    static const char fn[] = "sdpa_mask_block_diagonal";
    sdpa__clear_error();
    if (num_seqs < 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: num_seqs=%lld must be >= 0", fn, (long long)num_seqs);
    if (cu_seqlens_q == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: cu_seqlens_q is NULL", fn);
    if (causal != 0 && causal != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: causal=%d must be 0 or 1", fn, (int)causal);
    const int64_t *cuk = cu_seqlens_k ? cu_seqlens_k : cu_seqlens_q;
    SDPA__TRY(check_cu(fn, "cu_seqlens_q", cu_seqlens_q, num_seqs));
    SDPA__TRY(check_cu(fn, "cu_seqlens_k", cuk, num_seqs));
    SDPA__TRY(check_alignment(fn, alignment));
    const int64_t Lt = cu_seqlens_q[num_seqs], St = cuk[num_seqs];
    SDPA__TRY(check_matrix(fn, out, Lt, St, "Lt", "St"));
    if (Lt > 0 && St > 0)
        memset(out, 0, (size_t)(Lt * St));
    for (int64_t n = 0; n < num_seqs; ++n) {
        const int64_t lq = cu_seqlens_q[n + 1] - cu_seqlens_q[n], lk = cuk[n + 1] - cuk[n];
        const sdpa__rules r = band_rules(lq, lk, causal, alignment, -1, -1);
        fill_rule(out, St, cu_seqlens_q[n], cuk[n], &r);
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_prefix_lm(uint8_t *out, int64_t T, int64_t prefix_length) {
    static const char fn[] = "sdpa_mask_prefix_lm";
    sdpa__clear_error();
    SDPA__TRY(check_matrix(fn, out, T, T, "T", "T"));
    if (prefix_length < 0 || prefix_length > T)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: prefix_length=%lld is outside [0, T=%lld]", fn,
                          (long long)prefix_length, (long long)T);
    /* causal (top-left) plus every key of the prefix */
    const sdpa__rules r = band_rules(T, T, 1, SDPA_ALIGN_TOP_LEFT, -1, -1);
    fill_rule(out, T, 0, 0, &r);
    for (int64_t i = 0; i < T; ++i)
        memset(out + i * T, 1, (size_t)prefix_length);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_and(const sdpa_allow_mask *a, const sdpa_allow_mask *b, uint8_t *out,
                                   int32_t out_rank, const int64_t *out_shape) {
    static const char fn[] = "sdpa_mask_and";
    const sdpa_allow_mask *in[2] = {a, b};
    static const char *const names[2] = {"a", "b"};
    int64_t st4[2][4], shape4[4] = {1, 1, 1, 1};
    sdpa__clear_error();
    if (a == NULL || b == NULL || out_shape == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s is NULL", fn, a == NULL ? "a" : b == NULL ? "b" : "out_shape");
    if (out_rank < 1 || out_rank > SDPA_MASK_MAX_RANK)
        return sdpa__fail(SDPA_ERR_RANK, "%s: out_rank=%d, expected 1..4", fn, (int)out_rank);
    int64_t numel = 1;
    for (int32_t d = 0; d < out_rank; ++d) {
        if (out_shape[d] < 0)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: out_shape[%d]=%lld is negative", fn, (int)d, (long long)out_shape[d]);
        if (sdpa__mul_overflow(numel, out_shape[d], &numel))
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: out_shape has more elements than int64_t holds", fn);
        shape4[4 - out_rank + d] = out_shape[d];
    }
    if (numel > 0 && out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    sdpa__span out_span = {(uintptr_t)out, (uintptr_t)out + (uintptr_t)numel};
    for (int x = 0; x < 2; ++x) {
        const sdpa_allow_mask *m = in[x];
        SDPA__TRY(sdpa__check_mask(fn, names[x], m));
        if (m->rank > out_rank)
            return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d is larger than out_rank=%d", fn, names[x], (int)m->rank,
                              (int)out_rank);
        for (int32_t r = 0; r < m->rank; ++r) {
            const int64_t want = shape4[4 - m->rank + r];
            if (m->shape[r] != want && m->shape[r] != 1)
                return sdpa__fail(SDPA_ERR_BROADCAST, "%s: %s.shape[%d]=%lld cannot broadcast to out_shape[%d]=%lld", fn,
                                  names[x], (int)r, (long long)m->shape[r], (int)(out_rank - m->rank + r),
                                  (long long)want);
        }
        sdpa__broadcast4(fn, names[x], m->rank, m->shape, m->strides, shape4, st4[x]);
        if (numel > 0 && sdpa__spans_overlap(out_span, sdpa__mask_span(m)))
            return sdpa__fail(SDPA_ERR_OVERLAP, "%s: out overlaps %s", fn, names[x]);
    }
    int64_t idx = 0;
    for (int64_t i0 = 0; i0 < shape4[0]; ++i0)
        for (int64_t i1 = 0; i1 < shape4[1]; ++i1)
            for (int64_t i2 = 0; i2 < shape4[2]; ++i2)
                for (int64_t i3 = 0; i3 < shape4[3]; ++i3) {
                    const uint8_t x = a->data[i0 * st4[0][0] + i1 * st4[0][1] + i2 * st4[0][2] + i3 * st4[0][3]];
                    const uint8_t y = b->data[i0 * st4[1][0] + i1 * st4[1][1] + i2 * st4[1][2] + i3 * st4[1][3]];
                    out[idx++] = (x != 0 && y != 0) ? 1 : 0;
                }
    return SDPA_OK;
}

/* n elements of in_elem bytes in, out_elem bytes out; exact in-place only if allowed. */
static sdpa_status check_flat(const char *fn, const void *in, size_t in_elem, int64_t n, const void *out,
                              size_t out_elem, bool in_place_ok) {
    if (n < 0)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: n=%lld must be >= 0", fn, (long long)n);
    if (n == 0)
        return SDPA_OK;
    if (in == NULL || out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s is NULL", fn, in == NULL ? "input" : "out");
    if ((uint64_t)n > (uint64_t)(PTRDIFF_MAX / 8))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: n=%lld is too large", fn, (long long)n);
    sdpa__span a = {(uintptr_t)in, (uintptr_t)in + (uintptr_t)n * in_elem};
    sdpa__span b = {(uintptr_t)out, (uintptr_t)out + (uintptr_t)n * out_elem};
    if (sdpa__spans_overlap(a, b) && !(in_place_ok && in == out))
        return sdpa__fail(SDPA_ERR_OVERLAP, "%s: out overlaps the input%s", fn,
                          in_place_ok ? " (only exact in-place, out == input, is allowed)" : "");
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_from_ignore(const uint8_t *ignore, int64_t n, uint8_t *out) {
    sdpa__clear_error();
    SDPA__TRY(check_flat("sdpa_mask_from_ignore", ignore, 1, n, out, 1, true));
    for (int64_t t = 0; t < n; ++t)
        out[t] = ignore[t] == 0 ? 1 : 0;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_from_keep_int(const int32_t *keep, int64_t n, uint8_t *out) {
    static const char fn[] = "sdpa_mask_from_keep_int";
    sdpa__clear_error();
    SDPA__TRY(check_flat(fn, keep, sizeof *keep, n, out, 1, false));
    for (int64_t t = 0; t < n; ++t)
        if (keep[t] != 0 && keep[t] != 1)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: keep[%lld]=%d is neither 0 nor 1 (lengths instead of a mask? see sdpa_mask_padding())",
                              fn, (long long)t, (int)keep[t]);
    for (int64_t t = 0; t < n; ++t)
        out[t] = (uint8_t)keep[t];
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_from_additive(const float *additive, int64_t n, const float *threshold,
                                             uint8_t *out) {
    static const char fn[] = "sdpa_mask_from_additive";
    sdpa__clear_error();
    SDPA__TRY(check_flat(fn, additive, sizeof *additive, n, out, 1, false));
    if (threshold != NULL && isnan(*threshold))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: *threshold is NaN", fn);
    for (int64_t t = 0; t < n; ++t) {
        const float x = additive[t];
        if (isnan(x))
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: additive[%lld] is NaN", fn, (long long)t);
        if (threshold == NULL && x != 0.0f && x != -INFINITY)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: additive[%lld]=%g is neither 0 nor -inf; pass a threshold, or use it as options.bias", fn,
                              (long long)t, (double)x);
    }
    for (int64_t t = 0; t < n; ++t) {
        const float x = additive[t];
        out[t] = threshold ? (x > *threshold ? 1 : 0) : (x == 0.0f ? 1 : 0);
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_to_additive(const uint8_t *allow, int64_t n, float *out) {
    sdpa__clear_error();
    SDPA__TRY(check_flat("sdpa_mask_to_additive", allow, 1, n, out, sizeof *out, false));
    for (int64_t t = 0; t < n; ++t)
        out[t] = allow[t] ? 0.0f : -INFINITY;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_mask_count_empty_rows(const sdpa_allow_mask *mask, int64_t *empty_rows,
                                                int64_t *first_empty) {
    static const char fn[] = "sdpa_mask_count_empty_rows";
    sdpa__clear_error();
    if (mask == NULL || empty_rows == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s is NULL", fn, mask == NULL ? "mask" : "empty_rows");
    SDPA__TRY(sdpa__check_mask(fn, "mask", mask));
    int64_t shape4[4] = {1, 1, 1, 1}, str4[4] = {0, 0, 0, 0};
    for (int32_t r = 0; r < mask->rank; ++r) {
        shape4[4 - mask->rank + r] = mask->shape[r];
        str4[4 - mask->rank + r] = mask->strides[r];
    }
    int64_t numel = shape4[0] * shape4[1] * shape4[2] * shape4[3];
    if (numel > 0 && mask->data == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: mask.data is NULL", fn);
    int64_t count = 0, first = -1, row = 0;
    if (shape4[3] == 0) { /* no key: every row is empty and nothing is read (rows may be ~2^62) */
        int64_t rows;
        if (sdpa__mul_overflow(shape4[0], shape4[1], &rows) || sdpa__mul_overflow(rows, shape4[2], &rows))
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: mask has more rows than int64_t holds", fn);
        *empty_rows = rows;
        if (first_empty)
            *first_empty = rows > 0 ? 0 : -1;
        return SDPA_OK;
    }
    for (int64_t i0 = 0; i0 < shape4[0]; ++i0)
        for (int64_t i1 = 0; i1 < shape4[1]; ++i1)
            for (int64_t i2 = 0; i2 < shape4[2]; ++i2, ++row) {
                bool any = false;
                if (shape4[3] > 0) {
                    const uint8_t *base = mask->data + i0 * str4[0] + i1 * str4[1] + i2 * str4[2];
                    for (int64_t j = 0; j < shape4[3] && !any; ++j)
                        any = base[j * str4[3]] != 0;
                }
                if (!any) {
                    if (first < 0)
                        first = row;
                    ++count;
                }
            }
    *empty_rows = count;
    if (first_empty)
        *first_empty = first;
    return SDPA_OK;
}

/* ALiBi slopes (Press et al. 2022): the geometric sequence 2^(-max_bias * k / n) for the
 * largest power of two n <= H, then the odd-numbered terms of the 2n-head sequence. */
SDPA_API sdpa_status sdpa_alibi_slopes(int64_t H, float max_bias, float *out) {
    static const char fn[] = "sdpa_alibi_slopes";
    if (out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    if (H < 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: H=%lld must be >= 1", fn, (long long)H);
    if (!(max_bias > 0.0f) || isinf(max_bias))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: max_bias=%g must be finite and > 0", fn, (double)max_bias);
    if ((uint64_t)H > (uint64_t)PTRDIFF_MAX / sizeof(float))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: H=%lld floats are more bytes than an object can hold", fn,
                          (long long)H);
    int64_t n = 1;
    while (n <= H / 2) /* (n * 2 <= H would overflow for H >= 2^62) */
        n *= 2;
    for (int64_t i = 0; i < H; ++i) {
        const double e = i < n ? (double)(i + 1) / (double)n
                               : ((double)(i - n) * 2.0 + 1.0) / ((double)n * 2.0);
        out[i] = (float)exp2(-(double)max_bias * e);
    }
    sdpa__clear_error();
    return SDPA_OK;
}
