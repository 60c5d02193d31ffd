"""The few-shot start around the analytic point (the analytic schedule and its neighbours, measured first)
and the per-kernel figures that set the analytic model's predictions beside what was measured."""

from __future__ import annotations

import io
import math
import sqlite3

from analytic_facts import AVX512, check_factors, loops_of

from tuner import tune
from tuner.cli.report import write_report
from tuner.progress import format_latency
from tuner.search.first_candidates import ANALYTIC_SEEDS
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import ANALYTIC_SEED
from tuner.spaces.block_plan import plan_block
from tuner.spaces.machine import MachineFacts
from tuner.spaces.neighbours import analytic_candidates, neighbour_plans
from tuner.targets import resolve_target
from workloads import load_workload


def test_each_neighbour_is_one_step_of_one_loop_from_the_analytic_plan():
    loops = loops_of([512, 512], [512])
    plan = plan_block(loops, AVX512)
    neighbours = neighbour_plans([plan], AVX512)
    assert len(neighbours) >= 4
    for (neighbour,) in neighbours:
        check_factors(loops, neighbour)
        changed = [i for i in plan.factors if plan.factors[i] != neighbour.factors[i]]
        assert len(changed) == 1, changed
        before, after = plan.factors[changed[0]], neighbour.factors[changed[0]]
        moved = [a / b for a, b in zip(after, before, strict=True) if a != b]
        assert len(moved) == 2 and math.prod(moved) == 1 and {round(max(moved)), round(1 / min(moved))} == {2}
        assert neighbour.accumulators <= AVX512.registers.max_accumulators
    assert len({str(n[0].factors) for n in neighbours}) == len(neighbours)


def test_no_neighbour_holds_more_accumulators_than_the_registers():
    loops = loops_of([96, 64], [256])  # 96 rows: 6 x 4 vectors fills AVX-512's 24 accumulators
    plan = plan_block(loops, AVX512)
    assert plan.accumulators == AVX512.registers.max_accumulators
    assert all(n.accumulators <= plan.accumulators for (n,) in neighbour_plans([plan], AVX512))


def test_the_analytic_candidates_start_with_the_analytic_schedule_and_differ():
    mod = load_workload("matmul-128").mod
    target = resolve_target("llvm")
    context = msc.make_context(mod, target, ANALYTIC_SEED)
    spaces, postprocs = msc.design_spaces(context), msc.postprocessors(context)
    candidates = analytic_candidates(mod, spaces, postprocs, MachineFacts.of(target), ANALYTIC_SEEDS)
    assert len(candidates) == ANALYTIC_SEEDS
    keys = [msc.structural_key(c.sch.mod) for c in candidates]
    assert len(set(keys)) == len(keys)
    from tuner.spaces.analytic import configure_kernel

    assert keys[0] == msc.structural_key(configure_kernel(mod, target).sch.mod)


def test_a_search_measures_the_analytic_point_first_and_reports_its_prediction(tmp_path):
    result = tune("matmul-128", trials=8, batch_size=8, work_dir=tmp_path, progress=False)
    mod, target = load_workload("matmul-128").mod, resolve_target("llvm")
    context = msc.make_context(mod, target, ANALYTIC_SEED)
    around = analytic_candidates(
        mod, msc.design_spaces(context), msc.postprocessors(context), MachineFacts.of(target), ANALYTIC_SEEDS
    )
    with sqlite3.connect(tmp_path / "tuning.db") as db:
        first = [row[0] for row in db.execute("SELECT candidate FROM records ORDER BY id LIMIT ?", (ANALYTIC_SEEDS,))]
    assert set(first) == {msc.structural_key(c.sch.mod) for c in around}
    (task,) = result.tasks
    assert task.tiled and task.predicted_latency > 0 and task.analytic_latency > 0
    assert task.best_latency <= task.analytic_latency
    # the peak is measured once per machine (here, once per test session, while other tests run): above 0 is all
    # a loaded machine lets a test say
    assert task.fraction_of_peak > 0 and "predicted" in result.summary()
    report, _ = write_report(tmp_path)
    row = next(line for line in report.read_text().splitlines() if line.startswith(f"| {task.name} |"))
    assert row.count("|") == 14 and row.rstrip(" |").endswith("%")


