/* sdpa_attention: plan (with its call context) -> the one driver: a list of sequences, each with
 * its kernel (kernel.c), whose value checks and work items run as phases of one parallel
 * region, then each kernel's finish. A plain call is a packed batch of one sequence (its plan
 * as given); a packed call (options->cu_seqlens_q) has one per packed sequence. Nothing is
 * written to an output before every check has passed. */
#include "internal.h"
#include "kernel.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define SDPA__WS_ALIGN_SLACK 64u

/* The kernel for the plan (kernel.c), then the threads and workspace of the call: the checks'
 * and the kernel's (kernel.h). */
sdpa_status sdpa__exec_plan_make(const char *fn, const sdpa__plan *p, sdpa__exec_plan *x) {
    const sdpa__kernel *k = NULL;
    const sdpa_status st = sdpa__kernel_for(fn, p, &k);
    if (st != SDPA_OK)
        return st;
    x->kernel = k;
    const int kt = k->threads(p), ct = sdpa__check_threads(p);
    /* checks and items in one region: its threads serve both */
    x->threads = kt > ct ? kt : ct;
    const size_t kb = k->thread_bytes(p), cb = sdpa__check_thread_bytes(p);
    x->thread_bytes = sdpa__align64(kb > cb ? kb : cb);
    x->shared_bytes = sdpa__align64(k->shared_bytes(p));
    return SDPA_OK;
}

/* Workspace bytes of an exec plan, without the alignment slack (SIZE_MAX = overflow). */
static size_t exec_bytes(const sdpa__exec_plan *x) {
    return sdpa__add_sat(x->shared_bytes, sdpa__mul_sat(x->thread_bytes, (size_t)x->threads));
}

size_t sdpa__exec_plan_need(const sdpa__exec_plan *x) { return sdpa__add_sat(exec_bytes(x), SDPA__WS_ALIGN_SLACK); }

static sdpa_status drive(const sdpa__plan *p, const sdpa_options *o, void *workspace, size_t workspace_bytes);

/* A plain call's workspace: the driver's for its one sequence (sdpa__varlen_workspace_bytes). */
sdpa_status sdpa__attention_workspace_bytes(const char *fn, const sdpa__plan *p, size_t *bytes) {
    return sdpa__varlen_workspace_bytes(fn, p, NULL, bytes);
}

/* sdpa_attention after its plan: the one driver with one sequence. */
sdpa_status sdpa__attention_planned(const sdpa__plan *p, void *workspace, size_t workspace_bytes) {
    return drive(p, NULL, workspace, workspace_bytes);
}

