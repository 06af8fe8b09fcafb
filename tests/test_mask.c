/*
 * Mask builders and converters: exact small matrices, polarity checked through
 * sdpa_attention, and error statuses that leave the output untouched.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "test_common.h"

/* Compare an [rows, cols] uint8 matrix with the expected 0/1 pattern, printing both. */
static void expect_matrix(const uint8_t *got, const uint8_t *want, int rows, int cols, const char *what)
{
    if (memcmp(got, want, (size_t)(rows * cols)) == 0) {
        return;
    }
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "%s: got / expected\n", what);
    for (int i = 0; i < rows && n < (int)sizeof buf - 64; ++i) {
        for (int j = 0; j < cols; ++j) n += snprintf(buf + n, sizeof buf - (size_t)n, "%d", got[i * cols + j]);
        n += snprintf(buf + n, sizeof buf - (size_t)n, "   ");
        for (int j = 0; j < cols; ++j) n += snprintf(buf + n, sizeof buf - (size_t)n, "%d", want[i * cols + j]);
        n += snprintf(buf + n, sizeof buf - (size_t)n, "\n");
    }
    fail_msg("%s", buf);
}

/* Check a failing builder call: status, canary output untouched, message present. */
static void expect_fail(sdpa_status got, sdpa_status want, const uint8_t *canary_buf, size_t bytes,
                        const char *what)
{
    if (got != want) {
        fail_msg("%s: expected %s, got %s (\"%s\")", what, sdpa_status_string(want), sdpa_status_string(got),
                 sdpa_last_error_message());
    }
    if (canary_buf && !tc_is_canary(canary_buf, bytes)) {
        fail_msg("%s: output written although the call failed", what);
    }
    if (sdpa_last_error_message()[0] == '\0') {
        fail_msg("%s: no error message", what);
    }
}

/* ------------------------------------------------------------------ causal */

