/* Random attention problems shared by test_attention and test_kernels; see test_case.h. */
#include "test_case.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int tc_append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len >= cap) {
        return 0;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    return n;
}

void tc_random_layout(tc_rng *r, tc_layout *lay, int rank, const int64_t *shape, int is_input,
                      double bcast_p)
{
    tc_layout_contiguous(lay, rank);
    int kind = (int)tc_rng_int(r, 0, 3);
    if (rank == 4 && kind == 1) {
        lay->perm[1] = 2; /* BSHD storage of a [B, H, S, D] view */
        lay->perm[2] = 1;
    } else if (kind == 2) {
        for (int i = rank - 1; i > 0; --i) {
            int j = (int)tc_rng_int(r, 0, i);
            int t = lay->perm[i];
            lay->perm[i] = lay->perm[j];
            lay->perm[j] = t;
        }
    }
    for (int d = 0; d < rank; ++d) {
        if (tc_rng_chance(r, 0.2)) {
            lay->pad[d] = tc_rng_int(r, 1, 3);
        }
        if (is_input) {
            if (bcast_p > 0.0 && shape[d] > 1 && tc_rng_chance(r, bcast_p)) {
                lay->bcast[d] = 1;
            } else if (tc_rng_chance(r, 0.1)) {
                lay->reverse[d] = 1;
            }
        }
    }
}

static void describe_view(char *d, size_t cap, const char *name, const tc_buf *b)
{
    tc_append(d, cap, " %s[", name);
    for (int i = 0; i < b->rank; ++i) {
        tc_append(d, cap, "%s%lld", i ? "," : "", (long long)b->shape[i]);
    }
    tc_append(d, cap, "]/(");
    for (int i = 0; i < b->rank; ++i) {
        tc_append(d, cap, "%s%lld", i ? "," : "", (long long)b->strides[i]);
    }
    tc_append(d, cap, ")");
}

static void describe_list(char *d, size_t cap, const char *name, const int64_t *x, int64_t n)
{
    tc_append(d, cap, " %s=", name);
    for (int64_t b = 0; b < n; ++b) {
        tc_append(d, cap, "%s%lld", b ? "," : "", (long long)x[b]);
    }
}

