/*
 * The decode kernel's stored-K/V micro-kernels (src/microkernel.h sdpa__mk_kv), white box: the
 * ISA is capped through the internal hook sdpa__dispatch_set_max_isa_for_testing.
 *
 * For K/V dtypes f32, f16 and bf16 (same or mixed), at every ISA cap the CPU has, with GQA
 * (8 query heads over 2 kv heads), L = 1 and 3 (causal, bottom-right), E with and without a
 * vector tail, keys straddling the kernel's tiles, the decode kernel's output and lse are
 * bit-identical between:
 *   - K/V read in place (contiguous E) and K/V whose E axis has stride 2 (the loader's f32 copy
 *     of each tile: the fallback the in-place kernels must equal);
 *   - a dense cache and the same keys in a paged pool with block sizes 16, 8, 5 and 1 in
 *     shuffled block order (blocks never referenced and slots past the keys hold NaN);
 *   - 1 and 2 threads.
 * The count of (ISA, dtype, block size) cases run is printed.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu.h"
#include "dispatch.h"
#include "sdpa.h"

enum { B = 2, HQ = 8, HKV = 2, EV = 40 };
static const int64_t LEN[B] = {100, 263};

static uint32_t g_rng = 12345u;
static float frand(void) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (float)((g_rng >> 8) & 0xFFFF) / 65536.0f - 0.5f;
}
static size_t esz(int dt) { return dt == SDPA_DTYPE_F32 ? 4 : 2; }
/* x in dtype dt at element i of buf (bf16: truncation, f16: via _Float16-free rounding of small values). */
static void put(void *buf, int dt, size_t i, float x) {
    if (dt == SDPA_DTYPE_F32) {
        memcpy((char *)buf + 4 * i, &x, 4);
        return;
    }
    uint16_t h;
    if (dt == SDPA_DTYPE_BF16) {
        uint32_t u;
        memcpy(&u, &x, 4);
        h = (uint16_t)(u >> 16);
    } else { /* |x| < 1: a normal f16 with a 10-bit mantissa (or 0) */
        const float a = fabsf(x);
        if (a < 0x1p-14f) {
            h = 0;
        } else {
            int e;
            const float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
            const int m = (int)((f * 2.0f - 1.0f) * 1024.0f);
            h = (uint16_t)(((e - 1 + 15) << 10) | m);
        }
        if (x < 0)
            h |= 0x8000;
    }
    memcpy((char *)buf + 2 * i, &h, 2);
}
static void put_nan(void *buf, int dt, size_t i) {
    if (dt == SDPA_DTYPE_F32) {
        const float x = NAN;
        memcpy((char *)buf + 4 * i, &x, 4);
    } else {
        const uint16_t h = dt == SDPA_DTYPE_F16 ? 0x7E00 : 0x7FC0;
        memcpy((char *)buf + 2 * i, &h, 2);
    }
}

typedef struct run {
    float out[B * HQ * 3 * EV], lse[B * HQ * 3];
} run;

static void call(const sdpa_tensor *k, const sdpa_tensor *v, const float *q, int64_t L, int64_t E, int threads,
                 const int32_t *table, int64_t mb, run *r) {
    sdpa_tensor tq, to, tl;
    const int64_t qs[4] = {B, HQ, L, E}, os[4] = {B, HQ, L, EV}, ls[3] = {B, HQ, L};
    assert_int_equal(sdpa_tensor_init_dtype(&tq, q, SDPA_DTYPE_F32, 4, qs), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&to, r->out, SDPA_DTYPE_F32, 4, os), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_dtype(&tl, r->lse, SDPA_DTYPE_F32, 3, ls), SDPA_OK);
    sdpa_options o;
    sdpa_options_init(&o);
    o.kernel = SDPA_KERNEL_DECODE;
    o.num_threads = threads;
    o.causal = 1;
    o.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    o.key_lengths = LEN;
    o.block_table = table;
    o.max_blocks_per_seq = mb;
    const sdpa_status st = sdpa_attention(&tq, k, v, &o, &to, NULL, &tl);
    if (st != SDPA_OK)
        fail_msg("sdpa_attention: %s", sdpa_last_error_message());
}

