"""What tune() hands back."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from common.model_weights import weights_path
from common.target_kind import is_cuda
from tuner.compile.check import ModelCheck
from tuner.compile.figures import KernelFigures, at_machine_speed, fraction_of_peak
from tuner.compile.phase import BuiltModel
from tuner.database.database import Record
from tuner.runtime.compiled_model import CompiledModel, ModelDescription
from tuner.spaces import metaschedule as msc
from tuner.spaces.metaschedule import schedule_from_json
from tuner.tasks.extraction import Task
from workloads import TensorSpec

from .progress import filter_summary, format_latency, format_phases, format_seconds
from .targets import describe_target


@dataclass
class TaskResult:
    name: str
    weight: int
    flops: float
    trials: int
    best_latency: float | None  # seconds per launch of the best verified schedule
    verified: bool | None
    schedule: str | None  # the best schedule as a MetaSchedule trace (Python)
    bytes: int = 0  # of the kernel's arguments: what one launch moves at the least
    fell_back: str | None = None  # why the model was built with TVM's default schedule for it, despite tuning
    analytic: bool = False  # built with its analytic schedule (no measured one): best_latency is None
    predicted_latency: float | None = None  # seconds per launch of its analytic schedule, by the analytic model
    analytic_latency: float | None = None  # of its analytic schedule, measured alone by the search
    in_model_latency: float | None = None  # seconds per launch inside the compiled model
    peak_gflops: float | None = None  # of its precision on this machine
    tiled: bool = False  # a product whose analytic schedule has a register tile and cache blocks
    # built with its analytic schedule, judged faster inside the model than its best tuned one: that one's
    # seconds per launch there
    tuned_in_model_latency: float | None = None

    @property
    def gflops(self) -> float | None:
        return self.flops / self.best_latency / 1e9 if self.best_latency and self.flops else None

    @property
    def fraction_of_peak(self) -> float | None:
        """Its FLOPs at its precision's peak over its time (tuned alone, else inside the model)."""
        return fraction_of_peak(self.flops, self.best_latency or self.in_model_latency, self.peak_gflops)

    @property
    def gbs(self) -> float | None:
        """Bytes of its arguments per second of the best schedule."""
        return self.bytes / self.best_latency / 1e9 if self.best_latency and self.bytes else None


