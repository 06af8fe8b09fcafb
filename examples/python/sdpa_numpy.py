#!/usr/bin/env python3
"""Scaled dot-product attention on numpy arrays with the sdpa package.

    PYTHONPATH=python /usr/bin/python3 examples/python/sdpa_numpy.py

Shows: the causal 3x3 case; a batch in [B, L, H, E] (BSHD) buffers passed as [B, H, L, E] views
without copying, with grouped-query heads (GQA), causal masking and the log-sum-exp; splitting
the keys in two and merging the partial results (split-KV decode); and a readable error.
Exit status 1 if any number is wrong.
"""
import os
import sys

import numpy as np

try:
    import sdpa
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import sdpa


def reference(q, k, v, causal):
    """float64 attention over [B, H, L, E] with GQA, as the contract defines it."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return (e / e.sum(-1, keepdims=True)) @ v, (m + np.log(e.sum(-1, keepdims=True)))[..., 0]


def main():
    ok = True
    lib = sdpa.library()
    print(f"libsdpa {lib.version_string} from {lib.path} ({lib.origin})")

    # 1. Three tokens, zero queries and keys, causal: query i averages the values it may see.
    q = np.zeros((1, 1, 3, 4), np.float32)
    v = np.array([2, 4, 8], np.float32).reshape(1, 1, 3, 1)
    out = sdpa.scaled_dot_product_attention(q, q, v, causal=True)
    print("causal 3x3:", np.round(out[0, 0, :, 0], 4), "(expected [2. 3. 4.6667])")
    ok &= bool(np.allclose(out[0, 0, :, 0], [2, 3, 14 / 3], rtol=0, atol=1e-5))

    # 2. BSHD buffers, 8 query heads sharing 2 key/value heads, causal, with the lse.
    rng = np.random.default_rng(0)
    B, L, Hq, Hkv, E = 2, 6, 8, 2, 16
    q_bshd = rng.standard_normal((B, L, Hq, E), dtype=np.float32)
    k_bshd = rng.standard_normal((B, L, Hkv, E), dtype=np.float32)
    v_bshd = rng.standard_normal((B, L, Hkv, E), dtype=np.float32)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q_bshd, k_bshd, v_bshd))  # views, no copy
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, causal=True, need_lse=True)
    want, want_lse = reference(q, k, v, causal=True)
    err = max(np.abs(out - want).max(), np.abs(lse - want_lse).max())
    print(f"GQA causal on BSHD views: out {out.shape}, lse {lse.shape}, kernel "
          f"{sdpa.last_kernel()!r}, max error {err:.2e}")
    ok &= bool(err < 1e-4)

    # 3. Split the keys (e.g. a cached prefix and new tokens), attend to each part, merge.
    q1 = q[:, :, -1:]                                    # the last query (decode step)
    a, la = sdpa.scaled_dot_product_attention(q1, k[:, :, :4], v[:, :, :4], need_lse=True)
    b, lb = sdpa.scaled_dot_product_attention(q1, k[:, :, 4:], v[:, :, 4:], need_lse=True)
    merged, _ = sdpa.merge(a, la, b, lb)
    full = sdpa.scaled_dot_product_attention(q1, k, v)
    err = np.abs(merged - full).max()
    print(f"split-KV merge vs one pass: max difference {err:.2e}")
    ok &= bool(err < 1e-5)

    # 4. A mistake is reported with the status and the library's message.
    try:
        sdpa.scaled_dot_product_attention(q, k[..., :8], v)
        print("FAIL: the bad call succeeded")
        ok = False
    except sdpa.SdpaShapeError as e:
        print(f"bad call: {type(e).__name__}: {e}")
        ok &= e.name == "SDPA_ERR_SHAPE" and "does not match" in e.message
    try:
        sdpa.scaled_dot_product_attention(q.astype(np.float64), k, v)
        ok = False
    except sdpa.SdpaDtypeError as e:   # float64 is rejected, never silently copied
        print(f"float64 input: {type(e).__name__}: {e.message[:60]}...")

    print("sdpa_numpy: OK" if ok else "sdpa_numpy: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
