"""sdpa.cost (libsdpa 0.6, sdpa_attention_cost) and the wrapper's validation before it allocates
(issue 29): a mismatched call raises the library's error, never numpy's MemoryError for an out
that would not have been written; pair counts against a numpy brute force of the allow rule."""
import unittest

import numpy as np

import sdpa


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def brute_pairs(L, S, B=1, H=1, causal=False, bottom_right=False, window=None, key_lengths=None,
                query_lengths=None, mask=None):
    """Allowed pairs and empty rows of DESIGN.md section 4 (numpy, independent of the library)."""
    allowed = empty = 0
    for b in range(B):
        Sb = S if key_lengths is None else key_lengths[b]
        Lb = L if query_lengths is None else query_lengths[b]
        i = np.arange(L)[:, None]
        j = np.arange(S)[None, :]
        p = i + (Sb - Lb if bottom_right else 0)
        ok = j < Sb
        if causal:
            ok = ok & (j <= p)
        if window is not None:
            left, right = window
            if left >= 0:
                ok = ok & (j >= p - left)
            if right >= 0:
                ok = ok & (j <= p + right)
        ok = np.broadcast_to(ok, (H, L, S))
        if mask is not None:
            ok = ok & np.broadcast_to(mask, (B, H, L, S))[b]
        ok = ok[:, :Lb]
        allowed += int(ok.sum())
        empty += int((~ok.any(axis=2)).sum())
    return allowed, empty


class ValidateBeforeAllocating(unittest.TestCase):
    def test_oversized_mismatched_call_raises_the_library_error(self):
        # The call: a large broadcast query (out would be 32 GiB) and a head-width
        # mismatch. Before 0.6 numpy's MemoryError came first.
        q = np.broadcast_to(np.zeros(1, np.float32), (1024, 64, 2048, 64))
        k = np.zeros((1024, 64, 8, 32), np.float32)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.scaled_dot_product_attention(q, k, k)
        self.assertEqual(cm.exception.name, "SDPA_ERR_SHAPE")
        self.assertIn("sdpa_attention: key.shape[3]=32 does not match query.shape[3]=64", cm.exception.message)
        with self.assertRaises(sdpa.SdpaShapeError):
            sdpa.scaled_dot_product_attention(q, k, k, need_weights=True, need_lse=True)

    def test_size_overflow_reaches_a_caller_without_out(self):
        # L >= 2^31: SDPA_ERR_SIZE_OVERFLOW, not an attempt to allocate 2^38 floats.
        q = np.broadcast_to(np.zeros(1, np.float32), (1, 1, 2 ** 32, 64))
        k = np.zeros((1, 1, 4, 64), np.float32)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.scaled_dot_product_attention(q, k, k)
        self.assertEqual(cm.exception.name, "SDPA_ERR_SIZE_OVERFLOW")

    def test_weights_with_out_given_are_validated_first(self):
        q = np.broadcast_to(np.zeros(1, np.float32), (64, 64, 4096, 8))
        k = np.zeros((64, 64, 4096, 4), np.float32)
        out = np.empty((64, 64, 4096, 4), np.float32)
        with self.assertRaises(sdpa.SdpaShapeError):  # weights [64, 64, 4096, 4096] never allocated
            sdpa.scaled_dot_product_attention(q, k, k, out=out, need_weights=True)

    def test_empty_rows_are_still_the_calls_error(self):
        q, k = rand(1, 1, 3, 4), rand(1, 1, 3, 4, seed=1)
        with self.assertRaises(sdpa.SdpaValueError) as cm:
            sdpa.scaled_dot_product_attention(q, k, k, key_lengths=[0])
        self.assertIn("sdpa_attention: query row (b=0,h=0,i=0) has no allowed key", cm.exception.message)


