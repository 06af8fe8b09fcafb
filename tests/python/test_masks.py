"""Mask helpers of the sdpa package against numpy definitions, and their polarity."""
import unittest

import numpy as np

import reference as ref  # noqa: F401  (puts the package on sys.path when run by hand)

import sdpa


def band(L, S, left, right, shift):
    i = np.arange(L)[:, None] + shift
    j = np.arange(S)[None, :]
    ok = np.ones((L, S), bool)
    if left is not None and left >= 0:
        ok &= j >= i - left
    if right is not None and right >= 0:
        ok &= j <= i + right
    return ok


class BuilderTest(unittest.TestCase):
    def test_causal(self):
        for L, S in [(1, 1), (3, 3), (2, 5), (5, 2), (0, 4), (4, 0)]:
            m = sdpa.causal_allow_mask(L, S)
            self.assertEqual((m.dtype, m.shape), (np.dtype(bool), (L, S)))
            np.testing.assert_array_equal(m, np.tril(np.ones((L, S), bool)))
            np.testing.assert_array_equal(sdpa.causal_allow_mask(L, S, "bottom_right"),
                                          np.tril(np.ones((L, S), bool), S - L))
        np.testing.assert_array_equal(sdpa.causal_allow_mask(4), np.tril(np.ones((4, 4), bool)))

    def test_padding(self):
        lengths = [0, 2, 4]
        right = sdpa.padding_allow_mask(lengths, 4)
        left = sdpa.padding_allow_mask(np.array(lengths, np.int32), 4, side="left")
        t = np.arange(4)
        np.testing.assert_array_equal(right, t[None, :] < np.array(lengths)[:, None])
        np.testing.assert_array_equal(left, t[None, :] >= 4 - np.array(lengths)[:, None])
        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
            sdpa.padding_allow_mask([5], 4)
        self.assertIn("sdpa_mask_padding", cm.exception.message)

    def test_sliding_window(self):
        for L, S, left, right in [(5, 5, 1, 0), (4, 7, 2, 1), (6, 3, None, 0), (3, 3, 0, None)]:
            for align, shift in (("top_left", 0), ("bottom_right", S - L)):
                np.testing.assert_array_equal(
                    sdpa.sliding_window_allow_mask(L, S, left, right, align),
                    band(L, S, left, right, shift))

    def test_block_diagonal(self):
        cu = [0, 2, 5, 6]
        m = sdpa.block_diagonal_allow_mask(cu)
        want = np.zeros((6, 6), bool)
        for a, b in zip(cu[:-1], cu[1:]):
            want[a:b, a:b] = True
        np.testing.assert_array_equal(m, want)
        mc = sdpa.block_diagonal_allow_mask(cu, causal=True)
        np.testing.assert_array_equal(mc, want & np.tril(np.ones((6, 6), bool)))
        cuk = [0, 3, 4, 8]
        mk = sdpa.block_diagonal_allow_mask(cu, cuk)
        want = np.zeros((6, 8), bool)
        for n in range(3):
            want[cu[n]:cu[n + 1], cuk[n]:cuk[n + 1]] = True
        np.testing.assert_array_equal(mk, want)
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.block_diagonal_allow_mask([0, 3, 2])

    def test_prefix_lm(self):
        m = sdpa.prefix_lm_allow_mask(5, 2)
        i, j = np.arange(5)[:, None], np.arange(5)[None, :]
        np.testing.assert_array_equal(m, (j < 2) | (j <= i))

    def test_and(self):
        a = np.array([True, False, True])
        b = np.array([[1], [0]], np.uint8)
        np.testing.assert_array_equal(sdpa.allow_and(a, b), a[None, :] & (b != 0))
        c = np.ones((2, 4), bool)[:, ::2]          # strided input
        np.testing.assert_array_equal(sdpa.allow_and(c, np.array([True, False])),
                                      np.array([[True, False], [True, False]]))
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.allow_and(np.ones(3, bool), np.ones(4, bool))
        self.assertEqual(cm.exception.name, "SDPA_ERR_BROADCAST")


