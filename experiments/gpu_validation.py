"""Prove (or disprove) the GPU path in one command: the first thing to run when a GPU is lent.

    python experiments/gpu_validation.py                         # one H100/H200: the ten steps in at most 8 minutes
    python experiments/gpu_validation.py --target llvm --quick   # the same code on a CPU (step 9: minutes)
    python experiments/gpu_validation.py --steps 9,10            # some steps only: runs into one --out add up

Ten steps, each recorded with its verdict, numbers and time, a failing one does not stop the rest:
  1. `tuner doctor` for the target;
  2. one kernel built, loaded in a runtime-only measuring worker, timed, checked against NumPy;
  3. tune() of a matmul (matmul-1024, 16 trials on a GPU), verified, with its DOP decisions;
  4. the measurement-engine experiment on real candidates (24 on a GPU): serial against the engine
     (throughput, median and worst error, top-1 agreement, share of wall time the device spent in timed calls);
     on a GPU also the same candidates built by the CUDA compiler the run does not use (nvcc beside NVRTC)
     and timed serially: their latencies over the run's compiler's kernels;
  5. caches flushed and not on a kernel whose inputs fit in the L2 (cold must be slower), and on a
     GPU the launch's host-side delay: a tiny kernel timed cold the tuner's way and TVM's way;
  6. candidates that fault (GPU: an illegal address, too many registers for their launch; CPU: a
     segfault, an impossible allocation): recorded with their reason, the worker replaced where
     the fault poisons it, the next candidate measured;
  7. NVML: the energy of about 2 s of kernels, and which GPU NVML watches under CUDA_VISIBLE_DEVICES;
  8. fp16 GEMMs (on a GPU 1024^3, then 4096^3 if time allows; 16 trials each) tuned, against
     torch.matmul (cuBLAS) where torch has CUDA;
  9. ours against stock MetaSchedule (tune_tir as a user runs it, for the target with its arch) on the
     same kernels and trials (on a GPU matmul-1024 in fp32, 16 trials each; then, if time allows,
     Llama-2-7B's q_proj in fp16 and a ResNet-50 3x3 convolution), each tuner in a fresh process:
     wall time to a compiled artifact, both artifacts timed side by side, the ratios ours/stock, each
     tuner's seconds by phase (DIR/vs_metaschedule.md);
 10. models against PyTorch: ResNet-18 in fp16 on a GPU (tiny-resnet in fp32 on a CPU) tuned with 8
     trials, timed beside PyTorch eager and torch.compile on the same device and inputs, every output's
     error against eager's (DIR/vs_pytorch.md; n/a where torch cannot use the device); ResNet-50 and
     BERT-base in fp16 after it if time allows.
Writes DIR/gpu_validation.json and DIR/gpu_validation.md (default DIR: experiments/results/gpu_validation)
after every step; with --steps, steps an earlier run recorded there are kept, so that runs of a few
steps each add up to one table. Tuning work dirs go to --work-dir (default DIR/work).

Time: --minutes (default 8 on a GPU's full plan, no limit otherwise) bounds the run. A step whose
estimate no longer fits the time left is recorded as not run (run it later with --steps N, same
--out); the further items of steps 8-10 run only if their estimate fits beside the steps still to
come. Estimates on one H100/H200 (experiments/gpu_validation_plan.py), in seconds:

    step       1   2   3   4   5   6   7   8   9    10   all
    estimate   3   5  35  35   3   3  20  60  160  140   464 (and ~10 s of start-up: under 8 minutes)

Steps 1-8 from the recorded runs (results/gpu_validation/h100 and h200, 438 and 528 s at the former
sizes): steps 1, 2, 5, 6 took 1-3 s, step 7 4-18 s; a matmul trial costs 1.35-2.1 s of tuning and
a tune() ~20 s besides (step 3: 90-137 s at 64 trials; step 8: 116-167 s a GEMM at 64 trials, its
build workers importing TVM's tensor intrinsics first, 20-40 s); step 4 took 0.8 s a candidate (its
other compiler's builds and serial timing ~10 s more, not yet run on a GPU).
Step 9: stock MetaSchedule at 16 trials ~100 s (its process, and every build worker once a batch,
imports the tensor intrinsics: on the 2-core CPU its set-up took 44 s and its 8 builds 100 s of
159 s), ours ~50 s (start-up and a tune() besides its 16 trials), timing ~12 s. Step 10: ResNet-18's
tune() at 8 trials ~85 s (fp32 ResNet-18 on an H200: start-up, compile and checks 60 s of a tune(),
a task's search, measuring and final choice ~20 s), torch.compile ~40 s, timing ~10 s. Steps 9 and
10 not yet run on a GPU, nor the others at these sizes.
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
from experiments.gpu_validation_comparing import step_vs_metaschedule, step_vs_pytorch  # noqa: E402
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

# The steps themselves: gpu_validation_tuning.py (1, 3, 8), gpu_validation_measuring.py (2, 4-7) and
# gpu_validation_comparing.py (9, 10).
STEPS: list[tuple[int, str, Callable[[Context], StepResult]]] = [
    (1, "tuner doctor", step_doctor),
    (2, "one kernel: build, runtime-only worker, time, NumPy check", step_one_kernel),
    (3, "tune() a matmul, verified, DOP decisions", step_tune),
    (4, "measurement engine against serial", step_engine),
    (5, "L2 flush on and off; launch delay", step_flush),
    (6, "faulting candidates", step_faults),
    (7, "NVML energy and device mapping", step_nvml),
    (8, "GEMMs tuned against torch.matmul", step_gemms),
    (9, "ours against stock MetaSchedule", step_vs_metaschedule),
    (10, "models against PyTorch eager and torch.compile", step_vs_pytorch),
]
_USES_SHARED_ENGINE = {2, 4, 5, 6, 7}


def run_step(number: int, name: str, step: Callable[[Context], StepResult], ctx: Context) -> dict:
    print(f"[{number}/{len(STEPS)}] {name} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result = step(ctx)
    except Exception as err:  # noqa: BLE001 - a failing step is a finding; the others still run
        traceback.print_exc()
        why = f"{type(err).__name__}: {error_line(err, last=True)}"[:300]
        result = StepResult(False, why, {"traceback": traceback.format_exc()})
    seconds = time.monotonic() - started
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}[result.ok]
    print(f"[{number}/{len(STEPS)}] {verdict} in {seconds:.0f} s: {result.summary}", file=sys.stderr, flush=True)
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


def left_out(number: int, name: str, estimate: float, left: float) -> dict:
    """The record of a step not run: its estimate exceeds the run's time left (--minutes)."""
    return {
        "step": number,
        "name": name,
        "ok": None,
        "verdict": "not run",
        "seconds": 0.0,
        "summary": f"not run: estimated {estimate:.0f} s, {max(left, 0):.0f} s left of --minutes; run it with "
        f"--steps {number} into the same --out",
        "details": {"left_out": True, "estimate_s": estimate},
    }


