/*
 * Allocation and thread-creation failure injection (issue 8). This executable interposes
 * malloc, calloc, realloc, posix_memalign, aligned_alloc, free and pthread_create (its own
 * definitions win over libc's for libsdpa.so too; the real ones come from dlsym(RTLD_NEXT)), so
 * src/ needs no hooks. For each representative call (tiled, decode split over keys, reference
 * with weights, MHA with two masks and weights, caller workspaces, merge, mask AND):
 *   1. a clean run counts the allocations K and thread creations T the call makes;
 *   2. for every N in 1..K the N-th allocation fails: the call must return
 *      SDPA_ERR_OUT_OF_MEMORY with a message, every output byte untouched, and every block it
 *      allocated freed (counted here; the sanitizer build adds ASan's leak check at exit);
 *   3. for every N in 1..T the N-th pthread_create fails (and once, all of them): the library
 *      runs the tasks on the threads it has, so the call must succeed bit-identically.
 * A call with a caller workspace must allocate nothing (K = 0).
 * 0.4/0.5 calls too: bf16 tiled, paged bf16 decode with sinks and ALiBi, a packed batch, a call
 * on a caller sdpa_threadpool, sdpa_kv_write (documented to allocate nothing: K = 0) and
 * sdpa_threadpool_create (its N-th allocation or pthread_create failing: OUT_OF_MEMORY, *out
 * untouched, no leak). 0.6: a q8_0 K + scaled E4M3 V cache on the tiled and decode kernels, and
 * sdpa_kv_write_ex with RoPE into those caches (K = 0).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rb_util.h"

int rb_failures = 0;

/* ------------------------------------------------------------ interposers */

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void (*real_free)(void *);
static int (*real_pthread_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

/* dlsym may allocate before the real functions are known: serve it from a static arena. */
static _Alignas(64) unsigned char boot[1 << 16];
static size_t boot_used;
static int resolving;

static void *boot_alloc(size_t n)
{
    n = (n + 63) & ~(size_t)63;
    if (boot_used + n > sizeof boot)
        return NULL;
    void *p = boot + boot_used;
    boot_used += n;
    return p;
}

static int from_boot(const void *p)
{
    return (const unsigned char *)p >= boot && (const unsigned char *)p < boot + sizeof boot;
}

/* POSIX: a dlsym result converts to a function pointer; ISO C needs it done through memcpy. */
#define LOOKUP(var, name)                          \
    do {                                           \
        void *sym_ = dlsym(RTLD_NEXT, name);       \
        memcpy(&(var), &sym_, sizeof sym_);        \
    } while (0)

static void resolve(void)
{
    if (real_malloc || resolving)
        return;
    resolving = 1;
    LOOKUP(real_calloc, "calloc");
    LOOKUP(real_realloc, "realloc");
    LOOKUP(real_posix_memalign, "posix_memalign");
    LOOKUP(real_aligned_alloc, "aligned_alloc");
    LOOKUP(real_free, "free");
    LOOKUP(real_pthread_create, "pthread_create");
    LOOKUP(real_malloc, "malloc");
    resolving = 0;
}

/* Armed window: count calls, fail the N-th, track live blocks. */
static atomic_int g_armed;
static atomic_long g_allocs, g_threads;
static long g_fail_alloc, g_fail_thread; /* 0 = none; -1 = every thread creation */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
enum { TABLE = 1 << 14 };
static void *g_live[TABLE];
static long g_nlive;

static void track(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_lock);
    size_t h = ((uintptr_t)p >> 4) & (TABLE - 1);
    while (g_live[h])
        h = (h + 1) & (TABLE - 1);
    g_live[h] = p;
    ++g_nlive;
    pthread_mutex_unlock(&g_lock);
}

static void untrack(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_lock);
    if (g_nlive > 0) {
        size_t h = ((uintptr_t)p >> 4) & (TABLE - 1);
        for (size_t probe = 0; probe < TABLE && g_live[h]; ++probe, h = (h + 1) & (TABLE - 1))
            if (g_live[h] == p) {
                /* delete with backward shift so the probe chains stay intact */
                size_t hole = h, nx = (h + 1) & (TABLE - 1);
                while (g_live[nx]) {
                    size_t home = ((uintptr_t)g_live[nx] >> 4) & (TABLE - 1);
                    if (((nx - home) & (TABLE - 1)) >= ((nx - hole) & (TABLE - 1))) {
                        g_live[hole] = g_live[nx];
                        hole = nx;
                    }
                    nx = (nx + 1) & (TABLE - 1);
                }
                g_live[hole] = NULL;
                --g_nlive;
                break;
            }
    }
    pthread_mutex_unlock(&g_lock);
}

static atomic_long g_blas_allocs;

/* Whether code at `pc` belongs to the BLAS library. OpenBLAS 0.3.21 calls exit(1) when its own
 * malloc fails (level3_thread.c: "OpenBLAS: malloc failed in gemm_driver"), which no caller can
 * handle: those allocations are counted apart and never failed (see docs/testing.md). */
