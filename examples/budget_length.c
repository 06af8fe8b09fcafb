/*
 * Budget the sequence length before running anything: the longest self-attention sequence
 * (L = S) whose call stays within a FLOP budget and a memory-traffic budget, for four mask
 * patterns of a Llama-like layer (Hq = 32 query heads, Hkv = 8 kv heads, head width 128,
 * bfloat16 q/k/v/out):
 *
 *   full      no mask                          L^2 pairs per head
 *   causal    options.causal                   L (L + 1) / 2
 *   window    causal + sliding window W = 512  W (W + 1) / 2 + (L - W) W   (L >= W)
 *   padding   causal, a batch of 4 sequences   sum_b l_b (l_b + 1) / 2 with key_lengths =
 *             padded to L, lengths L, 3L/4,    query_lengths = l_b (right padding)
 *             L/2, L/4
 *
 * sdpa_attention_cost() answers for each candidate L without running the call and without
 * memory for it: q, k and v are stride-0 views of one element (any shape is a valid input
 * view), and out = NULL means "the call will get a valid out". Its counts come from the same
 * rule the kernels use; this example checks them against the closed forms above, checks that
 * the L it finds is the longest within budget (L + 1 is not), and prints the table.
 * It also shows the exact scan: the causal pattern given as an explicit allow-mask (built by
 * sdpa_mask_causal) is counted by reading the mask (SDPA_COST_EXACT), with the same result.
 * Exits 1 on any mismatch.
 */
#include <stdint.h>

#include "common.h"

enum { HQ = 32, HKV = 8, HEAD = 128, WINDOW = 512, PADDED_B = 4 };

static const double FLOP_BUDGET = 2.0e12;          /* 2 TFLOP per attention call */
static const double BYTE_BUDGET = 4.0 * (1 << 30); /* 4 GiB of q/k/v/out traffic per call */

typedef enum pattern { FULL, CAUSAL, WINDOWED, PADDING, NPATTERNS } pattern;
static const char *const NAMES[NPATTERNS] = {"full", "causal", "window", "padding"};

static uint16_t one_element; /* every q, k, v element: views with stride 0 */

/* A bfloat16 view [B, H, N, HEAD] of one element (all strides 0). */
static sdpa_tensor broadcast_view(int64_t B, int64_t H, int64_t N)
{
    const int64_t shape[4] = {B, H, N, HEAD}, strides[4] = {0, 0, 0, 0};
    sdpa_tensor t;
    CHECK(sdpa_tensor_init_strided(&t, &one_element, SDPA_DTYPE_BF16, 4, shape, strides));
    return t;
}

/* Sequence lengths of the padded batch of length L. */
static int64_t padded_length(int64_t L, int b) { return L * (PADDED_B - b) / PADDED_B; }

/* The cost of pattern p at length L. */
static sdpa_cost cost_of(pattern p, int64_t L)
{
    const int64_t B = p == PADDING ? PADDED_B : 1;
    sdpa_tensor q = broadcast_view(B, HQ, L), kv = broadcast_view(B, HKV, L);
    int64_t lengths[PADDED_B];
    sdpa_options o;
    sdpa_options_init(&o);
    o.causal = p != FULL;
    if (p == WINDOWED) { /* Hugging Face sliding_window = W with causal is (W - 1, 0) */
        o.sliding_window = 1;
        o.window_left = WINDOW - 1;
        o.window_right = 0;
    }
    if (p == PADDING) {
        for (int b = 0; b < PADDED_B; b++)
            lengths[b] = padded_length(L, b);
        o.key_lengths = lengths;
        o.query_lengths = lengths;
    }
    sdpa_cost c;
    sdpa_cost_init(&c);
    CHECK(sdpa_attention_cost(&q, &kv, &kv, &o, NULL, NULL, NULL, NULL, &c));
    return c;
}

/* Allowed (query, key) pairs of pattern p at length L, per query head, in closed form. */
static int64_t closed_form(pattern p, int64_t L)
{
    switch (p) {
    case FULL: return L * L;
    case CAUSAL: return L * (L + 1) / 2;
    case WINDOWED: return L <= WINDOW ? L * (L + 1) / 2 : (int64_t)WINDOW * (WINDOW + 1) / 2 + (L - WINDOW) * WINDOW;
    default: {
        int64_t n = 0;
        for (int b = 0; b < PADDED_B; b++)
            n += padded_length(L, b) * (padded_length(L, b) + 1) / 2;
        return n;
    }
    }
}

static double traffic(const sdpa_cost *c)
{
    return (double)c->bytes_read_q + (double)c->bytes_read_k + (double)c->bytes_read_v +
           (double)c->bytes_written_out;
}

