"""What the engine's workers run besides candidates: whole programs compiled and timed, a model's kernels
timed inside it, a kernel run once, and looks into CUDA builds. A mixin of ``MeasureEngine``, whose build
workers (``_builder()``, one at a time from its pool) and runner pool (``_runners``) these calls go to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import tvm

from measure.contract import EngineConfig
from measure.timeouts import AdaptiveTimeout
from measure.timing.sampling import TimingConfig
from measure.workers.worker import WorkerProcess

from .runners import RunnerPool


class WorkerPrograms:
    """``MeasureEngine``'s calls of whole programs into its workers (see the module's docstring)."""

    target: tvm.target.Target
    config: EngineConfig
    device: str
    build_timeout: AdaptiveTimeout
    _builder: Callable[[], AbstractContextManager[WorkerProcess]]  # a build worker of the pool, for the caller alone
    _runners: RunnerPool

    def compile_program(self, artifact: Path, timeout: float = 1800.0, **request) -> Path:
        """Compile a whole program in a build worker (see codegen.build.compile_program) into ``artifact``."""
        with self._builder() as worker:
            worker.call("compile_program", timeout, artifact=str(artifact), target=str(self.target), **request)
        return artifact

    def time_program(
        self,
        artifact: Path,
        kind: str,
        args: Sequence,
        timing: TimingConfig | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        """Time a compiled model (``kind="relax"``) or kernel (``"tir"``) in the measuring worker; past
        ``timeout`` seconds the worker is stopped (and started again) and WorkerTimeout raised."""
        op = "time_model" if kind == "relax" else "time_kernel"
        timing = timing or self.config.timing
        outcome = self._runners.call_alone(
            op, timeout, artifact=str(artifact), args=args, device_kind=self.device, timing=timing.as_dict()
        )
        return outcome["samples"]

    def kernel_times(self, artifact: Path, args: Sequence, runs: int = 10, timeout: float | None = None) -> dict:
        """See ``Engine.kernel_times``: timed in the measuring worker."""
        outcome = self._runners.call_alone(
            "kernel_times", timeout, artifact=str(artifact), args=args, device_kind=self.device, runs=runs
        )
        return outcome["kernels"]

    def run_kernel(self, artifact: Path | str, arrays: Sequence) -> list:
        """Run a built kernel once on ``arrays`` (numpy) in the measuring worker; every argument afterwards."""
        return self._runners.call_alone(
            "run_kernel", None, artifact=str(artifact), arrays=list(arrays), device_kind=self.device
        )

    def cold_timings(self, artifact: Path | str, args: Sequence) -> dict:
        """A GPU kernel timed cold the tuner's way and TVM's way (``run_job.cold_timings``)."""
        return self._runners.call_alone("cold_timings", None, artifact=str(artifact), args=list(args))

    # -- looking into CUDA builds -------------------------------------------------------------------
    def cuda_source(self, mod: tvm.IRModule) -> str:
        """The CUDA C a scheduled kernel compiles to (compiled in a build worker)."""
        with self._builder() as worker:
            return worker.call("cuda_source", self.build_timeout.value, mod=mod, target=str(self.target))

    def load_cuda_artifact(self, artifact: str, kernels: list[str]) -> dict:
        """Load a built library in a build worker: its CUDA module's code format and which of ``kernels`` it has."""
        with self._builder() as worker:
            return worker.call("load_cuda_artifact", 120, artifact=str(artifact), kernels=list(kernels))
