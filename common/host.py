"""Facts about this host: its CPU, cores and free memory (psutil when installed, the OS otherwise), and
where tensor-tuner keeps its per-user cache."""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name, as the OS reports it."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them (``avx512_bf16``, ...); None where there is no
    /proc/cpuinfo to read."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            line = next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return None
    return set(line.partition(":")[2].split())


def host_has_amx() -> bool:
    """Whether this machine's CPU has AMX's bf16 tiles (``amx_tile`` and ``amx_bf16`` in its flags)."""
    return {"amx_tile", "amx_bf16"} <= (cpu_flags() or set())


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # e.g. a GPU host provisioned with the TVM runtime alone
        return os.cpu_count() or 1


def available_memory_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


CACHE_DIR_ENV = "TENSOR_TUNER_CACHE_DIR"


def user_cache_dir() -> Path:
    """Where tensor-tuner keeps what outlives a run: ``$TENSOR_TUNER_CACHE_DIR`` or ``~/.cache/tensor-tuner``."""
    override = os.environ.get(CACHE_DIR_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "tensor-tuner"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a partial file renamed into place): readers in other
    processes never see half of it. Raises OSError, with no partial file left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
