"""Long-sequence attention a block of queries at a time against the whole scores at once, beside the
fp32 runtimes a user has today.

    .venv/bin/python experiments/attention_blocks.py                      # Whisper-tiny's encoder, 1,500 positions
    .venv/bin/python experiments/attention_blocks.py --model hf-whisper-encoder-long --trials-per-task 32

The model is tuned twice at the same budget, each in a fresh process and a work dir of its own: with
``LoweringOptions(attention_blocks=True)`` (scores of a few MB per block, meant to stay in the caches
between the three kernels that write and read them) and as the lowering does by default (each layer's
scores written to memory whole). Both compiled models, PyTorch eager, torch.compile, ONNX
Runtime and OpenVINO are then timed in interleaved rounds in several fresh processes
(``budget_curve.py``'s timing step), each ratio taken within one process, and each model's error
against PyTorch eager. Results: OUT/blocks.json, OUT/blocks.md; the work dirs stay under OUT/runs (a
rerun tunes nothing already tuned, and times again).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.host import cpu_model  # noqa: E402
from experiments import budget_curve  # noqa: E402
from experiments import frameworks as fw  # noqa: E402
from experiments.harness import run_step  # noqa: E402

VARIANTS = {"tuned, query blocks": True, "tuned, whole scores": False}


def tune_step(name: str, blocks: bool, trials_per_task: int, work_dir: Path, seed: int) -> dict:
    from tuner import tune
    from tuner.lowering import LoweringOptions

    module, inputs = fw.module_and_inputs(name)
    result = tune(
        module,
        example_inputs=inputs,
        trials_per_task=trials_per_task,
        lowering=LoweringOptions(attention_blocks=blocks),
        work_dir=work_dir,
        seed=seed,
    )
    artifact = result.artifact_path
    kernels = {t.name: [t.weight, t.best_latency] for t in result.tasks}
    return {"trials": result.trials, "tasks": len(result.tasks), "artifact": str(artifact), "kernels": kernels}


def _table(record: dict) -> str:
    subject = f"{record['model']} at {record['trials_per_task']} trials per task on {record['cpu']}"
    tuned = record["tuned"]
    return budget_curve.timed_table(
        subject,
        record["timing"],
        list(VARIANTS),
        lambda label: {
            "kernels": tuned.get(label, {}).get("tasks", ""),
            "trials": tuned.get(label, {}).get("trials", ""),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="hf-whisper-encoder-long", help="a model of workloads/hf_models.py")
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--out", default="experiments/results/attention_blocks")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tune-step", choices=[str(b) for b in VARIANTS.values()], help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    if args.tune_step:
        blocks = args.tune_step == "True"
        work_dir = out / "runs" / ("blocks" if blocks else "whole")
        return print(json.dumps(tune_step(args.model, blocks, args.trials_per_task, work_dir, args.seed)))

    out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__)
    tuned = {}
    for label, blocks in VARIANTS.items():
        record = out / f"tune_{'blocks' if blocks else 'whole'}.json"
        if not record.exists():
            steps = ["--model", args.model, "--trials-per-task", str(args.trials_per_task), "--out", str(out)]
            steps += ["--seed", str(args.seed), "--tune-step", str(blocks)]
            record.write_text(json.dumps(run_step(script, steps, record.with_suffix(".log"))) + "\n")
        tuned[label] = json.loads(record.read_text())
        print(f"{label}: {tuned[label]['tasks']} kernels, {tuned[label]['trials']} trials", flush=True)
    artifacts = {label: step["artifact"] for label, step in tuned.items()}
    timing = budget_curve.time_in_processes(args.model, artifacts, out)
    record = {
        "model": args.model,
        "trials_per_task": args.trials_per_task,
        "cpu": cpu_model(),
        "tuned": tuned,
        "timing": timing,
    }
    (out / "blocks.json").write_text(json.dumps(record, indent=1) + "\n")
    table = _table(record)
    (out / "blocks.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
