/*
 * mpi_sequence_parallel: attention over a KV sequence split across P MPI ranks, exactly.
 *
 *   mpirun -np 4 ./build/examples/mpi_sequence_parallel
 *
 * Each rank holds S/P keys and values (a contiguous shard of the sequence) and attends to
 * them only, asking sdpa_attention for (out, lse); the parts are combined with sdpa_merge's
 * rule (sdpa_merge in include/sdpa.h), which is commutative and associative up to rounding:
 *
 *   1. prefill (L = S queries on every rank, causal bottom-right): each rank's part uses
 *      SDPA_ALIGN_OFFSETS with the shard's real key positions and SDPA_EMPTY_ROWS_ZERO (a
 *      query before the shard has no key there: lse = -inf, it contributes nothing); the
 *      parts are combined by MPI_Allreduce with a user-defined operation that calls
 *      sdpa_merge on (out, lse) rows;
 *   2. decode: 4 steps of one new query; each new token's K/V row is appended to rank
 *      t % P's shard; same reduction;
 *   3. ring order (ring attention): queries sharded too; each rank computes its query block
 *      against the K/V block it holds, merges it into its running (out, lse) with
 *      sdpa_merge, and passes the K/V block to the next rank (P - 1 transfers);
 *   4. the prefill of 1. with K/V stored as float16 (q and out float32) once the library
 *      computes f16; a library without f16 answers SDPA_ERR_DTYPE and this part prints
 *      "not run: library lacks f16".
 *
 * Every result is compared with one process's sdpa_attention over the whole sequence
 * (every rank has the whole input, generated from the same seed, for that check only):
 * max |difference| <= 1e-6 on out and lse. The bytes each rank hands to MPI are printed next
 * to the formulas of bench/mpi_comm.md. Exit status 0 when every part that ran matched.
 * The library does not link MPI; this program does.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common.h"

enum { B = 1, HQ = 4, HKV = 2, E = 32, EV = 32, PER_RANK = 64, STEPS = 4 };
static const double TOL = 1e-6;

static int g_rank, g_size;
static int g_merge_failed;

/* Deterministic inputs in [-1, 1): element `i` of stream `seed`, the same on every rank. */
static float value_at(uint32_t seed, size_t i) {
    uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (float)((double)(x >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* K or V of the whole sequence, [B, Hkv, cap, D] (cap >= positions), token t at row t. */
static void fill_cache(float *x, int cap, int positions, int d, uint32_t seed) {
    for (int h = 0; h < HKV; h++)
        for (int t = 0; t < positions; t++)
            for (int c = 0; c < d; c++)
                x[((size_t)h * cap + t) * d + c] = value_at(seed, ((size_t)h * 100000 + t) * d + c);
}

static sdpa_tensor cache_view(void *data, int cap, int rows, int d) {
    return view4(data, B, HKV, rows, d, (int64_t)HKV * cap * d, (int64_t)cap * d, d, 1);
}

/* One part: attention of q [B, Hq, L, E] over keys k/v [B, Hkv, n, *], whose key 0 sits at
 * global position `first_key`; query 0 sits at global position `first_query`. Causal over
 * global positions (j <= p) via SDPA_ALIGN_OFFSETS when `causal`; rows with no key there get
 * zero and lse = -inf. out [B*Hq*L*Ev], lse [B*Hq*L]. Returns the status (f16 may fail). */
static sdpa_status part(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v, int causal,
                        int64_t first_query, int64_t first_key, float *out, float *lse) {
    const int64_t L = q->shape[2];
    sdpa_tensor tout = view4(out, B, HQ, L, EV, HQ * L * EV, L * EV, EV, 1);
    sdpa_tensor tlse;
    int64_t shape[3] = {B, HQ, L};
    int64_t offsets[B] = {first_query - first_key};
    sdpa_options opt;
    CHECK(sdpa_tensor_init(&tlse, lse, 3, shape));
    sdpa_options_init(&opt);
    opt.causal = causal;
    opt.alignment = SDPA_ALIGN_OFFSETS;
    opt.query_offsets = offsets;
    opt.empty_rows = SDPA_EMPTY_ROWS_ZERO;
    opt.num_threads = 1; /* the ranks share the machine's cores */
    return sdpa_attention(q, k, v, &opt, &tout, NULL, &tlse);
}

/* One process's answer (the reference): q [B, Hq, L, E] over the whole cache k/v, causal
 * bottom-right, into ref [B*Hq*L*Ev] and ref_lse [B*Hq*L]. */
static sdpa_status one_process(const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v, float *ref,
                               float *ref_lse) {
    const int64_t L = q->shape[2];
    sdpa_tensor tr = view4(ref, B, HQ, L, EV, HQ * L * EV, L * EV, EV, 1), tl;
    int64_t ls[3] = {B, HQ, L};
    sdpa_options opt;
    CHECK(sdpa_tensor_init(&tl, ref_lse, 3, ls));
    sdpa_options_init(&opt);
    opt.causal = 1;
    opt.alignment = SDPA_ALIGN_BOTTOM_RIGHT;
    opt.num_threads = 1;
    return sdpa_attention(q, k, v, &opt, &tr, NULL, &tl);
}

/* -------------------------------------------------- the reduction: sdpa_merge on rows */
/* A reduction element is one query row: Ev output floats then its lse (MPI type "row").
 * (out and lse travel in one buffer; sdpa_merge wants them apart, so the operation unpacks
 * into scratch, merges in place into the inout side, and packs back.) */

static void merge_rows(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const int64_t rows = *len;
    float *a = in, *b = inout;
    float *scratch = malloc(sizeof(float) * (size_t)rows * (EV + 1) * 2);
    if (!scratch) { g_merge_failed = 1; return; }
    float *oa = scratch, *ob = oa + rows * EV, *la = ob + rows * EV, *lb = la + rows;
    for (int64_t r = 0; r < rows; r++) {
        memcpy(oa + r * EV, a + r * (EV + 1), sizeof(float) * EV);
        memcpy(ob + r * EV, b + r * (EV + 1), sizeof(float) * EV);
        la[r] = a[r * (EV + 1) + EV];
        lb[r] = b[r * (EV + 1) + EV];
    }
    int64_t oshape[2] = {rows, EV}, lshape[1] = {rows};
    sdpa_tensor toa, tob, tla, tlb;
    if (sdpa_tensor_init(&toa, oa, 2, oshape) != SDPA_OK || sdpa_tensor_init(&tob, ob, 2, oshape) != SDPA_OK ||
        sdpa_tensor_init(&tla, la, 1, lshape) != SDPA_OK || sdpa_tensor_init(&tlb, lb, 1, lshape) != SDPA_OK ||
        sdpa_merge(&toa, &tla, &tob, &tlb, &tob, &tlb) != SDPA_OK) { /* in place into b */
        fprintf(stderr, "rank %d: sdpa_merge in the reduction failed: %s\n", g_rank, sdpa_last_error_message());
        g_merge_failed = 1;
    }
    for (int64_t r = 0; r < rows; r++) {
        memcpy(b + r * (EV + 1), ob + r * EV, sizeof(float) * EV);
        b[r * (EV + 1) + EV] = lb[r];
    }
    free(scratch);
}

static MPI_Datatype g_row;
static MPI_Op g_merge;
static long long g_bytes_allreduce, g_bytes_ring;

/* Combine every rank's (out, lse) part into the whole: allreduce with the merge operation. */
static void allreduce_merge(float *out, float *lse, int64_t rows) {
    float *pack = malloc(sizeof(float) * (size_t)rows * (EV + 1));
    if (!pack) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
    for (int64_t r = 0; r < rows; r++) {
        memcpy(pack + r * (EV + 1), out + r * EV, sizeof(float) * EV);
        pack[r * (EV + 1) + EV] = lse[r];
    }
    MPI_Allreduce(MPI_IN_PLACE, pack, (int)rows, g_row, g_merge, MPI_COMM_WORLD);
    g_bytes_allreduce += (long long)rows * (EV + 1) * (long long)sizeof(float);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(out + r * EV, pack + r * (EV + 1), sizeof(float) * EV);
        lse[r] = pack[r * (EV + 1) + EV];
    }
    free(pack);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Largest difference over all ranks; every rank reports its own part. */
static int report(const char *what, double local_err) {
    double err;
    MPI_Allreduce(&local_err, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int ok = err <= TOL && !g_merge_failed;
    if (g_rank == 0)
        printf("%-44s max |diff| vs one process = %.3g (tolerance %g): %s\n", what, err, TOL, ok ? "OK" : "FAILED");
    return ok;
}

/* IEEE binary16 from float, round to nearest even (for the f16 cache). */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x47800000u) return (uint16_t)(sign | (ax > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (ax < 0x38800000u) { /* subnormal or zero */
        float m = fabsf(f) * 16777216.0f; /* 2^24 */
        return (uint16_t)(sign | (uint32_t)lrintf(m));
    }
    uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u) - 0x38000000u; /* rebias 127 -> 15 */
    return (uint16_t)(sign | (r >> 13));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    check_library_version();
    const int P = g_size, n = PER_RANK, S = P * n, cap = S + STEPS;
    const int L = S; /* prefill: every token queries */
    MPI_Type_contiguous(EV + 1, MPI_FLOAT, &g_row);
    MPI_Type_commit(&g_row);
    MPI_Op_create(merge_rows, 1 /* commutative: swapping a and b changes nothing */, &g_merge);

    /* The whole sequence (for the one-process check) and this rank's shard. */
    float *kg = malloc(sizeof(float) * HKV * cap * E), *vg = malloc(sizeof(float) * HKV * cap * EV);
    float *qg = malloc(sizeof(float) * B * HQ * L * E);
    int local_cap = n + STEPS;
    float *kl = malloc(sizeof(float) * HKV * local_cap * E), *vl = malloc(sizeof(float) * HKV * local_cap * EV);
    float *out = malloc(sizeof(float) * B * HQ * L * EV), *lse = malloc(sizeof(float) * B * HQ * L);
    float *ref = malloc(sizeof(float) * B * HQ * L * EV), *ref_lse = malloc(sizeof(float) * B * HQ * L);
    if (!kg || !vg || !qg || !kl || !vl || !out || !lse || !ref || !ref_lse) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill_cache(kg, cap, cap, E, 1);
    fill_cache(vg, cap, cap, EV, 2);
    for (size_t i = 0; i < (size_t)B * HQ * L * E; i++) qg[i] = value_at(3, i);
    const int first = g_rank * n; /* this rank's keys: global positions [first, first + n) */
    for (int h = 0; h < HKV; h++) {
        memcpy(kl + (size_t)h * local_cap * E, kg + ((size_t)h * cap + first) * E, sizeof(float) * n * E);
        memcpy(vl + (size_t)h * local_cap * EV, vg + ((size_t)h * cap + first) * EV, sizeof(float) * n * EV);
    }
    int ok = 1;

    /* ---- 1. prefill: L = S queries, causal bottom-right over the whole sequence ---- */
    sdpa_tensor tq = view4(qg, B, HQ, L, E, (int64_t)HQ * L * E, (int64_t)L * E, E, 1);
    sdpa_tensor tkl = cache_view(kl, local_cap, n, E), tvl = cache_view(vl, local_cap, n, EV);
    CHECK(part(&tq, &tkl, &tvl, 1, S - L, first, out, lse));
    allreduce_merge(out, lse, (int64_t)B * HQ * L);
    {
        sdpa_tensor tk = cache_view(kg, cap, S, E), tv = cache_view(vg, cap, S, EV);
        CHECK(one_process(&tq, &tk, &tv, ref, ref_lse));
    }
    double err = fmax(max_diff(out, ref, (int64_t)B * HQ * L * EV), max_diff(lse, ref_lse, (int64_t)B * HQ * L));
    ok &= report("prefill f32 (allreduce of sdpa_merge)", err);
    const long long prefill_bytes = g_bytes_allreduce;

    /* ---- 2. decode: one query per step; token S + t joins rank t % P's shard ---- */
    int local_n = n;
    double derr = 0;
    g_bytes_allreduce = 0;
    for (int t = 0; t < STEPS; t++) {
        const int pos = S + t; /* the new token's position; the cache now holds pos + 1 keys */
        if (t % P == g_rank) {
            for (int h = 0; h < HKV; h++) {
                memcpy(kl + ((size_t)h * local_cap + local_n) * E, kg + ((size_t)h * cap + pos) * E, sizeof(float) * E);
                memcpy(vl + ((size_t)h * local_cap + local_n) * EV, vg + ((size_t)h * cap + pos) * EV, sizeof(float) * EV);
            }
            local_n++;
        }
        float qd[B * HQ * E];
        for (int i = 0; i < B * HQ * E; i++) qd[i] = value_at(100 + (uint32_t)t, (size_t)i);
        sdpa_tensor tqd = view4(qd, B, HQ, 1, E, HQ * E, E, E, 1);
        sdpa_tensor tk = cache_view(kl, local_cap, local_n, E), tv = cache_view(vl, local_cap, local_n, EV);
        /* L = 1 at the last position sees every key: no causal rule is needed on the parts
         * (the shards' keys are no longer contiguous positions, which does not matter). */
        CHECK(part(&tqd, &tk, &tv, 0, 0, 0, out, lse));
        allreduce_merge(out, lse, (int64_t)B * HQ);
        sdpa_tensor tkg = cache_view(kg, cap, pos + 1, E), tvg = cache_view(vg, cap, pos + 1, EV);
        CHECK(one_process(&tqd, &tkg, &tvg, ref, ref_lse));
        derr = fmax(derr, fmax(max_diff(out, ref, B * HQ * EV), max_diff(lse, ref_lse, B * HQ)));
    }
    ok &= report("decode f32, 4 steps (allreduce)", derr);
    const long long decode_bytes = g_bytes_allreduce / STEPS;

    /* ---- 3. ring order: query block r and K/V block r on rank r; K/V blocks travel ---- */
    {
        const int qfirst = g_rank * n;
        float *kb = malloc(sizeof(float) * HKV * n * E), *vb = malloc(sizeof(float) * HKV * n * EV);
        float *acc = malloc(sizeof(float) * B * HQ * n * EV), *acc_lse = malloc(sizeof(float) * B * HQ * n);
        if (!kb || !vb || !acc || !acc_lse) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (int h = 0; h < HKV; h++) { /* this rank's own block, contiguous [Hkv, n, D] */
            memcpy(kb + (size_t)h * n * E, kg + ((size_t)h * cap + qfirst) * E, sizeof(float) * n * E);
            memcpy(vb + (size_t)h * n * EV, vg + ((size_t)h * cap + qfirst) * EV, sizeof(float) * n * EV);
        }
        /* the query block: rows [qfirst, qfirst + n) of the prefill queries (a view) */
        sdpa_tensor tqb = view4(qg + (size_t)qfirst * E, B, HQ, n, E, (int64_t)HQ * L * E, (int64_t)L * E, E, 1);
        sdpa_tensor tka = view4(acc, B, HQ, n, EV, HQ * n * EV, n * EV, EV, 1), tla;
        int64_t ls[3] = {B, HQ, n};
        CHECK(sdpa_tensor_init(&tla, acc_lse, 3, ls));
        for (int s = 0; s < P; s++) {
            const int j = (g_rank - s + P) % P; /* the block held at step s */
            sdpa_tensor tk = cache_view(kb, n, n, E), tv = cache_view(vb, n, n, EV);
            CHECK(part(&tqb, &tk, &tv, 1, qfirst, (int64_t)j * n, s == 0 ? acc : out, s == 0 ? acc_lse : lse));
            if (s > 0) {
                sdpa_tensor tpo = view4(out, B, HQ, n, EV, HQ * n * EV, n * EV, EV, 1), tpl;
                CHECK(sdpa_tensor_init(&tpl, lse, 3, ls));
                CHECK(sdpa_merge(&tka, &tla, &tpo, &tpl, &tka, &tla)); /* in place into acc */
            }
            if (s < P - 1) { /* pass the K/V block on: to rank + 1, from rank - 1 */
                MPI_Sendrecv_replace(kb, HKV * n * E, MPI_FLOAT, (g_rank + 1) % P, 0, (g_rank - 1 + P) % P, 0,
                                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Sendrecv_replace(vb, HKV * n * EV, MPI_FLOAT, (g_rank + 1) % P, 1, (g_rank - 1 + P) % P, 1,
                                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                g_bytes_ring += (long long)HKV * n * (E + EV) * (long long)sizeof(float);
            }
        }
        /* the one-process rows of this block: ref of part 1 is the whole causal prefill */
        sdpa_tensor tkg = cache_view(kg, cap, S, E), tvg = cache_view(vg, cap, S, EV);
        CHECK(part(&tq, &tkg, &tvg, 1, 0, 0, ref, ref_lse));
        double rerr = 0;
        for (int h = 0; h < HQ; h++) {
            rerr = fmax(rerr, max_diff(acc + (size_t)h * n * EV, ref + ((size_t)h * L + qfirst) * EV, (int64_t)n * EV));
            rerr = fmax(rerr, max_diff(acc_lse + (size_t)h * n, ref_lse + (size_t)h * L + qfirst, n));
        }
        ok &= report("prefill f32, ring order (sdpa_merge per step)", rerr);
        free(kb), free(vb), free(acc), free(acc_lse);
    }

    /* ---- 4. the prefill with a float16 K/V cache (q, out float32) ---- */
    {
        uint16_t *kh = malloc(sizeof(uint16_t) * HKV * cap * E), *vh = malloc(sizeof(uint16_t) * HKV * cap * EV);
        uint16_t *klh = malloc(sizeof(uint16_t) * HKV * n * E), *vlh = malloc(sizeof(uint16_t) * HKV * n * EV);
        if (!kh || !vh || !klh || !vlh) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
        for (size_t i = 0; i < (size_t)HKV * cap * E; i++) kh[i] = to_half(kg[i]);
        for (size_t i = 0; i < (size_t)HKV * cap * EV; i++) vh[i] = to_half(vg[i]);
        for (int h = 0; h < HKV; h++) {
            memcpy(klh + (size_t)h * n * E, kh + ((size_t)h * cap + first) * E, sizeof(uint16_t) * n * E);
            memcpy(vlh + (size_t)h * n * EV, vh + ((size_t)h * cap + first) * EV, sizeof(uint16_t) * n * EV);
        }
        sdpa_tensor tk = cache_view(klh, n, n, E), tv = cache_view(vlh, n, n, EV);
        tk.dtype = tv.dtype = SDPA_DTYPE_F16; /* same shape and strides, in f16 elements */
        sdpa_status st = part(&tq, &tk, &tv, 1, S - L, first, out, lse);
        int lacks = st == SDPA_ERR_DTYPE, any_lacks = 0;
        MPI_Allreduce(&lacks, &any_lacks, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any_lacks) {
            if (g_rank == 0)
                printf("%-44s not run: library lacks f16 (sdpa_attention: SDPA_ERR_DTYPE)\n", "prefill f16 K/V (allreduce)");
        } else {
            CHECK(st);
            allreduce_merge(out, lse, (int64_t)B * HQ * L);
            sdpa_tensor tkg = cache_view(kh, cap, S, E), tvg = cache_view(vh, cap, S, EV);
            tkg.dtype = tvg.dtype = SDPA_DTYPE_F16;
            CHECK(part(&tq, &tkg, &tvg, 1, 0, 0, ref, ref_lse));
            double herr = fmax(max_diff(out, ref, (int64_t)B * HQ * L * EV), max_diff(lse, ref_lse, (int64_t)B * HQ * L));
            ok &= report("prefill f16 K/V (allreduce)", herr);
        }
        free(kh), free(vh), free(klh), free(vlh);
    }

    if (g_rank == 0) {
        const long long f = sizeof(float);
        printf("\nP = %d ranks, B = %d, Hq = %d, Hkv = %d, E = %d, Ev = %d, S = %d (%d per rank)\n", P, B, HQ, HKV, E, EV,
               S, n);
        printf("bytes each rank gives MPI (formulas: bench/mpi_comm.md):\n");
        printf("  prefill allreduce: %lld bytes = B*Hq*L*(Ev+1)*4 = %lld (per query token: Hq*(Ev+1)*4 = %lld)\n",
               prefill_bytes, (long long)B * HQ * L * (EV + 1) * f, (long long)HQ * (EV + 1) * f);
        printf("  decode allreduce:  %lld bytes per step = B*Hq*(Ev+1)*4 = %lld\n", decode_bytes,
               (long long)B * HQ * (EV + 1) * f);
        printf("  ring:              %lld bytes sent = (P-1)*B*Hkv*(S/P)*(E+Ev)*4 = %lld\n", g_bytes_ring,
               (long long)(P - 1) * B * HKV * n * (E + EV) * f);
        printf("mpi_sequence_parallel: %s\n", ok ? "OK" : "FAILED");
    }
    MPI_Op_free(&g_merge);
    MPI_Type_free(&g_row);
    free(kg), free(vg), free(qg), free(kl), free(vl), free(out), free(lse), free(ref), free(ref_lse);
    MPI_Finalize();
    return ok ? 0 : 1;
}
