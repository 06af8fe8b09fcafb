"""8-bit K/V caches through the Python package (libsdpa 0.6, issue 31 read side): uint8 bytes
plus k_dtype= / v_dtype= ("q8_0", "fp8_e4m3", "fp8_e5m2") and k_scale= / v_scale=.

The oracle decodes the bytes here, from the formats' documentation (ggml block_q8_0: an f16 d
then 32 int8, value = q * d in float32; OCP FP8 E4M3FN / E5M2 from sign, exponent and mantissa),
and the same call on float32 arrays of those values must give the same bits (the library
dequantizes exactly, then computes as for float32). Bad arguments raise their status with `out`
untouched.
"""
import unittest

import numpy as np

import sdpa


def fp8_values(b, kind):
    """float64 values of FP8 bytes (NaN for NaN encodings, +-inf for E5M2 Inf)."""
    b = b.astype(np.int64)
    s = np.where(b >> 7, -1.0, 1.0)
    if kind == "fp8_e4m3":
        e, m = (b >> 3) & 15, b & 7
        v = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1.0 + m / 8.0, e - 7))
        v = np.where((e == 15) & (m == 7), np.nan, v)
    else:
        e, m = (b >> 2) & 31, b & 3
        v = np.where(e == 0, np.ldexp(m / 4.0, -14), np.ldexp(1.0 + m / 4.0, e - 15))
        v = np.where(e == 31, np.where(m == 0, np.inf, np.nan), v)
    return s * v


