/*
 * Concurrency harness (issue 8): 8 application threads call every entry point at once
 * (sdpa_attention with every kernel, mask kind, weights / lse, dropout and 1-3 library threads;
 * the workspace queries; sdpa_mha_forward; sdpa_merge; every mask builder and converter;
 * sdpa_mask_count_empty_rows), each thread with its own shapes and options, and about a quarter
 * of the calls failing on purpose (shape mismatch, NaN, empty row, bad struct_size, bad builder
 * argument). Every result is first computed serially; concurrently, each call must return the
 * same status, the same output bytes (bit for bit), the same sdpa_last_kernel() and, after a
 * failure, exactly its own sdpa_last_error_message() (thread-local: it names this thread's
 * shapes, so another thread's message would differ). CI also runs it under ThreadSanitizer.
 *
 * 0.4/0.5 jobs too: paged f16/bf16 pools with block tables, sinks and ALiBi; packed cu_seqlens
 * batches; dense f16/bf16 calls with sinks and [B, Hq] slopes; sdpa_kv_write into each thread's
 * own caches; about half of these calls run on ONE sdpa_threadpool shared by all 8 threads (its
 * contract: concurrent calls take the pool one after the other); failing on purpose with a
 * block-table entry out of range, a decreasing cu_seqlens, a NaN sink, a bad kv-write slot.
 *
 *   test_concurrency [rounds]    default 16 rounds of every thread's jobs
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_util.h"

int rb_failures = 0;
static pthread_mutex_t g_fail_lock = PTHREAD_MUTEX_INITIALIZER;

enum { NTHREADS = 8, JOBS_PER_THREAD = 16 };

/* One pool shared by every application thread's pool calls (its calls take it in turn). */
static sdpa_threadpool *g_pool;
static int g_pooled;

typedef struct job job;
struct job {
    char name[160];
    sdpa_status (*run)(job *);
    /* attention */
    sdpa_tensor q, k, v, o, w, l, bias;
    sdpa_options opt;
    sdpa_allow_mask m;
    int with_w, with_l, query_ws;
    int64_t kl[4];
    /* 0.5 serving: block table, cu_seqlens, sinks, slopes; sdpa_kv_write */
    int32_t *bt, cuq[5], cuk[5];
    float sinks[8], slopes[32];
    sdpa_tensor kc, vc, kr, vr;
    int64_t slots[64];
    /* mha */
    sdpa_mha_params mp;
    sdpa_mha_options mo;
    sdpa_tensor x, wi, wo, bo;
    /* merge */
    sdpa_tensor ma, mla, mb, mlb, mo_, ml;
    /* masks */
    int64_t L, S, B, bad;
    int32_t *keep;
    uint8_t *ign;
    float *add;
    /* buffers */
    float *in;
    uint8_t *mask;
    unsigned char *out; /* all outputs of the job, compared byte for byte */
    size_t out_bytes;
    size_t ws_bytes;
    /* serial result */
    sdpa_status want;
    char want_msg[512], want_kernel[64];
    unsigned char *want_out;
};

static float *floats(rb_rng *r, size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t t = 0; t < n; ++t)
        p[t] = rb_uniform(r, -1, 1);
    return p;
}

/* ---- attention ---- */

static sdpa_status run_attention(job *j)
{
    if (j->query_ws) {
        size_t bytes = 0;
        sdpa_status st = sdpa_attention_workspace_size(&j->q, &j->k, &j->v, &j->opt, j->with_w, &bytes);
        memcpy(j->out + j->out_bytes - sizeof bytes, &bytes, sizeof bytes);
        if (st != SDPA_OK)
            return st;
    }
    return sdpa_attention(&j->q, &j->k, &j->v, &j->opt, &j->o, j->with_w ? &j->w : NULL, j->with_l ? &j->l : NULL);
}

