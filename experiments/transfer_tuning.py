"""Transfer-tuning: how much search time do schedules tuned for another model save?

For each pair TARGET:SOURCE, SOURCE is tuned once (or an earlier step's run of it is reused);
then TARGET is tuned twice with the same seed and trial budget, without transfer ("stock") and
with ``transfer_from=[SOURCE's work dir]``. Each run's model latency (the sum over tasks of
launches x best latency so far) is recorded against its tuning seconds (counting the transfer's
replays and cost-model warm start, not the source's tuning). Reported per pair: the latency the
transfer run reached after its first round (every task measured once, its first batch being the
transferred schedules) and at its end, and the tuning time stock needed to reach the same
latency ("not reached" gives a lower bound on the ratio). Every step runs in a fresh process.

    python experiments/transfer_tuning.py              # resnet18 from resnet50, tiny-resnet from resnet18
    python experiments/transfer_tuning.py --quick      # a smoke run: tiny-resnet from tiny-resnet at batch 4
    python experiments/transfer_tuning.py --pairs resnet18:resnet50 --trials 32 --source-trials 48
    python experiments/transfer_tuning.py --source-trials 32 --reuse-sources   # source runs kept from an earlier call

A workload is a built-in model name, optionally with a batch size: ``tiny-resnet@4``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.harness import markdown_table, run_step, step_args, write_csv  # noqa: E402

DEFAULT_PAIRS = ["resnet18:resnet50", "tiny-resnet:resnet18"]
QUICK_PAIRS = ["tiny-resnet:tiny-resnet@4"]


def parse_workload(spec: str) -> tuple[str, int | None]:
    name, _, batch = spec.partition("@")
    return name, int(batch) if batch else None


def tune_step(spec: str, target: str, trials: int, work_dir: Path, seed: int, transfer_from: list[str]) -> dict:
    """Tune one workload; its model-latency curve from the database."""
    from tuner import tune
    from tuner.cli.report import job_curve
    from tuner.database.workdir import TransferRecord, WorkDir, read_meta

    name, batch = parse_workload(spec)
    result = tune(
        name,
        target=target,
        trials=trials,
        work_dir=work_dir,
        batch=batch,
        seed=seed,
        transfer_from=transfer_from or None,
    )
    db = WorkDir(result.work_dir).open_database(read_only=True)
    try:
        curve = job_curve(db)
        transfer = read_meta(db, TransferRecord)
    finally:
        db.close()
    return {
        "trials": result.trials,
        "tasks": len(result.tasks),
        "latency_after": result.latency_after,
        "seconds": result.seconds,
        "curve": {"trials": curve.trials, "elapsed": curve.elapsed, "latency": curve.latency},
        "transfer": transfer.as_dict() if transfer else None,
    }


# -- comparing ------------------------------------------------------------------------------------
def time_to_reach(curve: dict, latency: float) -> float | None:
    """Tuning seconds until ``curve`` first reaches ``latency`` (1% tolerance); None if it never does."""
    for elapsed, value in zip(curve["elapsed"], curve["latency"], strict=True):
        if value <= latency * 1.01:
            return elapsed
    return None


def compare_point(stock: dict, elapsed: float, latency: float) -> dict:
    """Stock's time to reach what transfer reached at ``elapsed``, and the ratio of the two."""
    reached = time_to_reach(stock, latency)
    if reached is None:
        end = stock["elapsed"][-1] if stock["elapsed"] else 0.0
        return {"stock_s": f"> {end:.0f} (not reached)", "ratio": f"> {end / elapsed:.1f}x"}
    return {"stock_s": f"{reached:.0f}", "ratio": f"{reached / elapsed:.1f}x"}