def q8_values(raw):
    """float32 values of q8_0 bytes [..., nb * 34] -> [..., nb * 32]."""
    blocks = raw.reshape(raw.shape[:-1] + (raw.shape[-1] // 34, 34))
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # little-endian f16
    q = blocks[..., 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(raw.shape[:-1] + (raw.shape[-1] // 34 * 32,)).astype(np.float32)


def rand_q8(g, shape_blocks):
    raw = g.integers(0, 256, size=shape_blocks + (34,), dtype=np.uint8)
    d = (g.uniform(0.005, 0.05, size=shape_blocks) * g.choice([-1, 1], size=shape_blocks)).astype(np.float16)
    raw[..., :2] = d[..., None].view(np.uint8).reshape(shape_blocks + (2,))
    return raw.reshape(shape_blocks[:-1] + (shape_blocks[-1] * 34,))


def rand_fp8(g, shape, kind):
    b = g.integers(0, 256, size=shape, dtype=np.uint8)
    v = fp8_values(b, kind)
    bad = ~np.isfinite(v) | (np.abs(v) > 8)
    while bad.any():
        b[bad] = g.integers(0, 256, size=int(bad.sum()), dtype=np.uint8)
        v = fp8_values(b, kind)
        bad = ~np.isfinite(v) | (np.abs(v) > 8)
    return b


class Kv8(unittest.TestCase):
    def setUp(self):
        self.g = np.random.default_rng(31)
        B, Hq, Hkv, L, S, E, Ev = 2, 4, 2, 3, 50, 64, 32
        self.dims = (B, Hq, Hkv, L, S, E, Ev)
        self.q = self.g.standard_normal((B, Hq, L, E)).astype(np.float32)

    def check_same(self, k, v, kf, vf, **kw):
        for kernel in ("reference", "tiled", "decode"):
            out8 = sdpa.scaled_dot_product_attention(self.q, k, v, causal="bottom_right", kernel=kernel, **kw)
            name = sdpa.last_kernel()
            f32kw = {key: val for key, val in kw.items() if key not in ("k_dtype", "v_dtype", "k_scale", "v_scale")}
            outf = sdpa.scaled_dot_product_attention(self.q, kf, vf, causal="bottom_right", kernel=kernel, **f32kw)
            self.assertEqual(out8.shape, outf.shape)
            self.assertTrue(np.array_equal(out8, outf), f"{kernel}: 8-bit K/V differ from float32 K/V")
        return name

    def test_q8_0_dense_and_bshd(self):
        B, Hq, Hkv, L, S, E, Ev = self.dims
        k = rand_q8(self.g, (B, Hkv, S, E // 32))
        v = rand_q8(self.g, (B, Hkv, S, Ev // 32))
        name = self.check_same(k, v, q8_values(k), q8_values(v), k_dtype="q8_0", v_dtype="q8_0")
        self.assertTrue(name.endswith("-q8_0"), name)
        # a [B, S, Hkv, E/32*34] cache (llama.cpp's order) as its transposed view: no copy
        kb = rand_q8(self.g, (B, S, Hkv, E // 32))
        kt = kb.transpose(0, 2, 1, 3)
        self.check_same(kt, v, q8_values(kt), q8_values(v), k_dtype="q8_0", v_dtype="q8_0")

    def test_fp8_scales_and_mixed(self):
        B, Hq, Hkv, L, S, E, Ev = self.dims
        for kind in ("fp8_e4m3", "fp8_e5m2"):
            k = rand_fp8(self.g, (B, Hkv, S, E), kind)
            v = rand_fp8(self.g, (B, Hkv, S, Ev), kind)
            ks = 0.5
            vs = np.array([0.25, 2.0], dtype=np.float32)  # per kv head (vLLM)
            kf = (fp8_values(k, kind).astype(np.float32) * np.float32(ks)).astype(np.float32)
            vf = (fp8_values(v, kind).astype(np.float32) * vs[None, :, None, None]).astype(np.float32)
            name = self.check_same(k, v, kf, vf, k_dtype=kind, v_dtype=kind, k_scale=ks, v_scale=vs)
            self.assertTrue(name.endswith("-" + kind), name)
        # q8_0 K with a float16 V (llama.cpp allows the two cache types to differ)
        k = rand_q8(self.g, (B, Hkv, S, E // 32))
        v16 = self.g.standard_normal((B, Hkv, S, Ev)).astype(np.float16)
        name = self.check_same(k, v16, q8_values(k), v16.astype(np.float32), k_dtype="q8_0")
        self.assertTrue(name.endswith("-mixed"), name)

    def test_paged_q8_0(self):
        B, Hq, Hkv, L, S, E, Ev = self.dims
        bs, nb = 16, 9
        kp = rand_q8(self.g, (nb, Hkv, bs, E // 32))
        vp = rand_fp8(self.g, (nb, Hkv, bs, Ev), "fp8_e4m3")
        table = np.array([[3, 0, 7, 5], [8, 1, 2, 4]], dtype=np.int32)
        lengths = [50, 20]
        kw = dict(block_table=table, key_lengths=lengths)
        out8 = sdpa.scaled_dot_product_attention(self.q, kp, vp, causal="bottom_right", k_dtype="q8_0",
                                                 v_dtype="fp8_e4m3", **kw)
        outf = sdpa.scaled_dot_product_attention(self.q, q8_values(kp), fp8_values(vp, "fp8_e4m3").astype(np.float32),
                                                 causal="bottom_right", **kw)
        self.assertTrue(np.array_equal(out8, outf))

    def test_errors(self):
        B, Hq, Hkv, L, S, E, Ev = self.dims
        k = rand_q8(self.g, (B, Hkv, S, E // 32))
        v = rand_fp8(self.g, (B, Hkv, S, Ev), "fp8_e5m2")
        out = np.full((B, Hq, L, Ev), 7.0, np.float32)
        cases = [
            (dict(k_dtype="q4_0", v_dtype="fp8_e5m2"), sdpa.SdpaArgumentError),
            (dict(k_dtype="q8_0", v_dtype="fp8_e5m2", k_scale=0.5), sdpa.SdpaArgumentError),  # q8_0 has no scale
            (dict(k_dtype="q8_0", v_dtype="fp8_e5m2", v_scale=np.ones(3, np.float32)), sdpa.SdpaShapeError),
            (dict(k_dtype="q8_0", v_dtype="fp8_e5m2", v_scale=float("nan")), sdpa.SdpaArgumentError),
            (dict(k_dtype="q8_0", v_dtype="fp8_e5m2", v_scale=-1.0), sdpa.SdpaArgumentError),
        ]
        for kw, err in cases:
            with self.assertRaises(err, msg=str(kw)):
                sdpa.scaled_dot_product_attention(self.q, k, v, out=out, **kw)
            self.assertTrue((out == 7.0).all(), f"out written by a failing call {kw}")
        with self.assertRaises(sdpa.SdpaShapeError):  # not whole 34-byte blocks
            sdpa.scaled_dot_product_attention(self.q, k[..., :40], v, k_dtype="q8_0", v_dtype="fp8_e5m2")
        with self.assertRaises(sdpa.SdpaDtypeError):  # the bytes must be uint8
            sdpa.scaled_dot_product_attention(self.q, k.view(np.int16), v, k_dtype="q8_0", v_dtype="fp8_e5m2")
        with self.assertRaises(sdpa.SdpaDtypeError):  # an 8-bit query is not a K/V cache
            sdpa.scaled_dot_product_attention(v[:, :, :L].astype(np.uint8), k, v, k_dtype="q8_0",
                                              v_dtype="fp8_e5m2")
        # NaN in an attended FP8 value row: SdpaValueError, out untouched
        v2 = v.copy()
        v2[0, 0, 5, 3] = 0xFF  # E5M2 NaN
        with self.assertRaises(sdpa.SdpaValueError):
            sdpa.scaled_dot_product_attention(self.q, k, v2, out=out, k_dtype="q8_0", v_dtype="fp8_e5m2")
        self.assertTrue((out == 7.0).all())


if __name__ == "__main__":
    unittest.main()
