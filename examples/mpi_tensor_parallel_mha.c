/*
 * mpi_tensor_parallel_mha: one torch.nn.MultiheadAttention layer split by heads across P MPI
 * ranks (Megatron-style tensor parallelism), equal to one process's sdpa_mha_forward.
 *
 *   mpirun -np 4 ./build/examples/mpi_tensor_parallel_mha
 *
 * Rank r owns heads [r*H/P, (r+1)*H/P): the matching rows of the q, k and v projections
 * (column-parallel: views into the full in_proj_weight, no copy) and the matching columns of
 * out_proj.weight (row-parallel: a strided view). Each rank runs sdpa_mha_forward as a layer
 * of H/P heads of width Dh = E/H (head_dim) over the whole input and gets a partial output
 * [B, L, E]; one MPI_Allreduce(SUM) adds the partials. out_proj.bias is added by rank 0 only,
 * so it is counted once. Compared with sdpa_mha_forward of the whole layer in one process:
 * max |difference| <= 1e-6 (the sum over ranks only regroups the output projection's sum).
 * The bytes each rank hands to MPI are printed next to the formula of bench/mpi_comm.md.
 * The library does not link MPI; this program does.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common.h"

enum { B = 2, L = 48, E = 64, H = 8 };
static const double TOL = 1e-6;

static float value_at(uint32_t seed, size_t i, float scale) {
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return scale * (float)((double)(x >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

static sdpa_tensor view2(float *data, int64_t rows, int64_t cols, int64_t row_stride) {
    sdpa_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = SDPA_DTYPE_F32;
    t.rank = 2;
    t.shape[0] = rows, t.shape[1] = cols;
    t.strides[0] = row_stride, t.strides[1] = 1;
    return t;
}

int main(int argc, char **argv) {
    int rank, P;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    check_library_version();
    if (H % P) {
        if (rank == 0) fprintf(stderr, "H = %d heads do not split over %d ranks\n", H, P);
        MPI_Finalize();
        return 1;
    }
    const int Dh = E / H, Hr = H / P, Dr = Hr * Dh; /* heads and projection rows per rank */

    /* The whole layer's weights (PyTorch layout, y = x W^T + b) and input, on every rank. */
    static float in_w[3 * E * E], in_b[3 * E], out_w[E * E], out_b[E], x[B * L * E];
    const float ws = 1.0f / sqrtf((float)E);
    for (size_t i = 0; i < sizeof in_w / sizeof *in_w; i++) in_w[i] = value_at(1, i, ws);
    for (size_t i = 0; i < sizeof in_b / sizeof *in_b; i++) in_b[i] = value_at(2, i, 0.1f);
    for (size_t i = 0; i < sizeof out_w / sizeof *out_w; i++) out_w[i] = value_at(3, i, ws);
    for (size_t i = 0; i < sizeof out_b / sizeof *out_b; i++) out_b[i] = value_at(4, i, 0.1f);
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = value_at(5, i, 1.0f);
    sdpa_tensor tx;
    CHECK(sdpa_tensor_init_3d(&tx, x, B, L, E));
    sdpa_mha_options opt;
    sdpa_mha_options_init(&opt);
    opt.causal = 1;
    opt.num_threads = 1; /* the ranks share the machine's cores */

    /* ---- this rank's shard of the layer ---- */
    const int r0 = rank * Dr; /* first projection row (of q, k and v each) */
    sdpa_tensor wq = view2(in_w + (size_t)(0 * E + r0) * E, Dr, E, E);
    sdpa_tensor wk = view2(in_w + (size_t)(1 * E + r0) * E, Dr, E, E);
    sdpa_tensor wv = view2(in_w + (size_t)(2 * E + r0) * E, Dr, E, E);
    sdpa_tensor wo = view2(out_w + r0, E, Dr, E); /* columns r0 .. r0 + Dr of out_proj.weight */
    float bias[3 * E]; /* [q | k | v] rows of this rank: not one strided view, so a small copy */
    for (int part = 0; part < 3; part++) memcpy(bias + part * Dr, in_b + part * E + r0, sizeof(float) * Dr);
    int64_t bshape[1] = {3 * Dr}, eshape[1] = {E};
    sdpa_tensor tb, tob;
    CHECK(sdpa_tensor_init(&tb, bias, 1, bshape));
    CHECK(sdpa_tensor_init(&tob, out_b, 1, eshape));
    sdpa_mha_params local;
    sdpa_mha_params_init(&local);
    local.embed_dim = E;
    local.num_heads = Hr;
    local.head_dim = Dh;
    local.q_proj_weight = &wq, local.k_proj_weight = &wk, local.v_proj_weight = &wv;
    local.in_proj_bias = &tb;
    local.out_proj_weight = &wo;
    local.out_proj_bias = rank == 0 ? &tob : NULL; /* the bias once in the sum */

    static float part_out[B * L * E], ref[B * L * E];
    sdpa_tensor tpart;
    CHECK(sdpa_tensor_init_3d(&tpart, part_out, B, L, E));
    CHECK(sdpa_mha_forward(&local, &tx, &tx, &tx, &opt, &tpart, NULL));
    MPI_Allreduce(MPI_IN_PLACE, part_out, B * L * E, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const long long bytes = (long long)B * L * E * (long long)sizeof(float);

    /* ---- one process: the whole layer ---- */
    sdpa_tensor tw, tow, tib, tr;
    int64_t wshape[2] = {3 * E, E}, oshape[2] = {E, E}, ibshape[1] = {3 * E};
    CHECK(sdpa_tensor_init(&tw, in_w, 2, wshape));
    CHECK(sdpa_tensor_init(&tow, out_w, 2, oshape));
    CHECK(sdpa_tensor_init(&tib, in_b, 1, ibshape));
    CHECK(sdpa_tensor_init_3d(&tr, ref, B, L, E));
    sdpa_mha_params whole;
    sdpa_mha_params_init(&whole);
    whole.embed_dim = E;
    whole.num_heads = H;
    whole.in_proj_weight = &tw;
    whole.in_proj_bias = &tib;
    whole.out_proj_weight = &tow;
    whole.out_proj_bias = &tob;
    CHECK(sdpa_mha_forward(&whole, &tx, &tx, &tx, &opt, &tr, NULL));

    double err = 0, all;
    for (int i = 0; i < B * L * E; i++) {
        double d = fabs((double)part_out[i] - (double)ref[i]);
        if (!(d <= err)) err = d;
    }
    MPI_Allreduce(&err, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const int ok = all <= TOL;
    if (rank == 0) {
        printf("P = %d ranks, B = %d, L = S = %d, E = %d, H = %d (%d heads per rank, Dh = %d), causal self-attention\n",
               P, B, L, E, H, Hr, Dh);
        printf("heads split across ranks + one allreduce(SUM): max |diff| vs one process = %.3g (tolerance %g): %s\n",
               all, TOL, ok ? "OK" : "FAILED");
        printf("bytes each rank gives MPI per layer: %lld = B*L*E*4 (per token: E*4 = %d; formulas: bench/mpi_comm.md)\n",
               bytes, (int)(E * sizeof(float)));
        printf("mpi_tensor_parallel_mha: %s\n", ok ? "OK" : "FAILED");
    }
    MPI_Finalize();
    return ok ? 0 : 1;
}
