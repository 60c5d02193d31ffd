"""Choose each kernel's schedule (the best tuned record, else its analytic schedule), compile a workload
with them, and time it."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import tvm

from codegen.weights import detach_weights
from common.error_text import error_line
from common.model_weights import save_weights
from measure import Engine, TimingConfig
from tuner.database.database import Record, TuningDatabase
from tuner.database.workdir import IN_MODEL_CHOICES_KEY
from tuner.search.parallel import parallel_map
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import AnalyticSchedule, Configuration, configuration
from tuner.tasks.extraction import Task
from workloads import Workload

MODEL_TIMING = TimingConfig(min_repeats=5, max_repeats=30, budget_seconds=0.5, warmup_seconds=0.1)
MODEL_TIMING_WINDOWS = 3
IN_MODEL_RUNS = 10  # inferences each kernel's time inside the model is the median of (the report's)
# TVM's default schedules can take minutes per call on a large model (a Llama layer): one
# warm-up and as many samples as half a second affords, at least one.
UNTUNED_TIMING = TimingConfig(min_repeats=1, max_repeats=30, budget_seconds=0.5, warmup_seconds=0.0)
UNTUNED_TIMEOUT_S = 300.0  # for the warm-up call and one timed call of TVM's default schedules


@dataclass(frozen=True)
class KernelChoice:
    """What compile takes for one kernel: a tuned record, else its analytic schedule (``configured``, on a
    CPU), else TVM's default schedule; ``fell_back`` says why where tuned records existed but none could
    be used, ``beaten`` the tuned record its analytic schedule ran faster than inside the model
    (``in_model_choice``), ``unconfigured`` why a CPU kernel has no analytic schedule."""

    task: Task
    record: Record | None
    fell_back: str | None = None
    configured: AnalyticSchedule | None = None
    beaten: Record | None = None
    unconfigured: str | None = None

    @property
    def why_default(self) -> str | None:
        """Why compile builds the kernel with TVM's default schedule; None where it has a schedule (or none
        was looked for)."""
        if self.record is not None or self.configured is not None:
            return None
        if self.fell_back:
            return f"no usable candidate ({self.fell_back})"
        return f"no analytic schedule: {self.unconfigured}" if self.unconfigured else None

    @cached_property
    def trace(self) -> str | None:
        """The schedule compile applies, as trace JSON; None: TVM's default."""
        if self.record is not None:
            return self.record.trace
        return msc.trace_to_json(self.configured.sch) if self.configured is not None else None


def choose_schedules(
    db: TuningDatabase,
    tasks: list[Task],
    target: tvm.target.Target,
    verified_only: bool = True,
    configure: bool = True,
) -> list[KernelChoice]:
    """Per task, the fastest record compile may use: with ``verified_only`` (verification on, the
    default), only one whose output was checked against the unscheduled kernel and matched; a record
    whose trace no longer replays on the kernel is never used. A task with none gets its analytic
    schedule where ``configure`` and the target has one (``tuner.spaces.analytic``)."""
    choices = _recorded_choices(db, tasks, target, verified_only)
    if not configure:
        return choices
    configured = parallel_map(
        lambda choice: configuration(choice.task.mod, target) if choice.record is None else Configuration(None),
        choices,
    )
    return [
        replace(choice, configured=made.schedule, unconfigured=made.missing)
        for choice, made in zip(choices, configured, strict=True)
    ]


def _recorded_choices(
    db: TuningDatabase, tasks: list[Task], target: tvm.target.Target, verified_only: bool
) -> list[KernelChoice]:
    key = str(target)
    judged = db.get_meta(IN_MODEL_CHOICES_KEY, {})
    choices = []
    for task in tasks:
        kernel_id = db.find_kernel(task.mod)
        if kernel_id is None:
            choices.append(KernelChoice(task, None))
            continue
        if verified_only:
            record = db.best_verified(kernel_id, key)
        else:
            record = next(iter(db.best(kernel_id, key, 1)), None)
        if record is not None and judged.get(str(kernel_id), {}).get("beat") == record.id:
            choices.append(KernelChoice(task, None, beaten=record))  # its analytic schedule ran faster in the model
            continue
        if record is None:
            choices.append(KernelChoice(task, None, _why_none_usable(db, kernel_id, key)))
            continue
        try:
            msc.schedule_from_json(task.mod, record.trace)
        except Exception as err:  # noqa: BLE001 - TVM raises several types for a trace that does not replay
            choices.append(KernelChoice(task, None, f"its schedule does not replay ({error_line(err)})"))
            continue
        choices.append(KernelChoice(task, record))
    return choices


