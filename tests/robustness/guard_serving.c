/*
 * Guard-page cases of the 0.4/0.5 features (part of test_guard; issue 8): f16/bf16 views of
 * q, k, v, out and bias; paged K/V pools with block tables; packed batches (cu_seqlens_q with
 * cu_seqlens_k or a paged cache); key_lengths; sinks; ALiBi slopes of rank 1 and 2; the
 * library's threads, a shared sdpa_threadpool. Every array and view struct (block table,
 * cu_seqlens, key_lengths, sinks, slopes, options) sits against a PROT_NONE page. Each case is
 * compared with a float64 evaluation written here from sdpa.h's formulas (values are multiples
 * of 1/8, exact in f16 and bf16), then rerun with NaN / +Inf / the largest finite value written
 * into every location no allowed pair reads: K/V slots past a sequence's length, pool blocks no
 * table entry names, stride gaps, bias entries of blocked pairs; block-table entries past a
 * sequence's last block and the table's row gaps get -1, num_blocks and INT32_MAX. Status and
 * every output byte must stay bit-identical; output stride gaps keep their canary.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "guard_serving.h"

int64_t g_sv_cases, g_sv_calls, g_sv_unsupported, g_sv_paged, g_sv_packed, g_sv_f16, g_sv_bf16;
int g_sv_amx;
int64_t g_sv_amx_calls;

#define SV_CANARY 0xA5

static uint16_t sv_to_f16(double x) /* x a multiple of 1/8 with |x| <= 4: exact */
{
    if (x == 0.0)
        return signbit(x) ? 0x8000 : 0;
    const uint16_t sign = x < 0 ? 0x8000 : 0;
    double a = fabs(x);
    int e = 0;
    while (a >= 2.0)
        a /= 2.0, ++e;
    while (a < 1.0)
        a *= 2.0, --e;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0) * 1024.0));
}

static double sv_from_f16(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double s = h & 0x8000 ? -1.0 : 1.0;
    if (e == 31)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, -24);
    return s * ldexp(1024.0 + m, e - 25);
}

static uint16_t sv_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16); /* exact for the values used here */
}

static double sv_from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void sv_put(rb_gt *t, int dt, int64_t slot, double x)
{
    if (dt == SDPA_DTYPE_F32)
        ((float *)(void *)t->g.lo)[slot] = (float)x;
    else
        ((uint16_t *)(void *)t->g.lo)[slot] = dt == SDPA_DTYPE_F16 ? sv_to_f16(x) : sv_to_bf16((float)x);
}

static double sv_get(const rb_gt *t, int dt, int64_t slot)
{
    if (dt == SDPA_DTYPE_F32)
        return ((const float *)(const void *)t->g.lo)[slot];
    const uint16_t h = ((const uint16_t *)(const void *)t->g.lo)[slot];
    return dt == SDPA_DTYPE_F16 ? sv_from_f16(h) : sv_from_bf16(h);
}

/* Poison p (0 NaN, 1 +Inf, 2 largest finite) into every slot not read. */
static void sv_poison(rb_gt *t, int dt, int p)
{
    static const uint16_t H16[3] = {0x7E00, 0x7C00, 0x7BFF}, B16[3] = {0x7FC0, 0x7F80, 0x7F7F};
    static const float F32[3] = {NAN, INFINITY, 3.4e38f};
    for (int64_t s = 0; s < t->span; ++s)
        if (t->role[s] != RB_READ) {
            if (dt == SDPA_DTYPE_F32)
                ((float *)(void *)t->g.lo)[s] = F32[p];
            else
                ((uint16_t *)(void *)t->g.lo)[s] = dt == SDPA_DTYPE_F16 ? H16[p] : B16[p];
        }
}

static double sv_val(rb_rng *r) { return (double)rb_int(r, -16, 16) / 8.0; }

static void *sv_place(rb_guard *g, const void *src, size_t n, int at_end)
{
    void *p = rb_guard_alloc(g, n, at_end);
    memcpy(p, src, n);
    return p;
}

static sdpa_tensor sv_view(const rb_gt *t, int dt)
{
    sdpa_tensor v = rb_gt_view(t);
    v.dtype = dt;
    return v;
}

