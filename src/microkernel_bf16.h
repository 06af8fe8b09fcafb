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
/* P.V over keys in pairs: o[d * ld + l] = sum_{tp < np} vp[tp * nev + d] . pp[tp * ldp + l]
 * (each a bf16 pair: key 2 tp low, 2 tp + 1 high), stored, or with beta added to
 * beta[l] * o[d * ld + l]; for d < nev, l < w (a multiple of 16). np may be 0 (o = beta o, or 0). */
void sdpa__bf16_lanes_pv_avx512bf16(int64_t nev, int64_t np, const uint32_t *vp, const uint32_t *pp, int64_t ldp,
                                    float *o, const float *beta, int64_t w, int64_t ld);
/* Probabilities rounded to bf16 (nearest even; below 2^-126 to 0) in key pairs:
 * pp[tp * ldp + l] = bf16(st[2 tp][l]) | bf16(st[2 tp + 1][l]) << 16 (0 beyond n), l < w. */
void sdpa__bf16_pack_p_avx512bf16(const float *st, int64_t ld, int64_t n, int64_t w, uint32_t *pp, int64_t ldp);
/* Value rows in key pairs: vp[tp * nev + d] = v_{j(2 tp)}[d] | v_{j(2 tp + 1)}[d] << 16, with
 * j(t) = idx[t] (or t if idx is NULL), the high half 0 for an odd n's last pair (nothing beyond
 * key n - 1 is read); v_j at v + j * vs, contiguous along d. */
void sdpa__bf16_pack_v_avx512bf16(const uint16_t *v, ptrdiff_t vs, const int32_t *idx, int64_t n, int64_t nev,
                                  uint32_t *vp);
#endif

#endif
