/*
 * 0.5 serving features: attention sinks, ALiBi slopes, caller thread pools.
 *
 * Oracles: a float64 reference written here from DESIGN section 4 (steps 3 and 5) with its
 * own loops (sinks in max and denominator only; ALiBi s -= slope * |p - j|), the ALiBi slope
 * formula written out independently (the paper / Hugging Face form: start * ratio^i), an
 * explicit bias tensor equal to the ALiBi term, and the library's own built-in threads (a pool
 * or hook must give the same bits). pthread_create is interposed to count the threads the
 * library creates.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sdpa.h"

/* ------------------------------------------------------ pthread_create counter */

#include "pthread_counter.h" /* g_creates: the threads this process created */

/* -------------------------------------------------------------------- problem */

typedef struct prob {
    int64_t B, Hq, Hkv, L, S, E, Ev;
    float *q, *k, *v;
    int causal, alignment;
    int64_t offsets[8], klen[8], qlen[8];
    int use_klen, use_qlen;
    float sinks[64];
    int use_sinks;
    float slopes[8 * 64];
    int slopes_rank;
    int empty_zero;
} prob;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(double lo, double hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (double)(g_rng >> 11) / 9007199254740992.0;
}

static float *frand(int64_t n, double lo, double hi) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (int64_t t = 0; t < n; ++t)
        x[t] = (float)urand(lo, hi);
    return x;
}

static void prob_init(prob *P, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E, int64_t Ev) {
    memset(P, 0, sizeof *P);
    P->B = B; P->Hq = Hq; P->Hkv = Hkv; P->L = L; P->S = S; P->E = E; P->Ev = Ev;
    P->q = frand(B * Hq * L * E, -1.5, 1.5);
    P->k = frand(B * Hkv * S * E, -1.5, 1.5);
    P->v = frand(B * Hkv * S * Ev, -2, 2);
    for (int64_t h = 0; h < Hq; ++h)
        P->sinks[h] = (float)urand(-1.0, 3.0);
}

static void prob_free(prob *P) {
    free(P->q);
    free(P->k);
    free(P->v);
}

static int64_t pos_of(const prob *P, int64_t b, int64_t i) {
    if (P->alignment == SDPA_ALIGN_BOTTOM_RIGHT)
        return i + (P->use_klen ? P->klen[b] : P->S) - (P->use_qlen ? P->qlen[b] : P->L);
    if (P->alignment == SDPA_ALIGN_OFFSETS)
        return i + P->offsets[b];
    return i;
}

static double slope_of(const prob *P, int64_t b, int64_t h) {
    if (P->slopes_rank == 0)
        return 0.0;
    return P->slopes[P->slopes_rank == 2 ? b * P->Hq + h : h];
}

/* float64 reference: out [B,Hq,L,Ev], lse [B,Hq,L]. */
static void reference(const prob *P, double *out, double *lse) {
    const int64_t grp = P->Hq / P->Hkv;
    for (int64_t b = 0; b < P->B; ++b)
        for (int64_t h = 0; h < P->Hq; ++h)
            for (int64_t i = 0; i < P->L; ++i) {
                double *o = out + ((b * P->Hq + h) * P->L + i) * P->Ev;
                double *ls = lse + (b * P->Hq + h) * P->L + i;
                for (int64_t d = 0; d < P->Ev; ++d)
                    o[d] = 0.0;
                if (P->use_qlen && i >= P->qlen[b]) {
                    *ls = -INFINITY;
                    continue;
                }
                const int64_t p = pos_of(P, b, i), Sb = P->use_klen ? P->klen[b] : P->S;
                const float *qr = P->q + ((b * P->Hq + h) * P->L + i) * P->E;
                double s[4096];
                int ok[4096];
                double m = -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < P->S; ++j) {
                    ok[j] = j < Sb && (!P->causal || j <= p);
                    if (!ok[j])
                        continue;
                    const float *kr = P->k + ((b * P->Hkv + h / grp) * P->S + j) * P->E;
                    double x = 0.0;
                    for (int64_t e = 0; e < P->E; ++e)
                        x += (double)qr[e] * (double)kr[e];
                    x /= sqrt((double)P->E);
                    x -= slope_of(P, b, h) * fabs((double)(p - j));
                    s[j] = x;
                    if (x > m)
                        m = x;
                    any = 1;
                }
                const double sink = P->use_sinks ? (double)P->sinks[h] : -INFINITY;
                if (!any) {
                    *ls = sink;
                    continue;
                }
                if (sink > m)
                    m = sink;
                double den = exp(sink - m);
                for (int64_t j = 0; j < P->S; ++j)
                    if (ok[j])
                        den += exp(s[j] - m);
                for (int64_t j = 0; j < P->S; ++j) {
                    if (!ok[j])
                        continue;
                    const double w = exp(s[j] - m) / den;
                    const float *vr = P->v + ((b * P->Hkv + h / grp) * P->S + j) * P->Ev;
                    for (int64_t d = 0; d < P->Ev; ++d)
                        o[d] += w * (double)vr[d];
                }
                *ls = m + log(den);
            }
}

/* Run the library: kernel, threads, optional pool / hook, optional bias instead of ALiBi. */
typedef struct runcfg {
    int kernel, threads;
    sdpa_threadpool *pool;
    sdpa_parallel_for_fn hook;
    void *hook_ctx;
    int hook_threads;
    const sdpa_tensor *bias;
    int no_alibi;
    int sinks_neg_inf; /* pass a sinks array of -inf */
} runcfg;