/* Fill a tensor's logical elements (gaps finite, 0.5) with sv_val() values. */
static void sv_fill(rb_gt *t, int dt, rb_rng *r)
{
    for (int64_t s = 0; s < t->span; ++s)
        sv_put(t, dt, s, 0.5);
    int64_t idx[4] = {0, 0, 0, 0};
    if (rb_numel(t->rank, t->shape) > 0)
        do {
            sv_put(t, dt, rb_gt_slot(t, idx), sv_val(r));
        } while (rb_index_next(t->rank, t->shape, idx));
}

static int sv_gaps_intact(const rb_gt *t)
{
    const unsigned char *p = t->g.lo;
    for (int64_t s = 0; s < t->span; ++s)
        if (t->role[s] == RB_GAP)
            for (size_t b = 0; b < t->elem; ++b)
                if (p[(size_t)s * t->elem + b] != SV_CANARY)
                    return 0;
    return 1;
}

static int sv_all_canary(const rb_gt *t)
{
    const unsigned char *p = t->g.lo;
    for (size_t b = 0; b < (size_t)t->span * t->elem; ++b)
        if (p[b] != SV_CANARY)
            return 0;
    return 1;
}

void serving_case(rb_rng *r, int64_t n)
{
    static const sdpa_kernel KERN[4] = {SDPA_KERNEL_AUTO, SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE};
    static const int DT[3] = {SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_BF16};
    static sdpa_threadpool *pool;
    if (pool == NULL && sdpa_threadpool_create(3, &pool) != SDPA_OK) {
        RB_FAIL("serving: sdpa_threadpool_create(3) failed: %s", sdpa_last_error_message());
        return;
    }
    const int mode = (int)rb_int(r, 0, 3); /* 0 dense + key_lengths, 1 paged, 2 packed + cu_seqlens_k, 3 packed + paged */
    const int paged = mode == 1 || mode == 3, packed = mode >= 2;
    const int big = rb_chance(r, 25);
    const int64_t R = rb_int(r, 1, 3), Hkv = rb_int(r, 1, 2), Hq = Hkv * rb_int(r, 1, 3), group = Hq / Hkv;
    int64_t E = rb_chance(r, 20) ? rb_int(r, 1, 3) : rb_int(r, 1, big ? 72 : 20);
    int64_t Ev = rb_chance(r, 50) ? E : rb_int(r, 1, big ? 40 : 16);
    int dt = DT[rb_int(r, 0, 2)];
    /* AMX: bf16 storage, REDUCED, head sizes the AMX column takes (these draws only in that mode) */
    const int amx = g_sv_amx && rb_chance(r, 50);
    if (amx) {
        dt = SDPA_DTYPE_BF16;
        E = 32 * rb_int(r, 1, big ? 4 : 2);
        Ev = 16 * rb_int(r, 1, 3);
    }
    const int odt = rb_chance(r, 50) ? dt : SDPA_DTYPE_F32;
    g_sv_f16 += dt == SDPA_DTYPE_F16, g_sv_bf16 += dt == SDPA_DTYPE_BF16;
    int64_t Lr[3], Sr[3], qs[4], ks[4];
    const int64_t Lmax = rb_chance(r, 40) ? rb_int(r, 1, 2) : rb_int(r, 1, big ? 40 : 8);
    int64_t Smax = 0, total_q = 0, total_k = 0;
    const int64_t Lall = rb_int(r, 1, Lmax);
    for (int64_t b = 0; b < R; ++b) {
        Lr[b] = packed ? rb_int(r, 0, Lmax) : Lall;
        Sr[b] = rb_chance(r, 10) ? 0 : rb_int(r, 1, big ? 150 : 30);
        Smax = Sr[b] > Smax ? Sr[b] : Smax;
        qs[b] = total_q, ks[b] = total_k;
        total_q += Lr[b], total_k += Sr[b];
    }
    sdpa_options o;
    sdpa_options_init(&o);
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.causal = rb_chance(r, 50);
    o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    if (amx)
        o.precision = SDPA_PRECISION_REDUCED;
    const int kern = (int)rb_int(r, 0, 3);
    o.kernel = KERN[kern];
    if (rb_chance(r, 20))
        o.threadpool = pool;
    o.num_threads = (int32_t)rb_int(r, 1, 3);
    const int in_lay = RB_LAY_NEG | RB_LAY_BCAST | RB_LAY_PERM | RB_LAY_PAD, out_lay = RB_LAY_PERM | RB_LAY_PAD;
    const size_t es = dt == SDPA_DTYPE_F32 ? 4 : 2, oes = odt == SDPA_DTYPE_F32 ? 4 : 2;
    rb_gt q, k, v, out, lse, bias;
    memset(&bias, 0, sizeof bias);
    int bdt = SDPA_DTYPE_F32;
    rb_guard gs[16];
    memset(gs, 0, sizeof gs);
    /* q, out, lse */
    const int64_t QB = packed ? 1 : R, QL = packed ? total_q : Lall;
    const int64_t shq[4] = {QB, Hq, QL, E}, sho[4] = {QB, Hq, QL, Ev}, shl[3] = {QB, Hq, QL};
    /* packed q and cu_seqlens_k K/V take negative strides too (varlen shift() is signed) */
    const int packed_lay = in_lay & ~RB_LAY_BCAST;
    rb_gt_make(&q, r, 4, shq, es, packed_lay);
    rb_gt_make(&out, r, 4, sho, oes, out_lay);
    const int want_lse = rb_chance(r, 60);
    rb_gt_make(&lse, r, 3, shl, 4, RB_LAY_PAD);
    sv_fill(&q, dt, r);
    /* keys: dense [R, Hkv, S, E], packed [1, Hkv, total_k, E], or a pool [NB, Hkv, bs, E] */
    int64_t bs = 1, mbps = 1, bts = 1, NB = 1, bt_n = 1;
    int32_t *bt = NULL;
    uint8_t *bt_read = NULL;
    int64_t S = Smax + rb_int(r, 0, 3);
    if (paged) {
        bs = rb_int(r, 1, 9);
        mbps = (Smax + bs - 1) / bs + rb_int(r, 0, 2);
        if (mbps < 1)
            mbps = 1;
        bts = mbps + (rb_chance(r, 40) ? rb_int(r, 1, 3) : 0);
        int64_t need = 0;
        for (int64_t b = 0; b < R; ++b)
            need += (Sr[b] + bs - 1) / bs;
        NB = need + rb_int(r, 0, 3);
        if (NB < 1)
            NB = 1;
        S = mbps * bs;
        bt_n = (R - 1) * bts + mbps;
        bt = (int32_t *)rb_guard_alloc(&gs[0], (size_t)bt_n * 4, 1);
        bt_read = (uint8_t *)calloc((size_t)bt_n, 1);
        int64_t *perm = (int64_t *)malloc((size_t)NB * sizeof *perm);
        for (int64_t t = 0; t < NB; ++t)
            perm[t] = t;
        for (int64_t t = NB - 1; t > 0; --t) {
            const int64_t u = rb_int(r, 0, t), x = perm[t];
            perm[t] = perm[u], perm[u] = x;
        }
        int64_t next = 0;
        for (int64_t b = 0; b < R; ++b)
            for (int64_t m = 0; m < mbps; ++m) {
                const int64_t e = b * bts + m;
                if (m * bs < Sr[b])
                    bt[e] = (int32_t)perm[next++], bt_read[e] = 1;
                else
                    bt[e] = (int32_t)(rb_chance(r, 50) ? perm[rb_int(r, 0, NB - 1)] : 0);
            }
        for (int64_t e = 0; e < bt_n; ++e)
            if (!bt_read[e] && (e % bts) >= mbps)
                bt[e] = 0;
        free(perm);
        o.block_table = bt, o.max_blocks_per_seq = mbps;
        o.block_table_stride = bts == mbps && rb_chance(r, 50) ? 0 : bts;
        g_sv_paged++;
    }
    const int64_t KB = paged ? NB : packed ? 1 : R, KS = paged ? bs : packed ? total_k : S;
    const int64_t shk[4] = {KB, Hkv, KS, E}, shv[4] = {KB, Hkv, KS, Ev};
    const int kv_lay = mode == 2 ? packed_lay : in_lay & ~RB_LAY_BCAST;
    rb_gt_make(&k, r, 4, shk, es, kv_lay);
    rb_gt_make(&v, r, 4, shv, es, kv_lay);
    sv_fill(&k, dt, r);
    sv_fill(&v, dt, r);
    /* key_lengths (dense, paged), cu_seqlens (packed) */
    int64_t *klen = NULL;
    if (mode != 2) {
        klen = (int64_t *)rb_guard_alloc(&gs[1], (size_t)R * 8, rb_chance(r, 70));
        for (int64_t b = 0; b < R; ++b)
            klen[b] = Sr[b];
        o.key_lengths = klen;
    }
    if (packed) {
        int32_t *cq = (int32_t *)rb_guard_alloc(&gs[2], (size_t)(R + 1) * 4, rb_chance(r, 70));
        for (int64_t b = 0; b <= R; ++b)
            cq[b] = (int32_t)(b < R ? qs[b] : total_q);
        o.cu_seqlens_q = cq, o.num_seqs = R;
        if (mode == 2) {
            int32_t *ck = (int32_t *)rb_guard_alloc(&gs[3], (size_t)(R + 1) * 4, rb_chance(r, 70));
            for (int64_t b = 0; b <= R; ++b)
                ck[b] = (int32_t)(b < R ? ks[b] : total_k);
            o.cu_seqlens_k = ck;
        }
        g_sv_packed++;
    }
    /* sinks, slopes */
    float *sinks = NULL, *slopes = NULL;
    if (rb_chance(r, 40)) {
        sinks = (float *)rb_guard_alloc(&gs[4], (size_t)Hq * 4, rb_chance(r, 70));
        for (int64_t h = 0; h < Hq; ++h)
            sinks[h] = rb_chance(r, 15) ? -INFINITY : (float)sv_val(r);
        o.sinks = sinks;
    }
    if (rb_chance(r, 40)) {
        o.alibi_slopes_rank = (int32_t)rb_int(r, 1, 2);
        const int64_t ns = o.alibi_slopes_rank == 1 ? Hq : R * Hq;
        slopes = (float *)rb_guard_alloc(&gs[5], (size_t)ns * 4, rb_chance(r, 70));
        for (int64_t t = 0; t < ns; ++t)
            slopes[t] = (float)rb_int(r, 0, 16) / 16.0f;
        o.alibi_slopes = slopes;
    }
    /* bias (dense only): [R, Hq, L, S] of any dtype */
    if (mode == 0 && rb_chance(r, 30)) {
        bdt = DT[rb_int(r, 0, 2)];
        const int64_t shb[4] = {R, Hq, Lall, S};
        rb_gt_make(&bias, r, 4, shb, bdt == SDPA_DTYPE_F32 ? 4 : 2, in_lay & ~RB_LAY_BCAST);
        sv_fill(&bias, bdt, r);
    }
    const double scale = 1.0 / sqrt((double)E);
    /* float64 evaluation and roles */
    const int64_t nout = QB * Hq * QL * Ev, nl = QB * Hq * QL;
    double *want = (double *)calloc((size_t)(nout > 0 ? nout : 1), sizeof(double));
    double *want_l = (double *)calloc((size_t)(nl > 0 ? nl : 1), sizeof(double));
    double *sc = (double *)malloc((size_t)(S > total_k ? S + 1 : total_k + 1) * sizeof(double));
    for (int64_t b = 0; b < R; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
            const int64_t hk = h / group;
            for (int64_t i = 0; i < Lr[b]; ++i) {
                const int64_t qb = packed ? 0 : b, qi = packed ? qs[b] + i : i;
                const int64_t p = i + Sr[b] - Lr[b];
                double m = sinks ? sinks[h] : -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Sr[b]; ++j) {
                    sc[j] = -INFINITY;
                    if (o.causal && j > p)
                        continue;
                    int64_t kb = packed ? 0 : b, kj = packed ? ks[b] + j : j;
                    if (paged)
                        kb = bt[b * bts + j / bs], kj = j % bs;
                    double s = 0;
                    for (int64_t e = 0; e < E; ++e) {
                        const int64_t ia[4] = {qb, h, qi, e}, ib[4] = {kb, hk, kj, e};
                        s += sv_get(&q, dt, rb_gt_slot(&q, ia)) * sv_get(&k, dt, rb_gt_slot(&k, ib));
                    }
                    s *= scale;
                    if (bias.role) {
                        const int64_t ix[4] = {b, h, i, j};
                        s += sv_get(&bias, bdt, rb_gt_slot(&bias, ix));
                        bias.role[rb_gt_slot(&bias, ix)] = RB_READ;
                    }
                    if (slopes)
                        s -= (double)slopes[o.alibi_slopes_rank == 1 ? h : b * Hq + h] * (double)llabs(p - j);
                    sc[j] = s;
                    any = 1;
                    m = s > m ? s : m;
                }
                double den = sinks && sinks[h] != -INFINITY ? exp(sinks[h] - m) : 0.0;
                for (int64_t j = 0; j < Sr[b]; ++j)
                    if (sc[j] != -INFINITY)
                        den += exp(sc[j] - m);
                const int64_t li = (qb * Hq + h) * QL + qi;
                want_l[li] = any ? m + log(den) : sinks ? (double)sinks[h] : -INFINITY;
                for (int64_t c = 0; c < Ev; ++c) {
                    double acc = 0;
                    for (int64_t j = 0; j < Sr[b]; ++j)
                        if (sc[j] != -INFINITY) {
                            int64_t kb = packed ? 0 : b, kj = packed ? ks[b] + j : j;
                            if (paged)
                                kb = bt[b * bts + j / bs], kj = j % bs;
                            const int64_t iv[4] = {kb, hk, kj, c};
                            acc += exp(sc[j] - m) / den * sv_get(&v, dt, rb_gt_slot(&v, iv));
                        }
                    want[li * Ev + c] = any ? acc : 0.0;
                }
            }
        }
    /* K/V roles: every key j < Sr[b] of every head is read (the finite check reads blocked keys
     * of causal rows too: conservative), everything else is poisoned. */
    for (int64_t b = 0; b < R; ++b)
        for (int64_t j = 0; j < Sr[b]; ++j) {
            int64_t kb = packed ? 0 : b, kj = packed ? ks[b] + j : j;
            if (paged)
                kb = bt[b * bts + j / bs], kj = j % bs;
            for (int64_t hk = 0; hk < Hkv; ++hk) {
                for (int64_t e = 0; e < E; ++e) {
                    const int64_t ix[4] = {kb, hk, kj, e};
                    k.role[rb_gt_slot(&k, ix)] = RB_READ;
                }
                for (int64_t e = 0; e < Ev; ++e) {
                    const int64_t ix[4] = {kb, hk, kj, e};
                    v.role[rb_gt_slot(&v, ix)] = RB_READ;
                }
            }
        }
    {
        int64_t idx[4] = {0, 0, 0, 0};
        if (rb_numel(4, shq) > 0)
            do
                q.role[rb_gt_slot(&q, idx)] = RB_READ;
            while (rb_index_next(4, shq, idx));
        memset(idx, 0, sizeof idx);
        if (nout > 0)
            do
                out.role[rb_gt_slot(&out, idx)] = RB_READ;
            while (rb_index_next(4, sho, idx));
        memset(idx, 0, sizeof idx);
        if (nl > 0)
            do
                lse.role[rb_gt_slot(&lse, idx)] = RB_READ;
            while (rb_index_next(3, shl, idx));
    }
    /* views and options against guard pages */
    sdpa_tensor tv;
    tv = sv_view(&q, dt);
    const sdpa_tensor *pq = sv_place(&gs[6], &tv, sizeof tv, 1);
    tv = sv_view(&k, dt);
    const sdpa_tensor *pk = sv_place(&gs[7], &tv, sizeof tv, 1);
    tv = sv_view(&v, dt);
    const sdpa_tensor *pv = sv_place(&gs[8], &tv, sizeof tv, 1);
    tv = sv_view(&out, odt);
    const sdpa_tensor *po = sv_place(&gs[9], &tv, sizeof tv, 1);
    tv = sv_view(&lse, SDPA_DTYPE_F32);
    const sdpa_tensor *pl = sv_place(&gs[10], &tv, sizeof tv, 1);
    if (bias.role) {
        tv = sv_view(&bias, bdt);
        o.bias = sv_place(&gs[11], &tv, sizeof tv, 1);
    }
    const sdpa_options *popt = sv_place(&gs[12], &o, sizeof o, 1);
    char desc[400];
    snprintf(desc, sizeof desc,
             "serving case %lld: mode=%d R=%lld Hq=%lld Hkv=%lld Lall=%lld total_q=%lld S=%lld E=%lld Ev=%lld dtype=%s out=%s "
             "kernel=%d threads=%d pool=%d causal=%d sinks=%d alibi=%d bias=%d(%s) bs=%lld mbps=%lld bts=%lld NB=%lld lse=%d",
             (long long)n, mode, (long long)R, (long long)Hq, (long long)Hkv, (long long)Lall, (long long)total_q,
             (long long)S, (long long)E, (long long)Ev, sdpa_dtype_name((sdpa_dtype)dt), sdpa_dtype_name((sdpa_dtype)odt),
             kern, o.num_threads, o.threadpool != NULL, o.causal, sinks != NULL, o.alibi_slopes_rank, bias.role != NULL,
             sdpa_dtype_name((sdpa_dtype)bdt), (long long)bs, (long long)mbps, (long long)bts, (long long)NB, want_lse);
    ++g_sv_cases;
    unsigned char *base_o = NULL, *base_l = NULL;
    sdpa_status st0 = SDPA_OK;
    /* REDUCED (bf16 V): probabilities rounded to bf16, relative 2^-8 (sdpa.h's bound: twice that
     * times max |v|, and lse within 2^-8 more) */
    const double tol = amx ? 2.5e-2 : odt == SDPA_DTYPE_F32 ? 2e-4 : odt == SDPA_DTYPE_F16 ? 2e-3 : 1.6e-2;
    const double ltol = amx ? 1e-2 : 2e-4;
    for (int pass = -1; pass < 3; ++pass) {
        if (pass >= 0) {
            rb_gt *ts[4] = {&q, &k, &v, &bias};
            const int dts[4] = {dt, dt, dt, bdt};
            for (int t = 0; t < 4; ++t)
                if (ts[t]->role)
                    sv_poison(ts[t], dts[t], pass);
            static const int32_t BAD[3] = {-1, 0, 0x7FFFFFFF};
            for (int64_t e = 0; bt && e < bt_n; ++e)
                if (!bt_read[e])
                    bt[e] = pass == 1 ? (int32_t)NB : BAD[pass];
        }
        memset(out.g.lo, SV_CANARY, (size_t)out.span * oes);
        memset(lse.g.lo, SV_CANARY, (size_t)lse.span * 4);
        const sdpa_status st = sdpa_attention(pq, pk, pv, popt, po, NULL, want_lse ? pl : NULL);
        ++g_sv_calls;
        if (st == SDPA_OK && strstr(sdpa_last_kernel(), "amx") != NULL)
            ++g_sv_amx_calls;
        if (pass < 0) {
            st0 = st;
            if (st == SDPA_ERR_UNSUPPORTED && o.kernel != SDPA_KERNEL_AUTO) {
                ++g_sv_unsupported;
                RB_CHECK(sv_all_canary(&out) && sv_all_canary(&lse) && sdpa_last_error_message()[0] != '\0',
                         "%s: UNSUPPORTED wrote an output or left no message", desc);
                break;
            }
            if (st != SDPA_OK) {
                RB_FAIL("%s: %s (%s)", desc, sdpa_status_string(st), sdpa_last_error_message());
                break;
            }
            RB_CHECK(sv_gaps_intact(&out) && sv_gaps_intact(&lse) && (want_lse || sv_all_canary(&lse)),
                     "%s: write into an output stride gap", desc);
            int bad = 0;
            for (int64_t b = 0; b < QB && !bad; ++b)
                for (int64_t h = 0; h < Hq && !bad; ++h)
                    for (int64_t i = 0; i < QL && !bad; ++i) {
                        const int64_t li = (b * Hq + h) * QL + i;
                        for (int64_t c = 0; c < Ev && !bad; ++c) {
                            const int64_t ix[4] = {b, h, i, c};
                            const double got = sv_get(&out, odt, rb_gt_slot(&out, ix)), w = want[li * Ev + c];
                            if (!(fabs(got - w) <= tol * (1.0 + fabs(w)))) {
                                RB_FAIL("%s: out[%lld,%lld,%lld,%lld] = %.9g, float64 %.9g", desc, (long long)b, (long long)h,
                                        (long long)i, (long long)c, got, w);
                                bad = 1;
                            }
                        }
                        if (want_lse && !bad) {
                            const int64_t ix[3] = {b, h, i};
                            const double got = sv_get(&lse, SDPA_DTYPE_F32, rb_gt_slot(&lse, ix)), w = want_l[li];
                            if (!(isinf(w) ? got == w : fabs(got - w) <= ltol * (1.0 + fabs(w)))) {
                                RB_FAIL("%s: lse[%lld,%lld,%lld] = %.9g, float64 %.9g", desc, (long long)b, (long long)h,
                                        (long long)i, got, w);
                                bad = 1;
                            }
                        }
                    }
            base_o = (unsigned char *)malloc((size_t)out.span * oes);
            base_l = (unsigned char *)malloc((size_t)lse.span * 4);
            memcpy(base_o, out.g.lo, (size_t)out.span * oes);
            memcpy(base_l, lse.g.lo, (size_t)lse.span * 4);
        } else {
            RB_CHECK(st == st0 && memcmp(base_o, out.g.lo, (size_t)out.span * oes) == 0 &&
                         memcmp(base_l, lse.g.lo, (size_t)lse.span * 4) == 0,
                     "%s: poison %d in unread locations changed the result (%s)", desc, pass, sdpa_status_string(st));
        }
    }
    free(base_o);
    free(base_l);
    free(want);
    free(want_l);
    free(sc);
    free(bt_read);
    rb_gt *all[6] = {&q, &k, &v, &out, &lse, &bias};
    for (int t = 0; t < 6; ++t)
        if (all[t]->role)
            rb_gt_free(all[t]);
    for (int t = 0; t < 16; ++t)
        rb_guard_free(&gs[t]);
}

