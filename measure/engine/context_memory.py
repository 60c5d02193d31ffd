"""Measuring workers whose CUDA context grew past their share of the GPU's memory are restarted.

A CUDA context keeps the largest local-memory (stack) reservation any kernel it launched needed:
the driver sizes it for every thread the GPU can hold at once, and no longer gives it back after
the launch. One candidate that spills heavily (MetaSchedule's GPU design spaces have such) can
leave its worker holding 17 GB on an H100; seen in a GPU validation run (2026-11-27), where nine
measuring workers holding 4-17 GB each filled the 80 GB and an innocent kernel's launch then
failed with CUDA_ERROR_OUT_OF_MEMORY. After each request a worker that holds more than its share
is ended; the next request starts a fresh one (about a second).
"""

from __future__ import annotations

import logging

from measure.nvml import NvmlMonitor
from measure.workers.worker import WorkerProcess

log = logging.getLogger("tensor_tuner.measure")

MIN_CAP_BYTES = 1 << 30  # a fresh context on an H100 holds about 0.5 GB


def context_memory_cap(total_bytes: int, workers: int) -> int:
    """Half of each measuring worker's even share of the GPU's memory, and at least 1 GiB: the other
    half is left to the candidates' own arguments and to contexts between checks."""
    return max(MIN_CAP_BYTES, total_bytes // (2 * max(1, workers)))


class ContextMemoryGuard:
    """Ends measuring workers that hold more of the GPU's memory than ``cap`` bytes (NVML's count)."""

    def __init__(self, monitor: NvmlMonitor, cap: int):
        self.monitor, self.cap = monitor, cap

    @classmethod
    def for_workers(cls, monitor: NvmlMonitor | None, workers: int) -> ContextMemoryGuard | None:
        """A guard over ``workers`` measuring workers, or None where NVML does not tell memory apart."""
        total = monitor.total_memory() if monitor is not None else None
        return cls(monitor, context_memory_cap(total, workers)) if total else None

    def check(self, worker: WorkerProcess) -> None:
        """End ``worker`` if its process holds more than the cap (not found in NVML: left alone)."""
        held = (self.monitor.memory_by_process() or {}).get(worker.pid) if worker.pid else None
        if held is None or held <= self.cap:
            return
        log.info(
            "%s held %.1f GB of GPU memory after a request (cap %.1f GB): restarted",
            worker.name,
            held / 1e9,
            self.cap / 1e9,
        )
        worker.kill()  # counted in the worker's restarts
