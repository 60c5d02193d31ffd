"""How a candidate is timed: warm up, then take samples until the budget is spent, keeping all.

Timing goes through TVM's time evaluator, which uses the host clock on a CPU and the device's
own timer (CUDA events on the worker's stream) on a GPU, and runs the calls of a sample back to
back in C++. Each sample averages enough calls to last ``min_sample_seconds``, which also spreads
each GPU launch's host-side delay over them. Cold GPU samples (a single call after an L2 flush)
are timed by ``cuda_cold`` instead, with the kernel queued behind the flush so that the delay
stays out of the sample.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

# evaluator(number, repeat, min_repeat_ms) -> ``repeat`` per-call means in seconds (after one warm-up call)
Evaluator = Callable[[int, int, int], Sequence[float]]


@dataclass(frozen=True)
class TimingConfig:
    """How long and how often a candidate is timed.

    Sampling stops after ``max_repeats`` samples, or once ``min_repeats`` samples exist and either
    the median is known to ``precision`` or about ``budget_seconds`` of timed calls were spent.
    """

    min_repeats: int = 3
    max_repeats: int = 20
    budget_seconds: float = 0.05
    # Stop early once the 95% confidence interval of the median is within this fraction of it.
    precision: float = 0.01
    # Flush caches before every sample (the L2 on a GPU, the arguments' lines on a CPU) so inputs
    # are not served from cache; each sample is then a single call, the only cold one. None: on
    # a GPU only. On a CPU, cold single calls ranked schedules differently from the warm runs a
    # whole CPU model makes (and tuned some kernels slower), so it is opt-in there.
    flush_cache: bool | None = None
    min_sample_seconds: float = 1e-3
    # Calls before timing, for at least this long: a single warm-up call leaves the first samples
    # slow (CPU worker threads asleep, clocks ramping up).
    warmup_seconds: float = 0.01

    def as_dict(self) -> dict:
        return asdict(self)

    def seconds_for(self, latency: float) -> float:
        """The longest this config times a kernel of ``latency`` seconds a call (``time_with_evaluator``):
        its warm-up, then samples of ``min_sample_seconds`` at least until ``min_repeats`` and the budget
        (or ``max_repeats``) are reached."""
        sample = max(latency, self.min_sample_seconds)
        sampled = max(self.min_repeats * sample, min(self.budget_seconds, self.max_repeats * sample))
        return self.warmup_seconds + latency + sampled

    def for_device(self, device_kind: str) -> TimingConfig:
        """This config with ``flush_cache`` decided for the device ("cpu" or "cuda")."""
        return replace(self, flush_cache=device_kind == "cuda" if self.flush_cache is None else self.flush_cache)


def time_with_evaluator(evaluator: Evaluator, config: TimingConfig) -> tuple[list[float], int]:
    """Returns the samples and the number of calls averaged in the later ones.

    The first ``min_repeats`` samples let TVM grow the calls per sample until a sample lasts
    ``min_sample_seconds``; a slow candidate is done after them. A fast one gets more samples, a
    few at a time, until its median is known to ``config.precision`` or the budget is spent.
    """
    evaluator(1, 1, math.ceil(config.warmup_seconds * 1e3))
    min_sample_seconds = 0.0 if config.flush_cache else config.min_sample_seconds
    samples = [float(s) for s in evaluator(1, config.min_repeats, math.ceil(min_sample_seconds * 1e3))]
    estimate = statistics.median(samples)
    number = max(1, math.ceil(min_sample_seconds / max(estimate, 1e-9)))
    spent = len(samples) * number * estimate
    while len(samples) < config.max_repeats and median_precision(samples) > config.precision:
        affordable = math.floor((config.budget_seconds - spent) / (number * estimate))
        extra = min(config.max_repeats - len(samples), affordable, max(2, len(samples) // 2))
        if extra <= 0:
            break
        samples += [float(s) for s in evaluator(number, extra, 0)]
        spent += extra * number * estimate
    return samples, number


def median_precision(samples: Sequence[float]) -> float:
    """Half the width of a distribution-free 95% confidence interval of the median, relative to
    the median (order statistics n/2 -+ 0.98 sqrt(n); the whole range below 6 samples)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n < 2:
        return math.inf
    half = 0.98 * math.sqrt(n)
    low = max(0, math.floor(n / 2 - half) - 1) if n >= 6 else 0
    high = min(n - 1, math.ceil(n / 2 + half)) if n >= 6 else n - 1
    return (ordered[high] - ordered[low]) / 2 / statistics.median(ordered)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples)


def relative_spread(samples: Sequence[float]) -> float:
    """(max - min) / median of the samples: 0 for perfectly repeatable timings."""
    if len(samples) < 2:
        return 0.0
    return (max(samples) - min(samples)) / statistics.median(samples)
