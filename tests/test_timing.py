"""The sampling policy of the timing protocol (the evaluator here is a stand-in clock, since the
policy, not TVM's timer, is under test; real timing is covered by the engine tests)."""

import random

from measure.timing.sampling import TimingConfig, median_precision, time_with_evaluator


class Recorder:
    def __init__(self, seconds_per_call: float, noise: float = 0.0):
        self.seconds = seconds_per_call
        self.noise = noise
        self.rng = random.Random(0)
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, number: int, repeat: int, min_repeat_ms: int) -> list[float]:
        self.calls.append((number, repeat, min_repeat_ms))
        return [self.seconds * (1 + self.rng.uniform(-self.noise, self.noise)) for _ in range(repeat)]


def test_slow_kernels_stop_after_the_minimum_samples():
    clock = Recorder(0.2)
    samples, _ = time_with_evaluator(clock, TimingConfig(min_repeats=3, budget_seconds=0.05))
    assert len(samples) == 3
    assert clock.calls[0][2] >= 10  # the warm-up lasts at least warmup_seconds


def test_noisy_fast_kernels_get_more_samples_of_many_calls_until_the_budget():
    clock = Recorder(1e-5, noise=0.2)
    samples, number = time_with_evaluator(
        clock,
        TimingConfig(min_repeats=3, max_repeats=20, budget_seconds=0.01, min_sample_seconds=1e-3, flush_cache=False),
    )
    assert 80 <= number <= 125  # about 1 ms of calls per sample
    assert 3 < len(samples) <= 11  # about 10 samples of 1 ms spend the 10 ms budget
    assert all(call[0] == number and call[2] == 0 for call in clock.calls[2:])


def test_sampling_stops_once_the_median_is_known_to_the_precision():
    steady = Recorder(1e-5, noise=0.001)
    samples, _ = time_with_evaluator(
        steady, TimingConfig(min_repeats=3, max_repeats=50, budget_seconds=1.0, precision=0.01)
    )
    assert len(samples) == 3
    noisy = Recorder(1e-5, noise=0.1)
    samples, _ = time_with_evaluator(
        noisy, TimingConfig(min_repeats=3, max_repeats=50, budget_seconds=1.0, precision=0.01)
    )
    assert 3 < len(samples) <= 50
    assert median_precision(samples) <= 0.01 or len(samples) == 50


def test_median_precision_narrows_with_more_samples():
    rng = random.Random(1)
    few = [1 + rng.uniform(-0.1, 0.1) for _ in range(8)]
    many = few + [1 + rng.uniform(-0.1, 0.1) for _ in range(92)]
    assert 0 < median_precision(many) < median_precision(few) <= 0.1
    assert median_precision([2.0, 2.0, 2.0]) == 0


def test_with_cache_flushing_every_sample_is_one_cold_call():
    clock = Recorder(1e-5, noise=0.2)
    samples, number = time_with_evaluator(clock, TimingConfig(min_repeats=3, max_repeats=20, flush_cache=True))
    assert number == 1 and all(call[0] == 1 for call in clock.calls)
    assert 3 < len(samples) <= 20
