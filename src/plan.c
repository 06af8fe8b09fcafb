/* sdpa__plan_make: validated shapes, views and rules of an sdpa_attention call (everything that
 * does not depend on tensor values); no kernel knowledge. */
#include "internal.h"
#include "load.h"
#include "convert.h"

#include <math.h>
#include <string.h>

/* Bounds that keep position arithmetic (offset + i +- window) inside int64_t: offsets are
 * limited to 2^61, and a window wider than 2^62 is unbounded (|p - j| < 2^62 always). */
#define SDPA__MAX_OFFSET ((int64_t)1 << 61)
#define SDPA__MAX_WINDOW ((int64_t)1 << 62)

/* The user-visible axis index of logical axis d4 (0 B, 1 H, 2 L/S, 3 E) for a view of `rank`. */
static int user_axis(int32_t rank, int d4) { return rank == 4 ? d4 : (d4 == 0 ? 0 : d4 - 1); }

static sdpa__view4 to_view4(const sdpa_tensor *t) {
    sdpa__view4 v;
    memset(&v, 0, sizeof v);
    v.data = (float *)t->data;
    v.dtype = (int32_t)t->dtype;
    v.cv = NULL;
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

static sdpa_status expect_dim(const char *fn, const sdpa_tensor *t, const char *name, int d4, int64_t want,
                              const char *ref_name, int ref_d4, int32_t ref_rank) {
    sdpa__view4 v = to_view4(t);
    if (v.shape[d4] == want)
        return SDPA_OK;
    return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld does not match %s.shape[%d]=%lld", fn, name,
                      user_axis(t->rank, d4), (long long)v.shape[d4], ref_name, user_axis(ref_rank, ref_d4),
                      (long long)want);
}

/* q, k, v, out and bias may each be f32, f16 or bf16 (0.4); weights and lse are f32; 0.6: k and
 * v also the 8-bit cache dtypes (dtypes SDPA__DTYPES_KV). */
static sdpa_status check_input(const char *fn, const sdpa_tensor *t, const char *name, int32_t rank_min, int32_t rank_max,
                               unsigned dtypes) {
    sdpa_status st = sdpa__check_view(t, fn, name, rank_min, rank_max);
    return st != SDPA_OK ? st : sdpa__check_dtype_supported(t, fn, name, dtypes);
}

/* Check an output view against its expected logical shape (rank of q, or q's rank - 1 for lse). */
static sdpa_status check_output(const char *fn, const sdpa_tensor *t, const char *name, int32_t rank,
                                const int64_t *want, const char *const *dims, unsigned dtypes) {
    sdpa_status st = sdpa__check_view(t, fn, name, rank, rank);
    if (st != SDPA_OK)
        return st;
    if (dtypes == SDPA__DTYPES_F32 && t->dtype != SDPA_DTYPE_F32)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: %s.dtype=%s: weights and lse are float32 whatever the dtypes of q, k, v and out",
                          fn, name, sdpa_dtype_name((sdpa_dtype)t->dtype));
    SDPA__TRY(sdpa__check_dtype_supported(t, fn, name, dtypes));
    for (int32_t d = 0; d < rank; ++d)
        if (t->shape[d] != want[d])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld, expected %s=%lld", fn, name, (int)d,
                              (long long)t->shape[d], dims[d], (long long)want[d]);
    return sdpa__check_output_layout(t, fn, name);
}

static sdpa_status check_lengths(const char *fn, const int64_t *len, int64_t B, int64_t max, const char *name,
                                 const char *bound) {
    if (len == NULL)
        return SDPA_OK;
    for (int64_t b = 0; b < B; ++b)
        if (len[b] < 0 || len[b] > max)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->%s[%lld]=%lld is outside [0, %s=%lld]",
                              fn, name, (long long)b, (long long)len[b], bound, (long long)max);
    return SDPA_OK;
}

/* ---- packed variable-length batches (0.5) ---- */

