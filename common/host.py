"""Facts about this host: its CPU, caches, cores and free memory (psutil when installed, the OS otherwise),
and where tensor-tuner keeps its per-user cache."""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
from dataclasses import dataclass
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


@dataclass(frozen=True)
class CacheLevel:
    level: int
    bytes: int  # of one instance
    shared_by: int  # logical CPUs sharing one instance (1: private to a core)


# sizes of a common server core, where the OS does not say (no sysfs): Zen 4's
_FALLBACK_CACHES = (CacheLevel(1, 32 << 10, 1), CacheLevel(2, 1 << 20, 1), CacheLevel(3, 32 << 20, 8))


def data_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> tuple[CacheLevel, ...]:
    """CPU 0's data and unified caches, innermost first, as Linux's sysfs lists them (a common server
    core's where it lists none)."""
    levels = []
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            size = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            shared = _cpu_list_length((index / "shared_cpu_list").read_text())
            levels.append(CacheLevel(int((index / "level").read_text()), int(size.rstrip("KMG")) * scale, shared))
        except (OSError, ValueError):
            continue
    return tuple(sorted(levels, key=lambda c: c.level)) or _FALLBACK_CACHES


def _cpu_list_length(text: str) -> int:
    """How many CPUs a sysfs CPU list ("0-3,8") names."""
    count = 0
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1 if low else 0
    return max(count, 1)


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
