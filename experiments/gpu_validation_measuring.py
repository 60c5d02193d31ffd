"""experiments/gpu_validation.py's steps that measure with one shared engine: one kernel end to end
(2), the engine against serial timing (4), the L2 flush and the launch delay (5), faulting
candidates (6), NVML energy and device mapping (7)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.gpu_validation_plan import Context, StepResult
from experiments.harness import ROOT, sample_candidates
from experiments.measurement_engine import compare, copies, timed_pass


def step_one_kernel(ctx: Context) -> StepResult:
    import numpy as np

    from measure.cuda.artifact import gpu_binaries
    from measure.workers.run_job import random_arrays
    from workloads import get_workload

    workload = get_workload(ctx.plan.kernel)
    args = [[spec.dtype, list(spec.shape)] for spec in workload.inputs]
    artifact = ctx.engine.compile_program(ctx.work / "kernel.so", mod=workload.mod, kind="tir", schedules=[])
    binaries = (
        [f"{b.kind} {b.arch} {','.join(b.kernels)}" for b in gpu_binaries(artifact)] if ctx.device == "cuda" else []
    )
    samples = ctx.engine.time_program(artifact, "tir", args)
    arrays = random_arrays(args, seed=7)
    outputs = ctx.engine.run_kernel(artifact, arrays)
    expected = workload.reference(*arrays[:-1])
    error = float(np.max(np.abs(outputs[-1].astype(np.float64) - expected)) / max(1.0, float(np.max(np.abs(expected)))))
    latency = statistics.median(samples)
    ok = error < 1e-3 and (ctx.device != "cuda" or bool(binaries))
    summary = (
        f"{workload.name}: {latency * 1e3:.3f} ms ({len(samples)} samples), max relative error against NumPy "
        f"{error:.1e}"
    )
    return StepResult(
        ok,
        summary,
        {
            "latency_s": latency,
            "samples": samples,
            "max_rel_error": error,
            "gpu_binaries": binaries,
            "engine_log": ctx.engine.notes,
        },
    )


def step_engine(ctx: Context) -> StepResult:
    from measure.dop.controller import DopController

    engine = ctx.engine
    inputs = sample_candidates(ctx.plan.engine_workload, ctx.target, ctx.plan.engine_candidates, seed=1)
    builds = [b for b in engine.build(inputs) if b.ok]
    serial, serial_wall = timed_pass(engine, copies(builds, "serial"), serial=True)
    engine.dop = DopController(engine.dop.max_dop, engine.config.dop_error_threshold, engine.config.dop_check_fraction)
    parallel, parallel_wall = timed_pass(engine, copies(builds, "engine"), serial=False)
    for built in builds:
        Path(built.artifact).unlink(missing_ok=True)
    keys = sorted(k for k in serial if serial[k].ok and parallel.get(k) and parallel[k].ok)
    if len(keys) < 2:
        return StepResult(False, f"only {len(keys)} of {len(inputs)} candidates measured in both passes")
    accuracy = compare(serial, parallel, keys)
    busy = {
        name: sum(results[k].timed_seconds for k in keys) / wall
        for name, results, wall in (("serial", serial, serial_wall), ("engine", parallel, parallel_wall))
    }
    dops = [d.dop for d in engine.dop_decisions]
    summary = (
        f"{len(keys)} candidates: serial {len(keys) / serial_wall:.1f}/s, engine {len(keys) / parallel_wall:.1f}/s; "
        f"error median {accuracy['median_error']:.1%} worst {accuracy['worst_error']:.1%}; same top-1 "
        f"{accuracy['same_top1']}; "
        f"device busy {busy['serial']:.0%} serial, {busy['engine']:.0%} engine; DOP {dops}"
    )
    details = {
        "candidates": len(keys),
        "serial_per_s": len(keys) / serial_wall,
        "engine_per_s": len(keys) / parallel_wall,
        **accuracy,
        "device_busy": busy,
        "dops": dops,
    }
    if ctx.device == "cuda" and (other := other_compiler()) is not None:
        details["other_compiler"] = by_other_compiler(ctx, other, inputs, serial, keys)
        summary += f"; {describe_other_compiler(details['other_compiler'])}"
    return StepResult(bool(accuracy["same_top1"]), summary, details)


def other_compiler() -> str | None:
    """The CUDA compiler the run does not use (nvcc where it uses NVRTC, and back), where installed."""
    from measure.cuda.compile_env import choose_compile_mode, nvcc_path, nvrtc_available

    other = "nvcc" if choose_compile_mode().mode == "nvrtc" else "nvrtc"
    return other if (nvcc_path() if other == "nvcc" else nvrtc_available()) else None


def by_other_compiler(ctx: Context, other: str, inputs: list, timed: dict, keys: list[str]) -> dict:
    """The same candidates built by ``other`` (a build-only engine of its own) and timed serially by the
    run's engine: their latencies over those of the run's compiler's kernels (``timed``, serially)."""
    from common.environment import environment
    from measure import EngineConfig, MeasureEngine
    from measure.cuda.compile_env import COMPILE_MODE_ENV

    with environment({COMPILE_MODE_ENV: other}):  # handed to its build workers when it is made
        builder = MeasureEngine(ctx.target, ctx.work / f"built-by-{other}", EngineConfig(remember_dop=False))
    try:
        built = [b for b in builder.build([i for i in inputs if i.key in keys]) if b.ok]
        results, _ = timed_pass(ctx.engine, copies(built, other), serial=True)
    finally:
        builder.close()
    both = [k for k in keys if k in results and results[k].ok]
    ratios = [results[k].latency / timed[k].latency for k in both]
    if not ratios:
        return {"compiler": other, "candidates": 0}
    fastest = lambda by: min(both, key=lambda k: by[k].latency)  # noqa: E731
    return {
        "compiler": other,
        "candidates": len(both),
        "median_ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "same_top1": fastest(results) == fastest(timed),
    }


