"""Exceptions of the sdpa package.

Every failed libsdpa call raises an SdpaError (or a subclass chosen by the status family),
carrying the numeric status, its name and the library's detail message. Checks that the
package makes itself before calling the library (a float64 array, a stride that is not a whole
number of elements, an unknown option name) raise the same classes with the status the library
would have used, so one ``except`` clause covers both.
"""

__all__ = [
    "SdpaError", "SdpaArgumentError", "SdpaShapeError", "SdpaDtypeError", "SdpaValueError",
    "SdpaResourceError", "SdpaInternalError", "SdpaLibraryError", "SdpaVersionError",
    "STATUS_NAMES",
]

#: Status codes of include/sdpa.h (sdpa_status). Grouped by tens, never renumbered.
STATUS_NAMES = {
    0: "SDPA_OK",
    10: "SDPA_ERR_NULL_POINTER",
    11: "SDPA_ERR_INVALID_ARGUMENT",
    12: "SDPA_ERR_STRUCT_VERSION",
    13: "SDPA_ERR_UNSUPPORTED",
    20: "SDPA_ERR_RANK",
    21: "SDPA_ERR_SHAPE",
    22: "SDPA_ERR_BROADCAST",
    23: "SDPA_ERR_STRIDE",
    24: "SDPA_ERR_OVERLAP",
    25: "SDPA_ERR_SIZE_OVERFLOW",
    26: "SDPA_ERR_EMPTY_DIMENSION",
    27: "SDPA_ERR_INDEX",
    28: "SDPA_ERR_ALIGNMENT",
    30: "SDPA_ERR_DTYPE",
    40: "SDPA_ERR_EMPTY_ROW",
    41: "SDPA_ERR_NON_FINITE",
    50: "SDPA_ERR_OUT_OF_MEMORY",
    51: "SDPA_ERR_WORKSPACE_TOO_SMALL",
    60: "SDPA_ERR_INTERNAL",
}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


class SdpaError(Exception):
    """A libsdpa call failed.

    Attributes: ``status`` (int, the sdpa_status value), ``name`` (e.g. "SDPA_ERR_SHAPE"),
    ``message`` (the library's detail, e.g. "sdpa_attention: key.shape[3]=5 does not match
    query.shape[3]=4"; for a check made by this package, its own message)."""

    def __init__(self, status, name, message):
        super().__init__(f"{name} ({status}): {message}")
        self.status = int(status)
        self.name = name
        self.message = message

    def __reduce__(self):  # picklable (e.g. across multiprocessing)
        return (type(self), (self.status, self.name, self.message))


class SdpaArgumentError(SdpaError, ValueError):
    """Status 10-19: NULL pointer, invalid argument, struct version, unsupported request."""


class SdpaShapeError(SdpaError, ValueError):
    """Status 20-29: rank, shape, broadcast, stride, overlap, size overflow, empty dimension,
    index, alignment (0.6: data not aligned to its element size)."""


class SdpaDtypeError(SdpaError, TypeError):
    """Status 30-39: an array that is not float32 (or not bool/uint8 for an allow-mask)."""


class SdpaValueError(SdpaError, ValueError):
    """Status 40-49: a row with no allowed key (empty_rows="error"), NaN/Inf in the inputs."""


class SdpaResourceError(SdpaError, MemoryError):
    """Status 50-59: out of memory, workspace too small."""


class SdpaInternalError(SdpaError):
    """Status 60-69: a bug in libsdpa; please report it."""


_FAMILIES = {
    1: SdpaArgumentError,
    2: SdpaShapeError,
    3: SdpaDtypeError,
    4: SdpaValueError,
    5: SdpaResourceError,
    6: SdpaInternalError,
}


def error_class(status):
    """The SdpaError subclass for a status code (its family of ten); SdpaError if unknown."""
    return _FAMILIES.get(int(status) // 10, SdpaError)


def make_error(status, message, name=None):
    """An exception instance of the right family for `status`."""
    if name is None:
        name = STATUS_NAMES.get(int(status), "SDPA_ERR_UNKNOWN")
    return error_class(status)(status, name, message)


# The library's messages name C spellings in their hints; a Python caller passes keywords. Each
# C enum name becomes the keyword argument that selects it (SDPA_EMPTY_ROWS_ZERO ->
# empty_rows="zero"); the rest of the message (argument names, values) stays the library's.
_C_ENUM_KEYWORDS = (
    ("SDPA_EMPTY_ROWS_", "empty_rows"),
    ("SDPA_KERNEL_", "kernel"),
    ("SDPA_ALIGN_", "alignment"),
    ("SDPA_WEIGHTS_", "weights_stage"),
)
_C_PHRASES = (
    ("pass weights=NULL", "pass need_weights=False"),
    ("query_offsets is NULL", "query_offsets is None"),
)


def python_hints(message):
    """The library's message with its C enum names replaced by the Python keyword arguments
    that select them, e.g. 'use SDPA_EMPTY_ROWS_ZERO to get a zero row' -> 'use
    empty_rows="zero" to get a zero row'."""
    import re
    for old, new in _C_PHRASES:
        message = message.replace(old, new)
    for prefix, keyword in _C_ENUM_KEYWORDS:
        message = re.sub(re.escape(prefix) + r"([A-Z_]+)\b",
                         lambda m: f'{keyword}="{m.group(1).lower()}"', message)
    return re.sub(r"options->(\w+)=\1=", r"\1=", message)  # options->kernel=kernel="tiled"


def py_error(status_name, message):
    """An error found by this package before calling the library, reported with the status the
    library would have used (status_name such as "SDPA_ERR_DTYPE")."""
    return make_error(STATUS_CODES[status_name], message, status_name)


class SdpaLibraryError(ImportError):
    """libsdpa could not be found or loaded, or lacks a function this package needs."""


class SdpaVersionError(SdpaLibraryError):
    """The libsdpa found is not compatible with this package (different major version, or an
    older minor version). The message names the path, where it was found, the version found and
    the version expected."""
