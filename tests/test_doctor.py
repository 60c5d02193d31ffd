"""`tuner doctor`: one line per component, OK or the fix, and exit 0 only where the named target can be tuned."""

import socket

import pytest
import tvm

from tuner.cli.main import main


def _doctor(capsys, *args: str) -> tuple[int, list[str]]:
    status = main(["doctor", *args])
    return status, capsys.readouterr().out.splitlines()


def test_llvm_is_checked_with_the_cpu_and_its_mcpu(capsys):
    status, lines = _doctor(capsys, "--target", "llvm")
    assert status == 0 and lines[-1] == "llvm: can be tuned here"
    assert any(line.startswith("OK    TVM") and "0.27" in line for line in lines)
    (cpu,) = [line for line in lines if line.startswith("OK    CPU")]
    assert f"mcpu={tvm.target.codegen.llvm_get_system_cpu()}" in cpu
    assert not any("CUDA" in line or "NVML" in line for line in lines)  # not asked about
    (machine,) = [line for line in lines if line.startswith("OK    machine")]
    assert "FMA peak" in machine and "running now at" in machine  # the calibration, and the speed against it


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is present")
def test_without_a_gpu_one_line_says_so_and_cuda_cannot_be_tuned_while_llvm_can(capsys):
    status, lines = _doctor(capsys)
    assert status == 1
    failed = [line for line in lines if line.startswith("FAIL")]
    assert len(failed) == 1 and ("no CUDA GPU" in failed[0] or "driver" in failed[0]), lines
    assert "llvm: can be tuned here" in lines and lines[-1].startswith("cuda: cannot be tuned here (see ")
    compiler = [line for line in lines if "CUDA compiler" in line]
    assert len(compiler) == 1 and (compiler[0].startswith("OK") or "install" in compiler[0] or "pip" in compiler[0])


def test_a_ray_cluster_nobody_answers_at_is_a_failure_with_the_fix(capsys):
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status, lines = _doctor(capsys, "--target", "llvm", "--ray", f"127.0.0.1:{port}")
    (ray,) = [line for line in lines if "Ray" in line and not line.startswith("llvm")]
    assert status == 1 and ray.startswith("FAIL") and f"127.0.0.1:{port}" in ray and "ray start --head" in ray
