"""Fast from the first minute: each model with no trials (``tune(model, trials=0)``: every kernel with its
analytic schedule, nothing measured), from the call to a checked model, beside the same model tuned and
the runtimes a user would run instead, timed side by side in one process.

    .venv/bin/python experiments/analytic.py resnet18 bert-base mobilenetv2 --few-shot 2 4 --tuned-per-task 32
    .venv/bin/python experiments/analytic.py resnet18 hf-bert --dtype bfloat16      # bf16 builds, beside OpenVINO's
    .venv/bin/python experiments/analytic.py resnet18 --target "llvm -mcpu=haswell" --tuned-per-task 32   # AVX2 code
    .venv/bin/python experiments/analytic.py resnet18 --keep-searched   # trials=0 again, the tuned record kept

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

from experiments.analytic_tables import table_row, write_tables  # noqa: E402
from experiments.harness import host_cpu, markdown_table, run_step  # noqa: E402


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


def step_zero(model: str, work_dir: Path, target: str, dtype: str) -> dict:
    subject, keywords, started = _model(model)
    from tuner import tune

    result = tune(subject, target=target, dtype=dtype, trials=0, work_dir=work_dir, progress=False, **keywords)
    return {
        "wall_s": time.monotonic() - started,
        "latency_ms": result.latency_after * 1e3,
        "predicted_ms": result.predicted_latency * 1e3 if result.predicted_latency else None,
        "machine_speed": result.machine_speed,
        "error": result.check.error if result.check else None,
        "seconds": result.seconds,
        "artifact": str(result.artifact_path),
        "kernels": _kernels(result),
    }


def step_tuned(model: str, work_dir: Path, target: str, dtype: str, per_task: int) -> dict:
    subject, keywords, _ = _model(model)
    from tuner import tune

    result = tune(
        subject, target=target, dtype=dtype, trials_per_task=per_task, work_dir=work_dir, progress=False, **keywords
    )
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
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="tune(dtype=...)")
    parser.add_argument(
        "--repredict", action="store_true", help="the recorded models' kernels predicted again by today's model"
    )
    parser.add_argument("--tables", action="store_true", help="rewrite the tables from OUT/analytic.json only")
    parser.add_argument(
        "--keep-searched",
        action="store_true",
        help="measure trials=0 again (with its runtimes); keep the record's few-shot and tuned runs as measured",
    )
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        kind, model, *rest = args.step
        if kind == "zero":
            out = step_zero(model, Path(rest[0]), args.target, args.dtype)
        elif kind == "predict":
            out = step_predict(model, args.target, args.dtype)
        elif kind == "tuned":
            out = step_tuned(model, Path(rest[0]), args.target, args.dtype, int(rest[1]))
        else:
            out = step_side_by_side(model, rest, args.threads, args.rounds)
        print(json.dumps(out, default=str))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    kept = args.out / "analytic.json"
    records = json.loads(kept.read_text()) if kept.exists() else []
    cpu = host_cpu()
    if args.repredict:  # nothing measured: the kernels are lowered again and predicted
        for record in records:
            if "@" not in record["model"] and record["cpu"] == cpu:  # this CPU's, for its own target
                _repredict(record, args.out)
        kept.write_text(json.dumps(records, indent=1, default=str))
    if args.tables or args.repredict:  # the tables again from the records, nothing measured
        return write_tables(args.out, records, f"{args.threads} threads, {args.rounds} interleaved rounds")
    command = " ".join(["experiments/analytic.py", *sys.argv[1:]])
    failed = []
    for model in args.models:  # a rerun of some models keeps the others' records
        earlier = next((r for r in records if (r["model"], r["cpu"]) == (_label(model, args), cpu)), None)
        searched = earlier if args.keep_searched else None
        try:
            measured = _measure_model(model, args, searched)
        except RuntimeError as err:  # a step that failed (its log named): the other models are still measured
            failed.append(model)
            print(f"{model}: {err}", file=sys.stderr, flush=True)
            continue
        by = f"{searched['command']}; trials=0 again by {command}" if searched else command
        record = {**measured, "model": _label(model, args), "cpu": cpu, "command": by}
        records = [r for r in records if (r["model"], r["cpu"]) != (record["model"], cpu)] + [record]
        row = table_row(record)
        print(markdown_table([row], list(row)), flush=True)
        kept.write_text(json.dumps(records, indent=1, default=str))  # each model kept as soon as it is measured
    write_tables(args.out, records, f"{args.threads} threads, {args.rounds} interleaved rounds")
    if failed:
        raise SystemExit(f"analytic.py: {', '.join(failed)} failed (above); the others' records are kept")


def _repredict(record: dict, out: Path) -> None:
    """``record``'s kernels predicted again by the analytic model as it is now (their measurements kept),
    said in the record with the commit that predicted them."""
    import subprocess

    model, _, dtype = record["model"].partition(" ")  # "resnet18", "resnet18 bfloat16"
    step = ["--dtype", dtype or "float32", "--step", "predict", model]
    predicted = run_step(Path(__file__), step, out / f"{model}{dtype and '-' + dtype}-predict.log")
    for kernel in record["zero"]["kernels"]:
        kernel["predicted"], kernel["tiled"] = predicted.get(kernel["name"], (kernel["predicted"], kernel["tiled"]))
    kernels = record["zero"]["kernels"]
    if all(k["predicted"] for k in kernels):
        record["zero"]["predicted_ms"] = sum(k["predicted"] * k["weight"] for k in kernels) * 1e3
    last_change = ["git", "log", "-1", "--format=%h", "--", "tuner/spaces"]  # of the model: its code's last commit
    revision = subprocess.run(last_change, capture_output=True, text=True).stdout.strip()
    record["predicted_by"] = f"the analytic model of {revision}"


def step_predict(model: str, target_text: str, dtype: str) -> dict[str, tuple[float, bool]]:
    """Each kernel of ``model`` (lowered as tune() lowers it) predicted by the analytic model, by name, with
    whether the model counts it a product (``AnalyticSchedule.product``)."""
    from tuner.spaces.analytic import configure_kernel
    from tuner.spaces.prediction import predict_kernel
    from tuner.targets import resolve_target

    target = resolve_target(target_text)
    predicted = {}
    for task in model_tasks(model, target, dtype):
        configured = configure_kernel(task.mod, target)
        if configured is not None:
            predicted[task.name] = (predict_kernel(task.mod, task.flops, configured, target), configured.product)
    return predicted


def model_tasks(model: str, target, dtype: str = "float32") -> list:
    """The kernels (``Task``) of a model of ``_model``'s, lowered for ``target`` as tune() lowers it."""
    from tuner.lowering import LoweringOptions
    from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

    subject, keywords, _ = _model(model)
    workload = load_model(subject, keywords.get("example_inputs"), dtype=dtype)
    lowering = LoweringOptions(bfloat16=workload.precision == "bfloat16")
    return extract_tasks(workload, target, lower_workload(workload, target, lowering))


