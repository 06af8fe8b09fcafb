"""Finding and loading libsdpa; ctypes mirrors of the structs of include/sdpa.h (0.5).

The library is looked up, in this order:

1. the environment variable ``SDPA_LIBRARY`` (a path; ``meson test`` sets it to the library it
   just built);
2. the package's own copy: ``libsdpa.so*`` next to this file, which a wheel built by
   ``pip install .`` / ``python3 -m build`` (meson-python) bundles;
3. the build tree of the checkout this package lives in: ``libsdpa.so*`` under the
   ``build*/`` directories of the repository root (``python/sdpa/../..``), preferring libraries
   whose file name carries a compatible version, then ``build/``, then the newest; only when
   the package is inside a libsdpa checkout (``python/`` under a root holding ``meson.build``
   and ``include/sdpa.h``): a copy of the package elsewhere, or an installed one, skips this;
4. the system loader: ``ctypes.util.find_library("sdpa")``, else ``libsdpa.so.0``.

It is loaded once per process, on first use (or by ``sdpa.load_library()``); the handle is the
only module state of the package.
"""
import ctypes
import ctypes.util
import glob
import os
import re
import threading

from ._errors import SdpaLibraryError, SdpaVersionError, make_error, python_hints

#: The libsdpa version this package was written for: a library of the same major version and a
#: minor version >= this one is accepted.
EXPECTED_VERSION = (0, 5, 0)

SDPA_MAX_RANK = 8
SDPA_MASK_MAX_RANK = 4
SDPA_DTYPE_F32 = 0
SDPA_DTYPE_F16 = 1
SDPA_DTYPE_BF16 = 2
SDPA_DTYPE_Q8_0 = 3      # 0.6: 8-bit K/V caches (ggml block_q8_0; strides in 34-byte blocks)
SDPA_DTYPE_FP8_E4M3 = 4  # 0.6 (OCP E4M3FN, torch.float8_e4m3fn)
SDPA_DTYPE_FP8_E5M2 = 5  # 0.6 (torch.float8_e5m2)

c_status = ctypes.c_int  # sdpa_status is int-sized (SDPA_STATUS_FORCE_INT32_)


# ---------------------------------------------------------------------------- struct mirrors
# Pointer members are declared c_void_p (same size and alignment as any data pointer) and set
# from integer addresses: no ctypes pointer objects, so no hidden references or cycles.

class SdpaTensor(ctypes.Structure):
    """sdpa_tensor: non-owning strided view; shape and strides in elements, outermost first."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * SDPA_MAX_RANK),
        ("strides", ctypes.c_int64 * SDPA_MAX_RANK),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class SdpaAllowMask(ctypes.Structure):
    """sdpa_allow_mask: uint8, nonzero = the key may take part."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("rank", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("shape", ctypes.c_int64 * SDPA_MASK_MAX_RANK),
        ("strides", ctypes.c_int64 * SDPA_MASK_MAX_RANK),
    ]