static sdpa_status run(const prob *P, const runcfg *c, float *out, float *lse) {
    sdpa_tensor tq, tk, tv, to, tl;
    const int64_t qs[4] = {P->B, P->Hq, P->L, P->E}, ks[4] = {P->B, P->Hkv, P->S, P->E},
                  vs[4] = {P->B, P->Hkv, P->S, P->Ev}, os[4] = {P->B, P->Hq, P->L, P->Ev}, ls[3] = {P->B, P->Hq, P->L};
    assert_int_equal(sdpa_tensor_init(&tq, P->q, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tk, P->k, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tv, P->v, 4, vs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, out, 4, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = c->kernel;
    o.num_threads = c->threads;
    o.causal = P->causal;
    o.alignment = P->alignment;
    o.query_offsets = P->offsets;
    o.key_lengths = P->use_klen ? P->klen : NULL;
    o.query_lengths = P->use_qlen ? P->qlen : NULL;
    o.empty_rows = P->empty_zero ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    float ninf[64]; /* per call: run() is used from several threads */
    for (int h = 0; h < 64; ++h)
        ninf[h] = -INFINITY;
    o.sinks = c->sinks_neg_inf ? ninf : (P->use_sinks ? P->sinks : NULL);
    if (P->slopes_rank && !c->no_alibi) {
        o.alibi_slopes = P->slopes;
        o.alibi_slopes_rank = P->slopes_rank;
    }
    o.bias = c->bias;
    o.threadpool = c->pool;
    o.parallel_for = c->hook;
    o.parallel_for_ctx = c->hook_ctx;
    o.parallel_for_threads = c->hook_threads;
    return sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
}

static const int KERNELS[3] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
static const char *const KNAMES[3] = {"reference", "tiled", "decode"};

/* Compare against the float64 reference; returns the max abs error of out and lse. */
static void expect_close(const prob *P, const float *out, const float *lse, double tol, const char *what) {
    const int64_t no = P->B * P->Hq * P->L * P->Ev, nl = P->B * P->Hq * P->L;
    double *ro = malloc((size_t)(no > 0 ? no : 1) * sizeof(double)), *rl = malloc((size_t)nl * sizeof(double));
    reference(P, ro, rl);
    double eo = 0.0, el = 0.0;
    for (int64_t t = 0; t < no; ++t)
        eo = fmax(eo, fabs((double)out[t] - ro[t]));
    for (int64_t t = 0; t < nl; ++t) {
        if (isinf(rl[t]) || isinf(lse[t])) {
            if (!(rl[t] == (double)lse[t]))
                fail_msg("%s: lse[%lld] = %g, reference %g", what, (long long)t, (double)lse[t], rl[t]);
            continue;
        }
        el = fmax(el, fabs((double)lse[t] - rl[t]));
    }
    if (eo > tol || el > tol)
        fail_msg("%s: max |out - ref| = %.3g, |lse - ref| = %.3g > %.3g", what, eo, el, tol);
    free(ro);
    free(rl);
}

static float *fbuf(int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(x);
    for (int64_t t = 0; t < n; ++t)
        x[t] = 12345.0f;
    return x;
}

/* ------------------------------------------------------------------------ sinks */

static void sinks_match_reference_every_kernel(void **state) {
    (void)state;
    struct { int64_t B, Hq, Hkv, L, S, E, Ev; int causal, align; } cases[] = {
        {2, 4, 2, 3, 37, 16, 8, 1, SDPA_ALIGN_BOTTOM_RIGHT},
        {1, 8, 1, 1, 300, 32, 32, 0, SDPA_ALIGN_TOP_LEFT},
        {2, 2, 2, 70, 90, 8, 12, 1, SDPA_ALIGN_TOP_LEFT},
        {1, 2, 1, 4, 2100, 16, 16, 1, SDPA_ALIGN_BOTTOM_RIGHT}, /* decode splits the keys */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        prob P;
        prob_init(&P, cases[c].B, cases[c].Hq, cases[c].Hkv, cases[c].L, cases[c].S, cases[c].E, cases[c].Ev);
        P.causal = cases[c].causal;
        P.alignment = cases[c].align;
        P.use_sinks = 1;
        P.sinks[0] = 30.0f; /* a sink far above every score: out tiny, lse ~ sink */
        const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
        for (int kk = 0; kk < 3; ++kk) {
            float *out = fbuf(no), *lse = fbuf(nl);
            runcfg rc = {.kernel = KERNELS[kk], .threads = 2};
            assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
            char what[96];
            snprintf(what, sizeof what, "sinks case %zu kernel %s", c, KNAMES[kk]);
            expect_close(&P, out, lse, 3e-5, what);
            free(out);
            free(lse);
        }
        prob_free(&P);
    }
}

/* Empty rows under ZERO: out 0, lse = the sink; padding rows: lse -inf; -inf sinks = none. */
static void sinks_empty_rows_and_padding(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 3, 2, 1, 3, 40, 8, 8);
    P.use_sinks = 1;
    P.empty_zero = 1;
    P.use_klen = 1;
    P.klen[0] = 0;  /* every row of batch 0 empty */
    P.klen[1] = 40;
    P.klen[2] = 17;
    P.use_qlen = 1;
    P.qlen[0] = 3;
    P.qlen[1] = 2; /* row 2 of batch 1 is padding */
    P.qlen[2] = 3;
    const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
    for (int kk = 0; kk < 3; ++kk) {
        float *out = fbuf(no), *lse = fbuf(nl);
        runcfg rc = {.kernel = KERNELS[kk], .threads = 1};
        assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
        for (int64_t h = 0; h < P.Hq; ++h)
            for (int64_t i = 0; i < P.L; ++i) {
                assert_true(lse[(0 * P.Hq + h) * P.L + i] == P.sinks[h]);
                for (int64_t d = 0; d < P.Ev; ++d)
                    assert_true(out[((0 * P.Hq + h) * P.L + i) * P.Ev + d] == 0.0f);
            }
        assert_true(isinf(lse[(1 * P.Hq + 0) * P.L + 2]) && lse[(1 * P.Hq + 0) * P.L + 2] < 0);
        expect_close(&P, out, lse, 3e-5, KNAMES[kk]);
        /* a -inf sink is no sink, bit for bit */
        float *o2 = fbuf(no), *l2 = fbuf(nl), *o3 = fbuf(no), *l3 = fbuf(nl);
        P.use_sinks = 0;
        assert_int_equal(run(&P, &rc, o2, l2), SDPA_OK);
        runcfg rn = rc;
        rn.sinks_neg_inf = 1;
        assert_int_equal(run(&P, &rn, o3, l3), SDPA_OK);
        assert_memory_equal(o2, o3, (size_t)no * sizeof(float));
        assert_memory_equal(l2, l3, (size_t)nl * sizeof(float));
        P.use_sinks = 1;
        free(out); free(lse); free(o2); free(l2); free(o3); free(l3);
    }
    prob_free(&P);
}

/* The reported bug class: one query alone equals the same query inside a longer batch (causal
 * bottom-right: the last row of an L-row call is the decode row), with sinks, and decode vs
 * tiled. */
static void sinks_single_query_equals_batched(void **state) {
    (void)state;
    const int64_t S = 777, E = 32, Hq = 4, Hkv = 2, Lbig = 9;
    prob big, one;
    prob_init(&big, 1, Hq, Hkv, Lbig, S, E, E);
    prob_init(&one, 1, Hq, Hkv, 1, S, E, E);
    memcpy(one.k, big.k, (size_t)(Hkv * S * E) * sizeof(float));
    memcpy(one.v, big.v, (size_t)(Hkv * S * E) * sizeof(float));
    for (int64_t h = 0; h < Hq; ++h)
        memcpy(one.q + h * E, big.q + (h * Lbig + Lbig - 1) * E, (size_t)E * sizeof(float));
    memcpy(one.sinks, big.sinks, sizeof big.sinks);
    big.causal = one.causal = 1;
    big.alignment = one.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    big.use_sinks = one.use_sinks = 1;
    float *ob = fbuf(Hq * Lbig * E), *lb = fbuf(Hq * Lbig);
    runcfg tiled = {.kernel = SDPA_KERNEL_TILED, .threads = 2};
    assert_int_equal(run(&big, &tiled, ob, lb), SDPA_OK);
    expect_close(&big, ob, lb, 3e-5, "batched");
    for (int kk = 0; kk < 3; ++kk) {
        float *o1 = fbuf(Hq * E), *l1 = fbuf(Hq);
        runcfg rc = {.kernel = KERNELS[kk], .threads = 2};
        assert_int_equal(run(&one, &rc, o1, l1), SDPA_OK);
        /* The largest difference, NaN included (!(x <= e)). Not fmax: gcc 12 for aarch64 stops
         * with an internal compiler error (vect_transform_reduction) vectorising an fmax
         * reduction over this loop at -O2; a compare-and-select reduction compiles everywhere. */
        double e = 0.0;
        for (int64_t h = 0; h < Hq; ++h) {
            for (int64_t d = 0; d < E; ++d) {
                const double x = fabs((double)o1[h * E + d] - (double)ob[(h * Lbig + Lbig - 1) * E + d]);
                e = !(x <= e) ? x : e;
            }
            const double x = fabs((double)l1[h] - (double)lb[h * Lbig + Lbig - 1]);
            e = !(x <= e) ? x : e;
        }
        if (e > 2e-6)
            fail_msg("single query (%s) vs batched tiled: max diff %.3g", KNAMES[kk], e);
        free(o1);
        free(l1);
    }
    free(ob);
    free(lb);
    prob_free(&big);
    prob_free(&one);
}

/* sdpa_merge with sinks: include the sink in exactly one part. */
static void sinks_with_merge(void **state) {
    (void)state;
    const int64_t S = 100, Sa = 37, E = 16, Hq = 2;
    prob all, a, bpart;
    prob_init(&all, 1, Hq, 1, 2, S, E, E);
    prob_init(&a, 1, Hq, 1, 2, Sa, E, E);
    prob_init(&bpart, 1, Hq, 1, 2, S - Sa, E, E);
    memcpy(a.q, all.q, (size_t)(Hq * 2 * E) * sizeof(float));
    memcpy(bpart.q, all.q, (size_t)(Hq * 2 * E) * sizeof(float));
    memcpy(a.k, all.k, (size_t)(Sa * E) * sizeof(float));
    memcpy(a.v, all.v, (size_t)(Sa * E) * sizeof(float));
    memcpy(bpart.k, all.k + Sa * E, (size_t)((S - Sa) * E) * sizeof(float));
    memcpy(bpart.v, all.v + Sa * E, (size_t)((S - Sa) * E) * sizeof(float));
    memcpy(a.sinks, all.sinks, sizeof all.sinks);
    all.use_sinks = a.use_sinks = 1; /* part b without the sink */
    float oa[64], la[4], ob[64], lb[4], om[64], lm[4];
    runcfg rc = {.kernel = SDPA_KERNEL_AUTO, .threads = 1};
    assert_int_equal(run(&a, &rc, oa, la), SDPA_OK);
    assert_int_equal(run(&bpart, &rc, ob, lb), SDPA_OK);
    sdpa_tensor ta, tla, tb, tlb, tm, tlm;
    const int64_t os[3] = {Hq, 2, E}, ls[2] = {Hq, 2};
    assert_int_equal(sdpa_tensor_init(&ta, oa, 3, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tb, ob, 3, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tm, om, 3, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tla, la, 2, ls), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tlb, lb, 2, ls), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tlm, lm, 2, ls), SDPA_OK);
    assert_int_equal(sdpa_merge(&ta, &tla, &tb, &tlb, &tm, &tlm), SDPA_OK);
    expect_close(&all, om, lm, 3e-5, "merge with the sink in one part");
    prob_free(&all);
    prob_free(&a);
    prob_free(&bpart);
}


