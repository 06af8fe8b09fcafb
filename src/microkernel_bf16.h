/* bf16 x bf16 micro-kernel primitives with float32 accumulation (0.4), to be entered into the
 * [isa][dtype] micro-kernel table. Inputs are raw bf16 encodings (uint16_t); results are f32.
 * Products of two bf16 values are exact in f32; sums are rounded to nearest even in f32, and,
 * as VDPBF16PS / AMX define, bf16 subnormal inputs are read as 0 and subnormal partial results
 * flushed (see sdpa_precision in sdpa.h for the error bound this implies). */
#ifndef SDPA_MICROKERNEL_BF16_H
#define SDPA_MICROKERNEL_BF16_H

#include <stddef.h>
#include <stdint.h>

#if defined(SDPA_HAVE_MK_AVX512BF16)
/* s[t] = sum_{e < ne} q[e] * k[t * ks + e] for t < n (rows of k contiguous, ks >= ne). Elements
 * beyond ne of a row are never read. src/microkernel_avx512bf16.c (-mavx512bf16); call only
 * where the CPU has AVX512-BF16 (sdpa__cpu_features()->avx512bf16). */
void sdpa__bf16_dot_rows_avx512bf16(const uint16_t *q, int64_t ne, const uint16_t *k, ptrdiff_t ks, int64_t n,
                                    float *s);
/* o[d] = alpha * o[d] + sum_{t < cnt} p[t] * v[t * vs + d] for d < nev: bf16 probabilities p
 * (contiguous) and bf16 value rows (contiguous along d). With alpha = 1 nothing is rescaled. */
/* Scores in the lanes layout of the tiled kernel: st[t * ld + l] = scale * sum_e q_l[e] * k[t * ks + e]
 * for t < nk, l < w (a multiple of 16). q is packed in pairs: qp[pi * ldq + l] holds q_l[2 pi] in
 * its low and q_l[2 pi + 1] in its high 16 bits (0 beyond ne). k rows contiguous (ne elements). */
void sdpa__bf16_lanes_scores_avx512bf16(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w, const uint16_t *k,
                                        ptrdiff_t ks, int64_t nk, float scale, float *st, int64_t ld);
void sdpa__bf16_axpy_rows_avx512bf16(float *o, int64_t nev, float alpha, const uint16_t *p, int64_t cnt,
                                     const uint16_t *v, ptrdiff_t vs);

/* The tiled kernel's bf16 path (SDPA_PRECISION_REDUCED), blocked 8 rows x 32 lanes as the
 * float32 lanes_gemm (16 accumulators). Per element the pair steps run in pair order whatever
 * the blocking or lane offset, so results never depend on it.
 * Scores, as sdpa__bf16_lanes_scores_avx512bf16 (same arguments and results), any ks >= ne. */
void sdpa__bf16_lanes_scores_pairs_avx512bf16(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w,
                                              const uint16_t *k, ptrdiff_t ks, int64_t nk, float scale, float *st,
                                              int64_t ld);
/* P.V over keys in pairs: o[d * ld + l] = sum_{tp < np} vp[(tp0 + tp) * nev + d] . pp[tp * ldp + l]
 * (each a bf16 pair: key 2 tp low, 2 tp + 1 high), stored, or with beta added to
 * beta[l] * o[d * ld + l]; for d < nev, l < w (a multiple of 16). np may be 0 (o = beta o, or 0). */
void sdpa__bf16_lanes_pv_avx512bf16(int64_t nev, int64_t tp0, int64_t np, const uint32_t *vp, const uint32_t *pp,
                                    int64_t ldp, float *o, const float *beta, int64_t w, int64_t ld);
/* Probabilities rounded to bf16 (nearest even; below 2^-126 to 0) in key pairs:
 * pp[tp * ldp + l] = bf16(st[2 tp][l]) | bf16(st[2 tp + 1][l]) << 16 (0 beyond n), l < w. */
void sdpa__bf16_pack_p_avx512bf16(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp);
/* Value rows in key pairs: vp[tp * nev + d] = v_{j(2 tp)}[d] | v_{j(2 tp + 1)}[d] << 16, with
 * j(t) = idx[t] (or t if idx is NULL), the high half 0 for an odd n's last pair (nothing beyond
 * key n - 1 is read); v_j at v + j * vs, contiguous along d. */
