/*
 * Helpers shared by the robustness harnesses (tests/robustness): a seeded PRNG, failure
 * reporting that names the case, and small view builders. Public API only (plus tests/ref),
 * so the harnesses survive any restructuring of src/.
 */
#ifndef SDPA_RB_UTIL_H
#define SDPA_RB_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sdpa.h"

#if defined(__SANITIZE_ADDRESS__)
#define RB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RB_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define RB_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RB_TSAN 1
#endif
#endif

typedef struct rb_rng {
    uint64_t s;
} rb_rng;

static inline uint64_t rb_next(rb_rng *r)
{ /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform integer in [lo, hi]. */
static inline int64_t rb_int(rb_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rb_next(r) % (uint64_t)(hi - lo + 1));
}

/* Uniform in [lo, hi). */
static inline float rb_uniform(rb_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rb_next(r) >> 11) * (1.0 / 9007199254740992.0));
}

static inline int rb_chance(rb_rng *r, int percent)
{
    return (int)(rb_next(r) % 100) < percent;
}

/* Failures: print and count; the harness exits non-zero if any. */
extern int rb_failures;
#define RB_FAIL(...)                                                                     \
    do {                                                                                 \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                             \
        fprintf(stderr, __VA_ARGS__);                                                    \
        fputc('\n', stderr);                                                             \
        if (++rb_failures >= 20) {                                                       \
            fprintf(stderr, "too many failures, stopping\n");                            \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)
#define RB_CHECK(cond, ...)       \
    do {                          \
        if (!(cond))              \
            RB_FAIL(__VA_ARGS__); \
    } while (0)

/* A strided view; `data` points at element [0, ..., 0]. */
static inline sdpa_tensor rb_view(float *data, int rank, const int64_t *shape, const int64_t *strides)
{
    sdpa_tensor t = {0};
    t.data = data;
    t.dtype = SDPA_DTYPE_F32;
    t.rank = rank;
    for (int d = 0; d < rank; ++d) {
        t.shape[d] = shape[d];
        t.strides[d] = strides[d];
    }
    return t;
}

/* Whether a status is one sdpa.h documents. */
static inline int rb_known_status(sdpa_status s)
{
    switch (s) {
    case SDPA_OK: case SDPA_ERR_NULL_POINTER: case SDPA_ERR_INVALID_ARGUMENT: case SDPA_ERR_STRUCT_VERSION:
    case SDPA_ERR_UNSUPPORTED: case SDPA_ERR_RANK: case SDPA_ERR_SHAPE: case SDPA_ERR_BROADCAST:
    case SDPA_ERR_STRIDE: case SDPA_ERR_OVERLAP: case SDPA_ERR_SIZE_OVERFLOW: case SDPA_ERR_EMPTY_DIMENSION:
    case SDPA_ERR_DTYPE: case SDPA_ERR_EMPTY_ROW: case SDPA_ERR_NON_FINITE: case SDPA_ERR_OUT_OF_MEMORY:
    case SDPA_ERR_WORKSPACE_TOO_SMALL: case SDPA_ERR_INDEX: /* 0.5: block table, cu_seqlens, kv-write slot */
        return 1;
    default:
        return 0;
    }
}

#endif /* SDPA_RB_UTIL_H */
