/* The decode kernel's scores on a q8_0 key cache with int8 dot products (AVX512-VNNI
 * VPDPBUSD), for SDPA_PRECISION_REDUCED only (0.6, issue 31): the call context (context.c)
 * puts this column in kv_k for a q8_0 K under REDUCED where the CPU has AVX512-VNNI and the ISA
 * in effect is AVX512. Built with -mavx512vnni (and the AVX-512 flags) into its own static
 * library; run only where sdpa__cpu_features()->avx512vnni holds.
 *
 * As ggml's q8_0 x q8_0 dot (vec_dot_q8_0_q8_0): each query row is quantized per block of 32
 * to int8 with d_q = amax / 127 (amax = max |q| over the block; q * (1 / d_q) rounded to nearest
 * even; d_q kept in float32, where ggml rounds it to f16), then per key block the exact int32
 * sum of q8 * k8 times d_q * d_k (one float32 product), summed over the blocks in float32.
 * The unsigned x signed product of VPDPBUSD takes k8 + 128 (k8 XOR 0x80, so -128 is fine) and
 * subtracts 128 * sum(q8) per group of 4, exactly.
 * Error (include/sdpa.h, sdpa_precision REDUCED): |q - d_q q8| <= d_q / 2 per element, so a
 * score moves by at most scale * sum_b (amax_b(q) / 254) * sum_{e in b} |k_e| beyond float32
 * rounding. The members compute what dot_rows / dot_rows_multi of microkernel.h say, with that
 * error; it has no axpy members (the context never uses it for V). Quantizing a query row is
 * redone at each call (a tile or block of keys): ne / 32 blocks against n keys of ne values. */
#include "microkernel.h"
#include "convert.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))
#include "simd_avx2.h"
#define QBLOCKS 128 /* query blocks quantized on the stack: E <= 4096 (else the exact column) */

typedef struct qrow {
    int64_t nb;
    float dq[QBLOCKS];
    __m256i q8[QBLOCKS];   /* 32 int8 per block */
    __m256i corr[QBLOCKS]; /* 128 * (sum of each group of 4 q8): the k8 + 128 offset's share */
} qrow;

static void quantize(const float *q, int64_t nb, qrow *r) {
    r->nb = nb;
    const __m256i ones80 = _mm256_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 x0 = _mm512_loadu_ps(q + 32 * b), x1 = _mm512_loadu_ps(q + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 idv = _mm512_set1_ps(id);
        const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x0, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x1, idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i q8 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtsepi32_epi8(i0)), _mm512_cvtsepi32_epi8(i1), 1);
        r->dq[b] = d;
        r->q8[b] = q8;
        r->corr[b] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones80, q8);
    }
}

AI float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float dot_key(const qrow *r, const char *row) {
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < r->nb; ++b) {
        const char *blk = row + b * SDPA__Q8_0_BYTES;
        const __m256i ku = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(blk + 2)), x80);
        const __m256i s = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ku, r->q8[b]), r->corr[b]);
        const __m256 dk = _mm256_mul_ps(_mm256_set1_ps(r->dq[b]), q8_0_d8(blk)); /* q's d times k's (exact widening) */
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dk, acc);
    }
    return hsum8(acc);
}

static void scores(const qrow *r, const void *k, ptrdiff_t ks, int64_t n, float *s, const void *pf) {
    const ptrdiff_t rb = ks * SDPA__Q8_0_BYTES;
    const int64_t bytes = r->nb * SDPA__Q8_0_BYTES;
    for (int64_t t = 0; t < n; ++t) {
        if (pf)
            for (int64_t c = 0; c < bytes; c += 64)
                _mm_prefetch((const char *)pf + t * rb + c, _MM_HINT_T1);
        s[t] = dot_key(r, (const char *)k + t * rb);
    }
}

static void v_dot_rows(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s, const void *pf) {
    const int64_t nb = ne / SDPA__Q8_0_QK;
    if (nb > QBLOCKS) {
        sdpa__mk_kv_avx512[SDPA_DTYPE_Q8_0].dot_rows(q, ne, k, ks, n, s, pf);
        return;
    }
    qrow r;
    quantize(q, nb, &r);
    scores(&r, k, ks, n, s, pf);
}

/* Each row as v_dot_rows (the same bits). */
static void v_dot_rows_multi(int64_t nr, const float *const *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n,
                             float *const *s, const void *pf) {
    for (int64_t r = 0; r < nr; ++r)
        v_dot_rows(q[r], ne, k, ks, n, s[r], r == 0 ? pf : NULL);
}

const sdpa__mk_kv sdpa__mk_kv_q8_0_avx512vnni = {
    v_dot_rows, NULL, v_dot_rows_multi, NULL, /* K only: the decode kernel's P.V reads kv_v */
};
