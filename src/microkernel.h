/* Micro-kernels of the tiled and decode paths: one table per instruction set (and tile dtype),
 * looked up in dispatch.c.
 * Tile products never go through BLAS (OpenBLAS would start and synchronise its threads for
 * each tiny product); these loops are the whole arithmetic of the two paths.
 *
 * Two layouts:
 *  - "lanes" (tiled path): query rows are vector lanes. A tile is t[j * nl + l]: row j (a key,
 *    or an output column of P.V), lane l (a query row); nl is a multiple of SDPA__LANES. Row
 *    maxima and sums of the online softmax are then per-lane (vertical) operations, and K and V
 *    are read in place with any strides (their elements are broadcast), so only Q is packed
 *    (the bf16 column, dispatch.h / microkernel_bf16.h, also packs P and V in key pairs).
 *  - "rows" (decode path): one query row at a time, vectors along E / Ev, keys of a tile
 *    contiguous in a row of scores.
 */
#ifndef SDPA_MICROKERNEL_H
#define SDPA_MICROKERNEL_H

#include "internal.h"

#include <stddef.h>

#define SDPA__LANES 16  /* lane quantum: nl is always a multiple of it */
#define SDPA__TILE_Q 64 /* query rows (lanes) per tiled work item */
#define SDPA__TILE_K 64 /* keys per tile (both paths) */

typedef struct sdpa__mk {
    const char *tiled_name, *decode_name, *decode_split_name; /* sdpa_last_kernel() names */

    /* c[r * ld + l] = sum_{k < kk} a[r * ars + k * aks] * b[k * ld + l]  for r < m, l < nl;
     * with beta != NULL the sum is added to beta[l] * c[r * ld + l] instead. kk may be 0. */
    void (*lanes_gemm)(int64_t m, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
                       float *c, const float *beta, int64_t nl, int64_t ld);
    /* x[t] = cap * tanh(x[t]) for t < n; NaN where x[t] is NaN or +-Inf, so that a raw score that
     * overflowed float32 (its true value may have either sign) stays visible as not finite. */
    void (*softcap)(float *x, int64_t n, float cap);
    /* Lanes tile of n rows (keys j0 + j, row stride ld, lanes [0, nl)): t = -inf where j0 + j
     * is outside [lo[l], hi[l]); bad[l] = -1 where an allowed element is not finite. */
    void (*lanes_range_mask)(float *t, int64_t n, int64_t nl, int64_t ld, int32_t j0, const int32_t *lo,
                             const int32_t *hi, int32_t *bad);
    /* Online softmax step on a lanes tile (row stride ld; blocked elements hold -inf): per lane
     * l, mx = max_j t, m' = max(m[l], mx), u = (m' == -inf ? 0 : m'), alpha[l] = exp(m[l] - u),
     * t = exp(t - u) in place, tsum[l] = sum_j t (float, in j order), m[l] = m'. With bad != NULL
     * also bad[l] = -1 where some t is not finite (tiles without blocked elements). n may be 0. */
    void (*lanes_softmax)(float *t, int64_t n, int64_t nl, int64_t ld, float *m, float *alpha, float *tsum,
                          int32_t *bad);
    /* Lanes per chunk when a tile is computed per chunk of rows (a multiple of SDPA__LANES): the
     * width at which lanes_gemm runs at full speed. */
    int64_t range_lanes;

    /* s[t] = sum_{e < ne} q[e] * k[t * ks + e] for t < n (rows of k contiguous). */
    void (*dot_rows)(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s);
    /* max of s[0, n) (-inf if n = 0); with bad != NULL, *bad = -1 if some s is not finite. */
    float (*row_max)(const float *s, int64_t n, int32_t *bad);
    /* s[t] = exp(s[t] - u) in place; returns the float sum in t order (per vector lane, then lanes). */
    float (*exp_sum)(float *s, int64_t n, float u);
    /* o[d] = alpha * o[d] + sum_{t < cnt} p[idx[t]] * v[idx[t] * vs + d] for d < nev (rows of v
     * contiguous). */
    void (*axpy_rows)(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                      const float *v, ptrdiff_t vs);
    /* Whether x[0, n) (contiguous) holds no NaN or Inf. */
    bool (*all_finite)(const float *x, int64_t n);

    /* Transposes between row-major rows (contiguous along their ncols elements, rows at stride
     * rs) and a lanes tile (row stride ld): pack: t[c * ld + r] = scale * x[r * rs + c];
     * unpack: x[r * rs + c] = t[c * ld + r]; for r < nrows, c < ncols. */
    void (*pack_lanes)(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                       int64_t ld);
    void (*unpack_lanes)(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs);

    /* Optional (NULL: the caller loops dot_rows / axpy_rows over the rows). Several query rows
     * at once, reading each K (V) row once for all of them; row r's results equal, bit for bit,
     * those of dot_rows(q[r], ne, k, ks, n, s[r]) and axpy_rows(o[r], nev, alpha[r], p[r], idx,
     * cnt, v, vs) (same per-row summation order). nr may be any count >= 0. */
    void (*dot_rows_multi)(int64_t nr, const float *const *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n,
                           float *const *s);
    void (*axpy_rows_multi)(int64_t nr, float *const *o, int64_t nev, const float *alpha, const float *const *p,
                            const int32_t *idx, int64_t cnt, const float *v, ptrdiff_t vs);

    /* Optional (NULL: rules.c's sdpa__rule_alibi_add_lanes). An ALiBi term in the lane form of
     * rules.h sdpa__rule_alibi_lanes_form: s[t * ld + l] -= sl[l] * |(base - t) + lf[l]| for
     * t < n, l < w (a multiply, then a subtract: the same bits as the rules.c loop). */
    void (*lanes_sub_abs)(float *s, int64_t ld, int64_t n, int64_t w, const float *sl, const float *lf, float base);
} sdpa__mk;

