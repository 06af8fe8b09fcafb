"""sdpa.scaled_dot_product_attention and sdpa.merge: golden values, a float64 reference on random
shapes, strided views without copies, the return convention."""
import tracemalloc
import unittest

import numpy as np

import reference as ref
from reference import randn, ref_sdpa

import sdpa
from sdpa import _views

RTOL, ATOL = 1e-5, 2e-6


class GoldenTest(unittest.TestCase):
    def test_causal_3x3(self):
        """Zero Q/K under a causal mask: query i averages v[0..i] = 2, 4, 8."""
        q = np.zeros((1, 1, 3, 4), np.float32)
        k = np.zeros((1, 1, 3, 4), np.float32)
        v = np.array([2, 4, 8], np.float32).reshape(1, 1, 3, 1)
        out, w, lse = sdpa.scaled_dot_product_attention(q, k, v, causal=True, need_weights=True,
                                                         need_lse=True)
        np.testing.assert_allclose(out[0, 0, :, 0], [2.0, 3.0, 14.0 / 3.0], rtol=0, atol=1e-6)
        # masked weights exactly 0, rows sum to 1
        self.assertTrue(np.all(w[0, 0][np.triu_indices(3, 1)] == 0.0))
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-6)
        np.testing.assert_allclose(lse[0, 0], np.log([1, 2, 3]), rtol=0, atol=1e-6)

    def test_rank3_and_is_causal_alias(self):
        q = np.zeros((1, 3, 4), np.float32)
        v = np.array([2, 4, 8], np.float32).reshape(1, 3, 1)
        out = sdpa.scaled_dot_product_attention(q, q, v, is_causal=True)
        np.testing.assert_allclose(out[0, :, 0], [2.0, 3.0, 14.0 / 3.0], rtol=0, atol=1e-6)

    def test_bottom_right(self):
        q = np.zeros((1, 1, 2, 4), np.float32)
        k = np.zeros((1, 1, 3, 4), np.float32)
        v = np.array([2, 4, 8], np.float32).reshape(1, 1, 3, 1)
        out = sdpa.scaled_dot_product_attention(q, k, v, causal="bottom_right")
        np.testing.assert_allclose(out[0, 0, :, 0], [3.0, 14.0 / 3.0], rtol=0, atol=1e-6)
        out = sdpa.scaled_dot_product_attention(q, k, v, causal="top_left")
        np.testing.assert_allclose(out[0, 0, :, 0], [2.0, 3.0], rtol=0, atol=1e-6)

    def test_return_convention(self):
        g = ref.rng(1)
        q, k, v = randn(g, 1, 2, 3, 4), randn(g, 1, 2, 5, 4), randn(g, 1, 2, 5, 6)
        r = sdpa.scaled_dot_product_attention(q, k, v)
        self.assertIsInstance(r, np.ndarray)
        self.assertEqual(r.shape, (1, 2, 3, 6))
        r = sdpa.scaled_dot_product_attention(q, k, v, need_weights=True)
        self.assertEqual([x.shape for x in r], [(1, 2, 3, 6), (1, 2, 3, 5)])
        r = sdpa.scaled_dot_product_attention(q, k, v, need_lse=True)
        self.assertEqual([x.shape for x in r], [(1, 2, 3, 6), (1, 2, 3)])
        r = sdpa.scaled_dot_product_attention(q, k, v, need_weights=True, need_lse=True)
        self.assertEqual([x.shape for x in r], [(1, 2, 3, 6), (1, 2, 3, 5), (1, 2, 3)])
        for x in r:
            self.assertEqual(x.dtype, np.float32)

    def test_out_argument(self):
        g = ref.rng(2)
        q, k, v = randn(g, 2, 3, 4, 8), randn(g, 2, 3, 6, 8), randn(g, 2, 3, 6, 5)
        buf = np.full((2, 4, 3, 5), np.nan, np.float32)    # BSHD output buffer
        out = buf.transpose(0, 2, 1, 3)
        r = sdpa.scaled_dot_product_attention(q, k, v, out=out)
        self.assertIs(r, out)
        np.testing.assert_allclose(buf.transpose(0, 2, 1, 3), ref_sdpa(q, k, v)[0], rtol=RTOL, atol=ATOL)


