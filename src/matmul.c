/* The matmul core: logical strided matrices -> cblas_sgemm. The only file that includes cblas.h.
 * An operand BLAS can address directly (unit stride on one axis, a leading dimension at least
 * the other extent) is passed as is, transposed if need be; any other is packed into the
 * caller's workspace first. */
#include "internal.h"

#include <cblas.h>

#if defined(OPENBLAS_VERSION)
#include <sys/mman.h>
#endif

/* Can BLAS read m as row-major (NoTrans) or as the transpose of a row-major matrix? */
static bool as_row_major(const sdpa__mat *m, int64_t *ld) {
    int64_t rs = m->rows <= 1 ? (m->cols > 1 ? m->cols : 1) : m->row_stride;
    int64_t cs = m->cols <= 1 ? 1 : m->col_stride;
    if (cs == 1 && rs >= (m->cols > 1 ? m->cols : 1) && rs <= INT32_MAX) {
        *ld = rs;
        return true;
    }
    return false;
}

static bool as_col_major(const sdpa__mat *m, int64_t *ld) {
    int64_t cs = m->cols <= 1 ? (m->rows > 1 ? m->rows : 1) : m->col_stride;
    int64_t rs = m->rows <= 1 ? 1 : m->row_stride;
    if (rs == 1 && cs >= (m->rows > 1 ? m->rows : 1) && cs <= INT32_MAX) {
        *ld = cs;
        return true;
    }
    return false;
}

size_t sdpa__matmul_pack_floats(const sdpa__mat *m) {
    int64_t ld;
    if (as_row_major(m, &ld) || as_col_major(m, &ld))
        return 0;
    return (size_t)m->rows * (size_t)m->cols;
}

/* Resolve an operand to (pointer, transpose flag, leading dimension), packing if needed. */
static const float *resolve(const sdpa__mat *m, CBLAS_TRANSPOSE *tr, int64_t *ld, float **ws) {
    if (as_row_major(m, ld)) {
        *tr = CblasNoTrans;
        return m->data;
    }
    if (as_col_major(m, ld)) {
        *tr = CblasTrans;
        return m->data;
    }
    float *dst = *ws;
    for (int64_t r = 0; r < m->rows; ++r)
        for (int64_t c = 0; c < m->cols; ++c)
            dst[r * m->cols + c] = m->data[r * m->row_stride + c * m->col_stride];
    *ws += m->rows * m->cols;
    *tr = CblasNoTrans;
    *ld = m->cols > 1 ? m->cols : 1;
    return dst;
}

void sdpa__matmul(const sdpa__mat *a, const sdpa__mat *b, float alpha, float beta, sdpa__mat *c,
                  float *ws) {
    const int64_t m = c->rows, n = c->cols, k = a->cols;
    if (m == 0 || n == 0)
        return;
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda, ldb;
    const float *pa = resolve(a, &ta, &lda, &ws);
    const float *pb = resolve(b, &tb, &ldb, &ws);
    int64_t ldc = m <= 1 ? (n > 1 ? n : 1) : c->row_stride;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, alpha, pa, (int)lda, pb, (int)ldb, beta,
                c->data, (int)ldc);
}

/* OpenBLAS (0.3.21, interface/memory.c) takes its GEMM/GEMV scratch buffer with
 * mmap(BUFFER_SIZE = 128 MiB on x86-64, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS) the first
 * time each of its threads needs one, and loops on a failed mmap without end. Probe whether one
 * such mapping per OpenBLAS thread can be had now, with the same flags (so both RLIMIT_AS and
 * strict overcommit are seen), and give it back at once: untouched, it costs two system calls.
 * Conservative: buffers OpenBLAS already holds are not known here, so under a tight limit this
 * can say no where OpenBLAS would have reused one. Not atomic: memory another thread takes
 * between the probe and the GEMM can still make OpenBLAS hang (documented in sdpa.h). */
bool sdpa__matmul_memory_available(void) {
#if defined(OPENBLAS_VERSION)
    const size_t buffer_bytes = (size_t)128 << 20;
    int threads = openblas_get_num_threads();
    if (threads < 1)
        threads = 1;
    const size_t bytes = buffer_bytes * (size_t)threads + (size_t)2 * 4096;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    munmap(p, bytes);
#endif
    return true;
}
