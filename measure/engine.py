"""The measurement engine: build candidates in a pool of worker processes, time them in an
isolated measuring process, and hand back one result per candidate as soon as it is known.

On a CPU target the builds finish before any timing starts, because a compiling process on the
same cores would distort the timings; on a GPU, builds go on while earlier candidates are timed.
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from .host import available_memory_bytes
from .timeouts import AdaptiveTimeout
from .timing import TimingConfig
from .types import BuildResult, MeasureInput, MeasureResult, Status, VerifyResult
from .worker import WorkerCrashed, WorkerError, WorkerProcess, WorkerTimeout


class DeviceUnavailable(RuntimeError):
    """The measuring worker found no device of the target's kind."""


@dataclass
class EngineConfig:
    build_workers: int | None = None  # default: one per core, fewer if memory is short
    timing: TimingConfig = field(default_factory=TimingConfig)
    runtime_only_runner: bool = True  # measure with the TVM runtime alone, as a GPU host would
    build_timeout: AdaptiveTimeout = field(default_factory=lambda: AdaptiveTimeout(initial=120.0, floor=2.0))
    run_timeout: AdaptiveTimeout = field(default_factory=lambda: AdaptiveTimeout(initial=60.0, floor=5.0, factor=20.0))


def default_build_workers() -> int:
    memory_bound = max(1, available_memory_bytes() // (2 << 30))  # ~2 GiB per compiling worker
    return max(1, min(os.cpu_count() or 1, memory_bound))


def device_kind(target: tvm.target.Target) -> str:
    return "cuda" if target.kind.name == "cuda" else "cpu"


def host_target(target: tvm.target.Target) -> tvm.target.Target:
    """The CPU target that runs reference computations for ``target``."""
    if target.kind.name == "llvm":
        return target
    return target.host or tvm.target.Target("llvm")


class MeasureEngine:
    def __init__(self, target: tvm.target.Target, work_dir: Path, config: EngineConfig | None = None):
        self.target = target
        self.config = config or EngineConfig()
        self.device = device_kind(target)
        self.overlap_builds_with_runs = self.device != "cpu"
        self._artifact_dir = Path(work_dir) / "artifacts"
        self.log_dir = log_dir = Path(work_dir) / "logs"
        build_env = {"TENSOR_TUNER_CUDA_BUILD": "1"} if self.device == "cuda" else {}
        run_env = {"TVM_USE_RUNTIME_LIB": "1"} if self.config.runtime_only_runner else {}
        if self.device == "cpu":
            run_env["TVM_NUM_THREADS"] = str(int(target.attrs.get("num-cores", os.cpu_count() or 1)))
        workers = self.config.build_workers or default_build_workers()
        self._builders = [WorkerProcess("build", f"builder-{i}", log_dir / f"builder-{i}.log", build_env) for i in range(workers)]
        self._runner = WorkerProcess("run", "runner", log_dir / "runner.log", run_env)
        self._names = itertools.count()
        self._name_lock = threading.Lock()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start every worker; they import TVM in the background while the caller goes on."""
        for worker in (*self._builders, self._runner):
            worker.start()

    def close(self) -> None:
        for worker in (*self._builders, self._runner):
            worker.close()
        shutil.rmtree(self._artifact_dir, ignore_errors=True)

    def __enter__(self) -> MeasureEngine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def worker_restarts(self) -> int:
        return sum(w.restarts for w in (*self._builders, self._runner))

    # -- measuring candidates -------------------------------------------------------------------
    def measure(self, inputs: Sequence[MeasureInput], timing: TimingConfig | None = None) -> Iterator[MeasureResult]:
        """Yield one result per input, as each becomes known. A result is handed over before the
        next candidate's timing starts, so the caller can commit it first."""
        timing = timing or self.config.timing
        pending: list[BuildResult] = []
        for built in self.build(inputs):
            if not built.ok:
                yield built.as_failure()
            elif self.overlap_builds_with_runs:
                yield self._run(built, timing)
            else:
                pending.append(built)
        for built in pending:
            yield self._run(built, timing)

    def build(self, inputs: Sequence[MeasureInput], keep_layout_rewrite: bool = False, target: tvm.target.Target | None = None) -> Iterator[BuildResult]:
        """Build candidates in parallel, yielding each as it finishes. Artifacts are left in the
        work dir's artifacts folder for the caller (they can be timed on another host)."""
        free: queue.Queue[WorkerProcess] = queue.Queue()
        for worker in self._builders:
            free.put(worker)
        target = target or self.target
        with ThreadPoolExecutor(max_workers=len(self._builders)) as pool:
            futures = [pool.submit(self._build_one, free, item, target, keep_layout_rewrite) for item in inputs]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    def verify(self, reference: tvm.IRModule, candidate: tvm.IRModule, rtol: float) -> VerifyResult:
        """Check the candidate's output against the unscheduled function's on random inputs."""
        ref_target = host_target(self.target)
        (ref,) = self.build([MeasureInput("reference", reference)], keep_layout_rewrite=True, target=ref_target)
        (cand,) = self.build([MeasureInput("candidate", candidate)], keep_layout_rewrite=True)
        try:
            for built in (ref, cand):
                if not built.ok:
                    return VerifyResult(None, f"could not build the {built.key} to compare: {built.error}")
            outcome = self._runner.call(
                "compare_outputs",
                self.config.run_timeout.value * 10,
                candidate=cand.artifact,
                candidate_device=self.device,
                reference=ref.artifact,
                reference_device=device_kind(ref_target),
                args=cand.args,
                rtol=rtol,
            )
        except (WorkerError, WorkerTimeout, WorkerCrashed) as err:
            return VerifyResult(False, f"running the candidate to compare failed: {err}")
        finally:
            for built in (ref, cand):
                if built.artifact:
                    _remove(built.artifact)
        return VerifyResult(bool(outcome["ok"]), outcome["detail"])

    # -- whole programs ---------------------------------------------------------------------------
    def compile_program(self, artifact: Path, timeout: float = 1800.0, **request) -> Path:
        """Compile a whole program in a build worker (see build_job.compile_program) into ``artifact``."""
        self._builders[0].call("compile_program", timeout, artifact=str(artifact), target=str(self.target), **request)
        return artifact

    def time_program(self, artifact: Path, kind: str, args: Sequence, timing: TimingConfig | None = None) -> list[float]:
        """Time a compiled model (``kind="relax"``) or kernel (``"tir"``) in the measuring worker."""
        op = "time_model" if kind == "relax" else "time_kernel"
        timing = timing or self.config.timing
        try:
            outcome = self._runner.call(op, None, artifact=str(artifact), args=args, device_kind=self.device, timing=timing.as_dict())
        except WorkerError as err:
            self._raise_if_no_device(str(err))
            raise
        return outcome["samples"]

    # -- internals --------------------------------------------------------------------------------
    def _artifact_path(self) -> str:
        with self._name_lock:
            self._artifact_dir.mkdir(parents=True, exist_ok=True)
            return str(self._artifact_dir / f"candidate-{next(self._names)}.so")

    def _build_one(self, free: queue.Queue, item: MeasureInput, target: tvm.target.Target, keep_layout: bool) -> BuildResult:
        worker = free.get()
        try:
            artifact = self._artifact_path()
            request = dict(mod=item.mod, target=str(target), artifact=artifact, keep_layout_rewrite=keep_layout)
            try:
                built = worker.call("build_kernel", self.config.build_timeout.value, **request)
            except WorkerError as err:
                return BuildResult(item.key, Status.BUILD_ERROR, error=str(err))
            except WorkerTimeout as err:
                return BuildResult(item.key, Status.BUILD_TIMEOUT, error=f"build {err}")
            except WorkerCrashed as err:
                return BuildResult(item.key, Status.BUILD_CRASH, error=f"build crashed: {err}")
            self.config.build_timeout.record(built["seconds"])
            return BuildResult(item.key, Status.OK, artifact=built["artifact"], args=built["args"], seconds=built["seconds"])
        finally:
            free.put(worker)

    def _run(self, built: BuildResult, timing: TimingConfig) -> MeasureResult:
        common = dict(build_seconds=built.seconds, args=built.args)
        request = dict(artifact=built.artifact, args=built.args, device_kind=self.device, timing=timing.as_dict())
        try:
            outcome = self._runner.call("time_kernel", self.config.run_timeout.value, **request)
        except WorkerError as err:
            self._raise_if_no_device(str(err))
            return MeasureResult(built.key, Status.RUN_ERROR, error=str(err), **common)
        except WorkerTimeout as err:
            return MeasureResult(built.key, Status.RUN_TIMEOUT, error=f"run {err}", **common)
        except WorkerCrashed as err:
            return MeasureResult(built.key, Status.RUN_CRASH, error=f"run crashed: {err}", **common)
        finally:
            _remove(built.artifact)
        self.config.run_timeout.record(outcome["seconds"])
        return MeasureResult(built.key, Status.OK, samples=outcome["samples"], run_seconds=outcome["seconds"], **common)

    @staticmethod
    def _raise_if_no_device(message: str) -> None:
        if message.startswith("NoDevice"):
            raise DeviceUnavailable(message.split(":", 1)[-1].strip())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
