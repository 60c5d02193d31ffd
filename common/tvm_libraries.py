"""Where the installed TVM keeps its shared libraries, found without importing TVM (a CUDA build worker
must set its environment before ``import tvm``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def tvm_library_dir() -> Path | None:
    """The ``lib`` folder of the installed ``tvm`` package; None where TVM is not installed."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "lib"
