"""numpy float16 in and out of sdpa.scaled_dot_product_attention without copies (issue 9).

Written against the dtype-generic python/sdpa of branch eco (main after its merge); register it
in tests/python/meson.build (py_test_timeouts: 'test_f16_native': 60) once both are merged.

float16 query/key/value arrays (BSHD views included) go to the library as SDPA_DTYPE_F16 and a
float16 `out=` array is written in place; the result is checked against a float64 evaluation
of the widened inputs within the float16 rounding of out, and against the library's own float32
run on the widened copies (one rounding of out to nearest even). Golden facts: zero Q/K,
V = [2, 4, 8], 3x3 causal -> 2, 3, 14/3 in float16.
"""
import unittest

import numpy as np

import sdpa


def ref_attention(q, k, v, causal):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    g = Hq // Hkv
    out = np.zeros((B, Hq, L, v.shape[3]))
    for b in range(B):
        for h in range(Hq):
            s = q[b, h] @ k[b, h // g].T / np.sqrt(E)
            if causal:
                s = np.where(np.tril(np.ones((L, S), bool), S - L), s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[b, h] = p @ v[b, h // g]
    return out


class Float16Native(unittest.TestCase):
    def test_golden_in_float16(self):
        q = np.zeros((1, 1, 3, 1), np.float16)
        k = np.zeros((1, 1, 3, 1), np.float16)
        v = np.array([2, 4, 8], np.float16).reshape(1, 1, 3, 1)
        out = np.full((1, 1, 3, 1), np.nan, np.float16)
        got = sdpa.scaled_dot_product_attention(q, k, v, causal=True, out=out)
        self.assertIs(got, out)
        self.assertEqual(out.dtype, np.float16)
        self.assertEqual(float(out[0, 0, 0, 0]), 2.0)
        self.assertEqual(float(out[0, 0, 1, 0]), 3.0)
        self.assertEqual(out[0, 0, 2, 0], np.float16(14.0 / 3.0))  # rounded once, nearest even

    def test_bshd_views_gqa_no_copies(self):
        rng = np.random.default_rng(7)
        B, L, S, Hq, Hkv, E, Ev = 2, 65, 129, 4, 2, 24, 20
        # BSHD buffers, viewed as [B, H, S, E] (strides only, no copy)
        qb = rng.standard_normal((B, L, Hq, E)).astype(np.float16)
        kb = rng.standard_normal((B, S, Hkv, E)).astype(np.float16)
        vb = rng.standard_normal((B, S, Hkv, Ev)).astype(np.float16)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (qb, kb, vb))
        self.assertFalse(q.flags.c_contiguous)
        for kernel in ("auto", "reference", "tiled"):
            out = np.empty((B, Hq, L, Ev), np.float16)
            got = sdpa.scaled_dot_product_attention(q, k, v, causal="bottom_right", kernel=kernel, out=out)
            self.assertIs(got, out)
            ref = ref_attention(q, k, v, causal=True)
            vmax = np.abs(v.astype(np.float64)).max()
            # float32 arithmetic (tiny) plus half an f16 ulp of |out| <= max |v|
            self.assertLessEqual(np.abs(out.astype(np.float64) - ref).max(), vmax * (2.0 ** -11) + 1e-4)
            # equals the float32 run on the widened copies, rounded once to float16
            w = sdpa.scaled_dot_product_attention(q.astype(np.float32), k.astype(np.float32),
                                                  v.astype(np.float32), causal="bottom_right",
                                                  kernel=kernel)
            np.testing.assert_array_equal(out, w.astype(np.float16))
        # without out=: a float16 result for float16 inputs
        res = sdpa.scaled_dot_product_attention(q, k, v)
        self.assertEqual(res.dtype, np.float16)

    def test_float16_cache_with_float32_query(self):
        rng = np.random.default_rng(3)
        q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
        k = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
        v = rng.standard_normal((1, 2, 300, 64)).astype(np.float16)
        out = sdpa.scaled_dot_product_attention(q, k, v)
        self.assertEqual(out.dtype, np.float32)
        ref = ref_attention(q, k, v, causal=False)
        self.assertLess(np.abs(out - ref).max(), 1e-5)

    def test_nonfinite_float16_in_attended_row(self):
        q = np.zeros((1, 1, 2, 4), np.float16)
        k = np.zeros((1, 1, 3, 4), np.float16)
        v = np.ones((1, 1, 3, 4), np.float16)
        v[0, 0, 2, 1] = np.float16(np.inf)
        out = np.full((1, 1, 2, 4), 7, np.float16)
        # the Inf row is beyond the key length: never read
        sdpa.scaled_dot_product_attention(q, k, v, key_lengths=[2], out=out)
        np.testing.assert_array_equal(out, np.ones((1, 1, 2, 4), np.float16))
        out[...] = 7
        with self.assertRaises(sdpa.SdpaError):
            sdpa.scaled_dot_product_attention(q, k, v, out=out)
        np.testing.assert_array_equal(out, np.full((1, 1, 2, 4), 7, np.float16))  # nothing written


if __name__ == "__main__":
    unittest.main()
