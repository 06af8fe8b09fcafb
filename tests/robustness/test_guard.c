/*
 * Guard-page harness (issue 8). Every input view, the mask, the bias, the length / offset
 * arrays, the options struct and the view structs themselves sit against a PROT_NONE page
 * (at the end of their region, or at its start when a stride is negative), so a read one
 * element out of bounds faults. Cases are random and seeded: shapes (GQA included), strides
 * (BHSD, BSHD, padded, stride 0, negative), every mask kind (allow-mask of any broadcast rank,
 * causal with the three alignments, sliding window, key and query lengths, bias with -inf),
 * softcap, scale, empty-row policies, weights of every stage and lse or not, dropout, caller
 * workspace, every kernel (AUTO / REFERENCE / TILED / DECODE) and 1-3 threads, on the ISA
 * SDPA_MAX_ISA names (meson registers the harness once per ISA).
 *
 * Each case runs once with finite values everywhere, is compared with the float64 reference
 * (tests/ref), and then reruns with NaN, +Inf and 3e38 written into every location that no
 * allowed pair reads (blocked K/V rows, rows of empty or padding queries, bias entries of blocked
 * pairs, every stride gap; mask gaps get other bytes, the workspace other garbage): status and
 * every output byte must be bit-identical. Output stride gaps must keep their canary; a failed
 * call must leave every output byte untouched and set a message.
 *
 * The same is done for sdpa_mha_forward (gaps poisoned), sdpa_merge (against a double formula)
 * and the mask builders / converters (against their formulas).
 *
 * guard_serving.c adds the 0.4/0.5 features (f16/bf16 views, paged pools and block tables,
 * cu_seqlens, key_lengths, sinks, ALiBi slopes, a shared sdpa_threadpool): one serving case per
 * attention case.
 *
 *   test_guard [cases [seed]]          default 300 cases, seed 1, on the ISA SDPA_MAX_ISA names
 *   test_guard all-isas [cases [seed]] reruns itself (a forked child) once per ISA the CPU has
 *                                      (SDPA_MAX_ISA = portable, avx2, avx512, amx on x86-64;
 *                                      portable, neon on aarch64: the library reads it once per
 *                                      process; the amx child calls sdpa_request_amx() and draws
 *                                      half its serving cases for the AMX column) and prints
 *                                      "not run: <isa> (...)" for the others, which do not count
 *                                      as passed
 */
#include <math.h>
#include <unistd.h>
#include <sys/wait.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "guard_serving.h"
#include "ref/sdpa_ref.h"

int rb_failures = 0;

static const float POISON[3] = {NAN, INFINITY, 3e38f};
#define CANARY 0xA5

/* A struct copied into the last bytes before a guard page. */
static void *place_struct(rb_guard *g, const void *src, size_t n)
{
    void *p = rb_guard_alloc(g, n, 1);
    memcpy(p, src, n);
    return p;
}

static int region_all(const rb_gt *t, unsigned char byte)
{
    const unsigned char *p = t->g.lo;
    for (size_t b = 0; b < (size_t)t->span * t->elem; ++b)
        if (p[b] != byte)
            return 0;
    return 1;
}

/* Output gaps (role 0) still hold the canary. */
static int gaps_intact(const rb_gt *t)
{
    const unsigned char *p = t->g.lo;
    for (int64_t s = 0; s < t->span; ++s)
        if (t->role[s] == RB_GAP)
            for (size_t b = 0; b < t->elem; ++b)
                if (p[(size_t)s * t->elem + b] != CANARY)
                    return 0;
    return 1;
}

static void mark_all_logical(rb_gt *t, uint8_t role)
{
    int64_t idx[4] = {0, 0, 0, 0};
    if (rb_numel(t->rank, t->shape) == 0)
        return;
    do {
        t->role[rb_gt_slot(t, idx)] = role;
    } while (rb_index_next(t->rank, t->shape, idx));
}

static void mark(rb_gt *t, const int64_t *idx, int read)
{
    uint8_t *r = &t->role[rb_gt_slot(t, idx)];
    if (read)
        *r = RB_READ;
    else if (*r != RB_READ)
        *r = RB_UNREAD;
}

/* Write `v` into every float slot that is not read. */
static void poison_floats(rb_gt *t, float v)
{
    float *p = (float *)(void *)t->g.lo;
    for (int64_t s = 0; s < t->span; ++s)
        if (t->role[s] != RB_READ)
            p[s] = v;
}

/* ------------------------------------------------------------ attention */

typedef struct acase {
    int64_t B, Hq, Hkv, L, S, E, Ev;
    rb_gt q, k, v, bias, mask, out, w, lse;
    int has_bias, has_mask, want_w, want_lse, dropout;
    rb_guard gkl, gql, gqo, gopt, gm, gtb, gtq, gtk, gtv, gto, gtw, gtl, gws;
    int64_t *kl, *ql, *qoff;
    const sdpa_options *opt;
    sdpa_options o; /* the values, also for the description */
    size_t opt_size;
    sdpa_tensor *tq, *tk, *tv, *to, *tw, *tl;
    void *ws;
    size_t ws_bytes;
    unsigned char *save[5]; /* q k v bias mask regions as filled */
    char desc[512];
} acase;

static const char *const KNAME[4] = {"auto", "reference", "tiled", "decode"};

static double bias_value(const acase *c, int64_t b, int64_t h, int64_t i, int64_t j, int64_t *idx)
{
    const int64_t full[4] = {b, h, i, j};
    const int off = 4 - c->bias.rank;
    for (int d = 0; d < c->bias.rank; ++d)
        idx[d] = c->bias.shape[d] == 1 ? 0 : full[d + off];
    return *rb_gt_f(&c->bias, idx);
}

static void fill_uniform(rb_gt *t, rb_rng *r, float lo, float hi, int neg_inf_percent)
{
    float *p = (float *)(void *)t->g.lo;
    for (int64_t s = 0; s < t->span; ++s)
        p[s] = 0.5f; /* gaps: finite in the first run */
    int64_t idx[4] = {0, 0, 0, 0};
    if (rb_numel(t->rank, t->shape) == 0)
        return;
    do {
        float x = rb_uniform(r, lo, hi);
        if (neg_inf_percent && rb_chance(r, neg_inf_percent))
            x = -INFINITY;
        *rb_gt_f(t, idx) = x;
    } while (rb_index_next(t->rank, t->shape, idx));
}

/* Logical contents as doubles, row-major. */
static double *to_doubles(const rb_gt *t)
{
    const int64_t n = rb_numel(t->rank, t->shape);
    double *d = (double *)malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int64_t idx[4] = {0, 0, 0, 0}, at = 0;
    if (n > 0)
        do {
            d[at++] = (double)*rb_gt_f(t, idx);
        } while (rb_index_next(t->rank, t->shape, idx));
    return d;
}

static ref_view ref_contig(const double *d, int rank, const int64_t *shape)
{
    ref_view v;
    memset(&v, 0, sizeof v);
    v.data = d;
    v.rank = rank;
    int64_t st = 1;
    for (int k = rank - 1; k >= 0; --k) {
        v.shape[k] = shape[k];
        v.strides[k] = st;
        st *= shape[k];
    }
    return v;
}

static int close_enough(double got, double want)
{
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= 2e-4 + 2e-4 * fabs(want);
}

static void acase_free(acase *c)
{
    rb_gt *ts[8] = {&c->q, &c->k, &c->v, &c->bias, &c->mask, &c->out, &c->w, &c->lse};
    for (int t = 0; t < 8; ++t)
        if (ts[t]->role)
            rb_gt_free(ts[t]);
    rb_guard *gs[13] = {&c->gkl, &c->gql, &c->gqo, &c->gopt, &c->gm, &c->gtb, &c->gtq, &c->gtk, &c->gtv,
                        &c->gto, &c->gtw, &c->gtl, &c->gws};
    for (int t = 0; t < 13; ++t)
        rb_guard_free(gs[t]);
    for (int t = 0; t < 5; ++t)
        free(c->save[t]);
}

static int64_t *guarded_lengths(rb_guard *g, rb_rng *r, int64_t n, int64_t lo, int64_t hi)
{
    int64_t *p = (int64_t *)rb_guard_alloc(g, (size_t)n * sizeof(int64_t), rb_chance(r, 80));
    for (int64_t t = 0; t < n; ++t)
        p[t] = rb_int(r, lo, hi);
    return p;
}

