/* THE allowed-key rule: aligned position, structural key range, mask / bias -inf test, tile
 * classifier (see rules.h). The only place the rule is written. */
#include "rules.h"

#include <math.h>
#include <string.h>

int64_t sdpa__rule_position(const sdpa__rules *r, int64_t b, int64_t i) {
    if (r->alignment == SDPA_ALIGN_BOTTOM_RIGHT) {
        const int64_t Sb = r->key_lengths ? r->key_lengths[b] : r->S;
        return i + Sb - (r->query_lengths ? r->query_lengths[b] : r->L);
    }
    if (r->alignment == SDPA_ALIGN_OFFSETS)
        return i + r->query_offsets[b];
    return i;
}

void sdpa__rule_band(int64_t pos, int64_t left, int64_t right, int64_t n, int64_t *lo_out, int64_t *hi_out) {
    int64_t lo = 0, hi = n;
    if (right >= 0 && pos + right + 1 < hi)
        hi = pos + right + 1;
    if (left >= 0 && pos - left > lo)
        lo = pos - left;
    if (hi < lo)
        hi = lo;
    *lo_out = lo;
    *hi_out = hi;
}

void sdpa__rule_range(const sdpa__rules *r, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t Sb = r->key_lengths ? r->key_lengths[b] : r->S;
    if (!r->causal && r->window_left < 0 && r->window_right < 0) {
        *lo = 0;
        *hi = Sb;
        return;
    }
    /* causal is the band's right edge at 0 (a window's right edge, >= 0, is never tighter). */
    const int64_t right = r->causal ? 0 : r->window_right;
    sdpa__rule_band(sdpa__rule_position(r, b, i), r->window_left, right, Sb, lo, hi);
}

double sdpa__rule_alibi_term(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j) {
    const float slope = sdpa__rule_alibi_slope(r, b, h);
    if (slope == 0.0f)
        return 0.0;
    const int64_t d = sdpa__rule_position(r, b, i) - j;
    return (double)slope * (double)(d < 0 ? -d : d);
}

void sdpa__rule_alibi_add(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n, float *s,
                          ptrdiff_t stride) {
    const float slope = sdpa__rule_alibi_slope(r, b, h);
    if (slope == 0.0f)
        return;
    const int64_t pos = sdpa__rule_position(r, b, i);
    for (int64_t t = 0; t < n; ++t) {
        const int64_t d = pos - (j0 + t);
        s[t * stride] -= slope * (float)(d < 0 ? -d : d);
    }
}

bool sdpa__rule_alibi_lanes_form(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, const uint8_t *on,
                                 uint8_t on_value, int64_t l0, int64_t l1, int64_t j0, int64_t n, float *sl, float *lf,
                                 float *base) {
    const float slope = sdpa__rule_alibi_slope(r, b, h);
    if (l1 - l0 > SDPA__ALIBI_LANES || l1 <= l0 || n <= 0 || slope == 0.0f)
        return false;
    const int64_t p0 = sdpa__rule_position(r, b, i0); /* row i0 + l sits at p0 + l (p is i + a constant) */
    const int64_t dmax = p0 + l1 - 1 - j0, dmin = p0 + l0 - (j0 + n - 1); /* the extremes of p - j */
    const int64_t big = (int64_t)1 << 24;
    if (!(dmax < big && dmax > -big && dmin < big && dmin > -big))
        return false;
    /* every |p - j| is an integer below 2^24, exact in float: base - t + lf[l] is p - j exactly */
    for (int64_t l = l0; l < l1; ++l) {
        sl[l - l0] = on[l] == on_value ? slope : 0.0f;
        lf[l - l0] = (float)(l - l0);
    }
    *base = (float)(p0 + l0 - j0);
    return true;
}

void sdpa__rule_alibi_add_lanes(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, const uint8_t *on,
                                uint8_t on_value, int64_t l0, int64_t l1, int64_t j0, int64_t n, float *s, ptrdiff_t ld) {
    if (sdpa__rule_alibi_slope(r, b, h) == 0.0f || l1 <= l0 || n <= 0)
        return;
    float sl[SDPA__ALIBI_LANES], lf[SDPA__ALIBI_LANES], base;
    if (sdpa__rule_alibi_lanes_form(r, b, h, i0, on, on_value, l0, l1, j0, n, sl, lf, &base)) {
        /* the lane form in a loop over contiguous lanes the compiler vectorises; a lane that is
         * not on has slope 0 (s - 0 * d = s). microkernel.h lanes_sub_abs computes the same. */
        const int64_t w = l1 - l0;
        for (int64_t t = 0; t < n; ++t) {
            const float bt = base - (float)t;
            float *row = s + t * ld + l0;
            for (int64_t l = 0; l < w; ++l)
                row[l] -= sl[l] * fabsf(bt + lf[l]);
        }
        return;
    }
    for (int64_t l = l0; l < l1; ++l)
        if (on[l] == on_value)
            sdpa__rule_alibi_add(r, b, h, i0 + l, j0, n, s + l, ld);
}