class ReferenceTest(unittest.TestCase):
    """Random shapes against the float64 reference of reference.py."""

    def check(self, q, k, v, tol=(RTOL, ATOL), **kw):
        ref_kw = dict(kw)
        mask = ref_kw.pop("attn_mask", None)
        if mask is not None:
            if mask.dtype.kind == "f":
                ref_kw["bias"] = mask if ref_kw.get("bias") is None else mask + ref_kw["bias"]
            else:
                ref_kw["allow"] = mask
        causal = ref_kw.pop("causal", None)
        if isinstance(causal, str):
            ref_kw["causal"], ref_kw["alignment"] = True, causal
        else:
            ref_kw["causal"] = bool(causal)
        if "alignment" in kw and kw["alignment"] is not None:
            ref_kw["alignment"] = kw["alignment"]
        if kw.get("query_offsets") is not None and not isinstance(causal, str):
            ref_kw["alignment"] = "offsets"
        for key in ("kernel", "num_threads", "check_finite"):
            ref_kw.pop(key, None)
        try:
            want_out, want_w, want_lse = ref_sdpa(q, k, v, **ref_kw)
        except ref.EmptyRow:
            with self.assertRaises(sdpa.SdpaValueError) as cm:
                sdpa.scaled_dot_product_attention(q, k, v, **kw)
            self.assertEqual(cm.exception.name, "SDPA_ERR_EMPTY_ROW")
            return None
        out, w, lse = sdpa.scaled_dot_product_attention(q, k, v, need_weights=True,
                                                         need_lse=True, **kw)
        rtol, atol = tol
        np.testing.assert_allclose(out, want_out, rtol=rtol, atol=atol)
        np.testing.assert_allclose(w, want_w, rtol=rtol, atol=atol)
        np.testing.assert_allclose(lse, want_lse, rtol=rtol, atol=atol)
        # blocked keys have weight exactly 0, rows of probabilities sum to 1 (or 0 if empty)
        sums = w.sum(-1)
        self.assertTrue(np.all((np.abs(sums - 1) < 1e-5) | (sums == 0)))
        self.assertTrue(np.all(w[want_w == 0] == 0))
        return out

    def test_random_shapes(self):
        g = ref.rng(10)
        for trial in range(40):
            B = int(g.integers(1, 4))
            Hkv = int(g.integers(1, 3))
            Hq = Hkv * int(g.integers(1, 4))   # GQA groups of 1..3
            L, S = int(g.integers(1, 9)), int(g.integers(1, 11))
            E, Ev = int(g.integers(1, 17)), int(g.integers(1, 9))
            q, k, v = randn(g, B, Hq, L, E), randn(g, B, Hkv, S, E), randn(g, B, Hkv, S, Ev)
            kw = {}
            if g.random() < 0.5:
                kw["causal"] = ["top_left", "bottom_right", True][int(g.integers(0, 3))]
            if g.random() < 0.4:
                kw["attn_mask"] = g.random((B, 1, L, S)) < 0.8
            if g.random() < 0.3:
                kw["window"] = (int(g.integers(-1, 4)), int(g.integers(-1, 4)))
            if g.random() < 0.3:
                kw["key_lengths"] = g.integers(0, S + 1, size=B)
            if g.random() < 0.3:
                kw["query_lengths"] = g.integers(0, L + 1, size=B)
            if g.random() < 0.3:
                kw["scale"] = float(g.uniform(0.1, 2.0))
            if g.random() < 0.2:
                kw["softcap"] = float(g.uniform(0.5, 5.0))
            if g.random() < 0.3:
                kw["bias"] = randn(g, Hq, L, S)
            kw["empty_rows"] = "zero" if g.random() < 0.5 else "error"
            with self.subTest(trial=trial, shapes=(B, Hq, Hkv, L, S, E, Ev), kw=sorted(kw)):
                self.check(q, k, v, **kw)

    def test_rank3(self):
        g = ref.rng(11)
        q, k, v = randn(g, 3, 4, 8), randn(g, 3, 6, 8), randn(g, 3, 6, 2)
        mask = g.random((3, 4, 6)) < 0.7   # [B, L, S], as PyTorch broadcasts it for rank 3
        mask[..., 0] = True
        self.check(q, k, v, attn_mask=mask)
        self.check(q, k, v, causal=True, bias=randn(g, 3, 4, 6))

    def test_float_mask_is_additive(self):
        g = ref.rng(12)
        q, k, v = randn(g, 2, 2, 3, 4), randn(g, 2, 2, 5, 4), randn(g, 2, 2, 5, 3)
        add = np.where(g.random((3, 5)) < 0.6, 0.0, -np.inf).astype(np.float32)
        add[:, 0] = 0.0
        out = self.check(q, k, v, attn_mask=add)
        same = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=add != -np.inf)
        np.testing.assert_allclose(out, same, rtol=1e-6, atol=1e-7)
        # a float mask and a bias are added
        self.check(q, k, v, attn_mask=add, bias=randn(g, 1, 2, 3, 5))

    def test_query_offsets(self):
        g = ref.rng(13)
        q, k, v = randn(g, 2, 1, 3, 4), randn(g, 2, 1, 6, 4), randn(g, 2, 1, 6, 2)
        self.check(q, k, v, causal=True, query_offsets=[3, 1])
        self.check(q, k, v, window=(1, 1), query_offsets=[2, 0])

    def test_window_alignment_without_causal(self):
        g = ref.rng(14)
        q, k, v = randn(g, 1, 1, 3, 4), randn(g, 1, 1, 7, 4), randn(g, 1, 1, 7, 2)
        self.check(q, k, v, window=(2, 0), alignment="bottom_right")
        self.check(q, k, v, window=(None, 1))

    def test_empty_rows(self):
        q = np.zeros((1, 1, 2, 4), np.float32)
        v = np.ones((1, 1, 3, 2), np.float32)
        mask = np.array([[True, False, True], [False, False, False]])
        with self.assertRaises(sdpa.SdpaValueError) as cm:
            sdpa.scaled_dot_product_attention(q, q[:, :, :1].repeat(3, 2), v, attn_mask=mask)
        self.assertEqual(cm.exception.status, 40)
        self.assertIn("row", cm.exception.message)
        out, w, lse = sdpa.scaled_dot_product_attention(q, q[:, :, :1].repeat(3, 2), v,
                                                         attn_mask=mask, empty_rows="zero",
                                                         need_weights=True, need_lse=True)
        self.assertTrue(np.all(out[0, 0, 1] == 0) and np.all(w[0, 0, 1] == 0))
        self.assertEqual(lse[0, 0, 1], -np.inf)
        self.assertEqual(sdpa.count_empty_rows(mask), 1)

    def test_dropout_deterministic(self):
        g = ref.rng(15)
        q, k, v = randn(g, 1, 2, 4, 4), randn(g, 1, 2, 8, 4), randn(g, 1, 2, 8, 3)
        try:
            a = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7)
        except sdpa.SdpaArgumentError as e:
            self.fail(f"dropout rejected: {e}")
        b = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7)
        c = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=7, dropout_offset=1)
        plain = sdpa.scaled_dot_product_attention(q, k, v)
        np.testing.assert_array_equal(a, b)
        self.assertFalse(np.array_equal(a, c))
        self.assertFalse(np.array_equal(a, plain))
        np.testing.assert_array_equal(sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.0, seed=7), plain)

    def test_weights_stages(self):
        g = ref.rng(16)
        q, k, v = randn(g, 1, 1, 3, 4), randn(g, 1, 1, 3, 4), randn(g, 1, 1, 3, 2)
        _, scores = sdpa.scaled_dot_product_attention(q, k, v, need_weights=True, causal=True,
                                                      weights_stage="scores")
        np.testing.assert_allclose(scores[0, 0], q[0, 0] @ k[0, 0].T / 2.0, rtol=1e-5, atol=1e-6)
        _, masked = sdpa.scaled_dot_product_attention(q, k, v, need_weights=True, causal=True,
                                                      weights_stage="masked")
        self.assertTrue(np.all(masked[0, 0][np.triu_indices(3, 1)] == -np.inf))

    def test_kernels_and_threads_agree(self):
        g = ref.rng(17)
        q, k, v = randn(g, 2, 4, 9, 16), randn(g, 2, 2, 13, 16), randn(g, 2, 2, 13, 8)
        base = sdpa.scaled_dot_product_attention(q, k, v, causal=True, num_threads=1)
        self.assertTrue(sdpa.last_kernel())
        for kernel in sdpa.KERNELS:
            for threads in (1, 3):
                with self.subTest(kernel=kernel, threads=threads):
                    try:
                        out = sdpa.scaled_dot_product_attention(q, k, v, causal=True,
                                                                kernel=kernel, num_threads=threads)
                    except sdpa.SdpaArgumentError as e:
                        # a forced kernel that cannot serve this call: SDPA_ERR_UNSUPPORTED
                        self.assertEqual(e.name, "SDPA_ERR_UNSUPPORTED", str(e))
                        continue
                    np.testing.assert_allclose(out, base, rtol=1e-5, atol=1e-6)


