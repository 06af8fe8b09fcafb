/*
 * A batch of two sequences of different lengths (4 and 2 tokens) padded to N = 4, with causal
 * self-attention, done two ways:
 *
 * 1. Right padding (valid tokens first) with options.key_lengths and options.query_lengths:
 *    keys at j >= key_lengths[b] are blocked and query rows i >= query_lengths[b] are padding,
 *    written as exact zeros.
 * 2. Left padding (padding first, as Hugging Face tokenizers do for generation) with an explicit
 *    allow-mask built by the mask builders:
 *        key padding   sdpa_mask_padding -> [B, S] viewed as [B, 1, 1, S]
 *        query padding sdpa_mask_padding -> [B, L] viewed as [B, 1, L, 1]
 *        AND them, AND the causal mask [L, S]  -> allow-mask [B, 1, L, S]
 *    Padded query rows then have no allowed key at all; SDPA_EMPTY_ROWS_ZERO writes them as zeros
 *    (the default policy, SDPA_EMPTY_ROWS_ERROR, would reject the call).
 *
 * Padding queries, keys and values hold NaN: nothing the library computes an output from reads
 * them, so they cannot leak into the output, and the finite check (on by default) does not
 * inspect them.
 * Exits 1 if a padded row is not exactly zero or the two layouts disagree on a valid token.
 */
#include <math.h>
#include <string.h>

#include "common.h"

enum { B = 2, H = 1, N = 4, L = N, S = N, E = 2, EV = 2 };

static const int64_t lengths[B] = {4, 2};

/* Deterministic token data: component c of token t of sequence b, for q (which = 0), k, v. */
static float token(int which, int b, int t, int c)
{
    return (float)((which * 5 + b * 7 + t * 3 + c * 2) % 11) / 5.0f - 1.0f;
}

/* Fill q, k, v [B, H, N, width] with the tokens of each sequence, right- or left-padded.
 * Padding holds NaN everywhere. The finite check looks only at values that enter the output:
 * query rows that have an allowed key (a padding row declared by query_lengths, or blocked
 * entirely by the mask, has none) and key/value rows some allowed pair reads. */
static void fill(float *q, float *k, float *v, int left_padded)
{
    for (int b = 0; b < B; b++) {
        int first = left_padded ? N - (int)lengths[b] : 0;
        for (int p = 0; p < N; p++) {
            int t = p - first; /* token index, or out of [0, len) for padding */
            int valid = t >= 0 && t < lengths[b];
            for (int c = 0; c < E; c++) {
                q[(b * N + p) * E + c] = valid ? token(0, b, t, c) : NAN;
                k[(b * N + p) * E + c] = valid ? token(1, b, t, c) : NAN;
            }
            for (int c = 0; c < EV; c++)
                v[(b * N + p) * EV + c] = valid ? token(2, b, t, c) : NAN;
        }
    }
}

static void run(float *q, float *k, float *v, const sdpa_options *options, float *out)
{
    sdpa_tensor tq, tk, tv, tout;
    CHECK(sdpa_tensor_init_4d(&tq, q, B, H, L, E));
    CHECK(sdpa_tensor_init_4d(&tk, k, B, H, S, E));
    CHECK(sdpa_tensor_init_4d(&tv, v, B, H, S, EV));
    CHECK(sdpa_tensor_init_4d(&tout, out, B, H, L, EV));
    CHECK(sdpa_attention(&tq, &tk, &tv, options, &tout, NULL, NULL));
}

/* Print out [B, 1, L, Ev]; return the number of padded rows that are not exactly zero. */
static int print_and_check(const float *out, int left_padded)
{
    int bad = 0;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < L; i++) {
            int first = left_padded ? N - (int)lengths[b] : 0;
            int padded = i < first || i >= first + lengths[b];
            const float *row = out + (b * L + i) * EV;
            int zero = 1;
            printf("  b=%d i=%d: [", b, i);
            for (int c = 0; c < EV; c++) {
                printf("%s%8.5f", c ? ", " : " ", (double)row[c]);
                zero &= row[c] == 0.0f;
            }
            printf(" ]%s\n", padded ? (zero ? "  padding: exactly 0" : "  padding: NOT ZERO") : "");
            bad += padded && !zero;
        }
    }
    return bad;
}

