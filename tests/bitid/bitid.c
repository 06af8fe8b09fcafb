/* Bit-identity harness (issue 28): a broad, deterministic set of calls through the public API
 * only (so it links against any release since 0.5.0, e.g. bench/build_baseline.sh 9892fff),
 * printing one FNV-1a 64 hash per group of calls over every output byte, the status and
 * sdpa_last_kernel(). A refactor that keeps the arithmetic leaves every line unchanged.
 *
 * Groups: kernel (reference, tiled, decode) x dtypes of q/k/v/out x precision x threads over
 * random strided problems (masks, causal, alignment, offsets, windows, key lengths, bias of
 * every dtype, softcap, ALiBi, sinks, dropout, lse, weights stages); paged K/V and packed
 * batches per kernel x dtypes x precision; MHA; merge; kv_write of every dtype pair.
 * The ISA is the process's (SDPA_MAX_ISA): tests/bitid/check.sh runs one process per cap.
 *
 *   bitid [cases]     (default 24 random problems per group)
 */
#include "sdpa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic random numbers (splitmix64) and the hash (FNV-1a 64) ---- */

static uint64_t g_rng;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int64_t rint_(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }
static int chance(double p) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0) < p; }

typedef struct hash {
    uint64_t h, names; /* outputs and statuses; the kernel names (sdpa_last_kernel) apart */
    long calls, ok;
} hash;
static void hash_bytes(hash *h, const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; ++i) {
        h->h ^= c[i];
        h->h *= 0x100000001B3ull;
    }
}
static void names_bytes(hash *h, const char *c) {
    for (; *c; ++c) {
        h->names ^= (unsigned char)*c;
        h->names *= 0x100000001B3ull;
    }
}
static void hash_init(hash *h) {
    h->h = h->names = 0xCBF29CE484222325ull;
    h->calls = h->ok = 0;
}
static void hash_status(hash *h, sdpa_status st) {
    int32_t s = (int32_t)st;
    hash_bytes(h, &s, sizeof s);
    h->calls++;
    h->ok += st == SDPA_OK;
    if (st == SDPA_OK)
        names_bytes(h, sdpa_last_kernel());
}
static void hash_print(const char *name, const hash *h) {
    printf("%-44s %016llx %4ld %4ld names %016llx\n", name, (unsigned long long)h->h, h->calls, h->ok,
           (unsigned long long)h->names);
}

/* ---- values: multiples of 1/64 in [-2, 2] (exact in f16 and bf16) ---- */

static float rval(double range) {
    const int64_t k = (int64_t)(range * 64.0);
    return (float)rint_(-k, k) / 64.0f;
}
static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16); /* exact values only */
}
static uint16_t to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) == 0)
        return sign;
    const int e = (int)((u >> 23) & 0xff) - 127 + 15; /* normal, exact values only */
    return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)((u >> 13) & 0x3ffu));
}
static size_t dsize(int dt) { return dt == SDPA_DTYPE_F32 ? 4 : 2; }
static void put(void *buf, int dt, int64_t i, float x) {
    if (dt == SDPA_DTYPE_F32)
        ((float *)buf)[i] = x;
    else if (dt == SDPA_DTYPE_F16)
        ((uint16_t *)buf)[i] = to_f16(x);
    else
        ((uint16_t *)buf)[i] = to_bf16(x);
}

/* A rank-4 buffer [d0, d1, d2, d3] in layout BHLE (perm 0) or BLHE (perm 1), with padding
 * pad elements after each innermost row; filled with random values (inputs) or a pattern. */
typedef struct buf {
    void *data;
    size_t bytes;
    int dt;
    sdpa_tensor t;
} buf;
static void buf_make(buf *b, int dt, const int64_t sh[4], int perm, int64_t pad, int fill, double range) {
    int64_t st[4];
    const int64_t row = sh[3] + pad;
    if (perm == 0) {
        st[3] = 1;
        st[2] = row;
        st[1] = sh[2] * row;
        st[0] = sh[1] * sh[2] * row;
    } else {
        st[3] = 1;
        st[1] = row;
        st[2] = sh[1] * row;
        st[0] = sh[1] * sh[2] * row;
    }
    const int64_t n = sh[0] * sh[1] * sh[2] * row;
    b->dt = dt;
    b->bytes = (size_t)(n > 0 ? n : 1) * dsize(dt);
    b->data = calloc(1, b->bytes);
    for (int64_t i = 0; i < n; ++i)
        put(b->data, dt, i, fill ? rval(range) : (float)(i % 7) - 3.0f);
    if (sdpa_tensor_init_strided(&b->t, b->data, (sdpa_dtype)dt, 4, sh, st) != SDPA_OK) {
        fprintf(stderr, "bitid: bad view\n");
        exit(2);
    }
}
static void buf_free(buf *b) { free(b->data); }