/* The decode path's "rows" kernels on K/V rows as stored (0.5): base pointer k (v) of
 * sdpa_dtype F32, F16 or BF16 elements, rows contiguous along E (Ev), row t at element t * ks
 * (t * vs); the 16-bit encodings are widened exactly where they are loaded (no f32 copy of a
 * tile). Each member computes what the sdpa__mk member of the same name and ISA computes on the
 * exactly widened rows, with the same summation order, so the results equal, bit for bit, those
 * of the loader's f32 tile through sdpa__mk (and the f32 column is that member). Looked up by
 * [isa][sdpa_dtype] (dispatch.c: sdpa__dispatch_mk_kv). The multi-row members may be NULL
 * (the caller loops over the rows). pf (NULL: none): where the rows a stream's distance ahead
 * are, at the same strides: when a kernel reads row t (element offset t * ks), it prefetches
 * element offset t * ks of pf (a hint; nothing there is read). The sdpa__mk members pass k (v)
 * plus the ISA's distance (the rows continue in memory); a paged caller passes the block that
 * holds the keys that far ahead. Only the ISA sets that prefetch (AVX-512) use it. */
typedef struct sdpa__mk_kv {
    void (*dot_rows)(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s, const void *pf);
    void (*axpy_rows)(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                      const void *v, ptrdiff_t vs, const void *pf);
    void (*dot_rows_multi)(int64_t nr, const float *const *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n,
                           float *const *s, const void *pf);
    void (*axpy_rows_multi)(int64_t nr, float *const *o, int64_t nev, const float *alpha, const float *const *p,
                            const int32_t *idx, int64_t cnt, const void *v, ptrdiff_t vs, const void *pf);
} sdpa__mk_kv;

/* [sdpa_dtype] columns of each ISA's rows kernels on stored K/V (0.6: also q8_0, whose row
 * strides ks / vs count blocks and whose ne / nev are multiples of 32, and FP8 without a scale:
 * the loaders hand scaled FP8 rows out as f32 copies, load.c). */
#define SDPA__KV_DTYPES (SDPA_DTYPE_FP8_E5M2 + 1)
extern const sdpa__mk_kv sdpa__mk_kv_portable[SDPA__KV_DTYPES];
#if defined(SDPA_HAVE_AVX2)
extern const sdpa__mk_kv sdpa__mk_kv_avx2[SDPA__KV_DTYPES]; /* -mavx2 -mfma -mf16c */
#endif
#if defined(SDPA_HAVE_AVX2) && defined(SDPA_HAVE_AVX512)
extern const sdpa__mk_kv sdpa__mk_kv_avx512[SDPA__KV_DTYPES]; /* -mavx512f -mavx512bw -mavx512vl */
#endif

#if defined(SDPA_HAVE_MK_AVX512VNNI)
/* 0.6, SDPA_PRECISION_REDUCED with a q8_0 K: scores by int8 dot products on a per-block int8
 * quantization of q (src/microkernel_avx512vnni.c; dot members only). */
extern const sdpa__mk_kv sdpa__mk_kv_q8_0_avx512vnni;
#endif
#if defined(SDPA_HAVE_NEON)
extern const sdpa__mk_kv sdpa__mk_kv_neon[SDPA__KV_DTYPES]; /* aarch64 Advanced SIMD (baseline of armv8-a) */
#endif

extern const sdpa__mk sdpa__mk_portable;
#if defined(SDPA_HAVE_AVX2)
extern const sdpa__mk sdpa__mk_avx2; /* src/microkernel_avx2.c, built with -mavx2 -mfma */
/* Its "rows" members and softcap, shared by the AVX-512 set (decode is bound by memory). */
void sdpa__avx2_softcap(float *x, int64_t n, float cap);
void sdpa__avx2_dot_rows(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s);
float sdpa__avx2_row_max(const float *s, int64_t n, int32_t *bad);
float sdpa__avx2_exp_sum(float *s, int64_t n, float u);
void sdpa__avx2_axpy_rows(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                          const float *v, ptrdiff_t vs);
bool sdpa__avx2_all_finite(const float *x, int64_t n);
void sdpa__avx2_pack_lanes(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                           int64_t ld);
void sdpa__avx2_unpack_lanes(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs);
#endif
#if defined(SDPA_HAVE_AVX2) && defined(SDPA_HAVE_AVX512)
extern const sdpa__mk sdpa__mk_avx512; /* src/microkernel_avx512.c, built with -mavx512f */
#endif
#if defined(SDPA_HAVE_NEON)
extern const sdpa__mk sdpa__mk_neon; /* src/microkernel_neon.c (aarch64 only) */
#endif

/* Whether every element of a strided vector is finite (any stride; unit stride goes through
 * mk->all_finite). */
bool sdpa__finite_strided(const sdpa__mk *mk, const float *x, int64_t n, int64_t stride);

#endif
