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
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--warm", type=Path, required=True, help="the library tuned warm (a vs_frameworks model.so)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

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
    eager = fw.Contender("PyTorch eager", torch.no_grad()(lambda: module(*inputs)))
    tuned = [fw.Contender(name, partial(library, *inputs)) for name, library in libraries.items()]
    fw.time_interleaved(tuned, rounds=args.rounds)
    _, errors = fw.errors_against_eager([eager, *tuned])
    for contender in tuned:
        in_model = sum(libraries[contender.name].kernel_times(*inputs).values())
        print(
            f"{contender.name}: {contender.median * 1e3:.3f} ms, kernels in the model {in_model * 1e3:.3f} ms, "
            f"error {errors[contender.name]:.1e}"
        )
    warm, cold = (c.round_medians for c in tuned)
    print("cold / warm by round:", [round(c / w, 3) for c, w in zip(cold, warm, strict=True)])


if __name__ == "__main__":
    main()
