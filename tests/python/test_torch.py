"""torch CPU tensors wherever numpy arrays go: no copy (data pointers and strides of the views
are the tensors' own), non-contiguous views, out= a tensor (returned as given, written in
place), results as tensors for tensor inputs, float16 / bfloat16 passed through as
SDPA_DTYPE_F16 / SDPA_DTYPE_BF16 (the library's status decides), and
MultiheadAttention.from_torch(module) against the module itself.

Registered only when Debian's python3-torch imports (tests/python/meson.build); it fails, not
skips, without torch."""
import unittest

import numpy as np
import torch

import reference as ref

import sdpa
from sdpa import _lib
from sdpa._views import tensor_view

# Bounds against the float64 reference for reduced-precision storage: inputs exactly
# representable, f32 arithmetic, out rounded once (f16: 2^-11, bf16: 2^-8 relative, plus
# accumulation on values of magnitude <= ~2).
ATOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}


def t(g, *shape):
    return torch.from_numpy(ref.randn(g, *shape))


class TensorViewTest(unittest.TestCase):
    def check(self, x, code):
        v = tensor_view(x, "x")
        self.assertEqual(v.data, x.data_ptr())            # the tensor's memory: no copy
        self.assertEqual(tuple(v.shape[:x.dim()]), tuple(x.shape))
        self.assertEqual(tuple(v.strides[:x.dim()]), tuple(x.stride()))
        self.assertEqual(v.dtype, code)

    def test_views_of_every_dtype(self):
        base = torch.arange(2 * 5 * 3 * 4, dtype=torch.float32).reshape(2, 5, 3, 4)
        for dtype, code in ((torch.float32, _lib.SDPA_DTYPE_F32),
                            (torch.float16, _lib.SDPA_DTYPE_F16),
                            (torch.bfloat16, _lib.SDPA_DTYPE_BF16)):
            x = base.to(dtype)
            for view in (x, x.transpose(1, 2), x[:, 1:, :, ::2], x[:, :, :1].expand(2, 5, 3, 4)):
                self.check(view, code)
            self.check(x.requires_grad_(True), code)  # inputs may require grad

    def test_dlpack_capsule_bf16(self):
        """The generic DLPack path (capsule read with ctypes) on torch's own __dlpack__, for
        the dtype numpy has no type for."""
        class DLPackOnly:
            def __init__(self, t):
                self.t = t

            def __dlpack__(self, stream=None):
                return self.t.__dlpack__()

            def __dlpack_device__(self):
                return self.t.__dlpack_device__()

        x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).to(torch.bfloat16)
        for view in (x, x.transpose(0, 2), x[:, 1:, ::2]):
            v = tensor_view(DLPackOnly(view), "x")
            self.assertEqual(v.dtype, _lib.SDPA_DTYPE_BF16)
            self.assertEqual(v.data, view.data_ptr())
            self.assertEqual(tuple(v.strides[:3]), tuple(view.stride()))

    def test_masks_helpers_take_tensors(self):
        keep = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.int32)
        allow = sdpa.allow_from_keep_int(keep)
        self.assertEqual(allow.tolist(), [[True, True, False], [True, False, False]])
        both = sdpa.allow_and(torch.from_numpy(allow), torch.ones(3, dtype=torch.bool))
        self.assertEqual(both.tolist(), allow.tolist())

    def test_rejections(self):
        with self.assertRaises(sdpa.SdpaDtypeError):
            tensor_view(torch.zeros(3, dtype=torch.float64), "x")
        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
            tensor_view(torch.zeros(3, requires_grad=True), "out", writable=True)
        self.assertIn("requires grad", str(cm.exception))


