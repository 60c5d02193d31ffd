"""Timeouts sized from what is measured rather than fixed in advance."""

from __future__ import annotations

import statistics
from collections import deque


class AdaptiveTimeout:
    """``factor`` x the median of the recent durations, kept within [floor, ceiling].

    The median, not the maximum: a candidate that takes ten times longer than a typical one to
    build is nearly always one whose code exploded (unrolled far too much), and it runs slowly
    too. Until ``warmup`` durations have been seen, the generous ``initial`` value applies.
    """

    def __init__(
        self,
        initial: float,
        floor: float,
        factor: float = 10.0,
        ceiling: float = 600.0,
        warmup: int = 8,
        window: int = 64,
    ):
        self.initial = initial
        self.floor = floor
        self.factor = factor
        self.ceiling = ceiling
        self.warmup = warmup
        self._recent: deque[float] = deque(maxlen=window)

    def record(self, seconds: float) -> None:
        self._recent.append(seconds)

    @property
    def value(self) -> float:
        if len(self._recent) < self.warmup:
            return self.initial
        return min(self.ceiling, max(self.floor, self.factor * statistics.median(self._recent)))
