"""Each tuned kernel judged inside the model against its analytic schedule (tuner.compile.in_model_choice): the
judgement from times taken in alternation, the choice it makes in a real tuned model, and the choice kept in the
work dir for the next compile."""

from __future__ import annotations

from pathlib import Path

from tuner import tune
from tuner.compile.in_model_choice import MARGIN, PASSES, Judgement, judge
from tuner.database.database import TuningDatabase
from tuner.database.workdir import IN_MODEL_CHOICES_KEY


def test_each_kernel_keeps_its_fastest_pass_in_each_model_timed_in_alternation():
    tuned, analytic = Path("tuned.so"), Path("analytic.so")
    passes = {
        tuned: iter([{"a_prepacked": 3.0, "b": 1.0}, {"a_prepacked": 2.0, "b": 1.1}]),
        analytic: iter([{"a": 1.0, "b": 1.5}, {"a": 1.5, "b": 0.99}]),
    }
    order = []

    def time_kernels(model: Path) -> dict[str, float]:
        order.append(model)
        return next(passes[model])

    judged = judge(time_kernels, tuned, analytic, ["a", "b", "c"])
    assert order == [tuned, analytic] * PASSES
    # a kernel whose weights are laid out at load is timed under TVM's name for it; one not timed is not judged
    assert judged == {"a": Judgement(2.0, 1.0), "b": Judgement(1.0, 0.99)}
    assert judged["a"].analytic_wins and not judged["b"].analytic_wins  # within the margin the record stays


def test_a_tuned_model_takes_the_schedule_faster_inside_it_and_the_next_compile_keeps_it(tmp_path):
    result = tune("tiny-resnet", trials_per_task=6, work_dir=tmp_path, progress=False)
    db = TuningDatabase(tmp_path / "tuning.db")
    try:
        kept = db.get_meta(IN_MODEL_CHOICES_KEY, {})
    finally:
        db.close()
    assert "in-model choice" in result.seconds  # tuned kernels whose record is not their analytic schedule
    by_name = {task.name: task for task in result.tasks}
    for entry in kept.values():  # each kernel that took its analytic schedule ran faster with it in the model
        assert entry["analytic_s"] < MARGIN * entry["tuned_s"]
    switched = {name for name, task in by_name.items() if task.tuned_in_model_latency}
    assert len(switched) == len(kept)
    for name in switched:
        assert by_name[name].analytic and by_name[name].best_latency is None
    # compiled again from the work dir, with nothing measured: the same kernels take their analytic schedule
    again = tune("tiny-resnet", trials=0, work_dir=tmp_path, progress=False)
    assert {task.name for task in again.tasks if task.analytic and task.trials == 0} >= switched
    assert again.check.ok
    # the kernels built with a tuned record say so, with the record's latency, though nothing was measured now
    from_records = [task for task in again.tasks if not task.analytic]
    assert from_records and all(task.best_latency and task.verified for task in from_records)