class CostQuery(unittest.TestCase):
    def test_causal_closed_form_and_kernel(self):
        q, k = rand(2, 4, 16, 8), rand(2, 2, 16, 8, seed=1)
        c = sdpa.cost(q, k, k, causal=True)
        self.assertIsInstance(c, sdpa.Cost)
        self.assertTrue(c.exact)
        self.assertEqual(c.allowed_pairs, 2 * 4 * 16 * 17 // 2)
        self.assertEqual(c.skipped_pairs, 2 * 4 * 16 * 16 - c.allowed_pairs)
        self.assertEqual(c.flops, 2 * (8 + 8) * c.allowed_pairs)
        self.assertEqual(c.bytes_written_out, q.nbytes)
        self.assertEqual(c.bytes_read_q, q.nbytes)
        self.assertEqual(c.bytes_read, c.bytes_read_q + c.bytes_read_k + c.bytes_read_v)
        sdpa.scaled_dot_product_attention(q, k, k, causal=True)
        self.assertEqual(c.kernel, sdpa.last_kernel())
        self.assertEqual(c.kernel_choice, "tiled")
        self.assertGreaterEqual(c.threads, 1)

    def test_random_masks_windows_lengths_match_brute_force(self):
        g = np.random.default_rng(7)
        for it in range(40):
            B, H, L, S = (int(x) for x in g.integers(1, 4, 1).tolist() + g.integers(1, 3, 1).tolist()
                          + g.integers(1, 10, 2).tolist())
            kw = {}
            causal = bool(g.integers(0, 2))
            bottom_right = causal and bool(g.integers(0, 2))
            if causal:
                kw["causal"] = "bottom_right" if bottom_right else True
            window = None
            if g.integers(0, 2):
                window = (int(g.integers(-1, 4)), int(g.integers(-1, 4)))
                kw["window"] = window
                if not causal and g.integers(0, 2):
                    kw["alignment"] = "bottom_right"
                    bottom_right = True
            klen = qlen = mask = None
            if g.integers(0, 2):
                klen = [int(x) for x in g.integers(0, S + 1, B)]
                kw["key_lengths"] = klen
            if g.integers(0, 2):
                qlen = [int(x) for x in g.integers(0, L + 1, B)]
                kw["query_lengths"] = qlen
            if g.integers(0, 2):
                mask = g.random((B, 1, L, S)) < 0.6
                kw["attn_mask"] = mask
            q, k = rand(B, H, L, 4, seed=it), rand(B, H, S, 4, seed=it + 100)
            want, empty = brute_pairs(L, S, B, H, causal, bottom_right, window, klen, qlen, mask)
            c = sdpa.cost(q, k, k, empty_rows="zero", exact=True, **kw)
            self.assertEqual((c.allowed_pairs, c.empty_rows), (want, empty), (it, kw))
            self.assertTrue(c.exact)
            loose = sdpa.cost(q, k, k, empty_rows="zero", **kw)
            self.assertEqual(loose.exact, mask is None)
            self.assertGreaterEqual(loose.allowed_pairs, c.allowed_pairs)
            out = np.full((B, H, L, 4), 7.0, np.float32)
            sdpa.cost(q, k, k, empty_rows="zero", out=out, need_lse=True, **kw)
            self.assertTrue((out == 7.0).all())  # nothing written
            sdpa.scaled_dot_product_attention(q, k, k, empty_rows="zero", out=out, **kw)
            self.assertEqual(c.kernel, sdpa.last_kernel())

    def test_same_keywords_and_errors(self):
        q, k = rand(1, 2, 3, 4), rand(1, 2, 5, 4)
        with self.assertRaises(TypeError):
            sdpa.cost(q, k, k, no_such_keyword=1)
        with self.assertRaises(sdpa.SdpaShapeError):
            sdpa.cost(q, rand(1, 2, 5, 3), k)
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.cost(q, k, k, need_weights=True, kernel="tiled")
        c = sdpa.cost(q, k, k, need_weights=True, need_lse=True)
        self.assertEqual(c.kernel_choice, "reference")
        self.assertEqual(c.bytes_written_weights, 1 * 2 * 3 * 5 * 4)
        self.assertEqual(c.bytes_written_lse, 1 * 2 * 3 * 4)
        with self.assertRaises(sdpa.SdpaValueError):  # known without values: no key at all
            sdpa.cost(q, k, k, key_lengths=[0])
        self.assertEqual(sdpa.cost(q, k, k, key_lengths=[0], empty_rows="zero").empty_rows, 6)
        # values are not read: NaN passes the cost query, fails the call
        q[0, 0, 0, 0] = np.nan
        sdpa.cost(q, k, k)
        with self.assertRaises(sdpa.SdpaValueError):
            sdpa.scaled_dot_product_attention(q, k, k)

    def test_paged_and_packed(self):
        # paged: 3 sequences, block_size 4, key lengths 5, 8, 1; one query each (decode)
        pool = rand(8, 1, 4, 8)
        table = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
        q = rand(3, 2, 1, 8)
        c = sdpa.cost(q, pool, pool, block_table=table, key_lengths=[5, 8, 1], causal="bottom_right")
        self.assertEqual(c.allowed_pairs, 2 * (5 + 8 + 1))
        self.assertEqual(c.skipped_pairs, 3 * 2 * 8 - c.allowed_pairs)
        sdpa.scaled_dot_product_attention(q, pool, pool, block_table=table, key_lengths=[5, 8, 1],
                                          causal="bottom_right")
        self.assertEqual(c.kernel, sdpa.last_kernel())
        # packed: sequences of (L, S) = (3, 3) and (1, 4), causal bottom-right per sequence
        q = rand(1, 2, 4, 8)
        k = rand(1, 1, 7, 8)
        c = sdpa.cost(q, k, k, cu_seqlens_q=[0, 3, 4], cu_seqlens_k=[0, 3, 7], causal=True)
        self.assertEqual(c.allowed_pairs, 2 * (6 + 4))
        sdpa.scaled_dot_product_attention(q, k, k, cu_seqlens_q=[0, 3, 4], cu_seqlens_k=[0, 3, 7], causal=True)
        self.assertEqual(c.kernel, sdpa.last_kernel())


if __name__ == "__main__":
    unittest.main()
