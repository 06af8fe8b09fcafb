/* sdpa_kv_write: scatter new K/V rows into a block pool by slot index (vLLM
 * reshape_and_cache's slot_mapping contract), converting to the cache dtype through
 * convert.h (round to nearest even). Validation completes before the first byte is written. */
#include "internal.h"
#include "convert.h"

static const char FN[] = "sdpa_kv_write";

/* Chunk of converted elements per step: rows are widened to f32 then narrowed to the cache
 * dtype in pieces of this many elements (no allocation). */
#define KVW_CHUNK 256

/* w: the width's name in the messages ("E" for keys, "Ev" for values). */
static sdpa_status check_pair(const sdpa_tensor *cache, const sdpa_tensor *rows, const char *cname, const char *rname,
                              const char *w) {
    sdpa_status st;
    if ((st = sdpa__check_view(cache, FN, cname, 4, 4)) != SDPA_OK) return st;
    if ((st = sdpa__check_dtype_supported(cache, FN, cname, SDPA__DTYPES_ALL)) != SDPA_OK) return st;
    if ((st = sdpa__check_view(rows, FN, rname, 3, 3)) != SDPA_OK) return st;
    if ((st = sdpa__check_dtype_supported(rows, FN, rname, SDPA__DTYPES_ALL)) != SDPA_OK) return st;
    if (rows->shape[1] != cache->shape[1] || rows->shape[2] != cache->shape[3])
        return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s [T, Hkv, %s] = [%lld, %lld, %lld] does not match %s [num_blocks, Hkv, block_size, %s] = [%lld, %lld, %lld, %lld] in Hkv and %s",
                          FN, rname, w, (long long)rows->shape[0], (long long)rows->shape[1], (long long)rows->shape[2],
                          cname, w, (long long)cache->shape[0], (long long)cache->shape[1], (long long)cache->shape[2],
                          (long long)cache->shape[3], w);
    return sdpa__check_output_layout(cache, FN, cname);
}

/* Row (t, h) of rows into slot s of (h) of cache, converted. Offsets stay signed (ptrdiff_t)
 * down to the pointer: a negative stride of rows moves the pointer down, with no wrap-around
 * of an unsigned offset (undefined behaviour). */
static void put_row(const sdpa__convert *cv, const sdpa_tensor *cache, const sdpa_tensor *rows, int64_t t, int64_t h,
                    int64_t slot) {
    const int64_t bs = cache->shape[2], n = rows->shape[2];
    const ptrdiff_t re = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)rows->dtype),
                    ce = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)cache->dtype);
    const unsigned char *src = (const unsigned char *)rows->data + (ptrdiff_t)(t * rows->strides[0] + h * rows->strides[1]) * re;
    unsigned char *dst = (unsigned char *)(void *)cache->data +
                         (ptrdiff_t)((slot / bs) * cache->strides[0] + h * cache->strides[1] + (slot % bs) * cache->strides[2]) * ce;
    float tmp[KVW_CHUNK];
    for (int64_t e0 = 0; e0 < n; e0 += KVW_CHUNK) {
        const int64_t m = n - e0 < KVW_CHUNK ? n - e0 : KVW_CHUNK;
        sdpa__widen_rows(cv, rows->dtype, src + (ptrdiff_t)(e0 * rows->strides[2]) * re, 0, (ptrdiff_t)rows->strides[2], 1,
                         m, tmp, m);
        sdpa__narrow_rows(cv, cache->dtype, tmp, m, 1, m, dst + (ptrdiff_t)(e0 * cache->strides[3]) * ce, 0,
                          (ptrdiff_t)cache->strides[3]);
    }
}

SDPA_API sdpa_status sdpa_kv_write(const sdpa_tensor *key_cache, const sdpa_tensor *value_cache, const sdpa_tensor *key,
                                   const sdpa_tensor *value, const int64_t *slot_mapping) {
    sdpa__clear_error();
    sdpa_status st;
    if (key_cache == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key_cache is NULL", FN);
    if (key == NULL) return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: key is NULL", FN);
    if ((value_cache == NULL) != (value == NULL))
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: value_cache and value must both be given or both be NULL", FN);
    if ((st = check_pair(key_cache, key, "key_cache", "key", "E")) != SDPA_OK) return st;
    const int64_t T = key->shape[0];
    if (value != NULL) {
        if ((st = check_pair(value_cache, value, "value_cache", "value", "Ev")) != SDPA_OK) return st;
        if (value->shape[0] != T)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: value.shape[0]=%lld does not match key.shape[0]=%lld (rows T)", FN,
                              (long long)value->shape[0], (long long)T);
        if (value_cache->shape[0] != key_cache->shape[0] || value_cache->shape[2] != key_cache->shape[2])
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: value_cache [num_blocks, block_size] = [%lld, %lld] does not match key_cache's [%lld, %lld]",
                              FN, (long long)value_cache->shape[0], (long long)value_cache->shape[2],
                              (long long)key_cache->shape[0], (long long)key_cache->shape[2]);
    }
    if (T > 0 && slot_mapping == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: slot_mapping is NULL", FN);
    if (T > 0 && (st = sdpa__check_aligned(FN, "slot_mapping", slot_mapping, sizeof(int64_t))) != SDPA_OK)
        return st;
    int64_t nslots;
    if (sdpa__mul_overflow(key_cache->shape[0], key_cache->shape[2], &nslots))
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: num_blocks x block_size overflows", FN);
    /* Overlaps: the caches are written; rows, slot_mapping and the other cache must not share bytes with them. */
    sdpa__named_span in[3], outs[2];
    int nin = 0, nout = 0;
    in[nin].name = "key"; in[nin++].s = sdpa__tensor_span(key);
    if (value) { in[nin].name = "value"; in[nin++].s = sdpa__tensor_span(value); }
    in[nin].name = "slot_mapping";
    in[nin].s.lo = (uintptr_t)slot_mapping;
    in[nin++].s.hi = T > 0 ? (uintptr_t)(slot_mapping + T) : (uintptr_t)slot_mapping;
    outs[nout].name = "key_cache"; outs[nout++].s = sdpa__tensor_span(key_cache);
    if (value_cache) { outs[nout].name = "value_cache"; outs[nout++].s = sdpa__tensor_span(value_cache); }
    if ((st = sdpa__check_overlaps(FN, in, nin, outs, nout)) != SDPA_OK) return st;
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
    for (int64_t t = 0; t < T; ++t) {
        if (slot_mapping[t] < 0)
            continue;
        for (int64_t h = 0; h < H; ++h) {
            put_row(cv, key_cache, key, t, h, slot_mapping[t]);
            if (value)
                put_row(cv, value_cache, value, t, h, slot_mapping[t]);
        }
    }
    return SDPA_OK;
}
