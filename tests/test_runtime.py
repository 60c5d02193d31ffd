"""The compiled model as a callable (tuner.runtime.compiled_model): numpy and torch in and out, without copies
where the memory allows, and loadable in another process without tuning again."""

import subprocess
import sys

import numpy as np
import pytest

import tuner
from tuner import TunerError

torch = pytest.importorskip("torch")


def _input(seed=0, aligned=True):
    data = np.random.default_rng(seed).standard_normal((16, 64)).astype("float32")
    if aligned:
        return data
    storage = np.zeros(16 * 64 + 1, "float32")[1:]  # 4 bytes past an aligned start
    storage[:] = data.ravel()
    return storage.reshape(16, 64)


def test_numpy_in_numpy_out_and_torch_in_torch_out(tuned_mlp):
    model = tuned_mlp.compiled()
    x = _input()
    out = model(x)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, tuned_mlp.reference(x), rtol=1e-4, atol=1e-4)
    out_torch = model(torch.from_numpy(x))
    assert isinstance(out_torch, torch.Tensor)
    np.testing.assert_allclose(out_torch.numpy(), out, rtol=1e-6)
    np.testing.assert_allclose(tuned_mlp.run(x), out, rtol=1e-6)  # the simple door, same model


def test_aligned_inputs_are_passed_without_a_copy_and_others_are_copied(tuned_mlp):
    model = tuned_mlp.compiled()
    aligned = torch.from_numpy(_input()).clone()  # torch allocates 64-byte aligned (numpy does not)
    assert aligned.data_ptr() % 64 == 0
    assert torch.from_dlpack(model._argument(0, aligned)).data_ptr() == aligned.data_ptr()
    misaligned = _input(aligned=False)
    assert misaligned.ctypes.data % 64 != 0
    assert np.from_dlpack(model._argument(0, misaligned)).ctypes.data != misaligned.ctypes.data
    np.testing.assert_allclose(model(misaligned), tuned_mlp.reference(misaligned), rtol=1e-4, atol=1e-4)


def test_an_output_survives_later_calls(tuned_mlp):
    model = tuned_mlp.compiled()
    first = model(_input(0))
    kept = first.copy()
    for seed in range(1, 4):
        model(_input(seed))
    np.testing.assert_array_equal(first, kept)


def test_a_wrong_input_is_refused_with_the_shape_it_needs(tuned_mlp):
    model = tuned_mlp.compiled()
    with pytest.raises(TunerError, match=r"must be float32\[16, 64\], got float64\[16, 64\]"):
        model(np.zeros((16, 64)))
    with pytest.raises(TunerError, match="takes 1 input"):
        model(_input(), _input())


def test_an_exported_model_runs_in_another_process_without_tuning(tuned_mlp, tmp_path):
    library = tuned_mlp.export(tmp_path / "mlp.so")
    assert (tmp_path / "mlp.json").exists()
    x = _input(7)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import numpy as np, tuner; "
        f"m = tuner.load({str(library)!r}); "
        f"np.save({str(tmp_path / 'y.npy')!r}, m(np.load({str(tmp_path / 'x.npy')!r})))"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), tuned_mlp.run(x), rtol=1e-6)


def test_the_checks_process_runs_a_model_without_importing_torch(tuned_mlp, tmp_path):
    """Each end-to-end check runs a build in a process of its own (tuner.runtime.run_model): torch, which
    tvm_ffi imports whenever it is installed, took 3.5 of its 5.5 s there."""
    library = tuned_mlp.export(tmp_path / "mlp.so")
    x = _input(3)
    np.savez(tmp_path / "in.npz", x)
    script = (
        "import sys; from tuner.runtime import run_model; "
        f"run_model.main({str(library)!r}, {str(tmp_path / 'in.npz')!r}, {str(tmp_path / 'out.npz')!r}); "
        "print(sys.modules.get('torch') is None)"
    )
    ran = subprocess.run([sys.executable, "-c", script], check=True, timeout=120, capture_output=True, text=True)
    assert ran.stdout.split() == ["True"], ran.stdout
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["arr_0"], tuned_mlp.run(x), rtol=1e-6)