class TorchAttentionTest(unittest.TestCase):
    def setUp(self):
        g = ref.rng(21)
        # [B, L, H, E] buffers passed as [B, H, L, E] views (transpose(1, 2): non-contiguous)
        self.qb, self.kb, self.vb = t(g, 2, 5, 4, 8), t(g, 2, 7, 2, 8), t(g, 2, 7, 2, 3)
        self.q, self.k, self.v = (x.transpose(1, 2) for x in (self.qb, self.kb, self.vb))
        self.expected = ref.ref_sdpa(self.q.numpy(), self.k.numpy(), self.v.numpy(),
                                     causal=True)[0]

    def test_dtype_hint_keeps_a_tensor(self):
        """A float64 tensor is told to pass x.float() (a tensor), not np.asarray (a numpy array
        whose result would come back as numpy)."""
        x = torch.zeros(1, 1, 3, 4, dtype=torch.float64)
        with self.assertRaises(sdpa.SdpaDtypeError) as cm:
            sdpa.scaled_dot_product_attention(x, x.float(), x.float())
        self.assertIn("torch.float64", cm.exception.message)
        self.assertIn("query.float()", cm.exception.message)
        self.assertNotIn("np.asarray", cm.exception.message)

    def test_tensor_in_tensor_out(self):
        out, lse = sdpa.scaled_dot_product_attention(self.q, self.k, self.v, causal=True,
                                                     need_lse=True)
        self.assertIsInstance(out, torch.Tensor)
        self.assertIsInstance(lse, torch.Tensor)
        self.assertEqual(out.dtype, torch.float32)
        self.assertEqual(ref.within(out.numpy(), self.expected, 1e-5, 1e-6), "")
        # agrees with torch's own SDPA math (explicit GQA repeat)
        kr, vr = (x.repeat_interleave(2, dim=1) for x in (self.k, self.v))
        s = self.q @ kr.transpose(-1, -2) / 8 ** 0.5
        s = s.masked_fill(~torch.ones(5, 7, dtype=torch.bool).tril(), float("-inf"))
        self.assertLess(float((torch.softmax(s, -1) @ vr - out).abs().max()), 1e-5)

    def test_out_tensor_written_in_place(self):
        buf = torch.full((2, 5, 4, 3), float("nan"))   # BSHD output buffer
        out = buf.transpose(1, 2)                        # seen as [B, H, L, Ev]
        ptr = out.data_ptr()
        got = sdpa.scaled_dot_product_attention(self.q, self.k, self.v, causal=True, out=out)
        self.assertIs(got, out)
        self.assertEqual(out.data_ptr(), ptr)
        self.assertEqual(ref.within(out.numpy(), self.expected, 1e-5, 1e-6), "")
        # numpy inputs with a tensor out: the result is the tensor
        got = sdpa.scaled_dot_product_attention(self.q.numpy(), self.k.numpy(), self.v.numpy(),
                                                causal=True, out=out)
        self.assertIs(got, out)

    def test_masks_and_merge(self):
        allow = torch.ones(5, 7, dtype=torch.bool).tril()
        out = sdpa.scaled_dot_product_attention(self.q, self.k, self.v, attn_mask=allow)
        self.assertEqual(ref.within(out.numpy(), self.expected, 1e-5, 1e-6), "")
        bias = torch.zeros(5, 7).masked_fill(~allow, float("-inf"))
        out = sdpa.scaled_dot_product_attention(self.q, self.k, self.v, attn_mask=bias)
        self.assertEqual(ref.within(out.numpy(), self.expected, 1e-5, 1e-6), "")
        a = sdpa.scaled_dot_product_attention(self.q, self.k[:, :, :3], self.v[:, :, :3],
                                              need_lse=True)
        b = sdpa.scaled_dot_product_attention(self.q, self.k[:, :, 3:], self.v[:, :, 3:],
                                              need_lse=True)
        out, lse = sdpa.merge(a[0], a[1], b[0], b[1])
        self.assertIsInstance(out, torch.Tensor)
        full = ref.ref_sdpa(self.q.numpy(), self.k.numpy(), self.v.numpy())[0]
        self.assertEqual(ref.within(out.numpy(), full, 1e-5, 1e-6), "")

    def test_reduced_precision_passed_through(self):
        """float16 / bfloat16 tensors reach the library unconverted: it answers SdpaDtypeError
        (0.3) or a result within the dtype's bound of the float64 reference (0.4+)."""
        for dtype in (torch.float16, torch.bfloat16):
            q, k, v = (x.to(dtype) for x in (self.q, self.k, self.v))
            expected = ref.ref_sdpa(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                                    causal=True)[0]
            for out in (None, torch.empty(2, 5, 4, 3, dtype=dtype).transpose(1, 2)):
                try:
                    got = sdpa.scaled_dot_product_attention(q, k, v, causal=True, out=out)
                except sdpa.SdpaDtypeError as e:
                    self.assertEqual(e.name, "SDPA_ERR_DTYPE")
                    continue
                self.assertEqual(got.dtype, dtype)
                self.assertEqual(ref.within(got.float().numpy(), expected, 0, ATOL[dtype]), "")


