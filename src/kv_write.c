/* sdpa_kv_write / sdpa_kv_write_ex (one implementation): scatter new K/V rows into a block
 * pool by slot index (vLLM reshape_and_cache's slot_mapping contract), converting to the cache
 * dtype through convert.h (round to nearest even; 0.6: q8_0 as ggml's quantize_row_q8_0_ref,
 * FP8 divided by the caller's scale, saturating). The conversions come from the call context
 * (context.c). Validation completes before the first byte is written. */
#include "internal.h"
#include "convert.h"
#include "rope.h"

#include <math.h>
#include <string.h>

/* Elements converted per step: a row is widened to float32, then narrowed to the cache dtype
 * (quantized: q8_0 blocks are independent, and the chunk is a multiple of 32), in pieces of
 * this many elements on the stack (no allocation). */
#define KVW_CHUNK 2048
_Static_assert(2 * SDPA__ROPE_MAX_HALF <= KVW_CHUNK, "a rotated row's pairs must fit in the first chunk");
/* w: the width's name in the messages ("E" for keys, "Ev" for values). */
static sdpa_status check_pair(const char *FN, const sdpa_tensor *cache, const sdpa_tensor *rows, const char *cname,
                              const char *rname, const char *w) {
    sdpa_status st;
    if ((st = sdpa__check_view(cache, FN, cname, 4, 4)) != SDPA_OK) return st;
    if ((st = sdpa__check_dtype_supported(cache, FN, cname, SDPA__DTYPES_KV)) != SDPA_OK) return st;
    if ((st = sdpa__check_view(rows, FN, rname, 3, 3)) != SDPA_OK) return st;
    if ((st = sdpa__check_dtype_supported(rows, FN, rname, SDPA__DTYPES_ALL)) != SDPA_OK) return st;
    if (rows->shape[1] != cache->shape[1] || rows->shape[2] != cache->shape[3])
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s [T, Hkv, %s] = [%lld, %lld, %lld] does not match %s [num_blocks, Hkv, block_size, %s] = [%lld, %lld, %lld, %lld] in Hkv and %s",
                          FN, rname, w, (long long)rows->shape[0], (long long)rows->shape[1], (long long)rows->shape[2],
                          cname, w, (long long)cache->shape[0], (long long)cache->shape[1], (long long)cache->shape[2],
                          (long long)cache->shape[3], w);
    return sdpa__check_output_layout(cache, FN, cname);
}

static bool is_fp8(int dtype) { return dtype == SDPA_DTYPE_FP8_E4M3 || dtype == SDPA_DTYPE_FP8_E5M2; }

/* A write scale (options->k_scale / v_scale) of the FP8 cache `cache`: float32 [1] or [Hkv],
 * every entry finite and > 0 (the rows are divided by it). NULL: 1. */
typedef struct kvw_scale {
    const float *x; /* NULL: 1 */
    ptrdiff_t stride; /* 0 for [1] */
} kvw_scale;

static sdpa_status check_scale(const char *FN, const char *name, const sdpa_tensor *s, const sdpa_tensor *cache,
                               const char *cname, kvw_scale *out) {
    out->x = NULL;
    out->stride = 0;
    if (s == NULL)
        return SDPA_OK;
    if (cache == NULL || !is_fp8(cache->dtype))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: %s is set but %s is %s, not an FP8 cache (scales apply to SDPA_DTYPE_FP8_E4M3 / "
                          "_FP8_E5M2 caches; q8_0 blocks carry their own)",
                          FN, name, cname, cache == NULL ? "NULL" : sdpa_dtype_name((sdpa_dtype)cache->dtype));
    SDPA__TRY(sdpa__check_view(s, FN, name, 1, 1));
    if (s->dtype != SDPA_DTYPE_F32)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: %s.dtype=%s: scales are float32", FN, name,
                          sdpa_dtype_name((sdpa_dtype)s->dtype));
    const int64_t n = s->shape[0], Hkv = cache->shape[1];
    if (n != 1 && n != Hkv)
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[0]=%lld, expected 1 (per tensor) or Hkv=%lld (per kv head)", FN,
                          name, (long long)n, (long long)Hkv);
    const float *x = (const float *)s->data;
    for (int64_t h = 0; h < n; ++h) {
        const float sc = x[h * s->strides[0]];
        if (!(sc > 0.0f) || isinf(sc))
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s[%lld]=%g must be finite and > 0", FN, name,
                              (long long)h, (double)sc);
    }
    out->x = x;
    out->stride = n == 1 ? 0 : s->strides[0];
    return SDPA_OK;
}

/* One side (keys or values) of the write. */
typedef struct kvw_side {
    const sdpa_tensor *cache, *rows;
    kvw_scale scale;
    ptrdiff_t re, ce;     /* bytes of a row element, of a cache storage unit (q8_0: a 34-byte block) */
    int64_t per_unit;     /* elements per cache storage unit (q8_0: 32) */
} kvw_side;

