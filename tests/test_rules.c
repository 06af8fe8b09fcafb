/*
 * The allowed-key rule of src/rules.c (white box; links the library's objects): the structural
 * range against DESIGN section 4 step 4 written out per key, the tile classifier and the group
 * key set against a brute-force walk over every pair with sdpa__rule_allows, on random rules
 * (causal, every alignment, offsets, windows, key and query lengths, allow-masks, -inf biases).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rules.h"

#define MAXL 40
#define MAXS 48

static uint64_t g_state;
static int64_t rnd(int64_t lo, int64_t hi) { /* uniform in [lo, hi] */
    g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (int64_t)((g_state >> 33) % (uint64_t)(hi - lo + 1));
}

typedef struct rcase {
    sdpa__rules r;
    int64_t offsets[2], kl[2], ql[2];
    uint8_t mask[2 * 2 * MAXL * MAXS];
    float bias[2 * 2 * MAXL * MAXS];
} rcase;

static void make_case(rcase *c) {
    memset(c, 0, sizeof *c);
    sdpa__rules *r = &c->r;
    r->L = rnd(1, MAXL);
    r->S = rnd(1, MAXS);
    r->causal = (int)rnd(0, 1);
    r->alignment = (int)rnd(0, 2);
    for (int b = 0; b < 2; ++b) {
        c->offsets[b] = rnd(-r->S, r->S);
        c->kl[b] = rnd(0, r->S);
        c->ql[b] = rnd(0, r->L);
    }
    r->query_offsets = c->offsets;
    r->key_lengths = rnd(0, 1) ? c->kl : NULL;
    r->query_lengths = rnd(0, 1) ? c->ql : NULL;
    r->window_left = rnd(0, 2) ? -1 : rnd(0, r->S);
    r->window_right = rnd(0, 2) ? -1 : rnd(0, r->S);
    const int64_t st[4] = {2 * MAXL * MAXS, MAXL * MAXS, MAXS, 1};
    if (rnd(0, 1)) {
        r->has_mask = true;
        r->mask.data = c->mask;
        memcpy(r->mask.strides, st, sizeof st);
        const int dense = (int)rnd(0, 1);
        for (size_t t = 0; t < sizeof c->mask; ++t)
            c->mask[t] = (uint8_t)(rnd(0, 9) < (dense ? 9 : 5) ? rnd(1, 255) : 0);
    }
    if (rnd(0, 2) == 0) {
        r->has_bias = true;
        r->bias.data = c->bias;
        memcpy(r->bias.strides, st, sizeof st);
        for (size_t t = 0; t < sizeof c->bias / sizeof c->bias[0]; ++t)
            c->bias[t] = rnd(0, 9) == 0 ? -INFINITY : (float)rnd(-3, 3);
    }
}

/* DESIGN section 4, step 4, one key at a time (no shortcuts). */
static int design_structural(const sdpa__rules *r, int64_t b, int64_t i, int64_t j) {
    const int64_t Sb = r->key_lengths ? r->key_lengths[b] : r->S, Lb = r->query_lengths ? r->query_lengths[b] : r->L;
    int64_t p = i;
    if (r->alignment == SDPA_ALIGN_BOTTOM_RIGHT)
        p = i + Sb - Lb;
    else if (r->alignment == SDPA_ALIGN_OFFSETS)
        p = i + r->query_offsets[b];
    if (j >= Sb)
        return 0;
    if (r->causal && j > p)
        return 0;
    if (r->window_left >= 0 && j < p - r->window_left)
        return 0;
    if (r->window_right >= 0 && j > p + r->window_right)
        return 0;
    return 1;
}

static void rules_structural_range_matches_design(void **state) {
    (void)state;
    g_state = 1;
    for (int n = 0; n < 3000; ++n) {
        rcase c;
        make_case(&c);
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t i = 0; i < c.r.L; ++i) {
                int64_t lo, hi;
                sdpa__rule_range(&c.r, b, i, &lo, &hi);
                for (int64_t j = 0; j < c.r.S; ++j) {
                    const int in = j >= lo && j < hi;
                    if (in != design_structural(&c.r, b, i, j))
                        fail_msg("case %d: b=%lld i=%lld j=%lld: range [%lld, %lld) disagrees with the rule", n,
                                 (long long)b, (long long)i, (long long)j, (long long)lo, (long long)hi);
                }
            }
    }
}