def describe_other_compiler(found: dict) -> str:
    if not found.get("candidates"):
        return f"{found['compiler']}: none of the candidates built and timed"
    low, high = found["ratio_range"]
    return (
        f"the same {found['candidates']} built by {found['compiler']}: {found['median_ratio']:.2f}x the latency "
        f"(median; {low:.2f}-{high:.2f}), same top-1 {found['same_top1']}"
    )


def step_flush(ctx: Context) -> StepResult:
    from measure import TimingConfig

    mod, args = _elementwise(ctx.plan.l2_elements)
    artifact = ctx.engine.compile_program(ctx.work / "add.so", mod=mod, kind="tir", schedules=[])
    timings = {}
    for name, flush in (("cold", True), ("warm", False)):
        timings[name] = statistics.median(
            ctx.engine.time_program(
                artifact, "tir", args, TimingConfig(flush_cache=flush, min_repeats=10, max_repeats=30)
            )
        )
    megabytes = 3 * ctx.plan.l2_elements * 4 / 2**20
    summary = (
        f"add of {megabytes:.1f} MB in all: cold {timings['cold'] * 1e6:.1f} us, warm {timings['warm'] * 1e6:.1f} us "
        f"({timings['cold'] / timings['warm']:.2f}x)"
    )
    details: dict = {"buffers_mb": megabytes, "cold_s": timings["cold"], "warm_s": timings["warm"]}
    if (
        ctx.device == "cuda"
    ):  # how much of a tiny kernel's cold time TVM's way of timing adds: the launch's host-side delay
        tiny, tiny_args = _elementwise(256)
        tiny_artifact = ctx.engine.compile_program(ctx.work / "tiny.so", mod=tiny, kind="tir", schedules=[])
        delay = ctx.engine.cold_timings(tiny_artifact, tiny_args)
        details["launch_delay"] = delay
        summary += (
            f"; a 256-element kernel cold: {delay['queued'] * 1e6:.2f} us queued behind the flush (ours), "
            f"{delay['tvm_evaluator'] * 1e6:.2f} us TVM's way: host launch delay "
            f"~{(delay['tvm_evaluator'] - delay['queued']) * 1e6:.2f} us"
        )
    return StepResult(timings["cold"] > 1.05 * timings["warm"], summary, details)


