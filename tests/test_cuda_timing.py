"""Cold GPU samples are timed with the kernel queued behind the L2 flush, so that the launch's
host-side delay stays out of them, and a sample where the host fell behind is taken again.

No GPU here: ``SimulatedStream`` stands in for the CUDA runtime at ``QueuedColdTimer``'s boundary
(its events and one stream, on which work runs back to back in simulated time). The timer's own
logic, what it queues in which order, the check and the retries, is what is tested."""

import time

import pytest

from measure.timing.cuda_cold import RETRIES, QueuedColdTimer


class SimulatedStream:
    """One CUDA stream: each piece of work starts when it is queued or when the work before it
    ends, whichever is later; an event completes when the work queued before it has, and waiting
    for it waits until then. The host's clock is time.perf_counter."""

    def __init__(self):
        self.free_at = 0.0
        self.stamps: dict[int, float] = {}
        self.events = 0

    def run(self, seconds: float) -> None:
        self.free_at = max(time.perf_counter(), self.free_at) + seconds

    def event(self) -> int:
        self.events += 1
        return self.events

    def call(self, name: str, *args) -> None:
        if name == "cudaEventRecord":
            self.stamps[args[0]] = max(time.perf_counter(), self.free_at)
        elif name == "cudaEventSynchronize":
            time.sleep(max(0.0, self.stamps[args[0]] - time.perf_counter()))

    def elapsed_seconds(self, start: int, stop: int) -> float:
        return self.stamps[stop] - self.stamps[start]

    def destroy(self, event: int) -> None:
        pass


def _timer(flush_seconds: float, kernel_seconds: float, launch_delay: float) -> QueuedColdTimer:
    stream = SimulatedStream()

    def kernel():
        time.sleep(launch_delay)  # the host's work before the launch reaches the GPU
        stream.run(kernel_seconds)

    return QueuedColdTimer(kernel, [], lambda: stream.run(flush_seconds), cuda=stream)


def test_a_kernel_queued_behind_the_flush_is_timed_without_the_launch_delay():
    timer = _timer(flush_seconds=0.02, kernel_seconds=0.001, launch_delay=0.002)
    samples = timer(1, 5, 0)
    assert samples == pytest.approx([0.001] * 5, abs=2e-4) and timer.late == 0


def test_a_sample_the_host_queued_too_late_is_taken_again_and_counted_when_it_stays_late():
    timer = _timer(flush_seconds=0.0, kernel_seconds=0.001, launch_delay=0.002)
    calls = []
    kernel = timer.kernel
    timer.kernel = lambda: calls.append(1) or kernel()
    samples = timer(1, 2, 0)
    assert timer.late == 2 and len(calls) == 2 * (RETRIES + 1)
    assert all(s >= 0.0025 for s in samples)  # the delay is in them, and the timer said so


def test_the_warm_up_runs_calls_back_to_back_without_flushes_until_its_time_is_spent():
    stream = SimulatedStream()
    flushes, calls = [], []
    timer = QueuedColdTimer(
        lambda: calls.append(1) or stream.run(0.001), [], lambda: flushes.append(1) or stream.run(0.005), cuda=stream
    )
    (warm_up,) = timer(1, 1, 10)
    assert warm_up == pytest.approx(0.001, abs=2e-4) and len(calls) >= 10 and not flushes
    with pytest.raises(ValueError, match="number must be 1"):
        timer(4, 1, 0)
