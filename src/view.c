/* View constructors and validation: dtype, rank, shape, broadcast, strides, overlap, overflow. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

bool sdpa__mul_overflow(int64_t a, int64_t b, int64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

bool sdpa__add_overflow(int64_t a, int64_t b, int64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* Largest byte span we accept: fits ptrdiff_t and size_t with room for pointer arithmetic. */
#define SDPA__MAX_SPAN_BYTES ((int64_t)(PTRDIFF_MAX / 2))

void sdpa__storage_shape(int32_t dtype, int32_t rank, const int64_t *shape, int64_t *out) {
    for (int32_t d = 0; d < rank; ++d)
        out[d] = shape[d];
    if (dtype == SDPA_DTYPE_Q8_0 && rank >= 1)
        if (shape[rank - 1] >= 0) /* (a negative size stays as it is, for the geometry's message) */
            out[rank - 1] = shape[rank - 1] / SDPA_Q8_0_BLOCK; /* exact: view validation checks it */
}

sdpa_status sdpa__check_geometry(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                                 const int64_t *strides, size_t elem) {
    int64_t numel = 1, span = 0;
    for (int32_t d = 0; d < rank; ++d) {
        if (shape[d] < 0)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: %s.shape[%d]=%lld is negative", fn, name, (int)d,
                              (long long)shape[d]);
        if (sdpa__mul_overflow(numel, shape[d], &numel))
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: %s has more elements than int64_t holds", fn,
                              name);
    }
    if (numel == 0)
        return SDPA_OK;
    for (int32_t d = 0; d < rank; ++d) {
        int64_t st = strides[d], term;
        if (st == INT64_MIN)
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: %s.strides[%d] overflows", fn, name, (int)d);
        if (st < 0)
            st = -st;
        if (sdpa__mul_overflow(shape[d] - 1, st, &term) || sdpa__add_overflow(span, term, &span))
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: %s spans more elements than int64_t holds", fn,
                              name);
    }
    int64_t bytes;
    if (sdpa__add_overflow(span, 1, &span) || sdpa__mul_overflow(span, (int64_t)elem, &bytes) ||
        bytes > SDPA__MAX_SPAN_BYTES)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: %s spans more bytes than memory can hold", fn,
                          name);
    return SDPA_OK;
}

/* A view's extent in elements around data: `below` (reached through negative strides) and
 * `above` (through positive ones, its last element included, so >= 1). False for an empty view,
 * checked first: its other sizes and strides were never bounded (sdpa__check_geometry returns
 * early), so nothing is multiplied. For a non-empty view that passed sdpa__check_geometry both
 * fit int64. */
static bool extent_of(int32_t rank, const int64_t *shape, const int64_t *strides, int64_t *below, int64_t *above) {
    for (int32_t d = 0; d < rank; ++d)
        if (shape[d] == 0)
            return false;
    *below = 0;
    *above = 1;
    for (int32_t d = 0; d < rank; ++d) {
        if (strides[d] < 0)
            *below += (shape[d] - 1) * -strides[d];
        else
            *above += (shape[d] - 1) * strides[d];
    }
    return true;
}

/* After sdpa__check_geometry: the addresses of a non-empty view, from its lowest element (below
 * data with negative strides) to the end of its highest, must not wrap around the address space
 * (no object lies across address 0; reading such a view would touch addresses far from data). */
static sdpa_status check_address_range(const char *fn, const char *name, const void *data, int32_t rank,
                                       const int64_t *shape, const int64_t *strides, size_t elem) {
    int64_t below, above;
    if (!extent_of(rank, shape, strides, &below, &above))
        return SDPA_OK;
    const uintptr_t base = (uintptr_t)data, lo = (uintptr_t)below * elem, hi = (uintptr_t)above * elem;
    if (base < lo)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW,
                          "%s: %s reaches %llu bytes below data=%p (negative strides), below address 0: no object "
                          "spans that",
                          fn, name, (unsigned long long)lo, data);
    if (base > UINTPTR_MAX - hi)
        return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW,
                          "%s: %s reaches %llu bytes above data=%p, past the end of the address space", fn, name,
                          (unsigned long long)hi, data);
    return SDPA_OK;
}