/* Rows float32 cannot carry (the unnormalised P.V sum overflows: two keys of V near FLT_MAX)
 * are redone in double (fallback_double.c): the sink must be in that path too. */
static void sinks_in_double_fallback(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 2, 1, 1, 2, 4, 3);
    for (int t = 0; t < 8; ++t) P.q[t] = 0.0f; /* equal scores */
    for (int t = 0; t < 6; ++t) P.v[t] = 3.0e38f;
    P.use_sinks = 1;
    P.sinks[0] = 0.0f;
    P.sinks[1] = 1.0f;
    for (int kk = 0; kk < 3; ++kk) {
        float out[6], lse[2];
        runcfg rc = {.kernel = KERNELS[kk], .threads = 1};
        assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
        for (int h = 0; h < 2; ++h) {
            const double want = 3.0e38 * 2.0 / (2.0 + exp((double)P.sinks[h]));
            for (int d = 0; d < 3; ++d)
                if (fabs((double)out[h * 3 + d] - want) > 1e-6 * want)
                    fail_msg("%s head %d: out %.9g, want %.9g", KNAMES[kk], h, (double)out[h * 3 + d], want);
            assert_true(fabs((double)lse[h] - log(2.0 + exp((double)P.sinks[h]))) < 1e-6);
        }
    }
    prob_free(&P);
}

/* The reference kernel's weights: probabilities with sinks sum to 1 - exp(sink - lse); the
 * MASKED score stage holds the ALiBi term exactly as the explicit bias does. */
static void weights_with_sinks_and_alibi(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 2, 1, 3, 20, 8, 8);
    P.causal = 1;
    P.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    P.use_sinks = 1;
    P.slopes_rank = 1;
    P.slopes[0] = 0.5f;
    P.slopes[1] = 0.125f;
    const int64_t qs[4] = {1, 2, 3, 8}, ks[4] = {1, 1, 20, 8}, os[4] = {1, 2, 3, 8}, ws[4] = {1, 2, 3, 20},
                  ls[3] = {1, 2, 3};
    float out[48], w[120], w2[120], lse[6], bias[120];
    sdpa_tensor tq, tk, tv, to, tw, tw2, tl, tb;
    assert_int_equal(sdpa_tensor_init(&tq, P.q, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tk, P.k, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tv, P.v, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, out, 4, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tw, w, 4, ws), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tw2, w2, 4, ws), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tb, bias, 4, ws), SDPA_OK);
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 20; ++j) {
                const int64_t d = pos_of(&P, 0, i) - j;
                bias[(h * 3 + i) * 20 + j] = -(P.slopes[h] * (float)(d < 0 ? -d : d));
            }
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = 1;
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.sinks = P.sinks;
    o.alibi_slopes = P.slopes;
    o.alibi_slopes_rank = 1;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, &tl), SDPA_OK);
    expect_close(&P, out, lse, 3e-5, "reference with weights");
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 3; ++i) {
            double sum = 0.0;
            for (int j = 0; j < 20; ++j)
                sum += w[(h * 3 + i) * 20 + j];
            const double want = 1.0 - exp((double)P.sinks[h] - (double)lse[h * 3 + i]);
            if (fabs(sum - want) > 1e-5)
                fail_msg("head %d row %d: weights sum %.7g, want 1 - exp(sink - lse) = %.7g", h, i, sum, want);
        }
    o.weights_stage = SDPA_WEIGHTS_MASKED;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, NULL), SDPA_OK);
    o.alibi_slopes = NULL;
    o.alibi_slopes_rank = 0;
    o.bias = &tb;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, &tw2, NULL), SDPA_OK);
    assert_memory_equal(w, w2, sizeof w);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ ALiBi */

/* The slopes written out independently: the geometric form start * ratio^i of the paper's code. */
static void alibi_slopes_formula(void **state) {
    (void)state;
    const int64_t Hs[3] = {8, 12, 40};
    for (int c = 0; c < 3; ++c) {
        const int64_t H = Hs[c];
        float got[64];
        assert_int_equal(sdpa_alibi_slopes(H, 8.0f, got), SDPA_OK);
        int64_t n = 1;
        while (n * 2 <= H)
            n *= 2;
        double want[64];
        const double start = pow(2.0, -8.0 / (double)n); /* 2^(-8/n), ratio = start */
        double x = start;
        for (int64_t i = 0; i < n; ++i, x *= start)
            want[i] = x;
        const double start2 = pow(2.0, -8.0 / (double)(2 * n));
        x = start2; /* slopes of 2n heads, every other one from the first */
        for (int64_t i = 0, t = 0; n + t < H; ++i, x *= start2)
            if (i % 2 == 0)
                want[n + t++] = x;
        for (int64_t i = 0; i < H; ++i)
            if (fabs((double)got[i] - want[i]) > 1e-6 * want[i])
                fail_msg("H=%lld slope %lld: %.9g, formula %.9g", (long long)H, (long long)i, (double)got[i], want[i]);
    }
    float s8[8];
    assert_int_equal(sdpa_alibi_slopes(8, 8.0f, s8), SDPA_OK);
    for (int i = 0; i < 8; ++i)
        assert_true(s8[i] == ldexpf(1.0f, -(i + 1))); /* 1/2 ... 1/256 exactly */
    float s12[12];
    assert_int_equal(sdpa_alibi_slopes(12, 8.0f, s12), SDPA_OK);
    assert_true(fabs((double)s12[8] - pow(2.0, -0.5)) < 1e-7); /* 2^(-8 * 1/16) */
    assert_true(fabs((double)s12[11] - pow(2.0, -3.5)) < 1e-7); /* 2^(-8 * 7/16) */
    float dummy[1] = {7.0f};
    assert_int_equal(sdpa_alibi_slopes(0, 8.0f, dummy), SDPA_ERR_INVALID_ARGUMENT);
    assert_int_equal(sdpa_alibi_slopes(4, 0.0f, dummy), SDPA_ERR_INVALID_ARGUMENT);
    assert_int_equal(sdpa_alibi_slopes(4, NAN, dummy), SDPA_ERR_INVALID_ARGUMENT);
    assert_int_equal(sdpa_alibi_slopes(4, 8.0f, NULL), SDPA_ERR_NULL_POINTER);
    /* more floats than an object can hold: a status, at once (the power-of-two search of an
     * earlier version overflowed int64 for H >= 2^62 and never ended) */
    assert_int_equal(sdpa_alibi_slopes(((int64_t)1 << 62) + 1, 8.0f, dummy), SDPA_ERR_SIZE_OVERFLOW);
    assert_int_equal(sdpa_alibi_slopes(INT64_MAX, 8.0f, dummy), SDPA_ERR_SIZE_OVERFLOW);
    assert_true(dummy[0] == 7.0f);
}

