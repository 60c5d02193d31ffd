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
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # faulty.py: the project's failing kernels (plain TVM, no pytest)

from common.error_text import error_line  # noqa: E402
from experiments.gpu_validation_measuring import (  # noqa: E402
    step_engine,
    step_faults,
    step_flush,
    step_nvml,
    step_one_kernel,
)
from experiments.gpu_validation_plan import PLANS, Context, StepResult  # noqa: E402
from experiments.gpu_validation_tuning import step_doctor, step_gemms, step_tune  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402

# The steps themselves: gpu_validation_tuning.py (1, 3, 8) and gpu_validation_measuring.py (2, 4-7).
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
    if ctx.engine is not None:
        gpu = ctx.engine.gpu_name()
    else:  # only tune() steps ran (--steps 3,8)
        from measure.nvml import NvmlMonitor

        gpu = NvmlMonitor().name if ctx.device == "cuda" else None
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
        # step 4 is the experiment of timing several candidates at once, which a GPU's default forbids
        config = EngineConfig(remember_dop=False, max_dop=8 if ctx.device == "cuda" else None)
        ctx.engine = MeasureEngine(target, args.out / "work" / "shared", config)
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