/* ---- one random attention problem ---- */

typedef struct dtypes {
    const char *name;
    int q, k, v, out;
} dtypes;
static const dtypes DTS[] = {
    {"f32", 0, 0, 0, 0},          {"f16", 1, 1, 1, 1},      {"bf16", 2, 2, 2, 2},
    {"q32-kv16-o32", 0, 1, 1, 0}, {"bf16-o32", 2, 2, 2, 0}, {"q32-k16-vbf16-obf16", 0, 1, 2, 2},
    {"qbf16-kbf16-v16-o16", 2, 2, 1, 1},
};
#define NDT ((int)(sizeof DTS / sizeof DTS[0]))

enum { KIND_DENSE, KIND_PAGED, KIND_PACKED };

static void run_case(hash *h, int kernel, const dtypes *dt, int precision, int threads, int kind) {
    static const int64_t Ls[] = {1, 3, 16, 37, 70, 130}, Ss[] = {1, 7, 33, 64, 129, 200};
    static const int64_t Es[] = {16, 32, 40, 64, 128};
    int64_t B = rint_(1, 2), Hkv = rint_(1, 2), Hq = Hkv * rint_(1, 2);
    int64_t L = kernel == SDPA_KERNEL_DECODE ? rint_(1, 4) : Ls[rint_(0, 5)];
    int64_t S = Ss[rint_(0, 5)], E = Es[rint_(0, 4)], Ev = chance(0.7) ? E : Es[rint_(0, 4)];
    if (L * S > 8000 && E > 64)
        E = Ev = 64;
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = kernel;
    o.precision = precision;
    o.num_threads = threads;
    o.empty_rows = chance(0.9) ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    if (chance(0.3))
        o.scale = 0.05f + (float)rint_(0, 20) / 40.0f;
    if (chance(0.2))
        o.softcap = (float)rint_(3, 30);
    o.causal = chance(0.35);
    o.alignment = chance(0.5) ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    int64_t offsets[4], kl[4], ql[4];
    int32_t cu_q[5], cu_k[5];
    if (kind == KIND_PACKED) {
        /* three sequences; q [1, Hq, total_q, E], k/v [1, Hkv, total_k, E] */
        const int64_t R = 3;
        cu_q[0] = cu_k[0] = 0;
        for (int r = 0; r < R; ++r) {
            cu_q[r + 1] = cu_q[r] + (int32_t)(kernel == SDPA_KERNEL_DECODE ? rint_(0, 3) : rint_(0, 40));
            cu_k[r + 1] = cu_k[r] + (int32_t)rint_(0, 90);
        }
        B = 1;
        L = cu_q[R];
        S = cu_k[R];
        o.cu_seqlens_q = cu_q;
        o.cu_seqlens_k = cu_k;
        o.num_seqs = R;
    }
    const int64_t nseq = kind == KIND_PACKED ? o.num_seqs : B;
    if (chance(0.1)) {
        o.alignment = SDPA_ALIGN_OFFSETS;
        for (int64_t b = 0; b < nseq; ++b)
            offsets[b] = rint_(-S / 2, S);
        o.query_offsets = offsets;
    }
    if (chance(0.15)) {
        o.sliding_window = 1;
        o.window_left = rint_(-1, S);
        o.window_right = rint_(-1, S / 3);
    }
    if (kind == KIND_PAGED || chance(0.2)) {
        for (int64_t b = 0; b < nseq; ++b) {
            const int64_t Sb = kind == KIND_PACKED ? cu_k[b + 1] - cu_k[b] : S;
            kl[b] = chance(0.3) ? Sb : rint_(0, Sb);
        }
        o.key_lengths = kl;
    }
    if (kind == KIND_DENSE && chance(0.15)) {
        for (int64_t b = 0; b < B; ++b)
            ql[b] = rint_(0, L);
        o.query_lengths = ql;
    }
    float sinks[8], slopes[8];
    if (chance(0.15)) {
        for (int64_t i = 0; i < Hq; ++i)
            sinks[i] = chance(0.2) ? -INFINITY : rval(2.0);
        o.sinks = sinks;
    }
    if (chance(0.15)) {
        for (int64_t i = 0; i < Hq; ++i)
            slopes[i] = (float)rint_(0, 16) / 64.0f;
        o.alibi_slopes = slopes;
        o.alibi_slopes_rank = 1;
    }
    if (chance(0.1)) {
        o.dropout_p = 0.25f;
        o.dropout_seed = rnd();
        o.dropout_offset = rnd() & 0xffff;
    }
    uint8_t *mask = NULL;
    sdpa_allow_mask am;
    buf bias = {0};
    if (kind != KIND_PACKED && chance(0.2)) {
        const int64_t msh[4] = {B, 1, L, S};
        mask = calloc(1, (size_t)(B * L * S > 0 ? B * L * S : 1));
        const double p_allow = chance(0.5) ? 0.9 : 0.4;
        for (int64_t i = 0; i < B * L * S; ++i)
            mask[i] = chance(p_allow) ? (uint8_t)rint_(1, 255) : 0;
        if (sdpa_allow_mask_init(&am, mask, 4, msh) != SDPA_OK)
            exit(2);
        o.allow_mask = &am;
    }
    if (kind != KIND_PACKED && chance(0.2)) {
        const int64_t bsh[4] = {1, Hq, L, S};
        buf_make(&bias, (int)rint_(0, 2), bsh, 0, 0, 1, 2.0);
        for (int64_t i = 0; i < Hq * L * S; ++i)
            if (chance(0.05))
                put(bias.data, bias.dt, i, -INFINITY);
        o.bias = &bias.t;
    }
    /* q, k, v, out, lse, weights */
    const int perm = (int)rint_(0, 1);
    const int64_t pad = chance(0.3) ? rint_(1, 3) : 0;
    const int64_t qsh[4] = {B, Hq, L, E}, osh[4] = {B, Hq, L, Ev};
    buf q, k, v, out, lse = {0}, w = {0};
    buf_make(&q, dt->q, qsh, perm, pad, 1, 2.0);
    int32_t table[128];
    if (kind == KIND_PAGED) {
        const int64_t bs = chance(0.5) ? 16 : 5, mb = (S + bs - 1) / bs, nb = B * mb + 2;
        const int64_t ksh[4] = {nb, Hkv, bs, E}, vsh[4] = {nb, Hkv, bs, Ev};
        buf_make(&k, dt->k, ksh, perm, pad, 1, 2.0);
        buf_make(&v, dt->v, vsh, perm, pad, 1, 2.0);
        for (int64_t i = 0; i < B * mb; ++i)
            table[i] = (int32_t)((i * 7 + 3) % nb);
        for (int64_t i = 0; i < B * mb; ++i) { /* a permutation: distinct blocks */
            const int64_t j = rint_(0, B * mb - 1);
            const int32_t t = table[i];
            table[i] = table[j];
            table[j] = t;
        }
        o.block_table = table;
        o.max_blocks_per_seq = mb;
    } else {
        const int64_t ksh[4] = {B, Hkv, S, E}, vsh[4] = {B, Hkv, S, Ev};
        buf_make(&k, dt->k, ksh, perm, pad, 1, 2.0);
        buf_make(&v, dt->v, vsh, perm, pad, 1, 2.0);
    }
    buf_make(&out, dt->out, osh, (int)rint_(0, 1), chance(0.2) ? 1 : 0, 0, 0.0);
    sdpa_tensor tl;
    float *lsed = NULL;
    if (chance(0.5)) {
        lsed = calloc((size_t)(B * Hq * L > 0 ? B * Hq * L : 1), sizeof(float));
        for (int64_t i = 0; i < B * Hq * L; ++i)
            lsed[i] = 7.0f;
        const int64_t lsh[3] = {B, Hq, L}, lst[3] = {Hq * L, L, 1};
        if (sdpa_tensor_init_strided(&tl, lsed, SDPA_DTYPE_F32, 3, lsh, lst) != SDPA_OK)
            exit(2);
    }
    int want_w = kind == KIND_DENSE && kernel == SDPA_KERNEL_REFERENCE && chance(0.4);
    if (want_w) {
        const int64_t wsh[4] = {B, Hq, L, S};
        buf_make(&w, SDPA_DTYPE_F32, wsh, 0, 0, 0, 0.0);
        o.weights_stage = (int32_t)rint_(0, 3);
    }
    void *ws = NULL;
    if (chance(0.3)) {
        size_t bytes = 0;
        if (sdpa_attention_workspace_size(&q.t, &k.t, &v.t, &o, want_w, &bytes) == SDPA_OK) {
            ws = malloc(bytes + 64);
            o.workspace = ws;
            o.workspace_bytes = bytes + 64;
        }
    }
    (void)lse;
    const sdpa_status st = sdpa_attention(&q.t, &k.t, &v.t, &o, &out.t, want_w ? &w.t : NULL, lsed ? &tl : NULL);
    hash_status(h, st);
    hash_bytes(h, out.data, out.bytes);
    if (lsed)
        hash_bytes(h, lsed, (size_t)(B * Hq * L) * sizeof(float));
    if (want_w)
        hash_bytes(h, w.data, w.bytes);
    free(ws);
    free(lsed);
    free(mask);
    if (o.bias)
        buf_free(&bias);
    if (want_w)
        buf_free(&w);
    buf_free(&q);
    buf_free(&k);
    buf_free(&v);
    buf_free(&out);
}

