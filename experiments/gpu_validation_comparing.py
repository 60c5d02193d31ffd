"""experiments/gpu_validation.py's steps that compare with what a user would run otherwise: ours
against stock MetaSchedule on the same kernels and trials (9), tuned models against PyTorch eager
and torch.compile on the same device (10). Each writes its tables beside gpu_validation.md:
vs_metaschedule.md and vs_pytorch.md."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from common.error_text import error_line
from experiments.gpu_validation_plan import Context, StepResult
from experiments.harness import markdown_table


def step_vs_metaschedule(ctx: Context) -> StepResult:
    from experiments.vs_metaschedule import TunerFailed, compare_one
    from tuner.tasks.extraction import extract_tasks
    from workloads import get_workload

    plan = ctx.plan
    out = ctx.work / "vs_metaschedule"
    out.mkdir(parents=True, exist_ok=True)
    rows, phases, failures, left_out = [], {}, {}, []
    for index, name in enumerate(plan.versus_workloads):
        if index and not ctx.allows(plan.item_seconds(9, name)):
            left_out.append(name)
            continue
        workload = get_workload(name)
        tasks = len(extract_tasks(workload, ctx.target))
        try:
            row, phases[name] = compare_one(
                workload,
                tasks,
                plan.versus_trials * tasks,
                seed=1,
                target_spec=ctx.spec,
                target=ctx.target,
                out=out,
                timing_processes=plan.timing_processes,
                deadline=_deadline(ctx),
            )
        except TunerFailed as err:
            failures[name] = {"side": err.tuner, "error": error_line(err, last=True)[:300], "log": _tail(err.log)}
            continue
        rows.append(row)
    _write_versus_tables(ctx, rows, phases, failures, left_out)
    compared = {r["workload"] for r in rows}
    # stock MetaSchedule failing on a later kernel (say, fp16 tensor cores) is a finding about it, not a failure here
    ok = plan.versus_workloads[0] in compared and all(f["side"] == "stock" for f in failures.values())
    summary = "; ".join(
        f"{r['workload']}: wall ours/stock {r['wall_ratio']:.2f} ({r['ours_wall_s']:.0f} / {r['stock_wall_s']:.0f} s), "
        f"latency ours/stock {r['latency_ratio']:.2f} ({r['ours_latency_ms']:.4f} / {r['stock_latency_ms']:.4f} ms)"
        for r in rows
    )
    summary += "".join(f"; {name}: {f['side']} FAILED ({f['error'][:120]})" for name, f in failures.items())
    summary += f"; {plan.versus_trials} trials per task each, phases in vs_metaschedule.md"
    summary += f"; left out for time: {', '.join(left_out)}" if left_out else ""
    details = {
        "trials_per_task": plan.versus_trials,
        "rows": rows,
        "phases": phases,
        "failures": failures,
        "left_out": left_out,
    }
    return StepResult(ok, summary, details)


def step_vs_pytorch(ctx: Context) -> StepResult:
    from tuner.compile.check import precision_tolerance

    missing = _why_no_torch(ctx.device)
    if missing:
        return StepResult(None, f"n/a: {missing}")
    import torch

    plan = ctx.plan
    rows, failures, left_out = [], {}, []
    for index, name in enumerate(plan.models):
        if index and not ctx.allows(plan.item_seconds(10, name)):
            left_out.append(name)
            continue
        try:
            rows.append(_model_against_pytorch(ctx, name))
        except Exception as err:  # noqa: BLE001 - one model failing must not lose the others' numbers
            failures[name] = f"{type(err).__name__}: {error_line(err, last=True)}"[:300]
        if ctx.device == "cuda":
            torch.cuda.empty_cache()  # the next model's contenders start from a free device
    tolerance = precision_tolerance(plan.model_dtype)
    _write_pytorch_tables(ctx, rows, failures, left_out)
    ok = bool(rows) and not failures and all(r["tuned_error"] <= tolerance for r in rows)
    summary = "; ".join(_model_line(r) for r in rows)
    summary += "".join(f"; {name}: FAILED ({why[:150]})" for name, why in failures.items())
    summary += f"; the tuned error's tolerance {tolerance:.0e}"
    summary += f"; left out for time: {', '.join(left_out)}" if left_out else ""
    details = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if ctx.device == "cuda" else "cpu",
        "tolerance": tolerance,
        "rows": rows,
        "failures": failures,
        "left_out": left_out,
    }
    return StepResult(ok, summary, details)


def _model_against_pytorch(ctx: Context, name: str) -> dict:
    """Tune one model, then time it beside PyTorch eager and torch.compile on the same inputs and
    device, in the plan's precision, each output checked against eager's."""
    import torch

    from experiments import frameworks as fw
    from experiments.vs_frameworks import Setting, placed
    from tuner import tune
    from tuner.runtime.compiled_model import ModelDescription

    plan = ctx.plan
    work_dir = ctx.work / "models" / name
    shutil.rmtree(work_dir, ignore_errors=True)
    result = tune(
        name, target=ctx.target, dtype=plan.model_dtype, trials=plan.model_trials, work_dir=work_dir, progress=False
    )
    setting = Setting("cuda" if ctx.device == "cuda" else "llvm", plan.model_dtype)
    module, inputs = placed(*fw.module_and_inputs(name), setting)
    description = ModelDescription.read(result.artifact_path)
    # a mixed-precision model takes its inputs in float32
    tuned_inputs = [x.to(getattr(torch, spec.dtype)) for x, spec in zip(inputs, description.inputs, strict=True)]
    precision = fw.PRECISIONS.get(setting.framework_dtype, setting.framework_dtype)
    compiling = time.monotonic()
    compiled = fw.torch_compiled(module, inputs, precision)
    compile_seconds = time.monotonic() - compiling
    contenders = [
        fw.tvm_model("tuned", result.artifact_path, description, tuned_inputs, fw.PRECISIONS.get(plan.model_dtype, "")),
        fw.torch_eager(module, inputs, precision),
        compiled,
    ]
    if contenders[0].call is None:
        raise RuntimeError(f"the tuned model does not run: {contenders[0].missing}")
    if setting.on_gpu:
        fw.synchronize_each_call(contenders)
    reference, errors = fw.errors_against_eager(contenders)
    fw.time_interleaved(contenders, rounds=plan.model_rounds, seconds_per_round=plan.model_round_seconds)
    tuned, eager = contenders[0].median, contenders[1].median
    return {
        "model": name,
        "precision": fw.PRECISIONS.get(plan.model_dtype, plan.model_dtype),
        "tasks": len(result.tasks),
        "trials": result.trials,
        "tune_s": result.wall_seconds,
        "tuned_ms": tuned * 1e3,
        "eager_ms": eager * 1e3,
        "compiled_ms": compiled.median * 1e3 if compiled.median else None,
        "tuned_error": errors["tuned"],
        "compiled_error": errors.get("torch.compile"),
        "output_scale": float(abs(reference).max()),
        "torch_compile_s": compile_seconds,
        "missing": {c.name: c.missing for c in contenders if c.missing},
        "check": result.check.line() if result.check else None,
        "phases": dict(result.seconds),
        "round_ms": {c.name: [m * 1e3 for m in c.round_medians] for c in contenders if c.call},
    }


def _model_line(row: dict) -> str:
    compiled = (
        f", torch.compile {row['compiled_ms']:.3f} (tuned/compile {row['tuned_ms'] / row['compiled_ms']:.2f})"
        if row["compiled_ms"]
        else f", torch.compile unavailable ({row['missing'].get('torch.compile', '')[:80]})"
    )
    compiled_error = f", torch.compile {row['compiled_error']:.1e}" if row["compiled_error"] is not None else ""
    return (
        f"{row['model']} {row['precision']}, {row['trials']} trials in {row['tune_s']:.0f} s: tuned "
        f"{row['tuned_ms']:.3f} ms, eager {row['eager_ms']:.3f} (tuned/eager {row['tuned_ms'] / row['eager_ms']:.2f})"
        f"{compiled}; error against eager: tuned {row['tuned_error']:.1e}{compiled_error} (outputs up to "
        f"{row['output_scale']:.2g})"
    )


def _why_no_torch(device: str) -> str | None:
    """Why PyTorch cannot run beside the tuned models on ``device`` here, or None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed here"
    if device == "cuda" and not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        return f"torch {torch.__version__} ({built}) sees no GPU"
    return None