/* Outputs: canary everywhere. */
static void canary_outputs(acase *c)
{
    memset(c->out.g.lo, CANARY, (size_t)c->out.span * 4);
    if (c->want_w)
        memset(c->w.g.lo, CANARY, (size_t)c->w.span * 4);
    if (c->want_lse)
        memset(c->lse.g.lo, CANARY, (size_t)c->lse.span * 4);
}

static sdpa_status acase_call(acase *c)
{
    canary_outputs(c);
    return sdpa_attention(c->tq, c->tk, c->tv, c->opt, c->to, c->want_w ? c->tw : NULL, c->want_lse ? c->tl : NULL);
}

static void draw_case(acase *c, rb_rng *r, int big)
{
    memset(c, 0, sizeof *c);
    c->B = rb_int(r, 1, 2);
    c->Hkv = rb_int(r, 1, 2);
    c->Hq = c->Hkv * rb_int(r, 1, 3);
    c->L = rb_chance(r, 30) ? rb_int(r, 1, 4) : rb_int(r, 1, big ? 80 : 24);
    c->S = rb_int(r, 1, big ? 140 : 40);
    c->E = rb_chance(r, 20) ? rb_int(r, 1, 3) : rb_int(r, 1, big ? 72 : 24);
    c->Ev = rb_chance(r, 50) ? c->E : rb_int(r, 1, big ? 40 : 20);
    sdpa_options *o = &c->o;
    sdpa_options_init(o);
    int kern = (int)rb_int(r, 0, 3);
    c->want_w = (kern == SDPA_KERNEL_AUTO || kern == SDPA_KERNEL_REFERENCE) && rb_chance(r, 45);
    c->want_lse = rb_chance(r, 50);
    o->kernel = kern;
    o->num_threads = (int32_t)rb_int(r, 1, 3);
    if (c->want_w)
        o->weights_stage = (int32_t)rb_int(r, 0, 3);
    if (rb_chance(r, 30)) {
        o->causal = 1;
        o->alignment = (int32_t)rb_int(r, 0, 2);
    } else if (rb_chance(r, 10)) {
        o->alignment = (int32_t)rb_int(r, 0, 2);
    }
    if (rb_chance(r, 20)) {
        o->sliding_window = 1;
        o->window_left = rb_int(r, -1, 6);
        o->window_right = rb_int(r, -1, 6);
        if (o->alignment == SDPA_ALIGN_TOP_LEFT && rb_chance(r, 30))
            o->alignment = SDPA_ALIGN_OFFSETS;
    }
    o->empty_rows = rb_chance(r, 60) ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    if (rb_chance(r, 15))
        o->softcap = rb_uniform(r, 0.5f, 5.0f);
    if (rb_chance(r, 20))
        o->scale = rb_uniform(r, 0.05f, 1.0f);
    if (rb_chance(r, 10))
        o->skip_finite_check = 1;
    if (rb_chance(r, 10)) {
        o->dropout_p = 0.25f;
        o->dropout_seed = rb_next(r);
        o->dropout_offset = rb_next(r) >> 8;
        c->dropout = 1;
    }
    c->has_mask = rb_chance(r, 30);
    c->has_bias = rb_chance(r, 30);
}