class BuilderArgumentTest(unittest.TestCase):
    """Regression: causal_allow_mask(3.5, 4) was truncated to 3 rows."""

    CALLS = {
        "causal L": lambda v: sdpa.causal_allow_mask(v, 4),
        "causal S": lambda v: sdpa.causal_allow_mask(3, v),
        "padding N": lambda v: sdpa.padding_allow_mask([1, 2], v),
        "sliding L": lambda v: sdpa.sliding_window_allow_mask(v, 4, 1, 0),
        "sliding S": lambda v: sdpa.sliding_window_allow_mask(3, v, 1, 0),
        "sliding left": lambda v: sdpa.sliding_window_allow_mask(3, 4, v, 0),
        "sliding right": lambda v: sdpa.sliding_window_allow_mask(3, 4, 1, v),
        "prefix T": lambda v: sdpa.prefix_lm_allow_mask(v, 1),
        "prefix length": lambda v: sdpa.prefix_lm_allow_mask(3, v),
    }

    def test_non_integers_are_rejected(self):
        for label, f in self.CALLS.items():
            for bad in (3.5, 2.0, np.float64(2.0), np.float32(-1.0), "3", True, [3]):
                with self.subTest(label=label, bad=bad):
                    with self.assertRaises(sdpa.SdpaDtypeError) as cm:
                        f(bad)
                    self.assertIsInstance(cm.exception, TypeError)
                    self.assertIn("integer", cm.exception.message)

    def test_numpy_integers_are_accepted(self):
        for label, f in self.CALLS.items():
            for t in (np.int8, np.int32, np.int64, np.uint16, np.uint64):
                with self.subTest(label=label, type=t.__name__):
                    np.testing.assert_array_equal(f(t(2)), f(2))
            np.testing.assert_array_equal(f(np.array(2)), f(2))   # 0-d integer array
        self.assertEqual(sdpa.causal_allow_mask(np.int64(3), np.uint8(4)).shape, (3, 4))

    def test_fractional_length_arrays_are_rejected(self):
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.padding_allow_mask([1.5, 2], 4)
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.block_diagonal_allow_mask([0, 1.5, 3])
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.block_diagonal_allow_mask([0, 2, 3], [0, 2.5, 4])


class ConverterTest(unittest.TestCase):
    def test_ignore_polarity(self):
        """nn.MultiheadAttention masks: True = IGNORE. Converted, True = take part."""
        ignore = np.array([[False, True, True], [False, False, True]])
        allow = sdpa.allow_from_ignore(ignore)
        np.testing.assert_array_equal(allow, ~ignore)
        np.testing.assert_array_equal(sdpa.allow_from_ignore(ignore.astype(np.uint8)), ~ignore)
        np.testing.assert_array_equal(sdpa.allow_from_ignore(np.triu(np.ones((3, 3), bool), 1)),
                                      np.tril(np.ones((3, 3), bool)))
        # a strided ignore mask works (converted through a contiguous buffer)
        np.testing.assert_array_equal(sdpa.allow_from_ignore(ignore.T), ~ignore.T)

    def test_keep_int(self):
        keep = np.array([[1, 1, 0], [1, 0, 0]], np.int64)
        np.testing.assert_array_equal(sdpa.allow_from_keep_int(keep), keep == 1)
        for bad in ([1, 2], np.array([0, 1, 2 ** 32 + 1], np.int64), [0.5, 1.0]):
            with self.assertRaises(sdpa.SdpaArgumentError) as cm:
                sdpa.allow_from_keep_int(bad)
            self.assertIn("neither 0 nor 1", str(cm.exception))

    def test_additive(self):
        add = np.array([0.0, -np.inf, 0.0], np.float32)
        np.testing.assert_array_equal(sdpa.allow_from_additive(add), [True, False, True])
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.allow_from_additive(np.array([0.0, -1e9], np.float32))
        np.testing.assert_array_equal(sdpa.allow_from_additive(np.array([0.0, -1e9]), threshold=-1e4),
                                      [True, False])
        back = sdpa.allow_to_additive(np.array([[True, False]]))
        self.assertEqual(back.dtype, np.float32)
        np.testing.assert_array_equal(back, [[0.0, -np.inf]])

    def test_count_empty_rows(self):
        m = np.array([[[1, 0], [0, 0]], [[0, 0], [1, 1]]], np.uint8)
        self.assertEqual(sdpa.count_empty_rows(m), 2)
        self.assertEqual(sdpa.count_empty_rows(m, return_first=True), (2, (0, 1)))
        self.assertEqual(sdpa.count_empty_rows(np.ones((3, 2), bool), return_first=True), (0, None))
        self.assertEqual(sdpa.count_empty_rows(np.broadcast_to(np.array([False, False]), (4, 2))), 4)

    def test_builders_feed_attention(self):
        """A causal allow-mask and causal=True give the same attention; the mask of a
        key-padding builder equals key_lengths."""
        g = ref.rng(5)
        q, k, v = ref.randn(g, 2, 2, 4, 8), ref.randn(g, 2, 2, 4, 8), ref.randn(g, 2, 2, 4, 3)
        a = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=sdpa.causal_allow_mask(4))
        b = sdpa.scaled_dot_product_attention(q, k, v, causal=True)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        pad = sdpa.padding_allow_mask([3, 2], 4)
        a = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=pad[:, None, None, :])
        b = sdpa.scaled_dot_product_attention(q, k, v, key_lengths=[3, 2])
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
    unittest.main()
