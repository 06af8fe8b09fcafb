"""numpy arrays -> sdpa_tensor / sdpa_allow_mask views, without copying.

A view records the array's data address (element [0, ..., 0]), its shape and its strides
converted from bytes to elements. Nothing is copied, so the caller must keep the array alive
while the view is used: every function of the package holds its arrays in local variables for
the whole library call.

Policy: arrays the library reads are never copied or converted. float32, float16 and bfloat16
(torch) arrays are passed with their dtype; the library's status says whether it computes with
it. An array of another dtype (float64, a byte-swapped float32), a stride that is not a whole number of elements, or a misaligned
buffer raises SdpaDtypeError / SdpaShapeError instead of being converted silently; convert it
yourself (``np.asarray(x, dtype=np.float32)``) if a copy is what you want. Per-head parameters
(sinks, ALiBi slopes) follow the same rule (float32, never rounded). Small integer metadata is
converted exactly instead, after a range check: per-batch lengths and offsets to int64; index
tables (block_table, cu_seqlens) are viewed when they are int32 with a contiguous last axis (as
engines keep them) and converted to int32 otherwise.
"""
import ctypes
import numbers
import operator

import numpy as np

from ._arrays import as_numpy, is_bf16, kind_of
from ._errors import py_error
from ._lib import (SDPA_DTYPE_BF16, SDPA_DTYPE_F16, SDPA_DTYPE_F32, SDPA_DTYPE_FP8_E4M3,
                   SDPA_DTYPE_FP8_E5M2, SDPA_DTYPE_Q8_0, SDPA_MASK_MAX_RANK, SDPA_MAX_RANK,
                   SdpaAllowMask, SdpaTensor)

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))


def address(array):
    """Address of element [0, ..., 0] of a numpy array."""
    return array.__array_interface__["data"][0]


def sdpa_dtype(dtype):
    """The sdpa_dtype of a numpy dtype (float32, float16, or BF16 for torch bfloat16), or None.
    The package maps storage types only: whether the library computes with one is its answer
    (SDPA_ERR_DTYPE from a library without it)."""
    if is_bf16(dtype):
        return SDPA_DTYPE_BF16
    if dtype == F32:
        return SDPA_DTYPE_F32
    if dtype == F16:
        return SDPA_DTYPE_F16
    return None


def tensor_view(array, name, writable=False, origin=None, float32_only=None):
    """An SdpaTensor over an array (numpy, torch CPU tensor, __dlpack__ or __array_interface__
    object; see _arrays) of float32, float16 or bfloat16 and any strides (negative and 0
    included; the library accepts them on inputs). No copy, no conversion.
    For the error hint of an unsupported dtype: origin = kind_of() of the caller's object when
    `array` is already its numpy view ("torch": the hint is ``.float()``, which keeps a tensor),
    float32_only = the name of a function that computes float32 only (sdpa_merge,
    sdpa_mha_forward: the hint does not offer float16/bfloat16). The library still answers for
    a float16/bfloat16 view there (its status and message)."""
    if origin is None:
        origin = kind_of(array)
    array = as_numpy(array, name, writable)
    code = sdpa_dtype(array.dtype)
    if code is None:
        if origin == "torch":
            shown = f"torch.{array.dtype}"
            hint = f"{name}.float()"
        else:
            shown = f"{array.dtype.str} ({array.dtype})"
            if array.dtype.kind == "f" and array.dtype.itemsize in (2, 4) and not array.dtype.isnative:
                hint = f"{name}.astype({name}.dtype.newbyteorder('='))"  # same dtype, native order
            else:
                hint = f"np.asarray({name}, dtype=np.float32)"
        expected = (f"float32 ({float32_only} computes float32 only)" if float32_only else
                    "float32, float16 or bfloat16")
        if origin != "torch":
            expected += " in native byte order"
        raise py_error("SDPA_ERR_DTYPE",
                       f"{name}.dtype={shown}, expected {expected}; this package never converts "
                       f"or copies inputs: pass {hint}")
    if not 1 <= array.ndim <= SDPA_MAX_RANK:
        raise py_error("SDPA_ERR_RANK", f"{name}.ndim={array.ndim} is outside 1..{SDPA_MAX_RANK}")
    if writable and not array.flags.writeable:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name} is read-only")
    t = SdpaTensor()  # zero-filled: unused shape/stride entries and reserved[] are 0
    t.data = address(array) or None
    t.dtype = code
    t.rank = array.ndim
    _fill(t, array, name, array.dtype.itemsize)
    return t


