"""The serving arguments of sdpa.scaled_dot_product_attention (libsdpa 0.5) and the serving
helpers: paged K/V (block_table), packed batches (cu_seqlens_q/k), sinks, ALiBi, precision,
ThreadPool, kv_write, alibi_slopes.

Checks, each of which fails on a wrong binding: paged vs the dense gather of the same keys
bit-equal (random block order, unused blocks and slots past the lengths full of NaN); packed vs
per-sequence calls bit-equal; sinks and ALiBi against the float64 reference (reference.py) with
the sink / bias written out; ALiBi slopes against the paper's formula; kv_write against numpy's
own round-to-nearest-even; every bad argument raises its status with `out` untouched.
"""
import math
import unittest

import numpy as np

import reference as ref
from reference import randn, ref_sdpa

import sdpa

RTOL, ATOL = 1e-5, 2e-6


def gather(pool, table, lengths, S):
    """Dense [B, Hkv, S, E] keys of a block pool [nb, Hkv, bs, E] and a block table (NaN past
    each sequence's length, which the call must never read)."""
    bs = pool.shape[2]
    out = np.full((table.shape[0], pool.shape[1], S, pool.shape[3]), np.nan, pool.dtype)
    for b, row in enumerate(table):
        for j in range(lengths[b]):
            out[b, :, j] = pool[row[j // bs], :, j % bs]
    return out


def paged_case(g, dtype=np.float32, B=3, Hq=4, Hkv=2, L=2, E=16, Ev=8, bs=4, max_blocks=5):
    """(q, k_pool, v_pool, table, lengths): shuffled blocks, one shared prefix block, the unused
    blocks and the slots past each length NaN."""
    nb = B * max_blocks + 3
    lengths = [max_blocks * bs, 9, 1][:B]
    kp = np.full((nb, Hkv, bs, E), np.nan, np.float32)
    vp = np.full((nb, Hkv, bs, Ev), np.nan, np.float32)
    order = g.permutation(nb)
    table = np.zeros((B, max_blocks), np.int32)
    used = 0
    for b in range(B):
        for blk in range(-(-lengths[b] // bs)):
            if blk == 0 and b == 1:
                table[b, 0] = table[0, 0]  # a shared prefix block
                continue
            table[b, blk] = order[used]
            used += 1
            n = min(bs, lengths[b] - blk * bs)
            kp[table[b, blk], :, :n] = randn(g, Hkv, n, E)
            vp[table[b, blk], :, :n] = randn(g, Hkv, n, Ev)
        table[b, -(-lengths[b] // bs):] = -7  # entries past the last block: never read
    q = randn(g, B, Hq, L, E)
    return q.astype(dtype), kp.astype(dtype), vp.astype(dtype), table, lengths


def expect_errors(test, q, k, v, out, cases):
    """Each (keywords, status) case raises that status, and `out` keeps its canary values."""
    canary = out.copy()
    for kw, status in cases:
        with test.assertRaises(sdpa.SdpaError, msg=str(kw)) as cm:
            sdpa.scaled_dot_product_attention(q, k, v, out=out, **kw)
        test.assertEqual(cm.exception.name, status, f"{kw}: {cm.exception}")
        test.assertTrue(np.array_equal(out, canary), kw)


class Paged(unittest.TestCase):
    def check_equal_dense(self, dtype, L):
        g = ref.rng(10 + L)
        q, kp, vp, table, lengths = paged_case(g, dtype, L=L)
        S = table.shape[1] * kp.shape[2]
        kd, vd = gather(kp, table, lengths, S), gather(vp, table, lengths, S)
        for kernel in ("auto", "reference"):
            out = sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table, key_lengths=lengths,
                                                    causal="bottom_right", kernel=kernel,
                                                    empty_rows="zero")
            dense = sdpa.scaled_dot_product_attention(q, kd, vd, key_lengths=lengths,
                                                      causal="bottom_right", kernel=kernel,
                                                      empty_rows="zero")
            self.assertTrue(np.array_equal(out, dense), f"{dtype} L={L} {kernel}")
            self.assertFalse(np.isnan(out.astype(np.float32)).any())
        # (the reference multiplies the NaN past the lengths by 0 weights: give it zeros there)
        r, _, _ = ref_sdpa(q, np.nan_to_num(kd.astype(np.float64)), np.nan_to_num(vd.astype(np.float64)),
                           key_lengths=lengths, causal=True, alignment="bottom_right", empty_rows="zero")
        tol = 1e-5 if dtype == np.float32 else 4e-3
        self.assertEqual(ref.within(out, r, tol, tol), "")

    def test_paged_equals_dense_f32_decode(self):
        self.check_equal_dense(np.float32, 1)

    def test_paged_equals_dense_f32_prefill(self):
        self.check_equal_dense(np.float32, 7)

    def test_paged_equals_dense_f16(self):
        self.check_equal_dense(np.float16, 1)
        self.check_equal_dense(np.float16, 5)

    def test_vllm_layout_and_table_views(self):
        """vLLM's [num_blocks, block_size, Hkv, E] cache through a transposed view; a block
        table that is a column slice of a wider int32 array (viewed, row stride kept) and an
        int64 one (converted) give the same bits."""
        g = ref.rng(3)
        q, kp, vp, table, lengths = paged_case(g)
        kv_llm = np.ascontiguousarray(kp.transpose(0, 2, 1, 3))
        vv_llm = np.ascontiguousarray(vp.transpose(0, 2, 1, 3))
        want = sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table, key_lengths=lengths)
        wide = np.full((table.shape[0], table.shape[1] + 3), -1, np.int32)
        wide[:, 1:1 + table.shape[1]] = table
        for t in (table, wide[:, 1:1 + table.shape[1]], table.astype(np.int64), table.tolist()):
            got = sdpa.scaled_dot_product_attention(q, kv_llm.transpose(0, 2, 1, 3),
                                                    vv_llm.transpose(0, 2, 1, 3), block_table=t,
                                                    key_lengths=lengths)
            self.assertTrue(np.array_equal(got, want))

    def test_weights_span_the_table(self):
        g = ref.rng(4)
        q, kp, vp, table, lengths = paged_case(g, L=3)
        S = table.shape[1] * kp.shape[2]
        out, w = sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table, key_lengths=lengths,
                                                   need_weights=True)
        self.assertEqual(w.shape, q.shape[:-1] + (S,))
        _, wd = sdpa.scaled_dot_product_attention(q, gather(kp, table, lengths, S),
                                                  gather(vp, table, lengths, S), key_lengths=lengths,
                                                  need_weights=True)
        np.testing.assert_allclose(w, wd, rtol=1e-6, atol=1e-7)
        for b, n in enumerate(lengths):
            self.assertTrue(np.all(w[b, :, :, n:] == 0.0))

    def test_bad_block_entry(self):
        g = ref.rng(5)
        q, kp, vp, table, lengths = paged_case(g)
        out = np.full(q.shape[:-1] + (vp.shape[-1],), 7.0, np.float32)
        for bad in (kp.shape[0], -1):
            t = table.copy()
            t[1, 1] = bad  # reached: lengths[1] = 9 > block_size
            with self.assertRaises(sdpa.SdpaShapeError) as cm:
                sdpa.scaled_dot_product_attention(q, kp, vp, block_table=t, key_lengths=lengths, out=out)
            self.assertEqual(cm.exception.name, "SDPA_ERR_INDEX")
            self.assertIn(str(bad), cm.exception.message)
            self.assertTrue(np.all(out == 7.0))

    def test_table_shape_and_dtype_errors(self):
        g = ref.rng(6)
        q, kp, vp, table, lengths = paged_case(g)
        with self.assertRaises(sdpa.SdpaShapeError):  # one row per batch
            sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table[:2], key_lengths=lengths)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table[0], key_lengths=lengths)
        self.assertEqual(cm.exception.name, "SDPA_ERR_RANK")
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table.astype(np.float32),
                                              key_lengths=lengths)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table.astype(np.int64) + 2 ** 40,
                                              key_lengths=lengths)
        self.assertEqual(cm.exception.name, "SDPA_ERR_INDEX")
        with self.assertRaises(sdpa.SdpaError) as cm:  # key_lengths are required
            sdpa.scaled_dot_product_attention(q, kp, vp, block_table=table)
        self.assertIn("key_lengths", cm.exception.message)
        # integer metadata: one rule (bools, floats, strings rejected; ragged rows named)
        cases = [
            (dict(block_table=table, key_lengths=[True] * 3), "SDPA_ERR_DTYPE"),
            (dict(block_table=table, key_lengths=np.asarray(lengths, np.float64)), "SDPA_ERR_DTYPE"),
            (dict(block_table=table.astype(bool), key_lengths=lengths), "SDPA_ERR_DTYPE"),
            (dict(block_table="abc", key_lengths=lengths), "SDPA_ERR_DTYPE"),
            (dict(block_table=[[0, 1], [2]], key_lengths=lengths), "SDPA_ERR_SHAPE"),
            # bools inside lists (numpy reads [True, 2] as [1, 2]); Python ints beyond int64 in a
            # list (numpy makes them float64) are a range error, not a dtype error
            (dict(block_table=table, key_lengths=[True, 4, 4]), "SDPA_ERR_DTYPE"),
            (dict(block_table=[[0, True, 2, 3, 4]] * 3, key_lengths=lengths), "SDPA_ERR_DTYPE"),
            (dict(block_table=[[0, 2 ** 63, 2, 3, 4]] * 3, key_lengths=lengths), "SDPA_ERR_INDEX"),
            (dict(block_table=table, key_lengths=[1, 2 ** 63, 1]), "SDPA_ERR_INVALID_ARGUMENT"),
            # zero columns: the table is still seen (it was dropped, the pool read as dense)
            (dict(block_table=np.zeros((3, 0), np.int32), key_lengths=[0, 0, 0]),
             "SDPA_ERR_INVALID_ARGUMENT"),
        ]
        out = np.full(q.shape[:-1] + (vp.shape[-1],), 7.0, np.float32)
        expect_errors(self, q, kp, vp, out, cases)

    def test_empty_batches(self):
        """B = 0 paged and num_seqs = 0 packed calls are valid and give empty outputs."""
        kp = np.full((6, 1, 4, 8), np.nan, np.float32)
        q0 = np.zeros((0, 2, 1, 8), np.float32)
        o = sdpa.scaled_dot_product_attention(q0, kp, kp, block_table=np.zeros((0, 3), np.int32),
                                              key_lengths=[])
        self.assertEqual(o.shape, (0, 2, 1, 8))
        qp = np.zeros((1, 2, 0, 8), np.float32)
        o = sdpa.scaled_dot_product_attention(qp, kp, kp, cu_seqlens_q=[0], key_lengths=[],
                                              block_table=np.zeros((0, 3), np.int32))
        self.assertEqual(o.shape, (1, 2, 0, 8))
        kd = np.zeros((1, 1, 0, 8), np.float32)
        o = sdpa.scaled_dot_product_attention(qp, kd, kd, cu_seqlens_q=[0], cu_seqlens_k=[0])
        self.assertEqual(o.shape, (1, 2, 0, 8))
        with self.assertRaises(sdpa.SdpaArgumentError):  # cu_seqlens_k alone is seen, even empty
            sdpa.scaled_dot_product_attention(qp, kd, kd, cu_seqlens_k=[])


