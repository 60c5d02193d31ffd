"""A model's latency against minutes of tuning, beside the fp32 runtimes a user has today.

    .venv/bin/python experiments/budget_curve.py --model hf-efficientnet --minutes 6 --checkpoints 1 3 6 \
        --starts analytic random
    .venv/bin/python experiments/budget_curve.py --model hf-mobilenetv2 --minutes 15
    .venv/bin/python experiments/budget_curve.py --model hf-bert --minutes 3 --checkpoints 3 --dtype bfloat16

Per start (``analytic``: each kernel's search begins at its analytic schedule and three around it, the
default; ``random``: at random samples of its design spaces, ``tune(..., analytic_start=False)``), one run
of ``tune(..., stop=Objectives(seconds=60 * minutes))`` (no trial budget: the clock ends it, as ``tuner
tune --max-minutes`` does); the minutes count from the call, import and lowering included. Every
candidate is committed with its time, so the model as it stood after m minutes is the work dir's
database cut at that moment: for each checkpoint, a copy of the work dir keeps only the records
committed by then and ``tune()`` resumes it with no trial left to measure: it ends as a run stopped
then would (each kernel's best re-measured and verified, the model compiled and checked end to end).
Minute 0 is ``tune(..., trials=0)``: every kernel with its analytic schedule, nothing measured. Then, in
fresh processes, every checkpoint's model, PyTorch eager, torch.compile, ONNX Runtime and OpenVINO
(fp32, and its default precision for reference) are timed in interleaved rounds, each with its error
against PyTorch eager (max|out - ref| / max|ref|). Results: OUT/MODEL.json and OUT/MODEL.md; the work
dirs and the checkpoints' models stay under OUT/runs/MODEL (a rerun with the same OUT tunes and
compiles nothing already done, and times the checkpoints again).

``--dtype bfloat16`` tunes and compiles every step with ``tune(..., dtype="bfloat16")`` (bf16 operands,
fp32 accumulators) and times PyTorch's bf16 autocast beside the rest; its curve is MODEL-bfloat16 and is
summarised against OpenVINO's default precision (bf16 on a CPU with bf16 units), the runtime a bf16
user compares with. ``--cold-cache`` tunes with ``tune(..., cold_cache=True)`` (every kernel timed with its
arguments flushed), ``--scheduler round-robin`` with ``tune(..., scheduler="round-robin")``; give either an OUT
of its own, the curve's name does not say it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import frameworks as fw  # noqa: E402
from experiments.budget_curve_summary import FP32_RUNTIMES, best_fp32, write_summary  # noqa: E402
from experiments.harness import host_cpu, markdown_table, run_step  # noqa: E402

# A 2-core VM's speed, and which contender it favours, changes with where it places the threads of a
# process (cross_core.py): the timing runs in several processes, each ratio taken within one.
TIMING_PROCESSES = 3
FP32 = "float32"


# -- steps, each in a fresh process ---------------------------------------------------------------------
def tune_step(
    name: str,
    minutes: float,
    work_dir: Path,
    seed: int,
    analytic_start: bool,
    dtype: str,
    cold_cache: bool = False,
    scheduler: str = "gradient",
) -> dict:
    """The user's call: ``tune()`` with the clock alone to end it; its model exported beside the work dir, as
    the run's last checkpoint (what the user gets at the full budget is this model, not the database cut)."""
    from tuner import Objectives, tune

    module, inputs = fw.module_and_inputs(name)
    started = time.time()
    result = tune(
        module,
        example_inputs=inputs,
        stop=Objectives(seconds=60 * minutes),
        work_dir=work_dir,
        seed=seed,
        analytic_start=analytic_start,
        dtype=dtype,
        cold_cache=cold_cache,
        scheduler=scheduler,
    )
    ended = time.time()
    artifact = work_dir.parent / "final" / "model.so"
    result.export(artifact)
    return {
        "started": started,
        "ended": ended,
        "trials": result.trials,
        "tasks": len(result.tasks),
        "untuned_latency": result.latency_before,
        "tuned_latency": result.latency_after,
        "artifact": str(artifact),
    }


