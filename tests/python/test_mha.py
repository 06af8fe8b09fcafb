"""sdpa.MultiheadAttention against the float64 reference of reference.py (and against torch when
it is importable): layouts, masks in PyTorch's polarity, GQA, state_dict handling, dropout."""
import gc
import os
import sys
import unittest

import numpy as np

import reference as ref
from reference import randn, ref_mha

import sdpa
from sdpa._arrays import BF16

RTOL, ATOL = 1e-4, 1e-5


def make_state_dict(g, E, H, *, kdim=None, vdim=None, bias=True, add_bias_kv=False,
                    num_kv_heads=None, head_dim=None, packed=None):
    kdim, vdim = kdim or E, vdim or E
    Dh = head_dim or E // H
    Hkv = num_kv_heads or H
    Dq, Dkv = H * Dh, Hkv * Dh
    if packed is None:
        packed = kdim == E and vdim == E and Dq == E and Dkv == E
    sd = {}
    if packed:
        sd["in_proj_weight"] = randn(g, 3 * E, E) * 0.3
    else:
        sd["q_proj_weight"] = randn(g, Dq, E) * 0.3
        sd["k_proj_weight"] = randn(g, Dkv, kdim) * 0.3
        sd["v_proj_weight"] = randn(g, Dkv, vdim) * 0.3
    if bias:
        sd["in_proj_bias"] = randn(g, Dq + 2 * Dkv) * 0.1
        sd["out_proj.bias"] = randn(g, E) * 0.1
    if add_bias_kv:
        sd["bias_k"] = randn(g, 1, 1, Dkv)
        sd["bias_v"] = randn(g, 1, 1, Dkv)
    sd["out_proj.weight"] = randn(g, E, Dq) * 0.3
    return sd


