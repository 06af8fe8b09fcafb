/* Portable C micro-kernels (any CPU); dispatch.c registers them, the call context (context.c)
 * picks a table once per call. */
#include "microkernel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void p_lanes_gemm(int64_t m, int64_t kk, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *b,
                         float *c, const float *beta, int64_t nl, int64_t ld) {
    for (int64_t l0 = 0; l0 < nl; l0 += SDPA__LANES) {
        for (int64_t r = 0; r < m; ++r) {
            float acc[SDPA__LANES];
            for (int l = 0; l < SDPA__LANES; ++l)
                acc[l] = 0.0f;
            const float *ar = a + r * ars;
            for (int64_t k = 0; k < kk; ++k) {
                const float x = ar[k * aks];
                const float *bk = b + k * ld + l0;
                for (int l = 0; l < SDPA__LANES; ++l)
                    acc[l] += x * bk[l];
            }
            float *cr = c + r * ld + l0;
            if (beta != NULL)
                for (int l = 0; l < SDPA__LANES; ++l)
                    cr[l] = beta[l0 + l] * cr[l] + acc[l];
            else
                for (int l = 0; l < SDPA__LANES; ++l)
                    cr[l] = acc[l];
        }
    }
}

static void p_softcap(float *x, int64_t n, float cap) {
    for (int64_t t = 0; t < n; ++t)
        x[t] = cap * tanhf(x[t]) + (x[t] - x[t]); /* NaN where x[t] is not finite */
}

static void p_lanes_range_mask(float *t, int64_t n, int64_t nl, int64_t ld, int32_t j0, const int32_t *lo,
                               const int32_t *hi, int32_t *bad) {
    for (int64_t j = 0; j < n; ++j) {
        const int32_t key = j0 + (int32_t)j;
        float *row = t + j * ld;
        for (int64_t l = 0; l < nl; ++l) {
            if (key >= lo[l] && key < hi[l]) {
                if (!isfinite(row[l]))
                    bad[l] = -1;
            } else {
                row[l] = -INFINITY;
            }
        }
    }
}

static void p_lanes_softmax(float *t, int64_t n, int64_t nl, int64_t ld, float *m, float *alpha, float *tsum,
                            int32_t *bad) {
    for (int64_t l = 0; l < nl; ++l) {
        float mx = -INFINITY;
        bool fin = true;
        for (int64_t j = 0; j < n; ++j) {
            const float x = t[j * ld + l];
            mx = x > mx ? x : mx;
            fin = fin && isfinite(x);
        }
        if (bad != NULL && !fin)
            bad[l] = -1;
        const float mo = m[l], mn = mx > mo ? mx : mo, u = mn == -INFINITY ? 0.0f : mn;
        alpha[l] = expf(mo - u);
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            const float e = expf(t[j * ld + l] - u);
            t[j * ld + l] = e;
            sum += e;
        }
        tsum[l] = sum;
        m[l] = mn;
    }
}

/* Row off of a base as stored (off in the view's stride unit: elements, or q8_0 blocks). */
static inline const void *p_row(int DT, const void *base, ptrdiff_t off) {
    const ptrdiff_t unit = DT == SDPA_DTYPE_F32 ? 4 : DT == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_BYTES : DT >= SDPA_DTYPE_FP8_E4M3 ? 1 : 2;
    return (const char *)base + off * unit;
}

/* Element e of a row as stored, widened exactly (DT: the row's sdpa_dtype; 0.6: q8_0 d * q, FP8
 * without a scale: the loaders give scaled FP8 rows as f32 copies). */
