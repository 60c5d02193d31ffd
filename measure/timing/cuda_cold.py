"""Cold single calls timed on a GPU without the launch's host-side delay.

TVM's time evaluator, when it flushes the L2 before a sample, waits for the flush to end, records
the start event on the idle stream and only then launches the kernel: the event pair spans the
host's launch delay (a few microseconds, more while builds load the CPU), which is most of the
number for a kernel of a few microseconds. Here the flush, the start event, the kernel and the
stop event are queued back to back without waiting. The GPU reaches the start event when the flush
is done and finds the kernel already queued behind it, so the pair spans the kernel alone.

That holds when the host has queued the kernel before the GPU could finish the flush. Each sample
checks it: the host's time from before the flush to after the launch must be shorter than the
flush as the GPU ran it (a third event, before the flush, gives that). A sample that fails the
check is taken again (up to ``RETRIES`` times); ``late`` counts those kept anyway.

The events are made with the CUDA runtime library TVM itself loaded; they are recorded on the
legacy default stream, where TVM launches kernels unless a stream is set (nothing here sets one).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Sequence

from measure.cuda.runtime import CUDART_SONAME

RETRIES = 3
_DEFAULT_STREAM = None


class CudaCallError(RuntimeError):
    """A CUDA runtime call failed; the message names the error as ``cudaError...``."""


class _Runtime:
    """The few CUDA runtime calls used here, each checked."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(CUDART_SONAME)  # already loaded by TVM's CUDA runtime: the same library
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def call(self, name: str, *args) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            error, text = self.lib.cudaGetErrorName(code).decode(), self.lib.cudaGetErrorString(code).decode()
            raise CudaCallError(f"{name} failed: {error} ({code}): {text}")

    def event(self) -> ctypes.c_void_p:
        event = ctypes.c_void_p()
        self.call("cudaEventCreate", ctypes.byref(event))
        return event

    def elapsed_seconds(self, start: ctypes.c_void_p, stop: ctypes.c_void_p) -> float:
        milliseconds = ctypes.c_float()
        self.call("cudaEventElapsedTime", ctypes.byref(milliseconds), start, stop)
        return milliseconds.value / 1e3

    def destroy(self, event: ctypes.c_void_p) -> None:
        self.lib.cudaEventDestroy(event)  # unchecked: after a fault the context is gone anyway


class QueuedColdTimer:
    """``timer(number, repeat, min_repeat_ms)`` -> ``repeat`` samples of one cold call each, in
    seconds (the evaluator signature ``measure.timing.sampling`` uses; ``number`` must be 1). With
    ``min_repeat_ms`` (the warm-up) a sample is instead calls back to back, without flushes, until
    that long, as TVM's evaluator warms up. ``cuda``: the CUDA runtime's event calls (default: the
    library TVM loaded)."""

    def __init__(self, kernel: Callable, args: Sequence, flush: Callable[[], None], cuda: _Runtime | None = None):
        self.kernel, self.args, self.flush = kernel, args, flush
        self.cuda = cuda or _Runtime()
        self.events = [self.cuda.event() for _ in range(3)]
        self.late = 0  # samples kept although the host queued the kernel after the flush could end

    def __call__(self, number: int, repeat: int, min_repeat_ms: int) -> list[float]:
        if number != 1:
            raise ValueError("a cold sample is a single call after a flush: number must be 1")
        return [self.warm(min_repeat_ms / 1e3) if min_repeat_ms > 0 else self.sample() for _ in range(repeat)]

    def warm(self, seconds: float) -> float:
        """Seconds per call of calls run back to back (no flush) for at least ``seconds``."""
        cuda, (_, start, stop) = self.cuda, self.events
        calls = 1
        while True:
            cuda.call("cudaEventRecord", start, _DEFAULT_STREAM)
            for _ in range(calls):
                self.kernel(*self.args)
            cuda.call("cudaEventRecord", stop, _DEFAULT_STREAM)
            cuda.call("cudaEventSynchronize", stop)
            elapsed = cuda.elapsed_seconds(start, stop)
            if elapsed >= seconds:
                return elapsed / calls
            calls = max(2 * calls, math.ceil(seconds / max(elapsed / calls, 1e-9)))

    def sample(self) -> float:
        for _ in range(RETRIES + 1):
            seconds, queued_in_time = self._queued_sample()
            if queued_in_time:
                return seconds
        self.late += 1
        return seconds

    def _queued_sample(self) -> tuple[float, bool]:
        """(the kernel's seconds, whether the host queued it before the flush could end)."""
        cuda, (before_flush, start, stop) = self.cuda, self.events
        host_start = time.perf_counter()
        cuda.call("cudaEventRecord", before_flush, _DEFAULT_STREAM)
        self.flush()
        cuda.call("cudaEventRecord", start, _DEFAULT_STREAM)
        self.kernel(*self.args)
        host_queued = time.perf_counter() - host_start
        cuda.call("cudaEventRecord", stop, _DEFAULT_STREAM)
        cuda.call("cudaEventSynchronize", stop)
        return cuda.elapsed_seconds(start, stop), host_queued < cuda.elapsed_seconds(before_flush, start)

    def close(self) -> None:
        for event in self.events:
            self.cuda.destroy(event)
        self.events = []
