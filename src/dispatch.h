/* Instruction-set dispatch (dispatch.c): the ISA is chosen once per process (pthread_once): the
 * best the CPU supports (x86-64: AVX-512F, else AVX2 with FMA, else portable C; aarch64: NEON,
 * else portable C), capped by the environment variable SDPA_MAX_ISA ("portable", "avx2" or
 * "avx512" on x86-64, "portable" or "neon" on aarch64), which is read once, at the first call
 * that needs a micro-kernel. Micro-kernel tables are looked up by [isa][dtype]: a new ISA is one
 * row, a new storage dtype's micro-kernels one column (see load.h for the loader side of a
 * dtype). Reading CPUID (getauxval on aarch64) is not state a caller can see; nothing else is
 * cached. */
#ifndef SDPA_DISPATCH_H
#define SDPA_DISPATCH_H

#include "cpu.h"
#include "microkernel.h"

/* ISA levels: SDPA__ISA_PORTABLE, _AVX2, _AVX512, _NEON (cpu.h, whose one CPUID / getauxval
 * read decides them). */
typedef int sdpa__isa;

/* Micro-kernel dtypes: the dtype of the tiles the loaders hand to the micro-kernels (only f32
 * today; a bf16 tile column comes with AVX512-BF16 / AMX). */
typedef enum sdpa__mk_dtype {
    SDPA__MK_F32 = 0,
    SDPA__MK_DTYPE_COUNT
} sdpa__mk_dtype;

/* The ISA in effect: the process's choice, or the test cap if one is set. */
sdpa__isa sdpa__dispatch_isa(void);
/* The micro-kernel table for tiles of `dtype` at the ISA in effect (the best compiled-in
 * table at or below it; never NULL for SDPA__MK_F32). */
const sdpa__mk *sdpa__dispatch_mk(sdpa__mk_dtype dtype);
/* The decode rows kernels on K/V rows stored as `dtype` (an sdpa_dtype: F32, F16, BF16) at the
 * ISA of sdpa__dispatch_mk(SDPA__MK_F32) (so their results equal its rows members' on the
 * widened rows); NULL for another dtype. */
const sdpa__mk_kv *sdpa__dispatch_mk_kv(int dtype);
/* 0.6: the REDUCED q8_0 key column (int8 dot products, AVX512-VNNI), or NULL where the build,
 * the CPU or the ISA in effect (below AVX512) does not have it. */
const sdpa__mk_kv *sdpa__dispatch_mk_kv_q8_0_reduced(void);

/* The bf16-tile column (SDPA_PRECISION_REDUCED with bf16 q and k): VDPBF16PS products on raw
 * bf16 rows (microkernel_bf16.h), float32 results. */
typedef struct sdpa__mk_bf16 {
    const char *tiled_name, *decode_name, *decode_split_name; /* "tiled-avx512bf16", ... */
    /* s[t] = sum_{e < ne} q[e] * k[t * ks + e] for t < n (bf16 subnormals read as 0). */
    void (*dot_rows)(const uint16_t *q, int64_t ne, const uint16_t *k, ptrdiff_t ks, int64_t n, float *s);
    /* Lanes-layout scores (tiled kernel): see sdpa__bf16_lanes_scores_avx512bf16. */
    void (*lanes_scores)(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w, const uint16_t *k, ptrdiff_t ks,
                         int64_t nk, float scale, float *st, int64_t ld);
    /* The tiled kernel's bf16 P.V (bf16 V, REDUCED): probabilities rounded and packed in key
     * pairs, value rows packed in key pairs, the pair product (microkernel_bf16.h). */
    void (*lanes_pv)(int64_t nev, int64_t tp0, int64_t np, const uint32_t *vp, const uint32_t *pp, int64_t ldp, float *o,
                     const float *beta, int64_t w, int64_t ld);
    void (*pack_p)(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp);
    void (*pack_v)(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev, uint32_t *vp);
    /* Optional (NULL: none): called by a thread before its first and after its last use of the
     * column's tiled members in a work item (AMX: tile configuration and release). */
    void (*begin)(void);
    void (*end)(void);
    /* lanes_pv computes only whole tiles (tp0 = 0, every pair of pack_v's): the tiled kernel
     * then runs P.V of a causal diagonal tile over all its keys (the P of keys outside a lane
     * chunk's reach is 0 there), not per chunk. */
    bool pv_whole_tile;
    /* Optional (NULL: none): the online-softmax step of a fully allowed tile on raw scores
     * (lanes_scores with scale 1), scaled, with a lazy reference point, fused with pack_p
     * (sdpa__amx_softmax_pack). */
    void (*softmax_pack)(const float *t, int64_t n, int64_t w, int64_t ld, float scale, float *m, float *alpha,
                         float *tsum, int32_t *bad, uint32_t *pp, int64_t ldp);
    /* Query rows per tiled work item (0: SDPA__TILE_Q; at most 256): AMX amortises its packed
     * value tile over more rows. */
    int tile_q;
    /* Keys per tile (0: SDPA__TILE_K; at most 128; even): AMX runs P.V over more key pairs per
     * load and store of its accumulator tiles. */
    int tile_k;
} sdpa__mk_bf16;
/* The bf16 column at the ISA in effect, or NULL where the build, the CPU (AVX512-BF16) or the
 * ISA cap does not allow it. */
const sdpa__mk_bf16 *sdpa__dispatch_mk_bf16(void);
/* The tiled kernel's bf16 column for head sizes E (q, k) and Ev (v): the AMX-BF16 column where
 * the build has it, sdpa_amx_available() says this process may use it (the application's
 * opt-in), the ISA in effect is AVX512 with AMX not capped (SDPA_MAX_ISA unset or "amx"; the
 * test hook below) and E is a multiple of 32 up to SDPA__AMX_MAX_E and Ev a multiple of 16;
 * else sdpa__dispatch_mk_bf16(). */
const sdpa__mk_bf16 *sdpa__dispatch_mk_bf16_tiled(int64_t E, int64_t Ev);
/* Test hook (never exported): allow (1, the default; or -1) or forbid (0) the AMX column for
 * the following calls of every thread. */
void sdpa__dispatch_set_amx_for_testing(int allow);

/* The conversion table of the ISA in effect (convert.h; sdpa__convert_for_isa, also here). */
struct sdpa__convert;
const struct sdpa__convert *sdpa__dispatch_convert(void);

/* Test hook (never exported): cap the ISA for the following calls of every thread, as
 * SDPA_MAX_ISA would for a new process (still limited by the CPU); isa < 0 returns to the
 * process's choice. Tests that run every ISA in one process use it instead of setenv. */
void sdpa__dispatch_set_max_isa_for_testing(int isa);

#endif