def pair_row(target: str, source: str, trials_per_task: int, stock: dict, transfer: dict) -> dict:
    row = {"target": target, "source": source, "trials_per_task": trials_per_task, "tasks": stock["tasks"]}
    s, t = stock["curve"], transfer["curve"]
    row["stock_final_ms"] = f"{s['latency'][-1] * 1e3:.3f}" if s["latency"] else "-"
    row["stock_final_s"] = f"{s['elapsed'][-1]:.0f}" if s["elapsed"] else "-"
    if not t["latency"]:  # some task never produced a working candidate
        return {**row, "transfer_first_round_ms": "-"}
    points = {"first_round": (t["elapsed"][0], t["latency"][0]), "final": (t["elapsed"][-1], t["latency"][-1])}
    for label, (elapsed, latency) in points.items():
        row[f"transfer_{label}_ms"] = f"{latency * 1e3:.3f}"
        row[f"transfer_{label}_s"] = f"{elapsed:.0f}"
        compared = compare_point(s, elapsed, latency)
        row[f"stock_s_to_{label}"] = compared["stock_s"]
        row[f"speedup_{label}"] = compared["ratio"]
    row["compiled_ms_stock"] = f"{stock['latency_after'] * 1e3:.3f}"
    row["compiled_ms_transfer"] = f"{transfer['latency_after'] * 1e3:.3f}"
    row["wall_s_stock"] = f"{stock['process_seconds']:.0f}"
    row["wall_s_transfer"] = f"{transfer['process_seconds']:.0f}"
    seeded = transfer.get("transfer") or {}
    row["transferred_schedules"] = sum(src["schedules"] for src in seeded.get("sources", []))
    return row


def run(args: argparse.Namespace) -> None:
    from tuner.cli.catalog import catalog
    from workloads import list_workloads

    out = Path(args.out).resolve()  # the steps run from the repository root
    out.mkdir(parents=True, exist_ok=True)
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    entries = {e.name: e for e in list_workloads()}
    names = dict.fromkeys(parse_workload(spec)[0] for pair in pairs for spec in pair)
    tasks = {info.name: info.distinct_tasks for info in catalog([entries[name] for name in names])}
    runs: dict[str, dict] = {}  # label -> step result
    stock_dirs: dict[str, Path] = {}  # workload spec -> a work dir of a run without transfer

    def tune_once(label: str, spec: str, per_task: int, transfer_from: Path | None = None) -> dict:
        work_dir = out / f"{label}-seed{args.seed}"  # work dirs and logs are left out of git
        shutil.rmtree(work_dir, ignore_errors=True)
        trials = per_task * tasks[parse_workload(spec)[0]]
        step = step_args("--step", spec, target=args.target, trials=trials, work_dir=work_dir, seed=args.seed)
        if transfer_from is not None:
            step += ["--transfer-from", str(transfer_from)]
        print(
            f"[{label}] tuning {spec}: {trials} trials{f' from {transfer_from}' if transfer_from else ''} ...",
            flush=True,
        )
        runs[label] = run_step(Path(__file__), step, out / f"{label}.log")
        print(f"[{label}] {runs[label]['process_seconds']:.0f} s", flush=True)
        if transfer_from is None:
            stock_dirs.setdefault(spec, work_dir)
        return runs[label]

    rows = []
    for target, source in pairs:
        if source not in stock_dirs:
            earlier = out / f"source-{_slug(source)}-seed{args.seed}"
            if (
                args.reuse_sources
                and _finished_trials(earlier) == args.source_trials * tasks[parse_workload(source)[0]]
            ):
                print(f"[source-{_slug(source)}] reusing the finished run in {earlier}", flush=True)
                stock_dirs[source] = earlier
            else:
                tune_once(f"source-{_slug(source)}", source, args.source_trials)
        stock = tune_once(f"{_slug(target)}-stock", target, args.trials)
        transfer = tune_once(f"{_slug(target)}-from-{_slug(source)}", target, args.trials, stock_dirs[source])
        rows.append(pair_row(target, source, args.trials, stock, transfer))
        print(markdown_table(rows[-1:], list(rows[-1])), flush=True)
    (out / "curves.json").write_text(json.dumps({label: r["curve"] for label, r in runs.items()}))
    write_csv(out / "transfer_tuning.csv", rows)
    (out / "transfer_tuning.md").write_text(_markdown(rows, args))
    _plot(rows, runs, out / "transfer_tuning.png")
    print("\n" + markdown_table(rows, list(rows[0])))