/* ---- MHA, merge, kv_write ---- */

static void mat(float **p, sdpa_tensor *t, int rank, const int64_t *sh, double range) {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i)
        n *= sh[i];
    *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    for (int64_t i = 0; i < n; ++i)
        (*p)[i] = rval(range);
    if (sdpa_tensor_init(t, *p, rank, sh) != SDPA_OK)
        exit(2);
}

static void run_mha(hash *h, int threads) {
    const int64_t B = rint_(1, 2), L = rint_(1, 40), S = rint_(1, 50), H = rint_(1, 2) * 2, Dh = 8 * rint_(1, 4);
    const int64_t E = H * Dh;
    float *pw, *pb, *ow, *ob, *x, *kv, *o, *aw;
    sdpa_tensor tw, tb, tow, tob, tx, tkv, to, taw;
    const int64_t wsh[2] = {3 * E, E}, bsh[1] = {3 * E}, owsh[2] = {E, E}, obsh[1] = {E};
    const int64_t xsh[3] = {B, L, E}, kvsh[3] = {B, S, E}, awsh[3] = {B, L, S};
    mat(&pw, &tw, 2, wsh, 0.25);
    mat(&pb, &tb, 1, bsh, 0.5);
    mat(&ow, &tow, 2, owsh, 0.25);
    mat(&ob, &tob, 1, obsh, 0.5);
    mat(&x, &tx, 3, xsh, 1.0);
    mat(&kv, &tkv, 3, kvsh, 1.0);
    mat(&o, &to, 3, xsh, 0.0);
    mat(&aw, &taw, 3, awsh, 0.0);
    sdpa_mha_params pr;
    sdpa_mha_params_init(&pr);
    pr.embed_dim = E;
    pr.num_heads = H;
    pr.in_proj_weight = &tw;
    pr.in_proj_bias = &tb;
    pr.out_proj_weight = &tow;
    pr.out_proj_bias = &tob;
    sdpa_mha_options mo;
    sdpa_mha_options_init(&mo);
    mo.num_threads = threads;
    mo.causal = chance(0.4);
    mo.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    const int want_w = chance(0.5);
    const sdpa_status st = sdpa_mha_forward(&pr, &tx, &tkv, &tkv, &mo, &to, want_w ? &taw : NULL);
    hash_status(h, st);
    hash_bytes(h, o, (size_t)(B * L * E) * sizeof(float));
    if (want_w)
        hash_bytes(h, aw, (size_t)(B * L * S) * sizeof(float));
    free(pw), free(pb), free(ow), free(ob), free(x), free(kv), free(o), free(aw);
}

