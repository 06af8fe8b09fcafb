/* Status names, the thread-local failure detail and the last kernel name. */
#include "internal.h"

#include <string.h>

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];
static _Thread_local int last_subject; /* sdpa__subject of the last failure (data, not text) */
static _Thread_local const char *last_kernel = "";

SDPA_API const char *sdpa_status_string(sdpa_status status) {
    switch (status) {
    case SDPA_OK: return "SDPA_OK";
    case SDPA_ERR_NULL_POINTER: return "SDPA_ERR_NULL_POINTER";
    case SDPA_ERR_INVALID_ARGUMENT: return "SDPA_ERR_INVALID_ARGUMENT";
    case SDPA_ERR_STRUCT_VERSION: return "SDPA_ERR_STRUCT_VERSION";
    case SDPA_ERR_UNSUPPORTED: return "SDPA_ERR_UNSUPPORTED";
    case SDPA_ERR_RANK: return "SDPA_ERR_RANK";
    case SDPA_ERR_SHAPE: return "SDPA_ERR_SHAPE";
    case SDPA_ERR_BROADCAST: return "SDPA_ERR_BROADCAST";
    case SDPA_ERR_STRIDE: return "SDPA_ERR_STRIDE";
    case SDPA_ERR_OVERLAP: return "SDPA_ERR_OVERLAP";
    case SDPA_ERR_SIZE_OVERFLOW: return "SDPA_ERR_SIZE_OVERFLOW";
    case SDPA_ERR_EMPTY_DIMENSION: return "SDPA_ERR_EMPTY_DIMENSION";
    case SDPA_ERR_INDEX: return "SDPA_ERR_INDEX";
    case SDPA_ERR_ALIGNMENT: return "SDPA_ERR_ALIGNMENT";
    case SDPA_ERR_DTYPE: return "SDPA_ERR_DTYPE";
    case SDPA_ERR_EMPTY_ROW: return "SDPA_ERR_EMPTY_ROW";
    case SDPA_ERR_NON_FINITE: return "SDPA_ERR_NON_FINITE";
    case SDPA_ERR_OUT_OF_MEMORY: return "SDPA_ERR_OUT_OF_MEMORY";
    case SDPA_ERR_WORKSPACE_TOO_SMALL: return "SDPA_ERR_WORKSPACE_TOO_SMALL";
    case SDPA_ERR_INTERNAL: return "SDPA_ERR_INTERNAL";
    default: return "SDPA_ERR_UNKNOWN";
    }
}

SDPA_API const char *sdpa_last_error_message(void) { return last_error; }

SDPA_API const char *sdpa_last_kernel(void) { return last_kernel; }

sdpa_status sdpa__fail(sdpa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_subject = SDPA__SUBJECT_NONE;
    return status;
}

sdpa_status sdpa__fail_on(sdpa_status status, int subject, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_subject = subject;
    return status;
}

int sdpa__last_subject(void) { return last_subject; }

void sdpa__clear_error(void) {
    last_error[0] = '\0';
    last_subject = SDPA__SUBJECT_NONE;
}

void sdpa__set_kernel(const char *name) { last_kernel = name; }

void sdpa__set_kernel_path(const char *name, const char *tag) {
    static _Thread_local char path[64];
    if (tag == NULL || tag[0] == '\0') {
        last_kernel = name;
        return;
    }
    snprintf(path, sizeof path, "%s%s", name, tag);
    last_kernel = path;
}

sdpa_status sdpa__fail_kv_row(const char *fn, int64_t b, int64_t g, int64_t j, bool value) {
    return sdpa__fail(SDPA_ERR_NON_FINITE, "%s: %s row (b=%lld,h=%lld,j=%lld) holds NaN or Inf and is attended", fn,
                      value ? "value" : "key", (long long)b, (long long)g, (long long)j);
}

SDPA_API unsigned sdpa_version(void) { return SDPA_VERSION_NUMBER; }

SDPA_API const char *sdpa_version_string(void) { return SDPA_VERSION_STRING; }
