"""Facts about this host: cores and free memory (psutil when installed, the OS otherwise)."""

from __future__ import annotations

import os


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
