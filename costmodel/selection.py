"""Which proposed candidates get built and measured: the seam the Trimmer filter plugs into."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TopKWithExploration:
    """The ``k`` best-scored candidates, except that a share ``exploration`` of the picks is
    drawn at random from the rest, so the model keeps seeing what it rates poorly."""

    exploration: float = 0.1

    def select(self, scores: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
        k = min(k, len(scores))
        explore = int(round(k * self.exploration)) if k > 1 else 0
        order = list(np.argsort(-scores, kind="stable"))
        chosen = order[: k - explore]
        rest = order[k - explore :]
        if explore and rest:
            chosen += list(rng.choice(rest, size=min(explore, len(rest)), replace=False))
        return [int(i) for i in chosen]