class SdpaOptions(ctypes.Structure):
    """sdpa_options of 0.6, field for field (the 0.1 layout, then the fields each version
    appended). struct_size = ctypes.sizeof(SdpaOptions) tells the library which it is."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("alignment", ctypes.c_int32),
        ("query_offsets", ctypes.c_void_p),   # const int64_t *
        ("sliding_window", ctypes.c_int32),
        ("empty_rows", ctypes.c_int32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("allow_mask", ctypes.c_void_p),      # const sdpa_allow_mask *
        ("bias", ctypes.c_void_p),            # const sdpa_tensor *
        ("key_lengths", ctypes.c_void_p),     # const int64_t *
        ("query_lengths", ctypes.c_void_p),   # const int64_t *
        ("weights_stage", ctypes.c_int32),
        ("skip_finite_check", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("num_threads", ctypes.c_int32),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        # appended in 0.2
        ("kernel", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        # appended in 0.4
        ("precision", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        # appended in 0.5: sinks, ALiBi, caller thread pools
        ("sinks", ctypes.c_void_p),               # const float *
        ("alibi_slopes", ctypes.c_void_p),        # const float *
        ("alibi_slopes_rank", ctypes.c_int32),
        ("parallel_for_threads", ctypes.c_int32),
        ("parallel_for", ctypes.c_void_p),        # sdpa_parallel_for_fn (not used from Python)
        ("parallel_for_ctx", ctypes.c_void_p),
        ("threadpool", ctypes.c_void_p),          # sdpa_threadpool *
        # appended in 0.5: paged K/V and packed variable-length batches
        ("block_table", ctypes.c_void_p),         # const int32_t *
        ("block_table_stride", ctypes.c_int64),
        ("max_blocks_per_seq", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.c_void_p),        # const int32_t *
        ("cu_seqlens_k", ctypes.c_void_p),        # const int32_t *
        ("num_seqs", ctypes.c_int64),
        # appended in 0.6: scales of FP8 K/V caches
        ("k_scale", ctypes.c_void_p),             # const sdpa_tensor *
        ("v_scale", ctypes.c_void_p),             # const sdpa_tensor *
    ]


class SdpaMhaParams(ctypes.Structure):
    """sdpa_mha_params (0.2)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("embed_dim", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("kdim", ctypes.c_int64),
        ("vdim", ctypes.c_int64),
        ("in_proj_weight", ctypes.c_void_p),   # const sdpa_tensor * (all of these)
        ("q_proj_weight", ctypes.c_void_p),
        ("k_proj_weight", ctypes.c_void_p),
        ("v_proj_weight", ctypes.c_void_p),
        ("in_proj_bias", ctypes.c_void_p),
        ("out_proj_weight", ctypes.c_void_p),
        ("out_proj_bias", ctypes.c_void_p),
        ("bias_k", ctypes.c_void_p),
        ("bias_v", ctypes.c_void_p),
        ("add_zero_attn", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
    ]


class SdpaMhaOptions(ctypes.Structure):
    """sdpa_mha_options (0.2)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("attn_mask", ctypes.c_void_p),        # const sdpa_allow_mask *
        ("key_padding_mask", ctypes.c_void_p), # const sdpa_allow_mask *
        ("attn_bias", ctypes.c_void_p),        # const sdpa_tensor *
        ("key_lengths", ctypes.c_void_p),      # const int64_t *
        ("query_lengths", ctypes.c_void_p),    # const int64_t *
        ("causal", ctypes.c_int32),
        ("per_head_weights", ctypes.c_int32),
        ("training", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("empty_rows", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class SdpaCostOptions(ctypes.Structure):
    """sdpa_cost_options (0.6): flags SDPA_COST_EXACT | _WEIGHTS | _LSE."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("flags", ctypes.c_uint32),
        ("reserved0", ctypes.c_int32),
    ]


class SdpaRopeParams(ctypes.Structure):
    """sdpa_rope_params (0.6): rotary embedding (sdpa_rope, sdpa_kv_write_options.rope)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("rotary_dim", ctypes.c_int64),
        ("interleaved", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("cos", ctypes.POINTER(SdpaTensor)),
        ("sin", ctypes.POINTER(SdpaTensor)),
        ("theta", ctypes.c_double),
    ]


SDPA_COST_EXACT = 0x1
SDPA_COST_WEIGHTS = 0x2
SDPA_COST_LSE = 0x4


class SdpaCost(ctypes.Structure):
    """sdpa_cost (0.6): what an sdpa_attention call would do (sdpa_attention_cost)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("status", ctypes.c_int32),
        ("exact", ctypes.c_int32),
        ("kernel", ctypes.c_char * 64),
        ("kernel_id", ctypes.c_int32),
        ("threads", ctypes.c_int32),
        ("workspace_bytes", ctypes.c_size_t),
        ("query_rows", ctypes.c_int64),
        ("allowed_pairs", ctypes.c_int64),
        ("skipped_pairs", ctypes.c_int64),
        ("empty_rows", ctypes.c_int64),
        ("flops", ctypes.c_int64),
        ("bytes_read_q", ctypes.c_int64),
        ("bytes_read_k", ctypes.c_int64),
        ("bytes_read_v", ctypes.c_int64),
        ("bytes_read_mask", ctypes.c_int64),
        ("bytes_read_bias", ctypes.c_int64),
        ("bytes_written_out", ctypes.c_int64),
        ("bytes_written_weights", ctypes.c_int64),
        ("bytes_written_lse", ctypes.c_int64),
    ]


