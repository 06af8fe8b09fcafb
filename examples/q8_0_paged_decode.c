/*
 * A q8_0 paged K/V cache, as llama.cpp's `--cache-type-k q8_0 --cache-type-v q8_0` keeps it,
 * addressed by a vLLM-style block table, filled and read by libsdpa.
 *
 * For a reader who knows the engines:
 *   - the cache is a block pool [num_blocks, Hkv, block_size, E] of ggml block_q8_0
 *     ({ggml_half d; int8_t qs[32]}: 34 bytes per 32 values along E). Its sdpa_tensor is
 *     shaped in elements (E) but strided in BLOCKS (E / 32 per row), last stride 1;
 *   - sdpa_kv_write_ex is vLLM's fused rotary + reshape_and_cache for this cache: it takes the
 *     new float32 K/V rows [T, Hkv, E], rotates K by RoPE at each row's position (NeoX /
 *     HF rotate_half pairs, theta 10000: llama's rope_theta), quantizes each 32-block exactly
 *     as ggml's quantize_row_q8_0_ref (so the bytes are what llama.cpp would store), and
 *     scatters the rows to slot_mapping[t] = block * block_size + offset;
 *   - the decode query is rotated by sdpa_rope at its position with the same parameters,
 *     then one sdpa_attention call reads the pool through the block table (key_lengths per
 *     sequence), dequantizing each block as ggml's dequantize_row_q8_0 does.
 *
 * Checks (the program exits 1 if one fails):
 *   1. against float64 attention on the DEQUANTIZED cache bytes (decoded here from the block
 *      layout): the float32 bound of sdpa_precision (tight: what the kernel adds);
 *   2. against float64 attention on the UNQUANTIZED rows (K rotated in float64): the
 *      quantization bound stated at sdpa_kv_write_ex (per element
 *      amax * (1/254 + 2^-11) * (1 + 2^-14) + 127 * 2^-25 of its block), carried through the
 *      scores (|dq . dk| <= scale * sum |q| |dk|, which moves each probability by at most a
 *      factor exp(2 * ds)) and the values, plus float32 RoPE's rounding.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

/* max of two doubles by compare and select, not fmax: gcc 12 for aarch64 stops with an internal
 * compiler error (vect_transform_reduction) vectorising fmax reductions (the aarch64 CI job);
 * NaN in b is ignored as fmax ignores it. */
static inline double dmax(double a, double b) { return b > a ? b : a; }

enum { NSEQ = 2, HQ = 8, HKV = 2, E = 128, BS = 16, NBLOCKS = 12, MAXB = 5, BLK = E / 32 };
enum { MAXT = MAXB * BS };
static const int64_t LEN[NSEQ] = {45, 70};                        /* tokens after this decode step */
static const int32_t TABLE[NSEQ][MAXB] = {{7, 2, 9, -1, -1}, {4, 11, 0, 5, 8}}; /* scattered blocks */

static uint32_t g_seed = 31u;
static float rnd(void) /* deterministic, in [-1, 1) */
{
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)(g_seed >> 8) / (float)(1u << 23) - 1.0f;
}

/* The pools: NBLOCKS * HKV * BS rows of BLK blocks of 34 bytes (2-byte aligned for d). */
static _Alignas(64) unsigned char g_kpool[NBLOCKS * HKV * BS * BLK * 34], g_vpool[NBLOCKS * HKV * BS * BLK * 34];
static float g_k[NSEQ][MAXT][HKV][E], g_v[NSEQ][MAXT][HKV][E]; /* the float32 rows as the model made them */

/* ggml's binary16 d, decoded by its fields. */
static double half_value(const unsigned char *p)
{
    const unsigned h = (unsigned)p[0] | ((unsigned)p[1] << 8);
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return (h >> 15) ? -v : v;
}

/* Element e of row (block b, head g, slot s) of a pool, dequantized as dequantize_row_q8_0. */
static double deq(const unsigned char *pool, int b, int g, int s, int e)
{
    const unsigned char *blk = pool + ((size_t)((b * HKV + g) * BS + s) * BLK + (size_t)(e / 32)) * 34;
    return (double)((float)(int8_t)blk[2 + e % 32] * (float)half_value(blk));
}

/* NeoX RoPE in float64 (HF rotate_half: pairs (i, i + E/2), inv_freq = theta^(-2i/E)). */
static void rope64(const float *x, int64_t pos, double *y)
{
    for (int i = 0; i < E / 2; i++) {
        const double ang = (double)pos * pow(10000.0, -2.0 * i / E);
        const double a = x[i], b = x[i + E / 2];
        y[i] = a * cos(ang) - b * sin(ang);
        y[i + E / 2] = a * sin(ang) + b * cos(ang);
    }
}