/* Each serving entry point leaves "" as the message when it succeeds after a failed call
 * (sdpa_last_error_message: "" when the last call on this thread succeeded). */
static void serving_calls_clear_the_message(void **state) {
    (void)state;
    float s[4];
    float dummy[1];
    assert_int_equal(sdpa_alibi_slopes(0, 8.0f, dummy), SDPA_ERR_INVALID_ARGUMENT);
    assert_true(strlen(sdpa_last_error_message()) > 0);
    assert_int_equal(sdpa_alibi_slopes(4, 8.0f, s), SDPA_OK);
    assert_string_equal(sdpa_last_error_message(), "");

    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(0, &pool), SDPA_ERR_INVALID_ARGUMENT);
    assert_true(strlen(sdpa_last_error_message()) > 0);
    assert_int_equal(sdpa_threadpool_create(2, &pool), SDPA_OK);
    assert_string_equal(sdpa_last_error_message(), "");
    sdpa_threadpool_destroy(pool);

    float cache[2 * 4 * 2] = {0}, row[2] = {1.0f, 2.0f};
    sdpa_tensor kc, kr;
    assert_int_equal(sdpa_tensor_init_4d(&kc, cache, 2, 1, 4, 2), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_3d(&kr, row, 1, 1, 2), SDPA_OK);
    const int64_t bad_slot[1] = {8}, slot[1] = {5};
    assert_int_equal(sdpa_kv_write(&kc, NULL, &kr, NULL, bad_slot), SDPA_ERR_INDEX);
    assert_true(strlen(sdpa_last_error_message()) > 0);
    assert_int_equal(sdpa_kv_write(&kc, NULL, &kr, NULL, slot), SDPA_OK);
    assert_string_equal(sdpa_last_error_message(), "");
    assert_true(cache[5 * 2] == 1.0f && cache[5 * 2 + 1] == 2.0f);
}

/* ALiBi vs the reference and vs an explicit bias tensor, every kernel, several alignments. */
static void alibi_matches_bias_and_reference(void **state) {
    (void)state;
    struct { int64_t B, Hq, Hkv, L, S; int causal, align, rank, klen; } cases[] = {
        {2, 4, 2, 3, 50, 1, SDPA_ALIGN_BOTTOM_RIGHT, 1, 0},
        {2, 4, 4, 70, 90, 1, SDPA_ALIGN_TOP_LEFT, 2, 0},
        {2, 2, 1, 2, 600, 1, SDPA_ALIGN_OFFSETS, 2, 1},
        {1, 12, 4, 1, 1100, 0, SDPA_ALIGN_BOTTOM_RIGHT, 1, 0},
        {2, 4, 2, 5, 40, 0, SDPA_ALIGN_TOP_LEFT, 1, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        prob P;
        prob_init(&P, cases[c].B, cases[c].Hq, cases[c].Hkv, cases[c].L, cases[c].S, 16, 8);
        P.causal = cases[c].causal;
        P.alignment = cases[c].align;
        P.slopes_rank = cases[c].rank;
        float base[64];
        assert_int_equal(sdpa_alibi_slopes(P.Hq, 8.0f, base), SDPA_OK);
        for (int64_t b = 0; b < P.B; ++b) {
            for (int64_t h = 0; h < P.Hq; ++h)
                P.slopes[P.slopes_rank == 2 ? b * P.Hq + h : h] = P.slopes_rank == 2 ? base[h] * (float)(b + 1) : base[h];
            P.offsets[b] = P.S - P.L - 3 * b;
            P.klen[b] = P.S - 5 * b;
        }
        P.use_klen = cases[c].klen;
        /* the explicit bias [B, Hq, L, S] = -(slope * (float)|p - j|) */
        const int64_t nb = P.B * P.Hq * P.L * P.S;
        float *bias = malloc((size_t)nb * sizeof(float));
        for (int64_t b = 0; b < P.B; ++b)
            for (int64_t h = 0; h < P.Hq; ++h)
                for (int64_t i = 0; i < P.L; ++i)
                    for (int64_t j = 0; j < P.S; ++j) {
                        const int64_t d = pos_of(&P, b, i) - j;
                        bias[((b * P.Hq + h) * P.L + i) * P.S + j] = -((float)slope_of(&P, b, h) * (float)(d < 0 ? -d : d));
                    }
        sdpa_tensor tb;
        const int64_t bs[4] = {P.B, P.Hq, P.L, P.S};
        assert_int_equal(sdpa_tensor_init(&tb, bias, 4, bs), SDPA_OK);
        const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
        for (int kk = 0; kk < 3; ++kk) {
            float *o1 = fbuf(no), *l1 = fbuf(nl), *o2 = fbuf(no), *l2 = fbuf(nl);
            runcfg ra = {.kernel = KERNELS[kk], .threads = 2};
            runcfg rb = {.kernel = KERNELS[kk], .threads = 2, .bias = &tb, .no_alibi = 1};
            assert_int_equal(run(&P, &ra, o1, l1), SDPA_OK);
            assert_int_equal(run(&P, &rb, o2, l2), SDPA_OK);
            char what[96];
            snprintf(what, sizeof what, "alibi case %zu kernel %s", c, KNAMES[kk]);
            expect_close(&P, o1, l1, 3e-5, what);
            double e = 0.0;
            for (int64_t t = 0; t < no; ++t)
                e = fmax(e, fabs((double)o1[t] - (double)o2[t]));
            for (int64_t t = 0; t < nl; ++t)
                e = fmax(e, fabs((double)l1[t] - (double)l2[t]));
            if (e != 0.0) /* s - term and s + (-term) are the same float: the same bits */
                fail_msg("%s: ALiBi vs explicit bias differ by %.3g", what, e);
            free(o1); free(l1); free(o2); free(l2);
        }
        free(bias);
        prob_free(&P);
    }
}

/* A slope so large that the float32 term overflows (-inf scores): the row is redone in double
 * and the nearest key takes all the weight. */
static void alibi_huge_slope(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 1, 1, 1, 8, 4, 2);
    P.slopes_rank = 1;
    P.slopes[0] = 1.0e38f;
    P.alignment = SDPA_ALIGN_OFFSETS;
    P.offsets[0] = 2; /* p = 2: key 2 has term 0, the others >= 1e38 (float32 inf from 4e38) */
    for (int kk = 0; kk < 3; ++kk) {
        float out[2], lse[1];
        runcfg rc = {.kernel = KERNELS[kk], .threads = 1};
        assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
        for (int d = 0; d < 2; ++d)
            if (!(fabsf(out[d] - P.v[2 * 2 + d]) <= 1e-6f))
                fail_msg("%s: out[%d] = %g, want v[2] = %g", KNAMES[kk], d, (double)out[d], (double)P.v[4 + d]);
        assert_true(isfinite(lse[0]));
    }
    prob_free(&P);
}

