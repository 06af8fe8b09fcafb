/* sdpa_attention_cost (0.6, DESIGN section 12): what an sdpa_attention call would do, without
 * doing it. Everything here is asked of the code the call runs: the validation is
 * sdpa__plan_make (plan.c), the kernel, ISA and threads come from sdpa__exec_plan_make and the
 * kernel's own name() (kernel.h), a packed batch is planned by varlen.c, and every pair is
 * classified by the allowed-key rule of rules.c (sdpa__rule_range, sdpa__rule_row_flags,
 * sdpa__rule_group_keys). This file only counts. */
#include "internal.h"
#include "kernel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char FN[] = "sdpa_attention_cost";

#define SDPA__COST_FLAGS (SDPA_COST_EXACT | SDPA_COST_WEIGHTS | SDPA_COST_LSE)
#define SDPA__STRUCT_SIZE_MAX 4096
#define FLAG_CHUNK 512 /* keys per sdpa__rule_row_flags call of the exact scan */

/* Saturating arithmetic on counts (all >= 0): INT64_MAX = "at least this many". */
static int64_t add_sat(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
static int64_t mul_sat(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

typedef struct tally {
    bool exact;
    int64_t logical, rows, allowed, empty, score_pairs, mask_pairs, bias_pairs, k_rows, v_rows;
    int64_t first_seq, first_h, first_i; /* the first empty row found (first_seq -1: none) */
} tally;

static void note_empty(tally *t, int64_t seq, int64_t h, int64_t i) {
    if (t->first_seq < 0) {
        t->first_seq = seq;
        t->first_h = h;
        t->first_i = i;
    }
}

static int64_t count_used(const uint8_t *used, int64_t n) {
    int64_t u = 0;
    for (int64_t j = 0; j < n; ++j)
        u += used[j] != 0;
    return u;
}

/* Row (b, h, i) with structural range [lo, hi), exact scan: its allowed keys (the rule's flags)
 * and, into *bias_pairs, the pairs whose bias element the rule reads (where the mask allows). */
static int64_t scan_row(const sdpa__rules *r, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi,
                        int64_t *bias_pairs) {
    uint8_t flags[FLAG_CHUNK];
    int64_t allowed = 0;
    for (int64_t j0 = lo; j0 < hi; j0 += FLAG_CHUNK) {
        const int64_t n = hi - j0 < FLAG_CHUNK ? hi - j0 : FLAG_CHUNK;
        if (sdpa__rule_row_flags(r, b, h, i, lo, hi, j0, n, flags))
            allowed += count_used(flags, n);
    }
    if (r->has_bias) {
        int64_t m = hi - lo;
        if (r->has_mask) {
            m = 0;
            for (int64_t j = lo; j < hi; ++j)
                m += sdpa__rule_mask_allows(r, b, h, i, j);
        }
        *bias_pairs = add_sat(*bias_pairs, m);
    }
    return allowed;
}

/* Count one plan (the whole call, or packed sequence `seq` as its B = 1 plan). cnt: S + 1
 * int32, used: S bytes of scratch (S of this plan or more). */
static void count_plan(const sdpa__plan *s, int64_t seq, bool scan, bool score_stage, int32_t *cnt, uint8_t *used,
                       tally *t) {
    const sdpa__rules *r = &s->rules;
    const bool valued = r->has_mask || r->has_bias;
    sdpa__rules structural = *r; /* causal, window and lengths only: the part that needs no value */
    structural.has_mask = false;
    structural.has_bias = false;
    if (valued && !scan)
        t->exact = false;
    const int64_t Hq = s->Hq, Hkv = s->Hkv, L = s->L, S = s->S;
    for (int64_t b = 0; b < s->B; ++b) {
        const int64_t sq = seq >= 0 ? seq : b;
        t->logical = add_sat(t->logical, mul_sat(mul_sat(Hq, L), S));
        if (Hq == 0)
            continue;
        int64_t rows = 0, spairs = 0, sempty = 0, first_i = -1;
        for (int64_t i = 0; i < L; ++i) {
            if (sdpa__rule_is_padding(r, b, i))
                continue;
            int64_t lo, hi;
            sdpa__rule_range(r, b, i, &lo, &hi);
            ++rows;
            if (hi > lo) {
                spairs += hi - lo;
            } else {
                ++sempty;
                if (first_i < 0)
                    first_i = i;
            }
        }
        t->rows = add_sat(t->rows, mul_sat(Hq, rows));
        if (r->has_mask)
            t->mask_pairs = add_sat(t->mask_pairs, mul_sat(Hq, spairs));
        if (score_stage && rows > 0) { /* SCORES / SOFTCAPPED weights: every key below the key count */
            const int64_t Sb = r->key_lengths != NULL ? r->key_lengths[b] : S;
            t->score_pairs = add_sat(t->score_pairs, mul_sat(mul_sat(Hq, rows), Sb));
            t->k_rows = add_sat(t->k_rows, mul_sat(Hkv, Sb));
        }
        if (!valued || !scan) {
            t->allowed = add_sat(t->allowed, mul_sat(Hq, spairs));
            t->empty = add_sat(t->empty, mul_sat(Hq, sempty));
            if (sempty > 0)
                note_empty(t, sq, 0, first_i);
            if (r->has_bias)
                t->bias_pairs = add_sat(t->bias_pairs, mul_sat(Hq, spairs));
            if (S > 0 && rows > 0) { /* the structural key set does not depend on the head */
                sdpa__rule_group_keys(&structural, b, 0, 1, cnt, used);
                const int64_t u = count_used(used, S);
                if (!score_stage)
                    t->k_rows = add_sat(t->k_rows, mul_sat(Hkv, u));
                t->v_rows = add_sat(t->v_rows, mul_sat(Hkv, u));
            }
            continue;
        }
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < L; ++i) {
                if (sdpa__rule_is_padding(r, b, i))
                    continue;
                int64_t lo, hi;
                sdpa__rule_range(r, b, i, &lo, &hi);
                const int64_t a = hi > lo ? scan_row(r, b, h, i, lo, hi, &t->bias_pairs) : 0;
                t->allowed = add_sat(t->allowed, a);
                if (a == 0) {
                    t->empty = add_sat(t->empty, 1);
                    note_empty(t, sq, h, i);
                }
            }
        if (S > 0 && rows > 0)
            for (int64_t g = 0; g < Hkv; ++g) {
                sdpa__rule_group_keys(r, b, g * s->group, (g + 1) * s->group, cnt, used);
                const int64_t u = count_used(used, S);
                if (!score_stage)
                    t->k_rows = add_sat(t->k_rows, u);
                t->v_rows = add_sat(t->v_rows, u);
            }
    }
}

static void put_kernel(sdpa_cost *c, const sdpa__kernel *k, const sdpa__plan *p) {
    snprintf(c->kernel, sizeof c->kernel, "%s%s", k->name(p), sdpa__dtype_tag(p));
    c->kernel_id = k->id;
}

/* Everything but the struct handling of sdpa_attention_cost. */
static sdpa_status cost_fill(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                             const sdpa_options *options, const sdpa_tensor *out, const sdpa_tensor *weights,
                             const sdpa_tensor *lse, const sdpa_cost_options *copts, sdpa_cost *c) {
    sdpa_status st;
    sdpa_cost_options co;
    memset(&co, 0, sizeof co);
    if (copts != NULL) {
        if ((st = sdpa__read_versioned(FN, "copts", "sdpa_cost_options", copts, sizeof(sdpa_cost_options), &co,
                                       sizeof co)) != SDPA_OK ||
            (st = sdpa__check_reserved(FN, "copts->reserved0", co.reserved0)) != SDPA_OK)
            return st;
        if (co.flags & ~(uint32_t)SDPA__COST_FLAGS)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: copts->flags=0x%x has bits that are not SDPA_COST_EXACT, _WEIGHTS or _LSE", FN,
                              (unsigned)co.flags);
    }
    if (out == NULL && (weights != NULL || lse != NULL))
        return sdpa__fail(SDPA_ERR_NULL_POINTER,
                          "%s: out is NULL but %s is given (count weights and lse without views with "
                          "SDPA_COST_WEIGHTS / SDPA_COST_LSE, or pass all three views)",
                          FN, weights != NULL ? "weights" : "lse");

    /* The validation of the call: sdpa__plan_make, its messages naming this function. Without
     * out, its output checks are those a workspace-size query makes (none). */
    sdpa__plan p;
    sdpa_options o;
    st = sdpa__plan_make(FN, q, k, v, options, out, weights, lse, out == NULL, &p, &o);
    if (st != SDPA_OK)
        return st;
    const bool want_w = weights != NULL || (co.flags & SDPA_COST_WEIGHTS);
    const bool want_l = lse != NULL || (co.flags & SDPA_COST_LSE);
    if (want_w && weights == NULL) {
        if (o.cu_seqlens_q != NULL)
            return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                              "%s: weights are not available for a packed batch (cu_seqlens_q); drop SDPA_COST_WEIGHTS", FN);
        p.has_weights = true; /* what kernel AUTO picks and what it needs depend on it */
    }

    /* The kernel, threads and workspace the call would plan. */
    size_t need = 0;
    const sdpa__kernel *kern = NULL;
    const sdpa__plan *kplan = &p;
    sdpa__plan last;
    int threads = 1;
    if (o.cu_seqlens_q != NULL) {
        sdpa__exec_plan lx;
        bool any = false;
        if ((st = sdpa__varlen_exec(FN, &p, &o, &threads, &need, &last, &lx, &any)) !=
            SDPA_OK)
            return st;
        if (any) {
            kern = lx.kernel;
            kplan = &last;
        }
        if ((st = sdpa__varlen_workspace_bytes(FN, &p, &o, &c->workspace_bytes)) !=
            SDPA_OK)
            return st;
    } else {
        sdpa__exec_plan x;
        if ((st = sdpa__exec_plan_make(FN, &p, &x)) != SDPA_OK)
            return st;
        need = sdpa__exec_plan_need(&x);
        if (need == SIZE_MAX)
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", FN);
        if (p.B > 0 && p.Hq > 0 && p.L > 0) {
            kern = x.kernel;
            threads = x.threads;
        }
        if ((st = sdpa__attention_workspace_bytes(FN, &p, &c->workspace_bytes)) !=
            SDPA_OK)
            return st;
    }
    /* a packed call with no query row returns before looking at the workspace (varlen.c) */
    if (o.workspace != NULL && o.workspace_bytes < need && (o.cu_seqlens_q == NULL || need > 0))
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_attention_workspace_size())",
                          FN, o.workspace_bytes, need);
    if (kern != NULL)
        put_kernel(c, kern, kplan);
    else
        snprintf(c->kernel, sizeof c->kernel, "none");
    c->threads = threads;

    /* The pairs, by the rule. */
    tally t;
    memset(&t, 0, sizeof t);
    t.exact = true;
    t.first_seq = -1;
    const bool scan = (co.flags & SDPA_COST_EXACT) != 0;
    const bool score_stage =
        want_w && (o.weights_stage == SDPA_WEIGHTS_SCORES || o.weights_stage == SDPA_WEIGHTS_SOFTCAPPED);
    int32_t *cnt = NULL;
    uint8_t *used = NULL;
    if (p.S > 0 && p.Hq > 0 && p.L > 0) {
        const size_t n = (size_t)p.S;
        cnt = malloc((n + 1) * sizeof *cnt + n);
        if (cnt == NULL)
            return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of scratch", FN,
                              (n + 1) * sizeof *cnt + n);
        used = (uint8_t *)(cnt + n + 1);
    }
    if (o.cu_seqlens_q != NULL) {
        for (int64_t r = 0; r < o.num_seqs; ++r) {
            sdpa__plan s;
            sdpa__varlen_sequence_plan(&p, &o, r, &s);
            count_plan(&s, r, scan, false, cnt, used, &t);
        }
    } else {
        count_plan(&p, -1, scan, score_stage, cnt, used, &t);
    }
    free(cnt);

    const size_t eq = sdpa_dtype_size((sdpa_dtype)p.q.dtype), ek = sdpa_dtype_size((sdpa_dtype)p.k.dtype);
    const size_t ev = sdpa_dtype_size((sdpa_dtype)p.v.dtype);
    const size_t eo = out != NULL ? sdpa_dtype_size((sdpa_dtype)out->dtype) : eq;
    c->exact = t.exact;
    c->query_rows = t.rows;
    c->allowed_pairs = t.allowed;
    c->skipped_pairs = t.logical - t.allowed;
    c->empty_rows = t.empty;
    c->flops = add_sat(mul_sat(mul_sat(2, p.E), score_stage ? t.score_pairs : t.allowed),
                       mul_sat(mul_sat(2, p.Ev), t.allowed));
    c->bytes_read_q = mul_sat(mul_sat(t.rows, p.E), (int64_t)eq);
    /* a row's storage units (0.6: a q8_0 row is E / 32 blocks; ek, ev: bytes of one unit) */
    int64_t k_units, v_units;
    sdpa__storage_shape(p.k.dtype, 1, &p.E, &k_units);
    sdpa__storage_shape(p.v.dtype, 1, &p.Ev, &v_units);
    c->bytes_read_k = mul_sat(mul_sat(t.k_rows, k_units), (int64_t)ek);
    c->bytes_read_v = mul_sat(mul_sat(t.v_rows, v_units), (int64_t)ev);
    c->bytes_read_mask = t.mask_pairs;
    c->bytes_read_bias = p.rules.has_bias ? mul_sat(t.bias_pairs, (int64_t)sdpa_dtype_size((sdpa_dtype)p.rules.bias.dtype)) : 0;
    const int64_t out_rows = mul_sat(mul_sat(p.B, p.Hq), p.L);
    c->bytes_written_out = mul_sat(mul_sat(out_rows, p.Ev), (int64_t)eo);
    c->bytes_written_weights = want_w ? mul_sat(mul_sat(out_rows, p.S), 4) : 0;
    c->bytes_written_lse = want_l ? mul_sat(out_rows, 4) : 0;

    /* The one value-level status known here: empty rows under policy ERROR. */
    if (p.empty_rows == SDPA_EMPTY_ROWS_ERROR && t.empty > 0) {
        if (o.cu_seqlens_q != NULL)
            return sdpa__fail(SDPA_ERR_EMPTY_ROW,
                              "%s: query row (b=0,h=%lld,i=%lld) of packed sequence r=%lld has no allowed key (use "
                              "SDPA_EMPTY_ROWS_ZERO to get a zero row); %lld empty rows in all",
                              FN, (long long)t.first_h, (long long)t.first_i, (long long)t.first_seq, (long long)t.empty);
        return sdpa__fail(SDPA_ERR_EMPTY_ROW,
                          "%s: query row (b=%lld,h=%lld,i=%lld) has no allowed key (use SDPA_EMPTY_ROWS_ZERO to get a "
                          "zero row); %lld empty rows in all",
                          FN, (long long)t.first_seq, (long long)t.first_h, (long long)t.first_i, (long long)t.empty);
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_attention_cost(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                         const sdpa_options *options, const sdpa_tensor *out, const sdpa_tensor *weights,
                                         const sdpa_tensor *lse, const sdpa_cost_options *copts, sdpa_cost *cost) {
    sdpa__clear_error();
    if (cost == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: cost is NULL", FN);
    size_t sz;
    memcpy(&sz, cost, sizeof sz);
    if (sz < sizeof(sdpa_cost) || sz > SDPA__STRUCT_SIZE_MAX || sz % _Alignof(size_t) != 0)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                          "%s: cost->struct_size=%zu must be at least sizeof(sdpa_cost)=%zu of libsdpa 0.6, at most "
                          "%d and a multiple of %zu (set it to sizeof(sdpa_cost), or call sdpa_cost_init())",
                          FN, sz, sizeof(sdpa_cost), SDPA__STRUCT_SIZE_MAX, (size_t)_Alignof(size_t));
    sdpa_cost c;
    memset(&c, 0, sizeof c);
    sdpa_status st = cost_fill(q, k, v, options, out, weights, lse, copts, &c);
    if (st != SDPA_OK && st != SDPA_ERR_EMPTY_ROW)
        memset(&c, 0, sizeof c); /* a validation error: no count, no kernel */
    c.struct_size = sz;
    c.status = (int32_t)st;
    memcpy(cost, &c, sizeof c);
    memset((unsigned char *)cost + sizeof c, 0, sz - sizeof c); /* a newer layout's fields: 0 */
    return st;
}

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(sizeof(sdpa_cost_options) == 16, "sdpa_cost_options 0.6 layout");
_Static_assert(offsetof(sdpa_cost, kernel) == 16 && offsetof(sdpa_cost, workspace_bytes) == 88,
               "sdpa_cost 0.6 layout");
_Static_assert(sizeof(sdpa_cost) == offsetof(sdpa_cost, bytes_written_lse) + 8, "sdpa_cost ends with bytes_written_lse");
#endif