static void describe(tc_case *c, const char *label, int run_opts)
{
    char *d = c->desc;
    const size_t cap = sizeof c->desc;
    const sdpa_options *o = &c->opt;
    d[0] = '\0';
    tc_append(d, cap, "%s: rank %d B=%lld Hq=%lld Hkv=%lld L=%lld S=%lld E=%lld Ev=%lld", label, c->rank,
              (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->L, (long long)c->S,
              (long long)c->E, (long long)c->Ev);
    describe_view(d, cap, "q", &c->q);
    describe_view(d, cap, "k", &c->k);
    describe_view(d, cap, "v", &c->v);
    describe_view(d, cap, "out", &c->out);
    if (c->want_w) {
        describe_view(d, cap, "w", &c->w);
    }
    if (c->want_lse) {
        describe_view(d, cap, "lse", &c->lse);
    }
    tc_append(d, cap, " scale=%g softcap=%g causal=%d align=%d sliding_window=%d window=(%lld,%lld)"
                      " empty_rows=%d skip_finite_check=%d",
              (double)o->scale, (double)o->softcap, o->causal, o->alignment, o->sliding_window,
              (long long)o->window_left, (long long)o->window_right, o->empty_rows, o->skip_finite_check);
    if (run_opts) {
        tc_append(d, cap, " stage=%d threads=%d ws=%d", o->weights_stage, o->num_threads, c->use_ws);
    }
    if (o->alignment == SDPA_ALIGN_OFFSETS) {
        describe_list(d, cap, "offsets", c->offsets, c->B);
    }
    if (o->key_lengths) {
        describe_list(d, cap, "key_lengths", c->kl, c->B);
    }
    if (o->query_lengths) {
        describe_list(d, cap, "query_lengths", c->ql, c->B);
    }
    if (c->has_bias) {
        describe_view(d, cap, "bias", &c->bias);
    }
    if (c->has_mask) {
        tc_append(d, cap, " mask[");
        for (int i = 0; i < c->mask.rank; ++i) {
            tc_append(d, cap, "%s%lld", i ? "," : "", (long long)c->mask.shape[i]);
        }
        tc_append(d, cap, "]/(");
        for (int i = 0; i < c->mask.rank; ++i) {
            tc_append(d, cap, "%s%lld", i ? "," : "", (long long)c->mask.strides[i]);
        }
        tc_append(d, cap, ")");
    }
}

void tc_attention_shapes(int rank, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E,
                         int64_t Ev, int64_t *qs, int64_t *ks, int64_t *vs, int64_t *os, int64_t *ws,
                         int64_t *ls)
{
    int64_t *const shapes[6] = {qs, ks, vs, os, ws, ls};
    const int64_t heads[6] = {Hq, Hkv, Hkv, Hq, Hq, Hq};
    const int64_t rows[6] = {L, S, S, L, L, L};
    const int64_t cols[6] = {E, E, Ev, Ev, S, 0};
    for (int t = 0; t < 6; ++t) {
        int64_t *x = shapes[t];
        if (!x) {
            continue;
        }
        int n = 0;
        x[n++] = B;
        if (rank == 4) {
            x[n++] = heads[t];
        }
        x[n++] = rows[t];
        if (t != 5) { /* lse has no last axis */
            x[n++] = cols[t];
        }
    }
}

/* Allow-mask of random rank, broadcast shapes and stride-0 axes. */
static void make_mask(tc_case *c, tc_rng *r, const int64_t *full, int tiles)
{
    int mr = (int)tc_rng_int(r, 1, 4);
    memset(&c->mask, 0, sizeof c->mask);
    c->mask.rank = mr;
    int stride0[4] = {0};
    for (int d = 0; d < mr; ++d) {
        c->mask.shape[d] = tc_rng_chance(r, 0.35) ? 1 : full[4 - mr + d];
        stride0[d] = c->mask.shape[d] > 1 && tc_rng_chance(r, 0.15);
    }
    int64_t running = 1;
    for (int d = mr - 1; d >= 0; --d) {
        if (stride0[d]) {
            c->mask.strides[d] = 0;
            continue;
        }
        c->mask.strides[d] = running;
        running *= c->mask.shape[d] > 0 ? c->mask.shape[d] : 1;
    }
    c->mask_base = malloc((size_t)running);
    assert_non_null(c->mask_base);
    if (tiles) {
        /* Sparse or dense masks, and whole blocked runs, so tiles of every class occur. */
        const double p0 = tc_rng_chance(r, 0.3) ? 0.85 : 0.2;
        for (int64_t e = 0; e < running; ++e) {
            c->mask_base[e] = tc_rng_chance(r, p0) ? 0 : (uint8_t)tc_rng_int(r, 1, 255);
        }
        if (running > 80 && tc_rng_chance(r, 0.5)) {
            int64_t s = tc_rng_int(r, 0, running - 70);
            memset(c->mask_base + s, tc_rng_chance(r, 0.5) ? 0 : 1, 70);
        }
    } else {
        static const uint8_t allow_values[4] = {1, 2, 128, 255};
        for (int64_t e = 0; e < running; ++e) {
            c->mask_base[e] = tc_rng_chance(r, 0.2) ? 0 : allow_values[tc_rng_int(r, 0, 3)];
        }
    }
    c->mask.data = c->mask_base;
    memset(&c->rmask, 0, sizeof c->rmask);
    c->rmask.data = c->mask_base;
    c->rmask.rank = mr;
    for (int d = 0; d < mr; ++d) {
        c->rmask.shape[d] = c->mask.shape[d];
        c->rmask.strides[d] = c->mask.strides[d];
    }
}

/* Bias of random rank, broadcast, with -inf entries. */
static void make_bias(tc_case *c, tc_rng *r, const int64_t *full, const tc_case_params *P)
{
    int br = (int)tc_rng_int(r, 1, 4);
    int64_t shape[4];
    for (int d = 0; d < br; ++d) {
        shape[d] = tc_rng_chance(r, 0.35) ? 1 : full[4 - br + d];
    }
    tc_layout lay;
    tc_random_layout(r, &lay, br, shape, 1, P->bcast_p);
    tc_buf_alloc(&c->bias, br, shape, &lay, NAN);
    tc_buf_fill_uniform(&c->bias, r, -2.0, 2.0);
    double pinf = P->bias_neginf_p;
    if (P->bias_neginf_dense_p > 0.0 && tc_rng_chance(r, P->bias_neginf_dense_p)) {
        pinf = 0.6;
    }
    int64_t idx[4] = {0};
    do {
        if (tc_rng_chance(r, pinf)) {
            tc_buf_set(&c->bias, idx, -INFINITY);
        }
    } while (tc_index_next(br, shape, idx));
    c->rbias = tc_buf_ref_same_rank(&c->bias);
    c->tbias = tc_buf_view(&c->bias);
}

void tc_case_build(tc_case *c, tc_rng *r, const tc_case_params *P, const char *label)
{
    int64_t qs[4], ks[4], vs[4], os[4], ws[4], ls[3];
    tc_attention_shapes(c->rank, c->B, c->Hq, c->Hkv, c->L, c->S, c->E, c->Ev, qs, ks, vs, os, ws, ls);
    tc_layout lay;
    tc_random_layout(r, &lay, c->rank, qs, 1, P->bcast_p);
    tc_buf_alloc(&c->q, c->rank, qs, &lay, NAN);
    tc_buf_fill_uniform(&c->q, r, -P->qk_range, P->qk_range);
    tc_random_layout(r, &lay, c->rank, ks, 1, P->bcast_p);
    tc_buf_alloc(&c->k, c->rank, ks, &lay, NAN);
    tc_buf_fill_uniform(&c->k, r, -P->qk_range, P->qk_range);
    tc_random_layout(r, &lay, c->rank, vs, 1, P->bcast_p);
    tc_buf_alloc(&c->v, c->rank, vs, &lay, NAN);
    tc_buf_fill_uniform(&c->v, r, -2.0, 2.0);
    tc_random_layout(r, &lay, c->rank, os, 0, 0.0);
    tc_buf_alloc_canary(&c->out, c->rank, os, &lay);

    c->want_w = P->weights_p > 0.0 && tc_rng_chance(r, P->weights_p);
    c->want_lse = P->lse_p >= 1.0 || tc_rng_chance(r, P->lse_p);
    if (c->want_w) {
        tc_random_layout(r, &lay, c->rank, ws, 0, 0.0);
        tc_buf_alloc_canary(&c->w, c->rank, ws, &lay);
    }
    if (c->want_lse) {
        tc_random_layout(r, &lay, c->rank - 1, ls, 0, 0.0);
        tc_buf_alloc_canary(&c->lse, c->rank - 1, ls, &lay);
    }

    sdpa_options *o = &c->opt;
    sdpa_options_init(o);
    ref_problem *p = &c->rp;
    ref_problem_init(p);
    p->B = c->B;
    p->Hq = c->Hq;
    p->Hkv = c->Hkv;
    p->L = c->L;
    p->S = c->S;
    p->E = c->E;
    p->Ev = c->Ev;

    if (tc_rng_chance(r, 0.3)) {
        o->scale = (float)tc_rng_uniform(r, 0.05, 1.5);
        p->scale = o->scale;
    }
    if (tc_rng_chance(r, P->softcap_p)) {
        o->softcap = (float)tc_rng_uniform(r, 0.5, 5.0);
        p->softcap = o->softcap;
    }
    const int64_t full[4] = {c->B, c->rank == 4 ? c->Hq : 1, c->L, c->S};
    if (tc_rng_chance(r, P->bias_p)) {
        c->has_bias = 1;
        make_bias(c, r, full, P);
        o->bias = &c->tbias;
        p->bias = &c->rbias;
    }
    if (tc_rng_chance(r, P->mask_p)) {
        c->has_mask = 1;
        make_mask(c, r, full, P->mask_tiles);
        o->allow_mask = &c->mask;
        p->mask = &c->rmask;
    }
    int use_window = tc_rng_chance(r, 0.25);
    if (tc_rng_chance(r, P->causal_p)) {
        o->causal = p->causal = 1;
    }
    if (o->causal || use_window) {
        o->alignment = p->alignment = (int)tc_rng_int(r, 0, 2);
        if (o->alignment == SDPA_ALIGN_OFFSETS) {
            for (int64_t b = 0; b < c->B; ++b) {
                c->offsets[b] = tc_rng_int(r, -c->S / P->offset_lo_div, c->S);
            }
            o->query_offsets = p->query_offsets = c->offsets;
        }
    }
    if (use_window) {
        o->sliding_window = p->sliding_window = 1;
        o->window_left = p->window_left = tc_rng_int(r, -1, c->S);
        o->window_right = p->window_right = tc_rng_int(r, -1, c->S / P->window_right_div);
    }
    if (tc_rng_chance(r, 0.25)) {
        for (int64_t b = 0; b < c->B; ++b) {
            c->kl[b] = tc_rng_int(r, 0, c->S);
        }
        o->key_lengths = p->key_lengths = c->kl;
    }
    if (tc_rng_chance(r, 0.2)) {
        for (int64_t b = 0; b < c->B; ++b) {
            c->ql[b] = tc_rng_int(r, 0, c->L);
        }
        o->query_lengths = p->query_lengths = c->ql;
    }
    if (tc_rng_chance(r, P->zero_rows_p)) {
        o->empty_rows = SDPA_EMPTY_ROWS_ZERO;
        p->empty_rows_zero = 1;
    }
    if (P->run_opts) {
        if (c->want_w) {
            o->weights_stage = p->weights_stage = (int)tc_rng_int(r, 0, 3);
        }
        o->num_threads = (int32_t)tc_rng_int(r, 0, 3);
        c->use_ws = tc_rng_chance(r, 0.3);
        /* Drawn last so that the cases above stay what they were: window sides without
         * sliding_window = 1 must change nothing. */
        if (!use_window && tc_rng_chance(r, 0.15)) {
            o->window_left = p->window_left = tc_rng_int(r, 0, 2);
            o->window_right = p->window_right = tc_rng_int(r, 0, 2);
        }
    }
    if (tc_rng_chance(r, 0.1)) {
        o->skip_finite_check = p->skip_finite_check = 1;
    }

    p->q = tc_buf_ref4(&c->q);
    p->k = tc_buf_ref4(&c->k);
    p->v = tc_buf_ref4(&c->v);
    describe(c, label, P->run_opts);
}

void tc_case_free(tc_case *c)
{
    tc_buf_free(&c->q);
    tc_buf_free(&c->k);
    tc_buf_free(&c->v);
    tc_buf_free(&c->out);
    if (c->want_w) {
        tc_buf_free(&c->w);
    }
    if (c->want_lse) {
        tc_buf_free(&c->lse);
    }
    if (c->has_bias) {
        tc_buf_free(&c->bias);
    }
    free(c->mask_base);
    c->mask_base = NULL;
}

float tc_case_at(const tc_buf *buf, int64_t b, int64_t h, int64_t i, int64_t last)
{
    int64_t idx[4];
    if (buf->rank == 4) {
        idx[0] = b, idx[1] = h, idx[2] = i, idx[3] = last;
    } else {
        idx[0] = b, idx[1] = i, idx[2] = last;
    }
    return *tc_buf_fptr(buf, idx);
}

float tc_case_lse_at(const tc_case *c, int64_t b, int64_t h, int64_t i)
{
    int64_t idx[3];
    if (c->lse.rank == 3) {
        idx[0] = b, idx[1] = h, idx[2] = i;
    } else {
        idx[0] = b, idx[1] = i;
    }
    return *tc_buf_fptr(&c->lse, idx);
}

double tc_elem_err(float got, double ref, int exact)
{
    if (!isfinite(ref) || exact) {
        if (isnan(ref)) {
            return isnan(got) ? 0.0 : INFINITY;
        }
        return ((double)got == ref) ? 0.0 : INFINITY;
    }
    if (!isfinite(got)) {
        return INFINITY;
    }
    double scale = fabs(ref) > 1.0 ? fabs(ref) : 1.0;
    return fabs((double)got - ref) / scale;
}
