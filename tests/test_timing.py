"""The sampling policy of the timing protocol (the evaluator here is a stand-in clock, since the
policy, not TVM's timer, is under test; real timing is covered by the engine tests)."""

from measure.timing import TimingConfig, time_with_evaluator


class Recorder:
    def __init__(self, seconds_per_call: float):
        self.seconds = seconds_per_call
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, number: int, repeat: int, min_repeat_ms: int) -> list[float]:
        self.calls.append((number, repeat, min_repeat_ms))
        return [self.seconds] * repeat


def test_slow_kernels_stop_after_the_minimum_samples():
    clock = Recorder(0.2)
    samples, _ = time_with_evaluator(clock, TimingConfig(min_repeats=3, budget_seconds=0.05))
    assert len(samples) == 3
    assert clock.calls[0][2] >= 10  # the warm-up lasts at least warmup_seconds


def test_fast_kernels_get_more_samples_of_many_calls_until_the_budget():
    clock = Recorder(1e-5)
    samples, number = time_with_evaluator(clock, TimingConfig(min_repeats=3, max_repeats=20, budget_seconds=0.01, min_sample_seconds=1e-3))
    assert number == 100
    assert 3 < len(samples) <= 20
    assert clock.calls[-1] == (100, len(samples) - 3, 0)