static sdpa_status check_cu(const char *fn, const char *name, const int32_t *cu, int64_t R, int64_t total,
                            const char *total_name) {
    if (cu[0] != 0)
        return sdpa__fail(SDPA_ERR_INDEX, "%s: options->%s[0]=%d must be 0", fn, name, (int)cu[0]);
    for (int64_t r = 0; r < R; ++r)
        if (cu[r + 1] < cu[r])
            return sdpa__fail(SDPA_ERR_INDEX, "%s: options->%s[%lld]=%d is smaller than %s[%lld]=%d (must not decrease)",
                              fn, name, (long long)(r + 1), (int)cu[r + 1], name, (long long)r, (int)cu[r]);
    if (cu[R] != total)
        return sdpa__fail(SDPA_ERR_INDEX, "%s: options->%s[num_seqs=%lld]=%d must equal %s=%lld", fn, name,
                          (long long)R, (int)cu[R], total_name, (long long)total);
    return SDPA_OK;
}

/* The checks of a packed call (options->cu_seqlens_q) made before the shapes: q [1, Hq,
 * total_q, E]; the cu_seqlens arrays; what a packed call cannot take. */
static sdpa_status packed_check(const char *fn, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_options *o,
                          const sdpa_tensor *weights) {
    if (q->rank != 4)
        return sdpa__fail(SDPA_ERR_RANK, "%s: with options->cu_seqlens_q, query must be rank 4, [1, Hq, total_q, E] (query.rank=%d)",
                          fn, (int)q->rank);
    if (q->shape[0] != 1)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: with options->cu_seqlens_q, query must be [1, Hq, total_q, E] (query.shape[0]=%lld)",
                          fn, (long long)q->shape[0]);
    if (weights != NULL)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED, "%s: weights are not available for a packed batch (cu_seqlens_q); pass weights=NULL", fn);
    if (o->query_lengths != NULL || o->allow_mask != NULL || o->bias != NULL)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED, "%s: query_lengths, allow_mask and bias are not available with cu_seqlens_q", fn);
    if (o->num_seqs < 0 || o->num_seqs > INT32_MAX)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->num_seqs=%lld is outside [0, 2^31)", fn, (long long)o->num_seqs);
    sdpa_status st = check_cu(fn, "cu_seqlens_q", o->cu_seqlens_q, o->num_seqs, q->shape[2], "total_q=query.shape[2]");
    if (st != SDPA_OK)
        return st;
    if (o->cu_seqlens_k != NULL) {
        if (o->block_table != NULL)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->cu_seqlens_k and block_table are exclusive (keys come from one of them)", fn);
        if (k->rank != 4 || k->shape[0] != 1)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: with options->cu_seqlens_k, key must be [1, Hkv, total_k, E] (rank %d, shape[0]=%lld)",
                              fn, (int)k->rank, (long long)k->shape[0]);
        SDPA__TRY(check_cu(fn, "cu_seqlens_k", o->cu_seqlens_k, o->num_seqs, k->shape[2], "total_k=key.shape[2]"));
        if (o->key_lengths != NULL)
            for (int64_t r = 0; r < o->num_seqs; ++r) {
                const int64_t Sr = (int64_t)o->cu_seqlens_k[r + 1] - o->cu_seqlens_k[r];
                if (o->key_lengths[r] < 0 || o->key_lengths[r] > Sr)
                    return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->key_lengths[%lld]=%lld is outside [0, S_r=%lld] (cu_seqlens_k)",
                                      fn, (long long)r, (long long)o->key_lengths[r], (long long)Sr);
            }
    } else if (o->block_table == NULL) {
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: options->cu_seqlens_q needs cu_seqlens_k or a block_table for the keys", fn);
    }
    return SDPA_OK;
}

/* Paged K/V (0.5): k and v are block pools [num_blocks, Hkv, block_size, E / Ev]; the plan's
 * views become the logical [B, Hkv, S = max_blocks_per_seq * block_size, E] with the pool's
 * data and strides and the block table (internal.h). The table's entries are checked by
 * paged_check_table once key_lengths are known to be in range. */
