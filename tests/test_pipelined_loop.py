"""Pipelined batches: batch k+1 proposed and submitted (its builds started) before batch k is finished, and
the engine with two batches in flight at once. Real TVM builds and CPU timing, small kernels; the pipeline is
forced on (by default it is on only where the engine times candidates while others build: GPUs)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import faulty
import pytest

from costmodel import CandidateFeatures, CostModel
from measure import EngineConfig, MeasureEngine, MeasureInput, Status, TimeoutPolicy, TimingConfig
from tuner.database.database import TuningDatabase
from tuner.progress import Progress, format_phases
from tuner.search.in_flight import InFlight
from tuner.search.loop import TuningLoop
from tuner.search.loop_config import LoopConfig
from tuner.search.objectives import Objectives
from tuner.search.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress
from tuner.search.task_search import TaskSearch
from tuner.spaces import metaschedule as msc
from tuner.tasks.extraction import Task
from workloads.operators import matmul

PIPELINED = LoopConfig(batch_size=8, verify=False, pipeline=True)
# Each candidate warms up for 0.2 s before it is timed, so that a batch's timing outlasts a build of the next.
SLOW_TIMING = TimingConfig(warmup_seconds=0.2)
QUICK = TimingConfig(min_repeats=3, max_repeats=3, budget_seconds=0.01)


def _matmul_task(m: int, n: int, k: int) -> Task:
    return Task(f"matmul-{m}x{n}x{k}", msc.normalize_prim_func_module(matmul(m, n, k)), 1, 2 * m * n * k)


class BuildClock(MeasureEngine):
    """The real engine, noting for each call of ``build`` (one per batch, in the order they were submitted)
    when its first candidate was built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.first_built: list[float | None] = []  # time.time()

    def build(self, inputs, *args, **kwargs):
        call = len(self.first_built)
        self.first_built.append(None)
        for built in super().build(inputs, *args, **kwargs):
            self.first_built[call] = self.first_built[call] or time.time()
            yield built


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory, llvm_target) -> SimpleNamespace:
    """One task (a 64x64 matmul) tuned for 20 trials in batches of 8, pipelined: its analytic four, then 8 and 8."""
    work = tmp_path_factory.mktemp("pipelined")
    db = TuningDatabase(work / "tuning.db")
    with BuildClock(llvm_target, work, EngineConfig(build_workers=2, timing=SLOW_TIMING)) as engine:
        loop = TuningLoop([_matmul_task(64, 64, 64)], llvm_target, db, engine, CostModel(), config=PIPELINED)
        started = time.monotonic()
        reason = loop.run(Objectives(trials=20))
        wall = time.monotonic() - started
    batches = [json.loads(line) for line in (work / "logs" / "batches.jsonl").read_text().splitlines()]
    return SimpleNamespace(
        loop=loop, db=db, reason=reason, wall=wall, batches=batches, first_built=engine.first_built, target=llvm_target
    )


def test_batch_k_plus_1_is_built_while_batch_k_is_timed(pipelined):
    batches, first_built = pipelined.batches, pipelined.first_built
    assert [b["candidates"] for b in batches] == [4, 8, 8] and len(first_built) == 3
    assert all(b["pipelined"] for b in batches)
    for k in range(len(batches) - 1):
        # batch k+1 went to the engine, and had a candidate built, before batch k's last result came out of it
        assert batches[k + 1]["submitted"] < batches[k]["last_result"], k
        assert first_built[k + 1] < batches[k]["last_result"], k


def test_a_task_picked_again_while_its_batch_is_in_flight_gets_new_candidates(pipelined):
    """One task: the gradient scheduler picks it for every batch, each proposed from a model that has not
    seen the batch before it yet. Nothing in flight is proposed again; every batch measures in full."""
    records = pipelined.db.records(str(pipelined.target))
    assert len({r.candidate for r in records}) == len(records) == 20
    assert all(b["task"] == "matmul-64x64x64" for b in pipelined.batches)
    assert all(r.status == Status.OK for r in records)
    run = pipelined.loop.runs[0]
    assert run.progress.batches == 3 and run.progress.in_flight == 0 and run.progress.spent.in_flight == 0


def test_a_trial_budget_is_met_exactly_with_a_batch_in_flight(pipelined):
    loop = pipelined.loop
    assert pipelined.reason == "trial budget: 20 of 20 trials measured"
    assert loop.trials_done == loop.runs[0].trials == loop.spent.trials == 20 and loop.spent.in_flight == 0


