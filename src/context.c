/* The call context (internal.h sdpa__ctx; DESIGN.md section 7): built once per call by the plan
 * from the process's ISA (dispatch.c, which read CPUID and SDPA_MAX_ISA once) and the call's
 * q/k/v/out dtypes and precision. With dispatch.c, the only caller of the micro-kernel and
 * conversion registries; every later stage reads plan->ctx. What the builder decides per dtype
 * is written here once:
 *  - the float32 micro-kernels and conversions of the ISA;
 *  - the tiled kernel's score and P.V operations: the bf16 column (AVX512-BF16, or AMX when
 *    this process may use it and E, Ev fit) under SDPA_PRECISION_REDUCED for bf16 q and k
 *    (scores) and bf16 v (P.V), else the float32 lanes products; its tile sizes;
 *  - the decode kernel's bf16 dot products (REDUCED, bf16 q and k), its int8 dot products
 *    (REDUCED, q8_0 k, AVX512-VNNI: "decode-avx512vnni") and its rows kernels on K
 *    and V as stored, with their element sizes (0.6: q8_0's is its 34-byte block, the unit its
 *    row strides count; FP8 rows with a scale other than 1 reach the f32 column through the
 *    loader's copy, load.c);
 *  - the row write-back of out's dtype and sdpa_last_kernel()'s names. */
#include "internal.h"
#include "dispatch.h"
#include "load.h"

static void put_f32(void *row, int64_t at, float x) { ((float *)row)[at] = x; }
static void put_f16(void *row, int64_t at, float x) { ((uint16_t *)row)[at] = sdpa__f32_to_f16(x); }
static void put_bf16(void *row, int64_t at, float x) { ((uint16_t *)row)[at] = sdpa__f32_to_bf16(x); }

void sdpa__ctx_make_base(sdpa__ctx *c) {
    memset(c, 0, sizeof *c);
    c->mk = sdpa__dispatch_mk(SDPA__MK_F32);
    c->cv = sdpa__dispatch_convert();
}

static const char *dtype_tag(const sdpa__plan *p) {
    if (p->q.dtype == SDPA_DTYPE_F32 && p->k.dtype == SDPA_DTYPE_F32 && p->v.dtype == SDPA_DTYPE_F32)
        return "";
    if (p->k.dtype != p->v.dtype)
        return "-mixed";
    switch (p->k.dtype) {
    case SDPA_DTYPE_F16: return "-f16";
    case SDPA_DTYPE_BF16: return "-bf16";
    case SDPA_DTYPE_Q8_0: return "-q8_0"; /* 0.6, the 8-bit K/V caches */
    case SDPA_DTYPE_FP8_E4M3: return "-fp8_e4m3";
    case SDPA_DTYPE_FP8_E5M2: return "-fp8_e5m2";
    default: return "-f32";
    }
}

/* The tiled kernel's operations and tile sizes. */
static void tiled_entries(sdpa__ctx *c, const sdpa__plan *p) {
    const bool reduced = p->precision == SDPA_PRECISION_REDUCED;
    const sdpa__mk_bf16 *col = reduced ? sdpa__dispatch_mk_bf16_tiled(p->E, p->Ev) : NULL;
    const bool qk16 = p->q.dtype == SDPA_DTYPE_BF16 && p->k.dtype == SDPA_DTYPE_BF16 && p->load_q->rows_bf16 != NULL &&
                      p->load_k->rows_bf16 != NULL;
    const bool v16 = p->v.dtype == SDPA_DTYPE_BF16 && p->load_v->rows_bf16 != NULL;
    c->score16 = qk16 ? col : NULL;
    c->pv16 = v16 ? col : NULL;
    const sdpa__mk_bf16 *used = c->score16 != NULL ? c->score16 : c->pv16;
    c->tiles_begin = used != NULL ? used->begin : NULL;
    c->tiles_end = used != NULL ? used->end : NULL;
    c->fusable = c->score16 != NULL && c->pv16 == c->score16 && c->score16->softmax_pack != NULL;
    /* A size query covers the most a bf16 column may ask for (256 rows, 128 keys) under
     * REDUCED: the AMX permission may be granted between the query and the call. */
    c->tile_q_size = reduced ? 256 : SDPA__TILE_Q;
    c->tile_k_size = reduced ? 128 : SDPA__TILE_K;
    c->tile_q = used != NULL && used->tile_q > 0 ? used->tile_q : SDPA__TILE_Q;
    c->tile_k = used != NULL && used->tile_k > 0 ? used->tile_k : SDPA__TILE_K;
    if (c->tile_q > c->tile_q_size || c->tile_k > c->tile_k_size) {
        c->tile_q = SDPA__TILE_Q;
        c->tile_k = SDPA__TILE_K;
    }
    c->pv16_size = reduced && v16;
    c->tiled_name = used != NULL ? used->tiled_name : c->mk->tiled_name;
}