static int in_blas(void *pc)
{
    Dl_info info;
    return dladdr(pc, &info) && info.dli_fname && strstr(info.dli_fname, "blas") != NULL;
}

/* Whether code at `pc` is libsdpa's: only its allocations are counted, failed and tracked
 * (libc's own, e.g. pthread_getattr_np in a starting thread, and a sanitizer runtime's are not). */
static int in_sdpa(void *pc)
{
    Dl_info info;
    return dladdr(pc, &info) && info.dli_fname && strstr(info.dli_fname, "libsdpa") != NULL;
}

/* Per allocation call: 0 = not libsdpa's, 1 = libsdpa's (count and track), 2 = fail it. */
#define inject() inject_from(__builtin_return_address(0))
static int inject_from(void *caller)
{
    if (!atomic_load(&g_armed))
        return 0;
    if (!in_sdpa(caller)) {
        if (in_blas(caller))
            atomic_fetch_add(&g_blas_allocs, 1);
        return 0;
    }
    long k = atomic_fetch_add(&g_allocs, 1) + 1;
    return k == g_fail_alloc ? 2 : 1;
}

void *malloc(size_t n)
{
    resolve();
    if (!real_malloc)
        return boot_alloc(n);
    const int k = inject();
    if (k == 2)
        return NULL;
    void *p = real_malloc(n);
    if (k == 1)
        track(p);
    return p;
}

void *calloc(size_t a, size_t b)
{
    resolve();
    if (!real_calloc) {
        void *p = b && a > SIZE_MAX / b ? NULL : boot_alloc(a * b);
        if (p)
            memset(p, 0, a * b);
        return p;
    }
    const int k = inject();
    if (k == 2)
        return NULL;
    void *p = real_calloc(a, b);
    if (k == 1)
        track(p);
    return p;
}

void *realloc(void *old, size_t n)
{
    resolve();
    if (from_boot(old)) {
        void *p = malloc(n);
        if (p)
            memcpy(p, old, n); /* the arena block is at least as large as what it held */
        return p;
    }
    const int k = inject();
    if (k == 2)
        return NULL;
    void *p = real_realloc(old, n);
    if (atomic_load(&g_armed) && p) {
        untrack(old);
        if (k == 1)
            track(p);
    }
    return p;
}

int posix_memalign(void **out, size_t align, size_t n)
{
    resolve();
    const int k = inject();
    if (k == 2)
        return ENOMEM;
    int rc = real_posix_memalign(out, align, n);
    if (rc == 0 && k == 1)
        track(*out);
    return rc;
}

void *aligned_alloc(size_t align, size_t n)
{
    resolve();
    const int k = inject();
    if (k == 2)
        return NULL;
    void *p = real_aligned_alloc(align, n);
    if (k == 1)
        track(p);
    return p;
}

void free(void *p)
{
    if (p == NULL || from_boot(p))
        return;
    resolve();
    if (atomic_load(&g_armed))
        untrack(p);
    real_free(p);
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    resolve();
    if (atomic_load(&g_armed) && in_sdpa(__builtin_return_address(0))) {
        long k = atomic_fetch_add(&g_threads, 1) + 1;
        if (g_fail_thread == -1 || k == g_fail_thread)
            return EAGAIN;
    }
    return real_pthread_create(t, attr, fn, arg);
}

static void arm(long fail_alloc, long fail_thread)
{
    g_fail_alloc = fail_alloc;
    g_fail_thread = fail_thread;
    atomic_store(&g_allocs, 0);
    atomic_store(&g_threads, 0);
    atomic_store(&g_blas_allocs, 0);
    pthread_mutex_lock(&g_lock);
    memset(g_live, 0, sizeof g_live);
    g_nlive = 0;
    pthread_mutex_unlock(&g_lock);
    atomic_store(&g_armed, 1);
}

static void disarm(void)
{
    atomic_store(&g_armed, 0);
}

/* -------------------------------------------------------------- scenarios */

typedef struct outbuf {
    float *p;
    size_t n;
} outbuf;

typedef struct scenario {
    const char *name;
    sdpa_status (*call)(void *ctx);
    void *ctx;
    outbuf outs[3];
    int must_not_allocate;
} scenario;

static int64_t g_checked;

static void canary(scenario *s)
{
    for (int t = 0; t < 3; ++t)
        if (s->outs[t].p)
            memset(s->outs[t].p, 0xA5, s->outs[t].n * sizeof(float));
}

static int untouched(const scenario *s)
{
    for (int t = 0; t < 3; ++t) {
        const unsigned char *b = (const unsigned char *)s->outs[t].p;
        for (size_t k = 0; b && k < s->outs[t].n * sizeof(float); ++k)
            if (b[k] != 0xA5)
                return 0;
    }
    return 1;
}

