"""The tuner's one thread pool, for TVM work that releases the GIL (sampling schedules, replaying
traces, postprocessing): on threads it uses every core.

The pool is made on first use and shut down when the interpreter exits (or by ``shutdown()``,
after which the next ``parallel_map`` makes a new one). Search and transfer-tuning share it, so
the process never holds more than ``THREADS`` such threads.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

THREADS = os.cpu_count() or 1  # the pool's threads; TVM's search context is given as many

_In = TypeVar("_In")
_Out = TypeVar("_Out")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def parallel_map(fn: Callable[[_In], _Out], items: Iterable[_In]) -> list[_Out]:
    """``[fn(x) for x in items]`` on the shared pool, results in order; the first exception ``fn``
    raises is raised here. ``fn`` must not itself call ``parallel_map`` (it could wait for ever on
    a pool whose threads all wait)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="tuner-parallel")
        pool = _pool
    return list(pool.map(fn, items))


@atexit.register
def shutdown() -> None:
    """Stop the pool's threads once the work handed to them is done."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True)
