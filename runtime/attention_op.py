"""The row-invariant attention operator: a custom-op library built with the package, found and loaded here.

`specexport.RowInvariantAttention` (native/row_attention.cc) does GroupQueryAttention's job in the `ort`
pieces with every output row computed alone, so a one-row call rounds as a row of a many-row call. It is
compiled when the package is installed (setup.py) and lives beside this module; nothing is compiled at run
time. A session whose pieces use it registers the library before it opens them.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import SpecExportError

if TYPE_CHECKING:  # the module itself loads no runtime: `specexport bench --help` and the CLI stay light
    import onnxruntime as ort

DOMAIN = "specexport"
OP_TYPE = "RowInvariantAttention"
MATMUL_OP_TYPE = "RowInvariantMatMulNBits"  # native/row_matmul.cc, in the same library
GATED_OP_TYPE = "GatedSiLU"  # native/gated_silu.cc: in graphs that use either of the two above
GATHER_ROWS_OP_TYPE = "GatherRowsNBits"  # a tied table's rows read from the rowwise LM head (native/row_gather.cc)
LIBRARY = "_row_attention"
WIDEST_GQA_HEAD = 128  # above: GroupQueryAttention's CPU kernel rounds a row by its call's total length
HOW_TO_BUILD = ("reinstall specexport where a C++ compiler is on the PATH (`make setup`, or `pip install .`),"
                " or rebuild the bundle with --attention gqa")


def library_path() -> Path | None:
    """The built library inside the installed package, or None where the install built none."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{LIBRARY}{suffix}"
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def load_error() -> str | None:
    """Why the library cannot serve this process, in one sentence; None where it can."""
    path = library_path()
    if path is None:
        return f"specexport was installed without its attention operator; {HOW_TO_BUILD}"
    try:
        ctypes.CDLL(str(path))
    except OSError as exc:
        return f"the attention operator at {path} does not load here ({exc}); {HOW_TO_BUILD}"
    return None


def available() -> bool:
    return load_error() is None


def _ask_library(function: str) -> str | None:
    """The string a no-argument function of the library returns, None without the library."""
    if not available():
        return None
    query = getattr(ctypes.CDLL(str(library_path())), function)
    query.restype = ctypes.c_char_p
    return query().decode()


def isa() -> str | None:
    """The vector path the operator takes on this CPU (avx512, avx2 or portable), None without the library."""
    return _ask_library("SpecexportAttentionIsa")


def matmul_isa() -> str | None:
    """The vector path the matmul operator takes on this CPU (avx512vnni, avx2 or portable), None without the
    library."""
    return _ask_library("SpecexportMatMulIsa")


def needed(attention: str, matmul: str) -> bool:
    """Whether pieces built with this attention and matmul use the library."""
    return attention == "rowwise" or matmul == "rowwise"


def register(options: ort.SessionOptions) -> None:
    """Adds the operator to `options`; refuses in one sentence where the library is missing or does not load."""
    error = load_error()
    if error is not None:
        raise SpecExportError(error)
    options.register_custom_ops_library(str(library_path()))