static void bad_sink_and_slope_arguments(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 2, 1, 2, 8, 4, 4);
    float out[16], lse[4];
    for (int t = 0; t < 16; ++t) out[t] = 99.0f;
    for (int t = 0; t < 4; ++t) lse[t] = 99.0f;
    runcfg rc = {.kernel = SDPA_KERNEL_AUTO, .threads = 1};
    P.use_sinks = 1;
    P.sinks[1] = NAN;
    assert_int_equal(run(&P, &rc, out, lse), SDPA_ERR_NON_FINITE);
    assert_non_null(strstr(sdpa_last_error_message(), "sinks[1]"));
    P.sinks[1] = INFINITY;
    assert_int_equal(run(&P, &rc, out, lse), SDPA_ERR_NON_FINITE);
    P.sinks[1] = 0.5f;
    P.slopes_rank = 1;
    P.slopes[0] = 0.5f;
    P.slopes[1] = NAN;
    assert_int_equal(run(&P, &rc, out, lse), SDPA_ERR_NON_FINITE);
    assert_non_null(strstr(sdpa_last_error_message(), "alibi_slopes[1]"));
    P.slopes[1] = 0.25f;
    P.slopes_rank = 3;
    assert_int_equal(run(&P, &rc, out, lse), SDPA_ERR_INVALID_ARGUMENT);
    for (int t = 0; t < 16; ++t) assert_true(out[t] == 99.0f);
    for (int t = 0; t < 4; ++t) assert_true(lse[t] == 99.0f);
    /* slopes without a rank */
    sdpa_options o;
    sdpa_options_init(&o);
    o.alibi_slopes = P.slopes;
    sdpa_tensor tq, tk, tv, to;
    const int64_t qs[4] = {1, 2, 2, 4}, ks[4] = {1, 1, 8, 4}, os[4] = {1, 2, 2, 4};
    assert_int_equal(sdpa_tensor_init(&tq, P.q, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tk, P.k, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tv, P.v, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, out, 4, os), SDPA_OK);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT);
    o.alibi_slopes = NULL;
    o.alibi_slopes_rank = 1;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_ERR_INVALID_ARGUMENT);
    for (int t = 0; t < 16; ++t) assert_true(out[t] == 99.0f);
    prob_free(&P);
}

/* ------------------------------------------------------------------ thread pools */

typedef struct hookstat {
    int64_t calls, max_ntasks;
    int reverse;
} hookstat;

/* A hook that runs the tasks on the calling thread, optionally in reverse order. */
static void serial_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    hookstat *hs = (hookstat *)ctx;
    hs->calls++;
    if (ntasks > hs->max_ntasks)
        hs->max_ntasks = ntasks;
    for (int64_t t = 0; t < ntasks; ++t)
        task(task_ctx, hs->reverse ? ntasks - 1 - t : t);
}

/* A hook that runs the tasks on a pair of threads the test creates per call. */
typedef struct pair_arg {
    sdpa_task_fn task;
    void *task_ctx;
    int64_t from, to;
} pair_arg;
static void *pair_main(void *a) {
    pair_arg *p = (pair_arg *)a;
    for (int64_t t = p->from; t < p->to; ++t)
        p->task(p->task_ctx, t);
    return NULL;
}
static void pair_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    (void)ctx;
    pthread_t th;
    pair_arg a = {task, task_ctx, 0, ntasks / 2}, b = {task, task_ctx, ntasks / 2, ntasks};
    assert_int_equal(pthread_create(&th, NULL, pair_main, &a), 0);
    pair_main(&b);
    pthread_join(th, NULL);
}

static void pools_bit_identical_and_create_no_thread(void **state) {
    (void)state;
    struct { int64_t B, Hq, Hkv, L, S; } cases[] = {
        {1, 32, 8, 1, 2048},  /* decode */
        {2, 8, 8, 200, 300},  /* tiled */
        {1, 16, 16, 1, 4096}, /* decode, split keys */
    };
    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(4, &pool), SDPA_OK);
    assert_int_equal(sdpa_threadpool_size(pool), 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        prob P;
        prob_init(&P, cases[c].B, cases[c].Hq, cases[c].Hkv, cases[c].L, cases[c].S, 64, 64);
        P.causal = 1;
        P.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        P.use_sinks = 1;
        P.slopes_rank = 1;
        assert_int_equal(sdpa_alibi_slopes(P.Hq, 8.0f, P.slopes), SDPA_OK);
        const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
        for (int kk = 0; kk < 3; ++kk) {
            if (KERNELS[kk] == SDPA_KERNEL_REFERENCE && P.L * P.S > 100000)
                continue;
            float *o0 = fbuf(no), *l0 = fbuf(nl), *o1 = fbuf(no), *l1 = fbuf(nl);
            runcfg builtin = {.kernel = KERNELS[kk], .threads = 4};
            g_creates = 0;
            assert_int_equal(run(&P, &builtin, o0, l0), SDPA_OK);
            if (KERNELS[kk] != SDPA_KERNEL_REFERENCE)
                assert_true(g_creates > 0); /* the counter sees the library's threads */
            hookstat hs = {0, 0, 0};
            runcfg variants[4] = {
                {.kernel = KERNELS[kk], .pool = pool},
                {.kernel = KERNELS[kk], .pool = pool, .threads = 2},
                {.kernel = KERNELS[kk], .hook = serial_hook, .hook_ctx = &hs, .hook_threads = 3},
                {.kernel = KERNELS[kk], .hook = pair_hook, .hook_threads = 2},
            };
            for (int vi = 0; vi < 4; ++vi) {
                hs.reverse = vi == 2;
                memset(o1, 0, (size_t)no * sizeof(float));
                g_creates = 0;
                assert_int_equal(run(&P, &variants[vi], o1, l1), SDPA_OK);
                if (vi < 3 && g_creates != 0)
                    fail_msg("case %zu %s variant %d: the library created %ld threads", c, KNAMES[kk], vi,
                             (long)g_creates);
                if (vi == 3 && g_creates > 16) /* the test's own hook threads only: one per hook call */
                    fail_msg("pair hook: %ld threads", (long)g_creates);
                if (memcmp(o0, o1, (size_t)no * sizeof(float)) != 0 || memcmp(l0, l1, (size_t)nl * sizeof(float)) != 0)
                    fail_msg("case %zu %s variant %d: not bit-identical to the built-in threads", c, KNAMES[kk], vi);
            }
            assert_true(hs.max_ntasks <= 3);
            free(o0); free(l0); free(o1); free(l1);
        }
        prob_free(&P);
    }
    sdpa_threadpool_destroy(pool);
    sdpa_threadpool_destroy(NULL);
}

typedef struct conc_arg {
    const prob *P;
    sdpa_threadpool *pool;
    const float *want, *want_decode;
    int bad;
} conc_arg;

static void *conc_main(void *a) {
    conc_arg *c = (conc_arg *)a;
    const int64_t no = c->P->B * c->P->Hq * c->P->L * c->P->Ev, nl = c->P->B * c->P->Hq * c->P->L;
    float *o = malloc((size_t)no * sizeof(float)), *l = malloc((size_t)nl * sizeof(float));
    for (int it = 0; it < 40; ++it) {
        runcfg rc = {.kernel = it % 2 ? SDPA_KERNEL_DECODE : SDPA_KERNEL_TILED, .pool = c->pool};
        if (run(c->P, &rc, o, l) != SDPA_OK || memcmp(o, it % 2 ? c->want_decode : c->want, (size_t)no * sizeof(float)) != 0)
            c->bad++;
    }
    free(o);
    free(l);
    return NULL;
}

/* One pool used by several application threads at once: every call still correct. */
static void pool_shared_by_threads(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 8, 2, 1, 1500, 32, 32);
    P.use_sinks = 1;
    const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
    float *want = fbuf(no), *l = fbuf(nl), *w2 = fbuf(no);
    runcfg r0 = {.kernel = SDPA_KERNEL_TILED, .threads = 1}, r1 = {.kernel = SDPA_KERNEL_DECODE, .threads = 1};
    assert_int_equal(run(&P, &r0, want, l), SDPA_OK);
    assert_int_equal(run(&P, &r1, w2, l), SDPA_OK);
    double e = 0.0;
    for (int64_t t = 0; t < no; ++t)
        e = fmax(e, fabs((double)want[t] - (double)w2[t]));
    assert_true(e < 1e-5);
    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(2, &pool), SDPA_OK);
    pthread_t th[3];
    conc_arg args[3];
    for (int t = 0; t < 3; ++t) {
        args[t].P = &P;
        args[t].pool = pool;
        args[t].want = want;
        args[t].want_decode = w2;
        args[t].bad = 0;
    }
    for (int t = 0; t < 3; ++t)
        assert_int_equal(pthread_create(&th[t], NULL, conc_main, &args[t]), 0);
    for (int t = 0; t < 3; ++t)
        pthread_join(th[t], NULL);
    sdpa_threadpool_destroy(pool);
    for (int t = 0; t < 3; ++t)
        assert_int_equal(args[t].bad, 0);
    free(want); free(l); free(w2);
    prob_free(&P);
}