def test_no_trials_times_every_kernel_inside_the_model(tmp_path):
    result = tune("tiny-resnet", trials=0, work_dir=tmp_path, progress=False)
    assert result.tasks and all(task.in_model_latency and task.in_model_latency > 0 for task in result.tasks)
    assert all(task.predicted_latency for task in result.tasks)
    products = [task for task in result.tasks if task.tiled]
    assert products and all(task.fraction_of_peak for task in products)
    assert "in the model" in result.summary()
    # the calibration's product timed beside the kernels: a VM's speed reads 0.5-1 of it; above 0 is what a
    # loaded machine lets a test say
    assert result.machine_speed and result.machine_speed > 0 and "of its calibrated speed" in result.summary()
    # the predictions are given at that speed, the one the kernels' times in the model were taken at
    at_speed = format_latency(result.predicted_latency / result.machine_speed)
    assert f"the analytic model predicted {at_speed} ({format_latency(result.predicted_latency)} at" in result.summary()


def test_without_the_analytic_start_the_search_measures_none_of_the_analytic_candidates(tmp_path):
    tune("matmul-128", trials=8, batch_size=8, work_dir=tmp_path, progress=False, analytic_start=False)
    mod, target = load_workload("matmul-128").mod, resolve_target("llvm")
    context = msc.make_context(mod, target, ANALYTIC_SEED)
    around = analytic_candidates(
        mod, msc.design_spaces(context), msc.postprocessors(context), MachineFacts.of(target), ANALYTIC_SEEDS
    )
    with sqlite3.connect(tmp_path / "tuning.db") as db:
        measured = {row[0] for row in db.execute("SELECT candidate FROM records")}
    assert len(measured) == 8 and not measured & {msc.structural_key(c.sch.mod) for c in around}


def test_kernel_times_inside_the_model_are_timed_again_until_they_add_up_to_its_latency(tmp_path):
    """Given a latency no pass can add up to, the kernels are timed IN_MODEL_PASSES times and the pass that
    adds up to least is kept, and the report says they are upper bounds; given the model's own, one pass does
    where the machine is steady."""
    from measure.engine.engine import MeasureEngine
    from tuner.compile.phase import IN_MODEL_PASSES, _in_model_seconds
    from tuner.progress import Progress
    from tuner.tasks.extraction import extract_tasks

    result = tune("tiny-resnet", trials=0, work_dir=tmp_path / "work", progress=False)
    target = resolve_target("llvm")
    workload = load_workload("tiny-resnet")
    tasks = extract_tasks(workload, target)

    class PassesCounted(MeasureEngine):
        totals: list[float] = []

        def kernel_times(self, *args, **kwargs):
            times = super().kernel_times(*args, **kwargs)
            self.totals.append(sum(times.values()))
            return times

    engine = PassesCounted(target, tmp_path / "engine")
    try:
        said = io.StringIO()
        seconds = _in_model_seconds(engine, workload, result.artifact_path, tasks, Progress(stream=said), latency=1e-9)
        assert len(engine.totals) == IN_MODEL_PASSES
        assert "read them as upper bounds" in said.getvalue()
        kept = sum(seconds[task.name] * task.weight for task in tasks if task.name in seconds)
        assert seconds and math.isclose(kept, min(engine.totals), rel_tol=1e-9)
        engine.totals.clear()
        quiet = io.StringIO()  # a latency the kernels add up to within IN_MODEL_SLACK: one pass, nothing said
        _in_model_seconds(engine, workload, result.artifact_path, tasks, Progress(stream=quiet), latency=0.1)
        assert len(engine.totals) == 1 and "upper bounds" not in quiet.getvalue()
    finally:
        engine.close()
