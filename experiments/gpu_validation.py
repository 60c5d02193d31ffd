"""Prove (or disprove) the GPU path in one command: the first thing to run when a GPU is lent.

    python experiments/gpu_validation.py                         # one GPU: about 10 minutes on an H100
    python experiments/gpu_validation.py --target llvm --quick   # the same code on a CPU, in under a minute

Eight steps, each recorded with its verdict, numbers and time, a failing one does not stop the rest:
  1. `tuner doctor` for the target;
  2. one kernel built, loaded in a runtime-only measuring worker, timed, checked against NumPy;
  3. tune() of a matmul (matmul-1024, 64 trials on a GPU), verified, with its DOP decisions;
  4. the measurement-engine experiment on real candidates: serial against the engine (throughput,
     median and worst error, top-1 agreement, share of wall time the device spent in timed calls);
  5. caches flushed and not on a kernel whose inputs fit in the L2 (cold must be slower), and on a
     GPU the launch's host-side delay: a tiny kernel timed cold the tuner's way and TVM's way;
  6. candidates that fault (GPU: an illegal address, too many registers for their launch; CPU: a
     segfault, an impossible allocation): recorded with their reason, the worker replaced where
     the fault poisons it, the next candidate measured;
  7. NVML: the energy of about 2 s of kernels, and which GPU NVML watches under CUDA_VISIBLE_DEVICES;
  8. fp16 GEMMs (1024^3 and 4096^3 on a GPU) tuned, against torch.matmul (cuBLAS) where torch has CUDA.
Writes DIR/gpu_validation.json and DIR/gpu_validation.md (default DIR: experiments/results/gpu_validation)
after every step; with --steps, steps an earlier run recorded there are kept, so that runs of a few
steps each add up to one table.
Needs only Python, the project and its dependencies (torch optional).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # faulty.py: the project's failing kernels (plain TVM, no pytest)

from experiments.common import markdown_table, sample_candidates  # noqa: E402
from experiments.measurement_engine import compare, copies, timed_pass  # noqa: E402
from measure.error_text import error_line  # noqa: E402


@dataclass(frozen=True)
class Plan:
    """Sizes of each step for a target and mode."""

    kernel: str  # step 2
    tune_workload: str  # step 3
    tune_trials: int
    engine_workload: str  # step 4
    engine_candidates: int
    l2_elements: int  # step 5: per buffer of a three-buffer elementwise kernel that fits in the L2
    nvml_seconds: float  # step 7
    gemm_sizes: tuple[int, ...]  # step 8
    gemm_dtype: str
    gemm_trials: int


PLANS = {
    ("cuda", False): Plan(
        "matmul-1024", "matmul-1024", 64, "matmul-1024", 64, 1 << 21, 2.0, (1024, 4096), "float16", 64
    ),
    ("cuda", True): Plan("matmul-512", "matmul-512", 16, "matmul-512", 16, 1 << 20, 1.0, (1024,), "float16", 16),
    ("llvm", False): Plan("matmul-512", "matmul-512", 64, "matmul-512", 32, 1 << 16, 0.0, (256,), "float32", 32),
    ("llvm", True): Plan("matmul-128", "matmul-128", 8, "matmul-128", 8, 1 << 14, 0.0, (64,), "float32", 8),
}


@dataclass
class StepResult:
    ok: bool | None  # None: not applicable here
    summary: str
    details: dict = field(default_factory=dict)


@dataclass
class Context:
    target: object  # tvm.target.Target
    device: str  # "cuda" or "cpu"
    plan: Plan
    out: Path
    engine: object = None  # the MeasureEngine steps 2 and 4-7 share


def step_doctor(ctx: Context) -> StepResult:
    from tuner.doctor import run_checks, verdicts

    kind = ctx.target.kind.name
    checks = run_checks((kind,))
    blocked = verdicts(checks, (kind,))[kind]
    lines = [f"{c.status} {c.name}: {c.text}" for c in checks]
    summary = f"{kind} can be tuned here" if not blocked else f"{kind} cannot be tuned here ({', '.join(blocked)})"
    return StepResult(not blocked, summary, {"checks": lines})


def step_one_kernel(ctx: Context) -> StepResult:
    import numpy as np

    from measure.cuda_artifact import gpu_binaries
    from measure.run_job import random_arrays
    from workloads import get_workload

    workload = get_workload(ctx.plan.kernel)
    args = [[spec.dtype, list(spec.shape)] for spec in workload.inputs]
    artifact = ctx.engine.compile_program(ctx.out / "work" / "kernel.so", mod=workload.mod, kind="tir", schedules=[])
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


def step_tune(ctx: Context) -> StepResult:
    from tuner import tune

    work_dir = ctx.out / "work" / "tune"
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


def step_engine(ctx: Context) -> StepResult:
    from measure.dop import DopController

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
    return StepResult(bool(accuracy["same_top1"]), summary, details)


def step_flush(ctx: Context) -> StepResult:
    from measure import TimingConfig

    mod, args = _elementwise(ctx.plan.l2_elements)
    artifact = ctx.engine.compile_program(ctx.out / "work" / "add.so", mod=mod, kind="tir", schedules=[])
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
        tiny_artifact = ctx.engine.compile_program(ctx.out / "work" / "tiny.so", mod=tiny, kind="tir", schedules=[])
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
    artifact = ctx.engine.compile_program(ctx.out / "work" / "energy.so", mod=workload.mod, kind="tir", schedules=[])
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


def step_gemms(ctx: Context) -> StepResult:
    import numpy as np

    from measure import EngineConfig, MeasureEngine, TimingConfig
    from measure.run_job import random_arrays
    from tuner import tune
    from tuner.metaschedule import normalize_prim_func_module, tensor_cores_apply
    from workloads.operators import matmul

    rows, ok = [], True
    for size in ctx.plan.gemm_sizes:
        func = matmul(size, size, size, ctx.plan.gemm_dtype)
        tensor_cores = tensor_cores_apply(normalize_prim_func_module(func), ctx.target)
        work_dir = ctx.out / "work" / f"gemm-{size}"
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
    return StepResult(ok, summary, {"gemms": rows})


STEPS: list[tuple[int, str, Callable[[Context], StepResult]]] = [
    (1, "tuner doctor", step_doctor),
    (2, "one kernel: build, runtime-only worker, time, NumPy check", step_one_kernel),
    (3, "tune() a matmul, verified, DOP decisions", step_tune),
    (4, "measurement engine against serial", step_engine),
    (5, "L2 flush on and off; launch delay", step_flush),
    (6, "faulting candidates", step_faults),
    (7, "NVML energy and device mapping", step_nvml),
    (8, "GEMMs tuned against torch.matmul", step_gemms),
]
_USES_SHARED_ENGINE = {2, 4, 5, 6, 7}


def _elementwise(n: int):
    """c = a + b over ``n`` float32 elements, and its arguments."""
    from tvm import te

    a = te.placeholder((n,), name="a")
    b = te.placeholder((n,), name="b")
    c = te.compute((n,), lambda i: a[i] + b[i], name="c")
    from tuner.metaschedule import normalize_prim_func_module

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


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def run_step(number: int, name: str, step: Callable[[Context], StepResult], ctx: Context) -> dict:
    print(f"[{number}/8] {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result = step(ctx)
    except Exception as err:  # noqa: BLE001 - a failing step is a finding; the others still run
        traceback.print_exc()
        why = f"{type(err).__name__}: {error_line(err, last=True)}"[:300]
        result = StepResult(False, why, {"traceback": traceback.format_exc()})
    seconds = time.monotonic() - started
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}[result.ok]
    print(f"[{number}/8] {verdict} in {seconds:.0f} s: {result.summary}", file=sys.stderr, flush=True)
    return {
        "step": number,
        "name": name,
        "ok": result.ok,
        "verdict": verdict,
        "seconds": seconds,
        "summary": result.summary,
        "details": result.details,
    }


def environment(ctx: Context) -> dict:
    import tvm

    from tuner.targets import describe_target

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    gpu = ctx.engine.gpu_name() if ctx.engine is not None else None
    return {
        "host": platform.node(),
        "target": describe_target(ctx.target),
        "gpu": gpu,
        "tvm": tvm.__version__,
        "commit": commit,
        "python": platform.python_version(),
    }


def earlier_steps(out: Path, rerun: set[int]) -> list[dict]:
    """Steps an earlier run recorded in ``out`` that this run does not repeat: runs of a few steps
    each (``--steps``, where one command may last only so long) add up to one table."""
    try:
        recorded = json.loads((out / "gpu_validation.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return []
    return [s for s in recorded if s["step"] not in rerun]


def write_outputs(out: Path, env: dict, steps: list[dict], wall: float) -> str:
    rows = [
        {
            "step": s["step"],
            "check": s["name"],
            "verdict": s["verdict"],
            "seconds": f"{s['seconds']:.0f}",
            "result": s["summary"].replace("|", "/"),
        }
        for s in steps
    ]
    table = markdown_table(rows, ["step", "check", "verdict", "seconds", "result"])
    passed = sum(s["ok"] is True for s in steps)
    header = (
        f"GPU validation on {env['target']} ({env['gpu'] or 'no GPU'}), {env['host']}, commit {env['commit']}, TVM "
        f"{env['tvm']}: {passed} of {len(steps)} steps passed in {wall:.0f} s."
    )
    (out / "gpu_validation.md").write_text(header + "\n\n" + table + "\n")
    (out / "gpu_validation.json").write_text(
        json.dumps({"environment": env, "wall_s": wall, "steps": steps}, indent=1, default=str)
    )
    return header + "\n\n" + table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--target", default="cuda", help="'cuda' (the GPU here), 'cuda -arch=sm_90', 'llvm', ... (default: cuda)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and budgets (CI runs --target llvm --quick)")
    parser.add_argument(
        "--steps", type=lambda text: {int(s) for s in text.split(",")}, help="only these steps, e.g. 1,2,6"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "gpu_validation")
    args = parser.parse_args(argv)

    from measure import EngineConfig, MeasureEngine
    from measure.contract import device_kind
    from tuner.targets import resolve_target

    target = resolve_target(args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out / "work", ignore_errors=True)
    ctx = Context(target, device_kind(target), PLANS[(target.kind.name, args.quick)], args.out)
    chosen = [s for s in STEPS if args.steps is None or s[0] in args.steps]
    kept = earlier_steps(args.out, {s[0] for s in chosen}) if args.steps else []
    started = time.monotonic()
    results = []

    def record(result: dict) -> None:  # the table is written after every step: a run cut short keeps what it found
        results.append(result)
        steps = sorted([*kept, *results], key=lambda r: r["step"])
        write_outputs(args.out, env, steps, sum(r["seconds"] for r in steps))

    # Steps that share an engine run first, with its workers; tune() steps then have the machine to themselves.
    shared = [s for s in chosen if s[0] in _USES_SHARED_ENGINE]
    if shared:
        ctx.engine = MeasureEngine(target, args.out / "work" / "shared", EngineConfig(remember_dop=False))
        ctx.engine.start()
    try:
        env = environment(ctx)
        for number, name, step in chosen:
            if number == 1 or number in _USES_SHARED_ENGINE:
                record(run_step(number, name, step, ctx))
    finally:
        if ctx.engine is not None:
            ctx.engine.close()
    for number, name, step in chosen:
        if number != 1 and number not in _USES_SHARED_ENGINE:
            record(run_step(number, name, step, replace(ctx, engine=None)))
    steps = sorted([*kept, *results], key=lambda r: r["step"])
    print(write_outputs(args.out, env, steps, sum(r["seconds"] for r in steps)))
    print(f"this run: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0 if all(r["ok"] is not False for r in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
