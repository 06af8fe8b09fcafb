"""sdpa: Python bindings (ctypes + numpy) of libsdpa, validated scaled dot-product attention.

    import numpy as np, sdpa
    out = sdpa.scaled_dot_product_attention(q, k, v, causal=True)      # q [B, H, L, E] float32
    out, lse = sdpa.scaled_dot_product_attention(q, k, v, need_lse=True)
    c = sdpa.cost(q, k, v, causal=True)   # validated, nothing run: c.allowed_pairs, c.flops, c.kernel
    layer = sdpa.MultiheadAttention.from_state_dict(state_dict, num_heads=8)
    y, w = layer(x, x, x)
    out = sdpa.scaled_dot_product_attention(q, k_pool, v_pool, block_table=table,
                                            key_lengths=lens, causal="bottom_right")  # paged

Arrays of any strides (numpy, torch CPU tensors, objects with __dlpack__ or
__array_interface__; float32, float16, bfloat16) are passed to the library as views, never
copied or converted; results are torch tensors for torch inputs. Errors raise sdpa.SdpaError
subclasses carrying the status and the library's message. The library is found through
$SDPA_LIBRARY, then the copy bundled with an installed package (pip), then this checkout's
build*/ directories (only from inside a checkout), then the system loader (see sdpa._lib), and must be libsdpa 0.x with
x >= 5.
"""
from ._errors import (STATUS_NAMES, SdpaArgumentError, SdpaDtypeError, SdpaError,
                      SdpaInternalError, SdpaLibraryError, SdpaResourceError, SdpaShapeError,
                      SdpaValueError, SdpaVersionError)
from ._lib import EXPECTED_VERSION, load_library
from .attention import (ALIGNMENTS, EMPTY_ROWS, KERNELS, PRECISIONS, WEIGHTS_STAGES, Cost, cost,
                        last_kernel, merge, scaled_dot_product_attention)
from .masks import (allow_and, allow_from_additive, allow_from_ignore, allow_from_keep_int,
                    allow_to_additive, block_diagonal_allow_mask, causal_allow_mask,
                    count_empty_rows, padding_allow_mask, prefix_lm_allow_mask,
                    sliding_window_allow_mask)
from .mha import MultiheadAttention
from .serving import ThreadPool, alibi_slopes, amx_available, kv_write, request_amx
from .rope import rope, rope_params

__version__ = "0.5.0"

__all__ = [
    "scaled_dot_product_attention", "cost", "Cost", "merge", "MultiheadAttention", "last_kernel",
    "causal_allow_mask", "padding_allow_mask", "sliding_window_allow_mask",
    "block_diagonal_allow_mask", "prefix_lm_allow_mask", "allow_and", "allow_from_ignore",
    "allow_from_keep_int", "allow_from_additive", "allow_to_additive", "count_empty_rows",
    "SdpaError", "SdpaArgumentError", "SdpaShapeError", "SdpaDtypeError", "SdpaValueError",
    "SdpaResourceError", "SdpaInternalError", "SdpaLibraryError", "SdpaVersionError",
    "ThreadPool", "kv_write", "rope", "rope_params", "alibi_slopes", "request_amx", "amx_available",
    "STATUS_NAMES", "ALIGNMENTS", "EMPTY_ROWS", "WEIGHTS_STAGES", "KERNELS", "PRECISIONS",
    "library", "load_library", "library_version", "EXPECTED_VERSION", "__version__",
]


def library():
    """The loaded libsdpa (loading it on first use): .path, .origin, .version (a tuple),
    .version_string."""
    from . import _lib
    return _lib.get()


def library_version():
    """The version string of the loaded libsdpa, e.g. "0.5.0"."""
    return library().version_string