static int g_cases;

static void one(int isa, int kdt, int vdt, int64_t L, int64_t E) {
    const int64_t S = 264; /* >= max LEN, a multiple of every block size below (16, 8, 1; 5 -> 265 rounded below) */
    float *q = malloc(sizeof(float) * (size_t)(B * HQ * L * E));
    for (int64_t i = 0; i < B * HQ * L * E; ++i)
        q[i] = 2.0f * frand();
    /* dense [B, HKV, S, E] (E stride 1) and the same with E stride 2 (NaN between) */
    const size_t nk = (size_t)(B * HKV * S * E), nv = (size_t)(B * HKV * S * EV);
    void *dk = malloc(nk * esz(kdt)), *dv = malloc(nv * esz(vdt));
    void *xk = malloc(2 * nk * esz(kdt)), *xv = malloc(2 * nv * esz(vdt));
    float *kf = malloc(nk * sizeof(float)), *vf = malloc(nv * sizeof(float));
    for (size_t i = 0; i < nk; ++i) {
        kf[i] = frand();
        put(dk, kdt, i, kf[i]);
        put(xk, kdt, 2 * i, kf[i]);
        put_nan(xk, kdt, 2 * i + 1);
    }
    for (size_t i = 0; i < nv; ++i) {
        vf[i] = 4.0f * frand();
        put(dv, vdt, i, vf[i]);
        put(xv, vdt, 2 * i, vf[i]);
        put_nan(xv, vdt, 2 * i + 1);
    }
    for (int64_t b = 0; b < B; ++b) /* keys past the length: NaN (never read) */
        for (int64_t g = 0; g < HKV; ++g)
            for (int64_t j = LEN[b]; j < S; ++j) {
                for (int64_t e = 0; e < E; ++e)
                    put_nan(dk, kdt, (size_t)(((b * HKV + g) * S + j) * E + e));
                for (int64_t e = 0; e < EV; ++e)
                    put_nan(dv, vdt, (size_t)(((b * HKV + g) * S + j) * EV + e));
            }
    sdpa_tensor tk, tv, txk, txv;
    const int64_t ks[4] = {B, HKV, S, E}, vs[4] = {B, HKV, S, EV};
    const int64_t kst[4] = {HKV * S * E, S * E, E, 1}, vst[4] = {HKV * S * EV, S * EV, EV, 1};
    const int64_t xkst[4] = {2 * HKV * S * E, 2 * S * E, 2 * E, 2}, xvst[4] = {2 * HKV * S * EV, 2 * S * EV, 2 * EV, 2};
    assert_int_equal(sdpa_tensor_init_strided(&tk, dk, (sdpa_dtype)kdt, 4, ks, kst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&tv, dv, (sdpa_dtype)vdt, 4, vs, vst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&txk, xk, (sdpa_dtype)kdt, 4, ks, xkst), SDPA_OK);
    assert_int_equal(sdpa_tensor_init_strided(&txv, xv, (sdpa_dtype)vdt, 4, vs, xvst), SDPA_OK);

    sdpa__dispatch_set_max_isa_for_testing(isa);
    static run r0, r1;
    call(&tk, &tv, q, L, E, 1, NULL, 0, &r0);
    call(&txk, &txv, q, L, E, 1, NULL, 0, &r1);
    assert_memory_equal(&r0, &r1, sizeof r0);
    call(&tk, &tv, q, L, E, 2, NULL, 0, &r1);
    assert_memory_equal(&r0, &r1, sizeof r0);
    ++g_cases;

    static const int64_t bss[] = {16, 8, 5, 1};
    for (size_t bi = 0; bi < sizeof bss / sizeof bss[0]; ++bi) {
        const int64_t bs = bss[bi], mb = (S + bs - 1) / bs, nb = B * mb + 3; /* 3 blocks nobody references */
        void *pk = malloc((size_t)(nb * HKV * bs * E) * esz(kdt)), *pv = malloc((size_t)(nb * HKV * bs * EV) * esz(vdt));
        for (int64_t i = 0; i < nb * HKV * bs * E; ++i)
            put_nan(pk, kdt, (size_t)i);
        for (int64_t i = 0; i < nb * HKV * bs * EV; ++i)
            put_nan(pv, vdt, (size_t)i);
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)nb), *table = malloc(sizeof(int32_t) * (size_t)(B * mb));
        for (int64_t i = 0; i < nb; ++i)
            perm[i] = (int32_t)i;
        for (int64_t i = nb - 1; i > 0; --i) {
            g_rng = g_rng * 1664525u + 1013904223u;
            const int64_t j = (int64_t)((g_rng >> 8) % (uint32_t)(i + 1));
            const int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        /* layout [nb, bs, HKV, E] (vLLM's) for odd block sizes, [nb, HKV, bs, E] otherwise */
        const int vllm = bs % 2 == 1;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t m = 0; m < mb; ++m) {
                const int32_t blk = perm[b * mb + m];
                table[b * mb + m] = blk;
                for (int64_t g = 0; g < HKV; ++g)
                    for (int64_t s = 0; s < bs; ++s) {
                        const int64_t j = m * bs + s;
                        if (j >= LEN[b])
                            continue;
                        const int64_t slot = vllm ? (blk * bs + s) * HKV + g : (blk * HKV + g) * bs + s;
                        for (int64_t e = 0; e < E; ++e)
                            put(pk, kdt, (size_t)(slot * E + e), kf[((b * HKV + g) * S + j) * E + e]);
                        for (int64_t e = 0; e < EV; ++e)
                            put(pv, vdt, (size_t)(slot * EV + e), vf[((b * HKV + g) * S + j) * EV + e]);
                    }
            }
        sdpa_tensor tpk, tpv;
        const int64_t pks[4] = {nb, HKV, bs, E}, pvs[4] = {nb, HKV, bs, EV};
        const int64_t pkst[4] = {HKV * bs * E, vllm ? E : bs * E, vllm ? HKV * E : E, 1};
        const int64_t pvst[4] = {HKV * bs * EV, vllm ? EV : bs * EV, vllm ? HKV * EV : EV, 1};
        assert_int_equal(sdpa_tensor_init_strided(&tpk, pk, (sdpa_dtype)kdt, 4, pks, pkst), SDPA_OK);
        assert_int_equal(sdpa_tensor_init_strided(&tpv, pv, (sdpa_dtype)vdt, 4, pvs, pvst), SDPA_OK);
        call(&tpk, &tpv, q, L, E, 2, table, mb, &r1);
        if (memcmp(&r0, &r1, sizeof r0) != 0)
            fail_msg("paged (block size %d) != dense: isa %d, k %d, v %d, L %d, E %d", (int)bs, isa, kdt, vdt, (int)L,
                     (int)E);
        ++g_cases;
        free(pk);
        free(pv);
        free(perm);
        free(table);
    }
    sdpa__dispatch_set_max_isa_for_testing(-1);
    free(q);
    free(dk);
    free(dv);
    free(xk);
    free(xv);
    free(kf);
    free(vf);
}

static void test_stored_kv(void **state) {
    (void)state;
    static const int pairs[][2] = {{SDPA_DTYPE_F32, SDPA_DTYPE_F32},   {SDPA_DTYPE_F16, SDPA_DTYPE_F16},
                                   {SDPA_DTYPE_BF16, SDPA_DTYPE_BF16}, {SDPA_DTYPE_F16, SDPA_DTYPE_BF16},
                                   {SDPA_DTYPE_F32, SDPA_DTYPE_F16}};
    int isas = 0;
    for (int isa = SDPA__ISA_PORTABLE; isa < SDPA__ISA_COUNT; ++isa) {
        if (!sdpa__cpu_has_isa(isa)) {
            printf("# isa %s: not run (the CPU lacks it)\n", sdpa__isa_name(isa));
            continue;
        }
        ++isas;
        for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; ++pi) {
            one(isa, pairs[pi][0], pairs[pi][1], 1, 128);
            one(isa, pairs[pi][0], pairs[pi][1], 3, 72);
        }
    }
    printf("# %d ISAs, %d (isa, dtype, shape, layout) cases bit-identical\n", isas, g_cases);
    assert_true(g_cases > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stored_kv)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
