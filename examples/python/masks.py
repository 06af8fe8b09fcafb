#!/usr/bin/env python3
"""Masks and their polarity with the sdpa package.

    PYTHONPATH=python /usr/bin/python3 examples/python/masks.py

libsdpa takes ALLOW-masks: True = the key takes part (PyTorch scaled_dot_product_attention's bool
polarity). Other frameworks' masks are converted at the boundary by helpers that name the
polarity they read. This program builds the same "padded batch, causal" rule five ways and checks
that attention gives the same result each time. Exit status 1 if not.
"""
import os
import sys

import numpy as np

try:
    import sdpa
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import sdpa


def show(name, mask):
    rows = ["".join("x" if a else "." for a in row) for row in np.asarray(mask).reshape(-1, mask.shape[-1])]
    print(f"{name} {mask.shape} (x = attend):\n  " + "\n  ".join(rows))


def main():
    ok = True
    B, H, L, E = 2, 2, 4, 8
    lengths = [4, 3]                       # batch 1 has one padding key at the end
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, H, L, E), dtype=np.float32) for _ in range(3))

    causal = sdpa.causal_allow_mask(L)                            # [L, S], torch.tril
    padding = sdpa.padding_allow_mask(lengths, L)                 # [B, S], True = real token
    allow = sdpa.allow_and(causal, padding[:, None, None, :])     # [B, 1, L, S]
    show("causal_allow_mask", causal)
    show("padding_allow_mask", padding)

    # 1. The options themselves: causal=True and key_lengths.
    want = sdpa.scaled_dot_product_attention(q, k, v, causal=True, key_lengths=lengths)
    results = {}
    # 2. An allow-mask built from the helpers (bool True = attend, as torch SDPA).
    results["allow-mask"] = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=allow)
    # 3. nn.MultiheadAttention's polarity: True = IGNORE. Convert, never pass it as is.
    ignore = ~allow
    results["from ignore"] = sdpa.scaled_dot_product_attention(
        q, k, v, attn_mask=sdpa.allow_from_ignore(ignore))
    # 4. Hugging Face attention_mask / ONNX Runtime: int 1 = keep, 0 = padding.
    hf = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int64)
    keep = sdpa.allow_from_keep_int(hf)
    results["from keep_int"] = sdpa.scaled_dot_product_attention(
        q, k, v, attn_mask=keep[:, None, None, :], causal=True)
    # 5. A float mask is additive (0 = attend, -inf = blocked), as in PyTorch.
    additive = sdpa.allow_to_additive(allow)
    results["additive"] = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    ok &= bool(np.array_equal(sdpa.allow_from_additive(additive), allow))

    for name, got in results.items():
        err = float(np.abs(got - want).max())
        print(f"{name:>14}: max difference from causal=True + key_lengths = {err:.1e}")
        ok &= err < 1e-6

    # Passing an ignore-mask as if it were an allow-mask is the classic polarity bug: here it
    # blocks every key of the last query row, which libsdpa reports instead of returning NaN.
    try:
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=ignore)
        print("FAIL: an all-blocked row was not reported")
        ok = False
    except sdpa.SdpaValueError as e:
        print(f"ignore-mask passed as allow-mask: {e.name}: {e.message}")
    print("empty rows in ~allow:", sdpa.count_empty_rows(ignore, return_first=True))

    # Sliding window (Hugging Face sliding_window=W is (W - 1, 0) with causal) and prefix-LM.
    show("sliding_window_allow_mask(5, 5, 1, 0)", sdpa.sliding_window_allow_mask(5, 5, 1, 0))
    show("prefix_lm_allow_mask(5, 2)", sdpa.prefix_lm_allow_mask(5, 2))
    show("block_diagonal_allow_mask([0, 2, 5], causal=True)",
         sdpa.block_diagonal_allow_mask([0, 2, 5], causal=True))
    win = sdpa.scaled_dot_product_attention(q, k, v, causal=True, window=(1, 0))
    win_mask = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=sdpa.sliding_window_allow_mask(L, L, 1, 0))
    ok &= bool(np.abs(win - win_mask).max() < 1e-6)

    print("masks: OK" if ok else "masks: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
