#!/usr/bin/env python3
"""Regenerate the PyTorch golden fixtures in tests/golden/ (see tests/golden/README.md).

Run by hand, not by CI:  /usr/bin/python3 tests/golden/make_torch_golden.py
Needs numpy and torch (Debian: python3-numpy, python3-torch; written against torch 1.13).
Every case seeds torch's generator itself, so a rerun with the same torch gives the same files.

Each case is a directory tests/golden/<case>/ holding manifest.json and one raw little-endian
file per array (float32, or uint8 for boolean masks), C order, no header.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

FORMAT = "libsdpa-golden-1"
HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class Case:
    def __init__(self, name, op, description, generator, seed):
        self.name = name
        self.op = op
        self.description = description
        self.generator = generator
        self.seed = seed
        self.params = {}
        self.arrays = []
        self.blobs = {}

    def add(self, name, role, tensor, polarity=None):
        """role: 'input', 'param' (layer weights) or 'expected'."""
        a = tensor.detach().cpu().numpy()
        if a.dtype == np.bool_:
            a = a.astype(np.uint8)
            dtype = "uint8"
        else:
            a = a.astype(np.float32)
            dtype = "float32"
        fname = name + ".bin"
        entry = {"name": name, "role": role, "dtype": dtype, "shape": list(a.shape), "file": fname}
        if polarity is not None:
            entry["polarity"] = polarity
        self.arrays.append(entry)
        # '<f4' / '|u1': little-endian whatever the host is.
        self.blobs[fname] = np.ascontiguousarray(a, dtype="<f4" if dtype == "float32" else "u1").tobytes()

    def write(self, root):
        d = os.path.join(root, self.name)
        os.makedirs(d, exist_ok=True)
        for old in os.listdir(d):
            if old.endswith(".bin") and old not in self.blobs:
                os.remove(os.path.join(d, old))
        for fname, blob in self.blobs.items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(blob)
        manifest = {
            "format": FORMAT,
            "name": self.name,
            "op": self.op,
            "description": self.description,
            "generator": {"torch": torch.__version__.split("+")[0], "function": self.generator,
                          "seed": self.seed, "script": "tests/golden/make_torch_golden.py"},
            "tolerance": TOLERANCE,
            "params": self.params,
            "arrays": self.arrays,
        }
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")


# ----------------------------------------------------------------- SDPA

def sdpa_case(name, description, seed, B, H, L, S, E, Ev, mask_kind):
    torch.manual_seed(seed)
    q = torch.randn(B, H, L, E)
    k = torch.randn(B, H, S, E)
    v = torch.randn(B, H, S, Ev)
    c = Case(name, "sdpa", description, "torch.nn.functional._scaled_dot_product_attention", seed)
    mask = None
    causal = mask_kind == "causal"
    if mask_kind == "bool":
        mask = torch.rand(B, H, L, S) < 0.6
        mask[..., 0] |= ~mask.any(-1)  # no empty row: PyTorch would give NaN there
    # torch 1.13: _scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, need_attn_weights,
    # is_causal); a bool attn_mask means True = attend; is_causal is top-left (tril).
    out, w = F._scaled_dot_product_attention(q, k, v, mask, 0.0, True, causal)
    c.params = {"layout": "BHLD", "is_causal": causal, "scale": None, "dropout_p": 0.0,
                "need_weights": True}
    c.add("query", "input", q)
    c.add("key", "input", k)
    c.add("value", "input", v)
    if mask is not None:
        c.add("attn_mask", "input", mask, polarity="allow")
    c.add("out", "expected", out)
    c.add("attn_weights", "expected", w)
    return c


# ------------------------------------------------------------------ MHA

def mha_case(name, description, seed, *, B, L, S, E, H, kdim=None, vdim=None, bias=True,
             add_bias_kv=False, add_zero_attn=False, batch_first=True, self_attention=False,
             key_padding=None, attn_mask=None, average=True, dropout=0.0):
    """key_padding: list of valid key counts per batch (right padding) or None.
    attn_mask: None, 'causal_bool' ([L, S] bool, True = ignore) or 'float' ([B*H, L, S] additive)."""
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(E, H, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                                      add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                      batch_first=batch_first)
    with torch.no_grad():  # non-zero biases so that every term is exercised
        for pname, p in mha.named_parameters():
            if "bias" in pname:
                p.copy_(torch.randn_like(p) * 0.5)
    mha.eval()
    kd = kdim if kdim is not None else E
    vd = vdim if vdim is not None else E

    def seq(n, width):
        return torch.randn(B, n, width) if batch_first else torch.randn(n, B, width)

    query = seq(L, E)
    if self_attention:
        key = value = query
    else:
        key = seq(S, kd)
        value = seq(S, vd)

    kpm = None
    if key_padding is not None:
        kpm = torch.zeros(B, S, dtype=torch.bool)
        for b, n in enumerate(key_padding):
            kpm[b, n:] = True  # PyTorch: True = padding (ignore)
    am = None
    if attn_mask == "causal_bool":
        am = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = ignore
    elif attn_mask == "float":
        am = torch.randn(B * H, L, S) * 0.5
        am[:, :, -1] = float("-inf")  # one blocked key in every row
        am[:, 0, 0] = float("-inf")

    with torch.no_grad():
        out, w = mha(query, key, value, key_padding_mask=kpm, need_weights=True, attn_mask=am,
                     average_attn_weights=average)

    c = Case(name, "mha", description, "torch.nn.MultiheadAttention", seed)
    c.params = {
        "embed_dim": E, "num_heads": H, "kdim": kd, "vdim": vd, "bias": bias,
        "add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn, "batch_first": batch_first,
        "self_attention": self_attention, "dropout": dropout, "training": False,
        "need_weights": True, "average_attn_weights": average,
    }
    c.add("query", "input", query)
    if not self_attention:
        c.add("key", "input", key)
        c.add("value", "input", value)
    if kpm is not None:
        c.add("key_padding_mask", "input", kpm, polarity="ignore")
    if am is not None:
        if am.dtype == torch.bool:
            c.add("attn_mask", "input", am, polarity="ignore")
        else:
            c.add("attn_mask", "input", am, polarity="additive")
    for pname, p in mha.state_dict().items():
        c.add(pname, "param", p)
    c.add("out", "expected", out)
    c.add("attn_weights", "expected", w)
    return c


def cases():
    return [
        sdpa_case("sdpa_bool_mask", "SDPA with a [B, H, L, S] bool attn_mask (True = attend)", 101,
                  B=2, H=2, L=3, S=5, E=4, Ev=6, mask_kind="bool"),
        sdpa_case("sdpa_causal", "SDPA with is_causal=True and L < S (top-left: query i sees keys j <= i)",
                  102, B=1, H=2, L=3, S=5, E=4, Ev=4, mask_kind="causal"),
        mha_case("mha_self_packed", "self-attention, packed in_proj_weight, head-averaged weights; "
                 "module built with dropout=0.1 but evaluated in eval mode (no dropout)", 201,
                 B=2, L=4, S=4, E=8, H=2, self_attention=True, dropout=0.1),
        mha_case("mha_cross_kdim_vdim_padding", "cross-attention with kdim=5, vdim=6 (separate "
                 "q/k/v_proj_weight) and a key_padding_mask (True = padding)", 202,
                 B=2, L=3, S=5, E=8, H=2, kdim=5, vdim=6, key_padding=[5, 3]),
        mha_case("mha_bias_kv_zero_attn", "add_bias_kv + add_zero_attn with a key_padding_mask and "
                 "a causal bool attn_mask (True = ignore); per-head weights over S + 2 keys", 203,
                 B=2, L=4, S=4, E=8, H=2, add_bias_kv=True, add_zero_attn=True,
                 key_padding=[4, 2], attn_mask="causal_bool", average=False),
        mha_case("mha_per_head_float_mask", "self-attention, per-head weights, float additive "
                 "attn_mask [B*H, L, S] with -inf entries", 204,
                 B=2, L=3, S=3, E=12, H=3, self_attention=True, attn_mask="float", average=False),
        mha_case("mha_no_bias", "bias=False (no in_proj_bias, no out_proj.bias), cross-attention",
                 205, B=2, L=3, S=4, E=8, H=4, bias=False),
        mha_case("mha_seq_first", "batch_first=False: query [L, B, E], key/value [S, B, E]", 206,
                 B=3, L=2, S=3, E=8, H=2, batch_first=False),
    ]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else HERE
    names = []
    for c in cases():
        c.write(root)
        names.append(c.name)
        print("wrote", os.path.join(root, c.name))
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"format": FORMAT, "cases": names}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
