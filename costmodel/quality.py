"""How well the cost model ranks: its predicted order of a batch against the measured order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

MIN_RESULTS = 4  # fewer successes in a batch say nothing about ranking


@dataclass(frozen=True)
class RankQuality:
    """Kendall tau between predicted scores and measured speed, and the share of the truly best
    ``k`` that the model put in its own top ``k``; None where a batch cannot tell (too few results)."""

    tau: float | None
    top_k_recall: float | None
    k: int
    measured: int

    def as_dict(self) -> dict:
        return asdict(self)


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant pairs) over the
    geometric mean of the pairs each sequence orders, so a pair tied in either sequence counts as
    neither and ties lower the denominator, not the score. None where the correlation is undefined:
    fewer than two values, or either sequence constant (it orders nothing; that is no evidence of
    agreement, so it is not reported as 1 or 0)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"kendall_tau needs sequences of one length, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    upper = np.triu_indices(len(x), k=1)
    dx, dy = dx[upper], dy[upper]
    concordant_minus_discordant = float(np.sum(dx * dy))
    pairs_x, pairs_y = float(np.count_nonzero(dx)), float(np.count_nonzero(dy))
    if pairs_x == 0 or pairs_y == 0:
        return None
    return concordant_minus_discordant / math.sqrt(pairs_x * pairs_y)


def rank_quality(predicted: Sequence[float], latencies: Sequence[float | None], k: int | None = None) -> RankQuality:
    """Compare predicted scores (higher = predicted faster) with measured latencies (None = failed,
    counted as slower than every success)."""
    scores = np.asarray(predicted, dtype=float)
    lat = np.array([math.inf if v is None else float(v) for v in latencies])
    ok = np.isfinite(lat)
    k = k or max(1, len(lat) // 4)
    if ok.sum() < MIN_RESULTS:
        return RankQuality(None, None, k, len(lat))
    speed = np.where(ok, -np.log(np.where(ok, lat, 1.0)), -np.inf)
    speed[~ok] = speed[ok].min() - 1.0
    tau = kendall_tau(scores, speed)
    k = min(k, int(ok.sum()))
    truly_best = set(np.argsort(-speed, kind="stable")[:k])
    predicted_best = set(np.argsort(-scores, kind="stable")[:k])
    return RankQuality(tau, len(truly_best & predicted_best) / k, k, len(lat))
