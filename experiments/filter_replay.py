"""What a cost-model filter could save, replayed offline on runs tuned without it.

For each unfiltered run (the work dir of one ``tune``, of one task or a whole model), the
measured candidates are cut into the run's batches (consecutive measurements of one task);
before each batch, a fresh cost model is trained on everything measured earlier and scores the
batch, as the loop would have. Two kinds of filter are replayed: dropping a fixed share of each
batch (its worst-scored), and dropping what the model predicts at least some ratio slower than
the task's best (the rule ``costmodel.CandidateFilter`` uses at full trust); a task's batches
before its first working candidate are not judged. For each, this counts what dropping would
have lost: the batches whose improvement of the task's best would have been missed, and the
latency (the model's: launches x best, summed over tasks) the run would have ended with. No
candidate is built or run: only the stored results are used.

    python experiments/filter_replay.py \
        experiments/results/trimmer/sixteen-runs-conv2d-resnet18-l2/*-filter-off-seed*[0-9]
    python experiments/filter_replay.py --batch 8 \
        experiments/results/transfer_tuning/resnet18-stock-seed1   # a whole model
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.filter_curves import geometric_mean_curve, trials_to_reach  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402

SHARES = (0.25, 0.5, 0.75)
RATIOS = (1.5, 2.0, 3.0)


def replay_run(
    work_dir: Path, batch: int, score: str, warm_from: list[Path] = ()
) -> tuple[list[dict], list, dict[int, float]]:
    """The run's records in measurement order, its tasks' weights (launches per inference; 1 for a
    work dir without a job description) and its batches: runs of consecutive records of one task,
    at most ``batch`` long. For each batch of a task that has a working candidate before it: its
    records, its candidates' scores (``score``: the ensemble's mean, optimistic or pessimistic
    estimate) from a model trained on everything measured earlier (each task its own group, as in
    the loop; ``oracle``: the measured log-speed relative to that best, what a perfect model would
    predict), and the task's best latency before it. ``warm_from``: saved cost models whose
    training data every model also learns from, as a run warm-started by transfer-tuning does."""
    import tvm

    from costmodel import CostModel
    from costmodel.model import read_training_data
    from tuner.database.workdir import JobRecord, WorkDir, read_meta

    db = WorkDir(work_dir).open_database(read_only=True)
    try:
        records = db.records()
        mods = {w: db.kernel_mod(w) for w in dict.fromkeys(r.kernel_id for r in records)}
        job = read_meta(db, JobRecord)
    finally:
        db.close()
    weights = job.weights if job else dict.fromkeys(mods, 1)
    target = tvm.target.Target(records[0].target)
    warm = [
        (f"warm{index}:{group}", x, y)
        for index, path in enumerate(warm_from)
        for group, x, y in read_training_data(path)
    ]
    rows = {} if score == "oracle" else _feature_rows(records, mods, target)  # a perfect model needs no features

    batches = []
    measured: dict[int, list] = {kernel_id: [] for kernel_id in mods}  # each task's records before the batch
    for chunk in _task_batches(records, batch):
        mine = measured[chunk[0].kernel_id]
        best_before = min((r.latency for r in mine if r.latency is not None), default=None)
        if best_before is not None and score == "oracle":
            speeds = [math.log(best_before / r.latency) if r.latency is not None else -math.inf for r in chunk]
            batches.append({"records": chunk, "scores": np.array(speeds), "best_before": best_before})
        elif best_before is not None:
            model = CostModel(seed=1)
            for group, x, y in warm:
                model.add(group, x, y)
            for kernel_id, done in measured.items():
                if done:
                    model.add(str(kernel_id), np.stack([rows[r.id] for r in done]), [r.latency for r in done])
            if model.fit():
                mean, spread = model.predict_spread(np.stack([rows[r.id] for r in chunk]))
                scores = {"mean": mean, "optimistic": mean + spread, "pessimistic": mean - spread}[score]
                batches.append({"records": chunk, "scores": scores, "best_before": best_before})
        mine.extend(chunk)
    return batches, records, weights


def _feature_rows(records: list, mods: dict, target) -> dict[int, np.ndarray]:
    """Each record's features (by record id), extracted in one batch per task."""
    from costmodel import CandidateFeatures, CostModel
    from tuner.search.task_search import Candidate, TaskSearch
    from tuner.spaces import metaschedule as msc

    rows = {}
    for kernel_id, mod in mods.items():
        search = TaskSearch(mod, target, 1, CostModel(seed=1), CandidateFeatures(), group="replay")
        mine = [r for r in records if r.kernel_id == kernel_id]
        features = search.feature_rows([Candidate(r.candidate, msc.schedule_from_json(mod, r.trace)) for r in mine])
        rows.update({r.id: row for r, row in zip(mine, features, strict=True)})
    return rows


