"""TVM's CUDA runtime on a GPU host: load it on purpose, say what is missing when it does not
load, and identify the GPU a process's ``tvm.cuda(0)`` is.

``import tvm`` tries to load ``libtvm_runtime_cuda.so`` and drops the error when it fails, so a
host without the CUDA 13 runtime library (``libcudart.so.13``) or with an older driver looks
like a host without a GPU. Here the load is retried with the runtime from the
``nvidia-cuda-runtime`` wheel where the system has none, and a failure is explained in one line.

The driver is asked through its C API (``libcuda.so.1``) with ctypes: it needs no CUDA context,
so the tuner's own process can ask without holding GPU memory.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from common.tvm_libraries import tvm_library_dir

# TVM 0.27's libtvm_runtime_cuda.so links against the CUDA 13 runtime; CUDA 13 needs a driver of
# release 580 or later (the driver reports the newest CUDA it supports: 13000 for 13.0).
CUDART_SONAME = "libcudart.so.13"
CUDART_WHEEL = "nvidia-cuda-runtime>=13,<14"
MIN_DRIVER_CUDA = 13000
MIN_DRIVER_RELEASE = 580
_CUDA_SUCCESS = 0


@dataclass(frozen=True)
class DeviceIdentity:
    """What names one GPU to NVML as well as to CUDA, whatever CUDA_VISIBLE_DEVICES says."""

    ordinal: int  # CUDA's index among the visible devices
    uuid: str | None  # hex digits with dashes, without NVML's "GPU-"/"MIG-" prefix
    pci_bus_id: str | None  # "0000:3B:00.0"


def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def nvidia_wheel_file(*layouts: str) -> Path | None:
    """The first of ``layouts`` (paths as NVIDIA's CUDA wheels install them, "nvidia/cu13/...") that
    exists under an entry of sys.path."""
    for entry in sys.path:
        for layout in layouts:
            candidate = Path(entry or ".") / layout
            if candidate.exists():
                return candidate
    return None


def wheel_cudart() -> Path | None:
    """``libcudart.so.13`` as the nvidia-cuda-runtime wheel installs it, if it is on sys.path."""
    found = nvidia_wheel_file(f"nvidia/cu13/lib/{CUDART_SONAME}", f"nvidia/cuda_runtime/lib/{CUDART_SONAME}")
    return found if found is not None and found.is_file() else None


def load_cudart() -> str | None:
    """Make ``libcudart.so.13`` loaded (system first, then the wheel's); None, or where it was
    looked for in vain. Loaded globally, TVM's CUDA runtime then links against it."""
    try:
        ctypes.CDLL(CUDART_SONAME, mode=ctypes.RTLD_GLOBAL)
        return None
    except OSError:
        pass
    wheel = wheel_cudart()
    if wheel is not None:
        try:
            ctypes.CDLL(str(wheel), mode=ctypes.RTLD_GLOBAL)
            return None
        except OSError as err:
            return f"{wheel} does not load ({err})"
    return "neither the system's library path nor an nvidia-cuda-runtime wheel has it"


def driver_cuda_version() -> int | None:
    """The newest CUDA version the installed driver supports (12040 for 12.4), or None without a driver."""
    driver = _driver()
    if driver is None:
        return None
    version = ctypes.c_int()
    if driver.cuDriverGetVersion(ctypes.byref(version)) != _CUDA_SUCCESS:
        return None
    return version.value


def cuda_version_text(version: int) -> str:
    """ "12.4" for the driver API's 12040."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _driver_error(driver: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    if driver.cuGetErrorName(code, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
        return name.value.decode()
    return f"CUDA error {code}"


def runtime_problem() -> str | None:
    """Why TVM cannot use a GPU on this host, in one line with the fix; None if its CUDA runtime
    is loaded (or has just been loaded here)."""
    import tvm

    if tvm.get_global_func("device_api.cuda", allow_missing=True) is not None:
        return None
    driver = _driver()
    if driver is None:
        return (
            "no CUDA GPU: no NVIDIA driver on this host (libcuda.so.1 not found); install the NVIDIA driver (release "
            f"{MIN_DRIVER_RELEASE} or later)"
        )
    version = driver_cuda_version()
    if version is not None and version < MIN_DRIVER_CUDA:
        return (
            f"the NVIDIA driver supports CUDA {cuda_version_text(version)}, but TVM 0.27's CUDA runtime needs CUDA 13: "
            f"upgrade the driver to release {MIN_DRIVER_RELEASE} or later"
        )
    missing = load_cudart()
    if missing:
        return (
            f"TVM's CUDA runtime needs {CUDART_SONAME} (CUDA 13), and {missing}: pip install '{CUDART_WHEEL}', or "
            "install the CUDA 13 toolkit"
        )
    lib_dir = tvm_library_dir()
    library = lib_dir / "libtvm_runtime_cuda.so" if lib_dir else None
    if library is None or not library.exists():
        return (
            "this TVM has no CUDA runtime (libtvm_runtime_cuda.so): install apache-tvm==0.27.0.post1 from PyPI, which "
            "has it"
        )
    try:
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        return f"TVM's CUDA runtime does not load ({err}); `tuner doctor` checks each of its dependencies"
    return None


def no_gpu_reason() -> str:
    """Why ``tvm.cuda(0)`` does not exist, in one line with the fix."""
    problem = runtime_problem()
    if problem:
        return problem
    driver = _driver()
    if driver is None:  # the runtime loaded against a driver that is now gone: not expected
        return "no CUDA GPU: libcuda.so.1 not found"
    status = driver.cuInit(0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if status != _CUDA_SUCCESS:
        return f"no CUDA GPU is visible: the driver answers {_driver_error(driver, status)}{where}"
    count = ctypes.c_int()
    driver.cuDeviceGetCount(ctypes.byref(count))
    if count.value == 0:
        return f"no CUDA GPU is visible{where}"
    return f"the CUDA driver sees {count.value} GPU(s) but TVM cannot use them{where}; `tuner doctor` says more"


def visible_gpu_count() -> int:
    """How many GPUs CUDA shows this process (0 without a driver)."""
    driver = _driver()
    if driver is None or driver.cuInit(0) != _CUDA_SUCCESS:
        return 0
    count = ctypes.c_int()
    return count.value if driver.cuDeviceGetCount(ctypes.byref(count)) == _CUDA_SUCCESS else 0


def device_identity(ordinal: int = 0) -> DeviceIdentity | None:
    """The UUID and PCI bus id of CUDA device ``ordinal`` as this process sees it (after
    CUDA_VISIBLE_DEVICES), from the driver; None where there is no such device."""
    driver = _driver()
    if driver is None or driver.cuInit(0) != _CUDA_SUCCESS:
        return None
    device = ctypes.c_int()
    if driver.cuDeviceGet(ctypes.byref(device), ordinal) != _CUDA_SUCCESS:
        return None
    uuid = None
    raw = (ctypes.c_ubyte * 16)()
    get_uuid = getattr(driver, "cuDeviceGetUuid_v2", None) or getattr(driver, "cuDeviceGetUuid", None)
    if get_uuid is not None and get_uuid(raw, device) == _CUDA_SUCCESS:
        uuid = format_uuid(bytes(raw))
    bus = ctypes.create_string_buffer(32)
    pci = bus.value.decode() if driver.cuDeviceGetPCIBusId(bus, len(bus), device) == _CUDA_SUCCESS else None
    return DeviceIdentity(ordinal, uuid, pci)


def format_uuid(raw: bytes) -> str:
    """16 bytes as NVML writes them after its prefix: 8-4-4-4-12 lower-case hex digits."""
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
