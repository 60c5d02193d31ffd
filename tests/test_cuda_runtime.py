"""Why TVM cannot use a GPU, said with the fix: no driver, a driver older than CUDA 13, no CUDA 13
runtime (found in the nvidia-cuda-runtime wheel where the system has none)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

from measure.cuda.runtime import CUDART_SONAME, format_uuid, runtime_problem, wheel_cudart
from tuner.errors import NoDeviceError
from tuner.targets import require_device

ROOT = Path(__file__).resolve().parent.parent


def test_the_cuda_13_runtime_is_found_where_the_wheel_puts_it(tmp_path, monkeypatch):
    library = tmp_path / "nvidia" / "cu13" / "lib" / CUDART_SONAME
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere"), str(tmp_path)])
    assert wheel_cudart() == library
    monkeypatch.setattr(sys, "path", [str(tmp_path / "elsewhere")])
    assert wheel_cudart() is None


@pytest.mark.skipif(tvm.cuda(0).exist or Path("/dev/nvidiactl").exists(), reason="a GPU driver is present")
def test_without_a_driver_tune_and_the_measuring_side_say_which_driver_to_install():
    assert "no NVIDIA driver" in runtime_problem() and "release 580" in runtime_problem()
    with pytest.raises(NoDeviceError) as err:
        require_device("cuda -arch=sm_90")
    assert "libcuda.so.1 not found" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the stand-in driver")
def test_a_driver_older_than_cuda_13_is_named_with_the_release_to_upgrade_to(tmp_path):
    """A stand-in libcuda.so.1 that reports CUDA 12.4 (driver release 550), in a fresh process."""
    source = tmp_path / "driver.c"
    source.write_text("int cuDriverGetVersion(int *version) { *version = 12040; return 0; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "libcuda.so.1"), str(source)],
        check=True,
    )
    probe = "from measure.cuda.runtime import runtime_problem; print(runtime_problem())"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"LD_LIBRARY_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert out.stdout.strip() == (
        "the NVIDIA driver supports CUDA 12.4, but TVM 0.27's CUDA runtime needs CUDA 13: upgrade the driver to "
        "release 580 or later"
    )


def test_uuids_are_written_as_nvml_writes_them_after_its_prefix():
    assert format_uuid(bytes(range(16))) == "00010203-0405-0607-0809-0a0b0c0d0e0f"
