/* Rotary position embedding (0.6): the one rotation (sdpa__rope_prepare / _angles / _apply,
 * src/rope.h) that sdpa_rope() below and sdpa_kv_write_ex() (kv_write.c) both use.
 *
 * Arithmetic is float32, each product rounded on its own: the library is built as ISO C11
 * (meson c_std=c11), for which GCC does not contract a * b + c into an FMA
 * (-ffp-contract=off is the ISO default), so the bits equal those of PyTorch's elementwise
 * x * cos + rotate_half(x) * sin on CPU. */
#include "rope.h"
#include "convert.h"

#include <math.h>
#include <string.h>

static const char FN[] = "sdpa_rope";

SDPA_API void sdpa_rope_params_init_sized(sdpa_rope_params *params, size_t struct_size) {
    if (params == NULL || struct_size < sizeof(size_t))
        return;
    memset(params, 0, struct_size);
    params->struct_size = struct_size;
}

/* A cos / sin table: float32 [max_pos, half]. */
static sdpa_status check_table(const char *fn, const char *name, const sdpa_tensor *t, int64_t half) {
    SDPA__TRY(sdpa__check_view(t, fn, name, 2, 2));
    SDPA__TRY(sdpa__check_dtype_supported(t, fn, name, SDPA__DTYPES_F32));
    if (t->shape[1] != half)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s [max_pos, rotary_dim / 2] has %lld columns, rotary_dim / 2 is %lld", fn,
                          name, (long long)t->shape[1], (long long)half);
    return SDPA_OK;
}

sdpa_status sdpa__rope_prepare(const char *fn, const sdpa_rope_params *params, int64_t E, int64_t T,
                               const int64_t *positions, sdpa__rope *r, double *inv_freq) {
    if (params == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: rope params are NULL", fn);
    sdpa_rope_params p;
    sdpa_rope_params_init_sized(&p, sizeof p);
    SDPA__TRY(sdpa__read_versioned(fn, "rope", "sdpa_rope_params", params, sizeof(sdpa_rope_params), &p, sizeof p));
    SDPA__TRY(sdpa__check_reserved(fn, "rope->reserved0", p.reserved0));
    const int64_t rd = p.rotary_dim == 0 ? E : p.rotary_dim;
    if (rd < 2 || rd > E || rd % 2 != 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: rope->rotary_dim=%lld must be even and in [2, E = %lld] (0 = E)", fn,
                          (long long)p.rotary_dim, (long long)E);
    const int64_t half = rd / 2;
    if (half > SDPA__ROPE_MAX_HALF)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: rotary_dim=%lld is above the supported %d", fn, (long long)rd,
                          2 * SDPA__ROPE_MAX_HALF);
    if (p.interleaved != 0 && p.interleaved != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: rope->interleaved=%d must be 0 (NeoX) or 1 (GPT-J)", fn,
                          (int)p.interleaved);
    if ((p.cos == NULL) != (p.sin == NULL))
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: rope->cos and rope->sin must both be given or both be NULL", fn);
    memset(r, 0, sizeof *r);
    r->rotary_dim = rd;
    r->interleaved = p.interleaved;
    if (p.cos != NULL) {
        if (p.theta != 0.0)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                              "%s: rope->theta=%g with cos/sin tables (theta is for the computed angles: leave it 0)",
                              fn, p.theta);
        SDPA__TRY(check_table(fn, "rope->cos", p.cos, half));
        SDPA__TRY(check_table(fn, "rope->sin", p.sin, half));
        if (p.sin->shape[0] != p.cos->shape[0])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: rope->sin has %lld rows, rope->cos %lld (max_pos)", fn,
                              (long long)p.sin->shape[0], (long long)p.cos->shape[0]);
        r->cos = (const float *)p.cos->data;
        r->sin = (const float *)p.sin->data;
        r->cs_stride = (ptrdiff_t)p.cos->strides[0];
        r->ccol = (ptrdiff_t)p.cos->strides[1];
        r->ss_stride = (ptrdiff_t)p.sin->strides[0];
        r->scol = (ptrdiff_t)p.sin->strides[1];
        r->max_pos = p.cos->shape[0];
    } else {
        const double theta = p.theta == 0.0 ? 10000.0 : p.theta;
        if (!(theta > 0.0) || isinf(theta))
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: rope->theta=%g must be finite and > 0 (0 = 10000)", fn,
                              p.theta);
        /* HF's inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        for (int64_t i = 0; i < half; ++i) {
            const float ex = (float)(2 * i) / (float)rd;
            inv_freq[i] = (double)(1.0f / (float)pow(theta, (double)ex));
        }
        r->inv_freq = inv_freq;
        r->max_pos = INT64_MAX;
    }
    if (T > 0 && positions == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: positions is NULL", fn);
    if (T > 0)
        SDPA__TRY(sdpa__check_aligned(fn, "positions", positions, sizeof(int64_t)));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t pos = positions[t];
        if (pos < 0 || pos >= r->max_pos)
            return sdpa__fail(SDPA_ERR_INDEX, "%s: positions[%lld]=%lld is outside [0, %lld)%s", fn, (long long)t,
                              (long long)pos, (long long)(r->cos != NULL ? r->max_pos : INT64_MAX),
                              r->cos != NULL ? " (the rows of rope->cos / rope->sin)" : "");
        if (r->cos != NULL) { /* the table rows this call reads must be finite */
            float c[SDPA__ROPE_MAX_HALF], s[SDPA__ROPE_MAX_HALF];
            sdpa__rope_angles(r, pos, c, s);
            for (int64_t i = 0; i < half; ++i)
                if (!isfinite(c[i]) || !isfinite(s[i]))
                    return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: rope->%s[%lld, %lld] is not finite (positions[%lld])",
                                      fn, isfinite(c[i]) ? "sin" : "cos", (long long)pos, (long long)i, (long long)t);
        }
    }
    return SDPA_OK;
}

