"""The final choice: each task's fastest candidates re-timed alone, then the fastest whose output matches
the unscheduled kernel's taken. Only such a verified schedule reaches the compiled model; a task without
one keeps its analytic schedule (or TVM's default).

The re-timed candidates are ranked among themselves, by their re-timings, and checked before any other:
they were timed back to back, at one speed of the machine, while the others' latencies were measured
minutes earlier, at whatever speed it had then. Ranked all together, a re-timing taken while something else
held a core (1.5x slower for the median candidate of MobileNetV2's final choice, 2026-12-03, Zen 3) let a
candidate that had measured up to 1.7x slower than the re-timed ones win: tuned at 32 trials per kernel,
the model ran 1.09x slower than its analytic schedules; its final choice made again so, 1.00-1.04x.

Under a time budget it fits the seconds it is given: the tasks go largest share of the model first, each
re-times only its best where the top candidates of all would not fit, and once the seconds and a grace
are spent the tasks left keep their analytic schedules, said in one line. (The search stops with the final
choice's estimate kept, less what its last batch took beyond it: a task is left out for time actually
spent past the grace, not for an estimate a little over what is left.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import tvm

from measure import Engine, MeasureInput, TimingConfig, VerifyResult
from tuner.database.database import Record, TuningDatabase
from tuner.progress import Progress
from tuner.spaces import metaschedule as msc
from tuner.tasks.extraction import Task

from .kernel_costs import KernelCosts
from .retiming import retime
from .task_run import TaskRun

VERIFY_DEPTH = 2  # candidates checked at the end, at most, in multiples of those re-measured
VERIFY_ATTEMPTS = 3  # tries at checking a candidate's output when the check itself fails to build or run
# A task under this share of the model's estimated latency re-measures only its best candidate at the end: picking
# its second-best instead could not change the model by more than timing noise does.
MINOR_SHARE = 0.01
# What an unscheduled kernel (TVM's plain loops, one thread), the reference a candidate is checked against, computes
# per second, leaning low: DeBERTa-v2's products ran theirs at 0.33-0.75 GFLOP/s (Zen 5, 2026-12-04), 7.3 s for the
# largest, 13 s of a final choice estimated at 21 s in all without them (the call returned 33 s past its budget).
UNSCHEDULED_FLOPS_PER_SECOND = 0.4e9


def tolerance(mod: tvm.IRModule) -> float:
    """Relative error allowed when comparing with the unscheduled function: reduction order differs,
    and in a kernel that casts to a low precision inside, so does rounding (TVM keeps its unscheduled
    bf16 buffers in fp32, where a built schedule whose micro-kernel reads them rounds)."""
    func = mod["main"]
    dtypes = {str(p.dtype) for p in func.params}
    block = getattr(func.body, "block", None)
    dtypes |= {str(buffer.dtype) for buffer in getattr(block, "alloc_buffers", ())}
    return 1e-2 if dtypes & {"float16", "bfloat16"} else 1e-3


def task_seconds(
    costs: KernelCosts,
    task: Task,
    latency: float | None,
    retimed: int,
    timing: TimingConfig,
    rebuilt: bool,
    verified: bool,
) -> float:
    """One task's final choice, estimated: ``retimed`` candidates of about ``latency`` (None: not measured
    yet, its whole budget counted) timed alone with ``timing`` (built again first where ``rebuilt``: their
    libraries were not kept, an earlier run's), and unless its best is ``verified`` already, the check of its
    best. (A small kernel's re-timing ends at ``max_repeats``, not at the budget: counting the budget for each
    of BiT's 73 kernels kept 68 s for what took 44.)"""
    build, run = costs.build(task.name), costs.run(task.name)
    timed = timing.budget_seconds if latency is None else timing.seconds_for(latency)
    seconds = retimed * (run + timed + (build if rebuilt else 0.0))
    return seconds if verified else seconds + check_seconds(costs, task.name, task.flops)


def checking_order(retimed: Sequence[Record], ranked: Sequence[Record]) -> list[Record]:
    """The order a task's candidates are checked in, the first that matches being its choice: the
    ``retimed`` ones by their re-timings, then the rest of ``ranked`` (the database's fastest) as they
    stand. A re-timing is compared only with the re-timings taken beside it (the module's docstring)."""
    again = {record.candidate for record in retimed}
    return sorted(retimed, key=lambda record: (record.latency, record.id)) + [
        record for record in ranked if record.candidate not in again
    ]


def check_seconds(costs: KernelCosts, kernel: str, flops: float) -> float:
    """A candidate of ``kernel`` (of ``flops`` a launch) checked against the unscheduled kernel, estimated: the
    candidate built and run, the unscheduled kernel run once (its plain loops at ``UNSCHEDULED_FLOPS_PER_SECOND``,
    its library loaded as a candidate's is). (The kernel's build, of plain loops, is a fraction of a candidate's:
    counting two candidates' builds made 2.3 s of a check that took 1.2, tiny-resnet on 2 cores.)"""
    return costs.build(kernel) + 2 * costs.run(kernel) + flops / UNSCHEDULED_FLOPS_PER_SECOND


class FinalChoice:
    """The final choice of a loop's tasks: their records in ``db``, re-timed and checked on ``engine``."""

    def __init__(
        self,
        db: TuningDatabase,
        engine: Engine,
        target_key: str,
        remeasure_top: int,
        timing: TimingConfig,
        verify: bool,
        progress: Progress,
    ):
        self.db, self.engine, self.target_key = db, engine, target_key
        self.remeasure_top, self.timing, self.verify, self.progress = remeasure_top, timing, verify, progress

    def seconds(self, runs: Sequence[TaskRun], costs: KernelCosts, model: float | None, top: bool = False) -> float:
        """What the final choice of ``runs`` (each with a candidate measured, or about to be) will take,
        estimated; re-timing each one's top candidates with ``top``, else its best alone (as it does when short
        of time)."""
        return sum(self._task_seconds(run, costs, self._retimed(run, model, top)) for run in runs)

    def choose(
        self,
        runs: Sequence[TaskRun],
        costs: KernelCosts,
        model: float | None,
        seconds: float | None = None,
        grace: float = 0.0,
    ) -> None:
        """Set each run's ``best``: re-time its top candidates, then take the fastest verified one; within
        ``seconds`` where given (None: no limit), leaving tasks out only once ``grace`` more is spent too."""
        started = time.monotonic()
        measured = [run for run in runs if run.progress.best is not None]
        top = seconds is None or self.seconds(measured, costs, model, top=True) <= seconds
        ordered = sorted(runs, key=lambda run: run.task.weight * (run.progress.best or 0.0), reverse=True)
        late = []
        for run in ordered:
            if seconds is not None and run.progress.best is not None and time.monotonic() - started > seconds + grace:
                late.append(run.task.name)
                run.best = self.db.best_verified(run.kernel_id, self.target_key)  # an earlier run's, if any
                continue
            self._choose(run, self._retimed(run, model, top))
        if late:
            self.progress.line(
                f"time budget: {len(late)} kernel(s) not verified in time keep their analytic or default schedule: "
                + ", ".join(late)
            )

    def _retimed(self, run: TaskRun, model: float | None, top: bool) -> int:
        minor = model and run.progress.best and run.task.weight * run.progress.best < MINOR_SHARE * model
        return self.remeasure_top if top and not minor else 1

    def _task_seconds(self, run: TaskRun, costs: KernelCosts, retimed: int) -> float:
        best = self.db.best(run.kernel_id, self.target_key, 1)
        verified = not self.verify or bool(best and best[0].verified)
        return task_seconds(costs, run.task, run.progress.best, retimed, self.timing, not run.measured_here, verified)

    def _choose(self, run: TaskRun, retimed: int) -> None:
        top = self.db.best(run.kernel_id, self.target_key, retimed)
        if not top:
            return
        kept = self.db.best_verified(run.kernel_id, self.target_key)
        if kept is not None and all(r.id != kept.id for r in top):
            # an earlier run's choice (a resumed work dir), timed at another moment: re-timed beside the top, or
            # compile, which takes the fastest verified record, could take it on a latency no longer true
            top.append(kept)
        schedules = {r.candidate: msc.schedule_from_json(run.task.mod, r.trace) for r in top}
        records = {r.candidate: r for r in top}
        inputs = [MeasureInput(key, sch.mod) for key, sch in schedules.items()]
        tuned = {key: record.latency for key, record in records.items()}
        retimed = []
        for key, timed in retime(self.engine, inputs, tuned, self.timing, run.group):
            self.db.add_samples(records[key].id, timed.samples, timed.discarded)
            records[key].latency = statistics.median(timed.samples)  # as add_samples keeps it
            retimed.append(records[key])
        run.best = self._first_correct(run, schedules, retimed)
        run.progress.best = run.best.latency if run.best else None

    def _first_correct(self, run: TaskRun, schedules: dict, retimed: Sequence[Record]) -> Record | None:
        # past the re-measured top, the next fastest are checked too: a compiled model takes only a
        # verified schedule, and a kernel whose top candidates are all wrong would keep TVM's default
        ranked = self.db.best(run.kernel_id, self.target_key, VERIFY_DEPTH * self.remeasure_top)
        for record in checking_order(retimed, ranked):
            if not self.verify or record.verified:
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