def _deadline(ctx: Context) -> float | None:
    """When step 9's processes are killed: a minute past the run's budget (None: no budget)."""
    return None if ctx.deadline is None else ctx.deadline + 60.0


def _tail(log: Path, lines: int = 15) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []


def _write_versus_tables(ctx: Context, rows: list[dict], phases: dict, failures: dict, left_out: list[str]) -> None:
    from tuner.targets import describe_target

    text = (
        f"# Ours against stock MetaSchedule (gpu_validation.py step 9)\n\ntarget `{describe_target(ctx.target)}`, "
        f"{ctx.plan.versus_trials} trials per task each, seed 1; wall time from process start to a compiled "
        f"artifact; latency of both artifacts timed side by side ({ctx.plan.timing_processes} timing process(es)).\n\n"
    )
    if rows:
        text += markdown_table(rows, list(rows[0])) + "\n\n"
    if phases:
        by_tuner = [
            {"workload": name, "tuner": tuner, **sec} for name, both in phases.items() for tuner, sec in both.items()
        ]
        text += "Seconds by phase, each tuner's own (stock's: MetaSchedule's profiler):\n\n"
        text += _phase_table(by_tuner, ["workload", "tuner"])
    text += "".join(f"\n- {name}: {f['side']} failed: {f['error']}\n" for name, f in failures.items())
    text += f"\n- left out for time: {', '.join(left_out)}\n" if left_out else ""
    (ctx.out / "vs_metaschedule.md").write_text(text)


