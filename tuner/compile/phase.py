"""A run's compile phase: each kernel's schedule chosen (its best verified record, else its analytic one),
the model compiled so that no kernel can sink it, checked against its own framework, and timed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import tvm

from common.model_weights import remove_model
from measure import Engine, TimingConfig
from measure.workers.worker import WorkerError, WorkerTimeout
from tuner.database.database import Record, TuningDatabase
from tuner.database.workdir import WorkDir
from tuner.progress import Progress, format_latency
from tuner.search.final_choice import tolerance
from tuner.spaces.analytic import AnalyticSchedule
from tuner.spaces.calibration import SpeedProbe, speed_probe
from tuner.tasks.extraction import Task
from workloads import Workload

from .check import ModelCheck
from .checked_build import CheckedBuild
from .compile import (
    IN_MODEL_RUNS,
    UNTUNED_TIMEOUT_S,
    UNTUNED_TIMING,
    KernelChoice,
    choose_schedules,
    compile_workload,
    in_model_seconds,
    input_args,
    program_of,
    time_workload,
)
from .figures import KernelFigures, kernel_figures
from .in_model_choice import Judgement, choose_in_model


@dataclass(frozen=True)
class BuiltModel:
    artifact: Path
    latency_before: float | None  # seconds per run with TVM's default schedules; None: not timed
    latency_after: float | None  # and with the tuned ones; None: the model could not be timed here
    check: ModelCheck
    fell_back: dict[str, str]  # kernel name: why it keeps TVM's default schedule
    check_seconds: float  # of the compile and time, spent on the end-to-end check
    configured: dict[str, AnalyticSchedule] = field(default_factory=dict)  # kernels built with their analytic one
    configure_seconds: float = 0.0  # of the compile and time, spent on the analytic schedules
    figures: dict[str, KernelFigures] = field(default_factory=dict)  # by kernel: predicted, measured, peak
    # this machine's speed against its calibration while the kernels were timed in the model (the predictions'
    # speed); None: not read (a kernel, a GPU)
    machine_speed: float | None = None
    # by kernel: its tuned and its analytic schedule timed inside the model (``in_model_choice``)
    judged: dict[str, Judgement] = field(default_factory=dict)
    judge_seconds: float = 0.0  # of the compile and time, spent judging them
    records: dict[str, Record] = field(default_factory=dict)  # by kernel built with a tuned record: that record


def _untuned_latency(engine: Engine, workload: Workload, untuned: Path, report: Progress) -> float | None:
    """Seconds per run of the program with TVM's default schedules, or None where its warm-up call and
    one timed call outlast ``UNTUNED_TIMEOUT_S`` (a Llama-3 layer's direct matmuls untuned: over 20
    minutes a call); the tuned program is what the user came for, and is timed already."""
    try:
        return time_workload(engine, workload, untuned, UNTUNED_TIMING, windows=1, timeout=UNTUNED_TIMEOUT_S)
    except WorkerTimeout:
        report.line(f"the untuned program is not timed: two calls take over {UNTUNED_TIMEOUT_S:.0f} s")
        return None


def _tuned_latency(engine: Engine, workload: Workload, artifact: Path, report: Progress) -> float | None:
    """Seconds per run of the compiled model, or None where the measuring worker cannot run it (an extern
    function its TVM runtime lacks, say): the model is compiled and checked, and is returned all the same."""
    try:
        return time_workload(engine, workload, artifact)
    except (WorkerError, WorkerTimeout) as err:
        report.line(f"the compiled model is not timed: the measuring worker cannot run it ({err}); it is returned")
        return None


def compile_and_time(
    engine: Engine,
    workload: Workload,
    lowered: tvm.IRModule,
    tasks: list[Task],
    target: tvm.target.Target,
    work_dir: WorkDir,
    db: TuningDatabase,
    report: Progress,
    verify: bool = True,
    untunable: dict[str, str] | None = None,
    time_untuned: bool = False,
) -> BuiltModel:
    """The tuned program (verified schedules only, with ``verify``; analytic ones for kernels with none)
    compiled, checked against the model's own framework and timed; with ``time_untuned``, the untuned one
    (TVM's default schedules) compiled and timed too. Otherwise the untuned program is compiled only where
    the check needs it (a model with no framework to compare with, or a difference to bisect)."""
    report.line("compiling the tuned and the untuned program" if time_untuned else "compiling the tuned program")
    configuring = time.monotonic()
    choices = choose_schedules(db, tasks, target, verified_only=verify)
    configure_seconds = time.monotonic() - configuring
    if verify and workload.kind != "relax":  # a single kernel: no end-to-end check to catch a wrong one
        choices = _verified_configurations(engine, choices, report)
    for choice in choices:
        if choice.why_default:
            if choice.task.name not in (untunable or {}):  # the search said why already
                report.line(f"{choice.task.name}: built with TVM's default schedule: {choice.why_default}")
        elif choice.fell_back:
            why = f"no usable candidate ({choice.fell_back})"
            report.line(f"{choice.task.name}: built with its analytic schedule: {why}")
        elif choice.beaten and choice.configured:
            report.line(f"{choice.task.name}: built with its analytic schedule, judged faster inside the model")
    remove_model(work_dir.untuned)  # an earlier run's, of the same lowering or not
    with program_of(workload, lowered, work_dir.path) as program:
        if time_untuned:
            compile_workload(engine, program, [], work_dir.untuned)
        judging = time.monotonic()
        judged = choose_in_model(engine, workload, program, choices, target, work_dir.path, db, report.line)
        judge_seconds = time.monotonic() - judging
        if judged.switched:
            report.line(f"{len(judged.switched)} kernel(s) built with their analytic schedule, faster inside the model")
        choices = judged.choices
        build = CheckedBuild(engine, workload, program, choices, target, work_dir.untuned, report.line)
        check = build.build(work_dir.artifact, check=verify, compiled=judged.tuned_model)
    _mark_wrong_in_model(db, choices, check)
    latency_after = _tuned_latency(engine, workload, work_dir.artifact, report)
    latency_before = _untuned_latency(engine, workload, work_dir.untuned, report) if time_untuned else None
    probe = _speed_probe(target) if workload.kind == "relax" else None
    speed_before = _speed_now(engine, probe)
    in_model = _in_model_seconds(engine, workload, work_dir.artifact, tasks, report, latency_after)
    speed_after = _speed_now(engine, probe) if speed_before and in_model else None
    fell_back = {c.task.name: c.why_default for c in choices if c.why_default and c.fell_back}
    unconfigured = {c.task.name: c.why_default for c in choices if c.why_default and not c.fell_back}
    reasons = {**unconfigured, **(untunable or {}), **fell_back, **check.left_out}  # later win: the search's why
    configured = {c.task.name: c.configured for c in choices if c.configured and c.task.name not in check.left_out}
    switched = [c for c in choices if c.task.name in judged.switched and c.task.name in configured]
    beaten = {c.task.name: judged.judged[c.task.name].tuned / c.task.weight for c in switched}
    figures = kernel_figures(tasks, db, target, configured, in_model, beaten)
    return BuiltModel(
        work_dir.artifact,
        latency_before,
        latency_after,
        check,
        reasons,
        build.check_seconds,
        configured=configured,
        configure_seconds=configure_seconds,
        figures=figures,
        machine_speed=(speed_before + speed_after) / 2 if speed_before and speed_after else None,
        judged=judged.judged,
        records={c.task.name: c.record for c in choices if c.record is not None and c.task.name not in check.left_out},
        judge_seconds=judge_seconds,
    )


# As the calibration timed its product: the fastest of 7 samples of at least 20 ms each
PROBE_TIMING = TimingConfig(min_repeats=7, max_repeats=7, min_sample_seconds=0.02, warmup_seconds=0.02)


def _speed_probe(target: tvm.target.Target) -> SpeedProbe | None:
    """``calibration.speed_probe``, or None where it cannot be built: a figure of the report, nothing
    depends on it."""
    try:
        return speed_probe(target)
    except Exception:  # noqa: BLE001 - TVM raises several types for a build that fails; the report loses a line
        return None


def _speed_now(engine: Engine, probe: SpeedProbe | None) -> float | None:
    """The machine's speed against its calibration, the probe timed in the measuring worker, where the model's
    kernels are: timed in this process, the worker's threads still spinning from the model's last call held
    the cores, and the speed read 0.37-0.51 while the kernels ran at their predicted times."""
    if probe is None:
        return None
    try:
        return probe.speed(min(engine.time_program(probe.library, "tir", probe.args, PROBE_TIMING)))
    except (WorkerError, WorkerTimeout, ValueError):
        return None


IN_MODEL_PASSES = 3  # the kernels timed inside the model at most this many times (``_in_model_seconds``)
IN_MODEL_SLACK = 1.15  # what their sum may exceed the model's latency by (the hook runs Python between them)
IN_MODEL_MAX_PASS_SECONDS = 5.0  # a pass this long or longer is not repeated


def _in_model_seconds(
    engine: Engine,
    workload: Workload,
    artifact: Path,
    tasks: list[Task],
    report: Progress,
    latency: float | None = None,
) -> dict[str, float]:
    """Each task's seconds per launch as it runs inside the compiled model (its calls in one inference
    over its weight), for the report; nothing where the model cannot be instrumented (a kernel). A VM's
    small kernels slow down with it for minutes at a time while its product probe does not: MobileNetV1's
    kernels once added up to 3.9 ms in a 2.8 ms model (its depthwise convolutions at 3-4x their time alone),
    and to 2.7 ms in the same model an hour later. So where the kernels add up to more than
    ``IN_MODEL_SLACK`` of the model's ``latency``, they are timed again, up to ``IN_MODEL_PASSES`` times, and
    the pass that adds up to least is kept: the machine at its own speed, as the calibration keeps its
    fastest repeat."""
    if workload.kind != "relax":
        return {}
    args = input_args(workload)
    # a large model (or one not timed): one pass is what it affords
    repeatable = latency is not None and latency * IN_MODEL_RUNS <= IN_MODEL_MAX_PASS_SECONDS
    kept: dict[str, float] = {}
    for _ in range(IN_MODEL_PASSES if repeatable else 1):
        try:
            by_symbol = engine.kernel_times(artifact, args, IN_MODEL_RUNS)
        except (WorkerError, WorkerTimeout) as err:
            report.line(f"each kernel's time inside the model is not reported: {err}")
            return {}
        if not kept or sum(by_symbol.values()) < sum(kept.values()):
            kept = by_symbol
        if repeatable and sum(kept.values()) <= IN_MODEL_SLACK * latency:
            break
    total = sum(kept.values())
    if repeatable and total > IN_MODEL_SLACK * latency:  # ResNet-18 in bf16 once: 4.8 ms in 2.3
        report.line(
            f"the kernels' times inside the model add up to {format_latency(total)} in a model timed "
            f"at {format_latency(latency)}: the machine slowed while they were timed; read them as upper bounds"
        )
    seconds = {}
    for task in tasks:
        total = in_model_seconds(kept, task.name)
        if total is not None:
            seconds[task.name] = total / task.weight
    return seconds


def _verified_configurations(engine: Engine, choices: list[KernelChoice], report: Progress) -> list[KernelChoice]:
    """The analytic schedules checked against the unscheduled kernel; a wrong one is left out."""
    kept = []
    for choice in choices:
        if choice.configured is not None:
            outcome = engine.verify(choice.task.mod, choice.configured.sch.mod, tolerance(choice.task.mod))
            if outcome.ok is False:
                report.line(f"{choice.task.name}: its analytic schedule gives wrong results ({outcome.detail})")
                choice = replace(choice, configured=None)
        kept.append(choice)
    return kept


def _mark_wrong_in_model(db: TuningDatabase, choices: list[KernelChoice], check: ModelCheck) -> None:
    """Records whose kernels made the model wrong are never chosen again (a resume, ``tuner apply``)."""
    for choice in choices:
        if choice.record is not None and choice.task.name in check.left_out:
            db.set_verified(choice.record.id, False, check.left_out[choice.task.name])
