"""What goes into the measurement engine and what comes out of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm

from measure.timing.sampling import median


class Status:
    OK = "ok"
    BUILD_ERROR = "build_error"
    BUILD_TIMEOUT = "build_timeout"
    BUILD_CRASH = "build_crash"
    RUN_ERROR = "run_error"
    RUN_TIMEOUT = "run_timeout"
    RUN_CRASH = "run_crash"
    WRONG_RESULT = "wrong_result"


@dataclass(frozen=True)
class MeasureInput:
    """A scheduled kernel to build and time; ``key`` identifies it to the caller."""

    key: str
    mod: tvm.IRModule


@dataclass
class BuildResult:
    """A built candidate: ``artifact`` is a shared library holding the kernel, or None if the build failed."""

    key: str
    status: str
    artifact: str | None = None
    args: list | None = None  # [dtype, shape] of the kernel's arguments as built
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def as_failure(self) -> MeasureResult:
        return MeasureResult(self.key, self.status, error=self.error, build_seconds=self.seconds)


@dataclass
class MeasureResult:
    key: str
    status: str
    samples: list[float] = field(default_factory=list)  # seconds per call, every sample kept
    error: str | None = None
    build_seconds: float = 0.0
    run_seconds: float = 0.0
    args: list | None = None  # [dtype, shape] of the kernel's arguments as built
    timed_seconds: float = 0.0  # time spent inside timed calls (samples x calls per sample)
    dop: int = 1  # how many candidates were being timed at once when these samples were taken
    parallel_samples: list[float] | None = None  # when re-measured serially: the parallel samples
    energy_j: float | None = None  # from NVML, where the GPU counts energy
    health_flags: list[str] = field(default_factory=list)  # NVML saw clocks or temperature drift
    device: str | None = None  # on a cluster: the model of the device that timed it
    node: str | None = None  # on a cluster: the measuring actor, as "host/gpuN" or "host/cpu"

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def latency(self) -> float | None:
        return median(self.samples) if self.ok and self.samples else None

    def measurement_details(self) -> dict:
        """How the samples were taken, for the database: only what differs from a plain serial run."""
        details: dict = {}
        if self.dop != 1:
            details["dop"] = self.dop
        if self.parallel_samples:
            details["parallel_samples"] = self.parallel_samples
        if self.energy_j is not None:
            details["energy_j"] = self.energy_j
        if self.health_flags:
            details["health_flags"] = self.health_flags
        if self.device is not None:
            details["device"] = self.device
            details["node"] = self.node
        return details


@dataclass(frozen=True)
class VerifyResult:
    """Whether a candidate's output matched the unscheduled function's; ``ok`` is None if it could not be
    checked, and ``worth_retrying`` False where checking again would fail the same way."""

    ok: bool | None
    detail: str
    worth_retrying: bool = True