def test_results_phases_and_device_time_add_up(pipelined):
    loop, batches = pipelined.loop, pipelined.batches
    ok = [r.latency for r in pipelined.db.records(str(pipelined.target)) if r.status == Status.OK]
    assert loop.model_latency() == loop.runs[0].progress.best == min(ok)
    # "measure" is the time the loop waited for results; search and learning were its own time
    assert loop.phase_seconds["measure"] == pytest.approx(sum(b["waited"] for b in batches), abs=0.05)
    loop_seconds = sum(loop.phase_seconds[name] for name in ("search", "measure", "cost model"))
    assert loop_seconds <= pipelined.wall
    assert 0 < loop.device_seconds < pipelined.wall


def test_a_summary_gives_the_device_seconds_where_they_outlast_the_wait_for_results():
    assert format_phases({"measure": 2.0}, 1.0) == "measure 2.0 s (the device timing 50%)"
    overlapped = format_phases({"measure": 2.0}, 3.0)  # pipelined: the device timed while the loop searched too
    assert overlapped == "measure 2.0 s (the device timing 3.0 s, also while the loop searched)"


def test_trials_in_flight_count_against_the_time_left(pipelined):
    loop, run = pipelined.loop, pipelined.loop.runs[0]
    # what a trial costs is the pipelined loop's wall time per trial: its batches' seconds cover the run
    assert loop._batch_overhead == 0.0 and 0.8 * pipelined.wall < loop._measure_seconds <= pipelined.wall
    per_trial = loop._trial_seconds(run)
    assert per_trial == pytest.approx(pipelined.wall / 20, rel=0.25)
    budget = Objectives(seconds=12.5 * per_trial)  # 12 trials' time, none spent yet
    loop.spent.seconds = loop.spent.reserved = 0.0
    try:
        assert loop._batch_limit(8, budget, Objectives(), run) == 8
        loop.spent.in_flight = 8
        assert loop._batch_limit(8, budget, Objectives(), run) == 4
        loop.spent.in_flight = 12
        assert loop._batch_limit(8, budget, Objectives(), run) == 0  # the next batch is not submitted: the run stops
    finally:
        loop.spent.in_flight = 0


def test_a_trial_of_a_kernel_costlier_than_the_typical_one_is_priced_at_its_own_cost(pipelined):
    """The call's seconds a trial are an average over its kernels; a kernel whose candidates build and time
    slower than the typical one's takes fewer trials of the time left, so that its last batch ends in time."""
    loop, run = pipelined.loop, pipelined.loop.runs[0]
    average = loop._measure_seconds / loop._measured
    assert loop._trial_seconds(run) == pytest.approx(average)  # its only kernel is the typical one
    build, timing = loop.costs.build(run.task.name), loop.costs.run(run.task.name)
    loop.costs.observe("a-kernel-seven-times-cheaper", build / 7, timing / 7)
    try:
        # typical: the mean of the two kernels' costs, 4/7 of this one's
        assert loop._trial_seconds(run) == pytest.approx(average * 7 / 4)
    finally:
        loop.costs.builds.pop("a-kernel-seven-times-cheaper")
        loop.costs.runs.pop("a-kernel-seven-times-cheaper")


def test_each_task_gets_its_first_batch_and_its_own_trial_budget_exactly(tmp_path, llvm_target):
    tasks = [_matmul_task(32, 32, 32), _matmul_task(16, 32, 64)]
    db = TuningDatabase(tmp_path / "tuning.db")
    config = LoopConfig(batch_size=2, verify=False, pipeline=True)
    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=2, timing=QUICK)) as engine:
        loop = TuningLoop(tasks, llvm_target, db, engine, CostModel(), config=config)
        reason = loop.run(Objectives(trials=64), task_objectives=Objectives(trials=4))
    assert reason.startswith("every task is finished")
    batches = [json.loads(line)["task"] for line in (tmp_path / "logs" / "batches.jsonl").read_text().splitlines()]
    assert batches[:2] == [t.name for t in tasks]  # the second task's first batch went in while the first's flew
    per_task = {run.kernel_id: 0 for run in loop.runs}
    for record in db.records(str(llvm_target)):
        per_task[record.kernel_id] += 1
    assert list(per_task.values()) == [4, 4]
    assert [run.progress.stopped for run in loop.runs] == ["trial budget: 4 of 4 trials measured"] * 2


def test_a_proposed_candidate_is_never_proposed_again_before_it_is_measured(llvm_target):
    mod = msc.normalize_prim_func_module(matmul(1, 1, 2))  # about 20 distinct schedules
    search = TaskSearch(mod, llvm_target, seed=0, cost_model=CostModel(), features=CandidateFeatures(), group="m")
    proposed = []
    for _ in range(8):  # none observed: every batch is still in flight when the next is proposed
        proposed += [c.key for c in search.propose(8)]
    assert len(proposed) > 8 and len(set(proposed)) == len(proposed)


