"""Fast from the first minute: each model with no trials (``tune(model, trials=0)``: every kernel with its
analytic schedule, nothing measured), from the call to a checked model, beside the same model tuned and
the runtimes a user would run instead, timed side by side in one process.

    .venv/bin/python experiments/analytic.py resnet18 bert-base mobilenetv2 --few-shot 2 4 --tuned-per-task 32

Per model: ``tune(model, trials=0)`` in a fresh process, its wall time counted from before ``import
tuner``; with ``--few-shot N ...``, the model after N trials per kernel around the analytic point (the
analytic schedule and its neighbours, measured first); with ``--tuned-per-task N``, the model tuned at N
trials per kernel (each work dir kept under OUT/runs: run again, it is resumed and measures nothing).
Per kernel, the analytic model's prediction against the kernel's time inside the trials=0 model and
against its analytic schedule measured alone (by the tuned run), and the products' fraction of peak,
go to OUT/kernels.md. Then each build timed in interleaved rounds
beside PyTorch eager, torch.compile, ONNX Runtime and OpenVINO (fp32 and its default), with each output's
error against PyTorch eager. Each build is timed in a process of its own with the other runtimes (TVM
0.27 resolves a second build of a model loaded into one process to the first one's kernels): the two
builds are compared through the runtimes timed beside both (ONNX Runtime's ratio). Writes
OUT/analytic.md and OUT/analytic.json (default OUT: experiments/results/analytic).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

STARTED = time.monotonic()  # before anything of the tuner is imported: the wall time a user waits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.host import cpu_model  # noqa: E402
from experiments.harness import markdown_table, run_step  # noqa: E402

_COLUMNS = [
    "model",
    "trials=0 wall (s)",
    "trials=0 (ms)",
    "predicted (ms)",
    "tuned (ms)",
    "trials=0 / tuned (via ONNX Runtime)",
    "tuning (min)",
    "trials=0 / best fp32 runtime",
]
FP32_RUNTIMES = ("PyTorch eager", "torch.compile", "ONNX Runtime", "OpenVINO fp32")
PREDICTION_WITHIN = 0.25  # the bar: predicted within 25% of measured


def _kernels(result) -> list[dict]:
    return [
        {
            "name": t.name,
            "weight": t.weight,
            "flops": t.flops,
            "tiled": t.tiled,
            "predicted": t.predicted_latency,
            "in_model": t.in_model_latency,
            "alone": t.analytic_latency,
            "best": t.best_latency,
            "peak_gflops": t.peak_gflops,
        }
        for t in result.tasks
    ]


def _model(name: str) -> tuple[object, dict, float]:
    """What a user would pass ``tune()`` for ``name`` (a zoo name, or a Hugging Face model of
    workloads/hf_models.py built first, as a user's own module would be), and when the clock starts:
    before ``import tuner``, after the user's module exists."""
    from workloads.hf_models import HF_MODELS

    if name not in HF_MODELS:
        return name, {}, STARTED
    module, inputs = HF_MODELS[name]()
    return module, {"example_inputs": inputs}, time.monotonic()


def step_zero(model: str, work_dir: Path, target: str) -> dict:
    subject, keywords, started = _model(model)
    from tuner import tune

    result = tune(subject, target=target, trials=0, work_dir=work_dir, progress=False, **keywords)
    return {
        "wall_s": time.monotonic() - started,
        "latency_ms": result.latency_after * 1e3,
        "predicted_ms": result.predicted_latency * 1e3 if result.predicted_latency else None,
        "error": result.check.error if result.check else None,
        "seconds": result.seconds,
        "artifact": str(result.artifact_path),
        "kernels": _kernels(result),
    }


def step_tuned(model: str, work_dir: Path, target: str, per_task: int) -> dict:
    subject, keywords, _ = _model(model)
    from tuner import tune

    result = tune(subject, target=target, trials_per_task=per_task, work_dir=work_dir, progress=False, **keywords)
    return {
        "latency_ms": result.latency_after * 1e3,
        "tuning_min": sum(v for k, v in result.seconds.items() if k not in ("start-up",)) / 60,
        "wall_s": result.wall_seconds,
        "error": result.check.error if result.check else None,
        "artifact": str(result.artifact_path),
        "kernels": _kernels(result),
    }


def step_side_by_side(model: str, builds: list[str], threads: int, rounds: int) -> dict:
    import tempfile

    import torch

    from experiments import frameworks as fw
    from tuner.runtime.compiled_model import ModelDescription

    torch.set_num_threads(threads)
    module, inputs = fw.module_and_inputs(model)
    scratch = Path(tempfile.mkdtemp(prefix="analytic-onnx-"))
    contenders = [
        fw.torch_eager(module, inputs),
        fw.torch_compiled(module, inputs),
        fw.onnx_runtime(module, inputs, threads, scratch),
    ]
    for build in builds:
        label, _, path = build.rpartition("=")
        contenders.append(fw.tvm_model(label, Path(path), ModelDescription.read(Path(path)), inputs))
    contenders += fw.openvino(module, inputs, threads)
    _, errors = fw.errors_against_eager(contenders)
    fw.time_interleaved(contenders, rounds=rounds, seconds_per_round=0.3)
    return {
        c.name: {"ms": c.median * 1e3 if c.call else None, "error": errors.get(c.name), "missing": c.missing}
        for c in contenders
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet18", "bert-base", "mobilenetv2"])
    parser.add_argument("--tuned-per-task", type=int, default=None, help="also tune each at N trials per kernel")
    parser.add_argument("--few-shot", type=int, nargs="*", default=[], help="and at these trials per kernel")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/analytic"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--target", default="llvm", help="what to compile for, e.g. 'llvm -mcpu=haswell' for an AVX2 machine's code"
    )
    parser.add_argument("--tables", action="store_true", help="rewrite the tables from OUT/analytic.json only")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        kind, model, *rest = args.step
        if kind == "zero":
            out = step_zero(model, Path(rest[0]), args.target)
        elif kind == "tuned":
            out = step_tuned(model, Path(rest[0]), args.target, int(rest[1]))
        else:
            out = step_side_by_side(model, rest, args.threads, args.rounds)
        print(json.dumps(out, default=str))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    kept = args.out / "analytic.json"
    records = json.loads(kept.read_text()) if kept.exists() else []
    if args.tables:  # the tables again from the records, nothing measured
        return _write_tables(args.out, records, f"{args.threads} threads, {args.rounds} interleaved rounds")
    labels = [_label(model, args.target) for model in args.models]
    records = [r for r in records if r["model"] not in labels]
    command = " ".join(["experiments/analytic.py", *sys.argv[1:]])
    for model in args.models:  # a rerun of some models keeps the others' records
        records.append({**_measure_model(model, args), "model": _label(model, args.target), "command": command})
        row = _table_row(records[-1])
        print(markdown_table([row], list(row)), flush=True)
    kept.write_text(json.dumps(records, indent=1, default=str))
    _write_tables(args.out, records, f"{args.threads} threads, {args.rounds} interleaved rounds")


def _write_tables(out: Path, records: list[dict], timing: str) -> None:
    """analytic.md and kernels.md, from every model's record, with the commands that measured them."""
    commands = "; ".join(
        f"`{command}`" for command in dict.fromkeys(r.get("command", "an earlier command") for r in records)
    )
    rows = [_table_row(record) for record in records]
    columns = list(dict.fromkeys(c for row in rows for c in row))  # as the rows name them: _COLUMNS first
    rows = [{column: row.get(column, "-") for column in columns} for row in rows]  # a runtime that failed: "-"
    kernel_rows, accuracy_rows = [], []
    for record in records:
        searched = [run for run in (*record["few_shot"].values(), record["tuned"]) if run]  # measured them alone
        kernel_rows.extend(_kernel_rows(record["model"], record["zero"], searched))
        accuracy_rows.append(_accuracy(record["model"], record["zero"], searched))
    (out / "analytic.md").write_text(
        f"# No trials against tuned and against other runtimes\n\n{cpu_model()}, {timing}; measured by "
        f"{commands}\n\n{markdown_table(rows, columns)}\n\n"
        f"## The analytic model's predictions (products: predicted within {PREDICTION_WITHIN:.0%})\n\n"
        f"{markdown_table(accuracy_rows, list(accuracy_rows[0]))}\n"
    )
    (out / "kernels.md").write_text(
        f"# Per kernel: predicted, measured, fraction of peak\n\n{cpu_model()}; measured by {commands}\n\n"
        f"{markdown_table(kernel_rows, list(kernel_rows[0]))}\n"
    )


def _label(model: str, target: str) -> str:
    """A model's row: its name, and the target where it is not this CPU's own."""
    return model if target == "llvm" else f"{model} @ {target}"


def _measure_model(model: str, args: argparse.Namespace) -> dict:
    """One model's builds (trials=0, few-shot, tuned), each timed in a process of its own beside the other
    runtimes."""
    runs, script = args.out / "runs", Path(__file__)
    if args.target != "llvm":  # its own work dirs and logs
        runs = runs / "".join(c if c.isalnum() else "_" for c in args.target)  # no "=": it splits a build
    target = ["--target", args.target]
    zero = run_step(script, [*target, "--step", "zero", model, str(runs / f"{model}-0")], args.out / f"{model}-0.log")
    builds = [f"trials=0={zero['artifact']}"]
    few = {}
    for per_task in args.few_shot:
        few[per_task] = run_step(
            script,
            [*target, "--step", "tuned", model, str(runs / f"{model}-few{per_task}"), str(per_task)],
            args.out / f"{model}-few{per_task}.log",
        )
        builds.append(f"{per_task}/kernel={few[per_task]['artifact']}")
    tuned = None
    if args.tuned_per_task:
        tuned_dir = runs / f"{model}-{args.tuned_per_task}"
        tuned = run_step(
            script,
            [*target, "--step", "tuned", model, str(tuned_dir), str(args.tuned_per_task)],
            args.out / f"{model}.log",
        )
        builds.append(f"tuned {args.tuned_per_task}/kernel={tuned['artifact']}")
    timed = {}
    for index, build in enumerate(builds):
        beside = run_step(script, ["--step", "side", model, build], args.out / f"{model}-side{index}.log")
        label = build.rpartition("=")[0]
        anchor = beside["ONNX Runtime"]["ms"] if beside.get("ONNX Runtime", {}).get("ms") else None
        timed[label] = {**beside[label], "onnx_runtime_ratio": beside[label]["ms"] / anchor if anchor else None}
        for name, value in beside.items():  # the other runtimes, from the trials=0 build's process
            if index == 0 and name != label and isinstance(value, dict):
                timed[name] = value
    return {"model": model, "zero": zero, "few_shot": few, "tuned": tuned, "side_by_side": timed}


def _table_row(record: dict) -> dict:
    model, zero, tuned, timed = record["model"], record["zero"], record["tuned"], record["side_by_side"]
    label = next((name for name in timed if name.startswith("tuned ")), "")  # "tuned N/kernel"
    per_task = int(label.split()[1].split("/")[0]) if label else None
    few = {int(k): v for k, v in record["few_shot"].items()}
    return {**_row(model, zero, tuned, timed, per_task), **_few_columns(few, timed, zero, tuned)}


def _row(model: str, zero: dict, tuned: dict | None, timed: dict, per_task: int | None) -> dict:
    row = {
        "model": model,
        "trials=0 wall (s)": f"{zero['wall_s']:.0f}",
        "trials=0 (ms)": f"{timed['trials=0']['ms']:.3f}",
        "predicted (ms)": f"{zero['predicted_ms']:.3f}" if zero["predicted_ms"] else "-",
        "tuned (ms)": f"{timed[f'tuned {per_task}/kernel']['ms']:.3f}" if tuned else "-",
        "trials=0 / tuned (via ONNX Runtime)": _through_onnx_runtime(timed, per_task) if tuned else "-",
        "tuning (min)": f"{tuned['tuning_min']:.1f}" if tuned else "-",
        "trials=0 / best fp32 runtime": _against_best_fp32(timed),
    }
    for name, value in timed.items():
        if value["ms"] is not None and not name.startswith("tuned"):
            row[f"{name} / trials=0"] = f"{value['ms'] / timed['trials=0']['ms']:.2f}"
            row[f"{name} error"] = f"{value['error']:.1e}" if value["error"] is not None else "-"
    return row


def _few_columns(few: dict, timed: dict, zero: dict, tuned: dict | None) -> dict:
    """Per few-shot budget: its latency against trials=0's and the tuned one's (through ONNX Runtime), and
    its wall time."""
    row = {}
    reference = timed["trials=0"].get("onnx_runtime_ratio")
    tuned_ratio = next((v.get("onnx_runtime_ratio") for k, v in timed.items() if k.startswith("tuned")), None)
    for per_task, outcome in few.items():
        ratio = timed[f"{per_task}/kernel"].get("onnx_runtime_ratio")
        row[f"{per_task}/kernel (ms)"] = f"{timed[f'{per_task}/kernel']['ms']:.3f}"
        row[f"{per_task}/kernel wall (s)"] = f"{outcome['wall_s']:.0f}"
        row[f"{per_task}/kernel / trials=0"] = f"{ratio / reference:.2f}" if ratio and reference else "-"
        row[f"{per_task}/kernel / tuned"] = f"{ratio / tuned_ratio:.2f}" if ratio and tuned_ratio else "-"
    return row


def _alone(searched: list[dict]) -> dict[str, float]:
    """Each kernel's analytic schedule measured alone, from the first search that measured it."""
    alone: dict[str, float] = {}
    for run in searched:
        for kernel in run.get("kernels", []):
            if kernel["alone"]:
                alone.setdefault(kernel["name"], kernel["alone"])
    return alone


def _kernel_rows(model: str, zero: dict, searched: list[dict]) -> list[dict]:
    alone = _alone(searched)
    best = {k["name"]: k["best"] for k in (searched[-1]["kernels"] if searched else [])}
    rows = []
    for kernel in zero["kernels"]:
        in_model, predicted, peak = kernel["in_model"], kernel["predicted"], kernel["peak_gflops"]
        rows.append(
            {
                "model": model,
                "kernel": kernel["name"],
                "x": kernel["weight"],
                "product": "yes" if kernel["tiled"] else "",
                "predicted (us)": _us(predicted),
                "in the model (us)": _us(in_model),
                "alone (us)": _us(alone.get(kernel["name"])),
                "searched alone (us)": _us(best.get(kernel["name"])),
                "trials=0 of peak": f"{kernel['flops'] / in_model / 1e9 / peak:.0%}" if in_model and peak else "-",
            }
        )
    return rows


def _accuracy(model: str, zero: dict, searched: list[dict]) -> dict:
    """How many products the analytic model predicted within PREDICTION_WITHIN, against each measurement,
    and the products' FLOP-weighted fraction of peak at trials=0."""
    products = [k for k in zero["kernels"] if k["tiled"] and k["predicted"]]
    alone = _alone(searched)

    def within(measured: dict) -> str:
        pairs = [(k["predicted"], measured[k["name"]]) for k in products if measured.get(k["name"])]
        good = sum(abs(p - m) <= PREDICTION_WITHIN * m for p, m in pairs)
        return f"{good} of {len(pairs)}" if pairs else "-"

    timed = [k for k in products if k["in_model"] and k["peak_gflops"]]
    flops = sum(k["flops"] * k["weight"] for k in timed)
    seconds = sum(k["in_model"] * k["weight"] for k in timed)
    return {
        "model": model,
        "products": len(products),
        "within, in the model": within({k["name"]: k["in_model"] for k in products}),
        "within, alone": within(alone),
        "products at trials=0, of peak": f"{flops / seconds / 1e9 / timed[0]['peak_gflops']:.0%}" if timed else "-",
    }


def _against_best_fp32(timed: dict) -> str:
    """trials=0's latency over the fastest fp32 runtime's, timed in the same process, and which it is."""
    runtimes = [(timed[name]["ms"], name) for name in FP32_RUNTIMES if (timed.get(name) or {}).get("ms")]
    if not runtimes:
        return "-"
    ms, name = min(runtimes)
    return f"{timed['trials=0']['ms'] / ms:.2f} ({name})"


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:.1f}" if seconds else "-"


def _through_onnx_runtime(timed: dict, per_task: int | None) -> str:
    zero, tuned = (
        timed["trials=0"].get("onnx_runtime_ratio"),
        timed[f"tuned {per_task}/kernel"].get("onnx_runtime_ratio"),
    )
    return f"{zero / tuned:.2f}" if zero and tuned else "-"


if __name__ == "__main__":
    main()
