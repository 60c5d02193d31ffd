"""The measurement engine: build candidates in a pool of worker processes, time them in an
isolated measuring process, and hand back one result per candidate as soon as it is known.

On a CPU target the builds finish before any timing starts, because a compiling process on the
same cores would distort the timings; on a GPU, builds go on while earlier candidates are timed.

Two batches may be in flight at once (``pipelines_batches``: the tuning loop measures batch k in one
thread while batch k+1 is submitted from another): their builds share one pool of build workers, and
their windows are timed in the order the batches were submitted, never two interleaved (``TurnOrder``).

The DOP controller starts where the last run on this machine and device left it (see
``measure.dop.memory``), and its state is saved after each of its decisions and on ``close()``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import random
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import tvm

from measure.contract import Engine, EngineConfig
from measure.cuda.compile_env import COMPILE_MODE_ENV, CudaBuildEnvError, choose_compile_mode
from measure.cuda.nvrtc_source import LEAN_ENV
from measure.dop.controller import GPU_DEFAULT_MAX_DOP, DopController, DopDecision, relative_error
from measure.dop.memory import DopMemory, machine_key
from measure.nvml import NvmlMonitor, split_energy
from measure.timeouts import AdaptiveTimeout
from measure.timing.cpu_slots import default_cpu_dop, pinned_env, runner_cpu_sets
from measure.timing.sampling import TimingConfig
from measure.types import BuildResult, MeasureInput, MeasureResult, Status
from measure.workers.env import CUDA_BUILD_ENV, RUN_DEVICE_ENV
from measure.workers.worker import WorkerProcess

from .building import artifact_stem, build_with, default_build_workers
from .kept_builds import KeptBuilds
from .programs import WorkerPrograms
from .runners import DeviceUnavailable, RunnerPool
from .turns import TurnOrder
from .verifying import CandidateChecks

__all__ = ["DeviceUnavailable", "EngineConfig", "MeasureEngine"]

log = logging.getLogger("tensor_tuner.measure")
_RUN_FAILURES = (Status.RUN_ERROR, Status.RUN_TIMEOUT, Status.RUN_CRASH)
SERIAL_WINDOW = 4  # built candidates one measuring window takes when each is timed alone


class MeasureEngine(WorkerPrograms, CandidateChecks, Engine):
    """This machine's worker processes. ``monitor``: the NVML monitor of the runners' GPU (default:
    one is made for a CUDA target)."""

    def __init__(
        self,
        target: tvm.target.Target,
        work_dir: Path,
        config: EngineConfig | None = None,
        monitor: NvmlMonitor | None = None,
    ):
        super().__init__(target, work_dir, config)
        self.build_timeout = AdaptiveTimeout(self.config.build_timeout)
        self.run_timeout = AdaptiveTimeout(self.config.run_timeout)
        self.overlap_builds_with_runs = self.device != "cpu"
        self._artifact_dir = Path(work_dir) / "artifacts"
        log_dir = self.log_dir
        self.notes: list[str] = []  # how this engine measures (compile path, GPU watched): logs/engine.log
        workers = default_build_workers() if self.config.build_workers is None else self.config.build_workers
        # A compiling process's idle TVM threads spin for a while after each build; on a CPU that
        # slowed the first timings after a batch's builds.
        build_env = {"TVM_THREAD_POOL_SPIN_COUNT": "0"} | (
            self._cuda_build_env() if self.device == "cuda" and workers else {}
        )
        # The measuring workers create their device's context (seconds, on a GPU) during start-up, so
        # that it counts against the start-up timeout, not the first candidate's run timeout.
        run_env = {RUN_DEVICE_ENV: self.device} | (
            {"TVM_USE_RUNTIME_LIB": "1"} if self.config.runtime_only_runner else {}
        )
        self._builders = [
            WorkerProcess("build", f"builder-{i}", log_dir / f"builder-{i}.log", build_env) for i in range(workers)
        ]
        self._free_builders: queue.Queue[WorkerProcess] = queue.Queue()  # every caller's, so no two share one
        for worker in self._builders:
            self._free_builders.put(worker)
        if self.device == "cpu":
            kernel_threads = int(target.attrs.get("num-cores", os.cpu_count() or 1))
            run_env["TVM_NUM_THREADS"] = str(kernel_threads)
            max_dop = self.config.max_dop or default_cpu_dop(kernel_threads)
            cpu_sets = runner_cpu_sets(max_dop, kernel_threads)
        else:
            max_dop = self.config.max_dop or GPU_DEFAULT_MAX_DOP
            cpu_sets = [None]  # one owner of the GPU (``_slots_and_ahead``)
        runners = [
            WorkerProcess("run", f"runner-{i}", log_dir / f"runner-{i}.log", run_env | pinned_env(cpus))
            for i, cpus in enumerate(cpu_sets)
        ]
        self.monitor = monitor if monitor is not None or self.device != "cuda" else NvmlMonitor()
        if self.monitor is not None:
            self._note(self.monitor.describe())
        self._runners = RunnerPool(runners, self.device, self.run_timeout, self.monitor)
        self.dop = DopController(max_dop, self.config.dop_error_threshold, self.config.dop_check_fraction)
        self._dop_memory = DopMemory(machine_key(self.device, self.gpu_name())) if self.config.remember_dop else None
        if self._dop_memory is not None:
            self._dop_memory.resume(self.dop)
        else:
            self.dop.start = "start: DOP 1 (remember_dop is off)"
        self._rng = random.Random(0)
        self._names = itertools.count()
        self._kept = KeptBuilds(self.config.kept_builds)
        self._name_lock = threading.Lock()
        # A batch's windows are timed, their DOP decisions made and their builds kept or deleted once every batch
        # submitted before it has ended: batch k+1's builds may finish first, its timing waits for batch k's.
        self._turns = TurnOrder()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start every worker; they import TVM in the background while the caller goes on."""
        for worker in self._builders:
            worker.start()
        self._runners.start()

    def close(self) -> None:
        self._remember_dop()
        for worker in self._builders:
            worker.close()
        self._runners.close()
        if self.monitor is not None:
            self.monitor.close()
        shutil.rmtree(self._artifact_dir, ignore_errors=True)

    def process_start_seconds(self) -> float | None:
        """The build workers' own start-up: they import TVM's compiler, as a process that runs a model does."""
        return max((w.import_seconds for w in self._builders if w.import_seconds is not None), default=None)

    @property
    def worker_restarts(self) -> int:
        return sum(w.restarts for w in self._builders) + self._runners.restarts

    @property
    def energy_measurable(self) -> bool:
        """Whether measurements come with the GPU's energy (NVML counts it on this device)."""
        return self.monitor is not None and self.monitor.energy_supported

    @property
    def pipelines_batches(self) -> bool:
        return True

    # -- measuring candidates -------------------------------------------------------------------
    def measure(
        self,
        inputs: Sequence[MeasureInput],
        timing: TimingConfig | None = None,
        serial: bool = False,
        group: str | None = None,
    ) -> Iterator[MeasureResult]:
        """Yield one result per input, as each becomes known, for the caller to commit.

        Built candidates are timed in windows at the DOP controller's degree of parallelism; a
        sample of each parallel window (and every candidate that failed in parallel) is re-measured
        serially, and that serial result is the one handed back. ``serial=True`` times every
        candidate alone (for final choices) and leaves the controller as it is. ``group`` names the
        candidates' comparison (a task): engines with devices of several models measure one group
        on one model; here there is one device. A second call may be made while another thread still
        reads the first one's results (``pipelines_batches``); within one thread, read the results to
        the end before calling the engine again: a measuring worker is streaming them.
        """
        turn = self._turns.take()
        reused, to_build = self._kept.take(group, inputs)
        built = self.build(to_build, group=group) if to_build else ()
        return self._in_turn(turn, itertools.chain(reused, built), timing, serial, group)

    def measure_built(
        self,
        builds: Iterable[BuildResult],
        timing: TimingConfig | None = None,
        serial: bool = False,
        group: str | None = None,
    ) -> Iterator[MeasureResult]:
        """``measure`` for candidates already built (here or on another host); once timed, their
        artifacts are deleted, or kept for the final choice where they are among ``group``'s fastest."""
        return self._in_turn(self._turns.take(), builds, timing, serial, group)

    def _in_turn(
        self, turn: int, builds: Iterable[BuildResult], timing: TimingConfig | None, serial: bool, group: str | None
    ) -> Iterator[MeasureResult]:
        results = self._timed_in_turn(turn, builds, timing or self.config.timing, serial, group)
        self._turns.end_with(results, turn)
        return results

    def _timed_in_turn(
        self, turn: int, builds: Iterable[BuildResult], timing: TimingConfig, serial: bool, group: str | None
    ) -> Iterator[MeasureResult]:
        try:
            window: list[BuildResult] = []
            for built in builds:
                if not built.ok:
                    yield built.as_failure()
                    continue
                window.append(built)
                if self.overlap_builds_with_runs and len(window) >= self.window_size(serial):
                    yield from self._measure_window(turn, window, timing, serial, group)
                    window = []
            while window:
                size = self.window_size(serial)
                yield from self._measure_window(turn, window[:size], timing, serial, group)
                window = window[size:]
        finally:
            self._turns.end(turn)

    @property
    def dop_decisions(self) -> list[DopDecision]:
        return self.dop.decisions

    def window_size(self, serial: bool) -> int:
        """How many built candidates one measuring window takes at the current DOP."""
        return SERIAL_WINDOW if serial else 5 * self.dop.dop

    def _measure_window(
        self, turn: int, window: list[BuildResult], timing: TimingConfig, serial: bool, group: str | None
    ) -> Iterator[MeasureResult]:
        """Time a window at the current DOP. At DOP 1 each result is handed back as it comes. A
        parallel window is held until its serial checks are done: if they find a loss, the whole
        window is re-measured serially, so distorted numbers never reach the caller."""
        self._turns.wait(turn)
        dop = 1 if serial else self.dop.dop
        slots, ahead = self._slots_and_ahead(dop)
        self._runners.gate.set_limit(slots)
        if dop == 1:
            for index, result in enumerate(self._runners.measure_queue(window, timing, serial, ahead)):
                self._kept.offer(group, window[index], result)
                yield result
            if serial:
                return
            decision = self.dop.update([], 0)
        else:
            results, decision = self._checked_in_parallel(window, timing, dop, slots, ahead)
            for index, result in sorted(results.items()):
                self._kept.offer(group, window[index], result)
                yield result
        self._log_decision(decision)
        self._remember_dop()
        self._runners.gate.set_limit(self.dop.dop)

    def _checked_in_parallel(
        self, window: list[BuildResult], timing: TimingConfig, dop: int, slots: int, ahead: int
    ) -> tuple[dict[int, MeasureResult], DopDecision]:
        """The window timed at ``dop`` (results by index), then its serial checks and the controller's
        decision on them; after a loss every candidate re-measured alone."""
        before = self.monitor.sample() if self.monitor is not None and slots > 1 else None
        results = self._in_slots(window, timing, slots, ahead)
        for result in results.values():
            result.dop = dop
        if before is not None:  # the candidates' timed regions overlapped: share the window's energy
            split_energy(self.monitor.energy_between(before, self.monitor.sample()), list(results.values()))
        checks = set(self.dop.to_check(len(window), self._rng))
        checks |= {i for i, r in results.items() if r.status in _RUN_FAILURES}
        errors, parallel_only_failures = [], 0
        for index in sorted(checks):
            parallel = results[index]
            results[index] = alone = self._alone(window[index], parallel, timing)
            if alone.ok and parallel.ok:
                errors.append(relative_error(parallel.latency, alone.latency))
            elif alone.ok:
                parallel_only_failures += 1
        decision = self.dop.update(errors, parallel_only_failures)
        if decision.loss:
            for index in sorted(set(results) - checks):
                results[index] = self._alone(window[index], results[index], timing)
        return results, decision

    def _slots_and_ahead(self, dop: int) -> tuple[int, int]:
        """What a DOP means on this device: on a CPU, queues timed at once on disjoint cores; on a GPU,
        one queue (kernels of separate processes only time-slice, and their events count each other's
        kernels) whose owner loads ``dop - 1`` libraries ahead of the one it times."""
        return (dop, 0) if self.device == "cpu" else (1, dop - 1)

    def _in_slots(
        self, window: list[BuildResult], timing: TimingConfig, slots: int, ahead: int
    ) -> dict[int, MeasureResult]:
        """The window timed as ``slots`` queues at once (every ``slots``-th candidate in one), by index."""
        queues = [list(range(slot, len(window), slots)) for slot in range(slots)]

        def run(indices: list[int]) -> list[tuple[int, MeasureResult]]:
            measured = self._runners.measure_queue([window[i] for i in indices], timing, False, ahead)
            return list(zip(indices, measured, strict=True))

        with ThreadPoolExecutor(max_workers=slots) as pool:
            return dict(pair for pairs in pool.map(run, queues) for pair in pairs)

    def _alone(self, built: BuildResult, parallel: MeasureResult, timing: TimingConfig) -> MeasureResult:
        """Re-measure a candidate with nothing else being timed, keeping its parallel samples and
        counting the energy of both measurements."""
        (alone,) = self._runners.measure_queue([built], timing, serial=True)
        if alone.ok:
            alone.parallel_samples = parallel.samples or None
        if parallel.energy_j is not None:
            alone.energy_j = parallel.energy_j + (alone.energy_j or 0.0)
        return alone

    def gpu_name(self) -> str | None:
        """The name from NVML of the GPU the runners use, if known."""
        return self.monitor.name if self.monitor is not None else None

    def _cuda_build_env(self) -> dict[str, str]:
        """The build workers' environment for CUDA: the compile path chosen here, on purpose."""
        try:
            mode = choose_compile_mode()
        except CudaBuildEnvError as err:  # the build workers fail to start with the same reason, as build results
            self._note(f"CUDA compile: none available ({err})")
            return {CUDA_BUILD_ENV: "1"}
        self._note(f"CUDA compile: {mode.describe()}")
        lean = {LEAN_ENV: os.environ[LEAN_ENV]} if LEAN_ENV in os.environ else {}  # as when the mode was chosen
        return {CUDA_BUILD_ENV: "1", COMPILE_MODE_ENV: mode.mode} | lean

    def _note(self, text: str) -> None:
        """Say how this engine measures, in the run's log (logs/engine.log)."""
        self.notes.append(text)
        log.info("%s", text)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "engine.log", "a") as out:
            out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def _remember_dop(self) -> None:
        if self._dop_memory is not None:
            self._dop_memory.save_new(self.dop)

    def _log_decision(self, decision: DopDecision) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / "dop.jsonl", "a") as log:
            log.write(json.dumps({"time": time.time(), **decision.as_dict()}) + "\n")

    def build(
        self,
        inputs: Sequence[MeasureInput],
        keep_layout_rewrite: bool = False,
        target: tvm.target.Target | None = None,
        timeout: float | None = None,
        group: str | None = None,
    ) -> Iterator[BuildResult]:
        """Build candidates in parallel, yielding each as it finishes. Artifacts are left in the
        work dir's artifacts folder for the caller (they can be timed on another host). ``timeout``:
        each build's, instead of the adaptive one that candidates get (and then not learnt from),
        which is sized on the builds of their ``group`` (task) where given."""
        target = target or self.target
        with ThreadPoolExecutor(max_workers=len(self._builders)) as pool:
            futures = [
                pool.submit(self._build_one, item, target, keep_layout_rewrite, timeout, group) for item in inputs
            ]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    # -- internals --------------------------------------------------------------------------------
    def _artifact_path(self, item: MeasureInput) -> str:
        stem = artifact_stem(item)
        with self._name_lock:
            self._artifact_dir.mkdir(parents=True, exist_ok=True)
            return str(self._artifact_dir / f"{stem}-{next(self._names)}.so")

    @contextmanager
    def _builder(self) -> Iterator[WorkerProcess]:
        """A build worker of the engine's pool, for the caller alone until it is given back."""
        if not self._builders:
            raise RuntimeError("this engine builds nothing (build_workers=0)")
        worker = self._free_builders.get()
        try:
            yield worker
        finally:
            self._free_builders.put(worker)

    def _build_one(
        self,
        item: MeasureInput,
        target: tvm.target.Target,
        keep_layout: bool,
        timeout: float | None,
        group: str | None,
    ) -> BuildResult:
        with self._builder() as worker:
            limit = timeout or self.build_timeout.value_for(group)
            built = build_with(worker, item, str(target), self._artifact_path(item), keep_layout, limit)
        if built.ok and timeout is None:
            self.build_timeout.record(built.seconds, group)
        return built
