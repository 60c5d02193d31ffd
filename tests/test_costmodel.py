import numpy as np

from costmodel import CostModel, TopKWithExploration, kendall_tau


def _data(rng, n):
    x = rng.random((n, 20)).astype("float32")
    latency = 1.0 + 5 * x[:, 0] + x[:, 1]  # lower is better
    return x, latency


def test_model_learns_to_rank_from_measurements(tmp_path):
    rng = np.random.default_rng(0)
    model = CostModel(seed=1)
    x, latency = _data(rng, 200)
    assert not model.fit() and not model.trained
    model.add("task", x, list(latency))
    assert model.fit()
    x_new, lat_new = _data(rng, 100)
    scores = model.predict(x_new)
    top = set(np.argsort(-scores)[:10])
    best = set(np.argsort(lat_new)[:20])
    assert len(top & best) >= 7

    model.save(tmp_path / "m.ubj")
    loaded = CostModel()
    loaded.load(tmp_path / "m.ubj")
    np.testing.assert_allclose(loaded.predict(x_new), scores, rtol=1e-6)


def test_failed_candidates_are_learned_as_worst():
    rng = np.random.default_rng(1)
    model = CostModel(seed=1)
    x, latency = _data(rng, 100)
    failed = x[:, 2] > 0.8
    model.add("task", x, [None if f else float(lat) for f, lat in zip(failed, latency, strict=True)])
    assert model.fit()
    scores = model.predict(x)
    assert scores[failed].mean() < scores[~failed].mean()


def test_selection_explores_and_never_drops_everything():
    rng = np.random.default_rng(2)
    scores = np.arange(100, dtype=float)
    picked = TopKWithExploration(exploration=0.25).select(scores, 8, rng)
    assert len(picked) == len(set(picked)) == 8
    assert sum(p >= 94 for p in picked) == 6  # the 6 best by score, 2 explored
    assert TopKWithExploration().select(np.zeros(3), 8, rng) != []


def test_the_score_is_the_ensembles_mean_less_its_disagreement():
    rng = np.random.default_rng(0)
    model = CostModel(seed=1)
    x, latency = _data(rng, 200)
    model.add("task", x, list(latency))
    assert model.fit()
    mean, spread = model.predict_spread(x[:50])
    np.testing.assert_allclose(model.predict(x[:50]), mean - spread, rtol=1e-6)
    assert (spread >= 0).all() and spread.any()  # members trained on different subsamples disagree somewhat
    untrained_mean, untrained_spread = CostModel().predict_spread(x[:5], np.random.default_rng(1))
    assert len(untrained_mean) == 5 and not untrained_spread.any()


def test_kendall_tau_is_tau_b_and_undefined_for_constant_input():
    # one tied pair in the first sequence: 5 concordant pairs over sqrt(5 * 6) ordered ones
    assert abs(kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) - 5 / 30**0.5) < 1e-12
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None and kendall_tau([1], [1]) is None