class MhaReferenceTest(unittest.TestCase):
    def compare(self, layer, sd, q, k, v, **kw):
        y, w = layer(q, k, v, **kw)
        ref_kw = {n: kw[n] for n in ("key_padding_mask", "attn_mask", "is_causal",
                                     "average_attn_weights") if n in kw}
        unbatched = q.ndim == 2
        rq, rk, rv = (x[None] if unbatched else x for x in (q, k, v))
        if unbatched:
            if "key_padding_mask" in ref_kw:
                ref_kw["key_padding_mask"] = ref_kw["key_padding_mask"][None]
            am = ref_kw.get("attn_mask")
            if am is not None and am.ndim == 3:
                ref_kw["attn_mask"] = am
        want_y, want_w = ref_mha(sd, rq, rk, rv, layer.num_heads,
                                 num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
                                 batch_first=layer.batch_first or unbatched,
                                 add_zero_attn=layer.add_zero_attn, **ref_kw)
        if unbatched:
            want_y, want_w = want_y[0], want_w[0]
        self.assertEqual(y.shape, q.shape[:-1] + (layer.embed_dim,))
        self.assertEqual(y.dtype, np.float32)
        np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
        if kw.get("need_weights", True):
            np.testing.assert_allclose(w, want_w, rtol=RTOL, atol=ATOL)
        else:
            self.assertIsNone(w)
        return y, w

    def test_self_attention_packed(self):
        g = ref.rng(1)
        sd = make_state_dict(g, 8, 2)
        for batch_first in (True, False):
            layer = sdpa.MultiheadAttention(8, 2, batch_first=batch_first, state_dict=sd)
            x = randn(g, 3, 5, 8)
            self.compare(layer, sd, x, x, x)
            self.compare(layer, sd, x, x, x, need_weights=False)
            self.compare(layer, sd, x, x, x, average_attn_weights=False)

    def test_cross_kdim_vdim_masks(self):
        g = ref.rng(2)
        E, H, B, L, S = 12, 3, 2, 4, 6
        sd = make_state_dict(g, E, H, kdim=5, vdim=7)
        layer = sdpa.MultiheadAttention(E, H, kdim=5, vdim=7, batch_first=True, state_dict=sd)
        q, k, v = randn(g, B, L, E), randn(g, B, S, 5), randn(g, B, S, 7)
        kpm = np.zeros((B, S), bool)
        kpm[0, 4:] = True                              # True = ignore (PyTorch MHA polarity)
        self.compare(layer, sd, q, k, v, key_padding_mask=kpm)
        am = np.triu(np.ones((L, S), bool), 3)         # bool [L, S], True = ignore
        self.compare(layer, sd, q, k, v, attn_mask=am, key_padding_mask=kpm)
        am3 = g.random((B * H, L, S)) < 0.3            # [B*H, L, S]
        am3[..., 0] = False
        self.compare(layer, sd, q, k, v, attn_mask=am3, average_attn_weights=False)
        fm = np.where(g.random((B * H, L, S)) < 0.3, -np.inf, g.standard_normal((B * H, L, S)))
        fm[..., 0] = 0.0
        fm = fm.astype(np.float32)                     # float = additive
        self.compare(layer, sd, q, k, v, attn_mask=fm)
        fkpm = np.where(kpm, -np.inf, 0.5).astype(np.float32)
        self.compare(layer, sd, q, k, v, attn_mask=fm, key_padding_mask=fkpm)
        self.compare(layer, sd, q, k, v, is_causal=True, key_padding_mask=kpm)

    def test_bias_kv_zero_attn_no_bias(self):
        g = ref.rng(3)
        sd = make_state_dict(g, 8, 4, add_bias_kv=True)
        layer = sdpa.MultiheadAttention(8, 4, add_bias_kv=True, add_zero_attn=True, state_dict=sd)
        x = randn(g, 5, 2, 8)                           # [L, B, E]
        kpm = np.zeros((2, 5), bool)
        kpm[1, 2:] = True
        y, w = self.compare(layer, sd, x, x, x, key_padding_mask=kpm, is_causal=True)
        self.assertEqual(w.shape, (2, 5, 7))
        sd = make_state_dict(g, 8, 2, bias=False)
        layer = sdpa.MultiheadAttention(8, 2, bias=False, state_dict=sd)
        self.compare(layer, sd, x, x, x)

    def test_gqa(self):
        g = ref.rng(4)
        E, H, Hkv, Dh = 16, 4, 2, 6                     # head_dim != E / H, as in Llama-style layers
        sd = make_state_dict(g, E, H, num_kv_heads=Hkv, head_dim=Dh, bias=False)
        layer = sdpa.MultiheadAttention(E, H, num_kv_heads=Hkv, head_dim=Dh, bias=False,
                                        batch_first=True, state_dict=sd)
        x = randn(g, 2, 5, E)
        self.compare(layer, sd, x, x, x, is_causal=True)
        self.compare(layer, sd, x, x, x, average_attn_weights=False)
        inferred = sdpa.MultiheadAttention.from_state_dict(sd, 4, batch_first=True)
        self.assertEqual((inferred.num_kv_heads, inferred.head_dim), (Hkv, Dh))
        self.compare(inferred, sd, x, x, x)

    def test_unbatched_and_strided(self):
        g = ref.rng(5)
        sd = make_state_dict(g, 8, 2)
        layer = sdpa.MultiheadAttention(8, 2, state_dict=sd)
        x = randn(g, 4, 8)
        y, w = self.compare(layer, sd, x, x, x, key_padding_mask=np.array([False, False, True, False]))
        self.assertEqual(w.shape, (4, 4))
        self.compare(layer, sd, x, x, x, attn_mask=np.triu(np.ones((2, 4, 4), bool), 1),
                     average_attn_weights=False)
        buf = randn(g, 3, 6, 16)                       # strided views of a larger buffer
        xv = buf[:, ::2, 4:12]
        layer.batch_first = True
        y1, _ = layer(xv, xv, xv)
        y2, _ = layer(*(np.ascontiguousarray(xv),) * 3)
        np.testing.assert_array_equal(y1, y2)

    def test_from_state_dict_infers_layout(self):
        g = ref.rng(6)
        sd = make_state_dict(g, 8, 2, kdim=3, vdim=5, add_bias_kv=True)
        layer = sdpa.MultiheadAttention.from_state_dict(sd, num_heads=2)
        self.assertEqual((layer.embed_dim, layer.kdim, layer.vdim, layer.bias, layer.add_bias_kv),
                         (8, 3, 5, True, True))
        self.assertEqual(sorted(layer.expected_state_dict_keys()), sorted(sd))
        q, k, v = randn(g, 4, 2, 8), randn(g, 3, 2, 3), randn(g, 3, 2, 5)
        self.compare(layer, sd, q, k, v)

    def test_state_dict_errors(self):
        g = ref.rng(7)
        sd = make_state_dict(g, 8, 2)
        layer = sdpa.MultiheadAttention(8, 2)
        with self.assertRaises(KeyError):
            layer.load_state_dict({**sd, "extra": sd["out_proj.bias"]})
        with self.assertRaises(KeyError):
            layer.load_state_dict({k: v for k, v in sd.items() if k != "in_proj_bias"})
        with self.assertRaises(sdpa.SdpaShapeError):
            layer.load_state_dict({**sd, "out_proj.weight": randn(g, 8, 7)})
        with self.assertRaises(sdpa.SdpaArgumentError):   # no weights loaded
            layer(randn(g, 2, 1, 8), randn(g, 2, 1, 8), randn(g, 2, 1, 8))
        with self.assertRaises(sdpa.SdpaShapeError):
            sdpa.MultiheadAttention(10, 3)
        layer.load_state_dict({k: v.astype(np.float64) for k, v in sd.items()})  # converted once
        self.assertEqual(layer.state_dict()["in_proj_weight"].dtype, np.float32)
        x = randn(g, 2, 1, 8)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            layer(x, x[..., :6], x)
        self.assertIn("key.shape[2]=6 must be kdim=8", cm.exception.message)
        with self.assertRaises(sdpa.SdpaDtypeError):
            layer(x.astype(np.float64), x, x)
        with self.assertRaises(sdpa.SdpaValueError) as cm:
            layer(x, x, x, key_padding_mask=np.ones((1, 2), bool))
        self.assertEqual(cm.exception.name, "SDPA_ERR_EMPTY_ROW")
        y, w = layer(x, x, x, key_padding_mask=np.ones((1, 2), bool), empty_rows="zero")
        self.assertTrue(np.all(w == 0))

    def test_training_dropout(self):
        g = ref.rng(8)
        sd = make_state_dict(g, 8, 2)
        layer = sdpa.MultiheadAttention(8, 2, dropout=0.5, batch_first=True, state_dict=sd)
        x = randn(g, 2, 6, 8)
        self.assertFalse(layer.training)
        eval_y, eval_w = self.compare(layer, sd, x, x, x)    # eval: no dropout
        layer.train()
        y1, w1 = layer(x, x, x)
        self.assertEqual(layer.dropout_offset, 1)
        y2, _ = layer(x, x, x)
        self.assertFalse(np.array_equal(y1, y2))             # fresh stream per call
        layer.dropout_offset = 0
        y3, w3 = layer(x, x, x)
        np.testing.assert_array_equal(y1, y3)                 # deterministic in (seed, offset)
        self.assertFalse(np.array_equal(y1, eval_y))
        np.testing.assert_allclose(w1, eval_w, rtol=1e-6, atol=1e-7)  # pre-dropout weights
        self.assertIs(layer.eval(), layer)
        np.testing.assert_array_equal(layer(x, x, x)[0], eval_y)

    def test_no_leaks(self):
        g = ref.rng(9)
        sd = make_state_dict(g, 8, 2)
        layer = sdpa.MultiheadAttention(8, 2, state_dict=sd)
        x = randn(g, 3, 2, 8)
        am = np.triu(np.ones((3, 3), bool), 1)
        for _ in range(20):
            layer(x, x, x, attn_mask=am)
        gc.collect()
        refs = [sys.getrefcount(a) for a in (x, am, *sd.values())]
        gc.disable()
        try:
            for _ in range(2000):
                layer(x, x, x, attn_mask=am)
            self.assertEqual(gc.collect(), 0)
        finally:
            gc.enable()
        self.assertEqual([sys.getrefcount(a) for a in (x, am, *sd.values())], refs)


