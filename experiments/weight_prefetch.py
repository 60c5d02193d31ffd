"""A tuned model compiled with and without the weights' prefetches (codegen/weight_prefetch.py),
timed interleaved in one process beside OpenVINO, each checked against PyTorch fp32.

    .venv/bin/python experiments/weight_prefetch.py bert-base \
        --work-dir experiments/results/vs_frameworks/LINEUP/runs/bert-base

The work dir is one a tuning left (a `vs_frameworks.py` run keeps them under `runs/`); both libraries are
compiled from its schedules with `tuner.compile.apply`, one with `TENSOR_TUNER_WEIGHT_PREFETCH=0`. Prints each
latency, the kernels' time inside the model, the error, and the ratio by round.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo model or a workloads/hf_models.py name")
    parser.add_argument("--work-dir", type=Path, required=True, help="where the model was tuned")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-openvino", action="store_true", help="time the two libraries alone")
    args = parser.parse_args()

    import torch

    import experiments.frameworks as fw
    from codegen.weight_prefetch import DISABLE_ENV
    from tuner import load
    from tuner.compile.apply import apply

    module, inputs = fw.module_and_inputs(args.model)
    out = Path(tempfile.mkdtemp(prefix="weight_prefetch_"))
    libraries = {}
    for name, setting in (("without prefetches", "0"), ("with prefetches", "1")):
        os.environ[DISABLE_ENV] = setting
        libraries[name] = load(apply(args.work_dir, module, out / f"{setting}.so", example_inputs=inputs))
    eager = fw.Contender("PyTorch eager", torch.no_grad()(lambda: module(*inputs)))
    ours = [fw.Contender(name, partial(library, *inputs)) for name, library in libraries.items()]
    others = [] if args.no_openvino else fw.openvino(module, inputs, torch.get_num_threads())
    others = [c for c in others if c.call is not None]
    fw.time_interleaved([*ours, *others], rounds=args.rounds)
    _, errors = fw.errors_against_eager([eager, *ours, *others])
    fw.print_two_builds(ours, libraries, others, errors, inputs)


if __name__ == "__main__":
    main()
