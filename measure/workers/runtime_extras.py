"""TVM's extern functions that compiled models call by name, in a measuring worker that loads only TVM's
runtime library.

A model's lowering leaves some operators to functions of TVM's own rather than to kernels of its
(``tvm.contrib.sort.topk``, ``sort``, ``argsort``, ``argsort_nms``, ``tvm.contrib.random.*``: a
Hiera's token selection, a detector's non-maximum suppression). They live in ``libtvm_runtime_extra``,
which ``import tvm`` loads only with the compiler; a runtime-only process (``TVM_USE_RUNTIME_LIB=1``,
how the measuring workers run, as a GPU host without the compiler would) lacks them, and the model's
first call fails with "Cannot find function tvm.contrib.sort.topk". Loading the library registers them.
"""

from __future__ import annotations

import ctypes

from common.tvm_libraries import tvm_library_dir

EXTRA_LIBRARY = "libtvm_runtime_extra.so"
_loaded: list[ctypes.CDLL] = []  # kept referenced: its functions stay registered for the process's life


def load_runtime_extras() -> str | None:
    """Register the runtime's extern functions in this process; None, or why they are not there (a TVM
    install without the library: a model calling one then fails with TVM's own line)."""
    if _loaded:
        return None
    lib_dir = tvm_library_dir()
    if lib_dir is None:
        return "TVM is not installed"
    library = lib_dir / EXTRA_LIBRARY
    if not library.is_file():
        return f"{library} is not installed"
    try:
        _loaded.append(ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL))
    except OSError as err:
        return f"{library} does not load ({err})"
    return None
