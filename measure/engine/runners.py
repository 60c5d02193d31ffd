"""The measuring workers, each the owner of its device while it times a queue of candidates, and the
gate around their timed regions.

A window's candidates go to a measuring worker as one queue (``measure.workers.owner_job``): it times
them back to back and streams each result back, so the device never waits for a request's round trip,
and what candidates share (their arguments' buffers, a GPU's flush buffers) is made once. On a GPU the
worker loads the next libraries while the current candidate is timed (host work that does not disturb a
GPU kernel); on a CPU the host is the device, and it loads them between timings. Parallel slots (a CPU's
disjoint core sets) are one queue each; the gate admits at most ``dop`` of them at once, and a serial
check waits until it is alone.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from measure.cuda.errors import poisons_the_context
from measure.nvml import MeasurementHealth, NvmlMonitor
from measure.timeouts import AdaptiveTimeout
from measure.timing.sampling import TimingConfig
from measure.types import BuildResult, MeasureResult, Status
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerProcess, WorkerTimeout

from .context_memory import ContextMemoryGuard


class TimedRegionGate:
    """At most ``limit`` holders at once; ``exclusive()`` waits for sole possession."""

    def __init__(self, limit: int = 1):
        self._limit = limit
        self._held = 0
        self._exclusive_waiting = 0
        self._condition = threading.Condition()

    def set_limit(self, limit: int) -> None:
        with self._condition:
            self._limit = max(1, limit)
            self._condition.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: self._held < self._limit and not self._exclusive_waiting)
            self._held += 1
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._condition:
            self._exclusive_waiting += 1
            self._condition.wait_for(lambda: self._held == 0)
            self._exclusive_waiting -= 1
            self._held = self._limit + 1  # nobody else gets in
        try:
            yield
        finally:
            with self._condition:
                self._held = 0
                self._condition.notify_all()

    def _release(self) -> None:
        with self._condition:
            self._held -= 1
            self._condition.notify_all()


class DeviceUnavailable(RuntimeError):
    """The measuring worker found no device of the target's kind."""


@dataclass
class RunnerPool:
    workers: list[WorkerProcess]
    device: str  # "cpu" or "cuda"
    timeout: AdaptiveTimeout
    monitor: NvmlMonitor | None = None  # NVML on the runners' GPU

    def __post_init__(self) -> None:
        self.gate = TimedRegionGate(1)
        self.memory_guard = ContextMemoryGuard.for_workers(self.monitor, len(self.workers))
        self._free: queue.Queue[WorkerProcess] = queue.Queue()
        for worker in self.workers:
            self._free.put(worker)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def close(self) -> None:
        for worker in self.workers:
            worker.close()

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self.workers)

    def measure_queue(
        self, builts: Sequence[BuildResult], timing: TimingConfig, serial: bool = False, ahead: int = 0
    ) -> Iterator[MeasureResult]:
        """Time ``builts`` in order in one measuring worker, the device's owner for their time, and yield
        each result as it comes (``measure.workers.owner_job``); ``serial``: with nothing else being timed,
        ``ahead``: libraries the worker loads ahead while timing. A candidate that crashes or hangs the
        worker is recorded as such, the worker replaced, and the rest of the queue timed in the new one."""
        pending = list(builts)
        worker = self._free.get()
        region = self.gate.exclusive if serial else self.gate.shared
        try:
            with region():
                while pending:
                    yield from self._stream(worker, pending, timing, ahead)
        finally:
            self._give_back(worker)

    def _stream(
        self, worker: WorkerProcess, pending: list[BuildResult], timing: TimingConfig, ahead: int
    ) -> Iterator[MeasureResult]:
        """One request for all of ``pending``, each candidate taken off it as its result is yielded; a
        request ended by a candidate yields that candidate's failure and leaves the rest pending."""
        request = [{"key": b.key, "artifact": b.artifact, "args": b.args} for b in pending]
        before = self.monitor.sample() if self.monitor is not None else None
        stream = worker.stream(
            "time_queue",
            self.timeout.value,
            candidates=request,
            device_kind=self.device,
            timing=timing.as_dict(),
            ahead=ahead,
        )
        failure = None
        try:
            for outcome in stream:
                built = pending.pop(0)
                health = None
                if self.monitor is not None:  # NVML over the candidate's turn, its load included
                    after = self.monitor.sample()
                    health = self.monitor.assess(before, after) if before is not None and after is not None else None
                    before = after
                if "error" in outcome:
                    raise_if_no_device(outcome["error"])
                    if poisons_the_context(outcome["error"]):  # the worker ended the stream after it
                        worker.kill()
                        failure = self._result(built, outcome, health)
                        break
                yield self._result(built, outcome, health)
        except WorkerTimeout as err:
            failure = _failure(pending.pop(0), Status.RUN_TIMEOUT, f"run {err}")
        except WorkerCrashed as err:
            failure = _failure(pending.pop(0), Status.RUN_CRASH, f"run crashed: {err}")
        except WorkerError as err:  # the request itself failed, before any candidate's turn
            raise_if_no_device(str(err))
            replace_if_poisoned(worker, str(err))
            failure = _failure(pending.pop(0), Status.RUN_ERROR, str(err))
        except GeneratorExit:  # the caller stopped reading: the rest of the stream must not reach the next request
            worker.kill()
            raise
        if failure is not None:
            yield failure

    def _result(self, built: BuildResult, outcome: dict, health: MeasurementHealth | None) -> MeasureResult:
        if "error" in outcome:
            return _failure(built, Status.RUN_ERROR, outcome["error"])
        self.timeout.record(outcome["seconds"])
        common = dict(build_seconds=built.seconds, args=built.args, run_seconds=outcome["seconds"])
        if health is not None:
            common |= dict(energy_j=health.energy_j, health_flags=health.flags)
        if outcome["nonfinite"]:
            where = ", ".join(str(i) for i in outcome["nonfinite"])
            return MeasureResult(
                built.key, Status.RUN_ERROR, error=f"output holds NaN or Inf (argument {where})", **common
            )
        timed = sum(outcome["samples"]) * outcome["number"]
        return MeasureResult(built.key, Status.OK, samples=outcome["samples"], timed_seconds=timed, **common)

    def call_alone(self, op: str, timeout: float | None, **request) -> dict:
        """Run a request in a measuring worker with nothing else being timed."""
        worker = self._free.get()
        try:
            with self.gate.exclusive():
                return worker.call(op, timeout, **request)
        except WorkerError as err:
            raise_if_no_device(str(err))
            replace_if_poisoned(worker, str(err))
            raise
        finally:
            self._give_back(worker)

    def _give_back(self, worker: WorkerProcess) -> None:
        if self.memory_guard is not None:
            self.memory_guard.check(worker)
        self._free.put(worker)


def raise_if_no_device(message: str) -> None:
    """Re-raise a worker's error message naming a missing device (a measuring worker's NoDevice, or
    DeviceUnavailable from the cluster driver) as DeviceUnavailable."""
    if message.startswith(("NoDevice", "DeviceUnavailable")):
        raise DeviceUnavailable(message.split(":", 1)[-1].strip())


def _failure(built: BuildResult, status: str, error: str) -> MeasureResult:
    return MeasureResult(built.key, status, error=error, build_seconds=built.seconds, args=built.args)


def replace_if_poisoned(worker: WorkerProcess, message: str) -> None:
    """A CUDA context that saw a fault (an illegal address, a launch failure) fails every later
    call: end the worker, and the next request starts a fresh one."""
    if poisons_the_context(message):
        worker.kill()
