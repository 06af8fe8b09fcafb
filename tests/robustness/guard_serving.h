/* The 0.4/0.5 guard-page cases (guard_serving.c), run by test_guard. */
#ifndef SDPA_RB_GUARD_SERVING_H
#define SDPA_RB_GUARD_SERVING_H

#include <stdint.h>

#include "rb_util.h"

/* One random serving case (and its three poisoned reruns). */
void serving_case(rb_rng *r, int64_t n);

/* One random sdpa_kv_write case (negative-stride rows, E past 256, caches of any dtype). */
void kv_write_case(rb_rng *r, int64_t n);
extern int64_t g_kvw_calls;

/* Counts for the summary line. */
extern int64_t g_sv_cases, g_sv_calls, g_sv_unsupported, g_sv_paged, g_sv_packed, g_sv_f16, g_sv_bf16;

/* Set by test_guard under SDPA_MAX_ISA=amx once sdpa_request_amx() succeeded: half the cases are
 * drawn for the AMX column (bf16, SDPA_PRECISION_REDUCED, E a multiple of 32, Ev of 16);
 * g_sv_amx_calls counts the calls that ran tiled-amx-bf16. */
extern int g_sv_amx;
extern int64_t g_sv_amx_calls;

#endif