static void run_merge(hash *h) {
    const int64_t sh[3] = {rint_(1, 3), rint_(1, 9), 8 * rint_(1, 8)}, lsh[2] = {sh[0], sh[1]};
    float *oa, *ob, *la, *lb, *o, *l;
    sdpa_tensor toa, tob, tla, tlb, to, tl;
    mat(&oa, &toa, 3, sh, 2.0);
    mat(&ob, &tob, 3, sh, 2.0);
    mat(&la, &tla, 2, lsh, 2.0);
    mat(&lb, &tlb, 2, lsh, 2.0);
    mat(&o, &to, 3, sh, 0.0);
    mat(&l, &tl, 2, lsh, 0.0);
    for (int64_t i = 0; i < lsh[0] * lsh[1]; ++i)
        if (chance(0.1))
            la[i] = -INFINITY;
    const sdpa_status st = sdpa_merge(&toa, &tla, &tob, &tlb, &to, &tl);
    hash_status(h, st);
    hash_bytes(h, o, (size_t)(sh[0] * sh[1] * sh[2]) * sizeof(float));
    hash_bytes(h, l, (size_t)(lsh[0] * lsh[1]) * sizeof(float));
    free(oa), free(ob), free(la), free(lb), free(o), free(l);
}

static void run_kv_write(hash *h, int cdt, int rdt) {
    const int64_t nb = rint_(1, 4), Hkv = rint_(1, 2), bs = rint_(1, 16), E = 8 * rint_(1, 8), T = rint_(1, 20);
    const int64_t csh[4] = {nb, Hkv, bs, E}, rsh[4] = {1, T, Hkv, E};
    buf kc, vc, kr, vr;
    buf_make(&kc, cdt, csh, 0, 0, 0, 0.0);
    buf_make(&vc, cdt, csh, 1, 1, 0, 0.0);
    buf_make(&kr, rdt, rsh, 0, 0, 1, 2.0);
    buf_make(&vr, rdt, rsh, 1, 0, 1, 2.0);
    /* rows [T, Hkv, E]: drop the leading 1 */
    sdpa_tensor tk, tv;
    if (sdpa_tensor_init_strided(&tk, kr.data, (sdpa_dtype)rdt, 3, kr.t.shape + 1, kr.t.strides + 1) != SDPA_OK ||
        sdpa_tensor_init_strided(&tv, vr.data, (sdpa_dtype)rdt, 3, vr.t.shape + 1, vr.t.strides + 1) != SDPA_OK)
        exit(2);
    int64_t slots[20];
    for (int64_t t = 0; t < T; ++t)
        slots[t] = chance(0.1) ? -1 : rint_(0, nb * bs - 1);
    const sdpa_status st = sdpa_kv_write(&kc.t, &vc.t, &tk, &tv, slots);
    hash_status(h, st);
    hash_bytes(h, kc.data, kc.bytes);
    hash_bytes(h, vc.data, vc.bytes);
    buf_free(&kc), buf_free(&vc), buf_free(&kr), buf_free(&vr);
}