static void make_attention(job *j, rb_rng *r, int tid, int fail_kind)
{
    const int64_t B = rb_int(r, 1, 2), Hkv = rb_int(r, 1, 2), Hq = Hkv * rb_int(r, 1, 2);
    const int64_t L = rb_chance(r, 30) ? rb_int(r, 1, 3) : rb_int(r, 5, 70), S = rb_int(r, 1, 150) + tid;
    const int64_t E = rb_int(r, 4, 48), Ev = rb_int(r, 4, 40);
    const size_t nq = (size_t)(B * Hq * L * E), nk = (size_t)(B * Hkv * S * E), nv = (size_t)(B * Hkv * S * Ev);
    const size_t no = (size_t)(B * Hq * L * Ev), nw = (size_t)(B * Hq * L * S), nl = (size_t)(B * Hq * L);
    j->in = floats(r, nq + nk + nv + nw);
    float *q = j->in, *k = q + nq, *v = k + nk, *bias = v + nv;
    j->out_bytes = (no + nw + nl) * sizeof(float) + sizeof(size_t);
    j->out = (unsigned char *)calloc(1, j->out_bytes);
    float *o = (float *)(void *)j->out, *w = o + no, *l = w + nw;
    (void)!sdpa_tensor_init_4d(&j->q, q, B, Hq, L, E);
    (void)!sdpa_tensor_init_4d(&j->k, k, B, Hkv, S, E);
    (void)!sdpa_tensor_init_4d(&j->v, v, B, Hkv, S, Ev);
    (void)!sdpa_tensor_init_4d(&j->o, o, B, Hq, L, Ev);
    (void)!sdpa_tensor_init_4d(&j->w, w, B, Hq, L, S);
    (void)!sdpa_tensor_init_4d(&j->bias, bias, B, Hq, L, S);
    const int64_t ls[3] = {B, Hq, L};
    (void)!sdpa_tensor_init(&j->l, l, 3, ls);
    sdpa_options_init(&j->opt);
    j->opt.kernel = (int32_t)rb_int(r, 0, 3);
    j->with_w = (j->opt.kernel == SDPA_KERNEL_AUTO || j->opt.kernel == SDPA_KERNEL_REFERENCE) && rb_chance(r, 40);
    j->with_l = rb_chance(r, 60);
    j->opt.num_threads = (int32_t)rb_int(r, 1, 3);
    j->query_ws = rb_chance(r, 30);
    if (j->with_w)
        j->opt.weights_stage = (int32_t)rb_int(r, 0, 3);
    if (rb_chance(r, 40)) {
        j->opt.causal = 1;
        j->opt.alignment = (int32_t)rb_int(r, 0, 1);
    }
    if (rb_chance(r, 25)) {
        j->opt.sliding_window = 1;
        j->opt.window_left = rb_int(r, 0, 20);
        j->opt.window_right = rb_int(r, -1, 5);
    }
    j->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    if (rb_chance(r, 30)) {
        j->mask = (uint8_t *)malloc((size_t)(L * S));
        for (int64_t t = 0; t < L * S; ++t)
            j->mask[t] = (uint8_t)rb_chance(r, 80);
        const int64_t ms[2] = {L, S};
        (void)!sdpa_allow_mask_init(&j->m, j->mask, 2, ms);
        j->opt.allow_mask = &j->m;
    }
    if (rb_chance(r, 25))
        j->opt.bias = &j->bias;
    if (rb_chance(r, 25)) {
        for (int64_t b = 0; b < B; ++b)
            j->kl[b] = rb_int(r, 1, S);
        j->opt.key_lengths = j->kl;
    }
    if (rb_chance(r, 15)) {
        j->opt.dropout_p = 0.3f;
        j->opt.dropout_seed = (uint64_t)tid * 1000 + 7;
    }
    if (rb_chance(r, 15))
        j->opt.softcap = 3.0f;
    switch (fail_kind) {
    case 1: /* S of v differs from S of k: SDPA_ERR_SHAPE naming this thread's sizes */
        j->v.shape[2] = S - 1 > 0 ? S - 1 : S + 1;
        break;
    case 2: /* NaN in an attended query row */
        q[(size_t)rb_int(r, 0, (int64_t)nq - 1)] = NAN;
        j->opt.allow_mask = NULL;
        j->opt.causal = 0;
        j->opt.sliding_window = 0;
        j->opt.key_lengths = NULL;
        j->opt.bias = NULL;
        break;
    case 3: /* an empty row under the ERROR policy */
        j->opt.empty_rows = SDPA_EMPTY_ROWS_ERROR;
        j->kl[0] = 0;
        if (B > 1)
            j->kl[1] = S;
        j->opt.key_lengths = j->kl;
        break;
    case 4: /* struct_size of no version */
        j->opt.struct_size = 9 + (size_t)tid;
        break;
    default:
        break;
    }
    snprintf(j->name, sizeof j->name, "thread %d attention B=%lld Hq=%lld Hkv=%lld L=%lld S=%lld E=%lld Ev=%lld kernel=%d threads=%d fail=%d",
             tid, (long long)B, (long long)Hq, (long long)Hkv, (long long)L, (long long)S, (long long)E, (long long)Ev,
             j->opt.kernel, j->opt.num_threads, fail_kind);
    j->run = run_attention;
}