/* Build a case: regions, values, reference, roles. Returns the expected status. */
static sdpa_status build_case(acase *c, rb_rng *r, ref_problem *rp, double **dbuf)
{
    sdpa_options *o = &c->o;
    const int in_lay = RB_LAY_NEG | RB_LAY_BCAST | RB_LAY_PERM | RB_LAY_PAD;
    const int out_lay = RB_LAY_PERM | RB_LAY_PAD;
    const int64_t sq[4] = {c->B, c->Hq, c->L, c->E}, sk[4] = {c->B, c->Hkv, c->S, c->E};
    const int64_t sv[4] = {c->B, c->Hkv, c->S, c->Ev}, so[4] = {c->B, c->Hq, c->L, c->Ev};
    const int64_t sw[4] = {c->B, c->Hq, c->L, c->S}, sl[3] = {c->B, c->Hq, c->L};
    rb_gt_make(&c->q, r, 4, sq, 4, in_lay);
    rb_gt_make(&c->k, r, 4, sk, 4, in_lay);
    rb_gt_make(&c->v, r, 4, sv, 4, in_lay);
    rb_gt_make(&c->out, r, 4, so, 4, out_lay);
    fill_uniform(&c->q, r, -1.0f, 1.0f, 0);
    fill_uniform(&c->k, r, -1.0f, 1.0f, 0);
    fill_uniform(&c->v, r, -1.0f, 1.0f, 0);
    if (c->want_w)
        rb_gt_make(&c->w, r, 4, sw, 4, out_lay);
    if (c->want_lse)
        rb_gt_make(&c->lse, r, 3, sl, 4, RB_LAY_PAD);
    const int64_t full[4] = {c->B, c->Hq, c->L, c->S};
    if (c->has_bias) {
        int rank = (int)rb_int(r, 1, 4);
        int64_t bs[4];
        for (int d = 0; d < rank; ++d)
            bs[d] = rb_chance(r, 30) ? 1 : full[4 - rank + d];
        rb_gt_make(&c->bias, r, rank, bs, 4, in_lay);
        fill_uniform(&c->bias, r, -1.0f, 1.0f, 10);
    }
    if (c->has_mask) {
        int rank = (int)rb_int(r, 1, 4);
        int64_t ms[4];
        for (int d = 0; d < rank; ++d)
            ms[d] = rb_chance(r, 30) ? 1 : full[4 - rank + d];
        rb_gt_make(&c->mask, r, rank, ms, 1, in_lay);
        memset(c->mask.g.lo, 0, (size_t)c->mask.span); /* gaps 0 in the first run */
        int64_t idx[4] = {0, 0, 0, 0};
        const int density = (int)rb_int(r, 40, 95);
        do {
            ((uint8_t *)c->mask.g.lo)[rb_gt_slot(&c->mask, idx)] = rb_chance(r, density) ? (uint8_t)rb_int(r, 1, 255) : 0;
        } while (rb_index_next(rank, ms, idx));
        mark_all_logical(&c->mask, RB_READ);
        sdpa_allow_mask m;
        memset(&m, 0, sizeof m);
        m.data = (const uint8_t *)c->mask.data;
        m.rank = rank;
        for (int d = 0; d < rank; ++d) {
            m.shape[d] = ms[d];
            m.strides[d] = c->mask.strides[d];
        }
        o->allow_mask = (const sdpa_allow_mask *)place_struct(&c->gm, &m, sizeof m);
    }
    if (c->has_bias) {
        sdpa_tensor tb = rb_gt_view(&c->bias);
        o->bias = (const sdpa_tensor *)place_struct(&c->gtb, &tb, sizeof tb);
    }
    if (rb_chance(r, 25))
        o->key_lengths = c->kl = guarded_lengths(&c->gkl, r, c->B, 0, c->S);
    if (rb_chance(r, 20))
        o->query_lengths = c->ql = guarded_lengths(&c->gql, r, c->B, 0, c->L);
    if (o->alignment == SDPA_ALIGN_OFFSETS)
        o->query_offsets = c->qoff = guarded_lengths(&c->gqo, r, c->B, -3, c->S);

    /* the view structs and the options struct against guard pages too */
    sdpa_tensor t;
    t = rb_gt_view(&c->q), c->tq = (sdpa_tensor *)place_struct(&c->gtq, &t, sizeof t);
    t = rb_gt_view(&c->k), c->tk = (sdpa_tensor *)place_struct(&c->gtk, &t, sizeof t);
    t = rb_gt_view(&c->v), c->tv = (sdpa_tensor *)place_struct(&c->gtv, &t, sizeof t);
    t = rb_gt_view(&c->out), c->to = (sdpa_tensor *)place_struct(&c->gto, &t, sizeof t);
    if (c->want_w)
        t = rb_gt_view(&c->w), c->tw = (sdpa_tensor *)place_struct(&c->gtw, &t, sizeof t);
    if (c->want_lse)
        t = rb_gt_view(&c->lse), c->tl = (sdpa_tensor *)place_struct(&c->gtl, &t, sizeof t);
    /* A 0.1-sized struct (it ends before `kernel`) for some AUTO calls. */
    c->opt_size = sizeof(sdpa_options);
    if (o->kernel == SDPA_KERNEL_AUTO && rb_chance(r, 25))
        c->opt_size = offsetof(sdpa_options, kernel);
    if (rb_chance(r, 20)) {
        size_t bytes = 0;
        o->struct_size = c->opt_size;
        sdpa_status st = sdpa_attention_workspace_size(c->tq, c->tk, c->tv, o, c->want_w, &bytes);
        if (st == SDPA_OK && bytes > 0) {
            c->ws = rb_guard_alloc(&c->gws, bytes, 1);
            c->ws_bytes = bytes;
            memset(c->ws, 0xFF, bytes);
            o->workspace = c->ws;
            o->workspace_bytes = bytes;
        }
    }
    o->struct_size = c->opt_size;
    c->opt = (const sdpa_options *)place_struct(&c->gopt, o, c->opt_size);

    /* reference problem over logical doubles */
    ref_problem_init(rp);
    rp->B = c->B, rp->Hq = c->Hq, rp->Hkv = c->Hkv, rp->L = c->L, rp->S = c->S, rp->E = c->E, rp->Ev = c->Ev;
    dbuf[0] = to_doubles(&c->q);
    dbuf[1] = to_doubles(&c->k);
    dbuf[2] = to_doubles(&c->v);
    rp->q = ref_contig(dbuf[0], 4, sq);
    rp->k = ref_contig(dbuf[1], 4, sk);
    rp->v = ref_contig(dbuf[2], 4, sv);
    static ref_view rbias;
    static ref_mask rmask;
    if (c->has_bias) {
        dbuf[3] = to_doubles(&c->bias);
        rbias = ref_contig(dbuf[3], c->bias.rank, c->bias.shape);
        rp->bias = &rbias;
    }
    if (c->has_mask) {
        memset(&rmask, 0, sizeof rmask);
        rmask.data = (const uint8_t *)c->mask.data;
        rmask.rank = c->mask.rank;
        for (int d = 0; d < c->mask.rank; ++d) {
            rmask.shape[d] = c->mask.shape[d];
            rmask.strides[d] = c->mask.strides[d];
        }
        rp->mask = &rmask;
    }
    rp->scale = o->scale;
    rp->softcap = o->softcap;
    rp->causal = o->causal;
    rp->alignment = o->alignment;
    rp->query_offsets = o->query_offsets;
    rp->sliding_window = o->sliding_window;
    rp->window_left = o->window_left;
    rp->window_right = o->window_right;
    rp->key_lengths = o->key_lengths;
    rp->query_lengths = o->query_lengths;
    rp->empty_rows_zero = o->empty_rows == SDPA_EMPTY_ROWS_ZERO;
    rp->weights_stage = o->weights_stage;
    rp->skip_finite_check = o->skip_finite_check;

    /* roles: which input elements the call may read */
    const int every_pair = c->want_w && (o->weights_stage == SDPA_WEIGHTS_SCORES || o->weights_stage == SDPA_WEIGHTS_SOFTCAPPED);
    const int64_t group = c->Hq / c->Hkv;
    mark_all_logical(&c->q, RB_UNREAD);
    mark_all_logical(&c->k, RB_UNREAD);
    mark_all_logical(&c->v, RB_UNREAD);
    if (c->has_bias)
        mark_all_logical(&c->bias, RB_UNREAD);
    for (int64_t b = 0; b < c->B; ++b)
        for (int64_t h = 0; h < c->Hq; ++h)
            for (int64_t i = 0; i < c->L; ++i) {
                const int padding = o->query_lengths && i >= o->query_lengths[b];
                if (padding)
                    continue;
                int any = 0;
                for (int64_t j = 0; j < c->S; ++j) {
                    int ok = ref_structurally_allowed(rp, b, h, i, j);
                    if (ok && c->has_bias) {
                        int64_t bidx[4];
                        double bv = bias_value(c, b, h, i, j, bidx);
                        mark(&c->bias, bidx, 1);
                        ok = bv != -INFINITY;
                    }
                    if (ok || every_pair)
                        for (int64_t e = 0; e < c->E; ++e) {
                            const int64_t ki[4] = {b, h / group, j, e};
                            mark(&c->k, ki, 1);
                        }
                    if (ok) {
                        any = 1;
                        for (int64_t e = 0; e < c->Ev; ++e) {
                            const int64_t vi[4] = {b, h / group, j, e};
                            mark(&c->v, vi, 1);
                        }
                    }
                }
                if (any || every_pair)
                    for (int64_t e = 0; e < c->E; ++e) {
                        const int64_t qi[4] = {b, h, i, e};
                        mark(&c->q, qi, 1);
                    }
            }
    if (c->want_w)
        mark_all_logical(&c->w, RB_READ); /* outputs: role 1 = written, 0 = gap */
    if (c->want_lse)
        mark_all_logical(&c->lse, RB_READ);
    mark_all_logical(&c->out, RB_READ);

    rb_gt *ins[5] = {&c->q, &c->k, &c->v, &c->bias, &c->mask};
    for (int u = 0; u < 5; ++u)
        if (ins[u]->role) {
            const size_t n = (size_t)ins[u]->span * ins[u]->elem;
            c->save[u] = (unsigned char *)malloc(n);
            memcpy(c->save[u], ins[u]->g.lo, n);
        }
    snprintf(c->desc, sizeof c->desc,
             "B=%lld Hq=%lld Hkv=%lld L=%lld S=%lld E=%lld Ev=%lld kernel=%s threads=%d weights=%d(stage %d) lse=%d "
             "causal=%d align=%d window=%d(%lld,%lld) empty=%d mask=%d(rank %d) bias=%d(rank %d) klen=%d qlen=%d "
             "softcap=%g scale=%g skipfin=%d dropout=%d ws=%zu opt_size=%zu strides q(%lld,%lld,%lld,%lld) k(%lld,%lld,%lld,%lld)",
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->L, (long long)c->S, (long long)c->E,
             (long long)c->Ev, KNAME[o->kernel], o->num_threads, c->want_w, o->weights_stage, c->want_lse, o->causal,
             o->alignment, o->sliding_window, (long long)o->window_left, (long long)o->window_right, o->empty_rows,
             c->has_mask, c->mask.rank, c->has_bias, c->bias.rank, o->key_lengths != NULL, o->query_lengths != NULL,
             (double)o->softcap, (double)o->scale, o->skip_finite_check, c->dropout, c->ws_bytes, c->opt_size,
             (long long)c->q.strides[0], (long long)c->q.strides[1], (long long)c->q.strides[2], (long long)c->q.strides[3],
             (long long)c->k.strides[0], (long long)c->k.strides[1], (long long)c->k.strides[2], (long long)c->k.strides[3]);
    return SDPA_OK;
}

static void restore_inputs(acase *c)
{
    rb_gt *ins[5] = {&c->q, &c->k, &c->v, &c->bias, &c->mask};
    for (int t = 0; t < 5; ++t)
        if (c->save[t])
            memcpy(ins[t]->g.lo, c->save[t], (size_t)ins[t]->span * ins[t]->elem);
}

static unsigned char *snapshot(const rb_gt *t)
{
    const size_t n = (size_t)t->span * t->elem;
    unsigned char *s = (unsigned char *)malloc(n);
    memcpy(s, t->g.lo, n);
    return s;
}