static inline float p_ld(int DT, const void *row, ptrdiff_t e) {
    if (DT == SDPA_DTYPE_F32)
        return ((const float *)row)[e];
    if (DT == SDPA_DTYPE_Q8_0) {
        const unsigned char *blk = (const unsigned char *)row + (e / SDPA__Q8_0_QK) * SDPA__Q8_0_BYTES;
        return (float)((const int8_t *)(const void *)(blk + 2))[e % SDPA__Q8_0_QK] * sdpa__q8_0_d(blk);
    }
    if (DT == SDPA_DTYPE_FP8_E4M3)
        return sdpa__e4m3_to_f32(((const uint8_t *)row)[e]);
    if (DT == SDPA_DTYPE_FP8_E5M2)
        return sdpa__e5m2_to_f32(((const uint8_t *)row)[e]);
    const uint16_t h = ((const uint16_t *)row)[e];
    return DT == SDPA_DTYPE_F16 ? sdpa__f16_to_f32(h) : sdpa__bf16_to_f32(h);
}

/* 16-bit rows are widened P_WIDEN elements at a time into a local buffer first (a loop without
 * a reduction, which compilers vectorise; the conversion inside the dot product's in-order sum
 * stayed scalar, about 30 integer operations per f16 element): the products and the sum run
 * as for f32, in the same order, so the bits are those of the f32 column on the widened rows.
 * With convert.h's branch-free widening, decode (1,32,1,4096,128) with f16 K/V, SDPA_MAX_ISA=
 * portable, 1 thread, K/V cache-resident (bench/decode-probe 1 4096 f16 32 1), 5 alternated
 * runs of each build in one session, medians: 65.7 -> 46.4 ms (bf16 21.1 / 20.5, f32 15.9 /
 * 15.4: unchanged). */
#define P_WIDEN 256
static inline void p_dot_rows_t(int DT, const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n,
                                float *s) {
    if (DT == SDPA_DTYPE_F32) {
        for (int64_t t = 0; t < n; ++t) {
            float acc = 0.0f;
            for (int64_t e = 0; e < ne; ++e)
                acc += q[e] * p_ld(DT, p_row(DT, k, t * ks), e);
            s[t] = acc;
        }
        return;
    }
    float w[P_WIDEN];
    for (int64_t t = 0; t < n; ++t) {
        const void *kr = p_row(DT, k, t * ks);
        float acc = 0.0f;
        for (int64_t e0 = 0; e0 < ne; e0 += P_WIDEN) {
            const int64_t c = ne - e0 < P_WIDEN ? ne - e0 : P_WIDEN;
            for (int64_t e = 0; e < c; ++e)
                w[e] = p_ld(DT, kr, e0 + e);
            for (int64_t e = 0; e < c; ++e)
                acc += q[e0 + e] * w[e];
        }
        s[t] = acc;
    }
}

static void p_dot_rows(const float *q, int64_t ne, const float *k, ptrdiff_t ks, int64_t n, float *s) {
    p_dot_rows_t(SDPA_DTYPE_F32, q, ne, k, ks, n, s);
}

static float p_row_max(const float *s, int64_t n, int32_t *bad) {
    float mx = -INFINITY;
    bool fin = true;
    for (int64_t t = 0; t < n; ++t) {
        mx = s[t] > mx ? s[t] : mx;
        fin = fin && isfinite(s[t]);
    }
    if (bad != NULL && !fin)
        *bad = -1;
    return mx;
}

static float p_exp_sum(float *s, int64_t n, float u) {
    float sum = 0.0f;
    for (int64_t t = 0; t < n; ++t) {
        s[t] = expf(s[t] - u);
        sum += s[t];
    }
    return sum;
}

static inline void p_axpy_rows_t(int DT, float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,
                                 int64_t cnt, const void *v, ptrdiff_t vs) {
    for (int64_t d = 0; d < nev; ++d)
        o[d] *= alpha;
    for (int64_t t = 0; t < cnt; ++t) {
        const float w = p[idx[t]];
        const void *vr = p_row(DT, v, (ptrdiff_t)idx[t] * vs);
        for (int64_t d = 0; d < nev; ++d)
            o[d] += w * p_ld(DT, vr, d);
    }
}