# Sizes of the C structs on LP64 (Linux/macOS 64-bit). A mirror that drifts from the header
# fails here, at import, instead of corrupting memory later.
STRUCT_SIZES_LP64 = {
    SdpaTensor: 160,
    SdpaAllowMask: 80,
    SdpaOptions: 264,
    SdpaMhaParams: 136,
    SdpaMhaOptions: 104,
    SdpaCostOptions: 16,
    SdpaCost: 200,
}
if ctypes.sizeof(ctypes.c_void_p) == 8 and ctypes.sizeof(ctypes.c_long) == 8:
    for _struct, _size in STRUCT_SIZES_LP64.items():
        assert ctypes.sizeof(_struct) == _size, \
            f"{_struct.__name__} is {ctypes.sizeof(_struct)} bytes, the C struct {_size}"
    assert SdpaOptions.kernel.offset == 136 and SdpaOptions.workspace_bytes.offset == 128
    assert SdpaOptions.precision.offset == 144 and SdpaOptions.sinks.offset == 152
    assert SdpaOptions.block_table.offset == 200 and SdpaOptions.num_seqs.offset == 240
    assert SdpaOptions.k_scale.offset == 248 and SdpaOptions.v_scale.offset == 256
    assert SdpaMhaParams.add_zero_attn.offset == 128
    assert SdpaMhaOptions.dropout_p.offset == 60 and SdpaMhaOptions.empty_rows.offset == 80
    assert SdpaCost.kernel.offset == 16 and SdpaCost.workspace_bytes.offset == 88
    del _struct, _size


# --------------------------------------------------------------------- function signatures

_T = ctypes.POINTER(SdpaTensor)
_M = ctypes.POINTER(SdpaAllowMask)
_O = ctypes.POINTER(SdpaOptions)
_P = ctypes.POINTER(SdpaMhaParams)
_MO = ctypes.POINTER(SdpaMhaOptions)
_i64 = ctypes.c_int64
_vp = ctypes.c_void_p
_i64p = ctypes.POINTER(ctypes.c_int64)

