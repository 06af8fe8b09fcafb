"""Array-likes -> numpy views of the same memory, and results in the caller's array type.

libsdpa reads and writes memory through strided views; this module turns what a caller passes
into a numpy array over the SAME memory (never a copy), so one code path (_views) builds the
C views:

- numpy.ndarray: as is;
- torch CPU tensors (duck-typed: torch is never imported here), any strides: float32 and
  float16 through ``Tensor.numpy()``; bfloat16, which numpy has no type for, through a view of
  the same bytes as int16 tagged BF16 (below);
- any other object with ``__dlpack__`` (a CPU DLPack tensor; the capsule is read with ctypes,
  not consumed, and kept alive with the array);
- any object with ``__array_interface__`` (``numpy.asarray``, which does not copy it).

BF16 is numpy's int16 dtype carrying the metadata {"sdpa_dtype": "bfloat16"}; numpy keeps the
metadata through views (transpose, slicing), so _views maps such an array to SDPA_DTYPE_BF16.

Results: the package returns numpy arrays unless the caller's arrays are torch tensors, then
torch tensors over the same memory (new outputs are allocated by torch). An ``out=`` argument
is returned as given, whatever its type.
"""
import ctypes
import sys

import numpy as np

from ._errors import py_error

__all__ = ["BF16", "is_bf16", "as_numpy", "kind_of", "new_array", "wrap", "ARRAY_TYPES_HINT"]

#: numpy dtype standing for bfloat16 storage (int16 with metadata; see the module docstring).
BF16 = np.dtype(np.int16, metadata={"sdpa_dtype": "bfloat16"})

ARRAY_TYPES_HINT = ("a numpy.ndarray, a torch CPU tensor, or an object with __dlpack__ or "
                    "__array_interface__")


def is_bf16(dtype):
    return dtype.metadata is not None and dtype.metadata.get("sdpa_dtype") == "bfloat16"


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def kind_of(obj):
    """"torch" for a torch tensor, "numpy" for anything else (results follow it)."""
    return "torch" if _is_torch_tensor(obj) else "numpy"


def _from_torch(t, name, writable):
    if t.device.type != "cpu":
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name} is on {t.device}; libsdpa computes on the CPU (pass {name}.cpu())")
    if writable and t.requires_grad:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name} requires grad; libsdpa writes outputs outside autograd "
                       f"(pass {name}.detach() or allocate it under torch.no_grad())")
    if t.is_conj() or t.is_neg():
        raise py_error("SDPA_ERR_DTYPE", f"{name} has a lazy conjugate/negation bit "
                       "(call .resolve_conj() / .resolve_neg() first)")
    torch = sys.modules["torch"]
    t = t.detach()  # same memory; only drops the autograd record for reading
    if t.dtype == torch.bfloat16:
        array = t.view(torch.int16).numpy().view(BF16)
    else:
        try:
            array = t.numpy()
        except (TypeError, RuntimeError) as e:
            raise py_error("SDPA_ERR_DTYPE", f"{name}.dtype={t.dtype} has no numpy view ({e}); "
                           "libsdpa takes float32, float16 and bfloat16") from None
    if t.numel() and array.__array_interface__["data"][0] != t.data_ptr():
        raise py_error("SDPA_ERR_INTERNAL", f"{name}: numpy view of the tensor moved its data")
    return array


