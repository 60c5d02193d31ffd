"""tune() end to end on the CPU, with real builds, timing and XGBoost."""

import sqlite3
import stat

import numpy as np
import pytest
import tvm

from tuner import NoDeviceError, TargetError, TunerError, WorkloadError, tune


def test_tuning_beats_the_untuned_kernel_and_checks_its_result(tuned_matmul):
    result = tuned_matmul
    assert result.trials == 16
    (task,) = result.tasks
    assert task.best_latency > 0 and task.verified is True and "sample_perfect_tile" in task.schedule
    assert result.latency_after < result.latency_before / 2
    a, b = np.random.rand(128, 128).astype("float32"), np.random.rand(128, 128).astype("float32")
    _, _, c = result.run(a, b, np.zeros((128, 128), "float32"))
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)


def test_the_summary_says_how_much_of_measuring_the_device_spent_timing(tuned_matmul):
    """The device's busy share, the figure a GPU run is judged by, from the candidates' timed regions."""
    result = tuned_matmul
    assert 0 < result.device_seconds < result.seconds["measure"]
    share = result.device_seconds / result.seconds["measure"]
    assert f"(the device timing {share:.0%})" in result.summary()


def test_the_untuned_program_is_compiled_and_timed_only_when_asked(tuned_mlp, tmp_path):
    """Timing TVM's default schedules costs minutes on a large model (26-680x slower than tuned): by
    default it is neither timed, nor compiled where the end-to-end check does not need it."""
    assert tuned_mlp.latency_before is None and tuned_mlp.latency_after > 0  # its check compiled it, untimed
    assert "untuned not timed" in tuned_mlp.summary()
    result = tune("matmul-128", trials=8, work_dir=tmp_path, batch_size=8, progress=False)
    assert result.latency_before is None and not (tmp_path / "untuned.so").exists()
    asked = tune("matmul-128", trials=8, work_dir=tmp_path, batch_size=8, progress=False, time_untuned=True)
    assert asked.latency_before > asked.latency_after and (tmp_path / "untuned.so").exists()


def test_export_writes_a_library_tvm_loads(tuned_matmul, tmp_path):
    path = tuned_matmul.export(tmp_path / "mm.so")
    lib = tvm.runtime.load_module(str(path))
    a = tvm.runtime.tensor(np.ones((128, 128), "float32"))
    c = tvm.runtime.tensor(np.zeros((128, 128), "float32"))
    lib[lib.entry_name](a, a, c)
    assert np.allclose(c.numpy(), 128.0)


def _records(work_dir):
    with sqlite3.connect(work_dir / "tuning.db") as conn:
        return conn.execute("SELECT candidate, status FROM records").fetchall()


def test_resuming_measures_nothing_twice(tmp_path):
    tune("matmul-128", trials=8, work_dir=tmp_path, batch_size=8, progress=False, verify=False)
    first = _records(tmp_path)
    assert len(first) == 8
    again = tune("matmul-128", trials=8, work_dir=tmp_path, batch_size=8, progress=False, verify=False)
    assert _records(tmp_path) == first and again.trials == 8
    tune("matmul-128", trials=12, work_dir=tmp_path, batch_size=8, progress=False, verify=False)
    after = _records(tmp_path)
    assert after[:8] == first and len(after) == 12
    assert len({candidate for candidate, _ in after}) == 12


def test_a_work_dir_is_resumed_only_with_the_cache_state_it_was_timed_with(tmp_path):
    tune("matmul-128", trials=8, work_dir=tmp_path, batch_size=8, progress=False, verify=False)
    first = _records(tmp_path)
    with pytest.raises(TunerError, match=r"tuned with warm caches: resume it without --cold-cache"):
        tune("matmul-128", trials=12, work_dir=tmp_path, batch_size=8, progress=False, verify=False, cold_cache=True)
    assert _records(tmp_path) == first


def test_a_relax_model_is_tuned_task_by_task_and_runs(tmp_path):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    weight = np.random.rand(64, 32).astype("float32")
    w = relax.const(weight)
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    result = tune(bb.get(), trials=8, work_dir=tmp_path, batch_size=8, progress=False)
    (task,) = result.tasks
    assert result.kind == "relax" and task.trials == 8
    # its verified tuned schedule, or its analytic one where that ran faster inside the model (a 1.5 us kernel:
    # either, by the noise of the moment)
    assert task.verified or (task.analytic and task.tuned_in_model_latency)
    data = np.random.rand(8, 64).astype("float32")
    np.testing.assert_allclose(result.run(data), np.maximum(data @ weight, 0), rtol=1e-4)


@pytest.mark.parametrize("trials", [-3, 2.5, "8", True])
def test_trials_must_be_a_whole_number(trials, tmp_path):
    """0 is a budget too: no candidate measured, the analytic schedules alone (tests/test_analytic.py)."""
    with pytest.raises(TunerError, match="whole number"):
        tune("matmul-128", trials=trials, work_dir=tmp_path)


def test_unknown_model_names_the_closest(tmp_path):
    with pytest.raises(WorkloadError, match="matmul-128"):
        tune("matmul-12", trials=4, work_dir=tmp_path)


def test_invalid_target(tmp_path):
    with pytest.raises(TargetError, match="unsupported target kind 'vulkan'"):
        tune("matmul-128", target="vulkan", trials=4, work_dir=tmp_path)


def test_unwritable_work_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(TunerError, match="cannot write to work dir"):
        tune("matmul-128", trials=4, work_dir=blocker / "run")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if not _writable(read_only):  # root ignores permission bits
            with pytest.raises(TunerError, match="cannot write to work dir"):
                tune("matmul-128", trials=4, work_dir=read_only)
    finally:
        read_only.chmod(stat.S_IRWXU)


def _writable(path):
    try:
        (path / "probe").write_text("")
        (path / "probe").unlink()
        return True
    except OSError:
        return False


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is present")
def test_cuda_without_a_gpu_stops_with_one_clear_line(tmp_path):
    with pytest.raises(NoDeviceError) as err:
        tune("matmul-128", target="cuda -arch=sm_90", trials=4, work_dir=tmp_path)
    message = str(err.value)
    assert "no CUDA GPU" in message and "\n" not in message