static int compare_ref(acase *c, const ref_problem *rp, int64_t ncase)
{
    const int64_t nout = c->B * c->Hq * c->L * c->Ev, nw = c->B * c->Hq * c->L * c->S, nl = c->B * c->Hq * c->L;
    double *rout = malloc((size_t)nout * sizeof(double)), *rw = malloc((size_t)(nw > 0 ? nw : 1) * sizeof(double));
    double *rl = malloc((size_t)nl * sizeof(double));
    ref_attention(rp, rout, c->want_w ? rw : NULL, rl, NULL);
    int bad = 0;
    int64_t idx[4] = {0, 0, 0, 0}, at = 0;
    if (!c->dropout) {
        do {
            double got = *rb_gt_f(&c->out, idx);
            if (!close_enough(got, rout[at]) && !bad) {
                RB_FAIL("case %lld: out[%lld,%lld,%lld,%lld] = %.9g, reference %.9g (%s)", (long long)ncase, (long long)idx[0],
                        (long long)idx[1], (long long)idx[2], (long long)idx[3], got, rout[at], c->desc);
                bad = 1;
            }
            ++at;
        } while (rb_index_next(4, c->out.shape, idx));
    }
    if (c->want_w) {
        memset(idx, 0, sizeof idx);
        at = 0;
        do {
            double got = *rb_gt_f(&c->w, idx);
            if (!close_enough(got, rw[at]) && !bad) {
                RB_FAIL("case %lld: weights[%lld,%lld,%lld,%lld] = %.9g, reference %.9g (%s)", (long long)ncase,
                        (long long)idx[0], (long long)idx[1], (long long)idx[2], (long long)idx[3], got, rw[at], c->desc);
                bad = 1;
            }
            ++at;
        } while (rb_index_next(4, c->w.shape, idx));
    }
    if (c->want_lse) {
        memset(idx, 0, sizeof idx);
        at = 0;
        do {
            double got = *rb_gt_f(&c->lse, idx);
            if (!close_enough(got, rl[at]) && !bad) {
                RB_FAIL("case %lld: lse[%lld,%lld,%lld] = %.9g, reference %.9g (%s)", (long long)ncase, (long long)idx[0],
                        (long long)idx[1], (long long)idx[2], got, rl[at], c->desc);
                bad = 1;
            }
            ++at;
        } while (rb_index_next(3, c->lse.shape, idx));
    }
    free(rout);
    free(rw);
    free(rl);
    return !bad;
}

static int64_t g_calls, g_failed_calls;
static char g_kernels[1024];

static void note_kernel(void)
{
    const char *k = sdpa_last_kernel();
    char key[80];
    snprintf(key, sizeof key, " %s", k);
    if (strstr(g_kernels, key) == NULL && strlen(g_kernels) + strlen(key) + 1 < sizeof g_kernels)
        strcat(g_kernels, key);
}

static void attention_case(rb_rng *r, int64_t n)
{
    acase c;
    ref_problem rp;
    double *dbuf[4] = {NULL, NULL, NULL, NULL};
    draw_case(&c, r, rb_chance(r, 12));
    build_case(&c, r, &rp, dbuf);
    double *tmp = malloc((size_t)(c.B * c.Hq * c.L * c.Ev) * sizeof(double));
    ref_report rep = ref_attention(&rp, tmp, NULL, NULL, NULL);
    free(tmp);
    const sdpa_status want = rep.status == REF_EMPTY_ROW ? SDPA_ERR_EMPTY_ROW : SDPA_OK;
    sdpa_status st = acase_call(&c);
    ++g_calls;
    if (st != want) {
        RB_FAIL("case %lld: %s (%s), expected %s (%s)", (long long)n, sdpa_status_string(st), sdpa_last_error_message(),
                sdpa_status_string(want), c.desc);
        goto done;
    }
    if (st != SDPA_OK) {
        ++g_failed_calls;
        RB_CHECK(sdpa_last_error_message()[0] != '\0', "case %lld: no message for %s", (long long)n, sdpa_status_string(st));
        RB_CHECK(region_all(&c.out, CANARY) && (!c.want_w || region_all(&c.w, CANARY)) &&
                     (!c.want_lse || region_all(&c.lse, CANARY)),
                 "case %lld: %s but an output was written (%s)", (long long)n, sdpa_status_string(st), c.desc);
    } else {
        note_kernel();
        RB_CHECK(gaps_intact(&c.out) && (!c.want_w || gaps_intact(&c.w)) && (!c.want_lse || gaps_intact(&c.lse)),
                 "case %lld: a write into an output's stride gap (%s)", (long long)n, c.desc);
        compare_ref(&c, &rp, n);
    }
    unsigned char *base_out = snapshot(&c.out), *base_w = c.want_w ? snapshot(&c.w) : NULL;
    unsigned char *base_l = c.want_lse ? snapshot(&c.lse) : NULL;
    for (int p = 0; p < 3; ++p) {
        poison_floats(&c.q, POISON[p]);
        poison_floats(&c.k, POISON[p]);
        poison_floats(&c.v, POISON[p]);
        if (c.has_bias)
            poison_floats(&c.bias, POISON[p]);
        if (c.has_mask)
            for (int64_t s = 0; s < c.mask.span; ++s)
                if (c.mask.role[s] != RB_READ)
                    ((uint8_t *)c.mask.g.lo)[s] = (uint8_t)(p == 1 ? 0x01 : 0xFF);
        if (c.ws)
            memset(c.ws, p == 0 ? 0x7F : p == 1 ? 0x00 : 0xC3, c.ws_bytes);
        sdpa_status st2 = acase_call(&c);
        ++g_calls;
        const int same = st2 == st && memcmp(base_out, c.out.g.lo, (size_t)c.out.span * 4) == 0 &&
                         (!c.want_w || memcmp(base_w, c.w.g.lo, (size_t)c.w.span * 4) == 0) &&
                         (!c.want_lse || memcmp(base_l, c.lse.g.lo, (size_t)c.lse.span * 4) == 0);
        RB_CHECK(same, "case %lld: %g in locations no allowed pair reads changed the result (%s -> %s: %s) (%s)", (long long)n,
                 (double)POISON[p], sdpa_status_string(st), sdpa_status_string(st2), sdpa_last_error_message(), c.desc);
        restore_inputs(&c);
    }
    free(base_out);
    free(base_w);
    free(base_l);
done:
    for (int t = 0; t < 4; ++t)
        free(dbuf[t]);
    acase_free(&c);
}

/* ------------------------------------------------------------------ MHA */

static int64_t g_mha_calls;

static rb_gt *mk_weight(rb_gt *t, rb_rng *r, int rank, const int64_t *shape, float scale)
{
    rb_gt_make(t, r, rank, shape, 4, RB_LAY_NEG | RB_LAY_PAD | RB_LAY_PERM);
    fill_uniform(t, r, -scale, scale, 0);
    mark_all_logical(t, RB_READ);
    return t;
}

