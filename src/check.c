/* The value checks of sdpa_attention, before anything is written: empty rows under policy
 * ERROR, and the finite check (NaN/Inf in a value that enters out or lse). Which keys a row
 * attends comes from rules.c. */
#include "internal.h"
#include "microkernel.h"
#include "load.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>


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

static sdpa_status report(const char *fn, const check_err *e);

typedef sdpa__check check_ctx;

/* Per thread: the first failure it met (its tasks come in increasing order), then S + 1 int32. */
static size_t per_thread(const sdpa__plan *p) {
    return sdpa__add_sat(sdpa__align64(sizeof(check_err)),
                         sdpa__align64(sdpa__mul_sat((size_t)p->S + 1, sizeof(int32_t))));
}

static bool check_task_body(const check_ctx *c, int64_t b, int64_t g, int32_t *cnt, check_err *e) {
    const sdpa__plan *p = c->p;
    const bool fin = p->check_finite, kv = fin && c->check_kv;
    const sdpa__mk *mk = (const sdpa__mk *)c->mk;
    const bool plain = !p->rules.has_mask && !p->rules.has_bias;
    uint8_t *used = (uint8_t *)cnt; /* with a mask or bias: S flags */
    if (kv)
        memset(cnt, 0, plain ? (size_t)(p->S + 1) * sizeof(int32_t) : (size_t)p->S);
    for (int64_t h = g * p->group; h < (g + 1) * p->group; ++h) {
        for (int64_t i = 0; i < p->L; ++i) {
            if (sdpa__rule_is_padding(&p->rules, b, i))
                continue;
            int64_t lo, hi;
            sdpa__rule_range(&p->rules, b, i, &lo, &hi);
            bool any = false;
            if (plain) {
                any = lo < hi;
                if (kv && any && h == g * p->group) { /* the range does not depend on h */
                    cnt[lo]++;
                    cnt[hi]--;
                }
            } else {
                const void *brow = p->rules.has_bias ? sdpa__rule_bias_row(&p->rules, b, h, i) : NULL;
                for (int64_t j = lo; j < hi; ++j) {
                    if (p->rules.has_mask && !sdpa__rule_mask_allows(&p->rules, b, h, i, j))
                        continue;
                    if (brow) {
                        const float bv = sdpa__rule_bias_at(&p->rules, brow, j);
                        if (sdpa__rule_bias_blocks(bv))
                            continue;
                        if (fin && !isfinite(bv)) {
                            e->kind = ERR_BIAS; e->h = h; e->i = i; e->j = j; e->value = bv;
                            return false;
                        }
                    }
                    any = true;
                    if (!kv) {
                        if (!fin || !p->rules.has_bias)
                            break; /* later entries matter only for the bias check or K/V rows */
                        continue;
                    }
                    used[j] = 1;
                }
            }
            /* A query row with no allowed key is never read, so it is not inspected. */
            if (any && fin &&
                !p->load_q->row_finite(mk, &p->q, b, h, i)) {
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
        if (!p->load_k->row_finite(mk, &p->k, b, g, j)) {
            e->kind = ERR_KROW; e->h = g; e->j = j;
            return false;
        }
        if (p->Ev > 0 &&
            !p->load_v->row_finite(mk, &p->v, b, g, j)) {
            e->kind = ERR_VROW; e->h = g; e->j = j;
            return false;
        }
    }
    return true;
}

static void check_task(void *vctx, int64_t task, int tid) {
    check_ctx *c = (check_ctx *)vctx;
    unsigned char *ws = c->ws + (size_t)tid * c->stride;
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

/* The check of tasks [0, ntasks) as a phase of a region (sdpa__run_phases). */
static void check_begin(check_ctx *c, const sdpa__plan *p, const sdpa__mk *mk, bool check_kv, int64_t ntasks,
                        unsigned char *tws, size_t stride, int threads, sdpa__phase *ph) {
    c->p = p;
    c->mk = mk;
    c->need_empty = p->empty_rows == SDPA_EMPTY_ROWS_ERROR;
    c->check_kv = check_kv;
    c->ws = tws;
    c->stride = stride;
    c->threads = threads < 1 ? 1 : threads;
    c->ntasks = (!c->need_empty && !p->check_finite) ? 0 : ntasks;
    atomic_init(&c->first_bad, (long long)c->ntasks);
    if (c->ntasks > 0)
        for (int t = 0; t < c->threads; ++t)
            ((check_err *)(c->ws + (size_t)t * c->stride))->kind = ERR_NONE;
    ph->ntasks = c->ntasks;
    ph->fn = check_task;
    ph->ctx = c;
    ph->gate = sdpa__check_passed_gate;
    ph->gate_ctx = c;
}

bool sdpa__check_failed(const sdpa__check *c) {
    return atomic_load_explicit(&((sdpa__check *)c)->first_bad, memory_order_acquire) < (long long)c->ntasks;
}

bool sdpa__check_passed_gate(void *c) { return !sdpa__check_failed((const sdpa__check *)c); }

static sdpa_status check_run(const sdpa__plan *p, const sdpa__mk *mk, int threads, bool check_kv, int64_t ntasks,
                             void *ws);

/* After the region: the failure of a sequential scan (or SDPA_OK). Per-thread slots are read
 * only when a task failed (then the region stopped before any later phase reused them). */
static sdpa_status check_end(check_ctx *c) {
    if (!sdpa__check_failed(c))
        return SDPA_OK;
    const sdpa__plan *p = c->p;
    const check_err *e = NULL;
    for (int t = 0; t < c->threads; ++t) {
        const check_err *x = (const check_err *)(c->ws + (size_t)t * c->stride);
        if (x->kind != ERR_NONE && (e == NULL || x->task < e->task))
            e = x;
    }
    if (e == NULL)
        return sdpa__fail(SDPA_ERR_INTERNAL, "%s: a value check failed without a record", p->fn);
    if (!c->check_kv && p->check_finite && e->task > 0) {
        /* K/V rows are left to the kernel, but in the scan's order those of the earlier tasks
         * come before this failure: check them, so the failure named is the full scan's. */
        const check_err first = *e;
        const sdpa_status st = check_run(p, (const sdpa__mk *)c->mk, c->threads, true, first.task, c->ws);
        if (st != SDPA_OK)
            return st;
        return report(p->fn, &first);
    }
    return report(p->fn, e);
}

sdpa_status sdpa__check_end(sdpa__check *c) { return check_end(c); }

/* The checks of tasks [0, ntasks) in a region of their own; see sdpa__check_values. */
static sdpa_status check_run(const sdpa__plan *p, const sdpa__mk *mk, int threads, bool check_kv, int64_t ntasks,
                             void *ws) {
    check_ctx c;
    sdpa__phase ph;
    check_begin(&c, p, mk, check_kv, ntasks, (unsigned char *)ws, per_thread(p), threads, &ph);
    if ((int64_t)threads > ntasks)
        threads = (int)ntasks;
    const sdpa_status st = sdpa__run_phases(&p->exec, threads, &ph, 1);
    return st != SDPA_OK ? st : check_end(&c);
}

static sdpa_status report(const char *fn, const check_err *e) {
    const long long b = (long long)e->b, h = (long long)e->h, i = (long long)e->i, j = (long long)e->j;
    switch (e->kind) {
    case ERR_BIAS:
        return sdpa__fail_on(SDPA_ERR_NON_FINITE, SDPA__SUBJECT_BIAS,
                             "%s: bias at (b=%lld,h=%lld,i=%lld,j=%lld) is %s on an allowed pair", fn, b, h, i, j,
                             isnan(e->value) ? "NaN" : "+Inf");
    case ERR_QROW:
        return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: query row (b=%lld,h=%lld,i=%lld) holds NaN or Inf", fn, b, h, i);
    case ERR_EMPTY:
        return sdpa__fail(SDPA_ERR_EMPTY_ROW,
                          "%s: query row (b=%lld,h=%lld,i=%lld) has no allowed key (use SDPA_EMPTY_ROWS_ZERO to get a zero row)",
                          fn, b, h, i);
    case ERR_KROW:
        return sdpa__fail_kv_row(fn, e->b, e->h, e->j, false);
    default:
        return sdpa__fail_kv_row(fn, e->b, e->h, e->j, true);
    }
}

int sdpa__check_threads(const sdpa__plan *p) {
    /* The checks scan q, K, V (and mask/bias rows): about 2 MB per thread at least. */
    double scan = 4.0 * (double)p->B * ((double)p->Hq * (double)p->L * (double)p->E +
                                        (double)p->Hkv * (double)p->S * (double)(p->E + p->Ev));
    if (p->rules.has_mask || p->rules.has_bias)
        scan += (double)p->B * (double)p->Hq * (double)p->L * (double)p->S;
    int64_t t = p->num_threads < SDPA__MAX_THREADS ? p->num_threads : SDPA__MAX_THREADS;
    const double most = scan / (2e6 * sdpa__thread_work_scale(&p->exec, p->num_threads)); /* (threads.c) */
    if ((double)t > most)
        t = (int64_t)most;
    if (t > p->B * p->Hkv)
        t = p->B * p->Hkv;
    return t < 1 ? 1 : (int)t;
}

size_t sdpa__check_thread_bytes(const sdpa__plan *p) { return per_thread(p); }

void sdpa__check_begin(sdpa__check *c, const sdpa__plan *p, bool check_kv, unsigned char *tws, size_t stride,
                       int threads, sdpa__phase *ph) {
    check_begin(c, p, p->ctx.mk, check_kv, p->B * p->Hkv, tws, stride, threads, ph);
}

size_t sdpa__check_workspace_bytes(const sdpa__plan *p, int threads) {
    return sdpa__mul_sat(per_thread(p), (size_t)(threads < 1 ? 1 : threads));
}

sdpa_status sdpa__check_values(const sdpa__plan *p, bool check_kv, int threads, void *ws) {
    return check_run(p, p->ctx.mk, threads, check_kv, p->B * p->Hkv, ws);
}