def compile_step(
    name: str, work_dir: Path, cutoff: float, artifact: Path, seed: int, dtype: str, cold_cache: bool = False
) -> dict:
    """The model as a run stopped at ``cutoff`` would have handed it back: a copy of ``work_dir``
    holding only the records committed by then, resumed by ``tune()`` with that many trials, so it
    measures nothing new and does what the end of a run does (re-measure each kernel's best, verify
    it, compile, check the model end to end)."""
    from tuner import tune
    from tuner.database.workdir import DATABASE_FILE

    cut = artifact.parent / "work"
    shutil.rmtree(cut, ignore_errors=True)
    cut.mkdir(parents=True)
    shutil.copy(work_dir / DATABASE_FILE, cut / DATABASE_FILE)
    with sqlite3.connect(cut / DATABASE_FILE) as conn:
        conn.execute("DELETE FROM records WHERE created > ?", (cutoff,))
        (kept,) = conn.execute("SELECT COUNT(*) FROM records").fetchone()
    if not kept:  # still importing and lowering then: nothing to compile but TVM's defaults
        shutil.rmtree(cut)
        return {"records": 0}
    module, inputs = fw.module_and_inputs(name)
    result = tune(
        module, example_inputs=inputs, trials=kept, work_dir=cut, seed=seed, dtype=dtype, progress=False,
        cold_cache=cold_cache,
    )  # fmt: skip
    result.export(artifact)
    shutil.rmtree(cut)
    return {"records": kept, "trials": result.trials, "latency": result.latency_after}


def zero_step(name: str, artifact: Path, dtype: str) -> dict:
    """Minute 0: the model with every kernel's analytic schedule, nothing measured."""
    from tuner import tune

    module, inputs = fw.module_and_inputs(name)
    started = time.monotonic()
    work = artifact.parent / "work"
    result = tune(module, example_inputs=inputs, trials=0, work_dir=work, dtype=dtype, progress=False)
    result.export(artifact)
    return {"records": 0, "wall_s": time.monotonic() - started, "latency": result.latency_after}


def time_step(name: str, artifacts: dict[str, str], threads: int, scratch: Path, dtype: str) -> dict:
    import torch

    from tuner.runtime.compiled_model import ModelDescription

    torch.set_num_threads(threads)
    module, inputs = fw.module_and_inputs(name)
    module = module.eval()
    contenders = [
        *(
            fw.tvm_model(label, Path(p), ModelDescription.read(Path(p)), inputs, fw.PRECISIONS[dtype])
            for label, p in artifacts.items()
        ),
        fw.torch_eager(module, inputs),
        *([fw.torch_autocast(module, inputs, dtype)] if dtype != FP32 else []),
        fw.torch_compiled(module, inputs),
        fw.onnx_runtime(module, inputs, threads, scratch),
        *fw.openvino(module, inputs, threads),
    ]
    reference, errors = fw.errors_against_eager(contenders)
    fw.time_interleaved(contenders, rounds=8, seconds_per_round=0.3)
    return {
        "latency": {c.name: c.median for c in contenders},
        "rounds": {c.name: c.round_medians for c in contenders if c.call},
        "precision": {c.name: c.precision for c in contenders},
        "missing": {c.name: c.missing for c in contenders if c.missing},
        "errors": errors,
        "output_scale": float(abs(reference).max()),
    }


# -- the experiment -------------------------------------------------------------------------------------
def median_latencies(runs: list[dict]) -> dict:
    names = [n for n, v in runs[0]["latency"].items() if v]
    return {n: statistics.median(r["latency"][n] for r in runs) for n in names}


def median_ratios(runs: list[dict]) -> dict:
    """Each contender's latency over the best fp32 runtime's in the same process, median over processes."""
    names = [n for n, v in runs[0]["latency"].items() if v]
    ratios = {n: [r["latency"][n] / r["latency"][best_fp32(r["latency"])] for r in runs] for n in names}
    return {n: statistics.median(values) for n, values in ratios.items()}


def time_in_processes(model: str, artifacts: dict[str, str], out: Path, dtype: str = FP32) -> dict:
    """The compiled ``artifacts`` (label: library) and the runtimes timed in ``TIMING_PROCESSES`` fresh
    processes: each contender's median latency and median ratio to the best fp32 runtime over them."""
    steps = ["--model", model, "--out", str(out), "--dtype", dtype, "--time-step", json.dumps(artifacts)]
    runs = [run_step(Path(__file__), steps, out / f"time{i}.log") for i in range(TIMING_PROCESSES)]
    return {**runs[-1], "latency": median_latencies(runs), "ratio": median_ratios(runs), "processes": runs}


