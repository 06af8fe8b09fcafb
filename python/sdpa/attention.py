"""scaled_dot_product_attention and merge over numpy arrays."""
import contextlib
import ctypes
import dataclasses
import inspect

import numpy as np

from . import _lib
from ._arrays import as_numpy, kind_of, new_array, wrap
from ._errors import py_error
from .serving import ThreadPool
from ._views import (F32, KV8_DTYPES, attach_vector, attach_view, choice, float32_vector, int32,
                     int32_table, int64, is_additive, kv8_view, kv8_width, mask_view, real,
                     sdpa_dtype, table_address, tensor_view, uint64)

__all__ = ["scaled_dot_product_attention", "cost", "Cost", "merge", "last_kernel", "ALIGNMENTS", "EMPTY_ROWS",
           "WEIGHTS_STAGES", "KERNELS", "PRECISIONS"]

#: sdpa_alignment by name.
ALIGNMENTS = {"top_left": 0, "bottom_right": 1, "offsets": 2}
#: sdpa_empty_rows by name.
EMPTY_ROWS = {"error": 0, "zero": 1}
#: sdpa_weights_stage by name (what the weights output holds).
WEIGHTS_STAGES = {"probabilities": 0, "scores": 1, "softcapped": 2, "masked": 3}
#: sdpa_kernel by name.
KERNELS = {"auto": 0, "reference": 1, "tiled": 2, "decode": 3}
#: sdpa_precision by name (error bounds in include/sdpa.h).
PRECISIONS = {"default": 0, "f32": 1, "reduced": 2}


def last_kernel():
    """Name of the kernel that ran the last successful attention call on this thread
    ("reference", "tiled...", "decode...", "none"), or "" if none ran."""
    return _lib.get().last_kernel()


def _causal_and_alignment(causal, alignment, query_offsets):
    """(causal flag, alignment enum) from causal=None/False/True/"top_left"/"bottom_right"."""
    if causal is None or (isinstance(causal, (bool, np.bool_)) and not causal):
        flag, implied = 0, None
    elif isinstance(causal, (bool, np.bool_)):
        flag, implied = 1, None
    elif isinstance(causal, str):
        flag, implied = 1, choice(causal, ALIGNMENTS, "causal")
    elif isinstance(causal, (int, np.integer)) and int(causal) in (0, 1):
        flag, implied = int(causal), None
    else:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"causal={causal!r} must be None, False, True, 'top_left' or 'bottom_right'")
    explicit = None if alignment is None else choice(alignment, ALIGNMENTS, "alignment")
    if implied is not None and explicit is not None and implied != explicit:
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"causal={causal!r} contradicts alignment={alignment!r}")
    align = implied if implied is not None else explicit
    if align is None:
        align = ALIGNMENTS["offsets"] if query_offsets is not None else ALIGNMENTS["top_left"]
    if query_offsets is not None and align != ALIGNMENTS["offsets"]:
        named = f"causal={causal!r}" if implied is not None else f"alignment={alignment!r}"
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"query_offsets are used only with alignment='offsets' (which they imply), "
                       f"but {named} selects another alignment: drop one of them")
    return flag, align


def _window(window):
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                       f"window={window!r} must be a pair (left, right); None or -1 = unbounded"
                       ) from None
    return tuple(-1 if w is None else int64(w, f"window[{i}]") for i, w in enumerate((left, right)))


def _head_axis(array, query_ndim):
    """For rank-3 queries ([B, L, E]) PyTorch broadcasts a rank-3 mask [B, L, S] against the
    scores [B, L, S]; the library broadcasts masks to [B, H, L, S]. Insert the head axis."""
    if query_ndim == 3 and array.ndim == 3:
        return array[:, None, :, :]
    return array