int main(int argc, char **argv) {
    const int cases = argc > 1 ? atoi(argv[1]) : 24;
    static const int kernels[] = {SDPA_KERNEL_REFERENCE, SDPA_KERNEL_TILED, SDPA_KERNEL_DECODE, SDPA_KERNEL_AUTO};
    static const char *const knames[] = {"ref", "tiled", "decode", "auto"};
    static const char *const kinds[] = {"dense", "paged", "packed"};
    char name[128];
    hash h;
    { /* the ISA this process runs (check.sh compares only caps whose probe matches) */
        float x[64] = {0}, y[64];
        sdpa_tensor t, u;
        const int64_t sh[4] = {1, 1, 4, 16};
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = SDPA_KERNEL_TILED;
        if (sdpa_tensor_init(&t, x, 4, sh) != SDPA_OK || sdpa_tensor_init(&u, y, 4, sh) != SDPA_OK ||
            sdpa_attention(&t, &t, &t, &o, &u, NULL, NULL) != SDPA_OK)
            return 2;
        printf("probe %s\n", sdpa_last_kernel());
    }
    for (int kind = 0; kind < 3; ++kind)
        for (int ki = 0; ki < 4; ++ki)
            for (int d = 0; d < NDT; ++d)
                for (int prec = 1; prec <= 2; ++prec)
                    for (int th = 1; th <= 2; ++th) {
                        if (kind != KIND_DENSE && th == 2)
                            continue;
                        hash_init(&h);
                        g_rng = 0x5eed0000ull + (uint64_t)(((kind * 8 + ki) * 16 + d) * 4 + prec) * 1000003ull;
                        for (int c = 0; c < cases; ++c)
                            run_case(&h, kernels[ki], &DTS[d], prec, th, kind);
                        snprintf(name, sizeof name, "%s/%s/%s/%s/t%d", kinds[kind], knames[ki], DTS[d].name,
                                 prec == 2 ? "reduced" : "f32", th);
                        hash_print(name, &h);
                    }
    for (int th = 1; th <= 2; ++th) {
        hash_init(&h);
        g_rng = 0x3a3a;
        for (int c = 0; c < cases; ++c)
            run_mha(&h, th);
        snprintf(name, sizeof name, "mha/t%d", th);
        hash_print(name, &h);
    }
    hash_init(&h);
    g_rng = 0x4b4b;
    for (int c = 0; c < cases * 3; ++c)
        run_merge(&h);
    hash_print("merge", &h);
    for (int cdt = 0; cdt < 3; ++cdt)
        for (int rdt = 0; rdt < 3; ++rdt) {
            hash_init(&h);
            g_rng = 0x6c6c + (uint64_t)(cdt * 3 + rdt);
            for (int c = 0; c < cases; ++c)
                run_kv_write(&h, cdt, rdt);
            snprintf(name, sizeof name, "kv_write/%s<-%s", sdpa_dtype_name((sdpa_dtype)cdt),
                     sdpa_dtype_name((sdpa_dtype)rdt));
            hash_print(name, &h);
        }
    return 0;
}
