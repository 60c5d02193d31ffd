"""Tuning on a real Ray cluster started by the tests (loopback, 2 CPUs, fake GPUs for placement)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import threading
import time

import faulty
import pytest
from ray_cluster import LocalRayCluster

from measure import MeasureInput
from measure.cluster.connect import CLIENT_CONNECT_ATTEMPTS, init_remote
from measure.cluster.engine import ClusterEngine, ClusterOptions
from tuner import TunerError, tune


@pytest.fixture(scope="module")
def ray_cluster(request):
    failed_before = request.session.testsfailed
    with LocalRayCluster(num_cpus=2, num_gpus=2) as cluster:
        yield cluster
        cluster.keep_logs = request.session.testsfailed > failed_before  # the node logs of a failing module stay


def copies(count: int, prefix: str = "copy") -> list[MeasureInput]:
    return [MeasureInput(f"{prefix}{i}", faulty.copy(64 * (i + 1))) for i in range(count)]


def committed(work_dir) -> list[str]:
    with sqlite3.connect(work_dir / "tuning.db") as db:
        return [row[0] for row in db.execute("SELECT candidate FROM records")]


def test_tuning_through_ray_gives_what_the_local_path_gives(ray_cluster, tuned_matmul, tmp_path):
    result = tune(
        "matmul-128",
        target="llvm",
        trials=16,
        work_dir=tmp_path,
        batch_size=8,
        progress=False,
        cluster=ray_cluster.address,
        time_untuned=True,
    )
    assert result.trials == tuned_matmul.trials == 16
    assert result.tasks[0].verified and tuned_matmul.tasks[0].verified
    assert result.latency_after < result.latency_before
    with sqlite3.connect(tmp_path / "tuning.db") as db:
        nodes = {
            row[0] for row in db.execute("SELECT json_extract(measurement, '$.node') FROM records WHERE status = 'ok'")
        }
    assert len(nodes) == 1 and next(iter(nodes)).endswith("/cpu")  # a CPU target: one measuring actor per host


@pytest.mark.slow  # 18 s: out of CI (`pytest -m slow`)
def test_one_measuring_actor_per_gpu_each_with_its_own_dop(ray_cluster, tmp_path, llvm_target):
    with ClusterEngine(llvm_target, tmp_path, ClusterOptions(ray_cluster.address, per_gpu=True)) as engine:
        results = list(engine.measure(copies(20), group="copies"))
        assert sorted(r.key for r in results) == sorted(f"copy{i}" for i in range(20))
        assert all(r.ok for r in results)
        measurers = engine.measurers()
        assert sorted(m["name"].rsplit("/", 1)[1] for m in measurers) == ["gpu0", "gpu1"]
        assert {r.node for r in results} == {m["name"] for m in measurers}  # both were fed
        assert len({r.device for r in results}) == 1  # one device model per comparison group
        assert "cluster: built on" in engine.activity()


@pytest.mark.slow  # another spelling of the address the tests above connect through
def test_ray_client_addresses_work_too(ray_cluster, tmp_path, llvm_target):
    with ClusterEngine(llvm_target, tmp_path, ClusterOptions(ray_cluster.client_address)) as engine:
        assert all(r.ok for r in engine.measure(copies(4), group="copies"))


class RayClientProxyThatFailsToFork:
    """Answers ``ray.init`` as Ray Client's proxy does when the server it forks for a client dies."""

    def __init__(
        self,
        failures: int,
        message: str = "Starting Ray client server failed. See ray_client_server_23000.err for detailed logs.",
    ):
        self.failures, self.message, self.inits, self.shutdowns = failures, message, 0, 0

    def init(self, address: str, **kwargs) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise RuntimeError(self.message)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_ray_client_server_that_fails_to_start_is_asked_again_and_other_errors_are_not():
    flaky = RayClientProxyThatFailsToFork(failures=CLIENT_CONNECT_ATTEMPTS - 1)
    init_remote(flaky, "ray://127.0.0.1:10001", {})
    assert flaky.inits == CLIENT_CONNECT_ATTEMPTS and flaky.shutdowns == CLIENT_CONNECT_ATTEMPTS - 1
    broken = RayClientProxyThatFailsToFork(failures=CLIENT_CONNECT_ATTEMPTS)
    with pytest.raises(RuntimeError, match="client server failed"):
        init_remote(broken, "ray://127.0.0.1:10001", {})
    assert broken.inits == CLIENT_CONNECT_ATTEMPTS
    wrong = RayClientProxyThatFailsToFork(failures=1, message="ray client connection timeout")
    with pytest.raises(RuntimeError, match="timeout"):
        init_remote(wrong, "ray://127.0.0.1:10001", {})
    assert wrong.inits == 1
    plain = RayClientProxyThatFailsToFork(failures=1)  # a GCS address has no client proxy to ask again
    with pytest.raises(RuntimeError):
        init_remote(plain, "127.0.0.1:6379", {})
    assert plain.inits == 1


