"""How a candidate is timed: warm up, then take samples until the budget is spent, keeping all.

Timing goes through TVM's time evaluator, which uses the host clock on a CPU and the device's
own timer (CUDA events on the worker's stream) on a GPU, and runs the calls of a sample back to
back in C++. Each sample averages enough calls to last ``min_sample_seconds``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

# evaluator(number, repeat, min_repeat_ms) -> ``repeat`` per-call means in seconds (after one warm-up call)
Evaluator = Callable[[int, int, int], Sequence[float]]


@dataclass(frozen=True)
class TimingConfig:
    """How long and how often a candidate is timed.

    Sampling stops after ``max_repeats`` samples, or once ``min_repeats`` samples exist and about
    ``budget_seconds`` of timed calls have been spent.
    """

    min_repeats: int = 3
    max_repeats: int = 20
    budget_seconds: float = 0.05
    min_sample_seconds: float = 1e-3
    # Calls before timing, for at least this long: a single warm-up call leaves the first samples
    # slow (CPU worker threads asleep, clocks ramping up).
    warmup_seconds: float = 0.01

    def as_dict(self) -> dict:
        return asdict(self)


def time_with_evaluator(evaluator: Evaluator, config: TimingConfig) -> tuple[list[float], int]:
    """Returns the samples and the number of calls averaged in the later ones.

    The first ``min_repeats`` samples let TVM grow the calls per sample until a sample lasts
    ``min_sample_seconds``; a slow candidate is done after them. A fast one gets more samples, in
    one more evaluator call, until the budget is spent.
    """
    evaluator(1, 1, math.ceil(config.warmup_seconds * 1e3))
    samples = [float(s) for s in evaluator(1, config.min_repeats, math.ceil(config.min_sample_seconds * 1e3))]
    estimate = statistics.median(samples)
    number = max(1, math.ceil(config.min_sample_seconds / max(estimate, 1e-9)))
    spent = len(samples) * number * estimate
    extra = min(config.max_repeats - len(samples), math.ceil((config.budget_seconds - spent) / (number * estimate)))
    if extra > 0:
        samples += [float(s) for s in evaluator(number, extra, 0)]
    return samples, number


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median of the samples: 0 for perfectly repeatable timings."""
    if len(samples) < 2:
        return 0.0
    return (max(samples) - min(samples)) / statistics.median(samples)
