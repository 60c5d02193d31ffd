"""experiments/prediction_terms.py: recorded predictions decomposed into the analytic model's terms."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.prediction_terms import cpu_rows, fit_terms, recombined, within


def _records(rates: tuple[float, float, float, float], terms: dict, measured: dict) -> list[dict]:
    per_work, per_byte, per_weight, launch = rates
    kernels = [
        {
            "name": name,
            "tiled": True,
            "predicted": work * per_work + others * per_byte + weights * per_weight + launch,
            "in_model": measured[name],
        }
        for (_, name), (work, others, weights) in terms.items()
    ]
    kernels.append({"name": "softmax", "tiled": False, "predicted": 1e-5, "in_model": 1e-5})  # not a product
    return [
        {"model": "m", "cpu": "Xeon", "zero": {"kernels": kernels, "machine_speed": 1.0}},
        {"model": "m", "cpu": "EPYC", "zero": {"kernels": kernels}},
    ]


def test_recorded_predictions_come_apart_into_the_rates_that_made_them():
    """Predictions made with every term added are linear in the terms: the fit finds each CPU's rates again, and
    hiding nothing recombines them into the recorded predictions."""
    rng = np.random.default_rng(0)
    terms = {("m", f"k{i}"): (rng.uniform(1e8, 1e9), rng.uniform(1e5, 1e7), rng.uniform(0, 1e7)) for i in range(12)}
    rates = (1 / 300e9, 1 / 40e9, 1 / 25e9, 1e-6)
    measured = {name: 1e-3 for _, name in terms}
    rows = cpu_rows(_records(rates, terms, measured), "Xeon", terms)
    assert rows.shape == (12, 5)  # the products only, of that CPU only
    parts, residual = fit_terms(rows)
    assert residual == pytest.approx(0, abs=1e-9)
    work, others, weights = np.array(list(terms.values())).T
    assert parts[:, 0] == pytest.approx(work * rates[0]) and parts[:, 2] == pytest.approx(weights * rates[2])
    assert recombined(parts, 0.0) == pytest.approx(rows[:, 3])


def test_a_hidden_share_of_the_weights_stream_shortens_only_what_overlaps():
    """All of the shorter one hidden is the roofline's max of arithmetic and weights; none hidden, their sum."""
    parts = np.array([[3.0, 1.0, 2.0, 0.5], [1.0, 0.0, 4.0, 0.0]])
    assert recombined(parts, 1.0) == pytest.approx([3.0 + 1.0 + 0.5, 4.0])
    assert recombined(parts, 0.5) == pytest.approx([3.0 + 1.0 + 1.0 + 0.5, 4.5])
    assert within(np.array([1.2, 1.3, 0.8, 0.7]), np.ones(4)) == 2
