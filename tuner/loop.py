"""The tuning loop: pick a task, propose candidates, measure them, commit every result, learn, repeat."""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import tvm

from costmodel import CandidateFeatures, CostModel
from measure import MeasureEngine, MeasureInput, TimingConfig

from . import metaschedule as msc
from .database import Record, TuningDatabase
from .errors import TunerError
from .progress import Progress
from .scheduler import TaskProgress, TaskScheduler
from .search import Candidate, SearchConfig, TaskSearch
from .targets import describe_target
from .tasks import Task


@dataclass
class LoopConfig:
    batch_size: int | None = None  # default: about a quarter of each task's share of the trials
    search: SearchConfig = field(default_factory=SearchConfig)
    remeasure_top: int = 5  # re-measured at the end with final_timing before the best is chosen
    final_timing: TimingConfig = field(default_factory=lambda: TimingConfig(min_repeats=5, max_repeats=50, budget_seconds=0.25))
    verify: bool = True
    give_up_after: int = 32  # failures in a row, with no success at all yet, that end the run


@dataclass
class TaskRun:
    task: Task
    workload_id: int
    search: TaskSearch
    progress: TaskProgress
    trials: int = 0
    best: Record | None = None


def auto_batch_size(budget: int, num_tasks: int) -> int:
    per_task = budget / max(1, num_tasks)
    return int(min(64, max(8, math.ceil(per_task / 4))))


def tolerance(mod: tvm.IRModule) -> float:
    """Relative error allowed when comparing with the unscheduled function: reduction order differs."""
    dtypes = {str(p.dtype) for p in mod["main"].params}
    return 1e-2 if dtypes & {"float16", "bfloat16"} else 1e-3