def earlier_steps(out: Path) -> list[dict]:
    """The steps an earlier run recorded in ``out``: runs of a few steps each (``--steps``, where one
    command may last only so long) add up to one table."""
    try:
        return json.loads((out / "gpu_validation.json").read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return []


def merged(earlier: list[dict], results: list[dict]) -> list[dict]:
    """This run's steps over an earlier run's, except a step this run left out that the earlier one ran."""
    by_step = {s["step"]: s for s in earlier}
    for result in results:
        ran_before = result["step"] in by_step and not by_step[result["step"]]["details"].get("left_out")
        if not (result["details"].get("left_out") and ran_before):
            by_step[result["step"]] = result
    return sorted(by_step.values(), key=lambda r: r["step"])


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
    not_run = sum(bool(s["details"].get("left_out")) for s in steps)
    header = (
        f"GPU validation on {env['target']} ({env['gpu'] or 'no GPU'}), {env['host']}, commit {env['commit']}, TVM "
        f"{env['tvm']}: {passed} of {len(steps)} steps passed in {wall:.0f} s"
        + (f" ({not_run} not run for time)." if not_run else ".")
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
    parser.add_argument(
        "--minutes",
        type=float,
        help="the run's budget: steps that no longer fit are left for --steps (default: 8 on a GPU's full plan, "
        "none otherwise; 0: none)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "gpu_validation")
    parser.add_argument("--work-dir", type=Path, help="tuning work dirs and artifacts (default: OUT/work, emptied)")
    args = parser.parse_args(argv)

    from measure import EngineConfig, MeasureEngine
    from measure.contract import device_kind
    from tuner.targets import resolve_target

    started = time.monotonic()
    target = resolve_target(args.target)
    plan = PLANS[(target.kind.name, args.quick)]
    minutes = plan.minutes if args.minutes is None else args.minutes
    args.out.mkdir(parents=True, exist_ok=True)
    if args.work_dir is None:
        shutil.rmtree(args.out / "work", ignore_errors=True)
    deadline = started + minutes * 60 if minutes else None
    ctx = Context(
        target, device_kind(target), plan, args.out, spec=args.target, work_dir=args.work_dir, deadline=deadline
    )
    chosen = [s for s in STEPS if args.steps is None or s[0] in args.steps]
    # Steps that share an engine run first, with its workers; tune() steps then have the machine to themselves.
    with_engine = [s for s in chosen if s[0] == 1 or s[0] in _USES_SHARED_ENGINE]
    order = with_engine + [s for s in chosen if s not in with_engine]
    earlier = earlier_steps(args.out) if args.steps else []
    results = []

    def record(result: dict) -> None:  # the table is written after every step: a run cut short keeps what it found
        results.append(result)
        steps = merged(earlier, results)
        write_outputs(args.out, env, steps, sum(r["seconds"] for r in steps))

    def run_next(index: int, step_ctx: Context) -> None:
        number, name, step = order[index]
        estimate, left = plan.seconds[number], step_ctx.seconds_left()
        if estimate > left:
            print(f"[{number}/{len(STEPS)}] {name}: not run, {estimate:.0f} s > {left:.0f} s left", file=sys.stderr)
            record(left_out(number, name, estimate, left))
            return
        later = sum(plan.seconds[n] for n, _, _ in order[index + 1 :])
        record(run_step(number, name, step, replace(step_ctx, reserve=later)))

    if any(s[0] in _USES_SHARED_ENGINE for s in chosen):
        # step 4 is the experiment of timing several candidates at once, which a GPU's default forbids
        config = EngineConfig(remember_dop=False, max_dop=8 if ctx.device == "cuda" else None)
        ctx.engine = MeasureEngine(target, ctx.work / "shared", config)
        ctx.engine.start()
    try:
        env = environment(ctx)
        for index in range(len(with_engine)):
            run_next(index, ctx)
    finally:
        if ctx.engine is not None:
            ctx.engine.close()
    for index in range(len(with_engine), len(order)):
        run_next(index, replace(ctx, engine=None))
    steps = merged(earlier, results)
    print(write_outputs(args.out, env, steps, sum(r["seconds"] for r in steps)))
    print(f"this run: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0 if all(r["ok"] is not False for r in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
