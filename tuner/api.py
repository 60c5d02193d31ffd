"""``tune()``: the Python entry point."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import tvm

from costmodel import CostModel, TrimmerFilter
from measure import DeviceUnavailable, EngineConfig, MeasureEngine
from measure.cluster import ClusterEngine, ClusterLost, ClusterOptions, ClusterUnavailable
from workloads import Workload

from . import metaschedule as msc
from .compile import UNTUNED_TIMING, best_schedules, compile_workload, time_workload
from .database import TuningDatabase
from .errors import NoDeviceError, TunerError
from .loop import LoopConfig, TuningLoop
from .lowering import LoweringOptions
from .metaschedule import schedule_from_json
from .objectives import Objectives, check_measurable
from .progress import Progress
from .result import TaskResult, TuneResult
from .scheduler import check_scheduler
from .targets import require_device, resolve_target
from .tasks import Task, extract_tasks, load_model, lower_workload
from .transfer import read_model_sources, read_sources, transfer, warm_start
from .workdir import (
    ARTIFACT_FILE,
    COST_MODEL_FILE,
    DATABASE_FILE,
    STORAGE_FAILURES,
    UNTUNED_FILE,
    WorkDirLock,
    prepare_work_dir,
    storage_errno,
)


def tune(
    model: Any,
    target: str | dict | tvm.target.Target = "llvm",
    trials: int | None = 64,
    work_dir: str | Path | None = None,
    *,
    stop: Objectives | None = None,
    task_stop: Objectives | None = None,
    scheduler: str = "gradient",
    trimmer: bool | TrimmerFilter = True,
    example_inputs: Sequence[Any] | None = None,
    batch: int | None = None,
    dtype: str | None = None,
    batch_size: int | None = None,
    build_workers: int | None = None,
    seed: int = 1,
    verify: bool = True,
    progress: bool = True,
    transfer_from: Sequence[str | Path] | None = None,
    cost_model_from: Sequence[str | Path] | None = None,
    cluster: str | None = None,
    lowering: LoweringOptions | None = None,
    trials_per_task: int | None = None,
) -> TuneResult:
    """Tune every kernel of ``model`` for ``target`` and return the compiled result.

    ``model`` is a built-in workload name (``tuner workloads`` lists them; ``batch`` and ``dtype``
    choose a built-in model's batch size and precision), a TensorIR PrimFunc, a Relax IRModule, a
    torch.nn.Module with ``example_inputs`` (tensors or shapes), or the path of an ONNX file
    (``example_inputs`` gives shapes its inputs leave symbolic). ``trials`` is the number of
    candidates measured in total, counting earlier runs in the same ``work_dir``: running again on
    a work dir resumes it and measures nothing twice. ``transfer_from``: work dirs of earlier runs
    (other models) whose schedules for kernels of the same kind are tried first (``tuner.transfer``).
    ``cost_model_from``: work dirs of earlier runs whose cost models' training data warm-starts this
    run's cost model, without their schedules (``transfer_from`` does both).
    ``cluster`` runs the builds and measurements on a Ray cluster: "auto" (the one this machine
    belongs to), "HOST:PORT" of its head node, "ray://HOST:PORT", or "local" (a private Ray
    instance on this machine); None tunes with this machine's own worker processes.
    ``trials_per_task`` states the budget per kernel instead: ``trials`` becomes that many times the
    number of tasks (the scheduler still gives more to the tasks where they pay).
    ``lowering`` sets how a model is lowered to kernels (``tuner.lowering.LoweringOptions``: batch
    norms folded, fast math, layout-only kernels fused, weight layouts chosen by the schedules; all
    on by default).

    ``stop`` adds cost objectives for the whole run (time, energy, money budgets, or no
    improvement; the first one met ends it) and ``task_stop`` the same per task (a task that
    meets one gets no more trials); ``trials=None`` leaves only those. ``scheduler`` is
    "gradient" (trials go where they cut the model's latency most) or "round-robin".
    ``trimmer=False`` measures every candidate the search proposes instead of skipping those the
    cost model predicts to be poor; a ``costmodel.TrimmerFilter`` sets how much it filters.
    """
    started = time.monotonic()
    if trials_per_task is not None:
        run_objectives(trials_per_task, stop)  # the same checks, before anything is set up
    objectives = run_objectives(trials, stop)
    check_scheduler(scheduler)
    sources = read_sources(transfer_from or [], DATABASE_FILE, COST_MODEL_FILE)
    model_sources = read_model_sources(cost_model_from or [], DATABASE_FILE, COST_MODEL_FILE)
    workload = load_model(model, example_inputs, batch=batch, dtype=dtype)
    if cluster is None:
        require_device(target)  # on a cluster the devices are the cluster's
    tvm_target = resolve_target(target)
    if tvm_target.kind.name != "cuda":  # no energy counters on a CPU: refuse an energy budget before anything starts
        for scope, objective in (("for the run", objectives), ("per task", task_stop or Objectives())):
            check_measurable(objective, False, scope)
    work_dir = prepare_work_dir(work_dir, workload.name, tvm_target)
    report = Progress(enabled=progress)
    with ExitStack() as held:
        held.enter_context(WorkDirLock(work_dir))
        db = TuningDatabase(work_dir / DATABASE_FILE)
        held.callback(db.close)
        engine = make_engine(tvm_target, work_dir, build_workers, cluster)
        held.callback(engine.close)
        try:
            start_engine(engine, report)  # local workers import TVM while the tasks and search spaces are prepared
            lowering = lowering or LoweringOptions()
            lowered = lower_workload(workload, tvm_target, lowering)
            tasks = extract_tasks(workload, tvm_target, lowered)
            if trials_per_task is not None:
                objectives = replace(objectives, trials=trials_per_task * len(tasks))
            _record_job(db, workload, tvm_target, tasks, lowering)
            cost_model = CostModel(seed=seed)
            config = LoopConfig(
                batch_size=batch_size,
                verify=verify,
                scheduler=scheduler,
                trimmer=trimmer if isinstance(trimmer, TrimmerFilter) else TrimmerFilter(enabled=trimmer),
            )
            loop = TuningLoop(tasks, tvm_target, db, engine, cost_model, seed, config, report)
            tuning_started = time.monotonic()
            if model_sources:
                db.set_meta(
                    "cost_model_from",
                    {
                        "samples": warm_start(
                            cost_model,
                            model_sources,
                            loop.runs[0].search.features.width,
                            report,
                            strict=True,
                            prefix="model",
                        )
                    },
                )
            if sources:
                db.set_meta("transfer", transfer(sources, loop.runs, cost_model, tvm_target, report))
            transfer_seconds = time.monotonic() - tuning_started
            stop_reason = loop.run(objectives, task_stop)
            report.line("re-measuring the best candidates and checking their results")
            loop.finalize()
            cost_model.save(work_dir / COST_MODEL_FILE)
            report.line("compiling the tuned and the untuned program")
            compiling = time.monotonic()
            artifact = compile_workload(
                engine, workload, lowered, best_schedules(db, tasks, tvm_target), work_dir / ARTIFACT_FILE
            )
            untuned = compile_workload(engine, workload, lowered, [], work_dir / UNTUNED_FILE)
            latency_after = time_workload(engine, workload, artifact)
            latency_before = time_workload(engine, workload, untuned, UNTUNED_TIMING)
            seconds = {
                "start-up": tuning_started - started,
                **({"transfer": transfer_seconds} if sources else {}),
                **loop.phase_seconds,
                "compile and time": time.monotonic() - compiling,
            }
            result = TuneResult(
                model=workload.name,
                kind=workload.kind,
                target=str(tvm_target),
                work_dir=work_dir,
                database_path=db.path,
                artifact_path=artifact,
                inputs=workload.inputs,
                tasks=[_task_result(run) for run in loop.runs],
                latency_before=latency_before,
                latency_after=latency_after,
                trials=loop.trials_done,
                wall_seconds=time.monotonic() - started,
                seconds=seconds,
                stop_reason=stop_reason,
                filtered=loop.ledger.as_dict(),
            )
            result.description.save(artifact)
            db.set_meta(
                "result",
                {
                    "latency_before": latency_before,
                    "latency_after": latency_after,
                    "trials": loop.trials_done,
                    "seconds": seconds,
                    "stop_reason": stop_reason,
                    "scheduler": scheduler,
                },
            )
            report.line(result.summary())
            return result
        except DeviceUnavailable as err:
            raise NoDeviceError(f"cannot measure on {tvm_target.kind.name}: {err}") from None
        except ClusterLost as err:
            raise TunerError(
                f"the Ray cluster went away ({err}); the {len(db.records(str(tvm_target)))} measurements taken are committed in {db.path}: "
                "run the same command again to resume, on a new cluster or on this machine"
            ) from None
        except (sqlite3.OperationalError, OSError) as err:
            code = storage_errno(err)
            if code is None:
                raise
            problem, fix = STORAGE_FAILURES[code]
            raise TunerError(f"{problem}: {_saved(db)}; {fix}, then run the same command again to resume") from None
        except KeyboardInterrupt as interrupt:
            print(
                f"tuner: {interrupt or 'interrupted'}; {_saved(db)}: run the same command again to resume",
                file=sys.stderr,
                flush=True,
            )
            raise


def _saved(db: TuningDatabase) -> str:
    try:
        return f"every measurement before it is committed in {db.path} ({db.count_records()} in all)"
    except sqlite3.Error:
        return f"every measurement before it is committed in {db.path}"


def make_engine(
    target: tvm.target.Target, work_dir: Path, build_workers: int | None, cluster: str | None
) -> MeasureEngine | ClusterEngine:
    """This machine's worker processes, or, given a cluster address, the Ray cluster's."""
    if cluster is None:
        return MeasureEngine(target, work_dir, EngineConfig(build_workers=build_workers))
    if not isinstance(cluster, str) or not cluster.strip():
        raise TunerError(
            f"cluster must be a Ray address ('auto', 'HOST:PORT', 'ray://HOST:PORT' or 'local'), got {cluster!r}"
        )
    if build_workers is not None:
        raise TunerError(
            "build_workers sizes this machine's build processes; on a Ray cluster every CPU builds: leave it out"
        )
    return ClusterEngine(target, work_dir, ClusterOptions(cluster.strip()))


def start_engine(engine: MeasureEngine | ClusterEngine, report: Progress) -> None:
    if isinstance(engine, MeasureEngine):
        engine.start()
        return
    try:
        engine.start()
    except ClusterUnavailable as err:
        raise TunerError(
            f"{err}: start a cluster with `ray start --head` (and `ray start --address HEAD:6379` on the other machines), "
            "or leave out the cluster to tune on this machine"
        ) from None
    nodes, measurers = engine.description["nodes"], engine.description["measurers"]
    devices = ", ".join(sorted({m["device"] for m in measurers if m["device"]}))
    report.line(
        f"cluster at {engine.options.address}: {len(nodes)} node(s), {sum(n['cpus'] for n in nodes):.0f} CPUs; {len(measurers)} measuring actor(s) on {devices}"
    )


def run_objectives(trials: Any, stop: Objectives | None) -> Objectives:
    """``stop`` with ``trials`` as its trial budget; some objective must be able to end the run."""
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials <= 0):
        raise TunerError(f"trials must be a positive integer (the number of candidates to measure), got {trials!r}")
    if stop is not None and not isinstance(stop, Objectives):
        raise TunerError(f"stop must be a tuner.Objectives, got {type(stop).__name__}")
    objectives = replace(stop or Objectives(), trials=trials if trials is not None else (stop.trials if stop else None))
    if objectives.empty:
        raise TunerError(
            "nothing would end this run: give trials, or a time, energy, money or no-improvement objective in stop"
        )
    return objectives


def _record_job(
    db: TuningDatabase, workload: Workload, target: tvm.target.Target, tasks: list[Task], lowering: LoweringOptions
) -> None:
    db.set_meta(
        "job",
        {
            "model": workload.name,
            "kind": workload.kind,
            "target": str(target),
            "lowering": lowering.as_dict(),
            "inputs": [[s.name, list(s.shape), s.dtype] for s in workload.inputs],
            "tasks": [
                {"name": t.name, "workload_id": db.workload_id(t.mod, t.name), "weight": t.weight, "flops": t.flops}
                for t in tasks
            ],
        },
    )


def _task_result(run) -> TaskResult:
    best = run.best
    schedule = None
    if best is not None:
        schedule = "\n".join(schedule_from_json(run.task.mod, best.trace).trace.as_python())
    return TaskResult(
        name=run.task.name,
        weight=run.task.weight,
        flops=run.task.flops,
        trials=run.trials,
        best_latency=best.latency if best else None,
        verified=best.verified if best else None,
        schedule=schedule,
        bytes=msc.kernel_bytes(run.task.mod),
    )