class ServingTensorsTest(unittest.TestCase):
    def test_bf16_paged_cache_of_tensors(self):
        """A vLLM-layout bf16 cache tensor written by kv_write (torch's own bf16 rounding, in
        place: the tensor's memory) and read by a paged call with an int32 block-table tensor
        (viewed), sinks and ALiBi slopes as float32 tensors: equal to the same call on the
        dense gather, within the bf16 bound of the float64 reference."""
        g = ref.rng(60)
        nb, bs, Hkv, E, Hq = 7, 4, 2, 16, 4
        kc = torch.zeros(nb, bs, Hkv, E, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        lengths = [6, 3]
        table = torch.tensor([[5, 2], [0, 6]], dtype=torch.int32)
        slots = [int(table[b, j // bs]) * bs + j % bs for b, n in enumerate(lengths) for j in range(n)]
        k, v = t(g, len(slots), Hkv, E), t(g, len(slots), Hkv, E)
        ptr = kc.data_ptr()
        sdpa.kv_write(kc.transpose(1, 2), vc.transpose(1, 2), k, v, torch.tensor(slots))
        self.assertEqual(kc.data_ptr(), ptr)
        for i, s in enumerate(slots):
            self.assertTrue(torch.equal(kc[s // bs, s % bs], k[i].to(torch.bfloat16)))
        q = t(g, 2, Hq, 1, E)
        sinks = torch.tensor([0.0, 1.0, -1.0, 0.5])
        slopes = torch.from_numpy(sdpa.alibi_slopes(Hq))
        kw = dict(causal="bottom_right", sinks=sinks, alibi_slopes=slopes, key_lengths=lengths)
        got = sdpa.scaled_dot_product_attention(q, kc.transpose(1, 2), vc.transpose(1, 2),
                                                block_table=table, **kw)
        self.assertIsInstance(got, torch.Tensor)
        S = 2 * bs
        kd = torch.zeros(2, Hkv, S, E, dtype=torch.bfloat16)
        vd = torch.zeros_like(kd)
        for b, n in enumerate(lengths):
            for j in range(n):
                kd[b, :, j] = kc[table[b, j // bs], j % bs]
                vd[b, :, j] = vc[table[b, j // bs], j % bs]
        dense = sdpa.scaled_dot_product_attention(q, kd, vd, **kw)
        self.assertTrue(torch.equal(got, dense))
        # float64: ALiBi as the bias, the sink in the denominator
        p = np.arange(S)
        dist = np.abs(np.array(lengths)[:, None, None, None] - 1 - p[None, None, None, :])
        bias = -slopes.double().numpy()[None, :, None, None] * dist
        r, _, rl = ref.ref_sdpa(q.numpy(), kd.float().numpy(), vd.float().numpy(), bias=bias,
                                key_lengths=lengths, causal=True, alignment="bottom_right")
        tot = np.logaddexp(rl, sinks.double().numpy()[None, :, None])
        expected = r * np.exp(rl - tot)[..., None]
        self.assertEqual(ref.within(got.numpy(), expected, 1e-5, 1e-5), "")


class FromTorchTest(unittest.TestCase):
    def check(self, module, q, k, v, **kw):
        module.eval()
        layer = sdpa.MultiheadAttention.from_torch(module)
        self.assertFalse(layer.training)
        with torch.no_grad():
            want, want_w = module(q, k, v, **kw)
        got, got_w = layer(q, k, v, **kw)
        self.assertIsInstance(got, torch.Tensor)
        self.assertLess(float((got - want).abs().max()), 1e-5)
        self.assertLess(float((got_w - want_w).abs().max()), 1e-6)
        return layer

    def test_packed_seq_first(self):
        torch.manual_seed(0)
        m = torch.nn.MultiheadAttention(16, 4)
        x = torch.randn(5, 2, 16)                    # [L, B, E]
        pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
        layer = self.check(m, x, x, x, key_padding_mask=pad)
        # the weights are the module's parameters, not copies
        self.assertEqual(tensor_view(layer.state_dict()["in_proj_weight"], "w").data,
                         m.in_proj_weight.data_ptr())

    def test_cross_kdim_vdim_bias_kv_batch_first(self):
        torch.manual_seed(1)
        m = torch.nn.MultiheadAttention(12, 3, kdim=5, vdim=7, add_bias_kv=True,
                                        add_zero_attn=True, batch_first=True)
        q, k, v = torch.randn(2, 4, 12), torch.randn(2, 6, 5), torch.randn(2, 6, 7)
        self.check(m, q, k, v, attn_mask=torch.ones(4, 6, dtype=torch.bool).triu(1))

    def test_mode_follows_module(self):
        m = torch.nn.MultiheadAttention(8, 2, dropout=0.25)   # fresh module: training mode
        self.assertTrue(sdpa.MultiheadAttention.from_torch(m).training)
        with self.assertRaises(TypeError):
            sdpa.MultiheadAttention.from_torch(torch.nn.Linear(2, 2))


if __name__ == "__main__":
    unittest.main()
