"""Allow-mask builders and polarity converters (the sdpa_mask_* functions of libsdpa).

An ALLOW-mask holds True (1) where the key may take part, False (0) where it is blocked:
PyTorch scaled_dot_product_attention's bool attn_mask polarity. Every function here returns a
new numpy bool array in that polarity (except allow_to_additive, which returns float32), and
names the polarity it reads: *ignore* masks (True = ignore: nn.MultiheadAttention's
key_padding_mask and bool attn_mask), *keep_int* masks (1 = keep: ONNX Runtime, Hugging Face
attention_mask), *additive* masks (0 / -inf floats).
"""
import ctypes

import numpy as np

from . import _lib
from ._arrays import as_numpy, kind_of
from ._errors import py_error
from ._views import address, choice, int64, int64_vector, mask_view, real
from .attention import ALIGNMENTS

__all__ = ["causal_allow_mask", "padding_allow_mask", "sliding_window_allow_mask",
           "block_diagonal_allow_mask", "prefix_lm_allow_mask", "allow_and", "allow_from_ignore",
           "allow_from_keep_int", "allow_from_additive", "allow_to_additive", "count_empty_rows",
           "PADDING_SIDES"]

#: sdpa_padding_side by name.
PADDING_SIDES = {"right": 0, "left": 1}


def _array(x, name):
    """A numpy array over x: torch tensors, __dlpack__ and __array_interface__ objects through
    _arrays.as_numpy (same memory); lists and scalars through np.asarray."""
    if isinstance(x, np.ndarray):
        return x
    if kind_of(x) == "torch" or hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__"):
        return as_numpy(x, name)
    return np.asarray(x)


def _alloc_bool(shape):
    for n in shape:
        if n < 0:
            raise py_error("SDPA_ERR_SHAPE", f"negative size in shape {tuple(shape)}")
    return np.zeros(tuple(int(n) for n in shape), dtype=np.bool_)


def causal_allow_mask(L, S=None, alignment="top_left"):
    """[L, S] allow-mask, True iff j <= p(i): p = i ("top_left", torch.tril) or i + S - L
    ("bottom_right"). S defaults to L."""
    lib = _lib.get()
    L = int64(L, "L")
    S = L if S is None else int64(S, "S")
    out = _alloc_bool((max(L, 0), max(S, 0)))
    lib.check(lib.sdpa_mask_causal(address(out), L, S, choice(alignment, _TWO_ALIGN, "alignment")))
    return out


_TWO_ALIGN = {k: ALIGNMENTS[k] for k in ("top_left", "bottom_right")}


def padding_allow_mask(lengths, N, side="right"):
    """[B, N] allow-mask from per-batch valid lengths: True iff position t is valid (t < length
    with side="right"; t >= N - length with side="left"). Use it as [B, 1, 1, S] for keys
    (``m[:, None, None, :]``) or [B, 1, L, 1] for queries."""
    lib = _lib.get()
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise py_error("SDPA_ERR_SHAPE", f"lengths must be 1-D, got shape {lengths.shape}")
    B = lengths.shape[0]
    lv = int64_vector(lengths, B, "lengths")
    N = int64(N, "N")
    out = _alloc_bool((B, max(N, 0)))
    lib.check(lib.sdpa_mask_padding(address(out), B, N, address(lv),
                                    choice(side, PADDING_SIDES, "side")))
    return out


def sliding_window_allow_mask(L, S, left, right, alignment="top_left"):
    """[L, S] allow-mask, True iff p - left <= j <= p + right (p aligned as in
    causal_allow_mask); None or -1 = unbounded on that side. Hugging Face sliding_window=W
    with causal is (W - 1, 0)."""
    lib = _lib.get()
    L, S = int64(L, "L"), int64(S, "S")
    left = -1 if left is None else int64(left, "left")
    right = -1 if right is None else int64(right, "right")
    out = _alloc_bool((max(L, 0), max(S, 0)))
    lib.check(lib.sdpa_mask_sliding_window(address(out), L, S, left, right,
                                           choice(alignment, _TWO_ALIGN, "alignment")))
    return out