/* 0.6: the data of a non-empty view must be aligned to its element size (include/sdpa.h,
 * sdpa_tensor): loaders and write-backs read and store elements through typed pointers. */
static sdpa_status check_data_aligned(const char *fn, const char *name, const void *data, int32_t rank,
                                      const int64_t *shape, size_t elem) {
    for (int32_t d = 0; d < rank; ++d)
        if (shape[d] == 0)
            return SDPA_OK; /* nothing is read or written through an empty view */
    return sdpa__check_aligned(fn, name, data, elem);
}

sdpa_status sdpa__check_aligned(const char *fn, const char *name, const void *ptr, size_t align) {
    if (ptr == NULL || align <= 1 || (uintptr_t)ptr % align == 0)
        return SDPA_OK;
    return sdpa__fail(SDPA_ERR_ALIGNMENT,
                      "%s: %s data=%p is not aligned to its element size of %zu bytes (address %% %zu = %zu); "
                      "libsdpa reads and writes elements through typed pointers: pass an aligned buffer",
                      fn, name, ptr, align, align, (size_t)((uintptr_t)ptr % align));
}

sdpa_status sdpa__check_tensor(const sdpa_tensor *t, const char *fn, const char *name,
                               int32_t rank_min, int32_t rank_max) {
    sdpa_status st = sdpa__check_view(t, fn, name, rank_min, rank_max);
    if (st != SDPA_OK)
        return st;
    return sdpa__check_dtype_supported(t, fn, name, SDPA__DTYPES_F32);
}

sdpa_status sdpa__check_output_layout(const sdpa_tensor *t, const char *fn, const char *name) {
    int order[SDPA_MAX_RANK];
    int n = 0;
    int64_t shape[SDPA_MAX_RANK]; /* in storage units (q8_0: blocks on the last axis) */
    sdpa__storage_shape(t->dtype, t->rank, t->shape, shape);
    for (int d = 0; d < t->rank; ++d)
        if (shape[d] == 0)
            return SDPA_OK; /* empty: nothing is written, whatever the strides of the other dims */
    for (int d = 0; d < t->rank; ++d) {
        if (shape[d] == 1)
            continue;
        if (t->strides[d] <= 0)
            return sdpa__fail(SDPA_ERR_STRIDE, "%s: %s.strides[%d]=%lld must be > 0 on an output (shape[%d]=%lld)",
                              fn, name, d, (long long)t->strides[d], d, (long long)t->shape[d]);
        order[n++] = d;
    }
    /* Insertion sort of the non-trivial dims by stride; each stride must clear the
     * extent of all dims inside it, so no two indices share an address. */
    for (int a = 1; a < n; ++a) {
        int x = order[a], b = a - 1;
        while (b >= 0 && t->strides[order[b]] > t->strides[x]) {
            order[b + 1] = order[b];
            --b;
        }
        order[b + 1] = x;
    }
    int64_t extent = 1; /* elements covered by the dims inside the current one */
    for (int a = 0; a < n; ++a) {
        int d = order[a];
        if (t->strides[d] < extent)
            return sdpa__fail(SDPA_ERR_STRIDE, "%s: %s overlaps itself: strides[%d]=%lld is smaller than the extent %lld of the dims inside it",
                              fn, name, d, (long long)t->strides[d], (long long)extent);
        extent += (shape[d] - 1) * t->strides[d];
    }
    return SDPA_OK;
}

static sdpa__span span_of(const void *data, int32_t rank, const int64_t *shape, const int64_t *strides,
                          size_t elem) {
    sdpa__span s = {0, 0};
    int64_t below, above;
    if (!extent_of(rank, shape, strides, &below, &above))
        return s; /* empty */
    const uintptr_t base = (uintptr_t)data;
    s.lo = base - (uintptr_t)below * elem;
    s.hi = base + (uintptr_t)above * elem;
    return s;
}

sdpa__span sdpa__tensor_span(const sdpa_tensor *t) {
    int64_t shape[SDPA_MAX_RANK];
    const int32_t rank = t->rank >= 1 && t->rank <= SDPA_MAX_RANK ? t->rank : 0;
    sdpa__storage_shape(t->dtype, rank, t->shape, shape);
    return span_of(t->data, rank, shape, t->strides, sdpa_dtype_size((sdpa_dtype)t->dtype));
}

