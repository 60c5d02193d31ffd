"""Kernels tuned with fresh samples' register tiles drawn to fill the vector registers, and without
(``TENSOR_TUNER_REGISTER_TILES=0``: every fresh sample as MetaSchedule draws it), then each pair's best
schedules built and timed in alternation in one process.

    .venv/bin/python experiments/register_tiles.py [--workloads dense-bert-base-ffn1 ...] [--trials-per-task 32]

Each workload (a built-in operator) is tuned from scratch both ways with the same seed and budget, one
``tuner tune`` process each, alone. Prints a markdown table (also written to OUT/register_tiles.md): each
best's register tile (accumulator registers, inner reduction steps), its median latency over the
interleaved rounds, GFLOP/s and share of the FMA peak (``machine_limits.py``), and the ratio drawn /
MetaSchedule's. Work dirs stay under OUT/runs (resumed when run again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen.build import build_kernel  # noqa: E402
from common.host import cpu_model  # noqa: E402
from experiments import machine_limits  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402
from tuner.database.database import TuningDatabase  # noqa: E402
from tuner.spaces import metaschedule as msc  # noqa: E402
from tuner.spaces.register_tiles import DISABLE_ENV, register_file, register_tile  # noqa: E402
from tuner.targets import resolve_target  # noqa: E402

WORKLOADS = [
    "dense-bert-base-ffn1",
    "dense-bert-base-ffn2",
    "dense-bert-base-qkv",
    "matmul-llama2-7b-qproj",
    "matmul-512",
    "conv2d-resnet18-l2",
    "conv2d-resnet50-l3",
]
WAYS = {"drawn": "1", "metaschedule": "0"}  # the value of DISABLE_ENV for each way


def tune(workload: str, way: str, trials_per_task: int, runs: Path) -> Path:
    work_dir = runs / f"{workload}-{way}"
    env = {**os.environ, DISABLE_ENV: WAYS[way]}
    command = [sys.executable, "-m", "tuner.cli", "tune", workload, "--trials-per-task", str(trials_per_task)]
    subprocess.run([*command, "--work-dir", str(work_dir), "--quiet"], env=env, check=True)
    return work_dir


def best_schedule(work_dir: Path) -> tuple[tvm.IRModule, tvm.s_tir.Schedule]:
    """The kernel's unscheduled module and its fastest measured schedule (the workload's largest kernel)."""
    db = TuningDatabase(work_dir / "tuning.db", read_only=True)
    (target,) = db.targets()
    kernel = max(db.kernel_ids(), key=lambda k: msc.prim_func_flops(db.kernel_mod(k)))
    (best,) = db.best(kernel, target)
    mod = db.kernel_mod(kernel)
    return mod, msc.schedule_from_json(mod, best.trace)


def timer(sch: tvm.s_tir.Schedule, target: tvm.target.Target, artifact: Path):
    built = build_kernel(sch.mod, str(target), str(artifact))
    library = tvm.runtime.load_module(str(artifact))
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.random(shape).astype(dtype), dev) for dtype, shape in built["args"]]
    evaluator = library.time_evaluator(library.entry_name, dev, number=10, repeat=1, min_repeat_ms=30)
    return lambda: evaluator(*args).results[0]


def compare(workload: str, work_dirs: dict[str, Path], target, fma_peak: float, rounds: int, out: Path) -> dict:
    lanes = register_file(target).lanes
    schedules = {way: best_schedule(d) for way, d in work_dirs.items()}
    timers = {way: timer(sch, target, out / f"{workload}-{way}.so") for way, (_, sch) in schedules.items()}
    samples: dict[str, list[float]] = {way: [] for way in timers}
    for _ in range(rounds):
        for way, run in timers.items():
            samples[way].append(run())
    flops = msc.prim_func_flops(schedules["drawn"][0])
    row = {"workload": workload}
    for way in WAYS:
        median = statistics.median(samples[way])
        tile = register_tile(schedules[way][1], lanes)
        row[f"{way} tile"] = f"{tile[0]} x {tile[1]}" if tile else "-"
        row[f"{way} (us)"] = f"{median * 1e6:.1f}"
        row[f"{way} GFLOP/s"] = f"{flops / median / 1e9:.0f} ({flops / median / 1e9 / fma_peak:.0%})"
    by_round = [a / b for a, b in zip(samples["drawn"], samples["metaschedule"], strict=True)]
    row["drawn / metaschedule"] = f"{statistics.median(by_round):.2f}"
    row["by round"] = f"{min(by_round):.2f}-{max(by_round):.2f}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS)
    parser.add_argument("--trials-per-task", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/register_tiles"))
    args = parser.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count()))
    target = resolve_target("llvm")
    if register_file(target) is None:
        sys.exit("register_tiles.py: this CPU has no FMA vector unit whose registers the tiles could fill")
    args.out.mkdir(parents=True, exist_ok=True)
    threads = int(os.environ["TVM_NUM_THREADS"])
    fma_peak = max(machine_limits.fma_gflops(threads) for _ in range(3))  # the highest: others share this VM
    rows = []
    for workload in args.workloads:
        work_dirs = {way: tune(workload, way, args.trials_per_task, args.out / "runs") for way in WAYS}
        rows.append(compare(workload, work_dirs, target, fma_peak, args.rounds, args.out))
        print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    table = markdown_table(rows, list(rows[0]))
    header = (
        f"{cpu_model()}, {threads} threads (FMA peak {fma_peak:.0f} GFLOP/s), {args.trials_per_task} trials per task, "
        f"medians of {args.rounds} interleaved rounds; tile: accumulator registers x inner reduction steps."
    )
    (args.out / "register_tiles.md").write_text(f"{header}\n\n{table}\n")
    print(f"\n{header}\n\n{table}")


if __name__ == "__main__":
    main()
