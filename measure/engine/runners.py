"""The measuring workers and the gate around their timed regions.

A candidate's measurement has two parts: preparing it (loading the library, allocating and
filling its arguments) and its timed region. Preparing is host work that does not disturb a GPU
kernel being timed, so on a GPU it overlaps with other candidates' timed regions; the gate admits
at most ``dop`` timed regions at once, and a serial check waits until it is alone. On a CPU the
host is the device, so preparing happens inside the candidate's slot.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
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

    def measure(self, built: BuildResult, timing: TimingConfig, serial: bool = False) -> MeasureResult:
        """Prepare and time one built candidate; ``serial`` times it with nothing else in flight."""
        common = dict(build_seconds=built.seconds, args=built.args)
        worker = self._free.get()
        region = self.gate.exclusive if serial else self.gate.shared
        prepare = dict(artifact=built.artifact, args=built.args, device_kind=self.device)
        prepare_outside_the_gate = self.device != "cpu"  # host work does not disturb a GPU being timed
        try:
            if prepare_outside_the_gate:
                worker.call("prepare_kernel", self.timeout.value, **prepare)
            with region(), self._watch() as health:
                if not prepare_outside_the_gate:
                    worker.call("prepare_kernel", self.timeout.value, **prepare)
                outcome = worker.call("time_prepared", self.timeout.value, timing=timing.as_dict())
        except WorkerError as err:
            raise_if_no_device(str(err))
            replace_if_poisoned(worker, str(err))
            return MeasureResult(built.key, Status.RUN_ERROR, error=str(err), **common)
        except WorkerTimeout as err:
            return MeasureResult(built.key, Status.RUN_TIMEOUT, error=f"run {err}", **common)
        except WorkerCrashed as err:
            return MeasureResult(built.key, Status.RUN_CRASH, error=f"run crashed: {err}", **common)
        finally:
            self._give_back(worker)
        self.timeout.record(outcome["seconds"])
        extra = {}
        if health:
            extra = dict(energy_j=health[0].energy_j, health_flags=health[0].flags)
        if outcome["nonfinite"]:
            where = ", ".join(str(i) for i in outcome["nonfinite"])
            return MeasureResult(
                built.key,
                Status.RUN_ERROR,
                error=f"output holds NaN or Inf (argument {where})",
                run_seconds=outcome["seconds"],
                **common,
            )
        timed = sum(outcome["samples"]) * outcome["number"]
        return MeasureResult(
            built.key,
            Status.OK,
            samples=outcome["samples"],
            run_seconds=outcome["seconds"],
            timed_seconds=timed,
            **common,
            **extra,
        )

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

    @contextmanager
    def _watch(self) -> Iterator[list[MeasurementHealth]]:
        if self.monitor is None:
            yield []
            return
        with self.monitor.watch() as health:
            yield health


def raise_if_no_device(message: str) -> None:
    """Re-raise a worker's error message naming a missing device (a measuring worker's NoDevice, or
    DeviceUnavailable from the cluster driver) as DeviceUnavailable."""
    if message.startswith(("NoDevice", "DeviceUnavailable")):
        raise DeviceUnavailable(message.split(":", 1)[-1].strip())


def replace_if_poisoned(worker: WorkerProcess, message: str) -> None:
    """A CUDA context that saw a fault (an illegal address, a launch failure) fails every later
    call: end the worker, and the next request starts a fresh one."""
    if poisons_the_context(message):
        worker.kill()