def _write_pytorch_tables(ctx: Context, rows: list[dict], failures: dict, left_out: list[str]) -> None:
    columns = {
        "model": "model",
        "precision": "precision",
        "tasks": "tasks",
        "trials": "trials",
        "tune_s": "tuning (s)",
        "tuned_ms": "tuned (ms)",
        "eager_ms": "PyTorch eager (ms)",
        "compiled_ms": "torch.compile (ms)",
        "tuned_error": "tuned error",
        "compiled_error": "torch.compile error",
        "output_scale": "outputs up to",
        "torch_compile_s": "torch.compile's compile (s)",
    }
    table = [{title: _cell(row[key]) for key, title in columns.items()} for row in rows]
    text = (
        f"# Tuned models against PyTorch (gpu_validation.py step 10)\n\non {ctx.device}, "
        f"{ctx.plan.model_trials} trials per model; every contender on the same device and inputs, timed in "
        f"{ctx.plan.model_rounds} interleaved rounds (median); errors: largest |output - PyTorch eager's| over "
        "eager's largest output.\n\n"
    )
    if table:
        text += markdown_table(table, list(columns.values())) + "\n\nTuning's seconds by phase:\n\n"
        text += _phase_table([{"model": r["model"], **r["phases"]} for r in rows], ["model"])
        text += "".join(f"\n- {r['model']}: {r['check']}\n" for r in rows if r["check"])
    text += "".join(f"\n- {name}: failed: {why}\n" for name, why in failures.items())
    text += f"\n- left out for time: {', '.join(left_out)}\n" if left_out else ""
    (ctx.out / "vs_pytorch.md").write_text(text)


def _phase_table(rows: list[dict], keys: list[str]) -> str:
    """Rows of seconds by phase, phases as columns (in the order first seen), "-" where a row has none."""
    phases = list(dict.fromkeys(p for row in rows for p in row if p not in keys))
    cells = [{**{k: row[k] for k in keys}, **{p: _cell(row.get(p)) for p in phases}} for row in rows]
    return markdown_table(cells, [*keys, *phases]) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1e}" if value and abs(value) < 0.01 else f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)