def step_faults(ctx: Context) -> StepResult:
    import faulty

    from measure import MeasureInput, Status

    if ctx.device == "cuda":
        cases = [
            (
                "illegal address",
                faulty.gpu_out_of_bounds(),
                ("IllegalAddress", "ILLEGAL_ADDRESS", "illegal memory access"),
                True,
            ),
            ("out of resources", faulty.gpu_out_of_resources(), ("OUT_OF_RESOURCES", "OutOfResources"), False),
        ]
        good = faulty.gpu_copy()
    else:
        cases = [
            ("segfault", faulty.crashing(), ("SIGSEGV",), True),
            ("impossible allocation", faulty.out_of_memory(), ("memory",), False),
        ]
        good = faulty.copy()
    engine = ctx.engine
    built = {
        b.key: b
        for b in engine.build([MeasureInput(name, mod) for name, mod, _, _ in cases] + [MeasureInput("good", good)])
    }
    rows, ok = [], True
    for name, _, reasons, replaced in cases:
        restarts = engine.worker_restarts
        (result,) = engine.measure_built([copies([built[name]], "fault")[0]], serial=True)
        (after,) = engine.measure_built(copies([built["good"]], name.replace(" ", "-")), serial=True)
        recorded = result.status in (Status.RUN_ERROR, Status.RUN_CRASH) and any(
            r in (result.error or "") for r in reasons
        )
        was_replaced = engine.worker_restarts > restarts
        ok &= recorded and after.ok and (was_replaced or not replaced)
        rows.append(
            {
                "candidate": name,
                "status": result.status,
                "error": result.error,
                "worker_replaced": was_replaced,
                "next_measured": after.ok,
            }
        )
    summary = "; ".join(
        f"{r['candidate']}: {r['status']} ({(r['error'] or '')[:70]}), replaced {r['worker_replaced']}, next ok "
        f"{r['next_measured']}"
        for r in rows
    )
    return StepResult(ok, summary, {"cases": rows})


def step_nvml(ctx: Context) -> StepResult:
    from measure import TimingConfig
    from measure.nvml import NvmlMonitor

    if ctx.device != "cuda":
        return StepResult(None, "not applicable: no GPU on a CPU target")
    monitor = NvmlMonitor()
    if not monitor.available:
        return StepResult(False, f"NVML unavailable: {monitor.unavailable}")
    from workloads import get_workload

    workload = get_workload(ctx.plan.kernel)
    args = [[spec.dtype, list(spec.shape)] for spec in workload.inputs]
    artifact = ctx.engine.compile_program(ctx.work / "energy.so", mod=workload.mod, kind="tir", schedules=[])
    busy = TimingConfig(
        flush_cache=False,
        min_repeats=5,
        max_repeats=1000,
        precision=0.0,
        budget_seconds=ctx.plan.nvml_seconds,
        min_sample_seconds=0.05,
    )
    before, started = monitor.sample(), time.monotonic()
    samples = ctx.engine.time_program(artifact, "tir", args, busy)
    after, wall = monitor.sample(), time.monotonic() - started
    energy = monitor.energy_between(before, after)
    mapping = _device_mapping()
    mapped = all(row["nvml_index"] == row["expected"] for row in mapping)
    summary = (
        f"{monitor.name}: {energy:.1f} J over {wall:.2f} s of back-to-back kernels ({energy / wall:.0f} W average, "
        f"{len(samples)} samples)"
        if energy is not None
        else f"{monitor.name}: no energy counter ({monitor.describe_missing()})"
    )
    summary += f"; CUDA_VISIBLE_DEVICES mapping {'right' if mapped else 'WRONG'} for {len(mapping)} setting(s)"
    details = {"monitor": monitor.describe(), "energy_j": energy, "wall_s": wall, "mapping": mapping}
    monitor.close()
    return StepResult(energy is not None and energy > 0 and mapped, summary, details)


def _elementwise(n: int):
    """c = a + b over ``n`` float32 elements, and its arguments."""
    from tvm import te

    a = te.placeholder((n,), name="a")
    b = te.placeholder((n,), name="b")
    c = te.compute((n,), lambda i: a[i] + b[i], name="c")
    from tuner.spaces.metaschedule import normalize_prim_func_module

    return normalize_prim_func_module(te.create_prim_func([a, b, c])), [["float32", [n]]] * 3


def _device_mapping() -> list[dict]:
    """Which NVML GPU a fresh process's monitor watches, for CUDA_VISIBLE_DEVICES set to each GPU by
    index (with CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's order) and by UUID."""
    import pynvml

    pynvml.nvmlInit()
    try:
        uuids = [
            _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()
    probe = "from measure.nvml import NvmlMonitor; m = NvmlMonitor(); print(m.index)"
    rows = []
    for index, uuid in list(enumerate(uuids))[-2:]:  # the last GPUs: the ones where index 0 would be wrong
        for visible in (str(index), uuid):
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONPATH": path}
            out = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
            )
            got = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr.strip()[-200:]
            rows.append(
                {"CUDA_VISIBLE_DEVICES": visible, "expected": index, "nvml_index": int(got) if got.isdigit() else got}
            )
    return rows


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
