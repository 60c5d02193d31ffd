"""The tuning loop's own decisions: scheduling tasks, giving up when nothing works."""

import pytest

from costmodel import CostModel
from measure import AdaptiveTimeout, EngineConfig, MeasureEngine
from tuner.database import TuningDatabase
from tuner.errors import TunerError
from tuner.loop import LoopConfig, TuningLoop, auto_batch_size
from tuner.scheduler import TaskProgress, TaskScheduler
from tuner.tasks import extract_tasks
from workloads import get_workload


def test_a_run_where_every_candidate_fails_stops_with_the_reason(tmp_path, llvm_target):
    tasks = extract_tasks(get_workload("matmul-128"), llvm_target)
    db = TuningDatabase(tmp_path / "tuning.db")
    config = EngineConfig(build_workers=1, build_timeout=AdaptiveTimeout(initial=1e-3, floor=1e-3))
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        loop = TuningLoop(tasks, llvm_target, db, engine, CostModel(), config=LoopConfig(batch_size=4, give_up_after=4))
        with pytest.raises(TunerError, match="all 4 candidates .* build_timeout"):
            loop.run(64)
    records = db.records(str(llvm_target))
    assert len(records) == 4 and {r.status for r in records} == {"build_timeout"}  # every failure committed


def test_scheduler_visits_every_task_then_favours_the_costliest_improving_one():
    tasks = [TaskProgress(weight=1), TaskProgress(weight=4), TaskProgress(weight=1)]
    scheduler = TaskScheduler()
    order = []
    for batch_best in (1e-3, 1e-3, 5e-3):
        index = scheduler.pick(tasks)
        order.append(index)
        tasks[index].record_batch(batch_best)
    assert order == [0, 1, 2]
    assert scheduler.pick(tasks) == 2  # 1 x 5 ms > 4 x 1 ms
    tasks[2].record_batch(None)  # no improvement: its priority halves
    tasks[2].record_batch(None)
    assert scheduler.pick(tasks) == 1


def test_a_task_that_never_works_is_given_up():
    tasks = [TaskProgress(weight=1), TaskProgress(weight=1)]
    tasks[0].record_batch(1e-3)
    scheduler = TaskScheduler(max_failed_batches=2)
    assert scheduler.pick(tasks) == 1
    tasks[1].record_batch(None)
    assert scheduler.pick(tasks) == 1
    tasks[1].record_batch(None)
    assert scheduler.pick(tasks) == 0 and tasks[1].exhausted


@pytest.mark.parametrize("budget, tasks, expected", [(64, 1, 16), (16, 1, 8), (512, 8, 16), (10_000, 1, 64)])
def test_batch_size_follows_the_budget(budget, tasks, expected):
    assert auto_batch_size(budget, tasks) == expected
