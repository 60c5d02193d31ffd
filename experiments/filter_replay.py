"""What a cost-model filter could save, replayed offline on runs tuned without it.

For each unfiltered run (a work dir of one single-task ``tune``), the measured candidates are cut
into the run's batches; before each batch, a fresh cost model is trained on everything measured
earlier and scores the batch, as the loop would have. Two kinds of filter are replayed: dropping
a fixed share of each batch (its worst-scored), and dropping what the model predicts at least
some ratio slower than the task's best (the rule ``costmodel.TrimmerFilter`` uses at full trust).
For each, this counts what dropping would have lost: the batches whose improvement of the task's
best would have been missed, and the best latency the run would have ended with. No candidate is
built or run: only the stored results are used.

    python experiments/filter_replay.py experiments/results/trimmer/sixteen-runs-conv2d-resnet18-l2/*-filter-off-seed*[0-9]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.common import markdown_table  # noqa: E402
from experiments.trimmer import geometric_mean_curve, trials_to_reach  # noqa: E402

SHARES = (0.25, 0.5, 0.75)
RATIOS = (1.5, 2.0, 3.0)


def replay_run(work_dir: Path, batch: int, score: str) -> tuple[list[dict], list[float | None]]:
    """The run's latencies in measurement order (None for a failure) and, per batch after the
    first, its candidates' scores (``score``: the ensemble's mean, optimistic or pessimistic
    estimate) from a model trained on the earlier batches, their latencies, and the best latency
    measured before it."""
    import tvm

    from costmodel import CandidateFeatures, CostModel
    from tuner import metaschedule as msc
    from tuner.database import TuningDatabase
    from tuner.search import Candidate, TaskSearch

    db = TuningDatabase(work_dir / "tuning.db", read_only=True)
    try:
        records = db.records()
        (workload_id,) = {r.workload_id for r in records}
        mod = db.workload_mod(workload_id)
        target = tvm.target.Target(records[0].target)
    finally:
        db.close()
    search = TaskSearch(mod, target, 1, CostModel(seed=1), CandidateFeatures(), group="replay")  # for its feature extraction

    candidates = [Candidate(r.candidate, msc.schedule_from_json(mod, r.trace)) for r in records]
    rows = search.feature_rows(candidates)
    latencies = [r.latency for r in records]
    batches = []
    for start in range(batch, len(records), batch):
        model = CostModel(seed=1)
        model.add("replay", rows[:start], latencies[:start])
        if not model.fit():
            continue
        mean, spread = model.predict_spread(rows[start : start + batch])
        scores = {"mean": mean, "optimistic": mean + spread, "pessimistic": mean - spread}[score]
        before = min((lat for lat in latencies[:start] if lat is not None), default=np.inf)
        batches.append({"scores": scores, "latencies": latencies[start : start + batch], "best_before": before})
    return batches, latencies


def worst_share(share: float):
    """A filter that drops the worst-scored ``share`` of a batch."""
    return lambda scores: set(np.argsort(scores, kind="stable")[: int(len(scores) * share)].tolist())


def slower_than(ratio: float):
    """A filter that drops what the model scores at least ``ratio`` times slower than the best."""
    return lambda scores: {i for i, score in enumerate(scores) if score < -np.log(ratio)}


def what_dropping_loses(batches: list[dict], latencies: list[float | None], rule) -> dict:
    """Dropping in each batch what ``rule`` (scores -> indices) picks: measurements saved,
    improving batches whose improvement is lost, and the final best against the unfiltered run's."""
    dropped = improving = lost = 0
    curve = best_so_far(latencies[: len(latencies) - sum(len(b["latencies"]) for b in batches)])
    for b in batches:
        drop = rule(b["scores"])
        dropped += len(drop)
        lats = [np.inf if lat is None else lat for lat in b["latencies"]]
        batch_best = min(lats)
        kept = [lat for i, lat in enumerate(lats) if i not in drop]
        if batch_best < b["best_before"]:
            improving += 1
            if min(kept, default=np.inf) > batch_best:
                lost += 1
        curve += [min(curve[-1], lat) for lat in np.minimum.accumulate(kept)] if kept else []
    full_best = min(lat for lat in latencies if lat is not None)
    return {"dropped": dropped, "improving_batches": improving, "improvement_lost": lost, "end_vs_unfiltered": curve[-1] / full_best, "curve": curve}


def best_so_far(latencies: list[float | None]) -> list[float]:
    return np.minimum.accumulate([np.inf if lat is None else lat for lat in latencies]).tolist() if latencies else []


def padded(curves: list[list[float]]) -> list[list[float]]:
    """The curves extended to the longest one's length with their last value (a run that
    measured fewer candidates stays where it ended)."""
    length = max(map(len, curves))
    return [c + [c[-1]] * (length - len(c)) for c in curves]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dirs", nargs="+", type=Path)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--score", choices=["mean", "optimistic", "pessimistic"], default="optimistic")
    args = parser.parse_args()
    table = []
    per_run = {}
    for work_dir in args.work_dirs:
        per_run[work_dir] = replay_run(work_dir, args.batch, args.score)
        print(f"replayed {work_dir.name}", file=sys.stderr, flush=True)
    unfiltered = geometric_mean_curve(padded([best_so_far(lats) for _, lats in per_run.values()]))
    target = unfiltered[-1]
    print(f"unfiltered: target {target * 1e3:.4f} ms reached at measurement {trials_to_reach(unfiltered, target)}")
    measured = sum(len(lats) for _, lats in per_run.values())
    rules = [(f"worst {share:.0%}", worst_share(share)) for share in SHARES]
    rules += [(f"scored {ratio:g}x slower", slower_than(ratio)) for ratio in RATIOS]
    for name, rule in rules:
        results = [what_dropping_loses(batches, lats, rule) for batches, lats in per_run.values()]
        filtered_curve = geometric_mean_curve(padded([r["curve"] for r in results]))
        table.append(
            {
                "dropped": name,
                "runs": len(results),
                "saved": f"{sum(r['dropped'] for r in results) / measured:.0%}",
                "improving_batches": sum(r["improving_batches"] for r in results),
                "improvement_lost": sum(r["improvement_lost"] for r in results),
                "end_vs_unfiltered_geomean": round(float(np.exp(statistics.fmean(np.log(r["end_vs_unfiltered"]) for r in results))), 3),
                "end_worse_than_2pct": sum(r["end_vs_unfiltered"] > 1.02 for r in results),
                "measurements_to_target": trials_to_reach(filtered_curve, target),
            }
        )
    print(markdown_table(table, list(table[0])))


if __name__ == "__main__":
    main()