class MhaArgumentTest(unittest.TestCase):
    """Regressions: integer masks and out-of-range dropout were accepted silently."""

    def layer(self, **kw):
        g = ref.rng(20)
        return sdpa.MultiheadAttention(8, 2, batch_first=True, state_dict=make_state_dict(g, 8, 2),
                                       **kw), randn(g, 2, 3, 8)

    def test_integer_masks_are_rejected(self):
        # torch.nn.MultiheadAttention: "only bool and floating types of key_padding_mask are
        # supported". A Hugging Face attention_mask (1 = keep) must not be read as IGNORE.
        layer, x = self.layer()
        hf_keep = np.array([[1, 1, 0], [1, 0, 0]])
        for dtype in (np.int8, np.int32, np.int64, np.uint8):
            with self.subTest(dtype=np.dtype(dtype).name):
                with self.assertRaises(sdpa.SdpaDtypeError) as cm:
                    layer(x, x, x, key_padding_mask=hf_keep.astype(dtype))
                e = cm.exception
                self.assertIsInstance(e, TypeError)
                self.assertEqual(e.name, "SDPA_ERR_DTYPE")
                self.assertIn("key_padding_mask", e.message)
                self.assertIn("allow_from_keep_int", e.message)
                with self.assertRaises(sdpa.SdpaDtypeError) as cm:
                    layer(x, x, x, attn_mask=np.triu(np.ones((3, 3), dtype), 1))
                self.assertIn("attn_mask", cm.exception.message)
                self.assertIn("allow_from_keep_int", cm.exception.message)
                with self.assertRaises(sdpa.SdpaDtypeError):   # [B*H, L, S] too
                    layer(x, x, x, attn_mask=np.zeros((4, 3, 3), dtype))
        # unbatched input, and the conversions the message suggests
        with self.assertRaises(sdpa.SdpaDtypeError):
            layer(x[0], x[0], x[0], key_padding_mask=hf_keep[0])
        want, _ = layer(x, x, x, key_padding_mask=hf_keep == 0)
        got, _ = layer(x, x, x, key_padding_mask=~sdpa.allow_from_keep_int(hf_keep))
        np.testing.assert_array_equal(got, want)
        # bool and float32 masks still work
        layer(x, x, x, attn_mask=np.triu(np.ones((3, 3), bool), 1),
              key_padding_mask=np.zeros((2, 3), np.float32))

    def test_invalid_dropout_is_rejected_in_both_modes(self):
        # A probability outside [0, 1] (NaN included) is refused when the layer is built (it
        # used to construct and fail at the first call), and at a call in either mode when the
        # attribute was set later.
        for p in (-0.5, float("nan"), 1.5):
            with self.subTest(p=p), self.assertRaises(sdpa.SdpaArgumentError) as cm:
                self.layer(dropout=p)
            self.assertIn("dropout", cm.exception.message)
        for training in (True, False):
            layer, x = self.layer()
            layer.train(training)
            layer.dropout = -0.5
            with self.subTest(training=training), self.assertRaises(sdpa.SdpaArgumentError):
                layer(x, x, x)
            self.assertEqual(layer.dropout_offset, 0)
        # p = 1 is torch's valid "drop everything": eval mode ignores it (as torch, which used to
        # fail here); training refuses it (libsdpa's dropout_p is < 1) with a message saying so.
        layer, x = self.layer(dropout=1.0)
        y1, w1 = layer(x, x, x)
        y0, w0 = self.layer()[0](x, x, x)
        np.testing.assert_array_equal(y1, y0)
        np.testing.assert_array_equal(w1, w0)
        layer.train()
        with self.assertRaises(sdpa.SdpaArgumentError) as cm:
            layer(x, x, x)
        self.assertIn("dropout=1.0 when training", cm.exception.message)
        self.assertEqual(layer.dropout_offset, 0)
        # an attribute set after construction is checked the same way
        layer, x = self.layer()
        layer.train()
        layer.dropout = -0.5
        with self.assertRaises(sdpa.SdpaArgumentError):
            layer(x, x, x)
        layer.dropout = "0.5"
        with self.assertRaises(sdpa.SdpaDtypeError):
            layer(x, x, x)
        # valid values: eval mode ignores them bit for bit, p = 0 does not advance the offset
        layer.dropout = 0.0
        y0, _ = layer(x, x, x)
        self.assertEqual(layer.dropout_offset, 0)
        layer.dropout = 0.5
        layer.eval()
        np.testing.assert_array_equal(layer(x, x, x)[0], y0)
        self.assertEqual(layer.dropout_offset, 0)

    def test_shape_errors_name_the_axes_as_passed(self):
        # [L, B, E] inputs reach the library as [B, L, E] views: its messages named the
        # view's axes (key.shape[0] for the batch of a [S, B, kdim] key).
        g = ref.rng(22)
        layer = sdpa.MultiheadAttention(8, 2, state_dict=make_state_dict(g, 8, 2))
        q = np.zeros((4, 2, 8), np.float32)
        cases = [((q, np.zeros((6, 1, 8), np.float32), np.zeros((6, 1, 8), np.float32)),
                  "key.shape[1]=1 does not match query.shape[1]=2 (the batch B)"),
                 ((q, np.zeros((6, 2, 8), np.float32), np.zeros((5, 2, 8), np.float32)),
                  "value.shape[0]=5 does not match key.shape[0]=6 (the key count S)"),
                 ((q, np.zeros((6, 2, 8), np.float32), np.zeros((6, 3, 8), np.float32)),
                  "value.shape[1]=3 does not match key.shape[1]=2 (the batch B)"),
                 ((np.zeros((4, 2, 7), np.float32), q, q), "query.shape[2]=7 must be embed_dim=8")]
        for args, want in cases:
            with self.subTest(want=want), self.assertRaises(sdpa.SdpaShapeError) as cm:
                layer(*args)
            self.assertIn(want, cm.exception.message)
            self.assertIn("[S, B, kdim]", cm.exception.message)
        layer.batch_first = True
        with self.assertRaises(sdpa.SdpaShapeError) as cm:
            layer(np.zeros((2, 4, 8), np.float32), np.zeros((1, 6, 8), np.float32),
                  np.zeros((1, 6, 8), np.float32))
        self.assertIn("key.shape[0]=1 does not match query.shape[0]=2", cm.exception.message)
        with self.assertRaises(sdpa.SdpaShapeError) as cm:   # unbatched
            layer(np.zeros((4, 8), np.float32), np.zeros((6, 8), np.float32), np.zeros((5, 8), np.float32))
        self.assertIn("value.shape[0]=5 does not match key.shape[0]=6", cm.exception.message)

    def test_16_bit_float_masks(self):
        # A bfloat16 mask was refused as an integer mask (numpy carries it as int16), a float16
        # one failed in C naming options->attn_bias: both are widened to float32 (exact).
        layer, x = self.layer()
        am = np.triu(np.full((3, 3), -np.inf, np.float32), 1)
        am[0, 0] = -1.5
        kpm = np.array([[0, -2.0, 0], [0, 0, -np.inf]], np.float32)
        want = layer(x, x, x, attn_mask=am, key_padding_mask=kpm)
        bf = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16).view(BF16)  # exact here
        for conv in (lambda a: a.astype(np.float16), bf):
            got = layer(x, x, x, attn_mask=conv(am), key_padding_mask=conv(kpm))
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
        with self.assertRaises(sdpa.SdpaDtypeError) as cm:
            layer(x, x, x, attn_mask=am.astype(np.float64))
        self.assertIn("float32 (or float16/bfloat16)", cm.exception.message)

    def test_torch_constructor_keywords(self):
        g = ref.rng(23)
        sd = make_state_dict(g, 8, 2)
        for kw in ({"device": None}, {"device": "cpu"}, {"dtype": None}, {"dtype": np.float32},
                   {"dtype": "float32"}):
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                sdpa.MultiheadAttention(8, 2, state_dict=sd, **kw)
        with self.assertRaises(sdpa.SdpaError):
            sdpa.MultiheadAttention(8, 2, device="cuda")
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.MultiheadAttention(8, 2, dtype=np.float64)
        if torch is not None:
            sdpa.MultiheadAttention(8, 2, state_dict=sd, device=torch.device("cpu"), dtype=torch.float32)
            with self.assertRaises(sdpa.SdpaDtypeError):
                sdpa.MultiheadAttention(8, 2, dtype=torch.float16)

    def test_constructor_argument_types(self):
        g = ref.rng(21)
        sd = make_state_dict(g, 8, 2)
        with self.assertRaises(sdpa.SdpaDtypeError):
            sdpa.MultiheadAttention(8, 2, dropout="0.5")
        for kw in ({"embed_dim": 8.5}, {"num_heads": 2.0}, {"kdim": 8.5}, {"head_dim": 4.5},
                   {"num_kv_heads": 1.5}):
            args = {"embed_dim": 8, "num_heads": 2, **kw}
            with self.subTest(**kw), self.assertRaises(sdpa.SdpaDtypeError) as cm:
                sdpa.MultiheadAttention(args.pop("embed_dim"), args.pop("num_heads"), **args)
            self.assertIn("integer", cm.exception.message)
        layer = sdpa.MultiheadAttention(np.int64(8), np.int32(2), dropout=np.float32(0.25),
                                        state_dict=sd)
        self.assertEqual((layer.embed_dim, layer.num_heads, layer.dropout), (8, 2, 0.25))


