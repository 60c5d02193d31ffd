"""The measurement engine on real candidates, good and faulty."""

import json
import os

import faulty
import pytest

from measure import AdaptiveTimeout, EngineConfig, MeasureEngine, MeasureInput, Status, TimeoutPolicy, TimingConfig
from measure.dop.controller import DopState
from measure.dop.memory import DopMemory, machine_key


def test_good_candidates_are_built_and_timed(engine):
    results = list(engine.measure([MeasureInput(f"copy{i}", faulty.copy(64 * (i + 1))) for i in range(3)]))
    assert sorted(r.key for r in results) == ["copy0", "copy1", "copy2"]
    for r in results:
        assert r.ok and len(r.samples) >= 3 and r.latency > 0 and r.build_seconds > 0
        assert r.args == [["float32", [int(r.key[-1]) * 64 + 64]]] * 2


def test_each_failure_is_reported_with_its_reason_and_measuring_goes_on(tmp_path, llvm_target):
    config = EngineConfig(
        build_workers=2,
        build_timeout=TimeoutPolicy(initial=5, floor=5),
        run_timeout=TimeoutPolicy(initial=5, floor=5),
    )
    inputs = [
        MeasureInput("unbuildable", faulty.unbuildable()),
        MeasureInput("slow-build", faulty.slow_to_build()),
        MeasureInput("crash", faulty.crashing()),
        MeasureInput("hang", faulty.hanging()),
        MeasureInput("nan", faulty.nan_writing()),
        MeasureInput("oom", faulty.out_of_memory()),
        MeasureInput("good", faulty.copy()),
    ]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        results = {r.key: r for r in engine.measure(inputs)}
        assert results["unbuildable"].status == Status.BUILD_ERROR and "Error: " in results["unbuildable"].error
        assert results["slow-build"].status == Status.BUILD_TIMEOUT
        assert results["crash"].status == Status.RUN_CRASH and "SIGSEGV" in results["crash"].error
        assert results["hang"].status == Status.RUN_TIMEOUT
        assert results["nan"].status == Status.RUN_ERROR and "NaN" in results["nan"].error
        assert results["oom"].status == Status.RUN_ERROR and "memory" in results["oom"].error.lower(), results[
            "oom"
        ].error
        assert results["good"].ok
        assert engine.worker_restarts >= 3  # killed builder, crashed runner, killed runner
        # the replaced workers serve the next batch
        again = list(engine.measure([MeasureInput("good-again", faulty.copy(128))]))
        assert again[0].ok


def test_a_groups_fastest_builds_are_kept_and_timed_again_without_building(tmp_path, llvm_target):
    sizes = {"copy-small": 64, "copy-mid": 64 * 1024, "copy-large": 1024 * 1024}
    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=2, kept_builds=2)) as engine:
        first = {
            r.key: r for r in engine.measure([MeasureInput(k, faulty.copy(n)) for k, n in sizes.items()], group="g")
        }
        assert all(r.ok for r in first.values()) and first["copy-large"].latency > first["copy-small"].latency
        kept = sorted((tmp_path / "artifacts").glob("*.so"))
        assert len(kept) == 2  # the two fastest; the slowest one's library is gone
        # a kept candidate is timed from its library: the module given with it is never built
        again = list(engine.measure([MeasureInput("copy-small", faulty.unbuildable())], serial=True, group="g"))
        assert again[0].ok and again[0].args == [["float32", [64]], ["float32", [64]]]
        # not kept: the slowest, and any candidate of another group, are built as given
        (slowest,) = engine.measure([MeasureInput("copy-large", faulty.unbuildable())], group="g")
        (other,) = engine.measure([MeasureInput("copy-mid", faulty.unbuildable())], group="other")
        assert slowest.status == other.status == Status.BUILD_ERROR
        assert sorted((tmp_path / "artifacts").glob("*.so")) == kept


def test_verify_tells_right_from_wrong(engine):
    assert engine.verify(faulty.copy(), faulty.copy(), rtol=1e-3).ok is True
    wrong = engine.verify(faulty.copy(), faulty.wrong_copy(), rtol=1e-3)
    assert wrong.ok is False and "relative error" in wrong.detail


