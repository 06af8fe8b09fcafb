/*
 * The kernels behind sdpa_attention: the tiled (FlashAttention-2 style) path, the decode path
 * (small L, split over keys) and the reference path, each with the micro-kernel sets (AVX2
 * and AVX-512, or NEON on aarch64, where the CPU has them, and the portable C set, selected through the internal ISA test hook of
 * src/dispatch.h, which caps the ISA as SDPA_MAX_ISA=portable would). Every
 * path must agree with the float64 reference (tests/ref) and with the other paths, give the
 * same bits for any thread count, drop the same elements under dropout, never let NaN stored
 * at a blocked key reach the output, and keep its workspace free of L*S terms.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>

#include <cmocka.h>

#include "dispatch.h" /* internal: the ISA test hook (this test links the library's objects) */
#include "test_case.h"
#include "test_common.h"

#define RTOL 2e-5 /* vs the float64 reference, relative to max(1, |ref|) */
#define TILE 64   /* SDPA__TILE_Q = SDPA__TILE_K of the tiled kernel */

/* ------------------------------------------------------------- paths */

typedef struct path {
    int kernel;      /* sdpa_kernel */
    const char *isa; /* NULL = best for this CPU, "portable" = the C micro-kernels */
} path;

/* This architecture's micro-kernel sets, lowest first: the SDPA_MAX_ISA names (README) and the
 * levels of the internal test hook. The kernel names end in "-<name>". */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
static const char *const ISA_NAMES[] = {"portable", "avx2", "avx512"};
static const int ISA_LEVELS[] = {SDPA__ISA_PORTABLE, SDPA__ISA_AVX2, SDPA__ISA_AVX512};
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
static const char *const ISA_NAMES[] = {"portable", "neon"};
static const int ISA_LEVELS[] = {SDPA__ISA_PORTABLE, SDPA__ISA_NEON};
#else
static const char *const ISA_NAMES[] = {"portable"};
static const int ISA_LEVELS[] = {SDPA__ISA_PORTABLE};
#endif
#define N_ISAS ((int)(sizeof ISA_NAMES / sizeof ISA_NAMES[0]))

static const path g_paths[] = {
    {SDPA_KERNEL_REFERENCE, NULL},
    {SDPA_KERNEL_TILED, NULL},       /* the CPU's best: AVX-512 or NEON where the CPU has it */
#if defined(__x86_64__) || defined(__i386__)
    {SDPA_KERNEL_TILED, "avx2"},
#endif
    {SDPA_KERNEL_TILED, "portable"},
    {SDPA_KERNEL_DECODE, NULL},      /* the CPU's best */
#if defined(__x86_64__) || defined(__i386__)
    {SDPA_KERNEL_DECODE, "avx2"},
#endif
    {SDPA_KERNEL_DECODE, "portable"},
};
#define N_PATHS ((int)(sizeof g_paths / sizeof g_paths[0]))

/* The rank (index in ISA_NAMES) of an ISA cap: unset, "amx" or a name this architecture does
 * not have caps nothing (the top rank). */
static int isa_level(const char *isa)
{
    for (int i = 0; isa != NULL && i < N_ISAS; ++i)
        if (strcmp(isa, ISA_NAMES[i]) == 0)
            return i;
    return N_ISAS - 1;
}

/* Cap the micro-kernel ISA for the next calls through the library's internal test hook
 * (SDPA_MAX_ISA is read once per process; tests/test_isa_env.c checks that path). */
static void set_isa(const char *isa)
{
    sdpa__dispatch_set_max_isa_for_testing(isa == NULL ? -1 : ISA_LEVELS[isa_level(isa)]);
}

/* The rank of the best set this CPU runs, read independently of the library (CPUID through the
 * compiler's builtins on x86-64, HWCAP_ASIMD on aarch64 Linux). */
static int cpu_rank(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return 0;
    return __builtin_cpu_supports("avx512f") ? 2 : 1;
#elif defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & (1ul << 1)) ? 1 : 0;
#else
    return 0;
#endif
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), w = strlen(tail);
    return n >= w && strcmp(s + n - w, tail) == 0;
}

static const char *path_desc(const path *p)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "%s/%s",
             p->kernel == SDPA_KERNEL_TILED ? "tiled" : p->kernel == SDPA_KERNEL_DECODE ? "decode" : "reference",
             p->isa ? p->isa : "best");
    return buf;
}

/* The kernel name must name the path and, for tiled/decode, the micro-kernel set. */
static void check_kernel_name(const path *p, const char *what)
{
    const char *name = sdpa_last_kernel();
    const char *prefix = p->kernel == SDPA_KERNEL_TILED ? "tiled-" : p->kernel == SDPA_KERNEL_DECODE ? "decode-" : "reference";
    if (strncmp(name, prefix, strlen(prefix)) != 0) {
        fail_msg("%s on %s: kernel \"%s\", expected \"%s...\"", what, path_desc(p), name, prefix);
    }
    if (p->kernel == SDPA_KERNEL_REFERENCE) {
        return;
    }
    /* The set: the lower of what the CPU has and the cap, which is the path's own (the test hook
     * replaces the process's cap) or else the process's SDPA_MAX_ISA (README: portable, avx2,
     * avx512, amx on x86-64; portable, neon on aarch64; another value caps nothing). */
    int level = cpu_rank();
    const int cap = p->isa != NULL ? isa_level(p->isa) : isa_level(getenv("SDPA_MAX_ISA"));
    level = cap < level ? cap : level;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%s", ISA_NAMES[level]);
    if (!ends_with(name, suffix)) {
        fail_msg("%s on %s (SDPA_MAX_ISA=%s): kernel \"%s\" does not end with \"%s\"", what, path_desc(p),
                 getenv("SDPA_MAX_ISA") ? getenv("SDPA_MAX_ISA") : "(unset)", name, suffix);
    }
}

/* ------------------------------------------------------------- cases */

typedef struct kcase {
    tc_case t; /* the problem (shared generator, test_case.h) */
    /* float64 reference */
    double *rout, *rlse;
    uint8_t *kind;
    int ref_status;
    /* results of one run, flattened [B, Hq, L, Ev] and [B, Hq, L] */
    float *fout, *flse;
} kcase;

/* Features of these cases: ranges sized for the tiles of the tiled kernel, lse always, no
 * weights (the kernels do not produce them), masks with every tile class. */
static const tc_case_params g_params = {
    .qk_range = 1.5,
    .bcast_p = 0.06,
    .weights_p = 0.0,
    .lse_p = 1.0,
    .softcap_p = 0.25,
    .bias_p = 0.3,
    .bias_neginf_p = 0.1,
    .bias_neginf_dense_p = 0.3,
    .mask_p = 0.4,
    .mask_tiles = 1,
    .causal_p = 0.4,
    .offset_lo_div = 2,
    .window_right_div = 2,
    .zero_rows_p = 0.8,
    .run_opts = 0,
};

/* Shapes: 0 = random. Features (masks, bias, lengths, ...) are drawn from the seed. */
typedef struct dims {
    int rank;
    int64_t B, Hq, Hkv, L, S, E, Ev;
    int no_bcast; /* no stride-0 input axes (tests that poison single rows) */
} dims;

static void gen_case(kcase *kc, uint64_t seed, const dims *want)
{
    tc_rng rng, *r = &rng;
    tc_rng_seed(r, seed);
    memset(kc, 0, sizeof *kc);
    tc_case *c = &kc->t;
    c->rank = want->rank ? want->rank : (tc_rng_chance(r, 0.25) ? 3 : 4);
    c->B = want->B ? want->B : tc_rng_int(r, 1, 2);
    if (c->rank == 4) {
        c->Hkv = want->Hkv ? want->Hkv : tc_rng_int(r, 1, 2);
        c->Hq = want->Hq ? want->Hq : c->Hkv * tc_rng_int(r, 1, 3);
    } else {
        c->Hq = c->Hkv = 1;
    }
    c->L = want->L ? want->L : tc_rng_int(r, 1, 150);
    c->S = want->S ? want->S : tc_rng_int(r, 1, 200);
    c->E = want->E ? want->E : tc_rng_int(r, 1, 72);
    c->Ev = want->Ev ? want->Ev : (tc_rng_chance(r, 0.5) ? c->E : tc_rng_int(r, 1, 72));

    tc_case_params params = g_params;
    if (want->no_bcast) {
        params.bcast_p = 0.0;
    }
    char label[48];
    snprintf(label, sizeof label, "seed %llu", (unsigned long long)seed);
    tc_case_build(c, r, &params, label);

    const int64_t rows = c->B * c->Hq * c->L;
    kc->rout = calloc((size_t)(rows * c->Ev + 1), sizeof(double));
    kc->rlse = calloc((size_t)(rows + 1), sizeof(double));
    kc->kind = calloc((size_t)(rows + 1), 1);
    kc->fout = calloc((size_t)(rows * c->Ev + 1), sizeof(float));
    kc->flse = calloc((size_t)(rows + 1), sizeof(float));
    assert_true(kc->rout && kc->rlse && kc->kind && kc->fout && kc->flse);
    ref_report rep = ref_attention(&c->rp, kc->rout, NULL, kc->rlse, kc->kind);
    kc->ref_status = rep.status;
}

