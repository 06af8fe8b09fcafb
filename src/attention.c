/* sdpa_attention: validate -> plan -> check values -> run a kernel.
 * Nothing is written to an output before every check has passed. */
#include "internal.h"
#include "microkernel.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char FN[] = "sdpa_attention";

/* The v1 layout ends with workspace_bytes; struct_size may not be smaller. */
#define SDPA__OPTIONS_V1_SIZE (offsetof(sdpa_options, workspace_bytes) + sizeof(size_t))
#define SDPA__STRUCT_SIZE_MAX 4096
/* Bounds that keep position arithmetic (offset + i +- window) inside int64_t: offsets are
 * limited to 2^61, and a window wider than 2^62 is unbounded (|p - j| < 2^62 always). */
#define SDPA__MAX_OFFSET ((int64_t)1 << 61)
#define SDPA__MAX_WINDOW ((int64_t)1 << 62)

SDPA_API void sdpa_options_init_sized(sdpa_options *options, size_t struct_size) {
    if (options == NULL || struct_size < sizeof(size_t))
        return;
    sdpa_options d;
    memset(&d, 0, sizeof d);
    d.struct_size = struct_size;
    d.alignment = SDPA_ALIGN_TOP_LEFT;
    d.window_left = -1;
    d.window_right = -1;
    d.empty_rows = SDPA_EMPTY_ROWS_ERROR;
    d.weights_stage = SDPA_WEIGHTS_PROBABILITIES;
    const size_t n = struct_size < sizeof d ? struct_size : sizeof d;
    memcpy(options, &d, n);
    if (struct_size > n)
        memset((unsigned char *)options + n, 0, struct_size - n);
}

/* Copy the caller's options (of the caller's struct_size) into a full local struct. */
static sdpa_status read_options(const sdpa_options *in, sdpa_options *o) {
    sdpa_options_init_sized(o, sizeof *o);
    if (in == NULL)
        return SDPA_OK;
    if (in->struct_size < SDPA__OPTIONS_V1_SIZE)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                          "%s: options->struct_size=%zu is smaller than the version-1 size %zu (call sdpa_options_init())",
                          FN, in->struct_size, (size_t)SDPA__OPTIONS_V1_SIZE);
    if (in->struct_size > SDPA__STRUCT_SIZE_MAX)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION, "%s: options->struct_size=%zu is larger than %d", FN,
                          in->struct_size, SDPA__STRUCT_SIZE_MAX);
    size_t n = in->struct_size < sizeof *o ? in->struct_size : sizeof *o;
    memcpy(o, in, n);
    const unsigned char *tail = (const unsigned char *)in;
    for (size_t b = sizeof *o; b < in->struct_size; ++b)
        if (tail[b] != 0)
            return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                              "%s: options byte %zu is beyond what libsdpa %s knows (%zu bytes) and is not 0",
                              FN, b, SDPA_VERSION_STRING, sizeof *o);
    return SDPA_OK;
}

/* The user-visible axis index of logical axis d4 (0 B, 1 H, 2 L/S, 3 E) for a view of `rank`. */
static int user_axis(int32_t rank, int d4) { return rank == 4 ? d4 : (d4 == 0 ? 0 : d4 - 1); }

static sdpa__view4 to_view4(const sdpa_tensor *t) {
    sdpa__view4 v;
    v.data = (float *)t->data;
    if (t->rank == 4) {
        for (int d = 0; d < 4; ++d) {
            v.shape[d] = t->shape[d];
            v.strides[d] = t->strides[d];
        }
    } else { /* rank 3: [B, L, E] -> [B, 1, L, E] */
        v.shape[0] = t->shape[0]; v.strides[0] = t->strides[0];
        v.shape[1] = 1;           v.strides[1] = 0;
        v.shape[2] = t->shape[1]; v.strides[2] = t->strides[1];
        v.shape[3] = t->shape[2]; v.strides[3] = t->strides[2];
    }
    return v;
}

static sdpa_status expect_dim(const sdpa_tensor *t, const char *name, int d4, int64_t want,
                              const char *ref_name, int ref_d4, int32_t ref_rank) {
    sdpa__view4 v = to_view4(t);
    if (v.shape[d4] == want)
        return SDPA_OK;
    return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld does not match %s.shape[%d]=%lld", FN, name,
                      user_axis(t->rank, d4), (long long)v.shape[d4], ref_name, user_axis(ref_rank, ref_d4),
                      (long long)want);
}

