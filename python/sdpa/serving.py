"""Serving helpers of libsdpa 0.5 over numpy arrays: the cache write (sdpa_kv_write), ALiBi
slopes (sdpa_alibi_slopes), caller-owned thread pools (sdpa_threadpool) and the AMX opt-in
(sdpa_request_amx). Paged caches, packed batches, sinks and ALiBi themselves are arguments of
scaled_dot_product_attention."""
import contextlib
import ctypes
import threading

import numpy as np

from . import _lib
from ._arrays import as_numpy
from ._errors import STATUS_CODES, SdpaArgumentError, SdpaError, py_error
from ._views import KV8_DTYPES, address, int64_vector, integer, kv8_view, real, tensor_view

_FLT_MAX = float(np.finfo(np.float32).max)

__all__ = ["ThreadPool", "kv_write", "alibi_slopes", "request_amx", "amx_available"]


class _NotCopyable(SdpaArgumentError, TypeError):
    """copy/pickle of a ThreadPool: an SdpaArgumentError (status SDPA_ERR_UNSUPPORTED) that is
    also the TypeError the copy and pickle protocols use for objects they cannot copy."""


class ThreadPool:
    """A caller-owned pool of persistent worker threads (sdpa_threadpool_create): pass it as
    ``scaled_dot_product_attention(..., threadpool=pool)`` so that a call runs on its
    ``num_threads - 1`` workers plus the calling thread and starts no thread of its own (the
    per-call thread start-up that dominates small decode calls). The library keeps no hidden
    global pool: the pool lives until ``close()`` (or the end of a ``with`` block, or garbage
    collection). Results are bit-identical to the library's own threads.

        with sdpa.ThreadPool(2) as pool:
            out = sdpa.scaled_dot_product_attention(q, k, v, threadpool=pool)

    num_threads: 1..256 (1 = no worker: calls run on the calling thread), else
    SdpaArgumentError. Several Python threads may share one pool: the library runs their
    calls one after the other. ``close()`` from any thread waits for the calls in progress on
    the pool to return, then joins the workers; a call started after close() raises
    SdpaArgumentError. A pool owns threads, so it cannot be copied or pickled
    (SdpaArgumentError, status SDPA_ERR_UNSUPPORTED, also a TypeError): share the object
    itself. The workers poll for SDPA_POOL_SPIN_US microseconds after each call before they
    sleep (default 200; read when the pool is created; see sdpa.h)."""

    _handle = None  # class defaults: a pool whose __init__ failed or never ran is closed
    _idle = None
    _calls = 0

    def __init__(self, num_threads):
        lib = _lib.get()
        num_threads = integer(num_threads, "num_threads")
        if not 1 <= num_threads <= 256:  # the library's range, said before a C int could wrap
            raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                           f"num_threads={num_threads} must be in [1, 256]")
        handle = ctypes.c_void_p()
        lib.check(lib.sdpa_threadpool_create(num_threads, ctypes.byref(handle)))
        self._lib = lib
        self._idle = threading.Condition()  # guards _handle and _calls
        self._calls = 0                     # calls in progress on the pool
        self._handle = handle.value

    @property
    def num_threads(self):
        """Threads of a call: the workers plus the calling thread."""
        with self.in_use() as handle:
            return self._lib.sdpa_threadpool_size(handle)

    @contextlib.contextmanager
    def in_use(self):
        """The sdpa_threadpool * (an int) for the duration of a library call: close() waits
        until every in_use() block has ended. SdpaArgumentError once the pool is closed."""
        if self._idle is None:  # ThreadPool.__new__ without __init__, or __init__ failed
            raise py_error("SDPA_ERR_INVALID_ARGUMENT", "the ThreadPool was never opened")
        with self._idle:
            if self._handle is None:
                raise py_error("SDPA_ERR_INVALID_ARGUMENT", "the ThreadPool is closed")
            self._calls += 1
            handle = self._handle
        try:
            yield handle
        finally:
            with self._idle:
                self._calls -= 1
                if self._calls == 0:
                    self._idle.notify_all()

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Stop and join the workers (idempotent), after the calls in progress on the pool have
        returned; later calls with the pool raise SdpaArgumentError."""
        idle = self._idle
        if idle is None:  # __init__ failed or never ran: there is no pool
            return
        with idle:
            handle, self._handle = self._handle, None  # no new call can start
            while self._calls:
                idle.wait()
        if handle is not None:
            self._lib.sdpa_threadpool_destroy(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if self._handle is not None:
            self.close()

    def _not_copyable(self, *args):
        raise _NotCopyable(STATUS_CODES["SDPA_ERR_UNSUPPORTED"], "SDPA_ERR_UNSUPPORTED",
                           "a sdpa.ThreadPool owns its worker threads and cannot be copied or "
                           "pickled (two owners would destroy it twice): share the object itself")

    __copy__ = __deepcopy__ = __reduce__ = __reduce_ex__ = __getstate__ = _not_copyable

    def __repr__(self):
        try:
            with self.in_use() as handle:
                return f"<sdpa.ThreadPool {self._lib.sdpa_threadpool_size(handle)} threads>"
        except SdpaError:
            return "<sdpa.ThreadPool closed>"


class _RopeParams(ctypes.Structure):
    """sdpa_rope_params (0.6), as sdpa.h lays it out."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("rotary_dim", ctypes.c_int64),
                ("interleaved", ctypes.c_int32), ("reserved0", ctypes.c_int32),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("theta", ctypes.c_double)]


