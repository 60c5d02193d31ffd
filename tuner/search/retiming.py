"""The final choice's re-timing of a task's fastest candidates, with a second look at any whose re-timing
disagrees with what tuning measured.

On a 2-core machine a kernel runs on both cores, and anything else that runs for a moment (a build
worker, another tenant of the VM) holds one of them: each call then waits for the scheduler's next time
slice. SqueezeNet's concatenation of 3.6 us was re-timed at 5.98 ms a call (22 samples in a row, 2026-11-28,
Emerald Rapids VM), and that re-timing became its latency. Such a burst is not the candidate's speed: a
re-timing far slower than tuning measured is repeated, and the faster of the two kept.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from measure import Engine, MeasureInput, TimingConfig

# a serial re-timing this much slower than the tuning's own samples is timed again: timed alone, a candidate
# runs as fast as or faster than beside others, so its own speed does not put it that far off
SUSPECT_RATIO = 2.0


@dataclass(frozen=True)
class Retimed:
    samples: list[float]  # the re-timing whose median is the candidate's latency
    discarded: list[float]  # a re-timing set aside as a burst of interference: kept in the record, not its latency


def suspect(samples: Sequence[float], tuned_latency: float) -> bool:
    """Whether a re-timing's ``samples`` are too slow against the latency tuning measured to be the candidate's."""
    return bool(samples) and statistics.median(samples) > SUSPECT_RATIO * tuned_latency


def faster(first: Sequence[float], second: Sequence[float]) -> Retimed:
    """Of two re-timings of one candidate, the one with the lower median; the other kept as discarded."""
    if statistics.median(second) < statistics.median(first):
        return Retimed(list(second), list(first))
    return Retimed(list(first), list(second))


def retime(
    engine: Engine,
    inputs: Sequence[MeasureInput],
    tuned_latency: Mapping[str, float],
    timing: TimingConfig,
    group: str | None = None,
) -> Iterator[tuple[str, Retimed]]:
    """Each candidate of ``inputs`` timed alone with ``timing``, yielded as it is known; one far slower than
    ``tuned_latency`` (by key) is timed once more and yielded after, with the faster re-timing. Failed
    re-timings are left out."""
    suspects: dict[str, list[float]] = {}
    for key, samples in _timed(engine, inputs, timing, group):
        if suspect(samples, tuned_latency[key]):
            suspects[key] = samples
        else:
            yield key, Retimed(samples, [])
    again = [item for item in inputs if item.key in suspects]
    timed_again = dict(_timed(engine, again, timing, group)) if again else {}
    for key, samples in suspects.items():
        yield key, faster(samples, timed_again[key]) if key in timed_again else Retimed(samples, [])


def _timed(
    engine: Engine, inputs: Sequence[MeasureInput], timing: TimingConfig, group: str | None
) -> Iterator[tuple[str, list[float]]]:
    for result in engine.measure(list(inputs), timing=timing, serial=True, group=group):
        if result.ok and result.samples:
            yield result.key, result.samples
