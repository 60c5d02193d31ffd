"""Fixed-length features of scheduled candidates, built from TVM's per-store features.

TVM describes a candidate by one 164-float vector per buffer store; candidates differ in their
number of stores. Each candidate becomes the mean, max and min over its stores, plus the store
count, so one model can rank candidates of every task.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

PER_STORE = 164


class CandidateFeatures:
    def __init__(self) -> None:
        self._extractor = PerStoreFeature(extract_workload=False)

    @property
    def width(self) -> int:
        return 3 * PER_STORE + 1

    def extract(self, context, candidates: Sequence) -> np.ndarray:
        """One row per MeasureCandidate, for the task described by ``context`` (a TuneContext)."""
        if not candidates:
            return np.zeros((0, self.width), dtype=np.float32)
        per_store = self._extractor.extract_from(context, list(candidates))
        return np.stack([aggregate(t.numpy()) for t in per_store])


def aggregate(stores: np.ndarray) -> np.ndarray:
    if stores.size == 0:
        return np.zeros(3 * PER_STORE + 1, dtype=np.float32)
    return np.concatenate(
        [stores.mean(axis=0), stores.max(axis=0), stores.min(axis=0), [np.log2(1 + stores.shape[0])]]
    ).astype(np.float32)