def block_diagonal_allow_mask(cu_seqlens_q, cu_seqlens_k=None, causal=False,
                              alignment="top_left"):
    """[Lt, St] allow-mask for packed variable-length sequences (FlashAttention varlen):
    sequence n owns query rows cu_seqlens_q[n]..cu_seqlens_q[n+1]-1 and keys
    cu_seqlens_k[n]..cu_seqlens_k[n+1]-1 (cu_seqlens_k None = cu_seqlens_q); a query sees only
    its own sequence's keys, and with causal=True only those j <= p within the block.
    Lt = cu_seqlens_q[-1], St = cu_seqlens_k[-1]."""
    lib = _lib.get()
    cq = np.asarray(cu_seqlens_q)
    if cq.ndim != 1 or cq.shape[0] < 1:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"cu_seqlens_q must be 1-D with num_seqs + 1 >= 1 entries, got shape {cq.shape}")
    num_seqs = cq.shape[0] - 1
    cq = int64_vector(cq, num_seqs + 1, "cu_seqlens_q")
    ck = None
    if cu_seqlens_k is not None:
        ck = int64_vector(cu_seqlens_k, num_seqs + 1, "cu_seqlens_k")
    lt = int(cq[-1])
    st = int(ck[-1]) if ck is not None else lt
    out = _alloc_bool((max(lt, 0), max(st, 0)))
    lib.check(lib.sdpa_mask_block_diagonal(address(out), num_seqs, address(cq),
                                           None if ck is None else address(ck),
                                           1 if causal else 0,
                                           choice(alignment, _TWO_ALIGN, "alignment")))
    return out


def prefix_lm_allow_mask(T, prefix_length):
    """[T, T] allow-mask: True iff j < prefix_length (bidirectional prefix) or j <= i (causal
    rest), as T5/PaLM prefix-LM."""
    lib = _lib.get()
    T = int64(T, "T")
    out = _alloc_bool((max(T, 0), max(T, 0)))
    lib.check(lib.sdpa_mask_prefix_lm(address(out), T, int64(prefix_length, "prefix_length")))
    return out


def allow_and(a, b):
    """Logical AND of two allow-masks (bool/uint8, rank 1..4, any strides) with numpy
    broadcasting; a new bool array of the broadcast shape."""
    lib = _lib.get()
    a, b = _array(a, "a"), _array(b, "b")
    ma, mb = mask_view(a, "a"), mask_view(b, "b")
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise py_error("SDPA_ERR_BROADCAST",
                       f"shapes {a.shape} and {b.shape} do not broadcast") from None
    out = _alloc_bool(shape)
    shp = np.array(shape if shape else (1,), dtype=np.int64)
    lib.check(lib.sdpa_mask_and(ma, mb, address(out), len(shape), address(shp)))
    return out


def _flat_input(array, dtype, name):
    """A C-contiguous array of `dtype` with the values of `array` (a view when possible; the
    converters read n consecutive elements)."""
    return np.ascontiguousarray(array, dtype=dtype)


def _convert(lib, func, flat, out, *args):
    """Runs the element-wise converter func(src, n, *args, dst) of libsdpa over the flat.size
    values of `flat` into `out` (same size) and returns `out`."""
    lib.check(func(address(flat), flat.size, *args, address(out)))
    return out


def allow_from_ignore(ignore):
    """Allow-mask from an IGNORE mask (True/nonzero = do not attend: nn.MultiheadAttention
    key_padding_mask and bool attn_mask, torch.triu(ones, 1)): out = (ignore == 0).
    Accepts bool or integer arrays of any shape; returns a bool array of the same shape."""
    lib = _lib.get()
    src = _array(ignore, "ignore")
    if src.dtype == np.bool_ or src.dtype == np.uint8:
        flat = _flat_input(src, src.dtype, "ignore")
    elif src.dtype.kind in "iu":
        flat = (src != 0).astype(np.uint8)  # nonzero = ignore, whatever the width
    else:
        raise py_error("SDPA_ERR_DTYPE",
                       f"an ignore mask must be bool or integer, got {src.dtype} (a float mask "
                       "is additive: allow_from_additive())")
    return _convert(lib, lib.sdpa_mask_from_ignore, flat, _alloc_bool(src.shape))


