"""The tuning loop: pick a task, propose candidates, measure them, commit every result, learn, repeat."""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.s_tir.schedule import Trace

from costmodel import (
    CandidateFeatures,
    CandidateFilter,
    CostModel,
    FilterDecision,
    FilterLedger,
    FilterSettings,
    RankQuality,
    rank_quality,
)
from measure import Engine, MeasureInput, TimingConfig, VerifyResult
from tuner.database.database import Record, TuningDatabase
from tuner.database.workdir import FILTER_LEDGER_KEY, FILTER_STATE_KEY, stop_on_storage_failure
from tuner.errors import TunerError
from tuner.progress import Progress
from tuner.spaces import metaschedule as msc
from tuner.spaces.machine import MachineFacts
from tuner.spaces.prediction import floor_seconds
from tuner.targets import describe_target
from tuner.tasks.extraction import Task
from tuner.tasks.opclass import kernel_class

from .first_candidates import queue_first_candidates
from .objectives import Objectives, Spending, check_measurable, met
from .parallel import parallel_map
from .retiming import retime
from .scheduler import TaskProgress, make_scheduler, task_kind
from .task_run import TaskRun
from .task_search import Candidate, SearchConfig, TaskSearch

VERIFY_DEPTH = 2  # candidates checked at the end, at most, in multiples of those re-measured
VERIFY_ATTEMPTS = 3  # tries at checking a candidate's output when the check itself fails to build or run
# A task under this share of the model's estimated latency re-measures only its best candidate at the end: picking
# its second-best instead could not change the model by more than timing noise does.
MINOR_SHARE = 0.01


@dataclass(frozen=True)
class LoopConfig:
    batch_size: int | None = None  # default: about an eighth of each task's share of the trials
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: str = "gradient"  # or "round-robin"
    filter: FilterSettings = field(default_factory=FilterSettings)
    remeasure_top: int = 5  # re-measured at the end with final_timing before the best is chosen
    final_timing: TimingConfig = field(
        default_factory=lambda: TimingConfig(min_repeats=5, max_repeats=50, budget_seconds=0.25)
    )
    verify: bool = True
    give_up_after: int = 32  # failures in a row, with no success at all yet, that end the run


@dataclass
class BatchOutcome:
    latencies: list[float | None]  # per measured candidate, None for a failure
    joules: float | None  # energy of the batch's measurements, where NVML gives it

    @property
    def best(self) -> float | None:
        return min((lat for lat in self.latencies if lat is not None), default=None)


def auto_batch_size(budget: int | None, num_tasks: int) -> int:
    if budget is None:
        return 16
    per_task = budget / max(1, num_tasks)
    return int(min(64, max(8, math.ceil(per_task / 8))))


def tolerance(mod: tvm.IRModule) -> float:
    """Relative error allowed when comparing with the unscheduled function: reduction order differs,
    and in a kernel that casts to a low precision inside, so does rounding (TVM keeps its unscheduled
    bf16 buffers in fp32, where a built schedule whose micro-kernel reads them rounds)."""
    func = mod["main"]
    dtypes = {str(p.dtype) for p in func.params}
    block = getattr(func.body, "block", None)
    dtypes |= {str(buffer.dtype) for buffer in getattr(block, "alloc_buffers", ())}
    return 1e-2 if dtypes & {"float16", "bfloat16"} else 1e-3


