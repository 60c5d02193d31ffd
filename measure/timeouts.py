"""Timeouts sized from what is measured rather than fixed in advance."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeoutPolicy:
    """How an ``AdaptiveTimeout`` is sized: ``factor`` x the median of the recent durations, kept
    within [``floor``, ``ceiling``]; the generous ``initial`` value until ``warmup`` durations are seen.

    The median, not the maximum: a candidate that takes ten times longer than a typical one to
    build is nearly always one whose code exploded (unrolled far too much), and it runs slowly too.
    """

    initial: float
    floor: float
    factor: float = 10.0
    ceiling: float = 600.0
    warmup: int = 8
    window: int = 64


class AdaptiveTimeout:
    """A timeout that follows the durations recorded so far, as its ``policy`` says."""

    def __init__(self, policy: TimeoutPolicy):
        self.policy = policy
        self._recent: deque[float] = deque(maxlen=policy.window)
        self._by_group: dict[str, deque[float]] = {}

    def record(self, seconds: float, group: str | None = None) -> None:
        self._recent.append(seconds)
        if group is not None:
            self._by_group.setdefault(group, deque(maxlen=self.policy.window)).append(seconds)

    @property
    def value(self) -> float:
        policy = self.policy
        if len(self._recent) < policy.warmup:
            return policy.initial
        return self._bounded(policy.factor * statistics.median(self._recent))

    def value_for(self, group: str | None) -> float:
        """The timeout for a candidate of ``group`` (a task): sized on the group's own durations once
        it has some, and before that ``factor`` times the value for all. The candidates of one kernel
        can all take far longer than most to build: Gemma's FFN output kernel (a Strassen combination
        with its GELU) built in over 2 s where most kernels built in 0.1, and with one timeout for
        all, every one of its candidates timed out."""
        if group is None or len(self._recent) < self.policy.warmup:
            return self.value
        own = self._by_group.get(group)
        return self._bounded(self.policy.factor * (statistics.median(own) if own else self.value))

    def _bounded(self, seconds: float) -> float:
        return min(self.policy.ceiling, max(self.policy.floor, seconds))
