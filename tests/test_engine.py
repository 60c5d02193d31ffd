"""The measurement engine on real candidates, good and faulty."""

import os

import pytest

import faulty
from measure import AdaptiveTimeout, EngineConfig, MeasureEngine, MeasureInput, Status


def test_good_candidates_are_built_and_timed(engine):
    results = list(engine.measure([MeasureInput(f"copy{i}", faulty.copy(64 * (i + 1))) for i in range(3)]))
    assert sorted(r.key for r in results) == ["copy0", "copy1", "copy2"]
    for r in results:
        assert r.ok and len(r.samples) >= 3 and r.latency > 0 and r.build_seconds > 0
        assert r.args == [["float32", [int(r.key[-1]) * 64 + 64]]] * 2


def test_each_failure_is_reported_with_its_reason_and_measuring_goes_on(tmp_path, llvm_target):
    config = EngineConfig(build_workers=2, build_timeout=AdaptiveTimeout(initial=5, floor=5), run_timeout=AdaptiveTimeout(initial=5, floor=5))
    inputs = [
        MeasureInput("unbuildable", faulty.unbuildable()),
        MeasureInput("slow-build", faulty.slow_to_build()),
        MeasureInput("crash", faulty.crashing()),
        MeasureInput("hang", faulty.hanging()),
        MeasureInput("good", faulty.copy()),
    ]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        results = {r.key: r for r in engine.measure(inputs)}
        assert results["unbuildable"].status == Status.BUILD_ERROR and "Error: " in results["unbuildable"].error
        assert results["slow-build"].status == Status.BUILD_TIMEOUT
        assert results["crash"].status == Status.RUN_CRASH and "SIGSEGV" in results["crash"].error
        assert results["hang"].status == Status.RUN_TIMEOUT
        assert results["good"].ok
        assert engine.worker_restarts >= 3  # killed builder, crashed runner, killed runner
        # the replaced workers serve the next batch
        again = list(engine.measure([MeasureInput("good-again", faulty.copy(128))]))
        assert again[0].ok


def test_verify_tells_right_from_wrong(engine):
    assert engine.verify(faulty.copy(), faulty.copy(), rtol=1e-3).ok is True
    wrong = engine.verify(faulty.copy(), faulty.wrong_copy(), rtol=1e-3)
    assert wrong.ok is False and "relative error" in wrong.detail


def test_workers_start_once_and_are_reused(engine):
    list(engine.measure([MeasureInput("a", faulty.copy())]))
    pids = [w.pid for w in engine._builders] + [engine._runner.pid]
    list(engine.measure([MeasureInput("b", faulty.copy(32))]))
    assert [w.pid for w in engine._builders] + [engine._runner.pid] == pids
    assert all(pid and os.path.exists(f"/proc/{pid}") for pid in pids)


def test_closing_leaves_no_worker_behind(tmp_path, llvm_target):
    engine = MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=1))
    engine.start()
    list(engine.measure([MeasureInput("a", faulty.copy())]))
    pids = [w.pid for w in engine._builders] + [engine._runner.pid]
    engine.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@pytest.mark.parametrize(
    "observed, expected",
    [([], 60), ([0.1, 0.2, 0.1], 60), ([0.1] * 7 + [0.2], 10), ([3, 4, 5, 4, 4, 3, 5, 40], 40), ([30] * 8, 120)],
)
def test_timeouts_follow_the_typical_duration_measured(observed, expected):
    timeout = AdaptiveTimeout(initial=60, floor=10, factor=10, ceiling=120, warmup=8)
    for seconds in observed:
        timeout.record(seconds)
    assert timeout.value == expected