def _fill(view, array, name, itemsize):
    if array.size and address(array) % itemsize:
        raise py_error("SDPA_ERR_ALIGNMENT",
                       f"{name}: data address {address(array):#x} is not {itemsize}-byte aligned")
    for d, (size, stride) in enumerate(zip(array.shape, array.strides)):
        if stride % itemsize:
            raise py_error("SDPA_ERR_STRIDE",
                           f"{name}.strides[{d}]={stride} bytes is not a multiple of the element "
                           f"size {itemsize}")
        view.shape[d] = size
        view.strides[d] = stride // itemsize


#: The 8-bit K/V cache dtypes (0.6) by name: their stored bytes come as uint8 (or int8) arrays.
KV8_DTYPES = {"q8_0": SDPA_DTYPE_Q8_0, "fp8_e4m3": SDPA_DTYPE_FP8_E4M3, "fp8_e5m2": SDPA_DTYPE_FP8_E5M2}
Q8_0_BLOCK, Q8_0_BLOCK_BYTES = 32, 34


def kv8_view(array, name, kind):
    """An SdpaTensor over the stored bytes of an 8-bit K/V cache (libsdpa 0.6): `array` is a
    uint8 (or int8) array of any strides, `kind` one of KV8_DTYPES. FP8: one byte per element,
    shape and strides as they are. q8_0 (ggml block_q8_0): the last axis holds whole 34-byte
    blocks (length a multiple of 34, contiguous: stride 1 byte), so a [..., E / 32 * 34] array
    is the view [..., E] whose strides count blocks (every other stride a multiple of 34
    bytes). No copy."""
    if kind not in KV8_DTYPES:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name}_dtype={kind!r} is not one of {sorted(KV8_DTYPES)}")
    array = as_numpy(array, name)
    if array.dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise py_error("SDPA_ERR_DTYPE", f"{name} with {name[0]}_dtype={kind!r} must be the cache's "
                       f"bytes as a uint8 array, got {array.dtype}")
    if not 1 <= array.ndim <= SDPA_MAX_RANK:
        raise py_error("SDPA_ERR_RANK", f"{name}.ndim={array.ndim} is outside 1..{SDPA_MAX_RANK}")
    t = SdpaTensor()
    t.data = address(array) or None
    t.dtype = KV8_DTYPES[kind]
    t.rank = array.ndim
    if kind != "q8_0":
        _fill(t, array, name, 1)
        return t
    last = array.shape[-1]
    if last % Q8_0_BLOCK_BYTES:
        raise py_error("SDPA_ERR_SHAPE", f"{name}: a q8_0 cache's last axis holds 34-byte blocks "
                       f"(ggml block_q8_0), its length {last} is not a multiple of 34")
    if array.size and array.strides[-1] != 1 and last > 1:
        raise py_error("SDPA_ERR_STRIDE", f"{name}: a q8_0 cache's last axis must be contiguous "
                       f"bytes (stride {array.strides[-1]})")
    if array.size and address(array) % 2:
        raise py_error("SDPA_ERR_ALIGNMENT", f"{name}: data address {address(array):#x} is not "
                       "2-byte aligned (a q8_0 block starts with its f16 scale)")
    for d in range(array.ndim - 1):
        stride = array.strides[d]
        if stride % Q8_0_BLOCK_BYTES and array.shape[d] > 1:
            raise py_error("SDPA_ERR_STRIDE", f"{name}.strides[{d}]={stride} bytes is not a whole "
                           "number of 34-byte q8_0 blocks")
        t.shape[d] = array.shape[d]
        t.strides[d] = stride // Q8_0_BLOCK_BYTES
    t.shape[array.ndim - 1] = last // Q8_0_BLOCK_BYTES * Q8_0_BLOCK
    t.strides[array.ndim - 1] = 1
    return t


def kv8_width(array, kind):
    """Elements of the last axis of an 8-bit cache's bytes (q8_0: 32 per 34 bytes)."""
    last = array.shape[-1]
    return last // Q8_0_BLOCK_BYTES * Q8_0_BLOCK if kind == "q8_0" else last