sdpa__span sdpa__mask_span(const sdpa_allow_mask *m) {
    return span_of(m->data, m->rank, m->shape, m->strides, 1);
}

bool sdpa__spans_overlap(sdpa__span a, sdpa__span b) {
    if (a.lo == a.hi || b.lo == b.hi)
        return false;
    return a.lo < b.hi && b.lo < a.hi;
}

sdpa_status sdpa__check_overlaps(const char *fn, const sdpa__named_span *in, int nin, const sdpa__named_span *outs,
                                int nout) {
    for (int a = 0; a < nout; ++a) {
        for (int b = 0; b < nin; ++b)
            if (sdpa__spans_overlap(outs[a].s, in[b].s))
                return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s (written) overlaps input %s", fn, outs[a].name, in[b].name);
        for (int b = a + 1; b < nout; ++b)
            if (sdpa__spans_overlap(outs[a].s, outs[b].s))
                return sdpa__fail(SDPA_ERR_OVERLAP, "%s: %s overlaps %s (both written)", fn, outs[a].name,
                                  outs[b].name);
    }
    return SDPA_OK;
}

sdpa_status sdpa__broadcast4(const char *fn, const char *name, int32_t rank, const int64_t *shape,
                             const int64_t *strides, const int64_t target[4], int64_t out_strides[4]) {
    static const char *const axis[4] = {"B", "Hq", "L", "S"};
    for (int d = 0; d < 4; ++d)
        out_strides[d] = 0;
    for (int32_t r = 0; r < rank; ++r) {
        int d = 4 - rank + r;
        if (shape[r] == target[d]) {
            out_strides[d] = target[d] == 1 ? 0 : strides[r];
        } else if (shape[r] == 1) {
            out_strides[d] = 0;
        } else {
            return sdpa__fail(SDPA_ERR_BROADCAST,
                              "%s: %s.shape[%d]=%lld cannot broadcast to %s=%lld of [B, Hq, L, S]", fn,
                              name, (int)r, (long long)shape[r], axis[d], (long long)target[d]);
        }
    }
    return SDPA_OK;
}

