"""The tuning loop's own decisions: scheduling tasks, giving up when nothing works."""

import pytest

from costmodel import CostModel
from measure import EngineConfig, MeasureEngine, TimeoutPolicy
from tuner.database.database import TuningDatabase
from tuner.errors import TunerError
from tuner.search.loop import TuningLoop
from tuner.search.loop_config import LoopConfig, auto_batch_size
from tuner.search.objectives import Objectives
from tuner.search.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress, task_kind
from tuner.tasks.extraction import extract_tasks
from workloads import get_workload


def test_a_run_where_every_candidate_fails_stops_with_the_reason(tmp_path, llvm_target):
    tasks = extract_tasks(get_workload("matmul-128"), llvm_target)
    db = TuningDatabase(tmp_path / "tuning.db")
    config = EngineConfig(build_workers=1, build_timeout=TimeoutPolicy(initial=1e-3, floor=1e-3))
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        loop = TuningLoop(tasks, llvm_target, db, engine, CostModel(), config=LoopConfig(batch_size=4, give_up_after=4))
        # the task's analytic candidates (a batch of 4) are measured first: the run stops after that batch
        with pytest.raises(TunerError, match="all 4 candidates .* build_timeout"):
            loop.run(Objectives(trials=64))
    records = db.records(str(llvm_target))
    assert len(records) == 4 and {r.status for r in records} == {"build_timeout"}  # every failure committed


def _visit_all(scheduler, tasks, bests):
    order = []
    for best in bests:
        index = scheduler.pick(tasks)
        order.append(index)
        tasks[index].record_batch(8, 1.0, None, best)
    return order


def test_gradient_scheduler_visits_every_task_then_favours_where_the_model_gains_most():
    tasks = [TaskProgress(weight=1), TaskProgress(weight=4), TaskProgress(weight=1)]
    scheduler = GradientScheduler(epsilon=0.0)
    assert _visit_all(scheduler, tasks, (1e-3, 1e-3, 5e-3)) == [0, 1, 2]
    assert scheduler.pick(tasks) == 2  # 1 x 5 ms of model time to gain from, against 4 x 1 ms
    tasks[2].record_batch(8, 1.0, None, 1e-3)  # a big improvement: 4 x 1 ms now weighs most
    tasks[2].record_batch(8, 1.0, None, None)
    assert scheduler.pick(tasks) == 1


def test_gradient_scheduler_favours_a_task_far_below_the_throughput_of_its_kind():
    tasks = [TaskProgress(weight=1, flops=1e9, kind="conv"), TaskProgress(weight=1, flops=1e9, kind="conv")]
    scheduler = GradientScheduler(epsilon=0.0)
    _visit_all(scheduler, tasks, (1e-3, 1e-3))
    tasks[0].record_batch(8, 1.0, None, 1e-4)  # task 0 now runs at 10 TFLOP/s; task 1 is at 1
    assert scheduler.pick(tasks) == 1


def test_a_task_near_its_floor_gets_fewer_trials_than_one_far_from_it():
    # both at 1 ms, alike in weight and history; task 0 could run in 0.95 ms at peak, task 1 in 0.1 ms
    tasks = [TaskProgress(weight=1, flops=1e9, floor=9.5e-4), TaskProgress(weight=1, flops=1e9, floor=1e-4)]
    scheduler = GradientScheduler(epsilon=0.0)
    _visit_all(scheduler, tasks, (1e-3, 1e-3))
    assert scheduler.gradient(tasks, 0) == pytest.approx(0.8 * (9.5e-4 - 1e-3))
    assert scheduler.pick(tasks) == 1
    tasks[0].floor = 2e-3  # a floor above the best measured is wrong: the task keeps its look ahead (best / batches)
    assert scheduler.gradient(tasks, 0) == pytest.approx(0.8 * -1e-3)


def test_a_task_that_stopped_improving_loses_the_promise_of_its_kind():
    tasks = [TaskProgress(weight=1, flops=1e10, kind="conv"), TaskProgress(weight=1, flops=1e9, kind="conv")]
    scheduler = GradientScheduler(epsilon=0.0, window=3)
    _visit_all(scheduler, tasks, (1e-3, 1e-3))  # task 1 runs at a tenth of task 0's throughput
    tasks[0].record_batch(8, 1.0, None, 1e-3)
    picks = _visit_all(scheduler, tasks, (1e-3,) * 3)
    assert picks == [1, 1, 1] and tasks[1].batches_without_improvement == 3
    assert scheduler.pick(tasks) == 0  # three batches without gain: only its own history speaks for it now
    tasks[1].record_batch(8, 1.0, None, 9e-4)  # it improves again: the promise is back
    assert tasks[1].batches_without_improvement == 0 and scheduler.pick(tasks) == 1