def mask_view(array, name):
    """An SdpaAllowMask over a bool or uint8 numpy array (nonzero = allowed) of rank 1..4 and
    any strides (numpy, torch CPU tensor, or another array; see _arrays). No copy."""
    array = as_numpy(array, name)
    if array.dtype not in _MASK_DTYPES:
        if array.dtype.kind == "f":
            hint = ("a float mask is additive: pass it as bias= (or attn_mask= to "
                    "scaled_dot_product_attention), or convert it with allow_from_additive()")
        else:
            hint = ("an integer keep-mask (1 = keep) converts with allow_from_keep_int(), an "
                    "ignore-mask (True = ignore) with allow_from_ignore()")
        raise py_error("SDPA_ERR_DTYPE",
                       f"{name}.dtype={array.dtype}, expected bool or uint8 (nonzero = the key "
                       f"takes part); {hint}")
    if not 1 <= array.ndim <= SDPA_MASK_MAX_RANK:
        raise py_error("SDPA_ERR_RANK",
                       f"{name}.ndim={array.ndim} is outside 1..{SDPA_MASK_MAX_RANK}")
    m = SdpaAllowMask()
    m.data = address(array) or None
    m.rank = array.ndim
    _fill(m, array, name, 1)
    return m


def is_additive(mask, name):
    """True when a mask array is additive (floating point: float32, float16 or bfloat16, passed
    to the library as a bias of that dtype); another float dtype raises SdpaDtypeError. False
    for a bool/integer mask."""
    if not (mask.dtype.kind == "f" or is_bf16(mask.dtype)):
        return False
    if sdpa_dtype(mask.dtype) is None:
        raise py_error("SDPA_ERR_DTYPE", f"a float {name} must be float32 (or float16/bfloat16), "
                       f"got {mask.dtype}")
    return True


def attach_view(opt, field, make_view, array, name):
    """Sets the pointer field `field` of the options struct `opt` to a view make_view(array,
    name) (tensor_view or mask_view) and returns the view, which the caller keeps alive for
    the library call; leaves the field alone and returns None when array is None."""
    if array is None:
        return None
    view = make_view(array, name)
    setattr(opt, field, ctypes.addressof(view))
    return view


_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def integer_array(values, name):
    """A numpy array of integers from an integer array (numpy, torch tensor, __dlpack__ or
    __array_interface__ object) or a (nested) Python sequence of ints: the one rule of both
    integer-metadata converters (int64_vector, int32_table), as integer() is for scalars.
    Bools (also inside a list: numpy would read [True, 2] as [1, 2]), floats (even 3.0),
    bfloat16 and strings raise SdpaDtypeError; ragged sequences SdpaShapeError. A Python
    sequence gives an object array of its ints (numpy would turn [0, 2**63] into floats): the
    callers range-check before converting."""
    try:
        array = as_numpy(values, name)  # numpy, torch, __dlpack__, __array_interface__: a view
    except TypeError:                    # a Python sequence (or scalar): an array of its items
        try:
            array = np.asarray(values, dtype=object)
        except (ValueError, TypeError) as e:
            raise py_error("SDPA_ERR_SHAPE", f"{name} is not a rectangular array of integers "
                           f"(rows of different lengths?): {e}") from None
        if any(isinstance(x, (list, tuple, np.ndarray)) for x in array.reshape(-1).tolist()):
            raise py_error("SDPA_ERR_SHAPE", f"{name} is not a rectangular array of integers "
                           f"(rows of different lengths)")
    if array.dtype.kind == "O":          # every item must be an int (not a bool)
        bad = [x for x in array.reshape(-1).tolist() if not _is_int(x)][:1]
        if not bad:
            return array
        raise py_error("SDPA_ERR_DTYPE", f"{name} must hold integers, got {bad[0]!r} "
                       f"({type(bad[0]).__name__}; bools and floats, even integral ones, are "
                       f"not converted)")
    if array.dtype.kind in "iu" and not is_bf16(array.dtype):
        return array
    shown = "bfloat16" if is_bf16(array.dtype) else str(array.dtype)
    raise py_error("SDPA_ERR_DTYPE", f"{name} must hold integers (int32 or int64), got dtype "
                   f"{shown} (bools and floats, even integral ones, are not converted)")


