"""A tuning run in phases: check everything that can be refused, open the work dir and start the
engine, turn the model into tasks, warm-start from earlier runs, search, compile and time, report.
``tune()`` is the door; this is what happens behind it."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tvm

from codegen.weights import weight_bytes
from common.target_kind import is_cuda
from costmodel import CostModel
from measure import DeviceUnavailable, Engine, EngineConfig, MeasureEngine, TimingConfig
from measure.cluster.engine import ClusterEngine, ClusterLost, ClusterOptions, ClusterUnavailable
from tuner.compile.check import ModelCheck
from tuner.compile.estimate import CompileEstimate
from tuner.compile.phase import BuiltModel, compile_and_time
from tuner.database.database import TuningDatabase
from tuner.database.workdir import (
    STORAGE_FAILURES,
    CostModelSourceRecord,
    JobRecord,
    JobTask,
    ResultRecord,
    WorkDir,
    read_meta,
    storage_errno,
    write_meta,
)
from tuner.lowering import LoweringOptions
from tuner.lowering.bf16.precision import check_bf16
from tuner.partition.pieces import tune_in_pieces
from tuner.search.budget import Budget, choose_budget, describe_budget
from tuner.search.kernel_costs import KernelCosts, probe
from tuner.search.loop import TuningLoop
from tuner.search.loop_config import LoopConfig
from tuner.search.objectives import Objectives, Spending, check_measurable, met, time_limit
from tuner.search.reserve import CallClock, reserve
from tuner.search.scheduler import check_scheduler
from tuner.search.transfer import TransferSource, read_model_sources, read_sources, transfer, warm_start
from tuner.tasks.extraction import Task, extract_tasks, load_model, lower_workload
from workloads import Workload

from .errors import PARTITION_HINT, ModelError, NoDeviceError, TunerError
from .options import TuneOptions
from .progress import Progress
from .quiet import native_logs_quiet
from .result import TaskResult, TuneResult, task_result
from .targets import require_device, resolve_target


@dataclass(frozen=True)
class Plan:
    """What the checks made of the model and the options, before anything is started."""

    workload: Workload
    target: tvm.target.Target
    objectives: Objectives
    task_objectives: Objectives | None
    work_dir: WorkDir
    sources: list[TransferSource]  # transfer_from: schedules and cost models
    model_sources: list[TransferSource]  # cost_model_from: cost models alone
    budget: Budget
    warnings: tuple[str, ...] = ()  # said before anything starts (bf16 on a CPU without AVX512_BF16)


@dataclass(frozen=True)
class Tasks:
    lowered: tvm.IRModule
    tasks: list[Task]
    objectives: Objectives  # with trials_per_task turned into a total
    budget_text: str  # the budget, as the first progress line states it


def run_tuning(model: Any, options: TuneOptions) -> TuneResult:
    started = time.monotonic()
    with native_logs_quiet(options.verbose) as native_log:  # TVM's C++ lines go to logs/libraries.log
        try:
            plan = check(model, options)
        except ModelError as err:
            if err.source is None:
                raise
            if not options.partition:
                raise ModelError(f"{err}{PARTITION_HINT}", err.unsupported) from None
            refusal = err  # tuned in pieces below, each piece a run of its own
        else:
            native_log.keep_in(plan.work_dir.logs)
            return _run(plan, options, started)
    return tune_in_pieces(refusal, options, started, run_tuning)


def _run(plan: Plan, options: TuneOptions, started: float) -> TuneResult:
    report = Progress(enabled=options.progress)
    for warning in plan.warnings:
        report.line(warning)
    with ExitStack() as held:
        held.enter_context(plan.work_dir.lock())
        db = plan.work_dir.open_database()
        held.callback(db.close)
        check_timing_matches(db, options.cold_cache, plan.work_dir)
        engine = make_engine(
            plan.target, plan.work_dir.path, options.build_workers, options.cluster, options.cold_cache
        )
        held.callback(engine.close)
        with _saving_work(db, plan.target):
            start_engine(engine, report)  # local workers import TVM while the tasks and search spaces are prepared
            lowering = options.lowering or LoweringOptions()
            if plan.workload.precision == "bfloat16":
                lowering = replace(lowering, bfloat16=True)
            tasks = prepare_tasks(plan, lowering, db, options.cold_cache, options.verify)
            if plan.budget.measures_nothing:
                return _configure_only(plan, options, tasks, engine, db, report, started)
            clock, costs, no_time = call_clock(plan, options, tasks, engine, db, started)
            if no_time:
                return _configure_only(plan, options, tasks, engine, db, report, started, no_time)
            cost_model = CostModel(seed=options.seed)
            loop = TuningLoop(
                tasks.tasks, plan.target, db, engine, cost_model, options.seed, _loop_config(options), report, costs
            )
            tuning_started = time.monotonic()
            warm_up(plan, loop, cost_model, db, report)
            transfer_seconds = time.monotonic() - tuning_started
            stop_reason = loop.run(tasks.objectives, plan.task_objectives, tasks.budget_text, clock)
            report.line("re-measuring the best candidates and checking their results")
            loop.finalize()
            cost_model.save(plan.work_dir.cost_model)
            compiling = time.monotonic()
            built = compile_and_time(
                engine, plan.workload, tasks.lowered, tasks.tasks, plan.target, plan.work_dir, db, report,
                options.verify, loop.unsearchable, options.time_untuned,
            )  # fmt: skip
            seconds = {
                "start-up": tuning_started - started,
                **({"transfer": transfer_seconds} if plan.sources else {}),
                **loop.phase_seconds,
                **_compile_seconds(built, compiling),
            }
            outcome = _outcome(built, loop.trials_done, seconds, stop_reason, options.scheduler, loop.device_seconds)
            write_meta(db, outcome)
            task_results = [
                task_result(run.task, built, outcome.fell_back.get(run.task.name), run.trials, run.best)
                for run in loop.runs
            ]
            result = make_result(
                plan, task_results, loop.ledger.as_dict(), built.artifact, outcome, time.monotonic() - started
            )
            report.line(result.summary())
            return result


def _configure_only(
    plan: Plan,
    options: TuneOptions,
    tasks: Tasks,
    engine: Engine,
    db: TuningDatabase,
    report: Progress,
    started: float,
    no_time: str | None = None,
) -> TuneResult:
    """No trials (or, ``no_time``, no time to measure any): every kernel without a tuned schedule in the
    work dir compiled with its analytic one, the model checked end to end and timed."""
    why = f"no time to measure ({no_time})" if no_time else "no trials"
    report.line(f"{len(tasks.tasks)} kernels, {why}: their analytic schedules, none measured")
    compiling = time.monotonic()
    built = compile_and_time(
        engine, plan.workload, tasks.lowered, tasks.tasks, plan.target, plan.work_dir, db, report,
        options.verify, None, options.time_untuned,
    )  # fmt: skip
    seconds = {"start-up": compiling - started, **_compile_seconds(built, compiling)}
    outcome = _outcome(
        built, 0, seconds, f"{no_time}: none measured" if no_time else "no trials (trials=0)", options.scheduler
    )
    write_meta(db, outcome)
    task_results = [task_result(task, built, outcome.fell_back.get(task.name)) for task in tasks.tasks]
    result = make_result(plan, task_results, {}, built.artifact, outcome, time.monotonic() - started)
    report.line(result.summary())
    return result


def _compile_seconds(built: BuiltModel, compiling: float) -> dict[str, float]:
    spent = time.monotonic() - compiling
    return {
        "analytic schedules": built.configure_seconds,
        "compile and time": spent - built.check_seconds - built.configure_seconds - built.judge_seconds,
        "end-to-end check": built.check_seconds,
        **({"in-model choice": built.judge_seconds} if built.judged else {}),
    }


def _outcome(
    built: BuiltModel,
    trials: int,
    seconds: dict,
    stop_reason: str | None,
    scheduler: str,
    device_seconds: float = 0.0,
) -> ResultRecord:
    return ResultRecord(
        built.latency_before,
        built.latency_after,
        trials,
        seconds,
        stop_reason,
        scheduler,
        device_seconds,
        built.check.as_dict(),
        built.fell_back,
        {name: figures.as_dict() for name, figures in built.figures.items()},
        built.machine_speed,
    )


# -- phase 1: everything that can be refused is refused before anything starts --------------------
def check(model: Any, options: TuneOptions) -> Plan:
    budget = choose_budget(options.trials, options.trials_per_task, options.stop)
    # per task: the same checks as for trials; the total replaces it once the tasks are known
    trials = budget.trials_per_task if budget.trials_per_task is not None else budget.trials
    objectives = run_objectives(trials, options.stop) if trials != 0 else options.stop or Objectives()
    check_scheduler(options.scheduler)
    sources = read_sources(options.transfer_from or [])
    model_sources = read_model_sources(options.cost_model_from or [])
    workload = load_model(model, options.example_inputs, batch=options.batch, dtype=options.dtype)
    if options.cluster is None:
        require_device(options.target)  # on a cluster the devices are the cluster's
    target = resolve_target(options.target)
    if not is_cuda(target):  # no energy counters on a CPU: refuse an energy budget up front
        for scope, objective in (("for the run", objectives), ("per task", options.task_stop or Objectives())):
            check_measurable(objective, False, scope)
    warning = check_bf16(options.target, target) if workload.precision == "bfloat16" else None
    work_dir = WorkDir.create(options.work_dir, workload.name, target)
    warnings = (warning,) if warning else ()
    return Plan(workload, target, objectives, options.task_stop, work_dir, sources, model_sources, budget, warnings)


def run_objectives(trials: Any, stop: Objectives | None) -> Objectives:
    """``stop`` with ``trials`` as its trial budget; some objective must be able to end the run."""
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 0):
        raise TunerError(
            f"trials must be a whole number (the candidates to measure; 0: analytic schedules only), got {trials!r}"
        )
    if stop is not None and not isinstance(stop, Objectives):
        raise TunerError(f"stop must be a tuner.Objectives, got {type(stop).__name__}")
    objectives = replace(stop or Objectives(), trials=trials if trials is not None else (stop.trials if stop else None))
    if objectives.empty:
        raise TunerError(
            "nothing would end this run: give trials, or a time, energy, money or no-improvement objective in stop"
        )
    return objectives


def check_timing_matches(db: TuningDatabase, cold_cache: bool, work_dir: WorkDir) -> None:
    """Refuse to resume a work dir whose kernels were timed with the other cache state: the search
    would compare warm and cold timings as equals (MobileNetV2's kernels add up to 3.29 ms warm and
    4.51 ms cold)."""
    job = read_meta(db, JobRecord)
    if job is None or job.cold_cache == cold_cache or db.count_records() == 0:
        return
    tuned, flag = ("cold", "with") if job.cold_cache else ("warm", "without")
    raise TunerError(
        f"{work_dir.path} was tuned with {tuned} caches: resume it {flag} --cold-cache (cold_cache={job.cold_cache}),"
        " or tune in a new work dir"
    )


# -- phase 2: the engine ------------------------------------------------------------------------
def make_engine(
    target: tvm.target.Target,
    work_dir: Path,
    build_workers: int | None,
    cluster: str | None,
    cold_cache: bool = False,
) -> Engine:
    """This machine's worker processes, or, given a cluster address, the Ray cluster's."""
    timing = TimingConfig(flush_cache=True) if cold_cache else TimingConfig()
    if cluster is None:
        return MeasureEngine(target, work_dir, EngineConfig(build_workers=build_workers, timing=timing))
    if not isinstance(cluster, str) or not cluster.strip():
        raise TunerError(
            f"cluster must be a Ray address ('auto', 'HOST:PORT', 'ray://HOST:PORT' or 'local'), got {cluster!r}"
        )
    if build_workers is not None:
        raise TunerError(
            "build_workers sizes this machine's build processes; on a Ray cluster every CPU builds: leave it out"
        )
    return ClusterEngine(target, work_dir, ClusterOptions(cluster.strip()), EngineConfig(timing=timing))


def start_engine(engine: Engine, report: Progress) -> None:
    try:
        engine.start()
    except ClusterUnavailable as err:
        raise TunerError(
            f"{err}: start a cluster with `ray start --head` (and `ray start --address HEAD:6379` on the other "
            "machines), or leave out the cluster to tune on this machine"
        ) from None
    line = engine.started_line()
    if line:
        report.line(line)


@contextlib.contextmanager
def _saving_work(db: TuningDatabase, target: tvm.target.Target) -> Iterator[None]:
    """Whatever ends the run early, say in one line what is saved and how to go on."""
    try:
        yield
    except DeviceUnavailable as err:
        raise NoDeviceError(f"cannot measure on {target.kind.name}: {err}") from None
    except ClusterLost as err:
        raise TunerError(
            f"the Ray cluster went away ({err}); the {len(db.records(str(target)))} measurements taken are committed "
            f"in {db.path}: run the same command again to resume, on a new cluster or on this machine"
        ) from None
    except (sqlite3.OperationalError, OSError) as err:
        code = storage_errno(err)
        if code is None:
            raise
        problem, fix = STORAGE_FAILURES[code]
        raise TunerError(f"{problem}: {_saved(db)}; {fix}, then run the same command again to resume") from None
    except KeyboardInterrupt as interrupt:
        message = f"tuner: {interrupt or 'interrupted'}; {_saved(db)}: run the same command again to resume"
        print(message, file=sys.stderr, flush=True)
        raise


def _saved(db: TuningDatabase) -> str:
    try:
        return f"every measurement before it is committed in {db.path} ({db.count_records()} in all)"
    except sqlite3.Error:
        return f"every measurement before it is committed in {db.path}"


# -- phase 3: the tasks ---------------------------------------------------------------------------
def prepare_tasks(
    plan: Plan,
    lowering: LoweringOptions,
    db: TuningDatabase,
    cold_cache: bool,
    verify: bool = True,
) -> Tasks:
    lowered = lower_workload(plan.workload, plan.target, lowering)
    tasks = extract_tasks(plan.workload, plan.target, lowered)
    objectives = plan.objectives
    if plan.budget.trials_per_task is not None and not plan.budget.measures_nothing:
        objectives = replace(objectives, trials=plan.budget.total_trials(len(tasks)))
    workload = plan.workload
    job = JobRecord(
        model=workload.name,
        kind=workload.kind,
        target=str(plan.target),
        lowering=lowering.as_dict(),
        inputs=[[s.name, list(s.shape), s.dtype] for s in workload.inputs],
        tasks=[JobTask(t.name, db.kernel_id(t.mod, t.name), t.weight, t.flops) for t in tasks],
        cold_cache=cold_cache,
        verify=verify,
    )
    write_meta(db, job)
    return Tasks(lowered, tasks, objectives, describe_budget(plan.budget, objectives))


def _loop_config(options: TuneOptions) -> LoopConfig:
    return LoopConfig(
        batch_size=options.batch_size,
        verify=options.verify,
        scheduler=options.scheduler,
        filter=options.filter_settings,
        analytic_start=options.analytic_start,
        pipeline=options.pipeline,
    )


def call_clock(
    plan: Plan, options: TuneOptions, tasks: Tasks, engine: Engine, db: TuningDatabase, started: float
) -> tuple[CallClock, KernelCosts, str | None]:
    """A time budget's clock, from the call; what a candidate of each kernel costs, as the work dir's earlier
    runs measured it, else (a fresh work dir under a time budget) as measured on a few kernels now; and the
    budget's reason where start-up and the compile phase already fill it: no time to measure anything."""
    names = {db.kernel_id(task.mod, task.name): task.name for task in tasks.tasks}
    costs = KernelCosts.from_database(db, str(plan.target), names)
    timed = time_limit(tasks.objectives) is not None
    weights = weight_bytes(tasks.lowered) if timed and plan.workload.kind == "relax" else 0
    analytic = plan.target.kind.name == "llvm"
    estimate = CompileEstimate.of(
        plan.workload, tasks.tasks, engine, options.verify, options.time_untuned, analytic, weights
    )
    clock = CallClock(started, estimate)
    if timed and not costs.known and not met(tasks.objectives, Spending(seconds=clock.elapsed())):
        probe(engine, tasks.tasks, plan.target, costs)  # not where start-up alone used the budget
    before_search = Spending(seconds=clock.elapsed(), reserved=reserve(0.0, clock.compile_seconds(costs, 0.0)))
    return clock, costs, met(tasks.objectives, before_search) if timed else None


