"""Zero-copy interop without torch: objects with __dlpack__ or __array_interface__ are accepted
wherever numpy arrays are (same memory, no copy), numpy float16 is passed to the library as
SDPA_DTYPE_F16 (the library's status decides), and non-arrays get a message naming what is
accepted. torch tensors: test_torch.py."""
import ctypes
import unittest

import numpy as np

import reference as ref

import sdpa
from sdpa import _lib
from sdpa._views import tensor_view

# An f16 result is compared with the float64 reference within this bound (inputs in [-1, 1)
# exactly representable in f16, f32 arithmetic, out rounded once to f16: 2^-11 relative per
# element plus accumulation).
F16_ATOL = 4e-3


class DLPackOnly:
    """A producer that offers only the DLPack protocol (numpy's own __dlpack__ behind it)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class InterfaceOnly:
    """A producer that offers only __array_interface__."""

    def __init__(self, array):
        self._array = array  # keeps the memory alive
        self.__array_interface__ = array.__array_interface__


def address(a):
    return a.__array_interface__["data"][0]


class ArrayLikeTest(unittest.TestCase):
    def setUp(self):
        g = ref.rng(11)
        # [B, L, H, E] buffers seen as [B, H, L, E] (non-contiguous views)
        self.qb = ref.randn(g, 2, 5, 3, 4)
        self.kb = ref.randn(g, 2, 6, 3, 4)
        self.vb = ref.randn(g, 2, 6, 3, 2)
        self.q, self.k, self.v = (x.transpose(0, 2, 1, 3) for x in (self.qb, self.kb, self.vb))
        self.expected = ref.ref_sdpa(self.q, self.k, self.v, causal=True)[0]

    def check_view(self, obj, array):
        t = tensor_view(obj, "x")
        self.assertEqual(t.data, address(array))  # the same memory: no copy
        self.assertEqual(tuple(t.strides[:array.ndim]),
                         tuple(s // array.itemsize for s in array.strides))

    def test_dlpack_no_copy(self):
        for a in (self.q, self.k, self.v):
            self.check_view(DLPackOnly(a), a)
        out = sdpa.scaled_dot_product_attention(DLPackOnly(self.q), DLPackOnly(self.k),
                                                DLPackOnly(self.v), causal=True)
        self.assertIsInstance(out, np.ndarray)
        self.assertEqual(ref.within(out, self.expected, 1e-5, 1e-6), "")

    def test_dlpack_out_written_in_place(self):
        buf = np.full((2, 5, 3, 2), np.nan, np.float32)
        view = buf.transpose(0, 2, 1, 3)
        got = sdpa.scaled_dot_product_attention(self.q, self.k, self.v, causal=True,
                                                out=DLPackOnly(view))
        self.assertIsInstance(got, DLPackOnly)  # returned as given
        self.assertEqual(ref.within(view, self.expected, 1e-5, 1e-6), "")

    def test_array_interface_no_copy(self):
        for a in (self.q, self.k, self.v):
            self.check_view(InterfaceOnly(a), a)
        buf = np.zeros((2, 3, 5, 2), np.float32)
        out = InterfaceOnly(buf)
        got = sdpa.scaled_dot_product_attention(InterfaceOnly(self.q), InterfaceOnly(self.k),
                                                InterfaceOnly(self.v), causal=True, out=out)
        self.assertIs(got, out)
        self.assertEqual(ref.within(buf, self.expected, 1e-5, 1e-6), "")

    def test_array_like_masks_and_merge(self):
        allow = np.tril(np.ones((5, 6), bool))
        out = sdpa.scaled_dot_product_attention(self.q, self.k, self.v,
                                                attn_mask=InterfaceOnly(allow))
        self.assertEqual(ref.within(out, self.expected, 1e-5, 1e-6), "")
        o1, l1 = sdpa.scaled_dot_product_attention(self.q, self.k[:, :, :3], self.v[:, :, :3],
                                                   need_lse=True)
        o2, l2 = sdpa.scaled_dot_product_attention(self.q, self.k[:, :, 3:], self.v[:, :, 3:],
                                                   need_lse=True)
        out, _ = sdpa.merge(DLPackOnly(o1), DLPackOnly(l1), InterfaceOnly(o2), InterfaceOnly(l2))
        full = ref.ref_sdpa(self.q, self.k, self.v)[0]
        self.assertEqual(ref.within(out, full, 1e-5, 1e-6), "")

    def test_not_an_array(self):
        # new-user trial: out=[0]*10 said "out has shape None"
        with self.assertRaises(TypeError) as cm:
            sdpa.scaled_dot_product_attention(self.q, self.k, self.v, out=[0] * 10)
        self.assertIn("out must be an array", str(cm.exception))
        self.assertIn("got list", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            sdpa.scaled_dot_product_attention([[0.0]], self.k, self.v)
        self.assertIn("query must be an array", str(cm.exception))


class Float16Test(unittest.TestCase):
    """numpy float16 views go to the library as SDPA_DTYPE_F16, unconverted. A library without
    f16 (0.3) answers SDPA_ERR_DTYPE; one with f16 must match the float64 reference."""

    def test_view_dtype_and_pointer(self):
        a = np.zeros((2, 3, 4), np.float16)[:, ::2]
        t = tensor_view(a, "a")
        self.assertEqual(t.dtype, _lib.SDPA_DTYPE_F16)
        self.assertEqual(t.data, address(a))
        self.assertEqual(tuple(t.strides[:3]), (12, 8, 1))

    def test_library_answers(self):
        g = ref.rng(12)
        q, k, v = (np.round(ref.randn(g, *s) * 64) / 64 for s in ((1, 2, 3, 8), (1, 2, 7, 8),
                                                                  (1, 2, 7, 4)))
        q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
        expected = ref.ref_sdpa(q16, k16, v16)[0]
        try:
            out = sdpa.scaled_dot_product_attention(q16, k16, v16)
        except sdpa.SdpaDtypeError as e:
            self.assertEqual(e.name, "SDPA_ERR_DTYPE")
            self.assertIn("dtype", e.message)
            return
        self.assertEqual(out.dtype, np.float16)  # out takes the query's dtype
        self.assertEqual(ref.within(out, expected, 0, F16_ATOL), "")


if __name__ == "__main__":
    unittest.main()