static void free_case(kcase *c)
{
    tc_case_free(&c->t);
    free(c->rout);
    free(c->rlse);
    free(c->kind);
    free(c->fout);
    free(c->flse);
}

/* Run one path; returns the status. On SDPA_OK the outputs are copied into fout / flse and the
 * kernel name and the untouched holes of the output views are checked. On failure nothing may
 * have been written. */
static sdpa_status run_path(kcase *c, const path *pt, int threads, int with_lse)
{
    sdpa_tensor tq = tc_buf_view(&c->t.q), tk = tc_buf_view(&c->t.k), tv = tc_buf_view(&c->t.v);
    sdpa_tensor to = tc_buf_view(&c->t.out), tl = tc_buf_view(&c->t.lse);
    tc_fill_canary(c->t.out.fbase, c->t.out.n * sizeof(float));
    tc_fill_canary(c->t.lse.fbase, c->t.lse.n * sizeof(float));
    c->t.opt.kernel = pt->kernel;
    c->t.opt.num_threads = threads;
    set_isa(pt->isa);
    sdpa_status st = sdpa_attention(&tq, &tk, &tv, &c->t.opt, &to, NULL, with_lse ? &tl : NULL);
    set_isa(NULL);
    if (st != SDPA_OK) {
        if (!tc_buf_all_canary(&c->t.out) || !tc_buf_all_canary(&c->t.lse)) {
            fail_msg("%s: output written although the call failed (%s) on %s", path_desc(pt), sdpa_status_string(st),
                     c->t.desc);
        }
        return st;
    }
    check_kernel_name(pt, c->t.desc);
    if (!tc_buf_holes_intact(&c->t.out) || !tc_buf_holes_intact(&c->t.lse)) {
        fail_msg("%s: write outside the output view on %s", path_desc(pt), c->t.desc);
    }
    if (!with_lse && !tc_buf_all_canary(&c->t.lse)) {
        fail_msg("%s: lse written although not requested on %s", path_desc(pt), c->t.desc);
    }
    for (int64_t b = 0; b < c->t.B; ++b) {
        for (int64_t h = 0; h < c->t.Hq; ++h) {
            for (int64_t i = 0; i < c->t.L; ++i) {
                const int64_t row = (b * c->t.Hq + h) * c->t.L + i;
                for (int64_t e = 0; e < c->t.Ev; ++e) {
                    c->fout[row * c->t.Ev + e] = tc_case_at(&c->t.out, b, h, i, e);
                }
                c->flse[row] = with_lse ? tc_case_lse_at(&c->t, b, h, i) : 0.0f;
            }
        }
    }
    return SDPA_OK;
}

static double g_max_err;

/* Compare fout / flse with the float64 reference. */
static void compare_ref(const kcase *c, const path *pt)
{
    double worst = 0.0;
    char where[160] = "";
    const int64_t rows = c->t.B * c->t.Hq * c->t.L;
    for (int64_t row = 0; row < rows; ++row) {
        const int special = c->kind[row] != REF_ROW_NORMAL;
        for (int64_t e = 0; e <= c->t.Ev; ++e) {
            const float got = e < c->t.Ev ? c->fout[row * c->t.Ev + e] : c->flse[row];
            const double ref = e < c->t.Ev ? c->rout[row * c->t.Ev + e] : c->rlse[row];
            const double err = tc_elem_err(got, ref, special);
            if (err > worst || (isinf(err) && !isinf(worst))) {
                worst = err;
                snprintf(where, sizeof where, "%s row %lld col %lld: got %.9g ref %.9g", e < c->t.Ev ? "out" : "lse",
                         (long long)row, (long long)e, (double)got, ref);
            }
        }
    }
    if (!(worst <= RTOL)) {
        fail_msg("%s: error %.3g > %.1g at %s on %s", path_desc(pt), worst, RTOL, where, c->t.desc);
    }
    if (worst > g_max_err) {
        g_max_err = worst;
    }
}

/* Run every path on the case and compare each with the float64 reference; paths must agree on
 * the status (an EMPTY_ROW error under policy ERROR). */
static void check_all_paths(kcase *c, int threads)
{
    for (int k = 0; k < N_PATHS; ++k) {
        const path *pt = &g_paths[k];
        sdpa_status st = run_path(c, pt, threads, 1);
        if (c->ref_status == REF_EMPTY_ROW) {
            if (st != SDPA_ERR_EMPTY_ROW) {
                fail_msg("%s: expected SDPA_ERR_EMPTY_ROW, got %s on %s", path_desc(pt), sdpa_status_string(st), c->t.desc);
            }
            continue;
        }
        if (st != SDPA_OK) {
            fail_msg("%s: %s (%s) on %s", path_desc(pt), sdpa_status_string(st), sdpa_last_error_message(), c->t.desc);
        }
        compare_ref(c, pt);
    }
}

/* ------------------------------------------------------------- tests */

static void kernels_golden_causal_3x3_on_every_path(void **state)
{
    (void)state;
    float q[3 * 4] = {0}, k[3 * 4] = {0}, v[3] = {2.0f, 4.0f, 8.0f};
    for (int kk = 0; kk < N_PATHS; ++kk) {
        const path *pt = &g_paths[kk];
        for (int threads = 1; threads <= 3; threads += 2) {
            float out[3], lse[3];
            tc_fill_canary(out, sizeof out);
            tc_fill_canary(lse, sizeof lse);
            sdpa_tensor tq = tc_view4(q, 1, 1, 3, 4), tk = tc_view4(k, 1, 1, 3, 4);
            sdpa_tensor tv = tc_view4(v, 1, 1, 3, 1), to = tc_view4(out, 1, 1, 3, 1), tl;
            const int64_t ls[3] = {1, 1, 3};
            assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
            sdpa_options o;
            sdpa_options_init(&o);
            o.causal = 1;
            o.kernel = pt->kernel;
            o.num_threads = threads;
            set_isa(pt->isa);
            sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
            set_isa(NULL);
            assert_int_equal(st, SDPA_OK);
            check_kernel_name(pt, "golden 3x3");
            if (!(fabsf(out[0] - 2.0f) <= 1e-6f && fabsf(out[1] - 3.0f) <= 1e-6f &&
                  fabsf(out[2] - 14.0f / 3.0f) <= 2e-6f)) {
                fail_msg("%s: golden out = %.9g %.9g %.9g, expected 2 3 4.6667", path_desc(pt), (double)out[0],
                         (double)out[1], (double)out[2]);
            }
            if (!(fabsf(lse[0]) <= 1e-6f && fabsf(lse[1] - (float)log(2.0)) <= 1e-6f &&
                  fabsf(lse[2] - (float)log(3.0)) <= 1e-6f)) {
                fail_msg("%s: golden lse = %g %g %g", path_desc(pt), (double)lse[0], (double)lse[1], (double)lse[2]);
            }
        }
    }
}

/* L and S at 1, tile - 1, tile, tile + 1 and 2 tile + 1, odd E and Ev, masks from the seed. */
static void kernels_tile_edges_match_reference(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, TILE - 1, TILE, TILE + 1, 2 * TILE + 1};
    static const int64_t widths[][2] = {{1, 1}, {7, 5}, {33, 17}, {65, 3}, {8, 16}};
    int n = 0;
    for (int a = 0; a < 5; ++a) {
        for (int b = 0; b < 5; ++b) {
            dims d = {0};
            d.L = sizes[a];
            d.S = sizes[b];
            d.E = widths[(a + b) % 5][0];
            d.Ev = widths[(a * 3 + b) % 5][1];
            d.B = 1;
            kcase c;
            gen_case(&c, 1000u + (uint64_t)(a * 5 + b), &d);
            check_all_paths(&c, (a + b) % 3 + 1);
            free_case(&c);
            ++n;
        }
    }
    print_message("tile edges: %d shapes x %d paths, max error %.3g\n", n, N_PATHS, g_max_err);
}

