"""``tuner report``: a markdown summary of a work dir and a plot of best latency against trials
and against tuning time."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from measure.timing.sampling import relative_spread
from tuner.compile.figures import at_machine_speed, fraction_of_peak
from tuner.database.database import Record, TuningDatabase
from tuner.database.workdir import FILTER_LEDGER_KEY, JobRecord, ResultRecord, TransferRecord, WorkDir, read_meta
from tuner.errors import TunerError
from tuner.progress import filter_summary, format_latency, format_phases, format_seconds
from tuner.targets import describe_target


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
        if record.kernel_id not in weights:
            continue
        if record.latency is not None and record.latency < best.get(record.kernel_id, float("inf")):
            best[record.kernel_id] = record.latency
        if len(best) == len(weights):
            curve.trials.append(index)
            curve.elapsed.append(record.elapsed)
            curve.latency.append(sum(weights[w] * lat for w, lat in best.items()))
    return curve


def job_curve(db: TuningDatabase) -> Curve:
    """The best-latency curve of the tuning job ``db`` holds (its target's records, its tasks' weights)."""
    job = read_meta(db, JobRecord)
    return best_latency_curve(db.records(job.target), job.weights)


def write_report(work_dir: str | Path, output_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write report.md and report.png for a work dir; returns their paths."""
    run_dir = WorkDir.existing(work_dir, "report on")
    db = run_dir.open_database(read_only=True)
    try:
        job = read_meta(db, JobRecord)
        if job is None:
            raise TunerError(f"{run_dir.database} has no job description: it was not written by `tuner tune`")
        result = read_meta(db, ResultRecord) or ResultRecord()
        filtered = db.get_meta(FILTER_LEDGER_KEY, {})
        transferred = read_meta(db, TransferRecord) or TransferRecord()
        records = db.records(job.target)
    finally:
        db.close()
    output = Path(output_dir) if output_dir else run_dir.path
    output.mkdir(parents=True, exist_ok=True)
    curve = best_latency_curve(records, job.weights)
    png = output / "report.png"
    _plot(curve, job.model, png)
    md = output / "report.md"
    md.write_text(_markdown(job, result, filtered, transferred, records, curve, png.name, run_dir))
    return md, png