static sdpa_status paged_make(const char *fn, sdpa__plan *p, const sdpa_tensor *k, const sdpa_tensor *v, const sdpa_options *o,
                              int64_t nseq) {
    if (k->rank != 4)
        return sdpa__fail(SDPA_ERR_RANK, "%s: with options->block_table, key and value must be rank-4 block pools [num_blocks, Hkv, block_size, E] (key.rank=%d)",
                          fn, (int)k->rank);
    SDPA__TRY(expect_dim(fn, v, "value", 0, p->k.shape[0], "key", 0, 4));
    SDPA__TRY(expect_dim(fn, v, "value", 2, p->k.shape[2], "key", 2, 4));
    if (o->key_lengths == NULL && nseq > 0)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: options->block_table is set but key_lengths is NULL (a paged cache needs each sequence's key count)", fn);
    const int64_t bs = p->k.shape[2];
    if (bs < 1)
        return sdpa__fail(SDPA_ERR_EMPTY_DIMENSION, "%s: block_size=key.shape[2]=0 (a paged pool needs slots)", fn);
    if (o->max_blocks_per_seq < 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->max_blocks_per_seq=%lld must be >= 1 with a block table", fn,
                          (long long)o->max_blocks_per_seq);
    const int64_t ts = o->block_table_stride == 0 ? o->max_blocks_per_seq : o->block_table_stride;
    if (ts < o->max_blocks_per_seq)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->block_table_stride=%lld is smaller than max_blocks_per_seq=%lld", fn,
                          (long long)o->block_table_stride, (long long)o->max_blocks_per_seq);
    int64_t S, span;
    if (sdpa__mul_overflow(o->max_blocks_per_seq, bs, &S) || S > INT32_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: max_blocks_per_seq=%lld x block_size=%lld keys overflow int32", fn,
                          (long long)o->max_blocks_per_seq, (long long)bs);
    if (sdpa__mul_overflow(nseq > 0 ? nseq - 1 : 0, ts, &span) || sdpa__add_overflow(span, o->max_blocks_per_seq, &span) ||
        sdpa__mul_overflow(span, (int64_t)sizeof(int32_t), &span))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the block table's extent, (%lld sequences - 1) x block_table_stride=%lld + max_blocks_per_seq=%lld int32 entries, overflows", fn,
                          (long long)nseq, (long long)ts, (long long)o->max_blocks_per_seq);
    sdpa__view4 *views[2] = {&p->k, &p->v};
    for (int t = 0; t < 2; ++t) {
        sdpa__view4 *w = views[t];
        w->block_size = bs;
        w->block_table = o->block_table;
        w->block_table_stride = ts;
        w->key_lengths = o->key_lengths;
        w->shape[0] = p->B;
        w->shape[2] = S;
    }
    p->num_blocks = k->shape[0];
    p->S = S;
    return SDPA_OK;
}

/* Every block a key j < key_lengths[b] reaches is a pool block (before anything is written). */
static sdpa_status paged_check_table(const char *fn, const sdpa__plan *p, const sdpa_options *o, int64_t nseq) {
    const int64_t bs = p->k.block_size;
    for (int64_t b = 0; b < nseq; ++b) {
        const int64_t used = (o->key_lengths[b] + bs - 1) / bs;
        const int32_t *row = o->block_table + b * p->k.block_table_stride;
        for (int64_t c = 0; c < used; ++c)
            if (row[c] < 0 || row[c] >= p->num_blocks)
                return sdpa__fail(SDPA_ERR_INDEX,
                                  "%s: options->block_table[%lld][%lld]=%d is outside [0, num_blocks=key.shape[0]=%lld) and sequence b=%lld reaches it (key_lengths[%lld]=%lld, block_size=%lld)",
                                  fn, (long long)b, (long long)c, (int)row[c], (long long)p->num_blocks, (long long)b,
                                  (long long)b, (long long)o->key_lengths[b], (long long)bs);
    }
    return SDPA_OK;
}

/* 0.6: the options' arrays are read through typed pointers, so each must be aligned to its
 * element type (SDPA_ERR_ALIGNMENT); query_offsets only where they are read. */