void sdpa__rope_angles(const sdpa__rope *r, int64_t pos, float *cos_p, float *sin_p) {
    const int64_t half = r->rotary_dim / 2;
    if (r->cos != NULL) {
        const float *c = r->cos + (ptrdiff_t)pos * r->cs_stride, *s = r->sin + (ptrdiff_t)pos * r->ss_stride;
        for (int64_t i = 0; i < half; ++i) {
            cos_p[i] = c[(ptrdiff_t)i * r->ccol];
            sin_p[i] = s[(ptrdiff_t)i * r->scol];
        }
        return;
    }
    /* HF: freqs = float32(t) * inv_freq (float32), then cos / sin of that float32 angle (here
     * in double, then rounded: correctly rounded; PyTorch's float32 cos may differ by an ulp) */
    const float fp = (float)pos;
    for (int64_t i = 0; i < half; ++i) {
        const float a = fp * (float)r->inv_freq[i];
        cos_p[i] = (float)cos((double)a);
        sin_p[i] = (float)sin((double)a);
    }
}

void sdpa__rope_apply(const sdpa__rope *r, const float *cos_p, const float *sin_p, float *x) {
    const int64_t half = r->rotary_dim / 2;
    /* pair (a, b): NeoX (x[i], x[i + half]); GPT-J (x[2i], x[2i + 1]) */
    const int64_t step = r->interleaved ? 2 : 1, off = r->interleaved ? 1 : half;
    for (int64_t i = 0; i < half; ++i) {
        float *pa = x + i * step, *pb = pa + off;
        const float a = *pa, b = *pb, c = cos_p[i], s = sin_p[i];
        const float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        *pa = ac - bs;
        *pb = bc + as;
    }
}

/* ---------------------------------------------------------------- sdpa_rope */

/* Chunk of a row held in float32 (no allocation): rows wider than this are rotated through
 * the chunk holding the rotated part; rotary_dim <= 2 * SDPA__ROPE_MAX_HALF fits. */
#define ROPE_ROW_MAX (2 * SDPA__ROPE_MAX_HALF)

static bool same_view(const sdpa_tensor *a, const sdpa_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int32_t d = 0; d < a->rank; ++d)
        if (a->shape[d] != b->shape[d] || a->strides[d] != b->strides[d])
            return false;
    return true;
}