def test_a_measuring_actor_killed_mid_run_loses_nothing_and_measures_nothing_twice(ray_cluster, tmp_path, llvm_target):
    inputs = copies(30)
    keys, killed = [], None
    with ClusterEngine(llvm_target, tmp_path, ClusterOptions(ray_cluster.address, per_gpu=True)) as engine:
        for result in engine.measure(inputs, group="copies"):
            keys.append(result.key)
            busy = [m for m in engine.measurers() if m["in_flight"] and m["state"] == "up"]
            if killed is None and busy:
                killed = busy[0]
                os.kill(killed["pid"], signal.SIGKILL)
        assert killed is not None, "no measuring actor was busy to kill"
        assert sorted(keys) == sorted(i.key for i in inputs)  # each exactly once
        engine.settle(120)
        restarted = next(m for m in engine.measurers() if m["name"] == killed["name"])
        assert restarted["state"] == "up" and restarted["restarts"] >= 1 and restarted["pid"] != killed["pid"]
        again = list(engine.measure(copies(10, "again"), group="copies"))
        assert all(r.ok for r in again) and restarted["name"] in {
            r.node for r in again
        }  # the restarted actor is fed again


@pytest.mark.slow  # 35 s; a measuring actor killed mid-run (above) is in CI: out of CI (`pytest -m slow`)
def test_a_build_task_whose_worker_dies_is_run_again(ray_cluster, tmp_path, llvm_target):
    import psutil

    killed: list[int] = []

    def kill_the_first_long_build() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for process in psutil.process_iter(["pid", "cmdline"]):
                title = " ".join(process.info["cmdline"] or [])
                if title.startswith("ray::build_task"):
                    time.sleep(1.0)
                    if " ".join(process.cmdline()).startswith("ray::build_task"):  # still building: the slow one
                        process.kill()
                        killed.append(process.pid)
                        return
            time.sleep(0.1)

    inputs = [MeasureInput("slow", faulty.slow_to_build(20_000)), *copies(4)]
    killer = threading.Thread(target=kill_the_first_long_build)
    with ClusterEngine(llvm_target, tmp_path, ClusterOptions(ray_cluster.address)) as engine:
        killer.start()
        results = list(engine.measure(inputs, group="copies"))
        killer.join()
    assert killed, "no build task was seen running"
    assert sorted(r.key for r in results) == sorted(i.key for i in inputs)
    assert all(r.ok for r in results), [(r.key, r.status, r.error) for r in results]


@pytest.mark.slow  # 35-45 s; tuning through Ray and a measuring actor killed mid-run stay in CI
def test_a_second_node_joins_over_loopback_and_gets_builds(tmp_path, llvm_target):
    with LocalRayCluster(num_cpus=1) as cluster:
        cluster.add_node(num_cpus=1)
        with ClusterEngine(llvm_target, tmp_path, ClusterOptions(cluster.address)) as engine:
            assert len(engine.description["nodes"]) == 2
            results = list(engine.measure(copies(12), group="copies"))
            assert all(r.ok for r in results)
            built_on = engine._activity["built_on"]
            assert len(built_on) == 2 and all(count > 0 for count in built_on.values()), built_on