static void kernels_random_configs_match_reference(void **state)
{
    (void)state;
    int ok = 0, empty = 0, cov_mask = 0, cov_bias = 0, cov_gqa = 0, cov_causal = 0, cov_window = 0, cov_kl = 0,
        cov_ql = 0, cov_softcap = 0, cov_strided = 0;
    for (int n = 0; n < 90; ++n) {
        dims d = {0};
        kcase c;
        gen_case(&c, 5000u + (uint64_t)n, &d);
        check_all_paths(&c, (int)(n % 4) + 1);
        if (c.ref_status == REF_EMPTY_ROW) {
            ++empty;
        } else {
            ++ok;
        }
        cov_mask += c.t.has_mask;
        cov_bias += c.t.has_bias;
        cov_gqa += c.t.Hq > c.t.Hkv;
        cov_causal += c.t.opt.causal;
        cov_window += c.t.opt.sliding_window;
        cov_kl += c.t.opt.key_lengths != NULL;
        cov_ql += c.t.opt.query_lengths != NULL;
        cov_softcap += c.t.opt.softcap > 0.0f;
        cov_strided += c.t.k.strides[c.t.rank - 1] != 1 || c.t.q.strides[c.t.rank - 1] != 1 || c.t.v.strides[c.t.rank - 1] != 1;
        free_case(&c);
    }
    print_message("random: %d ok, %d EMPTY_ROW on every path; mask %d bias %d gqa %d causal %d window %d key_lengths %d "
                  "query_lengths %d softcap %d strided %d; max error %.3g\n",
                  ok, empty, cov_mask, cov_bias, cov_gqa, cov_causal, cov_window, cov_kl, cov_ql, cov_softcap,
                  cov_strided, g_max_err);
    assert_true(ok >= 60 && cov_mask >= 10 && cov_bias >= 10 && cov_gqa >= 10 && cov_causal >= 10 &&
                cov_window >= 5 && cov_kl >= 5 && cov_ql >= 5 && cov_softcap >= 5 && cov_strided >= 10);
}

/* Each mask kind on its own, at tile-straddling sizes, on every path. */
static void kernels_each_mask_kind_matches_reference(void **state)
{
    (void)state;
    for (int kind = 0; kind < 9; ++kind) {
        /* L = 2 tiles + 40: the last block has 48 lanes (a 32-lane and a 16-lane chunk). */
        dims d = {4, 2, 4, 2, 2 * TILE + 40, 3 * TILE - 5, 24, 40, 0};
        kcase c;
        /* Random data and layouts; then exactly one rule. */
        gen_case(&c, 77u + (uint64_t)kind, &d);
        c.t.opt.allow_mask = NULL;
        c.t.rp.mask = NULL;
        c.t.opt.bias = NULL;
        c.t.rp.bias = NULL;
        c.t.opt.softcap = 0.0f;
        c.t.rp.softcap = 0.0;
        c.t.opt.causal = c.t.rp.causal = 0;
        c.t.opt.sliding_window = c.t.rp.sliding_window = 0;
        c.t.opt.alignment = c.t.rp.alignment = 0;
        c.t.opt.key_lengths = c.t.rp.key_lengths = NULL;
        c.t.opt.query_lengths = c.t.rp.query_lengths = NULL;
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        c.t.rp.empty_rows_zero = 1;
        switch (kind) {
        case 0: c.t.opt.causal = c.t.rp.causal = 1; break;
        case 1: c.t.opt.causal = c.t.rp.causal = 1; c.t.opt.alignment = c.t.rp.alignment = SDPA_ALIGN_BOTTOM_RIGHT; break;
        case 2:
            c.t.opt.causal = c.t.rp.causal = 1;
            c.t.opt.alignment = c.t.rp.alignment = SDPA_ALIGN_OFFSETS;
            c.t.offsets[0] = -70;
            c.t.offsets[1] = 90;
            c.t.opt.query_offsets = c.t.rp.query_offsets = c.t.offsets;
            break;
        case 3:
            c.t.opt.sliding_window = c.t.rp.sliding_window = 1;
            c.t.opt.window_left = c.t.rp.window_left = 40;
            c.t.opt.window_right = c.t.rp.window_right = 0;
            c.t.opt.causal = c.t.rp.causal = 1;
            break;
        case 4:
            c.t.opt.sliding_window = c.t.rp.sliding_window = 1;
            c.t.opt.window_left = c.t.rp.window_left = 5;
            c.t.opt.window_right = c.t.rp.window_right = 70;
            break;
        case 5:
            c.t.kl[0] = 100;
            c.t.kl[1] = 0;
            c.t.opt.key_lengths = c.t.rp.key_lengths = c.t.kl;
            break;
        case 6:
            c.t.ql[0] = 65;
            c.t.ql[1] = 3;
            c.t.opt.query_lengths = c.t.rp.query_lengths = c.t.ql;
            break;
        case 7:
            c.t.ql[0] = 100;
            c.t.ql[1] = 150;
            c.t.kl[0] = 150;
            c.t.kl[1] = 64;
            c.t.opt.query_lengths = c.t.rp.query_lengths = c.t.ql;
            c.t.opt.key_lengths = c.t.rp.key_lengths = c.t.kl;
            c.t.opt.causal = c.t.rp.causal = 1;
            c.t.opt.alignment = c.t.rp.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            break;
        default: /* every row of the first block sees nothing: empty rows under ZERO */
            c.t.kl[0] = 0;
            c.t.kl[1] = 1;
            c.t.opt.key_lengths = c.t.rp.key_lengths = c.t.kl;
            break;
        }
        ref_report rep = ref_attention(&c.t.rp, c.rout, NULL, c.rlse, c.kind);
        c.ref_status = rep.status;
        check_all_paths(&c, kind % 3 + 1);
        free_case(&c);
    }
}

