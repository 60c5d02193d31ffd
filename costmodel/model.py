"""An XGBoost model that predicts how fast a candidate will be, retrained as results arrive.

It regresses each candidate's log-speed relative to the best measured in its task (0 for the
task's best, negative for slower ones, and below the task's worst for a failed candidate), so
tasks of very different speeds share one model. Log-latency ranked candidates better than
normalised throughput or a pairwise ranking objective in an offline comparison on measured conv2d
and matmul schedules, with little training data and with more.

The score is pessimistic: the mean of a small ensemble minus its spread. The search evolves
candidates toward high scores, and with little data a single model rates some unseen mutants
far above anything measured while they run far slower; the ensemble disagrees on exactly those.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# xgboost's OpenMP threads spin while idle unless told otherwise, stealing cores from builders.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import xgboost as xgb  # noqa: E402

_FAILED_PENALTY = np.log(2.0)  # a failed candidate counts as twice as slow as the task's slowest


class CostModel:
    """Predicts a score per candidate (higher is faster) from its features."""

    def __init__(
        self,
        seed: int = 1,
        rounds: int = 40,
        ensemble: int = 4,
        min_samples: int = 8,
        refit_growth: float = 0.1,
        threads: int | None = None,
    ):
        self.seed = seed
        self.refit_growth = refit_growth
        self.rounds = rounds
        self.ensemble = ensemble
        self.min_samples = min_samples
        self.params = {
            "objective": "reg:squarederror",
            "max_depth": 6,
            "max_bin": 64,
            "eta": 0.2,
            "min_child_weight": 1,
            "subsample": 0.8,
            "colsample_bytree": 0.8,
            "nthread": threads or os.cpu_count() or 1,
            "verbosity": 0,
        }
        self._features: dict[str, list[np.ndarray]] = {}
        self._latencies: dict[str, list[float]] = {}  # inf for a failed candidate
        self._boosters: list[xgb.Booster] = []
        self._trained_on = 0  # own samples (not warm-start ones) at the last training
        self._warm_samples = 0  # samples taken from other runs by warm_start()

    @property
    def trained(self) -> bool:
        return bool(self._boosters)

    @property
    def num_samples(self) -> int:
        return sum(len(v) for v in self._latencies.values())

    def add(self, group: str, features: np.ndarray, latencies: Sequence[float | None]) -> None:
        """Record measured candidates of one task (``group``); None marks a failed candidate."""
        self._features.setdefault(group, []).extend(np.asarray(features, dtype=np.float32))
        self._latencies.setdefault(group, []).extend(np.inf if lat is None else float(lat) for lat in latencies)

    def update(self) -> bool:
        """Retrain once the data has grown by ``refit_growth`` since the last training: each batch
        while data is scarce, every few batches once a few hundred results are in."""
        if self._boosters and self._own_samples < self._trained_on * (1 + self.refit_growth):
            return False
        return self.fit()

    @property
    def _own_samples(self) -> int:
        return self.num_samples - self._warm_samples

    def fit(self) -> bool:
        """Retrain on everything recorded; False while there is too little to learn from."""
        x, y = self._training_set()
        if len(y) < self.min_samples or np.ptp(y) == 0:
            return False
        self._trained_on = self._own_samples
        data = xgb.DMatrix(x, label=y)
        self._boosters = [
            xgb.train({**self.params, "seed": self.seed + member}, data, num_boost_round=self.rounds)
            for member in range(self.ensemble)
        ]
        return True

    def predict(self, features: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Pessimistic predicted log-speed; random scores while the model is untrained."""
        mean, spread = self.predict_spread(features, rng)
        return mean - spread

    def predict_spread(
        self, features: np.ndarray, rng: np.random.Generator | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ensemble's mean predicted log-speed and its spread (standard deviation) per candidate;
        random means and no spread while the model is untrained."""
        if len(features) == 0:
            return np.zeros(0), np.zeros(0)
        if not self._boosters:
            return (rng or np.random.default_rng(self.seed)).random(len(features)), np.zeros(len(features))
        data = xgb.DMatrix(np.asarray(features, dtype=np.float32))
        predictions = np.stack([booster.predict(data) for booster in self._boosters])
        return predictions.mean(axis=0), predictions.std(axis=0)

    def save(self, path: Path) -> None:
        """Write the ensemble as one XGBoost model file per member (PATH, PATH.1, PATH.2, ...) and
        the data it was trained on (``training_data_path(PATH)``), which ``warm_start`` reads."""
        for member, booster in enumerate(self._boosters):
            booster.save_model(str(path) if member == 0 else f"{path}.{member}")
        groups = list(self._latencies)
        features = [np.stack(self._features[g]) for g in groups if self._features[g]]
        np.savez_compressed(
            training_data_path(path),
            groups=np.asarray(groups, dtype=str),
            sizes=np.asarray([len(self._latencies[g]) for g in groups], dtype=np.int64),
            features=np.concatenate(features) if features else np.zeros((0, 0), dtype=np.float32),
            latencies=np.asarray([lat for g in groups for lat in self._latencies[g]], dtype=np.float64),
        )

    def warm_start(self, path: Path | str, prefix: str, width: int | None = None, fit: bool = True) -> int:
        """Add the training data another run saved with ``save(path)`` as extra groups named
        ``prefix + group`` (so they never mix with this run's tasks), then retrain unless ``fit`` is
        False (several sources: retrain once, after the last); returns the number of samples added.
        ``width``: the features per sample expected (default: those of the data already recorded).
        Later ``update()`` calls count growth in this run's own samples."""
        added = 0
        for group, features, latencies in read_training_data(path, width or self._width()):
            self.add(f"{prefix}{group}", features, latencies)
            added += len(latencies)
        self._warm_samples += added
        if fit:
            self.fit()
        return added

    def _width(self) -> int | None:
        """Features per sample of the data recorded so far; None while there is none."""
        for rows in self._features.values():
            if rows:
                return len(rows[0])
        return None

    def load(self, path: Path) -> None:
        boosters = []
        for member in range(self.ensemble):
            file = Path(path) if member == 0 else Path(f"{path}.{member}")
            if not file.exists():
                break
            booster = xgb.Booster()
            booster.load_model(str(file))
            boosters.append(booster)
        self._boosters = boosters

    def _training_set(self) -> tuple[np.ndarray, np.ndarray]:
        rows, labels = [], []
        for group, latencies in self._latencies.items():
            lat = np.asarray(latencies)
            ok = np.isfinite(lat)
            if not ok.any():
                continue
            log_speed = np.log(lat[ok].min()) - np.log(np.where(ok, lat, 1.0))
            labels.append(np.where(ok, log_speed, log_speed[ok].min() - _FAILED_PENALTY))
            rows.append(np.stack(self._features[group]))
        if not rows:
            return np.zeros((0, 1)), np.zeros(0)
        return np.concatenate(rows), np.concatenate(labels)


def read_training_data(
    model_path: Path | str, width: int | None = None
) -> list[tuple[str, np.ndarray, list[float | None]]]:
    """The training data ``CostModel.save(model_path)`` wrote: (group, features, latencies with None
    for a failure) per task group. ``width``: the features per sample expected, if known."""
    data_path = training_data_path(model_path)
    if not data_path.exists():
        raise FileNotFoundError(
            f"{data_path} does not exist: the model at {model_path} was saved without its training data"
        )
    with np.load(data_path) as data:
        groups, sizes, features, latencies = (data[k] for k in ("groups", "sizes", "features", "latencies"))
    if len(latencies) and width is not None and features.shape[1] != width:
        raise ValueError(
            f"{data_path} holds {features.shape[1]} features per sample, not {width}: it was saved by another version"
        )
    ends = np.cumsum(sizes)
    return [
        (
            str(group),
            features[end - size : end],
            [None if np.isinf(lat) else float(lat) for lat in latencies[end - size : end]],
        )
        for group, size, end in zip(groups, sizes.astype(int), ends, strict=True)
    ]


def training_data_path(model_path: Path | str) -> Path:
    """Where ``CostModel.save(model_path)`` writes the training data."""
    return Path(f"{model_path}.data.npz")