def timed_table(subject: str, timed: dict, tuned: Sequence[str], columns: Callable[[str], dict]) -> str:
    """A markdown table of ``time_in_processes``'s result: the ``tuned`` contenders (with ``columns`` of
    their own), then the runtimes, under a line on ``subject`` and how it was timed."""
    rows = []
    for label in [*tuned, *FP32_RUNTIMES, *_lower_precision(timed), fw.OPENVINO_DEFAULT]:
        latency = timed["latency"].get(label)
        rows.append(
            {
                "what": label,
                **columns(label),
                "ms": f"{latency * 1e3:.2f}" if latency else timed["missing"].get(label, "-"),
                "/ best fp32": f"{timed['ratio'][label]:.2f}" if latency else "",
                "precision": timed["precision"].get(label) or "",
                "error": f"{timed['errors'][label]:.1e}" if label in timed["errors"] else "",
            }
        )
    head = (
        f"{subject}; median of {len(timed['processes'])} timing processes, each ratio to the best fp32 runtime "
        f"({best_fp32(timed['latency'])} here) taken within one; errors against PyTorch eager, output scale "
        f"{timed['output_scale']:.2g}"
    )
    return head + "\n\n" + markdown_table(rows, list(rows[0])) + "\n"


def _table(curve: dict) -> str:
    runs = ", ".join(f"{run['trials']} trials from the {start} start" for start, run in curve["tune"].items())
    subject = (
        f"{curve['model']}{_in_dtype(curve)}: {next(iter(curve['tune'].values()))['tasks']} kernels, tuned "
        f"{curve['minutes']:g} minutes ({runs}) on {curve['cpu']} ({curve['threads']} threads); trials=0 "
        f"compiled and checked in {curve['zero']['wall_s']:.0f} s"
    )
    points = curve["checkpoints"]
    return timed_table(
        subject,
        curve["timing"],
        list(points),
        lambda label: {"trials so far": points.get(label, {}).get("records", "")},
    )


STARTS = {"analytic": True, "random": False}  # a start: tune()'s analytic_start


def _lower_precision(timed: dict) -> list[str]:
    """The timed runtimes that are neither ours, nor an fp32 runtime, nor OpenVINO's default: PyTorch's
    autocast in a bf16 curve."""
    return [n for n in timed["latency"] if n.endswith("(autocast)")]


def _in_dtype(curve: dict) -> str:
    dtype = curve.get("dtype", FP32)
    return "" if dtype == FP32 else f" in {dtype}"


def _label(start: str, minute: float) -> str:
    return f"tuned {minute:g} min" + ("" if start == "analytic" else f", {start} start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", nargs="+", default=["hf-efficientnet"], help="models of workloads/hf_models.py or the zoo, in turn"
    )
    parser.add_argument("--minutes", type=float, default=15.0, help="the tuning's wall-clock limit (default 15)")
    parser.add_argument("--checkpoints", type=float, nargs="*", help="minutes to compile at (default: 5 points)")
    parser.add_argument(
        "--starts", nargs="+", choices=list(STARTS), default=["analytic"], help="where each kernel's search starts"
    )
    parser.add_argument("--out", default="experiments/results/budget_curve")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dtype", default=FP32, choices=(FP32, "bfloat16"), help="tune(dtype=...) (default float32)")
    parser.add_argument(
        "--cold-cache", action="store_true", help="tune(cold_cache=True): kernels timed with their arguments flushed"
    )
    parser.add_argument(
        "--scheduler", default="gradient", choices=("gradient", "round-robin"), help="tune(scheduler=...)"
    )
    parser.add_argument("--summary", action="store_true", help="rewrite OUT/summary.md from OUT's curves only")
    parser.add_argument("--tune-step", choices=list(STARTS), help=argparse.SUPPRESS)
    parser.add_argument("--compile-step", nargs=3, metavar=("START", "CUTOFF", "ARTIFACT"), help=argparse.SUPPRESS)
    parser.add_argument("--zero-step", help=argparse.SUPPRESS)
    parser.add_argument("--time-step", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out).resolve()
    model, threads = args.model[0], os.cpu_count() or 1  # a step is one model's
    runs = out / "runs" / curve_name(model, args.dtype)
    if args.tune_step:
        work = runs / args.tune_step / "work"
        start = STARTS[args.tune_step]
        step = tune_step(model, args.minutes, work, args.seed, start, args.dtype, args.cold_cache, args.scheduler)
        return print(json.dumps(step))
    if args.compile_step:
        start, cutoff, artifact = args.compile_step
        work = runs / start / "work"
        cut = compile_step(model, work, float(cutoff), Path(artifact), args.seed, args.dtype, args.cold_cache)
        return print(json.dumps(cut))
    if args.zero_step:
        return print(json.dumps(zero_step(model, Path(args.zero_step), args.dtype)))
    if args.time_step:
        with tempfile.TemporaryDirectory(prefix="budget-curve-") as scratch:  # ONNX Runtime's export
            artifacts = json.loads(args.time_step)
            return print(json.dumps(time_step(model, artifacts, threads, Path(scratch), args.dtype)))
    for model in [] if args.summary else args.model:
        try:
            curve = measure_curve(model, args, out, threads)
        except (RuntimeError, KeyError) as err:  # one model's failure (its step's log says why) ends no other's
            print(f"{model}: not measured: {err}", flush=True)
            continue
        name = curve_name(model, args.dtype)
        (out / f"{name}.json").write_text(json.dumps(curve, indent=1) + "\n")
        table = _table(curve)
        (out / f"{name}.md").write_text(table)
        print(table, flush=True)
    write_summary(out)