def _task_batches(records: list, batch: int) -> list[list]:
    """The runs of consecutive records of one task, cut into pieces of at most ``batch``."""
    pieces, start = [], 0
    while start < len(records):
        end = start + 1
        while end < len(records) and end - start < batch and records[end].kernel_id == records[start].kernel_id:
            end += 1
        pieces.append(records[start:end])
        start = end
    return pieces


def worst_share(share: float):
    """A filter that drops the worst-scored ``share`` of a batch."""
    return lambda scores: set(np.argsort(scores, kind="stable")[: int(len(scores) * share)].tolist())


def slower_than(ratio: float):
    """A filter that drops what the model scores at least ``ratio`` times slower than the best."""
    return lambda scores: {i for i, score in enumerate(scores) if score < -np.log(ratio)}


def what_dropping_loses(batches: list[dict], records: list, weights: dict[int, float], rule) -> dict:
    """Dropping in each batch what ``rule`` (scores -> indices) picks: measurements saved,
    improving batches whose improvement is lost, and the final model latency against the unfiltered run's."""
    dropped: set[int] = set()
    improving = lost = 0
    for b in batches:
        drop = rule(b["scores"])
        dropped |= {b["records"][i].id for i in drop}
        lats = [np.inf if r.latency is None else r.latency for r in b["records"]]
        batch_best = min(lats)
        if batch_best < b["best_before"]:
            improving += 1
            if min((lat for i, lat in enumerate(lats) if i not in drop), default=np.inf) > batch_best:
                lost += 1
    curve = model_latency_curve([r for r in records if r.id not in dropped], weights)
    return {
        "dropped": len(dropped),
        "improving_batches": improving,
        "improvement_lost": lost,
        "end_vs_unfiltered": curve[-1] / model_latency_curve(records, weights)[-1],
        "curve": curve,
    }


def model_latency_curve(records: list, weights: dict[int, float]) -> list[float]:
    """After each record, the sum over tasks of weight x best latency so far (inf until every
    task has a working candidate); for one task of weight 1, its best latency so far."""
    from tuner.cli.report import best_latency_curve

    curve = [math.inf] * len(records)
    measured = best_latency_curve(records, weights)
    for n, latency in zip(measured.trials, measured.latency, strict=True):
        curve[n - 1 :] = [latency] * (len(records) - n + 1)
    return curve


def padded(curves: list[list[float]]) -> list[list[float]]:
    """The curves extended to the longest one's length with their last value (a run that
    measured fewer candidates stays where it ended)."""
    length = max(map(len, curves))
    return [c + [c[-1]] * (length - len(c)) for c in curves]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dirs", nargs="+", type=Path)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument(
        "--warm-from",
        nargs="*",
        type=Path,
        default=[],
        help="saved cost models (WORK_DIR/cost_model.ubj) every replayed model also learns from",
    )
    parser.add_argument("--score", choices=["mean", "optimistic", "pessimistic", "oracle"], default="optimistic")
    args = parser.parse_args()
    table = []
    per_run = {}
    for work_dir in args.work_dirs:
        per_run[work_dir] = replay_run(work_dir, args.batch, args.score, args.warm_from)
        print(f"replayed {work_dir.name}", file=sys.stderr, flush=True)
    unfiltered = geometric_mean_curve(
        padded([model_latency_curve(records, weights) for _, records, weights in per_run.values()])
    )
    target = unfiltered[-1]
    print(f"unfiltered: target {target * 1e3:.4f} ms reached at measurement {trials_to_reach(unfiltered, target)}")
    measured = sum(len(records) for _, records, _ in per_run.values())
    rules = [(f"worst {share:.0%}", worst_share(share)) for share in SHARES]
    rules += [(f"scored {ratio:g}x slower", slower_than(ratio)) for ratio in RATIOS]
    for name, rule in rules:
        results = [what_dropping_loses(*run, rule) for run in per_run.values()]
        filtered_curve = geometric_mean_curve(padded([r["curve"] for r in results]))
        table.append(
            {
                "dropped": name,
                "runs": len(results),
                "saved": f"{sum(r['dropped'] for r in results) / measured:.0%}",
                "improving_batches": sum(r["improving_batches"] for r in results),
                "improvement_lost": sum(r["improvement_lost"] for r in results),
                "end_vs_unfiltered_geomean": round(
                    float(np.exp(statistics.fmean(np.log(r["end_vs_unfiltered"]) for r in results))), 3
                ),
                "end_worse_than_2pct": sum(r["end_vs_unfiltered"] > 1.02 for r in results),
                "measurements_to_target": trials_to_reach(filtered_curve, target),
            }
        )
    print(markdown_table(table, list(table[0])))


if __name__ == "__main__":
    main()