# ------------------------------------------------------------------------------ DLPack
# include/dlpack/dlpack.h (v0.x/1.0 DLTensor layout, unchanged since v0.2): a capsule named
# "dltensor" holds a DLManagedTensor whose first member is the DLTensor.

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU = 1
_DL_CUDA_HOST = 3  # pinned host memory: addressable by the CPU
_DL_DTYPES = {(2, 32): np.dtype(np.float32), (2, 16): np.dtype(np.float16),
              (2, 64): np.dtype(np.float64), (4, 16): BF16, (1, 8): np.dtype(np.uint8),
              (1, 16): np.dtype(np.uint16), (0, 8): np.dtype(np.int8), (0, 32): np.dtype(np.int32),
              (0, 64): np.dtype(np.int64), (6, 8): np.dtype(np.bool_)}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, name):
    """A numpy array over the memory of a DLPack tensor. The capsule is not consumed (not
    renamed "used_dltensor"): the producer's deleter runs when the capsule is freed, which is
    after the returned array (whose buffer holds the capsule) is gone."""
    try:
        capsule = obj.__dlpack__()
    except Exception as e:  # producers raise what they like (BufferError, RuntimeError, ...)
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"{name}.__dlpack__() failed: {e}") from None
    if not _capsule_valid(capsule, b"dltensor"):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name}.__dlpack__() did not return an unconsumed 'dltensor' capsule")
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if t.device.device_type not in (_DL_CPU, _DL_CUDA_HOST):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name} lives on DLPack device type {t.device.device_type}; libsdpa "
                       "computes on the CPU")
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise py_error("SDPA_ERR_DTYPE", f"{name} has DLPack dtype code {t.dtype.code}, "
                       f"{t.dtype.bits} bits, {t.dtype.lanes} lanes; libsdpa takes float32, "
                       "float16 and bfloat16")
    ndim = t.ndim
    shape = tuple(t.shape[d] for d in range(ndim))
    if t.strides:
        strides = tuple(t.strides[d] for d in range(ndim))
    else:  # NULL strides = C-contiguous
        strides, acc = [], 1
        for size in reversed(shape):
            strides.insert(0, acc)
            acc *= max(size, 1)
        strides = tuple(strides)
    item = dtype.itemsize
    base = (t.data or 0) + t.byte_offset
    count = 1
    for size in shape:
        count *= size
    if count == 0:
        return np.empty(shape, dtype)
    lo = sum((s - 1) * st for s, st in zip(shape, strides) if st < 0)
    hi = sum((s - 1) * st for s, st in zip(shape, strides) if st > 0)
    buf = (ctypes.c_char * ((hi - lo + 1) * item)).from_address(base + lo * item)
    buf._sdpa_capsule = capsule  # the memory stays alive while the array (and buf) lives
    return np.ndarray(shape, dtype, buffer=buf, offset=-lo * item,
                      strides=tuple(st * item for st in strides))


def as_numpy(obj, name, writable=False):
    """A numpy array over the memory of `obj` (see the module docstring), never a copy.
    Anything else raises SdpaDtypeError (a TypeError) naming what is accepted."""
    if isinstance(obj, np.ndarray):
        return obj
    if isinstance(obj, np.generic):  # a numpy scalar: rank 0, and np.asarray would copy it
        raise py_error("SDPA_ERR_RANK", f"{name} is a numpy scalar ({type(obj).__name__}), expected "
                       f"an array ({ARRAY_TYPES_HINT})")
    if _is_torch_tensor(obj):
        return _from_torch(obj, name, writable)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name)
    if hasattr(obj, "__array_interface__"):
        array = np.asarray(obj)
        if array.size and array.__array_interface__["data"][0] != obj.__array_interface__["data"][0]:
            raise py_error("SDPA_ERR_INTERNAL", f"{name}: numpy copied the array interface")
        return array
    raise py_error("SDPA_ERR_DTYPE",
                   f"{name} must be an array ({ARRAY_TYPES_HINT}), got {type(obj).__name__}")


def new_array(shape, dtype, like):
    """(numpy view, object to return) of a new uninitialised array: a torch tensor (allocated by
    torch) when like == "torch", else the numpy array itself."""
    if like == "torch":
        torch = sys.modules["torch"]
        tdtype = (torch.bfloat16 if is_bf16(dtype) else
                  {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}[dtype])
        t = torch.empty(tuple(shape), dtype=tdtype)
        return _from_torch(t, "out", True), t
    array = np.empty(shape, dtype=dtype)
    return array, array


def wrap(array, like):
    """A result numpy array as the caller's type: torch.from_numpy (same memory) for "torch"."""
    if like == "torch" and not is_bf16(array.dtype):
        return sys.modules["torch"].from_numpy(array)
    return array