/* ---- MHA ---- */

static sdpa_status run_mha(job *j)
{
    size_t bytes = 0;
    sdpa_status st = sdpa_mha_workspace_size(&j->mp, &j->x, &j->x, &j->x, &j->mo, j->with_w, &bytes);
    if (st != SDPA_OK)
        return st;
    j->ws_bytes = bytes;
    return sdpa_mha_forward(&j->mp, &j->x, &j->x, &j->x, &j->mo, &j->o, j->with_w ? &j->w : NULL);
}

static void make_mha(job *j, rb_rng *r, int tid, int fail)
{
    const int64_t H = rb_int(r, 1, 4), Dh = rb_int(r, 2, 8), E = H * Dh, B = rb_int(r, 1, 2), L = rb_int(r, 1, 30) + tid;
    const size_t nx = (size_t)(B * L * E), nwi = (size_t)(3 * E * E), nwo = (size_t)(E * E), no = nx;
    const size_t nw = (size_t)(B * L * L);
    j->in = floats(r, nx + nwi + nwo + (size_t)E);
    float *x = j->in, *wi = x + nx, *wo = wi + nwi, *bo = wo + nwo;
    j->out_bytes = (no + nw) * sizeof(float);
    j->out = (unsigned char *)calloc(1, j->out_bytes);
    float *o = (float *)(void *)j->out, *w = o + no;
    (void)!sdpa_tensor_init_3d(&j->x, x, B, L, E);
    const int64_t swi[2] = {3 * E, E}, swo[2] = {E, E}, sbo[1] = {E};
    (void)!sdpa_tensor_init(&j->wi, wi, 2, swi);
    (void)!sdpa_tensor_init(&j->wo, wo, 2, swo);
    (void)!sdpa_tensor_init(&j->bo, bo, 1, sbo);
    (void)!sdpa_tensor_init_3d(&j->o, o, B, L, fail ? E + 1 : E);
    (void)!sdpa_tensor_init_3d(&j->w, w, B, L, L);
    sdpa_mha_params_init(&j->mp);
    j->mp.embed_dim = E;
    j->mp.num_heads = H;
    j->mp.in_proj_weight = &j->wi;
    j->mp.out_proj_weight = &j->wo;
    j->mp.out_proj_bias = &j->bo;
    sdpa_mha_options_init(&j->mo);
    j->mo.causal = rb_chance(r, 50);
    j->mo.num_threads = (int32_t)rb_int(r, 1, 3);
    j->with_w = rb_chance(r, 50);
    snprintf(j->name, sizeof j->name, "thread %d mha B=%lld L=%lld E=%lld H=%lld fail=%d", tid, (long long)B, (long long)L,
             (long long)E, (long long)H, fail);
    j->run = run_mha;
}

/* ---- merge ---- */

static sdpa_status run_merge(job *j)
{
    return sdpa_merge(&j->ma, &j->mla, &j->mb, &j->mlb, &j->mo_, &j->ml);
}