static void mha_case(rb_rng *r, int64_t n)
{
    const int64_t Hkv = rb_int(r, 1, 2), H = Hkv * rb_int(r, 1, 2), Dh = rb_int(r, 1, 6);
    const int64_t B = rb_int(r, 1, 2), L = rb_int(r, 1, 9), S = rb_int(r, 1, 11);
    const int packed = Hkv == H && rb_chance(r, 40);
    const int64_t E = packed ? H * Dh : rb_int(r, 1, 12);
    const int64_t kdim = packed ? E : rb_int(r, 1, 10), vdim = packed ? E : rb_int(r, 1, 10);
    const int64_t Dq = H * Dh, Dkv = Hkv * Dh;
    rb_gt x, kx, vx, win, wq, wk, wv, bin, wo, bo, bk, bv, out, aw, am, kpm;
    memset(&am, 0, sizeof am);
    memset(&kpm, 0, sizeof kpm);
    memset(&bin, 0, sizeof bin);
    memset(&bo, 0, sizeof bo);
    memset(&bk, 0, sizeof bk);
    memset(&bv, 0, sizeof bv);
    memset(&aw, 0, sizeof aw);
    memset(&win, 0, sizeof win);
    memset(&wq, 0, sizeof wq);
    memset(&wk, 0, sizeof wk);
    memset(&wv, 0, sizeof wv);
    const int in_lay = RB_LAY_NEG | RB_LAY_PAD | RB_LAY_PERM | RB_LAY_BCAST;
    const int64_t sx[3] = {B, L, E}, sk[3] = {B, S, kdim}, sv[3] = {B, S, vdim};
    rb_gt_make(&x, r, 3, sx, 4, in_lay);
    fill_uniform(&x, r, -1, 1, 0);
    mark_all_logical(&x, RB_READ);
    rb_gt_make(&kx, r, 3, sk, 4, in_lay);
    fill_uniform(&kx, r, -1, 1, 0);
    mark_all_logical(&kx, RB_READ);
    rb_gt_make(&vx, r, 3, sv, 4, in_lay);
    fill_uniform(&vx, r, -1, 1, 0);
    mark_all_logical(&vx, RB_READ);
    sdpa_mha_params prm;
    sdpa_mha_params_init(&prm);
    prm.embed_dim = E;
    prm.num_heads = H;
    prm.num_kv_heads = Hkv == H && rb_chance(r, 50) ? 0 : Hkv;
    prm.head_dim = packed && rb_chance(r, 50) ? 0 : Dh;
    prm.kdim = kdim == E && rb_chance(r, 50) ? 0 : kdim;
    prm.vdim = vdim == E && rb_chance(r, 50) ? 0 : vdim;
    sdpa_tensor t_win, t_wq, t_wk, t_wv, t_bin, t_wo, t_bo, t_bk, t_bv;
    if (packed) {
        const int64_t s[2] = {3 * E, E};
        t_win = rb_gt_view(mk_weight(&win, r, 2, s, 0.5f));
        prm.in_proj_weight = &t_win;
    } else {
        const int64_t s1[2] = {Dq, E}, s2[2] = {Dkv, kdim}, s3[2] = {Dkv, vdim};
        t_wq = rb_gt_view(mk_weight(&wq, r, 2, s1, 0.5f));
        t_wk = rb_gt_view(mk_weight(&wk, r, 2, s2, 0.5f));
        t_wv = rb_gt_view(mk_weight(&wv, r, 2, s3, 0.5f));
        prm.q_proj_weight = &t_wq;
        prm.k_proj_weight = &t_wk;
        prm.v_proj_weight = &t_wv;
    }
    if (rb_chance(r, 60)) {
        const int64_t s[1] = {Dq + 2 * Dkv};
        t_bin = rb_gt_view(mk_weight(&bin, r, 1, s, 0.2f));
        prm.in_proj_bias = &t_bin;
    }
    const int64_t so[2] = {E, Dq};
    t_wo = rb_gt_view(mk_weight(&wo, r, 2, so, 0.5f));
    prm.out_proj_weight = &t_wo;
    if (rb_chance(r, 60)) {
        const int64_t s[1] = {E};
        t_bo = rb_gt_view(mk_weight(&bo, r, 1, s, 0.2f));
        prm.out_proj_bias = &t_bo;
    }
    if (rb_chance(r, 25)) {
        const int64_t s[3] = {1, 1, Dkv};
        t_bk = rb_gt_view(mk_weight(&bk, r, 3, s, 0.5f));
        t_bv = rb_gt_view(mk_weight(&bv, r, 3, s, 0.5f));
        prm.bias_k = &t_bk;
        prm.bias_v = &t_bv;
    }
    prm.add_zero_attn = rb_chance(r, 20);
    const int64_t Sp = S + (prm.bias_k ? 1 : 0) + prm.add_zero_attn;
    sdpa_mha_options mo;
    sdpa_mha_options_init(&mo);
    sdpa_allow_mask m_am, m_kpm;
    rb_guard g1 = {0}, g2 = {0}, g3 = {0};
    if (rb_chance(r, 30)) {
        const int64_t s[2] = {L, S};
        rb_gt_make(&am, r, 2, s, 1, in_lay);
        memset(am.g.lo, 0, (size_t)am.span);
        int64_t idx[2] = {0, 0};
        do {
            ((uint8_t *)am.g.lo)[rb_gt_slot(&am, idx)] = (uint8_t)rb_chance(r, 75);
        } while (rb_index_next(2, s, idx));
        mark_all_logical(&am, RB_READ);
        memset(&m_am, 0, sizeof m_am);
        m_am.data = (const uint8_t *)am.data, m_am.rank = 2;
        m_am.shape[0] = L, m_am.shape[1] = S, m_am.strides[0] = am.strides[0], m_am.strides[1] = am.strides[1];
        mo.attn_mask = &m_am;
    }
    if (rb_chance(r, 25)) {
        const int64_t s[2] = {B, S};
        rb_gt_make(&kpm, r, 2, s, 1, in_lay);
        memset(kpm.g.lo, 0, (size_t)kpm.span);
        int64_t idx[2] = {0, 0};
        do {
            ((uint8_t *)kpm.g.lo)[rb_gt_slot(&kpm, idx)] = (uint8_t)rb_chance(r, 80);
        } while (rb_index_next(2, s, idx));
        mark_all_logical(&kpm, RB_READ);
        memset(&m_kpm, 0, sizeof m_kpm);
        m_kpm.data = (const uint8_t *)kpm.data, m_kpm.rank = 2;
        m_kpm.shape[0] = B, m_kpm.shape[1] = S, m_kpm.strides[0] = kpm.strides[0], m_kpm.strides[1] = kpm.strides[1];
        mo.key_padding_mask = &m_kpm;
    }
    if (rb_chance(r, 20))
        mo.key_lengths = guarded_lengths(&g1, r, B, 0, S);
    if (rb_chance(r, 20))
        mo.query_lengths = guarded_lengths(&g2, r, B, 0, L);
    mo.causal = rb_chance(r, 25);
    mo.empty_rows = rb_chance(r, 70) ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    mo.num_threads = (int32_t)rb_int(r, 1, 3);
    if (rb_chance(r, 15)) {
        mo.training = 1;
        mo.dropout_p = 0.2f;
        mo.dropout_seed = rb_next(r);
    }
    const int want_w = rb_chance(r, 40);
    mo.per_head_weights = want_w && rb_chance(r, 50);
    const int64_t so3[3] = {B, L, E};
    rb_gt_make(&out, r, 3, so3, 4, RB_LAY_PAD | RB_LAY_PERM);
    mark_all_logical(&out, RB_READ);
    if (want_w) {
        const int64_t s4[4] = {B, H, L, Sp}, s3[3] = {B, L, Sp};
        if (mo.per_head_weights)
            rb_gt_make(&aw, r, 4, s4, 4, RB_LAY_PAD | RB_LAY_PERM);
        else
            rb_gt_make(&aw, r, 3, s3, 4, RB_LAY_PAD);
        mark_all_logical(&aw, RB_READ);
    }
    if (rb_chance(r, 20)) {
        size_t bytes = 0;
        sdpa_tensor tx0 = rb_gt_view(&x), tk0 = rb_gt_view(&kx), tv0 = rb_gt_view(&vx);
        if (sdpa_mha_workspace_size(&prm, &tx0, &tk0, &tv0, &mo, want_w, &bytes) == SDPA_OK && bytes > 0) {
            mo.workspace = rb_guard_alloc(&g3, bytes, 1);
            mo.workspace_bytes = bytes;
        }
    }
    const int self = rb_chance(r, 25) && kdim == E && vdim == E && S == L;
    sdpa_tensor tx = rb_gt_view(&x), tk = self ? tx : rb_gt_view(&kx), tv = self ? tx : rb_gt_view(&vx);
    sdpa_tensor to = rb_gt_view(&out), tw = want_w ? rb_gt_view(&aw) : to;
    rb_gt *ins[16] = {&x, &kx, &vx, &win, &wq, &wk, &wv, &bin, &wo, &bo, &bk, &bv, &am, &kpm, NULL, NULL};
    unsigned char *save[16] = {0};
    for (int t = 0; ins[t]; ++t)
        if (ins[t]->role)
            save[t] = snapshot(ins[t]);
    unsigned char *base_o = NULL, *base_w = NULL;
    sdpa_status st0 = SDPA_OK;
    for (int p = -1; p < 3; ++p) {
        if (p >= 0)
            for (int t = 0; ins[t]; ++t)
                if (ins[t]->role) {
                    if (ins[t]->elem == 4)
                        poison_floats(ins[t], POISON[p]);
                    else
                        for (int64_t s = 0; s < ins[t]->span; ++s)
                            if (ins[t]->role[s] != RB_READ)
                                ((uint8_t *)ins[t]->g.lo)[s] = 0xFF;
                }
        if (mo.workspace)
            memset(mo.workspace, p < 0 ? 0xFF : 0x11 * (p + 1), mo.workspace_bytes);
        memset(out.g.lo, CANARY, (size_t)out.span * 4);
        if (want_w)
            memset(aw.g.lo, CANARY, (size_t)aw.span * 4);
        sdpa_status st = sdpa_mha_forward(&prm, &tx, &tk, &tv, &mo, &to, want_w ? &tw : NULL);
        ++g_mha_calls;
        if (p < 0) {
            st0 = st;
            RB_CHECK(st == SDPA_OK || st == SDPA_ERR_EMPTY_ROW, "mha case %lld: %s (%s) B=%lld L=%lld S=%lld E=%lld H=%lld Hkv=%lld",
                     (long long)n, sdpa_status_string(st), sdpa_last_error_message(), (long long)B, (long long)L,
                     (long long)S, (long long)E, (long long)H, (long long)Hkv);
            if (st != SDPA_OK)
                RB_CHECK(region_all(&out, CANARY) && (!want_w || region_all(&aw, CANARY)) && sdpa_last_error_message()[0],
                         "mha case %lld: failed call wrote an output or set no message", (long long)n);
            else
                RB_CHECK(gaps_intact(&out) && (!want_w || gaps_intact(&aw)), "mha case %lld: write into an output gap",
                         (long long)n);
            base_o = snapshot(&out);
            base_w = want_w ? snapshot(&aw) : NULL;
        } else {
            RB_CHECK(st == st0 && memcmp(base_o, out.g.lo, (size_t)out.span * 4) == 0 &&
                         (!want_w || memcmp(base_w, aw.g.lo, (size_t)aw.span * 4) == 0),
                     "mha case %lld: %g in stride gaps changed the result", (long long)n, (double)POISON[p]);
            for (int t = 0; ins[t]; ++t)
                if (save[t])
                    memcpy(ins[t]->g.lo, save[t], (size_t)ins[t]->span * ins[t]->elem);
        }
    }
    free(base_o);
    free(base_w);
    for (int t = 0; ins[t]; ++t) {
        free(save[t]);
        if (ins[t]->role)
            rb_gt_free(ins[t]);
    }
    rb_gt_free(&out);
    if (aw.role)
        rb_gt_free(&aw);
    rb_guard_free(&g1);
    rb_guard_free(&g2);
    rb_guard_free(&g3);
}