def measure_curve(model: str, args: argparse.Namespace, out: Path, threads: int) -> dict:
    """One model: trials=0, each start's run cut at the checkpoints, all timed beside the runtimes."""
    runs, script = out / "runs" / curve_name(model, args.dtype), Path(__file__)
    fixed = ["--model", model, "--out", str(out), "--dtype", args.dtype, "--scheduler", args.scheduler]
    fixed += ["--cold-cache"] if args.cold_cache else []
    zero_artifact = runs / "zero" / "model.so"
    zero = _once(zero_artifact.parent / "point.json", script, [*fixed, "--zero-step", str(zero_artifact)])
    points = {"trials=0": {"minute": 0, **zero, "artifact": str(zero_artifact)}}
    tuned = {}
    for start in args.starts:
        steps = [*fixed, "--minutes", str(args.minutes), "--seed", str(args.seed), "--tune-step", start]
        tuned[start] = _once(runs / start / "tune.json", script, steps)
        for minute in args.checkpoints or [args.minutes * k / 5 for k in range(1, 6)]:
            label, artifact = _label(start, minute), runs / start / f"at_{minute:g}min" / "model.so"
            if minute >= args.minutes and "artifact" in tuned[start]:  # the run's own model: what the user got
                run = tuned[start]
                points[label] = {"minute": minute, "records": run["trials"], "latency": run["tuned_latency"]}
                points[label]["artifact"] = run["artifact"]
                continue
            cutoff = str(tuned[start]["started"] + 60 * minute)
            steps = [*fixed, "--seed", str(args.seed), "--compile-step", start, cutoff, str(artifact)]
            step = _once(artifact.parent / "point.json", script, steps)
            points[label] = {"minute": minute, **step, "artifact": str(artifact)}
            print(f"{model} {label}: {step['records']} trials, compiled", flush=True)
    artifacts = {label: point["artifact"] for label, point in points.items() if point["records"] or label == "trials=0"}
    return {
        "model": model,
        "dtype": args.dtype,
        "cold_cache": args.cold_cache,
        "scheduler": args.scheduler,
        "minutes": args.minutes,
        "cpu": host_cpu(),
        "threads": threads,
        "zero": zero,
        "tune": tuned,
        "checkpoints": points,
        "timing": time_in_processes(model, artifacts, out, args.dtype),
    }


def curve_name(model: str, dtype: str) -> str:
    """A curve's file and run-folder name: the model's, with the dtype after it where not fp32."""
    return model if dtype == FP32 else f"{model}-{dtype}"


def _once(record: Path, script: Path, steps: list[str]) -> dict:
    """A step's result, run in a fresh process the first time and read back from ``record`` after."""
    if not record.exists():
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(run_step(script, steps, record.with_suffix(".log"))) + "\n")
    else:  # a rerun after a change to the tuner would time the old step's models without it
        print(f"{record.parent}: this step's earlier result, reused (remove the folder to run it again)", flush=True)
    return json.loads(record.read_text())


if __name__ == "__main__":
    main()