static void make_merge(job *j, rb_rng *r, int tid, int fail)
{
    const int64_t R = rb_int(r, 1, 40) + tid, Ev = rb_int(r, 1, 32);
    j->in = floats(r, (size_t)(2 * R * Ev + 2 * R));
    float *a = j->in, *b = a + R * Ev, *la = b + R * Ev, *lb = la + R;
    if (fail)
        la[R / 2] = NAN;
    j->out_bytes = (size_t)(R * Ev + R) * sizeof(float);
    j->out = (unsigned char *)calloc(1, j->out_bytes);
    float *o = (float *)(void *)j->out, *l = o + R * Ev;
    const int64_t so[2] = {R, Ev}, sl[1] = {R};
    (void)!sdpa_tensor_init(&j->ma, a, 2, so);
    (void)!sdpa_tensor_init(&j->mb, b, 2, so);
    (void)!sdpa_tensor_init(&j->mo_, o, 2, so);
    (void)!sdpa_tensor_init(&j->mla, la, 1, sl);
    (void)!sdpa_tensor_init(&j->mlb, lb, 1, sl);
    (void)!sdpa_tensor_init(&j->ml, l, 1, sl);
    snprintf(j->name, sizeof j->name, "thread %d merge R=%lld Ev=%lld fail=%d", tid, (long long)R, (long long)Ev, fail);
    j->run = run_merge;
}

/* ---- builders and converters: a chain; the first failure ends it ---- */

#define CHAIN(call)                  \
    do {                             \
        sdpa_status st_ = (call);    \
        if (st_ != SDPA_OK)          \
            return st_;              \
    } while (0)

static sdpa_status run_masks(job *j)
{
    const int64_t L = j->L, S = j->S, B = j->B;
    uint8_t *o = j->out;
    CHAIN(sdpa_mask_causal(o, L, S, SDPA_ALIGN_BOTTOM_RIGHT));
    o += L * S;
    CHAIN(sdpa_mask_sliding_window(o, L, S, 3, 1, SDPA_ALIGN_TOP_LEFT));
    o += L * S;
    CHAIN(sdpa_mask_padding(o, B, S, j->kl, SDPA_PAD_LEFT));
    o += B * S;
    CHAIN(sdpa_mask_prefix_lm(o, L, L / 2));
    o += L * L;
    const int64_t cu[3] = {0, L / 2, L};
    CHAIN(sdpa_mask_block_diagonal(o, 2, cu, NULL, 1, SDPA_ALIGN_TOP_LEFT));
    o += L * L;
    CHAIN(sdpa_mask_from_ignore(j->ign, L * S, o));
    o += L * S;
    CHAIN(sdpa_mask_from_keep_int(j->keep, L * S, o));
    sdpa_allow_mask a, b;
    const int64_t sa[2] = {L, S}, sb[1] = {S}, so[3] = {2, L, S};
    (void)!sdpa_allow_mask_init(&a, j->out, 2, sa);
    (void)!sdpa_allow_mask_init(&b, j->out + L * S, 1, sb);
    uint8_t *andout = o + L * S;
    CHAIN(sdpa_mask_and(&a, &b, andout, 3, so));
    int64_t *cnt = (int64_t *)(void *)(andout + 2 * L * S + (8 - ((uintptr_t)(andout + 2 * L * S) & 7)) % 8);
    CHAIN(sdpa_mask_count_empty_rows(&a, &cnt[0], &cnt[1]));
    float *add = (float *)(void *)(cnt + 2);
    CHAIN(sdpa_mask_to_additive(j->out, L * S, add));
    return sdpa_mask_from_additive(add, L * S, NULL, (uint8_t *)(void *)(add + L * S));
}