def allow_from_keep_int(keep):
    """Allow-mask from a KEEP int mask (1 = attend, 0 = masked: ONNX Runtime mask_index,
    Hugging Face attention_mask). Values other than 0 and 1 raise SdpaArgumentError (a
    sequence length passed by mistake is caught). Any integer (or integral) dtype; returns a
    bool array of the same shape."""
    lib = _lib.get()
    src = _array(keep, "keep")
    if src.dtype.kind not in "iubf":
        raise py_error("SDPA_ERR_DTYPE", f"a keep mask must be integer, got {src.dtype}")
    if src.dtype.kind == "f" and src.size:
        # A NaN, an infinity or a fraction is reported before any cast (casting NaN to int32
        # would print numpy's "invalid value encountered in cast" RuntimeWarning first).
        values = src.reshape(-1)
        bad_at = np.flatnonzero(~((values == 0) | (values == 1)))
        if bad_at.size:
            bad = int(bad_at[0])
            raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                           f"allow_from_keep_int: keep[{bad}]={values[bad]!r} is neither 0 nor 1 "
                           "(lengths instead of a mask? see padding_allow_mask())")
    flat = _flat_input(src, np.int32, "keep")
    if src.dtype != np.int32 and not np.array_equal(flat, src):
        # Narrowing would hide a value like 2**32 + 1 or 0.5: report the first one here.
        bad = np.flatnonzero(flat.reshape(-1) != np.asarray(src).reshape(-1))[0]
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"allow_from_keep_int: keep[{bad}]={src.reshape(-1)[bad]!r} is neither 0 nor 1 "
                       "(lengths instead of a mask? see padding_allow_mask())")
    return _convert(lib, lib.sdpa_mask_from_keep_int, flat, _alloc_bool(src.shape))


def allow_from_additive(additive, threshold=None):
    """Allow-mask from an ADDITIVE float mask (0 = attend, -inf = masked: PyTorch/ONNX float
    attn_mask). Without threshold, any other value (finite non-zero, +inf, NaN) raises
    SdpaArgumentError: such a mask is a bias (pass it as bias=). With a threshold, values <=
    threshold are blocked (e.g. threshold=-1e4 for -1e9 style masks). Converted to float32."""
    lib = _lib.get()
    src = _array(additive, "additive")
    if src.dtype.kind != "f":
        raise py_error("SDPA_ERR_DTYPE", f"an additive mask must be floating point, got {src.dtype}")
    flat = _flat_input(src, np.float32, "additive")
    thr = None
    if threshold is not None:
        thr = ctypes.c_float(real(threshold, "threshold"))
    return _convert(lib, lib.sdpa_mask_from_additive, flat, _alloc_bool(src.shape),
                    None if thr is None else ctypes.addressof(thr))


def allow_to_additive(allow):
    """Additive float32 mask from an allow-mask: allowed -> 0.0, blocked -> -inf (what PyTorch
    and ONNX float masks mean). Same shape."""
    lib = _lib.get()
    src = _array(allow, "allow")
    if src.dtype != np.bool_ and src.dtype != np.uint8:
        raise py_error("SDPA_ERR_DTYPE", f"an allow-mask must be bool or uint8, got {src.dtype}")
    flat = _flat_input(src, src.dtype, "allow")
    return _convert(lib, lib.sdpa_mask_to_additive, flat, np.empty(src.shape, dtype=np.float32))


def count_empty_rows(allow, return_first=False):
    """Number of rows of an allow-mask (all axes but the last, which is the key axis) that allow
    no key: the rows that empty_rows="error" rejects. With return_first=True, return
    (count, index) where index is the row's index tuple (the mask's leading axes) of the first
    empty row, or None. Bool/uint8, rank 1..4, any strides (no copy)."""
    lib = _lib.get()
    m = mask_view(allow, "allow")
    count = ctypes.c_int64()
    first = ctypes.c_int64()
    lib.check(lib.sdpa_mask_count_empty_rows(m, ctypes.byref(count), ctypes.byref(first)))
    if not return_first:
        return count.value
    if first.value < 0:
        return count.value, None
    rows_shape = allow.shape[:-1]
    index = tuple(int(i) for i in np.unravel_index(first.value, rows_shape)) if rows_shape else ()
    return count.value, index
