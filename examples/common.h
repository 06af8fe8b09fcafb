/*
 * Shared by the C examples: check every libsdpa status and explain a failure.
 *
 *     CHECK(sdpa_attention(&q, &k, &v, &options, &out, NULL, NULL));
 *
 * On failure it prints the call, the status name and the thread-local detail message, e.g.
 *     sdpa_attention(...) failed: SDPA_ERR_SHAPE: sdpa_attention: key.shape[3]=5 does not ...
 * and exits with status 1.
 */
#ifndef SDPA_EXAMPLES_COMMON_H
#define SDPA_EXAMPLES_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sdpa.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        sdpa_status check_status_ = (call);                                            \
        if (check_status_ != SDPA_OK) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,   \
                    sdpa_status_string(check_status_), sdpa_last_error_message());     \
            exit(EXIT_FAILURE);                                                        \
        }                                                                              \
    } while (0)

/* The library we run must not be older than the header we compiled against. */
static inline void check_library_version(void)
{
    if (sdpa_version() < SDPA_VERSION_NUMBER) {
        fprintf(stderr, "libsdpa %s is older than the header (%s)\n", sdpa_version_string(),
                SDPA_VERSION_STRING);
        exit(EXIT_FAILURE);
    }
}

/* A rank-4 float32 view with explicit element strides, for layouts the constructors do not
 * make (a slice of a KV cache, BSHD storage). Unused shape/stride entries and reserved[] are 0. */
static inline sdpa_tensor view4(float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0,
                                int64_t s1, int64_t s2, int64_t s3)
{
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = SDPA_DTYPE_F32;
    t.rank = 4;
    t.shape[0] = d0, t.shape[1] = d1, t.shape[2] = d2, t.shape[3] = d3;
    t.strides[0] = s0, t.strides[1] = s1, t.strides[2] = s2, t.strides[3] = s3;
    return t;
}

#endif /* SDPA_EXAMPLES_COMMON_H */