def scaled_dot_product_attention(query, key, value, attn_mask=None, bias=None, causal=None,
                                 scale=None, dropout_p=0.0, seed=0, key_lengths=None,
                                 query_lengths=None, window=None, softcap=None,
                                 empty_rows="error", need_weights=False, need_lse=False, *,
                                 is_causal=None, alignment=None, query_offsets=None,
                                 dropout_offset=0, weights_stage="probabilities",
                                 check_finite=True, kernel="auto", num_threads=0, out=None,
                                 precision="default", sinks=None, alibi_slopes=None,
                                 block_table=None, cu_seqlens_q=None, cu_seqlens_k=None,
                                 threadpool=None, k_dtype=None, v_dtype=None, k_scale=None,
                                 v_scale=None):
    """Scaled dot-product attention on numpy arrays, torch CPU tensors or any array with
    __dlpack__ / __array_interface__ (libsdpa's sdpa_attention), without copies.

        out = softmax(softcap(scale * query @ key^T) + bias, masked) @ value

    Shapes: query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] -> out
    [B, Hq, L, Ev]; rank 3 ([B, L, E]) means one head. Hq % Hkv == 0 (GQA: query head h reads
    kv head h // (Hq // Hkv)). Any strides: a [B, L, H, E] buffer is passed as
    ``x.transpose(0, 2, 1, 3)`` (torch: ``x.transpose(1, 2)``). Inputs are never copied or
    converted: float32, float16 and bfloat16 (torch) views are passed with their dtype (the
    library answers SdpaDtypeError for a dtype it does not compute); other dtypes raise
    SdpaDtypeError; strides must be whole elements (else SdpaShapeError).

    attn_mask: bool/uint8 = allow-mask (True = the key takes part, as PyTorch SDPA), or
        float32 / float16 / bfloat16 = additive (0 / -inf, as PyTorch), passed to the library
        as the bias in its dtype (added to `bias` when both are given, in a new float32 array:
        then both must be float32). Broadcast to [B, Hq, L, S] right-aligned; for rank-3
        inputs a rank-3 mask is [B, L, S].
    bias: float32 / float16 / bfloat16 additive bias, broadcast like attn_mask; -inf blocks
        the key.
    causal: None/False = off; True = the causal rule at `alignment` (default "top_left":
        key j <= query i, PyTorch is_causal, torch.tril; "offsets" when query_offsets are
        given); "top_left" / "bottom_right" name the alignment too ("bottom_right" = j <= i +
        S_b - L_b: KV-cache decode, FlashAttention); "offsets" = j <= i + query_offsets[b].
        ``is_causal`` is accepted as PyTorch's name.
    scale: None = 1/sqrt(E); a positive float replaces it (0 is rejected: the library reads 0
        as "default").
    dropout_p, seed, dropout_offset: dropout on the probabilities that form `out` (p in
        [0, 1)); deterministic in (seed, offset, b, h, i, j) (a packed sequence r draws as
        b = r, i and j counted within it). There is no training mode: pass
        0 for inference. Returned weights and lse are pre-dropout.
    key_lengths, query_lengths: per-batch [B] valid counts (right padding); rows
        i >= query_lengths[b] are exact zeros. Converted to int64 (small, not viewed).
    window: (left, right) sliding window, inclusive counts of other keys; None or -1 =
        unbounded on that side. Hugging Face sliding_window=W with causal is (W - 1, 0).
    softcap: None = off; c > 0 caps scores as c * tanh(s / c) before bias and mask.
    empty_rows: "error" (SdpaValueError for a row with no allowed key) or "zero" (zero output
        row, zero weights, lse = -inf; with sinks, lse = the head's sink).
    need_weights / need_lse: also return weights [B, Hq, L, S] (per weights_stage:
        "probabilities", "scores", "softcapped", "masked") / lse [B, Hq, L] (natural log).
    alignment: "top_left" / "bottom_right" / "offsets" for the causal and window rules when
        `causal` does not name it; query_offsets ([B] ints) implies "offsets" (and another
        alignment named with them raises SdpaArgumentError instead of ignoring them).
    check_finite: False skips the library's NaN/Inf scan of the inputs.
    kernel: "auto", "reference", "tiled" or "decode"; num_threads: 0 = online CPUs.
    out: optional array [B, Hq, L, Ev] (any positive strides; numpy, torch tensor, ...) to
        write into; it is returned as given. Without it, out is new, of the query's dtype.
    precision: "default" (= "f32": float32 scores, softmax and accumulation) or "reduced" (the
        kernel may round probabilities to V's dtype and use bf16 dot products when q and k are
        bf16: AVX512-BF16, AMX after request_amx()); error bounds in include/sdpa.h.

    Serving (libsdpa 0.5; docs/serving.md):
    sinks: float32 [Hq] attention-sink logits (gpt-oss sinks, vLLM s_aux, ONNX Runtime
        head_sink): exp(sinks[h]) joins each row's softmax denominator (and lse) only.
    alibi_slopes: float32 [Hq] or [B, Hq] ([num_seqs, Hq] when packed): s_ij -= slope *
        |p - j| with p the aligned position of query i (FlashAttention's alibi_slopes with
        causal="bottom_right"). p follows `alignment`/`causal` even without the causal rule:
        a decode call (L = 1 over S cached keys) needs causal="bottom_right" or
        alignment="bottom_right", else p = i = 0 measures distances from the first key; a
        packed batch is bottom-right per sequence (or i + query_offsets[r] with
        query_offsets). Any finite float32 slopes (negative ones too); alibi_slopes() gives
        the paper's.
        sinks and alibi_slopes must be C-contiguous float32 (never converted).
    block_table: paged K/V (vLLM block_tables, FlashAttention-2 block_table): key and value
        are block pools [num_blocks, Hkv, block_size, E] / [..., Ev] (vLLM's [num_blocks,
        block_size, Hkv, E] cache is ``cache.transpose(0, 2, 1, 3)``, in torch
        ``cache.permute(0, 2, 1, 3)``), block_table an integer [B, max_blocks] array,
        max_blocks >= 1 (int32 with a contiguous last axis is viewed; other integer arrays
        and lists are converted exactly, every entry must fit in int32; bools and floats
        raise SdpaDtypeError), key_lengths required; key j of sequence b is slot
        j % block_size of block block_table[b, j // block_size]. A bad entry a valid key
        reaches raises SdpaShapeError with status SDPA_ERR_INDEX before anything is written;
        slots past key_lengths[b] and unreferenced blocks are never read. weights have
        S = max_blocks * block_size.
    cu_seqlens_q, cu_seqlens_k: packed variable-length batch (FlashAttention
        flash_attn_varlen_func): integer [num_seqs + 1] arrays; sequence r owns query rows
        [cu_seqlens_q[r], cu_seqlens_q[r+1]) of query [1, Hq, total_q, E] (rank 4 only;
        FlashAttention's [total_q, Hq, E] buffer is ``x.transpose(1, 0, 2)[None]``, in torch
        ``x.transpose(0, 1)[None]``) and key rows
        [cu_seqlens_k[r], cu_seqlens_k[r+1]) of key/value [1, Hkv, total_k, E], or row r of
        block_table (then key_lengths[r]) for a paged cache. Causal and windows are
        bottom-right per sequence; key_lengths, query_offsets and [num_seqs, Hq] slopes are per
        sequence; attn_mask, bias, query_lengths and weights are not available.
    threadpool: a ThreadPool; the call runs on its threads and starts none of its own
        (num_threads > 0 caps the threads used). close() waits for this call to return.

    8-bit K/V caches (libsdpa 0.6; docs/serving.md): numpy and this torch have no q8_0 or fp8
    dtypes, so such a cache is passed as its bytes, a uint8 array (any strides, no copy), with
    k_dtype= / v_dtype= naming the format: "q8_0" (ggml block_q8_0, llama.cpp --cache-type-k
    q8_0: the last axis holds E / 32 blocks of 34 bytes, contiguous; [..., E / 32 * 34] bytes
    mean [..., E] elements), "fp8_e4m3" (OCP E4M3FN, torch.float8_e4m3fn, vLLM "fp8") or
    "fp8_e5m2" (one byte per element). torch float8_e4m3fn / float8_e5m2 tensors (torch >= 2.1)
    are taken as such, without k_dtype. K and V formats are independent (q8_0 K with float16
    V). k_scale, v_scale: FP8 scales (vLLM k_scale / v_scale): a float, or a float32 [1] /
    [Hkv] array; value = fp8 * scale. Each stored value is dequantized exactly; attention then
    runs in float32 as for a float32 cache (error bound: include/sdpa.h).
    Integer metadata (key_lengths, query_lengths, query_offsets, block_table, cu_seqlens_*):
        integer arrays or lists of ints; bools and floats (even 3.0) raise SdpaDtypeError.

    Returns (numpy arrays, or torch tensors when query is a torch tensor; with out= given,
    weights and lse follow out's type): `out` alone when need_weights and need_lse are both false; otherwise a tuple
    ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)``: out first, then the requested
    extras in the order weights, lse.

    Raises SdpaError subclasses: SdpaShapeError (shapes, broadcast, strides, overlap, and
        SDPA_ERR_INDEX: a bad block_table / cu_seqlens entry),
    SdpaDtypeError, SdpaArgumentError (options), SdpaValueError (empty rows, NaN/Inf),
    SdpaResourceError. On error nothing is written to `out`.
    """
    return _call(dict(locals()), None)