/* ---------------------------------------------------------------- merge */

static int64_t g_merge_calls;

static void merge_case(rb_rng *r, int64_t n)
{
    const int rank = (int)rb_int(r, 1, 4);
    int64_t so[4], sl[4] = {1, 1, 1, 1};
    for (int d = 0; d < rank; ++d)
        so[d] = rb_int(r, 1, d == rank - 1 ? 9 : 4);
    const int lrank = rank == 1 ? 1 : rank - 1;
    for (int d = 0; d < rank - 1; ++d)
        sl[d] = so[d];
    const int in_lay = RB_LAY_NEG | RB_LAY_PAD | RB_LAY_PERM | RB_LAY_BCAST;
    rb_gt oa, ob, la, lb, o, l;
    rb_gt_make(&oa, r, rank, so, 4, in_lay);
    rb_gt_make(&ob, r, rank, so, 4, in_lay);
    rb_gt_make(&la, r, lrank, sl, 4, in_lay);
    rb_gt_make(&lb, r, lrank, sl, 4, in_lay);
    rb_gt_make(&o, r, rank, so, 4, RB_LAY_PAD | RB_LAY_PERM);
    const int want_l = rb_chance(r, 70);
    rb_gt_make(&l, r, lrank, sl, 4, RB_LAY_PAD);
    fill_uniform(&oa, r, -2, 2, 0);
    fill_uniform(&ob, r, -2, 2, 0);
    fill_uniform(&la, r, -3, 3, 15);
    fill_uniform(&lb, r, -3, 3, 15);
    rb_gt *ins[4] = {&oa, &ob, &la, &lb};
    for (int t = 0; t < 4; ++t)
        mark_all_logical(ins[t], RB_READ);
    mark_all_logical(&o, RB_READ);
    mark_all_logical(&l, RB_READ);
    /* out rows whose lse is -inf are not read: they may hold anything */
    unsigned char *save[4];
    sdpa_tensor ta = rb_gt_view(&oa), tb = rb_gt_view(&ob), tla = rb_gt_view(&la), tlb = rb_gt_view(&lb);
    sdpa_tensor to = rb_gt_view(&o), tl = rb_gt_view(&l);
    rb_guard gs[6] = {{0}};
    const sdpa_tensor *pa = place_struct(&gs[0], &ta, sizeof ta), *pb = place_struct(&gs[1], &tb, sizeof tb);
    const sdpa_tensor *pla = place_struct(&gs[2], &tla, sizeof tla), *plb = place_struct(&gs[3], &tlb, sizeof tlb);
    const sdpa_tensor *po = place_struct(&gs[4], &to, sizeof to), *pl = place_struct(&gs[5], &tl, sizeof tl);
    for (int t = 0; t < 4; ++t)
        save[t] = snapshot(ins[t]);
    unsigned char *bo = NULL, *bl = NULL;
    sdpa_status st0 = SDPA_OK;
    for (int p = -1; p < 3; ++p) {
        if (p >= 0)
            for (int t = 0; t < 4; ++t)
                poison_floats(ins[t], POISON[p]);
        memset(o.g.lo, CANARY, (size_t)o.span * 4);
        memset(l.g.lo, CANARY, (size_t)l.span * 4);
        sdpa_status st = sdpa_merge(pa, pla, pb, plb, po, want_l ? pl : NULL);
        ++g_merge_calls;
        if (p < 0) {
            st0 = st;
            RB_CHECK(st == SDPA_OK, "merge case %lld: %s (%s)", (long long)n, sdpa_status_string(st), sdpa_last_error_message());
            if (st == SDPA_OK) {
                RB_CHECK(gaps_intact(&o) && gaps_intact(&l) && (want_l || region_all(&l, CANARY)),
                         "merge case %lld: write into a gap", (long long)n);
                int64_t idx[4] = {0, 0, 0, 0};
                do {
                    int64_t li[4] = {0, 0, 0, 0};
                    for (int d = 0; d < rank - 1; ++d)
                        li[d] = idx[d];
                    const double a = *rb_gt_f(&la, li), b = *rb_gt_f(&lb, li);
                    const double m = a > b ? a : b;
                    double want_o = 0.0, want_lse = -INFINITY;
                    if (m != -INFINITY) {
                        const double wa = exp(a - m), wb = exp(b - m);
                        const double xa = wa > 0 ? *rb_gt_f(&oa, idx) : 0.0, xb = wb > 0 ? *rb_gt_f(&ob, idx) : 0.0;
                        want_o = (wa * xa + wb * xb) / (wa + wb);
                        want_lse = m + log(wa + wb);
                    }
                    const double got = *rb_gt_f(&o, idx);
                    if (!close_enough(got, want_o)) {
                        RB_FAIL("merge case %lld: out %.9g, expected %.9g", (long long)n, got, want_o);
                        break;
                    }
                    if (want_l && idx[rank - 1] == 0 && !close_enough(*rb_gt_f(&l, li), want_lse)) {
                        RB_FAIL("merge case %lld: lse %.9g, expected %.9g", (long long)n, (double)*rb_gt_f(&l, li), want_lse);
                        break;
                    }
                } while (rb_index_next(rank, so, idx));
            }
            bo = snapshot(&o);
            bl = snapshot(&l);
        } else {
            RB_CHECK(st == st0 && memcmp(bo, o.g.lo, (size_t)o.span * 4) == 0 && memcmp(bl, l.g.lo, (size_t)l.span * 4) == 0,
                     "merge case %lld: %g in stride gaps changed the result", (long long)n, (double)POISON[p]);
            for (int t = 0; t < 4; ++t)
                memcpy(ins[t]->g.lo, save[t], (size_t)ins[t]->span * 4);
        }
    }
    free(bo);
    free(bl);
    for (int t = 0; t < 4; ++t) {
        free(save[t]);
        rb_gt_free(ins[t]);
    }
    rb_gt_free(&o);
    rb_gt_free(&l);
    for (int t = 0; t < 6; ++t)
        rb_guard_free(&gs[t]);
}

/* ------------------------------------------------- builders, converters */

static int64_t g_mask_calls;

