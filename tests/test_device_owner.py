"""The measuring worker as its device's owner: a window's candidates timed as one queue, each result streamed
back as it is known, failures recorded and the rest of the queue timed in a fresh worker."""

import time

import faulty
import pytest

from measure import EngineConfig, MeasureEngine, MeasureInput, Status, TimeoutPolicy, TimingConfig
from measure.workers.worker import WorkerProcess, WorkerTimeout

QUICK = TimingConfig(min_repeats=3, max_repeats=3, budget_seconds=0.01)


@pytest.fixture(scope="module")
def built(tmp_path_factory, llvm_target):
    """Kernels built once for the module: copies of two sizes, a hanging one, a NaN-writing one."""
    work = tmp_path_factory.mktemp("owner-builds")
    inputs = [
        MeasureInput("small-a", faulty.copy(64)),
        MeasureInput("small-b", faulty.copy(64)),
        MeasureInput("large-a", faulty.copy(4096)),
        MeasureInput("large-b", faulty.copy(4096)),
        MeasureInput("hang", faulty.hanging()),
        MeasureInput("nan", faulty.nan_writing()),
    ]
    engine = MeasureEngine(llvm_target, work, EngineConfig(build_workers=2))
    builds = {b.key: b for b in engine.build(inputs)}
    yield builds
    engine.close()


def _request(builds, keys):
    return [{"key": k, "artifact": builds[k].artifact, "args": builds[k].args} for k in keys]


@pytest.fixture
def owner(tmp_path):
    worker = WorkerProcess("run", "owner", tmp_path / "owner.log", {"TVM_NUM_THREADS": "1"})
    yield worker
    worker.close()


@pytest.mark.parametrize("ahead", [0, 2])
def test_a_queue_is_timed_in_order_and_a_tasks_arguments_are_allocated_once(owner, built, ahead):
    keys = ["small-a", "small-b", "large-a", "large-b", "small-a"]
    outcomes = list(
        owner.stream(
            "time_queue", 60, candidates=_request(built, keys), device_kind="cpu", timing=QUICK.as_dict(), ahead=ahead
        )
    )
    assert [o["key"] for o in outcomes] == keys
    assert all(len(o["samples"]) == 3 and not o["nonfinite"] for o in outcomes)
    # the second of each shape reuses the first's buffers, refilled; the third shape's return is refilled too
    assert [o["allocated"] for o in outcomes] == [True, False, True, False, False]


def test_results_stream_back_before_the_queue_ends(owner, built):
    """The first candidate's result arrives while the second one hangs: nothing waits for the whole queue."""
    stream = owner.stream(
        "time_queue", 5, candidates=_request(built, ["small-a", "hang"]), device_kind="cpu", timing=QUICK.as_dict()
    )
    first = next(stream)
    assert first["key"] == "small-a" and first["samples"]
    started = time.monotonic()
    with pytest.raises(WorkerTimeout):
        next(stream)
    assert time.monotonic() - started >= 4.5


def test_a_candidate_failing_in_the_queue_leaves_the_next_ones_clean(owner, built, tmp_path):
    """A NaN written into a shared buffer, or a library that does not load, is that candidate's result
    alone: the next candidate on the same buffers gets fresh arguments."""
    missing = {"key": "missing", "artifact": str(tmp_path / "nowhere.so"), "args": built["small-a"].args}
    queue = [*_request(built, ["nan"]), missing, *_request(built, ["small-a", "small-b"])]
    outcomes = list(owner.stream("time_queue", 60, candidates=queue, device_kind="cpu", timing=QUICK.as_dict()))
    assert [o["key"] for o in outcomes] == ["nan", "missing", "small-a", "small-b"]
    assert outcomes[0]["nonfinite"] and "error" in outcomes[1]
    assert not outcomes[2]["nonfinite"] and not outcomes[3]["nonfinite"]


def test_the_engine_times_a_window_as_one_queue_and_carries_on_past_a_crash_and_a_hang(tmp_path, llvm_target):
    config = EngineConfig(build_workers=2, run_timeout=TimeoutPolicy(initial=5, floor=5), timing=QUICK)
    inputs = [
        MeasureInput("crash", faulty.crashing()),
        MeasureInput("good-1", faulty.copy(128)),
        MeasureInput("hang", faulty.hanging()),
        MeasureInput("good-2", faulty.copy(256)),
        MeasureInput("good-3", faulty.copy(512)),
    ]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        builds = sorted(engine.build(inputs), key=lambda b: [i.key for i in inputs].index(b.key))
        results = list(engine.measure_built(builds))
        restarts = engine._runners.restarts
    assert [r.key for r in results] == [i.key for i in inputs]  # one queue, in order
    statuses = {r.key: r.status for r in results}
    assert statuses == {
        "crash": Status.RUN_CRASH,
        "good-1": Status.OK,
        "hang": Status.RUN_TIMEOUT,
        "good-2": Status.OK,
        "good-3": Status.OK,
    }
    assert "SIGSEGV" in results[0].error and results[1].latency > 0
    assert restarts == 2  # the crashed owner and the hung one, each replaced once