static sdpa_status check_option_arrays_aligned(const char *fn, const sdpa_options *o) {
    const struct { const char *name; const void *ptr; size_t align; } a[] = {
        {"options->key_lengths", o->key_lengths, sizeof(int64_t)},
        {"options->query_lengths", o->query_lengths, sizeof(int64_t)},
        {"options->query_offsets", o->alignment == SDPA_ALIGN_OFFSETS ? o->query_offsets : NULL, sizeof(int64_t)},
        {"options->block_table", o->block_table, sizeof(int32_t)},
        {"options->cu_seqlens_q", o->cu_seqlens_q, sizeof(int32_t)},
        {"options->cu_seqlens_k", o->cu_seqlens_k, sizeof(int32_t)},
        {"options->sinks", o->sinks, sizeof(float)},
        {"options->alibi_slopes", o->alibi_slopes, sizeof(float)},
    };
    for (size_t t = 0; t < sizeof a / sizeof a[0]; ++t) {
        const sdpa_status st = sdpa__check_aligned(fn, a[t].name, a[t].ptr, a[t].align);
        if (st != SDPA_OK)
            return st;
    }
    return SDPA_OK;
}

/* sdpa__plan_make, outputs: out (any dtype), weights and lse (float32) against the shapes. */
static sdpa_status plan_outputs(const char *fn, sdpa__plan *p, int32_t rank, const sdpa_tensor *out,
                                const sdpa_tensor *weights, const sdpa_tensor *lse) {
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
    SDPA__TRY(check_output(fn, out, "out", rank, want_out, rank == 4 ? d4 : d3, SDPA__DTYPES_ALL));
    p->out = to_view4(out);
    if (weights != NULL) {
        SDPA__TRY(check_output(fn, weights, "weights", rank, want_w, rank == 4 ? w4 : w3, SDPA__DTYPES_F32));
        p->has_weights = true;
        p->weights = to_view4(weights);
    }
    if (lse != NULL) {
        SDPA__TRY(check_output(fn, lse, "lse", rank - 1, want_l, rank == 4 ? l3 : l2, SDPA__DTYPES_F32));
        p->has_lse = true;
        p->lse = (float *)lse->data;
        if (rank == 4) {
            p->lse_strides[0] = lse->strides[0]; p->lse_strides[1] = lse->strides[1]; p->lse_strides[2] = lse->strides[2];
        } else {
            p->lse_strides[0] = lse->strides[0]; p->lse_strides[1] = 0; p->lse_strides[2] = lse->strides[1];
        }
    }
    return SDPA_OK;
}

/* sdpa__plan_make, the rules' inputs: options' ranges, offsets, lengths, the block table, the
 * allow-mask and the bias. */
static sdpa_status plan_rules(const char *fn, sdpa__plan *p, const sdpa_options *o, int64_t nseq) {
    sdpa_status st;
    SDPA__TRY(sdpa__options_check(fn, o));
    if (o->alignment == SDPA_ALIGN_OFFSETS) {
        if (o->query_offsets == NULL && nseq > 0)
            return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: options->alignment is SDPA_ALIGN_OFFSETS but query_offsets is NULL", fn);
        for (int64_t b = 0; b < nseq; ++b)
            if (o->query_offsets[b] < -SDPA__MAX_OFFSET || o->query_offsets[b] > SDPA__MAX_OFFSET)
                return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->query_offsets[%lld]=%lld is out of range", fn,
                                  (long long)b, (long long)o->query_offsets[b]);
    }
    SDPA__TRY(check_lengths(fn, o->key_lengths, nseq, p->S, "key_lengths", "S"));
    if (o->block_table != NULL && (st = paged_check_table(fn, p, o, nseq)) != SDPA_OK) return st;
    SDPA__TRY(check_lengths(fn, o->query_lengths, p->B, p->L, "query_lengths", "L"));

    const int64_t target[4] = {p->B, p->Hq, p->L, p->S};
    if (o->allow_mask != NULL) {
        const sdpa_allow_mask *m = o->allow_mask;
        SDPA__TRY(sdpa__check_mask(fn, "allow_mask", m));
        SDPA__TRY(sdpa__broadcast4(fn, "allow_mask", m->rank, m->shape, m->strides, target, p->rules.mask.strides));
        int64_t numel = 1;
        for (int32_t d = 0; d < m->rank; ++d) numel *= m->shape[d];
        p->rules.has_mask = numel > 0;
        p->rules.mask.data = m->data;
    }
    if (o->bias != NULL) {
        const sdpa_tensor *bt = o->bias;
        SDPA__TRY(check_input(fn, bt, "bias", 1, 4, SDPA__DTYPES_ALL));
        SDPA__TRY(sdpa__broadcast4(fn, "bias", bt->rank, bt->shape, bt->strides, target, p->rules.bias.strides));
        int64_t numel = 1;
        for (int32_t d = 0; d < bt->rank; ++d) numel *= bt->shape[d];
        p->rules.has_bias = numel > 0;
        p->rules.bias.data = bt->data;
        p->rules.bias.dtype = bt->dtype;
    }
    return SDPA_OK;
}