/* Fill the stack below this frame with a pattern, so that a library frame that uses an
 * uninitialised slot (say, the handle of a thread whose pthread_create failed) sees garbage,
 * not a stale valid value left by the previous call. */
static void __attribute__((noinline)) scribble_stack(void)
{
    volatile unsigned char pad[1 << 16];
    for (size_t t = 0; t < sizeof pad; ++t)
        pad[t] = 0xA7;
}

static sdpa_status call_scribbled(scenario *s)
{
    scribble_stack();
    return s->call(s->ctx);
}

static void run_scenario(scenario *s)
{
    /* warm-up (BLAS buffers and threads exist afterwards), then the counted clean run */
    canary(s);
    sdpa_status st = s->call(s->ctx);
    if (st != SDPA_OK) {
        RB_FAIL("%s: clean run: %s (%s)", s->name, sdpa_status_string(st), sdpa_last_error_message());
        return;
    }
    canary(s);
    arm(0, 0);
    st = s->call(s->ctx);
    disarm();
    const long K = atomic_load(&g_allocs), T = atomic_load(&g_threads), KB = atomic_load(&g_blas_allocs);
    RB_CHECK(st == SDPA_OK && g_nlive == 0, "%s: counted run: %s, %ld blocks not freed", s->name, sdpa_status_string(st), g_nlive);
    RB_CHECK(!s->must_not_allocate || K == 0, "%s: the call allocated %ld blocks although the caller gave a workspace", s->name, K);
    float *good[3];
    for (int t = 0; t < 3; ++t) {
        good[t] = s->outs[t].p ? (float *)malloc(s->outs[t].n * sizeof(float)) : NULL;
        if (good[t])
            memcpy(good[t], s->outs[t].p, s->outs[t].n * sizeof(float));
    }
    for (long n = 1; n <= K; ++n) {
        canary(s);
        arm(n, 0);
        st = call_scribbled(s);
        disarm();
        ++g_checked;
        RB_CHECK(st == SDPA_ERR_OUT_OF_MEMORY, "%s: allocation %ld of %ld failed but the call returned %s", s->name, n, K,
                 sdpa_status_string(st));
        RB_CHECK(untouched(s), "%s: allocation %ld failed and an output was written", s->name, n);
        RB_CHECK(sdpa_last_error_message()[0] != '\0', "%s: allocation %ld failed without a message", s->name, n);
        RB_CHECK(g_nlive == 0, "%s: allocation %ld failed and %ld blocks leaked", s->name, n, g_nlive);
    }
    for (long n = (T > 0 ? 1 : 0); n <= T; ++n) { /* n = 0 with T = 0: nothing to inject */
        if (n == 0)
            break;
        for (int every = 0; every < 2; ++every) {
            canary(s);
            arm(0, every ? -1 : n);
            st = call_scribbled(s);
            disarm();
            ++g_checked;
            int same = st == SDPA_OK;
            for (int t = 0; t < 3 && same; ++t)
                if (good[t])
                    same = memcmp(good[t], s->outs[t].p, s->outs[t].n * sizeof(float)) == 0;
            RB_CHECK(same, "%s: pthread_create %s failed: %s (%s) or a different result", s->name,
                     every ? "every" : "N-th", sdpa_status_string(st), sdpa_last_error_message());
            RB_CHECK(g_nlive == 0, "%s: a thread failure leaked %ld blocks", s->name, g_nlive);
            if (every && n > 1)
                break;
        }
    }
    for (int t = 0; t < 3; ++t)
        free(good[t]);
    printf("  %-44s %3ld allocations (+%ld inside BLAS, not failed), %2ld thread creations: %ld + %ld injected failures checked\n",
           s->name, K, KB, T, K, T > 0 ? T + 1 : 0);
}

/* attention context */
typedef struct actx {
    sdpa_tensor q, k, v, o, w, l;
    sdpa_options opt;
    int with_w, with_l;
    uint8_t *mask;
    sdpa_allow_mask m;
    void *ws;
} actx;

static sdpa_status call_attention(void *vc)
{
    actx *c = (actx *)vc;
    return sdpa_attention(&c->q, &c->k, &c->v, &c->opt, &c->o, c->with_w ? &c->w : NULL, c->with_l ? &c->l : NULL);
}

static float *filled(size_t n, rb_rng *r)
{
    float *p = (float *)malloc(n * sizeof(float));
    for (size_t t = 0; t < n; ++t)
        p[t] = rb_uniform(r, -1, 1);
    return p;
}