def _check_range(array, low, high, name, status, type_name):
    """Raises `status` when an integer array holds a value outside [low, high] (checked before
    a cast, so nothing wraps and numpy warns nothing)."""
    if not array.size:
        return
    if array.dtype.kind == "O":
        values = [int(x) for x in array.reshape(-1).tolist()]
        lo, hi = min(values), max(values)
    else:
        lo, hi = int(array.min()), int(array.max())
    if lo < low or hi > high:
        bad = hi if hi > high else lo
        raise py_error(status, f"{name} holds {bad}, which does not fit in {type_name}")


def _as_integers(array, dtype):
    if array.dtype.kind == "O":
        return np.array([int(x) for x in array.reshape(-1).tolist()], dtype=dtype).reshape(array.shape)
    return np.ascontiguousarray(array, dtype=dtype)


def int64_vector(values, length, name, per="batch"):
    """A contiguous int64 array of exactly `length` entries from integers (integer_array's rule;
    these small per-batch arrays are converted, not viewed). The library reads `length`
    entries, so the count is checked here ("one per {per}" in the message). The range is
    checked before the cast: an out-of-range value raises SdpaArgumentError."""
    array = integer_array(values, name)
    if array.ndim != 1 or array.shape[0] != length:
        raise py_error("SDPA_ERR_SHAPE",
                       f"{name} has shape {array.shape}, expected ({length},) (one per {per})")
    _check_range(array, _INT64_MIN, _INT64_MAX, name, "SDPA_ERR_INVALID_ARGUMENT", "int64")
    return _as_integers(array, np.int64)


def attach_vector(opt, field, values, length, name, per="batch"):
    """Sets the pointer field `field` of the options struct `opt` to int64_vector(values,
    length, name) and returns that array, which the caller keeps alive for the library call;
    leaves the field alone and returns None when values is None."""
    if values is None:
        return None
    array = int64_vector(values, length, name, per)
    setattr(opt, field, address(array))
    return array