@dataclass
class TuneResult:
    model: str
    kind: str  # "relax" (a model) or "tir" (a kernel)
    target: str
    work_dir: Path
    database_path: Path
    artifact_path: Path
    inputs: list[TensorSpec]
    tasks: list[TaskResult]
    latency_before: float | None  # seconds per run with TVM's default schedules
    latency_after: float | None  # seconds per run with the tuned schedules
    trials: int
    wall_seconds: float
    seconds: dict[str, float] = field(default_factory=dict)  # where the wall time went, by phase
    device_seconds: float = 0.0  # of the measure phase, the device in candidates' timed regions
    stop_reason: str | None = None  # the objective that ended the tuning
    filtered: dict = field(
        default_factory=dict
    )  # what the cost-model filter dropped and saved (costmodel.FilterLedger)
    check: ModelCheck | None = None  # the compiled model against its framework on the example inputs
    # this machine's speed against its calibration (the predictions' speed) while the kernels were timed in the
    # model: the calibration's product timed again beside them (``tuner.spaces.calibration.machine_speed``)
    machine_speed: float | None = None
    _module: Any = field(default=None, repr=False)
    _compiled: Any = field(default=None, repr=False)

    @property
    def predicted_latency(self) -> float | None:
        """Seconds per run by the analytic model of every kernel with its analytic schedule (what trials=0 gives)."""
        if not self.tasks or any(task.predicted_latency is None for task in self.tasks):
            return None
        return sum(task.weight * task.predicted_latency for task in self.tasks)

    def _speed_line(self) -> str:
        """The machine's speed while the model's kernels were timed: a VM's drifts (another tenant, a lower
        clock), and a run's timings read slow by it; the predictions are divided by it (docs/analytic.md)."""
        return (
            f"the machine ran at {self.machine_speed:.2f} of its calibrated speed while the kernels were timed in "
            "the model: the predictions are at that speed"
        )

    @property
    def speedup(self) -> float | None:
        if self.latency_before and self.latency_after:
            return self.latency_before / self.latency_after
        return None

    @property
    def module(self) -> tvm.runtime.Module:
        """The compiled artifact, loaded into this process. A model's ``main`` takes its weights after its
        inputs (``common.model_weights.load_weights``): ``run`` and ``compiled`` pass them."""
        if self._module is None:
            self._module = tvm.runtime.load_module(str(self.artifact_path))
        return self._module

    @property
    def description(self) -> ModelDescription:
        return ModelDescription(self.model, self.kind, self.target, self.inputs)

    def export(self, path: str | Path) -> Path:
        """Write the compiled model as a shared library that ``tvm.runtime.load_module`` loads, with
        its weights (``path`` with ``.params``) and its description (``.json``) beside it, from which
        ``tuner.load`` runs it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.artifact_path, path)
        if weights_path(self.artifact_path).exists():
            shutil.copyfile(weights_path(self.artifact_path), weights_path(path))
        self.description.save(path)
        return path

    def compiled(self, device: tvm.runtime.Device | None = None) -> CompiledModel:
        """The tuned model, ready to run (``tuner.runtime.compiled_model.CompiledModel``): keep it and call it."""
        if self._compiled is None or device is not None:
            compiled = CompiledModel(self.artifact_path, self.description, device)
            if device is not None:
                return compiled
            self._compiled = compiled
        return self._compiled

    def run(self, *inputs: Any, device: tvm.runtime.Device | None = None) -> Any:
        """Run the tuned program. A model takes numpy arrays or torch tensors and returns its
        output(s) the same way (see ``compiled``); a kernel takes every buffer argument (outputs too)
        as numpy and returns them all after the call."""
        if self.kind == "relax":
            return self.compiled(device)(*inputs)
        dev = device or (tvm.cuda(0) if is_cuda(self.target) else tvm.cpu(0))
        tensors = [tvm.runtime.tensor(np.asarray(x), dev) for x in inputs]
        self.module[self.module.entry_name](*tensors)
        return [t.numpy() for t in tensors]

    def summary(self) -> str:
        lines = [
            f"{self.model} on {describe_target(self.target)}: {self.trials} trials in "
            f"{format_seconds(self.wall_seconds)}"
        ]
        if self.check is not None:
            lines.append(self.check.line())
        fallen = sum(1 for task in self.tasks if task.fell_back)
        if fallen:
            lines.append(f"{fallen} kernel(s) built with TVM's default schedule (why: see below)")
        if self.seconds:
            lines.append("time: " + format_phases(self.seconds, self.device_seconds))
        if self.stop_reason:
            lines.append(f"stopped by {self.stop_reason}")
        if self.filtered.get("dropped"):
            lines.append(filter_summary(self.filtered))
        if self.latency_before is not None:
            speedup = f" ({self.speedup:.2f}x)" if self.speedup else ""
            lines.append(
                f"latency {format_latency(self.latency_before)} untuned -> {format_latency(self.latency_after)} "
                f"tuned{speedup}"
            )
        elif self.latency_after is not None:
            lines.append(f"latency {format_latency(self.latency_after)} tuned (untuned not timed: time_untuned=True)")
        else:
            lines.append("latency not timed: the measuring worker could not run the compiled model (its log says why)")
        if self.predicted_latency is not None:
            searched = any(not task.analytic for task in self.tasks)
            at_speed = at_machine_speed(self.predicted_latency, self.machine_speed)
            calibrated = f" ({format_latency(self.predicted_latency)} at its calibrated speed)"
            lines.append(
                f"the analytic model predicted {format_latency(at_speed)}"
                + (calibrated if self.machine_speed else "")
                + (" for the analytic schedules (what trials=0 gives)" if searched else "")
            )
        if self.machine_speed:
            lines.append(self._speed_line())
        for task in self.tasks:
            lines.append(f"  {task.name} x{task.weight}: {task_line(task, self.machine_speed)}")
        lines.append(f"artifact {self.artifact_path}  database {self.database_path}")
        return "\n".join(lines)


def task_line(task: TaskResult, machine_speed: float | None = None) -> str:
    """A kernel's latency, speed and schedule, then the analytic model's prediction (at ``machine_speed``
    where known) and its time inside the model where known: "1.20 ms 96.1 GFLOP/s (43% of peak), 32 trials,
    verified; predicted 1.05 ms"."""
    speed = f" {task.gflops:.1f} GFLOP/s" if task.gflops else ""
    if task.fraction_of_peak is not None:
        speed += f" ({task.fraction_of_peak:.0%} of peak)"
    check = {True: "verified", False: "WRONG", None: "unverified"}[task.verified]
    if task.fell_back:
        check = f"TVM's default schedule ({task.fell_back})"
    elif task.analytic and task.tuned_in_model_latency:
        check = f"analytic schedule (its tuned one {format_latency(task.tuned_in_model_latency)} in the model)"
    elif task.analytic:
        check = "analytic schedule"
    figures = [
        f"{what} {format_latency(seconds)}"
        for what, seconds in (
            ("predicted", at_machine_speed(task.predicted_latency, machine_speed)),
            ("analytic measured", task.analytic_latency),
            ("in the model", task.in_model_latency),
        )
        if seconds
    ]
    tail = "; " + ", ".join(figures) if figures else ""
    return f"{format_latency(task.best_latency)}{speed}, {task.trials} trials, {check}{tail}"


def task_result(
    task: Task, built: BuiltModel, fell_back_because: str | None, trials: int = 0, best: Record | None = None
) -> TaskResult:
    """A task's outcome: the schedule the model was built with: its ``best`` record (a run's, else the one
    ``built`` took from the work dir), else its analytic schedule; none where it fell back to TVM's default."""
    best = best or built.records.get(task.name)
    configured = built.configured.get(task.name)
    kernel = {
        "name": task.name,
        "weight": task.weight,
        "flops": task.flops,
        "trials": trials,
        "bytes": msc.kernel_bytes(task.mod),
        **_figure_fields(built, task.name),
    }
    if best is not None and not fell_back_because and configured is None:
        schedule = "\n".join(schedule_from_json(task.mod, best.trace).trace.as_python())
        return TaskResult(**kernel, best_latency=best.latency, verified=best.verified, schedule=schedule)
    return TaskResult(
        **kernel,
        best_latency=None,
        verified=None,
        schedule="\n".join(configured.sch.trace.as_python()) if configured else None,
        fell_back=None if configured else fell_back_because,
        analytic=configured is not None,
    )


def _figure_fields(built: BuiltModel, name: str) -> dict:
    figures = built.figures.get(name) or KernelFigures()
    return {
        "predicted_latency": figures.predicted,
        "analytic_latency": figures.analytic_measured,
        "in_model_latency": figures.in_model,
        "peak_gflops": figures.peak_gflops,
        "tiled": figures.tiled,
        "tuned_in_model_latency": figures.tuned_in_model,
    }