def test_a_task_long_without_gain_or_too_small_to_matter_gets_no_trials_while_others_can_gain():
    tasks = [TaskProgress(weight=1), TaskProgress(weight=1), TaskProgress(weight=1)]
    scheduler = GradientScheduler(epsilon=1.0, retire_after=2, min_share=0.01)  # every pick a random one
    _visit_all(scheduler, tasks, (1e-3, 1e-3, 1e-6))  # task 2: a thousandth of the model's time
    assert scheduler.retired(tasks, 2) and not scheduler.retired(tasks, 0)
    for _ in range(3):  # three batches without a new best: 2 x 1.5, its share of the model (1/2) x 3 tasks
        assert not scheduler.retired(tasks, 1)
        tasks[1].record_batch(8, 1.0, None, None)
    assert scheduler.retired(tasks, 1)
    assert {scheduler.pick(tasks) for _ in range(20)} == {0}
    for _ in range(3):
        tasks[0].record_batch(8, 1.0, None, None)
    # all retired: the budget left goes on, to tasks big enough to matter
    assert {scheduler.pick(tasks) for _ in range(40)} == {0, 1}
    tasks[0].exhausted = tasks[1].exhausted = True  # only the tiny task is left: tuning ends
    assert scheduler.pick(tasks) is None


def test_a_task_that_weighs_more_in_the_model_waits_longer_before_it_retires():
    tasks = [TaskProgress(weight=4), *(TaskProgress(weight=1) for _ in range(9))]
    scheduler = GradientScheduler(retire_after=6, max_patience=4.0)
    _visit_all(scheduler, tasks, (1e-3,) * 10)  # task 0: 4 of the model's 13 ms, 3.1x the average share
    assert scheduler.patience(tasks, 1) == 6 and scheduler.patience(tasks, 0) == pytest.approx(6 * 40 / 13)
    for _ in range(18):
        tasks[0].record_batch(8, 1.0, None, None)
    assert not scheduler.retired(tasks, 0)
    tasks[0].record_batch(8, 1.0, None, None)
    assert scheduler.retired(tasks, 0)
    tasks[0] = TaskProgress(weight=100)
    tasks[0].record_batch(8, 1.0, None, 1e-3)
    assert scheduler.patience(tasks, 0) == 24  # at most max_patience times retire_after


def test_round_robin_scheduler_takes_turns():
    tasks = [TaskProgress(weight=1), TaskProgress(weight=100)]
    scheduler = RoundRobinScheduler()
    assert _visit_all(scheduler, tasks, (1e-3, 1e-3, 1e-3, 1e-3)) == [0, 1, 0, 1]


@pytest.mark.parametrize("scheduler", [GradientScheduler(), RoundRobinScheduler()])
def test_a_task_that_never_works_is_given_up(scheduler):
    tasks = [TaskProgress(weight=1), TaskProgress(weight=1)]
    tasks[0].record_batch(8, 1.0, None, 1e-3)
    scheduler.max_failed_batches = 2
    assert scheduler.pick(tasks) == 1
    tasks[1].record_batch(8, 1.0, None, None)
    assert scheduler.pick(tasks) == 1
    tasks[1].record_batch(8, 1.0, None, None)
    assert scheduler.pick(tasks) == 0 and tasks[1].exhausted


def test_tasks_of_one_kind_differ_only_by_suffix():
    assert task_kind("fused_conv2d_add_relu1") == task_kind("fused_conv2d_add_relu") == "fused_conv2d_add_relu"
    assert task_kind("fused_matmul") != task_kind("fused_conv2d")


@pytest.mark.parametrize(
    "budget, tasks, expected", [(64, 1, 8), (128, 1, 16), (512, 8, 8), (10_000, 1, 64), (None, 3, 16)]
)
def test_batch_size_follows_the_budget(budget, tasks, expected):
    assert auto_batch_size(budget, tasks) == expected


@pytest.mark.slow  # over 45 s on 2 cores; CI's time goes to the rest
def test_the_final_choice_re_measures_only_the_best_of_a_task_too_small_to_matter(tmp_path, llvm_target):
    from tuner.search.final_choice import MINOR_SHARE

    tasks = extract_tasks(get_workload("tiny-resnet"), llvm_target)
    db = TuningDatabase(tmp_path / "tuning.db")
    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=1)) as engine:
        loop = TuningLoop(tasks, llvm_target, db, engine, CostModel(), config=LoopConfig(batch_size=4, verify=False))
        loop.run(Objectives(trials=4 * len(tasks)))
        samples_before = {r.id: len(r.samples) for r in db.records()}
        measured = {run.kernel_id: db.count_status(run.kernel_id, loop.target_key, "ok") for run in loop.runs}
        model, shares = loop.model_latency(), {}
        for run in loop.runs:
            shares[run.kernel_id] = run.task.weight * run.progress.best / model
        loop.finalize()
    re_measured = {kernel_id: 0 for kernel_id in shares}
    for record in db.records():
        if record.status == "ok" and len(record.samples) > samples_before[record.id]:
            re_measured[record.kernel_id] += 1
    minor = [k for k, share in shares.items() if share < MINOR_SHARE]
    major = [k for k, share in shares.items() if share >= MINOR_SHARE]
    assert minor and major, shares
    assert all(re_measured[k] == 1 for k in minor), (re_measured, shares)
    # a task with one distinct candidate measured has no second one to re-measure
    top = LoopConfig().remeasure_top
    assert all(re_measured[k] == min(top, measured[k]) for k in major), (re_measured, measured, shares)
    assert any(re_measured[k] >= 2 for k in major), (re_measured, measured, shares)