/* Results do not depend on num_threads, bit for bit, on every path. */
static void kernels_thread_count_is_bit_identical(void **state)
{
    (void)state;
    static const int threads[] = {1, 2, 3, 5};
    const dims shapes[] = {
        {4, 2, 4, 2, 2 * TILE + 1, 3 * TILE + 7, 40, 24, 0},
        {4, 1, 1, 1, 3, 3000, 32, 32, 0}, /* decode: few items, split over keys */
        {4, 1, 8, 2, 1, 700, 64, 64, 0},  /* decode with GQA */
        {0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (int s = 0; s < 4; ++s) {
        kcase c;
        gen_case(&c, 900u + (uint64_t)s, &shapes[s]);
        if (c.ref_status == REF_EMPTY_ROW) {
            c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        }
        const int64_t nout = c.t.B * c.t.Hq * c.t.L * c.t.Ev, nl = c.t.B * c.t.Hq * c.t.L;
        float *o1 = malloc((size_t)(nout + 1) * sizeof(float)), *l1 = malloc((size_t)(nl + 1) * sizeof(float));
        assert_true(o1 && l1);
        for (int k = 0; k < N_PATHS; ++k) {
            const path *pt = &g_paths[k];
            for (int t = 0; t < 4; ++t) {
                sdpa_status st = run_path(&c, pt, threads[t], 1);
                if (st != SDPA_OK) {
                    fail_msg("%s threads %d: %s on %s", path_desc(pt), threads[t], sdpa_status_string(st), c.t.desc);
                }
                if (s == 1 && pt->kernel == SDPA_KERNEL_DECODE && strstr(sdpa_last_kernel(), "decode-split-") == NULL) {
                    fail_msg("expected a split decode, got %s", sdpa_last_kernel());
                }
                if (t == 0) {
                    memcpy(o1, c.fout, (size_t)nout * sizeof(float));
                    memcpy(l1, c.flse, (size_t)nl * sizeof(float));
                } else if (memcmp(o1, c.fout, (size_t)nout * sizeof(float)) != 0 ||
                           memcmp(l1, c.flse, (size_t)nl * sizeof(float)) != 0) {
                    fail_msg("%s: %d threads differ from 1 thread on %s", path_desc(pt), threads[t], c.t.desc);
                }
            }
        }
        free(o1);
        free(l1);
        free_case(&c);
    }
}

/* Decode with few (b, kv head) items and a long S is split over keys; the chunks' merge must
 * give the one-pass result: compare with the float64 reference with every rule in play. */
static void kernels_decode_split_matches_reference(void **state)
{
    (void)state;
    static const int64_t Ls[] = {1, 2, 4, 3};
    static const int64_t Ss[] = {1100, 3000, 5000, 2049};
    int split = 0;
    for (int t = 0; t < 8; ++t) {
        dims d = {4, 1, t % 2 ? 2 : 1, 1, Ls[t % 4], Ss[t % 4], t % 3 ? 32 : 7, t % 2 ? 16 : 9, 0};
        kcase c;
        gen_case(&c, 7000u + (uint64_t)t, &d);
        for (int k = 0; k < N_PATHS; ++k) {
            if (g_paths[k].kernel != SDPA_KERNEL_DECODE) {
                continue;
            }
            sdpa_status st = run_path(&c, &g_paths[k], t % 3 + 1, 1);
            if (c.ref_status == REF_EMPTY_ROW) {
                assert_int_equal(st, SDPA_ERR_EMPTY_ROW);
                continue;
            }
            if (st != SDPA_OK) {
                fail_msg("%s: %s (%s) on %s", path_desc(&g_paths[k]), sdpa_status_string(st), sdpa_last_error_message(),
                         c.t.desc);
            }
            split += strstr(sdpa_last_kernel(), "-split-") != NULL;
            compare_ref(&c, &g_paths[k]);
        }
        free_case(&c);
    }
    assert_true(split >= 8);
}

/* GQA decode equals per-head decode, bit for bit: with 4 query heads per kv head the decode
 * kernel shares each K/V tile among the group's rows (in L1-sized sub-tiles); the same call
 * with K/V repeated per query head (one row per item) must give the same bits, on every
 * micro-kernel set, with and without a causal mask, at E and Ev with vector tails. With the
 * multi-row micro-kernels (dot_rows_multi, axpy_rows_multi) this also checks that they sum each
 * row as dot_rows / axpy_rows do. */
static void kernels_gqa_decode_equals_per_head_decode(void **state)
{
    (void)state;
    /* Groups of 4 and of 3 (rows of 4 and of 3, 6, 9 per group: the multi-row micro-kernels'
     * remainders), E and Ev with and without vector tails. */
    static const int64_t cfg[2][4] = {{8, 2, 72, 40}, {6, 2, 128, 136}};
    for (int ci = 0; ci < 2; ++ci)
    for (int64_t L = 1; L <= 3; ++L) {
    const int64_t B = 2, Hq = cfg[ci][0], Hkv = cfg[ci][1], G = Hq / Hkv, S = 700, E = cfg[ci][2], Ev = cfg[ci][3];
        float *q = malloc((size_t)(B * Hq * L * E) * sizeof(float));
        float *k = malloc((size_t)(B * Hkv * S * E) * sizeof(float)), *v = malloc((size_t)(B * Hkv * S * Ev) * sizeof(float));
        float *kr = malloc((size_t)(B * Hq * S * E) * sizeof(float)), *vr = malloc((size_t)(B * Hq * S * Ev) * sizeof(float));
        float *o1 = malloc((size_t)(B * Hq * L * Ev) * sizeof(float)), *o2 = malloc((size_t)(B * Hq * L * Ev) * sizeof(float));
        assert_true(q && k && v && kr && vr && o1 && o2);
        uint64_t x = 88172645463325252ull;
        for (int64_t t = 0; t < B * Hq * L * E; ++t) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            q[t] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (int64_t t = 0; t < B * Hkv * S * E; ++t) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            k[t] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (int64_t t = 0; t < B * Hkv * S * Ev; ++t) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            v[t] = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t h = 0; h < Hq; ++h) {
                const int64_t g = h / G;
                memcpy(kr + (b * Hq + h) * S * E, k + (b * Hkv + g) * S * E, (size_t)(S * E) * sizeof(float));
                memcpy(vr + (b * Hq + h) * S * Ev, v + (b * Hkv + g) * S * Ev, (size_t)(S * Ev) * sizeof(float));
            }
        }
        sdpa_tensor tq = tc_view4(q, B, Hq, L, E), tk = tc_view4(k, B, Hkv, S, E), tv = tc_view4(v, B, Hkv, S, Ev);
        sdpa_tensor tkr = tc_view4(kr, B, Hq, S, E), tvr = tc_view4(vr, B, Hq, S, Ev);
        sdpa_tensor to1 = tc_view4(o1, B, Hq, L, Ev), to2 = tc_view4(o2, B, Hq, L, Ev);
        for (int kk = 0; kk < N_PATHS; ++kk) {
            const path *pt = &g_paths[kk];
            if (pt->kernel != SDPA_KERNEL_DECODE) {
                continue;
            }
            set_isa(pt->isa);
            for (int causal = 0; causal <= 1; ++causal) {
                sdpa_options o;
                sdpa_options_init(&o);
                o.kernel = SDPA_KERNEL_DECODE;
                o.causal = causal;
                o.num_threads = 2;
                assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to1, NULL, NULL), SDPA_OK);
                check_kernel_name(pt, "GQA decode");
                if (strstr(sdpa_last_kernel(), "-split-") != NULL) {
                    fail_msg("GQA decode at S = %lld split over keys; the comparison needs one chunk", (long long)S);
                }
                assert_int_equal(sdpa_attention(&tq, &tkr, &tvr, &o, &to2, NULL, NULL), SDPA_OK);
                if (memcmp(o1, o2, (size_t)(B * Hq * L * Ev) * sizeof(float)) != 0) {
                    fail_msg("%s, L = %lld, causal %d: GQA decode differs from per-head decode", path_desc(pt),
                             (long long)L, causal);
                }
            }
        }
        set_isa(NULL);
        free(q); free(k); free(v); free(kr); free(vr); free(o1); free(o2);
    }
}

/* Dropout: q = k = 0 so every allowed key of row i has p = 1 / n_i, and V = identity (Ev = S),
 * so out[i, j] = keep_ij / (n_i (1 - p)). The set of kept elements must be the same on every
 * path, micro-kernel set and thread count; lse is the pre-dropout ln n_i. */
static void kernels_dropout_keep_pattern_is_identical(void **state)
{
    (void)state;
    const int64_t B = 2, Hq = 4, Hkv = 2, L = TILE + 6, S = 2 * TILE + 2;
    const float p = 0.3f;
    float *q = calloc((size_t)(B * Hq * L * 8), sizeof(float)), *k = calloc((size_t)(B * Hkv * S * 8), sizeof(float));
    float *v = calloc((size_t)(B * Hkv * S * S), sizeof(float));
    float *out = malloc((size_t)(B * Hq * L * S) * sizeof(float)), *lse = malloc((size_t)(B * Hq * L) * sizeof(float));
    uint8_t *pattern = malloc((size_t)(B * Hq * L * S));
    assert_true(q && k && v && out && lse && pattern);
    for (int64_t bg = 0; bg < B * Hkv; ++bg) {
        for (int64_t j = 0; j < S; ++j) {
            v[(bg * S + j) * S + j] = 1.0f;
        }
    }
    sdpa_tensor tq = tc_view4(q, B, Hq, L, 8), tk = tc_view4(k, B, Hkv, S, 8), tv = tc_view4(v, B, Hkv, S, S);
    sdpa_tensor to = tc_view4(out, B, Hq, L, S), tl;
    const int64_t ls[3] = {B, Hq, L};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    int64_t kl[2] = {S, S - 30};
    int first = 1;
    int64_t dropped = 0, allowed_total = 0;
    for (int kk = 0; kk < N_PATHS; ++kk) {
        const path *pt = &g_paths[kk];
        for (int threads = 1; threads <= 5; threads += 2) {
            sdpa_options o;
            sdpa_options_init(&o);
            o.causal = 1;
            o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            o.key_lengths = kl;
            o.dropout_p = p;
            o.dropout_seed = 0x1234567887654321ull;
            o.dropout_offset = 99;
            o.kernel = pt->kernel;
            o.num_threads = threads;
            set_isa(pt->isa);
            sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
            set_isa(NULL);
            if (st != SDPA_OK) {
                fail_msg("dropout on %s: %s (%s)", path_desc(pt), sdpa_status_string(st), sdpa_last_error_message());
            }
            check_kernel_name(pt, "dropout");
            for (int64_t b = 0; b < B; ++b) {
                for (int64_t h = 0; h < Hq; ++h) {
                    for (int64_t i = 0; i < L; ++i) {
                        const int64_t row = (b * Hq + h) * L + i;
                        const int64_t n_i = i + kl[b] - L + 1; /* keys 0 .. i + kl[b] - L */
                        assert_true(fabsf(lse[row] - (float)log((double)n_i)) <= 1e-5f);
                        for (int64_t j = 0; j < S; ++j) {
                            const float x = out[row * S + j];
                            const uint8_t kept = x != 0.0f;
                            if (j >= n_i && kept) {
                                fail_msg("dropout on %s: blocked (%lld,%lld,%lld,%lld) is %g", path_desc(pt),
                                         (long long)b, (long long)h, (long long)i, (long long)j, (double)x);
                            }
                            if (kept && fabs((double)x - 1.0 / ((double)n_i * (1.0 - (double)p))) > 1e-6 / (double)n_i * 4) {
                                fail_msg("dropout on %s: kept (%lld,%lld,%lld,%lld) = %.9g, expected %.9g", path_desc(pt),
                                         (long long)b, (long long)h, (long long)i, (long long)j, (double)x,
                                         1.0 / ((double)n_i * (1.0 - (double)p)));
                            }
                            if (first) {
                                pattern[row * S + j] = kept;
                                if (j < n_i) {
                                    dropped += !kept;
                                    allowed_total += 1;
                                }
                            } else if (pattern[row * S + j] != kept) {
                                fail_msg("dropout on %s, %d threads: element (%lld,%lld,%lld,%lld) %s, reference path %s",
                                         path_desc(pt), threads, (long long)b, (long long)h, (long long)i, (long long)j,
                                         kept ? "kept" : "dropped", pattern[row * S + j] ? "kept" : "dropped");
                            }
                        }
                    }
                }
            }
            first = 0;
        }
    }
    const double frac = (double)dropped / (double)allowed_total;
    print_message("dropout p=%.2f: %.4f of %lld allowed elements dropped, same set on every path\n", (double)p, frac,
                  (long long)allowed_total);
    assert_true(frac > 0.27 && frac < 0.33);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(pattern);
}