/* Row-major strides for `shape` (elements of `elem` bytes), checked for overflow. */
static sdpa_status contiguous_strides(const char *fn, const char *name, int32_t rank, int32_t max_rank,
                                      const int64_t *shape, size_t elem, int64_t *strides) {
    if (shape == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: shape is NULL", fn);
    if (rank < 1 || rank > max_rank)
        return sdpa__fail(SDPA_ERR_RANK, "%s: rank=%d, expected 1..%d", fn, (int)rank, (int)max_rank);
    int64_t acc = 1;
    for (int32_t d = rank - 1; d >= 0; --d) {
        if (shape[d] < 0)
            return sdpa__fail(SDPA_ERR_SHAPE, "%s: shape[%d]=%lld is negative", fn, (int)d, (long long)shape[d]);
        strides[d] = acc;
        if (sdpa__mul_overflow(acc, shape[d] > 0 ? shape[d] : 1, &acc))
            return sdpa__fail(SDPA_ERR_SIZE_OVERFLOW, "%s: the shape has more elements than int64_t holds", fn);
    }
    return sdpa__check_geometry(fn, name, rank, shape, strides, elem);
}

sdpa_status sdpa__check_mask(const char *fn, const char *name, const sdpa_allow_mask *m) {
    if (m->rank < 1 || m->rank > SDPA_MASK_MAX_RANK)
        return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d, expected 1..4", fn, name, (int)m->rank);
    if (m->reserved0 != 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s.reserved0 must be 0", fn, name);
    for (int32_t d = m->rank; d < SDPA_MASK_MAX_RANK; ++d)
        if (m->shape[d] != 0 || m->strides[d] != 0)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s.shape[%d] and strides[%d] are beyond rank=%d and must be 0",
                              fn, name, (int)d, (int)d, (int)m->rank);
    sdpa_status st = sdpa__check_geometry(fn, name, m->rank, m->shape, m->strides, 1);
    if (st != SDPA_OK)
        return st;
    int64_t numel = 1;
    for (int32_t d = 0; d < m->rank; ++d)
        numel *= m->shape[d];
    if (numel > 0 && m->data == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s.data is NULL", fn, name);
    return check_address_range(fn, name, m->data, m->rank, m->shape, m->strides, 1);
}

static sdpa_status init_contiguous(const char *fn, sdpa_tensor *view, const void *data, sdpa_dtype dtype, int32_t rank,
                                   const int64_t *shape);

SDPA_API sdpa_status sdpa_tensor_init(sdpa_tensor *view, float *data, int32_t rank, const int64_t *shape) {
    sdpa__clear_error();
    return init_contiguous("sdpa_tensor_init", view, data, SDPA_DTYPE_F32, rank, shape);
}

SDPA_API sdpa_status sdpa_tensor_init_4d(sdpa_tensor *view, float *data, int64_t d0, int64_t d1, int64_t d2,
                                         int64_t d3) {
    const int64_t shape[4] = {d0, d1, d2, d3};
    return sdpa_tensor_init(view, data, 4, shape);
}

SDPA_API sdpa_status sdpa_tensor_init_3d(sdpa_tensor *view, float *data, int64_t d0, int64_t d1, int64_t d2) {
    const int64_t shape[3] = {d0, d1, d2};
    return sdpa_tensor_init(view, data, 3, shape);
}

SDPA_API sdpa_status sdpa_allow_mask_init(sdpa_allow_mask *mask, const uint8_t *data, int32_t rank,
                                          const int64_t *shape) {
    static const char fn[] = "sdpa_allow_mask_init";
    int64_t strides[SDPA_MASK_MAX_RANK];
    sdpa__clear_error();
    if (mask == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: mask is NULL", fn);
    memset(mask, 0, sizeof *mask);
    sdpa_status st = contiguous_strides(fn, "mask", rank, SDPA_MASK_MAX_RANK, shape, 1, strides);
    if (st != SDPA_OK)
        return st;
    int64_t numel = 1;
    for (int32_t d = 0; d < rank; ++d)
        numel *= shape[d];
    if (data == NULL && numel > 0)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: data is NULL but the mask has %lld elements", fn,
                          (long long)numel);
    mask->data = data;
    mask->rank = rank;
    for (int32_t d = 0; d < rank; ++d) {
        mask->shape[d] = shape[d];
        mask->strides[d] = strides[d];
    }
    return SDPA_OK;
}

/* The frozen public layouts (LP64). A change here is an ABI break: bump SDPA_VERSION_MAJOR. */
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(sizeof(sdpa_tensor) == 160, "sdpa_tensor layout is frozen");
_Static_assert(sizeof(sdpa_allow_mask) == 80, "sdpa_allow_mask layout is frozen");
_Static_assert(offsetof(sdpa_options, workspace_bytes) == 128, "sdpa_options v1 layout is frozen");
#endif

/* ------------------------------------------------------------ dtypes (0.4) */

SDPA_API size_t sdpa_dtype_size(sdpa_dtype dtype) {
    switch (dtype) {
    case SDPA_DTYPE_F32: return 4;
    case SDPA_DTYPE_F16: return 2;
    case SDPA_DTYPE_BF16: return 2;
    case SDPA_DTYPE_Q8_0: return SDPA_Q8_0_BLOCK_BYTES; /* one block of 32 (the storage unit) */
    case SDPA_DTYPE_FP8_E4M3: return 1;
    case SDPA_DTYPE_FP8_E5M2: return 1;
    default: return 0;
    }
}

SDPA_API const char *sdpa_dtype_name(sdpa_dtype dtype) {
    switch (dtype) {
    case SDPA_DTYPE_F32: return "float32";
    case SDPA_DTYPE_F16: return "float16";
    case SDPA_DTYPE_BF16: return "bfloat16";
    case SDPA_DTYPE_Q8_0: return "q8_0";
    case SDPA_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case SDPA_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "unknown";
    }
}

/* "SDPA_DTYPE_F16 (float16)" style text of a dtype field for messages. */
static const char *dtype_enum_name(int32_t dtype) {
    switch (dtype) {
    case SDPA_DTYPE_F32: return "SDPA_DTYPE_F32";
    case SDPA_DTYPE_F16: return "SDPA_DTYPE_F16";
    case SDPA_DTYPE_BF16: return "SDPA_DTYPE_BF16";
    case SDPA_DTYPE_Q8_0: return "SDPA_DTYPE_Q8_0";
    case SDPA_DTYPE_FP8_E4M3: return "SDPA_DTYPE_FP8_E4M3";
    case SDPA_DTYPE_FP8_E5M2: return "SDPA_DTYPE_FP8_E5M2";
    default: return "not an sdpa_dtype";
    }
}

/* 0.6, the 8-bit K/V dtypes: a q8_0 view's shape counts elements (its last axis, the head
 * width, a multiple of SDPA_Q8_0_BLOCK: SDPA_ERR_SHAPE) and its strides count blocks of 34
 * bytes, the last axis being contiguous blocks (stride 1: SDPA_ERR_STRIDE). The geometry
 * checks then run on the storage shape (sshape: blocks on the last axis). Other dtypes: the
 * shape as it is. */
static sdpa_status check_block_layout(const char *fn, const char *name, int32_t dtype, int32_t rank,
                                      const int64_t *shape, int64_t *sshape) {
    sdpa__storage_shape(dtype, rank, shape, sshape);
    if (dtype != SDPA_DTYPE_Q8_0 || rank < 1)
        return SDPA_OK;
    const int64_t e = shape[rank - 1];
    if (e >= 0 && e % SDPA_Q8_0_BLOCK != 0)
        return sdpa__fail(SDPA_ERR_SHAPE,
                          "%s: %s is a q8_0 view with shape[%d]=%lld elements on its last axis, not a multiple of "
                          "the block size %d (ggml block_q8_0: 32 int8 values and one f16 scale per block)",
                          fn, name, (int)(rank - 1), (long long)e, SDPA_Q8_0_BLOCK);
    return SDPA_OK;
}

/* After the geometry: a non-empty q8_0 view's last axis must be contiguous blocks. */
static sdpa_status check_block_stride(const char *fn, const char *name, int32_t dtype, int32_t rank,
                                      const int64_t *sshape, const int64_t *strides) {
    if (dtype != SDPA_DTYPE_Q8_0 || rank < 1)
        return SDPA_OK;
    for (int32_t d = 0; d < rank; ++d)
        if (sshape[d] == 0)
            return SDPA_OK;
    if (strides[rank - 1] != 1)
        return sdpa__fail(SDPA_ERR_STRIDE,
                          "%s: %s.strides[%d]=%lld: a q8_0 view's strides count blocks of 34 bytes and its last axis "
                          "must be contiguous blocks (stride 1; a ggml tensor's nb[] in bytes / 34)",
                          fn, name, (int)(rank - 1), (long long)strides[rank - 1]);
    return SDPA_OK;
}

/* Alignment of a view's data: its element size, 2 for q8_0 (its blocks start with an f16). */
static size_t data_align(int32_t dtype, size_t elem) { return dtype == SDPA_DTYPE_Q8_0 ? 2 : elem; }

sdpa_status sdpa__check_view(const sdpa_tensor *t, const char *fn, const char *name, int32_t rank_min,
                             int32_t rank_max) {
    if (t == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s is NULL", fn, name);
    const size_t elem = sdpa_dtype_size((sdpa_dtype)t->dtype);
    if (elem == 0)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: %s.dtype=%d is not an sdpa_dtype (SDPA_DTYPE_F32, _F16, _BF16, _Q8_0, _FP8_E4M3 or _FP8_E5M2)", fn,
                          name, (int)t->dtype);
    if (t->rank < rank_min || t->rank > rank_max) {
        if (rank_min == rank_max)
            return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d, expected %d", fn, name, (int)t->rank,
                              (int)rank_min);
        return sdpa__fail(SDPA_ERR_RANK, "%s: %s.rank=%d, expected %d..%d", fn, name, (int)t->rank,
                          (int)rank_min, (int)rank_max);
    }
    if (t->reserved[0] != 0 || t->reserved[1] != 0)
        return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s.reserved must be 0", fn, name);
    for (int32_t d = t->rank; d < SDPA_MAX_RANK; ++d)
        if (t->shape[d] != 0 || t->strides[d] != 0)
            return sdpa__fail(SDPA_ERR_INVALID_ARGUMENT, "%s: %s.shape[%d] and strides[%d] are beyond rank=%d and must be 0",
                              fn, name, (int)d, (int)d, (int)t->rank);
    int64_t ss[SDPA_MAX_RANK];
    SDPA__TRY(check_block_layout(fn, name, t->dtype, t->rank, t->shape, ss));
    sdpa_status st = sdpa__check_geometry(fn, name, t->rank, ss, t->strides, elem);
    if (st != SDPA_OK)
        return st;
    SDPA__TRY(check_block_stride(fn, name, t->dtype, t->rank, ss, t->strides));
    int64_t numel = 1; /* storage units (q8_0: blocks), checked by sdpa__check_geometry */
    for (int32_t d = 0; d < t->rank; ++d)
        numel *= ss[d];
    if (numel > 0 && t->data == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: %s.data is NULL but the view has %lld %s", fn,
                          name, (long long)numel, t->dtype == SDPA_DTYPE_Q8_0 ? "blocks" : "elements");
    if ((st = check_address_range(fn, name, t->data, t->rank, ss, t->strides, elem)) != SDPA_OK)
        return st;
    return check_data_aligned(fn, name, t->data, t->rank, ss, data_align(t->dtype, elem));
}

sdpa_status sdpa__check_dtype_supported(const sdpa_tensor *t, const char *fn, const char *name, unsigned dtypes) {
    if (t->dtype >= 0 && t->dtype < 31 && ((dtypes >> t->dtype) & 1u))
        return SDPA_OK;
    const char *dn = sdpa_dtype_name((sdpa_dtype)t->dtype);
    if (dtypes == SDPA__DTYPES_F32)
        return sdpa__fail(SDPA_ERR_DTYPE,
                          "%s: %s.dtype=%s is a valid %s view, but %s computes float32 only: its %s loaders and "
                          "kernels are not built yet",
                          fn, name, dtype_enum_name(t->dtype), dn, fn, dn);
    if (t->dtype >= 0 && t->dtype < 31 && ((SDPA__DTYPES_8BIT >> t->dtype) & 1u))
        return sdpa__fail(SDPA_ERR_DTYPE,
                          "%s: %s.dtype=%s (%s) is an 8-bit K/V cache dtype: only sdpa_attention's key and value "
                          "may have it",
                          fn, name, dtype_enum_name(t->dtype), dn);
    return sdpa__fail(SDPA_ERR_DTYPE, "%s: %s.dtype=%s (%s) is not supported here", fn, name,
                      dtype_enum_name(t->dtype), dn);
}

/* Fill *view from (data, dtype, rank, shape, strides) after the checks every view gets. */
static sdpa_status init_view(const char *fn, sdpa_tensor *view, const void *data, sdpa_dtype dtype, int32_t rank,
                             const int64_t *shape, const int64_t *strides) {
    if (view == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: view is NULL", fn);
    memset(view, 0, sizeof *view);
    view->dtype = SDPA_DTYPE_F32; /* an empty float32 view until every check has passed */
    if (shape == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: shape is NULL", fn);
    if (strides == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: strides is NULL", fn);
    const size_t elem = sdpa_dtype_size(dtype);
    if (elem == 0)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: dtype=%d is not an sdpa_dtype (SDPA_DTYPE_F32, _F16, _BF16, _Q8_0, _FP8_E4M3 or _FP8_E5M2)", fn,
                          (int)dtype);
    if (rank < 1 || rank > SDPA_MAX_RANK)
        return sdpa__fail(SDPA_ERR_RANK, "%s: rank=%d, expected 1..%d", fn, (int)rank, (int)SDPA_MAX_RANK);
    int64_t ss[SDPA_MAX_RANK];
    SDPA__TRY(check_block_layout(fn, "view", (int32_t)dtype, rank, shape, ss));
    sdpa_status st = sdpa__check_geometry(fn, "view", rank, ss, strides, elem);
    if (st != SDPA_OK)
        return st;
    SDPA__TRY(check_block_stride(fn, "view", (int32_t)dtype, rank, ss, strides));
    int64_t numel = 1;
    for (int32_t d = 0; d < rank; ++d)
        numel *= ss[d]; /* no overflow: checked by sdpa__check_geometry (q8_0: blocks) */
    if (data == NULL && numel > 0)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: data is NULL but the view has %lld %s", fn,
                          (long long)numel, dtype == SDPA_DTYPE_Q8_0 ? "blocks" : "elements");
    st = check_address_range(fn, "view", data, rank, ss, strides, elem);
    if (st == SDPA_OK)
        st = check_data_aligned(fn, "view", data, rank, ss, data_align((int32_t)dtype, elem));
    if (st != SDPA_OK)
        return st;
    /* The library never writes through an input view: the cast only keeps the frozen layout. */
    view->data = (void *)(uintptr_t)data;
    view->dtype = (int32_t)dtype;
    view->rank = rank;
    for (int32_t d = 0; d < rank; ++d) {
        view->shape[d] = shape[d];
        view->strides[d] = strides[d];
    }
    return SDPA_OK;
}

SDPA_API sdpa_status sdpa_tensor_init_strided(sdpa_tensor *view, const void *data, sdpa_dtype dtype, int32_t rank,
                                              const int64_t *shape, const int64_t *strides) {
    sdpa__clear_error();
    return init_view("sdpa_tensor_init_strided", view, data, dtype, rank, shape, strides);
}

/* Contiguous row-major view: the one implementation behind sdpa_tensor_init{,_dtype}. */
static sdpa_status init_contiguous(const char *fn, sdpa_tensor *view, const void *data, sdpa_dtype dtype, int32_t rank,
                                   const int64_t *shape) {
    int64_t strides[SDPA_MAX_RANK];
    if (view == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: view is NULL", fn);
    memset(view, 0, sizeof *view);
    view->dtype = SDPA_DTYPE_F32;
    const size_t elem = sdpa_dtype_size(dtype);
    if (elem == 0)
        return sdpa__fail(SDPA_ERR_DTYPE, "%s: dtype=%d is not an sdpa_dtype (SDPA_DTYPE_F32, _F16, _BF16, _Q8_0, _FP8_E4M3 or _FP8_E5M2)", fn,
                          (int)dtype);
    if (shape == NULL)
        return sdpa__fail(SDPA_ERR_NULL_POINTER, "%s: shape is NULL", fn);
    if (rank < 1 || rank > SDPA_MAX_RANK)
        return sdpa__fail(SDPA_ERR_RANK, "%s: rank=%d, expected 1..%d", fn, (int)rank, (int)SDPA_MAX_RANK);
    int64_t ss[SDPA_MAX_RANK]; /* q8_0: row-major strides over blocks (last 1, next E / 32) */
    SDPA__TRY(check_block_layout(fn, "view", (int32_t)dtype, rank, shape, ss));
    sdpa_status st = contiguous_strides(fn, "view", rank, SDPA_MAX_RANK, ss, elem, strides);
    if (st != SDPA_OK)
        return st;
    return init_view(fn, view, data, dtype, rank, shape, strides);
}

SDPA_API sdpa_status sdpa_tensor_init_dtype(sdpa_tensor *view, const void *data, sdpa_dtype dtype, int32_t rank,
                                            const int64_t *shape) {
    sdpa__clear_error();
    return init_contiguous("sdpa_tensor_init_dtype", view, data, dtype, rank, shape);
}

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
_Static_assert(offsetof(sdpa_options, precision) == offsetof(sdpa_options, reserved0) + 4,
               "sdpa_options 0.4 fields follow reserved0");
_Static_assert(offsetof(sdpa_options, sinks) == offsetof(sdpa_options, reserved1) + 4,
               "sdpa_options 0.5 fields follow reserved1");
_Static_assert(offsetof(sdpa_options, block_table) == offsetof(sdpa_options, threadpool) + sizeof(void *),
               "sdpa_options 0.5 paged/packed fields follow threadpool");
_Static_assert(offsetof(sdpa_options, k_scale) == offsetof(sdpa_options, num_seqs) + 8,
               "sdpa_options 0.6 fields follow num_seqs");
_Static_assert(sizeof(sdpa_options) == offsetof(sdpa_options, v_scale) + sizeof(void *), "sdpa_options ends with v_scale");
#endif