_PARAMS = None  # the signature of scaled_dot_product_attention (cost() binds to it)


def cost(query, key, value, *args, exact=False, **kwargs):
    """What ``scaled_dot_product_attention`` would do with these arguments, without running it
    (libsdpa's sdpa_attention_cost, 0.6): the same positional and keyword arguments (``out=``,
    ``need_weights``, ``need_lse`` included; nothing is allocated or written), plus
    ``exact=True`` to scan the allow-mask and bias values (an O(B*Hq*L*S) read) so that pairs,
    empty rows and the bytes they decide are exact.

    It validates everything the call validates without reading q/k/v values, and raises the
    same SdpaError the call would for it (SdpaShapeError for mismatched shapes, SdpaArgumentError
    for a kernel that cannot serve the call, SdpaValueError for empty rows under
    empty_rows="error" where they are known: always without a mask or bias, and with exact=True;
    pass empty_rows="zero" to count them instead). NaN/Inf in the values are not looked at.

    Returns a Cost: kernel (the name sdpa.last_kernel() would report, e.g. "tiled-avx512"),
    threads, workspace_bytes, exact (False when a mask or bias was not scanned: pairs and bytes
    are then upper bounds, empty_rows a lower bound), query_rows, allowed_pairs (the attended
    (query row, key) pairs), skipped_pairs (the other pairs of the [B, Hq, L, S] score matrix),
    empty_rows, flops (2 per multiply-add: 2 * (E + Ev) per allowed pair), bytes_read_q / _k / _v
    / _mask / _bias and bytes_written_out / _weights / _lse (their definitions: sdpa_cost in
    include/sdpa.h)."""
    global _PARAMS
    if _PARAMS is None:
        _PARAMS = inspect.signature(scaled_dot_product_attention)
    bound = _PARAMS.bind(query, key, value, *args, **kwargs)
    bound.apply_defaults()
    return _call(dict(bound.arguments), bool(exact))


