"""The Trimmer filter and the cost model's measured rank quality."""

import json

import numpy as np
import pytest

from costmodel import CandidateFilter, FilterLedger, FilterSettings, TrimmerFilter, kendall_tau, rank_quality


def test_kendall_tau_and_top_k_recall():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None
    # scores: higher = predicted faster; latencies: lower = faster; a failure ranks last
    quality = rank_quality([4, 3, 2, 1, 0], [1e-3, 2e-3, 3e-3, 4e-3, None], k=2)
    assert quality.tau == 1.0 and quality.top_k_recall == 1.0
    assert rank_quality([4, 3], [1e-3, 2e-3]).tau is None  # too few to say


def _trusted(ranks_well: bool, group: str = "t") -> CandidateFilter:
    """A filter that has judged two batches of task ``group``: ranked perfectly, or exactly backwards."""
    trimmer = CandidateFilter()
    latencies = [1e-3 * (1 + i) for i in range(8)]
    scores = [-float(i) for i in range(8)]
    for _ in range(2):
        trimmer.record(group, scores if ranks_well else scores[::-1], latencies)
    return trimmer


def test_a_poorly_ranking_model_filters_nothing():
    decision = _trusted(False).split("t", np.linspace(0, -3, 20), np.random.default_rng(0))
    assert decision.trust == 0 and decision.dropped == [] and len(decision.keep) == 20


def test_a_trusted_model_drops_what_it_predicts_twice_as_slow_as_the_best_and_explores_some_of_it():
    scores = -np.arange(40, dtype=float) / 10  # candidate i predicted exp(i/10) times slower than the best
    decision = _trusted(True).split("t", scores, np.random.default_rng(0))
    assert decision.trust == 1.0
    assert len(decision.dropped) + len(decision.explored) == 30  # 33 are predicted 2x slower; max_drop caps at 75%
    assert decision.explored and set(decision.explored) <= set(decision.keep)
    assert min(decision.dropped) >= 10  # the worst-scored first
    assert set(range(7)) <= set(decision.keep)  # predicted less than 2x slower: never poor


def test_with_less_trust_only_what_is_predicted_much_slower_counts_as_poor():
    trimmer = CandidateFilter()
    for _ in range(2):  # a model that ranks half-well (tau 1/3): trust 0.58
        trimmer.record("t", [3, 2, 1, 0, -1, -2], [3e-3, 1e-3, 2e-3, 6e-3, 5e-3, 4e-3])
    scores = -np.arange(40, dtype=float) / 10
    decision = trimmer.split("t", scores, np.random.default_rng(0))
    assert 0 < decision.trust < 1
    poor = sorted(decision.dropped + decision.explored)
    assert poor and np.all(scores[poor] < np.log(0.5) / decision.trust)  # 2 ** (1 / trust) times slower
    assert len(poor) < 30


def _trusted_with(**settings) -> CandidateFilter:
    trimmer = CandidateFilter(FilterSettings(**settings))
    trimmer.restore(_trusted(True).state())
    return trimmer


def test_the_best_rated_share_of_the_fresh_samples_is_measured_whatever_its_score():
    scores = -np.arange(40, dtype=float) / 10
    fresh = [i % 2 == 1 for i in range(40)]  # every odd one, as the search's fresh samples
    decision = _trusted_with(spare_fresh=0.5).split("t", scores, np.random.default_rng(0), fresh)
    assert set(range(1, 20, 2)) <= set(decision.keep)  # the better-rated 10 of the 20 fresh
    assert len(decision.dropped) + len(decision.explored) == 22  # 75% of the 30 judged
    decision = _trusted_with(spare_fresh=1.0).split("t", scores, np.random.default_rng(0), fresh)
    assert set(range(1, 40, 2)) <= set(decision.keep) and all(i % 2 == 0 for i in decision.dropped)


def test_a_task_that_stopped_improving_measures_every_fresh_sample():
    scores = -np.arange(40, dtype=float) / 10
    fresh = [i % 2 == 1 for i in range(40)]
    trimmer = _trusted_with(spare_fresh=0.0, spare_fresh_when_stalled=2)
    improving = trimmer.split("t", scores, np.random.default_rng(0), fresh, batches_without_improvement=1)
    assert any(i % 2 == 1 for i in improving.dropped)  # fresh samples judged like the rest
    stalled = trimmer.split("t", scores, np.random.default_rng(0), fresh, batches_without_improvement=2)
    assert set(range(1, 40, 2)) <= set(stalled.keep) and stalled.dropped and all(i % 2 == 0 for i in stalled.dropped)
    never = _trusted_with(spare_fresh=0.0, spare_fresh_when_stalled=0).split(
        "t", scores, np.random.default_rng(0), fresh, 50
    )
    assert any(i % 2 == 1 for i in never.dropped)


