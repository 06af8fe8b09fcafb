#!/usr/bin/env python3
"""libsdpa from Python with nothing but ctypes and numpy, in one self-contained file.

    python3 examples/python/ctypes_quickstart.py [path/to/libsdpa.so]

The library is looked up in this order: the path given as the first argument; the environment
variable SDPA_LIBRARY (meson test sets it to the library it just built); a build tree of this
checkout (build*/libsdpa.so, ./build first); the system (ctypes.util.find_library('sdpa')).

It checks sdpa_version(), runs the causal 3x3 case on numpy arrays without copying them (a
numpy view of any strides becomes an sdpa_tensor: byte strides / itemsize = element strides),
then makes a deliberately bad call and prints the readable error. Exit status 1 if the numbers
are wrong or the bad call did not fail as documented.

The ctypes Structures below mirror include/sdpa.h 0.1. The future python/sdpa package will
hold the maintained bindings; this file only shows how they work.
"""
import ctypes
import ctypes.util
import glob
import os
import sys

import numpy as np

# ----------------------------------------------------------- mirror of include/sdpa.h (0.1)

SDPA_VERSION_NUMBER = 1000  # 0.1.0: MAJOR*1000000 + MINOR*1000 + PATCH
SDPA_MAX_RANK = 8
SDPA_MASK_MAX_RANK = 4
SDPA_OK = 0
SDPA_ERR_SHAPE = 21
SDPA_DTYPE_F32 = 0
SDPA_ALIGN_TOP_LEFT, SDPA_ALIGN_BOTTOM_RIGHT, SDPA_ALIGN_OFFSETS = 0, 1, 2


class SdpaTensor(ctypes.Structure):
    """sdpa_tensor: a non-owning strided view; shape and strides in elements, outermost first."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * SDPA_MAX_RANK),
        ("strides", ctypes.c_int64 * SDPA_MAX_RANK),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class SdpaAllowMask(ctypes.Structure):
    """sdpa_allow_mask: uint8, nonzero = the key may take part (PyTorch SDPA bool polarity)."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("rank", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("shape", ctypes.c_int64 * SDPA_MASK_MAX_RANK),
        ("strides", ctypes.c_int64 * SDPA_MASK_MAX_RANK),
    ]


class SdpaOptions(ctypes.Structure):
    """sdpa_options (0.1 layout), field for field in the header's order. struct_size tells the
    library how much of it we know. Every default is the zero value (a fresh SdpaOptions() with
    struct_size set means the defaults); the flags sliding_window and skip_finite_check take 0/1."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("alignment", ctypes.c_int32),
        ("query_offsets", ctypes.POINTER(ctypes.c_int64)),
        ("sliding_window", ctypes.c_int32),
        ("empty_rows", ctypes.c_int32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("allow_mask", ctypes.POINTER(SdpaAllowMask)),
        ("bias", ctypes.POINTER(SdpaTensor)),
        ("key_lengths", ctypes.POINTER(ctypes.c_int64)),
        ("query_lengths", ctypes.POINTER(ctypes.c_int64)),
        ("weights_stage", ctypes.c_int32),
        ("skip_finite_check", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("num_threads", ctypes.c_int32),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


if ctypes.sizeof(ctypes.c_void_p) == 8:  # the sizes and a few offsets of the C structs on LP64
    assert ctypes.sizeof(SdpaTensor) == 160
    assert ctypes.sizeof(SdpaAllowMask) == 80
    assert ctypes.sizeof(SdpaOptions) == 136
    assert SdpaOptions.sliding_window.offset == 32 and SdpaOptions.window_left.offset == 40
    assert SdpaOptions.weights_stage.offset == 88 and SdpaOptions.skip_finite_check.offset == 92
    assert SdpaOptions.num_threads.offset == 100 and SdpaOptions.workspace_bytes.offset == 128


class SdpaError(RuntimeError):
    """A failed libsdpa call: the status, its name and the library's detail message."""

    def __init__(self, status, name, message):
        super().__init__(f"{name} ({status}): {message}")
        self.status, self.name, self.message = status, name, message


# ------------------------------------------------------------------------------ loading

