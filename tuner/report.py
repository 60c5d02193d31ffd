"""``tuner report``: a markdown summary of a work dir and a plot of best latency against trials
and against tuning time."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from measure.timing import relative_spread

from .database import Record, TuningDatabase
from .errors import TunerError
from .progress import filter_summary, format_latency, format_phases, format_seconds
from .targets import describe_target
from .workdir import DATABASE_FILE


@dataclass
class Curve:
    """The best (model) latency after each measured candidate."""

    trials: list[int]
    elapsed: list[float]
    latency: list[float]


def best_latency_curve(records: list[Record], weights: dict[int, int]) -> Curve:
    """After each record, the sum over tasks of weight x best latency so far; points start once
    every task has a working candidate."""
    best: dict[int, float] = {}
    curve = Curve([], [], [])
    for index, record in enumerate(records, start=1):
        if record.workload_id not in weights:
            continue
        if record.latency is not None and record.latency < best.get(record.workload_id, float("inf")):
            best[record.workload_id] = record.latency
        if len(best) == len(weights):
            curve.trials.append(index)
            curve.elapsed.append(record.elapsed)
            curve.latency.append(sum(weights[w] * lat for w, lat in best.items()))
    return curve


def job_curve(db: TuningDatabase) -> Curve:
    """The best-latency curve of the tuning job ``db`` holds (its target's records, its tasks' weights)."""
    job = db.get_meta("job")
    return best_latency_curve(db.records(job["target"]), {t["workload_id"]: t["weight"] for t in job["tasks"]})


def write_report(work_dir: str | Path, output_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write report.md and report.png for a work dir; returns their paths."""
    work_dir = Path(work_dir)
    db_path = work_dir / DATABASE_FILE
    if not db_path.exists():
        raise TunerError(
            f"{work_dir} holds no tuning database ({DATABASE_FILE}): run `tuner tune ... --work-dir {work_dir}` first"
        )
    db = TuningDatabase(db_path, read_only=True)
    try:
        job = db.get_meta("job")
        if job is None:
            raise TunerError(f"{db_path} has no job description: it was not written by `tuner tune`")
        result = db.get_meta("result", {})
        filtered = db.get_meta("trimmer", {})
        transferred = db.get_meta("transfer", {})
        records = db.records(job["target"])
    finally:
        db.close()
    output = Path(output_dir) if output_dir else work_dir
    output.mkdir(parents=True, exist_ok=True)
    tasks = job["tasks"]
    weights = {t["workload_id"]: t["weight"] for t in tasks}
    curve = best_latency_curve(records, weights)
    png = output / "report.png"
    _plot(curve, job["model"], png)
    md = output / "report.md"
    md.write_text(_markdown(job, result, filtered, transferred, records, curve, png.name, work_dir))
    return md, png


