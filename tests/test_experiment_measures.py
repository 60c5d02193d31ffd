"""The measures experiments/trimmer.py reports: measurements saved to a target, and how much of
that the seeds alone can make."""

from __future__ import annotations

from experiments.seed_noise import chance_spread, scored
from experiments.trimmer import _saved, saved_share


def curve(drops: dict[int, float], trials: int = 100) -> list[float]:
    """A best-latency curve that falls to ``value`` at measurement ``n`` for each ``n: value``."""
    points, best = [], float("inf")
    for n in range(1, trials + 1):
        best = min(best, drops.get(n, best))
        points.append(best)
    return points


def test_reaching_the_target_in_half_the_measurements_after_the_shared_start_saves_half():
    reference = curve({1: 2.0, 90: 1.0})
    faster = curve({1: 2.0, 50: 1.0})
    assert scored(reference, faster, 1.0, shared=10) == 1 - (50 - 10) / (90 - 10)
    assert saved_share(50, 90, 10, 100) == (0.5, True)
    assert _saved(None, 90, 10, 100) == "< -12%"  # never got there: at best the whole budget


def test_a_reference_that_got_there_within_the_shared_start_scores_nothing():
    assert scored(curve({5: 1.0}), curve({5: 1.0}), 1.0, shared=10) is None
    assert _saved(5, 5, 10, 100) == "-"


def test_sets_of_identical_runs_differ_by_nothing_and_sets_of_different_runs_do():
    same = chance_spread([curve({1: 2.0, 60: 1.0})] * 4, set_size=2, at=1.0, draws=50)
    assert same["p10"] == same["p90"] == 0.0
    varied = chance_spread([curve({1: 2.0, n: 1.0}) for n in (20, 40, 60, 80)], set_size=2, at=0.75, draws=200)
    assert varied["p10"] < 0 < varied["p90"]