/* sdpa__plan_make, overlaps: no output (written) overlaps an input or another output. */
static sdpa_status plan_overlaps(const char *fn, const sdpa__plan *p, const sdpa_options *o, int64_t nseq,
                                 const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                 const sdpa_tensor *out, const sdpa_tensor *weights, const sdpa_tensor *lse) {
    sdpa__named_span in[16], outs[4];
    int nin = 0, nout = 0;
    in[nin].name = "query"; in[nin++].s = sdpa__tensor_span(q);
    in[nin].name = "key"; in[nin++].s = sdpa__tensor_span(k);
    in[nin].name = "value"; in[nin++].s = sdpa__tensor_span(v);
    if (o->bias) { in[nin].name = "bias"; in[nin++].s = sdpa__tensor_span(o->bias); }
    if (o->allow_mask) { in[nin].name = "allow_mask"; in[nin++].s = sdpa__mask_span(o->allow_mask); }
    if (o->key_lengths && nseq > 0) {
        in[nin].name = "key_lengths";
        in[nin].s.lo = (uintptr_t)o->key_lengths;
        in[nin++].s.hi = (uintptr_t)(o->key_lengths + nseq);
    }
    if (o->block_table && nseq > 0) {
        in[nin].name = "block_table";
        in[nin].s.lo = (uintptr_t)o->block_table;
        in[nin++].s.hi = (uintptr_t)(o->block_table + (nseq - 1) * p->k.block_table_stride + o->max_blocks_per_seq);
    }
    if (o->cu_seqlens_q) {
        in[nin].name = "cu_seqlens_q";
        in[nin].s.lo = (uintptr_t)o->cu_seqlens_q;
        in[nin++].s.hi = (uintptr_t)(o->cu_seqlens_q + nseq + 1);
        if (o->cu_seqlens_k) {
            in[nin].name = "cu_seqlens_k";
            in[nin].s.lo = (uintptr_t)o->cu_seqlens_k;
            in[nin++].s.hi = (uintptr_t)(o->cu_seqlens_k + nseq + 1);
        }
    }
    if (o->query_lengths && p->B > 0) {
        in[nin].name = "query_lengths";
        in[nin].s.lo = (uintptr_t)o->query_lengths;
        in[nin++].s.hi = (uintptr_t)(o->query_lengths + p->B);
    }
    if (o->alignment == SDPA_ALIGN_OFFSETS && nseq > 0) {
        in[nin].name = "query_offsets";
        in[nin].s.lo = (uintptr_t)o->query_offsets;
        in[nin++].s.hi = (uintptr_t)(o->query_offsets + nseq);
    }
    if (o->sinks && p->Hq > 0) {
        in[nin].name = "sinks";
        in[nin].s.lo = (uintptr_t)o->sinks;
        in[nin++].s.hi = (uintptr_t)(o->sinks + p->Hq);
    }
    if (o->alibi_slopes && p->Hq > 0 && nseq > 0) {
        in[nin].name = "alibi_slopes";
        in[nin].s.lo = (uintptr_t)o->alibi_slopes;
        in[nin++].s.hi = (uintptr_t)(o->alibi_slopes + (o->alibi_slopes_rank == 2 ? nseq * p->Hq : p->Hq));
    }
    if (o->k_scale) { in[nin].name = "k_scale"; in[nin++].s = sdpa__tensor_span(o->k_scale); } /* 0.6 */
    if (o->v_scale) { in[nin].name = "v_scale"; in[nin++].s = sdpa__tensor_span(o->v_scale); }
    outs[nout].name = "out"; outs[nout++].s = sdpa__tensor_span(out);
    if (weights) { outs[nout].name = "weights"; outs[nout++].s = sdpa__tensor_span(weights); }
    if (lse) { outs[nout].name = "lse"; outs[nout++].s = sdpa__tensor_span(lse); }
    if (o->workspace && o->workspace_bytes > 0) { /* written too: checked like an output */
        outs[nout].name = "workspace";
        outs[nout].s.lo = (uintptr_t)o->workspace;
        outs[nout++].s.hi = (uintptr_t)o->workspace + o->workspace_bytes;
    }
    return sdpa__check_overlaps(fn, in, nin, outs, nout);
}

