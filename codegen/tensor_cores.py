"""The tensor-core intrinsics MetaSchedule's tensor-core rules and their traces name
(``wmma_sync_16x16x16_f16f16f32``, ``mma_sync_m16n8k8_f16f16f32``, ...), registered by importing
``tvm.s_tir.tensor_intrin``. That import parses some seventy TVMScript functions (2.4 s with
``script_parsing.light_frame_stacks``, 24 s without), so a process imports it once, and only when it meets a
task or a trace that uses tensor cores.
"""

from __future__ import annotations

import re
import threading
import time

from .bf16_dot import register_if_ours
from .script_parsing import light_frame_stacks

_lock = threading.Lock()
_import_seconds: float | None = None


def ensure_tensor_intrinsics() -> float:
    """Register the tensor intrinsics in this process (once); returns how long the import took."""
    global _import_seconds
    with _lock:
        if _import_seconds is None:
            started = time.perf_counter()
            with light_frame_stacks():  # 2.4 s instead of 23.6 (codegen/script_parsing.py)
                import tvm.s_tir.tensor_intrin  # noqa: F401 - registers the intrinsics as it is imported

            _import_seconds = time.perf_counter() - started
    return _import_seconds


_TENSORIZED_WITH = re.compile(r'\["Tensorize", \[[^\]]*\], \["([^"]+)"')


def trace_uses_tensor_intrinsics(trace_json: str) -> bool:
    """Whether replaying a stored trace (MetaSchedule's JSON form) tensorizes with a registered intrinsic."""
    return '"Tensorize"' in trace_json


def ensure_intrinsics_of(trace_json: str) -> None:
    """Register the intrinsics a stored trace tensorizes with, before it is replayed: ours (cheap) by
    their names, TVM's by importing them all (once) where it names any of theirs."""
    names = set(_TENSORIZED_WITH.findall(trace_json))
    theirs = [name for name in names if not register_if_ours(name)]
    # a form of the trace the pattern does not know (no names found) registers everything too
    if theirs or (not names and trace_uses_tensor_intrinsics(trace_json)):
        ensure_tensor_intrinsics()
