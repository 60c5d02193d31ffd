"""Ours against stock MetaSchedule on the same workloads, target and trial budget, in one run.

Each tuner runs in a fresh process (so start-up is counted) and produces a compiled artifact;
both artifacts of a workload are then timed in one process, in alternating rounds. Prints and
writes a table of wall time, best latency and the ratios ours/stock. On a GPU (``--target cuda``)
stock MetaSchedule tunes for the target with its arch (``cuda -arch=sm_90``: its tensor-core rules),
as ours does. experiments/gpu_validation.py's step 9 runs ``compare_one`` on the GPU.

    python experiments/vs_metaschedule.py                       # the default set, 64 trials per task, seeds 1 2
    python experiments/vs_metaschedule.py --workloads matmul-512 --trials-per-task 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.harness import (  # noqa: E402
    markdown_table,
    prepare_comparison,
    run_step,
    step_args,
    time_side_by_side,
    write_csv,
)

DEFAULT_WORKLOADS = ["matmul-512", "conv2d-resnet18-l2", "tiny-resnet"]


class TunerFailed(RuntimeError):
    """One side of a comparison failed: a tuner's process (``tuner`` "stock" or "ours"), or the
    timing ("timing"); ``log`` is the failed process's stderr."""

    def __init__(self, tuner: str, log: Path, cause: BaseException):
        super().__init__(f"{tuner}: {type(cause).__name__}: {cause}")
        self.tuner, self.log = tuner, log


def stock_step(kernel_name: str, target_spec: str, trials: int, work_dir: Path, seed: int) -> dict:
    """Stock MetaSchedule as a user runs it: tune_tir / tune_relax with default settings (its
    LocalBuilder on every core, its LocalRunner), then compile with the database. The changes: a
    build timeout long enough for this machine (the default 30 s makes every build of a batch time
    out under load), and on CUDA what ours sets up in its own processes (``_cuda_environment_for_workers``),
    so that both compile alike. ``phases``: seconds by phase, from MetaSchedule's profiler."""
    from tvm.s_tir import meta_schedule as ms

    from tuner.targets import resolve_target
    from workloads import get_workload

    workload = get_workload(kernel_name)
    target = resolve_target(target_spec)
    if target.kind.name == "cuda":
        _cuda_environment_for_workers()
    builder = ms.builder.LocalBuilder(timeout_sec=300)
    with ms.Profiler() as profiler:
        if workload.kind == "tir":
            db = ms.tune_tir(workload.mod, target, str(work_dir), trials, builder=builder, seed=seed)
        else:
            from tuner.tasks.extraction import lower_workload

            # both tune the kernels of the same lowering (tune_relax finds no tasks in an un-lowered module)
            lowered = lower_workload(workload, target)
            db = ms.relax_integration.tune_relax(
                lowered, None, target, str(work_dir), trials, builder=builder, seed=seed
            )
    compiling = time.monotonic()
    if workload.kind == "tir":
        import tvm

        sch = ms.tir_integration.compile_tir(db, workload.mod, target)
        if sch is None:
            raise RuntimeError(f"stock MetaSchedule has no schedule for {kernel_name}: no candidate built and ran")
        executable = tvm.compile(sch.mod, target=target)
    else:
        from codegen.build import build_lowered_model

        executable = build_lowered_model(lowered, target, db)
    artifact = work_dir / "stock.so"
    executable.export_library(str(artifact))
    return {
        "artifact": str(artifact),
        "trials": len(db.get_all_tuning_records()),
        "phases": {**stock_phases(profiler.get()), "compile": time.monotonic() - compiling},
    }