static int within(const sdpa_cost *c) { return (double)c->flops <= FLOP_BUDGET && traffic(c) <= BYTE_BUDGET; }

int main(void)
{
    check_library_version();
    int failures = 0;
    printf("Longest L = S within %.1f TFLOP and %.1f GiB per call (Hq=%d, Hkv=%d, head %d, bf16):\n\n",
           FLOP_BUDGET / 1e12, BYTE_BUDGET / (1 << 30), HQ, HKV, HEAD);
    printf("%-8s %9s %16s %9s %9s %9s  %s\n", "pattern", "L", "pairs/head", "TFLOP", "GiB", "limit", "kernel");
    for (int p = 0; p < NPATTERNS; p++) {
        int64_t lo = 1, hi = (int64_t)1 << 22; /* lo within budget, hi not */
        const sdpa_cost first = cost_of((pattern)p, lo), last = cost_of((pattern)p, hi);
        if (!within(&first) || within(&last)) {
            fprintf(stderr, "%s: the budget does not bracket [%lld, %lld]\n", NAMES[p], (long long)lo, (long long)hi);
            return EXIT_FAILURE;
        }
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            const sdpa_cost c = cost_of((pattern)p, mid);
            if (within(&c))
                lo = mid;
            else
                hi = mid;
        }
        const sdpa_cost c = cost_of((pattern)p, lo), next = cost_of((pattern)p, lo + 1);
        const int64_t pairs = c.allowed_pairs / HQ; /* per query head (the padded batch: summed over b) */
        const int64_t want = closed_form((pattern)p, lo);
        const char *limit = (double)next.flops > FLOP_BUDGET ? "FLOPs" : "bytes";
        printf("%-8s %9lld %16lld %9.3f %9.3f %9s  %s\n", NAMES[p], (long long)lo, (long long)pairs,
               (double)c.flops / 1e12, traffic(&c) / (1 << 30), limit, c.kernel);
        /* the library's count is the closed form; FLOPs are 2 (E + Ev) per pair */
        if (c.allowed_pairs != want * HQ || c.flops != 2 * (HEAD + HEAD) * c.allowed_pairs || !c.exact) {
            fprintf(stderr, "%s at L=%lld: %lld pairs, closed form %lld (x %d heads)\n", NAMES[p], (long long)lo,
                    (long long)c.allowed_pairs, (long long)want, HQ);
            failures++;
        }
        if (!within(&c) || within(&next)) {
            fprintf(stderr, "%s: L=%lld is not the longest within budget\n", NAMES[p], (long long)lo);
            failures++;
        }
    }

    /* The exact scan: causal as an explicit allow-mask [L, L], read by SDPA_COST_EXACT. */
    enum { LM = 1024 };
    uint8_t *mask = malloc((size_t)LM * LM);
    if (mask == NULL)
        return EXIT_FAILURE;
    CHECK(sdpa_mask_causal(mask, LM, LM, SDPA_ALIGN_TOP_LEFT));
    sdpa_allow_mask m;
    const int64_t mshape[2] = {LM, LM};
    CHECK(sdpa_allow_mask_init(&m, mask, 2, mshape));
    sdpa_tensor q = broadcast_view(1, HQ, LM), kv = broadcast_view(1, HKV, LM);
    sdpa_options o;
    sdpa_options_init(&o);
    o.allow_mask = &m;
    sdpa_cost_options co;
    sdpa_cost_options_init(&co);
    sdpa_cost loose, exact;
    sdpa_cost_init(&loose);
    sdpa_cost_init(&exact);
    CHECK(sdpa_attention_cost(&q, &kv, &kv, &o, NULL, NULL, NULL, &co, &loose)); /* mask not read */
    co.flags = SDPA_COST_EXACT;
    CHECK(sdpa_attention_cost(&q, &kv, &kv, &o, NULL, NULL, NULL, &co, &exact)); /* mask read */
    printf("\ncausal as an allow-mask, L=%d: %lld pairs/head unscanned (upper bound, exact=%d), "
           "%lld scanned (exact=%d)\n",
           LM, (long long)(loose.allowed_pairs / HQ), loose.exact, (long long)(exact.allowed_pairs / HQ), exact.exact);
    if (loose.exact || !exact.exact || loose.allowed_pairs != (int64_t)LM * LM * HQ ||
        exact.allowed_pairs != closed_form(CAUSAL, LM) * HQ) {
        fprintf(stderr, "the exact scan of the causal allow-mask disagrees with the closed form\n");
        failures++;
    }
    free(mask);
    return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