/* NaN stored in K/V rows that no query may attend (beyond key_lengths, a masked column, a
 * -inf bias column, outside causal/window reach) never reaches out or lse, with and without
 * the finite check, on every path. */
static void kernels_nan_in_blocked_kv_does_not_leak(void **state)
{
    (void)state;
    for (int variant = 0; variant < 4; ++variant) {
        dims d = {4, 1, 2, 1, variant < 2 ? 2 * TILE + 5 : 3, 3 * TILE, 16, 8, 1};
        kcase c;
        gen_case(&c, 42u, &d);
        /* Fresh, fully controlled options: key lengths, a masked column, a -inf bias column. */
        sdpa_options_init(&c.t.opt);
        ref_problem_init(&c.t.rp);
        c.t.rp.B = c.t.B, c.t.rp.Hq = c.t.Hq, c.t.rp.Hkv = c.t.Hkv, c.t.rp.L = c.t.L, c.t.rp.S = c.t.S, c.t.rp.E = c.t.E, c.t.rp.Ev = c.t.Ev;
        c.t.rp.q = tc_buf_ref4(&c.t.q);
        c.t.rp.k = tc_buf_ref4(&c.t.k);
        c.t.rp.v = tc_buf_ref4(&c.t.v);
        c.t.kl[0] = c.t.S - 40;
        c.t.opt.key_lengths = c.t.rp.key_lengths = c.t.kl;
        if (variant % 2 == 1) {
            c.t.opt.causal = c.t.rp.causal = 1;
            c.t.opt.alignment = c.t.rp.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
            c.t.opt.sliding_window = c.t.rp.sliding_window = 1;
            c.t.opt.window_left = c.t.rp.window_left = 100;
            c.t.opt.window_right = c.t.rp.window_right = 0;
        }
        free(c.t.mask_base);
        c.t.mask_base = malloc((size_t)c.t.S);
        assert_non_null(c.t.mask_base);
        memset(c.t.mask_base, 1, (size_t)c.t.S);
        c.t.mask_base[10] = 0;
        for (int64_t j = 64; j < 128; ++j) { /* a whole tile of keys nobody may attend */
            c.t.mask_base[j] = 0;
        }
        c.t.mask = tc_mask_view(c.t.mask_base, 1, &c.t.S);
        c.t.rmask.data = c.t.mask_base;
        c.t.rmask.rank = 1;
        c.t.rmask.shape[0] = c.t.S;
        c.t.rmask.strides[0] = 1;
        c.t.opt.allow_mask = &c.t.mask;
        c.t.rp.mask = &c.t.rmask;
        if (c.t.has_bias) {
            tc_buf_free(&c.t.bias);
        }
        int64_t bshape[1] = {c.t.S};
        tc_buf_alloc(&c.t.bias, 1, bshape, NULL, NAN);
        tc_rng br;
        tc_rng_seed(&br, 7);
        tc_buf_fill_uniform(&c.t.bias, &br, -0.5, 0.5);
        int64_t bj[1] = {20};
        tc_buf_set(&c.t.bias, bj, -INFINITY);
        c.t.has_bias = 1;
        c.t.rbias = tc_buf_ref_same_rank(&c.t.bias);
        c.t.tbias = tc_buf_view(&c.t.bias);
        c.t.opt.bias = &c.t.tbias;
        c.t.rp.bias = &c.t.rbias;
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        c.t.rp.empty_rows_zero = 1;
        c.t.opt.skip_finite_check = c.t.rp.skip_finite_check = variant >= 2;
        /* Poison every K/V row that no query may attend; with the window, rows too old too. */
        for (int64_t j = 0; j < c.t.S; ++j) {
            int reach = 0;
            for (int64_t i = 0; i < c.t.L && !reach; ++i) {
                reach = ref_structurally_allowed(&c.t.rp, 0, 0, i, j) && j != 20;
            }
            if (reach) {
                continue;
            }
            for (int64_t e = 0; e < c.t.E; ++e) {
                int64_t idx[4] = {0, 0, j, e};
                tc_buf_set(&c.t.k, idx, NAN);
            }
            for (int64_t e = 0; e < c.t.Ev; ++e) {
                int64_t idx[4] = {0, 0, j, e};
                tc_buf_set(&c.t.v, idx, variant % 2 ? INFINITY : NAN);
            }
        }
        ref_report rep = ref_attention(&c.t.rp, c.rout, NULL, c.rlse, c.kind);
        c.ref_status = rep.status;
        assert_int_equal(rep.status, REF_OK);
        for (int k = 0; k < N_PATHS; ++k) {
            sdpa_status st = run_path(&c, &g_paths[k], 2, 1);
            if (st != SDPA_OK) {
                fail_msg("NaN variant %d on %s: %s (%s)", variant, path_desc(&g_paths[k]), sdpa_status_string(st),
                         sdpa_last_error_message());
            }
            for (int64_t x = 0; x < c.t.B * c.t.Hq * c.t.L * c.t.Ev; ++x) {
                if (!isfinite(c.fout[x])) {
                    fail_msg("NaN variant %d on %s leaked into out[%lld]", variant, path_desc(&g_paths[k]), (long long)x);
                }
            }
            compare_ref(&c, &g_paths[k]);
        }
        free_case(&c);
    }
}

/* A NaN in an attended K or V row fails with the same status and message on every path, and
 * nothing is written. */
static void kernels_nonfinite_attended_row_fails_alike(void **state)
{
    (void)state;
    for (int which = 0; which < 4; ++which) {
        dims d = {4, 1, 4, 2, which < 2 ? 1 : TILE + 3, 200, 16, 16, 1};
        kcase c;
        gen_case(&c, 4242u, &d);
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        c.t.opt.skip_finite_check = 0;
        int64_t idx[4] = {0, 1, 150, 3};
        tc_buf_set(which % 2 ? &c.t.v : &c.t.k, idx, NAN);
        char first[512] = "";
        for (int k = 0; k < N_PATHS; ++k) {
            sdpa_status st = run_path(&c, &g_paths[k], 2, 1);
            /* The row may be out of every query's reach under the case's random rules. */
            if (k == 0) {
                snprintf(first, sizeof first, "%s|%s", sdpa_status_string(st),
                         st == SDPA_OK ? "" : sdpa_last_error_message());
                continue;
            }
            char now[512];
            snprintf(now, sizeof now, "%s|%s", sdpa_status_string(st), st == SDPA_OK ? "" : sdpa_last_error_message());
            if (strcmp(now, first) != 0) {
                fail_msg("%s: \"%s\" but the reference path gave \"%s\" on %s", path_desc(&g_paths[k]), now, first, c.t.desc);
            }
        }
        /* With plain options the poisoned row is attended: the error is certain. */
        sdpa_options_init(&c.t.opt);
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        for (int k = 0; k < N_PATHS; ++k) {
            sdpa_status st = run_path(&c, &g_paths[k], 3, 1);
            assert_int_equal(st, SDPA_ERR_NON_FINITE);
            const char *want = which % 2 ? "value row (b=0,h=1,j=150)" : "key row (b=0,h=1,j=150)";
            if (strstr(sdpa_last_error_message(), want) == NULL) {
                fail_msg("%s: message \"%s\" does not name %s", path_desc(&g_paths[k]), sdpa_last_error_message(), want);
            }
        }
        free_case(&c);
    }
}

/* q [B, H, L, E], k and v [B, H, S, E], out like q: uniform in [-1, 1) from seed (out unset);
 * free with free_qkvo(). */
typedef struct qkvo {
    float *q, *k, *v, *out;
    size_t nq, nk;
    sdpa_tensor tq, tk, tv, to;
} qkvo;

static qkvo make_qkvo(int64_t B, int64_t H, int64_t L, int64_t S, int64_t E, uint64_t seed)
{
    qkvo x;
    x.nq = (size_t)(B * H * L * E);
    x.nk = (size_t)(B * H * S * E);
    x.q = malloc(x.nq * sizeof(float));
    x.k = malloc(x.nk * sizeof(float));
    x.v = malloc(x.nk * sizeof(float));
    x.out = malloc(x.nq * sizeof(float));
    assert_true(x.q && x.k && x.v && x.out);
    tc_rng r;
    tc_rng_seed(&r, seed);
    tc_fill_uniform(x.q, (int64_t)x.nq, &r, -1, 1);
    tc_fill_uniform(x.k, (int64_t)x.nk, &r, -1, 1);
    tc_fill_uniform(x.v, (int64_t)x.nk, &r, -1, 1);
    x.tq = tc_view4(x.q, B, H, L, E);
    x.tk = tc_view4(x.k, B, H, S, E);
    x.tv = tc_view4(x.v, B, H, S, E);
    x.to = tc_view4(x.out, B, H, L, E);
    return x;
}

static void free_qkvo(qkvo *x)
{
    free(x->q);
    free(x->k);
    free(x->v);
    free(x->out);
}

