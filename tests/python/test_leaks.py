"""No reference cycles, no leaks, no lost references over 10,000 calls (successful and failing)."""
import gc
import sys
import tracemalloc
import unittest

import numpy as np

import reference as ref

import sdpa

N = 10_000


class LeakTest(unittest.TestCase):
    def run_many(self, fn, inputs, n=N):
        """Run fn() n times with the collector off: no object may end up in a cycle (gc.collect
        finds nothing unreachable), gc.garbage stays empty, traced memory does not grow, and
        the reference counts of the inputs are unchanged. Traced memory may rise once while
        the interpreter's free lists fill (about 100 KiB of tuples), then must stay flat: the
        second half of the calls may not add more than 8 KiB."""
        for _ in range(50):          # warm-up: library loaded, caches filled
            fn()
        gc.collect()
        refs = [sys.getrefcount(x) for x in inputs]
        was_enabled = gc.isenabled()
        gc.disable()
        tracemalloc.start()
        try:
            fn()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(n // 2):
                fn()
            middle = tracemalloc.get_traced_memory()[0]
            for _ in range(n - n // 2):
                fn()
            after = tracemalloc.get_traced_memory()[0]
            unreachable = gc.collect()
        finally:
            tracemalloc.stop()
            if was_enabled:
                gc.enable()
        self.assertEqual(unreachable, 0, "calls left reference cycles behind")
        self.assertEqual(gc.garbage, [])
        self.assertLess(after - middle, 8 * 1024,
                        f"traced memory grew by {after - middle} bytes over the last {n - n // 2} calls")
        self.assertLess(after - before, 256 * 1024, f"traced memory grew by {after - before} bytes")
        self.assertEqual([sys.getrefcount(x) for x in inputs], refs, "input reference counts changed")

    def test_attention_success(self):
        g = ref.rng(1)
        q, k, v = ref.randn(g, 2, 4, 3, 8), ref.randn(g, 2, 2, 5, 8), ref.randn(g, 2, 2, 5, 4)
        qv = q.transpose(0, 2, 1, 3)[:, :, :, ::2]     # strided view input as well
        kv = ref.randn(g, 2, 5, 2, 4).transpose(0, 2, 1, 3)
        mask = np.broadcast_to(g.random(5) < 0.9, (2, 1, 3, 5)).copy()
        mask[..., 0] = True
        bias = ref.randn(g, 1, 3, 5)
        lengths = np.array([5, 4])

        def fn():
            sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, bias=bias, causal=True,
                                              key_lengths=lengths, need_weights=True,
                                              need_lse=True, window=(2, None))
            sdpa.scaled_dot_product_attention(qv.transpose(0, 2, 1, 3), kv, v)

        self.run_many(fn, [q, k, v, mask, bias, lengths, qv, kv])

    def test_attention_errors(self):
        g = ref.rng(2)
        q, k, v = ref.randn(g, 1, 1, 3, 4), ref.randn(g, 1, 1, 5, 4), ref.randn(g, 1, 1, 5, 2)
        empty = np.zeros((3, 5), bool)
        bad64 = np.zeros((1, 1, 3, 4))

        def fn():
            try:
                sdpa.scaled_dot_product_attention(q, k, v, attn_mask=empty)
            except sdpa.SdpaValueError:
                pass
            try:
                sdpa.scaled_dot_product_attention(bad64, k, v)
            except sdpa.SdpaDtypeError:
                pass
            try:
                sdpa.scaled_dot_product_attention(q, k[..., :3], v)
            except sdpa.SdpaShapeError:
                pass

        self.run_many(fn, [q, k, v, empty, bad64])

    def test_masks_and_merge(self):
        g = ref.rng(3)
        a, la = ref.randn(g, 2, 3, 4), ref.randn(g, 2, 3)
        b, lb = ref.randn(g, 2, 3, 4), ref.randn(g, 2, 3)
        ignore = np.array([[False, True, False]])
        keep = np.array([[1, 0, 1]], np.int32)

        def fn():
            sdpa.causal_allow_mask(4, 5, "bottom_right")
            sdpa.allow_and(sdpa.allow_from_ignore(ignore), sdpa.allow_from_keep_int(keep))
            sdpa.count_empty_rows(ignore, return_first=True)
            sdpa.merge(a, la, b, lb)

        self.run_many(fn, [a, la, b, lb, ignore, keep], n=N // 2)


if __name__ == "__main__":
    unittest.main()
