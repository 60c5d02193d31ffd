"""A batch being measured: the engine's results read to the end by a thread of their own, into a queue
that the loop's main thread takes them from. The main thread can so propose the next batch (and submit
it: its builds start) while this one is built and timed (``LoopConfig.pipeline``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from measure import MeasureResult

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