/* The value checks run on several threads for large inputs; whatever the thread count and the
 * path, the failure reported is the first one in sequential (b, kv head) order: a NaN in an
 * attended key row of (b=0, h=2), then one in a value row of (b=0, h=3), then the empty rows of
 * b=1 (key_lengths 0), each reported once the earlier ones are repaired. */
static void kernels_first_failure_is_reported_for_any_thread_count(void **state)
{
    (void)state;
    const int64_t B = 2, H = 4, L = 3, S = 4096, E = 64;
    qkvo x = make_qkvo(B, H, L, S, E, 11);
    float *k = x.k, *v = x.v, *out = x.out;
    const size_t nq = x.nq;
    k[((0 * H + 2) * S + 4000) * E + 1] = NAN;
    v[((0 * H + 3) * S + 10) * E + 5] = NAN;
    int64_t kl[2] = {S, 0};
    const sdpa_tensor tq = x.tq, tk = x.tk, tv = x.tv, to = x.to;
    static const char *const wants[3] = {"key row (b=0,h=2,j=4000)", "value row (b=0,h=3,j=10)",
                                         "query row (b=1,h=0,i=0) has no allowed key"};
    for (int round = 0; round < 3; ++round) {
        const char *want = wants[round];
        const sdpa_status want_st = round < 2 ? SDPA_ERR_NON_FINITE : SDPA_ERR_EMPTY_ROW;
        for (int kk = 0; kk < N_PATHS; ++kk) {
            for (int threads = 1; threads <= 5; ++threads) {
                if (threads == 4) {
                    continue;
                }
                sdpa_options o;
                sdpa_options_init(&o);
                o.key_lengths = kl;
                o.kernel = g_paths[kk].kernel;
                o.num_threads = threads;
                tc_fill_canary(out, nq * sizeof(float));
                set_isa(g_paths[kk].isa);
                sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
                set_isa(NULL);
                if (st != want_st || strstr(sdpa_last_error_message(), want) == NULL) {
                    fail_msg("%s, %d threads: %s \"%s\", expected %s naming %s", path_desc(&g_paths[kk]), threads,
                             sdpa_status_string(st), sdpa_last_error_message(), sdpa_status_string(want_st), want);
                }
                assert_true(tc_is_canary(out, nq * sizeof(float)));
            }
        }
        if (round == 0) {
            k[((0 * H + 2) * S + 4000) * E + 1] = 0.5f;
        } else {
            v[((0 * H + 3) * S + 10) * E + 5] = 0.5f;
        }
    }
    free_qkvo(&x);
}

/* First-failure order when check threads really overlap: 4 batch tasks scan 32768 key and
 * value rows each; tasks 0 and 1 pass, task 2 fails late (its last value row) and task 3 fails
 * at once (its first query row). With 3 threads, tasks 0-2 start together and task 3 goes to
 * whichever of threads 0 and 1 finishes first, so it fails while task 2 is still scanning, on a
 * lower-numbered thread: the lowest task's failure must be reported (not the first in time, nor
 * the lowest thread's). 2 threads overlap the same way about half the time. */
static void kernels_first_failure_wins_when_check_threads_overlap(void **state)
{
    (void)state;
    const int64_t B = 4, H = 1, L = 4, S = 32768, E = 32;
    qkvo x = make_qkvo(B, H, L, S, E, 12);
    float *q = x.q, *v = x.v, *out = x.out;
    const size_t nq = x.nq;
    v[((2 * H + 0) * S + (S - 1)) * E + (E - 1)] = NAN; /* task 2: its very last value */
    q[((3 * H + 0) * L + 0) * E + 0] = NAN;             /* task 3: its first query row */
    const sdpa_tensor tq = x.tq, tk = x.tk, tv = x.tv, to = x.to;
    const char *want = "value row (b=2,h=0,j=32767)";
    for (int rep = 0; rep < 6; ++rep) {
        for (int kk = 0; kk < N_PATHS; ++kk) {
            for (int threads = 2; threads <= 3; ++threads) {
                sdpa_options o;
                sdpa_options_init(&o);
                o.kernel = g_paths[kk].kernel;
                o.num_threads = threads;
                tc_fill_canary(out, nq * sizeof(float));
                set_isa(g_paths[kk].isa);
                sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
                set_isa(NULL);
                if (st != SDPA_ERR_NON_FINITE || strstr(sdpa_last_error_message(), want) == NULL) {
                    fail_msg("%s, %d threads: %s \"%s\", expected SDPA_ERR_NON_FINITE naming %s", path_desc(&g_paths[kk]),
                             threads, sdpa_status_string(st), sdpa_last_error_message(), want);
                }
                assert_true(tc_is_canary(out, nq * sizeof(float)));
            }
        }
    }
    free_qkvo(&x);
}

/* The same rule with the schedule steered by a parallel_for hook, so the overlap does not hang on
 * how the machine schedules the library's threads (mutant M08: the lowest thread's failure wins).
 * The hook starts job 1 on a thread of its own and job 0 (the calling thread) `delay` later:
 * job 1 claims task 0 (one key, passes at once) and task 1 (32768 keys, fails on its last value
 * row); job 0, arriving while task 1 is still being scanned, claims task 2 and fails at once on
 * its first query row. Slot 0 then holds task 2's failure, slot 1 task 1's: the report must be
 * task 1's whatever the delay (the delays only make the overlap likely; the assertion holds for
 * any schedule). */
typedef struct late_job {
    sdpa_task_fn task;
    void *task_ctx;
} late_job;

static long g_late_delay_us;

static void *late_job_main(void *arg)
{
    late_job *j = (late_job *)arg;
    j->task(j->task_ctx, 1);
    return NULL;
}

static void late_start_hook(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx)
{
    (void)ctx;
    pthread_t th;
    late_job j = {task, task_ctx};
    const bool started = ntasks >= 2 && pthread_create(&th, NULL, late_job_main, &j) == 0;
    if (started) {
        struct timespec ts = {0, g_late_delay_us * 1000L};
        nanosleep(&ts, NULL);
    }
    for (int64_t t = 0; t < ntasks; ++t)
        if (!(started && t == 1))
            task(task_ctx, t);
    if (started)
        pthread_join(th, NULL);
}

static void kernels_lowest_task_failure_wins_on_a_late_thread_zero(void **state)
{
    (void)state;
    const int64_t B = 3, H = 1, L = 4, S = 32768, E = 32;
    qkvo x = make_qkvo(B, H, L, S, E, 13);
    float *q = x.q, *v = x.v, *out = x.out;
    const size_t nq = x.nq;
    const int64_t key_lengths[3] = {1, S, S};
    v[((1 * H + 0) * S + (S - 1)) * E + (E - 1)] = NAN; /* task 1: its very last value */
    q[((2 * H + 0) * L + 0) * E + 0] = NAN;             /* task 2: its first query row */
    const sdpa_tensor tq = x.tq, tk = x.tk, tv = x.tv, to = x.to;
    const char *want = "value row (b=1,h=0,j=32767)";
    static const long delays_us[] = {0, 50, 200, 500, 1000, 2000};
    static const sdpa_kernel kernels[] = {SDPA_KERNEL_TILED, SDPA_KERNEL_REFERENCE};
    for (int rep = 0; rep < 3; ++rep) {
        for (size_t d = 0; d < sizeof delays_us / sizeof delays_us[0]; ++d) {
            for (size_t kk = 0; kk < sizeof kernels / sizeof kernels[0]; ++kk) {
                sdpa_options o;
                sdpa_options_init(&o);
                o.kernel = kernels[kk];
                o.key_lengths = key_lengths;
                o.parallel_for = late_start_hook;
                o.parallel_for_threads = 2;
                g_late_delay_us = delays_us[d];
                tc_fill_canary(out, nq * sizeof(float));
                sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL);
                if (st != SDPA_ERR_NON_FINITE || strstr(sdpa_last_error_message(), want) == NULL) {
                    fail_msg("kernel %d, job 0 %ld us late: %s \"%s\", expected SDPA_ERR_NON_FINITE naming %s",
                             (int)kernels[kk], delays_us[d], sdpa_status_string(st), sdpa_last_error_message(), want);
                }
                assert_true(tc_is_canary(out, nq * sizeof(float)));
            }
        }
    }
    free_qkvo(&x);
}

/* Rows float32 cannot carry although the inputs are finite are recomputed in double on every
 * path: an overflowing P.V sum, a softcap that would hide an overflowed dot product. */
