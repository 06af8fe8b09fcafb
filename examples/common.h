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

#endif /* SDPA_EXAMPLES_COMMON_H */
