/* Helpers shared by the unit tests; see test_common.h. */
#include "test_common.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ------------------------------------------------------------------- PRNG */

void tc_rng_seed(tc_rng *rng, uint64_t seed)
{
    rng->state = seed ^ 0x9E3779B97F4A7C15ull;
}

uint64_t tc_rng_next(tc_rng *rng)
{
    /* splitmix64 */
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tc_rng_uniform(tc_rng *rng, double lo, double hi)
{
    double u = (double)(tc_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
    return lo + (hi - lo) * u;
}

void tc_fill_uniform(float *x, int64_t n, tc_rng *rng, double lo, double hi)
{
    for (int64_t e = 0; e < n; ++e) {
        x[e] = (float)tc_rng_uniform(rng, lo, hi);
    }
}

int64_t tc_rng_int(tc_rng *rng, int64_t lo, int64_t hi)
{
    uint64_t span = (uint64_t)(hi - lo) + 1u;
    return lo + (int64_t)(tc_rng_next(rng) % span);
}

int tc_rng_chance(tc_rng *rng, double p)
{
    return tc_rng_uniform(rng, 0.0, 1.0) < p;
}

/* ---------------------------------------------------------------- buffers */

void tc_layout_contiguous(tc_layout *lay, int rank)
{
    memset(lay, 0, sizeof *lay);
    for (int d = 0; d < rank; ++d) {
        lay->perm[d] = d;
    }
}

static void tc_buf_alloc_raw(tc_buf *buf, int rank, const int64_t *shape, const tc_layout *lay)
{
    tc_layout def;
    if (!lay) {
        tc_layout_contiguous(&def, rank);
        lay = &def;
    }
    memset(buf, 0, sizeof *buf);
    buf->rank = rank;
    int64_t running = 1;
    for (int k = rank - 1; k >= 0; --k) {
        int d = lay->perm[k];
        buf->shape[d] = shape[d];
        if (lay->bcast[d]) {
            buf->strides[d] = 0;
            continue;
        }
        int64_t extent = (shape[d] > 0 ? shape[d] : 1) + lay->pad[d];
        buf->strides[d] = lay->reverse[d] ? -running : running;
        if (lay->reverse[d] && shape[d] > 0) {
            buf->offset += (shape[d] - 1) * running;
        }
        running *= extent;
    }
    buf->n = (size_t)running;
    buf->fbase = malloc(buf->n * sizeof(float));
    buf->dbase = malloc(buf->n * sizeof(double));
    assert_non_null(buf->fbase);
    assert_non_null(buf->dbase);
}

void tc_buf_alloc(tc_buf *buf, int rank, const int64_t *shape, const tc_layout *lay,
                  float hole_value)
{
    tc_buf_alloc_raw(buf, rank, shape, lay);
    for (size_t e = 0; e < buf->n; ++e) {
        buf->fbase[e] = hole_value;
        buf->dbase[e] = (double)hole_value;
    }
}

void tc_buf_alloc_canary(tc_buf *buf, int rank, const int64_t *shape, const tc_layout *lay)
{
    tc_buf_alloc_raw(buf, rank, shape, lay);
    tc_fill_canary(buf->fbase, buf->n * sizeof(float));
    memset(buf->dbase, 0, buf->n * sizeof(double));
}

void tc_buf_free(tc_buf *buf)
{
    free(buf->fbase);
    free(buf->dbase);
    memset(buf, 0, sizeof *buf);
}

int64_t tc_buf_offset(const tc_buf *buf, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < buf->rank; ++d) {
        off += idx[d] * buf->strides[d];
    }
    return off;
}

float *tc_buf_fptr(const tc_buf *buf, const int64_t *idx)
{
    return buf->fbase + buf->offset + tc_buf_offset(buf, idx);
}

void tc_buf_set(tc_buf *buf, const int64_t *idx, float value)
{
    int64_t at = buf->offset + tc_buf_offset(buf, idx);
    buf->fbase[at] = value;
    buf->dbase[at] = (double)value;
}

int tc_index_next(int rank, const int64_t *shape, int64_t *idx)
{
    for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < shape[d]) {
            return 1;
        }
        idx[d] = 0;
    }
    return 0;
}

