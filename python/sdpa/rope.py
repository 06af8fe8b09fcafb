"""Rotary position embedding (sdpa_rope, libsdpa 0.6) over numpy arrays and torch CPU tensors."""
import ctypes

from . import _lib
from ._arrays import as_numpy, kind_of, new_array
from ._views import address, int64_vector, integer, real, tensor_view

__all__ = ["rope", "rope_params"]


def rope_params(rotary_dim=0, interleaved=False, cos=None, sin=None, theta=0.0):
    """An sdpa_rope_params and the views it points to (keep the returned tuple alive while the
    params are used): (params, keep). See :func:`rope` for the fields."""
    lib = _lib.get()
    p = _lib.SdpaRopeParams()
    lib.sdpa_rope_params_init_sized(ctypes.byref(p), ctypes.sizeof(p))
    p.rotary_dim = integer(rotary_dim, "rotary_dim")
    p.interleaved = 1 if interleaved is True else 0 if interleaved is False else integer(interleaved, "interleaved")
    p.theta = real(theta, "theta")
    keep = []
    if cos is not None:
        c = as_numpy(cos, "cos")
        tc = tensor_view(c, "cos")
        keep += [c, tc]
        p.cos = ctypes.pointer(tc)
    if sin is not None:
        s = as_numpy(sin, "sin")
        ts = tensor_view(s, "sin")
        keep += [s, ts]
        p.sin = ctypes.pointer(ts)
    return p, keep


def rope(x, positions, *, cos=None, sin=None, theta=0.0, rotary_dim=0, interleaved=False, out=None):
    """Rotate rows by RoPE (sdpa_rope): x [T, H, E] (float32 / float16 / bfloat16, any strides;
    a [B, L, H, E] query is ``x.reshape(B * L, H, E)``), positions: T integers (the position of
    each row). cos / sin: float32 tables [max_pos, rotary_dim / 2] (HF's / FlashAttention's
    cos/sin caches, one entry per pair), or None for theta (0 = 10000) with HF's float32 recipe.
    interleaved=False: GPT-NeoX / HF rotate_half pairs (i, i + rotary_dim/2); True: GPT-J pairs
    (2i, 2i + 1). rotary_dim 0 = E; the elements past rotary_dim are copied.
    out: None (a new array like x), or a writable array of x's shape (may be x itself: in place).
    Returns out."""
    lib = _lib.get()
    xa = as_numpy(x, "x")
    tx = tensor_view(xa, "x")
    if out is None:
        oa, result = new_array(xa.shape, xa.dtype, kind_of(x))
    else:
        oa = as_numpy(out, "out", writable=True)
        result = out
    to = tensor_view(oa, "out", writable=True)
    if xa.ndim != 3:  # the library names the rank; positions' length needs T
        p, keep = rope_params(rotary_dim, interleaved, cos, sin, theta)
        lib.check(lib.sdpa_rope(tx, to, None, ctypes.byref(p)))
    pos = int64_vector(positions, xa.shape[0], "positions", per="row of x (T)")
    p, keep = rope_params(rotary_dim, interleaved, cos, sin, theta)
    lib.check(lib.sdpa_rope(tx, to, address(pos) if pos.size else None, ctypes.byref(p)))
    del keep, pos
    return result
