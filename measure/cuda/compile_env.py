"""How CUDA candidates are compiled: the compile path, chosen on purpose, and what lets TVM's
CUDA code generator build real cubins on a host without a GPU driver.

TVM compiles CUDA C with NVRTC (through the ``cuda-bindings`` package) unless
``TVM_CUDA_COMPILE_MODE=nvcc``, so installing that package silently changes the compiler. Here the
choice is made on purpose and written to the run's log: NVRTC where installed, as its sources lose the
libcu++ header they do not use (``measure.cuda.nvrtc_source``: 1.1-2.3x the candidates built a second
of nvcc's), unless it is newer than the GPU driver; nvcc otherwise; an explicit
``TVM_CUDA_COMPILE_MODE`` wins.

TVM's NVRTC path compiles against the CUDA headers of ``$CUDA_PATH`` (or of the nvcc it finds) and
looks for libcu++ (CCCL) only in a toolkit's ``targets/<triple>/include/cccl``. Where no toolkit is
installed, ``pip install 'tensor-tuner[nvrtc]'`` brings the headers as NVIDIA's wheels lay them out
(``nvidia/cu13/include``, CCCL in its ``cccl`` folder): a build worker points TVM at them.

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
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common.host import user_cache_dir
from common.tvm_libraries import tvm_library_dir
from measure.cuda.runtime import cuda_version_text, driver_cuda_version, nvidia_wheel_file

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
COMPILE_MODE_ENV = "TVM_CUDA_COMPILE_MODE"  # read by TVM's tvm_callback_cuda_compile: "nvcc" or "nvrtc"
NVRTC_OPTIONS_ENV = "TVM_CUDA_NVRTC_EXTRA_OPTS"  # read by TVM's NVRTC path: flags after its own
NVRTC_INSTALL = "pip install 'tensor-tuner[nvrtc]'"
WHEEL_CUDA_HEADERS = "nvidia/cu13/include"  # where nvidia-cuda-runtime, -crt and -cccl put them


class CudaBuildEnvError(RuntimeError):
    """CUDA candidates cannot be built on this host."""


@dataclass(frozen=True)
class CompileMode:
    mode: str  # "nvcc" or "nvrtc"
    why: str

    def describe(self) -> str:
        return f"{self.mode} ({self.why})"


@dataclass(frozen=True)
class CudaHeaders:
    """The CUDA headers NVRTC compiles against."""

    root: Path  # TVM's CUDA root ($CUDA_PATH): include/cuda_runtime.h, or targets/<triple>/include/...
    cccl: Path  # libcu++: cuda/std/cstdint, which TVM's NVRTC preamble includes


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


def nvcc_path() -> str | None:
    home = cuda_home()
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return shutil.which("nvcc")


def nvcc_version(nvcc: str) -> str:
    """ "13.0" from ``nvcc --version``, or "unknown version"."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown version"
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else "unknown version"


def nvrtc_version() -> str | None:
    """ "13.5": the version of the NVRTC library that ``cuda.bindings.nvrtc`` (which TVM imports) loads;
    None where the bindings or the library are missing."""
    try:
        if importlib.util.find_spec("cuda.bindings.nvrtc") is None:
            return None
        from cuda.bindings import nvrtc

        result, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - no ``cuda`` package, or a library it cannot find: no NVRTC either way
        return None
    return f"{major}.{minor}" if result == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def cuda_headers() -> CudaHeaders | None:
    """The CUDA headers for NVRTC: the toolkit's where one is installed, else those of NVIDIA's wheels."""
    home = cuda_home()
    found = _headers_under(Path(home)) if home else None
    if found is None:
        wheel = nvidia_wheel_file(f"{WHEEL_CUDA_HEADERS}/cuda_runtime.h")
        found = _headers_under(wheel.parent.parent) if wheel else None
    return found


def _headers_under(root: Path) -> CudaHeaders | None:
    includes = [root / "include", *sorted(root.glob("targets/*/include"))]
    if not any((folder / "cuda_runtime.h").is_file() for folder in includes):
        return None
    cccl = next((f / "cccl" for f in includes if (f / "cccl" / "cuda" / "std" / "cstdint").is_file()), None)
    return CudaHeaders(root, cccl) if cccl else None


def nvrtc_missing() -> str | None:
    """What TVM's NVRTC path lacks here, or None when it can compile."""
    if nvrtc_version() is None:
        return "NVRTC (cuda-bindings and nvidia-cuda-nvrtc) is not installed"
    if cuda_headers() is None:
        return "NVRTC has no CUDA headers (a CUDA toolkit, or nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl)"
    return None


def nvrtc_available() -> bool:
    """Whether TVM can compile with NVRTC here: the bindings, the library and the headers."""
    return nvrtc_missing() is None


def nvrtc_env() -> dict[str, str]:
    """The environment that points TVM's NVRTC path at :func:`cuda_headers`: $CUDA_PATH at their root,
    and their CCCL folder among NVRTC's extra flags (TVM finds it only in a toolkit's targets/ layout)."""
    headers = cuda_headers()
    if headers is None:
        return {}
    include = f"-I{headers.cccl}"
    flags = os.environ.get(NVRTC_OPTIONS_ENV, "")
    if include not in shlex.split(flags):
        flags = f"{flags} {shlex.quote(include)}".strip()
    return {"CUDA_PATH": str(headers.root), NVRTC_OPTIONS_ENV: flags}