@dataclasses.dataclass(frozen=True)
class Cost:
    """The answer of sdpa.cost() (sdpa_cost of include/sdpa.h; counts in pairs, FLOPs, bytes)."""
    kernel: str
    kernel_choice: str
    threads: int
    workspace_bytes: int
    exact: bool
    query_rows: int
    allowed_pairs: int
    skipped_pairs: int
    empty_rows: int
    flops: int
    bytes_read_q: int
    bytes_read_k: int
    bytes_read_v: int
    bytes_read_mask: int
    bytes_read_bias: int
    bytes_written_out: int
    bytes_written_weights: int
    bytes_written_lse: int

    @property
    def bytes_read(self):
        """All bytes read: q, k, v, mask and bias."""
        return (self.bytes_read_q + self.bytes_read_k + self.bytes_read_v + self.bytes_read_mask
                + self.bytes_read_bias)

    @property
    def bytes_written(self):
        """All bytes written: out, weights and lse."""
        return self.bytes_written_out + self.bytes_written_weights + self.bytes_written_lse

    @classmethod
    def _from_struct(cls, c):
        names = {v: k for k, v in KERNELS.items()}
        ints = {f.name: int(getattr(c, f.name)) for f in dataclasses.fields(cls)
                if f.name not in ("kernel", "kernel_choice", "exact")}
        return cls(kernel=c.kernel.decode("ascii", "replace"),
                   kernel_choice=names.get(int(c.kernel_id), "none"),
                   exact=bool(c.exact), **ints)


