"""numpy arrays -> sdpa_tensor / sdpa_allow_mask views, without copying.

A view records the array's data address (element [0, ..., 0]), its shape and its strides
converted from bytes to elements. Nothing is copied, so the caller must keep the array alive
while the view is used: every function of the package holds its arrays in local variables for
the whole library call.

Policy: arrays the library reads are never copied. An array of another dtype (float64, float16,
a byte-swapped float32), a stride that is not a whole number of elements, or a misaligned
buffer raises SdpaDtypeError / SdpaShapeError instead of being converted silently; convert it
yourself (``np.asarray(x, dtype=np.float32)``) if a copy is what you want.
"""
import numpy as np

from ._errors import py_error
from ._lib import SDPA_DTYPE_F32, SDPA_MASK_MAX_RANK, SDPA_MAX_RANK, SdpaAllowMask, SdpaTensor

F32 = np.dtype(np.float32)
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.uint8))


def address(array):
    """Address of element [0, ..., 0] of a numpy array."""
    return array.__array_interface__["data"][0]


def _require_ndarray(array, name):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(array).__name__} "
                        f"(e.g. np.asarray({name}, dtype=np.float32))")


def tensor_view(array, name, writable=False):
    """An SdpaTensor over a float32 numpy array of any strides (negative and 0 included; the
    library accepts them on inputs). No copy."""
    _require_ndarray(array, name)
    if array.dtype != F32:
        raise py_error("SDPA_ERR_DTYPE",
                       f"{name}.dtype={array.dtype.str} ({array.dtype}), expected float32 in "
                       "native byte order; libsdpa computes float32 and this package never "
                       f"copies inputs: pass np.asarray({name}, dtype=np.float32)")
    if not 1 <= array.ndim <= SDPA_MAX_RANK:
        raise py_error("SDPA_ERR_RANK", f"{name}.ndim={array.ndim} is outside 1..{SDPA_MAX_RANK}")
    if writable and not array.flags.writeable:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name} is read-only")
    t = SdpaTensor()  # zero-filled: unused shape/stride entries and reserved[] are 0
    t.data = address(array) or None
    t.dtype = SDPA_DTYPE_F32
    t.rank = array.ndim
    _fill(t, array, name, 4)
    return t


def _fill(view, array, name, itemsize):
    if array.size and address(array) % itemsize:
        raise py_error("SDPA_ERR_STRIDE",
                       f"{name}: data address {address(array):#x} is not {itemsize}-byte aligned")
    for d, (size, stride) in enumerate(zip(array.shape, array.strides)):
        if stride % itemsize:
            raise py_error("SDPA_ERR_STRIDE",
                           f"{name}.strides[{d}]={stride} bytes is not a multiple of the element "
                           f"size {itemsize}")
        view.shape[d] = size
        view.strides[d] = stride // itemsize


def mask_view(array, name):
    """An SdpaAllowMask over a bool or uint8 numpy array (nonzero = allowed) of rank 1..4 and
    any strides. No copy."""
    _require_ndarray(array, name)
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


def int64_vector(values, length, name):
    """A contiguous int64 array of exactly `length` entries from a sequence of integers (these
    small per-batch arrays are converted, not viewed). The library reads `length` entries, so
    the count is checked here."""
    array = np.asarray(values)
    if array.dtype.kind not in "iub":
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            pass
        else:
            raise py_error("SDPA_ERR_DTYPE", f"{name} must hold integers, got dtype {array.dtype}")
    if array.ndim != 1 or array.shape[0] != length:
        raise py_error("SDPA_ERR_SHAPE",
                       f"{name} has shape {array.shape}, expected ({length},) (one per batch)")
    converted = np.ascontiguousarray(array, dtype=np.int64)
    if not np.array_equal(converted, array):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name} does not fit in int64")
    return converted


def uint64(value, name):
    value = int(value)
    if not 0 <= value < 2 ** 64:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}={value} must be in [0, 2**64)")
    return value


def int32(value, name, minimum=None):
    value = int(value)
    if not -2 ** 31 <= value < 2 ** 31 or (minimum is not None and value < minimum):
        low = -2 ** 31 if minimum is None else minimum
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}={value} must be in [{low}, 2**31)")
    return value


def int64(value, name):
    value = int(value)
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
