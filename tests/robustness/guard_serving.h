/* The 0.4/0.5 guard-page cases (guard_serving.c), run by test_guard. */
#ifndef SDPA_RB_GUARD_SERVING_H
#define SDPA_RB_GUARD_SERVING_H

#include <stdint.h>

#include "rb_util.h"

/* One random serving case (and its three poisoned reruns). */
void serving_case(rb_rng *r, int64_t n);

/* Counts for the summary line. */
extern int64_t g_sv_cases, g_sv_calls, g_sv_unsupported, g_sv_paged, g_sv_packed, g_sv_f16, g_sv_bf16;

#endif