/* Check an output view against its expected logical shape (rank of q, or q's rank - 1 for lse). */
static sdpa_status check_output(const sdpa_tensor *t, const char *name, int32_t rank,
                                const int64_t *want, const char *const *dims) {
    sdpa_status st = sdpa__check_tensor(t, FN, name, rank, rank);
    if (st != SDPA_OK)
        return st;
    for (int32_t d = 0; d < rank; ++d)
        if (t->shape[d] != want[d])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld, expected %s=%lld", FN, name, (int)d,
                              (long long)t->shape[d], dims[d], (long long)want[d]);
    return sdpa__check_output_layout(t, FN, name);
}

static sdpa_status check_lengths(const int64_t *len, int64_t B, int64_t max, const char *name,
                                 const char *bound) {
    if (len == NULL)
        return SDPA_OK;
    for (int64_t b = 0; b < B; ++b)
        if (len[b] < 0 || len[b] > max)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->%s[%lld]=%lld is outside [0, %s=%lld]",
                              FN, name, (long long)b, (long long)len[b], bound, (long long)max);
    return SDPA_OK;
}

/* Validate everything that does not depend on tensor values and fill the plan.
 * Outputs may be NULL only when `for_size` (workspace-size query). */
static sdpa_status make_plan(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                             const sdpa_options *opt_in, const sdpa_tensor *out, const sdpa_tensor *weights,
                             const sdpa_tensor *lse, bool for_size, sdpa__plan *p, sdpa_options *o) {
    sdpa_status st;
    if (q == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: query is NULL", FN);
    if (k == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key is NULL", FN);
    if (v == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: value is NULL", FN);
    if (!for_size && out == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", FN);
    if ((st = sdpa__check_tensor(q, FN, "query", 3, 4)) != SDPA_OK) return st;
    if ((st = sdpa__check_tensor(k, FN, "key", 3, 4)) != SDPA_OK) return st;
    if ((st = sdpa__check_tensor(v, FN, "value", 3, 4)) != SDPA_OK) return st;
    if (k->rank != q->rank || v->rank != q->rank)
        return sdpa__fail(SDPA_ERR_RANK, "%s: query.rank=%d, key.rank=%d, value.rank=%d must be equal", FN,
                          (int)q->rank, (int)k->rank, (int)v->rank);
    const int32_t rank = q->rank;
    memset(p, 0, sizeof *p);
    p->q = to_view4(q);
    p->k = to_view4(k);
    p->v = to_view4(v);
    p->B = p->q.shape[0];
    p->Hq = p->q.shape[1];
    p->L = p->q.shape[2];
    p->E = p->q.shape[3];
    p->Hkv = p->k.shape[1];
    p->S = p->k.shape[2];
    p->Ev = p->v.shape[3];
    if ((st = expect_dim(k, "key", 0, p->B, "query", 0, rank)) != SDPA_OK) return st;
    if ((st = expect_dim(v, "value", 0, p->B, "query", 0, rank)) != SDPA_OK) return st;
    if ((st = expect_dim(v, "value", 1, p->Hkv, "key", 1, rank)) != SDPA_OK) return st;
    if ((st = expect_dim(v, "value", 2, p->S, "key", 2, rank)) != SDPA_OK) return st;
    if ((st = expect_dim(k, "key", 3, p->E, "query", 3, rank)) != SDPA_OK) return st;
    if (p->Hkv == 0 ? p->Hq != 0 : p->Hq % p->Hkv != 0)
        return sdpa__fail(SDPA_ERR_SHAPE,
                          "%s: query heads Hq=query.shape[1]=%lld is not a multiple of key heads Hkv=key.shape[1]=%lld",
                          FN, (long long)p->Hq, (long long)p->Hkv);
    p->group = p->Hkv == 0 ? 1 : p->Hq / p->Hkv;
    if (p->L > INT32_MAX || p->S > INT32_MAX || p->E > INT32_MAX || p->Ev > INT32_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: L=%lld, S=%lld, E=%lld, Ev=%lld must each fit in 32 bits (libsdpa indexes key positions, rows and widths with 32-bit integers on every path)",
                          FN, (long long)p->L, (long long)p->S, (long long)p->E, (long long)p->Ev);
    if (p->E == 0)
        return sdpa__fail(SDPA_ERR_EMPTY_DIMENSION, "%s: head width E=query.shape[%d]=0 (the default scale 1/sqrt(E) is undefined)",
                          FN, rank - 1);

    if ((st = read_options(opt_in, o)) != SDPA_OK) return st;

    /* Outputs. */
    if (!for_size) {
        static const char *const d4[] = {"B", "Hq", "L", "Ev"}, *const d3[] = {"B", "L", "Ev"};
        static const char *const w4[] = {"B", "Hq", "L", "S"}, *const w3[] = {"B", "L", "S"};
        static const char *const l3[] = {"B", "Hq", "L"}, *const l2[] = {"B", "L"};
        int64_t want_out[4], want_w[4], want_l[3];
        if (rank == 4) {
            int64_t a[4] = {p->B, p->Hq, p->L, p->Ev}, b[4] = {p->B, p->Hq, p->L, p->S}, c[3] = {p->B, p->Hq, p->L};
            memcpy(want_out, a, sizeof a); memcpy(want_w, b, sizeof b); memcpy(want_l, c, sizeof c);
        } else {
            int64_t a[3] = {p->B, p->L, p->Ev}, b[3] = {p->B, p->L, p->S}, c[2] = {p->B, p->L};
            memcpy(want_out, a, sizeof a); memcpy(want_w, b, sizeof b); memcpy(want_l, c, sizeof c);
        }
        if ((st = check_output(out, "out", rank, want_out, rank == 4 ? d4 : d3)) != SDPA_OK) return st;
        p->out = to_view4(out);
        if (weights != NULL) {
            if ((st = check_output(weights, "weights", rank, want_w, rank == 4 ? w4 : w3)) != SDPA_OK) return st;
            p->has_weights = true;
            p->weights = to_view4(weights);
        }
        if (lse != NULL) {
            if ((st = check_output(lse, "lse", rank - 1, want_l, rank == 4 ? l3 : l2)) != SDPA_OK) return st;
            p->has_lse = true;
            p->lse = (float *)lse->data;
            if (rank == 4) {
                p->lse_strides[0] = lse->strides[0]; p->lse_strides[1] = lse->strides[1]; p->lse_strides[2] = lse->strides[2];
            } else {
                p->lse_strides[0] = lse->strides[0]; p->lse_strides[1] = 0; p->lse_strides[2] = lse->strides[1];
            }
        }
    }

    /* Scalars and enums. */
    if (!(o->scale >= 0.0f) || isinf(o->scale))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->scale=%g must be finite and >= 0 (0 = 1/sqrt(E))",
                          FN, (double)o->scale);
    if (!(o->softcap >= 0.0f) || isinf(o->softcap))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->softcap=%g must be finite and >= 0 (0 = off)", FN,
                          (double)o->softcap);
    if (o->causal != 0 && o->causal != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->causal=%d must be 0 or 1", FN, (int)o->causal);
    if (o->alignment != SDPA_ALIGN_TOP_LEFT && o->alignment != SDPA_ALIGN_BOTTOM_RIGHT &&
        o->alignment != SDPA_ALIGN_OFFSETS)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->alignment=%d is not an sdpa_alignment", FN,
                          (int)o->alignment);
    if (o->window_left < -1 || o->window_right < -1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->window_left=%lld, window_right=%lld must be >= -1",
                          FN, (long long)o->window_left, (long long)o->window_right);
    if (o->empty_rows != SDPA_EMPTY_ROWS_ERROR && o->empty_rows != SDPA_EMPTY_ROWS_ZERO)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->empty_rows=%d is not an sdpa_empty_rows", FN,
                          (int)o->empty_rows);
    if (o->weights_stage < SDPA_WEIGHTS_PROBABILITIES || o->weights_stage > SDPA_WEIGHTS_MASKED)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->weights_stage=%d is not an sdpa_weights_stage", FN,
                          (int)o->weights_stage);
    if (o->num_threads < 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->num_threads=%d must be >= 0", FN, (int)o->num_threads);
    if (o->sliding_window != 0 && o->sliding_window != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->sliding_window=%d must be 0 or 1", FN,
                          (int)o->sliding_window);
    if (o->skip_finite_check != 0 && o->skip_finite_check != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->skip_finite_check=%d must be 0 or 1", FN,
                          (int)o->skip_finite_check);
    if (!(o->dropout_p >= 0.0f && o->dropout_p < 1.0f))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->dropout_p=%g must be in [0, 1)", FN,
                          (double)o->dropout_p);
    if (o->kernel < SDPA_KERNEL_AUTO || o->kernel > SDPA_KERNEL_DECODE)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->kernel=%d is not an sdpa_kernel", FN, (int)o->kernel);
    if (o->reserved0 != 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->reserved0=%d must be 0", FN, (int)o->reserved0);
    if (o->alignment == SDPA_ALIGN_OFFSETS) {
        if (o->query_offsets == NULL && p->B > 0)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: options->alignment is SDPA_ALIGN_OFFSETS but query_offsets is NULL", FN);
        for (int64_t b = 0; b < p->B; ++b)
            if (o->query_offsets[b] < -SDPA__MAX_OFFSET || o->query_offsets[b] > SDPA__MAX_OFFSET)
                return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->query_offsets[%lld]=%lld is out of range", FN,
                                  (long long)b, (long long)o->query_offsets[b]);
    }
    if ((st = check_lengths(o->key_lengths, p->B, p->S, "key_lengths", "S")) != SDPA_OK) return st;
    if ((st = check_lengths(o->query_lengths, p->B, p->L, "query_lengths", "L")) != SDPA_OK) return st;

    const int64_t target[4] = {p->B, p->Hq, p->L, p->S};
    if (o->allow_mask != NULL) {
        const sdpa_allow_mask *m = o->allow_mask;
        if ((st = sdpa__check_mask(FN, "allow_mask", m)) != SDPA_OK) return st;
        if ((st = sdpa__broadcast4(FN, "allow_mask", m->rank, m->shape, m->strides, target, p->mask.strides)) != SDPA_OK)
            return st;
        int64_t numel = 1;
        for (int32_t d = 0; d < m->rank; ++d) numel *= m->shape[d];
        p->has_mask = numel > 0;
        p->mask.data = m->data;
    }
    if (o->bias != NULL) {
        const sdpa_tensor *bt = o->bias;
        if ((st = sdpa__check_tensor(bt, FN, "bias", 1, 4)) != SDPA_OK) return st;
        if ((st = sdpa__broadcast4(FN, "bias", bt->rank, bt->shape, bt->strides, target, p->bias.strides)) != SDPA_OK)
            return st;
        int64_t numel = 1;
        for (int32_t d = 0; d < bt->rank; ++d) numel *= bt->shape[d];
        p->has_bias = numel > 0;
        p->bias.data = bt->data;
    }

    /* Outputs must not overlap inputs or each other. */
    if (!for_size) {
        struct { const char *name; sdpa__span s; } in[8], outs[4];
        int nin = 0, nout = 0;
        in[nin].name = "query"; in[nin++].s = sdpa__tensor_span(q);
        in[nin].name = "key"; in[nin++].s = sdpa__tensor_span(k);
        in[nin].name = "value"; in[nin++].s = sdpa__tensor_span(v);
        if (o->bias) { in[nin].name = "bias"; in[nin++].s = sdpa__tensor_span(o->bias); }
        if (o->allow_mask) { in[nin].name = "allow_mask"; in[nin++].s = sdpa__mask_span(o->allow_mask); }
        if (o->key_lengths && p->B > 0) {
            in[nin].name = "key_lengths";
            in[nin].s.lo = (uintptr_t)o->key_lengths;
            in[nin++].s.hi = (uintptr_t)(o->key_lengths + p->B);
        }
        if (o->query_lengths && p->B > 0) {
            in[nin].name = "query_lengths";
            in[nin].s.lo = (uintptr_t)o->query_lengths;
            in[nin++].s.hi = (uintptr_t)(o->query_lengths + p->B);
        }
        if (o->alignment == SDPA_ALIGN_OFFSETS && p->B > 0) {
            in[nin].name = "query_offsets";
            in[nin].s.lo = (uintptr_t)o->query_offsets;
            in[nin++].s.hi = (uintptr_t)(o->query_offsets + p->B);
        }
        outs[nout].name = "out"; outs[nout++].s = sdpa__tensor_span(out);
        if (weights) { outs[nout].name = "weights"; outs[nout++].s = sdpa__tensor_span(weights); }
        if (lse) { outs[nout].name = "lse"; outs[nout++].s = sdpa__tensor_span(lse); }
        if (o->workspace && o->workspace_bytes > 0) { /* written too: checked like an output */
            outs[nout].name = "workspace";
            outs[nout].s.lo = (uintptr_t)o->workspace;
            outs[nout++].s.hi = (uintptr_t)o->workspace + o->workspace_bytes;
        }
        for (int a = 0; a < nout; ++a) {
            for (int b = 0; b < nin; ++b)
                if (sdpa__spans_overlap(outs[a].s, in[b].s))
                    return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s (written) overlaps input %s", FN, outs[a].name, in[b].name);
            for (int b = a + 1; b < nout; ++b)
                if (sdpa__spans_overlap(outs[a].s, outs[b].s))
                    return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s overlaps %s (both written)", FN, outs[a].name,
                                      outs[b].name);
        }
    }

    p->scale = o->scale > 0.0f ? o->scale : (float)(1.0 / sqrt((double)p->E));
    p->softcap = o->softcap;
    p->causal = o->causal;
    p->alignment = o->alignment;
    p->query_offsets = o->query_offsets;
    /* Without sliding_window both sides are unbounded; windows beyond 2^62 are too. */
    p->window_left = !o->sliding_window || o->window_left > SDPA__MAX_WINDOW ? -1 : o->window_left;
    p->window_right = !o->sliding_window || o->window_right > SDPA__MAX_WINDOW ? -1 : o->window_right;
    p->key_lengths = o->key_lengths;
    p->query_lengths = o->query_lengths;
    p->empty_rows = o->empty_rows;
    p->weights_stage = o->weights_stage;
    p->check_finite = o->skip_finite_check == 0;
    p->num_threads = o->num_threads > 0 ? o->num_threads : sdpa__online_cpus();
    p->kernel = o->kernel;
    p->dropout_p = o->dropout_p;
    p->dropout_seed = o->dropout_seed;
    p->dropout_offset = o->dropout_offset;
    p->row_block = p->L < 64 ? (p->L > 0 ? p->L : 1) : 64;
    return SDPA_OK;
}