/* sdpa__plan_make, the rest: loaders, scalars, rules, sinks, ALiBi, the executor, and the call
 * context last (context.c). */
static sdpa_status plan_settings(const char *fn, sdpa__plan *p, const sdpa_options *o, int64_t nseq) {
    p->load_q = sdpa__loader_for(&p->q, SDPA__ADDR_STRIDED);
    const sdpa__addressing kv_addr = o->block_table != NULL ? SDPA__ADDR_PAGED : SDPA__ADDR_STRIDED;
    p->load_k = sdpa__loader_for(&p->k, kv_addr);
    p->load_v = sdpa__loader_for(&p->v, kv_addr);
    if (p->load_q == NULL || p->load_k == NULL || p->load_v == NULL)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: no loader reads query/key/value of these dtypes", fn);
    p->scale = o->scale > 0.0f ? o->scale : (float)(1.0 / sqrt((double)p->E));
    p->softcap = o->softcap;
    p->rules.L = p->L;
    p->rules.S = p->S;
    p->rules.causal = o->causal;
    p->rules.alignment = o->alignment;
    p->rules.query_offsets = o->query_offsets;
    /* Without sliding_window both sides are unbounded; windows beyond 2^62 are too. */
    p->rules.window_left = !o->sliding_window || o->window_left > SDPA__MAX_WINDOW ? -1 : o->window_left;
    p->rules.window_right = !o->sliding_window || o->window_right > SDPA__MAX_WINDOW ? -1 : o->window_right;
    p->rules.key_lengths = o->key_lengths;
    p->rules.query_lengths = o->query_lengths;
    p->empty_rows = o->empty_rows;
    p->weights_stage = o->weights_stage;
    p->check_finite = o->skip_finite_check == 0;
    p->num_threads = o->num_threads > 0 ? o->num_threads : sdpa__online_cpus();
    p->kernel = o->kernel;
    p->dropout_p = o->dropout_p;
    p->dropout_seed = o->dropout_seed;
    p->dropout_offset = o->dropout_offset;
    p->precision = o->precision == SDPA_PRECISION_REDUCED ? SDPA_PRECISION_REDUCED : SDPA_PRECISION_F32;
    p->row_block = p->L < 64 ? (p->L > 0 ? p->L : 1) : 64;
    /* 0.5: sinks, ALiBi slopes (checked here: O(Hq) values), the call's executor. */
    if (o->sinks != NULL)
        for (int64_t h = 0; h < p->Hq; ++h)
            if (isnan(o->sinks[h]) || o->sinks[h] == INFINITY)
                return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: options->sinks[%lld]=%g is NaN or +inf (-inf = no sink)", fn,
                                  (long long)h, (double)o->sinks[h]);
    p->sinks = o->sinks;
    if (o->alibi_slopes != NULL) {
        /* [B, Hq], or [num_seqs, Hq] for a packed batch (rows per sequence, like key_lengths). */
        const int64_t n = o->alibi_slopes_rank == 2 ? nseq * p->Hq : p->Hq;
        for (int64_t t = 0; t < n; ++t)
            if (!isfinite(o->alibi_slopes[t]))
                return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: options->alibi_slopes[%lld]=%g is not finite", fn,
                                  (long long)t, (double)o->alibi_slopes[t]);
        p->rules.alibi_slopes = o->alibi_slopes;
        p->rules.alibi_stride_b = o->alibi_slopes_rank == 2 ? p->Hq : 0;
    }
    p->exec.hook = o->parallel_for;
    p->exec.hook_ctx = o->parallel_for_ctx;
    p->exec.pool = o->threadpool;
    p->exec.fn = fn;
    if (o->parallel_for != NULL || o->threadpool != NULL) {
        const int n = o->threadpool != NULL ? sdpa_threadpool_size(o->threadpool) : (int)o->parallel_for_threads;
        const int cap = n < SDPA__MAX_THREADS ? n : SDPA__MAX_THREADS;
        p->num_threads = o->num_threads > 0 && o->num_threads < cap ? o->num_threads : cap;
    }
    /* The call context last (context.c): the ISA's tables and the dtypes' entries. */
    sdpa__ctx_make(&p->ctx, p);
    p->q.cv = p->k.cv = p->v.cv = p->ctx.cv;
    return SDPA_OK;
}

