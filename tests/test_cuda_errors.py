"""A failed CUDA launch keeps its reason, and a worker whose CUDA context a fault poisoned is
replaced, on the parallel path and on the serial one (verification, final re-measures).

No GPU here: the failing candidates are CPU kernels whose runs fail with the exact text TVM 0.27
gives for a CUDA error (an assertion in the kernel carries it). Everything after the kernel's
failure is the real path: TVM's error, the measuring worker, the engine."""

from pathlib import Path

import faulty
import pytest

from measure import EngineConfig, MeasureEngine, MeasureInput, Status, TimeoutPolicy
from measure.cuda.errors import cuda_error_line, poisons_the_context
from measure.workers.error_report import describe_error
from measure.workers.worker import _last_meaningful_line

# CUDAWrappedFunc's launch failure (src/backend/cuda/runtime/cuda_module.cc): the error's name on
# the first line, then the launch's shape and, where TVM still has it, the kernel's whole source.
OUT_OF_RESOURCES = (
    "CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\n grid=(1,1,1),  block=(1024,1,1)\n"
    "// func_name=main_kernel\n// CUDA Source\n// -----------\n"
    'extern "C" __global__ void __maxnreg__(255) main_kernel(float* __restrict__ a) {\n  a[threadIdx.x] = 0.0f;\n}\n'
)
# TVM_FFI_CHECK_CUDA_ERROR around a runtime call after a kernel wrote out of bounds.
ILLEGAL_ADDRESS = "CUDA Runtime Error: cudaErrorIllegalAddress (700): an illegal memory access was encountered"


def _failure_text(message: str) -> str:
    import tvm

    executable = tvm.compile(faulty.failing_with(message), target="llvm")
    a, b = (tvm.runtime.tensor(__import__("numpy").zeros(64, "float32")) for _ in range(2))
    with pytest.raises(Exception) as err:
        executable.mod["main"](a, b)
    return describe_error(err.value)


def test_the_line_naming_the_cuda_error_is_kept_not_the_kernel_source_after_it():
    assert _failure_text(OUT_OF_RESOURCES) == "RuntimeError: CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert (
        _failure_text(f"while timing:\n{ILLEGAL_ADDRESS}\n  at 0x7f00 in cudaStreamSynchronize")
        == f"RuntimeError: {ILLEGAL_ADDRESS}"
    )
    assert _failure_text("an ordinary failure\nits last line") == "RuntimeError: its last line"


@pytest.mark.parametrize(
    "message, poisoned",
    [
        (ILLEGAL_ADDRESS, True),
        ("CUDALaunch Error: CUDA_ERROR_ILLEGAL_ADDRESS", True),
        ("cudaEventSynchronize failed: cudaErrorLaunchFailure (719): unspecified launch failure", True),
        ("CUDA Runtime Error: cudaErrorMisalignedAddress (716): misaligned address", True),
        (OUT_OF_RESOURCES, False),
        ("CUDA Runtime Error: cudaErrorMemoryAllocation (2): out of memory", False),
        ("output holds NaN or Inf (argument 1)", False),
    ],
)
def test_which_errors_leave_the_cuda_context_unusable(message, poisoned):
    assert cuda_error_line(message) is not None or not poisoned
    assert poisons_the_context(message) is poisoned


def _engine(tmp_path: Path, llvm_target) -> MeasureEngine:
    return MeasureEngine(
        llvm_target, tmp_path, EngineConfig(build_workers=1, run_timeout=TimeoutPolicy(initial=5.0, floor=5.0))
    )


def test_a_poisoning_failure_is_recorded_with_its_reason_the_worker_replaced_and_the_next_measured(
    tmp_path, llvm_target
):
    inputs = [
        MeasureInput("out-of-resources", faulty.failing_with(OUT_OF_RESOURCES)),
        MeasureInput("illegal-address", faulty.failing_with(ILLEGAL_ADDRESS)),
        MeasureInput("good", faulty.copy()),
    ]
    with _engine(tmp_path, llvm_target) as engine:
        built = {b.key: b for b in engine.build(inputs)}
        # A run timeout shorter than a measuring worker's start-up: the replacement's start-up must not
        # count against it.
        startup = min(worker.wait_ready() for worker in engine._runners.workers)
        engine.run_timeout.policy = TimeoutPolicy(initial=startup / 2, floor=startup / 2)
        restarts = engine.worker_restarts
        (oor,) = engine.measure_built([built["out-of-resources"]])
        assert oor.status == Status.RUN_ERROR and oor.error.endswith(
            "CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
        )
        assert engine.worker_restarts == restarts  # the launch never happened: the context is fine
        (illegal,) = engine.measure_built([built["illegal-address"]])
        assert illegal.status == Status.RUN_ERROR and "cudaErrorIllegalAddress" in illegal.error
        assert engine.worker_restarts == restarts + 1
        (good,) = engine.measure_built([built["good"]])
        assert good.ok, good.error  # in a fresh worker, whose start-up was not taken for a hang


def test_the_serial_path_replaces_a_poisoned_worker_too(tmp_path, llvm_target):
    with _engine(tmp_path, llvm_target) as engine:
        restarts = engine.worker_restarts
        outcome = engine.verify(faulty.copy(), faulty.failing_with(ILLEGAL_ADDRESS), rtol=1e-3)
        assert outcome.ok is False and "cudaErrorIllegalAddress" in outcome.detail
        assert engine.worker_restarts == restarts + 1
        assert engine.verify(faulty.copy(), faulty.copy(), rtol=1e-3).ok is True


def test_a_dead_workers_reason_is_the_cuda_error_its_last_request_logged(tmp_path):
    log = tmp_path / "runner.log"
    log.write_text(f"an earlier request's failure\n{ILLEGAL_ADDRESS.replace('Illegal', 'Old')}\n")
    mark = log.stat().st_size
    with open(log, "a") as out:
        out.write(f"Traceback (most recent call last):\nmeasure.timing.cuda_cold.CudaCallError: {ILLEGAL_ADDRESS}\n")
        out.write(
            "terminate called after throwing an instance of 'tvm::ffi::Error'\nFatal Python error: Aborted\n\nCurrent "
            "thread 0x1 (most recent call first):\n"
        )
    assert _last_meaningful_line(log, mark) == f"measure.timing.cuda_cold.CudaCallError: {ILLEGAL_ADDRESS}"
    assert _last_meaningful_line(log, log.stat().st_size) == ""