void sdpa__row_range(const sdpa__plan *p, int64_t b, int64_t i, int64_t *lo_out, int64_t *hi_out) {
    int64_t Sb = p->key_lengths ? p->key_lengths[b] : p->S;
    int64_t lo = 0, hi = Sb;
    if (p->causal || p->window_left >= 0 || p->window_right >= 0) {
        int64_t pos = i;
        if (p->alignment == SDPA_ALIGN_BOTTOM_RIGHT)
            pos = i + Sb - (p->query_lengths ? p->query_lengths[b] : p->L);
        else if (p->alignment == SDPA_ALIGN_OFFSETS)
            pos = i + p->query_offsets[b];
        if (p->causal && pos + 1 < hi)
            hi = pos + 1;
        if (p->window_right >= 0 && pos + p->window_right + 1 < hi)
            hi = pos + p->window_right + 1;
        if (p->window_left >= 0 && pos - p->window_left > lo)
            lo = pos - p->window_left;
    }
    if (hi < lo)
        hi = lo;
    *lo_out = lo;
    *hi_out = hi;
}

/* ---- value checks (before any write): empty rows under policy ERROR, and the finite check ----
 * One task per (b, kv head g), in parallel; each task looks for its first failure in the
 * sequential order (rows of the group's heads, then its K/V rows), and the failure of the lowest
 * task wins, so the status and message are those of a sequential scan whatever the threads. */