static void make_masks(job *j, rb_rng *r, int tid, int fail)
{
    j->L = rb_int(r, 1, 20) + tid;
    j->S = rb_int(r, 1, 20) + tid;
    j->B = rb_int(r, 1, 4);
    for (int64_t b = 0; b < j->B; ++b)
        j->kl[b] = rb_int(r, 0, j->S);
    const int64_t n = j->L * j->S;
    j->keep = (int32_t *)malloc((size_t)n * 4);
    j->ign = (uint8_t *)malloc((size_t)n);
    for (int64_t t = 0; t < n; ++t) {
        j->keep[t] = (int32_t)rb_chance(r, 50);
        j->ign[t] = (uint8_t)rb_chance(r, 30);
    }
    if (fail)
        j->keep[rb_int(r, 0, n - 1)] = 2 + tid; /* not 0/1: the message names this index */
    j->out_bytes = (size_t)(16 * n + 2 * j->L * j->L + j->B * j->S + 64);
    j->out = (unsigned char *)calloc(1, j->out_bytes);
    snprintf(j->name, sizeof j->name, "thread %d masks L=%lld S=%lld B=%lld fail=%d", tid, (long long)j->L, (long long)j->S,
             (long long)j->B, fail);
    j->run = run_masks;
}

/* ---- 0.4/0.5 serving calls ---- */

static uint16_t half_bits(float x, int dt) /* x = k / 8, |x| <= 2: exact in both */
{
    if (dt == SDPA_DTYPE_BF16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        return (uint16_t)(u >> 16);
    }
    if (x == 0.0f)
        return 0;
    const uint16_t sign = x < 0 ? 0x8000 : 0;
    float a = fabsf(x);
    int e = 0;
    while (a >= 2.0f)
        a /= 2.0f, ++e;
    while (a < 1.0f)
        a *= 2.0f, --e;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0f) * 1024.0f));
}

static void fill_half(uint16_t *p, size_t n, int dt, rb_rng *r)
{
    for (size_t t = 0; t < n; ++t)
        p[t] = half_bits((float)rb_int(r, -16, 16) / 8.0f, dt);
}

static sdpa_status run_kv_write(job *j)
{
    return sdpa_kv_write(&j->kc, &j->vc, &j->kr, &j->vr, j->slots);
}