static void attention_scenario(const char *name, int64_t B, int64_t H, int64_t L, int64_t S, int64_t E, int kernel,
                               int with_w, int threads, int with_mask, int caller_ws, rb_rng *r)
{
    actx c;
    memset(&c, 0, sizeof c);
    float *q = filled((size_t)(B * H * L * E), r), *k = filled((size_t)(B * H * S * E), r), *v = filled((size_t)(B * H * S * E), r);
    float *o = malloc((size_t)(B * H * L * E) * 4), *w = malloc((size_t)(B * H * L * S) * 4), *l = malloc((size_t)(B * H * L) * 4);
    (void)!sdpa_tensor_init_4d(&c.q, q, B, H, L, E);
    (void)!sdpa_tensor_init_4d(&c.k, k, B, H, S, E);
    (void)!sdpa_tensor_init_4d(&c.v, v, B, H, S, E);
    (void)!sdpa_tensor_init_4d(&c.o, o, B, H, L, E);
    (void)!sdpa_tensor_init_4d(&c.w, w, B, H, L, S);
    const int64_t ls[3] = {B, H, L};
    (void)!sdpa_tensor_init(&c.l, l, 3, ls);
    sdpa_options_init(&c.opt);
    c.opt.kernel = kernel;
    c.opt.num_threads = threads;
    c.with_w = with_w;
    c.with_l = 1;
    if (with_mask) {
        c.mask = malloc((size_t)(L * S));
        for (int64_t t = 0; t < L * S; ++t)
            c.mask[t] = (uint8_t)(t % S <= t / S + S - L || t % 7 == 0);
        const int64_t ms[2] = {L, S};
        (void)!sdpa_allow_mask_init(&c.m, c.mask, 2, ms);
        c.opt.allow_mask = &c.m;
        c.opt.causal = 1;
        c.opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    }
    if (caller_ws) {
        size_t bytes = 0;
        (void)!sdpa_attention_workspace_size(&c.q, &c.k, &c.v, &c.opt, with_w, &bytes);
        c.ws = malloc(bytes ? bytes : 1);
        c.opt.workspace = c.ws;
        c.opt.workspace_bytes = bytes;
    }
    scenario s = {name, call_attention, &c, {{o, (size_t)(B * H * L * E)}, {with_w ? w : NULL, (size_t)(B * H * L * S)}, {l, (size_t)(B * H * L)}}, caller_ws};
    run_scenario(&s);
    free(q), free(k), free(v), free(o), free(w), free(l), free(c.mask), free(c.ws);
}

typedef struct mctx {
    sdpa_mha_params p;
    sdpa_tensor x, kx, wi, wo, bi, bo, out, aw;
    sdpa_mha_options o;
    sdpa_allow_mask am, kpm;
    int with_w;
} mctx;

static sdpa_status call_mha(void *vc)
{
    mctx *c = (mctx *)vc;
    return sdpa_mha_forward(&c->p, &c->x, &c->kx, &c->kx, &c->o, &c->out, c->with_w ? &c->aw : NULL);
}

static void mha_scenario(const char *name, int caller_ws, int with_w, rb_rng *r)
{
    enum { B = 2, L = 96, S = 700, E = 64, H = 4 };
    mctx c;
    memset(&c, 0, sizeof c);
    float *x = filled(B * L * E, r), *kx = filled(B * S * E, r), *wi = filled(3 * E * E, r), *wo = filled(E * E, r);
    float *bi = filled(3 * E, r), *bo = filled(E, r), *out = malloc(B * L * E * 4), *aw = malloc(B * H * L * S * 4);
    static uint8_t am[L * S], kpm[B * S];
    for (int t = 0; t < L * S; ++t)
        am[t] = (uint8_t)(t % 5 != 1);
    for (int t = 0; t < B * S; ++t)
        kpm[t] = (uint8_t)(t % S < S - 1 - t / S);
    (void)!sdpa_tensor_init_3d(&c.x, x, B, L, E);
    (void)!sdpa_tensor_init_3d(&c.kx, kx, B, S, E);
    const int64_t s_wi[2] = {3 * E, E}, s_wo[2] = {E, E}, s_bi[1] = {3 * E}, s_bo[1] = {E}, s_aw[4] = {B, H, L, S};
    (void)!sdpa_tensor_init(&c.wi, wi, 2, s_wi);
    (void)!sdpa_tensor_init(&c.wo, wo, 2, s_wo);
    (void)!sdpa_tensor_init(&c.bi, bi, 1, s_bi);
    (void)!sdpa_tensor_init(&c.bo, bo, 1, s_bo);
    (void)!sdpa_tensor_init_3d(&c.out, out, B, L, E);
    (void)!sdpa_tensor_init(&c.aw, aw, 4, s_aw);
    sdpa_mha_params_init(&c.p);
    c.p.embed_dim = E;
    c.p.num_heads = H;
    c.p.in_proj_weight = &c.wi;
    c.p.in_proj_bias = &c.bi;
    c.p.out_proj_weight = &c.wo;
    c.p.out_proj_bias = &c.bo;
    sdpa_mha_options_init(&c.o);
    const int64_t s_am[2] = {L, S}, s_kpm[2] = {B, S};
    (void)!sdpa_allow_mask_init(&c.am, am, 2, s_am);
    (void)!sdpa_allow_mask_init(&c.kpm, kpm, 2, s_kpm);
    c.o.attn_mask = &c.am;
    c.o.key_padding_mask = &c.kpm;
    c.o.per_head_weights = 1;
    c.o.num_threads = 3;
    c.with_w = with_w;
    void *ws = NULL;
    if (caller_ws) {
        size_t bytes = 0;
        (void)!sdpa_mha_workspace_size(&c.p, &c.x, &c.kx, &c.kx, &c.o, with_w, &bytes);
        ws = malloc(bytes);
        c.o.workspace = ws;
        c.o.workspace_bytes = bytes;
    }
    scenario s = {name, call_mha, &c, {{out, B * L * E}, {with_w ? aw : NULL, B * H * L * S}, {NULL, 0}}, caller_ws};
    run_scenario(&s);
    free(x), free(kx), free(wi), free(wo), free(bi), free(bo), free(out), free(aw), free(ws);
}

