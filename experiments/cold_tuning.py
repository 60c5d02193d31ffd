"""A model tuned with cold caches against the same model tuned warm, timed interleaved in one process.

    .venv/bin/python experiments/cold_tuning.py hf-distilbert \
        --warm experiments/results/vs_frameworks_hf_coverage2/runs/hf-distilbert/model.so --work-dir /tmp/cold

The warm library is one a `vs_frameworks.py` run tuned (its work dirs keep `model.so`); this script tunes
the same model (workloads/hf_models.py names, or a zoo model) with ``cold_cache=True`` (every kernel timed
with its arguments flushed from the caches, as it meets its weights inside the model) at the same budget,
then times both libraries in alternating rounds and checks both against PyTorch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _first_output(out: object) -> object:
    return out[0] if isinstance(out, (list, tuple)) else getattr(out, "last_hidden_state", out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--warm", type=Path, required=True, help="the library tuned warm (a vs_frameworks model.so)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import numpy as np
    import torch

    import experiments.frameworks as fw
    from tuner import load, tune

    module, inputs = fw.module_and_inputs(args.model)
    result = tune(
        module,
        target="llvm",
        example_inputs=inputs,
        trials_per_task=args.trials_per_task,
        work_dir=args.work_dir,
        seed=1,
        cold_cache=True,
    )
    libraries = {"warm": load(args.warm), "cold": load(result.artifact_path)}
    with torch.no_grad():
        reference = _first_output(module(*inputs))
    rounds: dict[str, list[float]] = {name: [] for name in libraries}
    for _ in range(args.rounds):
        for name, library in libraries.items():
            calls = []
            for _ in range(20):
                started = time.perf_counter()
                library(*inputs)
                calls.append(time.perf_counter() - started)
            rounds[name].append(statistics.median(calls))
    for name, library in libraries.items():
        got = torch.as_tensor(np.asarray(_first_output(library(*inputs))))
        error = float((got - reference).abs().max() / reference.abs().max())
        in_model = sum(library.kernel_times(*inputs).values())
        print(
            f"{name}: {statistics.median(rounds[name]) * 1e3:.3f} ms, kernels in the model {in_model * 1e3:.3f} ms, "
            f"error {error:.1e}"
        )
    print("cold / warm by round:", [round(c / w, 3) for c, w in zip(rounds["cold"], rounds["warm"], strict=True)])


if __name__ == "__main__":
    main()