def _check_before_allocating(lib, tq, tk, tv, opt, tout, need_weights, need_lse, exact):
    """sdpa_attention_cost of the call (out may be None: "a valid out will be given"); raises
    the library's error. Returns the SdpaCost, or None when the library predates 0.6."""
    if not lib.has("sdpa_attention_cost"):
        if exact is not None:
            lib.sdpa_attention_cost  # raises SdpaLibraryError naming the missing function
        return None
    co = _lib.SdpaCostOptions()
    co.struct_size = ctypes.sizeof(co)
    co.flags = ((_lib.SDPA_COST_WEIGHTS if need_weights else 0) | (_lib.SDPA_COST_LSE if need_lse else 0)
                | (_lib.SDPA_COST_EXACT if exact else 0))
    c = _lib.SdpaCost()
    c.struct_size = ctypes.sizeof(c)
    status = lib.sdpa_attention_cost(tq, tk, tv, opt, tout, None, None, co, c)
    if exact is None and status == 40:  # SDPA_ERR_EMPTY_ROW: not a size problem; the call
        return c                        # itself reports it (after any earlier NaN row)
    called = None if exact is not None else ("sdpa_attention_cost", "sdpa_attention")
    lib.check(status, called)
    return c


def _call(a, exact):
    """scaled_dot_product_attention (exact is None) or cost (exact a bool) of the arguments `a`."""
    query, key, value = a["query"], a["key"], a["value"]
    attn_mask, bias, causal, scale = a["attn_mask"], a["bias"], a["causal"], a["scale"]
    dropout_p, seed, key_lengths, query_lengths = a["dropout_p"], a["seed"], a["key_lengths"], a["query_lengths"]
    window, softcap, empty_rows = a["window"], a["softcap"], a["empty_rows"]
    need_weights, need_lse, is_causal, alignment = a["need_weights"], a["need_lse"], a["is_causal"], a["alignment"]
    query_offsets, dropout_offset, weights_stage = a["query_offsets"], a["dropout_offset"], a["weights_stage"]
    check_finite, kernel, num_threads, out = a["check_finite"], a["kernel"], a["num_threads"], a["out"]
    precision, sinks, alibi_slopes, block_table = a["precision"], a["sinks"], a["alibi_slopes"], a["block_table"]
    cu_seqlens_q, cu_seqlens_k, threadpool = a["cu_seqlens_q"], a["cu_seqlens_k"], a["threadpool"]
    k_dtype, v_dtype, k_scale, v_scale = a["k_dtype"], a["v_dtype"], a["k_scale"], a["v_scale"]
    del a
    lib = _lib.get()
    # Results come back as the caller's type: `out` itself when given, else torch tensors for
    # torch inputs and numpy arrays otherwise. Every array below is a numpy view of the
    # caller's memory (_arrays.as_numpy), never a copy.
    out_given = out
    like = kind_of(query)
    origin = {"query": like, "key": kind_of(key), "value": kind_of(value)}  # for error hints
    key, k_dtype = _torch_fp8(key, k_dtype)
    value, v_dtype = _torch_fp8(value, v_dtype)
    query = as_numpy(query, "query")
    key = as_numpy(key, "key")
    value = as_numpy(value, "value")
    kinds = {"query": None, "key": k_dtype, "value": v_dtype}
    for name, a in (("query", query), ("key", key), ("value", value)):
        if a.ndim < 2:
            if kinds[name] is None:
                tensor_view(a, name, origin=origin[name])  # raises the precise error (dtype, rank)
            raise py_error("SDPA_ERR_RANK", f"{name}.ndim={a.ndim}, expected 3 or 4")
    tq = tensor_view(query, "query", origin=origin["query"])
    tk = tensor_view(key, "key", origin=origin["key"]) if k_dtype is None else kv8_view(key, "key", k_dtype)
    tv = tensor_view(value, "value", origin=origin["value"]) if v_dtype is None else kv8_view(value, "value", v_dtype)
    qnd = query.ndim

    ev = value.shape[-1] if v_dtype is None else kv8_width(value, v_dtype)
    out_shape = query.shape[:-1] + (ev,)
    tout = None
    if out is not None:
        like = None
        out = as_numpy(out, "out", writable=True)
        if out.shape != out_shape:
            raise py_error("SDPA_ERR_SHAPE", f"out has shape {out.shape}, expected {out_shape}")
        tout = tensor_view(out, "out", writable=True)
    weights = lse = tw = tl = None
    table = cu_q = cu_k = None
    if block_table is not None:
        table, table_stride = int32_table(block_table, "block_table", 2)

    opt = _lib.SdpaOptions()
    lib.sdpa_options_init_sized(opt, ctypes.sizeof(opt))

    if is_causal is not None:
        if causal is not None and bool(causal) != bool(is_causal):
            raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                           f"causal={causal!r} and is_causal={is_causal!r} disagree")
        if causal is None:
            causal = is_causal
    opt.causal, opt.alignment = _causal_and_alignment(causal, alignment, query_offsets)

    if scale is not None:
        scale = real(scale, "scale")
        if scale == 0.0:
            raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                           "scale=0 is not supported (libsdpa reads 0 as the default "
                           "1/sqrt(E)); pass scale=None for the default")
        opt.scale = scale
    if softcap is not None:
        opt.softcap = real(softcap, "softcap")

    # Masks and biases. Every array used by the call stays referenced by a local variable.
    mask_arr = bias_arr = None
    if attn_mask is not None:
        attn_mask = as_numpy(attn_mask, "attn_mask")
        if is_additive(attn_mask, "attn_mask"):
            bias_arr = _head_axis(attn_mask, qnd)
        else:
            mask_arr = _head_axis(attn_mask, qnd)
    if bias is not None:
        b = _head_axis(as_numpy(bias, "bias"), qnd)
        if bias_arr is None:
            bias_arr = b
        else:
            tensor_view(b, "bias")  # dtype/rank errors before combining
            if bias_arr.dtype != F32 or b.dtype != F32:
                raise py_error("SDPA_ERR_DTYPE", "a float attn_mask and a bias are summed into "
                               "a new float32 array: both must be float32")
            bias_arr = np.add(bias_arr, b, dtype=np.float32)
    tmask = attach_view(opt, "allow_mask", mask_view, mask_arr, "attn_mask")
    tbias = attach_view(opt, "bias", tensor_view, bias_arr, "bias")

    batch = query.shape[0]
    if cu_seqlens_q is not None:
        cu_q, _ = int32_table(cu_seqlens_q, "cu_seqlens_q", 1)
        if cu_q.shape[0] < 1:
            raise py_error("SDPA_ERR_SHAPE", "cu_seqlens_q has no entries, expected num_seqs + 1 "
                           ">= 1 (starting at 0)")
        batch = opt.num_seqs = cu_q.shape[0] - 1
        opt.cu_seqlens_q = table_address(cu_q)
    if cu_seqlens_k is not None:
        cu_k, _ = int32_table(cu_seqlens_k, "cu_seqlens_k", 1)
        if cu_q is not None and cu_k.shape[0] != cu_q.shape[0]:
            raise py_error("SDPA_ERR_SHAPE", f"cu_seqlens_k has {cu_k.shape[0]} entries and "
                           f"cu_seqlens_q {cu_q.shape[0]}: both are num_seqs + 1")
        opt.cu_seqlens_k = table_address(cu_k)  # never NULL: NULL means "not packed"
    if table is not None:
        opt.block_table = table_address(table)  # an empty table still selects the paged cache
        opt.block_table_stride = table_stride
        opt.max_blocks_per_seq = table.shape[1]
        if table.shape[0] != batch:
            what = "num_seqs (cu_seqlens_q)" if cu_q is not None else "the query's batch"
            raise py_error("SDPA_ERR_SHAPE", f"block_table has {table.shape[0]} rows, expected "
                           f"{batch} ({what})")
    per = "packed sequence of cu_seqlens_q" if cu_q is not None else "batch"
    kl = attach_vector(opt, "key_lengths", key_lengths, batch, "key_lengths", per)
    ql = attach_vector(opt, "query_lengths", query_lengths, batch, "query_lengths", per)
    qo = attach_vector(opt, "query_offsets", query_offsets, batch, "query_offsets", per)

    win = _window(window)
    if win is not None:
        opt.sliding_window = 1
        opt.window_left, opt.window_right = win

    opt.empty_rows = choice(empty_rows, EMPTY_ROWS, "empty_rows")
    opt.weights_stage = choice(weights_stage, WEIGHTS_STAGES, "weights_stage")
    opt.skip_finite_check = 0 if check_finite else 1
    opt.dropout_p = real(dropout_p, "dropout_p")
    opt.dropout_seed = uint64(seed, "seed")
    opt.dropout_offset = uint64(dropout_offset, "dropout_offset")
    opt.kernel = choice(kernel, KERNELS, "kernel")
    opt.num_threads = int32(num_threads, "num_threads", minimum=0)
    opt.precision = choice(precision, PRECISIONS, "precision")

    # 0.6: FP8 scales (float32 [1] or [Hkv]; a Python float becomes a new [1] array)
    k_scale_arr, tks = _scale_view(opt, "k_scale", k_scale)
    v_scale_arr, tvs = _scale_view(opt, "v_scale", v_scale)

    sink_arr = slope_arr = None
    heads = query.shape[1] if qnd == 4 else 1  # Hq (rank 3: one head)
    if sinks is not None:
        sink_arr = float32_vector(sinks, "sinks", origin=kind_of(sinks))
        if sink_arr.shape[0] != heads:
            raise py_error("SDPA_ERR_SHAPE", f"sinks has shape {sink_arr.shape}, expected "
                           f"({heads},) (one per query head)")
        opt.sinks = table_address(sink_arr)
    if alibi_slopes is not None:
        slope_arr = float32_vector(alibi_slopes, "alibi_slopes", ndims=(1, 2), origin=kind_of(alibi_slopes))
        want = (heads,) if slope_arr.ndim == 1 else (batch, heads)
        if slope_arr.shape != want:
            raise py_error("SDPA_ERR_SHAPE", f"alibi_slopes has shape {slope_arr.shape}, "
                           f"expected {want} ([Hq], or [B, Hq] with one row per "
                           + ("packed sequence)" if cu_q is not None else "batch)"))
        opt.alibi_slopes_rank = slope_arr.ndim
        opt.alibi_slopes = table_address(slope_arr)
    if threadpool is not None:
        if not isinstance(threadpool, ThreadPool):
            raise py_error("SDPA_ERR_INVALID_ARGUMENT",
                           f"threadpool must be a sdpa.ThreadPool, got {type(threadpool).__name__}")
        pool = threadpool.in_use()  # SdpaArgumentError once closed; close() waits
    else:
        pool = contextlib.nullcontext(None)
    with pool as handle:
        if handle is not None:
            opt.threadpool = handle
        # Nothing is allocated before the library has validated the call: a mismatched call
        # raises the library's error (SdpaShapeError, ...), never numpy's MemoryError for an
        # out it would not have written (sdpa_attention_cost with out = NULL).
        if exact is not None or tout is None or need_weights or need_lse:
            c = _check_before_allocating(lib, tq, tk, tv, opt, tout, need_weights, need_lse, exact)
            if exact is not None:
                return Cost._from_struct(c)
        if out is None:
            # out takes the query's dtype (as torch does); weights and lse are float32.
            out_dtype = query.dtype if sdpa_dtype(query.dtype) is not None else F32
            out, out_given = new_array(out_shape, out_dtype, like)
            tout = tensor_view(out, "out", writable=True)
        result_like = like or kind_of(out_given)
        if need_weights:
            s_len = key.shape[-2] if table is None else table.shape[1] * key.shape[-2]
            weights = np.empty(query.shape[:-1] + (s_len,), dtype=np.float32)
            tw = tensor_view(weights, "weights", writable=True)
        if need_lse:
            lse = np.empty(query.shape[:-1], dtype=np.float32)
            tl = tensor_view(lse, "lse", writable=True)
        status = lib.sdpa_attention(tq, tk, tv, opt, tout, tw, tl)
    lib.check(status)
    # The arrays the views point into were alive until here (locals of this frame).
    del mask_arr, bias_arr, kl, ql, qo, table, cu_q, cu_k, sink_arr, slope_arr, threadpool
    del k_scale_arr, v_scale_arr, tks, tvs

    if weights is None and lse is None:
        return out_given
    result = (out_given,)
    if weights is not None:
        result += (wrap(weights, result_like),)
    if lse is not None:
        result += (wrap(lse, result_like),)
    return result