# -- phase 4: what earlier runs give --------------------------------------------------------------
def warm_up(plan: Plan, loop: TuningLoop, cost_model: CostModel, db: TuningDatabase, report: Progress) -> None:
    """Warm-start the cost model (cost_model_from) and seed the tasks (transfer_from)."""
    if plan.model_sources:
        samples = warm_start(cost_model, plan.model_sources, loop.feature_width, report, strict=True, prefix="model")
        write_meta(db, CostModelSourceRecord(samples))
    if plan.sources:
        write_meta(db, transfer(plan.sources, loop, cost_model, plan.target, report))


# -- phase 5: the result --------------------------------------------------------------------------
def make_result(
    plan: Plan,
    tasks: list[TaskResult],
    filtered: dict,
    artifact: Path,
    outcome: ResultRecord,
    wall_seconds: float,
) -> TuneResult:
    workload = plan.workload
    result = TuneResult(
        model=workload.name,
        kind=workload.kind,
        target=str(plan.target),
        work_dir=plan.work_dir.path,
        database_path=plan.work_dir.database,
        artifact_path=artifact,
        inputs=workload.inputs,
        tasks=tasks,
        latency_before=outcome.latency_before,
        latency_after=outcome.latency_after,
        trials=outcome.trials,
        wall_seconds=wall_seconds,
        seconds=outcome.seconds,
        device_seconds=outcome.device_seconds,
        stop_reason=outcome.stop_reason,
        filtered=filtered,
        check=ModelCheck(**outcome.check) if outcome.check else None,
        machine_speed=outcome.machine_speed,
    )
    result.description.save(artifact)
    return result