class Packed(unittest.TestCase):
    def test_packed_equals_per_sequence(self):
        """Prefill chunks and decode rows in one call, each sequence bit-equal to a call over it
        alone (B = 1, bottom-right causal), dense packed keys and a paged cache."""
        g = ref.rng(20)
        Hq, Hkv, E, Ev = 4, 2, 16, 16
        lq, lk = [5, 1, 1, 3], [9, 4, 17, 3]
        cu_q, cu_k = np.cumsum([0] + lq), np.cumsum([0] + lk)
        q = randn(g, 1, Hq, cu_q[-1], E)
        k = randn(g, 1, Hkv, cu_k[-1], E)
        v = randn(g, 1, Hkv, cu_k[-1], Ev)
        out = sdpa.scaled_dot_product_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                                causal=True)
        # the same keys in a paged cache (block size 4): one sequence per row of the table
        bs, mb = 4, 5
        kp = np.full((len(lq) * mb, Hkv, bs, E), np.nan, np.float32)
        vp = np.full((len(lq) * mb, Hkv, bs, Ev), np.nan, np.float32)
        table = (np.arange(len(lq) * mb, dtype=np.int32).reshape(len(lq), mb))[::-1].copy()
        for r in range(len(lq)):
            for j in range(lk[r]):
                kp[table[r, j // bs], :, j % bs] = k[0, :, cu_k[r] + j]
                vp[table[r, j // bs], :, j % bs] = v[0, :, cu_k[r] + j]
        paged = sdpa.scaled_dot_product_attention(q, kp, vp, cu_seqlens_q=cu_q, block_table=table,
                                                  key_lengths=lk, causal=True)
        for r in range(len(lq)):
            qs = q[:, :, cu_q[r]:cu_q[r + 1]]
            one = sdpa.scaled_dot_product_attention(qs, k[:, :, cu_k[r]:cu_k[r + 1]],
                                                    v[:, :, cu_k[r]:cu_k[r + 1]], causal="bottom_right")
            self.assertTrue(np.array_equal(out[:, :, cu_q[r]:cu_q[r + 1]], one), r)
            self.assertTrue(np.array_equal(paged[:, :, cu_q[r]:cu_q[r + 1]], one), r)
            exp, _, _ = ref_sdpa(qs, k[:, :, cu_k[r]:cu_k[r + 1]], v[:, :, cu_k[r]:cu_k[r + 1]],
                                 causal=True, alignment="bottom_right")
            self.assertEqual(ref.within(one, exp, RTOL, ATOL), "")

    def test_flash_attention_layout(self):
        """FlashAttention's [total_q, H, E] buffers as views: x.transpose(1, 0, 2)[None]."""
        g = ref.rng(21)
        lq = [3, 2]
        cu = np.array([0, 3, 5], np.int32)
        qf, kf, vf = randn(g, 5, 2, 8), randn(g, 5, 2, 8), randn(g, 5, 2, 8)
        out = sdpa.scaled_dot_product_attention(qf.transpose(1, 0, 2)[None], kf.transpose(1, 0, 2)[None],
                                                vf.transpose(1, 0, 2)[None], cu_seqlens_q=cu,
                                                cu_seqlens_k=cu, causal=True)
        for r in range(len(lq)):
            sl = slice(cu[r], cu[r + 1])
            exp, _, _ = ref_sdpa(qf[sl].transpose(1, 0, 2)[None], kf[sl].transpose(1, 0, 2)[None],
                                 vf[sl].transpose(1, 0, 2)[None], causal=True)
            self.assertEqual(ref.within(out[:, :, sl], exp, RTOL, ATOL), "")

    def test_packed_errors(self):
        g = ref.rng(22)
        q, k, v = randn(g, 1, 2, 4, 8), randn(g, 1, 2, 6, 8), randn(g, 1, 2, 6, 8)
        out = np.full((1, 2, 4, 8), 5.0, np.float32)
        cases = [
            (dict(cu_seqlens_q=[0, 3, 2, 4], cu_seqlens_k=[0, 2, 4, 6]), "SDPA_ERR_INDEX"),
            (dict(cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 3, 6]), "SDPA_ERR_INDEX"),
            (dict(cu_seqlens_q=[0, 2, 4], cu_seqlens_k=[0, 6]), "SDPA_ERR_SHAPE"),
            (dict(cu_seqlens_q=[0, 2, 4]), "SDPA_ERR_NULL_POINTER"),
            (dict(cu_seqlens_k=[0, 6]), "SDPA_ERR_INVALID_ARGUMENT"),
            (dict(cu_seqlens_q=[[0, 4]], cu_seqlens_k=[0, 6]), "SDPA_ERR_RANK"),
            (dict(cu_seqlens_q=[0.0, 4.0], cu_seqlens_k=[0, 6]), "SDPA_ERR_DTYPE"),
            (dict(cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 6], need_weights=True), "SDPA_ERR_UNSUPPORTED"),
            (dict(cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 6], key_lengths=[6, 6]), "SDPA_ERR_SHAPE"),
        ]
        expect_errors(self, q, k, v, out, cases)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:  # named per packed sequence
            sdpa.scaled_dot_product_attention(q, k, v, cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 6],
                                              key_lengths=[6, 6])
        self.assertIn("one per packed sequence", cm.exception.message)
        # query_offsets with another alignment named: an error, not silently ignored
        for kw in (dict(causal="bottom_right"), dict(causal=True, alignment="top_left")):
            with self.assertRaises(sdpa.SdpaArgumentError, msg=str(kw)) as cm:
                sdpa.scaled_dot_product_attention(q, k, v, query_offsets=[2], out=out, **kw)
            self.assertIn("query_offsets", cm.exception.message)