bool sdpa__rule_allows(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t j, int64_t lo, int64_t hi) {
    if (j < lo || j >= hi || (r->has_mask && !sdpa__rule_mask_allows(r, b, h, i, j)))
        return false;
    return !r->has_bias || !sdpa__rule_bias_blocks(sdpa__rule_bias_at(r, sdpa__rule_bias_row(r, b, h, i), j));
}

bool sdpa__rule_row_flags(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi, int64_t j0,
                          int64_t n, uint8_t *allowed) {
    const uint8_t *mrow = r->has_mask ? sdpa__rule_mask_row(r, b, h, i) : NULL;
    const void *brow = r->has_bias ? sdpa__rule_bias_row(r, b, h, i) : NULL;
    const int64_t ms3 = r->mask.strides[3];
    bool any = false;
    for (int64_t t = 0; t < n; ++t) {
        const int64_t j = j0 + t;
        const bool ok = j >= lo && j < hi && (mrow == NULL || mrow[j * ms3] != 0) &&
                        (brow == NULL || !sdpa__rule_bias_blocks(sdpa__rule_bias_at(r, brow, j)));
        allowed[t] = ok;
        any = any || ok;
    }
    return any;
}

sdpa__tile_class sdpa__rule_classify_tile(const sdpa__rules *r, int64_t b, int64_t h, int64_t i0, int64_t nrows,
                                          const int32_t *lo, const int32_t *hi, int64_t j0, int64_t j1) {
    int64_t maxlo = j0, minhi = j1;
    bool any = false, meets = false;
    for (int64_t t = 0; t < nrows; ++t) {
        if (lo[t] >= hi[t])
            continue;
        any = true;
        maxlo = lo[t] > maxlo ? lo[t] : maxlo;
        minhi = hi[t] < minhi ? hi[t] : minhi;
        meets = meets || (lo[t] < j1 && hi[t] > j0);
    }
    if (!any || !meets)
        return SDPA__TILE_NONE;
    const bool sfull = maxlo <= j0 && minhi >= j1;
    if (r->has_mask) { /* the mask over the structurally allowed part */
        const int64_t ms3 = r->mask.strides[3];
        bool any1 = false, any0 = false;
        for (int64_t t = 0; t < nrows && !(any1 && any0); ++t) {
            if (lo[t] >= hi[t])
                continue;
            const uint8_t *mrow = sdpa__rule_mask_row(r, b, h, i0 + t);
            const int64_t s = lo[t] > j0 ? lo[t] : j0, e = hi[t] < j1 ? hi[t] : j1;
            for (int64_t j = s; j < e; ++j) {
                if (mrow[j * ms3])
                    any1 = true;
                else
                    any0 = true;
            }
        }
        if (!any1)
            return SDPA__TILE_NONE;
        if (any0)
            return SDPA__TILE_PARTIAL;
    }
    if (r->has_bias)
        return SDPA__TILE_PARTIAL;
    return sfull ? SDPA__TILE_FULL : SDPA__TILE_PARTIAL_RANGE;
}

void sdpa__rule_group_keys(const sdpa__rules *r, int64_t b, int64_t h0, int64_t h1, int32_t *cnt, uint8_t *used) {
    const int64_t S = r->S;
    if (!r->has_mask && !r->has_bias) { /* ranges only: they do not depend on h */
        memset(cnt, 0, (size_t)(S + 1) * sizeof *cnt);
        for (int64_t i = 0; i < r->L && h0 < h1; ++i) {
            int64_t lo, hi;
            if (sdpa__rule_is_padding(r, b, i))
                continue;
            sdpa__rule_range(r, b, i, &lo, &hi);
            if (lo < hi) {
                cnt[lo]++;
                cnt[hi]--;
            }
        }
        int32_t run = 0;
        for (int64_t j = 0; j < S; ++j) {
            run += cnt[j];
            used[j] = run > 0;
        }
        return;
    }
    memset(used, 0, (size_t)S);
    for (int64_t h = h0; h < h1; ++h)
        for (int64_t i = 0; i < r->L; ++i) {
            int64_t lo, hi;
            if (sdpa__rule_is_padding(r, b, i))
                continue;
            sdpa__rule_range(r, b, i, &lo, &hi);
            for (int64_t j = lo; j < hi; ++j)
                used[j] = used[j] || sdpa__rule_allows(r, b, h, i, j, lo, hi);
        }
}

sdpa__rules sdpa__rule_for_sequence(const sdpa__rules *r, int64_t seq, int64_t L_r, int64_t S_r) {
    sdpa__rules q = *r;
    q.L = L_r;
    q.S = S_r;
    q.alignment = r->alignment == SDPA_ALIGN_OFFSETS ? SDPA_ALIGN_OFFSETS : SDPA_ALIGN_BOTTOM_RIGHT;
    q.key_lengths = r->key_lengths ? r->key_lengths + seq : NULL;
    q.query_offsets = r->alignment == SDPA_ALIGN_OFFSETS ? r->query_offsets + seq : NULL;
    q.query_lengths = NULL;
    if (q.alibi_slopes != NULL) /* [num_seqs, Hq] slopes: row seq (stride 0 for [Hq]) */
        q.alibi_slopes += seq * q.alibi_stride_b;
    q.has_mask = false;
    q.has_bias = false;
    return q;
}