static void kernels_overflow_rows_fall_back_to_double(void **state)
{
    (void)state;
    for (int k = 0; k < N_PATHS; ++k) {
        const path *pt = &g_paths[k];
        /* P.V: three equal keys with V = 3e38 in a block of 70 rows: out must be 3e38. */
        {
            enum { L = 70, S = 3 };
            float q[L * 2] = {0}, kk[S * 2] = {0}, v[S] = {3e38f, 3e38f, 3e38f}, out[L], lse[L];
            sdpa_tensor tq = tc_view4(q, 1, 1, L, 2), tk = tc_view4(kk, 1, 1, S, 2), tv = tc_view4(v, 1, 1, S, 1);
            sdpa_tensor to = tc_view4(out, 1, 1, L, 1), tl;
            const int64_t ls[3] = {1, 1, L};
            assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
            sdpa_options o;
            sdpa_options_init(&o);
            o.kernel = pt->kernel;
            set_isa(pt->isa);
            sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
            set_isa(NULL);
            assert_int_equal(st, SDPA_OK);
            for (int i = 0; i < L; ++i) {
                if (!(fabs((double)out[i] - 3e38) <= 3e38 * 1e-6) || !(fabsf(lse[i] - (float)log(3.0)) <= 1e-6f)) {
                    fail_msg("%s: P.V overflow row %d: out %g lse %g", path_desc(pt), i, (double)out[i], (double)lse[i]);
                }
            }
        }
        /* Softcap: q . k0 passes through +inf in float32 but is -3e38 (see test_attention). */
        {
            float q[5] = {1.5e19f, 1.5e19f, -1.5e19f, -1.5e19f, -1.5e19f};
            float kk[10] = {2e19f, 2e19f, 2e19f, 2e19f, 2e19f, 0, 0, 0, 0, 0};
            float v[2] = {1.0f, 0.0f}, out[1], lse[1];
            sdpa_tensor tq = tc_view3(q, 1, 1, 5), tk = tc_view3(kk, 1, 2, 5), tv = tc_view3(v, 1, 2, 1);
            sdpa_tensor to = tc_view3(out, 1, 1, 1), tl;
            const int64_t ls[2] = {1, 1};
            assert_int_equal(sdpa_tensor_init(&tl, lse, 2, ls), SDPA_OK);
            sdpa_options o;
            sdpa_options_init(&o);
            o.scale = 1.0f;
            o.softcap = 1.0f;
            o.kernel = pt->kernel;
            set_isa(pt->isa);
            sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
            set_isa(NULL);
            assert_int_equal(st, SDPA_OK);
            const double want = 1.0 / (1.0 + exp(1.0));
            if (!(fabs((double)out[0] - want) <= 1e-5)) {
                fail_msg("%s: softcap overflow: out %.9g, expected %.9g", path_desc(pt), (double)out[0], want);
            }
        }
    }
}

/* The workspace of a call without weights does not grow with L*S: (1, 8, 8192, S, 64) for
 * S = 1024 and 8192 differ by far less than the factor 8 of L*S, and the 8192^2 call needs
 * less than 64 MiB. Also: a caller workspace of exactly the reported size works on every path,
 * one byte less is rejected before anything is written. */
static void kernels_workspace_does_not_grow_with_l_times_s(void **state)
{
    (void)state;
    static float dummy[1];
    sdpa_tensor q, k1, v1, k8, v8;
    /* Views over one float with stride 0: the size query never reads data. */
    q = tc_view4(dummy, 1, 8, 8192, 64);
    k1 = tc_view4(dummy, 1, 8, 1024, 64);
    v1 = k1;
    k8 = tc_view4(dummy, 1, 8, 8192, 64);
    v8 = k8;
    sdpa_tensor *all[] = {&q, &k1, &k8};
    for (int t = 0; t < 3; ++t) {
        for (int d = 0; d < 4; ++d) {
            all[t]->strides[d] = 0;
        }
    }
    v1 = k1;
    v8 = k8;
    for (int threads = 1; threads <= 16; threads *= 4) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.num_threads = threads;
        size_t s1 = 0, s8 = 0;
        assert_int_equal(sdpa_attention_workspace_size(&q, &k1, &v1, &o, 0, &s1), SDPA_OK);
        assert_int_equal(sdpa_attention_workspace_size(&q, &k8, &v8, &o, 0, &s8), SDPA_OK);
        print_message("workspace (1,8,8192,S,64), %d threads: S=1024 %zu bytes, S=8192 %zu bytes\n", threads, s1, s8);
        assert_true(s8 < (size_t)64 << 20);
        assert_true((double)s8 < 2.0 * (double)s1); /* L*S grows 8x */
        o.kernel = SDPA_KERNEL_TILED;
        size_t st = 0;
        assert_int_equal(sdpa_attention_workspace_size(&q, &k8, &v8, &o, 0, &st), SDPA_OK);
        assert_int_equal(st, s8);
    }

    for (int kk = 0; kk < N_PATHS; ++kk) {
        dims d = {4, 1, 4, 2, TILE + 9, 2 * TILE + 3, 20, 12, 0};
        kcase c;
        gen_case(&c, 31u, &d);
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        c.t.opt.kernel = g_paths[kk].kernel;
        c.t.opt.num_threads = 3;
        sdpa_tensor tq = tc_buf_view(&c.t.q), tk = tc_buf_view(&c.t.k), tv = tc_buf_view(&c.t.v);
        size_t bytes = 0;
        assert_int_equal(sdpa_attention_workspace_size(&tq, &tk, &tv, &c.t.opt, 0, &bytes), SDPA_OK);
        unsigned char *ws = malloc(bytes + 1);
        assert_non_null(ws);
        c.t.opt.workspace = ws + 1; /* any alignment */
        c.t.opt.workspace_bytes = bytes - 1;
        assert_int_equal(run_path(&c, &g_paths[kk], 3, 1), SDPA_ERR_WORKSPACE_TOO_SMALL);
        c.t.opt.workspace_bytes = bytes;
        assert_int_equal(run_path(&c, &g_paths[kk], 3, 1), SDPA_OK);
        compare_ref(&c, &g_paths[kk]);
        free(ws);
        free_case(&c);
    }
}

/* A forced tiled or decode kernel does not produce weights: SDPA_ERR_UNSUPPORTED, nothing
 * written, also from the size query; AUTO and REFERENCE serve the call. */
static void kernels_forced_kernel_with_weights_is_unsupported(void **state)
{
    (void)state;
    float q[2 * 4] = {0}, k[3 * 4] = {0}, v[3 * 2] = {1, 2, 3, 4, 5, 6}, out[4], w[6];
    sdpa_tensor tq = tc_view4(q, 1, 1, 2, 4), tk = tc_view4(k, 1, 1, 3, 4), tv = tc_view4(v, 1, 1, 3, 2);
    sdpa_tensor to = tc_view4(out, 1, 1, 2, 2), tw = tc_view4(w, 1, 1, 2, 3);
    for (int kernel = SDPA_KERNEL_AUTO; kernel <= SDPA_KERNEL_DECODE; ++kernel) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = kernel;
        tc_fill_canary(out, sizeof out);
        tc_fill_canary(w, sizeof w);
        sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, &tw, NULL);
        size_t bytes = 0;
        sdpa_status sz = sdpa_attention_workspace_size(&tq, &tk, &tv, &o, 1, &bytes);
        if (kernel == SDPA_KERNEL_TILED || kernel == SDPA_KERNEL_DECODE) {
            assert_int_equal(st, SDPA_ERR_UNSUPPORTED);
            assert_int_equal(sz, SDPA_ERR_UNSUPPORTED);
            assert_non_null(strstr(sdpa_last_error_message(), "weights"));
            assert_true(tc_is_canary(out, sizeof out) && tc_is_canary(w, sizeof w));
        } else {
            assert_int_equal(st, SDPA_OK);
            assert_int_equal(sz, SDPA_OK);
            assert_string_equal(sdpa_last_kernel(), "reference");
            assert_true(fabsf(w[0] - 1.0f / 3.0f) <= 1e-6f && fabsf(out[0] - 3.0f) <= 1e-6f);
        }
    }
}

/* AUTO: decode for L <= 4 (split over keys when few (b, kv head) items meet a long S), tiled
 * for longer L, reference when weights are requested. */
static void kernels_auto_picks_the_path_by_shape(void **state)
{
    (void)state;
    static const struct {
        int64_t B, H, L, S;
        const char *prefix;
    } cases[] = {
        {1, 2, 1, 10, "decode-"},  {1, 2, 4, 10, "decode-"},       {1, 2, 5, 10, "tiled-"},
        {2, 8, 1, 600, "decode-"}, {1, 1, 1, 4096, "decode-split-"}, {1, 2, 200, 300, "tiled-"},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; ++t) {
        dims d = {4, cases[t].B, cases[t].H, cases[t].H, cases[t].L, cases[t].S, 16, 16, 0};
        kcase c;
        gen_case(&c, 55u, &d);
        c.t.opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        c.t.opt.key_lengths = NULL; /* the shape decides (decode splits the attended keys) */
        const path autop = {SDPA_KERNEL_AUTO, NULL};
        sdpa_tensor tq = tc_buf_view(&c.t.q), tk = tc_buf_view(&c.t.k), tv = tc_buf_view(&c.t.v), to = tc_buf_view(&c.t.out);
        c.t.opt.kernel = autop.kernel;
        assert_int_equal(sdpa_attention(&tq, &tk, &tv, &c.t.opt, &to, NULL, NULL), SDPA_OK);
        if (strncmp(sdpa_last_kernel(), cases[t].prefix, strlen(cases[t].prefix)) != 0) {
            fail_msg("AUTO on B=%lld H=%lld L=%lld S=%lld ran \"%s\", expected \"%s...\"", (long long)cases[t].B,
                     (long long)cases[t].H, (long long)cases[t].L, (long long)cases[t].S, sdpa_last_kernel(),
                     cases[t].prefix);
        }
        free_case(&c);
    }
}