static void mask_causal_top_left_is_lower_triangle(void **state)
{
    (void)state;
    uint8_t m[3 * 5];
    assert_int_equal(sdpa_mask_causal(m, 3, 5, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t want[15] = {1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 1, 1, 1, 0, 0};
    expect_matrix(m, want, 3, 5, "causal top-left L=3 S=5");

    uint8_t m2[4 * 2];
    assert_int_equal(sdpa_mask_causal(m2, 4, 2, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t want2[8] = {1, 0, 1, 1, 1, 1, 1, 1};
    expect_matrix(m2, want2, 4, 2, "causal top-left L=4 S=2");
}

static void mask_causal_bottom_right_aligns_last_query_to_last_key(void **state)
{
    (void)state;
    uint8_t m[3 * 5];
    assert_int_equal(sdpa_mask_causal(m, 3, 5, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const uint8_t want[15] = {1, 1, 1, 0, 0, /**/ 1, 1, 1, 1, 0, /**/ 1, 1, 1, 1, 1};
    expect_matrix(m, want, 3, 5, "causal bottom-right L=3 S=5");

    uint8_t m2[4 * 2];
    assert_int_equal(sdpa_mask_causal(m2, 4, 2, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const uint8_t want2[8] = {0, 0, /**/ 0, 0, /**/ 1, 0, /**/ 1, 1};
    expect_matrix(m2, want2, 4, 2, "causal bottom-right L=4 S=2");
}

static void mask_causal_bad_arguments_are_rejected(void **state)
{
    (void)state;
    uint8_t m[64];
    tc_fill_canary(m, sizeof m);
    expect_fail(sdpa_mask_causal(NULL, 3, 3, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_NULL_POINTER, NULL, 0, "causal NULL");
    expect_fail(sdpa_mask_causal(m, -1, 3, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SHAPE, m, sizeof m, "causal L=-1");
    expect_fail(sdpa_mask_causal(m, 3, -1, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SHAPE, m, sizeof m, "causal S=-1");
    expect_fail(sdpa_mask_causal(m, 3, 3, SDPA_ALIGN_OFFSETS), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m,
                "causal OFFSETS");
    expect_fail(sdpa_mask_causal(m, 3, 3, (sdpa_alignment)7), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m,
                "causal alignment 7");
    const int64_t big = (int64_t)1 << 40;
    expect_fail(sdpa_mask_causal(m, big, big, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SIZE_OVERFLOW, m, sizeof m,
                "causal 2^40 x 2^40");
    /* empty is fine and writes nothing */
    assert_int_equal(sdpa_mask_causal(m, 0, 5, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    assert_true(tc_is_canary(m, sizeof m));
}

/* ----------------------------------------------------------------- padding */

static void mask_padding_right_and_left_follow_lengths(void **state)
{
    (void)state;
    const int64_t len[3] = {4, 2, 0};
    uint8_t m[3 * 4];
    assert_int_equal(sdpa_mask_padding(m, 3, 4, len, SDPA_PAD_RIGHT), SDPA_OK);
    const uint8_t right[12] = {1, 1, 1, 1, /**/ 1, 1, 0, 0, /**/ 0, 0, 0, 0};
    expect_matrix(m, right, 3, 4, "padding right");
    assert_int_equal(sdpa_mask_padding(m, 3, 4, len, SDPA_PAD_LEFT), SDPA_OK);
    const uint8_t left[12] = {1, 1, 1, 1, /**/ 0, 0, 1, 1, /**/ 0, 0, 0, 0};
    expect_matrix(m, left, 3, 4, "padding left");
}

static void mask_padding_bad_arguments_are_rejected(void **state)
{
    (void)state;
    uint8_t m[64];
    tc_fill_canary(m, sizeof m);
    const int64_t ok[2] = {1, 2}, too_long[2] = {1, 5}, negative[2] = {-1, 2};
    expect_fail(sdpa_mask_padding(NULL, 2, 4, ok, SDPA_PAD_RIGHT), SDPA_ERR_NULL_POINTER, NULL, 0, "padding NULL out");
    expect_fail(sdpa_mask_padding(m, 2, 4, NULL, SDPA_PAD_RIGHT), SDPA_ERR_NULL_POINTER, m, sizeof m,
                "padding NULL lengths");
    expect_fail(sdpa_mask_padding(m, -1, 4, ok, SDPA_PAD_RIGHT), SDPA_ERR_SHAPE, m, sizeof m, "padding B=-1");
    expect_fail(sdpa_mask_padding(m, 2, -4, ok, SDPA_PAD_RIGHT), SDPA_ERR_SHAPE, m, sizeof m, "padding N=-4");
    expect_fail(sdpa_mask_padding(m, 2, 4, too_long, SDPA_PAD_RIGHT), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m,
                "padding length 5 > N=4");
    expect_fail(sdpa_mask_padding(m, 2, 4, negative, SDPA_PAD_LEFT), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m,
                "padding length -1");
    expect_fail(sdpa_mask_padding(m, 2, 4, ok, (sdpa_padding_side)2), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m,
                "padding side 2");
}

/* ---------------------------------------------------------- sliding window */

static void mask_sliding_window_matches_band(void **state)
{
    (void)state;
    uint8_t m[5 * 5];
    assert_int_equal(sdpa_mask_sliding_window(m, 5, 5, 1, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t w10[25] = {1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 0, 1, 1, 0, 0, /**/ 0, 0, 1, 1, 0,
                             /**/ 0, 0, 0, 1, 1};
    expect_matrix(m, w10, 5, 5, "window (1,0) L=S=5");

    assert_int_equal(sdpa_mask_sliding_window(m, 5, 5, 1, 1, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t w11[25] = {1, 1, 0, 0, 0, /**/ 1, 1, 1, 0, 0, /**/ 0, 1, 1, 1, 0, /**/ 0, 0, 1, 1, 1,
                             /**/ 0, 0, 0, 1, 1};
    expect_matrix(m, w11, 5, 5, "window (1,1) L=S=5");

    assert_int_equal(sdpa_mask_sliding_window(m, 5, 5, 2, -1, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t w2u[25] = {1, 1, 1, 1, 1, /**/ 1, 1, 1, 1, 1, /**/ 1, 1, 1, 1, 1, /**/ 0, 1, 1, 1, 1,
                             /**/ 0, 0, 1, 1, 1};
    expect_matrix(m, w2u, 5, 5, "window (2,-1) L=S=5");

    /* (-1, 0) is plain causal */
    uint8_t c[25];
    assert_int_equal(sdpa_mask_sliding_window(m, 5, 5, -1, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    assert_int_equal(sdpa_mask_causal(c, 5, 5, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    expect_matrix(m, c, 5, 5, "window (-1,0) vs causal");

    uint8_t br[2 * 5];
    assert_int_equal(sdpa_mask_sliding_window(br, 2, 5, 1, 0, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const uint8_t wbr[10] = {0, 0, 1, 1, 0, /**/ 0, 0, 0, 1, 1};
    expect_matrix(br, wbr, 2, 5, "window (1,0) bottom-right L=2 S=5");
}

static void mask_sliding_window_bad_arguments_are_rejected(void **state)
{
    (void)state;
    uint8_t m[64];
    tc_fill_canary(m, sizeof m);
    expect_fail(sdpa_mask_sliding_window(NULL, 3, 3, 1, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_NULL_POINTER, NULL, 0,
                "window NULL");
    expect_fail(sdpa_mask_sliding_window(m, 3, 3, -2, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT, m,
                sizeof m, "window left -2");
    expect_fail(sdpa_mask_sliding_window(m, 3, 3, 1, -2, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT, m,
                sizeof m, "window right -2");
    expect_fail(sdpa_mask_sliding_window(m, 3, 3, 1, 0, SDPA_ALIGN_OFFSETS), SDPA_ERR_INVALID_ARGUMENT, m,
                sizeof m, "window OFFSETS");
    expect_fail(sdpa_mask_sliding_window(m, -3, 3, 1, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SHAPE, m, sizeof m,
                "window L=-3");
    const int64_t big = (int64_t)1 << 40;
    expect_fail(sdpa_mask_sliding_window(m, big, big, 1, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SIZE_OVERFLOW, m,
                sizeof m, "window 2^40 x 2^40");
}

/* ---------------------------------------------------------- block diagonal */

static void mask_block_diagonal_isolates_sequences(void **state)
{
    (void)state;
    const int64_t cu[3] = {0, 2, 5};
    uint8_t m[5 * 5];
    assert_int_equal(sdpa_mask_block_diagonal(m, 2, cu, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t full[25] = {1, 1, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 0, 0, 1, 1, 1, /**/ 0, 0, 1, 1, 1,
                              /**/ 0, 0, 1, 1, 1};
    expect_matrix(m, full, 5, 5, "block diagonal [0,2,5]");

    assert_int_equal(sdpa_mask_block_diagonal(m, 2, cu, NULL, 1, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t causal[25] = {1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 0, 0, 1, 0, 0, /**/ 0, 0, 1, 1, 0,
                                /**/ 0, 0, 1, 1, 1};
    expect_matrix(m, causal, 5, 5, "block diagonal [0,2,5] causal");

    /* different key lengths: q [0,2,3], k [0,3,5] -> [3, 5] */
    const int64_t cq[3] = {0, 2, 3}, ck[3] = {0, 3, 5};
    uint8_t r[3 * 5];
    assert_int_equal(sdpa_mask_block_diagonal(r, 2, cq, ck, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t rf[15] = {1, 1, 1, 0, 0, /**/ 1, 1, 1, 0, 0, /**/ 0, 0, 0, 1, 1};
    expect_matrix(r, rf, 3, 5, "block diagonal q[0,2,3] k[0,3,5]");
    assert_int_equal(sdpa_mask_block_diagonal(r, 2, cq, ck, 1, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t rtl[15] = {1, 0, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 0, 0, 0, 1, 0};
    expect_matrix(r, rtl, 3, 5, "block diagonal q[0,2,3] k[0,3,5] causal top-left");
    assert_int_equal(sdpa_mask_block_diagonal(r, 2, cq, ck, 1, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const uint8_t rbr[15] = {1, 1, 0, 0, 0, /**/ 1, 1, 1, 0, 0, /**/ 0, 0, 0, 1, 1};
    expect_matrix(r, rbr, 3, 5, "block diagonal q[0,2,3] k[0,3,5] causal bottom-right");

    /* an empty sequence in the middle */
    const int64_t ce[4] = {0, 1, 1, 3};
    uint8_t e[3 * 3];
    assert_int_equal(sdpa_mask_block_diagonal(e, 3, ce, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    const uint8_t we[9] = {1, 0, 0, /**/ 0, 1, 1, /**/ 0, 1, 1};
    expect_matrix(e, we, 3, 3, "block diagonal [0,1,1,3]");
}

static void mask_block_diagonal_bad_arguments_are_rejected(void **state)
{
    (void)state;
    uint8_t m[64];
    tc_fill_canary(m, sizeof m);
    const int64_t ok[3] = {0, 2, 4}, not_zero[3] = {1, 2, 4}, decreasing[3] = {0, 3, 2};
    expect_fail(sdpa_mask_block_diagonal(NULL, 2, ok, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_NULL_POINTER, NULL,
                0, "block NULL out");
    expect_fail(sdpa_mask_block_diagonal(m, 2, NULL, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_NULL_POINTER, m,
                sizeof m, "block NULL cu_seqlens_q");
    expect_fail(sdpa_mask_block_diagonal(m, 2, not_zero, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT,
                m, sizeof m, "block cu_q not starting at 0");
    expect_fail(sdpa_mask_block_diagonal(m, 2, decreasing, NULL, 0, SDPA_ALIGN_TOP_LEFT),
                SDPA_ERR_INVALID_ARGUMENT, m, sizeof m, "block cu_q decreasing");
    expect_fail(sdpa_mask_block_diagonal(m, 2, ok, decreasing, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT,
                m, sizeof m, "block cu_k decreasing");
    expect_fail(sdpa_mask_block_diagonal(m, 2, ok, not_zero, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT,
                m, sizeof m, "block cu_k not starting at 0");
    expect_fail(sdpa_mask_block_diagonal(m, -1, ok, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_INVALID_ARGUMENT, m,
                sizeof m, "block num_seqs -1");
    expect_fail(sdpa_mask_block_diagonal(m, 2, ok, NULL, 1, SDPA_ALIGN_OFFSETS), SDPA_ERR_INVALID_ARGUMENT, m,
                sizeof m, "block causal OFFSETS");
    /* causal is a 0/1 flag: other values are rejected, not read as "on" */
    const int32_t bad_causal[4] = {2, -1, 255, INT32_MIN};
    for (int i = 0; i < 4; ++i) {
        expect_fail(sdpa_mask_block_diagonal(m, 2, ok, NULL, bad_causal[i], SDPA_ALIGN_TOP_LEFT),
                    SDPA_ERR_INVALID_ARGUMENT, m, sizeof m, "block causal not 0/1");
        if (!strstr(sdpa_last_error_message(), "causal")) {
            fail_msg("block causal=%d: message does not name causal: \"%s\"", (int)bad_causal[i],
                     sdpa_last_error_message());
        }
    }
    const int64_t huge[2] = {0, (int64_t)1 << 40};
    expect_fail(sdpa_mask_block_diagonal(m, 1, huge, NULL, 0, SDPA_ALIGN_TOP_LEFT), SDPA_ERR_SIZE_OVERFLOW, m,
                sizeof m, "block 2^40 x 2^40");
}

/* --------------------------------------------------------------- prefix LM */

static void mask_prefix_lm_is_bidirectional_prefix_then_causal(void **state)
{
    (void)state;
    uint8_t m[5 * 5];
    assert_int_equal(sdpa_mask_prefix_lm(m, 5, 2), SDPA_OK);
    const uint8_t want[25] = {1, 1, 0, 0, 0, /**/ 1, 1, 0, 0, 0, /**/ 1, 1, 1, 0, 0, /**/ 1, 1, 1, 1, 0,
                              /**/ 1, 1, 1, 1, 1};
    expect_matrix(m, want, 5, 5, "prefix-LM T=5 prefix=2");
    uint8_t c[25];
    assert_int_equal(sdpa_mask_prefix_lm(m, 5, 0), SDPA_OK);
    assert_int_equal(sdpa_mask_causal(c, 5, 5, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    expect_matrix(m, c, 5, 5, "prefix-LM prefix=0 vs causal");
    assert_int_equal(sdpa_mask_prefix_lm(m, 5, 5), SDPA_OK);
    memset(c, 1, sizeof c);
    expect_matrix(m, c, 5, 5, "prefix-LM prefix=T");

    tc_fill_canary(m, sizeof m);
    expect_fail(sdpa_mask_prefix_lm(NULL, 5, 2), SDPA_ERR_NULL_POINTER, NULL, 0, "prefix NULL");
    expect_fail(sdpa_mask_prefix_lm(m, -1, 0), SDPA_ERR_SHAPE, m, sizeof m, "prefix T=-1");
    expect_fail(sdpa_mask_prefix_lm(m, 5, -1), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m, "prefix -1");
    expect_fail(sdpa_mask_prefix_lm(m, 5, 6), SDPA_ERR_INVALID_ARGUMENT, m, sizeof m, "prefix T+1");
}

/* --------------------------------------------------------------------- and */

static void mask_and_broadcasts_to_output_shape(void **state)
{
    (void)state;
    const uint8_t a[6] = {1, 0, 7, /**/ 0, 255, 1};              /* [2, 1, 1, 3] */
    const uint8_t b[9] = {1, 1, 1, /**/ 0, 2, 1, /**/ 1, 0, 0}; /* [3, 3] */
    const int64_t as[4] = {2, 1, 1, 3}, bs[2] = {3, 3}, os[4] = {2, 1, 3, 3};
    sdpa_allow_mask ma = tc_mask_view(a, 4, as), mb = tc_mask_view(b, 2, bs);
    uint8_t out[18];
    tc_fill_canary(out, sizeof out);
    assert_int_equal(sdpa_mask_and(&ma, &mb, out, 4, os), SDPA_OK);
    uint8_t want[18];
    for (int x = 0; x < 2; ++x)
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) want[(x * 3 + i) * 3 + j] = (uint8_t)((a[x * 3 + j] != 0) && (b[i * 3 + j] != 0));
    expect_matrix(out, want, 6, 3, "and [2,1,1,3] & [3,3] -> [2,1,3,3]");
    const uint8_t literal[18] = {1, 0, 1, /**/ 0, 0, 1, /**/ 1, 0, 0, /**/ 0, 1, 1, /**/ 0, 1, 1, /**/ 0, 0, 0};
    expect_matrix(out, literal, 6, 3, "and literal");

    /* stride-0 broadcast input: a row repeated through stride 0 */
    const uint8_t row[3] = {1, 0, 1};
    sdpa_allow_mask mr = tc_mask_view(row, 2, bs); /* [3, 3] ... */
    mr.strides[0] = 0;                             /* ... all rows = row */
    uint8_t out2[9];
    assert_int_equal(sdpa_mask_and(&mr, &mb, out2, 2, bs), SDPA_OK);
    const uint8_t want2[9] = {1, 0, 1, /**/ 0, 0, 1, /**/ 1, 0, 0};
    expect_matrix(out2, want2, 3, 3, "and stride-0 & [3,3]");
}

static void mask_and_bad_arguments_are_rejected(void **state)
{
    (void)state;
    uint8_t a[8] = {1, 1, 1, 1, 1, 1, 1, 1}, b[4] = {1, 1, 1, 1}; /* a views the first 6 */
    const int64_t as[2] = {2, 3}, bs[1] = {4}, os[2] = {2, 3}, wrong_os[2] = {3, 3};
    sdpa_allow_mask ma = tc_mask_view(a, 2, as), mb = tc_mask_view(b, 1, bs);
    uint8_t out[64];
    tc_fill_canary(out, sizeof out);
    expect_fail(sdpa_mask_and(&ma, &mb, out, 2, os), SDPA_ERR_BROADCAST, out, sizeof out, "and [2,3] & [4]");
    expect_fail(sdpa_mask_and(&ma, &ma, out, 2, wrong_os), SDPA_ERR_BROADCAST, out, sizeof out,
                "and [2,3] -> [3,3]");
    expect_fail(sdpa_mask_and(NULL, &ma, out, 2, os), SDPA_ERR_NULL_POINTER, out, sizeof out, "and NULL a");
    expect_fail(sdpa_mask_and(&ma, &ma, NULL, 2, os), SDPA_ERR_NULL_POINTER, NULL, 0, "and NULL out");
    expect_fail(sdpa_mask_and(&ma, &ma, out, 2, NULL), SDPA_ERR_NULL_POINTER, out, sizeof out, "and NULL shape");
    expect_fail(sdpa_mask_and(&ma, &ma, out, 0, os), SDPA_ERR_RANK, out, sizeof out, "and out rank 0");
    const int64_t os5[5] = {1, 1, 1, 2, 3};
    expect_fail(sdpa_mask_and(&ma, &ma, out, 5, os5), SDPA_ERR_RANK, out, sizeof out, "and out rank 5");
    const int64_t neg[2] = {-2, 3};
    expect_fail(sdpa_mask_and(&ma, &ma, out, 2, neg), SDPA_ERR_SHAPE, out, sizeof out, "and negative out shape");
    /* out over a */
    uint8_t before[8];
    memcpy(before, a, sizeof a);
    expect_fail(sdpa_mask_and(&ma, &ma, a + 1, 2, os), SDPA_ERR_OVERLAP, NULL, 0, "and out overlapping a");
    assert_memory_equal(before, a, sizeof a);
    sdpa_allow_mask mbad = ma;
    mbad.rank = 5;
    expect_fail(sdpa_mask_and(&mbad, &ma, out, 2, os), SDPA_ERR_RANK, out, sizeof out, "and a rank 5");
}

/* -------------------------------------------------------------- converters */

/* Run 3x3 attention (zero q/k, v = [2, 4, 8]) with an allow-mask or causal. */
static sdpa_status attend_3x3(const uint8_t *allow, int causal, int zero_policy, float out[3])
{
    static float q[3 * 2], k[3 * 2];
    static float v[3] = {2.0f, 4.0f, 8.0f};
    sdpa_tensor tq = tc_view4(q, 1, 1, 3, 2), tk = tc_view4(k, 1, 1, 3, 2);
    sdpa_tensor tv = tc_view4(v, 1, 1, 3, 1), to = tc_view4(out, 1, 1, 3, 1);
    const int64_t ms[2] = {3, 3};
    sdpa_allow_mask m;
    sdpa_options opt;
    sdpa_options_init(&opt);
    if (allow) {
        m = tc_mask_view(allow, 2, ms);
        opt.allow_mask = &m;
    }
    opt.causal = causal;
    opt.empty_rows = zero_policy ? SDPA_EMPTY_ROWS_ZERO : SDPA_EMPTY_ROWS_ERROR;
    return sdpa_attention(&tq, &tk, &tv, &opt, &to, NULL, NULL);
}

static void mask_from_ignore_of_triu_gives_causal_attention(void **state)
{
    (void)state;
    /* torch.triu(ones(3,3), 1): True = do not attend */
    const uint8_t triu[9] = {0, 1, 1, /**/ 0, 0, 1, /**/ 0, 0, 0};
    uint8_t allow[9];
    assert_int_equal(sdpa_mask_from_ignore(triu, 9, allow), SDPA_OK);
    const uint8_t tril[9] = {1, 0, 0, /**/ 1, 1, 0, /**/ 1, 1, 1};
    expect_matrix(allow, tril, 3, 3, "from_ignore(triu)");

    float with_mask[3], with_causal[3], wrong[3];
    assert_int_equal(attend_3x3(allow, 0, 0, with_mask), SDPA_OK);
    assert_int_equal(attend_3x3(NULL, 1, 0, with_causal), SDPA_OK);
    assert_memory_equal(with_mask, with_causal, sizeof with_mask);
    assert_float_equal(with_mask[2], 14.0f / 3.0f, 1e-5);
    /* the wrong polarity (triu used as an allow-mask) is a different attention */
    assert_int_equal(attend_3x3(triu, 0, 0, wrong), SDPA_ERR_EMPTY_ROW);
    assert_int_equal(attend_3x3(triu, 0, 1, wrong), SDPA_OK);
    assert_float_equal(wrong[0], 6.0f, 1e-5); /* keys 1, 2: (4 + 8) / 2 */
    assert_true(wrong[2] == 0.0f);            /* row 2 has no key */

    /* in place, and any nonzero means ignore */
    uint8_t inplace[4] = {0, 3, 255, 0};
    assert_int_equal(sdpa_mask_from_ignore(inplace, 4, inplace), SDPA_OK);
    const uint8_t want[4] = {1, 0, 0, 1};
    expect_matrix(inplace, want, 1, 4, "from_ignore in place");

    uint8_t o[8];
    tc_fill_canary(o, sizeof o);
    expect_fail(sdpa_mask_from_ignore(triu, -1, o), SDPA_ERR_SHAPE, o, sizeof o, "from_ignore n=-1");
    expect_fail(sdpa_mask_from_ignore(NULL, 3, o), SDPA_ERR_NULL_POINTER, o, sizeof o, "from_ignore NULL in");
    expect_fail(sdpa_mask_from_ignore(triu, 3, NULL), SDPA_ERR_NULL_POINTER, NULL, 0, "from_ignore NULL out");
}

static void mask_from_keep_int_converts_and_rejects_lengths(void **state)
{
    (void)state;
    /* HF attention_mask style: 1 = keep. Keys 0, 1 kept for every row. */
    const int32_t keep[9] = {1, 1, 0, /**/ 1, 1, 0, /**/ 1, 1, 0};
    uint8_t allow[9];
    assert_int_equal(sdpa_mask_from_keep_int(keep, 9, allow), SDPA_OK);
    const uint8_t want[9] = {1, 1, 0, /**/ 1, 1, 0, /**/ 1, 1, 0};
    expect_matrix(allow, want, 3, 3, "from_keep_int");
    float out[3], ignored[3];
    assert_int_equal(attend_3x3(allow, 0, 0, out), SDPA_OK);
    for (int i = 0; i < 3; ++i) {
        assert_float_equal(out[i], 3.0f, 1e-6); /* (2 + 4) / 2 */
    }
    /* the wrong polarity (keep read as ignore) attends key 2 only */
    uint8_t wrong[9];
    assert_int_equal(sdpa_mask_from_ignore(allow, 9, wrong), SDPA_OK);
    assert_int_equal(attend_3x3(wrong, 0, 0, ignored), SDPA_OK);
    assert_float_equal(ignored[0], 8.0f, 1e-6);

    const int32_t bad[6] = {1, 1, 0, 1, 0, 2}; /* a length passed by mistake */
    uint8_t o[8];
    tc_fill_canary(o, sizeof o);
    expect_fail(sdpa_mask_from_keep_int(bad, 6, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o, "from_keep_int 2");
    if (!strchr(sdpa_last_error_message(), '5')) {
        fail_msg("from_keep_int message does not name index 5: \"%s\"", sdpa_last_error_message());
    }
    const int32_t neg[2] = {1, -1};
    expect_fail(sdpa_mask_from_keep_int(neg, 2, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o, "from_keep_int -1");
    expect_fail(sdpa_mask_from_keep_int(keep, -1, o), SDPA_ERR_SHAPE, o, sizeof o, "from_keep_int n=-1");
    expect_fail(sdpa_mask_from_keep_int(NULL, 2, o), SDPA_ERR_NULL_POINTER, o, sizeof o, "from_keep_int NULL");
}

static void mask_from_additive_accepts_zero_and_minus_inf_only(void **state)
{
    (void)state;
    /* a float causal mask: 0 / -inf (torch float attn_mask) */
    const float add[9] = {0.0f, -INFINITY, -INFINITY, /**/ -0.0f, 0.0f, -INFINITY, /**/ 0.0f, 0.0f, 0.0f};
    uint8_t allow[9];
    assert_int_equal(sdpa_mask_from_additive(add, 9, NULL, allow), SDPA_OK);
    const uint8_t tril[9] = {1, 0, 0, /**/ 1, 1, 0, /**/ 1, 1, 1};
    expect_matrix(allow, tril, 3, 3, "from_additive causal");
    float out[3], causal[3];
    assert_int_equal(attend_3x3(allow, 0, 0, out), SDPA_OK);
    assert_int_equal(attend_3x3(NULL, 1, 0, causal), SDPA_OK);
    assert_memory_equal(out, causal, sizeof out);

    uint8_t o[8];
    tc_fill_canary(o, sizeof o);
    const float finite[3] = {0.0f, -0.5f, 0.0f};
    expect_fail(sdpa_mask_from_additive(finite, 3, NULL, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o,
                "from_additive -0.5 without threshold");
    const float big_neg[2] = {0.0f, -1e9f};
    expect_fail(sdpa_mask_from_additive(big_neg, 2, NULL, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o,
                "from_additive -1e9 without threshold");
    const float pinf[2] = {0.0f, INFINITY};
    expect_fail(sdpa_mask_from_additive(pinf, 2, NULL, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o,
                "from_additive +inf");
    const float nan_[2] = {0.0f, NAN};
    expect_fail(sdpa_mask_from_additive(nan_, 2, NULL, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o,
                "from_additive NaN");

    /* with a threshold: v <= t -> blocked */
    const float t = -1e4f;
    const float soft[6] = {0.0f, -1e9f, -1e4f, -9999.0f, 3.0f, -INFINITY};
    uint8_t s[6];
    assert_int_equal(sdpa_mask_from_additive(soft, 6, &t, s), SDPA_OK);
    const uint8_t want[6] = {1, 0, 0, 1, 1, 0};
    expect_matrix(s, want, 1, 6, "from_additive threshold -1e4");
    expect_fail(sdpa_mask_from_additive(nan_, 2, &t, o), SDPA_ERR_INVALID_ARGUMENT, o, sizeof o,
                "from_additive NaN with threshold");
    expect_fail(sdpa_mask_from_additive(soft, -1, &t, o), SDPA_ERR_SHAPE, o, sizeof o, "from_additive n=-1");
    expect_fail(sdpa_mask_from_additive(NULL, 2, &t, o), SDPA_ERR_NULL_POINTER, o, sizeof o, "from_additive NULL");
}

static void mask_to_additive_gives_zero_and_minus_inf(void **state)
{
    (void)state;
    const uint8_t allow[4] = {0, 1, 255, 0};
    float add[4];
    assert_int_equal(sdpa_mask_to_additive(allow, 4, add), SDPA_OK);
    assert_true(isinf(add[0]) && add[0] < 0);
    assert_true(add[1] == 0.0f && add[2] == 0.0f);
    assert_true(isinf(add[3]) && add[3] < 0);
    /* the round trip is the identity on 0/1 masks */
    uint8_t back[4];
    assert_int_equal(sdpa_mask_from_additive(add, 4, NULL, back), SDPA_OK);
    const uint8_t want[4] = {0, 1, 1, 0};
    expect_matrix(back, want, 1, 4, "to_additive round trip");

    float o[4];
    tc_fill_canary(o, sizeof o);
    expect_fail(sdpa_mask_to_additive(allow, -1, o), SDPA_ERR_SHAPE, (const uint8_t *)o, sizeof o,
                "to_additive n=-1");
    expect_fail(sdpa_mask_to_additive(NULL, 4, o), SDPA_ERR_NULL_POINTER, (const uint8_t *)o, sizeof o,
                "to_additive NULL");
}

/* ---------------------------------------------------------- count empty rows */

static void mask_count_empty_rows_reports_count_and_first(void **state)
{
    (void)state;
    /* [2, 3, 4]: rows (0,1), (1,0), (1,2) empty -> flat 1, 3, 5 */
    const uint8_t m[24] = {1, 0, 0, 0, /**/ 0, 0, 0, 0, /**/ 0, 0, 0, 9,
                           /**/ 0, 0, 0, 0, /**/ 1, 1, 1, 1, /**/ 0, 0, 0, 0};
    const int64_t shape[3] = {2, 3, 4};
    sdpa_allow_mask mv = tc_mask_view(m, 3, shape);
    int64_t n = -7, first = -7;
    assert_int_equal(sdpa_mask_count_empty_rows(&mv, &n, &first), SDPA_OK);
    assert_int_equal(n, 3);
    assert_int_equal(first, 1);
    assert_int_equal(sdpa_mask_count_empty_rows(&mv, &n, NULL), SDPA_OK);
    assert_int_equal(n, 3);

    /* none empty */
    const uint8_t full[4] = {1, 0, 0, 1};
    const int64_t fs[2] = {2, 2};
    sdpa_allow_mask mf = tc_mask_view(full, 2, fs);
    assert_int_equal(sdpa_mask_count_empty_rows(&mf, &n, &first), SDPA_OK);
    assert_int_equal(n, 0);
    assert_int_equal(first, -1);

    /* S = 0: every row is empty */
    const int64_t zs[2] = {3, 0};
    sdpa_allow_mask mz = tc_mask_view(full, 2, zs);
    assert_int_equal(sdpa_mask_count_empty_rows(&mz, &n, &first), SDPA_OK);
    assert_int_equal(n, 3);
    assert_int_equal(first, 0);

    /* a causal bottom-right mask with L > S has L - S empty rows */
    uint8_t c[5 * 3];
    assert_int_equal(sdpa_mask_causal(c, 5, 3, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const int64_t cs[2] = {5, 3};
    sdpa_allow_mask mc = tc_mask_view(c, 2, cs);
    assert_int_equal(sdpa_mask_count_empty_rows(&mc, &n, &first), SDPA_OK);
    assert_int_equal(n, 2);
    assert_int_equal(first, 0);

    /* errors */
    n = 42;
    expect_fail(sdpa_mask_count_empty_rows(NULL, &n, &first), SDPA_ERR_NULL_POINTER, NULL, 0, "count NULL mask");
    expect_fail(sdpa_mask_count_empty_rows(&mv, NULL, &first), SDPA_ERR_NULL_POINTER, NULL, 0, "count NULL out");
    sdpa_allow_mask bad = mv;
    bad.rank = 0;
    expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_RANK, NULL, 0, "count rank 0");
    bad.rank = 5;
    expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_RANK, NULL, 0, "count rank 5");
    bad = mv;
    bad.shape[1] = -1;
    expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_SHAPE, NULL, 0, "count negative shape");
    assert_int_equal(n, 42);
}

static void mask_count_empty_rows_rejects_reserved_and_entries_beyond_rank(void **state)
{
    (void)state;
    const uint8_t m[6] = {1, 0, 0, /**/ 0, 0, 0};
    const int64_t shape[2] = {2, 3};
    const sdpa_allow_mask good = tc_mask_view(m, 2, shape);
    int64_t n = -7, first = -7;
    assert_int_equal(sdpa_mask_count_empty_rows(&good, &n, &first), SDPA_OK);
    assert_int_equal(n, 1);
    assert_int_equal(first, 1);

    n = first = 42;
    sdpa_allow_mask bad = good;
    bad.reserved0 = 1;
    expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_INVALID_ARGUMENT, NULL, 0,
                "count reserved0 = 1");
    bad.reserved0 = -1;
    expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_INVALID_ARGUMENT, NULL, 0,
                "count reserved0 = -1");
    for (int d = 2; d < SDPA_MASK_MAX_RANK; ++d) {
        bad = good;
        bad.shape[d] = 1; /* even a harmless-looking 1 beyond rank */
        expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_INVALID_ARGUMENT, NULL, 0,
                    "count shape beyond rank");
        bad = good;
        bad.strides[d] = 3;
        expect_fail(sdpa_mask_count_empty_rows(&bad, &n, &first), SDPA_ERR_INVALID_ARGUMENT, NULL, 0,
                    "count stride beyond rank");
    }
    /* the outputs are untouched on every failure */
    assert_int_equal(n, 42);
    assert_int_equal(first, 42);
}

/* ----------------------------------------------- converters and overlapping buffers */

static void mask_converters_reject_overlap_and_leave_out_untouched(void **state)
{
    (void)state;
    /* one arena per element type; the input at its start, out placed over it */
    union {
        uint8_t u8[64];
        int32_t i32[16];
        float f32[16];
    } arena, before;

    /* from_ignore: exact in place is allowed, every other overlap is not */
    for (int shift = 1; shift < 8; ++shift) {
        memset(arena.u8, 0, sizeof arena);
        for (int e = 0; e < 16; ++e) arena.u8[e] = (uint8_t)(e % 3 == 0);
        memcpy(&before, &arena, sizeof arena);
        expect_fail(sdpa_mask_from_ignore(arena.u8, 16, arena.u8 + shift), SDPA_ERR_OVERLAP, NULL, 0,
                    "from_ignore out = in + shift");
        assert_memory_equal(&before, &arena, sizeof arena);
        expect_fail(sdpa_mask_from_ignore(arena.u8 + shift, 16, arena.u8), SDPA_ERR_OVERLAP, NULL, 0,
                    "from_ignore out = in - shift");
        assert_memory_equal(&before, &arena, sizeof arena);
    }
    for (int e = 0; e < 16; ++e) arena.u8[e] = (uint8_t)(e % 3 == 0);
    assert_int_equal(sdpa_mask_from_ignore(arena.u8, 16, arena.u8), SDPA_OK);
    for (int e = 0; e < 16; ++e) assert_int_equal(arena.u8[e], e % 3 != 0);
    /* adjacent is not overlap */
    assert_int_equal(sdpa_mask_from_ignore(arena.u8, 16, arena.u8 + 16), SDPA_OK);
    for (int e = 0; e < 16; ++e) assert_int_equal(arena.u8[16 + e], e % 3 == 0);

    /* from_keep_int: no overlap at all, exact start included */
    const int shifts_keep[4] = {0, 1, 4, 48}; /* out [shift, shift + 16) within the arena */
    for (int t = 0; t < 4; ++t) {
        for (int e = 0; e < 16; ++e) arena.i32[e] = e % 2;
        memcpy(&before, &arena, sizeof arena);
        expect_fail(sdpa_mask_from_keep_int(arena.i32, 16, arena.u8 + shifts_keep[t]), SDPA_ERR_OVERLAP, NULL, 0,
                    "from_keep_int out over keep");
        assert_memory_equal(&before, &arena, sizeof arena);
    }
    {
        /* keep = int32 [1, 5) of the arena = bytes [4, 20) */
        memset(arena.u8, 0, sizeof arena);
        const int32_t keep[4] = {1, 0, 1, 1};
        memcpy(&arena.i32[1], keep, sizeof keep);
        memcpy(&before, &arena, sizeof arena);
        /* out = bytes [1, 5): only its last byte lies in keep */
        expect_fail(sdpa_mask_from_keep_int(&arena.i32[1], 4, arena.u8 + 1), SDPA_ERR_OVERLAP, NULL, 0,
                    "from_keep_int out tail over keep head");
        assert_memory_equal(&before, &arena, sizeof arena);
        /* out = bytes [0, 4) ends where keep starts: fine */
        assert_int_equal(sdpa_mask_from_keep_int(&arena.i32[1], 4, arena.u8), SDPA_OK);
        const uint8_t want[4] = {1, 0, 1, 1};
        expect_matrix(arena.u8, want, 1, 4, "from_keep_int adjacent");
    }

    /* from_additive: no overlap, exact start included */
    const int shifts_add[3] = {0, 2, 48};
    for (int t = 0; t < 3; ++t) {
        for (int e = 0; e < 16; ++e) arena.f32[e] = e % 2 ? -INFINITY : 0.0f;
        memcpy(&before, &arena, sizeof arena);
        expect_fail(sdpa_mask_from_additive(arena.f32, 16, NULL, arena.u8 + shifts_add[t]), SDPA_ERR_OVERLAP, NULL,
                    0, "from_additive out over additive");
        assert_memory_equal(&before, &arena, sizeof arena);
        const float th = -1.0f;
        expect_fail(sdpa_mask_from_additive(arena.f32, 16, &th, arena.u8 + shifts_add[t]), SDPA_ERR_OVERLAP, NULL,
                    0, "from_additive with threshold, out over additive");
        assert_memory_equal(&before, &arena, sizeof arena);
    }

    /* to_additive: no overlap, in either direction */
    for (int t = 0; t < 3; ++t) {
        memset(arena.u8, 1, sizeof arena);
        memcpy(&before, &arena, sizeof arena);
        const int at = t == 0 ? 0 : t == 1 ? 3 : 20;
        /* allow = bytes [at, at + 8), out = floats [0, 8) = bytes [0, 32) */
        expect_fail(sdpa_mask_to_additive(arena.u8 + at, 8, arena.f32), SDPA_ERR_OVERLAP, NULL, 0,
                    "to_additive out over allow");
        assert_memory_equal(&before, &arena, sizeof arena);
    }
    /* allow right after out: fine */
    memset(arena.u8, 0, sizeof arena);
    arena.u8[32] = 1;
    assert_int_equal(sdpa_mask_to_additive(arena.u8 + 32, 8, arena.f32), SDPA_OK);
    assert_true(arena.f32[0] == 0.0f && isinf(arena.f32[1]) && arena.f32[1] < 0);
}

/* ------------------------------------------------- builders feed attention */

static void mask_padding_builder_matches_key_lengths_option(void **state)
{
    (void)state;
    /* a [B, S] key padding mask viewed as [B, 1, 1, S] equals options.key_lengths */
    enum { B = 2, H = 2, L = 3, S = 5, E = 4 };
    float q[B * H * L * E], k[B * H * S * E], v[B * H * S * E], o1[B * H * L * E], o2[B * H * L * E];
    tc_rng r;
    tc_rng_seed(&r, 99);
    tc_fill_uniform(q, B * H * L * E, &r, -1, 1);
    for (int e = 0; e < B * H * S * E; ++e) {
        k[e] = (float)tc_rng_uniform(&r, -1, 1);
        v[e] = (float)tc_rng_uniform(&r, -1, 1);
    }
    const int64_t len[B] = {3, 5};
    uint8_t pad[B * S];
    assert_int_equal(sdpa_mask_padding(pad, B, S, len, SDPA_PAD_RIGHT), SDPA_OK);
    const int64_t ms[4] = {B, 1, 1, S};
    sdpa_allow_mask m = tc_mask_view(pad, 4, ms);
    sdpa_tensor tq = tc_view4(q, B, H, L, E), tk = tc_view4(k, B, H, S, E), tv = tc_view4(v, B, H, S, E);
    sdpa_tensor t1 = tc_view4(o1, B, H, L, E), t2 = tc_view4(o2, B, H, L, E);
    sdpa_options a, b;
    sdpa_options_init(&a);
    sdpa_options_init(&b);
    a.allow_mask = &m;
    b.key_lengths = len;
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &a, &t1, NULL, NULL), SDPA_OK);
    assert_int_equal(sdpa_attention(&tq, &tk, &tv, &b, &t2, NULL, NULL), SDPA_OK);
    for (int e = 0; e < B * H * L * E; ++e) {
        assert_float_equal(o1[e], o2[e], 1e-6);
    }
}

/* A builder with no key column returns at once however many rows it is given (found by the
 * fuzzer: L = INT64_MAX with S = 0 looped over every row). A hang here is a test timeout. */
static void mask_builders_with_no_columns_return_at_once(void **state)
{
    (void)state;
    uint8_t out[4] = {7, 7, 7, 7};
    assert_int_equal(sdpa_mask_causal(out, INT64_MAX, 0, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    assert_int_equal(sdpa_mask_causal(out, INT64_MAX, 0, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    assert_int_equal(sdpa_mask_sliding_window(out, INT64_MAX, 0, 1, 5, SDPA_ALIGN_BOTTOM_RIGHT), SDPA_OK);
    const int64_t cq[2] = {0, INT64_MAX}, ck[2] = {0, 0};
    assert_int_equal(sdpa_mask_block_diagonal(out, 1, cq, ck, 1, SDPA_ALIGN_TOP_LEFT), SDPA_OK);
    for (int t = 0; t < 4; ++t)
        assert_int_equal(out[t], 7);
    /* counting the empty rows of a mask with no key column: every row, without visiting them */
    sdpa_allow_mask m;
    const int64_t shape[2] = {(int64_t)1 << 40, 0};
    assert_int_equal(sdpa_allow_mask_init(&m, out, 2, shape), SDPA_OK);
    int64_t empty = -5, first = -5;
    assert_int_equal(sdpa_mask_count_empty_rows(&m, &empty, &first), SDPA_OK);
    assert_true(empty == ((int64_t)1 << 40) && first == 0);
    memset(&m, 0, sizeof m); /* [2^40, 2^40, 0]: its rows overflow int64 */
    m.data = out;
    m.rank = 3;
    m.shape[0] = m.shape[1] = (int64_t)1 << 40;
    m.strides[2] = 1;
    assert_int_equal(sdpa_mask_count_empty_rows(&m, &empty, &first), SDPA_ERR_SIZE_OVERFLOW);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mask_causal_top_left_is_lower_triangle),
        cmocka_unit_test(mask_causal_bottom_right_aligns_last_query_to_last_key),
        cmocka_unit_test(mask_causal_bad_arguments_are_rejected),
        cmocka_unit_test(mask_padding_right_and_left_follow_lengths),
        cmocka_unit_test(mask_padding_bad_arguments_are_rejected),
        cmocka_unit_test(mask_sliding_window_matches_band),
        cmocka_unit_test(mask_sliding_window_bad_arguments_are_rejected),
        cmocka_unit_test(mask_block_diagonal_isolates_sequences),
        cmocka_unit_test(mask_block_diagonal_bad_arguments_are_rejected),
        cmocka_unit_test(mask_prefix_lm_is_bidirectional_prefix_then_causal),
        cmocka_unit_test(mask_and_broadcasts_to_output_shape),
        cmocka_unit_test(mask_and_bad_arguments_are_rejected),
        cmocka_unit_test(mask_from_ignore_of_triu_gives_causal_attention),
        cmocka_unit_test(mask_from_keep_int_converts_and_rejects_lengths),
        cmocka_unit_test(mask_from_additive_accepts_zero_and_minus_inf_only),
        cmocka_unit_test(mask_to_additive_gives_zero_and_minus_inf),
        cmocka_unit_test(mask_count_empty_rows_reports_count_and_first),
        cmocka_unit_test(mask_count_empty_rows_rejects_reserved_and_entries_beyond_rank),
        cmocka_unit_test(mask_converters_reject_overlap_and_leave_out_untouched),
        cmocka_unit_test(mask_padding_builder_matches_key_lengths_option),
        cmocka_unit_test(mask_builders_with_no_columns_return_at_once),
    };
    return cmocka_run_group_tests_name("mask", tests, NULL, NULL);
}