SDPA_API sdpa_status sdpa_rope(const sdpa_tensor *x, const sdpa_tensor *out, const int64_t *positions,
                               const sdpa_rope_params *params) {
    sdpa__clear_error();
    if (x == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: x is NULL", FN);
    if (out == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: out is NULL", FN);
    SDPA__TRY(sdpa__check_view(x, FN, "x", 3, 3));
    SDPA__TRY(sdpa__check_dtype_supported(x, FN, "x", SDPA__DTYPES_ALL));
    SDPA__TRY(sdpa__check_view(out, FN, "out", 3, 3));
    SDPA__TRY(sdpa__check_dtype_supported(out, FN, "out", SDPA__DTYPES_ALL));
    for (int d = 0; d < 3; ++d)
        if (out->shape[d] != x->shape[d])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: out [T, H, E] = [%lld, %lld, %lld] differs from x [%lld, %lld, %lld]",
                              FN, (long long)out->shape[0], (long long)out->shape[1], (long long)out->shape[2],
                              (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2]);
    SDPA__TRY(sdpa__check_output_layout(out, FN, "out"));
    const int64_t T = x->shape[0], H = x->shape[1], E = x->shape[2];
    sdpa__rope r;
    double inv_freq[SDPA__ROPE_MAX_HALF];
    SDPA__TRY(sdpa__rope_prepare(FN, params, E, T, positions, &r, inv_freq));
    const bool in_place = same_view(x, out);
    if (!in_place) {
        sdpa__named_span in[2], outs[1];
        int nin = 0;
        in[nin].name = "x";
        in[nin++].s = sdpa__tensor_span(x);
        in[nin].name = "positions";
        in[nin].s.lo = (uintptr_t)positions;
        in[nin++].s.hi = T > 0 ? (uintptr_t)(positions + T) : (uintptr_t)positions;
        outs[0].name = "out";
        outs[0].s = sdpa__tensor_span(out);
        SDPA__TRY(sdpa__check_overlaps(FN, in, nin, outs, 1));
    } else {
        sdpa__named_span in[1], outs[1];
        in[0].name = "positions";
        in[0].s.lo = (uintptr_t)positions;
        in[0].s.hi = T > 0 ? (uintptr_t)(positions + T) : (uintptr_t)positions;
        outs[0].name = "out";
        outs[0].s = sdpa__tensor_span(out);
        SDPA__TRY(sdpa__check_overlaps(FN, in, 1, outs, 1));
    }
    sdpa__ctx ctx; /* the process's conversions (context.c) */
    sdpa__ctx_make_base(&ctx);
    const sdpa__convert *cv = ctx.cv;
    const ptrdiff_t xe = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)x->dtype),
                    oe = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)out->dtype);
    float c[SDPA__ROPE_MAX_HALF], s[SDPA__ROPE_MAX_HALF], buf[ROPE_ROW_MAX];
    for (int64_t t = 0; t < T; ++t) {
        sdpa__rope_angles(&r, positions[t], c, s);
        for (int64_t h = 0; h < H; ++h) {
            const unsigned char *src =
                (const unsigned char *)x->data + (ptrdiff_t)(t * x->strides[0] + h * x->strides[1]) * xe;
            unsigned char *dst =
                (unsigned char *)(void *)out->data + (ptrdiff_t)(t * out->strides[0] + h * out->strides[1]) * oe;
            /* the first chunk holds the rotated part (rotary_dim <= ROPE_ROW_MAX) */
            for (int64_t e0 = 0; e0 < E; e0 += ROPE_ROW_MAX) {
                const int64_t m = E - e0 < ROPE_ROW_MAX ? E - e0 : ROPE_ROW_MAX;
                sdpa__widen_rows(cv, x->dtype, src + (ptrdiff_t)(e0 * x->strides[2]) * xe, 0,
                                 (ptrdiff_t)x->strides[2], 1, m, buf, m);
                if (e0 == 0)
                    sdpa__rope_apply(&r, c, s, buf);
                sdpa__narrow_rows(cv, out->dtype, buf, m, 1, m, dst + (ptrdiff_t)(e0 * out->strides[2]) * oe, 0,
                                  (ptrdiff_t)out->strides[2]);
            }
        }
    }
    return SDPA_OK;
}