static void expect_ok(sdpa_status st, const char *what, int64_t n)
{
    ++g_mask_calls;
    RB_CHECK(st == SDPA_OK, "mask case %lld: %s: %s (%s)", (long long)n, what, sdpa_status_string(st), sdpa_last_error_message());
}

static void mask_case(rb_rng *r, int64_t n)
{
    const int64_t L = rb_int(r, 0, 9), S = rb_int(r, 0, 11), B = rb_int(r, 1, 3);
    rb_guard g[8] = {{0}};
    /* causal and sliding window, each alignment they accept */
    const sdpa_alignment al = (sdpa_alignment)rb_int(r, 0, 1);
    uint8_t *m = (uint8_t *)rb_guard_alloc(&g[0], (size_t)(L * S), rb_chance(r, 70));
    expect_ok(sdpa_mask_causal(m, L, S, al), "causal", n);
    for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) {
            const int64_t p = al == SDPA_ALIGN_TOP_LEFT ? i : i + S - L;
            RB_CHECK(m[i * S + j] == (j <= p), "mask case %lld: causal [%lld,%lld]", (long long)n, (long long)i, (long long)j);
        }
    const int64_t left = rb_int(r, -1, 4), right = rb_int(r, -1, 4);
    expect_ok(sdpa_mask_sliding_window(m, L, S, left, right, al), "sliding window", n);
    for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) {
            const int64_t p = al == SDPA_ALIGN_TOP_LEFT ? i : i + S - L;
            const int ok = (left < 0 || j >= p - left) && (right < 0 || j <= p + right);
            RB_CHECK(m[i * S + j] == ok, "mask case %lld: window [%lld,%lld]", (long long)n, (long long)i, (long long)j);
        }
    /* padding from guarded lengths */
    int64_t *len = guarded_lengths(&g[1], r, B, 0, S);
    uint8_t *pm = (uint8_t *)rb_guard_alloc(&g[2], (size_t)(B * S), rb_chance(r, 70));
    const sdpa_padding_side side = (sdpa_padding_side)rb_int(r, 0, 1);
    expect_ok(sdpa_mask_padding(pm, B, S, len, side), "padding", n);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < S; ++t)
            RB_CHECK(pm[b * S + t] == (side == SDPA_PAD_RIGHT ? t < len[b] : t >= S - len[b]), "mask case %lld: padding",
                     (long long)n);
    /* prefix-LM */
    const int64_t T = L, pre = rb_int(r, 0, T);
    uint8_t *pl = (uint8_t *)rb_guard_alloc(&g[3], (size_t)(T * T), 1);
    expect_ok(sdpa_mask_prefix_lm(pl, T, pre), "prefix_lm", n);
    for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
            RB_CHECK(pl[i * T + j] == (j < pre || j <= i), "mask case %lld: prefix_lm", (long long)n);
    /* block diagonal from guarded cu_seqlens */
    const int64_t ns = rb_int(r, 0, 3);
    int64_t *cq = (int64_t *)rb_guard_alloc(&g[4], (size_t)(ns + 1) * 8, 1);
    int64_t *ck = (int64_t *)rb_guard_alloc(&g[5], (size_t)(ns + 1) * 8, 0);
    cq[0] = ck[0] = 0;
    for (int64_t t = 1; t <= ns; ++t) {
        cq[t] = cq[t - 1] + rb_int(r, 0, 3);
        ck[t] = ck[t - 1] + rb_int(r, 0, 3);
    }
    const int self_bd = rb_chance(r, 50);
    uint8_t *bd = (uint8_t *)rb_guard_alloc(&g[6], (size_t)(cq[ns] * (self_bd ? cq[ns] : ck[ns])), 1);
    expect_ok(sdpa_mask_block_diagonal(bd, ns, cq, self_bd ? NULL : ck, 0, SDPA_ALIGN_TOP_LEFT), "block_diagonal", n);
    for (int64_t q = 0; q < ns; ++q) /* one cell per sequence: inside its own block */
        if (cq[q + 1] > cq[q] && (self_bd ? cq : ck)[q + 1] > (self_bd ? cq : ck)[q])
            RB_CHECK(bd[cq[q] * (self_bd ? cq[ns] : ck[ns]) + (self_bd ? cq : ck)[q]] == 1, "mask case %lld: block_diagonal",
                     (long long)n);
    rb_guard_free(&g[6]);
    bd = (uint8_t *)rb_guard_alloc(&g[6], (size_t)(cq[ns] * ck[ns]), 1);
    expect_ok(sdpa_mask_block_diagonal(bd, ns, cq, ck, 1, (sdpa_alignment)rb_int(r, 0, 1)), "block_diagonal causal", n);
    /* AND of two strided masks (negative and zero strides) into a guarded output */
    const int64_t sh[3] = {B, L, S};
    rb_gt a, b2;
    const int lay = RB_LAY_NEG | RB_LAY_BCAST | RB_LAY_PAD | RB_LAY_PERM;
    rb_gt_make(&a, r, 3, sh, 1, lay);
    const int64_t shb[2] = {L, S};
    rb_gt_make(&b2, r, 2, shb, 1, lay);
    memset(a.g.lo, 0xFF, (size_t)a.span);
    memset(b2.g.lo, 0xFF, (size_t)b2.span);
    int64_t idx[3] = {0, 0, 0};
    if (B * L * S > 0)
        do {
            ((uint8_t *)a.g.lo)[rb_gt_slot(&a, idx)] = (uint8_t)rb_chance(r, 60);
        } while (rb_index_next(3, sh, idx));
    memset(idx, 0, sizeof idx);
    if (L * S > 0)
        do {
            ((uint8_t *)b2.g.lo)[rb_gt_slot(&b2, idx)] = (uint8_t)(rb_chance(r, 60) * 3);
        } while (rb_index_next(2, shb, idx));
    sdpa_allow_mask ma, mb;
    memset(&ma, 0, sizeof ma);
    memset(&mb, 0, sizeof mb);
    ma.data = (const uint8_t *)a.data, ma.rank = 3;
    mb.data = (const uint8_t *)b2.data, mb.rank = 2;
    for (int d = 0; d < 3; ++d)
        ma.shape[d] = sh[d], ma.strides[d] = a.strides[d];
    for (int d = 0; d < 2; ++d)
        mb.shape[d] = shb[d], mb.strides[d] = b2.strides[d];
    uint8_t *ao = (uint8_t *)rb_guard_alloc(&g[7], (size_t)(B * L * S), 1);
    rb_guard gms[3] = {{0}};
    const sdpa_allow_mask *pma = place_struct(&gms[0], &ma, sizeof ma), *pmb = place_struct(&gms[1], &mb, sizeof mb);
    const int64_t *psh = place_struct(&gms[2], sh, sizeof sh);
    expect_ok(sdpa_mask_and(pma, pmb, ao, 3, psh), "and", n);
    memset(idx, 0, sizeof idx);
    if (B * L * S > 0)
        do {
            const int64_t i2[2] = {idx[1], idx[2]};
            const int want = ((uint8_t *)a.g.lo)[rb_gt_slot(&a, idx)] != 0 && ((uint8_t *)b2.g.lo)[rb_gt_slot(&b2, i2)] != 0;
            RB_CHECK(ao[(idx[0] * L + idx[1]) * S + idx[2]] == want, "mask case %lld: and", (long long)n);
        } while (rb_index_next(3, sh, idx));
    int64_t empty = -1, first = -2;
    expect_ok(sdpa_mask_count_empty_rows(pma, &empty, &first), "count_empty_rows", n);
    {
        int64_t cnt = 0, f = -1, row = 0;
        for (int64_t bb = 0; bb < B; ++bb)
            for (int64_t i = 0; i < L; ++i, ++row) {
                int any = 0;
                for (int64_t j = 0; j < S; ++j) {
                    const int64_t ii[3] = {bb, i, j};
                    any |= ((uint8_t *)a.g.lo)[rb_gt_slot(&a, ii)] != 0;
                }
                if (!any) {
                    if (f < 0)
                        f = row;
                    ++cnt;
                }
            }
        RB_CHECK(empty == cnt && first == f, "mask case %lld: count_empty_rows %lld/%lld, expected %lld/%lld", (long long)n,
                 (long long)empty, (long long)first, (long long)cnt, (long long)f);
    }
    rb_gt_free(&a);
    rb_gt_free(&b2);
    for (int t = 0; t < 3; ++t)
        rb_guard_free(&gms[t]);
    /* converters: input and output each against a guard page */
    const int64_t cn = rb_int(r, 0, 40);
    rb_guard h[4] = {{0}};
    uint8_t *ig = (uint8_t *)rb_guard_alloc(&h[0], (size_t)cn, rb_chance(r, 60));
    int32_t *kp = (int32_t *)rb_guard_alloc(&h[1], (size_t)cn * 4, rb_chance(r, 60));
    float *ad = (float *)rb_guard_alloc(&h[2], (size_t)cn * 4, rb_chance(r, 60));
    uint8_t *co = (uint8_t *)rb_guard_alloc(&h[3], (size_t)cn, rb_chance(r, 60));
    for (int64_t t = 0; t < cn; ++t) {
        ig[t] = (uint8_t)(rb_chance(r, 50) * rb_int(r, 1, 255));
        kp[t] = (int32_t)rb_chance(r, 50);
        ad[t] = rb_chance(r, 50) ? 0.0f : -INFINITY;
    }
    expect_ok(sdpa_mask_from_ignore(ig, cn, co), "from_ignore", n);
    for (int64_t t = 0; t < cn; ++t)
        RB_CHECK(co[t] == (ig[t] == 0), "mask case %lld: from_ignore", (long long)n);
    expect_ok(sdpa_mask_from_keep_int(kp, cn, co), "from_keep_int", n);
    for (int64_t t = 0; t < cn; ++t)
        RB_CHECK(co[t] == (kp[t] != 0), "mask case %lld: from_keep_int", (long long)n);
    expect_ok(sdpa_mask_from_additive(ad, cn, NULL, co), "from_additive", n);
    for (int64_t t = 0; t < cn; ++t)
        RB_CHECK(co[t] == (ad[t] == 0.0f), "mask case %lld: from_additive", (long long)n);
    expect_ok(sdpa_mask_to_additive(co, cn, ad), "to_additive", n);
    for (int64_t t = 0; t < cn; ++t)
        RB_CHECK(co[t] ? ad[t] == 0.0f : ad[t] == -INFINITY, "mask case %lld: to_additive", (long long)n);
    expect_ok(sdpa_mask_from_ignore(ig, cn, ig), "from_ignore in place", n);
    for (int t = 0; t < 4; ++t)
        rb_guard_free(&h[t]);
    for (int t = 0; t < 8; ++t)
        rb_guard_free(&g[t]);
}

