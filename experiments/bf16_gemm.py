"""A square GEMM tuned in bf16 and in fp32, each against the peak of its own precision measured in
the same run: the bf16 dot product's (``vdpbf16ps``) and the fp32 FMA's (experiments/machine_limits.py).

    .venv/bin/python experiments/bf16_gemm.py [--size 1024] [--trials-per-task 64] [--out DIR]

The GEMM is a torch ``Linear`` (a constant weight, as in a model) on ``size`` rows, tuned through
``tune()`` as a user would; the kernel's rate is its best measured latency's. The peaks are measured
before and after the tuning runs and the higher of each is used (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.host import cpu_flags, cpu_model  # noqa: E402
from experiments.machine_limits import bf16_peak, fma_gflops  # noqa: E402


def _peaks(threads: int) -> dict[str, float | None]:
    bf16, _, _ = bf16_peak(threads)
    return {"float32": fma_gflops(threads), "bfloat16": bf16}


def torch_gemm_gflops(size: int, dtype: str, threads: int, calls: int = 10) -> float:
    """PyTorch's (oneDNN's) GEMM of the same size and precision, best of five rounds: what a tuned kernel
    should be measured beside, besides the peak."""
    import time

    import torch

    torch.set_num_threads(threads)
    a, b = (torch.randn(size, size).to(getattr(torch, dtype)) for _ in range(2))
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            torch.matmul(a, b)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2.0 * size**3 / best / 1e9


def tune_gemm(size: int, dtype: str, trials_per_task: int, work_dir: Path) -> dict:
    import numpy as np
    import torch

    import tuner

    torch.manual_seed(0)
    model = torch.nn.Linear(size, size, bias=False).eval()
    x = torch.randn(size, size)
    result = tuner.tune(
        model, example_inputs=[x], target="llvm", dtype=dtype, trials_per_task=trials_per_task, work_dir=work_dir
    )
    gemm = max(result.tasks, key=lambda t: t.flops)
    with torch.no_grad():
        expected = model(x).numpy()
    got = np.asarray(result.run(x.numpy()))
    return {
        "dtype": dtype,
        "kernel": gemm.name,
        "latency_ms": gemm.best_latency * 1e3 if gemm.best_latency else None,
        "gflops": gemm.gflops,
        "model_ms": result.latency_after * 1e3 if result.latency_after else None,
        "error": float(np.max(np.abs(got - expected)) / np.max(np.abs(expected))),
        "output_scale": float(np.max(np.abs(expected))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials-per-task", type=int, default=64)
    parser.add_argument("--out", default="experiments/results/bf16_gemm")
    args = parser.parse_args()
    if "avx512_bf16" not in (cpu_flags() or set()):
        sys.exit("this CPU has no AVX512_BF16: the bf16 GEMM cannot use vdpbf16ps here (not measured)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = os.cpu_count() or 1
    before = _peaks(threads)
    rows = [
        tune_gemm(args.size, dtype, args.trials_per_task, out / "runs" / f"wd-{dtype}")
        for dtype in ("bfloat16", "float32")
    ]
    after = _peaks(threads)
    peaks = {k: max(v for v in (before[k], after[k]) if v is not None) for k in before}
    print(
        f"CPU: {cpu_model()}, {threads} threads; peaks (GFLOP/s): fp32 FMA {peaks['float32']:.0f}, bf16 dot "
        f"{peaks['bfloat16']:.0f}"
    )
    for row in rows:
        row["torch_gflops"] = torch_gemm_gflops(args.size, row["dtype"], threads)
        row["peak_gflops"] = peaks[row["dtype"]]
        row["fraction_of_peak"] = row["gflops"] / row["peak_gflops"] if row["gflops"] else None
        print(
            f"{args.size}^3 {row['dtype']:>8}: {row['latency_ms']:.3f} ms, {row['gflops']:.0f} GFLOP/s = "
            f"{row['fraction_of_peak']:.0%} of its peak (PyTorch's matmul: {row['torch_gflops']:.0f}); error "
            f"{row['error']:.1e} of outputs up to {row['output_scale']:.1f}"
        )
    bf16, fp32 = rows
    print(f"bf16 / fp32 kernel time: {bf16['latency_ms'] / fp32['latency_ms']:.2f}")
    (out / "results.json").write_text(json.dumps({"peaks": peaks, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
