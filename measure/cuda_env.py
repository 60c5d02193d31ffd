"""Let TVM's CUDA code generator build real cubins on a host without a GPU driver.

TVM registers its CUDA codegen only if ``libtvm_runtime_cuda.so`` loads, and that library links
against the driver (``libcuda.so.1``). On a build host with the CUDA toolkit but no driver we load
a stand-in driver whose entry points all answer "no device"; nothing here ever runs a kernel.
Call :func:`prepare_cuda_build_env` before ``import tvm``.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from .host import user_cache_dir

# Driver entry points libtvm_runtime_cuda.so links against (TVM 0.27); extended from `nm` when present.
_KNOWN_DRIVER_SYMBOLS = (
    "cuDeviceGetName",
    "cuFuncSetAttribute",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuLaunchKernelEx",
    "cuModuleGetFunction",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuTensorMapEncodeTiled",
)
_CUDA_ERROR_NO_DEVICE = 100


class CudaBuildEnvError(RuntimeError):
    """CUDA candidates cannot be built on this host."""


def driver_available() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def cuda_home() -> str | None:
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            return os.environ[var]
    # /usr/local/bin/nvcc may be a wrapper script, which misleads TVM's libdevice lookup.
    for candidate in ("/usr/local/cuda",):
        if Path(candidate, "bin", "nvcc").exists():
            return str(Path(candidate).resolve())
    nvcc = shutil.which("nvcc")
    return str(Path(nvcc).resolve().parent.parent) if nvcc else None


def prepare_cuda_build_env(cache_dir: Path | None = None) -> None:
    home = cuda_home()
    if home is None:
        raise CudaBuildEnvError("building for CUDA needs the CUDA toolkit (nvcc): install it or set CUDA_PATH")
    os.environ.setdefault("CUDA_PATH", home)
    if importlib.util.find_spec("cuda") is None:  # no NVRTC bindings: compile with nvcc instead
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    if not driver_available():
        ctypes.CDLL(str(stand_in_driver(cache_dir)), mode=ctypes.RTLD_GLOBAL)


def stand_in_driver(cache_dir: Path | None = None) -> Path:
    """Build (once) a libcuda.so.1 whose every entry point fails with CUDA_ERROR_NO_DEVICE."""
    symbols = sorted(set(_KNOWN_DRIVER_SYMBOLS) | _driver_symbols_from_nm())
    cache_dir = Path(cache_dir or user_cache_dir() / "cuda-stand-in")
    library = cache_dir / hashlib.sha1("\n".join(symbols).encode()).hexdigest()[:12] / "libcuda.so.1"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CudaBuildEnvError("building CUDA candidates without a GPU driver needs a C compiler (cc) for a stand-in libcuda")
    library.parent.mkdir(parents=True, exist_ok=True)
    # Several build workers may get here at once: each compiles its own copy, then renames atomically.
    source = library.with_name(f"stand-in-{os.getpid()}.c")
    source.write_text("".join(f"int {name}(void) {{ return {_CUDA_ERROR_NO_DEVICE}; }}\n" for name in symbols))
    partial = library.with_name(f"libcuda-{os.getpid()}.tmp")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(partial), str(source)],
        check=True,
        capture_output=True,
    )
    os.replace(partial, library)
    source.unlink()
    return library


def _driver_symbols_from_nm() -> set[str]:
    spec = importlib.util.find_spec("tvm")
    nm = shutil.which("nm")
    if spec is None or not spec.submodule_search_locations or nm is None:
        return set()
    runtime = Path(list(spec.submodule_search_locations)[0], "lib", "libtvm_runtime_cuda.so")
    if not runtime.exists():
        return set()
    out = subprocess.run([nm, "-D", "--undefined-only", str(runtime)], capture_output=True, text=True).stdout
    return set(re.findall(r"\bU (cu[A-Z]\w+)", out))