def find_library(argv=None, environ=None, root=None):
    """Return (path, where it came from) of the libsdpa shared library to load, or None when
    there is none. A build directory that is configured but not built yet (or whose library
    was removed) has no file, or a dangling libsdpa.so link: such candidates are skipped."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if len(argv) > 1:
        return argv[1], "command line"
    if environ.get("SDPA_LIBRARY"):
        return environ["SDPA_LIBRARY"], "SDPA_LIBRARY"
    if root is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # os.path.isfile follows links: a dangling libsdpa.so (or a directory) is not a candidate.
    built = [p for p in glob.glob(os.path.join(root, "build", "libsdpa.so")) if os.path.isfile(p)]
    built += sorted((p for p in glob.glob(os.path.join(root, "build?*", "libsdpa.so"))
                     if os.path.isfile(p)), key=os.path.getmtime, reverse=True)
    if built:
        return built[0], "build tree"
    system = ctypes.util.find_library("sdpa")
    if system:
        return system, "system"
    return None


def load(path):
    lib = ctypes.CDLL(path)
    status = ctypes.c_int  # sdpa_status is int-sized
    tensor_p = ctypes.POINTER(SdpaTensor)
    lib.sdpa_version.argtypes, lib.sdpa_version.restype = [], ctypes.c_uint
    lib.sdpa_version_string.argtypes, lib.sdpa_version_string.restype = [], ctypes.c_char_p
    lib.sdpa_status_string.argtypes, lib.sdpa_status_string.restype = [status], ctypes.c_char_p
    lib.sdpa_last_error_message.argtypes = []
    lib.sdpa_last_error_message.restype = ctypes.c_char_p
    lib.sdpa_last_kernel.argtypes, lib.sdpa_last_kernel.restype = [], ctypes.c_char_p
    lib.sdpa_options_init_sized.argtypes = [ctypes.POINTER(SdpaOptions), ctypes.c_size_t]
    lib.sdpa_options_init_sized.restype = None
    lib.sdpa_attention.argtypes = [tensor_p, tensor_p, tensor_p, ctypes.POINTER(SdpaOptions),
                                   tensor_p, tensor_p, tensor_p]
    lib.sdpa_attention.restype = status
    return lib


def check(lib, status):
    if status != SDPA_OK:
        raise SdpaError(status, lib.sdpa_status_string(status).decode(),
                        lib.sdpa_last_error_message().decode())


# ------------------------------------------------------------------------ numpy -> views

def view(array, writable=False):
    """An sdpa_tensor over a float32 numpy array of any strides. No copy: keep `array` alive
    for as long as the view is used."""
    if array.dtype != np.float32:
        raise TypeError(f"libsdpa computes float32; got {array.dtype} (convert it yourself)")
    if not 1 <= array.ndim <= SDPA_MAX_RANK:
        raise ValueError(f"rank {array.ndim} outside 1..{SDPA_MAX_RANK}")
    if writable and not array.flags.writeable:
        raise ValueError("output array is read-only")
    t = SdpaTensor()  # ctypes zero-fills: unused entries and reserved[] are 0
    t.data = array.ctypes.data
    t.dtype = SDPA_DTYPE_F32
    t.rank = array.ndim
    for d, (size, byte_stride) in enumerate(zip(array.shape, array.strides)):
        if byte_stride % array.itemsize:
            raise ValueError(f"stride {byte_stride} bytes on axis {d} is not a whole element")
        t.shape[d] = size
        t.strides[d] = byte_stride // array.itemsize
    return t


def default_options(lib):
    """The defaults, written by the library for exactly the fields this file knows
    (sdpa_options_init() is an inline C function; ctypes calls the sized form)."""
    options = SdpaOptions()
    lib.sdpa_options_init_sized(options, ctypes.sizeof(SdpaOptions))
    return options


def mirror_problems(lib):
    """What is wrong with this file's mirror of sdpa_options, judged by the defaults the library
    writes: every field 0 but window_left = window_right = -1 (a field at the wrong offset shows)."""
    options = SdpaOptions()
    ctypes.memset(ctypes.byref(options), 0xAB, ctypes.sizeof(options))
    lib.sdpa_options_init_sized(options, ctypes.sizeof(SdpaOptions))
    problems = []
    for name, ctype in SdpaOptions._fields_:
        value = getattr(options, name)
        if name == "struct_size":
            want = ctypes.sizeof(SdpaOptions)
        elif name in ("window_left", "window_right"):
            want = -1
        else:
            want = None if issubclass(ctype, (ctypes._Pointer, ctypes.c_void_p)) else 0
        if isinstance(value, ctypes._Pointer):
            value = ctypes.cast(value, ctypes.c_void_p).value
        if value != want:
            problems.append(f"{name} = {value!r}, expected {want!r}")
    return problems


def attention(lib, q, k, v, out, causal=False, alignment=SDPA_ALIGN_TOP_LEFT):
    """out <- softmax(q k^T / sqrt(E), masked) v. Raises SdpaError; `out` is untouched then."""
    options = default_options(lib)
    options.causal = int(causal)
    options.alignment = alignment
    tq, tk, tv, tout = view(q), view(k), view(v), view(out, writable=True)
    check(lib, lib.sdpa_attention(tq, tk, tv, options, tout, None, None))
    return out


# ---------------------------------------------------------------------------------- main

def main():
    found = find_library()
    if found is None:
        sys.exit("libsdpa not found: build it (meson setup build && ninja -C build) "
                 "or set SDPA_LIBRARY=/path/to/libsdpa.so")
    path, origin = found
    lib = load(path)
    version = lib.sdpa_version()
    print(f"loaded {path} ({origin}): libsdpa {lib.sdpa_version_string().decode()}")
    if version < SDPA_VERSION_NUMBER or version // 1000000 != SDPA_VERSION_NUMBER // 1000000:
        print(f"FAIL: library version {version} is not compatible with 0.1 ({SDPA_VERSION_NUMBER})")
        return 1

    problems = mirror_problems(lib)
    if problems:
        print("FAIL: SdpaOptions does not mirror sdpa_options: " + "; ".join(problems))
        return 1

    # The causal 3x3 case: q = k = 0, so query i averages v[0..i] = [2, 4, 8].
    # q, k and out live in [B, L, H, E] (BSHD) buffers and are passed as [B, H, L, E] views
    # by transposing: only the strides change, nothing is copied.
    q = np.zeros((1, 3, 1, 4), dtype=np.float32).transpose(0, 2, 1, 3)   # [B, H, L, E]
    k = np.zeros((1, 3, 1, 4), dtype=np.float32).transpose(0, 2, 1, 3)   # [B, H, S, E]
    v = np.array([2, 4, 8], dtype=np.float32).reshape(1, 1, 3, 1)        # [B, H, S, Ev]
    out_bshd = np.full((1, 3, 1, 1), np.nan, dtype=np.float32)
    out = out_bshd.transpose(0, 2, 1, 3)                                 # [B, H, L, Ev]
    attention(lib, q, k, v, out, causal=True)
    expected = np.array([2.0, 3.0, 14.0 / 3.0], dtype=np.float32)
    got = out[0, 0, :, 0]
    print(f"causal 3x3 (kernel \"{lib.sdpa_last_kernel().decode()}\"): out = {np.round(got, 4)}"
          f" (expected {np.round(expected, 4)})")
    ok = bool(np.allclose(got, expected, rtol=0, atol=1e-5))
    if not ok:
        print("FAIL: wrong result")

    # A deliberately bad call: key head width 5 against query head width 4.
    bad_k = np.zeros((1, 1, 3, 5), dtype=np.float32)
    sentinel = np.full((1, 1, 3, 1), 7.0, dtype=np.float32)
    try:
        attention(lib, q, bad_k, v, sentinel)
    except SdpaError as e:
        print(f"bad call (E=4 vs 5) failed as it should: {e.name} ({e.status}): {e.message}")
        if e.status != SDPA_ERR_SHAPE or not e.message:
            print(f"FAIL: expected SDPA_ERR_SHAPE with a message, got {e.name}: '{e.message}'")
            ok = False
        if not np.all(sentinel == 7.0):
            print("FAIL: the failed call wrote to its output")
            ok = False
    else:
        print("FAIL: the bad call succeeded")
        ok = False

    print("ctypes_quickstart: OK" if ok else "ctypes_quickstart: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