def _label(model: str, args: argparse.Namespace) -> str:
    """A model's row: its name, its precision where not fp32, and the target where it is not this CPU's own."""
    label = model if args.dtype == "float32" else f"{model} {args.dtype}"
    return label if args.target == "llvm" else f"{label} @ {args.target}"


def _variant(args: argparse.Namespace) -> str:
    """Where a model's work dirs and logs go beside the fp32 ones for this CPU's own target: "" for those."""
    parts = [args.dtype] if args.dtype != "float32" else []
    text = "_".join(parts + ([args.target] if args.target != "llvm" else []))
    return "".join(c if c.isalnum() else "_" for c in text)  # no "=": it splits a build


def _measure_model(model: str, args: argparse.Namespace, earlier: dict | None = None) -> dict:
    """One model's builds (trials=0, few-shot, tuned), each timed in a process of its own beside the other
    runtimes; with an ``earlier`` record, trials=0 only, the searched builds and their timings kept from it
    (compared through the ONNX Runtime timed beside each, as always)."""
    runs, script, variant = args.out / "runs", Path(__file__), _variant(args)
    runs, logs = (runs / variant, args.out / variant) if variant else (runs, args.out)
    logs.mkdir(parents=True, exist_ok=True)
    target = ["--target", args.target, "--dtype", args.dtype]
    zero = run_step(script, [*target, "--step", "zero", model, str(runs / f"{model}-0")], logs / f"{model}-0.log")
    builds = [f"trials=0={zero['artifact']}"]
    if earlier is not None:
        timed = _timed_beside(model, builds, script, logs)
        kept = {label: value for label, value in earlier["side_by_side"].items() if label.endswith("/kernel")}
        return {**earlier, "zero": zero, "side_by_side": {**timed, **kept}}
    few = {}
    for per_task in args.few_shot:
        few[per_task] = run_step(
            script,
            [*target, "--step", "tuned", model, str(runs / f"{model}-few{per_task}"), str(per_task)],
            logs / f"{model}-few{per_task}.log",
        )
        builds.append(f"{per_task}/kernel={few[per_task]['artifact']}")
    tuned = None
    if args.tuned_per_task:
        tuned_dir = runs / f"{model}-{args.tuned_per_task}"
        tuned = run_step(
            script,
            [*target, "--step", "tuned", model, str(tuned_dir), str(args.tuned_per_task)],
            logs / f"{model}.log",
        )
        builds.append(f"tuned {args.tuned_per_task}/kernel={tuned['artifact']}")
    return {
        "model": model,
        "zero": zero,
        "few_shot": few,
        "tuned": tuned,
        "side_by_side": _timed_beside(model, builds, script, logs),
    }


def _timed_beside(model: str, builds: list[str], script: Path, logs: Path) -> dict:
    """Each build timed in a process of its own beside the other runtimes, compared through ONNX Runtime's."""
    timed = {}
    for index, build in enumerate(builds):
        beside = run_step(script, ["--step", "side", model, build], logs / f"{model}-side{index}.log")
        label = build.rpartition("=")[0]
        anchor = beside["ONNX Runtime"]["ms"] if beside.get("ONNX Runtime", {}).get("ms") else None
        timed[label] = {**beside[label], "onnx_runtime_ratio": beside[label]["ms"] / anchor if anchor else None}
        timed[label]["beside"] = {  # the runtimes timed in this build's own process
            name: value for name, value in beside.items() if name != label and isinstance(value, dict)
        }
        for name, value in beside.items():  # the other runtimes, from the trials=0 build's process
            if index == 0 and name != label and isinstance(value, dict):
                timed[name] = value
    return timed


if __name__ == "__main__":
    main()