int64_t tc_numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
        n *= shape[d];
    }
    return n;
}

void tc_buf_fill_uniform(tc_buf *buf, tc_rng *rng, double lo, double hi)
{
    if (tc_numel(buf->rank, buf->shape) == 0) {
        return;
    }
    int64_t idx[SDPA_MAX_RANK] = {0};
    do {
        tc_buf_set(buf, idx, (float)tc_rng_uniform(rng, lo, hi));
    } while (tc_index_next(buf->rank, buf->shape, idx));
}

sdpa_tensor tc_buf_view(const tc_buf *buf)
{
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf->fbase + buf->offset;
    t.dtype = SDPA_DTYPE_F32;
    t.rank = buf->rank;
    for (int d = 0; d < buf->rank; ++d) {
        t.shape[d] = buf->shape[d];
        t.strides[d] = buf->strides[d];
    }
    return t;
}

ref_view tc_buf_ref_same_rank(const tc_buf *buf)
{
    ref_view r;
    memset(&r, 0, sizeof r);
    r.data = buf->dbase + buf->offset;
    r.rank = buf->rank;
    for (int d = 0; d < buf->rank; ++d) {
        r.shape[d] = buf->shape[d];
        r.strides[d] = buf->strides[d];
    }
    return r;
}

ref_view tc_buf_ref4(const tc_buf *buf)
{
    ref_view r = tc_buf_ref_same_rank(buf);
    if (buf->rank == 3) {
        r.rank = 4;
        r.shape[0] = buf->shape[0];
        r.shape[1] = 1;
        r.shape[2] = buf->shape[1];
        r.shape[3] = buf->shape[2];
        r.strides[0] = buf->strides[0];
        r.strides[1] = 0;
        r.strides[2] = buf->strides[1];
        r.strides[3] = buf->strides[2];
    }
    return r;
}

int tc_buf_holes_intact(const tc_buf *buf)
{
    unsigned char *covered = calloc(buf->n, 1);
    assert_non_null(covered);
    if (tc_numel(buf->rank, buf->shape) > 0) {
        int64_t idx[SDPA_MAX_RANK] = {0};
        do {
            covered[buf->offset + tc_buf_offset(buf, idx)] = 1;
        } while (tc_index_next(buf->rank, buf->shape, idx));
    }
    int ok = 1;
    for (size_t e = 0; e < buf->n && ok; ++e) {
        if (!covered[e] && !tc_is_canary(buf->fbase + e, sizeof(float))) {
            ok = 0;
        }
    }
    free(covered);
    return ok;
}

int tc_buf_all_canary(const tc_buf *buf)
{
    return tc_is_canary(buf->fbase, buf->n * sizeof(float));
}

/* ------------------------------------------------------------------- misc */

void tc_fill_canary(void *p, size_t bytes)
{
    memset(p, TC_CANARY_BYTE, bytes);
}

int tc_is_canary(const void *p, size_t bytes)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; ++i) {
        if (c[i] != TC_CANARY_BYTE) {
            return 0;
        }
    }
    return 1;
}

sdpa_tensor tc_view4(float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init_4d(&t, data, d0, d1, d2, d3), SDPA_OK);
    return t;
}

sdpa_tensor tc_view3(float *data, int64_t d0, int64_t d1, int64_t d2)
{
    sdpa_tensor t;
    assert_int_equal(sdpa_tensor_init_3d(&t, data, d0, d1, d2), SDPA_OK);
    return t;
}

sdpa_allow_mask tc_mask_view(const uint8_t *data, int rank, const int64_t *shape)
{
    sdpa_allow_mask m;
    assert_int_equal(sdpa_allow_mask_init(&m, data, rank, shape), SDPA_OK);
    return m;
}