int main(void)
{
    float q[B * H * N * E], k[B * H * N * E], v[B * H * N * EV];
    float out_right[B * H * L * EV], out_left[B * H * L * EV];
    int bad = 0;

    check_library_version();

    /* 1. Right padding: lengths as options. */
    fill(q, k, v, 0);
    sdpa_options options;
    sdpa_options_init(&options);
    options.causal = 1;
    options.key_lengths = lengths;   /* key j allowed only if j < key_lengths[b] */
    options.query_lengths = lengths; /* rows i >= query_lengths[b] are padding: zeros */
    memset(out_right, 0xff, sizeof out_right); /* NaN garbage: every row must be written */
    run(q, k, v, &options, out_right);
    printf("right padding, lengths {%d, %d}, key_lengths + query_lengths, causal:\n",
           (int)lengths[0], (int)lengths[1]);
    bad += print_and_check(out_right, 0);

    /* 2. Left padding: one allow-mask from the builders. */
    fill(q, k, v, 1);
    uint8_t key_pad[B * S], query_pad[B * L], pad[B * L * S], causal[L * S], allow[B * L * S];
    CHECK(sdpa_mask_padding(key_pad, B, S, lengths, SDPA_PAD_LEFT));
    CHECK(sdpa_mask_padding(query_pad, B, L, lengths, SDPA_PAD_LEFT));
    CHECK(sdpa_mask_causal(causal, L, S, SDPA_ALIGN_TOP_LEFT));

    const int64_t key_shape[4] = {B, 1, 1, S}, query_shape[4] = {B, 1, L, 1};
    const int64_t full_shape[4] = {B, 1, L, S}, causal_shape[2] = {L, S};
    sdpa_allow_mask m_key, m_query, m_pad, m_causal, m_allow;
    CHECK(sdpa_allow_mask_init(&m_key, key_pad, 4, key_shape));
    CHECK(sdpa_allow_mask_init(&m_query, query_pad, 4, query_shape));
    CHECK(sdpa_mask_and(&m_key, &m_query, pad, 4, full_shape));
    CHECK(sdpa_allow_mask_init(&m_pad, pad, 4, full_shape));
    CHECK(sdpa_allow_mask_init(&m_causal, causal, 2, causal_shape));
    CHECK(sdpa_mask_and(&m_pad, &m_causal, allow, 4, full_shape));
    CHECK(sdpa_allow_mask_init(&m_allow, allow, 4, full_shape)); /* broadcast over heads */

    sdpa_options_init(&options);
    options.allow_mask = &m_allow;
    options.empty_rows = SDPA_EMPTY_ROWS_ZERO; /* padded query rows allow no key: write zeros */
    memset(out_left, 0xff, sizeof out_left);
    run(q, k, v, &options, out_left);
    printf("left padding, lengths {%d, %d}, allow-mask = key pad & query pad & causal, "
           "SDPA_EMPTY_ROWS_ZERO:\n", (int)lengths[0], (int)lengths[1]);
    bad += print_and_check(out_left, 1);

    /* A valid token gets the same output whichever side the padding is on. */
    float max_diff = 0.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < lengths[b]; t++)
            for (int c = 0; c < EV; c++) {
                float r = out_right[(b * L + t) * EV + c];
                float l = out_left[(b * L + (N - (int)lengths[b]) + t) * EV + c];
                float d = fabsf(r - l);
                if (!(d <= max_diff)) /* also catches NaN */
                    max_diff = isnan(d) ? INFINITY : d;
            }
    printf("max |right - left| over valid tokens: %g\n", (double)max_diff);

    if (bad) {
        fprintf(stderr, "padded_batch: %d padded row(s) not exactly zero\n", bad);
        return EXIT_FAILURE;
    }
    if (!(max_diff <= 1e-6f)) {
        fprintf(stderr, "padded_batch: left and right padding disagree\n");
        return EXIT_FAILURE;
    }
    printf("padded_batch: OK\n");
    return EXIT_SUCCESS;
}