void sdpa__bf16_pack_v_avx512bf16(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev,
                                  uint32_t *vp);
#endif

#if defined(SDPA_HAVE_MK_AMX)
/* AMX-BF16 primitives of the tiled kernel's bf16 column (src/microkernel_amx.c, built with
 * -mamx-tile -mamx-bf16 -mavx512bf16): the same contracts as the _avx512bf16 members above,
 * except where said. Call only where sdpa_amx_available(), with head sizes that
 * sdpa__amx_fits accepts, between sdpa__amx_begin() (configures this thread's tiles) and
 * sdpa__amx_end() (releases them: the thread's AMX state is not preserved across a work item). */
#define SDPA__AMX_MAX_E 256 /* largest ne: a last partial key block is copied into 16 x ne on the stack */
#ifndef SDPA__AMX_TILE_K
#define SDPA__AMX_TILE_K 128 /* keys per tile on AMX */
#endif
#define SDPA__AMX_VP_LD (SDPA__AMX_TILE_K / 2) /* pairs per packed value column */
#ifndef SDPA__AMX_TILE_Q
#define SDPA__AMX_TILE_Q 256 /* query rows per tiled work item on AMX */
#endif
void sdpa__amx_begin(void);
void sdpa__amx_end(void);
/* Scores: any nk >= 0 and k row stride; ne a multiple of 32, at most SDPA__AMX_MAX_E. With
 * scale = 1 the raw sums are stored (no pass over st). */
void sdpa__amx_lanes_scores(const uint32_t *qp, int64_t ldq, int64_t ne, int64_t w, const uint16_t *k, ptrdiff_t ks,
                            int64_t nk, float scale, float *st, int64_t ld);
/* P.V over a whole tile's pairs (tp0 = 0; np <= SDPA__AMX_VP_LD): vp as sdpa__amx_pack_v laid
 * it out, pp as sdpa__amx_pack_p; nev a multiple of 16. With beta: on each block of 32 (or 16)
 * lanes whose beta is exactly 1, the pair products are accumulated onto o in pair order; on
 * the others o = beta o + sum (FMA). */
void sdpa__amx_lanes_pv(int64_t nev, int64_t tp0, int64_t np, const uint32_t *vp, const uint32_t *pp, int64_t ldp,
                        float *o, const float *beta, int64_t w, int64_t ld);
/* The online-softmax step of a tile every lane may fully attend, on raw scores t (n rows of w
 * lanes, row stride ld; scaled here by scale), fused with the packing of P: per lane, x = scale
 * t, mx = max_j x; the reference point m' = max(m, mx) where mx > m + SDPA__AMX_LAZY_MAX (or m
 * is -inf), else m' = m (alpha exactly 1: Ot is not rescaled; P <= e^SDPA__AMX_LAZY_MAX);
 * alpha = exp(m - u), P = exp(x - u) with u = m' (0 if -inf), tsum = sum_j P in j order
 * (float), m = m'; bad = -1 where some x is not finite; pp as sdpa__amx_pack_p packs P (t is
 * not written). */
#define SDPA__AMX_LAZY_MAX 8.0f
void sdpa__amx_softmax_pack(const float *t, int64_t n, int64_t w, int64_t ld, float scale, float *m, float *alpha,
                            float *tsum, int32_t *bad, uint32_t *pp, int64_t ldp);
/* As sdpa__bf16_pack_p_avx512bf16, and pair rows [np, np rounded up to 16) set to 0. */
void sdpa__amx_pack_p(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp);
/* Value rows in key pairs, transposed for the A operand: vp[d * SDPA__AMX_VP_LD + tp] =
 * v_{j(2 tp)}[d] | v_{j(2 tp + 1)}[d] << 16 for d < nev (a multiple of 16), tp < np rounded up
 * to 16 (0 beyond key n - 1; nothing beyond it is read); n <= 2 * SDPA__AMX_VP_LD. */
void sdpa__amx_pack_v(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev, uint32_t *vp);
#endif

#endif