def _cuda_environment_for_workers() -> None:
    """Set up, in the environment MetaSchedule's builder and runner processes inherit, what ours sets
    up in its own for CUDA: the same compiler (NVRTC where installed, on TVM's sources as they are, as
    stock MetaSchedule compiles them; else nvcc) and, where NVIDIA's wheel brings the CUDA 13 runtime
    library, its folder (a plain ``import tvm`` finds only the system's, and without one sees no GPU)."""
    import os

    from measure.cuda.compile_env import prepare_cuda_build_env
    from measure.cuda.runtime import wheel_cudart

    prepare_cuda_build_env()
    wheel = wheel_cudart()
    if wheel is not None:
        paths = [str(wheel.parent), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(paths)


def stock_phases(stats: dict) -> dict[str, float]:
    """MetaSchedule's profiler scopes (TVM 0.27's task scheduler and evolutionary search) summed into
    phases: "rest of tuning" is what no scope covers (creating the task, whose first step imports
    TVM's tensor intrinsics, its design spaces, the database)."""
    seconds = {str(k): float(getattr(v, "value", v)) for k, v in stats.items()}
    phases = {
        "search": sum(v for k, v in seconds.items() if k.startswith("EvoSearch/")),
        "build": seconds.get("SendToBuilder", 0.0),
        # LocalRunner.run waits for each candidate: the runs are in SendToRunner
        "measure": seconds.get("SendToRunner", 0.0) + seconds.get("JoinRunnerFutures", 0.0),
        "cost model": seconds.get("MeasureCallback/UpdateCostModel", 0.0),
    }
    phases["rest of tuning"] = max(0.0, seconds.get("Total", 0.0) - sum(phases.values()))
    return phases


def ours_step(kernel_name: str, target_spec: str, trials: int, work_dir: Path, seed: int) -> dict:
    from tuner import tune

    result = tune(kernel_name, target=target_spec, trials=trials, work_dir=work_dir, seed=seed)
    return {
        "artifact": str(result.artifact_path),
        "trials": result.trials,
        "phases": dict(result.seconds),
    }


def compare(args: argparse.Namespace) -> None:
    from tuner.tasks.extraction import extract_tasks
    from workloads import get_workload

    out, target = prepare_comparison(args.out, args.target)
    rows = []
    for name in args.workloads:
        workload = get_workload(name)
        tasks = extract_tasks(workload, target)
        trials = args.trials_per_task * len(tasks)
        for seed in args.seeds:
            rows.append(compare_one(workload, len(tasks), trials, seed, args.target, target, out)[0])
            print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    write_csv(out / "vs_metaschedule.csv", rows)
    summary_rows = _summaries(rows)
    table = markdown_table(summary_rows, list(summary_rows[0]))
    (out / "vs_metaschedule.md").write_text(
        f"# Ours vs stock MetaSchedule\n\ntarget `{args.target}`, {args.trials_per_task} trials per task, seeds "
        f"{args.seeds}; "
        "wall time from process start to a compiled artifact; latency of both artifacts timed side by side "
        "(median over 3 timing processes of the ratio within each).\n\n"
        + table
        + "\n\nPer seed:\n\n"
        + markdown_table(rows, list(rows[0]))
        + "\n"
    )
    _plot(summary_rows, out / "vs_metaschedule.png")
    print("\n" + table)


def compare_one(
    workload,
    num_tasks: int,
    trials: int,
    seed: int,
    target_spec: str,
    target,
    out: Path,
    timing_processes: int = 3,
    deadline: float | None = None,
) -> tuple[dict, dict[str, dict[str, float]]]:
    """Tune ``workload`` with stock MetaSchedule and with ours (each in a fresh process), then time
    both artifacts side by side in ``timing_processes`` processes; a process still running at
    ``deadline`` (time.monotonic()) is killed.
    Returns the table's row and each tuner's seconds by phase, which add up to its process's wall time
    ("process and set-up": what no phase of the tuner's covers, the interpreter, imports, the target);
    raises TunerFailed naming the side that failed."""
    import shutil
    import subprocess

    name = workload.name
    results, phases = {}, {}
    for tuner_name in ("stock", "ours"):
        work_dir = out / f"{name}-{tuner_name}-seed{seed}"
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)
        step = step_args("--step", tuner_name, name, target=target_spec, trials=trials, work_dir=work_dir, seed=seed)
        print(f"[{name} seed {seed}] {tuner_name}: tuning {num_tasks} task(s), {trials} trials ...", flush=True)
        log = out / f"{name}-{tuner_name}-seed{seed}.log"
        try:
            results[tuner_name] = run_step(Path(__file__), step, log, timeout=_until(deadline))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, IndexError) as err:  # a failed or silent process
            raise TunerFailed(tuner_name, log, err) from err
        process = results[tuner_name]["process_seconds"]
        own = results[tuner_name]["phases"]
        phases[tuner_name] = {"process and set-up": process - sum(own.values()), **own}
        print(f"[{name} seed {seed}] {tuner_name}: {process:.1f} s", flush=True)
    args_spec = [[s.dtype, list(s.shape)] for s in workload.inputs]
    from measure.contract import device_kind

    device = device_kind(target)
    log = out / f"{name}-timing.log"
    try:
        latency = time_side_by_side(
            {k: v["artifact"] for k, v in results.items()},
            workload.kind,
            args_spec,
            device,
            log,
            timing_processes,
            _until(deadline),
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        raise TunerFailed("timing", log, err) from err
    stock_s, ours_s = results["stock"]["process_seconds"], results["ours"]["process_seconds"]
    row = {
        "workload": name,
        "seed": seed,
        "tasks": num_tasks,
        "trials": trials,
        "stock_wall_s": round(stock_s, 1),
        "ours_wall_s": round(ours_s, 1),
        "wall_ratio": round(ours_s / stock_s, 3),
        "stock_latency_ms": round(latency["stock"] * 1e3, 4),
        "ours_latency_ms": round(latency["ours"] * 1e3, 4),
        "latency_ratio": round(latency["ratio"], 3),
    }
    return row, phases


def _until(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (at least a few, for a process to say what went wrong), or None."""
    return None if deadline is None else max(deadline - time.monotonic(), 10.0)


def _summaries(rows: list[dict]) -> list[dict]:
    """One row per workload: means over seeds."""
    summary = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        summary.append(
            {
                "workload": name,
                "seeds": len(mine),
                "trials": mine[0]["trials"],
                "stock_wall_s": round(statistics.fmean(r["stock_wall_s"] for r in mine), 1),
                "ours_wall_s": round(statistics.fmean(r["ours_wall_s"] for r in mine), 1),
                "wall_ratio": round(statistics.fmean(r["wall_ratio"] for r in mine), 3),
                "stock_latency_ms": round(statistics.fmean(r["stock_latency_ms"] for r in mine), 4),
                "ours_latency_ms": round(statistics.fmean(r["ours_latency_ms"] for r in mine), 4),
                "latency_ratio": round(statistics.fmean(r["latency_ratio"] for r in mine), 3),
            }
        )
    return summary


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (wall, lat) = plt.subplots(1, 2, figsize=(10, 4))
    names = [r["workload"] for r in rows]
    xs = range(len(rows))
    wall.bar([x - 0.2 for x in xs], [r["stock_wall_s"] for r in rows], 0.4, label="stock MetaSchedule")
    wall.bar([x + 0.2 for x in xs], [r["ours_wall_s"] for r in rows], 0.4, label="tensor-tuner")
    wall.set_ylabel("wall time (s)")
    lat.bar(xs, [r["latency_ratio"] for r in rows], 0.5, color="tab:green")
    lat.axhline(1.0, color="gray", lw=1)
    lat.set_ylabel("best latency, ours / stock")
    for ax in (wall, lat):
        ax.set_xticks(list(xs), names, rotation=15)
    wall.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--trials-per-task", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="experiments/results/vs_metaschedule")
    parser.add_argument("--step", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.step:
        step = {"stock": stock_step, "ours": ours_step}[args.step[0]]
        print(json.dumps(step(rest[0], args.target, args.trials, args.work_dir, args.seed)))
    else:
        compare(args)


if __name__ == "__main__":
    main()