sdpa_status sdpa__plan_make(const char *fn, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                             const sdpa_options *opt_in, const sdpa_tensor *out, const sdpa_tensor *weights,
                             const sdpa_tensor *lse, bool for_size, sdpa__plan *p, sdpa_options *o) {
    sdpa_status st;
    if (q == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: query is NULL", fn);
    if (k == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key is NULL", fn);
    if (v == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: value is NULL", fn);
    if (!for_size && out == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", fn);
    SDPA__TRY(check_input(fn, q, "query", 3, 4, SDPA__DTYPES_ALL));
    SDPA__TRY(check_input(fn, k, "key", 3, 4, SDPA__DTYPES_KV));
    SDPA__TRY(check_input(fn, v, "value", 3, 4, SDPA__DTYPES_KV));
    SDPA__TRY(sdpa__options_read(fn, opt_in, o));
    SDPA__TRY(check_option_arrays_aligned(fn, o));
    if (k->rank != q->rank || v->rank != q->rank)
        return sdpa__fail(SDPA_ERR_RANK, "%s: query.rank=%d, key.rank=%d, value.rank=%d must be equal", fn,
                          (int)q->rank, (int)k->rank, (int)v->rank);
    const int32_t rank = q->rank;
    memset(p, 0, sizeof *p);
    p->fn = fn;
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
    const int64_t nseq = o->cu_seqlens_q != NULL ? o->num_seqs : p->B; /* rows of key_lengths, block_table */
    if (o->cu_seqlens_q != NULL && (st = packed_check(fn, q, k, o, weights)) != SDPA_OK) return st;
    if (o->block_table != NULL) {
        SDPA__TRY(paged_make(fn, p, k, v, o, nseq));
    } else {
        SDPA__TRY(expect_dim(fn, k, "key", 0, p->B, "query", 0, rank));
        SDPA__TRY(expect_dim(fn, v, "value", 0, p->B, "query", 0, rank));
        SDPA__TRY(expect_dim(fn, v, "value", 2, p->S, "key", 2, rank));
    }
    SDPA__TRY(expect_dim(fn, v, "value", 1, p->Hkv, "key", 1, rank));
    SDPA__TRY(expect_dim(fn, k, "key", 3, p->E, "query", 3, rank));
    if (p->Hkv == 0 ? p->Hq != 0 : p->Hq % p->Hkv != 0)
        return sdpa__fail(SDPA_ERR_SHAPE,
                          "%s: query heads Hq=query.shape[1]=%lld is not a multiple of key heads Hkv=key.shape[1]=%lld",
                          fn, (long long)p->Hq, (long long)p->Hkv);
    p->group = p->Hkv == 0 ? 1 : p->Hq / p->Hkv;
    if (p->L > INT32_MAX || p->S > INT32_MAX || p->E > INT32_MAX || p->Ev > INT32_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: L=%lld, S=%lld, E=%lld, Ev=%lld must each fit in 32 bits (libsdpa indexes key positions, rows and widths with 32-bit integers on every path)",
                          fn, (long long)p->L, (long long)p->S, (long long)p->E, (long long)p->Ev);
    if (p->E == 0)
        return sdpa__fail(SDPA_ERR_EMPTY_DIMENSION, "%s: head width E=query.shape[%d]=0 (the default scale 1/sqrt(E) is undefined)",
                          fn, rank - 1);

    if (!for_size)
        SDPA__TRY(plan_outputs(fn, p, rank, out, weights, lse));
    SDPA__TRY(plan_rules(fn, p, o, nseq));
    SDPA__TRY(sdpa__options_kv_scales(fn, o, p->Hkv, &p->k, &p->v)); /* 0.6 */
    if (!for_size)
        SDPA__TRY(plan_overlaps(fn, p, o, nseq, q, k, v, out, weights, lse));
    return plan_settings(fn, p, o, nseq);
}

