/* Versioned structs: the ONE reader of caller structs that start with struct_size
 * (sdpa_options here; sdpa_mha_params and sdpa_mha_options through the same function from
 * mha.c), sdpa_options' defaults, and its range checks that need no shapes. */
#include "internal.h"

#include <math.h>
#include <string.h>

/* The v1 layout of sdpa_options ends with workspace_bytes; struct_size may not be smaller. */
#define SDPA__OPTIONS_V1_SIZE (offsetof(sdpa_options, workspace_bytes) + sizeof(size_t))
#define SDPA__STRUCT_SIZE_MAX 4096

sdpa_status sdpa__read_versioned(const char *fn, const char *what, const char *init_name, const void *in,
                                 size_t v1_size, void *dst, size_t dst_size) {
    size_t sz;
    memcpy(&sz, in, sizeof sz);
    if (sz < v1_size)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                          "%s: %s->struct_size=%zu is smaller than the version-1 size %zu (call %s_init())", fn, what,
                          sz, v1_size, init_name);
    if (sz > SDPA__STRUCT_SIZE_MAX)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION, "%s: %s->struct_size=%zu is larger than %d", fn, what, sz,
                          SDPA__STRUCT_SIZE_MAX);
    /* Every sizeof of a released layout is a multiple of the struct's alignment (>= that of
     * its first member, size_t); any other size ends inside a field (half a pointer read as a
     * pointer would crash), so it is refused, not truncated. */
    if (sz % _Alignof(size_t) != 0)
        return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                          "%s: %s->struct_size=%zu is not a multiple of %zu (every layout's sizeof is: such a "
                          "size ends inside a field; call %s_init())",
                          fn, what, sz, (size_t)_Alignof(size_t), init_name);
    memcpy(dst, in, sz < dst_size ? sz : dst_size);
    const unsigned char *bytes = (const unsigned char *)in;
    for (size_t b = dst_size; b < sz; ++b)
        if (bytes[b] != 0)
            return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                              "%s: %s byte %zu is beyond what libsdpa %s knows (%zu bytes) and is not 0", fn, what, b,
                              SDPA_VERSION_STRING, dst_size);
    return SDPA_OK;
}

sdpa_status sdpa__check_reserved(const char *fn, const char *field, int64_t value) {
    if (value == 0)
        return SDPA_OK;
    return sdpa__fail(SDPA_ERR_STRUCT_VERSION,
                      "%s: %s=%lld is not 0: it is reserved for a later version of libsdpa (this is %s)", fn, field,
                      (long long)value, SDPA_VERSION_STRING);
}

SDPA_API void sdpa_options_init_sized(sdpa_options *options, size_t struct_size) {
    if (options == NULL || struct_size < sizeof(size_t))
        return;
    sdpa_options d;
    memset(&d, 0, sizeof d);
    d.struct_size = struct_size;
    d.alignment = SDPA_ALIGN_TOP_LEFT;
    d.window_left = -1;
    d.window_right = -1;
    d.empty_rows = SDPA_EMPTY_ROWS_ERROR;
    d.weights_stage = SDPA_WEIGHTS_PROBABILITIES;
    const size_t n = struct_size < sizeof d ? struct_size : sizeof d;
    memcpy(options, &d, n);
    if (struct_size > n)
        memset((unsigned char *)options + n, 0, struct_size - n);
}

sdpa_status sdpa__options_read(const char *fn, const sdpa_options *in, sdpa_options *o) {
    sdpa_options_init_sized(o, sizeof *o);
    if (in == NULL)
        return SDPA_OK;
    sdpa_status st = sdpa__read_versioned(fn, "options", "sdpa_options", in, SDPA__OPTIONS_V1_SIZE, o, sizeof *o);
    if (st != SDPA_OK)
        return st;
    SDPA__TRY(sdpa__check_reserved(fn, "options->reserved0", o->reserved0));
    return sdpa__check_reserved(fn, "options->reserved1", o->reserved1);
}