class TuningLoop:
    def __init__(
        self,
        tasks: list[Task],
        target: tvm.target.Target,
        db: TuningDatabase,
        engine: Engine,
        cost_model: CostModel,
        seed: int = 1,
        config: LoopConfig | None = None,
        progress: Progress | None = None,
    ):
        self.target = target
        self.target_key = str(target)
        self.facts = MachineFacts.of(target)  # None: no analytic first schedules (not a CPU with FMA)
        self.db = db
        self.engine = engine
        self.cost_model = cost_model
        self.config = config or LoopConfig()
        self.progress = progress or Progress(enabled=False)
        self.scheduler = make_scheduler(self.config.scheduler, seed)
        self.filter = CandidateFilter(self.config.filter)
        self.ledger = FilterLedger.from_dict(db.get_meta(FILTER_LEDGER_KEY, {}))
        self.filter.restore(db.get_meta(FILTER_STATE_KEY, {}))  # a resumed run keeps the trust it had earned
        self.spent = Spending()  # the whole run's, counting earlier runs' trials and time
        self.stop_reason: str | None = None
        self.phase_seconds: dict[str, float] = {"search": 0.0, "measure": 0.0, "cost model": 0.0, "final choice": 0.0}
        self._rng = np.random.default_rng(seed)
        self._successes = 0
        self._failures: Counter[str] = Counter()
        self._clock_offset = db.elapsed_so_far()
        self._session_start = time.monotonic()
        self._quality_log = engine.log_dir / "costmodel.jsonl"
        features = CandidateFeatures()
        self.feature_width = features.width  # of the cost model's rows
        self.runs: list[TaskRun] = []
        for index, task in enumerate(tasks):
            kernel_id = db.kernel_id(task.mod, task.name)
            search = TaskSearch(
                task.mod, target, seed + index, cost_model, features, group=str(kernel_id), config=self.config.search
            )
            floor = floor_seconds(task.mod, task.flops, target)
            progress = TaskProgress(task.weight, task.flops, task_kind(task.name), floor=floor)
            self.runs.append(TaskRun(task, kernel_id, search, progress, kernel_class(task.mod, task.name)))
            if search.unsearchable:
                self.runs[-1].progress.exhausted = True
                self.progress.line(f"{task.name}: left at TVM's default schedule: {search.unsearchable}")
        self._restore()

    @property
    def unsearchable(self) -> dict[str, str]:
        """Tasks that cannot be tuned (kernel name: why), left at TVM's default schedule."""
        return {run.task.name: run.search.unsearchable for run in self.runs if run.search.unsearchable}

    @property
    def tasks(self) -> list[Task]:
        return [run.task for run in self.runs]

    def add_transferred(
        self, traces: dict[str, Sequence[Trace]], max_seeds: int, replay_seed: int, retile=None
    ) -> dict[str, list[int]]:
        """Queue schedules tuned for other kernels (transfer-tuning: ``traces`` per task name, best
        first) as the tasks' first candidates, up to ``max_seeds`` new ones each, replayed on the
        tasks' kernels with tile sizes fitted by ``retile``; returns per task the indices queued."""
        offered = [(run, traces.get(run.task.name, [])) for run in self.runs]
        used = parallel_map(
            lambda pair: pair[0].search.add_transferred(pair[1], max_seeds, replay_seed, retile), offered
        )
        return {run.task.name: indices for (run, _), indices in zip(offered, used, strict=True)}

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
            mine = [(r.candidate, r.trace, r.latency) for r in records if r.kernel_id == run.kernel_id]
            run.search.restore(mine)
            run.trials = len(mine)
            if mine:
                best = self.db.best(run.kernel_id, self.target_key, 1)
                run.progress.record_batch(len(mine), 0.0, None, best[0].latency if best else None)
        if self.trials_done:
            self.cost_model.fit()

    # -- tuning ----------------------------------------------------------------------------------
    def run(
        self, objectives: Objectives, task_objectives: Objectives | None = None, budget_text: str | None = None
    ) -> str:
        """Tune until one of ``objectives`` is met for the whole run (trials and time count earlier
        runs of this work dir), dropping tasks that meet ``task_objectives``; returns why it ended.
        ``budget_text`` states the budget in the first progress line."""
        task_objectives = task_objectives or Objectives()
        for scope, objective in (("for the run", objectives), ("per task", task_objectives)):
            check_measurable(objective, self.engine.energy_measurable, scope)
        batch_size = self.config.batch_size or auto_batch_size(objectives.trials, len(self.runs))
        self.progress.start(
            self.trials_done, objectives.trials, len(self.runs), f"on {describe_target(self.target)}", budget_text
        )
        self.spent.trials = self.trials_done
        while True:
            self.spent.seconds = self.elapsed()
            self.stop_reason = met(objectives, self.spent)
            if self.stop_reason:
                break
            index = self.scheduler.pick([run.progress for run in self.runs])
            if index is None:
                self.stop_reason = (
                    "every task is finished (its search space exhausted, its objectives met, or too small a part "
                    "of the model to pay for more trials)"
                )
                break
            limit = self._batch_limit(batch_size, objectives, task_objectives, self.runs[index])
            self._tune_batch(index, limit, task_objectives, objectives.trials)
        self.progress.line(f"stopped: {self.stop_reason}")
        return self.stop_reason

    def _batch_limit(
        self, batch_size: int, run_objectives: Objectives, task_objectives: Objectives, run: TaskRun
    ) -> int:
        limit = batch_size
        if run_objectives.trials:
            limit = min(limit, run_objectives.trials - self.trials_done)
        if task_objectives.trials:
            limit = min(limit, task_objectives.trials - run.progress.spent.trials)
        return max(1, limit)

    def _tune_batch(self, index: int, size: int, task_objectives: Objectives, budget: int | None) -> None:
        run = self.runs[index]
        started = time.monotonic()
        seeded = ""
        with self._phase("search"):
            if run.trials == 0 and not run.sibling_seeded:
                run.sibling_seeded = True
                seeded = queue_first_candidates(run, self.runs, self.db, self.target, self.facts)
            candidates = run.search.propose(size)
            features = run.search.feature_rows(candidates)  # extract features in one batch
        if not candidates:
            run.progress.exhausted = True
            self.progress.line(f"{run.task.name}: its search space has nothing new left")
            return
        trained = self.cost_model.trained  # an untrained model scores at random: nothing to judge it by
        with self._phase("cost model"):
            mean, spread = self.cost_model.predict_spread(features, self._rng)
            scores = mean - spread  # as the search ranks; its rank quality sets the filter's trust
            # A candidate is dropped only if even an optimistic estimate (ensemble mean + spread) rates it poor:
            # the model is least sure away from what was measured, and dropping there trapped the search in one
            # region (experiments/README.md, "Why the filter trapped searches").
            fresh = [c.parent is None for c in candidates]
            # Transferred schedules are measured whatever the model says: they are what transfer-tuning
            # brings, and a model warm-started on other kernels is least sure about this one's.
            transferred = [c.transferred for c in candidates]
            decision = self.filter.split(
                run.group, mean + spread, self._rng, fresh, run.progress.batches_without_improvement, transferred
            )
        for i in decision.dropped:
            run.search.skip(candidates[i])
        measured = [candidates[i] for i in decision.keep]
        measuring = time.monotonic()
        with self._phase("measure"):
            outcome = self._measure(run, measured)
        self._stop_if_nothing_works()
        per_candidate = (time.monotonic() - measuring) / max(1, len(measured))
        joules_each = outcome.joules / len(measured) if outcome.joules is not None and measured else None
        self.ledger.add(decision, per_candidate, joules_each)
        quality = (
            rank_quality(scores[decision.keep], outcome.latencies)
            if trained
            else RankQuality(None, None, 0, len(measured))
        )
        if trained:
            self.filter.record(run.group, scores[decision.keep], outcome.latencies)
        if not any(r.trials == 0 and r.search.seeds_waiting for r in self.runs):
            # Until every task has measured its first transferred schedules, the searches (the model's
            # users) wait; retraining a warm-started model on thousands of source samples after each
            # of those small batches held up the transfer's first round.
            with self._phase("cost model"):
                self.cost_model.update()
        run.progress.record_batch(len(measured), time.monotonic() - started, outcome.joules, outcome.best)
        self.spent.add_batch(len(measured), 0.0, outcome.joules, self.model_latency())
        self._log_batch(run, decision, quality)
        reason = met(task_objectives, run.progress.spent)
        self.progress.batch(
            index, len(self.runs), run.task.name, self.trials_done, budget, run.progress.best, run.task.flops,
            self.model_latency(), self._filter_summary(decision, quality) + seeded,
        )  # fmt: skip
        activity = self.engine.activity()
        if activity:
            self.progress.line(activity)
        if reason and run.progress.live:
            run.progress.stopped = reason
            self.progress.line(f"{run.task.name}: done ({reason})")

    def _filter_summary(self, decision: FilterDecision, quality: RankQuality) -> str:
        tau = f"  model tau {quality.tau:+.2f}" if quality.tau is not None else ""
        if not self.ledger.dropped:
            return tau
        ledger = self.ledger
        return (
            f"{tau}  filtered {len(decision.dropped)} "
            f"(total {ledger.dropped}/{ledger.proposed}, ~{ledger.seconds_saved:.0f} s saved)"
        )

    def _log_batch(self, run: TaskRun, decision: FilterDecision, quality: RankQuality) -> None:
        self.db.set_meta(FILTER_LEDGER_KEY, self.ledger.as_dict())
        self.db.set_meta(FILTER_STATE_KEY, self.filter.state())
        entry = {"time": time.time(), "task": run.task.name, "trials": self.trials_done, **quality.as_dict()}
        entry |= {
            "pooled_tau": self.filter.rank_quality(run.group),
            "trust": decision.trust,
            "threshold": decision.threshold,
            "dropped": len(decision.dropped),
            "explored": len(decision.explored),
        }
        self._quality_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self._quality_log, "a") as log:
            log.write(json.dumps(entry) + "\n")

    def _measure(self, run: TaskRun, candidates: list[Candidate]) -> BatchOutcome:
        by_key = {c.key: c for c in candidates}
        latencies: dict[str, float | None] = {}
        joules = None
        for result in self.engine.measure([MeasureInput(c.key, c.mod) for c in candidates], group=run.group):
            candidate = by_key[result.key]
            if not result.ok:
                stop_on_storage_failure(result.error)
            self.db.commit(
                run.kernel_id,
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
            latencies[candidate.key] = result.latency
            if result.energy_j is not None:
                joules = (joules or 0.0) + result.energy_j
            if result.ok:
                self._successes += 1
            else:
                self._failures[f"{result.status}: {result.error}"] += 1
        return BatchOutcome([latencies.get(c.key) for c in candidates], joules)

    def _stop_if_nothing_works(self) -> None:
        failed = sum(self._failures.values())
        if self._successes == 0 and failed >= self.config.give_up_after:
            reason, count = self._failures.most_common(1)[0]
            raise TunerError(
                f"all {failed} candidates measured so far failed ({count} with {reason}); stopping rather than "
                "spending "
                f"the rest of the budget: see the worker logs in {self.engine.log_dir}"
            )

    # -- choosing the final schedules ------------------------------------------------------------
    def finalize(self) -> None:
        """Re-measure each task's top candidates with more repeats, then take the fastest one whose
        output matches the unscheduled function's."""
        with self._phase("final choice"):
            self._finalize()

    def _finalize(self) -> None:
        model = self.model_latency()
        for run in self.runs:
            minor = model and run.task.weight * run.progress.best < MINOR_SHARE * model
            top = self.db.best(run.kernel_id, self.target_key, 1 if minor else self.config.remeasure_top)
            if not top:
                continue
            schedules = {r.candidate: msc.schedule_from_json(run.task.mod, r.trace) for r in top}
            records = {r.candidate: r for r in top}
            inputs = [MeasureInput(key, sch.mod) for key, sch in schedules.items()]
            tuned = {key: record.latency for key, record in records.items()}
            for key, timed in retime(self.engine, inputs, tuned, self.config.final_timing, run.group):
                self.db.add_samples(records[key].id, timed.samples, timed.discarded)
            run.best = self._first_correct(run, schedules)
            run.progress.best = run.best.latency if run.best else None

    def _first_correct(self, run: TaskRun, schedules: dict) -> Record | None:
        # past the re-measured top, the next fastest are checked too: a compiled model takes only a
        # verified schedule, and a kernel whose top candidates are all wrong would keep TVM's default
        for record in self.db.best(run.kernel_id, self.target_key, VERIFY_DEPTH * self.config.remeasure_top):
            if not self.config.verify or record.verified:
                return record
            sch = schedules.get(record.candidate) or msc.schedule_from_json(run.task.mod, record.trace)
            outcome = self._verify(run, sch.mod)
            if outcome.ok is False:
                self.db.set_verified(record.id, False, outcome.detail)
                self.progress.line(
                    f"{run.task.name}: candidate {record.candidate} gives wrong results ({outcome.detail}); skipped"
                )
                continue
            if outcome.ok:
                self.db.set_verified(record.id, True)
                record.verified = True
            else:
                self.progress.line(f"{run.task.name}: could not verify the best candidate: {outcome.detail}")
            return record
        return None

    def _verify(self, run: TaskRun, candidate: tvm.IRModule) -> VerifyResult:
        # A build or run that fails while checking (a crashed compiler, a lost worker) says nothing about the
        # candidate's answers, so it is tried again before the candidate is kept unverified.
        for _ in range(VERIFY_ATTEMPTS):
            outcome = self.engine.verify(run.task.mod, candidate, tolerance(run.task.mod), group=run.group)
            if outcome.ok is not None or not outcome.worth_retrying:
                break
        return outcome