class _KvWriteOptions(ctypes.Structure):
    """sdpa_kv_write_options (0.6), as sdpa.h lays it out."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("k_scale", ctypes.c_void_p),
                ("v_scale", ctypes.c_void_p), ("rope", ctypes.c_void_p), ("positions", ctypes.c_void_p)]


_ROPE_KEYS = {"rotary_dim", "interleaved", "theta", "cos", "sin"}


def _rope_params(rope, keep):
    """A _RopeParams from rope=: True (the defaults: NeoX pairs, rotary_dim = E, theta 10000) or
    a dict with any of rotary_dim, interleaved (bool), theta, cos, sin (float32 tables
    [max_pos, rotary_dim / 2]). Arrays it views are appended to `keep`."""
    p = _RopeParams()
    p.struct_size = ctypes.sizeof(_RopeParams)
    if rope is True:
        return p
    if not isinstance(rope, dict):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"rope={rope!r}: expected True or a dict of "
                       f"{sorted(_ROPE_KEYS)}")
    unknown = set(rope) - _ROPE_KEYS
    if unknown:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"rope: unknown keys {sorted(unknown)} (known: "
                       f"{sorted(_ROPE_KEYS)})")
    p.rotary_dim = integer(rope.get("rotary_dim", 0), "rope['rotary_dim']")
    p.interleaved = 1 if rope.get("interleaved", False) else 0
    p.theta = real(rope.get("theta", 0.0), "rope['theta']")
    for field in ("cos", "sin"):
        if rope.get(field) is not None:
            arr = as_numpy(rope[field], f"rope['{field}']")
            t = tensor_view(arr, f"rope['{field}']")
            keep += [arr, t]
            setattr(p, field, ctypes.addressof(t))
    return p


def _scale(scale, name, keep):
    """The address of an SdpaTensor over a write scale (a float, or a float32 [1] / [Hkv] array)."""
    if scale is None:
        return None
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        arr = np.array([scale], dtype=np.float32)
    else:  # its dtype, rank and shape are the library's to check
        arr = as_numpy(scale, name)
    t = tensor_view(arr, name)
    keep += [arr, t]
    return ctypes.addressof(t)


def _cache_view(cache, name, kind):
    cache = as_numpy(cache, name, writable=True)
    if kind is None:
        return cache, tensor_view(cache, name, writable=True)
    if kind not in KV8_DTYPES:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"{name[0]}_dtype={kind!r} is not one of {sorted(KV8_DTYPES)}")
    return cache, kv8_view(cache, name, kind)


def kv_write(key_cache, value_cache, key, value, slot_mapping, *, k_dtype=None, v_dtype=None, k_scale=None,
             v_scale=None, rope=None, positions=None):
    """Scatter new K/V rows into a cache by slot index (sdpa_kv_write / 0.6 sdpa_kv_write_ex;
    vLLM's reshape_and_cache slot_mapping contract), in place, without copies of the cache.

    key_cache [num_blocks, Hkv, block_size, E], value_cache [num_blocks, Hkv, block_size, Ev]:
        writable arrays (any strides: vLLM's [num_blocks, block_size, Hkv, E] cache is
        ``cache.transpose(0, 2, 1, 3)``, torch ``cache.permute(0, 2, 1, 3)``; a dense [B, Hkv, S, E] cache is the pool with
        num_blocks = B, block_size = S); float32, float16 or bfloat16 (torch).
        0.6, 8-bit caches: the cache's bytes as a uint8 array with k_dtype= / v_dtype= naming
        the format, as scaled_dot_product_attention reads them: "q8_0" (ggml block_q8_0: the
        last axis holds E / 32 blocks of 34 bytes), "fp8_e4m3", "fp8_e5m2" (one byte each).
        q8_0 blocks are quantized as ggml's quantize_row_q8_0_ref (bit for bit); FP8 stores
        x / scale rounded to nearest even, saturating to +-448 / +-57344 (vLLM).
    key [T, Hkv, E], value [T, Hkv, Ev]: the new rows, float32, float16 or bfloat16; converted to
        the cache dtype (round-to-nearest-even; exact when equal or wider).
    slot_mapping: T integers (converted to int64): row t goes to block slot // block_size,
        slot slot % block_size; a negative slot skips the row (padding, as vLLM).
    value_cache and value may both be None (keys only).
    k_scale, v_scale (0.6): FP8 caches only: a float or a float32 [1] / [Hkv] array, finite and
        > 0 (the same scales scaled_dot_product_attention's k_scale= / v_scale= then read).
    rope, positions (0.6): RoPE on the key rows before they are stored: rope=True (NeoX pairs,
        rotary_dim = E, theta 10000) or a dict with rotary_dim, interleaved (GPT-J pairs),
        theta, cos / sin (float32 tables [max_pos, rotary_dim / 2]); positions: T integers, the
        rows' positions. Both or neither.

    Every slot (and scale, position) is validated before anything is written: a slot >=
    num_blocks * block_size raises SdpaShapeError with status SDPA_ERR_INDEX naming the row and
    value. Rows are written in order (two rows naming one slot: the later wins). Returns None."""
    lib = _lib.get()
    key_cache, tkc = _cache_view(key_cache, "key_cache", k_dtype)
    key = as_numpy(key, "key")
    tk = tensor_view(key, "key")
    tvc = None
    if value_cache is not None:
        value_cache, tvc = _cache_view(value_cache, "value_cache", v_dtype)
    tv = tensor_view(value, "value") if value is not None else None
    extended = (k_scale is not None or v_scale is not None or rope is not None or positions is not None)
    keep = []
    opt = None
    if extended:
        opt = _KvWriteOptions()
        opt.struct_size = ctypes.sizeof(_KvWriteOptions)
        opt.k_scale = _scale(k_scale, "k_scale", keep)
        opt.v_scale = _scale(v_scale, "v_scale", keep)
        if rope is not None and rope is not False:
            rp = _rope_params(rope, keep)
            keep.append(rp)
            opt.rope = ctypes.addressof(rp)
    call = (lambda *a: lib.sdpa_kv_write_ex(*a, ctypes.addressof(opt))) if extended else lib.sdpa_kv_write
    if key.ndim != 3:  # the library names the rank; slot_mapping's length needs key's T
        lib.check(call(tkc, tvc, tk, tv, None))
    slots = int64_vector(slot_mapping, key.shape[0], "slot_mapping", per="row of key (T)")
    if extended and positions is not None:
        pos = int64_vector(positions, key.shape[0], "positions", per="row of key (T)")
        if not pos.size:  # T = 0: nothing is read, but rope still comes with positions
            pos = np.zeros(1, dtype=np.int64)
        keep.append(pos)
        opt.positions = address(pos)
    status = call(tkc, tvc, tk, tv, address(slots) if slots.size else None)
    lib.check(status)
    del slots, keep


def alibi_slopes(num_heads, max_bias=8.0):
    """ALiBi slopes of the paper for num_heads heads (sdpa_alibi_slopes: Press et al. 2022, the
    same rule as Hugging Face's get_alibi_slopes and llama.cpp; non-power-of-two H takes the
    first H - n odd-numbered slopes of the 2n-head sequence, n the largest power of two <= H):
    a new float32 array [num_heads], to pass as ``alibi_slopes=``. max_bias = 8 (the paper's)
    gives 1/2, 1/4, ..., 1/256 for 8 heads. 1 <= num_heads < 2**31, max_bias > 0 and finite
    as a float32, else SdpaArgumentError. (alibi_slopes= takes any finite float32 slopes,
    negative ones too: those reward distance instead of penalising it.)"""
    lib = _lib.get()
    num_heads = integer(num_heads, "num_heads")
    if not 1 <= num_heads < 2 ** 31:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"num_heads={num_heads} must be in [1, 2**31)")
    max_bias = real(max_bias, "max_bias")
    # The C argument is a float: say the value given, not the inf or 0 it would round to.
    if abs(max_bias) > _FLT_MAX or (max_bias != 0.0 and np.float32(max_bias) == 0.0):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT", f"max_bias={max_bias!r} is not representable "
                       f"as a float32 (the library's max_bias is float: it would be "
                       f"{float(np.float32(max_bias)) if abs(max_bias) <= _FLT_MAX else 'inf'}); "
                       f"expected > 0 and finite")
    out = np.empty(num_heads, dtype=np.float32)
    lib.check(lib.sdpa_alibi_slopes(num_heads, max_bias, address(out)))
    return out


def request_amx(raise_error=False):
    """Ask Linux for this process's permission to use Intel AMX tile data (sdpa_request_amx:
    the application's explicit opt-in; the library never asks on its own). Returns True when
    permission is granted (now or earlier). When the CPU or OS lacks AMX-BF16 or Linux refused:
    False, or with raise_error=True an SdpaArgumentError (status SDPA_ERR_UNSUPPORTED) carrying
    the library's reason. With permission, ``precision="reduced"`` bf16 prefill calls use
    AMX-BF16 tiles."""
    lib = _lib.get()
    status = lib.sdpa_request_amx()
    if status != 0 and raise_error:
        lib.check(status)
    return status == 0


def amx_available():
    """True iff the CPU has AMX-BF16 with OS support and this process already has permission
    (sdpa_amx_available; never requests it)."""
    return bool(_lib.get().sdpa_amx_available())
