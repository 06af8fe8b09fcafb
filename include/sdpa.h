/**
 * @file sdpa.h
 * @brief libsdpa: validated scaled dot-product attention for C, C++ and Python (ctypes).
 *
 * The one public header of libsdpa, and its API reference: every function, type, enum value
 * and macro below is documented here and in the generated reference (`ninja -C build docs`).
 * The guides (semantics, serving, building, Python) are the pages of the repository's docs/.
 *
 *     out = softmax(softcap(scale * Q K^T) + bias, masked) V
 *
 * One public header. Tensors are non-owning strided views (sdpa_tensor); masks are
 * explicit allow-masks (sdpa_allow_mask, nonzero = the key MAY take part). Every
 * function returns an sdpa_status; on failure no output byte has been written and
 * sdpa_last_error_message() explains what was wrong. Nothing aborts or prints.
 *
 * Stability: symbols and structs of one SDPA_VERSION_MAJOR stay binary compatible.
 * sdpa_tensor and sdpa_allow_mask never change; sdpa_options starts with struct_size
 * and only ever grows at its end. Check at start-up that
 *     sdpa_version() >= SDPA_VERSION_NUMBER
 * i.e. that the library you run is not older than the header you compiled against.
 *
 * Naming: B batch, Hq query heads, Hkv key/value heads, L target (query) length,
 * S source (key) length, E query/key head width, Ev value head width.
 * Shapes are written outermost first; strides are in ELEMENTS (not bytes), signed.
 *
 * MIT licence; see LICENSE.
 */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ export */

/**
 * @def SDPA_API
 * Marks the functions libsdpa exports: default visibility with GCC and Clang, dllexport while
 * building the DLL (SDPA_BUILDING_DLL) and dllimport when using it on Windows, nothing with
 * SDPA_STATIC. Every other symbol of the library is hidden. Define it before including sdpa.h
 * to override.
 */
#ifndef SDPA_API
#  if defined(_WIN32) || defined(__CYGWIN__)
#    if defined(SDPA_BUILDING_DLL) && defined(SDPA_STATIC)
#      error "Define either SDPA_BUILDING_DLL or SDPA_STATIC, not both."
#    elif defined(SDPA_BUILDING_DLL)
#      define SDPA_API __declspec(dllexport)
#    elif defined(SDPA_STATIC)
#      define SDPA_API
#    else
#      define SDPA_API __declspec(dllimport)
#    endif
#  elif defined(__GNUC__) && __GNUC__ >= 4
#    define SDPA_API __attribute__((visibility("default")))
#  else
#    define SDPA_API
#  endif
#endif

/**
 * @def SDPA_NODISCARD
 * Marks the functions whose sdpa_status must be looked at: GCC and Clang warn
 * (-Wunused-result, on by default) when a call's result is ignored. A `(void)` cast silences
 * Clang but not GCC (checked with GCC 12 and Clang 14, C and C++). What silences both:
 * using the status (`if (sdpa_request_amx() != SDPA_OK) { ... }`, or `if (sdpa_x(...)) {}`),
 * storing it in a variable that is then read or cast (`sdpa_status s = sdpa_x(...); (void)s;`),
 * or `(void)!sdpa_x(...)`. Defining SDPA_NODISCARD as empty before including sdpa.h
 * (`-DSDPA_NODISCARD=`) removes the attribute.
 */
#ifndef SDPA_NODISCARD
#  if defined(__GNUC__) && __GNUC__ >= 4
#    define SDPA_NODISCARD __attribute__((warn_unused_result))
#  else
#    define SDPA_NODISCARD
#  endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- version */

/** Major version of this header; the soname follows it (libsdpa.so.0). */
#define SDPA_VERSION_MAJOR 0
/** Minor version of this header: grows when functions or struct fields are added. */
#define SDPA_VERSION_MINOR 5
/** Patch version of this header. */
#define SDPA_VERSION_PATCH 0
/** MAJOR*1000000 + MINOR*1000 + PATCH (SQLite's scheme). */
#define SDPA_VERSION_NUMBER \
    (SDPA_VERSION_MAJOR * 1000000 + SDPA_VERSION_MINOR * 1000 + SDPA_VERSION_PATCH)
/** "MAJOR.MINOR.PATCH" of this header, as sdpa_version_string() gives the library's. */
#define SDPA_VERSION_STRING "0.5.0"

/** @return SDPA_VERSION_NUMBER of the library actually linked (not of this header). */
SDPA_API unsigned sdpa_version(void);
/** @return "MAJOR.MINOR.PATCH" of the library actually linked; a static string. */
SDPA_API const char *sdpa_version_string(void);

/* ------------------------------------------------------------------ status */

/**
 * Status codes. Values are explicit, grouped by tens and never renumbered; new codes
 * may be added. The enum is int-sized (ctypes: c_int).
 */
