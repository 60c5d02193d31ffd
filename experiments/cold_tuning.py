"""A model tuned with cold caches against the same model tuned warm, timed interleaved in one process.

    W=experiments/results/vs_frameworks/hf-coverage/gemma-mistral-resnet-convnext-wav2vec2-bart-distilbert-clip
    .venv/bin/python experiments/cold_tuning.py hf-distilbert --warm $W/runs/hf-distilbert/model.so --work-dir /tmp/cold
    .venv/bin/python experiments/cold_tuning.py resnet50 --dtype bfloat16 --warm /tmp/warm --work-dir /tmp/cold

The warm library is one a `vs_frameworks.py` run tuned (its work dirs keep `model.so`), or, given a work
dir, this script tunes it there first; then it tunes the same model (workloads/hf_models.py names, or a
zoo model) with ``cold_cache=True`` (every kernel timed with its arguments flushed from the caches, as it
meets its weights inside the model) at the same budget, times both libraries and OpenVINO (fp32 and its
default) in alternating rounds, and checks all against PyTorch fp32.
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
    parser.add_argument(
        "--warm", type=Path, required=True, help="the library tuned warm (a model.so), or a work dir to tune it in"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import torch

    import experiments.frameworks as fw
    from tuner import load, tune

    module, inputs = fw.module_and_inputs(args.model)

    def tuned(work_dir: Path, cold_cache: bool) -> Path:
        return tune(
            module,
            target="llvm",
            example_inputs=inputs,
            trials_per_task=args.trials_per_task,
            work_dir=work_dir,
            dtype=args.dtype,
            seed=1,
            cold_cache=cold_cache,
        ).artifact_path

    warm_library = args.warm if args.warm.suffix == ".so" else tuned(args.warm, cold_cache=False)
    libraries = {"warm": load(warm_library), "cold": load(tuned(args.work_dir, cold_cache=True))}
    eager = fw.Contender("PyTorch eager", torch.no_grad()(lambda: module(*inputs)))
    tuned_contenders = [fw.Contender(name, partial(library, *inputs)) for name, library in libraries.items()]
    openvino = [c for c in fw.openvino(module, inputs, torch.get_num_threads()) if c.call is not None]
    fw.time_interleaved([*tuned_contenders, *openvino], rounds=args.rounds)
    _, errors = fw.errors_against_eager([eager, *tuned_contenders, *openvino])
    fw.print_two_builds(tuned_contenders, libraries, openvino, errors, inputs)


if __name__ == "__main__":
    main()