def _markdown(
    job: dict,
    result: dict,
    filtered: dict,
    transferred: dict,
    records: list[Record],
    curve: Curve,
    png_name: str,
    work_dir: Path,
) -> str:
    by_task: dict[int, list[Record]] = {}
    for record in records:
        by_task.setdefault(record.workload_id, []).append(record)
    elapsed = max((r.elapsed for r in records), default=0.0)
    lines = [
        f"# Tuning report: {job['model']}",
        "",
        f"- target: `{describe_target(job['target'])}`",
        f"- trials measured: {len(records)} in {format_seconds(elapsed)} of tuning",
    ]
    if result.get("latency_after"):
        before, after = result["latency_before"], result["latency_after"]
        lines.append(
            f"- latency: {format_latency(before)} with TVM's default schedules, {format_latency(after)} tuned ({before / after:.2f}x)"
        )
    if result.get("seconds"):
        lines.append("- time of the last run: " + format_phases(result["seconds"]))
    if result.get("stop_reason"):
        lines.append(f"- stopped by {result['stop_reason']} (task scheduler: {result.get('scheduler', 'gradient')})")
    if filtered.get("dropped"):
        lines.append("- " + filter_summary(filtered))
    lines += _quality_summary(work_dir)
    for source in transferred.get("sources", []):
        lines.append(
            f"- transfer from `{source['work_dir']}`: {source['schedules']} schedules from {source['source_kernels']} kernels "
            f"seeded {source['tasks']} of {len(job['tasks'])} tasks"
        )
    if transferred.get("cost_model_samples"):
        lines.append(
            f"- cost model warm-started with {transferred['cost_model_samples']} measurements of the source runs"
        )
    failures = Counter(r.status for r in records if r.status != "ok")
    if failures:
        lines.append("- failed candidates: " + ", ".join(f"{n} {status}" for status, n in sorted(failures.items())))
    lines += _dop_summary(work_dir)
    lines += [
        "",
        "| task | launches | trials | best | spread | samples | GFLOP/s | failed | verified |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for task in job["tasks"]:
        mine = by_task.get(task["workload_id"], [])
        ok = [r for r in mine if r.status == "ok"]
        best = min(ok, key=lambda r: r.latency) if ok else None
        speed = f"{task['flops'] / best.latency / 1e9:.1f}" if best and task["flops"] else "-"
        verified = {True: "yes", False: "no", None: "-"}[best.verified if best else None]
        lines.append(
            f"| {task['name']} | {task['weight']} | {len(mine)} | {format_latency(best.latency if best else None)} "
            f"| {f'{relative_spread(best.samples):.1%}' if best else '-'} | {len(best.samples) if best else '-'} | {speed} "
            f"| {len(mine) - len(ok)} | {verified} |"
        )
    if curve.latency:
        lines += ["", f"Best {'model ' if len(job['tasks']) > 1 else ''}latency: {format_latency(curve.latency[0])} after {curve.trials[0]} trials, "
                  f"{format_latency(curve.latency[-1])} after {curve.trials[-1]}."]  # fmt: skip
    lines += ["", f"![best latency against trials and tuning time]({png_name})", ""]
    return "\n".join(lines)


def _quality_summary(work_dir: Path) -> list[str]:
    """The cost model's rank quality on batches it scored before they were measured (logs/costmodel.jsonl)."""
    entries = _jsonl(work_dir / "logs" / "costmodel.jsonl")
    taus = [e["tau"] for e in entries if e.get("tau") is not None]
    recalls = [e["top_k_recall"] for e in entries if e.get("top_k_recall") is not None]
    if not taus:
        return []
    last = taus[-len(taus) // 4 or -1 :]
    return [
        f"- cost model, predicted against measured order per batch: Kendall tau {statistics.mean(taus):+.2f} on average, "
        f"{statistics.mean(last):+.2f} over the last quarter; top-k recall {statistics.mean(recalls):.0%}; every batch in logs/costmodel.jsonl"
    ]


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except OSError:
        return []


def _dop_summary(work_dir: Path) -> list[str]:
    """The DOP controller's decisions (logs/dop.jsonl), in one line."""
    decisions = _jsonl(work_dir / "logs" / "dop.jsonl")
    if not decisions:
        return []
    losses = sum(d["reason"].startswith("loss") for d in decisions)
    counts = Counter(d["dop"] for d in decisions)
    spread = ", ".join(f"{n} at {dop}" for dop, n in sorted(counts.items()))
    return [
        f"- measurement parallelism: {len(decisions)} windows ({spread}), {losses} loss(es); every decision in logs/dop.jsonl"
    ]


def _plot(curve: Curve, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_trials, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    ms = [lat * 1e3 for lat in curve.latency]
    by_trials.step(curve.trials, ms, where="post")
    by_trials.set_xlabel("trials measured")
    by_trials.set_ylabel("best latency (ms)")
    by_time.step(curve.elapsed, ms, where="post", color="tab:orange")
    by_time.set_xlabel("tuning time (s)")
    for ax in (by_trials, by_time):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: best latency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