static void rules_tile_classes_match_brute_force(void **state) {
    (void)state;
    g_state = 2;
    int seen[4] = {0, 0, 0, 0};
    for (int n = 0; n < 3000; ++n) {
        rcase c;
        make_case(&c);
        const sdpa__rules *r = &c.r;
        const int64_t b = rnd(0, 1), h = rnd(0, 1), i0 = rnd(0, r->L - 1), nrows = rnd(1, r->L - i0);
        const int64_t j0 = rnd(0, r->S - 1), j1 = rnd(j0 + 1, r->S);
        int32_t lo[MAXL], hi[MAXL];
        int64_t lo64[MAXL], hi64[MAXL];
        for (int64_t t = 0; t < nrows; ++t) {
            sdpa__rule_range(r, b, i0 + t, &lo64[t], &hi64[t]);
            if (sdpa__rule_is_padding(r, b, i0 + t) || lo64[t] >= hi64[t])
                lo64[t] = hi64[t] = 0;
            lo[t] = (int32_t)lo64[t];
            hi[t] = (int32_t)hi64[t];
        }
        int any = 0, all = 1, all_in_range_allowed = 1, rows = 0;
        for (int64_t t = 0; t < nrows; ++t) {
            if (lo[t] >= hi[t])
                continue;
            ++rows;
            for (int64_t j = j0; j < j1; ++j) {
                const int ok = sdpa__rule_allows(r, b, h, i0 + t, j, lo64[t], hi64[t]);
                const int in = j >= lo64[t] && j < hi64[t];
                any |= ok;
                all &= ok;
                if (in && !ok)
                    all_in_range_allowed = 0;
            }
        }
        const sdpa__tile_class k = sdpa__rule_classify_tile(r, b, h, i0, nrows, lo, hi, j0, j1);
        seen[k]++;
        if (k == SDPA__TILE_NONE && any)
            fail_msg("case %d: NONE but some pair is allowed", n);
        if (k == SDPA__TILE_FULL && !(rows > 0 && all))
            fail_msg("case %d: FULL but some pair is blocked", n);
        if (k == SDPA__TILE_PARTIAL_RANGE && (r->has_bias || !all_in_range_allowed))
            fail_msg("case %d: PARTIAL_RANGE but the mask or bias blocks a pair inside the ranges", n);
        if (!r->has_bias && !any && k != SDPA__TILE_NONE)
            fail_msg("case %d: nothing allowed (no bias) but class %d", n, (int)k);
        if (!r->has_bias && rows > 0 && all && k != SDPA__TILE_FULL)
            fail_msg("case %d: everything allowed (no bias) but class %d", n, (int)k);
        uint8_t flags[MAXS];
        for (int64_t t = 0; t < nrows; ++t) {
            const int got_any = sdpa__rule_row_flags(r, b, h, i0 + t, lo64[t], hi64[t], j0, j1 - j0, flags);
            int want_any = 0;
            for (int64_t j = j0; j < j1; ++j) {
                const int ok = sdpa__rule_allows(r, b, h, i0 + t, j, lo64[t], hi64[t]);
                want_any |= ok;
                assert_int_equal(flags[j - j0], ok);
            }
            assert_int_equal(got_any, want_any);
        }
    }
    print_message("tile classes seen: none %d, full %d, partial-range %d, partial %d\n", seen[0], seen[1], seen[2],
                  seen[3]);
    for (int k = 0; k < 4; ++k)
        assert_true(seen[k] > 0);
}

static void rules_group_keys_match_brute_force(void **state) {
    (void)state;
    g_state = 3;
    for (int n = 0; n < 2000; ++n) {
        rcase c;
        make_case(&c);
        const sdpa__rules *r = &c.r;
        int32_t cnt[MAXS + 1];
        uint8_t used[MAXS];
        const int64_t b = rnd(0, 1), h0 = rnd(0, 1), h1 = rnd(h0 + 1, 2);
        sdpa__rule_group_keys(r, b, h0, h1, cnt, used);
        for (int64_t j = 0; j < r->S; ++j) {
            int want = 0;
            for (int64_t h = h0; h < h1; ++h)
                for (int64_t i = 0; i < r->L; ++i) {
                    int64_t lo, hi;
                    if (sdpa__rule_is_padding(r, b, i))
                        continue;
                    sdpa__rule_range(r, b, i, &lo, &hi);
                    want |= sdpa__rule_allows(r, b, h, i, j, lo, hi);
                }
            if (used[j] != want)
                fail_msg("case %d: key %lld: group_keys says %d, the pairs say %d", n, (long long)j, used[j], want);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rules_structural_range_matches_design),
        cmocka_unit_test(rules_tile_classes_match_brute_force),
        cmocka_unit_test(rules_group_keys_match_brute_force),
    };
    return cmocka_run_group_tests_name("rules", tests, NULL, NULL);
}