# name: (restype, argtypes). Buffers that the mask functions read or write are c_void_p and get
# integer addresses of numpy arrays.
SIGNATURES = {
    "sdpa_version": (ctypes.c_uint, []),
    "sdpa_version_string": (ctypes.c_char_p, []),
    "sdpa_status_string": (ctypes.c_char_p, [c_status]),
    "sdpa_last_error_message": (ctypes.c_char_p, []),
    "sdpa_last_kernel": (ctypes.c_char_p, []),
    "sdpa_options_init_sized": (None, [_O, ctypes.c_size_t]),
    "sdpa_attention": (c_status, [_T, _T, _T, _O, _T, _T, _T]),
    "sdpa_attention_workspace_size": (c_status, [_T, _T, _T, _O, ctypes.c_int,
                                                 ctypes.POINTER(ctypes.c_size_t)]),
    "sdpa_mask_causal": (c_status, [_vp, _i64, _i64, ctypes.c_int]),
    "sdpa_mask_padding": (c_status, [_vp, _i64, _i64, _vp, ctypes.c_int]),
    "sdpa_mask_sliding_window": (c_status, [_vp, _i64, _i64, _i64, _i64, ctypes.c_int]),
    "sdpa_mask_block_diagonal": (c_status, [_vp, _i64, _vp, _vp, ctypes.c_int32, ctypes.c_int]),
    "sdpa_mask_prefix_lm": (c_status, [_vp, _i64, _i64]),
    "sdpa_mask_and": (c_status, [_M, _M, _vp, ctypes.c_int32, _vp]),
    "sdpa_mask_from_ignore": (c_status, [_vp, _i64, _vp]),
    "sdpa_mask_from_keep_int": (c_status, [_vp, _i64, _vp]),
    "sdpa_mask_from_additive": (c_status, [_vp, _i64, _vp, _vp]),
    "sdpa_mask_to_additive": (c_status, [_vp, _i64, _vp]),
    "sdpa_mask_count_empty_rows": (c_status, [_M, _i64p, _i64p]),
    "sdpa_merge": (c_status, [_T, _T, _T, _T, _T, _T]),
    "sdpa_mha_params_init_sized": (None, [_P, ctypes.c_size_t]),
    "sdpa_mha_options_init_sized": (None, [_MO, ctypes.c_size_t]),
    "sdpa_mha_forward": (c_status, [_P, _T, _T, _T, _MO, _T, _T]),
    "sdpa_mha_workspace_size": (c_status, [_P, _T, _T, _T, _MO, ctypes.c_int,
                                           ctypes.POINTER(ctypes.c_size_t)]),
    # 0.4
    "sdpa_request_amx": (c_status, []),
    "sdpa_amx_available": (ctypes.c_int, []),
    # 0.5
    "sdpa_kv_write": (c_status, [_T, _T, _T, _T, _vp]),
    "sdpa_alibi_slopes": (c_status, [_i64, ctypes.c_float, _vp]),
    "sdpa_threadpool_create": (c_status, [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]),
    "sdpa_threadpool_destroy": (None, [_vp]),
    "sdpa_threadpool_size": (ctypes.c_int, [_vp]),
    # 0.6
    "sdpa_attention_cost": (c_status, [_T, _T, _T, _O, _T, _T, _T, ctypes.POINTER(SdpaCostOptions),
                                       ctypes.POINTER(SdpaCost)]),
    "sdpa_rope_params_init_sized": (None, [ctypes.POINTER(SdpaRopeParams), ctypes.c_size_t]),
    "sdpa_rope": (c_status, [_T, _T, _vp, ctypes.POINTER(SdpaRopeParams)]),
    "sdpa_kv_write_ex": (c_status, [_T, _T, _T, _T, _vp, _vp]),  # options: sdpa_kv_write_options *
}
# Functions without which nothing works: loading fails if one is missing. The others are looked
# up when first called and raise SdpaLibraryError naming the missing symbol.
_REQUIRED = ("sdpa_version", "sdpa_version_string", "sdpa_status_string",
             "sdpa_last_error_message", "sdpa_options_init_sized", "sdpa_attention")


def version_tuple(number):
    """(major, minor, patch) of an SDPA_VERSION_NUMBER (MAJOR*1000000 + MINOR*1000 + PATCH)."""
    number = int(number)
    return number // 1000000, (number // 1000) % 1000, number % 1000


def version_compatible(found, expected=None):
    """Whether a library of version `found` (a tuple) serves a package written for `expected`:
    same major version and a minor version at least as new."""
    if expected is None:
        expected = EXPECTED_VERSION
    return found[0] == expected[0] and found[1] >= expected[1]


def _fmt(v):
    return ".".join(str(x) for x in v)


