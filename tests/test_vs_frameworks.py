"""experiments/vs_frameworks.py keeps working: its quick run tunes tiny-resnet and one operator,
times them beside PyTorch and ONNX Runtime, checks their outputs and writes its tables."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # over a minute and a half on 2 cores: out of CI (`pytest -m slow`)
def test_the_quick_run_times_every_runtime_and_writes_its_tables(tmp_path):
    subprocess.run(
        [sys.executable, "experiments/vs_frameworks.py", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        check=True,
        timeout=900,
    )
    models = {row["workload"]: row for row in _rows(tmp_path / "vs_frameworks.csv")}
    assert set(models) == {"tiny-resnet", "op-softmax-bert"}
    for row in models.values():
        for runtime in ("tuned (ms)", "TVM untuned (ms)", "PyTorch eager (ms)", "ONNX Runtime (ms)"):
            assert float(row[runtime]) > 0, (runtime, row)
        assert float(row["tuned error"]) < 1e-3  # checked against PyTorch's output
        assert float(row["tuned / best"]) > 0
        assert float(row["by round"].split("-")[0]) > 0  # the ratio of each interleaved round
        assert float(row["kernels in model (ms)"]) > 0  # the tuned kernels profiled inside the model
        assert float(row["FLOPs at peak / best"]) > 0  # the kernels' arithmetic at the machine's peak
    kernels = _rows(tmp_path / "kernels.csv")
    assert {k["workload"] for k in kernels} == set(models)
    direct = [k for k in kernels if "conv2d" in k["kernel"] and "winograd" not in k["kernel"]]
    assert direct and all(k["PyTorch op (us)"] != "-" for k in direct)  # matched to aten::conv2d by FLOPs
    assert all(0 < float(k["% of roofline"].rstrip("%")) for k in kernels)
    assert all(float(k["in model (us)"]) > 0 for k in kernels)  # every tuned kernel found in the model
    summary = (tmp_path / "vs_frameworks.md").read_text()
    assert "Machine limits" in summary and "Geometric mean" in summary and "at the FLOPs' peak" in summary
    assert (tmp_path / "vs_frameworks.png").stat().st_size > 0


def test_the_roofline_bound_is_the_slower_of_compute_and_memory():
    sys.path.insert(0, str(ROOT))
    from experiments.machine_limits import MachineLimits

    limits = MachineLimits(
        threads=2, fma_gflops=200.0, numpy_sgemm_gflops=250.0, torch_sgemm_gflops=None, copy_gbs=10.0
    )
    assert limits.peak_gflops == 250.0
    assert limits.bound_seconds(flops=250e9, bytes_moved=1e9) == pytest.approx(1.0)  # compute-bound
    assert limits.bound_seconds(flops=1e9, bytes_moved=20e9) == pytest.approx(2.0)  # memory-bound


def test_the_arithmetic_floor_is_the_kernels_flops_at_peak():
    sys.path.insert(0, str(ROOT))
    from experiments.vs_frameworks import arithmetic_floor

    tuned = {
        "tasks": [
            {"launches": 3, "flops": 250e9, "bytes": 1e9, "latency": 1.5},  # 1 s at peak, three times
            {"launches": 1, "flops": 1e9, "bytes": 20e9, "latency": 2.5},  # memory-bound: its FLOPs only
            {"launches": 1, "flops": 9e12, "bytes": 1e9, "latency": None},  # no tuned schedule: still run
        ]
    }
    assert arithmetic_floor(tuned, peak_gflops=250.0) == pytest.approx(39.004)
    # a bf16 product counts at the bf16 dot product's peak (twice the FMA's here)
    tuned["tasks"][0]["name"] = "fused_bf16_dense"
    peaks = lambda name: 500.0 if "bf16_" in name else 250.0  # noqa: E731
    assert arithmetic_floor(tuned, 250.0, peaks) == pytest.approx(39.004 - 1.5)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here: the comparison would run")
def test_the_gpu_comparison_says_in_one_line_that_it_needs_a_gpu(tmp_path):
    run = subprocess.run(
        [sys.executable, "experiments/vs_frameworks.py", "--target", "cuda", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "torch sees none here" in run.stderr.strip().splitlines()[-1], run.stderr
    assert not list(tmp_path.iterdir())  # nothing started


def test_two_thread_placements_are_told_apart_only_when_the_probe_spreads():
    sys.path.insert(0, str(ROOT))
    from experiments.cross_core import fork_join_probe, placement_threshold

    assert placement_threshold([0.75, 0.77, 0.80]) is None
    threshold = placement_threshold([0.75, 1.55, 0.76, 1.58])
    assert 0.8 < threshold < 1.5
    probe = fork_join_probe(2)
    assert 0 < probe() < 1000  # microseconds of one fork-join of TVM's pool


def test_token_ids_stay_integers_when_a_model_is_placed_in_its_precision():
    sys.path.insert(0, str(ROOT))
    import torch

    from experiments.vs_frameworks import Setting, placed

    module, ids = placed(torch.nn.Embedding(10, 4), torch.tensor([[1, 2, 3]]), Setting(dtype="float32"))
    assert ids.dtype == torch.int64 and module(ids).dtype == torch.float32  # BERT's input, not cast to float
    _, hidden = placed(torch.nn.Identity(), torch.zeros(2, 4, dtype=torch.float64), Setting(dtype="float32"))
    assert hidden.dtype == torch.float32