enum { ERR_NONE = 0, ERR_BIAS, ERR_QROW, ERR_EMPTY, ERR_KROW, ERR_VROW };

typedef struct check_err {
    int kind;
    int64_t task, b, h, i, j;
    float value;
} check_err;

typedef struct check_ctx {
    const sdpa__plan *p;
    const sdpa__mk *mk;
    bool need_empty, check_kv;
    unsigned char *ws;
    size_t per_thread;
    atomic_llong first_bad; /* lowest failing task so far: later tasks cannot be first */
} check_ctx;

/* Per thread: the first failure it met (its tasks come in increasing order), then S + 1 int32. */
static size_t check_per_thread(const sdpa__plan *p) {
    return sdpa__add_sat(sdpa__align64(sizeof(check_err)),
                         sdpa__align64(sdpa__mul_sat((size_t)p->S + 1, sizeof(int32_t))));
}

static bool check_task_body(const check_ctx *c, int64_t b, int64_t g, int32_t *cnt, check_err *e) {
    const sdpa__plan *p = c->p;
    const bool fin = p->check_finite, kv = fin && c->check_kv;
    const bool plain = !p->has_mask && !p->has_bias;
    uint8_t *used = (uint8_t *)cnt; /* with a mask or bias: S flags */
    if (kv)
        memset(cnt, 0, plain ? (size_t)(p->S + 1) * sizeof(int32_t) : (size_t)p->S);
    for (int64_t h = g * p->group; h < (g + 1) * p->group; ++h) {
        for (int64_t i = 0; i < p->L; ++i) {
            if (sdpa__row_is_padding(p, b, i))
                continue;
            int64_t lo, hi;
            sdpa__row_range(p, b, i, &lo, &hi);
            bool any = false;
            if (plain) {
                any = lo < hi;
                if (kv && any && h == g * p->group) { /* the range does not depend on h */
                    cnt[lo]++;
                    cnt[hi]--;
                }
            } else {
                const float *brow = p->has_bias ? sdpa__bias_row(p, b, h, i) : NULL;
                for (int64_t j = lo; j < hi; ++j) {
                    if (p->has_mask && !sdpa__mask_allows(p, b, h, i, j))
                        continue;
                    if (brow) {
                        const float bv = brow[j * p->bias.strides[3]];
                        if (bv == -INFINITY)
                            continue;
                        if (fin && !isfinite(bv)) {
                            e->kind = ERR_BIAS; e->h = h; e->i = i; e->j = j; e->value = bv;
                            return false;
                        }
                    }
                    any = true;
                    if (!kv) {
                        if (!fin || !p->has_bias)
                            break; /* later entries matter only for the bias check or K/V rows */
                        continue;
                    }
                    used[j] = 1;
                }
            }
            /* A query row with no allowed key is never read, so it is not inspected. */
            if (any && fin &&
                !sdpa__finite_strided(c->mk, p->q.data + b * p->q.strides[0] + h * p->q.strides[1] + i * p->q.strides[2],
                                      p->E, p->q.strides[3])) {
                e->kind = ERR_QROW; e->h = h; e->i = i;
                return false;
            }
            if (!any && c->need_empty) {
                e->kind = ERR_EMPTY; e->h = h; e->i = i;
                return false;
            }
        }
    }
    if (!kv)
        return true;
    int32_t run = 0;
    for (int64_t j = 0; j < p->S; ++j) {
        bool u;
        if (plain) {
            run += cnt[j];
            u = run > 0;
        } else {
            u = used[j] != 0;
        }
        if (!u)
            continue;
        if (!sdpa__finite_strided(c->mk, p->k.data + b * p->k.strides[0] + g * p->k.strides[1] + j * p->k.strides[2],
                                  p->E, p->k.strides[3])) {
            e->kind = ERR_KROW; e->h = g; e->j = j;
            return false;
        }
        if (p->Ev > 0 &&
            !sdpa__finite_strided(c->mk, p->v.data + b * p->v.strides[0] + g * p->v.strides[1] + j * p->v.strides[2],
                                  p->Ev, p->v.strides[3])) {
            e->kind = ERR_VROW; e->h = g; e->j = j;
            return false;
        }
    }
    return true;
}

