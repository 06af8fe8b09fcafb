"""sdpa.rope (libsdpa 0.6, issue 31): rotary embedding against HF transformers'
apply_rotary_pos_emb (rotate_half, NeoX) and FlashAttention's apply_rotary_emb_torch
(interleaved, GPT-J), each written here in numpy float32 from its formula; with cos/sin tables
the library's result must be the same bits (elementwise float32 products, then one add).
tests/python/test_rope_torch.py repeats the comparison with torch tensors where torch is installed.
"""
import unittest

import numpy as np

import sdpa


def tables(max_pos, rd, theta=10000.0):
    inv = 1.0 / theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def hf_rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def hf_apply(x, cos, sin, pos, rd):
    """HF apply_rotary_pos_emb on x [T, H, E] (the first rd elements; the rest passes)."""
    c = np.concatenate([cos[pos], cos[pos]], axis=-1)[:, None, :]  # emb = cat(freqs, freqs)
    s = np.concatenate([sin[pos], sin[pos]], axis=-1)[:, None, :]
    xr = x[..., :rd]
    out = (xr * c) + (hf_rotate_half(xr) * s)
    return np.concatenate([out, x[..., rd:]], axis=-1)


def fa_apply_interleaved(x, cos, sin, pos, rd):
    """FlashAttention apply_rotary_emb_torch(interleaved=True) on x [T, H, E]."""
    c = np.repeat(cos[pos], 2, axis=-1)[:, None, :]
    s = np.repeat(sin[pos], 2, axis=-1)[:, None, :]
    xr = x[..., :rd]
    x1, x2 = xr[..., ::2], xr[..., 1::2]
    rot = np.stack([-x2, x1], axis=-1).reshape(xr.shape)
    out = (xr * c) + (rot * s)
    return np.concatenate([out, x[..., rd:]], axis=-1)


class RopeTest(unittest.TestCase):
    def setUp(self):
        self.g = np.random.default_rng(31)

    def test_conventions_bit_exact(self):
        for interleaved, ref in ((False, hf_apply), (True, fa_apply_interleaved)):
            for rd in (64, 32):
                cos, sin = tables(100, rd)
                x = self.g.standard_normal((6, 4, 64)).astype(np.float32)
                pos = np.array([0, 1, 5, 17, 63, 99])
                got = sdpa.rope(x, pos, cos=cos, sin=sin, rotary_dim=rd, interleaved=interleaved)
                want = ref(x, cos, sin, pos, rd)
                np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    def test_in_place_and_query_layout(self):
        cos, sin = tables(64, 128)
        q = self.g.standard_normal((2, 3, 8, 128)).astype(np.float32)  # [B, L, H, E]
        pos = np.array([[10, 11, 12], [0, 1, 2]]).reshape(-1)
        want = hf_apply(q.reshape(6, 8, 128), cos, sin, pos, 128)
        x = q.reshape(6, 8, 128)
        r = sdpa.rope(x, pos, cos=cos, sin=sin, out=x)
        self.assertIs(r, x)
        np.testing.assert_array_equal(q.reshape(6, 8, 128).view(np.uint32), want.view(np.uint32))

    def test_theta_close_to_float64(self):
        x = self.g.standard_normal((3, 2, 64)).astype(np.float32)
        pos = np.array([0, 7, 300])
        got = sdpa.rope(x, pos, theta=10000.0).astype(np.float64)
        cos, sin = tables(301, 64)
        want = hf_apply(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), pos, 64)
        self.assertLess(np.abs(got - want).max(), 1e-4)

    def test_errors_leave_out_untouched(self):
        cos, sin = tables(8, 16)
        x = self.g.standard_normal((2, 1, 16)).astype(np.float32)
        out = np.full_like(x, 7.0)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:  # SDPA_ERR_INDEX
            sdpa.rope(x, [1, 8], cos=cos, sin=sin, out=out)
        self.assertIn("positions[1]=8", str(cm.exception))
        with self.assertRaises(sdpa.SdpaArgumentError):
            sdpa.rope(x, [1, 2], rotary_dim=5, out=out)
        with self.assertRaises(sdpa.SdpaError):
            sdpa.rope(x, [1, 2], cos=cos, out=out)
        self.assertTrue((out == 7.0).all())


if __name__ == "__main__":
    unittest.main()