class SinksAndAlibi(unittest.TestCase):
    def test_sinks_reference(self):
        """w_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)): out scales by
        sum / (sum + exp(sink)), lse = log(exp(lse_keys) + exp(sink))."""
        g = ref.rng(30)
        q, k, v = randn(g, 2, 4, 3, 8), randn(g, 2, 2, 6, 8), randn(g, 2, 2, 6, 8)
        sinks = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)
        for kernel in ("auto", "reference", "tiled", "decode"):
            out, lse = sdpa.scaled_dot_product_attention(q, k, v, causal=True, sinks=sinks,
                                                         need_lse=True, kernel=kernel)
            r, _, rl = ref_sdpa(q, k, v, causal=True)
            sink = sinks.astype(np.float64)[None, :, None]
            tot = np.logaddexp(rl, sink)
            self.assertEqual(ref.within(out, r * np.exp(rl - tot)[..., None], RTOL, ATOL), "", kernel)
            self.assertEqual(ref.within(lse, tot, RTOL, ATOL), "", kernel)

    def test_sink_of_an_empty_row(self):
        g = ref.rng(31)
        q, k, v = randn(g, 1, 2, 2, 4), randn(g, 1, 2, 3, 4), randn(g, 1, 2, 3, 4)
        out, lse = sdpa.scaled_dot_product_attention(q, k, v, key_lengths=[0], empty_rows="zero",
                                                     sinks=np.array([1.5, -2.0], np.float32),
                                                     need_lse=True)
        self.assertTrue(np.all(out == 0.0))
        np.testing.assert_array_equal(lse[0, :, 0], np.array([1.5, -2.0], np.float32))

    def test_alibi_is_the_explicit_bias(self):
        """s_ij -= slope * |p - j| with p = i + S - L (bottom-right), [Hq] and [B, Hq]."""
        g = ref.rng(32)
        B, Hq, L, S = 2, 4, 3, 7
        q, k, v = randn(g, B, Hq, L, 8), randn(g, B, 2, S, 8), randn(g, B, 2, S, 8)
        p = np.arange(L)[:, None] + S - L
        dist = np.abs(p - np.arange(S)[None, :]).astype(np.float64)
        for slopes in (sdpa.alibi_slopes(Hq), randn(g, B, Hq) ** 2):
            sl = slopes.astype(np.float64).reshape((1, Hq) if slopes.ndim == 1 else (B, Hq))
            bias = -sl[:, :, None, None] * dist[None, None]
            out = sdpa.scaled_dot_product_attention(q, k, v, causal="bottom_right", alibi_slopes=slopes)
            r, _, _ = ref_sdpa(q, k, v, bias=bias, causal=True, alignment="bottom_right")
            self.assertEqual(ref.within(out, r, RTOL, ATOL), "")

    def test_alibi_slopes_formula(self):
        """2^(-8 (i+1)/n) for i < n (n the largest power of two <= H), then the first H - n
        odd-numbered slopes of the 2n sequence: 2^(-8 (2 (i - n) + 1) / (2n))."""
        for H in (8, 12, 40, 1):
            n = 1 << (H.bit_length() - 1)
            want = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
            want += [2.0 ** (-8.0 * (2 * (i - n) + 1) / (2 * n)) for i in range(n, H)]
            np.testing.assert_array_equal(sdpa.alibi_slopes(H), np.array(want, np.float32))
        np.testing.assert_array_equal(sdpa.alibi_slopes(4, max_bias=4.0),
                                      np.array([0.5 ** (i + 1) for i in range(4)], np.float32))
        for bad in (0, -3):
            with self.assertRaises(sdpa.SdpaArgumentError):
                sdpa.alibi_slopes(bad)
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.alibi_slopes(8, max_bias=math.nan)

    def test_parameter_errors(self):
        g = ref.rng(33)
        q, k, v = randn(g, 2, 4, 3, 8), randn(g, 2, 2, 6, 8), randn(g, 2, 2, 6, 8)
        out = np.full((2, 4, 3, 8), 3.0, np.float32)
        wide = np.zeros((4, 2), np.float32)
        cases = [
            (dict(sinks=np.zeros(4)), "SDPA_ERR_DTYPE"),             # float64: never rounded
            (dict(sinks=[0.0] * 4), "SDPA_ERR_DTYPE"),
            (dict(sinks=np.zeros(3, np.float32)), "SDPA_ERR_SHAPE"),
            (dict(sinks=wide[:, 0]), "SDPA_ERR_STRIDE"),              # not contiguous
            (dict(sinks=np.array([0, np.nan, 0, 0], np.float32)), "SDPA_ERR_NON_FINITE"),
            (dict(alibi_slopes=np.zeros(3, np.float32)), "SDPA_ERR_SHAPE"),
            (dict(alibi_slopes=np.zeros((3, 4), np.float32)), "SDPA_ERR_SHAPE"),
            (dict(alibi_slopes=np.zeros((1, 2, 4), np.float32)), "SDPA_ERR_RANK"),
            (dict(alibi_slopes=np.array([1, 1, np.inf, 1], np.float32)), "SDPA_ERR_NON_FINITE"),
            (dict(precision="bf16"), "SDPA_ERR_INVALID_ARGUMENT"),
            (dict(threadpool=object()), "SDPA_ERR_INVALID_ARGUMENT"),
            (dict(sinks="0000"), "SDPA_ERR_DTYPE"),
        ]
        expect_errors(self, q, k, v, out, cases)
        for bad, shown in ((1e39, "1e+39"), (1e-300, "1e-300")):  # the value given, not inf / 0
            with self.assertRaises(sdpa.SdpaArgumentError) as cm:
                sdpa.alibi_slopes(2, bad)
            self.assertIn(shown, cm.exception.message)
        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
            sdpa.alibi_slopes(2 ** 31)
        self.assertIn("[1, 2**31)", cm.exception.message)
        with self.assertRaises(sdpa.SdpaDtypeError) as cm:
            sdpa.scaled_dot_product_attention("q", k, v)
        self.assertIn("query must be an array", cm.exception.message)


