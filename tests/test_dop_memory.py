"""Remembering the DOP controller across runs: real controllers, real files in temporary folders."""

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from measure.dop.controller import DopController, DopState
from measure.dop.memory import CACHE_DIR_ENV, DopMemory, machine_key, user_cache_dir


def run_where_parallel_never_holds(controller: DopController, windows: int) -> list[int]:
    """Windows of a run on a CPU where two candidates at once always measure 25% off; returns the
    windows spent probing DOP 2."""
    probes = []
    for window in range(windows):
        if controller.dop > 1:
            probes.append(window)
            controller.update(errors=[0.25])
        else:
            controller.update(errors=[])
    return probes


def test_what_is_saved_is_what_the_next_run_loads(tmp_path):
    path = tmp_path / "cache" / "dop_memory.json"
    other = DopMemory("cuda/NVIDIA H100", path)
    assert other.load() is None and other.problem is None  # no file yet: nothing to say
    assert other.save(DopState(dop=8, loss_dop=None, cooldown=0, loss_streak=0))
    state = DopState(dop=3, loss_dop=4, cooldown=5, loss_streak=2)
    before = datetime.now(UTC) - timedelta(seconds=1)
    assert DopMemory("cpu/here", path).save(state)
    remembered = DopMemory("cpu/here", path).load()
    assert remembered.state == state and before <= remembered.updated <= datetime.now(UTC)
    assert remembered.since.endswith("UTC") and remembered.since[:4].isdigit()
    assert DopMemory("cuda/NVIDIA H100", path).load().state.dop == 8  # the other machine's entry is kept
    assert [p.name for p in path.parent.iterdir()] == ["dop_memory.json"]  # no temporary file left
    assert json.loads(path.read_text())["machines"]["cpu/here"]["loss_dop"] == 4


def test_a_cpu_where_two_at_once_always_lose_starts_the_next_run_at_1_and_probes_rarely(tmp_path):
    first = DopController(max_dop=2)
    fresh_probes = run_where_parallel_never_holds(first, 13)
    assert len(fresh_probes) >= 3  # what each run cost before it remembered
    run_where_parallel_never_holds(first, 27)  # a few more runs' worth of windows
    memory = DopMemory(machine_key("cpu"), tmp_path / "dop_memory.json")
    memory.save(first.state())

    remembered = memory.load()
    second = DopController(max_dop=2)
    second.resume(remembered.state, since=remembered.since)
    assert second.dop == 1 and second.loss_dop == 2
    assert second.cooldown >= first.cooldown and second.loss_streak == first.loss_streak >= 3
    assert second.start.startswith("start: remembered DOP 1 (loss at 2")
    probes = run_where_parallel_never_holds(second, 13)
    assert len(probes) <= 1
    assert second.decisions[0].start == second.start and second.decisions[1].start is None


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"format": 99, "machines": {}}),
        json.dumps(
            {
                "format": 1,
                "machines": {
                    "cpu/here": {
                        "dop": "two",
                        "loss_dop": None,
                        "cooldown": 0,
                        "loss_streak": 0,
                        "updated": "2024-01-01T00:00:00+00:00",
                    }
                },
            }
        ),
        json.dumps(
            {
                "format": 1,
                "machines": {
                    "cpu/here": {
                        "dop": 2,
                        "loss_dop": None,
                        "cooldown": -1,
                        "loss_streak": 0,
                        "updated": "2024-01-01T00:00:00+00:00",
                    }
                },
            }
        ),
        json.dumps(
            {"format": 1, "machines": {"cpu/here": {"dop": 2, "loss_dop": None, "cooldown": 0, "loss_streak": 0}}}
        ),
    ],
    ids=["not-json", "not-an-object", "other-format", "bad-dop", "negative-cooldown", "no-date"],
)
def test_a_corrupt_file_starts_afresh_with_one_warning_and_is_repaired(tmp_path, caplog, content):
    path = tmp_path / "dop_memory.json"
    path.write_text(content)
    memory = DopMemory("cpu/here", path)
    with caplog.at_level(logging.WARNING, logger="tensor_tuner.measure"):
        assert memory.load() is None
        assert memory.save(DopState(1, 2, 4, 2))
    assert len(caplog.records) == 1 and str(path) in caplog.records[0].message and memory.problem
    assert DopMemory("cpu/here", path).load().state == DopState(1, 2, 4, 2)


def test_an_unwritable_cache_warns_once_and_tuning_goes_on(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    memory = DopMemory("cpu/here", blocker / "dop_memory.json")  # its folder cannot be created
    with caplog.at_level(logging.WARNING, logger="tensor_tuner.measure"):
        assert memory.load() is None
        assert memory.save(DopState(1, 2, 4, 2)) is False
        assert memory.save(DopState(1, 2, 3, 2)) is False
    assert len(caplog.records) == 1 and str(blocker) in caplog.records[0].message  # once, not per save
    assert memory.problem.startswith("cannot save")


def test_the_key_tells_cpu_from_cuda_and_one_gpu_from_another():
    cpu = machine_key("cpu")
    assert cpu == machine_key("cpu") and cpu.startswith("cpu/") and cpu.endswith(" cores")
    keys = {cpu, machine_key("cuda", "NVIDIA H100 80GB HBM3"), machine_key("cuda", "NVIDIA H200"), machine_key("cuda")}
    assert len(keys) == 4
    with pytest.raises(ValueError, match="device kind"):
        machine_key("rocm")


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert (
        user_cache_dir() == tmp_path / "elsewhere" and DopMemory("k").path == tmp_path / "elsewhere" / "dop_memory.json"
    )
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert user_cache_dir() == Path.home() / ".cache" / "tensor-tuner"


def test_tests_never_write_to_the_real_user_cache(user_cache):
    assert user_cache_dir() == user_cache and user_cache != Path.home() / ".cache" / "tensor-tuner"
