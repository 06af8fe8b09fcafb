"""sdpa.kv_write into 8-bit caches (libsdpa 0.6, issue 31 write side): uint8 cache bytes with
k_dtype= / v_dtype= ("q8_0", "fp8_e4m3", "fp8_e5m2"), k_scale= / v_scale=, rope= + positions=.

The oracles are this file's own, in numpy from the formats' documentation: ggml's
quantize_row_q8_0_ref (amax / 127 in float32, id = 1 / d, roundf = half away from zero, d to
float16 with numpy's round-to-nearest-even cast), the FP8 value nearest to x / scale (a scan of
the 256 encodings, ties to the even one, saturating), and RoPE in float32 as sdpa.h writes it.
What kv_write stored is then read by scaled_dot_product_attention: the same bits as float32 K/V
holding the dequantized values.
"""
import unittest

import numpy as np

import sdpa


def ref_q8_0(x):
    """q8_0 bytes [..., E / 32 * 34] of float32 rows [..., E] (finite values)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // 32, 32))
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (blocks * idv[..., None]).astype(np.float32)
    q = np.where(v < 0, -np.floor(-v.astype(np.float64) + 0.5), np.floor(v.astype(np.float64) + 0.5))
    q = np.clip(q, -127, 127).astype(np.int8)
    out = np.empty(blocks.shape[:-1] + (34,), np.uint8)
    out[..., :2] = d.astype(np.float16)[..., None].view(np.uint8).reshape(d.shape + (2,))
    out[..., 2:] = q.view(np.uint8)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // 32 * 34,))


def q8_values(raw):
    blocks = raw.reshape(raw.shape[:-1] + (raw.shape[-1] // 34, 34))
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(raw.shape[:-1] + (raw.shape[-1] // 34 * 32,)).astype(np.float32)


def fp8_table(kind):
    """float64 values of the 128 non-negative encodings (NaN/Inf as nan)."""
    b = np.arange(128)
    if kind == "fp8_e4m3":
        e, m = (b >> 3) & 15, b & 7
        v = np.where(e == 0, np.ldexp(m / 8.0, -6), np.ldexp(1.0 + m / 8.0, e - 7))
        return np.where((e == 15) & (m == 7), np.nan, v)
    e, m = (b >> 2) & 31, b & 3
    v = np.where(e == 0, np.ldexp(m / 4.0, -14), np.ldexp(1.0 + m / 4.0, e - 15))
    return np.where(e == 31, np.nan, v)


def ref_fp8(y, kind):
    """FP8 bytes of float32 y: the nearest finite value, ties to the even encoding, saturating."""
    y = np.asarray(y, np.float32)
    tab = fp8_table(kind)
    finite = np.flatnonzero(np.isfinite(tab))
    a = np.abs(y.astype(np.float64)).reshape(-1)
    dist = np.abs(a[:, None] - tab[finite][None, :])
    best = dist.min(axis=1, keepdims=True)
    cand = np.where(dist == best, finite[None, :], 1 << 20)
    even = np.where(cand % 2 == 0, cand, 1 << 20).min(axis=1)
    code = np.where(even < (1 << 20), even, cand.min(axis=1))
    code = np.where(a > np.nanmax(tab), finite.max(), code)
    sign = np.signbit(y).reshape(-1).astype(np.int64) << 7
    return (code | sign).astype(np.uint8).reshape(y.shape)


def rope_f32(x, pos, theta=10000.0, interleaved=False):
    """RoPE of float32 rows x [T, H, E] at positions [T], float32 as sdpa.h's formula, the angles
    from float64 cos / sin rounded to float32 (the table path)."""
    T, H, E = x.shape
    i = np.arange(E // 2)
    ang = np.asarray(pos, np.float64)[:, None] * theta ** (-2.0 * i / E)
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    y = x.copy()
    ia = 2 * i if interleaved else i
    ib = 2 * i + 1 if interleaved else i + E // 2
    a, b = x[..., ia], x[..., ib]
    y[..., ia] = a * c[:, None, :] - b * s[:, None, :]
    y[..., ib] = a * s[:, None, :] + b * c[:, None, :]
    return y, c, s


class KvWrite8(unittest.TestCase):
    def setUp(self):
        self.g = np.random.default_rng(3201)
        self.T, self.H, self.E, self.nb, self.bs = 6, 2, 64, 5, 4
        self.k = (self.g.standard_normal((self.T, self.H, self.E)) * 2).astype(np.float32)
        self.v = self.g.standard_normal((self.T, self.H, self.E)).astype(np.float32)
        self.slots = np.array([3, 17, -1, 0, 9, 12])

    def rows_at(self, cache, slots):
        """cache [nb, H, bs, w] -> the rows of the given slots [n, H, w]."""
        return np.stack([cache[s // self.bs, :, s % self.bs] for s in slots])

    def test_q8_0_bit_exact_and_round_trip(self):
        nb, H, bs, E = self.nb, self.H, self.bs, self.E
        kc = np.full((nb, H, bs, E // 32 * 34), 0xCD, np.uint8)
        vc = np.full((nb, H, bs, E // 32 * 34), 0xCD, np.uint8)
        sdpa.kv_write(kc, vc, self.k, self.v, self.slots, k_dtype="q8_0", v_dtype="q8_0")
        live = [t for t in range(self.T) if self.slots[t] >= 0]
        self.assertTrue(np.array_equal(self.rows_at(kc, self.slots[live]), ref_q8_0(self.k[live])))
        self.assertTrue(np.array_equal(self.rows_at(vc, self.slots[live]), ref_q8_0(self.v[live])))
        self.assertTrue((kc[1] == 0xCD).all())  # block 1 has no written slot
        # read back by attention over a block table: the bits of float32 K/V of the dequantized values
        q = self.g.standard_normal((1, 4, 1, E)).astype(np.float32)
        table = np.array([[0, 4, 2, 3]], np.int32)  # slots 0..15 of "sequence 0": blocks 0, 4, 2, 3
        kw = dict(block_table=table, key_lengths=[16])
        out8 = sdpa.scaled_dot_product_attention(q, kc, vc, k_dtype="q8_0", v_dtype="q8_0", **kw)
        outf = sdpa.scaled_dot_product_attention(q, q8_values(kc), q8_values(vc), **kw)
        self.assertTrue(np.array_equal(out8, outf))

    def test_fp8_scales(self):
        nb, H, bs, E = self.nb, self.H, self.bs, self.E
        for kind in ("fp8_e4m3", "fp8_e5m2"):
            for ks, vs in ((None, None), (0.05, np.array([0.5, 4.0], np.float32))):
                kc = np.zeros((nb, H, bs, E), np.uint8)
                vc = np.zeros((nb, H, bs, E), np.uint8)
                k = self.k * np.float32(100)
                sdpa.kv_write(kc, vc, k, self.v, self.slots, k_dtype=kind, v_dtype=kind, k_scale=ks, v_scale=vs)
                live = [t for t in range(self.T) if self.slots[t] >= 0]
                kd = k[live] / np.float32(1 if ks is None else ks)
                vd = self.v[live] / (np.float32(1) if vs is None else vs[None, :, None])
                self.assertTrue(np.array_equal(self.rows_at(kc, self.slots[live]), ref_fp8(kd.astype(np.float32), kind)),
                                kind)
                self.assertTrue(np.array_equal(self.rows_at(vc, self.slots[live]), ref_fp8(vd.astype(np.float32), kind)),
                                kind)

    def test_rope_then_quantize(self):
        nb, H, bs, E = self.nb, self.H, self.bs, self.E
        pos = np.array([4, 9, 0, 31, 2, 7])
        for interleaved in (False, True):
            rot, c, s = rope_f32(self.k, pos, interleaved=interleaved)
            # tables of every position 0..31 (rows of this call's positions are what matter)
            i = np.arange(E // 2)
            ang = np.arange(32, dtype=np.float64)[:, None] * 10000.0 ** (-2.0 * i / E)
            ct, st = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
            kc = np.zeros((nb, H, bs, E // 32 * 34), np.uint8)
            vc = np.zeros((nb, H, bs, E // 32 * 34), np.uint8)
            sdpa.kv_write(kc, vc, self.k, self.v, self.slots, k_dtype="q8_0", v_dtype="q8_0",
                          rope=dict(cos=ct, sin=st, interleaved=interleaved), positions=pos)
            live = [t for t in range(self.T) if self.slots[t] >= 0]
            self.assertTrue(np.array_equal(self.rows_at(kc, self.slots[live]), ref_q8_0(rot[live])), interleaved)
            self.assertTrue(np.array_equal(self.rows_at(vc, self.slots[live]), ref_q8_0(self.v[live])))
            # float32 cache, theta path: near the float64 rotation
            kf = np.zeros((nb, H, bs, E), np.float32)
            sdpa.kv_write(kf, None, self.k, None, self.slots, rope=dict(interleaved=interleaved), positions=pos)
            self.assertTrue(np.allclose(self.rows_at(kf, self.slots[live]), rot[live], rtol=0, atol=1e-4))

    def test_errors_leave_the_cache_untouched(self):
        nb, H, bs, E = self.nb, self.H, self.bs, self.E
        kc = np.full((nb, H, bs, E), 0xCD, np.uint8)
        kf16 = np.zeros((nb, H, bs, E), np.float16)
        cases = [
            (dict(k_dtype="fp8_e4m3", k_scale=0.0), sdpa.SdpaArgumentError),
            (dict(k_dtype="fp8_e4m3", k_scale=float("inf")), sdpa.SdpaArgumentError),
            (dict(k_dtype="fp8_e4m3", k_scale=np.ones(3, np.float32)), sdpa.SdpaShapeError),
            (dict(k_dtype="fp8_e4m3", positions=np.arange(self.T)), sdpa.SdpaArgumentError),
            (dict(k_dtype="fp8_e4m3", rope=True), sdpa.SdpaArgumentError),
            (dict(k_dtype="q4_0"), sdpa.SdpaArgumentError),
        ]
        for kw, err in cases:
            with self.assertRaises(err, msg=str(kw)):
                sdpa.kv_write(kc, None, self.k, None, self.slots, **kw)
            self.assertTrue((kc == 0xCD).all(), f"cache written by a failing call {kw}")
        with self.assertRaises(sdpa.SdpaArgumentError):  # a scale for a float16 cache
            sdpa.kv_write(kf16, None, self.k, None, self.slots, k_scale=0.5)
        self.assertTrue((kf16 == 0).all())


if __name__ == "__main__":
    unittest.main()
