"""The tuner killed, interrupted, doubled, starved of disk, and fed failing candidates: every
measurement committed before is kept, none is taken twice, and the run says what to do next."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.chaos import kill_cycle, orphans_after, read_database, start_tuner
from tuner import TunerError, tune

MATMUL = ["matmul-128", "--batch-size", "8"]


def _wait_until(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _records(work_dir: Path) -> int:
    return read_database(work_dir / "tuning.db").records


def _last_line(path: Path) -> str:
    lines = path.read_text().strip().splitlines()
    return lines[-1] if lines else ""


def test_a_second_tuner_on_the_same_work_dir_stops_at_once_and_a_killed_holder_leaves_no_lock(tmp_path):
    holder = start_tuner([*MATMUL, "--trials", "400", "--work-dir", "run"], tmp_path)
    _wait_until(lambda: _records(tmp_path / "run") >= 8, what="the first tuner's measurements")
    second = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", *MATMUL, "--trials", "400", "--work-dir", "run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr
    assert f"in use by process {holder.process.pid}" in lines[0] and "--work-dir" in lines[0]
    holder.process.kill()
    holder.process.wait()
    assert orphans_after(holder) == []
    done = _records(tmp_path / "run")
    resumed = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "tune", *MATMUL, "--trials", str(done + 8), "--work-dir", "run", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    state = read_database(tmp_path / "run" / "tuning.db")
    assert state.records == done + 8 and state.duplicates == 0


@pytest.mark.parametrize(
    "sig, code",
    # tuner.cli turns SIGTERM into an exception as Python does Ctrl-C, and both stop the same way from
    # there: Ctrl-C in CI, SIGTERM (11 s) out of it (`pytest -m slow`)
    [pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow), (signal.SIGINT, 130)],
)
def test_sigterm_and_ctrl_c_stop_with_the_work_saved_and_say_how_to_resume(tmp_path, sig, code):
    tuner = start_tuner([*MATMUL, "--trials", "400", "--work-dir", "run"], tmp_path)
    _wait_until(lambda: _records(tmp_path / "run") >= 8, what="measurements")
    tuner.process.send_signal(sig)
    assert tuner.process.wait(timeout=60) == code
    last = _last_line(tuner.stderr_path)
    assert "committed in run/tuning.db" in last and "run the same command again to resume" in last, last
    assert orphans_after(tuner) == []
    assert read_database(tmp_path / "run" / "tuning.db").incomplete == 0


@pytest.mark.slow  # over a minute and a half on 2 cores: out of CI (`pytest -m slow`)
def test_sigkill_at_random_moments_then_resume_loses_and_repeats_nothing(tmp_path):
    """Two kills of a multi-task run at random instants, then the same command until it ends."""
    cycle = kill_cycle(
        tmp_path / "run",
        ["tiny-resnet", "--trials", "32", "--batch-size", "8", "--time-untuned"],
        32,
        2,
        random.Random(3),
        expected_seconds=40,
    )
    assert cycle["exit"] == 0, cycle
    assert cycle["records"] == 32 and cycle["lost"] == 0 and cycle["duplicated"] == 0 and cycle["half_written"] == 0, (
        cycle
    )
    assert cycle["orphans"] == 0 and cycle["verified"] and cycle["latency_after"] < cycle["latency_before"], cycle


def test_tuning_survives_a_fifth_of_candidates_failing_for_real(tmp_path, monkeypatch):
    # Hangs are left to experiments/chaos.py: each costs a full run timeout.
    monkeypatch.setenv("TENSOR_TUNER_INJECT_FAULTS", "build-crash,segfault,oom,nan,wrong:0.2")
    result = tune("matmul-128", trials=40, batch_size=8, work_dir=tmp_path / "run", progress=False)
    assert result.trials == 40 and all(task.verified for task in result.tasks)
    from tuner.database.database import TuningDatabase

    db = TuningDatabase(result.database_path, read_only=True)
    failed = [r for r in db.records() if r.status != "ok"]
    db.close()
    assert failed and all(r.error for r in failed)
    statuses = {r.status for r in failed}
    assert statuses & {"build_crash", "run_crash", "run_error"}, statuses


def _can_mount() -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", "--version"], capture_output=True).returncode == 0


@contextlib.contextmanager
def _tmpfs(path: Path, size: str, *options: str):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


needs_mount = pytest.mark.skipif(not _can_mount(), reason="mounting a small file system needs root")


def _remount_read_only(mount: Path, tries: int = 50) -> None:
    """Make a bind mount read-only; the kernel refuses (EBUSY) while a file the tuner has just opened there
    is open for writing (a log, a database journal), so it is tried again until a moment without one."""
    for _ in range(tries):
        remounted = subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], capture_output=True)
        if remounted.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"{mount} could not be made read-only: {remounted.stderr.decode().strip()}")


@needs_mount
def test_a_full_disk_ends_the_run_in_one_line_with_every_measurement_kept(tmp_path):
    with _tmpfs(tmp_path / "disk", "64m") as disk:
        tuner = start_tuner([*MATMUL, "--trials", "400", "--work-dir", "disk/run"], tmp_path)
        _wait_until(lambda: _records(disk / "run") >= 8, what="measurements")
        with open(disk / "filler", "wb") as filler:  # fill the disk to the last block
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
        assert tuner.process.wait(timeout=120) == 2
        last = _last_line(tuner.stderr_path)
        assert last.startswith("tuner: error: the work dir's disk is full") and "free some space" in last, last
        (disk / "filler").unlink()
        state = read_database(disk / "run" / "tuning.db")
        assert state.intact and state.records >= 8 and state.incomplete == 0 and state.duplicates == 0


@needs_mount
def test_a_work_dir_turning_read_only_ends_the_run_without_blaming_candidates(tmp_path):
    with _tmpfs(tmp_path / "disk", "64m") as disk:
        tuner = start_tuner([*MATMUL, "--trials", "400", "--work-dir", "disk/run"], tmp_path)
        _wait_until(lambda: _records(disk / "run") >= 8, what="measurements")
        run = disk / "run"
        subprocess.run(["mount", "--bind", str(run), str(run)], check=True)
        try:
            _remount_read_only(run)
            assert tuner.process.wait(timeout=120) == 2
        finally:
            subprocess.run(["umount", "-l", str(run)], capture_output=True)
        last = _last_line(tuner.stderr_path)
        assert last.startswith("tuner: error: the work dir became read-only"), last
        from tuner.database.database import TuningDatabase

        db = TuningDatabase(run / "tuning.db", read_only=True)
        statuses = {r.status for r in db.records()}
        db.close()
        assert statuses == {"ok"}, statuses  # no candidate recorded as failed for the disk's sake


@needs_mount
def test_an_unwritable_work_dir_is_refused_also_as_root(tmp_path):
    with _tmpfs(tmp_path / "ro", "1m", "ro") as read_only:
        with pytest.raises(TunerError, match="cannot write to work dir .*Read-only file system"):
            tune("matmul-128", trials=4, work_dir=read_only / "run")
