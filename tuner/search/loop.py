"""The tuning loop: pick a task, propose candidates, measure them, commit every result, learn, repeat.

A batch goes through three steps: proposed (search, cost model, filter), submitted (the engine builds and
times it, its results read by a thread of their own: ``InFlight``), finished (every result committed, the
search and the cost model taught, progress said). Without ``LoopConfig.pipeline`` the three run back to
back; with it, batch k+1 is proposed and submitted before batch k is finished, so that the device times
k+1 while the loop learns from k and searches for k+2. Everything but reading results stays in this thread.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import tvm
from tvm.s_tir.schedule import Trace

from costmodel import (
    CandidateFeatures,
    CandidateFilter,
    CostModel,
    FilterLedger,
    RankQuality,
    rank_quality,
)
from measure import Engine, MeasureInput, MeasureResult
from tuner.database.database import TuningDatabase
from tuner.database.workdir import FILTER_LEDGER_KEY, FILTER_STATE_KEY
from tuner.progress import Progress
from tuner.spaces.machine import MachineFacts
from tuner.spaces.prediction import floor_seconds
from tuner.targets import describe_target
from tuner.tasks.extraction import Task
from tuner.tasks.opclass import kernel_class

from .batch_records import filter_summary, give_up_if_nothing_works, record_result, write_batch_logs
from .final_choice import FinalChoice
from .first_candidates import queue_first_candidates
from .in_flight import Batch, InFlight
from .kernel_costs import KernelCosts
from .loop_config import LoopConfig, auto_batch_size
from .objectives import Objectives, Spending, check_measurable, met, short_of_time, time_left, time_limit
from .parallel import parallel_map
from .reserve import OVERRUN, CallClock, reserve_parts
from .scheduler import TaskProgress, make_scheduler, task_kind
from .task_run import TaskRun
from .task_search import TaskSearch


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
        costs: KernelCosts | None = None,
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
        self.spent = Spending()  # the whole run's: earlier runs' trials, this call's time
        self.stop_reason: str | None = None
        self.clock = CallClock(time.monotonic())  # run() takes the call's
        self._time_limit: float | None = None  # seconds the call may last, from run()'s objectives
        self._final_choice = FinalChoice(
            db, engine, str(target), self.config.remeasure_top, self.config.final_timing, self.config.verify,
            self.progress,
        )  # fmt: skip
        # This call's seconds of measuring (``_batch_seconds``) and the trials they measured; its last batch's rest.
        self._measure_seconds = 0.0
        self._measured = 0
        self._batch_overhead = 0.0
        pipeline = self.config.pipeline if self.config.pipeline is not None else engine.overlap_builds_with_runs
        self.pipelined = bool(pipeline and engine.pipelines_batches)
        self._in_flight: list[Batch] = []  # submitted, not finished; oldest first
        self._results_in = 0.0  # time.monotonic() when the last finished batch's results were all in
        self._task_objectives = Objectives()  # run()'s, for the batches it finishes
        self._trial_budget: int | None = None  # the run's trials, for the progress lines
        self._batch_log = engine.log_dir / "batches.jsonl"
        self.phase_seconds: dict[str, float] = {"search": 0.0, "measure": 0.0, "cost model": 0.0, "final choice": 0.0}
        self.device_seconds = 0.0  # of the measure phase, the device in candidates' timed regions
        self._rng = np.random.default_rng(seed)
        self._successes = 0
        self._failures: Counter[str] = Counter()
        self._clock_offset = db.elapsed_so_far()
        self._session_start = time.monotonic()
        self._quality_log = engine.log_dir / "costmodel.jsonl"
        features = CandidateFeatures()
        self.feature_width = features.width  # of the cost model's rows
        self.runs: list[TaskRun] = []
        kernel_ids = [db.kernel_id(task.mod, task.name) for task in tasks]
        if costs is None:
            costs = KernelCosts.from_database(
                db, self.target_key, dict(zip(kernel_ids, (t.name for t in tasks), strict=True))
            )
        self.costs = costs
        for index, (task, kernel_id) in enumerate(zip(tasks, kernel_ids, strict=True)):
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
        """Tuning seconds of this work dir, counting earlier runs (each record's timestamp)."""
        return self._clock_offset + time.monotonic() - self._session_start

    def model_latency(self) -> float | None:
        """The model's estimated latency from its tasks' best kernels; None until every task has one."""
        if any(run.progress.best is None for run in self.runs):
            return None
        return sum(run.task.weight * run.progress.best for run in self.runs)

    def partial_latency(self) -> float:
        """The model's latency estimated from the tasks measured so far, scaled up to all of them (0: none)."""
        measured = [run.task.weight * run.progress.best for run in self.runs if run.progress.best is not None]
        return sum(measured) * len(self.runs) / len(measured) if measured else 0.0

    def reserve(self, next_run: TaskRun | None = None) -> tuple[float, float]:
        """Seconds to keep for after the search: the final choice of every task measured (and of
        ``next_run``, about to be), and the compile phase; and of them, the final choice's."""
        runs = [run for run in self.runs if run.progress.best is not None or run.progress.in_flight or run is next_run]
        final = self._final_choice.seconds(runs, self.costs, self.model_latency())
        return reserve_parts(final, self.clock.compile_seconds(self.costs, self.partial_latency()))

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
        self,
        objectives: Objectives,
        task_objectives: Objectives | None = None,
        budget_text: str | None = None,
        clock: CallClock | None = None,
    ) -> str:
        """Tune until one of ``objectives`` is met for the whole run, dropping tasks that meet
        ``task_objectives``; returns why it ended. Trials count earlier runs of this work dir; time and
        money count from ``clock``'s start (default: now) with the reserve for after the search kept
        (``tuner.search.reserve``). ``budget_text`` states the budget in the first progress line."""
        task_objectives = task_objectives or Objectives()
        self.clock = clock or CallClock(time.monotonic())
        self._time_limit = time_limit(objectives)
        for scope, objective in (("for the run", objectives), ("per task", task_objectives)):
            check_measurable(objective, self.engine.energy_measurable, scope)
        batch_size = self.config.batch_size or auto_batch_size(objectives.trials, len(self.runs))
        self.progress.start(
            self.trials_done, objectives.trials, len(self.runs), f"on {describe_target(self.target)}", budget_text
        )
        self.spent.trials = self.trials_done
        if self.config.pipeline and not self.pipelined:
            self.progress.line("batches not pipelined: this engine measures one batch at a time")
        try:
            while True:
                index = self.scheduler.pick([run.progress for run in self.runs])
                self.spent.seconds = self.clock.elapsed()
                if self._time_limit is not None:
                    kept = self.reserve(self.runs[index] if index is not None else None)
                    self.spent.reserved, self.spent.reserved_for_choice = kept
                self.stop_reason = met(objectives, self.spent)
                if self.stop_reason:
                    break
                if index is None:
                    if self._in_flight:  # what it measures may give the scheduler a task to pick
                        self._finish_in_flight(keep=0)
                        continue
                    self.stop_reason = (
                        "every task is finished (its search space exhausted, its objectives met, or too small a part "
                        "of the model to pay for more trials)"
                    )
                    break
                limit = self._batch_limit(batch_size, objectives, task_objectives, self.runs[index])
                if limit == 0:
                    self.stop_reason = short_of_time(objectives, self.spent)
                    break
                self._tune_batch(index, limit, task_objectives, objectives.trials)
            self._finish_in_flight(keep=0)
        except BaseException:
            self._abandon_in_flight()
            raise
        self.progress.line(f"stopped: {self.stop_reason}")
        return self.stop_reason

    def _batch_limit(
        self, batch_size: int, run_objectives: Objectives, task_objectives: Objectives, run: TaskRun
    ) -> int:
        """How many candidates the next batch of ``run`` may measure: trials in flight count as spent."""
        limit = batch_size
        if run_objectives.trials:
            limit = min(limit, run_objectives.trials - self.trials_done - self.spent.in_flight)
        if task_objectives.trials:
            limit = min(limit, task_objectives.trials - run.progress.spent.trials - run.progress.spent.in_flight)
        limit = max(1, limit)
        left = time_left(run_objectives, self.spent)
        per_trial = self._trial_seconds(run)
        if left is not None and per_trial:
            # what the time left affords: the batch's search and learning, the trials in flight, its own
            affordable = int((left - self._batch_overhead) / per_trial) - self.spent.in_flight
            limit = max(0, min(limit, affordable))
        return limit

    def _trial_seconds(self, run: TaskRun) -> float:
        """Seconds a trial of ``run``'s task costs: this call's seconds a trial so far (``_batch_seconds``),
        scaled by the task's own build and timing against the kernels' typical ones; before the first batch,
        the task's build and timing as measured (as if built one at a time). Unscaled, the average of a run
        whose many small kernels each took a fraction of a second let MobileViT-S's largest kernel, whose
        candidates take seconds, a last batch of 16 with 3 s left: the search ended 10 s past its stop."""
        own = self.costs.build(run.task.name) + self.costs.run(run.task.name)
        if not self._measured:
            return own
        per_trial = self._measure_seconds / self._measured
        typical = self.costs.build() + self.costs.run()
        return per_trial * max(1.0, own / typical) if typical > 0 else per_trial

    def _tune_batch(self, index: int, size: int, task_objectives: Objectives, budget: int | None) -> None:
        """A batch of task ``index`` proposed and submitted (none where its space has nothing new left); then
        the batches in flight before it finished, and, unless batches pipeline, it too."""
        self._task_objectives, self._trial_budget = task_objectives, budget
        batch = self._propose(index, size)
        if batch is not None:
            self._submit(batch)
        self._finish_in_flight(keep=1 if self.pipelined else 0)

    def _propose(self, index: int, size: int) -> Batch | None:
        """Up to ``size`` new candidates of task ``index``, those the filter drops skipped; None where its
        search space has nothing new left."""
        run = self.runs[index]
        proposed = time.monotonic()
        seeded = ""
        with self._phase("search"):
            if run.trials == 0 and not run.sibling_seeded:
                run.sibling_seeded = True
                facts = self.facts if self.config.analytic_start else None
                seeded = queue_first_candidates(run, self.runs, self.db, self.target, facts)
            candidates = run.search.propose(size)
            features = run.search.feature_rows(candidates)  # extract features in one batch
        if not candidates:
            run.progress.exhausted = True
            self.progress.line(f"{run.task.name}: its search space has nothing new left")
            return None
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
        return Batch(run, index, proposed, measured, scores[decision.keep], decision, trained, seeded)

    def _submit(self, batch: Batch) -> None:
        """Hand ``batch`` to the engine (its builds start now); its trials count as spent from here on."""
        inputs = [MeasureInput(c.key, c.mod) for c in batch.candidates]
        batch.measuring = InFlight(self.engine.measure(inputs, group=batch.run.group), f"batch-{batch.run.task.name}")
        self._in_flight.append(batch)
        self._count_in_flight(batch, 1)
        self._stop_task_if_met(batch.run)  # its trials, counting these, may be all it gets

    def _count_in_flight(self, batch: Batch, sign: int) -> None:
        trials = sign * len(batch.candidates)
        self.spent.in_flight += trials
        batch.run.progress.spent.in_flight += trials
        batch.run.progress.in_flight += sign

    def _finish_in_flight(self, keep: int) -> None:
        """Finish the batches in flight, oldest first, all but the newest ``keep``."""
        while len(self._in_flight) > keep:
            self._finish(self._in_flight[0])
            self._in_flight.pop(0)

    def _abandon_in_flight(self) -> None:
        """After an error or an interrupt: commit what the batches in flight measured already, stop the rest."""
        for batch in self._in_flight:
            batch.measuring.stop()
        for batch in self._in_flight:
            with contextlib.suppress(Exception):  # the error being raised is the one to report
                for result in batch.measuring.results(wait=False):
                    self._commit(batch, result)
        self._in_flight.clear()
        self.spent.in_flight = 0
        for run in self.runs:
            run.progress.in_flight = run.progress.spent.in_flight = 0

    def _finish(self, batch: Batch) -> None:
        """Take in ``batch``'s results, each committed as it comes, then learn from them and report."""
        run = batch.run
        waiting = time.monotonic()
        with self._phase("measure"):
            for result in batch.measuring.results():
                self._commit(batch, result)
        waited = time.monotonic() - waiting
        self._count_in_flight(batch, -1)
        give_up_if_nothing_works(self._successes, self._failures, self.config.give_up_after, self.engine.log_dir)
        measured = len(batch.candidates)
        seconds = self._batch_seconds(batch, waited)
        joules_each = batch.joules / measured if batch.joules is not None and measured else None
        self.ledger.add(batch.decision, seconds / max(1, measured), joules_each)
        latencies = [batch.latencies.get(c.key) for c in batch.candidates]
        quality = rank_quality(batch.scores, latencies) if batch.trained else RankQuality(None, None, 0, measured)
        if batch.trained:
            self.filter.record(run.group, batch.scores, latencies)
        if not any(r.trials == 0 and r.search.seeds_waiting for r in self.runs):
            # Until every task has measured its first transferred schedules, the searches (the model's
            # users) wait; retraining a warm-started model on thousands of source samples after each
            # of those small batches held up the transfer's first round.
            with self._phase("cost model"):
                self.cost_model.update()
        # Where batches pipeline, the next batch's search overlapped this one's measuring: its seconds cover it.
        self._batch_overhead = 0.0 if self.pipelined else time.monotonic() - batch.proposed - waited
        run.progress.record_batch(measured, seconds + self._batch_overhead, batch.joules, batch.best)
        self._measure_seconds += seconds
        self._measured += measured
        self.spent.add_batch(measured, 0.0, batch.joules, self.model_latency())
        self._log_batch(batch, quality, waited)
        left = self._time_limit - self.clock.elapsed() - self.spent.reserved if self._time_limit is not None else None
        self.progress.batch(
            batch.index, len(self.runs), run.task.name, self.trials_done, self._trial_budget, run.progress.best,
            run.task.flops, self.model_latency(),
            filter_summary(batch.decision, quality, self.ledger) + batch.seeded, left,
        )  # fmt: skip
        activity = self.engine.activity()
        if activity:
            self.progress.line(activity)
        self._stop_task_if_met(run)

    def _batch_seconds(self, batch: Batch, waited: float) -> float:
        """What measuring ``batch`` cost the run: where batches pipeline, the loop's wall time since the
        batch before it was in (the search of the next overlapped it); else the time waiting for it."""
        now = time.monotonic()
        since, self._results_in = max(self._results_in, batch.proposed), now
        return now - since if self.pipelined else waited

    def _stop_task_if_met(self, run: TaskRun) -> None:
        reason = met(self._task_objectives, run.progress.spent)
        if reason and run.progress.live:
            run.progress.stopped = reason
            self.progress.line(f"{run.task.name}: done ({reason})")

    def _log_batch(self, batch: Batch, quality: RankQuality, waited: float) -> None:
        self.db.set_meta(FILTER_LEDGER_KEY, self.ledger.as_dict())
        self.db.set_meta(FILTER_STATE_KEY, self.filter.state())
        write_batch_logs(
            self._quality_log, self._batch_log, batch, quality, self.filter, self.trials_done, self.pipelined, waited
        )

    def _commit(self, batch: Batch, result: MeasureResult) -> None:
        """Commit one result to the database, and let the search and the run's counts learn from it."""
        run = batch.run
        candidate = batch.by_key[result.key]
        record_result(self.db, run.kernel_id, self.target_key, candidate, result, self.elapsed())
        run.search.observe(candidate, result.latency)
        run.trials += 1
        run.measured_here = True
        if result.ok:
            self.costs.observe(run.task.name, result.build_seconds, result.run_seconds)
        batch.latencies[candidate.key] = result.latency
        self.device_seconds += result.timed_seconds
        if result.energy_j is not None:
            batch.joules = (batch.joules or 0.0) + result.energy_j
        if result.ok:
            self._successes += 1
        else:
            self._failures[f"{result.status}: {result.error}"] += 1

    # -- choosing the final schedules ------------------------------------------------------------
    def finalize(self) -> None:
        """Re-measure each task's top candidates with more repeats, then take the fastest one whose
        output matches the unscheduled function's; under a time budget, within what is left of it once
        the compile phase's estimate is kept (``FinalChoice``; its grace: ``OVERRUN`` of the budget)."""
        with self._phase("final choice"):
            seconds, grace = None, 0.0
            if self._time_limit is not None:
                compile_seconds = self.clock.compile_seconds(self.costs, self.partial_latency())
                seconds = max(0.0, self._time_limit - self.clock.elapsed() - compile_seconds)
                grace = OVERRUN * self._time_limit
            self._final_choice.choose(self.runs, self.costs, self.model_latency(), seconds, grace)
