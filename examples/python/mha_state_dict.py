#!/usr/bin/env python3
"""torch.nn.MultiheadAttention's weights in sdpa.MultiheadAttention.

    PYTHONPATH=python /usr/bin/python3 examples/python/mha_state_dict.py

A PyTorch layer's state_dict() (as numpy arrays) builds an sdpa.MultiheadAttention with the same
forward: same argument names, same mask polarity (bool True = IGNORE, as PyTorch's MHA), same
(attn_output, attn_weights) result. The weights and the expected outputs come from a golden
fixture that PyTorch computed (tests/golden/, no torch needed); when torch is importable, a fresh
torch layer is compared as well. Exit status 1 if a result differs.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import sdpa
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(REPO, "python"))
    import sdpa

RTOL, ATOL = 1e-4, 1e-5


def load_fixture(name):
    """Arrays of tests/golden/<name> (format libsdpa-golden-1: raw little-endian files)."""
    base = os.path.join(REPO, "tests", "golden", name)
    with open(os.path.join(base, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    arrays = {}
    for a in manifest["arrays"]:
        data = np.fromfile(os.path.join(base, a["file"]), dtype={"float32": "<f4", "uint8": "u1"}[a["dtype"]])
        arrays[a["name"]] = (a, data.reshape(a["shape"]))
    return manifest, arrays


def close(got, want):
    return bool(np.all(np.abs(got - want) <= ATOL + RTOL * np.abs(want)))


def from_fixture(name):
    manifest, arrays = load_fixture(name)
    p = manifest["params"]
    state_dict = {n: arr for n, (meta, arr) in arrays.items() if meta["role"] == "param"}
    layer = sdpa.MultiheadAttention.from_state_dict(state_dict, num_heads=p["num_heads"],
                                                    batch_first=p["batch_first"],
                                                    add_zero_attn=p["add_zero_attn"])
    query = arrays["query"][1]
    key = query if p["self_attention"] else arrays["key"][1]
    value = query if p["self_attention"] else arrays["value"][1]
    masks = {}
    for m in ("key_padding_mask", "attn_mask"):
        if m in arrays:
            meta, arr = arrays[m]
            # "ignore" masks are PyTorch MHA bool masks: passed as they are (True = ignore)
            masks[m] = arr.astype(bool) if meta.get("polarity") == "ignore" else arr
    out, weights = layer(query, key, value, average_attn_weights=p["average_attn_weights"], **masks)
    ok = close(out, arrays["out"][1]) and close(weights, arrays["attn_weights"][1])
    print(f"fixture {name}: {layer}, masks {sorted(masks) or 'none'}: "
          f"max |out - torch| = {np.abs(out - arrays['out'][1]).max():.1e} -> {'OK' if ok else 'DIFFERS'}")
    return ok


def from_torch(torch):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(embed_dim=16, num_heads=4, kdim=10, vdim=12).eval()
    with torch.no_grad():
        m.in_proj_bias.normal_()
        m.out_proj.bias.normal_()
    state_dict = {k: t.detach().numpy() for k, t in m.state_dict().items()}
    print("state_dict keys:", sorted(state_dict))
    layer = sdpa.MultiheadAttention(16, 4, kdim=10, vdim=12, state_dict=state_dict)
    L, S, B = 5, 7, 3                                     # batch_first=False: [L, B, E]
    q, k, v = torch.randn(L, B, 16), torch.randn(S, B, 10), torch.randn(S, B, 12)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[2, 5:] = True                                     # True = padding, ignored
    with torch.no_grad():
        want, want_w = m(q, k, v, key_padding_mask=kpm)
    out, weights = layer(q.numpy(), k.numpy(), v.numpy(), key_padding_mask=kpm.numpy())
    ok = close(out, want.numpy()) and close(weights, want_w.numpy())
    print(f"torch {torch.__version__} layer: max |out - torch| = "
          f"{np.abs(out - want.numpy()).max():.1e} -> {'OK' if ok else 'DIFFERS'}")
    return ok


def main():
    ok = all([from_fixture("mha_cross_kdim_vdim_padding"), from_fixture("mha_bias_kv_zero_attn")])
    torch = None
    if "asan" not in os.environ.get("LD_PRELOAD", ""):   # torch does not run under ASan
        try:
            import torch
        except Exception:  # noqa: BLE001 - torch is optional
            torch = None
    if torch is not None:
        ok = from_torch(torch) and ok
    else:
        print("torch not importable: compared with the golden fixtures only")
    print("mha_state_dict: OK" if ok else "mha_state_dict: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