def _why_none_usable(db: TuningDatabase, kernel_id: int, key: str) -> str | None:
    wrong = db.count_status(kernel_id, key, "wrong_result")
    unchecked = db.count_status(kernel_id, key, "ok")
    parts = [f"{wrong} candidate{'s' if wrong != 1 else ''} wrong"] if wrong else []
    if unchecked:
        parts.append(f"{unchecked} not checked")
    return ", ".join(parts) or None


PREPACKED_SUFFIX = "_prepacked"  # TVM's SplitLayoutRewritePreproc renames a kernel whose weights it lays out


def in_model_seconds(times: dict[str, float], name: str) -> float | None:
    """A kernel's seconds per inference in ``times`` (``Engine.kernel_times``: by symbol), under its own name
    or the one TVM gives it where its weights are laid out once, at load."""
    return next((times[symbol] for symbol in (name, name + PREPACKED_SUFFIX) if symbol in times), None)


def schedules_of(choices: list[KernelChoice], leave_out: frozenset[str] = frozenset()) -> list[tuple]:
    """(kernel, trace JSON) pairs for ``compile_workload``: the scheduled kernels not in ``leave_out``."""
    return [(c.task.mod, c.trace) for c in choices if c.trace is not None and c.task.name not in leave_out]


@dataclass(frozen=True)
class Program:
    """What a build worker compiles a workload from: its module (a model's: lowered, its weights detached
    by ``codegen.weights``) and the file holding a model's weights (pickled inside the module, BERT-base's
    took 18 s to reach the worker)."""

    kind: str
    mod: tvm.IRModule
    weights: Path | None = None


@contextmanager
def program_of(workload: Workload, lowered: tvm.IRModule, scratch: Path) -> Iterator[Program]:
    """The program ``compile_workload`` compiles ``workload`` from (``lowered``: its ``tasks.lower_workload``),
    a model's weights written into ``scratch`` once, for every compile while it is open."""
    if workload.kind != "relax":
        yield Program(workload.kind, workload.mod)
        return
    mod, weights = detach_weights(lowered)
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".weights-", dir=scratch) as held:
        path = Path(held) / "lowered.params"
        save_weights(path, weights)
        yield Program(workload.kind, mod, path)


def compile_workload(
    engine: Engine, program: Program, schedules: list, artifact: Path, llvm_opt_level: int | None = None
) -> Path:
    """Compile ``program`` with ``schedules`` (none: TVM's default schedules) into ``artifact`` (a model's
    weights beside it: ``common.model_weights``); ``llvm_opt_level``: LLVM's, where not its default."""
    artifact.parent.mkdir(parents=True, exist_ok=True)
    extra = {"weights": str(program.weights)} if program.weights is not None else {}
    extra |= {"llvm_opt_level": llvm_opt_level} if llvm_opt_level is not None else {}
    return engine.compile_program(artifact, mod=program.mod, kind=program.kind, schedules=schedules, **extra)


def input_args(workload: Workload) -> list[list]:
    """A workload's inputs as the engine's workers take them ([dtype, shape] each, filled at random there)."""
    return [[spec.dtype, list(spec.shape)] for spec in workload.inputs]


def time_workload(
    engine: Engine,
    workload: Workload,
    artifact: Path,
    timing: TimingConfig = MODEL_TIMING,
    windows: int = MODEL_TIMING_WINDOWS,
    timeout: float | None = None,
) -> float:
    """Median seconds per run of a compiled workload, timed in the measuring worker: the lowest of
    ``windows`` separate timing windows. A shared machine's passing load (another process, a VM
    neighbour) lifts a window's median, never lowers it: one such window made a model tuned to
    12.5 ms report 26 ms."""
    args = input_args(workload)
    return min(
        statistics.median(engine.time_program(artifact, workload.kind, args, timing, timeout)) for _ in range(windows)
    )