/* ------------------------------------------------------------ sdpa_kv_write (issue 27)
 * Key and value rows [T, Hkv, E(v)] of any dtype with random strides (reversed axes, stride 0,
 * BSHD order, padding), caches [NB, Hkv, bs, E(v)] of any dtype (permuted, padded), E past the
 * conversion's 256-element chunk now and then, slot_mapping and both view structs against guard
 * pages. Every named slot must hold its row (the later row wins; values exact in every dtype),
 * every other logical slot its old value, every stride gap of a cache its canary; the rerun
 * with NaN / +Inf / the largest finite value in the rows' gaps gives the same cache bytes. */
int64_t g_kvw_calls;

static void kvw_mark_logical(rb_gt *t)
{
    int64_t idx[4] = {0, 0, 0, 0};
    if (rb_numel(t->rank, t->shape) > 0)
        do {
            t->role[rb_gt_slot(t, idx)] = RB_READ;
        } while (rb_index_next(t->rank, t->shape, idx));
}

void kv_write_case(rb_rng *r, int64_t n)
{
    static const int DT[3] = {SDPA_DTYPE_F32, SDPA_DTYPE_F16, SDPA_DTYPE_BF16};
    const int64_t NB = rb_int(r, 1, 4), Hkv = rb_int(r, 1, 2), bs = rb_int(r, 1, 4), T = rb_int(r, 0, 5);
    const int64_t E = rb_chance(r, 10) ? rb_int(r, 257, 300) : rb_int(r, 1, 20);
    const int with_v = rb_chance(r, 60);
    const int64_t Ev = rb_chance(r, 50) ? E : rb_int(r, 1, 20);
    const int cdt = DT[rb_int(r, 0, 2)], rdt = DT[rb_int(r, 0, 2)];
    const size_t ces = cdt == SDPA_DTYPE_F32 ? 4 : 2, res = rdt == SDPA_DTYPE_F32 ? 4 : 2;
    const int64_t cshape[2][4] = {{NB, Hkv, bs, E}, {NB, Hkv, bs, Ev}}, rshape[2][3] = {{T, Hkv, E}, {T, Hkv, Ev}};
    const int in_lay = RB_LAY_NEG | RB_LAY_BCAST | RB_LAY_PERM | RB_LAY_PAD, out_lay = RB_LAY_PERM | RB_LAY_PAD;
    rb_gt cache[2], rows[2];
    memset(cache, 0, sizeof cache);
    memset(rows, 0, sizeof rows);
    unsigned char *before[2] = {NULL, NULL}, *after[2] = {NULL, NULL};
    for (int w = 0; w < 1 + with_v; ++w) {
        rb_gt_make(&cache[w], r, 4, cshape[w], ces, out_lay);
        rb_gt_make(&rows[w], r, 3, rshape[w], res, in_lay);
        memset(cache[w].g.lo, SV_CANARY, (size_t)cache[w].span * ces);
        kvw_mark_logical(&cache[w]);
        for (int64_t s = 0; s < cache[w].span; ++s)
            if (cache[w].role[s] == RB_READ)
                sv_put(&cache[w], cdt, s, sv_val(r)); /* the cache's old contents */
        sv_fill(&rows[w], rdt, r);
        kvw_mark_logical(&rows[w]);
        before[w] = malloc((size_t)cache[w].span * ces);
        after[w] = malloc((size_t)cache[w].span * ces);
        memcpy(before[w], cache[w].g.lo, (size_t)cache[w].span * ces);
    }
    int64_t slots[5];
    for (int64_t t = 0; t < T; ++t)
        slots[t] = rb_chance(r, 15) ? -1 : rb_int(r, 0, NB * bs - 1);
    rb_guard gs[5];
    memset(gs, 0, sizeof gs);
    const int64_t *gslots = sv_place(&gs[0], slots, (size_t)T * sizeof slots[0], rb_chance(r, 50));
    const sdpa_tensor views[4] = {sv_view(&cache[0], cdt), sv_view(&rows[0], rdt),
                                  with_v ? sv_view(&cache[1], cdt) : sv_view(&cache[0], cdt),
                                  with_v ? sv_view(&rows[1], rdt) : sv_view(&rows[0], rdt)};
    const sdpa_tensor *pkc = sv_place(&gs[1], &views[0], sizeof views[0], 1);
    const sdpa_tensor *pkr = sv_place(&gs[2], &views[1], sizeof views[1], 1);
    const sdpa_tensor *pvc = with_v ? sv_place(&gs[3], &views[2], sizeof views[2], 1) : NULL;
    const sdpa_tensor *pvr = with_v ? sv_place(&gs[4], &views[3], sizeof views[3], 1) : NULL;
    for (int pass = 0; pass < 4; ++pass) { /* 0: as filled; 1-3: the rows' gaps poisoned */
        if (pass > 0)
            for (int w = 0; w < 1 + with_v; ++w) {
                sv_poison(&rows[w], rdt, pass - 1);
                memcpy(cache[w].g.lo, before[w], (size_t)cache[w].span * ces);
            }
        const sdpa_status st = sdpa_kv_write(pkc, pvc, pkr, pvr, gslots);
        ++g_kvw_calls;
        if (st != SDPA_OK) {
            RB_FAIL("kv_write case %lld pass %d: %s (%s)", (long long)n, pass, sdpa_status_string(st),
                    sdpa_last_error_message());
            break;
        }
        for (int w = 0; w < 1 + with_v; ++w) {
            const size_t nb = (size_t)cache[w].span * ces;
            if (pass > 0) {
                RB_CHECK(memcmp(after[w], cache[w].g.lo, nb) == 0,
                         "kv_write case %lld: poisoned row gaps (pass %d) changed the cache", (long long)n, pass);
                continue;
            }
            memcpy(after[w], cache[w].g.lo, nb);
            RB_CHECK(sv_gaps_intact(&cache[w]), "kv_write case %lld: a stride gap of cache %d was written", (long long)n, w);
            int64_t idx[4] = {0, 0, 0, 0};
            do {
                const int64_t slot = idx[0] * bs + idx[2], at = rb_gt_slot(&cache[w], idx);
                int64_t from = -1;
                for (int64_t t = 0; t < T; ++t)
                    if (slots[t] == slot)
                        from = t;
                double want;
                if (from < 0) {
                    rb_gt old = cache[w];
                    old.g.lo = before[w];
                    want = sv_get(&old, cdt, at);
                } else {
                    const int64_t ri[3] = {from, idx[1], idx[3]};
                    want = sv_get(&rows[w], rdt, rb_gt_slot(&rows[w], ri));
                }
                const double got = sv_get(&cache[w], cdt, at);
                RB_CHECK(got == want, "kv_write case %lld: cache %d [%lld,%lld,%lld,%lld] = %g, want %g (row %lld)",
                         (long long)n, w, (long long)idx[0], (long long)idx[1], (long long)idx[2], (long long)idx[3],
                         got, want, (long long)from);
            } while (rb_index_next(4, cshape[w], idx));
        }
    }
    for (int w = 0; w < 2; ++w) {
        if (w <= with_v) {
            rb_gt_free(&cache[w]);
            rb_gt_free(&rows[w]);
        }
        free(before[w]);
        free(after[w]);
    }
    for (int g = 0; g < 5; ++g)
        rb_guard_free(&gs[g]);
}