sdpa_status sdpa__options_check(const char *fn, const sdpa_options *o) {
    if (!(o->scale >= 0.0f) || isinf(o->scale))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->scale=%g must be finite and >= 0 (0 = 1/sqrt(E))",
                          fn, (double)o->scale);
    if (!(o->softcap >= 0.0f) || isinf(o->softcap))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->softcap=%g must be finite and >= 0 (0 = off)", fn,
                          (double)o->softcap);
    if (o->causal != 0 && o->causal != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->causal=%d must be 0 or 1", fn, (int)o->causal);
    if (o->alignment != SDPA_ALIGN_TOP_LEFT && o->alignment != SDPA_ALIGN_BOTTOM_RIGHT &&
        o->alignment != SDPA_ALIGN_OFFSETS)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->alignment=%d is not an sdpa_alignment", fn,
                          (int)o->alignment);
    if (o->sliding_window == 1 && (o->window_left < -1 || o->window_right < -1)) /* else ignored (header) */
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->window_left=%lld, window_right=%lld must be >= -1",
                          fn, (long long)o->window_left, (long long)o->window_right);
    if (o->empty_rows != SDPA_EMPTY_ROWS_ERROR && o->empty_rows != SDPA_EMPTY_ROWS_ZERO)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->empty_rows=%d is not an sdpa_empty_rows", fn,
                          (int)o->empty_rows);
    if (o->weights_stage < SDPA_WEIGHTS_PROBABILITIES || o->weights_stage > SDPA_WEIGHTS_MASKED)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->weights_stage=%d is not an sdpa_weights_stage", fn,
                          (int)o->weights_stage);
    if (o->num_threads < 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->num_threads=%d must be >= 0", fn, (int)o->num_threads);
    if (o->sliding_window != 0 && o->sliding_window != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->sliding_window=%d must be 0 or 1", fn,
                          (int)o->sliding_window);
    if (o->skip_finite_check != 0 && o->skip_finite_check != 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->skip_finite_check=%d must be 0 or 1", fn,
                          (int)o->skip_finite_check);
    if (!(o->dropout_p >= 0.0f && o->dropout_p < 1.0f))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->dropout_p=%g must be in [0, 1)", fn,
                          (double)o->dropout_p);
    if (o->kernel < SDPA_KERNEL_AUTO || o->kernel > SDPA_KERNEL_DECODE)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->kernel=%d is not an sdpa_kernel", fn, (int)o->kernel);
    if (o->precision < SDPA_PRECISION_DEFAULT || o->precision > SDPA_PRECISION_REDUCED)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->precision=%d is not an sdpa_precision", fn,
                          (int)o->precision);
    if (o->alibi_slopes_rank < 0 || o->alibi_slopes_rank > 2 || (o->alibi_slopes != NULL) != (o->alibi_slopes_rank != 0))
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: options->alibi_slopes_rank=%d with alibi_slopes %s: the rank must be 1 ([Hq]) or 2 "
                          "([B, Hq]) with slopes, 0 without",
                          fn, (int)o->alibi_slopes_rank, o->alibi_slopes != NULL ? "set" : "NULL");
    if (o->parallel_for != NULL && o->threadpool != NULL)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->parallel_for and options->threadpool are both set", fn);
    if (o->parallel_for != NULL && o->parallel_for_threads < 1)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: options->parallel_for_threads=%d must be >= 1 with a hook", fn,
                          (int)o->parallel_for_threads);
    if (o->cu_seqlens_q == NULL && o->cu_seqlens_k != NULL)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: options->cu_seqlens_k is set but cu_seqlens_q is NULL (cu_seqlens_k describes the keys "
                          "of a packed batch; a padded batch gives key_lengths)",
                          fn);
    return SDPA_OK;
}

/* One scale view (name "options->k_scale") of an FP8 view w (its dtype): shape [1] or [Hkv]. */
static sdpa_status kv_scale(const char *fn, const char *name, const char *of, const sdpa_tensor *t, int64_t Hkv,
                            sdpa__view4 *w) {
    w->scale = NULL;
    w->scale_stride = 0;
    if (t == NULL)
        return SDPA_OK;
    if (w->dtype != SDPA_DTYPE_FP8_E4M3 && w->dtype != SDPA_DTYPE_FP8_E5M2)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT,
                          "%s: %s is set but %s.dtype=%s is not an FP8 dtype (scales apply to SDPA_DTYPE_FP8_E4M3 / "
                          "_FP8_E5M2 caches; q8_0 blocks carry their own)",
                          fn, name, of, sdpa_dtype_name((sdpa_dtype)w->dtype));
    SDPA__TRY(sdpa__check_view(t, fn, name, 1, 1));
    if (t->dtype != SDPA_DTYPE_F32)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: %s.dtype=%s: scales are float32", fn, name,
                          sdpa_dtype_name((sdpa_dtype)t->dtype));
    const int64_t n = t->shape[0];
    if (n != 1 && n != Hkv)
        return sdpa__fail(SDPA_ERR_SHAPE,
                          "%s: %s.shape[0]=%lld, expected 1 (per tensor) or Hkv=%lld (per kv head); per-token scales "
                          "are not taken",
                          fn, name, (long long)n, (long long)Hkv);
    const float *x = (const float *)t->data;
    for (int64_t h = 0; h < n; ++h) {
        const float sc = x[h * t->strides[0]];
        if (!(sc >= 0.0f) || isinf(sc))
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s[%lld]=%g must be finite and >= 0", fn, name,
                              (long long)h, (double)sc);
    }
    w->scale = x;
    w->scale_stride = n == 1 ? 0 : t->strides[0];
    return SDPA_OK;
}

sdpa_status sdpa__options_kv_scales(const char *fn, const sdpa_options *o, int64_t Hkv, sdpa__view4 *k, sdpa__view4 *v) {
    SDPA__TRY(kv_scale(fn, "options->k_scale", "key", o->k_scale, Hkv, k));
    return kv_scale(fn, "options->v_scale", "value", o->v_scale, Hkv, v);
}