_TORCH_FP8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def _torch_fp8(x, kind):
    """A torch float8 tensor (torch >= 2.1) as its uint8 bytes and its format name."""
    if kind is not None or kind_of(x) != "torch":
        return x, kind
    name = str(x.dtype).replace("torch.", "")
    if name not in _TORCH_FP8:
        return x, kind
    import sys
    return x.view(sys.modules["torch"].uint8), _TORCH_FP8[name]


def _scale_view(opt, field, scale):
    """options.k_scale / v_scale from a float or a float32 [1] / [Hkv] array (0.6)."""
    if scale is None:
        return None, None
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        arr = np.array([scale], dtype=np.float32)
    else:  # any strides; its dtype, rank and shape are the library's to check
        arr = as_numpy(scale, field)
    t = tensor_view(arr, field, origin=kind_of(scale))
    setattr(opt, field, ctypes.addressof(t))
    return arr, t


def merge(out_a, lse_a, out_b, lse_b):
    """Merge attention over two disjoint key sets of the same queries (sdpa_merge): from
    (out_a, lse_a) over keys A and (out_b, lse_b) over keys B, return (out, lse) over A and B,
    as if attention had run once over all the keys.

    out_a, out_b: float32 [..., Ev], same shape; lse_a, lse_b: float32 [...] (the out shape
    without its last axis). Any strides, no copies. A row whose lse is -inf on one side takes
    the other side; -inf on both gives a zero row and lse = -inf. +inf (FlashAttention-2's lse
    of a row with no key) is read as -inf, as vLLM's merge_attn_states. Dropout does not
    split (sdpa_merge in sdpa.h): give each part its own dropout_offset.
    Returns (out, lse), new arrays."""
    lib = _lib.get()
    like = kind_of(out_a)
    out_a, lse_a = as_numpy(out_a, "out_a"), as_numpy(lse_a, "lse_a")
    out_b, lse_b = as_numpy(out_b, "out_b"), as_numpy(lse_b, "lse_b")
    f32 = dict(float32_only="sdpa_merge", origin=like)
    ta = tensor_view(out_a, "out_a", **f32)
    tla = tensor_view(lse_a, "lse_a", **f32)
    tb = tensor_view(out_b, "out_b", **f32)
    tlb = tensor_view(lse_b, "lse_b", **f32)
    out = np.empty(out_a.shape, dtype=np.float32)
    lse = np.empty(out_a.shape[:-1] if out_a.ndim > 1 else (1,), dtype=np.float32)
    tout = tensor_view(out, "out", writable=True)
    tlse = tensor_view(lse, "lse", writable=True)
    lib.check(lib.sdpa_merge(ta, tla, tb, tlb, tout, tlse))
    return wrap(out, like), wrap(lse, like)