class Library:
    """A loaded libsdpa: the ctypes handle, where it came from and its version."""

    def __init__(self, cdll, path, origin):
        self.cdll = cdll
        self.path = path
        self.origin = origin
        self._missing = {}
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                self._missing[name] = True
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        missing = [n for n in _REQUIRED if n in self._missing]
        if missing:
            raise SdpaLibraryError(f"{path} (found via {origin}) is not libsdpa: it lacks "
                                   + ", ".join(missing))
        self.version_number = int(cdll.sdpa_version())
        self.version = version_tuple(self.version_number)
        self.version_string = cdll.sdpa_version_string().decode("utf-8", "replace")

    def __getattr__(self, name):  # only reached for functions the library does not export
        if name.startswith("sdpa_") and name in SIGNATURES:
            raise SdpaLibraryError(
                f"libsdpa {self.version_string} at {self.path} does not export {name} "
                f"(expected in libsdpa >= {_fmt(EXPECTED_VERSION)}; the build is incomplete "
                f"or older than this package)")
        raise AttributeError(name)

    def check(self, status, called=None):
        """Raise the SdpaError of a non-zero status, with the detail message of this thread's
        last failure (read right away, before any other libsdpa call); C enum names in its
        hints are given as the Python keywords (_errors.python_hints). called = (function the
        message names, function to name instead): a check made through another entry point
        (sdpa_attention_cost before sdpa_attention) reports the call the user made."""
        if status != 0:
            message = (self.cdll.sdpa_last_error_message() or b"").decode("utf-8", "replace")
            if called is not None and message.startswith(called[0] + ":"):
                message = called[1] + message[len(called[0]):]
            name = self.cdll.sdpa_status_string(status)
            raise make_error(status, python_hints(message),
                             (name or b"SDPA_ERR_UNKNOWN").decode("ascii", "replace"))

    def has(self, name):
        """Whether the loaded library exports `name` (a function of SIGNATURES)."""
        return name in SIGNATURES and name not in self._missing

    def status_string(self, status):
        return self.cdll.sdpa_status_string(int(status)).decode("ascii", "replace")

    def last_kernel(self):
        return self.sdpa_last_kernel().decode("ascii", "replace")

    def __repr__(self):
        return f"<libsdpa {self.version_string} from {self.path} ({self.origin})>"


# ------------------------------------------------------------------------------- finding

def repository_root(package_dir=None):
    """The libsdpa checkout this package sits in (python/sdpa/../..), or None when the package
    is not inside one (a copy next to an application, an installed wheel): the directory
    above must be named ``python`` and the root must hold ``meson.build`` and
    ``include/sdpa.h``, so that a copy of the package never loads an unrelated directory's
    ``build*/libsdpa.so``."""
    package_dir = package_dir or os.path.dirname(os.path.abspath(__file__))
    python_dir = os.path.dirname(package_dir)
    root = os.path.dirname(python_dir)
    if (os.path.basename(python_dir) == "python" and os.path.isfile(os.path.join(root, "meson.build"))
            and os.path.isfile(os.path.join(root, "include", "sdpa.h"))):
        return root
    return None


_SONAME_VERSION = re.compile(r"libsdpa\.so\.(\d+)\.(\d+)\.(\d+)$")


def _needs_asan(path):
    """Whether a shared library was built with AddressSanitizer (it names libasan among its
    dependencies). Loading one into an interpreter without the ASan runtime aborts the process."""
    try:
        with open(path, "rb") as fh:
            return b"libasan.so" in fh.read()
    except OSError:
        return False


def _asan_loaded():
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return "libasan" in fh.read()
    except OSError:
        return False


def build_tree_candidates(root=None, expected=None):
    """libsdpa.so* files under root/build*/ (one per real file), best first: a file name with a
    compatible version before others, then build/ itself, then the newest. Sanitizer builds are
    left out unless the ASan runtime is already loaded (they would abort the interpreter).
    None of them when the package is not inside a checkout (repository_root())."""
    root = root or repository_root()
    if root is None:
        return []
    seen = {}
    for pattern in ("build*/libsdpa.so", "build*/libsdpa.so.*"):
        for path in glob.glob(os.path.join(root, pattern)):
            if not os.path.isfile(path) or path.endswith((".p", ".symbols")):
                continue
            real = os.path.realpath(path)
            # Prefer the plain libsdpa.so name for each real file (what a user would type).
            if real not in seen or path.endswith("libsdpa.so"):
                seen[real] = path
    ranked = []
    asan = None
    for real, path in seen.items():
        if _needs_asan(real):
            if asan is None:
                asan = _asan_loaded()
            if not asan:
                continue
        m = _SONAME_VERSION.search(os.path.basename(real))
        version = tuple(int(x) for x in m.groups()) if m else None
        compatible = version is not None and version_compatible(version, expected)
        top = os.path.basename(os.path.dirname(path)) == "build"
        ranked.append((not compatible, not top, -os.path.getmtime(real), path))
    ranked.sort()
    return [r[-1] for r in ranked]


