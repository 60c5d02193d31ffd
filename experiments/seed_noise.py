"""How much of a filter-on / filter-off difference in ``experiments/trimmer.py`` could be chance:
two sets of runs that differ only in their seeds, compared on the same measure.

Sets of ``k`` runs are drawn with replacement from the runs without the filter; one set is the
reference (its averaged curve sets the target), the other is scored as the filter's set would be.
The spread of those scores is what the measure gives by chance with ``k`` seeds. At the end of a
budget the averaged curves are nearly flat, so "measurements to come within 2% of where the
reference ends" swings widely by chance; a target the reference reaches earlier (at 3/4 of the
budget) is steadier.

    python experiments/seed_noise.py experiments/results/trimmer/sixteen-runs-conv2d-resnet18-l2 --sets 4 8 16
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.filter_curves import geometric_mean_curve, run_curve, saved_share, trials_to_reach  # noqa: E402

TARGETS = {"end": 1.0, "3/4": 0.75}  # where on the reference's averaged curve the target is taken


def target_index(trials: int, at: float) -> int:
    """The index into a curve of ``trials`` points at fraction ``at`` of the budget."""
    return max(0, min(trials, round(at * trials)) - 1)


def scored(reference: Sequence[float], other: Sequence[float], at: float, shared: int) -> float | None:
    """The share of measurements (after ``shared``) ``other`` saved reaching the latency
    ``reference`` has at fraction ``at`` of the budget; where it never got there, the bound; None
    where the reference got there within the shared measurements."""
    trials = len(reference)
    target = reference[target_index(trials, at)]
    share = saved_share(trials_to_reach(other, target), trials_to_reach(reference, target), shared, trials)
    return share[0] if share else None


def chance_spread(
    curves: Sequence[Sequence[float]], set_size: int, at: float, shared: int = 0, draws: int = 2000, seed: int = 0
) -> dict[str, float]:
    """The 10% and 90% quantiles of ``scored`` between two sets of ``set_size`` of ``curves`` (best-latency curves
    of runs of one variant) drawn with replacement."""
    rng = random.Random(seed)
    scores = []
    for _ in range(draws):
        reference = geometric_mean_curve([rng.choice(curves) for _ in range(set_size)])
        other = geometric_mean_curve([rng.choice(curves) for _ in range(set_size)])
        score = scored(reference, other, at, shared)
        if score is not None:
            scores.append(score)
    if not scores:
        return {"p10": float("nan"), "p90": float("nan")}
    scores.sort()

    def quantile(p: float) -> float:
        return scores[round(p * (len(scores) - 1))]

    return {"p10": quantile(0.1), "p90": quantile(0.9)}


def describe(spread: dict[str, float]) -> str:
    return f"{spread['p10']:+.0%} .. {spread['p90']:+.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "runs", type=Path, help="a folder of experiments/trimmer.py output; its *-filter-off-seed* runs are used"
    )
    parser.add_argument("--sets", type=int, nargs="+", default=[4, 8, 16], help="seeds per set")
    parser.add_argument("--shared", type=int, default=0, help="measurements the runs shared before they parted")
    args = parser.parse_args()
    work_dirs = sorted(d for d in args.runs.glob("*-filter-off-seed*") if d.is_dir())
    if len(work_dirs) < 2:
        parser.error(
            f"{args.runs} holds {len(work_dirs)} runs without the filter (*-filter-off-seed*); at least 2 are needed"
        )
    trials = min(_measured(d) for d in work_dirs)
    curves = [run_curve(d, trials)["latency"] for d in work_dirs]
    print(
        f"{len(curves)} runs without the filter, {trials} measurements each; 'saved' between two sets that differ "
        "only by seed (10-90%):"
    )
    for size in args.sets:
        cells = [
            f"target at {name}: {describe(chance_spread(curves, size, at, args.shared))}"
            for name, at in TARGETS.items()
        ]
        print(f"  sets of {size:>2}: " + ";  ".join(cells))


def _measured(work_dir: Path) -> int:
    from tuner.database.workdir import WorkDir

    db = WorkDir(work_dir).open_database(read_only=True)
    try:
        return len(db.records())
    finally:
        db.close()


if __name__ == "__main__":
    main()