/* ----------------------------------------------------------------- main */

/* This architecture's SDPA_MAX_ISA names (README), lowest first; "amx" is AVX-512 with the AMX
 * column (the child's sdpa_request_amx()). */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
static const char *const ISAS[] = {"portable", "avx2", "avx512", "amx"};
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
static const char *const ISAS[] = {"portable", "neon"};
#else
static const char *const ISAS[] = {"portable"};
#endif
#define N_ISAS ((int)(sizeof ISAS / sizeof ISAS[0]))

/* Whether this CPU has the ISA (read here, independently of the library). Another
 * architecture's name: no; unset or another value (which caps nothing): yes. */
static int isa_available(const char *isa)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(isa, "avx512") == 0 || strcmp(isa, "amx") == 0)
        return __builtin_cpu_supports("avx512f");
    if (strcmp(isa, "neon") == 0)
        return 0;
#elif defined(__aarch64__) && defined(__linux__)
    if (strcmp(isa, "neon") == 0)
        return (getauxval(AT_HWCAP) & (1ul << 1)) != 0; /* HWCAP_ASIMD */
    if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0 || strcmp(isa, "amx") == 0)
        return 0;
#else
    if (strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0 || strcmp(isa, "amx") == 0 || strcmp(isa, "neon") == 0)
        return 0;
#endif
    return 1;
}

static int run_harness(int64_t cases, uint64_t seed);

/* One child per ISA (the library reads SDPA_MAX_ISA once per process, and this parent has not
 * called it). The child is a fork() of this process that sets SDPA_MAX_ISA and runs the
 * harness, not a new program image: under a user-mode emulator (qemu-aarch64-static in the
 * aarch64 CI job, without binfmt_misc) exec of the test binary is the host kernel's and fails
 * (the child exited 127), while fork() is emulated. */
static int run_all_isas(int argc, char **argv)
{
    int failed = 0, ran = 0;
    char not_run[64] = "";
    const int64_t cases = argc > 2 ? atoll(argv[2]) : 300;
    const uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1;
    for (int t = 0; t < N_ISAS; ++t) {
        if (!isa_available(ISAS[t])) {
            printf("test_guard: not run: %s (CPU lacks it)\n", ISAS[t]);
            strcat(not_run, " ");
            strcat(not_run, ISAS[t]);
            continue;
        }
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            if (setenv("SDPA_MAX_ISA", ISAS[t], 1) != 0) {
                perror("setenv");
                _exit(2);
            }
            const int rc = run_harness(cases, seed);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) {
            perror("waitpid");
            return 2;
        }
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
            strcat(not_run, " ");
            strcat(not_run, ISAS[t]);
            continue;
        }
        ++ran;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("test_guard: SDPA_MAX_ISA=%s FAILED (status 0x%x)\n", ISAS[t], status);
            failed = 1;
        }
    }
    printf("test_guard: %d ISA(s) run; not run:%s\n", ran, not_run[0] ? not_run : " none");
    return failed;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "all-isas") == 0)
        return run_all_isas(argc, argv);
    const int64_t cases = argc > 1 ? atoll(argv[1]) : 300;
    const uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    return run_harness(cases, seed);
}

/* The harness on the ISA SDPA_MAX_ISA names (0 passed, 1 failed, 77 not run). */
static int run_harness(int64_t cases, uint64_t seed)
{
    const char *isa = getenv("SDPA_MAX_ISA");
    if (isa == NULL)
        isa = "(uncapped)";
    if (!isa_available(isa)) {
        printf("test_guard: not run: this CPU lacks %s (SDPA_MAX_ISA=%s)\n", isa, isa);
        return 77;
    }
    if (strcmp(isa, "amx") == 0) { /* the application's opt-in; then half the serving cases are AMX's */
        if (sdpa_request_amx() != SDPA_OK) {
            printf("test_guard: not run: amx (%s)\n", sdpa_last_error_message());
            return 77;
        }
        g_sv_amx = 1;
    }
    rb_rng r = {seed * 0x9E3779B97F4A7C15ull + 7};
    rb_rng rs = {seed * 0x9E3779B97F4A7C15ull + 11};
    for (int64_t n = 0; n < cases; ++n) {
        attention_case(&r, n);
        serving_case(&rs, n);
        kv_write_case(&rs, n);
        if (n % 4 == 0)
            mha_case(&r, n);
        if (n % 3 == 0)
            merge_case(&r, n);
        if (n % 5 == 0)
            mask_case(&r, n);
    }
    printf("test_guard (SDPA_MAX_ISA=%s, seed %llu): %lld attention cases (%lld calls, %lld expected failures), "
           "%lld MHA calls, %lld merge calls, %lld mask builder/converter calls; kernels:%s; "
           "%lld serving cases (%lld calls; %lld paged, %lld packed, %lld f16, %lld bf16; %lld forced kernels unsupported); "
           "%lld kv_write calls; %d failures\n",
           isa, (unsigned long long)seed, (long long)cases, (long long)g_calls, (long long)g_failed_calls,
           (long long)g_mha_calls, (long long)g_merge_calls, (long long)g_mask_calls, g_kernels, (long long)g_sv_cases,
           (long long)g_sv_calls, (long long)g_sv_paged, (long long)g_sv_packed, (long long)g_sv_f16, (long long)g_sv_bf16,
           (long long)g_sv_unsupported, (long long)g_kvw_calls, rb_failures);
    if (g_sv_amx) {
        printf("test_guard (SDPA_MAX_ISA=amx): %lld serving calls ran tiled-amx-bf16\n", (long long)g_sv_amx_calls);
        if (g_sv_amx_calls == 0 && cases > 0) {
            printf("test_guard: FAILED: AMX was granted but no call ran the AMX column\n");
            return 1;
        }
    }
    return rb_failures ? 1 : 0;
}