/* kind 0: paged, 1: packed, 2: dense f16/bf16 with sinks + [B, Hq] slopes, 3: sdpa_kv_write */
static void make_serving(job *j, rb_rng *r, int tid, int kind, int fail)
{
    const int dt = rb_chance(r, 50) ? SDPA_DTYPE_F16 : SDPA_DTYPE_BF16;
    const int64_t Hkv = rb_int(r, 1, 2), Hq = Hkv * rb_int(r, 1, 4), E = rb_int(r, 4, 40), Ev = rb_int(r, 4, 24);
    if (kind == 3) {
        const int64_t NB = rb_int(r, 2, 6), bs = rb_int(r, 1, 16), T = rb_int(r, 1, 64);
        const size_t nc = (size_t)(NB * Hkv * bs * E), nr = (size_t)(T * Hkv * E);
        j->in = floats(r, 2 * nr);
        j->out_bytes = 2 * nc * 2;
        j->out = (unsigned char *)calloc(1, j->out_bytes);
        const int64_t sc[4] = {NB, Hkv, bs, E}, sr[3] = {T, Hkv, E};
        (void)!sdpa_tensor_init_dtype(&j->kc, j->out, (sdpa_dtype)dt, 4, sc);
        (void)!sdpa_tensor_init_dtype(&j->vc, j->out + nc * 2, SDPA_DTYPE_F16, 4, sc);
        (void)!sdpa_tensor_init(&j->kr, j->in, 3, sr);
        (void)!sdpa_tensor_init(&j->vr, j->in + nr, 3, sr);
        for (int64_t t = 0; t < T; ++t)
            j->slots[t] = rb_chance(r, 10) ? -1 : rb_int(r, 0, NB * bs - 1);
        if (fail)
            j->slots[T - 1] = NB * bs + tid; /* SDPA_ERR_INDEX naming this row and value */
        snprintf(j->name, sizeof j->name, "thread %d kv_write NB=%lld bs=%lld Hkv=%lld E=%lld T=%lld %s fail=%d", tid,
                 (long long)NB, (long long)bs, (long long)Hkv, (long long)E, (long long)T, sdpa_dtype_name((sdpa_dtype)dt),
                 fail);
        j->run = run_kv_write;
        return;
    }
    const int64_t R = rb_int(r, 1, 3);
    int64_t L = kind == 0 ? rb_int(r, 1, 4) : rb_int(r, 1, 40), S = rb_int(r, 1, 120) + tid;
    int64_t QB = R, QL = L, KB = R, KS = S, total_q = 0, total_k = 0;
    sdpa_options_init(&j->opt);
    j->opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    j->opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    j->opt.causal = rb_chance(r, 60);
    j->opt.kernel = (int32_t)rb_int(r, 0, 3);
    j->opt.num_threads = (int32_t)rb_int(r, 1, 3);
    if (rb_chance(r, 50))
        j->opt.threadpool = g_pool, ++g_pooled;
    if (kind == 0) { /* pool [NB, Hkv, bs, E] in vLLM's [NB, bs, Hkv, E] order */
        const int64_t bs = rb_int(r, 1, 16), mbps = (S + bs - 1) / bs;
        KB = R * mbps + 1, KS = bs;
        j->bt = (int32_t *)malloc((size_t)(R * mbps) * 4);
        for (int64_t t = 0; t < R * mbps; ++t)
            j->bt[t] = (int32_t)((t * 5 + 1) % KB);
        for (int64_t b = 0; b < R; ++b)
            j->kl[b] = rb_int(r, 0, mbps * bs);
        if (fail)
            j->kl[0] = mbps * bs, j->bt[mbps - 1] = (int32_t)(KB + tid);
        j->opt.block_table = j->bt, j->opt.max_blocks_per_seq = mbps, j->opt.key_lengths = j->kl;
    } else if (kind == 1) {
        j->cuq[0] = j->cuk[0] = 0;
        for (int64_t b = 0; b < R; ++b) {
            j->cuq[b + 1] = j->cuq[b] + (int32_t)rb_int(r, 0, L);
            j->cuk[b + 1] = j->cuk[b] + (int32_t)rb_int(r, 0, S);
        }
        total_q = j->cuq[R], total_k = j->cuk[R];
        if (fail && R > 1)
            j->cuk[1] = j->cuk[2] + 1 + tid; /* decreasing: SDPA_ERR_INDEX */
        else if (fail)
            j->cuq[1] = (int32_t)total_q + 1 + tid;
        QB = 1, QL = total_q, KB = 1, KS = total_k;
        j->opt.cu_seqlens_q = j->cuq, j->opt.cu_seqlens_k = j->cuk, j->opt.num_seqs = R;
    }
    if (kind != 1 || rb_chance(r, 50)) {
        for (int64_t h = 0; h < Hq; ++h)
            j->sinks[h] = (float)rb_int(r, -16, 16) / 8.0f;
        if (fail && kind == 2)
            j->sinks[Hq - 1] = NAN;
        j->opt.sinks = j->sinks;
    }
    if (rb_chance(r, 70)) {
        j->opt.alibi_slopes_rank = kind == 2 ? 2 : 1;
        for (int64_t t = 0; t < (kind == 2 ? R : 1) * Hq; ++t)
            j->slopes[t] = (float)rb_int(r, 0, 8) / 16.0f;
        j->opt.alibi_slopes = j->slopes;
    }
    const size_t nq = (size_t)(QB * Hq * QL * E), nk = (size_t)(KB * Hkv * KS * E), nv = (size_t)(KB * Hkv * KS * Ev);
    const size_t no = (size_t)(QB * Hq * QL * Ev), nl = (size_t)(QB * Hq * QL);
    j->in = floats(r, (nq + nk + nv + 1) / 2 + 1);
    uint16_t *q = (uint16_t *)(void *)j->in, *k = q + nq, *v = k + nk;
    fill_half(q, nq + nk + nv, dt, r);
    const int odt = rb_chance(r, 50) ? dt : SDPA_DTYPE_F32;
    const size_t osz = odt == SDPA_DTYPE_F32 ? 4 : 2;
    j->out_bytes = no * osz + nl * 4 + 8;
    j->out = (unsigned char *)calloc(1, j->out_bytes);
    const int64_t sq[4] = {QB, Hq, QL, E}, so[4] = {QB, Hq, QL, Ev}, sl[3] = {QB, Hq, QL};
    (void)!sdpa_tensor_init_dtype(&j->q, q, (sdpa_dtype)dt, 4, sq);
    if (kind == 0) { /* strides of [NB, bs, Hkv, E] */
        const int64_t sk[4] = {KB, Hkv, KS, E}, sv[4] = {KB, Hkv, KS, Ev};
        const int64_t stk[4] = {KS * Hkv * E, E, Hkv * E, 1}, stv[4] = {KS * Hkv * Ev, Ev, Hkv * Ev, 1};
        (void)!sdpa_tensor_init_strided(&j->k, k, (sdpa_dtype)dt, 4, sk, stk);
        (void)!sdpa_tensor_init_strided(&j->v, v, (sdpa_dtype)dt, 4, sv, stv);
    } else {
        const int64_t sk[4] = {KB, Hkv, KS, E}, sv[4] = {KB, Hkv, KS, Ev};
        (void)!sdpa_tensor_init_dtype(&j->k, k, (sdpa_dtype)dt, 4, sk);
        (void)!sdpa_tensor_init_dtype(&j->v, v, (sdpa_dtype)dt, 4, sv);
    }
    (void)!sdpa_tensor_init_dtype(&j->o, j->out, (sdpa_dtype)odt, 4, so);
    j->with_l = rb_chance(r, 60);
    (void)!sdpa_tensor_init(&j->l, (float *)(void *)(j->out + (no * osz + 3) / 4 * 4), 3, sl);
    snprintf(j->name, sizeof j->name,
             "thread %d serving kind=%d R=%lld Hq=%lld Hkv=%lld L=%lld S=%lld E=%lld Ev=%lld %s out %s kernel=%d pool=%d fail=%d",
             tid, kind, (long long)R, (long long)Hq, (long long)Hkv, (long long)L, (long long)S, (long long)E, (long long)Ev,
             sdpa_dtype_name((sdpa_dtype)dt), sdpa_dtype_name((sdpa_dtype)odt), j->opt.kernel, j->opt.threadpool != NULL, fail);
    j->run = run_attention;
}