def _torch():
    if "LD_PRELOAD" in os.environ and "asan" in os.environ["LD_PRELOAD"]:
        return None   # torch's own libraries are not meant to run under the ASan runtime
    try:
        import torch
    except Exception:  # noqa: BLE001 - torch is optional
        return None
    return torch


torch = _torch()


@unittest.skipIf(torch is None, "torch is not importable (optional check)")
class TorchTest(unittest.TestCase):
    def test_against_torch_module(self):
        torch.manual_seed(0)
        configs = [dict(embed_dim=8, num_heads=2),
                   dict(embed_dim=12, num_heads=3, kdim=5, vdim=7, add_bias_kv=True),
                   dict(embed_dim=8, num_heads=4, add_zero_attn=True, batch_first=True),
                   dict(embed_dim=8, num_heads=2, bias=False, batch_first=True)]
        for cfg in configs:
            with self.subTest(**cfg):
                m = torch.nn.MultiheadAttention(**cfg).eval()
                with torch.no_grad():
                    for p in m.parameters():
                        p.normal_(0, 0.3)
                sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
                layer = sdpa.MultiheadAttention(**cfg, state_dict=sd)
                B, L, S = 2, 4, 5
                bf = cfg.get("batch_first", False)
                E = cfg["embed_dim"]
                kd, vd = cfg.get("kdim", E), cfg.get("vdim", E)
                shp = (lambda n, d: (B, n, d)) if bf else (lambda n, d: (n, B, d))
                q = torch.randn(*shp(L, E))
                k = torch.randn(*shp(S, kd))
                v = torch.randn(*shp(S, vd))
                kpm = torch.zeros(B, S, dtype=torch.bool)
                kpm[1, 3:] = True
                am = torch.triu(torch.ones(L, S, dtype=torch.bool), 2)
                for avg in (True, False):
                    with torch.no_grad():
                        ty, tw = m(q, k, v, key_padding_mask=kpm, attn_mask=am,
                                   average_attn_weights=avg)
                    y, w = layer(q.numpy(), k.numpy(), v.numpy(), key_padding_mask=kpm.numpy(),
                                 attn_mask=am.numpy(), average_attn_weights=avg)
                    np.testing.assert_allclose(y, ty.numpy(), rtol=RTOL, atol=ATOL)
                    np.testing.assert_allclose(w, tw.numpy(), rtol=RTOL, atol=ATOL)

    def test_against_torch_sdpa(self):
        fn = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        g = ref.rng(11)
        q, k, v = randn(g, 2, 3, 4, 8), randn(g, 2, 3, 6, 8), randn(g, 2, 3, 6, 5)
        mask = g.random((2, 1, 4, 6)) < 0.7
        mask[..., 0] = True
        tq, tk, tv, tm = (torch.from_numpy(x) for x in (q, k, v, mask))
        if fn is not None:   # torch >= 2.0
            want = fn(tq, tk, tv, attn_mask=tm).numpy()
            want_c = fn(tq, tk, tv, is_causal=True).numpy()
        else:                # torch 1.13: the private predecessor, which returns the weights too
            priv = torch.nn.functional._scaled_dot_product_attention
            want = priv(tq, tk, tv, tm.expand(2, 3, 4, 6), 0.0, False, False)[0].numpy()
            want_c = priv(tq, tk, tv, None, 0.0, False, True)[0].numpy()
        np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                   want, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, k, v, causal=True),
                                   want_c, rtol=RTOL, atol=ATOL)


if __name__ == "__main__":
    unittest.main()
