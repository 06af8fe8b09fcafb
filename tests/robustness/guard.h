/*
 * Guarded allocations for the robustness harnesses: a region placed right before (or right
 * after) a PROT_NONE page, so any read or write one byte beyond its end (or before its start)
 * faults. Views over such regions with random strides (BSHD/BHSD orders, padding, stride 0,
 * negative strides) and their "stride gaps" (bytes of the region no logical element covers).
 */
#ifndef SDPA_RB_GUARD_H
#define SDPA_RB_GUARD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rb_util.h"

typedef struct rb_guard {
    unsigned char *map;
    size_t map_len;
    unsigned char *lo; /* first byte of the region */
    size_t bytes;
} rb_guard;

/* `bytes` bytes against a PROT_NONE page: after the region (at_end = 1) or before it. */
static inline void *rb_guard_alloc(rb_guard *g, size_t bytes, int at_end)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t need = bytes == 0 ? 1 : bytes;
    const size_t pages = (need + page - 1) / page + 2;
    g->map_len = pages * page;
    void *m = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    g->map = (unsigned char *)m;
    if (mprotect(g->map, page, PROT_NONE) != 0 || mprotect(g->map + g->map_len - page, page, PROT_NONE) != 0) {
        perror("mprotect");
        exit(2);
    }
    g->lo = at_end ? g->map + g->map_len - page - need : g->map + page;
    g->bytes = need;
    return g->lo;
}

static inline void rb_guard_free(rb_guard *g)
{
    if (g->map)
        munmap(g->map, g->map_len);
    memset(g, 0, sizeof *g);
}

/* A guarded strided tensor of up to 4 logical dimensions, elements of `elem` bytes. */
typedef struct rb_gt {
    rb_guard g;
    int rank;
    size_t elem;
    int64_t shape[4], strides[4];
    int64_t min_off, span; /* element offsets of the region relative to element [0,..,0]: [min_off, min_off + span) */
    void *data;            /* element [0, ..., 0] */
    uint8_t *role;         /* per region element: 0 = gap, 1 = read by the call, 2 = logical but never read */
} rb_gt;

enum { RB_GAP = 0, RB_READ = 1, RB_UNREAD = 2 };

/* Layout flags. */
enum { RB_LAY_NEG = 1, RB_LAY_BCAST = 2, RB_LAY_PERM = 4, RB_LAY_PAD = 8 };

/*
 * Choose strides for `shape` (rank <= 4) from the allowed flags: dims stored in logical order or
 * with dims 1 and 2 swapped (BSHD for [B, H, L, E]), padding after some dims, and for inputs stride
 * 0 on some dims and negative strides on others; then allocate the region against a guard page
 * (at its end, or at its start when a stride is negative and the coin says so).
 */
static inline void rb_gt_make(rb_gt *t, rb_rng *r, int rank, const int64_t *shape, size_t elem, int allow)
{
    memset(t, 0, sizeof *t);
    t->rank = rank;
    t->elem = elem;
    int order[4] = {0, 1, 2, 3};
    if ((allow & RB_LAY_PERM) && rank >= 2 && rb_chance(r, 40)) {
        const int a = rank == 4 ? 1 : 0; /* [B,H,L,E] -> BSHD; [B,L,E] -> seq-first; [R,C] -> column-major */
        order[a] = a + 1;
        order[a + 1] = a;
    }
    int64_t st = 1;
    for (int k = rank - 1; k >= 0; --k) { /* physical position k, innermost last */
        const int d = order[k];
        t->shape[d] = shape[d];
        t->strides[d] = st;
        int64_t ext = shape[d] > 0 ? shape[d] : 1;
        if ((allow & RB_LAY_PAD) && rb_chance(r, 30))
            ext += rb_int(r, 1, 3);
        st *= ext;
    }
    for (int d = 0; d < rank; ++d) {
        if ((allow & RB_LAY_BCAST) && rb_chance(r, 8))
            t->strides[d] = 0;
        else if ((allow & RB_LAY_NEG) && rb_chance(r, 20))
            t->strides[d] = -t->strides[d];
    }
    int64_t lo = 0, hi = 0, numel = 1;
    for (int d = 0; d < rank; ++d) {
        numel *= shape[d];
        const int64_t ext = (shape[d] > 0 ? shape[d] - 1 : 0) * t->strides[d];
        if (ext < 0)
            lo += ext;
        else
            hi += ext;
    }
    t->min_off = lo;
    t->span = numel == 0 ? 1 : hi - lo + 1;
    int neg = lo < 0;
    int at_end = neg ? rb_chance(r, 50) : rb_chance(r, 85);
    unsigned char *base = (unsigned char *)rb_guard_alloc(&t->g, (size_t)t->span * elem, at_end);
    t->data = base + (size_t)(-lo) * elem;
    t->role = (uint8_t *)calloc((size_t)t->span, 1);
}

static inline void rb_gt_free(rb_gt *t)
{
    rb_guard_free(&t->g);
    free(t->role);
    memset(t, 0, sizeof *t);
}

/* Region index (0..span) of a logical index. */
static inline int64_t rb_gt_slot(const rb_gt *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; ++d)
        off += idx[d] * t->strides[d];
    return off - t->min_off;
}

static inline float *rb_gt_f(const rb_gt *t, const int64_t *idx)
{
    return (float *)(void *)t->g.lo + rb_gt_slot(t, idx);
}

/* Next logical index in row-major order; 0 after the last. */
static inline int rb_index_next(int rank, const int64_t *shape, int64_t *idx)
{
    for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < shape[d])
            return 1;
        idx[d] = 0;
    }
    return 0;
}

static inline int64_t rb_numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; ++d)
        n *= shape[d];
    return n;
}

static inline sdpa_tensor rb_gt_view(const rb_gt *t)
{
    return rb_view((float *)t->data, t->rank, t->shape, t->strides);
}

#endif /* SDPA_RB_GUARD_H */