typedef struct gctx {
    sdpa_tensor a, la, b, lb, o, l;
} gctx;

static sdpa_status call_merge(void *vc)
{
    gctx *c = (gctx *)vc;
    return sdpa_merge(&c->a, &c->la, &c->b, &c->lb, &c->o, &c->l);
}

static void merge_scenario(rb_rng *r)
{
    gctx c;
    float *a = filled(2 * 3 * 8, r), *b = filled(2 * 3 * 8, r), *la = filled(6, r), *lb = filled(6, r);
    float *o = malloc(48 * 4), *l = malloc(6 * 4);
    const int64_t so[3] = {2, 3, 8}, sl[2] = {2, 3};
    (void)!sdpa_tensor_init(&c.a, a, 3, so);
    (void)!sdpa_tensor_init(&c.b, b, 3, so);
    (void)!sdpa_tensor_init(&c.o, o, 3, so);
    (void)!sdpa_tensor_init(&c.la, la, 2, sl);
    (void)!sdpa_tensor_init(&c.lb, lb, 2, sl);
    (void)!sdpa_tensor_init(&c.l, l, 2, sl);
    scenario s = {"sdpa_merge", call_merge, &c, {{o, 48}, {l, 6}, {NULL, 0}}, 1};
    run_scenario(&s);
    free(a), free(b), free(la), free(lb), free(o), free(l);
}

/* 0.4/0.5 calls: bf16 tiled, paged decode with sinks + ALiBi, packed batch, a call on a caller
 * pool, sdpa_kv_write (no allocation), sdpa_threadpool_create. */
static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static float *filled16(size_t n, rb_rng *r) /* n bf16 values in a float buffer of (n + 1) / 2 */
{
    uint16_t *p = (uint16_t *)malloc((n + 1) / 2 * sizeof(float));
    for (size_t t = 0; t < n; ++t)
        p[t] = bf16_of(rb_uniform(r, -1, 1));
    return (float *)(void *)p;
}

enum { SV_BF16_TILED, SV_PAGED_DECODE, SV_PACKED, SV_POOL };

