"""``tune()`` of a torch module TVM's importer takes only in part: cut around the refused operator, the
pieces tuned and compiled, the operator in PyTorch between them; ``partition=False`` refuses it in one
line; a module with nothing heavy TVM can take is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from tuner import tune
from tuner.errors import ModelError, TunerError
from tuner.options import TuneOptions
from tuner.partition.pieces import piece_budget
from tuner.partition.result import PartitionedResult
from tuner.search.objectives import Objectives

torch = pytest.importorskip("torch")

TOLERANCE = 1e-3  # tuner.compile.check's fp32 tolerance, relative to the largest output


class Sandwich(torch.nn.Module):
    """erfinv, which TVM's importer refuses, between two Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.erfinv(torch.tanh(self.fc1(x)) * 0.5))


class Light(torch.nn.Module):
    """erfinv with only elementwise operators around it: nothing worth a tuning run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erfinv(torch.tanh(x) * 0.5) + 1


def _sandwich() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Sandwich().eval(), torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def test_tune_runs_the_refused_operator_in_pytorch_between_compiled_pieces(tmp_path, capfd):
    module, x = _sandwich()
    result = tune(module, example_inputs=[x], trials=0, work_dir=tmp_path / "run")
    assert isinstance(result, PartitionedResult)
    assert result.in_pytorch == ["erfinv.default"] and len(result.pieces) == 2
    assert result.compiled().split.installed == sorted(result.pieces)  # the pieces run compiled, not in PyTorch
    for piece in result.pieces.values():  # each piece a work dir of its own, under the run's
        assert piece.artifact_path.is_file() and piece.work_dir.parent == tmp_path / "run"
    with torch.no_grad():
        want = module(x)
    got = result.compiled()(x)
    scale = want.abs().max().item()
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    assert (got - want).abs().max().item() <= TOLERANCE * scale
    other = np.random.default_rng(2).standard_normal((4, 16)).astype("float32")  # numpy in, numpy out
    with torch.no_grad():
        assert np.abs(result.run(other) - module(torch.from_numpy(other)).numpy()).max() <= TOLERANCE * scale
    assert result.check is not None and result.check.ok and result.check.reference == "PyTorch"
    assert result.latency_after is not None and result.latency_after > 0
    summary = result.summary()
    assert "partitioned: erfinv.default in PyTorch between 2 compiled piece(s)" in summary, summary
    assert "end-to-end check: matches PyTorch" in summary
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if "TVM's importer does not take" in line]
    assert said == [
        f"tuner: Sandwich: TVM's importer does not take erfinv.default: those run in PyTorch, the rest in 2 "
        f"piece(s) tuned one by one in {tmp_path / 'run'}"
    ], err
    with pytest.raises(TunerError, match=r"cannot be saved as one library: keep result.compiled\(\)") as saving:
        result.export(tmp_path / "model.so")
    assert "\n" not in str(saving.value)


def test_partition_false_refuses_the_module_in_one_line_naming_the_way_out(tmp_path):
    module, x = _sandwich()
    with pytest.raises(ModelError) as refused:
        tune(module, example_inputs=[x], trials=0, work_dir=tmp_path / "run", partition=False)
    message = str(refused.value)
    assert "\n" not in message
    assert message == (
        "torch module Sandwich uses operators TVM's importer does not support: ['erfinv.default']; or let tune() "
        "run them in PyTorch: drop partition=False (--no-partition)"
    )


def test_a_module_with_nothing_heavy_tvm_takes_is_refused_in_one_line(tmp_path):
    with pytest.raises(ModelError) as refused:
        tune(Light(), example_inputs=[(4, 16)], trials=0, work_dir=tmp_path / "run")
    message = str(refused.value)
    assert "\n" not in message and "erfinv.default" in message
    assert message.endswith("no part of it TVM takes holds a matmul or convolution worth tuning: run it in PyTorch")


def test_the_pieces_share_the_budget():
    options = TuneOptions(trials=10, stop=Objectives(seconds=60.0, joules=90.0, price_per_hour=1.0, money=3.0))
    first = piece_budget(options, left=3, count=3, trials_left=10, elapsed=6.0)
    assert first["trials"] == 4  # 10 over 3 pieces, rounded up: what is left goes on to the next
    assert first["stop"].seconds == pytest.approx(18.0)  # (60 - 6) / 3
    assert (first["stop"].joules, first["stop"].money) == (30.0, 1.0)
    last = piece_budget(options, left=1, count=3, trials_left=3, elapsed=59.9)
    assert last["trials"] == 3 and last["stop"].seconds == pytest.approx(0.1)
    assert piece_budget(options, left=1, count=3, trials_left=0, elapsed=70.0)["stop"].seconds == 1e-3
    assert piece_budget(TuneOptions(trials_per_task=2), 2, 2, None, 0.0) == {}  # per kernel: as it is