def integer(value, name):
    """A Python int from an int or numpy integer (0-d integer arrays too). Floats, even 3.0,
    bools and strings raise SdpaDtypeError, as numpy rejects np.zeros(3.5): a size, length,
    window side or offset of 3.5 is a mistake, not 3."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise py_error("SDPA_ERR_DTYPE",
                   f"{name}={value!r} must be an integer (int or numpy integer), got "
                   f"{type(value).__name__}")


def real(value, name):
    """A Python float from an int, float or numpy integer/floating scalar (0-d arrays too).
    Strings, bytes, bools and other objects raise SdpaDtypeError (float('0.5') would parse a
    string). The range is left to the library (NaN and inf pass through to be rejected there
    with its message)."""
    if isinstance(value, (numbers.Real, np.ndarray)) and not isinstance(value, (bool, np.bool_)):
        array = np.asarray(value)
        if array.ndim == 0 and array.dtype.kind in "iuf":
            return float(array)
    raise py_error("SDPA_ERR_DTYPE",
                   f"{name}={value!r} must be a real number (int, float or numpy scalar), got "
                   f"{type(value).__name__}")


def uint64(value, name):
    value = integer(value, name)
    if not 0 <= value < 2 ** 64:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}={value} must be in [0, 2**64)")
    return value


def int32(value, name, minimum=None):
    value = integer(value, name)
    if not -2 ** 31 <= value < 2 ** 31 or (minimum is not None and value < minimum):
        low = -2 ** 31 if minimum is None else minimum
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}={value} must be in [{low}, 2**31)")
    return value


def int64(value, name):
    value = integer(value, name)
    if not -2 ** 63 <= value < 2 ** 63:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}={value} does not fit in int64")
    return value


def choice(value, table, name):
    """The enum value of a name in `table` (e.g. "top_left" -> 0)."""
    if isinstance(value, str) and value in table:
        return table[value]
    raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                   f"{name}={value!r} is not one of " + ", ".join(repr(k) for k in table))


def split_axis(array, axis, sizes):
    """A view of `array` whose `axis` is split into `sizes` (row-major), always without copying
    (splitting one axis never needs a copy, whatever its stride)."""
    n = array.shape[axis]
    if int(np.prod(sizes)) != n:
        raise py_error("SDPA_ERR_SHAPE",
                       f"cannot split axis {axis} of size {n} into {tuple(sizes)}")
    stride = array.strides[axis]
    new_strides = []
    acc = stride
    for s in reversed(sizes):
        new_strides.insert(0, acc)
        acc *= s
    shape = array.shape[:axis] + tuple(sizes) + array.shape[axis + 1:]
    strides = array.strides[:axis] + tuple(new_strides) + array.strides[axis + 1:]
    return np.lib.stride_tricks.as_strided(array, shape=shape, strides=strides,
                                           writeable=False)


I32 = np.dtype(np.int32)
_INT32_MIN, _INT32_MAX = -2 ** 31, 2 ** 31 - 1


def float32_vector(values, name, ndims=(1,), origin="numpy"):
    """A C-contiguous float32 numpy view of a per-head parameter array (sinks, ALiBi slopes:
    numpy array, torch tensor or other array of rank in `ndims`), never converted: a float32
    value is passed as is, and another dtype raises SdpaDtypeError (rounding a float64 slope
    to float32 would change it silently; FlashAttention also requires fp32 alibi_slopes). A
    non-contiguous array raises SdpaShapeError (the library reads it as a flat vector)."""
    if isinstance(values, (list, tuple)):
        raise py_error("SDPA_ERR_DTYPE",
                       f"{name} must be a float32 array, got a {type(values).__name__}: pass "
                       f"np.asarray({name}, dtype=np.float32)")
    array = as_numpy(values, name)
    torch = origin == "torch"
    if array.dtype != F32:
        shown = "bfloat16" if is_bf16(array.dtype) else array.dtype
        hint = f"{name}.float()" if torch else f"np.asarray({name}, dtype=np.float32)"
        raise py_error("SDPA_ERR_DTYPE",
                       f"{name}.dtype={shown}, expected float32 (per-head parameters are "
                       f"never converted): pass {hint}")
    if array.ndim not in ndims:
        raise py_error("SDPA_ERR_RANK", f"{name}.ndim={array.ndim}, expected "
                       + " or ".join(str(n) for n in ndims))
    if not array.flags.c_contiguous or (array.size and address(array) % 4):
        hint = f"{name}.contiguous()" if torch else f"np.ascontiguousarray({name})"
        raise py_error("SDPA_ERR_STRIDE", f"{name} must be C-contiguous (the library reads it "
                       f"as a flat float32 vector): pass {hint}")
    return array


def int32_table(values, name, ndim):
    """(array, row stride in elements) of an int32 index array of rank `ndim` (1: cu_seqlens,
    2: a block table). An int32 array whose last axis is contiguous (rows at a non-negative
    stride) is viewed, as engines keep these tables (vLLM and FlashAttention use int32
    tensors); other integer arrays and Python sequences are converted exactly, after a range
    check (integer_array's rule, as key_lengths). Every entry must fit in int32, reached by a
    key or not."""
    array = integer_array(values, name)
    if array.ndim != ndim:
        raise py_error("SDPA_ERR_RANK", f"{name}.ndim={array.ndim}, expected {ndim}")
    if array.dtype == I32 and array.dtype.isnative:
        item = array.strides[-1] if array.shape[-1] > 1 else 4
        row = array.strides[0] if ndim == 2 and array.shape[0] > 1 else 4 * array.shape[-1]
        if item == 4 and row >= 0 and row % 4 == 0 and (row > 0 or array.shape[0] <= 1) and \
                (array.size == 0 or address(array) % 4 == 0):
            return array, (row // 4 if ndim == 2 else 1)
    _check_range(array, _INT32_MIN, _INT32_MAX, name, "SDPA_ERR_INDEX", "int32")
    array = _as_integers(array, I32)
    return array, (array.shape[-1] if ndim == 2 else 1)


_ONE_INT32 = np.zeros(1, dtype=I32)


def table_address(array):
    """Address of an index table or per-head vector for an options pointer field: never NULL,
    even for an empty array (a torch or DLPack view of nothing may have address 0), because
    NULL means "feature off" to the library: an empty block table must still select the paged
    cache (and be rejected or serve an empty batch), not be dropped."""
    return address(array) or address(_ONE_INT32)