static void check_task(void *vctx, int64_t task, int tid) {
    check_ctx *c = (check_ctx *)vctx;
    unsigned char *ws = c->ws + (size_t)tid * c->per_thread;
    check_err *mine = (check_err *)ws;
    if (mine->kind != ERR_NONE || task > (int64_t)atomic_load_explicit(&c->first_bad, memory_order_relaxed))
        return;
    check_err e;
    memset(&e, 0, sizeof e);
    const int64_t b = task / c->p->Hkv, g = task % c->p->Hkv;
    if (check_task_body(c, b, g, (int32_t *)(ws + sdpa__align64(sizeof(check_err))), &e))
        return;
    e.task = task;
    e.b = b;
    *mine = e;
    long long cur = atomic_load_explicit(&c->first_bad, memory_order_relaxed);
    while (task < cur && !atomic_compare_exchange_weak_explicit(&c->first_bad, &cur, task, memory_order_relaxed,
                                                                 memory_order_relaxed)) {
    }
}

static sdpa_status check_run(const sdpa__plan *p, const sdpa__mk *mk, int threads, bool check_kv, void *ws) {
    const bool need_empty = p->empty_rows == SDPA_EMPTY_ROWS_ERROR;
    if (!need_empty && !p->check_finite)
        return SDPA_OK;
    check_ctx c;
    c.p = p;
    c.mk = mk;
    c.need_empty = need_empty;
    c.check_kv = check_kv;
    c.ws = (unsigned char *)ws;
    c.per_thread = check_per_thread(p);
    const int64_t ntasks = p->B * p->Hkv;
    atomic_init(&c.first_bad, (long long)ntasks);
    if ((int64_t)threads > ntasks)
        threads = (int)ntasks;
    for (int t = 0; t < threads; ++t)
        ((check_err *)(c.ws + (size_t)t * c.per_thread))->kind = ERR_NONE;
    sdpa__parallel_for(threads, ntasks, check_task, &c);
    const check_err *e = NULL;
    for (int t = 0; t < threads; ++t) {
        const check_err *x = (const check_err *)(c.ws + (size_t)t * c.per_thread);
        if (x->kind != ERR_NONE && (e == NULL || x->task < e->task))
            e = x;
    }
    if (e == NULL)
        return SDPA_OK;
    const long long b = (long long)e->b, h = (long long)e->h, i = (long long)e->i, j = (long long)e->j;
    switch (e->kind) {
    case ERR_BIAS:
        return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: bias at (b=%lld,h=%lld,i=%lld,j=%lld) is %s on an allowed pair", FN,
                          b, h, i, j, isnan(e->value) ? "NaN" : "+Inf");
    case ERR_QROW:
        return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: query row (b=%lld,h=%lld,i=%lld) holds NaN or Inf", FN, b, h, i);
    case ERR_EMPTY:
        return sdpa__fail(SDPA_ERR_EMPTY_ROW,
                          "%s: query row (b=%lld,h=%lld,i=%lld) has no allowed key (use SDPA_EMPTY_ROWS_ZERO to get a zero row)",
                          FN, b, h, i);
    case ERR_KROW:
        return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: key row (b=%lld,h=%lld,j=%lld) holds NaN or Inf and is attended", FN,
                          b, h, j);
    default:
        return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: value row (b=%lld,h=%lld,j=%lld) holds NaN or Inf and is attended",
                          FN, b, h, j);
    }
}