def choose_compile_mode() -> CompileMode:
    """The CUDA compile path for this host: ``$TVM_CUDA_COMPILE_MODE`` if set (checked), else NVRTC where
    installed (no newer than the GPU driver, where there is one), else nvcc; raises CudaBuildEnvError
    naming what to install if neither is."""
    requested = os.environ.get(COMPILE_MODE_ENV, "").strip().lower()
    nvcc = nvcc_path()
    if requested == "nvcc":
        if nvcc is None:
            raise CudaBuildEnvError(
                f"{COMPILE_MODE_ENV}=nvcc but nvcc is not installed: install the CUDA toolkit, set CUDA_PATH, or "
                f"unset {COMPILE_MODE_ENV}"
            )
        return CompileMode("nvcc", f"{COMPILE_MODE_ENV}=nvcc; nvcc {nvcc_version(nvcc)} at {nvcc}")
    if requested == "nvrtc":
        missing = nvrtc_missing()
        if missing is not None:
            raise CudaBuildEnvError(
                f"{COMPILE_MODE_ENV}=nvrtc but {missing}: {NVRTC_INSTALL}, or unset {COMPILE_MODE_ENV}"
            )
        return CompileMode("nvrtc", f"{COMPILE_MODE_ENV}=nvrtc; {_describe_nvrtc()}")
    if requested:
        raise CudaBuildEnvError(
            f"{COMPILE_MODE_ENV}={requested!r} is not a compile mode: set it to nvcc or nvrtc, or unset it"
        )
    nvrtc = nvrtc_available()
    too_new = nvrtc and _newer_than_driver(nvrtc_version())
    if nvrtc and too_new is None:
        return CompileMode("nvrtc", f"{_describe_nvrtc()}, preferred where installed")
    if nvcc is not None:
        why = too_new or "no NVRTC installed"
        return CompileMode("nvcc", f"nvcc {nvcc_version(nvcc)} at {nvcc}; {why}")
    if nvrtc:
        return CompileMode("nvrtc", f"{_describe_nvrtc()}; no nvcc installed")
    raise CudaBuildEnvError(
        f"building for CUDA needs NVRTC ({NVRTC_INSTALL}) or nvcc (the CUDA toolkit; or set CUDA_PATH)"
    )


def _newer_than_driver(version: str | None) -> str | None:
    """Why NVRTC of ``version`` ("13.5") is passed over: its cubins may use what this host's GPU driver does
    not know (a newer cubin format); None where the driver supports that version, or there is no driver."""
    driver = driver_cuda_version()
    if driver is None or version is None:
        return None
    major, minor = (int(part) for part in version.split(".")[:2])
    if major * 1000 + minor * 10 <= driver:  # the driver API's form: 12040 for 12.4
        return None
    return f"NVRTC {version} is newer than the CUDA {cuda_version_text(driver)} the GPU driver supports"


def _describe_nvrtc() -> str:
    headers = cuda_headers()  # there: nvrtc_missing() said so
    return f"NVRTC {nvrtc_version()} through cuda-bindings, headers of {headers.root}"


def prepare_cuda_build_env(cache_dir: Path | None = None) -> CompileMode:
    """Set this process up to compile CUDA (call before ``import tvm``); returns the compile path."""
    mode = choose_compile_mode()
    os.environ[COMPILE_MODE_ENV] = mode.mode
    if mode.mode == "nvrtc":
        os.environ.update(nvrtc_env())
    home = cuda_home()
    if home is not None:
        os.environ.setdefault("CUDA_PATH", home)
    nvcc = nvcc_path()
    if mode.mode == "nvcc" and nvcc and shutil.which("nvcc") is None:  # TVM runs "nvcc" from PATH
        os.environ["PATH"] = os.pathsep.join((str(Path(nvcc).parent), os.environ.get("PATH", "")))
    if not driver_available():
        ctypes.CDLL(str(stand_in_driver(cache_dir)), mode=ctypes.RTLD_GLOBAL)
    return mode


def stand_in_driver(cache_dir: Path | None = None) -> Path:
    """Build (once) a libcuda.so.1 whose every entry point fails with CUDA_ERROR_NO_DEVICE."""
    symbols = sorted(set(_KNOWN_DRIVER_SYMBOLS) | _driver_symbols_from_nm())
    cache_dir = Path(cache_dir or user_cache_dir() / "cuda-stand-in")
    library = cache_dir / hashlib.sha1("\n".join(symbols).encode()).hexdigest()[:12] / "libcuda.so.1"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CudaBuildEnvError(
            "building CUDA candidates without a GPU driver needs a C compiler (cc) for a stand-in libcuda"
        )
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
    lib_dir, nm = tvm_library_dir(), shutil.which("nm")
    if lib_dir is None or nm is None:
        return set()
    runtime = lib_dir / "libtvm_runtime_cuda.so"
    if not runtime.exists():
        return set()
    out = subprocess.run([nm, "-D", "--undefined-only", str(runtime)], capture_output=True, text=True).stdout
    return set(re.findall(r"\bU (cu[A-Z]\w+)", out))