static void p_axpy_rows(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx, int64_t cnt,
                        const float *v, ptrdiff_t vs) {
    p_axpy_rows_t(SDPA_DTYPE_F32, o, nev, alpha, p, idx, cnt, v, vs);
}

#define P_ROWS(SUF, DT)                                                                                          \
    static void p_dot_rows_##SUF(const float *q, int64_t ne, const void *k, ptrdiff_t ks, int64_t n, float *s,  \
                                 const void *pf) {                                                               \
        (void)pf;                                                                                                \
        p_dot_rows_t(DT, q, ne, k, ks, n, s);                                                                    \
    }                                                                                                            \
    static void p_axpy_rows_##SUF(float *o, int64_t nev, float alpha, const float *p, const int32_t *idx,       \
                                  int64_t cnt, const void *v, ptrdiff_t vs, const void *pf) {                   \
        (void)pf;                                                                                                \
        p_axpy_rows_t(DT, o, nev, alpha, p, idx, cnt, v, vs);                                                    \
    }
P_ROWS(f32, SDPA_DTYPE_F32)
P_ROWS(f16, SDPA_DTYPE_F16)
P_ROWS(bf16, SDPA_DTYPE_BF16)
P_ROWS(q8_0, SDPA_DTYPE_Q8_0)
P_ROWS(e4m3, SDPA_DTYPE_FP8_E4M3)
P_ROWS(e5m2, SDPA_DTYPE_FP8_E5M2)

const sdpa__mk_kv sdpa__mk_kv_portable[SDPA__KV_DTYPES] = {
    [SDPA_DTYPE_F32] = {p_dot_rows_f32, p_axpy_rows_f32, NULL, NULL},
    [SDPA_DTYPE_F16] = {p_dot_rows_f16, p_axpy_rows_f16, NULL, NULL},
    [SDPA_DTYPE_BF16] = {p_dot_rows_bf16, p_axpy_rows_bf16, NULL, NULL},
    [SDPA_DTYPE_Q8_0] = {p_dot_rows_q8_0, p_axpy_rows_q8_0, NULL, NULL},
    [SDPA_DTYPE_FP8_E4M3] = {p_dot_rows_e4m3, p_axpy_rows_e4m3, NULL, NULL},
    [SDPA_DTYPE_FP8_E5M2] = {p_dot_rows_e5m2, p_axpy_rows_e5m2, NULL, NULL},
};

static bool p_all_finite(const float *x, int64_t n) {
    uint32_t bad = 0;
    for (int64_t t = 0; t < n; ++t) {
        uint32_t u;
        memcpy(&u, &x[t], sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

static void p_pack_lanes(const float *x, ptrdiff_t rs, int64_t nrows, int64_t ncols, float scale, float *t,
                         int64_t ld) {
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t c = 0; c < ncols; ++c)
            t[c * ld + r] = scale * x[r * rs + c];
}

static void p_unpack_lanes(const float *t, int64_t ld, int64_t nrows, int64_t ncols, float *x, ptrdiff_t rs) {
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t c = 0; c < ncols; ++c)
            x[r * rs + c] = t[c * ld + r];
}

const sdpa__mk sdpa__mk_portable = {
    "tiled-portable", "decode-portable", "decode-split-portable",
    p_lanes_gemm, p_softcap, p_lanes_range_mask, p_lanes_softmax, SDPA__LANES,
    p_dot_rows, p_row_max, p_exp_sum, p_axpy_rows, p_all_finite,
    p_pack_lanes, p_unpack_lanes,
    NULL, NULL, /* no multi-row decode members: kernel_decode loops over the rows */
    NULL,       /* ALiBi: rules.c's loop */
};

bool sdpa__finite_strided(const sdpa__mk *mk, const float *x, int64_t n, int64_t stride) {
    if (n <= 0)
        return true;
    if (stride == 1)
        return mk->all_finite(x, n);
    for (int64_t t = 0; t < n; ++t)
        if (!isfinite(x[t * stride]))
            return false;
    return true;
}