/* Value checks; without check_kv the K/V rows are left to the kernel (decode), and a failure is
 * re-derived with them so that the first failure in sequential order is the one reported. */
static sdpa_status check_values(const sdpa__plan *p, const sdpa__mk *mk, int threads, bool check_kv, void *ws) {
    sdpa_status st = check_run(p, mk, threads, check_kv, ws);
    if (st != SDPA_OK && !check_kv && p->check_finite)
        st = check_run(p, mk, threads, true, ws);
    return st;
}

/* ---- kernel choice and workspace ---- */

#define SDPA__WS_ALIGN_SLACK 64u
#define SDPA__DECODE_AUTO_MAX_L 4

typedef struct exec {
    int kernel;         /* SDPA_KERNEL_REFERENCE, _TILED or _DECODE */
    int threads;        /* kernel threads (the reference kernel runs on the calling thread) */
    int check_threads;  /* threads of the value checks */
    size_t bytes;       /* workspace for the checks and the kernel (they run one after the other) */
} exec;

static const char *kernel_name(int k) {
    return k == SDPA_KERNEL_TILED ? "SDPA_KERNEL_TILED" : k == SDPA_KERNEL_DECODE ? "SDPA_KERNEL_DECODE"
                                                                                 : "SDPA_KERNEL_REFERENCE";
}