SDPA_API sdpa_status sdpa_attention_workspace_size(const sdpa_tensor *q, const sdpa_tensor *k,
                                                   const sdpa_tensor *v, const sdpa_options *options,
                                                   int weights_requested, size_t *bytes) {
    static const char fn[] = "sdpa_attention_workspace_size";
    sdpa__plan p;
    sdpa_options o;
    sdpa__clear_error();
    if (bytes == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    /* the validation of sdpa_attention, its messages naming this function (fn) */
    SDPA__TRY(sdpa__plan_make(fn, q, k, v, options, NULL, NULL, NULL, true, &p, &o));
    p.has_weights = weights_requested != 0;
    if (o.cu_seqlens_q != NULL && p.has_weights)
        return sdpa__fail(SDPA_ERR_UNSUPPORTED,
                          "%s: weights are not available for a packed batch (cu_seqlens_q); pass weights_requested=0",
                          fn);
    if (o.cu_seqlens_q != NULL)
        return sdpa__varlen_workspace_bytes(fn, &p, &o, bytes);
    return sdpa__attention_workspace_bytes(fn, &p, bytes);
}

SDPA_API sdpa_status sdpa_attention(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                    const sdpa_options *options, const sdpa_tensor *out,
                                    const sdpa_tensor *weights, const sdpa_tensor *lse) {
    static const char fn[] = "sdpa_attention";
    sdpa__plan p;
    sdpa_options o;
    sdpa__clear_error();
    SDPA__TRY(sdpa__plan_make(fn, q, k, v, options, out, weights, lse, false, &p, &o));
    if (o.cu_seqlens_q != NULL)
        return sdpa__varlen_run(&p, &o);
    return sdpa__attention_planned(&p, o.workspace, o.workspace_bytes);
}

/* ==== the driver, and packed variable-length batches (0.5, options->cu_seqlens_q) ====
 * Packed (FlashAttention varlen): the queries of R sequences packed along q's axis 2, keys from
 * cu_seqlens_k or a paged cache.
 * Every sequence runs as the B = 1 plan it would have alone (its rules from rules.c:
 * sdpa__rule_for_sequence), so a packed call is bit-identical to the per-sequence calls with
 * the same kernel. All sequences' value checks run before any output is written, and all
 * sequences' work items run in one parallel region (see "one region" below). */

static size_t elem(const sdpa__view4 *v) { return sdpa_dtype_size((sdpa_dtype)v->dtype); }

static void shift(sdpa__view4 *v, int64_t row0, int64_t rows) {
    /* signed: a negative axis-2 stride moves the pointer down (no size_t wrap-around); an empty
     * view's data may be NULL, and no offset (not even 0) is added to a null pointer */
    if (v->data != NULL)
        v->data = (float *)(void *)((unsigned char *)v->data + (ptrdiff_t)(row0 * v->strides[2]) * (ptrdiff_t)elem(v));
    v->shape[2] = rows;
}

/* The B = 1 plan of sequence r. */
static void sequence_plan(const sdpa__plan *p, const sdpa_options *o, int64_t r, sdpa__plan *s) {
    *s = *p;
    const int64_t i0 = o->cu_seqlens_q[r], Lr = (int64_t)o->cu_seqlens_q[r + 1] - i0;
    s->B = 1;
    s->L = Lr;
    s->dropout_batch0 = r; /* its dropout draws are batch row r's, as in the padded batch */
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

/* ---- one region for the whole batch ----
 * Every sequence is planned as the B = 1 call it would be alone (its kernel chosen as that
 * call would, kernel.h): phase 1 runs all sequences' value checks (K/V rows included), a gate
 * stops the region if any failed, phase 2 runs all sequences' kernel items (long prefill
 * blocks first, then the decode rows' items), so the threads start once and share the whole
 * batch; then each sequence's finish (decode's split-KV merge) on the calling thread. Items
 * are those of the sequence alone, so each sequence's bits are those of its call alone. */

typedef struct seq {
    sdpa__plan chk_plan; /* the sequence's plan as given: what its checks read */
    sdpa__plan run_plan; /* the same with the checks off: they ran in phase 1 */
    sdpa__exec_plan x;
    size_t shared_at; /* its kernel's shared state in the workspace (itemised) */
    sdpa__check chk;
    sdpa__work w;
} seq;

/* The tasks of one phase over many sequences: unit u owns tasks [first[u], first[u] + n[u]). */
typedef struct unit {
    int64_t first, n;
    sdpa__task_fn fn;
    void *ctx;
} unit;

typedef struct units {
    const unit *u;
    int64_t nu;
} units;

static void units_task(void *vctx, int64_t task, int tid) {
    const units *us = (const units *)vctx;
    int64_t lo = 0, hi = us->nu - 1; /* the last unit whose first <= task */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (us->u[mid].first <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    const unit *u = &us->u[lo];
    u->fn(u->ctx, task - u->first, tid);
}

typedef struct batch_gate {
    seq *sq;
    int64_t n;
    bool stopped; /* a gate failed (read by the calling thread after the region) */
} batch_gate;

/* Gate 1: every sequence's value checks passed. */
static bool checks_passed(void *vctx) {
    batch_gate *g = (batch_gate *)vctx;
    for (int64_t r = 0; r < g->n; ++r)
        if (sdpa__check_failed(&g->sq[r].chk)) {
            g->stopped = true;
            return false;
        }
    return true;
}

/* Gate 2: the inline K/V checks of the sequences whose kernel makes them (decode). */
static bool inline_checks_passed(void *vctx) {
    batch_gate *g = (batch_gate *)vctx;
    for (int64_t r = 0; r < g->n; ++r) {
        seq *q = &g->sq[r];
        if (q->x.kernel->verify != NULL && !q->x.kernel->verify(q->w.ctx)) {
            g->stopped = true;
            return false;
        }
    }
    return true;
}

/* Threads, per-thread bytes and workspace of the batch. */
typedef struct varlen_ws {
    int64_t nseq;            /* sequences with a query row */
    int threads;
    size_t thread_bytes, shared, total; /* bytes */
} varlen_ws;

/* The plans of sequence r (live false: nothing to compute); x from sdpa__exec_plan_make. A
 * plain call (o NULL) is one sequence, its plan as given, planned even without a query row (its
 * workspace size is that of its kernel then too). */
static sdpa_status plan_sequence(const char *fn, const sdpa__plan *p, const sdpa_options *o, int64_t r, sdpa__plan *chk,
                                 sdpa__plan *run, sdpa__exec_plan *x, bool *live) {
    if (o != NULL)
        sequence_plan(p, o, r, chk);
    else
        *chk = *p;
    *live = chk->L > 0 && chk->Hq > 0 && chk->B > 0;
    if (!*live && o != NULL)
        return SDPA_OK;
    *run = *chk;
    run->check_finite = false; /* phase 1 checked everything: no empty row is left under ERROR */
    run->empty_rows = SDPA_EMPTY_ROWS_ZERO;
    sdpa_status st = sdpa__exec_plan_make(fn, run, x);
    if (st == SDPA_OK && x->kernel->checks_kv_inline && x->kernel->verify != NULL)
        run->check_finite = chk->check_finite; /* it checks the K/V rows it reads (gate 2) */
    return st;
}

static sdpa_status layout(const char *fn, const sdpa__plan *p, const sdpa_options *o, varlen_ws *w, seq *sq) {
    memset(w, 0, sizeof *w);
    int64_t threads = 0;
    const int64_t nseq = o != NULL ? o->num_seqs : 1;
    for (int64_t r = 0; r < nseq; ++r) {
        sdpa__plan chk, run;
        sdpa__exec_plan x;
        bool live;
        SDPA__TRY(plan_sequence(fn, p, o, r, &chk, &run, &x, &live));
        if (!live && o != NULL)
            continue;
        size_t tb = sdpa__check_thread_bytes(&chk);
        tb = x.thread_bytes > tb ? x.thread_bytes : tb;
        if (sq != NULL)
            sq[w->nseq].shared_at = w->shared;
        w->shared = sdpa__add_sat(w->shared, x.shared_bytes);
        w->thread_bytes = sdpa__align64(tb) > w->thread_bytes ? sdpa__align64(tb) : w->thread_bytes;
        threads += x.threads;
        if (sq != NULL) {
            seq *q = &sq[w->nseq];
            q->chk_plan = chk;
            q->run_plan = run;
            q->x = x;
        }
        w->nseq++;
    }
    w->threads = threads < p->num_threads ? (int)threads : p->num_threads;
    if (w->threads < 1)
        w->threads = 1;
    w->total = sdpa__add_sat(sdpa__align64(w->shared),
                             sdpa__mul_sat(w->thread_bytes, (size_t)w->threads));
    if (w->total == SIZE_MAX)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the workspace size overflows size_t", fn);
    if (w->nseq == 0)
        w->total = 0;
    else
        w->total = sdpa__add_sat(w->total, 64u);
    return SDPA_OK;
}

/* Workspace bytes of a plain (o NULL) or packed plan. */
sdpa_status sdpa__varlen_workspace_bytes(const char *fn, const sdpa__plan *p, const sdpa_options *o, size_t *bytes) {
    varlen_ws w;
    const sdpa__plan sp = sdpa__sizing_plan(p);
    const sdpa_status st = layout(fn, &sp, o, &w, NULL);
    if (st == SDPA_OK)
        *bytes = w.total;
    return st;
}

/* Sequences with more query rows than this run their items first in phase 2 (longer items
 * first balance the threads better); the order changes no bit. */
#define VARLEN_SMALL_L 8

/* The one driver: sdpa_attention of a plan, a plain call (o NULL: one sequence, the plan) or a
 * packed batch (o: its sequences). Long because it is one region's set-up in order: the
 * sequences' plans and workspace, the phases' units (checks, inline-check items, the other
 * items), the region, the first failure (named in its packed sequence), the finishes. */
static sdpa_status drive(const sdpa__plan *p, const sdpa_options *o, void *workspace, size_t workspace_bytes) {
    varlen_ws w;
    sdpa_status st = layout(p->fn, p, o, &w, NULL);
    if (st != SDPA_OK)
        return st;
    if (w.total == 0) {
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    if (workspace != NULL && workspace_bytes < w.total)
        return sdpa__fail(SDPA_ERR_WORKSPACE_TOO_SMALL,
                          "%s: options->workspace_bytes=%zu is smaller than the %zu bytes this call needs (sdpa_attention_workspace_size())",
                          p->fn, workspace_bytes, w.total);
    if (o == NULL && !(p->B > 0 && p->Hq > 0 && p->L > 0)) { /* no query row: nothing to check or write */
        sdpa__set_kernel("none");
        return SDPA_OK;
    }
    const size_t n = (size_t)w.nseq;
    /* A plain call's one sequence lives here (no allocation the caller did not allow); a packed
     * batch's are allocated. */
    seq one_seq;
    unit one_units[3];
    void *sq_owned = NULL;
    seq *sq = &one_seq;
    unit *cu = one_units;
    if (o != NULL) {
        sq_owned = n <= SIZE_MAX / (sizeof(seq) + 3 * sizeof(unit)) ? malloc(n * (sizeof(seq) + 3 * sizeof(unit))) : NULL;
        sq = (seq *)sq_owned;
        cu = sq != NULL ? (unit *)(void *)(sq + n) : NULL;
    }
    void *ws = workspace, *owned = NULL;
    if (ws == NULL)
        owned = ws = malloc(w.total);
    if (ws == NULL || sq == NULL) {
        free(owned);
        free(sq_owned);
        return sdpa__fail(SDPA_ERR_OUT_OF_MEMORY, "%s: could not allocate %zu bytes of workspace", p->fn, w.total);
    }
    unit *ku = cu + n;
    if ((st = layout(p->fn, p, o, &w, sq)) != SDPA_OK) { /* the same answer as above */
        free(owned);
        free(sq_owned);
        return st;
    }
    unsigned char *base = (unsigned char *)(((uintptr_t)ws + 63u) & ~(uintptr_t)63u);
    unsigned char *shared = base;
    unsigned char *tws = shared + sdpa__align64(w.shared);
    /* Phase 1 in sequence order: every sequence's checks (K/V rows too, except for a kernel
     * that checks those inline); gate 1. Phase 2: the items of such kernels (decode; they write
     * no output), gate 2 = their inline checks. Phase 3: the other items (they write), long
     * sequences first. Then each sequence's finish. */
    int64_t nc = 0, ni = 0, nk = 0, ctasks = 0, itasks = 0, ktasks = 0;
    for (int64_t r = 0; r < w.nseq; ++r) {
        seq *q = &sq[r];
        sdpa__phase ph;
        const bool kv_inline = q->x.kernel->verify != NULL && q->run_plan.check_finite;
        sdpa__check_begin(&q->chk, &q->chk_plan, !kv_inline, tws, w.thread_bytes, w.threads, &ph);
        if (ph.ntasks > 0) {
            cu[nc++] = (unit){ctasks, ph.ntasks, ph.fn, ph.ctx};
            ctasks += ph.ntasks;
        }
        q->x.kernel->prepare(&q->run_plan, shared + q->shared_at, tws, w.thread_bytes, &q->w);
    }
    unit *iu = ku + n; /* after the other kernels' units */
    for (int pass = 0; pass < 2; ++pass)
        for (int64_t r = 0; r < w.nseq; ++r) {
            seq *q = &sq[r];
            if (q->w.items == 0)
                continue;
            if (q->x.kernel->verify != NULL) {
                if (pass == 0) {
                    iu[ni++] = (unit){itasks, q->w.items, q->w.item, q->w.ctx};
                    itasks += q->w.items;
                }
                continue;
            }
            if ((q->run_plan.L > VARLEN_SMALL_L) != (pass == 0))
                continue;
            ku[nk++] = (unit){ktasks, q->w.items, q->w.item, q->w.ctx};
            ktasks += q->w.items;
        }
    units cus = {cu, nc}, ius = {iu, ni}, kus = {ku, nk};
    batch_gate g = {sq, w.nseq, false};
    sdpa__phase ph[3] = {{ctasks, units_task, &cus, checks_passed, &g},
                         {itasks, units_task, &ius, inline_checks_passed, &g},
                         {ktasks, units_task, &kus, NULL, NULL}};
    st = sdpa__run_phases(&p->exec, w.threads, ph, 3);
    if (st != SDPA_OK) { /* a hook that broke its contract */
        free(sq_owned);
        free(owned);
        return st;
    }

    int64_t first_bad = -1;
    sdpa_status bad_st = SDPA_OK;
    for (int64_t r = 0; r < w.nseq && g.stopped && first_bad < 0; ++r) /* a scan in order finds it */
        if ((bad_st = sdpa__check_values(&sq[r].chk_plan, true, w.threads, tws)) != SDPA_OK)
            first_bad = r;
    if (g.stopped && first_bad < 0)
        st = sdpa__fail(SDPA_ERR_INTERNAL, "%s: a sequence's checks gave two answers", p->fn);
    if (first_bad >= 0 && o == NULL)
        st = bad_st; /* a plain call: the check's message as it is */
    if (first_bad >= 0 && o != NULL) { /* name the sequence and its first packed row */
        int64_t rr = 0; /* its index among all sequences: the r of the message */
        for (int64_t r = 0, live = 0; r < o->num_seqs; ++r) {
            const int32_t Lr = o->cu_seqlens_q[r + 1] - o->cu_seqlens_q[r];
            if (Lr > 0 && p->Hq > 0 && live++ == first_bad) {
                rr = r;
                break;
            }
        }
        char msg[512];
        snprintf(msg, sizeof msg, "%s", sdpa_last_error_message());
        st = sdpa__fail(bad_st, "%s [in packed sequence r=%lld: the b=0 above stands for this sequence, its i for packed query row cu_seqlens_q[%lld] + i = %d + i, its j for the sequence's key j]",
                        msg, (long long)rr, (long long)rr, (int)o->cu_seqlens_q[rr]);
    }
    /* Each sequence's finish (decode's merge and writes). */
    for (int64_t r = 0; r < w.nseq && st == SDPA_OK; ++r)
        st = sq[r].w.finish(sq[r].w.ctx);
    free(sq_owned);
    free(owned);
    return st;
}

sdpa_status sdpa__varlen_run(const sdpa__plan *p, const sdpa_options *o) { return drive(p, o, o->workspace, o->workspace_bytes); }

/* ---- the cost query (cost.c, 0.6): what sdpa__varlen_run would plan, without running ---- */

void sdpa__varlen_sequence_plan(const sdpa__plan *p, const sdpa_options *o, int64_t r, sdpa__plan *s) {
    sequence_plan(p, o, r, s);
}

sdpa_status sdpa__varlen_exec(const char *fn, const sdpa__plan *p, const sdpa_options *o, int *threads, size_t *need,
                              sdpa__plan *last, sdpa__exec_plan *last_x, bool *any) {
    varlen_ws w;
    SDPA__TRY(layout(fn, p, o, &w, NULL));
    *threads = w.threads;
    *need = w.total;
    *any = false;
    for (int64_t r = o->num_seqs - 1; r >= 0 && !*any; --r) { /* sdpa_last_kernel names the last live one */
        sdpa__plan chk;
        SDPA__TRY(plan_sequence(fn, p, o, r, &chk, last, last_x, any));
    }
    return SDPA_OK;
}
