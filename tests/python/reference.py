"""Independent float64 numpy references for the Python tests, and the golden fixture reader.

Written from the contract (DESIGN.md section 4, include/sdpa.h), not from the library: every
rule (causal alignment, window, lengths, GQA, softcap, empty rows) is spelled out explicitly.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(REPO, "tests", "golden")

# The package under test: PYTHONPATH (meson's python_env) or, run by hand, this checkout.
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))


class EmptyRow(Exception):
    """The reference found a non-padding row with no allowed key (policy "error")."""


def ref_sdpa(q, k, v, allow=None, bias=None, causal=False, scale=None, key_lengths=None,
             query_lengths=None, window=None, softcap=None, empty_rows="error",
             alignment="top_left", query_offsets=None):
    """(out, weights, lse) in float64. q [B,Hq,L,E] or [B,L,E]; allow: bool broadcastable to
    [B,Hq,L,S] ([B,L,S] for rank 3); bias likewise; causal: bool; alignment of the causal and
    window rules: "top_left" (p = i), "bottom_right" (p = i + S_b - L_b), "offsets"
    (p = i + query_offsets[b]); window (left, right) with -1/None = unbounded."""
    rank3 = q.ndim == 3
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if rank3:
        q, k, v = q[:, None], k[:, None], v[:, None]
        if allow is not None and np.ndim(allow) == 3:
            allow = np.asarray(allow)[:, None]
        if bias is not None and np.ndim(bias) == 3:
            bias = np.asarray(bias)[:, None]
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    kr = np.repeat(k, group, axis=1)   # query head h reads kv head h // group
    vr = np.repeat(v, group, axis=1)
    sc = 1.0 / np.sqrt(E) if scale is None else scale
    s = sc * np.einsum("bhle,bhse->bhls", q, kr)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.broadcast_to(np.asarray(bias, dtype=np.float64), s.shape)
    allowed = np.ones((B, Hq, L, S), dtype=bool)
    if allow is not None:
        allowed &= np.broadcast_to(np.asarray(allow) != 0, allowed.shape)
    if bias is not None:
        allowed &= np.broadcast_to(np.asarray(bias) != -np.inf, allowed.shape)
    kl = [S] * B if key_lengths is None else [int(x) for x in key_lengths]
    ql = [L] * B if query_lengths is None else [int(x) for x in query_lengths]
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    for b in range(B):
        allowed[b] &= (j < kl[b])
        if alignment == "offsets":
            p = i + int(query_offsets[b])
        elif alignment == "bottom_right":
            p = i + kl[b] - ql[b]
        else:
            p = i
        if causal:
            allowed[b] &= (j <= p)
        if window is not None:
            left, right = (-1 if w is None else w for w in window)
            if left >= 0:
                allowed[b] &= (j >= p - left)
            if right >= 0:
                allowed[b] &= (j <= p + right)
    out = np.zeros((B, Hq, L, v.shape[-1]))
    w = np.zeros((B, Hq, L, S))
    lse = np.full((B, Hq, L), -np.inf)
    for b in range(B):
        for h in range(Hq):
            for r in range(min(L, ql[b])):
                a = allowed[b, h, r]
                if not a.any():
                    if empty_rows == "error":
                        raise EmptyRow((b, h, r))
                    continue
                row = np.where(a, s[b, h, r], -np.inf)
                m = row[a].max()
                e = np.where(a, np.exp(row - m), 0.0)
                tot = e.sum()
                w[b, h, r] = e / tot
                lse[b, h, r] = m + np.log(tot)
                out[b, h, r] = w[b, h, r] @ vr[b, h]
    if rank3:
        return out[:, 0], w[:, 0], lse[:, 0]
    return out, w, lse


def ref_mha(sd, query, key, value, num_heads, *, num_kv_heads=None, head_dim=None,
            batch_first=True, add_zero_attn=False, key_padding_mask=None, attn_mask=None,
            is_causal=False, average_attn_weights=True):
    """(out, weights) of torch.nn.MultiheadAttention in eval mode, float64, from the contract.
    Masks in PyTorch MHA polarity (bool True = ignore; float additive)."""
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    q_in, k_in, v_in = f(query), f(key), f(value)
    if not batch_first:
        q_in, k_in, v_in = (x.transpose(1, 0, 2) for x in (q_in, k_in, v_in))
    B, L, E = q_in.shape
    S = k_in.shape[1]
    H = num_heads
    Hkv = num_kv_heads or H
    Dh = head_dim or E // H
    Dq, Dkv = H * Dh, Hkv * Dh
    if "in_proj_weight" in sd:
        w = f(sd["in_proj_weight"])
        wq, wk, wv = w[:Dq], w[Dq:Dq + Dkv], w[Dq + Dkv:]
    else:
        wq, wk, wv = f(sd["q_proj_weight"]), f(sd["k_proj_weight"]), f(sd["v_proj_weight"])
    if "in_proj_bias" in sd:
        bb = f(sd["in_proj_bias"])
        bq, bk, bv = bb[:Dq], bb[Dq:Dq + Dkv], bb[Dq + Dkv:]
    else:
        bq, bk, bv = np.zeros(Dq), np.zeros(Dkv), np.zeros(Dkv)
    qp = q_in @ wq.T + bq
    kp = k_in @ wk.T + bk
    vp = v_in @ wv.T + bv
    extra = 0
    if "bias_k" in sd:
        kp = np.concatenate([kp, np.broadcast_to(f(sd["bias_k"]).reshape(1, 1, Dkv), (B, 1, Dkv))], 1)
        vp = np.concatenate([vp, np.broadcast_to(f(sd["bias_v"]).reshape(1, 1, Dkv), (B, 1, Dkv))], 1)
        extra += 1
    if add_zero_attn:
        kp = np.concatenate([kp, np.zeros((B, 1, Dkv))], 1)
        vp = np.concatenate([vp, np.zeros((B, 1, Dkv))], 1)
        extra += 1
    S2 = S + extra
    qh = qp.reshape(B, L, H, Dh).transpose(0, 2, 1, 3)
    kh = kp.reshape(B, S2, Hkv, Dh).transpose(0, 2, 1, 3)
    vh = vp.reshape(B, S2, Hkv, Dh).transpose(0, 2, 1, 3)
    allow = np.ones((B, H, L, S2), dtype=bool)
    bias = np.zeros((B, H, L, S2))
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask)
        if kpm.dtype.kind == "f":
            bias[..., :S] += kpm[:, None, None, :]
        else:
            allow[..., :S] &= ~(kpm[:, None, None, :] != 0)
    if attn_mask is not None:
        am = np.asarray(attn_mask)
        if am.ndim == 3:
            am = am.reshape(B, H, L, S)
        if am.dtype.kind == "f":
            bias[..., :S] += am
        else:
            allow[..., :S] &= ~(am != 0)
    if is_causal:
        allow[..., :S] &= np.tril(np.ones((L, S), dtype=bool))
    out, w, _ = ref_sdpa(qh, kh, vh, allow=allow, bias=bias)
    concat = out.transpose(0, 2, 1, 3).reshape(B, L, Dq)
    y = concat @ f(sd["out_proj.weight"]).T
    if "out_proj.bias" in sd:
        y = y + f(sd["out_proj.bias"])
    if not batch_first:
        y = y.transpose(1, 0, 2)
    weights = w.mean(axis=1) if average_attn_weights else w
    return y, weights


# ------------------------------------------------------------------------------ golden fixtures

def golden_cases():
    """Names listed in tests/golden/index.json (format libsdpa-golden-1)."""
    with open(os.path.join(GOLDEN, "index.json"), encoding="utf-8") as fh:
        index = json.load(fh)
    if index.get("format") != "libsdpa-golden-1":
        raise ValueError(f"tests/golden/index.json: unknown format {index.get('format')!r}")
    return list(index["cases"])


def load_golden(name):
    """(manifest, {array name: numpy array}, {array name: entry}) of one golden case."""
    base = os.path.join(GOLDEN, name)
    with open(os.path.join(base, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    if manifest.get("format") != "libsdpa-golden-1":
        raise ValueError(f"{name}: unknown format {manifest.get('format')!r}")
    arrays, entries = {}, {}
    for entry in manifest["arrays"]:
        dtype = {"float32": "<f4", "uint8": "u1"}[entry["dtype"]]
        path = os.path.join(base, entry["file"])
        data = np.fromfile(path, dtype=dtype)
        shape = tuple(entry["shape"])
        if data.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: {data.size} elements, shape {shape}")
        arrays[entry["name"]] = data.reshape(shape).astype(dtype[1:] if dtype.startswith("<") else dtype)
        entries[entry["name"]] = entry
    return manifest, arrays, entries


def within(got, expected, rtol, atol):
    """|got - expected| <= atol + rtol * |expected| everywhere (the fixtures' rule); the worst
    violation as a string, or "" when it holds."""
    got = np.asarray(got, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return f"shape {got.shape} != {expected.shape}"
    err = np.abs(got - expected) - (atol + rtol * np.abs(expected))
    both_inf = np.isinf(got) & np.isinf(expected) & (np.sign(got) == np.sign(expected))
    err = np.where(both_inf, 0.0, err)
    if np.all(err <= 0):
        return ""
    at = np.unravel_index(np.nanargmax(np.where(np.isnan(err), np.inf, err)), err.shape)
    return f"at {tuple(int(x) for x in at)}: got {got[at]!r}, expected {expected[at]!r}"


def rng(seed):
    return np.random.default_rng(seed)


def randn(g, *shape):
    return g.standard_normal(shape).astype(np.float32)