static void side_init(kvw_side *s, const sdpa_tensor *cache, const sdpa_tensor *rows) {
    s->cache = cache;
    s->rows = rows;
    s->re = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)rows->dtype);
    s->ce = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)cache->dtype);
    s->per_unit = cache->dtype == SDPA_DTYPE_Q8_0 ? SDPA__Q8_0_QK : 1;
}

/* Row (t, h) of the side's rows into slot `slot` of head h of its cache: widened to float32
 * chunk by chunk, rotated (rope, keys only: cos_p / sin_p of row t's position), and narrowed (FP8: divided by head h's scale; q8_0: quantized by blocks).
 * Offsets stay signed (ptrdiff_t) down to the pointer: a negative stride of rows moves the
 * pointer down, with no wrap-around of an unsigned offset (undefined behaviour). */
static void put_row(const sdpa__convert *cv, const kvw_side *s, int64_t t, int64_t h, int64_t slot, const sdpa__rope *rope,
                    const float *cos_p, const float *sin_p) {
    const sdpa_tensor *cache = s->cache, *rows = s->rows;
    const int64_t bs = cache->shape[2], n = rows->shape[2];
    const unsigned char *src =
        (const unsigned char *)rows->data + (ptrdiff_t)(t * rows->strides[0] + h * rows->strides[1]) * s->re;
    unsigned char *dst = (unsigned char *)(void *)cache->data +
                         (ptrdiff_t)((slot / bs) * cache->strides[0] + h * cache->strides[1] + (slot % bs) * cache->strides[2]) *
                             s->ce;
    const float scale = s->scale.x != NULL ? s->scale.x[h * s->scale.stride] : 1.0f;
    float tmp[KVW_CHUNK];
    for (int64_t e0 = 0; e0 < n; e0 += KVW_CHUNK) {
        const int64_t m = n - e0 < KVW_CHUNK ? n - e0 : KVW_CHUNK;
        sdpa__widen_rows(cv, rows->dtype, src + (ptrdiff_t)(e0 * rows->strides[2]) * s->re, 0,
                         (ptrdiff_t)rows->strides[2], 1, m, tmp, m);
        if (rope != NULL && e0 == 0) /* rotary_dim <= min(E, KVW_CHUNK): the first chunk holds every pair */
            sdpa__rope_apply(rope, cos_p, sin_p, tmp);
        sdpa__narrow_rows_scaled(cv, cache->dtype, tmp, m, 1, m,
                                 dst + (ptrdiff_t)(e0 / s->per_unit * cache->strides[3]) * s->ce, 0,
                                 (ptrdiff_t)cache->strides[3], scale);
    }
}

/* The v1 (0.6) layout of sdpa_kv_write_options ends with positions. */
#define KVW_OPTIONS_V1_SIZE (offsetof(sdpa_kv_write_options, positions) + sizeof(const int64_t *))

SDPA_API void sdpa_kv_write_options_init_sized(sdpa_kv_write_options *options, size_t struct_size) {
    if (options == NULL || struct_size < sizeof(size_t))
        return;
    memset(options, 0, struct_size);
    options->struct_size = struct_size;
}

