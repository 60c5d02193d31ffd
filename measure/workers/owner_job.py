"""Runs inside the measuring worker that owns a device: a queue of built candidates timed back to back.

The engine sends a window's candidates in one request (``time_queue``) and gets each one's outcome
back as soon as it is timed (a stream, ``WorkerProcess.stream``), so that the device does not wait
for a request's round trip between candidates. What does not depend on the candidate is done once:
the arguments of a task's candidates (they share shapes) are allocated and drawn once per process
and copied in again from their host copy before each candidate (a candidate may have written
anywhere in them, NaN included); a GPU's L2-flush buffers are made once (``run_job``).

With ``ahead`` > 0 a thread loads the next candidates' libraries while the current one is timed:
host work that does not disturb a GPU kernel being timed, and the part of a candidate's preparation
that does not touch the device (a library's kernels reach the GPU on their first call, which must not
overlap another candidate's timed region). On a CPU the host is the device, and ``ahead`` is 0.
"""

from __future__ import annotations

import json
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import tvm

from measure.cuda.errors import poisons_the_context

from . import run_job
from .error_report import describe_error

# Set only when faults are injected on purpose (measure.workers.faults): a candidate's process-level
# fault (a crash, a hang, memory exhausted), raised before it is loaded.
before_candidate: Callable[[str], None] | None = None
ARGUMENT_SETS_KEPT = 2  # a window's candidates are one task's; the last two tasks' arguments stay


class ArgumentCache:
    """Each argument list (dtypes and shapes) allocated and drawn once, refilled before every use."""

    def __init__(self, kept: int = ARGUMENT_SETS_KEPT):
        self.kept = kept
        self._sets: OrderedDict[str, tuple[list[np.ndarray], list]] = OrderedDict()

    def filled(self, args: Sequence[run_job.ArgSpec], dev: tvm.runtime.Device) -> tuple[list, bool]:
        """The device tensors for ``args``, holding ``run_job.random_arrays(args)``; and whether they
        were allocated now (rather than refilled)."""
        key = f"{dev}:{json.dumps([[str(dtype), [int(d) for d in shape]] for dtype, shape in args])}"
        allocated = key not in self._sets
        if allocated:
            host = run_job.random_arrays(args)
            self._sets[key] = (host, run_job.to_device(host, dev))
        else:
            self._sets.move_to_end(key)
            for array, tensor in zip(*self._sets[key], strict=True):
                tensor.copyfrom(array)
        while len(self._sets) > self.kept:
            self._sets.popitem(last=False)
        return self._sets[key][1], allocated


class _Libraries:
    """Candidates' libraries loaded in order, up to ``ahead`` of the one being timed by a thread."""

    def __init__(self, artifacts: Sequence[str], ahead: int):
        self._artifacts = list(artifacts)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="load-ahead") if ahead > 0 else None
        self._loading: dict[int, Future] = {}
        self._next = 0
        for _ in range(ahead):
            self._load_next()

    def take(self, index: int) -> Any:
        loading = self._loading.pop(index, None)
        self._load_next()
        return loading.result() if loading is not None else tvm.runtime.load_module(self._artifacts[index])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _load_next(self) -> None:
        if self._pool is not None and self._next < len(self._artifacts):
            self._loading[self._next] = self._pool.submit(tvm.runtime.load_module, self._artifacts[self._next])
        self._next += 1


_arguments = ArgumentCache()


def time_queue(candidates: Sequence[dict], device_kind: str, timing: dict, ahead: int = 0) -> Iterator[dict]:
    """Time ``candidates`` ({"key", "artifact", "args"}) one after another, yielding each one's outcome
    when it is known: ``run_job.time_loaded``'s, with "key" and "allocated" (its arguments were
    allocated for it rather than refilled); or {"key", "error"} for a candidate that failed here. A
    failure that poisons a CUDA context ends the stream after its own outcome: the engine goes on with
    the rest in a fresh process."""
    dev = run_job.device(device_kind)
    libraries = _Libraries([c["artifact"] for c in candidates], ahead)
    try:
        for index, candidate in enumerate(candidates):
            try:
                if before_candidate is not None:
                    before_candidate(candidate["artifact"])
                mod = libraries.take(index)
                tensors, allocated = _arguments.filled(candidate["args"], dev)
                dev.sync()
                outcome = run_job.time_loaded(mod, dev, device_kind, tensors, timing, candidate["artifact"])
            except Exception as err:  # this candidate's failure, not the queue's
                traceback.print_exc()
                message = describe_error(err)
                yield {"key": candidate["key"], "error": message}
                if poisons_the_context(message):
                    return
                continue
            yield {"key": candidate["key"], **outcome, "allocated": allocated}
    finally:
        libraries.close()


HANDLERS = {"time_queue": time_queue}