static void serving_scenario(const char *name, int variant, rb_rng *r)
{
    actx c;
    memset(&c, 0, sizeof c);
    sdpa_options_init(&c.opt);
    const int64_t Hq = 8, Hkv = 2, E = 64;
    int64_t B = 2, L = 160, S = 600, KB, KS;
    int32_t *bt = NULL, cu_q[4], cu_k[4];
    int64_t klen[3] = {0, 0, 0};
    float sinks[8], slopes[8];
    sdpa_threadpool *pool = NULL;
    const int dt = variant == SV_BF16_TILED || variant == SV_PAGED_DECODE ? SDPA_DTYPE_BF16 : SDPA_DTYPE_F32;
    if (variant == SV_PAGED_DECODE) {
        B = 3, L = 1;
        const int64_t bs = 16, mbps = 64, NB = B * mbps;
        KB = NB, KS = bs, S = mbps * bs;
        bt = (int32_t *)malloc((size_t)(B * mbps) * 4);
        for (int64_t t = 0; t < B * mbps; ++t)
            bt[t] = (int32_t)((t * 37) % NB);
        klen[0] = 1000, klen[1] = 17, klen[2] = 640;
        c.opt.block_table = bt, c.opt.max_blocks_per_seq = mbps, c.opt.key_lengths = klen;
        c.opt.kernel = SDPA_KERNEL_DECODE;
        for (int h = 0; h < 8; ++h)
            sinks[h] = (float)h / 4 - 1, slopes[h] = (float)(h + 1) / 16;
        c.opt.sinks = sinks, c.opt.alibi_slopes = slopes, c.opt.alibi_slopes_rank = 1;
        c.opt.causal = 1, c.opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    } else if (variant == SV_PACKED) {
        cu_q[0] = 0, cu_q[1] = 70, cu_q[2] = 71, cu_q[3] = 200;
        cu_k[0] = 0, cu_k[1] = 300, cu_k[2] = 900, cu_k[3] = 1100;
        B = 1, L = 200, S = 1100, KB = 1, KS = S;
        c.opt.cu_seqlens_q = cu_q, c.opt.cu_seqlens_k = cu_k, c.opt.num_seqs = 3;
        c.opt.causal = 1;
    } else {
        KB = B, KS = S;
        c.opt.kernel = SDPA_KERNEL_TILED;
        c.opt.causal = variant == SV_POOL;
    }
    if (variant == SV_POOL && sdpa_threadpool_create(3, &pool) != SDPA_OK) {
        RB_FAIL("%s: sdpa_threadpool_create: %s", name, sdpa_last_error_message());
        return;
    }
    c.opt.threadpool = pool;
    c.opt.num_threads = 3;
    const size_t nq = (size_t)(B * Hq * L * E), nk = (size_t)(KB * Hkv * KS * E), nl = (size_t)(B * Hq * L);
    float *q = dt == SDPA_DTYPE_F32 ? filled(nq, r) : filled16(nq, r);
    float *k = dt == SDPA_DTYPE_F32 ? filled(nk, r) : filled16(nk, r);
    float *v = dt == SDPA_DTYPE_F32 ? filled(nk, r) : filled16(nk, r);
    const size_t no = dt == SDPA_DTYPE_F32 ? nq : (nq + 1) / 2;
    float *o = malloc(no * 4), *l = malloc(nl * 4);
    const int64_t sq[4] = {B, Hq, L, E}, sk[4] = {KB, Hkv, KS, E}, sl[3] = {B, Hq, L};
    (void)!sdpa_tensor_init_dtype(&c.q, q, (sdpa_dtype)dt, 4, sq);
    (void)!sdpa_tensor_init_dtype(&c.k, k, (sdpa_dtype)dt, 4, sk);
    (void)!sdpa_tensor_init_dtype(&c.v, v, (sdpa_dtype)dt, 4, sk);
    (void)!sdpa_tensor_init_dtype(&c.o, o, (sdpa_dtype)dt, 4, sq);
    (void)!sdpa_tensor_init(&c.l, l, 3, sl);
    c.with_l = 1;
    scenario s = {name, call_attention, &c, {{o, no}, {l, nl}, {NULL, 0}}, 0};
    run_scenario(&s);
    sdpa_threadpool_destroy(pool);
    free(q), free(k), free(v), free(o), free(l), free(bt);
}

typedef struct kctx {
    sdpa_tensor kc, vc, k, v;
    int64_t slots[40];
} kctx;

static sdpa_status call_kv_write(void *vc)
{
    kctx *c = (kctx *)vc;
    return sdpa_kv_write(&c->kc, &c->vc, &c->k, &c->v, c->slots);
}

static void kv_write_scenario(rb_rng *r)
{
    kctx c;
    const int64_t NB = 8, bs = 16, Hkv = 2, E = 32, T = 40;
    float *k = filled((size_t)(T * Hkv * E), r), *v = filled((size_t)(T * Hkv * E), r);
    float *kc = malloc((size_t)(NB * Hkv * bs * E) / 2 * 4), *vcache = malloc((size_t)(NB * Hkv * bs * E) / 2 * 4);
    const int64_t sc[4] = {NB, Hkv, bs, E}, sr[3] = {T, Hkv, E};
    (void)!sdpa_tensor_init_dtype(&c.kc, kc, SDPA_DTYPE_BF16, 4, sc);
    (void)!sdpa_tensor_init_dtype(&c.vc, vcache, SDPA_DTYPE_F16, 4, sc);
    (void)!sdpa_tensor_init(&c.k, k, 3, sr);
    (void)!sdpa_tensor_init(&c.v, v, 3, sr);
    for (int64_t t = 0; t < T; ++t)
        c.slots[t] = t % 9 == 4 ? -1 : (t * 7) % (NB * bs);
    scenario s = {"sdpa_kv_write (f32 rows -> bf16/f16 caches)", call_kv_write, &c,
                  {{kc, (size_t)(NB * Hkv * bs * E) / 2}, {vcache, (size_t)(NB * Hkv * bs * E) / 2}, {NULL, 0}}, 1};
    run_scenario(&s);
    free(k), free(v), free(kc), free(vcache);
}

/* 0.6: an 8-bit cache (q8_0 K, E4M3 V with v_scale 0.5: the scaled FP8 rows go through the
 * loaders' float32 tiles) on the tiled and the decode kernel, and its write by sdpa_kv_write_ex
 * with RoPE (documented to allocate nothing: K = 0). The caches are filled by kv_write_ex before
 * injection starts. */
typedef struct k8ctx {
    sdpa_tensor kc, vc, k, v, cos, sin;
    sdpa_kv_write_options o;
    sdpa_rope_params rope;
    int64_t slots[64], pos[64];
} k8ctx;

