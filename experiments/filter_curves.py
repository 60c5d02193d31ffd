"""A tuning run read as a curve, and the measures that compare a filter-on run with a filter-off one
(``experiments/trimmer.py``, ``seed_noise.py``, ``filter_replay.py``): best latency after each
measurement, measurements to reach a target, the share of them a filter saved."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

TOLERANCE = 0.02  # "reached the target" = within 2% of it


def run_curve(work_dir: Path, trials: int) -> dict[str, list[float]]:
    """The run's best latency after each of its measurements (inf before the first success) and
    the tuning seconds at each, from its database."""
    from tuner.cli.report import job_curve
    from tuner.database.workdir import WorkDir

    db = WorkDir(work_dir).open_database(read_only=True)
    try:
        curve = job_curve(db)
    finally:
        db.close()
    latency, elapsed = [math.inf] * trials, [0.0] * trials
    for n, seconds, value in zip(curve.trials, curve.elapsed, curve.latency, strict=True):
        if n <= trials:
            latency[n - 1 :] = [value] * (trials - n + 1)
            elapsed[n - 1] = seconds
    for i in range(1, trials):  # a failed measurement adds no curve point: carry the clock forward
        elapsed[i] = max(elapsed[i], elapsed[i - 1])
    return {"latency": latency, "elapsed": elapsed}


def trials_to_reach(latency: list[float], target: float) -> int | None:
    """Measurements until ``latency`` came within TOLERANCE of ``target``; None if it never did."""
    return next((n for n, value in enumerate(latency, start=1) if value <= target * (1 + TOLERANCE)), None)


def geometric_mean_curve(curves: list[list[float]]) -> list[float]:
    """Per measurement, the geometric mean over runs (inf until every run has a result)."""
    return [
        math.exp(statistics.fmean(map(math.log, point))) if all(map(math.isfinite, point)) else math.inf
        for point in zip(*curves, strict=False)  # up to the shortest run
    ]


def saved_share(on: int | None, off: int | None, shared: int, trials: int) -> tuple[float, bool] | None:
    """The share of the measurements after the first ``shared`` that ``on`` saved against ``off``
    on the way to a target, and whether ``on`` got there (if not, the share is an upper bound);
    None where ``off`` never got there or got there within the shared measurements."""
    if off is None or off <= shared:
        return None
    return (1 - (on - shared) / (off - shared), True) if on else (1 - (trials - shared) / (off - shared), False)