def test_loading_a_library_without_its_description_says_how_to_export(tuned_mlp, tmp_path):
    bare = tmp_path / "bare.so"
    bare.write_bytes(tuned_mlp.artifact_path.read_bytes())
    with pytest.raises(TunerError, match="TuneResult.export"):
        tuner.load(bare)
    with pytest.raises(TunerError, match="no compiled model"):
        tuner.load(tmp_path / "missing.so")


def test_kernel_times_name_each_kernel_of_the_model_and_leave_it_running_as_before(tuned_mlp):
    model = tuned_mlp.compiled()
    x = _input()
    before = model.kernel_times(x, runs=3)
    # the least of three: a stall over most of one measurement's runs (CI once: 1.85 ms against 15 us) is no inference
    times = min((model.kernel_times(x, runs=12) for _ in range(3)), key=lambda by_kernel: sum(by_kernel.values()))
    after = model.kernel_times(x, runs=3)
    assert times and all(seconds > 0 for seconds in times.values())
    assert not any(name.startswith("vm.") for name in times)  # the VM's own builtins are left out
    # of one inference, not of the runs: against fewer runs timed around them. Against a call's wall time it
    # was never strict (the VM's Python around 5 us of kernels is most of this call's 20 us) and it failed in CI,
    # where a parallel kernel on a busy 2-core machine waits for a descheduled thread (3.7 ms, a call 0.14 ms)
    assert sum(times.values()) < 2 * max(sum(before.values()), sum(after.values()))
    np.testing.assert_allclose(model(x), tuned_mlp.reference(x), rtol=1e-4, atol=1e-4)  # instrument removed


def test_a_compiled_models_weights_live_beside_its_library_and_it_loads_with_them(tuned_mlp, tmp_path):
    """The weights are written once beside the library (``model.params``) and bound when it is loaded,
    not compiled into it: BERT-base's 434 MB took 12 s to export inside one."""
    from common.model_weights import read_weights, save_weights, weights_path

    assert weights_path(tuned_mlp.artifact_path).exists()
    library = tuned_mlp.export(tmp_path / "mlp.so")
    weights = read_weights(weights_path(library))
    assert sum(int(np.prod(w.shape)) for w in weights) >= 64 * 32 + 32 * 8  # both matrices, in any layout
    x = _input(5)
    np.testing.assert_allclose(tuner.load(library)(x), tuned_mlp.reference(x), rtol=1e-4, atol=1e-4)
    # the output comes from those weights: zeroed, the model computes relu(x @ 0) @ 0
    save_weights(weights_path(library), [np.zeros(w.shape, w.dtype) for w in weights])
    assert not np.any(tuner.load(library)(x))
    weights_path(library).unlink()  # copied without its weights: said in one line, not TVM's argument count
    with pytest.raises(TunerError, match="no weights beside it"):
        tuner.load(library)


def test_a_library_that_holds_its_own_weights_still_loads(tmp_path, llvm_target):
    """A library compiled with its weights inside (as before; no ``.params`` beside it) runs as it did."""
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from codegen.build import build_lowered_model
    from tuner.runtime.compiled_model import ModelDescription
    from tuner.tasks.extraction import lower_workload
    from workloads import load_workload

    w = np.random.default_rng(1).standard_normal((64, 8)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.const(w)))
        bb.emit_func_output(out)
    workload = load_workload(bb.get())
    lowered = lower_workload(workload, llvm_target)
    library = tmp_path / "inside.so"
    build_lowered_model(lowered, llvm_target, ms.database.MemoryDatabase()).export_library(str(library))
    ModelDescription.of(workload, llvm_target).save(library)
    data = _input(2)
    np.testing.assert_allclose(tuner.load(library)(data), data @ w, rtol=1e-4, atol=1e-4)