static sdpa_status kv_write(const char *FN, const sdpa_tensor *key_cache, const sdpa_tensor *value_cache,
                            const sdpa_tensor *key, const sdpa_tensor *value, const int64_t *slot_mapping,
                            const sdpa_kv_write_options *options) {
    sdpa__clear_error();
    sdpa_status st;
    sdpa_kv_write_options o;
    memset(&o, 0, sizeof o);
    if (options != NULL)
        SDPA__TRY(sdpa__read_versioned(FN, "options", "sdpa_kv_write_options", options, KVW_OPTIONS_V1_SIZE, &o,
                                       sizeof o));
    if (key_cache == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key_cache is NULL", FN);
    if (key == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key is NULL", FN);
    if ((value_cache == NULL) != (value == NULL))
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: value_cache and value must both be given or both be NULL", FN);
    if ((st = check_pair(FN, key_cache, key, "key_cache", "key", "E")) != SDPA_OK) return st;
    const int64_t T = key->shape[0];
    if (value != NULL) {
        if ((st = check_pair(FN, value_cache, value, "value_cache", "value", "Ev")) != SDPA_OK) return st;
        if (value->shape[0] != T)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: value.shape[0]=%lld does not match key.shape[0]=%lld (rows T)", FN,
                              (long long)value->shape[0], (long long)T);
        if (value_cache->shape[0] != key_cache->shape[0] || value_cache->shape[2] != key_cache->shape[2])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: value_cache [num_blocks, block_size] = [%lld, %lld] does not match key_cache's [%lld, %lld]",
                              FN, (long long)value_cache->shape[0], (long long)value_cache->shape[2],
                              (long long)key_cache->shape[0], (long long)key_cache->shape[2]);
    }
    kvw_side sk, sv;
    side_init(&sk, key_cache, key);
    if (value != NULL)
        side_init(&sv, value_cache, value);
    SDPA__TRY(check_scale(FN, "options->k_scale", o.k_scale, key_cache, "key_cache", &sk.scale));
    SDPA__TRY(check_scale(FN, "options->v_scale", o.v_scale, value_cache, "value_cache", &sv.scale));
    if ((o.rope == NULL) != (o.positions == NULL))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: options->rope is %s but options->positions is %s: positions come with rope (the key "
                          "rows' positions), and only with it",
                          FN, o.rope ? "set" : "NULL", o.positions ? "set" : "NULL");
    if (o.rope != NULL && T > 0)
        SDPA__TRY(sdpa__check_aligned(FN, "options->positions", o.positions, sizeof(int64_t)));
    if (T > 0 && slot_mapping == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: slot_mapping is NULL", FN);
    if (T > 0 && (st = sdpa__check_aligned(FN, "slot_mapping", slot_mapping, sizeof(int64_t))) != SDPA_OK)
        return st;
    int64_t nslots;
    if (sdpa__mul_overflow(key_cache->shape[0], key_cache->shape[2], &nslots))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: num_blocks x block_size overflows", FN);
    /* Overlaps: the caches are written; rows, slot_mapping, scales and the other cache must not
     * share bytes with them. */
    sdpa__named_span in[7], outs[2];
    int nin = 0, nout = 0;
    in[nin].name = "key"; in[nin++].s = sdpa__tensor_span(key);
    if (value) { in[nin].name = "value"; in[nin++].s = sdpa__tensor_span(value); }
    in[nin].name = "slot_mapping";
    in[nin].s.lo = (uintptr_t)slot_mapping;
    in[nin++].s.hi = T > 0 ? (uintptr_t)(slot_mapping + T) : (uintptr_t)slot_mapping;
    if (o.k_scale) { in[nin].name = "options->k_scale"; in[nin++].s = sdpa__tensor_span(o.k_scale); }
    if (o.v_scale) { in[nin].name = "options->v_scale"; in[nin++].s = sdpa__tensor_span(o.v_scale); }
    if (o.positions != NULL) {
        in[nin].name = "options->positions";
        in[nin].s.lo = (uintptr_t)o.positions;
        in[nin++].s.hi = (uintptr_t)(o.positions + T);
    }
    outs[nout].name = "key_cache"; outs[nout++].s = sdpa__tensor_span(key_cache);
    if (value_cache) { outs[nout].name = "value_cache"; outs[nout++].s = sdpa__tensor_span(value_cache); }
    if ((st = sdpa__check_overlaps(FN, in, nin, outs, nout)) != SDPA_OK) return st;
    sdpa__rope rope; /* the rope params and every position, before anything is written */
    double inv_freq[SDPA__ROPE_MAX_HALF];
    if (o.rope != NULL)
        SDPA__TRY(sdpa__rope_prepare(FN, o.rope, key->shape[2], T, o.positions, &rope, inv_freq));
    for (int64_t t = 0; t < T; ++t)
        if (slot_mapping[t] >= nslots)
            return sdpa__fail(SDPA_ERR_INDEX,
                              "%s: slot_mapping[%lld]=%lld is outside [0, num_blocks x block_size = %lld x %lld) (negative = skip)",
                              FN, (long long)t, (long long)slot_mapping[t], (long long)key_cache->shape[0],
                              (long long)key_cache->shape[2]);
    sdpa__ctx ctx; /* the process's conversions (context.c) */
    sdpa__ctx_make_base(&ctx);
    const sdpa__convert *cv = ctx.cv;
    const int64_t H = key->shape[1];
    float cos_p[SDPA__ROPE_MAX_HALF], sin_p[SDPA__ROPE_MAX_HALF];
    const sdpa__rope *kr = o.rope != NULL ? &rope : NULL;
    for (int64_t t = 0; t < T; ++t) {
        if (slot_mapping[t] < 0)
            continue;
        if (kr != NULL) /* the angles of row t's position, once for all its heads */
            sdpa__rope_angles(kr, o.positions[t], cos_p, sin_p);
        for (int64_t h = 0; h < H; ++h) {
            put_row(cv, &sk, t, h, slot_mapping[t], kr, cos_p, sin_p);
            if (value)
                put_row(cv, &sv, t, h, slot_mapping[t], NULL, NULL, NULL);
        }
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_kv_write(const sdpa_tensor *key_cache, const sdpa_tensor *value_cache, const sdpa_tensor *key,
                                   const sdpa_tensor *value, const int64_t *slot_mapping) {
    return kv_write("sdpa_kv_write", key_cache, value_cache, key, value, slot_mapping, NULL);
}

SDPA_API sdpa_status sdpa_kv_write_ex(const sdpa_tensor *key_cache, const sdpa_tensor *value_cache,
                                      const sdpa_tensor *key, const sdpa_tensor *value, const int64_t *slot_mapping,
                                      const sdpa_kv_write_options *options) {
    return kv_write("sdpa_kv_write_ex", key_cache, value_cache, key, value, slot_mapping, options);
}