/* Process CPU time in ms (every thread of it). */
static double cpu_ms_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Involuntary context switches of every thread of this process so far. */
static long process_preemptions(void) {
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_nivcsw : 0;
}

/* CPU time the process uses while the caller sleeps 60 ms right after a call on pool: the
 * largest of `tries` attempts, 100 ms apart; with stop_at_15, the first attempt that sees 15 ms
 * ends it. A worker that another thread preempted stops polling for a while (threadpool.c), so
 * an attempt counts only if no thread of this process was preempted during it or the gap
 * before it; *conclusive says how many did. */
static double idle_cpu_ms(const prob *P, sdpa_threadpool *pool, float *o, float *l, int tries, bool stop_at_15,
                          int *conclusive) {
    double most = 0.0;
    *conclusive = 0;
    for (int a = 0; a < tries; ++a) {
        const long p0 = process_preemptions();
        const struct timespec gap = {0, 100000000};
        nanosleep(&gap, NULL);
        runcfg rc = {.kernel = SDPA_KERNEL_DECODE, .pool = pool};
        assert_int_equal(run(P, &rc, o, l), SDPA_OK);
        const double c0 = cpu_ms_now();
        const struct timespec ts = {0, 60000000};
        nanosleep(&ts, NULL);
        const double used = cpu_ms_now() - c0;
        most = used > most ? used : most;
        *conclusive += process_preemptions() == p0;
        if (stop_at_15 && most >= 15.0)
            break;
    }
    return most;
}

/* How a pool waits (SDPA_POOL_SPIN_US, read at sdpa_threadpool_create): workers poll for the
 * next call that long, then sleep. Every policy gives the 1-thread bits, for calls back to back
 * and calls far enough apart that the workers sleep in between (the wake-up path), with more
 * threads than CPUs too; the polling is observable: with 100 ms the idle worker burns CPU
 * time while the caller sleeps; with 0, with a value that is not plain digits (" 100000"), or
 * with more threads than online CPUs, it does not. */
static void pool_wait_policies(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 8, 8, 1, 1024, 64, 64); /* 4 MiB of K/V: decode takes 2 threads of a pool */
    P.use_sinks = 1;
    const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
    float *want = fbuf(no), *want_tiled = fbuf(no), *o = fbuf(no), *l = fbuf(nl);
    runcfg r1 = {.kernel = SDPA_KERNEL_DECODE, .threads = 1}, t1 = {.kernel = SDPA_KERNEL_TILED, .threads = 1};
    assert_int_equal(run(&P, &t1, want_tiled, l), SDPA_OK);
    expect_close(&P, want_tiled, l, 2e-5, "tiled, 1 thread");
    assert_int_equal(run(&P, &r1, want, l), SDPA_OK);
    /* the first three get the long loop; the others (not plain digits in range: the default)
     * one call each */
    const char *const spins[] = {"0", "3", "100000", "abc", "-1", "100001", "", " 100000", "+100000"};
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int over = online >= 1 && online < 255 ? (int)online + 1 : 5; /* more threads than CPUs */
    const int sizes[] = {2, over};
    const char *old = getenv("SDPA_POOL_SPIN_US");
    char *saved = old != NULL ? strdup(old) : NULL;
    for (size_t i = 0; i < sizeof spins / sizeof spins[0]; ++i)
        for (size_t n = 0; n < 2; ++n) {
            setenv("SDPA_POOL_SPIN_US", spins[i], 1);
            sdpa_threadpool *pool = NULL;
            assert_int_equal(sdpa_threadpool_create(sizes[n], &pool), SDPA_OK);
            for (int it = 0; it < (i < 3 ? 12 : 1); ++it) {
                runcfg rc = {.kernel = it % 3 != 1 ? SDPA_KERNEL_DECODE : SDPA_KERNEL_TILED, .pool = pool};
                memset(o, 0xff, (size_t)no * sizeof(float));
                assert_int_equal(run(&P, &rc, o, l), SDPA_OK);
                if (memcmp(o, rc.kernel == SDPA_KERNEL_DECODE ? want : want_tiled, (size_t)no * sizeof(float)) != 0)
                    fail_msg("SDPA_POOL_SPIN_US=%s, pool of %d: call %d differs from 1 thread", spins[i], sizes[n], it);
                if (it % 4 == 3) { /* longer than a 3 us poll: the workers go to sleep */
                    const struct timespec ts = {0, 2000000};
                    nanosleep(&ts, NULL);
                }
            }
            const bool polls = strcmp(spins[i], "100000") == 0 && sizes[n] <= online;
            if (polls || strcmp(spins[i], "0") == 0 || strcmp(spins[i], " 100000") == 0 ||
                (strcmp(spins[i], "100000") == 0 && sizes[n] > online)) {
                int conclusive = 0;
                const double used = idle_cpu_ms(&P, pool, o, l, polls ? 8 : 4, polls, &conclusive);
                if (polls && used < 15.0 && conclusive == 0)
                    printf("pool_wait_policies: polling not checked (SDPA_POOL_SPIN_US=100000): this process was "
                           "preempted in all 8 attempts (a busy machine; the pool's back-off)\n");
                else if (polls ? used < 15.0 : used > 15.0)
                    fail_msg("SDPA_POOL_SPIN_US=\"%s\", pool of %d (%ld CPUs): the idle pool used %.1f ms of CPU in 60 ms",
                             spins[i], sizes[n], online, used);
            }
            sdpa_threadpool_destroy(pool);
        }
    if (saved != NULL) {
        setenv("SDPA_POOL_SPIN_US", saved, 1);
        free(saved);
    } else {
        unsetenv("SDPA_POOL_SPIN_US");
    }
    free(want); free(want_tiled); free(o); free(l);
    prob_free(&P);
}

/* fork(): a pool made in the parent has no workers in the child. A call there runs on the
 * calling thread alone (same bits), and destroying the pool there returns; before, the call
 * waited forever for the parent's workers. */