def test_trust_pools_a_tasks_recent_batches_and_a_new_task_borrows_it():
    trimmer = CandidateFilter(FilterSettings(window=2))
    assert trimmer.trust("a") == 0  # nothing judged yet
    trimmer.record("a", [3, 2, 1, 0], [1e-3, 2e-3, 3e-3, 4e-3])
    assert trimmer.rank_quality("a") == 1.0 and trimmer.trust("a") == 1.0
    assert trimmer.trust("b") == 1.0  # no batch of its own: the other tasks' mean
    trimmer.record("a", [0, 1, 2, 3], [1e-3, 2e-3, 3e-3, 4e-3])  # one backwards batch: pooled, not replaced
    assert -1 < trimmer.rank_quality("a") < 1
    for _ in range(2):
        trimmer.record("a", [0, 1, 2, 3], [1e-3, 2e-3, 3e-3, 4e-3])  # only the last `window` batches count
    assert trimmer.rank_quality("a") == -1.0 and trimmer.trust("a") == 0
    assert CandidateFilter(FilterSettings(enabled=False)).trust("a") == 0


def test_the_judged_batches_survive_a_round_trip_through_json():
    trimmer = _trusted(True)
    copy = CandidateFilter()
    copy.restore(json.loads(json.dumps(trimmer.state())))
    assert copy.rank_quality("t") == trimmer.rank_quality("t") == 1.0


@pytest.mark.slow  # 20 s: out of CI (`pytest -m slow`)
def test_a_resumed_run_keeps_the_trust_its_model_earned(tmp_path):
    from tuner import tune

    lenient = FilterSettings(min_tau=-1.0, full_trust_tau=-0.9)  # trusts any model ranking better than at random

    for trials in (24, 32):
        tune(
            "matmul-128",
            trials=trials,
            work_dir=tmp_path,
            batch_size=8,
            progress=False,
            verify=False,
            filter=lenient,
        )
    entries = [json.loads(line) for line in (tmp_path / "logs" / "costmodel.jsonl").read_text().splitlines()]
    resumed = entries[-1]
    assert resumed["trials"] == 32 and resumed["trust"] == 1.0  # without the stored batches: 0, nothing judged yet


def test_candidates_rated_near_the_best_are_never_dropped():
    decision = _trusted(True).split("t", np.full(16, -0.01), np.random.default_rng(0))
    assert decision.dropped == []


@pytest.mark.parametrize("seed", range(5))
def test_the_filter_never_drops_a_whole_batch(seed):
    rng = np.random.default_rng(seed)
    for size in (1, 2, 3, 8, 64):
        decision = _trusted(True).split("t", -5 - rng.random(size), rng)
        assert decision.keep, size
        assert len(decision.keep) >= max(1, int(np.ceil(size * 0.25))) if size > 1 else decision.keep == [0]


def test_the_ledger_counts_what_was_saved():
    ledger = FilterLedger()
    decision = _trusted(True).split("t", -np.arange(20, dtype=float), np.random.default_rng(0))
    ledger.add(decision, seconds_per_candidate=0.5, joules_per_candidate=2.0)
    assert ledger.dropped == len(decision.dropped) > 0 and ledger.proposed == 20
    assert ledger.seconds_saved == 0.5 * ledger.dropped and ledger.joules_saved == 2.0 * ledger.dropped
    assert FilterLedger.from_dict(ledger.as_dict()) == ledger


@pytest.mark.slow  # 30 s: out of CI (`pytest -m slow`)
def test_a_run_reports_rank_quality_and_what_the_filter_saved(tmp_path):
    from tuner import tune

    result = tune("matmul-128", trials=64, work_dir=tmp_path, batch_size=8, progress=False, verify=False)
    entries = [json.loads(line) for line in (tmp_path / "logs" / "costmodel.jsonl").read_text().splitlines()]
    assert len(entries) >= 8 and any(e["tau"] is not None for e in entries)
    assert result.filtered["proposed"] >= 64 and result.filtered["proposed"] == 64 + result.filtered["dropped"]
    assert result.trials == 64
    from tuner.cli.report import write_report

    md, _ = write_report(tmp_path)
    assert "Kendall tau" in md.read_text()


def test_a_run_takes_the_filter_it_is_given(tmp_path):
    from tuner import tune

    result = tune(
        "matmul-128",
        trials=24,
        work_dir=tmp_path,
        batch_size=8,
        progress=False,
        verify=False,
        trimmer=TrimmerFilter(enabled=False),  # the spelling before `filter=` and FilterSettings
    )
    assert result.filtered["dropped"] == 0 and result.filtered["proposed"] == 24
    with pytest.raises(ValueError, match="max_drop"):
        FilterSettings(max_drop=1.0)
    with pytest.raises(ValueError, match="spare_fresh"):
        FilterSettings(spare_fresh=1.5)
    with pytest.raises(ValueError, match="spare_fresh_when_stalled"):
        FilterSettings(spare_fresh_when_stalled=-1)
