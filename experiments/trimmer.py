"""The Trimmer filter's payoff: the same workloads, seeds and trial budget tuned with the cost-model
filter and without it, in one run.

For each workload and seed, both runs tune in fresh processes. The target latency is what the
run without the filter reached at the end of its budget; for each run we count the measurements
(and the tuning seconds) it needed to come within 2% of that target, from the best latency after
each measured candidate in its database. The two compiled results at equal budget are then timed
side by side. Goal: at least 30% fewer measurements to reach the target, final latency within 2%.

    python experiments/trimmer.py                                  # matmul-512 and conv2d-resnet18-l2, seeds 1-3
    python experiments/trimmer.py --workloads matmul-512 --trials 64 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.common import markdown_table, prepare_comparison, run_step, time_side_by_side, write_csv  # noqa: E402

DEFAULT_WORKLOADS = ["matmul-512", "conv2d-resnet18-l2"]
TOLERANCE = 0.02  # "reached the target" = within 2% of it


def tune_step(workload_name: str, target_spec: str, trials: int, work_dir: Path, seed: int, trimmer: bool) -> dict:
    started = time.monotonic()
    from tuner import tune

    result = tune(workload_name, target=target_spec, trials=trials, work_dir=work_dir, seed=seed, trimmer=trimmer)
    return {"seconds": time.monotonic() - started, "artifact": str(result.artifact_path), "trials": result.trials, "filtered": result.filtered}


def reach(work_dir: Path, target_latency: float, at_trials: int | None = None) -> tuple[int | None, float | None, float]:
    """(measurements, tuning seconds) until the best latency came within TOLERANCE of
    ``target_latency`` (None if never), and the best latency after ``at_trials`` (default: at the end)."""
    from tuner.database import TuningDatabase
    from tuner.report import best_latency_curve

    db = TuningDatabase(work_dir / "tuning.db")
    try:
        job = db.get_meta("job")
        curve = best_latency_curve(db.records(job["target"]), {t["workload_id"]: t["weight"] for t in job["tasks"]})
    finally:
        db.close()
    at = [lat for trials, lat in zip(curve.trials, curve.latency) if at_trials is None or trials <= at_trials]
    for trials, elapsed, latency in zip(curve.trials, curve.elapsed, curve.latency):
        if latency <= target_latency * (1 + TOLERANCE):
            return trials, elapsed, at[-1]
    return None, None, at[-1]


def final_latency(work_dir: Path) -> float:
    return reach(work_dir, 0.0)[2]


def compare(args: argparse.Namespace) -> None:
    from workloads import get_workload

    out, target = prepare_comparison(args.out, args.target)
    rows = []
    for name in args.workloads:
        for seed in args.seeds:
            rows.append(_compare_one(get_workload(name), seed, args, target, out))
            print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    write_csv(out / "trimmer.csv", rows)
    summary = _summaries(rows)
    table = markdown_table(summary, list(summary[0]))
    (out / "trimmer.md").write_text(
        f"# Trimmer filter on / off\n\ntarget `{args.target}`, {args.trials} trials, seeds {args.seeds}. Target latency: "
        f"the best the run without the filter reached in its budget; `*_to_target`: measurements and tuning seconds until "
        f"a run came within {TOLERANCE:.0%} of it (the budget, as a lower bound, where it never did); final latency of "
        "the compiled results at equal budget timed side by side (median over 3 processes of the ratio within each), "
        "filter on / off; `on_at_70pct_vs_target`: the filtered run's best after 70% of the budget, over the target.\n\n"
        + table + "\n\nPer seed:\n\n" + markdown_table(rows, list(rows[0])) + "\n"
    )
    print("\n" + table)


def _compare_one(workload, seed: int, args: argparse.Namespace, target, out: Path) -> dict:
    name = workload.name
    runs, dirs = {}, {}
    for variant in ("off", "on"):
        dirs[variant] = work_dir = out / f"{name}-filter-{variant}-seed{seed}"
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)
        step = ["--step", variant, name, "--target", args.target, "--trials", str(args.trials), "--work-dir", str(work_dir), "--seed", str(seed)]
        print(f"[{name} seed {seed}] filter {variant}: tuning {args.trials} trials ...", flush=True)
        runs[variant] = run_step(Path(__file__), step, out / f"{name}-filter-{variant}-seed{seed}.log")
    target_latency = final_latency(dirs["off"])
    off_trials, off_seconds, _ = reach(dirs["off"], target_latency)
    on_trials, on_seconds, on_final = reach(dirs["on"], target_latency)
    on_at_70 = reach(dirs["on"], target_latency, int(0.7 * args.trials))[2]
    device = "cuda" if target.kind.name == "cuda" else "cpu"
    args_spec = [[s.dtype, list(s.shape)] for s in workload.inputs]
    timed = time_side_by_side({"ours": runs["on"]["artifact"], "stock": runs["off"]["artifact"]}, workload.kind, args_spec, device, out / f"{name}-timing.log")
    filtered = runs["on"]["filtered"]
    return {
        "workload": name,
        "seed": seed,
        "trials": args.trials,
        "target_ms": round(target_latency * 1e3, 4),
        "off_trials_to_target": off_trials,
        "on_trials_to_target": on_trials if on_trials is not None else f">{args.trials}",
        "trials_ratio": round((on_trials or args.trials) / off_trials, 3),
        "off_seconds_to_target": round(off_seconds, 1),
        "on_seconds_to_target": round(on_seconds, 1) if on_seconds is not None else "-",
        "on_best_ms": round(on_final * 1e3, 4),
        "on_at_70pct_vs_target": round(on_at_70 / target_latency, 3),
        "final_latency_ratio": round(timed["ratio"], 3),
        "off_wall_s": round(runs["off"]["process_seconds"], 1),
        "on_wall_s": round(runs["on"]["process_seconds"], 1),
        "filtered": f"{filtered.get('dropped', 0)}/{filtered.get('proposed', 0)}",
    }


def _summaries(rows: list[dict]) -> list[dict]:
    summary = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        summary.append(
            {
                "workload": name,
                "seeds": len(mine),
                "trials": mine[0]["trials"],
                "off_trials_to_target": round(statistics.mean(r["off_trials_to_target"] for r in mine), 1),
                "on_trials_to_target": round(statistics.mean(r["trials_ratio"] * r["off_trials_to_target"] for r in mine), 1),
                "measurements_saved": f"{1 - statistics.mean(r['trials_ratio'] for r in mine):.0%}",
                "on_at_70pct_vs_target": round(statistics.mean(r["on_at_70pct_vs_target"] for r in mine), 3),
                "final_latency_ratio": round(statistics.mean(r["final_latency_ratio"] for r in mine), 3),
                "off_wall_s": round(statistics.mean(r["off_wall_s"] for r in mine), 1),
                "on_wall_s": round(statistics.mean(r["on_wall_s"] for r in mine), 1),
            }
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="experiments/results/trimmer")
    parser.add_argument("--step", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.step:
        print(json.dumps(tune_step(rest[0], args.target, args.trials, args.work_dir, args.seed, trimmer=args.step[0] == "on")))
    else:
        compare(args)


if __name__ == "__main__":
    main()
