/* Packed variable-length batches (0.5, options->cu_seqlens_q; FlashAttention varlen): the
 * queries of R sequences packed along q's axis 2, keys from cu_seqlens_k or a paged cache.
 * Every sequence runs as the B = 1 plan it would have alone (its rules from rules.c:
 * sdpa__rule_for_sequence), so a packed call is bit-identical to the per-sequence calls with
 * the same kernel. All sequences' value checks run before any output is written. */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

sdpa_status sdpa__varlen_check(const char *fn, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_options *o,
                               const sdpa_tensor *weights, int64_t *S) {
    (void)S;
    if (q->rank != 4 || q->shape[0] != 1)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: with options->cu_seqlens_q, query must be [1, Hq, total_q, E] (rank %d, shape[0]=%lld)",
                          fn, (int)q->rank, (long long)q->shape[0]);
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
        if ((st = check_cu(fn, "cu_seqlens_k", o->cu_seqlens_k, o->num_seqs, k->shape[2], "total_k=key.shape[2]")) != SDPA_OK)
            return st;
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

static size_t elem(const sdpa__view4 *v) { return sdpa_dtype_size((sdpa_dtype)v->dtype); }

static void shift(sdpa__view4 *v, int64_t row0, int64_t rows) {
    v->data = (float *)(void *)((unsigned char *)v->data + (size_t)(row0 * v->strides[2]) * elem(v));
    v->shape[2] = rows;
}

/* The B = 1 plan of sequence r. */
static void sequence_plan(const sdpa__plan *p, const sdpa_options *o, int64_t r, sdpa__plan *s) {
    *s = *p;
    const int64_t i0 = o->cu_seqlens_q[r], Lr = (int64_t)o->cu_seqlens_q[r + 1] - i0;
    s->B = 1;
    s->L = Lr;
    shift(&s->q, i0, Lr);
    shift(&s->out, i0, Lr);
    if (p->has_lse)
        s->lse = p->lse + i0 * p->lse_strides[2];
    if (o->cu_seqlens_k != NULL) {
        const int64_t j0 = o->cu_seqlens_k[r], Sr = (int64_t)o->cu_seqlens_k[r + 1] - j0;
        shift(&s->k, j0, Sr);
        shift(&s->v, j0, Sr);
        s->S = Sr;
    } else { /* paged: row r of the block table */
        sdpa__view4 *w[2] = {&s->k, &s->v};
        for (int t = 0; t < 2; ++t) {
            w[t]->block_table += r * w[t]->block_table_stride;
            w[t]->key_lengths += r;
        }
    }
    s->rules = sdpa__rule_for_sequence(&p->rules, r, s->L, s->S);
    s->row_block = Lr < 64 ? (Lr > 0 ? Lr : 1) : 64;
}

/* Sequences with at most this many query rows (decode rows, short chunks) run one thread each,
 * many sequences at a time; longer ones run one after the other on all threads. Results do not
 * depend on the thread count (DESIGN section 7), so the split changes no bit. Shape-only. */
#define VARLEN_SMALL_L 8

static bool is_small(const sdpa__plan *s) { return s->L <= VARLEN_SMALL_L; }

/* Threads of the across-sequence pass and the workspace of both passes. */
typedef struct varlen_ws {
    int64_t nsmall;
    int par_threads;
    size_t serial, per_thread, total; /* bytes */
} varlen_ws;

