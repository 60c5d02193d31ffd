"""CPU measuring processes: as many as the cores allow for the kernel's thread count, each on cores of its own."""

import os

import faulty
import pytest

from common.host import physical_cores
from measure import EngineConfig, MeasureEngine, MeasureInput
from measure.timing.cpu_slots import default_cpu_dop, runner_cpu_sets
from tuner.targets import resolve_target


def test_kernels_using_every_core_are_timed_one_at_a_time():
    assert default_cpu_dop(physical_cores()) == 1
    assert default_cpu_dop(10 * physical_cores()) == 1
    assert runner_cpu_sets(1, 1) == [None]  # one runner has the host to itself


def test_runner_cpu_sets_are_disjoint_and_never_oversubscribed():
    allowed = sorted(os.sched_getaffinity(0))
    sets = runner_cpu_sets(len(allowed), 1)
    if len(allowed) >= 2:
        assert sets == [[cpu] for cpu in allowed]
    assert runner_cpu_sets(len(allowed) + 1, 1) == [None] * (len(allowed) + 1)  # more runners than CPUs: not pinned


@pytest.mark.skipif(physical_cores() < 2 or len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_single_thread_kernels_get_one_pinned_runner_per_core(tmp_path):
    target = resolve_target("llvm -num-cores=1")
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=1, remember_dop=False)) as engine:
        runners = engine._runners.workers
        assert len(runners) == physical_cores()
        for runner in runners:
            runner.wait_ready()
        pinned = [sorted(os.sched_getaffinity(runner.pid)) for runner in runners]
        assert all(len(cpus) == 1 for cpus in pinned) and len({cpus[0] for cpus in pinned}) == len(runners), pinned
        results = list(engine.measure([MeasureInput(f"copy{i}", faulty.copy(64 * (i + 1))) for i in range(4)]))
        assert all(r.ok for r in results)