@pytest.mark.slow  # over 40 s; a measuring actor killed mid-run (below) keeps losing nothing in CI
def test_a_cluster_going_away_ends_the_run_with_its_measurements_kept_and_it_resumes_locally(tmp_path):
    work_dir = tmp_path / "run"
    outcome: dict = {}

    def tune_on_the_cluster(address: str) -> None:
        try:
            tune("matmul-128", trials=200, work_dir=work_dir, batch_size=8, progress=False, cluster=address)
        except TunerError as err:
            outcome["error"] = str(err)

    with LocalRayCluster(num_cpus=2) as cluster:
        thread = threading.Thread(target=tune_on_the_cluster, args=(cluster.address,))
        thread.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(committed(work_dir) if (work_dir / "tuning.db").exists() else []) < 8:
            time.sleep(0.5)
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert "went away" in outcome["error"] and "resume" in outcome["error"], outcome
    kept = committed(work_dir)
    assert 8 <= len(kept) < 200
    result = tune("matmul-128", trials=len(kept) + 8, work_dir=work_dir, batch_size=8, progress=False, verify=False)
    after = committed(work_dir)
    assert result.trials == len(after) == len(kept) + 8
    assert set(kept) <= set(after) and len(set(after)) == len(after)


def test_an_address_where_no_cluster_listens_is_refused_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(TunerError, match=r"nothing answers at 127\.0\.0\.1:1 .*ray start --head"):
        tune("matmul-128", trials=8, work_dir=tmp_path, progress=False, cluster="127.0.0.1:1")
    assert time.monotonic() - started < 30


def test_a_malformed_address_names_the_forms_it_takes(tmp_path):
    with pytest.raises(TunerError, match="not a Ray address.*HOST:PORT"):
        tune("matmul-128", trials=8, work_dir=tmp_path, progress=False, cluster="head-node")


def test_tasks_are_spread_over_gpu_models_and_never_change_model():
    from collections import Counter

    from measure.cluster.state import assign_device

    measurers, groups = Counter({"NVIDIA H100": 2, "NVIDIA A100": 1}), {}
    assert [assign_device(task, measurers, groups) for task in ("t1", "t2", "t3")] == [
        "NVIDIA H100",
        "NVIDIA A100",
        "NVIDIA H100",
    ]
    assert assign_device("t2", measurers, groups) == "NVIDIA A100"  # a task's candidates stay on one model
    del measurers["NVIDIA A100"]  # its only measurer is gone for good
    assert assign_device("t2", measurers, groups) == "NVIDIA H100"


def test_build_workers_are_refused_on_a_cluster(tmp_path):
    with pytest.raises(TunerError, match="every CPU builds"):
        tune("matmul-128", trials=8, work_dir=tmp_path, progress=False, cluster="local", build_workers=2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs the CUDA toolkit to build CUDA candidates")
@pytest.mark.slow  # 20 s; CUDA candidates build here in test_cuda_build.py: out of CI (`pytest -m slow`)
def test_cuda_candidates_build_on_the_cluster_and_a_node_without_a_gpu_says_so(ray_cluster, tmp_path):
    from costmodel import CandidateFeatures, CostModel
    from measure import DeviceUnavailable
    from tuner.search.task_search import TaskSearch
    from tuner.targets import resolve_target
    from workloads import get_workload

    target = resolve_target("cuda -arch=sm_90")
    search = TaskSearch(
        get_workload("matmul-128").mod, target, seed=3, cost_model=CostModel(), features=CandidateFeatures(), group="mm"
    )
    inputs = [MeasureInput(c.key, c.mod) for c in search.propose(2)]
    with ClusterEngine(target, tmp_path, ClusterOptions(ray_cluster.address)) as engine:  # two fake GPUs: two actors
        assert len(engine.description["measurers"]) == 2
        with pytest.raises(DeviceUnavailable, match="no CUDA (driver|GPU)"):
            list(engine.measure(inputs, group="mm"))