static sdpa_status layout(const char *fn, const sdpa__plan *p, const sdpa_options *o, varlen_ws *w) {
    memset(w, 0, sizeof *w);
    for (int64_t r = 0; r < o->num_seqs; ++r) {
        sdpa__plan s;
        sequence_plan(p, o, r, &s);
        if (s.L == 0 || s.Hq == 0)
            continue;
        size_t b = 0;
        const bool small = is_small(&s);
        if (small)
            s.num_threads = 1;
        const sdpa_status st = sdpa__attention_workspace_bytes(fn, &s, &b);
        if (st != SDPA_OK)
            return st;
        /* The checks of pass 1 run with the sequence's own threads. */
        s.num_threads = p->num_threads;
        size_t cb = 0;
        if (sdpa__attention_workspace_bytes(fn, &s, &cb) != SDPA_OK)
            return SDPA_ERR_INTERNAL;
        w->serial = cb > w->serial ? cb : w->serial;
        if (small) {
            w->nsmall++;
            w->per_thread = b > w->per_thread ? b : w->per_thread;
        }
    }
    w->par_threads = (int64_t)p->num_threads < w->nsmall ? p->num_threads : (int)w->nsmall;
    const size_t par = sdpa__mul_sat(sdpa__align64(w->per_thread), (size_t)w->par_threads);
    w->total = w->serial > par ? w->serial : par;
    if (w->total == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
    if (w->total > 0)
        w->total = sdpa__add_sat(w->total, 64u);
    return SDPA_OK;
}

sdpa_status sdpa__varlen_workspace_bytes(const char *fn, const sdpa__plan *p, const sdpa_options *o, size_t *bytes) {
    varlen_ws w;
    const sdpa_status st = layout(fn, p, o, &w);
    if (st == SDPA_OK)
        *bytes = w.total;
    return st;
}

typedef struct small_ctx {
    const sdpa__plan *p;
    const sdpa_options *o;
    const int64_t *seqs; /* the small sequences, in order */
    unsigned char *ws;
    size_t per_thread;
    unsigned char *bad; /* pass 1: per short sequence, 1 = its checks failed */
    _Atomic int failed;
} small_ctx;

/* Pass 1 for a short sequence on one thread: its status only (the message of the first
 * failing sequence is made again on the calling thread). */
static void small_check_task(void *vctx, int64_t task, int tid) {
    small_ctx *c = (small_ctx *)vctx;
    sdpa__plan s;
    sequence_plan(c->p, c->o, c->seqs[task], &s);
    s.num_threads = 1;
    if (sdpa__check_values(&s, true, 1, c->ws + (size_t)tid * c->per_thread) != SDPA_OK)
        c->bad[task] = 1;
}

static void small_task(void *vctx, int64_t task, int tid) {
    small_ctx *c = (small_ctx *)vctx;
    sdpa__plan s;
    sequence_plan(c->p, c->o, c->seqs[task], &s);
    s.num_threads = 1;
    s.check_finite = false; /* pass 1 checked everything: no empty row is left under ERROR */
    s.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    if (sdpa__attention_planned(&s, c->ws + (size_t)tid * c->per_thread, c->per_thread) != SDPA_OK)
        c->failed = 1; /* cannot happen: the plan and workspace were checked in pass 1 */
}

sdpa_status sdpa__varlen_run(const sdpa__plan *p, const sdpa_options *o) {
    static const char FN[] = "sdpa_attention";
    varlen_ws w;
    sdpa_status st = layout(FN, p, o, &w);
    if (st != SDPA_OK)
        return st;
    if (w.total == 0) {
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    void *ws = o->workspace, *owned = NULL;
    if (ws != NULL && o->workspace_bytes < w.total)
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_attention_workspace_size())",
                          FN, o->workspace_bytes, w.total);
    int64_t *seqs = malloc((size_t)(w.nsmall > 0 ? w.nsmall : 1) * sizeof *seqs);
    if (ws == NULL)
        owned = ws = malloc(w.total);
    if (ws == NULL || seqs == NULL) {
        free(owned);
        free(seqs);
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of workspace", FN, w.total);
    }
    unsigned char *aligned = (unsigned char *)(((uintptr_t)ws + 63u) & ~(uintptr_t)63u);
    /* Pass 1: every sequence's value checks (K/V rows included), before anything is written:
     * long sequences on all threads, short ones one thread each, many at a time; the failure
     * reported is the one of the lowest failing sequence, as a scan in order would find. */
    int64_t ns = 0, first_bad = o->num_seqs;
    for (int64_t r = 0; r < o->num_seqs; ++r) {
        sdpa__plan s;
        sequence_plan(p, o, r, &s);
        if (s.L == 0 || s.Hq == 0)
            continue;
        if (is_small(&s)) {
            seqs[ns++] = r;
            continue;
        }
        if (sdpa__check_values(&s, true, sdpa__check_threads(&s), aligned) != SDPA_OK) {
            first_bad = r;
            break;
        }
    }
    unsigned char *bad = ns > 0 ? calloc((size_t)ns, 1) : NULL;
    if (ns > 0 && bad == NULL) {
        free(owned);
        free(seqs);
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %lld bytes", FN, (long long)ns);
    }
    if (ns > 0 && (p->check_finite || p->empty_rows == SDPA_EMPTY_ROWS_ERROR)) {
        small_ctx c = {p, o, seqs, aligned, sdpa__align64(w.per_thread), bad, 0};
        sdpa__run_tasks(&p->exec, w.par_threads, ns, small_check_task, &c);
        for (int64_t t = 0; t < ns && seqs[t] < first_bad; ++t)
            if (bad[t])
                first_bad = seqs[t];
    }
    free(bad);
    if (first_bad < o->num_seqs) { /* the message, made again on this thread */
        sdpa__plan s;
        sequence_plan(p, o, first_bad, &s);
        st = sdpa__check_values(&s, true, sdpa__check_threads(&s), aligned);
        if (st == SDPA_OK) {
            st = sdpa__fail(SDPA_ERR_INTERNAL, "%s: a packed sequence's checks gave two answers", FN);
        } else { /* its b is 0 (the sequence alone): name the sequence and its first packed row */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", sdpa_last_error_message());
            st = sdpa__fail(st, "%s [packed sequence r=%lld: b=0 is r, i counts from cu_seqlens_q[r]=%d, j from its first key]",
                            msg, (long long)first_bad, (int)o->cu_seqlens_q[first_bad]);
        }
    }
    /* Pass 2a: long sequences one after the other, each on all threads. Their checks have
     * passed, so the check stage and the kernels' inline K/V check are off (they would find
     * nothing; under ERROR no row is empty, so the ZERO policy changes no bit). */
    for (int64_t r = 0; r < o->num_seqs && st == SDPA_OK; ++r) {
        sdpa__plan s;
        sequence_plan(p, o, r, &s);
        if (s.L == 0 || s.Hq == 0 || is_small(&s))
            continue;
        s.check_finite = false;
        s.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        st = sdpa__attention_planned(&s, aligned, w.total - 64u);
    }
    /* Pass 2b: short sequences, one thread each, many at a time. */
    if (st == SDPA_OK && ns > 0) {
        small_ctx c = {p, o, seqs, aligned, sdpa__align64(w.per_thread), NULL, 0};
        sdpa__run_tasks(&p->exec, w.par_threads, ns, small_task, &c);
        if (c.failed)
            st = sdpa__fail(SDPA_ERR_INTERNAL, "%s: a packed sequence failed after its checks passed", FN);
    }
    free(seqs);
    free(owned);
    return st;
}
