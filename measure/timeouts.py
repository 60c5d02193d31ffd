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

    def record(self, seconds: float) -> None:
        self._recent.append(seconds)

    @property
    def value(self) -> float:
        policy = self.policy
        if len(self._recent) < policy.warmup:
            return policy.initial
        return min(policy.ceiling, max(policy.floor, policy.factor * statistics.median(self._recent)))