class PrecisionAndPools(unittest.TestCase):
    def test_precision(self):
        g = ref.rng(40)
        q, k, v = randn(g, 1, 2, 33, 32), randn(g, 1, 2, 40, 32), randn(g, 1, 2, 40, 32)
        base = sdpa.scaled_dot_product_attention(q, k, v)
        self.assertTrue(np.array_equal(base, sdpa.scaled_dot_product_attention(q, k, v, precision="f32")))
        qh, kh, vh = (x.astype(np.float16) for x in (q, k, v))
        red = sdpa.scaled_dot_product_attention(qh, kh, vh, precision="reduced")
        r, _, _ = ref_sdpa(qh, kh, vh)
        # REDUCED with f16 V rounds probabilities to f16 at most (relative 2^-11 each) and out
        # to f16: well inside 4e-3 of max |v| here.
        self.assertEqual(ref.within(red, r, 4e-3, 4e-3 * float(np.abs(vh).max())), "")

    def test_threadpool_same_bits(self):
        g = ref.rng(41)
        q, k, v = randn(g, 2, 8, 1, 64), randn(g, 2, 8, 300, 64), randn(g, 2, 8, 300, 64)
        want = sdpa.scaled_dot_product_attention(q, k, v, num_threads=1)
        with sdpa.ThreadPool(2) as pool:
            self.assertEqual(pool.num_threads, 2)
            for _ in range(3):
                got = sdpa.scaled_dot_product_attention(q, k, v, threadpool=pool)
                self.assertTrue(np.array_equal(got, want))
            got = sdpa.scaled_dot_product_attention(q, k, v, threadpool=pool, num_threads=1)
            self.assertTrue(np.array_equal(got, want))
        self.assertTrue(pool.closed)
        pool.close()  # idempotent
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.scaled_dot_product_attention(q, k, v, threadpool=pool)
        for bad in (0, 257, -1):
            with self.assertRaises(sdpa.SdpaArgumentError):
                sdpa.ThreadPool(bad)
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.ThreadPool(2.0)
        import copy
        import pickle
        with sdpa.ThreadPool(2) as pool:  # two owners would destroy it twice
            for dup in (copy.copy, copy.deepcopy, pickle.dumps):
                with self.assertRaises(sdpa.SdpaArgumentError, msg=dup.__name__) as cm:
                    dup(pool)
                self.assertIsInstance(cm.exception, TypeError)  # the protocols' convention
                self.assertEqual(cm.exception.name, "SDPA_ERR_UNSUPPORTED")
            self.assertIn("2 threads", repr(pool))
        self.assertIn("closed", repr(pool))
        never = sdpa.ThreadPool.__new__(sdpa.ThreadPool)  # __init__ never ran: no pool
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.scaled_dot_product_attention(q, k, v, threadpool=never)
        never.close()

    def test_threadpool_close_waits_for_calls(self):
        """close() from another thread while calls run on the pool: it waits for them (it
        deadlocked, destroying the pool under a running call); later calls raise."""
        import threading
        g = ref.rng(42)
        q, k, v = randn(g, 1, 8, 64, 64), randn(g, 1, 8, 512, 64), randn(g, 1, 8, 512, 64)
        want = sdpa.scaled_dot_product_attention(q, k, v, num_threads=1)
        for it in range(8):
            pool = sdpa.ThreadPool(2)
            started, results = threading.Event(), []

            def user():
                started.set()
                try:
                    results.append(sdpa.scaled_dot_product_attention(q, k, v, threadpool=pool))
                except sdpa.SdpaArgumentError as e:  # the pool closed first
                    results.append(e)
            t = threading.Thread(target=user)
            t.start()
            started.wait()
            pool.close()
            t.join(60)
            self.assertFalse(t.is_alive(), f"iteration {it}: the call never returned")
            self.assertEqual(len(results), 1)
            if isinstance(results[0], np.ndarray):
                self.assertTrue(np.array_equal(results[0], want))
            else:
                self.assertIn("closed", results[0].message)

    def test_amx_opt_in_answers(self):
        granted = sdpa.request_amx()
        self.assertIsInstance(granted, bool)
        self.assertEqual(sdpa.amx_available(), granted)
        if not granted:
            with self.assertRaises(sdpa.SdpaError) as cm:
                sdpa.request_amx(raise_error=True)
            self.assertEqual(cm.exception.name, "SDPA_ERR_UNSUPPORTED")


