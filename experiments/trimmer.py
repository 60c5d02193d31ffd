"""The Trimmer filter's payoff: the same workloads, seeds and trial budget tuned with the cost-model
filter and without it, in one run.

For each workload and seed, both runs tune in fresh processes. Per workload, the runs' best
latency after each measurement is averaged over the seeds (geometric mean), one curve with the
filter and one without; the target latency is where the curve without the filter ends, and each
curve's measurements to come within 2% of it are compared (the mean over seeds of the tuning
seconds those measurements took is given beside them). Single seeds are listed too, each against
its own run without the filter, but one seed's search can be far off another's at this budget, so
the averaged curves are the result. The two compiled results at equal budget are also timed side
by side. Goal: at least 30% fewer measurements to reach the target, final latency within 2%.

Two runs of one seed part after their first batch whatever the filter does: the model is trained
on latencies that differ by timing noise, and from then on the searches go their own ways. The
filter acts only once its model ranks well (after some 5 batches), so in a plain comparison the
difference is mostly that early noise. ``--shared N`` takes it out: each seed's first N
measurements are tuned once, without the filter, and both variants resume from a copy of that
work dir; ``saved_after_shared`` compares the measurements after it.

    python experiments/trimmer.py                                  # two conv2d layers, seeds 1-4
    python experiments/trimmer.py --shared 64 --trials 192         # both variants start from the same 64
    python experiments/trimmer.py --workloads matmul-512 --trials 64 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.filter_curves import (  # noqa: E402
    TOLERANCE,
    geometric_mean_curve,
    run_curve,
    saved_share,
    trials_to_reach,
)
from experiments.harness import (  # noqa: E402
    markdown_table,
    prepare_comparison,
    run_step,
    step_args,
    time_side_by_side,
    write_csv,
)
from experiments.seed_noise import TARGETS, chance_spread, describe, target_index  # noqa: E402

DEFAULT_WORKLOADS = ["conv2d-resnet18-l2", "conv2d-resnet50-l1"]


def tune_step(
    kernel_name: str,
    target_spec: str,
    trials: int,
    work_dir: Path,
    seed: int,
    trimmer: bool,
    filter_options: dict,
    cost_model_from: list[Path],
) -> dict:
    started = time.monotonic()
    from costmodel import FilterSettings
    from tuner import tune

    result = tune(
        kernel_name, target=target_spec, trials=trials, work_dir=work_dir, seed=seed,
        filter=FilterSettings(**filter_options) if trimmer else False, cost_model_from=cost_model_from,
    )  # fmt: skip
    return {
        "seconds": time.monotonic() - started,
        "artifact": str(result.artifact_path),
        "trials": result.trials,
        "filtered": result.filtered,
    }


def compare(args: argparse.Namespace) -> None:
    from workloads import get_workload

    out, target = prepare_comparison(args.out, args.target)
    rows, curves = [], {}
    for name in args.workloads:
        for seed in args.seeds:
            row, curves[name, seed] = _compare_one(get_workload(name), seed, args, target, out)
            rows.append(row)
            print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    write_csv(out / "trimmer.csv", rows)
    (out / "curves.json").write_text(json.dumps({f"{name}/seed{seed}": c for (name, seed), c in curves.items()}))
    summary = [
        _summary(
            name,
            [r for r in rows if r["workload"] == name],
            [curves[name, s] for s in args.seeds],
            args.trials,
            args.shared,
        )
        for name in args.workloads
    ]
    _plot(summary, out / "trimmer.png")
    for row in summary:
        del row["curves"]
    table = markdown_table(summary, list(summary[0]))
    (out / "trimmer.md").write_text(
        f"# Trimmer filter on / off\n\ntarget `{args.target}`, {args.trials} trials, seeds {args.seeds}. Per workload, "
        "the best latency after each measurement is averaged over the seeds (geometric mean) with the filter and "
        "without; the target is where the curve without the filter ends; `*_trials_to_target`: measurements until each "
        f"averaged curve came within {TOLERANCE:.0%} of it, `*_seconds_to_target`: the mean tuning seconds those "
        "measurements took; `on_end_vs_target`: where the filtered curve ends, over the target; `chance_saved_10_90`: "
        "the 10-90% range of what two sets of as many runs without the filter, drawn from these, score against each "
        "other on `measurements_saved` (see `experiments/seed_noise.py`): what the seeds alone can make of it (runs "
        "that share a start differ less); `*_3q`: the same with the target where the curve without the filter is at "
        "3/4 of the budget (its end is nearly flat, which makes the first measure noisy); `final_latency_ratio`: the "
        "compiled results at equal budget timed side by side (median over 3 processes of the ratio within each, "
        "averaged over seeds), filter on / off.\n\n"
        + table
        + "\n\n![averaged best latency against measurements](trimmer.png)\n\nPer seed, each against its own run "
        "without the filter:\n\n" + markdown_table(rows, list(rows[0])) + "\n"
    )
    print("\n" + table)


def _compare_one(workload, seed: int, args: argparse.Namespace, target, out: Path) -> tuple[dict, dict]:
    name = workload.name
    runs, curves = {}, {}
    prefix = None
    if args.shared:
        prefix = out / f"{name}-shared-seed{seed}"
        print(f"[{name} seed {seed}] shared start: tuning {args.shared} trials without the filter ...", flush=True)
        _tune_variant(name, "off", args.shared, prefix, None, seed, args)
    for variant in ("off", "on"):
        work_dir = out / f"{name}-filter-{variant}-seed{seed}"
        print(f"[{name} seed {seed}] filter {variant}: tuning to {args.trials} trials ...", flush=True)
        runs[variant] = _tune_variant(name, variant, args.trials, work_dir, prefix, seed, args)
        curves[variant] = run_curve(work_dir, args.trials)
    target_latency = curves["off"]["latency"][-1]
    off_trials = trials_to_reach(curves["off"]["latency"], target_latency)
    on_trials = trials_to_reach(curves["on"]["latency"], target_latency)
    from measure.contract import device_kind

    device = device_kind(target)
    args_spec = [[s.dtype, list(s.shape)] for s in workload.inputs]
    timed = time_side_by_side(
        {"ours": runs["on"]["artifact"], "stock": runs["off"]["artifact"]},
        workload.kind,
        args_spec,
        device,
        out / f"{name}-timing.log",
    )
    filtered = runs["on"]["filtered"]
    row = {
        "workload": name,
        "seed": seed,
        "trials": args.trials,
        "target_ms": round(target_latency * 1e3, 4),
        "off_trials_to_target": off_trials,
        "on_trials_to_target": on_trials if on_trials is not None else f">{args.trials}",
        "on_best_ms": round(curves["on"]["latency"][-1] * 1e3, 4),
        "final_latency_ratio": round(timed["ratio"], 3),
        "off_wall_s": round(runs["off"]["process_seconds"], 1),
        "on_wall_s": round(runs["on"]["process_seconds"], 1),
        "filtered": f"{filtered.get('dropped', 0)}/{filtered.get('proposed', 0)}",
    }
    return row, curves


def _tune_variant(
    name: str, variant: str, trials: int, work_dir: Path, start_from: Path | None, seed: int, args: argparse.Namespace
) -> dict:
    """Tune ``name`` with the filter ``variant`` ("on"/"off") to ``trials`` in a fresh process, in
    ``work_dir`` started afresh or, with ``start_from``, from a copy of that work dir (both variants
    then resume from the same measured candidates); its log is ``work_dir`` + ".log"."""
    shutil.rmtree(work_dir, ignore_errors=True)
    if start_from:
        shutil.copytree(start_from, work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    step = step_args("--step", variant, name, target=args.target, trials=trials, work_dir=work_dir, seed=seed)
    step += ["--filter", args.filter] + [
        option for d in args.cost_model_from for option in ("--cost-model-from", str(d))
    ]
    return run_step(Path(__file__), step, work_dir.with_name(work_dir.name + ".log"))


def _summary(name: str, rows: list[dict], curves: list[dict], trials: int, shared: int) -> dict:
    mean = {variant: geometric_mean_curve([c[variant]["latency"] for c in curves]) for variant in ("off", "on")}
    target = mean["off"][-1]
    reached = {variant: trials_to_reach(mean[variant], target) for variant in ("off", "on")}
    early_target = mean["off"][target_index(trials, TARGETS["3/4"])]
    early = {variant: trials_to_reach(mean[variant], early_target) for variant in ("off", "on")}
    off_curves = [c["off"]["latency"] for c in curves]
    # all measurements, shared or not: the sets drawn share no start, so only the whole count compares
    chance = {name: describe(chance_spread(off_curves, len(curves), at)) for name, at in TARGETS.items()}

    def seconds(variant: str) -> str:
        n = reached[variant]
        return f"{statistics.fmean(c[variant]['elapsed'][n - 1] for c in curves):.1f}" if n else "-"

    dropped, proposed = (sum(int(r["filtered"].split("/")[i]) for r in rows) for i in (0, 1))
    return {
        "workload": name,
        "seeds": len(rows),
        "trials": trials,
        "target_ms": round(target * 1e3, 4),
        "off_trials_to_target": reached["off"],
        "on_trials_to_target": reached["on"] or f">{trials}",
        "measurements_saved": _saved(reached["on"], reached["off"], 0, trials),
        "saved_after_shared": _saved(reached["on"], reached["off"], shared, trials) if shared else "-",
        "chance_saved_10_90": chance["end"],
        "target_3q_ms": round(early_target * 1e3, 4),
        "off_trials_to_3q": early["off"],
        "on_trials_to_3q": early["on"] or f">{trials}",
        "saved_to_3q": _saved(early["on"], early["off"], 0, trials),
        "chance_saved_3q_10_90": chance["3/4"],
        "off_seconds_to_target": seconds("off"),
        "on_seconds_to_target": seconds("on"),
        "on_end_vs_target": round(mean["on"][-1] / target, 3),
        "final_latency_ratio": round(statistics.fmean(r["final_latency_ratio"] for r in rows), 3),
        "filtered": f"{dropped}/{proposed}",
        "off_wall_s": round(statistics.fmean(r["off_wall_s"] for r in rows), 1),
        "on_wall_s": round(statistics.fmean(r["on_wall_s"] for r in rows), 1),
        "curves": mean,
    }


def _saved(on: int | None, off: int | None, shared: int, trials: int) -> str:
    share = saved_share(on, off, shared, trials)
    if share is None:
        return "-"
    return f"{share[0]:.0%}" if share[1] else f"< {share[0]:.0%}"


def _plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(6 * len(summary), 4), squeeze=False)
    for ax, row in zip(axes[0], summary, strict=True):
        for variant, label in (("off", "no filter"), ("on", "Trimmer filter")):
            curve = row["curves"][variant]
            ax.step(range(1, len(curve) + 1), [v * 1e3 for v in curve], where="post", label=label)
        ax.axhline(row["target_ms"] * (1 + TOLERANCE), color="grey", linestyle=":", label=f"target + {TOLERANCE:.0%}")
        ax.set_title(f"{row['workload']} ({row['seeds']} seeds, geometric mean)")
        ax.set_xlabel("measurements")
        ax.set_ylabel("best latency so far (ms)")
        if math.isfinite(row["target_ms"]):  # inf where some task of a model got no working candidate
            ax.set_ylim(row["target_ms"] * 0.9, row["target_ms"] * 2.5)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument(
        "--shared",
        type=int,
        default=0,
        help="measurements both variants of a seed share (tuned once, without the filter) before they part",
    )
    parser.add_argument(
        "--filter",
        default="{}",
        help="the filter's settings, as JSON keyword arguments of costmodel.FilterSettings, "
        "e.g. '{\"poor_ratio\": 1.5}' (default: its defaults)",
    )
    parser.add_argument(
        "--cost-model-from",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="warm-start both variants' cost models from the run in DIR (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="experiments/results/trimmer")
    parser.add_argument("--step", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.step:
        on = args.step[0] == "on"
        print(
            json.dumps(
                tune_step(
                    rest[0],
                    args.target,
                    args.trials,
                    args.work_dir,
                    args.seed,
                    on,
                    json.loads(args.filter),
                    args.cost_model_from,
                )
            )
        )
    else:
        compare(args)


if __name__ == "__main__":
    main()