def _finished_trials(work_dir: Path) -> int | None:
    """The trials of the finished run in ``work_dir``; None if there is none."""
    from tuner.database.workdir import ResultRecord, WorkDir, read_meta

    if not WorkDir(work_dir).database.exists():
        return None
    db = WorkDir(work_dir).open_database(read_only=True)
    try:
        result = read_meta(db, ResultRecord)
        return result.trials if result else None
    finally:
        db.close()


def _slug(spec: str) -> str:
    return spec.replace("@", "-b")


def _markdown(rows: list[dict], args: argparse.Namespace) -> str:
    columns = ["target", "source", "tasks", "trials_per_task", "transferred_schedules",
               "transfer_first_round_ms", "transfer_first_round_s", "stock_s_to_first_round", "speedup_first_round",
               "transfer_final_ms", "transfer_final_s", "stock_s_to_final", "speedup_final", "stock_final_ms",
               "compiled_ms_stock", "compiled_ms_transfer", "wall_s_stock", "wall_s_transfer"]  # fmt: skip
    columns = [c for c in columns if all(c in r for r in rows)]
    return (
        f"# Transfer-tuning\n\ntarget `{args.target}`, seed {args.seed}; {args.trials} trials per task for each target "
        f"run, {args.source_trials} per task for each source run. Model latency = sum over tasks of launches x best "
        "latency measured so far; seconds are tuning seconds (the transfer run's include its replays and cost-model "
        "warm start; the source's tuning is not counted). `speedup` = stock's seconds to reach the transfer run's "
        "latency / the transfer run's seconds (`>` where stock never reached it: a lower bound); the goal, after the "
        "paper, is 5x or more. `compiled_ms`: the tuned model as compiled and timed at the end of each run (separate "
        "processes); `wall_s`: each run's process, start to end.\n\n"
        + markdown_table(rows, columns)
        + "\n\n![latency against tuning time](transfer_tuning.png)\n"
    )


def _plot(rows: list[dict], runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        target, source = row["target"], row["source"]
        for label, name in (
            (f"{_slug(target)}-stock", "no transfer"),
            (f"{_slug(target)}-from-{_slug(source)}", f"from {source}"),
        ):
            curve = runs[label]["curve"]
            ax.step(curve["elapsed"], [v * 1e3 for v in curve["latency"]], where="post", label=name)
        ax.set_title(f"{target} from {source}")
        ax.set_xlabel("tuning time (s)")
        ax.set_ylabel("model latency (ms, sum of best kernels)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pairs", nargs="+", default=None, metavar="TARGET:SOURCE", help=f"default: {' '.join(DEFAULT_PAIRS)}"
    )
    parser.add_argument("--target", default="llvm")
    parser.add_argument(
        "--trials", type=int, default=None, help="trials per task of each target run (default: 24; 8 with --quick)"
    )
    parser.add_argument(
        "--source-trials",
        type=int,
        default=None,
        help="trials per task of each source run (default: 24; 8 with --quick)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--reuse-sources",
        action="store_true",
        help="reuse a source's finished run from an earlier call with the same --out, seed and --source-trials",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few minutes: tiny-resnet from tiny-resnet at batch 4"
    )
    parser.add_argument(
        "--out", default=None, help="default: experiments/results/transfer_tuning (its quick/ with --quick)"
    )
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--transfer-from", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(tune_step(args.step, args.target, args.trials, args.work_dir, args.seed, args.transfer_from)))
        return
    args.pairs = args.pairs or (QUICK_PAIRS if args.quick else DEFAULT_PAIRS)
    args.trials = args.trials or (8 if args.quick else 24)
    args.source_trials = args.source_trials or (8 if args.quick else 24)
    args.out = args.out or ("experiments/results/transfer_tuning" + ("/quick" if args.quick else ""))
    run(args)


if __name__ == "__main__":
    main()