/* The decode kernel's operations on K and V as stored. */
static void decode_entries(sdpa__ctx *c, const sdpa__plan *p) {
    c->dot16 = p->precision == SDPA_PRECISION_REDUCED && p->q.dtype == SDPA_DTYPE_BF16 &&
                       p->k.dtype == SDPA_DTYPE_BF16 && p->load_q->rows_bf16 != NULL && p->load_k->rows_bf16 != NULL
                   ? sdpa__dispatch_mk_bf16()
                   : NULL;
    c->kv_f32 = sdpa__dispatch_mk_kv(SDPA_DTYPE_F32);
    c->kv_k = c->dot16 != NULL ? NULL : sdpa__dispatch_mk_kv(p->k.dtype);
    c->kv_v = sdpa__dispatch_mk_kv(p->v.dtype);
    if (c->kv_v == NULL)
        c->kv_v = c->kv_f32; /* (every dtype validation admits has a column) */
    if (c->kv_k == NULL && c->dot16 == NULL)
        c->kv_k = c->kv_f32;
    /* 0.6: REDUCED with a q8_0 K scores by int8 dot products where the CPU has them */
    const sdpa__mk_kv *q8r = p->precision == SDPA_PRECISION_REDUCED && p->k.dtype == SDPA_DTYPE_Q8_0
                                 ? sdpa__dispatch_mk_kv_q8_0_reduced()
                                 : NULL;
    if (q8r != NULL)
        c->kv_k = q8r;
    c->k_elem = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)p->k.dtype);
    c->v_elem = (ptrdiff_t)sdpa_dtype_size((sdpa_dtype)p->v.dtype);
    const struct sdpa__mk_names {
        const char *d, *s;
    } n = c->dot16 != NULL ? (struct sdpa__mk_names){c->dot16->decode_name, c->dot16->decode_split_name}
                           : (struct sdpa__mk_names){c->mk->decode_name, c->mk->decode_split_name};
    c->decode_name = q8r != NULL ? "decode-avx512vnni" : n.d;
    c->decode_split_name = q8r != NULL ? "decode-split-avx512vnni" : n.s;
}

void sdpa__ctx_make(sdpa__ctx *c, const sdpa__plan *p) {
    sdpa__ctx_make_base(c);
    tiled_entries(c, p);
    decode_entries(c, p);
    c->dtype_tag = dtype_tag(p);
    const int od = p->out.dtype; /* 0 (F32) in a size query's plan, which has no out */
    c->out_elem = sdpa_dtype_size((sdpa_dtype)od);
    c->out_put = od == SDPA_DTYPE_F16 ? put_f16 : od == SDPA_DTYPE_BF16 ? put_bf16 : put_f32;
    c->out_narrow = od == SDPA_DTYPE_F16 ? c->cv->narrow_f16 : od == SDPA_DTYPE_BF16 ? c->cv->narrow_bf16 : NULL;
}