def test_a_task_is_run_unscheduled_once_for_all_its_candidates(engine):
    for candidate in (faulty.wrong_copy(), faulty.copy(), faulty.copy()):
        engine.verify(faulty.copy(), candidate, rtol=1e-3)
    assert len(list((engine._artifact_dir / "references").iterdir())) == 1


def test_a_reference_too_slow_to_run_leaves_the_candidate_unchecked_not_wrong(tmp_path, llvm_target):
    config = EngineConfig(build_workers=1, reference_timeout=2.0)
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        outcome = engine.verify(faulty.hanging(), faulty.copy(1), rtol=1e-3)
        assert outcome.ok is None and not outcome.worth_retrying and "too long" in outcome.detail, outcome
        assert engine.verify(faulty.copy(), faulty.copy(), rtol=1e-3).ok is True


def test_verification_builds_are_not_held_to_the_candidates_build_timeout(tmp_path, llvm_target):
    """The reference (the unscheduled kernel) can take far longer to build than the candidates; held to
    their timeout, a verification failed to build and the kernel fell back to TVM's default schedule."""
    # 1 ms: no LLVM build finishes that fast (a warm builder on a Zen 5 built this copy in under 50 ms)
    config = EngineConfig(build_workers=1, build_timeout=TimeoutPolicy(initial=0.001, floor=0.001))
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        (measured,) = engine.measure([MeasureInput("copy", faulty.copy())])
        assert measured.status == Status.BUILD_TIMEOUT  # a candidate's build is held to 1 ms
        assert engine.verify(faulty.copy(), faulty.copy(), rtol=1e-3).ok is True


def test_workers_start_once_and_are_reused(engine):
    list(engine.measure([MeasureInput("a", faulty.copy())]))
    pids = [w.pid for w in engine._builders] + [*[w.pid for w in engine._runners.workers]]
    list(engine.measure([MeasureInput("b", faulty.copy(32))]))
    assert [w.pid for w in engine._builders] + [*[w.pid for w in engine._runners.workers]] == pids
    assert all(pid and os.path.exists(f"/proc/{pid}") for pid in pids)


def test_closing_leaves_no_worker_behind(tmp_path, llvm_target):
    engine = MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=1))
    engine.start()
    list(engine.measure([MeasureInput("a", faulty.copy())]))
    pids = [w.pid for w in engine._builders] + [*[w.pid for w in engine._runners.workers]]
    engine.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@pytest.mark.parametrize(
    "observed, expected",
    [([], 60), ([0.1, 0.2, 0.1], 60), ([0.1] * 7 + [0.2], 10), ([3, 4, 5, 4, 4, 3, 5, 40], 40), ([30] * 8, 120)],
)
def test_timeouts_follow_the_typical_duration_measured(observed, expected):
    timeout = AdaptiveTimeout(TimeoutPolicy(initial=60, floor=10, factor=10, ceiling=120, warmup=8))
    for seconds in observed:
        timeout.record(seconds)
    assert timeout.value == expected


def test_a_task_whose_builds_are_all_slow_gets_a_timeout_of_its_own():
    timeout = AdaptiveTimeout(TimeoutPolicy(initial=60, floor=1, factor=10, ceiling=120, warmup=8))
    for _ in range(8):
        timeout.record(0.1, group="fast")
    assert timeout.value_for("fast") == 1 and timeout.value_for(None) == 1
    assert timeout.value_for("new") == 10  # before its own first build: factor x the value for all
    timeout.record(3.0, group="slow")
    assert timeout.value_for("slow") == 30 and timeout.value_for("fast") == 1


