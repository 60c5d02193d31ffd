"""The measures experiments/trimmer.py reports: measurements saved to a target, and how much of
that the seeds alone can make; and what experiments/filter_replay.py replays dropping on."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from experiments.filter_curves import saved_share
from experiments.filter_replay import _task_batches, model_latency_curve, what_dropping_loses
from experiments.seed_noise import chance_spread, scored
from experiments.trimmer import _saved


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


def _records(*measured: tuple[int, float | None]) -> list[SimpleNamespace]:
    """Records of (task, latency or None for a failure), in measurement order."""
    return [
        SimpleNamespace(id=i, kernel_id=task, latency=latency, elapsed=float(i))
        for i, (task, latency) in enumerate(measured)
    ]


def test_a_replayed_batch_is_a_run_of_one_tasks_measurements_cut_to_the_batch_size():
    records = _records((1, 3.0), (1, 2.0), (1, 1.0), (2, 5.0), (1, 0.5))
    assert [[r.id for r in chunk] for chunk in _task_batches(records, 2)] == [[0, 1], [2], [3], [4]]


def test_a_models_replayed_latency_counts_each_task_by_its_launches_once_every_task_has_one():
    records = _records((1, 3.0), (1, None), (2, 5.0), (1, 1.0))
    assert model_latency_curve(records, {1: 2, 2: 1}) == [math.inf, math.inf, 11.0, 7.0]


def test_dropping_the_candidate_that_improved_a_task_loses_that_gain_and_the_end_shows_it():
    records = _records((1, 3.0), (2, 5.0), (1, 4.0), (1, 1.0))
    batches = [{"records": records[2:], "scores": np.array([0.0, -1.0]), "best_before": 3.0}]
    kept = what_dropping_loses(batches, records, {1: 1, 2: 1}, lambda scores: {0})
    assert (kept["dropped"], kept["improving_batches"], kept["improvement_lost"], kept["end_vs_unfiltered"]) == (
        1,
        1,
        0,
        1.0,
    )
    lost = what_dropping_loses(batches, records, {1: 1, 2: 1}, lambda scores: {1})
    assert (lost["improvement_lost"], lost["end_vs_unfiltered"], lost["curve"]) == (1, 8.0 / 6.0, [math.inf, 8.0, 8.0])


def test_compare_builds_names_each_build_and_refuses_a_missing_library_in_one_line(tmp_path):
    from experiments.compare_builds import _build

    library = tmp_path / "a.so"
    library.write_bytes(b"")
    assert _build(f"after={library}") == ("after", library)
    with pytest.raises(SystemExit, match="is not LABEL=PATH"):
        _build(str(library))
    with pytest.raises(SystemExit, match="tuner apply"):
        _build(f"before={tmp_path / 'missing.so'}")