def bundled_candidates(package_dir=None):
    """libsdpa.so* files next to this package's modules (the copy a wheel bundles), the plain
    libsdpa.so first."""
    package_dir = package_dir or os.path.dirname(os.path.abspath(__file__))
    found = [p for p in glob.glob(os.path.join(package_dir, "libsdpa.so*"))
             if os.path.isfile(p) and not p.endswith((".p", ".symbols"))]
    return sorted(found, key=lambda p: (not p.endswith("libsdpa.so"), p))


def find_library():
    """(path or name, origin) of the libsdpa to load, without loading it: SDPA_LIBRARY, the
    bundled copy, the build tree, the system loader."""
    env = os.environ.get("SDPA_LIBRARY")
    if env:
        return env, "SDPA_LIBRARY"
    bundled = bundled_candidates()
    if bundled:
        return bundled[0], "bundled with the package"
    built = build_tree_candidates()
    if built:
        return built[0], f"build tree of {repository_root()}"
    system = ctypes.util.find_library("sdpa")
    return (system or "libsdpa.so.0"), "system loader"


def _load_hint(origin):
    """What to do when the library found via `origin` does not load: only the places that
    find_library() consulted before it are named (SDPA_LIBRARY wins over every other)."""
    if origin == "SDPA_LIBRARY":
        return ("SDPA_LIBRARY is looked at first and, when set, alone: correct it to the path "
                "of a libsdpa.so, or unset it to use the package's bundled copy, a checkout's "
                "build tree or the system's.")
    if origin == "system loader":
        root = repository_root()
        tree = (f", no libsdpa.so* under {os.path.join(root, 'build*')}" if root is not None
                else " (this package is not inside a libsdpa checkout, so no build tree is searched)")
        return ("Looked in: SDPA_LIBRARY (unset), the package's directory "
                f"{os.path.dirname(os.path.abspath(__file__))} (no bundled libsdpa.so){tree}, "
                "then the system loader. Build it (meson setup build && ninja -C build in the "
                "checkout), install it (meson install, or pip install . for a wheel that bundles "
                "it), or set SDPA_LIBRARY=/path/to/libsdpa.so.")
    return ("The file was found but did not load (a broken or foreign copy?): rebuild it, or "
            "set SDPA_LIBRARY=/path/to/libsdpa.so.")


def load(path=None, origin=None, expected=None):
    """Load libsdpa from `path` (default: find_library()) and check its version against
    `expected` (default EXPECTED_VERSION). Returns a Library; does not cache it."""
    if expected is None:
        expected = EXPECTED_VERSION
    if path is None:
        path, origin = find_library()
    origin = origin or "argument"
    try:
        cdll = ctypes.CDLL(path)
    except OSError as e:
        raise SdpaLibraryError(f"cannot load libsdpa from {path} (found via {origin}): {e}. "
                               + _load_hint(origin)) from None
    lib = Library(cdll, path, origin)
    if not version_compatible(lib.version, expected):
        raise SdpaVersionError(
            f"libsdpa version mismatch: found {lib.version_string} "
            f"(sdpa_version() = {lib.version_number}) at {path} (via {origin}); this sdpa "
            f"package was written for {_fmt(expected)} and needs libsdpa {expected[0]}.x with "
            f"x >= {expected[1]} (same major version, minor >= {expected[1]}). Point "
            "SDPA_LIBRARY at a matching build.")
    return lib


_LOCK = threading.Lock()
_LIBRARY = None


def get():
    """The process-wide Library, loaded on first use."""
    global _LIBRARY
    lib = _LIBRARY
    if lib is None:
        with _LOCK:
            if _LIBRARY is None:
                _LIBRARY = load()
            lib = _LIBRARY
    return lib


def load_library(path=None):
    """Load (or reload from another path) the library the package uses and return it. With no
    path, the usual lookup applies. Call it before other threads use the package."""
    global _LIBRARY
    lib = load(path, "argument" if path else None)
    with _LOCK:
        _LIBRARY = lib
    return lib