class TuningLoop:
    def __init__(
        self,
        tasks: list[Task],
        target: tvm.target.Target,
        db: TuningDatabase,
        engine: MeasureEngine,
        cost_model: CostModel,
        seed: int = 1,
        config: LoopConfig | None = None,
        progress: Progress | None = None,
    ):
        self.target = target
        self.target_key = str(target)
        self.db = db
        self.engine = engine
        self.cost_model = cost_model
        self.config = config or LoopConfig()
        self.progress = progress or Progress(enabled=False)
        self.scheduler = TaskScheduler()
        self.phase_seconds: dict[str, float] = {"search": 0.0, "measure": 0.0, "cost model": 0.0, "final choice": 0.0}
        self._successes = 0
        self._failures: Counter[str] = Counter()
        self._clock_offset = db.elapsed_so_far()
        self._session_start = time.monotonic()
        features = CandidateFeatures()
        self.runs: list[TaskRun] = []
        for index, task in enumerate(tasks):
            workload_id = db.workload_id(task.mod, task.name)
            search = TaskSearch(task.mod, target, seed + index, cost_model, features, group=str(workload_id), config=self.config.search)
            self.runs.append(TaskRun(task, workload_id, search, TaskProgress(task.weight)))
        self._restore()

    @property
    def trials_done(self) -> int:
        return sum(run.trials for run in self.runs)

    def elapsed(self) -> float:
        """Tuning seconds of this work dir, counting earlier runs."""
        return self._clock_offset + time.monotonic() - self._session_start

    def model_latency(self) -> float | None:
        """The model's estimated latency from its tasks' best kernels; None until every task has one."""
        if any(run.progress.best is None for run in self.runs):
            return None
        return sum(run.task.weight * run.progress.best for run in self.runs)

    @contextlib.contextmanager
    def _phase(self, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.phase_seconds[name] += time.monotonic() - start

    # -- resuming --------------------------------------------------------------------------------
    def _restore(self) -> None:
        records = self.db.records(self.target_key)
        for run in self.runs:
            mine = [(r.candidate, r.trace, r.latency) for r in records if r.workload_id == run.workload_id]
            run.search.restore(mine)
            run.trials = len(mine)
            if mine:
                best = self.db.best(run.workload_id, self.target_key, 1)
                run.progress.batches = 1
                run.progress.best = best[0].latency if best else None
        if self.trials_done:
            self.cost_model.fit()

    # -- tuning ----------------------------------------------------------------------------------
    def run(self, budget: int) -> None:
        """Measure until ``budget`` trials (counting earlier runs) are spent or every task's space is exhausted."""
        batch_size = self.config.batch_size or auto_batch_size(budget, len(self.runs))
        self.progress.start(self.trials_done, budget, len(self.runs), f"on {describe_target(self.target)}")
        while self.trials_done < budget:
            index = self.scheduler.pick([run.progress for run in self.runs])
            if index is None:
                self.progress.line("every task's search space is exhausted; stopping early")
                break
            run = self.runs[index]
            with self._phase("search"):
                candidates = run.search.propose(min(batch_size, budget - self.trials_done))
                run.search.feature_rows(candidates)  # extract features in one batch
            if not candidates:
                run.progress.exhausted = True
                continue
            with self._phase("measure"):
                run.progress.record_batch(self._measure(run, candidates))
            self._stop_if_nothing_works()
            with self._phase("cost model"):
                self.cost_model.update()
            self.progress.batch(
                index, len(self.runs), run.task.name, self.trials_done, budget, run.progress.best, run.task.flops, self.model_latency()
            )

    def _measure(self, run: TaskRun, candidates: list[Candidate]) -> float | None:
        by_key = {c.key: c for c in candidates}
        batch_best = None
        for result in self.engine.measure([MeasureInput(c.key, c.mod) for c in candidates]):
            candidate = by_key[result.key]
            self.db.commit(
                run.workload_id,
                self.target_key,
                candidate.key,
                candidate.trace_json,
                result.status,
                samples=result.samples,
                error=result.error,
                args=result.args,
                build_seconds=result.build_seconds,
                run_seconds=result.run_seconds,
                elapsed=self.elapsed(),
                measurement=result.measurement_details(),
            )
            run.search.observe(candidate, result.latency)
            run.trials += 1
            if result.ok:
                self._successes += 1
            else:
                self._failures[f"{result.status}: {result.error}"] += 1
            if result.latency is not None and (batch_best is None or result.latency < batch_best):
                batch_best = result.latency
        return batch_best

    def _stop_if_nothing_works(self) -> None:
        failed = sum(self._failures.values())
        if self._successes == 0 and failed >= self.config.give_up_after:
            reason, count = self._failures.most_common(1)[0]
            raise TunerError(
                f"all {failed} candidates measured so far failed ({count} with {reason}); stopping rather than spending "
                f"the rest of the budget: see the worker logs in {self.engine.log_dir}"
            )

    # -- choosing the final schedules ------------------------------------------------------------
    def finalize(self) -> None:
        """Re-measure each task's top candidates with more repeats, then take the fastest one whose
        output matches the unscheduled function's."""
        with self._phase("final choice"):
            self._finalize()

    def _finalize(self) -> None:
        for run in self.runs:
            top = self.db.best(run.workload_id, self.target_key, self.config.remeasure_top)
            if not top:
                continue
            schedules = {r.candidate: msc.schedule_from_json(run.task.mod, r.trace) for r in top}
            records = {r.candidate: r for r in top}
            inputs = [MeasureInput(key, sch.mod) for key, sch in schedules.items()]
            for result in self.engine.measure(inputs, timing=self.config.final_timing, serial=True):
                if result.ok:
                    self.db.add_samples(records[result.key].id, result.samples)
            run.best = self._first_correct(run, schedules)
            run.progress.best = run.best.latency if run.best else None

    def _first_correct(self, run: TaskRun, schedules: dict) -> Record | None:
        for record in self.db.best(run.workload_id, self.target_key, self.config.remeasure_top):
            if not self.config.verify or record.verified:
                return record
            sch = schedules.get(record.candidate) or msc.schedule_from_json(run.task.mod, record.trace)
            outcome = self.engine.verify(run.task.mod, sch.mod, tolerance(run.task.mod))
            if outcome.ok is False:
                self.db.set_verified(record.id, False, outcome.detail)
                self.progress.line(f"{run.task.name}: candidate {record.candidate} gives wrong results ({outcome.detail}); skipped")
                continue
            if outcome.ok:
                self.db.set_verified(record.id, True)
                record.verified = True
            else:
                self.progress.line(f"{run.task.name}: could not verify the best candidate: {outcome.detail}")
            return record
        return None