static sdpa_status call_kv_write_ex(void *vc)
{
    k8ctx *c = (k8ctx *)vc;
    return sdpa_kv_write_ex(&c->kc, &c->vc, &c->k, &c->v, c->slots, &c->o);
}

static void kv8_scenario(const char *name, int decode, rb_rng *r)
{
    const int64_t Hq = 8, Hkv = 2, E = 64, B = decode ? 1 : 2, L = decode ? 1 : 96, S = decode ? 2048 : 400;
    const int64_t nrows = B * Hkv * S, nq = B * Hq * L * E, nl = B * Hq * L;
    unsigned char *kb = malloc((size_t)(nrows * (E / 32) * 34)), *vb = malloc((size_t)(nrows * E));
    float *kf = filled((size_t)(nrows * E), r), *vf = filled((size_t)(nrows * E), r);
    float vscale[1] = {0.5f};
    sdpa_tensor tvs;
    (void)!sdpa_tensor_init(&tvs, vscale, 1, (int64_t[]){1});
    k8ctx w;
    memset(&w, 0, sizeof w);
    const int64_t cs[4] = {B, Hkv, S, E}, cst[4] = {Hkv * S * (E / 32), S * (E / 32), E / 32, 1};
    (void)!sdpa_tensor_init_strided(&w.kc, kb, SDPA_DTYPE_Q8_0, 4, cs, cst);
    (void)!sdpa_tensor_init_dtype(&w.vc, vb, SDPA_DTYPE_FP8_E4M3, 4, cs);
    sdpa_kv_write_options_init(&w.o);
    w.o.v_scale = &tvs;
    int64_t *slots = malloc((size_t)S * sizeof(int64_t));
    for (int64_t b = 0; b < B; ++b) { /* the dense cache is the pool with num_blocks = B, block_size = S */
        for (int64_t t = 0; t < S; ++t)
            slots[t] = b * S + t;
        sdpa_tensor rk, rv;
        const int64_t rs[3] = {S, Hkv, E}, rst[3] = {E, S * E, 1};
        (void)!sdpa_tensor_init_strided(&rk, kf + b * Hkv * S * E, SDPA_DTYPE_F32, 3, rs, rst);
        (void)!sdpa_tensor_init_strided(&rv, vf + b * Hkv * S * E, SDPA_DTYPE_F32, 3, rs, rst);
        RB_CHECK(sdpa_kv_write_ex(&w.kc, &w.vc, &rk, &rv, slots, &w.o) == SDPA_OK, "%s: fill: %s", name,
                 sdpa_last_error_message());
    }
    free(slots);
    actx c;
    memset(&c, 0, sizeof c);
    sdpa_options_init(&c.opt);
    c.opt.v_scale = &tvs;
    c.opt.kernel = decode ? SDPA_KERNEL_DECODE : SDPA_KERNEL_TILED;
    c.opt.causal = !decode;
    c.opt.num_threads = 3;
    float *q = filled((size_t)nq, r), *o = malloc((size_t)nq * 4), *l = malloc((size_t)nl * 4);
    const int64_t sq[4] = {B, Hq, L, E}, sl[3] = {B, Hq, L};
    (void)!sdpa_tensor_init(&c.q, q, 4, sq);
    c.k = w.kc;
    c.v = w.vc;
    (void)!sdpa_tensor_init(&c.o, o, 4, sq);
    (void)!sdpa_tensor_init(&c.l, l, 3, sl);
    c.with_l = 1;
    scenario s = {name, call_attention, &c, {{o, (size_t)nq}, {l, (size_t)nl}, {NULL, 0}}, 0};
    run_scenario(&s);
    free(q), free(o), free(l);
    if (decode) { /* the write: 64 rows with RoPE into the same caches */
        const int64_t T = 64, half = E / 2;
        float *k = filled((size_t)(T * Hkv * E), r), *v = filled((size_t)(T * Hkv * E), r);
        float *ct = malloc((size_t)(4096 * half) * 4), *st = malloc((size_t)(4096 * half) * 4);
        for (int64_t i = 0; i < 4096 * half; ++i)
            ct[i] = rb_uniform(r, -1, 1), st[i] = rb_uniform(r, -1, 1);
        (void)!sdpa_tensor_init(&w.k, k, 3, (int64_t[]){T, Hkv, E});
        (void)!sdpa_tensor_init(&w.v, v, 3, (int64_t[]){T, Hkv, E});
        (void)!sdpa_tensor_init(&w.cos, ct, 2, (int64_t[]){4096, half});
        (void)!sdpa_tensor_init(&w.sin, st, 2, (int64_t[]){4096, half});
        sdpa_rope_params_init(&w.rope);
        w.rope.cos = &w.cos, w.rope.sin = &w.sin;
        w.o.rope = &w.rope;
        w.o.positions = w.pos;
        for (int64_t t = 0; t < T; ++t)
            w.slots[t] = t % 9 == 4 ? -1 : (t * 31) % S, w.pos[t] = 100 + t;
        scenario sw = {"sdpa_kv_write_ex (RoPE, q8_0 K / E4M3 V)", call_kv_write_ex, &w,
                       {{(float *)(void *)kb, (size_t)(nrows * (E / 32) * 34) / 4}, {(float *)(void *)vb, (size_t)(nrows * E) / 4}, {NULL, 0}}, 1};
        run_scenario(&sw);
        free(k), free(v), free(ct), free(st);
    }
    free(kb), free(vb), free(kf), free(vf);
}