/* Empty rows (policy ZERO) and padded query rows are exact zeros with lse = -inf, on every
 * path, also when a whole query block is empty or padding. */
static void kernels_empty_and_padded_rows_are_exact(void **state)
{
    (void)state;
    const int64_t B = 2, H = 2, L = 2 * TILE + 1, S = 70, E = 8, Ev = 5;
    float *q = malloc((size_t)(B * H * L * E) * sizeof(float)), *k = malloc((size_t)(B * H * S * E) * sizeof(float));
    float *v = malloc((size_t)(B * H * S * Ev) * sizeof(float)), *out = malloc((size_t)(B * H * L * Ev) * sizeof(float));
    float *lse = malloc((size_t)(B * H * L) * sizeof(float));
    uint8_t *mask = malloc((size_t)(L * S));
    assert_true(q && k && v && out && lse && mask);
    tc_rng r;
    tc_rng_seed(&r, 3);
    tc_fill_uniform(q, B * H * L * E, &r, -1, 1);
    tc_fill_uniform(k, B * H * S * E, &r, -1, 1);
    tc_fill_uniform(v, B * H * S * Ev, &r, -1, 1);
    for (int64_t i = 0; i < L; ++i) {
        for (int64_t j = 0; j < S; ++j) {
            mask[i * S + j] = (uint8_t)(i < TILE ? 0 : (i + j) % 3 != 0); /* first block: no key at all */
        }
    }
    int64_t mshape[2] = {L, S}, ql[2] = {L, 30};
    sdpa_allow_mask m = tc_mask_view(mask, 2, mshape);
    sdpa_tensor tq = tc_view4(q, B, H, L, E), tk = tc_view4(k, B, H, S, E), tv = tc_view4(v, B, H, S, Ev);
    sdpa_tensor to = tc_view4(out, B, H, L, Ev), tl;
    const int64_t ls[3] = {B, H, L};
    assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
    for (int kk = 0; kk < N_PATHS; ++kk) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.allow_mask = &m;
        o.query_lengths = ql;
        o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
        o.kernel = g_paths[kk].kernel;
        tc_fill_canary(out, (size_t)(B * H * L * Ev) * sizeof(float));
        set_isa(g_paths[kk].isa);
        sdpa_status st = sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl);
        set_isa(NULL);
        assert_int_equal(st, SDPA_OK);
        for (int64_t b = 0; b < B; ++b) {
            for (int64_t h = 0; h < H; ++h) {
                for (int64_t i = 0; i < L; ++i) {
                    const int64_t row = (b * H + h) * L + i;
                    if (i < TILE || i >= ql[b]) {
                        for (int64_t e = 0; e < Ev; ++e) {
                            if (out[row * Ev + e] != 0.0f || signbit(out[row * Ev + e])) {
                                fail_msg("%s: row (%lld,%lld,%lld) out %g, expected +0", path_desc(&g_paths[kk]),
                                         (long long)b, (long long)h, (long long)i, (double)out[row * Ev + e]);
                            }
                        }
                        if (!(isinf(lse[row]) && lse[row] < 0)) {
                            fail_msg("%s: row (%lld,%lld,%lld) lse %g, expected -inf", path_desc(&g_paths[kk]),
                                     (long long)b, (long long)h, (long long)i, (double)lse[row]);
                        }
                    } else if (!isfinite(lse[row]) || !isfinite(out[row * Ev])) {
                        fail_msg("%s: row (%lld,%lld,%lld) not finite", path_desc(&g_paths[kk]), (long long)b,
                                 (long long)h, (long long)i);
                    }
                }
            }
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(mask);
}

/* No key at all (S = 0, K and V views with NULL data): every row is empty; policy ZERO gives
 * zero rows and lse = -inf on every path, policy ERROR fails alike. */
static void kernels_no_keys_give_empty_rows(void **state)
{
    (void)state;
    for (int64_t L = 1; L <= 70; L += 69) {
        float q[70 * 3], out[70 * 2], lse[70];
        for (int i = 0; i < 70 * 3; ++i) {
            q[i] = (float)i;
        }
        sdpa_tensor tq = tc_view4(q, 1, 1, L, 3), tk = tc_view4(NULL, 1, 1, 0, 3), tv = tc_view4(NULL, 1, 1, 0, 2);
        sdpa_tensor to = tc_view4(out, 1, 1, L, 2), tl;
        const int64_t ls[3] = {1, 1, L};
        assert_int_equal(sdpa_tensor_init(&tl, lse, 3, ls), SDPA_OK);
        for (int kk = 0; kk < N_PATHS; ++kk) {
            sdpa_options o;
            sdpa_options_init(&o);
            o.kernel = g_paths[kk].kernel;
            tc_fill_canary(out, sizeof out);
            tc_fill_canary(lse, sizeof lse);
            set_isa(g_paths[kk].isa);
            assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl), SDPA_ERR_EMPTY_ROW);
            assert_true(tc_is_canary(out, sizeof out) && tc_is_canary(lse, sizeof lse));
            o.empty_rows = SDPA_EMPTY_ROWS_ZERO;
            assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, &tl), SDPA_OK);
            set_isa(NULL);
            for (int64_t i = 0; i < L; ++i) {
                assert_true(out[2 * i] == 0.0f && out[2 * i + 1] == 0.0f && isinf(lse[i]) && lse[i] < 0);
            }
        }
    }
}

/* The portable set is what the ISA cap "portable" selects, the AVX2 set what "avx2" selects on
 * an AVX2 + FMA CPU; by default AVX-512F where present (NEON on aarch64). All were compared
 * with the reference above; here the names. */
static void kernels_micro_kernel_sets_are_selectable(void **state)
{
    (void)state;
    float q[4 * 8] = {0}, k[9 * 8] = {0}, v[9 * 3] = {0}, out[4 * 3];
    sdpa_tensor tq = tc_view4(q, 1, 1, 4, 8), tk = tc_view4(k, 1, 1, 9, 8), tv = tc_view4(v, 1, 1, 9, 3);
    sdpa_tensor to = tc_view4(out, 1, 1, 4, 3);
    for (int kk = 1; kk < N_PATHS; ++kk) {
        sdpa_options o;
        sdpa_options_init(&o);
        o.kernel = g_paths[kk].kernel;
        set_isa(g_paths[kk].isa);
        assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK);
        set_isa(NULL);
        check_kernel_name(&g_paths[kk], "selection");
    }
    const path best = {SDPA_KERNEL_TILED, NULL};
    set_isa(NULL);
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = best.kernel;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &o, &to, NULL, NULL), SDPA_OK);
    print_message("micro-kernels: the tiled path runs \"%s\" here (CPU's best set: %s)\n", sdpa_last_kernel(),
                  ISA_NAMES[cpu_rank()]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernels_golden_causal_3x3_on_every_path),
        cmocka_unit_test(kernels_micro_kernel_sets_are_selectable),
        cmocka_unit_test(kernels_tile_edges_match_reference),
        cmocka_unit_test(kernels_each_mask_kind_matches_reference),
        cmocka_unit_test(kernels_random_configs_match_reference),
        cmocka_unit_test(kernels_thread_count_is_bit_identical),
        cmocka_unit_test(kernels_decode_split_matches_reference),
        cmocka_unit_test(kernels_gqa_decode_equals_per_head_decode),
        cmocka_unit_test(kernels_dropout_keep_pattern_is_identical),
        cmocka_unit_test(kernels_nan_in_blocked_kv_does_not_leak),
        cmocka_unit_test(kernels_nonfinite_attended_row_fails_alike),
        cmocka_unit_test(kernels_first_failure_is_reported_for_any_thread_count),
        cmocka_unit_test(kernels_first_failure_wins_when_check_threads_overlap),
        cmocka_unit_test(kernels_lowest_task_failure_wins_on_a_late_thread_zero),
        cmocka_unit_test(kernels_overflow_rows_fall_back_to_double),
        cmocka_unit_test(kernels_empty_and_padded_rows_are_exact),
        cmocka_unit_test(kernels_no_keys_give_empty_rows),
        cmocka_unit_test(kernels_workspace_does_not_grow_with_l_times_s),
        cmocka_unit_test(kernels_forced_kernel_with_weights_is_unsupported),
        cmocka_unit_test(kernels_auto_picks_the_path_by_shape),
    };
    set_isa(NULL);
    return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
