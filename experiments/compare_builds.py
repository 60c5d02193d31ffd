"""Several compiled builds of one model timed side by side, with OpenVINO (its default and fp32) and
PyTorch eager, in one process, interleaved: what a change to the code generation (a micro-kernel,
a lowering) or to the tuning (warm or cold caches) did to the model a user gets, every other thing
held equal. Each build is a library written by ``tuner apply`` (its description beside it).

    .venv/bin/tuner apply runs/r50 resnet50 --dtype bfloat16 -o /tmp/before.so   # at one commit
    .venv/bin/tuner apply runs/r50 resnet50 --dtype bfloat16 -o /tmp/after.so    # at another
    .venv/bin/python experiments/compare_builds.py resnet50 before=/tmp/before.so after=/tmp/after.so

Prints a markdown table: each contender's median, its ratio to OpenVINO's default and its error
against PyTorch eager in fp32 (relative to the output's largest value), and the medians by round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.host import cpu_model  # noqa: E402
from experiments import frameworks as fw  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402

_COLUMNS = ["contender", "precision", "ms", "/ OpenVINO (default)", "by round (ms)", "error"]


def _build(label_and_path: str) -> tuple[str, Path]:
    label, sep, path = label_and_path.partition("=")
    if not sep or not label or not path:
        raise SystemExit(f"compare_builds: {label_and_path!r} is not LABEL=PATH: name each build, e.g. after=/tmp/a.so")
    if not Path(path).is_file():
        raise SystemExit(f"compare_builds: no library at {path}: write it with `tuner apply DIR MODEL -o {path}`")
    return label, Path(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the zoo, operator or transformers model the builds were compiled from")
    parser.add_argument("builds", nargs="+", metavar="LABEL=PATH", help="a library written by `tuner apply`")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    builds = [_build(b) for b in args.builds]

    import torch

    from tuner.runtime.compiled_model import ModelDescription

    torch.set_num_threads(args.threads)
    module, inputs = fw.module_and_inputs(args.model)
    contenders = [fw.torch_eager(module, inputs)]
    for label, path in builds:
        description = ModelDescription.read(path)
        typed = [x.to(getattr(torch, spec.dtype)) for x, spec in zip(inputs, description.inputs, strict=True)]
        contenders.append(fw.tvm_model(label, path, description, typed, precision=""))
    contenders += fw.openvino(module, inputs, args.threads)
    _, errors = fw.errors_against_eager(contenders)
    fw.time_interleaved(contenders, rounds=args.rounds, seconds_per_round=0.3)

    openvino = next((c.median for c in contenders if c.name == fw.OPENVINO_DEFAULT), None)
    rows = []
    for c in contenders:
        if c.call is None:
            rows.append({**dict.fromkeys(_COLUMNS, "-"), "contender": c.name, "error": c.missing})
            continue
        rounds = [m * 1e3 for m in c.round_medians]
        rows.append(
            {
                "contender": c.name,
                "precision": c.precision,
                "ms": f"{c.median * 1e3:.3f}",
                "/ OpenVINO (default)": f"{c.median / openvino:.2f}" if openvino else "-",
                "by round (ms)": f"{min(rounds):.2f}-{max(rounds):.2f}",
                "error": f"{errors[c.name]:.1e}",
            }
        )
    print(f"{args.model} on {cpu_model()}, {args.threads} threads, {args.rounds} interleaved rounds")
    print(markdown_table(rows, _COLUMNS))


if __name__ == "__main__":
    main()