def test_parallel_windows_are_checked_serially_and_every_decision_is_logged(tmp_path, llvm_target):
    config = EngineConfig(build_workers=1, max_dop=2, timing=TimingConfig(max_repeats=5, budget_seconds=0.01))
    inputs = [MeasureInput(f"c{i}", faulty.copy(256 * (i + 1))) for i in range(15)]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        results = list(engine.measure(inputs))
        decisions = engine.dop_decisions
    assert sorted(r.key for r in results) == sorted(i.key for i in inputs) and all(r.ok for r in results)
    first, second = decisions[0], decisions[1]
    assert first.dop == 1 and first.next_dop == 2 and first.checked == 0  # nothing to check alone
    assert second.dop == 2 and second.checked == 2 and second.max_error is not None  # 20% of a window of 10
    rechecked = [r for r in results if r.parallel_samples]
    assert all(r.dop == 1 for r in rechecked)
    if second.max_error > 0.05:  # a loss: back to 1, and the whole window was re-measured alone
        assert second.next_dop == 1 and len(rechecked) == 10 and not any(r.dop == 2 for r in results)
    else:
        assert second.next_dop == 2 and len(rechecked) == 2 and sum(r.dop == 2 for r in results) >= 8
    logged = (tmp_path / "logs" / "dop.jsonl").read_text().splitlines()
    assert len(logged) == len(decisions) and '"reason"' in logged[0]
    assert json.loads(logged[0])["start"].startswith("start: DOP 1 (nothing remembered for cpu/")


def test_an_engine_resumes_where_the_last_run_here_left_off_and_checks_it_closely(tmp_path, llvm_target):
    memory = DopMemory(machine_key("cpu"))  # in this test's own user cache (conftest)
    memory.save(DopState(dop=2, loss_dop=None, cooldown=0, loss_streak=0))
    config = EngineConfig(build_workers=1, max_dop=2, timing=TimingConfig(max_repeats=5, budget_seconds=0.01))
    inputs = [MeasureInput(f"c{i}", faulty.copy(256 * (i + 1))) for i in range(5)]
    with MeasureEngine(llvm_target, tmp_path, config) as engine:
        results = list(engine.measure(inputs))
        first = engine.dop_decisions[0]
    assert all(r.ok for r in results)
    assert first.dop == 2 and first.checked == 2  # 40% of a window of 5 where 20% would check 1
    logged = json.loads((tmp_path / "logs" / "dop.jsonl").read_text().splitlines()[0])
    assert logged["start"].startswith("start: remembered DOP 2 (no loss yet, probe cooldown 0) from ")
    assert memory.load().state == engine.dop.state()  # what this run learned is kept for the next


def test_an_engine_with_remember_dop_off_neither_reads_nor_writes_the_memory(llvm_target, tmp_path):
    memory = DopMemory(machine_key("cpu"))
    memory.save(DopState(dop=2, loss_dop=None, cooldown=0, loss_streak=0))
    saved = memory.path.read_text()
    engine = MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=1, max_dop=2, remember_dop=False))
    assert engine.dop.dop == 1 and engine.dop.start == "start: DOP 1 (remember_dop is off)"
    engine.dop.update([])  # a decision this run would otherwise remember
    engine.close()
    assert memory.path.read_text() == saved
    remembering = MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=1, max_dop=2))
    assert remembering.dop.dop == 2 and remembering.dop.start.startswith("start: remembered DOP 2")
    remembering.close()


def test_a_cold_cache_run_times_cpu_kernels_with_their_arguments_flushed(tmp_path, llvm_target):
    from tuner.run import make_engine

    with make_engine(llvm_target, tmp_path, 1, None, cold_cache=True) as engine:
        assert engine.config.timing.for_device("cpu").flush_cache  # TVM's flush before every sample
        (result,) = engine.measure([MeasureInput("copy", faulty.copy(1 << 16))])
        assert result.ok and len(result.samples) >= 3 and result.latency > 0
    with make_engine(llvm_target, tmp_path / "warm", 1, None) as engine:
        assert not engine.config.timing.for_device("cpu").flush_cache  # the default: as the kernel runs again


def test_a_program_timed_past_its_timeout_raises_and_the_worker_comes_back(engine, tmp_path):
    # the untuned program of a large model can take many minutes a call (tuner.run._untuned_latency)
    from measure.workers.worker import WorkerTimeout
    from workloads import get_workload

    artifact = engine.compile_program(tmp_path / "op.so", mod=get_workload("matmul-128").mod, kind="tir", schedules=[])
    args = [["float32", [128, 128]]] * 3
    with pytest.raises(WorkerTimeout):
        engine.time_program(artifact, "tir", args, TimingConfig(warmup_seconds=1.0), timeout=0.01)
    assert engine.time_program(artifact, "tir", args)[0] > 0
