"""A default run keeps TVM's C++ log lines off the terminal, and states its budget in its first line."""

from __future__ import annotations

import pytest

from tuner import Objectives, tune
from tuner.cli.main import build_parser
from tuner.cli.tune_flags import objectives_from_args
from tuner.search.budget import DEFAULT_MIN_TRIALS, DEFAULT_TRIALS_PER_TASK, choose_budget, describe_budget

torch = pytest.importorskip("torch")

EMBEDDING_WARNING = "Fast mode segfaults"  # TVM's C++ warning, once per gather, while a model is lowered


class _Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.proj = torch.nn.Linear(16, 8)

    def forward(self, ids):
        return self.proj(self.embed(ids)).relu()


def _tune_embedder(work_dir, **kwargs):
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 12))
    return tune(_Embedder().eval(), example_inputs=[ids], work_dir=work_dir, **kwargs)


def test_tvm_log_lines_go_to_the_work_dir_not_the_terminal(tmp_path, capfd):
    result = _tune_embedder(tmp_path / "run", trials_per_task=1)
    err = capfd.readouterr().err
    assert result.check.ok
    assert EMBEDDING_WARNING not in err and "Warning:" not in err
    assert "tuner: tuning on" in err  # the tuner's own lines still reach the user
    assert EMBEDDING_WARNING in (tmp_path / "run" / "logs" / "libraries.log").read_text()


@pytest.mark.slow  # 10 s; that the lines stay off the terminal is in CI: out of CI (`pytest -m slow`)
def test_verbose_lets_them_through(tmp_path, capfd):
    _tune_embedder(tmp_path / "run", trials_per_task=1, verbose=True)
    assert EMBEDDING_WARNING in capfd.readouterr().err


def test_a_time_budget_too_short_to_measure_says_so_in_one_line(tmp_path, capfd):
    result = _tune_embedder(tmp_path / "run", stop=Objectives(seconds=3))
    said = [line for line in capfd.readouterr().err.splitlines() if "no time to measure" in line]
    assert len(said) == 1 and "time budget: " in said[0] and " of 3 s" in said[0] and "none measured" in said[0]
    assert result.trials == 0
    timed = Objectives(seconds=3)  # the first line of a run that has the time states it so
    assert describe_budget(choose_budget(None, None, timed), timed) == "at most 0:03 in all (compile included)"


def test_no_budget_means_a_budget_per_kernel():
    budget = choose_budget(None, None, None)
    assert budget.defaulted and budget.trials_per_task == DEFAULT_TRIALS_PER_TASK
    assert budget.total_trials(100) == 100 * DEFAULT_TRIALS_PER_TASK
    assert budget.total_trials(1) == DEFAULT_MIN_TRIALS
    text = describe_budget(budget, Objectives(trials=budget.total_trials(100)))
    assert text.startswith(f"{100 * DEFAULT_TRIALS_PER_TASK} trials ({DEFAULT_TRIALS_PER_TASK} per kernel, the default")
    # anything the user gives replaces the default
    assert not choose_budget(64, None, None).defaulted and choose_budget(64, None, None).trials_per_task is None
    assert choose_budget(None, 8, None).total_trials(3) == 24
    timed = choose_budget(None, None, Objectives(seconds=60))
    assert timed.trials is None and timed.trials_per_task is None


def test_max_minutes_on_the_command_line():
    args = build_parser().parse_args(["tune", "resnet18", "--max-minutes", "15"])
    stop, _ = objectives_from_args(args)
    assert stop.seconds == 900 and args.trials is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "resnet18", "--max-minutes", "1", "--max-seconds", "60"])


class _TwoDense(torch.nn.Module):
    """Two matmuls by weights of different shapes: sibling kernels of one operator class."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(64, 96)
        self.second = torch.nn.Linear(96, 48)

    def forward(self, x):
        return self.second(self.first(x).relu()).relu()


def test_a_kernel_starts_from_its_siblings_schedules(tmp_path, capfd):
    torch.manual_seed(0)
    result = tune(
        _TwoDense().eval(), example_inputs=[torch.randn(16, 64)], trials_per_task=4, batch_size=4, work_dir=tmp_path
    )
    err = capfd.readouterr().err
    assert result.check.ok
    assert "from sibling kernels" in err, err