class StridedViewTest(unittest.TestCase):
    """Views of any strides give the contiguous result, and are passed without a copy."""

    def test_view_maps_bytes_to_elements(self):
        a = np.zeros((2, 5, 3, 8), np.float32).transpose(0, 2, 1, 3)[:, :, 1:4, ::2]
        t = _views.tensor_view(a, "a")
        self.assertEqual(t.data, _views.address(a))
        self.assertEqual(list(t.shape[:4]), list(a.shape))
        self.assertEqual(list(t.strides[:4]), [s // 4 for s in a.strides])
        self.assertEqual(list(t.shape[4:]) + list(t.strides[4:]) + list(t.reserved), [0] * 10)
        rev = np.zeros((3, 4), np.float32)[::-1, ::-1]
        t = _views.tensor_view(rev, "rev")
        self.assertEqual(t.data, _views.address(rev))  # element [0, 0] = the last of the buffer
        self.assertEqual(list(t.strides[:2]), [-4, -1])
        m = np.ones((4, 6), bool)[::2, ::3]
        mv = _views.mask_view(m, "m")
        self.assertEqual((mv.data, list(mv.strides)), (_views.address(m), [12, 3, 0, 0]))

    def test_bshd_views(self):
        g = ref.rng(20)
        B, L, S, Hq, Hkv, E = 2, 5, 7, 4, 2, 8
        qb, kb, vb = randn(g, B, L, Hq, E), randn(g, B, S, Hkv, E), randn(g, B, S, Hkv, E)
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (qb, kb, vb))
        self.assertFalse(q.flags.c_contiguous)
        got = sdpa.scaled_dot_product_attention(q, k, v, causal=True)
        want = sdpa.scaled_dot_product_attention(*(np.ascontiguousarray(x) for x in (q, k, v)),
                                                 causal=True)
        np.testing.assert_array_equal(got, want)

    def test_slices_negative_and_zero_strides(self):
        g = ref.rng(21)
        cache_k, cache_v = randn(g, 2, 3, 16, 10), randn(g, 2, 3, 16, 10)
        q = randn(g, 2, 3, 4, 12)[..., 1:9]                  # sliced last axis
        k = cache_k[:, :, :9, 1:9]                             # slice of a KV cache
        v = cache_v[:, :, 9:0:-1, ::-3]                        # negative strides
        m_row = g.random(9) < 0.8
        m_row[0] = True
        mask = np.broadcast_to(m_row, (2, 3, 4, 9))            # stride-0 broadcast mask
        bias = np.broadcast_to(randn(g, 1, 1, 1, 9), (2, 3, 4, 9))
        kb = np.broadcast_to(k[:1], k.shape)                   # stride-0 batch on an input
        for kk in (k, kb):
            contiguous = [np.ascontiguousarray(x) for x in (q, kk, v)]
            got = sdpa.scaled_dot_product_attention(q, kk, v, attn_mask=mask, bias=bias)
            want = sdpa.scaled_dot_product_attention(*contiguous, attn_mask=np.ascontiguousarray(mask),
                                                     bias=np.ascontiguousarray(bias))
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got, ref_sdpa(q, kk, v, allow=mask, bias=bias)[0],
                                       rtol=RTOL, atol=ATOL)

    def test_empty_query_axis(self):
        """L = 0: numpy gives empty arrays zero strides; the call returns empty results (a
        regression found by fuzzing: the empty output view was rejected as SDPA_ERR_STRIDE)."""
        q = np.zeros((2, 3, 0, 4), np.float32)
        g = np.random.default_rng(7)
        k = randn(g, 2, 3, 7, 4)
        v = randn(g, 2, 3, 7, 5)
        out, lse = sdpa.scaled_dot_product_attention(q, k, v, need_lse=True)
        self.assertEqual(out.shape, (2, 3, 0, 5))
        self.assertEqual(lse.shape, (2, 3, 0))

    def test_read_only_inputs(self):
        g = ref.rng(22)
        q, k, v = randn(g, 1, 1, 2, 4), randn(g, 1, 1, 3, 4), randn(g, 1, 1, 3, 4)
        for x in (q, k, v):
            x.flags.writeable = False
        sdpa.scaled_dot_product_attention(q, k, v)

    def test_no_copy_of_large_inputs(self):
        """With q, k (2 MiB each) as strided BSHD views, the Python-side memory traced during a
        call stays far below the size of one input: nothing is copied (numpy's buffers are
        traced by tracemalloc; the library's own workspace is C memory and is not)."""
        g = ref.rng(23)
        B, L, H, E = 2, 256, 4, 256
        qb, kb = randn(g, B, L, H, E), randn(g, B, L, H, E)
        q, k = qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 1, 3)
        v = randn(g, B, H, L, 1)[:, :, ::-1]
        mask = np.broadcast_to(np.tril(np.ones((L, L), bool)), (B, H, L, L))
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)   # load, warm up
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        self.assertLess(peak, q.nbytes // 8, f"peak {peak} bytes during a call on {q.nbytes}-byte inputs")
        np.testing.assert_allclose(out, ref_sdpa(q, k, v, allow=mask)[0], rtol=1e-4, atol=1e-5)


class MergeTest(unittest.TestCase):
    def test_merge_equals_full(self):
        g = ref.rng(30)
        q, k, v = randn(g, 2, 3, 4, 8), randn(g, 2, 3, 10, 8), randn(g, 2, 3, 10, 5)
        full, full_lse = sdpa.scaled_dot_product_attention(q, k, v, need_lse=True)
        a, la = sdpa.scaled_dot_product_attention(q, k[:, :, :6], v[:, :, :6], need_lse=True)
        b, lb = sdpa.scaled_dot_product_attention(q, k[:, :, 6:], v[:, :, 6:], need_lse=True)
        out, lse = sdpa.merge(a, la, b, lb)
        np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, full_lse, rtol=1e-5, atol=1e-6)

    def test_merge_empty_side_and_strides(self):
        g = ref.rng(31)
        a = randn(g, 3, 4, 2)
        la = randn(g, 3, 4)
        b = randn(g, 3, 4, 2)
        lb = np.full((3, 4), -np.inf, np.float32)
        out, lse = sdpa.merge(a[:, ::-1], la[:, ::-1], b, lb)
        np.testing.assert_array_equal(out, a[:, ::-1])
        np.testing.assert_array_equal(lse, la[:, ::-1])
        out, lse = sdpa.merge(b, lb, b, lb)
        self.assertTrue(np.all(out == 0) and np.all(lse == -np.inf))

    def test_merge_shape_error(self):
        a = np.zeros((2, 3), np.float32)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.merge(a, np.zeros(2, np.float32), np.zeros((2, 4), np.float32), np.zeros(2, np.float32))
        self.assertTrue(cm.exception.message.startswith("sdpa_merge"), cm.exception.message)


if __name__ == "__main__":
    unittest.main()