static void pool_after_fork(void **state) {
    (void)state;
    prob P;
    prob_init(&P, 1, 8, 8, 1, 1024, 64, 64);
    const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
    float *want = fbuf(no), *o = fbuf(no), *l = fbuf(nl);
    runcfg r1 = {.kernel = SDPA_KERNEL_DECODE, .threads = 1};
    assert_int_equal(run(&P, &r1, want, l), SDPA_OK);
    sdpa_threadpool *pool = NULL;
    assert_int_equal(sdpa_threadpool_create(2, &pool), SDPA_OK);
    runcfg rp = {.kernel = SDPA_KERNEL_DECODE, .pool = pool};
    assert_int_equal(run(&P, &rp, o, l), SDPA_OK); /* the workers exist and have run */
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hang becomes SIGALRM */
        int bad = 0;
        for (int it = 0; it < 3; ++it) {
            memset(o, 0xff, (size_t)no * sizeof(float));
            bad |= run(&P, &rp, o, l) != SDPA_OK || memcmp(o, want, (size_t)no * sizeof(float)) != 0;
        }
        sdpa_threadpool_destroy(pool);
        free(want); free(o); free(l);
        prob_free(&P);
        _exit(bad ? 3 : 0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* Under valgrind (--error-exitcode=1) the child also reports what it inherited and never
     * frees (the parent's earlier allocations): exit 1 is valgrind's, not the child's verdict. */
    const char *pre = getenv("LD_PRELOAD");
    const bool valgrind = pre != NULL && strstr(pre, "vgpreload") != NULL;
    if (!WIFEXITED(status) || (WEXITSTATUS(status) != 0 && !(valgrind && WEXITSTATUS(status) == 1)))
        fail_msg("child: %s %d (3: wrong result or status; SIGALRM 14: hung)", WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    assert_int_equal(run(&P, &rp, o, l), SDPA_OK); /* the parent's pool still works */
    assert_memory_equal(o, want, (size_t)no * sizeof(float));
    sdpa_threadpool_destroy(pool);
    free(want); free(o); free(l);
    prob_free(&P);
}

/* Hooks that break the contract (every task in [0, ntasks) exactly once, returning after the
 * last): each mode is SDPA_ERR_INVALID_ARGUMENT naming the hook, and no task number outside
 * [0, ntasks) or run twice reaches the region (its thread index selects per-thread scratch:
 * ASan would see the overrun). Before the check, such a hook got SDPA_OK and a wrong output. */
typedef struct badhook {
    int mode; /* 0 none, 1 skip task 0, 2 task 0 twice, 3 task ntasks too, 4 task -1 too */
    int calls;
} badhook;
static void bad_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx) {
    badhook *h = (badhook *)ctx;
    h->calls++;
    if (h->mode == 0)
        return;
    if (h->mode == 3)
        task(task_ctx, ntasks);
    if (h->mode == 4)
        task(task_ctx, -1);
    for (int64_t t = h->mode == 1 ? 1 : 0; t < ntasks; ++t)
        task(task_ctx, t);
    if (h->mode == 2)
        task(task_ctx, 0);
}

static void broken_hooks_are_reported(void **state) {
    (void)state;
    struct { int64_t B, Hq, Hkv, L, S; int kernel; } cases[] = {
        {2, 8, 8, 200, 300, SDPA_KERNEL_TILED},
        {1, 16, 16, 1, 4096, SDPA_KERNEL_DECODE},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        prob P;
        prob_init(&P, cases[c].B, cases[c].Hq, cases[c].Hkv, cases[c].L, cases[c].S, 64, 64);
        const int64_t no = P.B * P.Hq * P.L * P.Ev, nl = P.B * P.Hq * P.L;
        float *out = fbuf(no), *lse = fbuf(nl);
        for (int mode = 0; mode < 5; ++mode) {
            badhook h = {mode, 0};
            runcfg rc = {.kernel = cases[c].kernel, .hook = bad_hook, .hook_ctx = &h, .hook_threads = 4};
            for (int64_t t = 0; t < no; ++t)
                out[t] = 12345.0f;
            if (run(&P, &rc, out, lse) != SDPA_ERR_INVALID_ARGUMENT)
                fail_msg("case %zu mode %d: not SDPA_ERR_INVALID_ARGUMENT", c, mode);
            assert_true(h.calls > 0);
            if (strstr(sdpa_last_error_message(), "parallel_for hook") == NULL)
                fail_msg("case %zu mode %d: message %s", c, mode, sdpa_last_error_message());
            if (mode == 0) /* nothing ran: nothing written */
                for (int64_t t = 0; t < no; ++t)
                    if (out[t] != 12345.0f)
                        fail_msg("case %zu: out[%lld] written by a call whose hook ran nothing", c, (long long)t);
        }
        badhook good = {5, 0}; /* the same hook keeping the contract */
        runcfg rc = {.kernel = cases[c].kernel, .hook = bad_hook, .hook_ctx = &good, .hook_threads = 4};
        assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
        expect_close(&P, out, lse, 3e-5, "contract-keeping hook");
        free(out); free(lse);
        prob_free(&P);
    }
    /* A packed batch (its checks and items in one region) reports a hook that ran nothing too. */
    const int64_t Hq = 4, E = 32, TQ = 300, TK = 600;
    int32_t cuq[3] = {0, 150, 300}, cuk[3] = {0, 300, 600};
    float *q = fbuf(Hq * TQ * E), *k = fbuf(Hq * TK * E), *v = fbuf(Hq * TK * E), *out = fbuf(Hq * TQ * E);
    for (int64_t t = 0; t < Hq * TK * E; ++t)
        k[t] = v[t] = (float)(t % 7) * 0.125f;
    for (int64_t t = 0; t < Hq * TQ * E; ++t)
        q[t] = (float)(t % 5) * 0.25f;
    sdpa_tensor tq, tk, tv, to;
    const int64_t qs[4] = {1, Hq, TQ, E}, ks[4] = {1, Hq, TK, E};
    assert_int_equal(sdpa_tensor_init(&tq, q, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tk, k, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&tv, v, 4, ks), SDPA_OK);
    assert_int_equal(sdpa_tensor_init(&to, out, 4, qs), SDPA_OK);
    for (int mode = 0; mode < 6; mode += 5) {
        badhook h = {mode, 0};
        sdpa_options o;
        sdpa_options_init(&o);
        o.cu_seqlens_q = cuq;
        o.cu_seqlens_k = cuk;
        o.num_seqs = 2;
        o.causal = 1;
        o.parallel_for = bad_hook;
        o.parallel_for_ctx = &h;
        o.parallel_for_threads = 4;
        const sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
        assert_true(h.calls > 0);
        if (mode == 0) {
            assert_int_equal(st, SDPA_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(sdpa_last_error_message(), "parallel_for hook"));
        } else {
            assert_int_equal(st, SDPA_OK);
        }
    }
    free(q); free(k); free(v); free(out);
}

static void pool_and_hook_arguments(void **state) {
    (void)state;
    sdpa_threadpool *pool = (sdpa_threadpool *)(uintptr_t)1;
    assert_int_equal(sdpa_threadpool_create(0, &pool), SDPA_ERR_INVALID_ARGUMENT);
    assert_int_equal(sdpa_threadpool_create(257, &pool), SDPA_ERR_INVALID_ARGUMENT);
    assert_true(pool == (sdpa_threadpool *)(uintptr_t)1);
    assert_int_equal(sdpa_threadpool_create(2, NULL), SDPA_ERR_NULL_POINTER);
    assert_int_equal(sdpa_threadpool_size(NULL), 0);
    assert_int_equal(sdpa_threadpool_create(1, &pool), SDPA_OK);
    prob P;
    prob_init(&P, 1, 2, 1, 2, 8, 4, 4);
    float out[16], lse[4];
    hookstat hs = {0, 0, 0};
    runcfg both = {.pool = pool, .hook = serial_hook, .hook_ctx = &hs, .hook_threads = 2};
    assert_int_equal(run(&P, &both, out, lse), SDPA_ERR_INVALID_ARGUMENT);
    runcfg zero = {.hook = serial_hook, .hook_ctx = &hs, .hook_threads = 0};
    assert_int_equal(run(&P, &zero, out, lse), SDPA_ERR_INVALID_ARGUMENT);
    runcfg one = {.pool = pool};
    g_creates = 0;
    assert_int_equal(run(&P, &one, out, lse), SDPA_OK);
    assert_int_equal(g_creates, 0);
    expect_close(&P, out, lse, 3e-5, "pool of 1");
    sdpa_threadpool_destroy(pool);
    prob_free(&P);
}

/* ------------------------------------------- audit gaps (issue 27): sinks at the edges */

/* A sink more than ~709 above every score: exp(sink - max score) overflows double, so the
 * running max must include the sink. The exact answer in float: lse = the sink, out = 0
 * (every weight exp(s - sink) < 1e-300). Tiled (L = 70) and decode (L = 1, and a split over
 * 2100 keys), every kernel. */
static void sinks_far_above_every_score(void **state) {
    (void)state;
    const int64_t Ls[3] = {1, 70, 1}, Ss[3] = {300, 90, 2100};
    for (int c = 0; c < 3; ++c) {
        prob P;
        prob_init(&P, 1, 2, 1, Ls[c], Ss[c], 16, 8);
        P.use_sinks = 1;
        P.sinks[0] = 800.0f;
        P.sinks[1] = 1000.0f;
        const int64_t no = P.Hq * P.L * P.Ev, nl = P.Hq * P.L;
        for (int kk = 0; kk < 3; ++kk) {
            float *out = fbuf(no), *lse = fbuf(nl);
            runcfg rc = {.kernel = KERNELS[kk], .threads = 2};
            assert_int_equal(run(&P, &rc, out, lse), SDPA_OK);
            for (int64_t h = 0; h < P.Hq; ++h)
                for (int64_t i = 0; i < P.L; ++i) {
                    const float l = lse[h * P.L + i];
                    if (l != P.sinks[h])
                        fail_msg("%s, L=%lld S=%lld: lse[h=%lld, i=%lld] = %g, want the sink %g", KNAMES[kk],
                                 (long long)P.L, (long long)P.S, (long long)h, (long long)i, (double)l, (double)P.sinks[h]);
                    for (int64_t d = 0; d < P.Ev; ++d)
                        if (out[(h * P.L + i) * P.Ev + d] != 0.0f)
                            fail_msg("%s: out[h=%lld, i=%lld, %lld] = %g, want 0", KNAMES[kk], (long long)h, (long long)i,
                                     (long long)d, (double)out[(h * P.L + i) * P.Ev + d]);
                }
            free(out);
            free(lse);
        }
        prob_free(&P);
    }
}

/* A row emptied by an allow-mask or by an additive -inf bias (not by causal / lengths, which
 * the kernels see as structure) with a sink, under ZERO: out 0 and lse = the sink (DESIGN 4.5),
 * on every kernel (tiled: L = 70 rows, so the row is one lane of a tile with live lanes). The
 * other rows equal the reference (bias 0 there). */
static void sinks_row_emptied_by_mask_or_bias(void **state) {
    (void)state;
    const int64_t Ls[2] = {70, 1};
    for (int c = 0; c < 2; ++c) {
        prob P;
        prob_init(&P, 1, 2, 1, Ls[c], 40, 8, 8);
        P.use_sinks = 1;
        P.empty_zero = 1;
        const int64_t L = P.L, S = P.S, no = P.Hq * L * P.Ev, nl = P.Hq * L, er = L > 3 ? 3 : 0; /* the emptied row */
        float *bias = fbuf(P.Hq * L * S);
        uint8_t *mask = malloc((size_t)(L * S));
        assert_non_null(mask);
        for (int64_t t = 0; t < P.Hq * L * S; ++t)
            bias[t] = 0.0f;
        for (int64_t t = 0; t < L * S; ++t)
            mask[t] = 1;
        for (int64_t h = 0; h < P.Hq; ++h)
            for (int64_t j = 0; j < S; ++j)
                bias[(h * L + er) * S + j] = -INFINITY;
        for (int64_t j = 0; j < S; ++j)
            mask[er * S + j] = 0;
        sdpa_tensor tb;
        const int64_t bs[4] = {1, P.Hq, L, S};
        assert_int_equal(sdpa_tensor_init(&tb, bias, 4, bs), SDPA_OK);
        double *ro = malloc((size_t)no * sizeof(double)), *rl = malloc((size_t)nl * sizeof(double));
        reference(&P, ro, rl);
        for (int how = 0; how < 2; ++how) /* 0: bias, 1: allow-mask */
            for (int kk = 0; kk < 3; ++kk) {
                float *out = fbuf(no), *lse = fbuf(nl);
                sdpa_status st;
                if (how == 0) {
                    runcfg rc = {.kernel = KERNELS[kk], .threads = 1, .bias = &tb};
                    st = run(&P, &rc, out, lse);
                } else { /* the same call as run() with an allow-mask [L, S] */
                    sdpa_tensor tq, tk, tv, to, tl;
                    const int64_t qs[4] = {1, P.Hq, L, P.E}, ks[4] = {1, P.Hkv, S, P.E}, vs[4] = {1, P.Hkv, S, P.Ev},
                                  os[4] = {1, P.Hq, L, P.Ev}, ls[3] = {1, P.Hq, L}, ms[2] = {L, S};
                    assert_int_equal(sdpa_tensor_init(&tq, P.q, 4, qs), SDPA_OK);
                    assert_int_equal(sdpa_tensor_init(&tk, P.k, 4, ks), SDPA_OK);
                    assert_int_equal(sdpa_tensor_init(&tv, P.v, 4, vs), SDPA_OK);
                    assert_int_equal(sdpa_tensor_init(&to, out, 4, os), SDPA_OK);
                    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
                    sdpa_allow_mask am;
                    assert_int_equal(sdpa_allow_mask_init(&am, mask, 2, ms), SDPA_OK);
                    sdpa_options o;
                    sdpa_options_init(&o);
                    o.kernel = KERNELS[kk];
                    o.num_threads = 1;
                    o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
                    o.sinks = P.sinks;
                    o.allow_mask = &am;
                    st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
                }
                if (st != SDPA_OK)
                    fail_msg("%s %s: %s (%s)", how ? "mask" : "bias", KNAMES[kk], sdpa_status_string(st),
                             sdpa_last_error_message());
                for (int64_t h = 0; h < P.Hq; ++h)
                    for (int64_t i = 0; i < L; ++i) {
                        const int64_t r = h * L + i;
                        if (i == er) {
                            if (lse[r] != P.sinks[h])
                                fail_msg("%s %s (%s): emptied row h=%lld i=%lld: lse = %g, want the sink %g",
                                         how ? "mask" : "bias", KNAMES[kk], sdpa_last_kernel(), (long long)h, (long long)i,
                                         (double)lse[r], (double)P.sinks[h]);
                            for (int64_t d = 0; d < P.Ev; ++d)
                                assert_true(out[r * P.Ev + d] == 0.0f);
                            continue;
                        }
                        if (!(fabs((double)lse[r] - rl[r]) <= 3e-5))
                            fail_msg("%s %s: lse[%lld] = %g, reference %g", how ? "mask" : "bias", KNAMES[kk], (long long)r,
                                     (double)lse[r], rl[r]);
                        for (int64_t d = 0; d < P.Ev; ++d)
                            if (!(fabs((double)out[r * P.Ev + d] - ro[r * P.Ev + d]) <= 3e-5))
                                fail_msg("%s %s: out[%lld, %lld] = %g, reference %g", how ? "mask" : "bias", KNAMES[kk],
                                         (long long)r, (long long)d, (double)out[r * P.Ev + d], ro[r * P.Ev + d]);
                    }
                free(out);
                free(lse);
            }
        free(ro);
        free(rl);
        free(bias);
        free(mask);
        prob_free(&P);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sinks_match_reference_every_kernel),
        cmocka_unit_test(sinks_empty_rows_and_padding),
        cmocka_unit_test(sinks_single_query_equals_batched),
        cmocka_unit_test(sinks_with_merge),
        cmocka_unit_test(sinks_in_double_fallback),
        cmocka_unit_test(weights_with_sinks_and_alibi),
        cmocka_unit_test(alibi_slopes_formula),
        cmocka_unit_test(serving_calls_clear_the_message),
        cmocka_unit_test(alibi_matches_bias_and_reference),
        cmocka_unit_test(alibi_huge_slope),
        cmocka_unit_test(bad_sink_and_slope_arguments),
        cmocka_unit_test(pools_bit_identical_and_create_no_thread),
        cmocka_unit_test(pool_shared_by_threads),
        cmocka_unit_test(pool_wait_policies),
        cmocka_unit_test(pool_after_fork),
        cmocka_unit_test(pool_and_hook_arguments),
        cmocka_unit_test(broken_hooks_are_reported),
        cmocka_unit_test(sinks_far_above_every_score),
        cmocka_unit_test(sinks_row_emptied_by_mask_or_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
