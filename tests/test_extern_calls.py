"""Operators a model's lowering leaves to TVM's own functions, called by name (sorting, top-k, argsort:
``tvm.contrib.sort.*``), run in the measuring workers, which load only TVM's runtime; and a compiled
model the workers cannot run is returned all the same, its timing said as unavailable."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from measure import EngineConfig, MeasureEngine  # noqa: E402
from tuner import tune  # noqa: E402
from tuner.compile.phase import _tuned_latency  # noqa: E402
from tuner.progress import Progress  # noqa: E402
from tuner.targets import resolve_target  # noqa: E402
from workloads import load_workload  # noqa: E402


class TopK(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 4, dim=-1)
        return values * 2 + indices.to(x.dtype)


class Sort(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1, descending=True).values + 1


class ArgSort(torch.nn.Module):
    def forward(self, x):
        return torch.argsort(x, dim=-1).to(x.dtype) + x


class CumSum(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=-1) * 0.5


@pytest.mark.parametrize("module", [TopK(), Sort(), ArgSort(), CumSum()], ids=lambda m: type(m).__name__)
def test_a_model_calling_the_runtimes_sort_functions_is_checked_and_timed(module, tmp_path):
    x = torch.randn(8, 32)
    result = tune(module, example_inputs=[x], trials=0, work_dir=tmp_path, progress=False)
    assert result.check is not None and result.check.ok, result.check
    assert result.latency_after is not None and result.latency_after > 0


def test_a_model_the_workers_cannot_run_is_returned_untimed_in_one_line(tmp_path):
    target = resolve_target("llvm")
    engine = MeasureEngine(target, tmp_path, EngineConfig(build_workers=0))
    said = io.StringIO()
    not_a_library = tmp_path / "model.so"
    not_a_library.write_bytes(b"not a shared library")
    try:
        latency = _tuned_latency(engine, load_workload("tiny-resnet"), not_a_library, Progress(stream=said))
    finally:
        engine.close()
    assert latency is None
    (line,) = said.getvalue().splitlines()
    assert "not timed" in line and "returned" in line