typedef enum sdpa_status {
    SDPA_OK = 0,                     /**< success */

    /* 10-19: arguments */
    SDPA_ERR_NULL_POINTER = 10,      /**< a required pointer is NULL */
    SDPA_ERR_INVALID_ARGUMENT = 11,  /**< a scalar option out of range (scale, softcap, enum, window, length) */
    SDPA_ERR_STRUCT_VERSION = 12,    /**< struct_size too small, too large, unknown tail bytes or a reserved field of a versioned struct not zero */
    SDPA_ERR_UNSUPPORTED = 13,       /**< valid request this version cannot serve (e.g. a forced kernel that cannot run it) */

    /* 20-29: shape and layout */
    SDPA_ERR_RANK = 20,              /**< rank out of the accepted range */
    SDPA_ERR_SHAPE = 21,             /**< two sizes that must agree do not (B, H, E, S, ...) */
    SDPA_ERR_BROADCAST = 22,         /**< mask or bias not broadcastable to [B, Hq, L, S] */
    SDPA_ERR_STRIDE = 23,            /**< negative output stride, output overlapping itself, stride 0 on an output */
    SDPA_ERR_OVERLAP = 24,           /**< an output overlaps an input or another output */
    SDPA_ERR_SIZE_OVERFLOW = 25,     /**< a shape/stride product overflows int64_t or size_t */
    SDPA_ERR_EMPTY_DIMENSION = 26,   /**< a dimension that must be >= 1 is 0 (the head width E, a block pool's block_size) */
    SDPA_ERR_INDEX = 27,             /**< (0.5) an index read from caller memory is out of range: a block_table entry, a cu_seqlens entry, a kv-write slot */
    SDPA_ERR_ALIGNMENT = 28,         /**< (0.6) a data pointer is not aligned to its element size: a view's data (4 bytes for float32, 2 for float16/bfloat16) or an array of the options (int64_t lengths and offsets: 8; int32_t block table and cu_seqlens: 4; float sinks and slopes: 4) */

    /* 30-39: data type */
    SDPA_ERR_DTYPE = 30,             /**< dtype not an sdpa_dtype, or one this entry point does not compute (each entry point says which) */

    /* 40-49: values */
    SDPA_ERR_EMPTY_ROW = 40,         /**< a query row has no allowed key under SDPA_EMPTY_ROWS_ERROR */
    SDPA_ERR_NON_FINITE = 41,        /**< NaN/Inf in an input value that the call would read */

    /* 50-59: resources */
    SDPA_ERR_OUT_OF_MEMORY = 50,     /**< internal workspace allocation failed */
    SDPA_ERR_WORKSPACE_TOO_SMALL = 51, /**< caller workspace smaller than sdpa_attention_workspace_size() */

    /* 60-69: internal */
    SDPA_ERR_INTERNAL = 60,          /**< a bug in libsdpa; please report it */

    SDPA_STATUS_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_status;

/**
 * @return a static English name for any value, e.g. "SDPA_ERR_SHAPE", or
 *         "SDPA_ERR_UNKNOWN" for a value this library does not know. Never NULL.
 */
SDPA_API const char *sdpa_status_string(sdpa_status status);

/**
 * @return the detail of the last failure on the calling thread, e.g.
 *         "sdpa_attention: key.shape[2]=6 does not match value.shape[2]=5", or "" when the
 *         last call on this thread succeeded. Thread-local; valid until the next libsdpa
 *         call on this thread.
 */
SDPA_API const char *sdpa_last_error_message(void);

/**
 * @return the name of the kernel that computed the last successful sdpa_attention() on the
 *         calling thread, or "" if none ran. Thread-local; valid until the next sdpa_attention()
 *         on this thread. Names start with the path: "reference", "tiled..." or "decode..."
 *         (then the micro-kernel's ISA, e.g. "tiled-avx2", "tiled-avx512bf16" for the bf16 dot
 *         products of SDPA_PRECISION_REDUCED); with reduced-precision storage (0.4) a dtype
 *         suffix follows: the dtype of K and V ("-f16", "-bf16"; "-f32" for a float32 cache
 *         with a reduced q; 0.6: "-q8_0", "-fp8_e4m3", "-fp8_e5m2" for 8-bit caches;
 *         "-mixed" when K and V differ), e.g. "decode-avx2-f16",
 *         "reference-bf16". Float32 q, k and v keep the suffix-less 0.3 names. "none" when
 *         the call had no query row. A packed batch (cu_seqlens_q) names the kernel of its
 *         last sequence that has query rows (its sequences may run on different kernels).
 */
SDPA_API const char *sdpa_last_kernel(void);

/* ------------------------------------------------------------------- views */

/** Maximum rank of an sdpa_tensor. ABI constant. */
#define SDPA_MAX_RANK 8

/** Element types of a view (sdpa_tensor.dtype). Each entry point's documentation says which
 *  dtypes it computes; a valid view of a dtype an entry point does not compute (yet) is
 *  SDPA_ERR_DTYPE with a message naming the view. Element sizes: sdpa_dtype_size(). */
typedef enum sdpa_dtype {
    SDPA_DTYPE_F32 = 0,  /**< IEEE 754 binary32 (float) */
    SDPA_DTYPE_F16 = 1,  /**< IEEE 754 binary16 (numpy float16, _Float16), stored as its 16-bit encoding */
    SDPA_DTYPE_BF16 = 2, /**< bfloat16 (the top 16 bits of a binary32; torch.bfloat16) */
    /** (0.6) 8-bit block-quantized K/V cache, bit-compatible with ggml's `block_q8_0` (llama.cpp
     *  `--cache-type-k/-v q8_0`): blocks of SDPA_Q8_0_BLOCK = 32 consecutive elements along
     *  the LAST axis (the head width E or Ev), each SDPA_Q8_0_BLOCK_BYTES = 34 bytes
     *  `{uint16_t d; int8_t qs[32];}` with d an IEEE binary16 scale (little-endian, as ggml
     *  stores it); element i of a block is d * qs[i] (d widened exactly to float32, one float32
     *  multiply: ggml's dequantize_row_q8_0). THE VIEW: its shape counts elements (the last
     *  axis a multiple of 32, else SDPA_ERR_SHAPE naming the view); its strides count BLOCKS
     *  (sdpa_dtype_size() = 34 bytes, the storage unit), and the last axis must be contiguous
     *  blocks, stride 1 (else SDPA_ERR_STRIDE); data aligned to 2 bytes. sdpa_tensor_init_dtype()
     *  gives last stride 1 and the next stride E / 32. A ggml tensor (ne[] in elements, nb[] in
     *  bytes, multiples of 34) is the view with shape ne reversed and strides nb / 34 reversed.
     *  A d that is Inf or NaN makes its 32 values non-finite (the finite check reports them).
     *  Allowed for sdpa_attention()'s key and value only. */
    SDPA_DTYPE_Q8_0 = 3,
    /** (0.6) OCP 8-bit float E4M3FN (PyTorch float8_e4m3fn, vLLM kv_cache_dtype "fp8" /
     *  "fp8_e4m3"): 1 sign, 4 exponent (bias 7), 3 mantissa bits, subnormals, no infinities,
     *  NaN = S.1111.111 (0x7F, 0xFF), largest finite 448. One byte per element, ordinary
     *  strides. The value is fp8 * scale (sdpa_options.k_scale / v_scale, default 1). Allowed
     *  for sdpa_attention()'s key and value only. */
    SDPA_DTYPE_FP8_E4M3 = 4,
    /** (0.6) 8-bit float E5M2 (PyTorch float8_e5m2, vLLM "fp8_e5m2"): 1 sign, 5 exponent (bias
     *  15), 2 mantissa bits: the top byte of an IEEE binary16, with Inf (S.11111.00) and NaN.
     *  One byte per element; value fp8 * scale as for SDPA_DTYPE_FP8_E4M3. Key and value only. */
    SDPA_DTYPE_FP8_E5M2 = 5,
    SDPA_DTYPE_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_dtype;

/** (0.6) Elements per block of SDPA_DTYPE_Q8_0 (ggml QK8_0). */
#define SDPA_Q8_0_BLOCK 32
/** (0.6) Bytes per block of SDPA_DTYPE_Q8_0 (ggml sizeof(block_q8_0): an f16 scale and 32 int8);
 *  sdpa_dtype_size(SDPA_DTYPE_Q8_0), the unit its strides count. */
#define SDPA_Q8_0_BLOCK_BYTES 34

/**
 * A non-owning strided view of a tensor (frozen layout; 160 bytes on LP64).
 * Element [i0, ..., i(rank-1)] lives at byte offset sdpa_dtype_size(dtype) * sum_d i_d * strides[d]
 * from data (for float32: ((float *)data)[sum_d i_d * strides[d]]).
 * Strides are in elements and may be 0 (broadcast) or negative on inputs; outputs need
 * strides > 0 on every dimension of size > 1 and must not overlap themselves.
 * 8-bit dtypes (0.6): FP8 views are ordinary 1-byte views; a q8_0 view's shape counts
 * elements and its strides count 34-byte blocks (see SDPA_DTYPE_Q8_0): element [.., e] is
 * value e % 32 of block e / 32 of its row, the row at sdpa_dtype_size(dtype) * sum_{d<last}
 * i_d * strides[d] bytes.
 * Alignment (0.6): the data pointer of a view with at least one element must be a multiple of
 * its element size (sdpa_dtype_size(): 4 for float32, 2 for float16 and bfloat16; q8_0: 2), as a C
 * pointer of that type must be and as PyTorch, ONNX Runtime and numpy's aligned arrays give;
 * since strides count elements, every element is then aligned too. A misaligned view, e.g.
 * (float *)(buf + 3), is SDPA_ERR_ALIGNMENT from the constructors and from every function
 * that takes a view (nothing is read or written through it). Empty views and allow-masks
 * (uint8) may have any address.
 * Entries at index >= rank and reserved[] must be 0 (the constructors ensure it).
 * The library never writes through an input view, and never retains a view: a view of const
 * data (sdpa_tensor_init_strided(), sdpa_tensor_init_dtype() take `const void *`) may be passed
 * as any input; `data` stays `void *` only to keep the frozen layout.
 */
typedef struct sdpa_tensor {
    void *data;                      /**< address of element [0, ..., 0]; may be NULL if the view is empty */
    int32_t dtype;                   /**< sdpa_dtype */
    int32_t rank;                    /**< 1..SDPA_MAX_RANK */
    int64_t shape[SDPA_MAX_RANK];    /**< sizes, outermost first, >= 0 */
    int64_t strides[SDPA_MAX_RANK];  /**< in elements */
    uint64_t reserved[2];            /**< must be 0 */
} sdpa_tensor;

/**
 * Fill *view as a contiguous row-major (C-order) float32 view of `data` with the given shape.
 * @param view  [out] the view; fully overwritten (also on failure, then as an empty view).
 * @param data  buffer of prod(shape) floats, not retained; may be NULL only if prod(shape) == 0.
 * @param rank  1..SDPA_MAX_RANK.   @param shape [rank] sizes >= 0.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_RANK, SDPA_ERR_SHAPE (negative size),
 *         SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_ALIGNMENT (0.6: data not a multiple of 4 bytes).
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_tensor_init(sdpa_tensor *view, float *data, int32_t rank,
                                                     const int64_t *shape);

/** Shorthand for sdpa_tensor_init() of a rank-4 [d0, d1, d2, d3] view. Same errors. */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_tensor_init_4d(sdpa_tensor *view, float *data, int64_t d0,
                                                        int64_t d1, int64_t d2, int64_t d3);

/** Shorthand for sdpa_tensor_init() of a rank-3 [d0, d1, d2] view. Same errors. */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_tensor_init_3d(sdpa_tensor *view, float *data, int64_t d0,
                                                        int64_t d1, int64_t d2);

/** @return the size in bytes of one element of `dtype` (4 for F32, 2 for F16 and BF16; 0.6: 1
 *  for FP8_E4M3 and FP8_E5M2, and for Q8_0 the 34 bytes of one block of 32 elements, the unit
 *  a q8_0 view's strides count), or 0 if dtype is not an sdpa_dtype. (0.4) */
SDPA_API size_t sdpa_dtype_size(sdpa_dtype dtype);

/** @return a static name of `dtype` as numpy/PyTorch spell it: "float32", "float16",
 *  "bfloat16"; 0.6: "q8_0" (ggml's name), "fp8_e4m3", "fp8_e5m2" (vLLM's kv_cache_dtype
 *  names); or "unknown". Never NULL. (0.4) */
SDPA_API const char *sdpa_dtype_name(sdpa_dtype dtype);

/**
 * Fill *view as a view of `data` with any dtype, shape and strides (in elements, signed; 0
 * broadcasts): BSHD or BHSD layouts, a slice of a KV cache, a transposed or reversed input,
 * without overwriting fields by hand. Output views need strides > 0 on every dimension of size
 * > 1 and no self-overlap; that is checked by the function the view is passed to. (0.4)
 * @param view    [out] the view; fully overwritten (also on failure, then as an empty view).
 * @param data    address of element [0, ..., 0], not retained; may be NULL only if the view has
 *                no element. const: the library never writes through a view passed as an input.
 * @param dtype   an sdpa_dtype.
 * @param rank    1..SDPA_MAX_RANK.  @param shape [rank] sizes >= 0.  @param strides [rank].
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER (view, shape, strides, or data of a non-empty view),
 *         SDPA_ERR_DTYPE (not an sdpa_dtype), SDPA_ERR_RANK, SDPA_ERR_SHAPE (negative size),
 *         SDPA_ERR_SIZE_OVERFLOW (element count, a stride or the byte span overflows, or the
 *         view's addresses wrap around: its lowest element below address 0 with negative strides,
 *         or its end past the top; every function that takes a view checks the same),
 *         SDPA_ERR_ALIGNMENT (0.6: data of a non-empty view not a multiple of the element size).
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_tensor_init_strided(sdpa_tensor *view, const void *data,
                                                             sdpa_dtype dtype, int32_t rank,
                                                             const int64_t *shape,
                                                             const int64_t *strides);

/**
 * Fill *view as a contiguous row-major (C-order) view of prod(shape) elements of `dtype` at
 * `data` (sdpa_tensor_init() for any dtype). (0.4)
 * @param view  [out] the view; fully overwritten (also on failure, then as an empty view).
 * @param data  const: see sdpa_tensor_init_strided(); may be NULL only if prod(shape) == 0.
 * @param dtype an sdpa_dtype.
 * @param rank  1..SDPA_MAX_RANK.   @param shape [rank] sizes >= 0.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_DTYPE (not an sdpa_dtype), SDPA_ERR_RANK,
 *         SDPA_ERR_SHAPE (negative size), SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_ALIGNMENT (0.6).
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_tensor_init_dtype(sdpa_tensor *view, const void *data,
                                                           sdpa_dtype dtype, int32_t rank,
                                                           const int64_t *shape);

/* -------------------------------------------------------------- allow-mask */

/** Maximum rank of an allow-mask. */
#define SDPA_MASK_MAX_RANK 4

/**
 * An allow-mask: uint8 values, nonzero = the key MAY take part, 0 = blocked.
 * (PyTorch SDPA bool masks have this polarity; nn.MultiheadAttention bool masks and
 * ONNX Runtime int masks do not: convert them with sdpa_mask_from_ignore() /
 * sdpa_mask_from_keep_int().)
 * Rank 1..4, broadcast right-aligned (numpy rules) to [B, Hq, L, S]: [S], [L, S],
 * [Hq, L, S], [B, Hq, L, S]; a dimension of size 1 or stride 0 broadcasts.
 * Strides in elements (= bytes). Entries at index >= rank must be 0. Frozen layout.
 */
typedef struct sdpa_allow_mask {
    const uint8_t *data;                 /**< element [0, ..., 0] */
    int32_t rank;                        /**< 1..SDPA_MASK_MAX_RANK */
    int32_t reserved0;                   /**< must be 0 */
    int64_t shape[SDPA_MASK_MAX_RANK];   /**< sizes, outermost first */
    int64_t strides[SDPA_MASK_MAX_RANK]; /**< in elements; 0 allowed (broadcast) */
} sdpa_allow_mask;

/**
 * Fill *mask as a contiguous row-major view of `data` with the given shape (data may be NULL
 * only if the mask has no element).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_RANK (not 1..4), SDPA_ERR_SHAPE (negative),
 *         SDPA_ERR_SIZE_OVERFLOW.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_allow_mask_init(sdpa_allow_mask *mask, const uint8_t *data,
                                                         int32_t rank, const int64_t *shape);

/* ----------------------------------------------------------------- options */

/** How query row i is placed among the keys, for causal and window rules. */
typedef enum sdpa_alignment {
    /** p = i. PyTorch is_causal, torch.tril, ONNX without cache. */
    SDPA_ALIGN_TOP_LEFT = 0,
    /** p = i + S_b - L_b, S_b = key_lengths[b] if given, else S; L_b = query_lengths[b] if
     *  given, else L. FlashAttention >= 2.1,
     *  KV-cache decode: the last query sees every valid key. */
    SDPA_ALIGN_BOTTOM_RIGHT = 1,
    /** p = i + query_offsets[b] (may be negative). ONNX Attention with a past of length P
     *  (offset P) or nonpad_kv_seqlen (offset nonpad[b] - L). */
    SDPA_ALIGN_OFFSETS = 2,
    SDPA_ALIGN_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_alignment;

/** What to do with a query row that has no allowed key. */
typedef enum sdpa_empty_rows {
    /** Fail with SDPA_ERR_EMPTY_ROW before writing anything, naming the first such row. */
    SDPA_EMPTY_ROWS_ERROR = 0,
    /** Write a zero output row, lse = -inf and zero probabilities (PyTorch >= 2.5,
     *  FlashAttention-3 and FlashAttention-2's split-KV path, ONNX Attention errata #8068;
     *  FlashAttention-2's plain forward writes lse = +inf there, which sdpa_merge reads as
     *  -inf); with sinks lse is the sink. Score stages of `weights` keep their scores
     *  (SDPA_WEIGHTS_MASKED: all -inf). */
    SDPA_EMPTY_ROWS_ZERO = 1,
    SDPA_EMPTY_ROWS_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_empty_rows;

/** What the optional `weights` output holds. ONNX qk_matmul_output_mode in brackets: the
 *  numbers differ from these enum values, so map them (do not pass the mode through). */
typedef enum sdpa_weights_stage {
    SDPA_WEIGHTS_PROBABILITIES = 0, /**< softmax probabilities, 0 where blocked and in empty rows (mode 3); default */
    SDPA_WEIGHTS_SCORES = 1,        /**< scale * Q K^T for every pair (mode 0) */
    SDPA_WEIGHTS_SOFTCAPPED = 2,    /**< after softcap, before bias (mode 1) */
    SDPA_WEIGHTS_MASKED = 3,        /**< after softcap + bias, -inf wherever blocked (mode 2) */
    SDPA_WEIGHTS_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_weights_stage;

/** Which kernel sdpa_attention() runs (sdpa_options.kernel). AUTO picks by shape; a forced
 *  kernel that cannot serve the call fails with SDPA_ERR_UNSUPPORTED (nothing written).
 *  All kernels give the same results within float32 rounding; with the same kernel, the
 *  same SIMD set (see sdpa_last_kernel(); SDPA_MAX_ISA=portable|avx2|avx512|amx on x86-64,
 *  portable|neon on aarch64, in the environment
 *  caps it, read once per process, at the first call that runs a kernel) and the same inputs, the result does not depend on num_threads
 *  (bit for bit). AUTO: reference when weights are requested, decode for L <= 4, else tiled.
 *  TILED and DECODE produce no weights (forcing them with weights is SDPA_ERR_UNSUPPORTED). */
typedef enum sdpa_kernel {
    SDPA_KERNEL_AUTO = 0,      /**< default: decode for small L, tiled otherwise, reference when needed */
    SDPA_KERNEL_REFERENCE = 1, /**< one materialised score tile per row block (0.1's path) */
    SDPA_KERNEL_TILED = 2,     /**< FlashAttention-2 style tiles with online softmax */
    SDPA_KERNEL_DECODE = 3,    /**< small L (KV-cache decode): one pass over K and V, split over keys */
    SDPA_KERNEL_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_kernel;

/**
 * Arithmetic precision of sdpa_attention() for reduced-precision storage (sdpa_options.precision;
 * 0.4). Inputs are always widened exactly to float32 (f16 and bf16 values are float32 values), and
 * an f16/bf16 `out` is rounded once, to nearest even. The bounds below are what the test suite
 * holds every kernel, ISA and dtype combination to, against a float64 evaluation of the contract
 * on the same (widened) inputs.
 *
 * For output element (b, h, i, d) of a row with n allowed keys, with u = 2^-24:
 *   V  = max |v[b, h / (Hq/Hkv), j, d]| over the allowed keys j, divided by (1 - dropout_p);
 *   A  = max over allowed j of |scale| * sum_e |q[b,h,i,e] * k[b,h / (Hq/Hkv),j,e]|;
 *   T  = max over allowed j of |s_ij| (the final score: after softcap and bias);
 *   δ  = (E + 2) * u * A + 8 * u * T             (bounds the float32 error of every score).
 * The out error is err + r, where err is the float32 error of the row and r the one rounding of out
 * to its dtype: r = 0 for F32, 2^-11 * (V + err) + 2^-25 for F16, 2^-8 * (V + err) + 2^-134 for BF16
 * (half an ulp of |out| <= V + err; half the subnormal quantum below the normal range).
 * SDPA_PRECISION_DEFAULT and SDPA_PRECISION_F32:
 *   err = V * ((exp(2δ) - 1) + (3n + 32) * u) + (3n + 32) * 2^-150
 *   (the score errors move each probability by a factor within exp(±2δ); (3n + 32) u covers exp,
 *   the row sum, the P.V sum and the online rescaling, float32 sums of at most n terms each;
 *   the last term is the same operations' absolute error where their results are float32
 *   subnormals, as with v below 2^-126 in magnitude);
 *   |lse - ref| <= δ + (n + 32) * u + u * |ref|.
 * SDPA_PRECISION_REDUCED: err gains
 *   2 * (u_V + n * t_V) * V,   u_V = 2^-11 (f16 V), 2^-8 (bf16 V), 0 (f32 V);
 *                              t_V = 2^-25 (f16 V), 2^-126 (bf16 V), 0 (f32 V)
 *   (each probability, in [0, 1], rounded to V's dtype: relative error u_V, or absolute t_V
 *   where it is subnormal or flushed; the factor 2 lets the row sum use the rounded values), and
 *   lse gains u_V + n * t_V. When q and k are both bf16 and bf16 dot products are used, δ gains
 *   |scale| * E * 2^-126 plus |scale| * sum_e |q_e * k_je| over the terms where q_e or k_je is a
 *   bf16 subnormal (VDPBF16PS and AMX read subnormals as 0). When v is bf16 and P.V uses bf16
 *   dot products, err also gains (2n + 1) * 2^-126 (absolute: bf16 subnormal v values read as
 *   0, subnormal partial sums flushed). REDUCED never rounds a q or k value: f32 or f16 q/k
 *   keep the F32 score arithmetic, except (0.6) a q8_0 k: where the CPU has AVX512-VNNI
 *   (ISA AVX512) the decode kernel scores a q8_0 K cache by int8 dot products, as ggml's
 *   q8_0 x q8_0 dot: each q row is quantized per block b of 32 elements to int8 with
 *   d_b = amax_b / 127 (amax_b = max |q_e| over the block; d_b kept in float32; nearest even),
 *   and δ gains |scale| * sum_b (amax_b / 254) * (1 + 2^-13) * sum_{e in b} |k_je| (the
 *   q quantization; k is the dequantized value, read exactly). sdpa_last_kernel() then names
 *   "decode-avx512vnni" (or "decode-split-avx512vnni"). The tiled and reference kernels, V and
 *   the FP8 dtypes keep the F32 arithmetic on the dequantized values under REDUCED.
 *   Since 0.5.0 (the 0.4 core), REDUCED computes Q.K^T with VDPBF16PS in the tiled and decode
 *   kernels when q and k are bf16 and the CPU has AVX512-BF16; after 0.5.0, with bf16 v, the
 *   tiled kernel also rounds each
 *   probability to bf16 (nearest even; below 2^-126 to 0) and computes P.V with VDPBF16PS
 *   (sdpa_last_kernel() then names "tiled-avx512bf16"). After sdpa_request_amx() the tiled
 *   kernel uses AMX-BF16 tiles instead ("tiled-amx-bf16", head sizes as sdpa_request_amx()
 *   says): the same bound, with two differences in how it is met. On tiles every row may fully
 *   attend (and without softcap, ALiBi or dropout, with scale > 0) the probabilities are
 *   exp(s - m) for a reference point m that moves only when a tile's max exceeds it by more
 *   than 8 (so P <= e^8 and Ot is rarely rescaled; out = Ot / l and lse = m + log l are the same
 *   quantities), computed as 2^(t * scale * log2 e - m * log2 e) with a degree-6 polynomial
 *   (relative error below 2^-21, inside the bound's 32 u). Its results differ in the last bits
 *   from the AVX512-BF16 path's; like every path they do not depend on the thread count. The row sum l, the online softmax and
 *   the accumulation stay float32 (l sums the unrounded probabilities). f16 v keeps float32
 *   probabilities (no f16 dot product here), and the reference kernel keeps the F32
 *   arithmetic. DEFAULT and F32 never use VDPBF16PS: its subnormal handling (inputs read as 0)
 *   breaks the F32 bound, and its summation order the bit-identity with widened f32 inputs.
 *   tests/test_dtypes_kernels.c checks these bounds on every kernel, ISA and dtype
 *   combination (largest observed error / bound: about 0.1 with f32 out, 0.97 with f16 or
 *   bf16 out, where the one rounding of out dominates; REDUCED with rounded P: 0.14 with f32
 *   out).
 * An f16 out cannot hold |x| >= 65520, a bf16 out |x| >= 3.3961775e38 (half an ulp above its
 * largest finite value): a float32 result there becomes +-Inf (IEEE rounding, the dtype's
 * range), not an error. Since the float32 result may exceed the exact one by err, an exact value
 * within err of those limits (v values at the top of the range) can become +-Inf too.
 */
typedef enum sdpa_precision {
    /** Default: the SDPA_PRECISION_F32 contract, in this and every later 0.x/1.x version (a
     *  zero-filled sdpa_options never lowers accuracy). */
    SDPA_PRECISION_DEFAULT = 0,
    /** float32 scores, softmax, probabilities and accumulation; out rounded once. */
    SDPA_PRECISION_F32 = 1,
    /** The kernel may round the probabilities to V's storage dtype for P.V (as FlashAttention and
     *  PyTorch's CPU flash kernel do) and use bf16 dot products (AVX512-BF16 VDPBF16PS, AMX-BF16)
     *  when q and k are both bf16, and (0.6) int8 dot products (AVX512-VNNI) on a q8_0 k in the
     *  decode kernel, q quantized per block of 32. With f32 V the probabilities stay float32. */
    SDPA_PRECISION_REDUCED = 2,
    SDPA_PRECISION_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_precision;

/** A task of a caller thread pool hook (sdpa_options.parallel_for): runs task number `task`. */
typedef void (*sdpa_task_fn)(void *task_ctx, int64_t task);
/** A parallel-for over [0, ntasks) (contract at sdpa_options.parallel_for). */
typedef void (*sdpa_parallel_for_fn)(void *ctx, int64_t ntasks, sdpa_task_fn task, void *task_ctx);
/** A caller-owned pool of persistent worker threads (sdpa_threadpool_create()). Opaque. */
typedef struct sdpa_threadpool sdpa_threadpool;

/**
 * Options of sdpa_attention(). Initialise with sdpa_options_init(), then set fields.
 * Every field's default is its zero value (sdpa_options_init() also sets the unused window
 * sides to -1), so a zero-filled struct with struct_size set
 * (`sdpa_options o = {.struct_size = sizeof o};`) also means "the defaults".
 * The library reads only the first struct_size bytes; fields are only ever appended.
 * Pointers are borrowed for the duration of the call.
 */
typedef struct sdpa_options {
    size_t struct_size;     /**< sizeof(sdpa_options) as compiled by the caller */

    /** Score scale. 0 (default) = 1/sqrt(E), E = query/key head width (not Ev); > 0 replaces it.
     *  Negative, NaN or Inf is SDPA_ERR_INVALID_ARGUMENT. */
    float scale;
    /** Softcap c: s = c * tanh(s / c) applied to the scaled scores before bias and mask
     *  (ONNX, FlashAttention, ggml). 0 (default) = off; negative/NaN/Inf rejected. */
    float softcap;

    /** 0 (default) = no causal rule; 1 = key j allowed only if j <= p (see alignment). */
    int32_t causal;
    /** sdpa_alignment of query rows for the causal and window rules. Default TOP_LEFT. */
    int32_t alignment;
    /** [B] per-batch offsets for SDPA_ALIGN_OFFSETS, each in [-2^61, 2^61]; otherwise ignored
     *  (may be NULL). */
    const int64_t *query_offsets;

    /** 0 (default) = no window; 1 = apply the sliding window below. */
    int32_t sliding_window;
    /** sdpa_empty_rows policy. Default SDPA_EMPTY_ROWS_ERROR. */
    int32_t empty_rows;
    /** With sliding_window = 1: inclusive counts of other keys, -1 = unbounded on that side:
     *  key j allowed only if p - window_left <= j <= p + window_right. A Hugging Face
     *  sliding_window=W (with causal) is (W-1, 0). With sliding_window = 1, values < -1 are
     *  SDPA_ERR_INVALID_ARGUMENT; with 0 both sides are ignored, whatever they hold. */
    int64_t window_left;
    int64_t window_right; /**< right side of the window (see window_left); -1 = unbounded */

    /** Allow-mask (nullable), broadcast to [B, Hq, L, S]; nonzero = allowed. */
    const sdpa_allow_mask *allow_mask;
    /** Additive bias (nullable; float32, float16 or bfloat16, widened exactly), rank 1..4
     *  broadcast to [B, Hq, L, S], added after softcap; -inf blocks the key. Entries at
     *  blocked pairs are never read. */
    const sdpa_tensor *bias;

    /** [B] key lengths (nullable): key j allowed only if j < key_lengths[b]; each in [0, S]. */
    const int64_t *key_lengths;
    /** [B] query lengths (nullable): rows i >= query_lengths[b] are padding (right padding);
     *  their output, weights and lse are written as 0, 0 and -inf; each in [0, L]. */
    const int64_t *query_lengths;

    /** sdpa_weights_stage selecting what `weights` holds. Default probabilities. */
    int32_t weights_stage;
    /** 0 (default) = fail with SDPA_ERR_NON_FINITE on NaN/Inf in any value that enters out or
     *  lse (q rows that have an allowed key, K/V rows some query may attend, allowed bias
     *  entries); 1 = skip that scan. */
    int32_t skip_finite_check;

    /** Dropout probability p in [0, 1) (default 0 = none; there is no hidden training mode).
     *  Applied to the probabilities that form `out`: a kept one is scaled by 1/(1-p), a dropped
     *  one is 0 (torch.nn.functional.dropout after softmax). The `weights` output and lse are
     *  the pre-dropout values. The keep decision of element (b, h, i, j) is a pure function of
     *  (dropout_seed, dropout_offset, b, h, i, j), so it does not depend on threads, tiling or
     *  kernel:
     *    key' = words 0..1 of Philox4x32-10(counter {lo32(offset), hi32(offset), 0x53445041, 0},
     *           key {lo32(seed), hi32(seed)})
     *    r    = word (j % 4) of Philox4x32-10(counter {j / 4, i, h, b}, key') (Random123)
     *    kept iff r >= floor(p * 2^32)
     *  with b and h taken modulo 2^32. p = 0 is bit-identical to no dropout. Use a new offset (or
     *  seed) for each call that needs fresh randomness. In a packed batch (cu_seqlens_q, 0.5) b is
     *  the sequence r and i, j count within it: the masks of the padded [num_seqs, Hq, max L_r,
     *  max S_r] call with query/key lengths. */
    float dropout_p;
    /** Threads: 0 (default) = number of online CPUs; >= 1 = at most that many. The library
     *  runs its own threads over (batch, head, query block) and never changes process-wide
     *  state (BLAS thread count, environment). Results never depend on this value. With a
     *  caller pool or hook (0.5: threadpool, parallel_for) it caps the pool's thread count.
     *  A call starts a thread of its own only for work worth what starting one costs, which
     *  the library measures once per process (create + join of an empty thread);
     *  SDPA_THREAD_START_US=N (0..1000, microseconds) in the environment, read once, replaces
     *  the measurement (0: the per-thread minimums of 0.5.0). */
    int32_t num_threads;
    /** Dropout RNG key (seed) and stream offset; see dropout_p. */
    uint64_t dropout_seed;
    uint64_t dropout_offset; /**< dropout stream offset (Philox counter words 0..1); see dropout_p */

    /** Caller workspace (nullable): at least sdpa_attention_workspace_size() bytes, any
     *  alignment, overlapping no input or output (SDPA_ERR_OVERLAP). NULL = the library
     *  allocates what it needs and frees it before returning. */
    void *workspace;
    size_t workspace_bytes; /**< size of workspace in bytes */

    /* ---- appended in 0.2 (a 0.1 caller's smaller struct_size leaves these at defaults) ---- */
    /** sdpa_kernel to run. Default SDPA_KERNEL_AUTO. */
    int32_t kernel;
    /** Must be 0: a later version may give it a meaning, so a non-zero value is
     *  SDPA_ERR_STRUCT_VERSION (as unknown tail bytes beyond struct_size are). */
    int32_t reserved0;

    /* ---- appended in 0.4 (a 0.2/0.3 caller's smaller struct_size leaves these at defaults) ---- */
    /** sdpa_precision (error bounds there). Default SDPA_PRECISION_DEFAULT (= F32); a value that
     *  is not an sdpa_precision is SDPA_ERR_INVALID_ARGUMENT. */
    int32_t precision;
    int32_t reserved1; /**< must be 0 (SDPA_ERR_STRUCT_VERSION otherwise: a later field's use) */

    /* ---- appended in 0.5 (a 0.4 caller's smaller struct_size leaves these at defaults) ---- */
    /** Attention sinks: [Hq] float32 logits (nullable; NULL = none). The sink of query head h
     *  joins the softmax denominator only: with m = max(sinks[h], max_j s_ij),
     *    w_ij = exp(s_ij - m) / (exp(sinks[h] - m) + sum_j exp(s_ij - m)),
     *    lse_i = m + log(exp(sinks[h] - m) + sum_j exp(s_ij - m)).
     *  The sink is not scaled, softcapped, biased or masked and multiplies no value row, so a
     *  row's probabilities sum to less than 1 (gpt-oss `sinks`, llama.cpp ggml_soft_max_add_sinks,
     *  vLLM `s_aux`, ONNX Runtime GroupQueryAttention `head_sink`). It counts exactly once per
     *  row in every kernel (also across the decode kernel's key chunks). It is not a key: the
     *  empty-row policy is unchanged (under SDPA_EMPTY_ROWS_ZERO such a row's out is 0 and its
     *  lse is sinks[h]); padding rows (query_lengths) stay 0 / -inf. -inf means "no sink" for
     *  that head; NaN or +inf is SDPA_ERR_NON_FINITE (always checked, skip_finite_check or not).
     *  With sdpa_merge(): pass the sink to exactly one of the partial calls (the other part's
     *  lse must not contain it), then merge as usual. */
    const float *sinks;
    /** ALiBi slopes (nullable; NULL = none), float32, shape given by alibi_slopes_rank:
     *  s_ij -= alibi_slopes[h] * |p - j| (or alibi_slopes[b * Hq + h] for [B, Hq]), p the aligned
     *  position of row i (see alignment), applied after softcap together with the bias (not
     *  scaled or softcapped; never materialised). FlashAttention's `alibi_slopes` ((nheads,) or
     *  (batch, nheads), fp32, bias -slope * |i + seqlen_k - seqlen_q - j|) is this with
     *  alignment = SDPA_ALIGN_BOTTOM_RIGHT. Slopes from the ALiBi paper: sdpa_alibi_slopes().
     *  NaN/Inf slopes are SDPA_ERR_NON_FINITE (always checked). */
    const float *alibi_slopes;
    /** 0: no ALiBi (alibi_slopes must be NULL); 1: alibi_slopes is [Hq]; 2: [B, Hq] (row-major;
     *  [num_seqs, Hq] with cu_seqlens_q, one row per packed sequence).
     *  Anything else, or slopes without a rank, is SDPA_ERR_INVALID_ARGUMENT. */
    int32_t alibi_slopes_rank;
    /** Most tasks the parallel_for hook below may run at once (>= 1 when the hook is set; the
     *  library calls it with ntasks <= this). Ignored without the hook. */
    int32_t parallel_for_threads;
    /** Caller thread pool hook (nullable; NULL = the library's own threads, or `threadpool`).
     *  Contract: called only from the thread that called sdpa_attention(), zero or more times
     *  per call, never nested; it must call task(task_ctx, t) exactly once for every t in
     *  [0, ntasks), in any order, on any threads (concurrently or not, the caller's thread
     *  included), and return only after every one of them has returned. Tasks never block on
     *  each other, so running them one after the other on the calling thread is valid. With a
     *  hook the library creates no thread. Results are bit-identical to the built-in threads
     *  for any thread count (ONNX Runtime's ThreadPool::TrySimpleParallelFor, ggml's
     *  threadpool). Setting both this and `threadpool` is SDPA_ERR_INVALID_ARGUMENT. A hook
     *  found breaking the contract (a task number outside [0, ntasks) or run twice: refused,
     *  not run; a task not run; returning while the call's work is unfinished) makes the call
     *  return SDPA_ERR_INVALID_ARGUMENT with the outputs undefined (a hook that runs nothing
     *  leaves them untouched). */
    sdpa_parallel_for_fn parallel_for;
    void *parallel_for_ctx; /**< first argument of every parallel_for call */
    /** A caller-owned sdpa_threadpool (nullable; see sdpa_threadpool_create()). The call runs
     *  on the pool's threads plus the calling thread and creates no thread. num_threads, if
     *  > 0, caps the threads used (pool size otherwise). */
    sdpa_threadpool *threadpool;

    /* ---- appended in 0.5: paged K/V and packed variable-length batches (docs/serving.md) ---- */
    /** Paged K/V (nullable; NULL = k and v are ordinary [B, Hkv, S, E] views). With a block
     *  table, k and v are block pools: k [num_blocks, Hkv, block_size, E] and v [num_blocks, Hkv,
     *  block_size, Ev], rank 4, any strides (vLLM's [num_blocks, block_size, Hkv, E] cache is the
     *  view with strides {bs*Hkv*E, E, Hkv*E, 1}); key_lengths is required and gives each
     *  sequence's keys. Key j of sequence b lives in block block_table[b * block_table_stride +
     *  j / block_size], slot j % block_size (vLLM block_tables, FlashAttention-2 block_table,
     *  ONNX Runtime PagedAttention). The logical S is max_blocks_per_seq * block_size, so
     *  key_lengths[b] <= S. Every entry a key j < key_lengths[b] reaches must be in
     *  [0, num_blocks) (else SDPA_ERR_INDEX naming b, the block and the value, before anything
     *  is written); entries past a sequence's last block, slots past its length and blocks no
     *  table entry names are never read (the weights' score stages see zero rows there). Rows
     *  are [B, ...] or, with cu_seqlens_q, [num_seqs, ...]. block_size = 0 is
     *  SDPA_ERR_EMPTY_DIMENSION; block_table without key_lengths SDPA_ERR_NULL_POINTER. Every
     *  kernel and precision reads a paged cache (bf16 REDUCED included: the same kernel and bits
     *  as the dense view of the same keys). */
    const int32_t *block_table;
    /** Elements between rows of block_table; 0 (default) = max_blocks_per_seq; else >=
     *  max_blocks_per_seq (SDPA_ERR_INVALID_ARGUMENT otherwise, also when negative). */
    int64_t block_table_stride;
    /** Columns of block_table (>= 1 with a block table). */
    int64_t max_blocks_per_seq;
    /** Packed variable-length batch (nullable; FlashAttention flash_attn_varlen_func): the
     *  queries of num_seqs sequences packed without padding along q's axis 2, sequence r owning
     *  rows [cu_seqlens_q[r], cu_seqlens_q[r+1]). q is [1, Hq, total_q, E] (FlashAttention's
     *  [total_q, Hq, E] buffer is the view with strides {0, E, Hq*E, 1}), out [1, Hq, total_q,
     *  Ev], lse [1, Hq, total_q]; weights are not available (SDPA_ERR_UNSUPPORTED). Keys of
     *  sequence r: with cu_seqlens_k, rows [cu_seqlens_k[r], cu_seqlens_k[r+1]) of k [1, Hkv,
     *  total_k, E] and v; with a block table, row r of it and key_lengths[r] (a paged cache);
     *  otherwise SDPA_ERR_NULL_POINTER; cu_seqlens_k and a block table together are
     *  SDPA_ERR_INVALID_ARGUMENT; q of another rank SDPA_ERR_RANK. Both arrays have num_seqs + 1 entries, start at 0, never
     *  decrease and end at total_q (total_k); else SDPA_ERR_INDEX naming the entry. Each
     *  sequence gets exactly what one sdpa_attention call over it alone (B = 1) gives (dropout
     *  aside: sequence r draws its mask as batch row b = r, see dropout_p):
     *  causal and windows are bottom-right per sequence (p = i + S_r - L_r; alignment TOP_LEFT
     *  or BOTTOM_RIGHT, as FlashAttention varlen) or p = i + query_offsets[r] (OFFSETS);
     *  key_lengths and query_offsets are indexed by r; query_lengths and allow_mask/bias are not
     *  available with cu_seqlens_q (SDPA_ERR_UNSUPPORTED). */
    const int32_t *cu_seqlens_q;
    /** Packed keys (nullable): int32 [num_seqs + 1]; sequence r's keys are rows
     *  [cu_seqlens_k[r], cu_seqlens_k[r+1]) of k [1, Hkv, total_k, E] and v (see cu_seqlens_q;
     *  NULL with a block table: the paged cache gives the keys). Only with cu_seqlens_q: set
     *  without it, SDPA_ERR_INVALID_ARGUMENT (a padded batch gives key_lengths instead). */
    const int32_t *cu_seqlens_k;
    /** Sequences R of a packed batch (0 <= R < 2^31, else SDPA_ERR_INVALID_ARGUMENT; used only
     *  with cu_seqlens_q). */
    int64_t num_seqs;

    /* ---- appended in 0.6: 8-bit K/V caches (a 0.5 caller's smaller struct_size leaves these NULL) ---- */
    /** Scale of an FP8 key cache (nullable; NULL = 1): a float32 view, the key's element value
     *  being fp8 * scale, one float32 multiply (vLLM kv_cache_dtype "fp8" with `k_scale`,
     *  FlashAttention-3 descale_k). Shapes: [1] (per tensor) or [Hkv] (per kv head, vLLM's
     *  per-head scales; any stride); per-token scales are not taken (SDPA_ERR_SHAPE). Each
     *  scale read must be finite and >= 0 (else SDPA_ERR_INVALID_ARGUMENT naming the entry,
     *  always checked). Set while key is not SDPA_DTYPE_FP8_E4M3 / _FP8_E5M2:
     *  SDPA_ERR_INVALID_ARGUMENT (q8_0 carries its scales in its blocks). Another dtype than
     *  float32: SDPA_ERR_DTYPE; rank other than 1: SDPA_ERR_RANK. */
    const sdpa_tensor *k_scale;
    /** Scale of an FP8 value cache (nullable; NULL = 1): as k_scale, for value ([1] or [Hkv]). */
    const sdpa_tensor *v_scale;
} sdpa_options;

/**
 * Fill the first `struct_size` bytes of *options with the defaults documented on each field
 * (all zero, window sides -1) and set options->struct_size = struct_size. Writes exactly struct_size bytes, so a caller
 * compiled against an older (smaller) sdpa_options is safe with a newer library; bytes the
 * library does not know are zeroed. Does nothing if options is NULL or struct_size is smaller
 * than sizeof(size_t). For ctypes: pass ctypes.sizeof(your Structure).
 */
SDPA_API void sdpa_options_init_sized(sdpa_options *options, size_t struct_size);

/** Fill *options with the defaults for the sdpa_options of this header (inline, so the size
 *  is the caller's): sdpa_options_init_sized(options, sizeof(sdpa_options)). */
static inline void sdpa_options_init(sdpa_options *options) {
    sdpa_options_init_sized(options, sizeof(sdpa_options));
}

/* --------------------------------------------------------------- attention */

/**
 * Scaled dot-product attention with explicit mask semantics.
 * Matches torch.nn.functional.scaled_dot_product_attention (attn_mask bool = allow,
 * is_causal = causal top-left, scale, enable_gqa) and ONNX Attention-23/24 (+ errata)
 * including softcap, qk_matmul_output modes and causal offsets with a cache.
 *
 * Shapes (rank 4, multi-head):
 *   q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] -> out [B, Hq, L, Ev]
 *   weights [B, Hq, L, S] (nullable), lse [B, Hq, L] (nullable)
 * Rank 3 means one head: q [B, L, E], k [B, S, E], v [B, S, Ev] -> out [B, L, Ev],
 *   weights [B, L, S], lse [B, L]. q, k, v and out have the same rank.
 * Any strides (BSHD and BHSD views of one buffer give the same result; stride 0 broadcasts
 * an input). Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv) (contiguous groups,
 * GQA/MQA as PyTorch enable_gqa and ONNX).
 *
 * For each row (b, h, i) and key j:
 *   s = scale * <q_i, k_j>; softcap; s += bias (0.5: and s -= alibi_slopes[h] * |p - j|,
 *   sdpa_options.alibi_slopes); the key is allowed iff the allow-mask, the
 *   causal rule, key_lengths, the window and bias != -inf all allow it. Softmax runs over
 *   allowed keys only (blocked K/V/bias values never enter out or lse: NaN there cannot
 *   leak). out_i = sum_j w_ij v_j; lse_i = ln sum_j exp(s_ij) (natural log). 0.5: an
 *   attention sink of head h (sdpa_options.sinks) adds exp(sinks[h]) to the denominator and
 *   to lse only.
 *   Causal and window positions: p = i (TOP_LEFT), i + S_b - L_b (BOTTOM_RIGHT, with
 *   S_b = key_lengths[b] or S and L_b = query_lengths[b] or L, so the last valid query of each
 *   sequence sees every valid key, as FlashAttention varlen), or i + query_offsets[b].
 *   The weights stages SCORES and SOFTCAPPED hold the score of every pair, blocked ones
 *   included (ONNX qk_matmul_output modes 0 and 1): only for them are blocked K rows read,
 *   and they are not covered by the finite check.
 *   A row that float32 cannot carry although its inputs are finite (a score q.k or the
 *   P.V sum overflows) is recomputed in double precision, so finite inputs never give NaN or
 *   Inf in out; score-stage weights entries are recomputed the same way.
 *
 * Validation runs completely before any output byte is written; on failure every output
 * is untouched and sdpa_last_error_message() names the argument, axis and values.
 *
 * Size limit: L, S, E and Ev must each be below 2^31 (else SDPA_ERR_SIZE_OVERFLOW), on every
 * path: the kernels keep key positions, row indices and head widths in 32-bit integers (in
 * their workspaces and SIMD lanes). B and H are not limited beyond the int64_t/size_t products.
 *
 * Dtypes (0.4): q, k, v, out and options->bias may each be SDPA_DTYPE_F32, _F16 or _BF16,
 *   independently (e.g. float32 q with a float16 K/V cache); weights and lse are float32.
 *   Inputs are widened exactly to float32; scores, softmax and accumulation run in float32
 *   (see sdpa_precision for what SDPA_PRECISION_REDUCED may change, and the error bounds);
 *   an f16/bf16 out is rounded once, to nearest even. The finite check and every masked-value
 *   guarantee hold for every dtype (f16/bf16 Inf and NaN encodings included).
 * 8-bit K/V caches (0.6): k and v (only they: an 8-bit q, out or bias is SDPA_ERR_DTYPE) may
 *   also be SDPA_DTYPE_Q8_0 (ggml block_q8_0; E or Ev a multiple of 32), SDPA_DTYPE_FP8_E4M3 or
 *   SDPA_DTYPE_FP8_E5M2 (with options->k_scale / v_scale), independently of each other (a q8_0
 *   K with an f16 V, as llama.cpp allows), for dense, strided, paged and packed calls, on every
 *   kernel. Each stored element is dequantized exactly to float32 (q8_0: f16 d widened, times
 *   the int8, one float32 multiply, as ggml's dequantize_row_q8_0; fp8: the exact float32 of
 *   the encoding times the scale, one float32 multiply), and the call then computes attention
 *   on those float32 K/V values exactly as for a float32 cache. Accuracy: the error against a
 *   float64 evaluation on the DEQUANTIZED values is the float32 bound of sdpa_precision
 *   (DEFAULT; every 8-bit dtype, every kernel and ISA). What the cache lost when it was written
 *   (the quantization error: q8_0 about |d| / 2 per element, E4M3 2^-4 and E5M2 2^-3 relative,
 *   times the scale) is the writer's, documented at sdpa_kv_write(). NaN encodings (E4M3FN
 *   0x7F/0xFF, E5M2 exponent all ones, a q8_0 block whose d is Inf or NaN) in a row some query
 *   attends are SDPA_ERR_NON_FINITE under the finite check; in a masked row they are never read.
 *
 * @param q       [in] query view [B, Hq, L, E] (or [B, L, E]), float32, float16 or bfloat16.
 * @param k       [in] key view [B, Hkv, S, E] (or [B, S, E]), float32, float16 or bfloat16;
 *                0.6: or q8_0, fp8_e4m3, fp8_e5m2 (an 8-bit cache; options->k_scale).
 * @param v       [in] value view [B, Hkv, S, Ev] (or [B, S, Ev]), float32, float16 or bfloat16;
 *                0.6: or q8_0, fp8_e4m3, fp8_e5m2 (options->v_scale).
 * @param options [in] nullable (= defaults); see sdpa_options.
 * @param out     [out] float32, float16 or bfloat16 [B, Hq, L, Ev]; its address range must not overlap the address
 *                range of any input or other output (checked conservatively on ranges).
 * @param weights [out] nullable; float32 [B, Hq, L, S]; content per options->weights_stage.
 * @param lse     [out] nullable; float32 [B, Hq, L]; -inf for padded rows and for empty rows
 *                (empty rows with a sink: the sink).
 * @retval SDPA_OK
 * @retval SDPA_ERR_NULL_POINTER   q, k, v, out or a view's data (non-empty) is NULL; (0.5)
 *                                 block_table without key_lengths, cu_seqlens_q without keys
 *                                 (cu_seqlens_k or a block table); SDPA_ALIGN_OFFSETS without
 *                                 query_offsets
 * @retval SDPA_ERR_STRUCT_VERSION options->struct_size out of range, unknown tail not zero, or
 *                                 options->reserved0 not 0
 * @retval SDPA_ERR_RANK           rank other than 3/4, mismatched ranks, mask rank not 1..4
 * @retval SDPA_ERR_SHAPE          B, H, E, S or Ev disagree; Hq % Hkv != 0; weights/lse shape
 * @retval SDPA_ERR_BROADCAST      allow-mask or bias not broadcastable to [B, Hq, L, S]
 * @retval SDPA_ERR_STRIDE         output stride <= 0 on a dimension of size > 1, or self-overlap
 * @retval SDPA_ERR_OVERLAP        an output overlaps an input, another output or the workspace,
 *                                 or the workspace overlaps an input
 * @retval SDPA_ERR_SIZE_OVERFLOW  shape products overflow, or L, S, E or Ev >= 2^31; a block
 *                                 table's extent ((B-1) * stride + max_blocks_per_seq) overflows
 * @retval SDPA_ERR_EMPTY_DIMENSION E == 0; a block pool's block_size == 0
 * @retval SDPA_ERR_ALIGNMENT      (0.6) a view's data, or an array of the options (lengths,
 *                                 offsets, block table, cu_seqlens, sinks, slopes), not aligned
 *                                 to its element size (see sdpa_tensor)
 * @retval SDPA_ERR_DTYPE          a dtype that is not an sdpa_dtype, or weights / lse not float32
 * @retval SDPA_ERR_INVALID_ARGUMENT scale/softcap NaN, Inf or negative; window < -1; a key or
 *                                 query length outside [0, S] / [0, L]; dropout_p outside
 *                                 [0, 1); unknown enum value;
 *                                 flag not 0/1; a view's or mask's reserved field or entry
 *                                 beyond rank not 0; alibi_slopes_rank not 0/1/2 or not
 *                                 matching alibi_slopes; parallel_for with threadpool, or
 *                                 with parallel_for_threads < 1;
 *                                 cu_seqlens_k without cu_seqlens_q; (0.5) max_blocks_per_seq
 *                                 < 1 or block_table_stride negative or below it with a block
 *                                 table; cu_seqlens_k with a block table; num_seqs outside
 *                                 [0, 2^31)
 * @retval SDPA_ERR_UNSUPPORTED    options->kernel forces a kernel that cannot serve this call;
 *                                 weights, query_lengths, allow_mask or bias with cu_seqlens_q
 * @retval SDPA_ERR_INDEX          (0.5) a block_table entry a valid key reaches is outside
 *                                 [0, num_blocks), or a cu_seqlens entry is out of order or
 *                                 does not end at total_q / total_k
 * @retval SDPA_ERR_EMPTY_ROW      a non-padding row has no allowed key under policy ERROR
 * @retval SDPA_ERR_NON_FINITE     NaN/Inf in a value that enters out (unless skip_finite_check);
 *                                 a NaN/+inf sink or a NaN/Inf ALiBi slope (always)
 * @retval SDPA_ERR_WORKSPACE_TOO_SMALL / SDPA_ERR_OUT_OF_MEMORY
 * Thread-safe: concurrent calls on different outputs are fine.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_attention(const sdpa_tensor *q, const sdpa_tensor *k,
                                                   const sdpa_tensor *v, const sdpa_options *options,
                                                   const sdpa_tensor *out, const sdpa_tensor *weights,
                                                   const sdpa_tensor *lse);

/**
 * Bytes of workspace sdpa_attention() needs for these shapes, strides and options
 * (including options->num_threads). It never grows with B*H*L*S: per thread it is
 * O(rows_per_block * S + S * (E + Ev)) floats. It is the same in every process for the same
 * arguments and CPU count (num_threads = 0): sized for the most threads the call may use,
 * whatever start-up cost a process measured (a call that starts fewer needs less).
 * @param q       as it will be passed to sdpa_attention() (values are not read).
 * @param k       likewise.   @param v likewise.   @param options likewise.
 * @param weights_requested nonzero if the call will pass a weights output.
 * @param bytes [out] the size.
 * @retval SDPA_OK or any validation error of sdpa_attention() that depends only on
 *         q, k, v and options shapes (not on values).
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_attention_workspace_size(const sdpa_tensor *q,
                                                                  const sdpa_tensor *k,
                                                                  const sdpa_tensor *v,
                                                                  const sdpa_options *options,
                                                                  int weights_requested,
                                                                  size_t *bytes);

/* ----------------------------------------------------------- mask builders */
/*
 * Builders write contiguous row-major uint8 allow-masks (1 = allowed, 0 = blocked) into
 * caller buffers. On failure nothing is written.
 */

/**
 * Causal allow-mask [L, S]: out[i, j] = 1 iff j <= p(i), p(i) = i (TOP_LEFT; torch.tril)
 * or i + S - L (BOTTOM_RIGHT). SDPA_ALIGN_OFFSETS is rejected here (use the option).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (L or S < 0),
 *         SDPA_ERR_INVALID_ARGUMENT (alignment), SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_causal(uint8_t *out, int64_t L, int64_t S,
                                                     sdpa_alignment alignment);

/** Which end of a sequence holds the padding. */
typedef enum sdpa_padding_side {
    SDPA_PAD_RIGHT = 0, /**< valid tokens first: position t valid iff t < length */
    SDPA_PAD_LEFT = 1,  /**< padding first: position t valid iff t >= N - length */
    SDPA_PAD_FORCE_INT32_ = 0x7FFFFFFF /**< not a value: keeps the enum int-sized */
} sdpa_padding_side;

/**
 * Padding allow-mask [B, N] from per-batch valid lengths. View it as [B, 1, 1, S] for key
 * padding (N = S), or as [B, 1, L, 1] for query padding (N = L) and combine with
 * sdpa_mask_and(); rows with no key then need SDPA_EMPTY_ROWS_ZERO.
 * @param out     [out] B * N bytes.
 * @param B       number of sequences, >= 0.   @param N padded length, >= 0.
 * @param lengths [B], each in [0, N].
 * @param side    SDPA_PAD_RIGHT or SDPA_PAD_LEFT.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (B or N < 0),
 *         SDPA_ERR_INVALID_ARGUMENT (length out of range, bad side), SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_padding(uint8_t *out, int64_t B, int64_t N,
                                                      const int64_t *lengths, sdpa_padding_side side);

/**
 * Sliding-window allow-mask [L, S]: out[i, j] = 1 iff p - left <= j <= p + right, with p
 * aligned as in sdpa_mask_causal(); -1 = unbounded. Hugging Face sliding_window=W with
 * causal is (W-1, 0).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE, SDPA_ERR_INVALID_ARGUMENT
 *         (left/right < -1, alignment), SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_sliding_window(uint8_t *out, int64_t L, int64_t S,
                                                             int64_t left, int64_t right,
                                                             sdpa_alignment alignment);

/**
 * Block-diagonal allow-mask [Lt, St] for packed variable-length batches (FlashAttention
 * varlen): sequence n owns query rows cu_seqlens_q[n] .. cu_seqlens_q[n+1]-1 and keys
 * cu_seqlens_k[n] .. cu_seqlens_k[n+1]-1; a query sees only the keys of its own sequence,
 * and with causal != 0 only those j <= p inside the block (p aligned per `alignment`
 * within the block). Lt = cu_seqlens_q[num_seqs], St = cu_seqlens_k[num_seqs].
 * @param out          [out] Lt * St bytes.
 * @param num_seqs     number of sequences, >= 0.
 * @param cu_seqlens_q [num_seqs + 1], starting at 0, non-decreasing.
 * @param cu_seqlens_k [num_seqs + 1] or NULL (= cu_seqlens_q, self-attention).
 * @param causal       0 or 1: also the causal rule inside each block.
 * @param alignment    SDPA_ALIGN_TOP_LEFT or SDPA_ALIGN_BOTTOM_RIGHT (per block).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_INVALID_ARGUMENT (cu_seqlens not
 *         starting at 0 or decreasing, num_seqs < 0, causal not 0/1, alignment),
 *         SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_block_diagonal(uint8_t *out, int64_t num_seqs,
                                                             const int64_t *cu_seqlens_q,
                                                             const int64_t *cu_seqlens_k,
                                                             int32_t causal,
                                                             sdpa_alignment alignment);

/**
 * Prefix-LM allow-mask [T, T]: out[i, j] = 1 iff j < prefix_length (bidirectional prefix)
 * or j <= i (causal suffix). As in T5/PaLM prefix-LM and UniLM.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (T < 0),
 *         SDPA_ERR_INVALID_ARGUMENT (prefix_length outside [0, T]), SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_prefix_lm(uint8_t *out, int64_t T,
                                                        int64_t prefix_length);

/**
 * Logical AND of two allow-masks with numpy broadcasting: out (contiguous, shape
 * out_shape[out_rank]) = (a != 0) & (b != 0), where a and b broadcast to out_shape.
 * `out` must not overlap a or b (SDPA_ERR_OVERLAP).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_RANK, SDPA_ERR_SHAPE,
 *         SDPA_ERR_BROADCAST, SDPA_ERR_OVERLAP, SDPA_ERR_SIZE_OVERFLOW
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_and(const sdpa_allow_mask *a, const sdpa_allow_mask *b,
                                                  uint8_t *out, int32_t out_rank,
                                                  const int64_t *out_shape);

/**
 * Convert an IGNORE mask (nonzero = do NOT attend: nn.MultiheadAttention key_padding_mask
 * and bool attn_mask, torch.triu(ones, 1)) of n elements into an allow-mask: out = (in == 0).
 * In-place (out == ignore) is allowed; any other overlap is SDPA_ERR_OVERLAP.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (n < 0), SDPA_ERR_OVERLAP
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_from_ignore(const uint8_t *ignore, int64_t n,
                                                          uint8_t *out);

/**
 * Convert a KEEP int mask (1 = attend, 0 = masked: ONNX Runtime mask_index / HF
 * attention_mask) of n int32 elements into an allow-mask. Values other than 0 and 1 are
 * rejected (a sequence length passed by mistake is caught).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (n < 0), SDPA_ERR_OVERLAP (keep and
 *         out overlap), SDPA_ERR_INVALID_ARGUMENT (value not 0/1; message names the index)
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_from_keep_int(const int32_t *keep, int64_t n,
                                                            uint8_t *out);

/**
 * Convert an ADDITIVE float mask (0 = attend, -inf = masked: PyTorch float attn_mask,
 * ONNX float attn_mask) of n elements into an allow-mask.
 * Without threshold (NULL): 0 -> 1, -inf -> 0, anything else (finite non-zero, +inf, NaN)
 * is SDPA_ERR_INVALID_ARGUMENT (such a mask is a bias: pass it as options.bias).
 * With *threshold: v <= *threshold -> 0 (e.g. -1e4 or FLT_MIN-style masks), v > *threshold
 * -> 1; NaN is still rejected.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (n < 0), SDPA_ERR_OVERLAP,
 *         SDPA_ERR_INVALID_ARGUMENT
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_from_additive(const float *additive, int64_t n,
                                                            const float *threshold, uint8_t *out);

/**
 * Convert an allow-mask of n elements into an additive float mask: nonzero -> 0.0f,
 * 0 -> -inf (what PyTorch/ONNX float masks mean).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_SHAPE (n < 0), SDPA_ERR_OVERLAP
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_to_additive(const uint8_t *allow, int64_t n,
                                                          float *out);

/**
 * Count the rows of an allow-mask (all dimensions but the last; the last is the key axis)
 * that allow no key. With a mask of shape [..., S], S = 0 makes every row empty.
 * @param mask  the allow-mask (rank 1..SDPA_MASK_MAX_RANK).
 * @param empty_rows [out] number of empty rows.
 * @param first_empty [out, nullable] flat row-major index of the first empty row, or -1.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_RANK, SDPA_ERR_SHAPE, SDPA_ERR_SIZE_OVERFLOW,
 *         SDPA_ERR_INVALID_ARGUMENT (reserved0 or an entry beyond rank not 0)
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mask_count_empty_rows(const sdpa_allow_mask *mask,
                                                               int64_t *empty_rows,
                                                               int64_t *first_empty);

/* ------------------------------------------------------- merging partials */

/**
 * Merge attention computed over two disjoint key sets A and B of the same query rows into
 * attention over A ∪ B (split-KV decode, sequence-parallel / ring attention, a cached prefix
 * plus new keys). Per row r, with m = max(lse_a[r], lse_b[r]):
 *     wa = exp(lse_a[r] - m), wb = exp(lse_b[r] - m)
 *     out[r, :] = (wa * out_a[r, :] + wb * out_b[r, :]) / (wa + wb)
 *     lse[r]    = m + log(wa + wb)
 * computed in double precision. A row whose lse on one side is -inf (no allowed key there)
 * takes the other side's values exactly (its out row is not read); both -inf gives a zero row
 * and lse = -inf (as sdpa_attention's SDPA_EMPTY_ROWS_ZERO). An lse of +inf is read as -inf,
 * as vLLM's merge_attn_states does: FlashAttention-2's forward writes +inf for a row with no
 * key (FlashAttention-3 and libsdpa write -inf), and no finite scores give +inf. The result
 * equals sdpa_attention() over A ∪ B up to float32 rounding (as in FlashAttention's split-KV
 * combine).
 * Dropout does not split: a part draws its keep decisions by its own (b, h, i, j), so parts
 * called with the same dropout_seed and dropout_offset drop the same local positions
 * (correlated masks), and no split reproduces the single call's mask. Give each part its
 * own dropout_offset: as lse is pre-dropout, the merge is then a valid dropout of the whole
 * call, with a different mask. Inference splits run without dropout.
 * Attention sinks (sdpa_options.sinks): the sink is one more term of the denominator, so it
 * must be in exactly one part's lse: call one part with the sinks and the others without
 * (a sink in two parts would count twice). A part whose keys are all blocked but which
 * carries the sink has out 0 and lse = the sink (under SDPA_EMPTY_ROWS_ZERO), which merges
 * correctly.
 *
 * Dtypes: float32 views only (float16/bfloat16 are SDPA_ERR_DTYPE).
 * Shapes: out_a, out_b, out [..., Ev] of rank 1..SDPA_MAX_RANK, all equal; lse_a, lse_b,
 * lse [...] = the out shape without its last axis (rank - 1; for rank-1 outs a rank-1
 * view of shape [1]). Any strides on inputs; outputs need the output layout rules of
 * sdpa_attention. In place is allowed: `out` may be exactly the view out_a or out_b (same data
 * and strides), and `lse` exactly lse_a or lse_b; any other overlap is SDPA_ERR_OVERLAP.
 * @param out_a the part over key set A: out [..., Ev].   @param lse_a its lse [...].
 * @param out_b the part over key set B, same shape.   @param lse_b its lse.
 * @param out [out] the merged out [..., Ev].
 * @param lse [out] nullable.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_DTYPE, SDPA_ERR_RANK, SDPA_ERR_SHAPE,
 *         SDPA_ERR_STRIDE, SDPA_ERR_OVERLAP, SDPA_ERR_SIZE_OVERFLOW,
 *         SDPA_ERR_NON_FINITE (lse NaN, or a non-finite out entry in a row whose lse is
 *         finite), SDPA_ERR_INVALID_ARGUMENT (reserved field not 0), SDPA_ERR_ALIGNMENT (0.6)
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_merge(const sdpa_tensor *out_a, const sdpa_tensor *lse_a,
                                               const sdpa_tensor *out_b, const sdpa_tensor *lse_b,
                                               const sdpa_tensor *out, const sdpa_tensor *lse);

/* ------------------------------------------------------------ cache write */

/**
 * Scatter new K/V rows into a cache by slot index (vLLM reshape_and_cache's slot_mapping
 * contract). The cache is a block pool key_cache [num_blocks, Hkv, block_size, E] and
 * value_cache [num_blocks, Hkv, block_size, Ev] (any positive strides, as for every output: zero
 * or negative ones are SDPA_ERR_STRIDE; a dense [B, Hkv, S, E] cache is the pool with
 * num_blocks = B, block_size = S), rows key [T, Hkv, E], value [T, Hkv, Ev] (any strides). A
 * pool with block_size = 0 has no slot: every non-negative slot is SDPA_ERR_INDEX. The two
 * caches must not share bytes (SDPA_ERR_OVERLAP, by address range): a cache interleaving K and
 * V per block (FlashInfer's [num_blocks, 2, block_size, Hkv, E]) is written with two keys-only
 * calls, one per view.
 * Row t goes to block slot_mapping[t] / block_size, slot slot_mapping[t] % block_size (so
 * slot = block * block_size + offset); a negative slot skips the row (padding tokens, as vLLM).
 * Rows of any dtype are converted to the cache's dtype with round-to-nearest-even (exact when
 * the dtypes are equal or the cache is wider; a finite value beyond an f16 cache's range, e.g.
 * 65536, becomes +-inf as IEEE rounding says, and a later sdpa_attention that reads it fails
 * its finite check). Values are not checked here. Every slot is validated before anything is
 * written: a slot >= num_blocks * block_size is SDPA_ERR_INDEX naming the row and value. Rows
 * are written in order t = 0..T-1 (two rows naming one slot: the later wins, as in vLLM).
 * value_cache and value may both be NULL (keys only). On the caller's thread; no allocation.
 * 0.6: this is sdpa_kv_write_ex(..., NULL): the caches may also be q8_0 or FP8 (scale 1), as
 * described there.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_DTYPE, SDPA_ERR_RANK, SDPA_ERR_SHAPE,
 *         SDPA_ERR_STRIDE (cache self-overlapping), SDPA_ERR_OVERLAP (rows or slot_mapping
 *         overlap a cache, or the caches each other), SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_INDEX,
 *         SDPA_ERR_ALIGNMENT (0.6: a view, or slot_mapping not 8-byte aligned)
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_kv_write(const sdpa_tensor *key_cache, const sdpa_tensor *value_cache,
                                                  const sdpa_tensor *key, const sdpa_tensor *value,
                                                  const int64_t *slot_mapping);

/* ---------------------------------------------------- rotary embedding (0.6) */

/**
 * Rotary position embedding (RoPE) parameters (0.6), for sdpa_rope() and
 * sdpa_kv_write_options.rope. Versioned: set struct_size = sizeof(sdpa_rope_params) (or use
 * sdpa_rope_params_init()); fields are only ever appended; reserved fields must be 0
 * (SDPA_ERR_STRUCT_VERSION otherwise).
 *
 * A row x of E elements at position p is rotated on its first rotary_dim elements (the rest are
 * copied): for i in [0, rotary_dim / 2), with the pair (a, b) =
 *   - interleaved = 0 (GPT-NeoX / HF `rotate_half`, FlashAttention `interleaved=False`):
 *     (x[i], x[i + rotary_dim / 2]);
 *   - interleaved = 1 (GPT-J / FlashAttention `interleaved=True`): (x[2i], x[2i + 1]);
 * a' = a * cos(p, i) - b * sin(p, i), b' = b * cos(p, i) + a * sin(p, i), computed in float32
 * (each product rounded, then one add: no fused multiply-add) and narrowed to the output dtype with
 * round-to-nearest-even. cos(p, i) / sin(p, i) are the tables' [p, i] entries (float32 views
 * [max_pos, rotary_dim / 2], any strides, as HF's and FlashAttention's cos/sin caches; only the
 * rows a call uses are read, and they must be finite), or, when both tables are NULL, HF's and
 * vLLM's float32 recipe (`inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim))`,
 * `freqs = float32(t) * inv_freq`, `cos = freqs.cos()`), evaluated as: b = float32(theta);
 * inv_freq[i] = 1.0f / float32(pow(b, float32(2i) / float32(rotary_dim))) (pow in double, rounded
 * once to float32; float32 divisions); angle = float32(p) * inv_freq[i] in float32; cos(p, i) /
 * sin(p, i) = cos / sin of that float32 angle computed in double and rounded once to float32.
 * PyTorch's own float32 pow and cos / sin are not correctly rounded (SLEEF, 1 ulp), so against
 * torch 1.13.1 the recipe's inv_freq differs in 0-3 of rotary_dim / 2 entries by 1-2 ulp (bases
 * 1e4 .. 5e6, dims 64 .. 256) and cos / sin by 1 ulp in about 5% of the entries: within about
 * 1e-6 absolute of HF's cos / sin up to p = 32767 (tests/python/test_rope.py), not bit for bit.
 * The float32 angle itself carries HF's error, up to about p * inv_freq * 2^-23 radians against
 * the exact rotation; for long contexts pass tables computed in double. With tables the result
 * equals, bit for bit, PyTorch's float32 evaluation of FlashAttention's `apply_rotary_emb` / HF
 * transformers' `apply_rotary_pos_emb` on the same tables (their semantics; tests/test_rope.c,
 * tests/python/test_rope.py).
 */
typedef struct sdpa_rope_params {
    size_t struct_size;      /**< sizeof(sdpa_rope_params) as compiled by the caller */
    int64_t rotary_dim;      /**< even, 2 <= rotary_dim <= E; 0 (default) = E; above 2048: SDPA_ERR_SHAPE */
    int32_t interleaved;     /**< 0 (default): NeoX half-split pairs; 1: GPT-J adjacent pairs; else SDPA_ERR_INVALID_ARGUMENT */
    int32_t reserved0;       /**< must be 0 */
    const sdpa_tensor *cos;  /**< float32 [max_pos, rotary_dim / 2] or NULL (then sin NULL too: theta) */
    const sdpa_tensor *sin;  /**< float32 [max_pos, rotary_dim / 2] or NULL */
    double theta;            /**< base when the tables are NULL: 0 (default) = 10000; > 0 and finite once rounded to float32 (as PyTorch rounds it) */
} sdpa_rope_params;

/** Fill the first struct_size bytes of *params with the defaults (all zero) and set struct_size. */
SDPA_API void sdpa_rope_params_init_sized(sdpa_rope_params *params, size_t struct_size);
/** sdpa_rope_params_init_sized(params, sizeof(sdpa_rope_params)). */
static inline void sdpa_rope_params_init(sdpa_rope_params *params) {
    sdpa_rope_params_init_sized(params, sizeof(sdpa_rope_params));
}

/**
 * Rotate rows by RoPE (0.6): out[t, h, :] = rope(x[t, h, :], positions[t]) for x, out
 * [T, H, E] (any strides; a [B, L, H, E] BSHD query is T = B * L rows), dtypes float32 /
 * float16 / bfloat16 each. out may be exactly x (in place: same data, strides and dtype); any
 * other overlap is SDPA_ERR_OVERLAP. positions [T] (int64): position of each row,
 * 0 <= p < max_pos of the tables (SDPA_ERR_INDEX naming the row) or >= 0 with theta.
 * Everything is validated before anything is written. Use it for queries (apply the same
 * params as the keys' sdpa_kv_write_ex) before sdpa_attention. See sdpa_rope_params for the
 * formula and conventions.
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER, SDPA_ERR_DTYPE, SDPA_ERR_RANK, SDPA_ERR_SHAPE,
 *         SDPA_ERR_STRIDE, SDPA_ERR_OVERLAP, SDPA_ERR_INDEX, SDPA_ERR_INVALID_ARGUMENT,
 *         SDPA_ERR_STRUCT_VERSION, SDPA_ERR_NON_FINITE (a table entry), SDPA_ERR_ALIGNMENT
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_rope(const sdpa_tensor *x, const sdpa_tensor *out,
                                              const int64_t *positions, const sdpa_rope_params *params);

/**
 * Options of sdpa_kv_write_ex() (0.6). Versioned like sdpa_options: set struct_size (or use
 * sdpa_kv_write_options_init()); all-zero means "as sdpa_kv_write".
 */
typedef struct sdpa_kv_write_options {
    size_t struct_size;             /**< sizeof(sdpa_kv_write_options) as compiled by the caller */
    /** FP8 key cache scale (nullable = 1): float32 [1] or [Hkv]; stored fp8 = round(x / scale),
     *  the same scale sdpa_options.k_scale later reads. Finite and > 0. Non-FP8 caches: must be NULL. */
    const sdpa_tensor *k_scale;
    const sdpa_tensor *v_scale;     /**< as k_scale, for the value cache */
    /** RoPE applied to the key rows before they are converted and stored (nullable: none);
     *  FlashAttention's `flash_attn_with_kvcache(rotary_cos, rotary_sin)`, vLLM's fused rotary +
     *  reshape_and_cache. Values are not rotated. */
    const sdpa_rope_params *rope;
    /** positions [T] (int64) of the rows for rope; required with rope, else must be NULL. */
    const int64_t *positions;
} sdpa_kv_write_options;

/** Fill the first struct_size bytes of *options with the defaults (all zero) and set struct_size. */
SDPA_API void sdpa_kv_write_options_init_sized(sdpa_kv_write_options *options, size_t struct_size);
/** sdpa_kv_write_options_init_sized(options, sizeof(sdpa_kv_write_options)). */
static inline void sdpa_kv_write_options_init(sdpa_kv_write_options *options) {
    sdpa_kv_write_options_init_sized(options, sizeof(sdpa_kv_write_options));
}

/**
 * sdpa_kv_write() with options (0.6): 8-bit caches (q8_0, FP8 with scales) and RoPE on the key
 * rows. sdpa_kv_write() is this function with options NULL (one implementation). Everything of
 * sdpa_kv_write holds (shapes, strides, slots, -1 skips, order, validation before any write, no
 * allocation, the caller's thread); in addition:
 *   - Dtypes: key_cache and value_cache may each be SDPA_DTYPE_F32, _F16, _BF16, _Q8_0 (E or Ev a
 *     multiple of 32, strides in 34-byte blocks with the last one 1, as sdpa_attention reads it),
 *     _FP8_E4M3 or _FP8_E5M2, independently; the rows key / value stay float32, float16 or
 *     bfloat16 (an 8-bit row view is SDPA_ERR_DTYPE). Each row is widened exactly to float32
 *     (on the stack, in chunks of 2048 elements), rotated if options->rope, then narrowed:
 *   - q8_0 cache: each block of 32 is quantized as ggml's quantize_row_q8_0_ref, bit for bit
 *     for finite blocks: amax = max |x|, d = amax / 127 (float32), q = roundf(x * (1 / d))
 *     (nearest, ties away from zero; 0 for an all-zero block), d stored as binary16 rounded to
 *     nearest even. Where ggml's reference is undefined (a float beyond int8 converted to
 *     int8): a product beyond +-127 saturates (only when 1 / d overflows, amax < 127 * 2^-128;
 *     such a d is a binary16 0, so the block reads back as zeros), a block holding a NaN is
 *     stored as d = NaN and q = 0, one holding an Inf (no NaN) as d = +Inf and q = 0, so a
 *     later sdpa_attention that attends the row fails its finite check; amax >= 65520 * 127
 *     (d beyond binary16) also stores d = +Inf, as ggml does.
 *     Accuracy: with D the stored d, every element of a block reads back (q * D) within
 *       |x - q * D| <= amax * (1/254 + 2^-11) * (1 + 2^-14) + 127 * 2^-25
 *     (half a step d / 2, plus 127 times the binary16 rounding of d: 2^-11 relative while
 *     d >= 2^-14, i.e. amax >= 127 * 2^-14 ~ 0.0078, else 2^-25 absolute); about amax / 226.
 *   - FP8 cache (E4M3FN / E5M2): y = x / scale (one float32 division; scale from
 *     options->k_scale / v_scale, per tensor [1] or per kv head [Hkv], 1 when NULL), then y
 *     rounded to nearest, ties to even, with subnormal results (never flushed), saturating to
 *     the largest finite value +-448 / +-57344 (Inf included: vLLM's scaled_fp8_conversion
 *     clamps the same way); NaN stays NaN (stored s.1111111: 0x7F / 0xFF); -0 stays -0. This
 *     matches vLLM's scaled_fp8_conversion (its division, its saturation, RNE) for every finite
 *     y. Accuracy of the stored ŷ against y: |ŷ - y| <= 2^-4 |y| (E4M3, 2^-6 <= |y| <= 448) or
 *     2^-3 |y| (E5M2, 2^-14 <= |y| <= 57344); below the normal range an absolute half step,
 *     2^-10 (E4M3) / 2^-17 (E5M2); beyond the largest value ŷ = +-448 / +-57344 (saturated). The
 *     reader's value is ŷ * scale (one more float32 rounding).
 *   - rope: see sdpa_kv_write_options.rope: the angles are computed once per row position, each
 *     head's key row rotated in float32 (sdpa_rope_params' formula, the same bits as sdpa_rope()
 *     on a float32 row), then narrowed to the cache dtype (any cache dtype). rope and positions
 *     are validated before anything is written. Values are never rotated.
 * The tests (tests/test_kv_write8.c) hold every rule above bit for bit against independent
 * references (ggml's documented algorithm, a scan of the 256 FP8 values) and every bound.
 * @retval as sdpa_kv_write, plus SDPA_ERR_STRUCT_VERSION (options->struct_size, RoPE params),
 *         SDPA_ERR_INVALID_ARGUMENT (a scale not finite and > 0, a scale given for a non-FP8
 *         cache or without a value cache, positions without rope or rope without positions,
 *         bad rope params), SDPA_ERR_SHAPE / SDPA_ERR_DTYPE (a scale not float32 [1] or [Hkv];
 *         rotary_dim), SDPA_ERR_INDEX (a position outside the tables), SDPA_ERR_ALIGNMENT
 *         (positions not 8-byte aligned), SDPA_ERR_OVERLAP (positions or a scale inside a cache)
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_kv_write_ex(const sdpa_tensor *key_cache, const sdpa_tensor *value_cache,
                                                     const sdpa_tensor *key, const sdpa_tensor *value,
                                                     const int64_t *slot_mapping,
                                                     const sdpa_kv_write_options *options);

/* ------------------------------------------------- multi-head attention layer */

/**
 * Weights of a multi-head attention layer, laid out as PyTorch stores them
 * ([out_features, in_features], y = x W^T + b): torch.nn.MultiheadAttention's state_dict,
 * or the q/k/v/o projections of a Llama-style GQA decoder layer. Views are borrowed for the
 * duration of each call (any strides). Initialise with sdpa_mha_params_init().
 *
 * Sizes: E = embed_dim, H = num_heads, Hkv = num_kv_heads (0 = H), Dh = head_dim
 * (0 = E / H, then E % H == 0), Dq = H*Dh, Dkv = Hkv*Dh, kdim/vdim = widths of the key and
 * value inputs (0 = E).
 */
typedef struct sdpa_mha_params {
    size_t struct_size;   /**< sizeof(sdpa_mha_params) as compiled by the caller */
    int64_t embed_dim;    /**< E: width of the query input and of the output */
    int64_t num_heads;    /**< H >= 1 */
    int64_t num_kv_heads; /**< Hkv: 0 = H (plain MHA); otherwise H % Hkv == 0 (GQA/MQA) */
    int64_t head_dim;     /**< Dh: 0 = E / H */
    int64_t kdim;         /**< width of the key input; 0 = E */
    int64_t vdim;         /**< width of the value input; 0 = E */
    /** Packed [3E, E] (PyTorch in_proj_weight: rows q, k, v). Only when Dq = Dkv = E and
     *  kdim = vdim = E. NULL = use the three separate weights below. */
    const sdpa_tensor *in_proj_weight;
    const sdpa_tensor *q_proj_weight; /**< [Dq, E]  (when in_proj_weight is NULL) */
    const sdpa_tensor *k_proj_weight; /**< [Dkv, kdim] */
    const sdpa_tensor *v_proj_weight; /**< [Dkv, vdim] */
    /** [Dq + 2*Dkv] (PyTorch in_proj_bias [3E]: q, k, v biases); NULL = no bias (bias=False). */
    const sdpa_tensor *in_proj_bias;
    const sdpa_tensor *out_proj_weight; /**< [E, Dq], required */
    const sdpa_tensor *out_proj_bias;   /**< [E]; NULL = no bias */
    /** add_bias_kv: PyTorch bias_k, bias_v of shape [1, 1, Dkv] (any rank whose sizes
     *  multiply to Dkv with the last = Dkv). Both or neither. They append one key/value row
     *  after the projected keys, which every query may attend. */
    const sdpa_tensor *bias_k;
    const sdpa_tensor *bias_v; /**< PyTorch bias_v [1, 1, Dkv]; with bias_k (see there) */
    /** add_zero_attn: 1 = append one all-zero key/value row (after bias_k/bias_v), which every
     *  query may attend. */
    int32_t add_zero_attn;
    /** Must be 0: a later version may give it a meaning, so a non-zero value is
     *  SDPA_ERR_STRUCT_VERSION (as unknown tail bytes beyond struct_size are). */
    int32_t reserved0;
} sdpa_mha_params;

/**
 * Per-call options of sdpa_mha_forward(). Every default is the zero value; initialise with
 * sdpa_mha_options_init(). S is the number of key/value input rows; S' = S + (bias_k ? 1 : 0)
 * + add_zero_attn is the number of keys attended. Masks describe the S input keys; the
 * appended keys are always allowed (PyTorch pads its masks with an "attend" column).
 */
typedef struct sdpa_mha_options {
    size_t struct_size; /**< sizeof(sdpa_mha_options) as compiled by the caller */
    /** Allow-mask over [B, H, L, S] (broadcast right-aligned: [L, S], [H, L, S], ...). A
     *  PyTorch bool attn_mask means "ignore": convert with sdpa_mask_from_ignore(); a float
     *  one of 0/-inf with sdpa_mask_from_additive() (or pass it as attn_bias). PyTorch's
     *  [B*H, L, S] is this mask's [B, H, L, S]. */
    const sdpa_allow_mask *attn_mask;
    /** Key padding as an allow-mask of shape [B, S] exactly (nonzero = real key), applied as
     *  [B, 1, 1, S]. PyTorch's key_padding_mask (true = padding) converts with
     *  sdpa_mask_from_ignore(). */
    const sdpa_allow_mask *key_padding_mask;
    /** Additive float bias over [B, H, L, S] (PyTorch float attn_mask); -inf blocks. */
    const sdpa_tensor *attn_bias;
    /** [B] valid key counts (right padding), each in [0, S]; nullable. */
    const int64_t *key_lengths;
    /** [B] valid query counts (right padding), each in [0, L]; rows i >= query_lengths[b] of
     *  `out` and of the weights are written as exact zeros; nullable. */
    const int64_t *query_lengths;
    /** 1 = causal, top-left (PyTorch is_causal / a tril attn_mask): query i sees input keys
     *  j <= i (the appended keys stay visible). */
    int32_t causal;
    /** 0 (default) = weights [B, L, S'] averaged over heads (PyTorch average_attn_weights=True);
     *  1 = per head [B, H, L, S']. */
    int32_t per_head_weights;
    /** 1 = training: apply dropout_p; 0 (default) = eval, no dropout whatever dropout_p is. */
    int32_t training;
    /** Dropout on the attention probabilities, in [0, 1); used only when training = 1. Keyed
     *  as sdpa_options.dropout_p, with the layer's (b, h, i, j) over the S' keys. Returned
     *  weights are pre-dropout (PyTorch returns post-dropout weights when training). */
    float dropout_p;
    uint64_t dropout_seed;   /**< dropout RNG key, as sdpa_options.dropout_seed */
    uint64_t dropout_offset; /**< dropout stream offset, as sdpa_options.dropout_offset */
    /** sdpa_empty_rows for rows that no key may reach. Default SDPA_EMPTY_ROWS_ERROR. */
    int32_t empty_rows;
    /** Threads as sdpa_options.num_threads (0 = online CPUs). */
    int32_t num_threads;
    /** Caller workspace (nullable) of at least sdpa_mha_workspace_size() bytes; NULL = the
     *  library allocates and frees before returning. */
    void *workspace;
    size_t workspace_bytes; /**< size of workspace in bytes */
} sdpa_mha_options;

/** Fill the first struct_size bytes of *params with defaults (all zero) and set struct_size.
 *  Does nothing if params is NULL or struct_size < sizeof(size_t). */
SDPA_API void sdpa_mha_params_init_sized(sdpa_mha_params *params, size_t struct_size);
/** sdpa_mha_params_init_sized(params, sizeof(sdpa_mha_params)). */
static inline void sdpa_mha_params_init(sdpa_mha_params *params) {
    sdpa_mha_params_init_sized(params, sizeof(sdpa_mha_params));
}
/** Fill the first struct_size bytes of *options with defaults (all zero) and set struct_size.
 *  Does nothing if options is NULL or struct_size < sizeof(size_t). */
SDPA_API void sdpa_mha_options_init_sized(sdpa_mha_options *options, size_t struct_size);
/** sdpa_mha_options_init_sized(options, sizeof(sdpa_mha_options)). */
static inline void sdpa_mha_options_init(sdpa_mha_options *options) {
    sdpa_mha_options_init_sized(options, sizeof(sdpa_mha_options));
}

/**
 * Multi-head attention layer forward. Matches torch.nn.MultiheadAttention(batch_first=True)
 * in eval mode (training = 0), with the weights of sdpa_mha_params:
 *   q = query W_q^T + b_q, k = key W_k^T + b_k, v = value W_v^T + b_v   (one GEMM each over
 *   all B*L or B*S rows); heads are strided views (head h = columns h*Dh .. h*Dh+Dh-1);
 *   [bias_k; zero row] appended to k and v; attn = sdpa_attention with scale 1/sqrt(Dh)
 *   (query head h reads kv head h / (H/Hkv)); out = concat_heads(attn) W_o^T + b_o.
 *
 * @param params the layer's weights and configuration (sdpa_mha_params_init()).
 * @param query [B, L, E] (rank 3, any strides: PyTorch's batch_first=False [L, B, E] buffer
 *              is the view of shape [B, L, E] with strides {E, B*E, 1}). Self-attention
 *              passes the same view as query, key and value.
 * @param key   [B, S, kdim], any strides.
 * @param value [B, S, vdim], any strides.
 * @param out   [out] [B, L, E].
 *              Dtypes: float32 views and weights only (float16/bfloat16 are SDPA_ERR_DTYPE).
 * @param attn_weights [out] nullable (need_weights=False): [B, L, S'] averaged over heads, or
 *              [B, H, L, S'] with options->per_head_weights = 1; probabilities, 0 where blocked.
 * @param options nullable (= defaults).
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER (params, views, a required weight), SDPA_ERR_STRUCT_VERSION,
 *         SDPA_ERR_RANK, SDPA_ERR_SHAPE (a weight or input size disagrees with E, H, Dh,
 *         kdim, vdim; E % H != 0 without head_dim; H % Hkv != 0; packed weights with kdim,
 *         vdim or GQA), SDPA_ERR_BROADCAST, SDPA_ERR_STRIDE, SDPA_ERR_OVERLAP,
 *         SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_DTYPE, SDPA_ERR_INVALID_ARGUMENT (flags, dropout_p,
 *         lengths), SDPA_ERR_ALIGNMENT (0.6: a view or a lengths array), SDPA_ERR_EMPTY_ROW, SDPA_ERR_NON_FINITE, SDPA_ERR_WORKSPACE_TOO_SMALL,
 *         SDPA_ERR_OUT_OF_MEMORY (workspace allocation failed, or the BLAS library could not
 *         obtain its own GEMM buffer: OpenBLAS 0.3.21 maps 128 MiB per OpenBLAS thread on first
 *         use and would retry a failed mapping forever, so the call first checks that such a
 *         mapping can be had now; under an address-space limit that needs that much headroom).
 *         On failure nothing is written.
 *         Not covered: memory another thread takes between that check and the GEMM, and a
 *         failing malloc inside OpenBLAS's own threaded GEMM, on which OpenBLAS exits the process.
 *         Also OpenBLAS's, not the library's: under an address-space limit (RLIMIT_AS) a process
 *         that loaded libsdpa (and so OpenBLAS) can hang in exit() even if no call used BLAS, as
 *         an OpenBLAS worker retries a 128 MiB mapping forever and exit joins it; with
 *         OPENBLAS_NUM_THREADS=1 in the environment (OpenBLAS starts no worker) it exits.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mha_forward(const sdpa_mha_params *params,
                                                     const sdpa_tensor *query, const sdpa_tensor *key,
                                                     const sdpa_tensor *value,
                                                     const sdpa_mha_options *options,
                                                     const sdpa_tensor *out,
                                                     const sdpa_tensor *attn_weights);

/**
 * Bytes of workspace sdpa_mha_forward() needs for these parameters, shapes and options:
 * the projected q, k, v and the attention output (O(B*(L+S')*(Dq+Dkv)) floats) plus the
 * attention workspace; O(L*S) only when weights are requested or two masks must be combined.
 * @retval SDPA_OK or the shape errors of sdpa_mha_forward().
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_mha_workspace_size(const sdpa_mha_params *params,
                                                            const sdpa_tensor *query,
                                                            const sdpa_tensor *key,
                                                            const sdpa_tensor *value,
                                                            const sdpa_mha_options *options,
                                                            int weights_requested, size_t *bytes);

/* ------------------------------------------------------------------- AMX (0.4) */

/**
 * Ask Linux for this process's permission to use Intel AMX tile data (the application's
 * explicit opt-in; libsdpa never asks on its own: docs/performance.md, "Kernels"). AMX-BF16 kernels are
 * used only once permission is granted (see sdpa_amx_available()).
 *
 * What it enables (after 0.5.0): under SDPA_PRECISION_REDUCED, the tiled kernel computes the
 * bf16 products (Q.K^T when q and k are bf16, P.V when v is bf16) on AMX tiles
 * (sdpa_last_kernel() names "tiled-amx-bf16") where E is a multiple of 32 up to 256 and Ev a
 * multiple of 16; other head sizes, the decode kernel and DEFAULT/F32 calls are unchanged
 * (AVX512-BF16 or float32). SDPA_MAX_ISA=avx512 (or lower) in the environment leaves AMX out
 * ("amx" or unset: allowed). A thread that runs a work item on AMX configures its tiles at the
 * item's start and releases them (TILERELEASE) at its end: AMX tile state of the calling thread
 * (or of a thread of the caller's pool running a task) is not preserved across sdpa_attention().
 *
 * It calls arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 18), as the Linux kernel's
 * Documentation/arch/x86/xstate.rst describes. The permission is per process, lasts for its
 * life and cannot be revoked; afterwards every thread's signal frames are about 8 KiB larger
 * (size alternate signal stacks from getauxval(AT_MINSIGSTKSZ)). Idempotent; thread-safe.
 * @retval SDPA_OK          permission granted (now or earlier)
 * @retval SDPA_ERR_UNSUPPORTED the CPU lacks AMX-TILE or AMX-BF16 (CPUID leaf 7 EDX bits 24 and
 *                          22) or the OS does not enable their state (XCR0 bits 17, 18), Linux
 *                          refused (the message gives errno), or the OS is not x86 Linux.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_request_amx(void);

/**
 * @return 1 iff the CPU has AMX-TILE and AMX-BF16 with OS support AND this process already has
 *         the permission (arch_prctl ARCH_GET_XCOMP_PERM reports XTILEDATA); 0 otherwise.
 *         Never requests the permission itself and never fails; thread-safe.
 */
SDPA_API int sdpa_amx_available(void);

/* ---------------------------------------------------------- serving (0.5) */

/**
 * ALiBi slopes of the paper (Press et al., "Train Short, Test Long", ICLR 2022, and its
 * reference code; the same rule as Hugging Face's get_alibi_slopes / build_alibi_tensor and
 * llama.cpp's m0/m1 slopes): with n = the largest power of two <= H,
 *   out[i] = 2^(-max_bias * (i + 1) / n)                 for i < n,
 *   out[i] = 2^(-max_bias * (2 * (i - n) + 1) / (2 * n))  for n <= i < H
 * (the first H - n odd-numbered slopes of the 2n-head sequence). max_bias = 8 is the paper's
 * choice: for H = 8 the slopes are 1/2, 1/4, ..., 1/256. Computed in double, rounded once to
 * float32. Pass the result as sdpa_options.alibi_slopes (rank 1).
 * @param H       number of heads, >= 1
 * @param max_bias > 0 and finite
 * @param out     [out] H float32
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER (out), SDPA_ERR_INVALID_ARGUMENT (H < 1, max_bias not
 *         finite and > 0), SDPA_ERR_SIZE_OVERFLOW (H * sizeof(float) > PTRDIFF_MAX: no buffer
 *         holds that); nothing is written on failure.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_alibi_slopes(int64_t H, float max_bias, float *out);

/**
 * Create a pool of nthreads - 1 persistent worker threads; a call that uses it (options
 * .threadpool) runs on them plus its calling thread (nthreads in all). The pool is owned by the
 * caller: libsdpa keeps no global pool and never creates threads for a call that has one.
 * Several application threads may use one pool at the same time: their calls take the pool
 * one after the other (serialized by a mutex; each still gets the whole pool). For concurrent
 * calls that should not wait, give each application thread its own pool. A task never calls
 * back into the library, so there is no nesting.
 * Waiting (like OpenMP's OMP_WAIT_POLICY / GOMP_SPINCOUNT and ggml's threadpool poll level): a
 * worker that finished its job polls for the next call for SDPA_POOL_SPIN_US microseconds
 * before it sleeps, and the calling thread polls up to as long for its workers before it
 * sleeps, so back-to-back calls (one per layer) find the workers awake; a polling thread keeps
 * its CPU busy meanwhile. It backs off where polling cannot pay: a pool of more threads than
 * online CPUs never polls; a worker that was preempted (another thread wanted its CPU) stops
 * polling for 20 ms to 640 ms; the caller's poll shrinks while its workers keep finishing after
 * it. SDPA_POOL_SPIN_US, read from the environment when the pool is created: decimal digits
 * only, 0..100000; unset or anything else: 200 (about what waking a sleeping thread costs on a
 * VM whose other vCPU idles); 0 sleeps at once, as 0.5.0 did (for machines shared with other
 * busy processes). Results never depend on it.
 * fork(): the workers do not exist in a child process. A call there on a pool created before
 * the fork runs on the calling thread alone (same results); sdpa_threadpool_destroy() there
 * only frees the memory. Create a new pool in the child for threads.
 * @param nthreads 1..256 (1 = no worker thread: calls run on the calling thread)
 * @param out      [out] the pool; set only on success
 * @retval SDPA_OK, SDPA_ERR_NULL_POINTER (out), SDPA_ERR_INVALID_ARGUMENT (nthreads),
 *         SDPA_ERR_OUT_OF_MEMORY (memory or a thread could not be created; nothing is left
 *         running).
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_threadpool_create(int nthreads, sdpa_threadpool **out);

/** Stop and join the pool's workers and free it. NULL does nothing. No call may be using the
 *  pool (undefined behaviour otherwise, as for free()). */
SDPA_API void sdpa_threadpool_destroy(sdpa_threadpool *pool);

/** @return the pool's thread count (nthreads of sdpa_threadpool_create(), the caller's
 *  thread included), or 0 for NULL. */
SDPA_API int sdpa_threadpool_size(const sdpa_threadpool *pool);

/* ------------------------------------------------------------ cost query (0.6) */

/** sdpa_cost_options.flags: scan the allow-mask and the bias (their values, O(B*Hq*L*S) reads)
 *  so that pairs, empty rows and the bytes they decide are exact; see sdpa_cost.exact. */
#define SDPA_COST_EXACT 0x1u
/** sdpa_cost_options.flags: with weights == NULL, count as if a float32 weights view were passed
 *  (the call will get one; it selects the reference kernel and is unsupported when packed). */
#define SDPA_COST_WEIGHTS 0x2u
/** sdpa_cost_options.flags: with lse == NULL, count as if a float32 lse view were passed. */
#define SDPA_COST_LSE 0x4u

/**
 * Options of sdpa_attention_cost() (nullable there: NULL = all zero). A versioned struct read as
 * sdpa_options is: struct_size first, every default the zero value, fields only appended, bytes
 * beyond what this library knows must be 0 (SDPA_ERR_STRUCT_VERSION otherwise). (0.6)
 * Initialise with `sdpa_cost_options co = {sizeof co};` (C and C++) and set fields.
 */
typedef struct sdpa_cost_options {
    size_t struct_size; /**< sizeof(sdpa_cost_options) as compiled by the caller */
    uint32_t flags;     /**< SDPA_COST_EXACT | SDPA_COST_WEIGHTS | SDPA_COST_LSE; other bits:
                             SDPA_ERR_INVALID_ARGUMENT */
    int32_t reserved0;  /**< must be 0 (SDPA_ERR_STRUCT_VERSION otherwise) */
} sdpa_cost_options;

/** The bytes of the struct at p, for the inline initialisers below (no old-style cast in C++);
 *  an implementation detail, not for callers. */
#ifdef __cplusplus
#  define SDPA_BYTES_OF_(p) reinterpret_cast<unsigned char *>(p)
#else
#  define SDPA_BYTES_OF_(p) ((unsigned char *)(p))
#endif

/** Zero *copts and set copts->struct_size = sizeof(sdpa_cost_options) (inline: the caller's size). */
static inline void sdpa_cost_options_init(sdpa_cost_options *copts) {
    unsigned char *bytes = SDPA_BYTES_OF_(copts);
    for (size_t n = 0; n < sizeof(sdpa_cost_options); ++n)
        bytes[n] = 0;
    copts->struct_size = sizeof(sdpa_cost_options);
}

/**
 * What an sdpa_attention() call would do (filled by sdpa_attention_cost()). (0.6)
 * The caller sets struct_size (`sdpa_cost c = {sizeof c};`, or sdpa_cost_init()); the library
 * writes the first struct_size bytes and nothing beyond: fields it knows, and zeros over bytes
 * of a newer layout it does not know. Counts are int64_t and saturate at INT64_MAX.
 *
 * Pairs are (query row (b, h, i), key j) of the call's logical score matrix [B, Hq, L, S]
 * (S = max_blocks_per_seq * block_size for a paged cache; a packed batch: [Hq, L_r, S_r] per
 * sequence r). A pair is allowed when the rule of sdpa_attention() (causal, window, key lengths,
 * allow-mask, bias != -inf at the alignment) allows it and its row is not padding
 * (query_lengths): exactly the pairs whose probability can be nonzero.
 * Without SDPA_COST_EXACT the allow-mask and bias values are not read: pairs, empty rows and
 * the byte counts they decide follow the structural rules only (causal, window, lengths, which
 * are exact), so allowed_pairs and the bytes are upper bounds and empty_rows a lower bound,
 * and exact is 0 when a mask or bias is given.
 */
typedef struct sdpa_cost {
    size_t struct_size;      /**< set by the caller: sizeof(sdpa_cost) of its header */
    int32_t status;          /**< sdpa_status sdpa_attention_cost() returned (= what the call would return, see there) */
    int32_t exact;           /**< 1: every count below is exact; 0: see above (a mask or bias, not scanned) */
    /** sdpa_last_kernel() the call would leave (kernel, ISA, dtype tag: "tiled-avx512",
     *  "decode-split-avx2-f16", "none" without query rows; a packed batch: its last sequence with
     *  query rows); "" when status is a validation error. NUL-terminated. */
    char kernel[64];
    int32_t kernel_id;       /**< sdpa_kernel of that kernel (REFERENCE, TILED, DECODE); 0 with "none" or "" */
    int32_t threads;         /**< threads of the call's parallel region (the calling thread included) */
    size_t workspace_bytes;  /**< sdpa_attention_workspace_size() of the call (a caller workspace this large is enough) */
    int64_t query_rows;      /**< query rows (b, h, i) that are not padding */
    int64_t allowed_pairs;   /**< allowed pairs (attended key pairs): the softmax's terms */
    int64_t skipped_pairs;   /**< pairs of the logical score matrix that are not allowed (padding rows included) */
    int64_t empty_rows;      /**< query rows that are not padding and have no allowed key */
    /** Floating-point operations of the contract, 2 per multiply-add: 2 * E per pair whose score
     *  is formed (the allowed pairs; every non-padding pair with key j < the sequence's key count
     *  for weights stages SCORES and SOFTCAPPED) plus 2 * Ev per allowed pair (P.V). Kernels
     *  compute some blocked pairs of partial tiles too; softmax, softcap and ALiBi are not counted. */
    int64_t flops;
    /** Bytes read, each element counted once per (b, kv head) or row that needs it (logical
     *  elements: a broadcast input is counted at every use):
     *  q: E elements per non-padding query row; k: E per key row some query row of its
     *  (b, kv head) attends (every key below the key count for score stages); v: Ev per key row
     *  of an allowed pair of that group; mask: 1 byte per pair inside the structural range
     *  (causal, window, lengths) of a non-padding row; bias: one element per such pair the mask
     *  allows. Element sizes of each view's dtype (0.6: a q8_0 row of E elements is E / 32
     *  blocks of 34 bytes; FP8 1 byte per element; the scales are not counted). */
    int64_t bytes_read_q;
    int64_t bytes_read_k;      /**< see bytes_read_q */
    int64_t bytes_read_v;      /**< see bytes_read_q */
    int64_t bytes_read_mask;   /**< see bytes_read_q */
    int64_t bytes_read_bias;   /**< see bytes_read_q */
    int64_t bytes_written_out;     /**< B * Hq * L * Ev elements of out's dtype (padding rows are written too; q's dtype when out is NULL) */
    int64_t bytes_written_weights; /**< 4 * B * Hq * L * S with weights (or SDPA_COST_WEIGHTS), else 0 */
    int64_t bytes_written_lse;     /**< 4 * B * Hq * L with lse (or SDPA_COST_LSE), else 0 */
} sdpa_cost;

/** Zero *cost and set cost->struct_size = sizeof(sdpa_cost) (inline: the caller's size). */
static inline void sdpa_cost_init(sdpa_cost *cost) {
    unsigned char *bytes = SDPA_BYTES_OF_(cost);
    for (size_t n = 0; n < sizeof(sdpa_cost); ++n)
        bytes[n] = 0;
    cost->struct_size = sizeof(sdpa_cost);
}

/**
 * The cost of an sdpa_attention() call before running it (DESIGN section 12; the mask contracts'
 * "budget sequence length" and "validate masks before expensive model execution"): it takes the
 * call's arguments, runs every check of sdpa_attention() that needs no tensor values (the same
 * code: ranks, shapes, dtypes, broadcast, strides, overlap, alignment, options, lengths,
 * offsets, block-table entries and cu_seqlens, sinks and slopes, the forced kernel, a caller
 * workspace's size), picks the kernel, ISA and threads with the same functions the call uses,
 * and counts what the call would attend, compute, read and write. It writes no output and no
 * workspace byte, reads no q, k or v value, and reads the allow-mask and bias values only with
 * SDPA_COST_EXACT. Empty rows under SDPA_EMPTY_ROWS_ERROR are found where they are known: always
 * without mask and bias (the structural rules decide them), and with SDPA_COST_EXACT.
 *
 * @param q        as for sdpa_attention() (so are k, v and options).
 * @param k        see sdpa_attention().
 * @param v        see sdpa_attention().
 * @param options  nullable (= defaults); see sdpa_options.
 * @param out      nullable: NULL = "the call will get a valid out of q's dtype" (checks that need
 *                 out, such as its shape, strides and overlap, are then not made); weights and lse
 *                 must then be NULL too (SDPA_COST_WEIGHTS / SDPA_COST_LSE ask for them).
 * @param weights  nullable, as for sdpa_attention().
 * @param lse      nullable, as for sdpa_attention().
 * @param copts    nullable (= no flags); see sdpa_cost_options.
 * @param cost     [out] the caller's struct with struct_size set; filled on every return except
 *                 NULL_POINTER for cost itself and STRUCT_VERSION for cost->struct_size.
 * @return the status sdpa_attention() with these arguments would return for everything that
 *         does not depend on q/k/v values (so NON_FINITE is never returned; EMPTY_ROW only where
 *         empty rows are known, see above), with the same message (sdpa_last_error_message(),
 *         naming sdpa_attention_cost), and cost->status = the same value. On SDPA_OK every field
 *         is filled; on SDPA_ERR_EMPTY_ROW too (the counts say how many rows are empty); on
 *         another error the counts are 0 and kernel is "".
 *         Errors of the query itself: SDPA_ERR_NULL_POINTER (cost NULL; out NULL with weights
 *         or lse given), SDPA_ERR_STRUCT_VERSION (cost->struct_size below sizeof(sdpa_cost) of
 *         0.6, 200 bytes on LP64, above 4096 or not a multiple of sizeof(size_t); copts'
 *         struct_size or reserved0), SDPA_ERR_INVALID_ARGUMENT (unknown copts->flags bits),
 *         SDPA_ERR_OUT_OF_MEMORY (O(S) bytes of scratch for the key counts).
 * Return convention: the call's status is returned (not SDPA_OK with the status in a field),
 * so `if (sdpa_attention_cost(...) != SDPA_OK)` rejects exactly the calls sdpa_attention()
 * would reject on structure, and the Python package raises the same exception.
 * Thread-safe; O(B * L + B * Hkv * S) without SDPA_COST_EXACT, O(B * Hq * L * S) with it; it
 * allocates O(S) bytes of scratch and frees them. Like the call (sdpa_options.num_threads), the
 * first query of a process that would start threads of its own measures once what starting
 * one costs (one empty thread created and joined); with a hook or a pool it creates none.
 */
SDPA_API SDPA_NODISCARD sdpa_status sdpa_attention_cost(const sdpa_tensor *q, const sdpa_tensor *k,
                                                        const sdpa_tensor *v, const sdpa_options *options,
                                                        const sdpa_tensor *out, const sdpa_tensor *weights,
                                                        const sdpa_tensor *lse, const sdpa_cost_options *copts,
                                                        sdpa_cost *cost);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SDPA_H */