static void free_job(job *j)
{
    free(j->in);
    free(j->mask);
    free(j->out);
    free(j->want_out);
    free(j->keep);
    free(j->ign);
    free(j->bt);
}

/* ---- running ---- */

static job g_jobs[NTHREADS][JOBS_PER_THREAD];
static int g_rounds = 16;
static long g_calls[NTHREADS];

static void do_serial(job *j)
{
    memset(j->out, 0x5A, j->out_bytes);
    j->want = j->run(j);
    snprintf(j->want_msg, sizeof j->want_msg, "%s", sdpa_last_error_message());
    snprintf(j->want_kernel, sizeof j->want_kernel, "%s", sdpa_last_kernel());
    j->want_out = (unsigned char *)malloc(j->out_bytes);
    memcpy(j->want_out, j->out, j->out_bytes);
}

/* A packed batch (cu_seqlens_q) names the kernel of its last sequence: every sequence's finish
 * runs on the calling thread after the region, so the name is compared like any other. */
static void *thread_main(void *arg)
{
    const int tid = (int)(intptr_t)arg;
    rb_rng r = {(uint64_t)tid * 7919 + 1};
    for (int round = 0; round < g_rounds; ++round)
        for (int n = 0; n < JOBS_PER_THREAD; ++n) {
            job *j = &g_jobs[tid][(n + (int)rb_int(&r, 0, JOBS_PER_THREAD - 1)) % JOBS_PER_THREAD];
                    memset(j->out, 0x5A, j->out_bytes);
            sdpa_status st = j->run(j);
            ++g_calls[tid];
            const char *msg = sdpa_last_error_message(), *kern = sdpa_last_kernel();
            const int ok = st == j->want && strcmp(msg, j->want_msg) == 0 &&
                           (st != SDPA_OK || (j->run != run_attention && j->run != run_mha) ||
                            strcmp(kern, j->want_kernel) == 0) && memcmp(j->out, j->want_out, j->out_bytes) == 0;
            if (!ok) {
                pthread_mutex_lock(&g_fail_lock);
                RB_FAIL("%s: concurrent %s \"%s\" kernel \"%s\" vs serial %s \"%s\" kernel \"%s\"%s", j->name,
                        sdpa_status_string(st), msg, kern, sdpa_status_string(j->want), j->want_msg, j->want_kernel,
                        memcmp(j->out, j->want_out, j->out_bytes) ? " (outputs differ)" : "");
                pthread_mutex_unlock(&g_fail_lock);
            }
        }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        g_rounds = atoi(argv[1]);
    rb_rng r = {2026};
    int failing = 0;
    if (sdpa_threadpool_create(3, &g_pool) != SDPA_OK) {
        fprintf(stderr, "sdpa_threadpool_create: %s\n", sdpa_last_error_message());
        return 2;
    }
    for (int t = 0; t < NTHREADS; ++t)
        for (int n = 0; n < JOBS_PER_THREAD; ++n) {
            job *j = &g_jobs[t][n];
            memset(j, 0, sizeof *j);
            const int fail = n % 4 == 3; /* a quarter fail on purpose */
            if (n >= 12) { /* 0.4/0.5: paged, packed, dense f16/bf16 + sinks/ALiBi, kv_write */
                const int sfail = (n + t) % 4 == 3;
                make_serving(j, &r, t, n - 12, sfail);
                do_serial(j);
                RB_CHECK(sfail ? j->want == SDPA_ERR_INDEX || j->want == SDPA_ERR_NON_FINITE : j->want == SDPA_OK,
                         "%s: serial call: %s (%s)", j->name, sdpa_status_string(j->want), j->want_msg);
                failing += j->want != SDPA_OK;
                if (j->want != SDPA_OK && j->want_msg[0] == '\0')
                    RB_FAIL("%s: failed serially without a message", j->name);
                continue;
            }
            switch (n % 6) {
            case 0: case 1: case 2:
                make_attention(j, &r, t, fail ? 1 + (n / 4 + t) % 4 : 0);
                break;
            case 3:
                make_mha(j, &r, t, fail);
                break;
            case 4:
                make_merge(j, &r, t, fail);
                break;
            default:
                make_masks(j, &r, t, fail || (n == 5 && t % 2));
                break;
            }
            do_serial(j);
            failing += j->want != SDPA_OK;
            if (j->want != SDPA_OK && j->want_msg[0] == '\0')
                RB_FAIL("%s: failed serially without a message", j->name);
        }
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; ++t)
        if (pthread_create(&th[t], NULL, thread_main, (void *)(intptr_t)t) != 0) {
            perror("pthread_create");
            return 2;
        }
    long calls = 0;
    for (int t = 0; t < NTHREADS; ++t) {
        pthread_join(th[t], NULL);
        calls += g_calls[t];
    }
    for (int t = 0; t < NTHREADS; ++t)
        for (int n = 0; n < JOBS_PER_THREAD; ++n)
            free_job(&g_jobs[t][n]);
    sdpa_threadpool_destroy(g_pool);
    printf("test_concurrency: %d threads x %d jobs (%d failing on purpose; 4 per thread 0.4/0.5 serving jobs, %d on one shared "
           "sdpa_threadpool) x %d rounds = %ld concurrent calls, %d mismatches\n",
           NTHREADS, JOBS_PER_THREAD, failing, g_pooled, g_rounds, calls, rb_failures);
    return rb_failures ? 1 : 0;
}