def _markdown(
    job: JobRecord,
    result: ResultRecord,
    filtered: dict,
    transferred: TransferRecord,
    records: list[Record],
    curve: Curve,
    png_name: str,
    work_dir: WorkDir,
) -> str:
    by_task: dict[int, list[Record]] = {}
    for record in records:
        by_task.setdefault(record.kernel_id, []).append(record)
    elapsed = max((r.elapsed for r in records), default=0.0)
    lines = [
        f"# Tuning report: {job.model}",
        "",
        f"- target: `{describe_target(job.target)}`",
        f"- trials measured: {len(records)} in {format_seconds(elapsed)} of tuning",
    ]
    if result.latency_after and result.latency_before:
        before, after = result.latency_before, result.latency_after
        lines.append(
            f"- latency: {format_latency(before)} with TVM's default schedules, {format_latency(after)} tuned "
            f"({before / after:.2f}x)"
        )
    elif result.latency_after:
        lines.append(f"- latency: {format_latency(result.latency_after)} tuned (TVM's default schedules not timed)")
    if result.seconds:
        lines.append("- time of the last run: " + format_phases(result.seconds, result.device_seconds))
    if result.machine_speed:
        lines.append(
            f"- the machine ran at {result.machine_speed:.2f} of its calibrated speed while the kernels were timed in "
            "the model: the table's predictions are at that speed"
        )
    if result.stop_reason:
        lines.append(f"- stopped by {result.stop_reason} (task scheduler: {result.scheduler})")
    if filtered.get("dropped"):
        lines.append("- " + filter_summary(filtered))
    lines += _quality_summary(work_dir)
    for source in transferred.sources:
        lines.append(
            f"- transfer from `{source['work_dir']}`: {source['schedules']} schedules from {source['source_kernels']} "
            "kernels "
            f"seeded {source['tasks']} of {len(job.tasks)} tasks"
        )
    if transferred.cost_model_samples:
        lines.append(f"- cost model warm-started with {transferred.cost_model_samples} measurements of the source runs")
    failures = Counter(r.status for r in records if r.status != "ok")
    if failures:
        lines.append("- failed candidates: " + ", ".join(f"{n} {status}" for status, n in sorted(failures.items())))
    lines += _dop_summary(work_dir)
    lines += _in_model_choice_summary(result.kernels)
    lines += [
        "",
        "| task | launches | trials | best | spread | samples | GFLOP/s | failed | verified | predicted "
        "| analytic measured | in the model | of peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for task in job.tasks:
        mine = by_task.get(task.kernel_id, [])
        ok = [r for r in mine if r.status == "ok"]
        best = min(ok, key=lambda r: r.latency) if ok else None
        speed = f"{task.flops / best.latency / 1e9:.1f}" if best and task.flops else "-"
        verified = {True: "yes", False: "no", None: "-"}[best.verified if best else None]
        lines.append(
            f"| {task.name} | {task.weight} | {len(mine)} | {format_latency(best.latency if best else None)} "
            f"| {f'{relative_spread(best.samples):.1%}' if best else '-'} | {len(best.samples) if best else '-'} | "
            f"{speed} "
            f"| {len(mine) - len(ok)} | {verified} "
            f"| {_figures_cells(result.kernels.get(task.name), task.flops, best, result.machine_speed)} |"
        )
    if curve.latency:
        first, last = format_latency(curve.latency[0]), format_latency(curve.latency[-1])
        what = "model latency" if len(job.tasks) > 1 else "latency"
        lines += ["", f"Best {what}: {first} after {curve.trials[0]} trials, {last} after {curve.trials[-1]}."]
    lines += ["", f"![best latency against trials and tuning time]({png_name})", ""]
    return "\n".join(lines)


def _figures_cells(figures: dict | None, flops: float, best: Record | None, machine_speed: float | None) -> str:
    """Predicted (at ``machine_speed`` where known), analytic measured, in the model, and the fraction of peak
    (of the best latency alone, else of the time inside the model), as table cells; "-" where unknown."""
    figures = figures or {}
    fraction = fraction_of_peak(flops, best.latency if best else figures.get("in_model"), figures.get("peak_gflops"))
    predicted = at_machine_speed(figures.get("predicted"), machine_speed)
    seconds = [predicted, figures.get("analytic_measured"), figures.get("in_model")]
    cells = [format_latency(value) if value else "-" for value in seconds]
    return " | ".join([*cells, f"{fraction:.0%}" if fraction is not None else "-"])


def _in_model_choice_summary(kernels: dict[str, dict]) -> list[str]:
    """The kernels built with their analytic schedule for running faster inside the model than their tuned best
    (``tuner.compile.in_model_choice``), with both times there."""
    beaten = {name: figures for name, figures in kernels.items() if figures.get("tuned_in_model")}
    if not beaten:
        return []
    times = ", ".join(
        f"{name} {format_latency(figures['in_model'])} against {format_latency(figures['tuned_in_model'])}"
        for name, figures in beaten.items()
    )
    return [f"- built with their analytic schedule, faster inside the model than their tuned best: {times}"]


def _quality_summary(work_dir: WorkDir) -> list[str]:
    """The cost model's rank quality on batches it scored before they were measured (logs/costmodel.jsonl)."""
    entries = _jsonl(work_dir.logs / "costmodel.jsonl")
    taus = [e["tau"] for e in entries if e.get("tau") is not None]
    recalls = [e["top_k_recall"] for e in entries if e.get("top_k_recall") is not None]
    if not taus:
        return []
    last = taus[-len(taus) // 4 or -1 :]
    return [
        f"- cost model, predicted against measured order per batch: Kendall tau {statistics.mean(taus):+.2f} on "
        "average, "
        f"{statistics.mean(last):+.2f} over the last quarter; top-k recall {statistics.mean(recalls):.0%}; every "
        "batch in logs/costmodel.jsonl"
    ]


def _jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    except OSError:
        return []


def _dop_summary(work_dir: WorkDir) -> list[str]:
    """The DOP controller's decisions (logs/dop.jsonl), in one line."""
    decisions = _jsonl(work_dir.logs / "dop.jsonl")
    if not decisions:
        return []
    losses = sum(d["reason"].startswith("loss") for d in decisions)
    counts = Counter(d["dop"] for d in decisions)
    spread = ", ".join(f"{n} at {dop}" for dop, n in sorted(counts.items()))
    return [
        f"- measurement parallelism: {len(decisions)} windows ({spread}), {losses} loss(es); every decision in "
        "logs/dop.jsonl"
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