/* sdpa_threadpool_create: the N-th allocation or pthread_create failing gives
 * SDPA_ERR_OUT_OF_MEMORY, *out untouched, nothing leaked (its workers joined). */
static void pool_create_scenario(void)
{
    sdpa_threadpool *p = NULL;
    arm(0, 0);
    sdpa_status st = sdpa_threadpool_create(4, &p);
    disarm();
    const long K = atomic_load(&g_allocs), T = atomic_load(&g_threads);
    RB_CHECK(st == SDPA_OK && T == 3, "sdpa_threadpool_create(4): %s, %ld threads", sdpa_status_string(st), T);
    sdpa_threadpool_destroy(p);
    sdpa_threadpool *const sentinel = (sdpa_threadpool *)(uintptr_t)0x5A5A;
    for (long n = 1; n <= K + T; ++n) {
        p = sentinel;
        if (n <= K)
            arm(n, 0);
        else
            arm(0, n - K);
        st = sdpa_threadpool_create(4, &p);
        disarm();
        ++g_checked;
        RB_CHECK(st == SDPA_ERR_OUT_OF_MEMORY && p == sentinel && sdpa_last_error_message()[0] != '\0',
                 "sdpa_threadpool_create: %s %ld failed: %s, out %s", n <= K ? "allocation" : "pthread_create",
                 n <= K ? n : n - K, sdpa_status_string(st), p == sentinel ? "untouched" : "written");
        RB_CHECK(g_nlive == 0, "sdpa_threadpool_create: failure %ld leaked %ld blocks", n, g_nlive);
        if (st == SDPA_OK && p != sentinel)
            sdpa_threadpool_destroy(p);
    }
    printf("  %-44s %3ld allocations, %2ld thread creations: %ld injected failures checked\n", "sdpa_threadpool_create(4)", K,
           T, K + T);
}

int main(void)
{
    rb_rng r = {42};
    printf("test_inject: failing the N-th allocation / pthread_create for every N each call makes\n");
    attention_scenario("tiled, 3 threads", 2, 4, 256, 512, 64, SDPA_KERNEL_TILED, 0, 3, 0, 0, &r);
    attention_scenario("tiled, mask + causal, 2 threads", 2, 2, 200, 900, 64, SDPA_KERNEL_TILED, 0, 2, 1, 0, &r);
    attention_scenario("decode split over keys, 3 threads", 1, 2, 1, 4096, 64, SDPA_KERNEL_DECODE, 0, 3, 0, 0, &r);
    attention_scenario("reference with weights", 2, 2, 100, 3000, 64, SDPA_KERNEL_REFERENCE, 1, 2, 1, 0, &r);
    attention_scenario("auto, caller workspace", 2, 2, 130, 900, 64, SDPA_KERNEL_AUTO, 0, 3, 1, 1, &r);
    attention_scenario("reference with weights, caller workspace", 1, 2, 9, 30, 8, SDPA_KERNEL_REFERENCE, 1, 1, 1, 1, &r);
    mha_scenario("MHA, attn_mask + key_padding_mask, weights", 0, 1, &r);
    mha_scenario("MHA, masks and weights, caller workspace", 1, 1, &r);
    mha_scenario("MHA, masks, no weights, 3 threads", 0, 0, &r);
    merge_scenario(&r);
    serving_scenario("bf16 q/k/v/out, tiled, 3 threads", SV_BF16_TILED, &r);
    serving_scenario("paged bf16 decode, sinks + ALiBi, 3 threads", SV_PAGED_DECODE, &r);
    serving_scenario("packed batch (cu_seqlens_q/k), causal", SV_PACKED, &r);
    serving_scenario("tiled on a caller sdpa_threadpool(3)", SV_POOL, &r);
    kv_write_scenario(&r);
    kv8_scenario("q8_0 K + scaled E4M3 V, tiled, causal, 3 threads", 0, &r);
    kv8_scenario("q8_0 K + scaled E4M3 V, decode split, 3 threads", 1, &r);
    pool_create_scenario();
    printf("test_inject: %lld injected failures checked, %d failed\n", (long long)g_checked, rb_failures);
    return rb_failures ? 1 : 0;
}
