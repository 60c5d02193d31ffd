"""GPU health from NVML (the nvidia-ml-py package): utilization, SM clock, temperature, power and
energy, read around each measurement so that a number taken while the clocks throttled or the
chip heated up is flagged rather than trusted.

Without NVML (no driver, no GPU, a CPU target) the monitor says so once and every call returns
None: the rest of the engine works the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("tensor_tuner.measure")


@dataclass(frozen=True)
class GpuSample:
    utilization: int  # percent of the last sample period a kernel was running
    sm_clock_mhz: int
    temperature_c: int
    power_w: float
    energy_j: float | None  # since the driver loaded; None where the GPU does not count it


@dataclass
class MeasurementHealth:
    """What NVML saw over one measurement."""

    before: GpuSample
    after: GpuSample
    energy_j: float | None
    flags: list[str] = field(default_factory=list)  # why the measurement is suspect, if it is

    @property
    def suspect(self) -> bool:
        return bool(self.flags)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DriftLimits:
    sm_clock: float = 0.05  # relative change of the SM clock
    temperature_c: int = 5


class NvmlMonitor:
    def __init__(self, limits: DriftLimits | None = None):
        self.limits = limits or DriftLimits()
        self._nvml: Any = None
        self.unavailable: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as err:  # noqa: BLE001 - ImportError, or any NVMLError: no NVML here either way
            self.unavailable = f"{type(err).__name__}: {err}"
            log.info("no NVML (%s): GPU health and energy are not recorded", self.unavailable)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def device_names(self) -> list[str]:
        if not self.available:
            return []
        nvml = self._nvml
        return [_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())]

    def sample(self, index: int = 0) -> GpuSample | None:
        if not self.available:
            return None
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            energy = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3  # mJ
        except nvml.NVMLError:
            energy = None
        return GpuSample(
            utilization=int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            sm_clock_mhz=int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            temperature_c=int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,  # mW
            energy_j=energy,
        )

    @contextmanager
    def watch(self, index: int = 0) -> Iterator[list[MeasurementHealth]]:
        """``with monitor.watch() as health:`` ... afterwards ``health`` holds one
        MeasurementHealth, or nothing without NVML."""
        found: list[MeasurementHealth] = []
        before = self.sample(index)
        yield found
        after = self.sample(index)
        if before is not None and after is not None:
            found.append(self.assess(before, after))

    def assess(self, before: GpuSample, after: GpuSample) -> MeasurementHealth:
        flags = []
        clock_change = abs(after.sm_clock_mhz - before.sm_clock_mhz) / max(1, before.sm_clock_mhz)
        if clock_change > self.limits.sm_clock:
            flags.append(f"SM clock moved {before.sm_clock_mhz} -> {after.sm_clock_mhz} MHz")
        if abs(after.temperature_c - before.temperature_c) > self.limits.temperature_c:
            flags.append(f"temperature moved {before.temperature_c} -> {after.temperature_c} C")
        energy = None if before.energy_j is None or after.energy_j is None else after.energy_j - before.energy_j
        return MeasurementHealth(before, after, energy, flags)

    def close(self) -> None:
        if self.available:
            self._nvml.nvmlShutdown()
            self._nvml = None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
