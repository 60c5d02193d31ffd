"""What one candidate of each kernel costs to build and to time, as this run and the work dir measured it:
the unit of every estimate of what is left to do after a search (``tuner.search.reserve``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm

from codegen.build import default_gpu_schedule
from common.target_kind import is_cuda
from measure import Engine, MeasureInput
from tuner.database.database import TuningDatabase
from tuner.spaces.analytic import configure_kernel
from tuner.tasks.extraction import Task

from .parallel import parallel_map

PROBED_KERNELS = 3  # built once before a timed search that knows no kernel's cost: small, middling, large


@dataclass
class KernelCosts:
    """Per kernel (its task's name), the seconds its candidates took to build and to time."""

    builds: dict[str, list[float]] = field(default_factory=dict)
    runs: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def from_database(cls, db: TuningDatabase, target: str, names: dict[int, str]) -> KernelCosts:
        """What the work dir's earlier runs measured for the kernels ``names`` (kernel id: task name)."""
        costs = cls()
        for kernel_id, build, run in db.measured_seconds(target):
            if kernel_id in names:
                costs.observe(names[kernel_id], build or 0.0, run or 0.0)
        return costs

    def observe(self, kernel: str, build_seconds: float, run_seconds: float) -> None:
        if build_seconds > 0:
            self.builds.setdefault(kernel, []).append(build_seconds)
        if run_seconds > 0:
            self.runs.setdefault(kernel, []).append(run_seconds)

    @property
    def known(self) -> bool:
        return bool(self.builds)

    def build(self, kernel: str | None = None) -> float:
        """The median build of ``kernel``'s candidates; for a kernel not built yet (or None), the mean over
        the kernels built (what a sum over kernels needs); 0 before anything was built."""
        return _typical(self.builds, kernel)

    def run(self, kernel: str | None = None) -> float:
        """The median seconds a candidate of ``kernel`` took to time (loading its library included); for
        none, the mean over the kernels timed."""
        return _typical(self.runs, kernel)


def _typical(seconds: dict[str, list[float]], kernel: str | None) -> float:
    if kernel in seconds:
        return statistics.median(seconds[kernel])
    medians = [statistics.median(values) for values in seconds.values()]
    return statistics.fmean(medians) if medians else 0.0


def probe(engine: Engine, tasks: Sequence[Task], target: tvm.target.Target, costs: KernelCosts) -> None:
    """Build and time the schedules the compile would give ``PROBED_KERNELS`` kernels without tuning (their
    analytic ones on a CPU, TVM's default on a GPU), spread over the kernels by FLOPs, into ``costs``;
    nothing is committed. A build's cost follows a kernel's loops more than its FLOPs, so a spread of
    kernels, not the largest, stands for the rest."""
    by_flops = sorted(tasks, key=lambda task: task.flops)
    count = min(PROBED_KERNELS, len(by_flops))
    chosen = [by_flops[int((i + 0.5) * len(by_flops) / count)] for i in range(count)]
    mods = parallel_map(lambda task: _untuned_schedule(task.mod, target), chosen)
    inputs = [MeasureInput(task.name, mod) for task, mod in zip(chosen, mods, strict=True)]
    for result in engine.measure(inputs, serial=True):
        costs.observe(result.key, result.build_seconds, result.run_seconds if result.ok else 0.0)


def _untuned_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    if is_cuda(target):
        return default_gpu_schedule(mod, target)
    configured = configure_kernel(mod, target)
    return configured.sch.mod if configured is not None else mod
