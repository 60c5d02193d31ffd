"""A batch of one task from its proposal to its last result (``Batch``), and while it is measured the
engine's results read to the end by a thread of their own, into a queue that the loop's main thread takes
them from (``InFlight``). The main thread can so propose the next batch (and submit it: its builds start)
while this one is built and timed (``LoopConfig.pipeline``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from costmodel import FilterDecision
from measure import MeasureResult

from .task_run import TaskRun
from .task_search import Candidate

_END = object()


@dataclass
class _Raised:
    error: BaseException


class InFlight:
    """``results`` (an engine's ``measure``) read in a daemon thread; ``stop()`` ends the reading (and the
    engine's work on them) after the result the engine is producing now."""

    def __init__(self, results: Iterator[MeasureResult], name: str):
        self.submitted = time.time()
        self.first_result: float | None = None  # when the engine handed over its first result (time.time())
        self.last_result: float | None = None
        self._queue: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(results,), name=name, daemon=True)
        self._thread.start()

    def _read(self, results: Iterator[MeasureResult]) -> None:
        try:
            for result in results:
                self.last_result = time.time()
                self.first_result = self.first_result or self.last_result
                self._queue.put(result)
                if self._stopping.is_set():
                    break
        except BaseException as err:  # noqa: BLE001 - raised again in the thread that takes the results
            self._queue.put(_Raised(err))
        finally:
            close = getattr(results, "close", None)
            if close is not None:  # a generator left early: the engine stops its workers' streams
                try:
                    close()
                except Exception as err:  # noqa: BLE001
                    self._queue.put(_Raised(err))
            self._queue.put(_END)

    def results(self, wait: bool = True) -> Iterator[MeasureResult]:
        """The results in the order the engine gave them, up to the last one (``wait``), or up to the last
        that came already (not ``wait``). What the engine raised is raised here, after the results before it."""
        while not self._done:
            try:
                item = self._queue.get(block=wait)
            except queue.Empty:
                return
            if item is _END:
                self._done = True
            elif isinstance(item, _Raised):
                self._done = True
                raise item.error
            else:
                yield item

    def stop(self) -> None:
        self._stopping.set()


@dataclass
class Batch:
    """One batch of one task: proposed and filtered, then in flight in the engine, then finished."""

    run: TaskRun
    index: int  # of the task
    proposed: float  # time.monotonic() as its search began
    candidates: list[Candidate]  # the ones measured (kept by the filter)
    scores: np.ndarray  # the cost model's, of ``candidates``, as the search ranked them
    decision: FilterDecision
    trained: bool  # the model had been trained when it scored them
    seeded: str  # what its progress line says of first candidates queued
    measuring: InFlight | None = None
    latencies: dict[str, float | None] = field(default_factory=dict)  # by key; None for a failure
    joules: float | None = None  # energy of its measurements, where NVML gives it
    by_key: dict[str, Candidate] = field(init=False)

    def __post_init__(self) -> None:
        self.by_key = {c.key: c for c in self.candidates}

    @property
    def best(self) -> float | None:
        return min((lat for lat in self.latencies.values() if lat is not None), default=None)