/* AUTO: reference when weights are requested (they need the whole probability row), decode for
 * L <= 4, tiled otherwise. A forced tiled or decode kernel cannot produce weights. */
static sdpa_status choose(const char *fn, const sdpa__plan *p, exec *x) {
    int k = p->kernel;
    if (p->has_weights && (k == SDPA_KERNEL_TILED || k == SDPA_KERNEL_DECODE))
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: options->kernel=%s does not produce weights; pass weights=NULL, or use SDPA_KERNEL_AUTO or SDPA_KERNEL_REFERENCE",
                          fn, kernel_name(k));
    if (k == SDPA_KERNEL_AUTO)
        k = p->has_weights ? SDPA_KERNEL_REFERENCE : p->L <= SDPA__DECODE_AUTO_MAX_L ? SDPA_KERNEL_DECODE : SDPA_KERNEL_TILED;
    x->kernel = k;
    size_t kb;
    if (k == SDPA_KERNEL_TILED) {
        x->threads = sdpa__tiled_threads(p);
        kb = sdpa__tiled_workspace_bytes(p, x->threads);
    } else if (k == SDPA_KERNEL_DECODE) {
        x->threads = sdpa__decode_threads(p);
        kb = sdpa__decode_workspace_bytes(p, x->threads);
    } else {
        x->threads = 1;
        kb = sdpa__reference_workspace_bytes(p);
    }
    /* The checks scan q, K, V (and mask/bias rows): about 2 MB per thread at least. */
    int ct = k == SDPA_KERNEL_REFERENCE ? sdpa__tiled_threads(p) : x->threads;
    double scan = 4.0 * (double)p->B * ((double)p->Hq * (double)p->L * (double)p->E +
                                        (double)p->Hkv * (double)p->S * (double)(p->E + p->Ev));
    if (p->has_mask || p->has_bias)
        scan += (double)p->B * (double)p->Hq * (double)p->L * (double)p->S;
    if ((double)ct > scan / 2e6)
        ct = (int)(scan / 2e6);
    if ((int64_t)ct > p->B * p->Hkv)
        ct = (int)(p->B * p->Hkv);
    x->check_threads = ct < 1 ? 1 : ct;
    const size_t cb = sdpa__mul_sat(check_per_thread(p), (size_t)x->check_threads);
    x->bytes = sdpa__add_sat(kb > cb ? kb : cb, SDPA__WS_ALIGN_SLACK);
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_attention_workspace_size(const sdpa_tensor *q, const sdpa_tensor *k,
                                                   const sdpa_tensor *v, const sdpa_options *options,
                                                   int weights_requested, size_t *bytes) {
    static const char fn[] = "sdpa_attention_workspace_size";
    sdpa__plan p;
    sdpa_options o;
    exec x = {0, 0, 0, 0};
    sdpa__clear_error();
    if (bytes == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    sdpa_status st = make_plan(q, k, v, options, NULL, NULL, NULL, true, &p, &o);
    if (st != SDPA_OK)
        return st;
    p.has_weights = weights_requested != 0;
    if ((st = choose(fn, &p, &x)) != SDPA_OK)
        return st;
    if (x.bytes == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
    *bytes = x.bytes;
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_attention(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                    const sdpa_options *options, const sdpa_tensor *out,
                                    const sdpa_tensor *weights, const sdpa_tensor *lse) {
    sdpa__plan p;
    sdpa_options o;
    exec x = {0, 0, 0, 0};
    sdpa__clear_error();
    sdpa_status st = make_plan(q, k, v, options, out, weights, lse, false, &p, &o);
    if (st != SDPA_OK)
        return st;
    if ((st = choose(FN, &p, &x)) != SDPA_OK)
        return st;
    size_t need = x.bytes;
    if (need == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", FN);
    if (o.workspace != NULL && o.workspace_bytes < need)
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_attention_workspace_size())",
                          FN, o.workspace_bytes, need);
    if (p.B == 0 || p.Hq == 0 || p.L == 0) { /* no query row: nothing to check or write */
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    void *ws = o.workspace, *owned = NULL;
    if (ws == NULL) {
        owned = ws = malloc(need);
        if (ws == NULL)
            return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of workspace", FN, need);
    }
    /* Any caller alignment is accepted: the size includes 64 bytes of slack to round up. */
    ws = (void *)(((uintptr_t)ws + 63u) & ~(uintptr_t)63u);
    need -= SDPA__WS_ALIGN_SLACK;
    const sdpa__mk *mk = sdpa__mk_select();
    /* The decode kernel checks the K/V rows it streams itself (no second pass over the cache). */
    const bool kv_in_kernel = x.kernel == SDPA_KERNEL_DECODE && p.check_finite;
    st = check_values(&p, mk, x.check_threads, !kv_in_kernel, ws);
    if (st == SDPA_OK) {
        if (x.kernel == SDPA_KERNEL_TILED) {
            st = sdpa__kernel_tiled(&p, mk, x.threads, ws, need);
        } else if (x.kernel == SDPA_KERNEL_DECODE) {
            st = sdpa__kernel_decode(&p, mk, x.threads, kv_in_kernel, ws, need);
            if (st == SDPA_ERR_NON_FINITE) { /* name the first failure, as the full scan would */
                st = check_values(&p, mk, x.check_threads, true, ws);
                if (st == SDPA_OK)
                    st = sdpa__kernel_decode(&p, mk, x.threads, false, ws, need);
            }
        } else {
            st = sdpa__kernel_reference(&p, ws, need);
        }
    }
    free(owned);
    return st;
}
