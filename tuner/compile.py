"""Apply the best schedules to a workload, compile it, and time it against TVM's defaults."""

from __future__ import annotations

import statistics
from pathlib import Path

import tvm

from measure import Engine, TimingConfig
from workloads import Workload

from .database import TuningDatabase
from .tasks import Task

_MODEL_TIMING = TimingConfig(min_repeats=5, max_repeats=30, budget_seconds=0.5, warmup_seconds=0.1)
# TVM's default schedules can take minutes per call on a large model (a Llama layer): one
# warm-up and as many samples as half a second affords, at least one.
UNTUNED_TIMING = TimingConfig(min_repeats=1, max_repeats=30, budget_seconds=0.5, warmup_seconds=0.0)


def best_schedules(db: TuningDatabase, tasks: list[Task], target: tvm.target.Target) -> list[tuple[tvm.IRModule, str]]:
    """(kernel, trace JSON) of the fastest correct record of each task that has one."""
    schedules = []
    for task in tasks:
        kernel_id = db.find_kernel(task.mod)
        best = db.best(kernel_id, str(target), 1) if kernel_id is not None else []
        if best:
            schedules.append((task.mod, best[0].trace))
    return schedules


def compile_workload(
    engine: Engine, workload: Workload, lowered: tvm.IRModule, schedules: list, artifact: Path
) -> Path:
    """Compile ``workload`` (``lowered``: its ``tasks.lower_workload``) with ``schedules`` (none:
    TVM's default schedules) into ``artifact``."""
    artifact.parent.mkdir(parents=True, exist_ok=True)
    mod = lowered if workload.kind == "relax" else workload.mod
    return engine.compile_program(artifact, mod=mod, kind=workload.kind, schedules=schedules)


def time_workload(
    engine: Engine, workload: Workload, artifact: Path, timing: TimingConfig = _MODEL_TIMING, windows: int = 3
) -> float:
    """Median seconds per run of a compiled workload, timed in the measuring worker: the lowest of
    ``windows`` separate timing windows. A shared machine's passing load (another process, a VM
    neighbour) lifts a window's median, never lowers it: one such window made a model tuned to
    12.5 ms report 26 ms."""
    args = [[spec.dtype, list(spec.shape)] for spec in workload.inputs]
    return min(statistics.median(engine.time_program(artifact, workload.kind, args, timing)) for _ in range(windows))
