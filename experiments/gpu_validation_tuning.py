"""experiments/gpu_validation.py's steps that run the tuner as a user would: `tuner doctor` (1),
tune() of a matmul (3), GEMMs tuned against torch.matmul (8)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from experiments.gpu_validation_plan import Context, StepResult


def step_doctor(ctx: Context) -> StepResult:
    from tuner.cli.doctor import run_checks, verdicts

    kind = ctx.target.kind.name
    checks = run_checks((kind,))
    blocked = verdicts(checks, (kind,))[kind]
    lines = [f"{c.status} {c.name}: {c.text}" for c in checks]
    summary = f"{kind} can be tuned here" if not blocked else f"{kind} cannot be tuned here ({', '.join(blocked)})"
    return StepResult(not blocked, summary, {"checks": lines})


def step_tune(ctx: Context) -> StepResult:
    from tuner import tune

    work_dir = ctx.work / "tune"
    shutil.rmtree(work_dir, ignore_errors=True)
    result = tune(
        ctx.plan.tune_workload, target=ctx.target, trials=ctx.plan.tune_trials, work_dir=work_dir, progress=False
    )
    task = result.tasks[0]
    decisions = [json.loads(line) for line in (work_dir / "logs" / "dop.jsonl").read_text().splitlines()]
    dops = [d["dop"] for d in decisions]
    ok = task.best_latency is not None and task.verified is True
    summary = (
        f"{result.model}: {result.trials} trials in {result.wall_seconds:.0f} s, best {task.best_latency * 1e3:.3f} ms "
        f"({task.gflops:.0f} GFLOP/s), verified {task.verified}, DOP per window {dops}"
        if task.best_latency
        else f"{result.model}: no candidate measured"
    )
    details = {
        "best_latency_s": task.best_latency,
        "gflops": task.gflops,
        "verified": task.verified,
        "latency_before_s": result.latency_before,
        "latency_after_s": result.latency_after,
        "wall_s": result.wall_seconds,
        "stop_reason": result.stop_reason,
        "dop_decisions": decisions,
        "engine_log": _read(work_dir / "logs" / "engine.log").splitlines(),
    }
    return StepResult(ok, summary, details)


def step_gemms(ctx: Context) -> StepResult:
    import numpy as np

    from measure import EngineConfig, MeasureEngine, TimingConfig
    from measure.workers.run_job import random_arrays
    from tuner import tune
    from tuner.spaces.metaschedule import normalize_prim_func_module, tensor_cores_apply
    from workloads.operators import matmul

    rows, ok, left_out = [], True, []
    for index, size in enumerate(ctx.plan.gemm_sizes):
        if index and not ctx.allows(ctx.plan.item_seconds(8, size)):
            left_out.append(size)
            continue
        func = matmul(size, size, size, ctx.plan.gemm_dtype)
        tensor_cores = tensor_cores_apply(normalize_prim_func_module(func), ctx.target)
        work_dir = ctx.work / f"gemm-{size}"
        shutil.rmtree(work_dir, ignore_errors=True)
        # Checked against NumPy below: tune()'s own check runs the unscheduled kernel on the CPU,
        # minutes for 4096^3.
        result = tune(
            func, target=ctx.target, trials=ctx.plan.gemm_trials, work_dir=work_dir, verify=False, progress=False
        )
        args = [[spec.dtype, list(spec.shape)] for spec in result.inputs]
        with MeasureEngine(
            ctx.target, work_dir / "warm", EngineConfig(build_workers=0)
        ) as engine:  # timed warm, as torch is
            ours = statistics.median(
                engine.time_program(result.artifact_path, "tir", args, TimingConfig(flush_cache=False, min_repeats=10))
            )
            arrays = random_arrays(args, seed=5)
            got = engine.run_kernel(result.artifact_path, arrays)[-1].astype(np.float32)
        expected = arrays[0].astype(np.float32) @ arrays[1].astype(np.float32)
        error = float(np.max(np.abs(got - expected)) / max(1.0, float(np.max(np.abs(expected)))))
        torch_s = _torch_matmul_seconds(size, ctx.plan.gemm_dtype, ctx.device)
        flops = 2 * size**3
        ok &= error < 1e-2
        rows.append(
            {
                "size": size,
                "dtype": ctx.plan.gemm_dtype,
                "tensor_core_rules": tensor_cores,
                "trials": result.trials,
                "ours_s": ours,
                "ours_tflops": flops / ours / 1e12,
                "torch_s": torch_s,
                "torch_tflops": flops / torch_s / 1e12 if torch_s else None,
                "max_rel_error": error,
                "tune_wall_s": result.wall_seconds,
            }
        )
    summary = "; ".join(
        f"{r['size']}^3 {r['dtype']}: ours {r['ours_tflops']:.2f} TFLOP/s"
        + (
            f", torch {r['torch_tflops']:.2f}"
            if r["torch_tflops"]
            else ", torch with CUDA not here"
            if ctx.device == "cuda"
            else ""
        )
        + f" (tensor-core rules {r['tensor_core_rules']}, error against NumPy {r['max_rel_error']:.1e})"
        for r in rows
    )
    summary += f"; left out for time: {', '.join(f'{n}^3' for n in left_out)}" if left_out else ""
    return StepResult(ok, summary, {"gemms": rows, "left_out": left_out})


def _torch_matmul_seconds(size: int, dtype: str, device: str) -> float | None:
    """torch.matmul's median seconds (CUDA events, warm) where torch with CUDA is installed; None elsewhere."""
    if device != "cuda":
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from experiments.machine_limits import torch_cuda_matmul_seconds

    return torch_cuda_matmul_seconds(size, dtype)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
