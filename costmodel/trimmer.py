"""The Trimmer filter: of the candidates search proposes, build and measure only those the cost
model predicts to be competitive, trusting the model only as far as its measured ranking allows.

Trust comes from the Kendall tau of the model's predictions against the measured speeds, the
predictions each taken before their batch was measured, pooled over the task's last ``window``
batches: 0 below ``min_tau`` (nothing is filtered), 1 from ``full_trust_tau``. One filtered batch
is too small a sample (its tau swings widely from one batch to the next);
a task with no judged batch yet borrows the mean trust of the tasks that have one.
With trust t, a candidate is predicted poor when even an optimistic estimate puts it
``poor_ratio ** (1 / t)`` times slower than the task's best measured candidate (the model predicts
log-speed relative to that best): twice as slow at full trust, four times at half. A threshold
beats dropping a fixed share of each batch: replayed on unfiltered runs, it lost the gains of far
fewer improving batches than dropping the worst-scored half (``experiments/filter_replay.py``;
numbers in experiments/README.md, "Replaying filters offline"). The search's fresh random
samples are judged only while the task improves (see ``spare_fresh``). At most ``max_drop`` of a
batch is dropped, and a share ``exploration`` of what would be is measured anyway, picked at
random, so the model keeps seeing (and correcting) what it rates poorly; a batch is never dropped
entirely.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from .quality import rank_quality


@dataclass(frozen=True)
class FilterDecision:
    keep: list[int]  # indices into the proposed batch, to build and measure
    dropped: list[int]  # predicted poor: never built or measured
    explored: list[int]  # predicted poor but measured anyway (a subset of keep)
    trust: float
    threshold: float | None  # only candidates scored below this could count as poor; None = no filtering


@dataclass(frozen=True)
class FilterSettings:
    """How much the filter drops (the user's setting; what it learns lives in ``CandidateFilter``)."""

    poor_ratio: float = 2.0  # at full trust, predicted this many times slower than the task's best = poor
    min_tau: float = 0.1  # below this measured rank quality, filter nothing
    full_trust_tau: float = 0.5
    max_drop: float = 0.75
    exploration: float = 0.1
    window: int = 4  # a task's batches whose rank quality sets its trust
    # The search's fresh random samples are its way out of the region it has measured, where the
    # model knows least. Judged with the rest they were nearly all that was dropped (with the
    # filter far fewer of the measured candidates were far from any measured before), and filtered
    # searches got stuck more often; sparing all of them left nothing to drop (mutants of the best
    # are rated near it). So they are spared when the way out is needed: once the task has gone
    # ``spare_fresh_when_stalled`` batches without a new best (0: never). Against sparing the
    # best-rated half of them in every batch, the final latency held better at about the same
    # share dropped (experiments/README.md, "History of the filter").
    spare_fresh: float = 0.0  # of the fresh samples in a batch, the best-rated share always measured
    spare_fresh_when_stalled: int = 1
    enabled: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.max_drop < 1:
            raise ValueError(f"max_drop must be in [0, 1), got {self.max_drop}")
        if not self.poor_ratio > 1:
            raise ValueError(
                "poor_ratio must be above 1 (a candidate that many times slower than the best is poor), got "
                f"{self.poor_ratio}"
            )
        if not 0 <= self.spare_fresh <= 1:
            raise ValueError(
                f"spare_fresh must be in [0, 1] (the share of fresh samples always measured), got {self.spare_fresh}"
            )
        if self.spare_fresh_when_stalled < 0:
            raise ValueError(
                "spare_fresh_when_stalled counts batches without improvement (0 = never), got "
                f"{self.spare_fresh_when_stalled}"
            )
        if not 0 < self.exploration <= 1:
            raise ValueError(f"exploration must be in (0, 1], got {self.exploration}")


TrimmerFilter = FilterSettings  # its name before settings and state were split; tune(trimmer=TrimmerFilter(...)) works


class CandidateFilter:
    """The filter at work on one run: the tasks' judged batches, the trust they earn, the split of
    each proposed batch."""

    def __init__(self, settings: FilterSettings | None = None) -> None:
        self.settings = settings or FilterSettings()
        self._recent: dict[str, deque] = {}  # group -> (scores, latencies) of its last batches

    def record(self, group: str, scores: Sequence[float], latencies: Sequence[float | None]) -> None:
        """A measured batch of task ``group``: the model's scores, taken before it was measured, and
        the latencies (None for a failure)."""
        self._recent.setdefault(group, deque(maxlen=self.settings.window)).append(
            ([float(s) for s in scores], list(latencies))
        )

    def state(self) -> dict[str, list]:
        """The judged batches the trust comes from, per task, as JSON-ready lists: a resumed run
        takes them back with ``restore`` instead of trusting its model from scratch."""
        return {
            group: [[scores, latencies] for scores, latencies in batches] for group, batches in self._recent.items()
        }

    def restore(self, state: dict[str, list]) -> None:
        """Take back the judged batches ``state`` gave (replacing any this filter holds)."""
        self._recent = {
            group: deque(
                ((list(scores), list(latencies)) for scores, latencies in batches), maxlen=self.settings.window
            )
            for group, batches in state.items()
        }

    def rank_quality(self, group: str) -> float | None:
        """Kendall tau of the task's recent batches pooled; None while they cannot tell."""
        batches = self._recent.get(group)
        if not batches:
            return None
        return rank_quality(
            [s for scores, _ in batches for s in scores], [lat for _, lats in batches for lat in lats]
        ).tau

    def trust(self, group: str) -> float:
        """0 (filter nothing) to 1 (the full ``poor_ratio``), from the task's pooled rank quality."""
        if not self.settings.enabled:
            return 0.0
        tau = self.rank_quality(group)
        if tau is not None:
            return self._trust_at(tau)
        others = [self.rank_quality(g) for g in self._recent if g != group]
        judged = [self._trust_at(other) for other in others if other is not None]
        return float(np.mean(judged)) if judged else 0.0

    def _trust_at(self, tau: float) -> float:
        return float(
            np.clip((tau - self.settings.min_tau) / (self.settings.full_trust_tau - self.settings.min_tau), 0.0, 1.0)
        )

    def split(
        self,
        group: str,
        scores: Sequence[float],
        rng: np.random.Generator,
        fresh: Sequence[bool] = (),
        batches_without_improvement: int = 0,
        unjudged: Sequence[bool] = (),
    ) -> FilterDecision:
        """Which of a batch proposed for task ``group`` to measure, given the model's scores and
        which candidates are the search's ``fresh`` random samples (the best-rated ``spare_fresh``
        share of them is measured whatever its score, all of them once the task has gone
        ``spare_fresh_when_stalled`` batches without improvement; ``max_drop`` is a share of the others).
        Candidates flagged ``unjudged`` (e.g. schedules transferred from another model's tuning) are
        always measured."""
        scores = np.asarray(scores, dtype=float)
        everything = list(range(len(scores)))
        trust = self.trust(group)
        stalled = 0 < self.settings.spare_fresh_when_stalled <= batches_without_improvement
        spared = self._spared(scores, fresh, 1.0 if stalled else self.settings.spare_fresh) | {
            i for i, flag in enumerate(unjudged) if flag
        }
        judged = [i for i in everything if i not in spared]
        if trust <= 0 or len(judged) < 2:
            return FilterDecision(everything, [], [], trust, None)
        threshold = -math.log(self.settings.poor_ratio) / trust
        worst_first = [judged[int(i)] for i in np.argsort(scores[judged], kind="stable")]
        poor = [i for i in worst_first[: int(len(judged) * self.settings.max_drop)] if scores[i] < threshold]
        explore = min(len(poor), math.ceil(len(poor) * self.settings.exploration))
        explored = [int(i) for i in rng.choice(poor, size=explore, replace=False)] if explore else []
        dropped = sorted(set(poor) - set(explored))
        keep = [i for i in everything if i not in set(dropped)]
        return FilterDecision(keep, dropped, sorted(explored), trust, threshold)

    @staticmethod
    def _spared(scores: np.ndarray, fresh: Sequence[bool], share: float) -> set[int]:
        candidates = [i for i, is_fresh in enumerate(fresh) if is_fresh]
        best_first = sorted(candidates, key=lambda i: -scores[i])
        return set(best_first[: math.ceil(len(best_first) * share)])


@dataclass
class FilterLedger:
    """What the filter dropped and what that saved: the builds and measurements never made, and
    the seconds (and joules, where NVML gives them) they would have cost at the batch's own rate."""

    proposed: int = 0
    dropped: int = 0
    explored: int = 0
    seconds_saved: float = 0.0
    joules_saved: float = 0.0

    def add(self, decision: FilterDecision, seconds_per_candidate: float, joules_per_candidate: float | None) -> None:
        self.proposed += len(decision.keep) + len(decision.dropped)
        self.dropped += len(decision.dropped)
        self.explored += len(decision.explored)
        self.seconds_saved += len(decision.dropped) * seconds_per_candidate
        if joules_per_candidate is not None:
            self.joules_saved += len(decision.dropped) * joules_per_candidate

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FilterLedger:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