static int64_t slot_of(int r, int64_t j) { return (int64_t)TABLE[r][j / BS] * BS + j % BS; }

int main(void)
{
    check_library_version();
    memset(g_kpool, 0xFF, sizeof g_kpool); /* unused slots hold NaN d: never read */
    memset(g_vpool, 0xFF, sizeof g_vpool);
    const int64_t pshape[4] = {NBLOCKS, HKV, BS, E}, pstrides[4] = {HKV * BS * BLK, BS * BLK, BLK, 1}; /* in blocks */
    sdpa_tensor kpool, vpool;
    CHECK(sdpa_tensor_init_strided(&kpool, g_kpool, SDPA_DTYPE_Q8_0, 4, pshape, pstrides));
    CHECK(sdpa_tensor_init_strided(&vpool, g_vpool, SDPA_DTYPE_Q8_0, 4, pshape, pstrides));

    sdpa_rope_params rope; /* NeoX pairs, rotary_dim = E, theta 10000: the zero defaults */
    sdpa_rope_params_init(&rope);
    rope.theta = 10000.0;
    sdpa_kv_write_options wo;
    sdpa_kv_write_options_init(&wo);
    wo.rope = &rope;

    /* Prefill (tokens 0 .. LEN-2), then this decode step's token LEN-1: one kv_write_ex each,
     * rows [T, HKV, E] with their positions and slots (vLLM's positions / slot_mapping). */
    for (int r = 0; r < NSEQ; r++) {
        for (int64_t j = 0; j < LEN[r]; j++)
            for (int g = 0; g < HKV; g++)
                for (int e = 0; e < E; e++)
                    g_k[r][j][g][e] = rnd(), g_v[r][j][g][e] = rnd();
        int64_t pos[MAXT], slots[MAXT];
        for (int64_t j = 0; j < LEN[r]; j++)
            pos[j] = j, slots[j] = slot_of(r, j);
        for (int step = 0; step < 2; step++) {
            const int64_t t0 = step == 0 ? 0 : LEN[r] - 1, T = step == 0 ? LEN[r] - 1 : 1;
            sdpa_tensor k, v;
            const int64_t shape[3] = {T, HKV, E};
            CHECK(sdpa_tensor_init(&k, &g_k[r][t0][0][0], 3, shape));
            CHECK(sdpa_tensor_init(&v, &g_v[r][t0][0][0], 3, shape));
            wo.positions = pos + t0;
            CHECK(sdpa_kv_write_ex(&kpool, &vpool, &k, &v, slots + t0, &wo));
        }
    }

    /* The decode queries [NSEQ, HQ, 1, E], rotated at position LEN-1 by sdpa_rope (rows [T, H, E]:
     * T = NSEQ rows of HQ heads), as the model's q_proj output would be. */
    static float q_raw[NSEQ][HQ][E], q[NSEQ][HQ][E], out[NSEQ][HQ][E];
    for (int r = 0; r < NSEQ; r++)
        for (int h = 0; h < HQ; h++)
            for (int e = 0; e < E; e++)
                q_raw[r][h][e] = rnd();
    const int64_t qpos[NSEQ] = {LEN[0] - 1, LEN[1] - 1};
    sdpa_tensor tq_raw, tq_rot;
    const int64_t rshape[3] = {NSEQ, HQ, E};
    CHECK(sdpa_tensor_init(&tq_raw, &q_raw[0][0][0], 3, rshape));
    CHECK(sdpa_tensor_init(&tq_rot, &q[0][0][0], 3, rshape));
    CHECK(sdpa_rope(&tq_raw, &tq_rot, qpos, &rope));

    /* One decode call over the block table: q [NSEQ, HQ, 1, E], key_lengths = LEN. */
    sdpa_tensor tq, tout;
    const int64_t qshape[4] = {NSEQ, HQ, 1, E};
    CHECK(sdpa_tensor_init(&tq, &q[0][0][0], 4, qshape));
    CHECK(sdpa_tensor_init(&tout, &out[0][0][0], 4, qshape));
    sdpa_options o;
    sdpa_options_init(&o);
    o.block_table = &TABLE[0][0];
    o.max_blocks_per_seq = MAXB;
    o.key_lengths = LEN;
    CHECK(sdpa_attention(&tq, &kpool, &vpool, &o, &tout, NULL, NULL));
    printf("q8_0 paged decode: %d sequences (lengths %lld, %lld), GQA %d/%d, E = %d, block size %d, kernel %s\n", NSEQ,
           (long long)LEN[0], (long long)LEN[1], HQ, HKV, E, BS, sdpa_last_kernel());

    const double u = ldexp(1.0, -24), scale = 1.0 / sqrt((double)E);
    double worst1 = 0.0, worst2 = 0.0, maxq = 0.0;
    int bad = 0;
    for (int r = 0; r < NSEQ; r++)
        for (int h = 0; h < HQ; h++) {
            const int g = h / (HQ / HKV), n = (int)LEN[r];
            static double kd[MAXT][E], vd[MAXT][E], k64[MAXT][E];
            double sd[MAXT], s0[MAXT], q64[E], A = 0.0, Tm = 0.0, V = 0.0, dsmax = 0.0, dv = 0.0;
            rope64(q_raw[r][h], qpos[r], q64);
            for (int j = 0; j < n; j++) {
                const int blk = TABLE[r][j / BS], s = j % BS;
                rope64(g_k[r][j][g], j, k64[j]);
                double a = 0.0, x = 0.0, x0 = 0.0, ds = 0.0;
                for (int b = 0; b < BLK; b++) {
                    double amax = 0.0; /* the block's amax, of the rows as rotated in float64 */
                    for (int e = 32 * b; e < 32 * b + 32; e++)
                        amax = dmax(amax, fabs(k64[j][e]));
                    /* the stated q8_0 bound, on amax grown by float32 RoPE's rounding (2^-15 relative) */
                    const double ek = (amax * (1 + ldexp(1, -15))) * (1.0 / 254 + ldexp(1, -11)) * (1 + ldexp(1, -14)) +
                                      127 * ldexp(1, -25);
                    for (int e = 32 * b; e < 32 * b + 32; e++) {
                        kd[j][e] = deq(g_kpool, blk, g, s, e);
                        vd[j][e] = deq(g_vpool, blk, g, s, e);
                        x += (double)q[r][h][e] * kd[j][e];
                        x0 += q64[e] * k64[j][e];
                        a += fabs((double)q[r][h][e] * kd[j][e]);
                        /* |q k - q64 k64| <= |q| |dk| + |q - q64| |k64| (dk: quantization + RoPE) */
                        const double erope = ldexp(1, -15) * (fabs(g_k[r][j][g][e]) + fabs(g_k[r][j][g][(e + E / 2) % E]));
                        ds += fabs((double)q[r][h][e]) * (ek + erope) + fabs((double)q[r][h][e] - q64[e]) * fabs(k64[j][e]);
                        V = dmax(V, fabs(vd[j][e]));
                    }
                    double vmax = 0.0;
                    for (int e = 32 * b; e < 32 * b + 32; e++)
                        vmax = dmax(vmax, fabs((double)g_v[r][j][g][e]));
                    dv = dmax(dv, vmax * (1.0 / 254 + ldexp(1, -11)) * (1 + ldexp(1, -14)) + 127 * ldexp(1, -25));
                }
                sd[j] = x * scale, s0[j] = x0 * scale;
                A = dmax(A, a * scale), Tm = dmax(Tm, fabs(sd[j]));
                dsmax = dmax(dsmax, ds * scale);
            }
            double md = -INFINITY, m0 = -INFINITY, zd = 0.0, z0 = 0.0;
            for (int j = 0; j < n; j++)
                md = dmax(md, sd[j]), m0 = dmax(m0, s0[j]);
            for (int j = 0; j < n; j++)
                zd += exp(sd[j] - md), z0 += exp(s0[j] - m0);
            const double delta = (E + 2) * u * A + 8 * u * Tm;
            const double b1 = V * ((exp(2 * delta) - 1) + (3.0 * n + 32) * u) + (3.0 * n + 32) * ldexp(1, -150);
            const double b2 = b1 + (V + dv) * (exp(2 * dsmax) - 1) + dv;
            for (int e = 0; e < E; e++) {
                double od = 0.0, o0 = 0.0;
                for (int j = 0; j < n; j++)
                    od += exp(sd[j] - md) / zd * vd[j][e], o0 += exp(s0[j] - m0) / z0 * g_v[r][j][g][e];
                const double e1 = fabs(out[r][h][e] - od), e2 = fabs(out[r][h][e] - o0);
                bad += e1 > b1 || e2 > b2;
                worst1 = dmax(worst1, e1 / b1), worst2 = dmax(worst2, e2 / b2), maxq = dmax(maxq, e2);
            }
        }
    printf("  vs float64 on the dequantized cache: largest error / float32 bound = %.3f\n", worst1);
    printf("  vs float64 on the unquantized rows (RoPE in float64): largest error %.2e, / quantization bound = %.3f\n",
           maxq, worst2);
    if (bad) {
        printf("FAILED: %d outputs beyond their bound\n", bad);
        return 1;
    }
    printf("OK: the q8_0 cache written by sdpa_kv_write_ex (RoPE + ggml quantization) and read by sdpa_attention\n");
    return 0;
}