class KvWrite(unittest.TestCase):
    def test_scatter_rounds_to_nearest_even(self):
        g = ref.rng(50)
        nb, Hkv, bs, E = 6, 2, 4, 8
        kc = np.full((nb, Hkv, bs, E), 9.0, np.float16)
        vc = np.full((nb, Hkv, bs, E), 9.0, np.float16)
        key, value = randn(g, 5, Hkv, E), randn(g, 5, Hkv, E)
        key[0, 0, 0] = 1.0 + 2.0 ** -11  # a tie: rounds to even (1.0)
        slots = [13, 0, -1, 23, 13]      # -1 skipped; slot 13 written twice, the later wins
        sdpa.kv_write(kc, vc, key, value, slots)
        want_k = np.full_like(kc, 9.0)
        want_v = np.full_like(vc, 9.0)
        for t, s in enumerate(slots):
            if s >= 0:
                want_k[s // bs, :, s % bs] = key[t].astype(np.float16)
                want_v[s // bs, :, s % bs] = value[t].astype(np.float16)
        np.testing.assert_array_equal(kc, want_k)
        np.testing.assert_array_equal(vc, want_v)
        self.assertEqual(float(kc[13 // bs, 0, 13 % bs, 0]), float(np.float16(key[4, 0, 0])))
        np.testing.assert_array_equal(vc[0, :, 0], value[1].astype(np.float16))

    def test_vllm_layout_keys_only_and_errors(self):
        g = ref.rng(51)
        nb, bs, Hkv, E = 3, 4, 2, 8
        cache = np.zeros((nb, bs, Hkv, E), np.float32)  # vLLM [num_blocks, block_size, Hkv, E]
        rows = randn(g, 2, Hkv, E)
        sdpa.kv_write(cache.transpose(0, 2, 1, 3), None, rows, None, [5, 11])
        np.testing.assert_array_equal(cache[1, 1], rows[0])
        np.testing.assert_array_equal(cache[2, 3], rows[1])
        before = cache.copy()
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.kv_write(cache.transpose(0, 2, 1, 3), None, rows, None, [1, nb * bs])
        self.assertEqual(cm.exception.name, "SDPA_ERR_INDEX")
        np.testing.assert_array_equal(cache, before)  # nothing written, not even row 0
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            sdpa.kv_write(cache.transpose(0, 2, 1, 3), None, rows, None, [1])  # one per row
        self.assertIn("one per row of key", cm.exception.message)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:  # key's rank first, then the slots
            sdpa.kv_write(cache.transpose(0, 2, 1, 3), None, rows[0], None, [1])
        self.assertEqual(cm.exception.name, "SDPA_ERR_RANK")
        for bad in ([True, False], [1.0, 2.0], [True, 2]):
            with self.assertRaises(sdpa.SdpaDtypeError):
                sdpa.kv_write(cache.transpose(0, 2, 1, 3), None, rows, None, bad)
        np.testing.assert_array_equal(cache, before)
        ro = cache.transpose(0, 2, 1, 3)
        ro.flags.writeable = False
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.kv_write(ro, None, rows, None, [0, 1])


if __name__ == "__main__":
    unittest.main()
