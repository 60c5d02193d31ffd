"""What the tuner needs from a measurement engine, and the settings every engine takes.

``MeasureEngine`` (this machine's worker processes) and ``ClusterEngine`` (a Ray cluster's) both
implement ``Engine``; the tuner is written against it alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from common.target_kind import is_cuda
from measure.timing.sampling import TimingConfig

from .timeouts import TimeoutPolicy
from .types import MeasureInput, MeasureResult, VerifyResult


@dataclass(frozen=True)
class EngineConfig:
    """An engine's settings (what it learns while measuring lives in the engine)."""

    build_workers: int | None = None  # default: one per core, fewer if memory is short; 0: measure only
    timing: TimingConfig = field(default_factory=TimingConfig)
    runtime_only_runner: bool = True  # measure with the TVM runtime alone, as a GPU host would
    max_dop: int | None = None  # CPU: queues timed at once (cores / num-cores); GPU: 1 + libraries loaded ahead (3)
    dop_error_threshold: float = 0.05  # a parallel measurement this far off the serial one is a loss
    dop_check_fraction: float = 0.2  # share of each parallel window re-measured serially
    remember_dop: bool = True  # start the DOP controller where the last run on this machine left it
    kept_builds: int = 5  # per task, the fastest candidates' libraries kept for the final choice to re-time
    build_timeout: TimeoutPolicy = TimeoutPolicy(initial=120.0, floor=2.0)
    run_timeout: TimeoutPolicy = TimeoutPolicy(initial=60.0, floor=5.0, factor=20.0)
    # The unscheduled kernel candidates are checked against runs once per task, on one CPU core: a
    # 13-GFLOP matmul of the Llama-3 layer (its down projection in Strassen form) takes 50 s on this 2-core VM.
    reference_timeout: float = 600.0


def device_kind(target: tvm.target.Target) -> str:
    """The device that runs ``target``'s code: "cuda" or "cpu"."""
    return "cuda" if is_cuda(target) else "cpu"


def host_target(target: tvm.target.Target) -> tvm.target.Target:
    """The CPU target that runs reference computations for ``target``."""
    if target.kind.name == "llvm":
        return target
    return target.host or tvm.target.Target("llvm")


class Engine(ABC):
    """Builds and times candidates and whole programs for one target.

    Use it as a context manager, or call ``start()`` and, whatever happens, ``close()``.
    """

    target: tvm.target.Target
    config: EngineConfig
    device: str  # "cuda" or "cpu"
    log_dir: Path  # the workers' logs
    overlap_builds_with_runs: bool = False  # candidates are timed while later ones still build (a GPU's engine)

    def __init__(self, target: tvm.target.Target, work_dir: Path, config: EngineConfig | None) -> None:
        self.target = target
        self.config = config or EngineConfig()
        self.device = device_kind(target)
        self.log_dir = Path(work_dir) / "logs"

    # -- life cycle ---------------------------------------------------------------------------
    @abstractmethod
    def start(self) -> None:
        """Start the workers (they may go on starting in the background)."""

    @abstractmethod
    def close(self) -> None:
        """Stop every worker; safe to call after a failed start."""

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def started_line(self) -> str | None:
        """One line for the run's progress on what was started, where there is more to say than
        "this machine's workers"; None here."""
        return None

    def activity(self) -> str | None:
        """A line on what the workers are doing, for engines spread over machines; None here."""
        return None

    def process_start_seconds(self) -> float | None:
        """Seconds a fresh process on this machine took to import TVM, as a worker measured it when it
        started; None where unknown. A compiled model run in a process of its own pays it first (the
        end-to-end check runs each build so)."""
        return None

    @property
    @abstractmethod
    def energy_measurable(self) -> bool:
        """Whether measurements come with the device's energy."""

    @property
    def pipelines_batches(self) -> bool:
        """Whether ``measure`` may be called again while another thread still reads an earlier call's
        results (the tuning loop then builds batch k+1 while batch k is timed); not here."""
        return False

    # -- candidates -------------------------------------------------------------------------------
    @abstractmethod
    def measure(
        self,
        inputs: Sequence[MeasureInput],
        timing: TimingConfig | None = None,
        serial: bool = False,
        group: str | None = None,
    ) -> Iterator[MeasureResult]:
        """Build and time every input; yield one result per input as each becomes known, for the
        caller to commit. ``serial=True`` times each alone (final choices); ``group`` names the
        candidates' comparison (a task): engines with devices of several models measure a group
        on devices of one model."""

    @abstractmethod
    def verify(
        self, reference: tvm.IRModule, candidate: tvm.IRModule, rtol: float, group: str | None = None
    ) -> VerifyResult:
        """Check the candidate's output against the reference's on random inputs."""

    # -- whole programs ---------------------------------------------------------------------------
    @abstractmethod
    def compile_program(self, artifact: Path, timeout: float = 1800.0, **request) -> Path:
        """Compile a whole program (see ``codegen.build.compile_program``) into ``artifact``."""

    @abstractmethod
    def time_program(
        self,
        artifact: Path,
        kind: str,
        args: Sequence,
        timing: TimingConfig | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        """Seconds per call of a compiled model (``kind="relax"``) or kernel (``"tir"``); WorkerTimeout past
        ``timeout`` seconds where the engine can stop a call."""

    def kernel_times(self, artifact: Path, args: Sequence, runs: int = 10, timeout: float | None = None) -> dict:
        """Each kernel's median seconds (summed over its calls in one inference) inside a compiled model,
        over ``runs`` inferences on random inputs, by kernel symbol; empty where the engine cannot
        instrument a model (a Ray cluster's)."""
        return {}