@pytest.mark.parametrize("scheduler", [GradientScheduler(epsilon=0.0), RoundRobinScheduler()])
def test_a_batch_in_flight_counts_as_given(scheduler):
    tasks = [TaskProgress(weight=1), TaskProgress(weight=1)]
    tasks[0].in_flight = 1
    assert scheduler.pick(tasks) == 1  # every task's first batch before any task's second
    tasks[1].in_flight = 1
    assert scheduler.pick(tasks) == 0  # nothing measured yet, nothing else to pick: a task in flight again
    tasks[0].in_flight = 0
    for _ in range(3):
        tasks[0].record_batch(8, 1.0, None, None)  # three batches, all failed
    assert scheduler.pick(tasks) == 1 and tasks[0].exhausted
    assert not tasks[1].exhausted  # no working candidate yet, but its batch in flight may still bring one
    tasks[1].in_flight = 0
    tasks[1].record_batch(8, 1.0, None, 1e-3)
    tasks[1].in_flight = 1
    assert scheduler.pick(tasks) == 1  # a task with a best is picked while its batch is in flight


def test_an_interrupt_commits_what_came_back_and_stops_the_batch_in_flight(tmp_path, llvm_target):
    class InterruptedAfterFirstBatch(Progress):
        """Ctrl-C once batch 1 is finished and batch 2 has a result waiting, not yet taken in."""

        def batch(self, *args, **kwargs):
            self.in_flight = loop._in_flight[-1].measuring
            deadline = time.monotonic() + 60
            while self.in_flight.last_result is None and time.monotonic() < deadline:
                time.sleep(0.02)
            raise KeyboardInterrupt

    db = TuningDatabase(tmp_path / "tuning.db")
    progress = InterruptedAfterFirstBatch(enabled=False)
    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=2, timing=SLOW_TIMING)) as engine:
        loop = TuningLoop(
            [_matmul_task(64, 64, 64)], llvm_target, db, engine, CostModel(), config=PIPELINED, progress=progress
        )
        with pytest.raises(KeyboardInterrupt):
            loop.run(Objectives(trials=20))
        progress.in_flight._thread.join(timeout=60)
        assert not progress.in_flight._thread.is_alive()  # batch 2's measuring stopped
    records = db.records(str(llvm_target))
    assert len(records) == loop.trials_done
    assert 4 < len(records) < 12  # batch 1's analytic four, and what batch 2 had measured: not all of it
    assert loop.spent.in_flight == 0 and loop.runs[0].progress.in_flight == 0


def test_a_crash_and_a_hang_in_batch_k_leave_batch_k_plus_1_alone(tmp_path, llvm_target):
    config = EngineConfig(build_workers=2, run_timeout=TimeoutPolicy(initial=5, floor=5), timing=QUICK)
    first = [
        MeasureInput("crash", faulty.crashing()),
        MeasureInput("good-1", faulty.copy(128)),
        MeasureInput("hang", faulty.hanging()),
        MeasureInput("good-2", faulty.copy(256)),
    ]
    second = [MeasureInput(f"next-{n}", faulty.copy(n)) for n in (64, 512, 1024)]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        batch_k = InFlight(engine.measure(first), "k")  # its builds and those of k+1 share the build workers
        batch_k1 = InFlight(engine.measure(second), "k+1")
        results = {r.key: r for r in batch_k.results()}
        after = {r.key: r for r in batch_k1.results()}
        restarts = engine._runners.restarts
    assert {key: r.status for key, r in results.items()} == {
        "crash": Status.RUN_CRASH,
        "good-1": Status.OK,
        "hang": Status.RUN_TIMEOUT,
        "good-2": Status.OK,
    }
    assert sorted(after) == sorted(i.key for i in second) and all(r.ok and r.latency > 0 for r in after.values())
    assert restarts == 2  # the crashed measuring worker and the hung one, each replaced once
    assert batch_k1.first_result > batch_k.last_result  # timed after batch k's window, never inside it


def test_a_batch_whose_builds_come_last_is_still_timed_first(tmp_path, llvm_target):
    """Batch k's builds held back until batch k+1 (submitted after it, built already) could have been timed:
    batch k+1 waits for batch k's turn, and a batch dropped before it was read holds up nobody."""
    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=2, timing=QUICK)) as engine:
        builds = {b.key: b for b in engine.build([MeasureInput(f"copy-{n}", faulty.copy(n)) for n in (64, 128, 256)])}

        def late(*keys):
            time.sleep(1.0)
            yield from (builds[key] for key in keys)

        engine.measure_built([builds["copy-64"]])  # never read: its turn ends as it is collected
        batch_k = InFlight(engine.measure_built(late("copy-64", "copy-128")), "k")
        batch_k1 = InFlight(engine.measure_built([builds["copy-256"]]), "k+1")
        assert [r.key for r in batch_k1.results()] == ["copy-256"]
        assert [r.key for r in batch_k.results()] == ["copy-64", "copy-128"]
    assert batch_k1.first_result > batch_k.last_result
