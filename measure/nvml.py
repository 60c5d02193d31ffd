"""GPU health from NVML (the nvidia-ml-py package): utilization, SM clock, temperature, power and
energy, read around each measurement so that a number taken while the clocks throttled or the
chip heated up is flagged rather than trusted.

The monitor watches the GPU the measuring workers time: CUDA's device 0 of the visible ones,
found in NVML (which ignores CUDA_VISIBLE_DEVICES and numbers GPUs by PCI bus) by its UUID or
PCI bus id. Each reading is taken on its own: a counter the GPU does not give (utilization under
MIG or vGPU, energy on older boards) is said once and left out, and the rest go on. Without NVML
at all (no driver, no GPU) the monitor says so once and every call returns None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from measure.cuda.runtime import DeviceIdentity, device_identity

from .types import MeasureResult

log = logging.getLogger("tensor_tuner.measure")

FIELDS = ("utilization", "sm_clock", "temperature", "power", "energy")


@dataclass(frozen=True)
class GpuSample:
    utilization: int | None  # percent of the last sample period a kernel was running
    sm_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    energy_j: float | None  # since the driver loaded


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


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlMonitor:
    """NVML's view of one GPU. ``device``: the GPU to watch (default: CUDA's device 0 here);
    ``nvml``: the pynvml module (or a stand-in with its interface)."""

    def __init__(self, limits: DriftLimits | None = None, device: DeviceIdentity | None = None, nvml: Any = None):
        self.limits = limits or DriftLimits()
        self._nvml: Any = None
        self._handle: Any = None
        self.unavailable: str | None = None
        self.index: int | None = None  # NVML's index of the watched GPU
        self.name: str | None = None
        self.mapping = ""  # how the watched GPU was found, for the run's log
        self.missing: dict[str, str] = {}  # field -> why NVML does not give it
        self._probing = True  # what the first reading finds missing is said in one line
        try:
            nvml = nvml or _import_pynvml()
            nvml.nvmlInit()
        except Exception as err:  # noqa: BLE001 - ImportError, or any NVMLError: no NVML here either way
            self.unavailable = f"{type(err).__name__}: {err}"
            log.info("no NVML (%s): GPU health and energy are not recorded", self.unavailable)
            return
        self._nvml = nvml
        try:
            self._handle, self.index, self.mapping = self._find(
                nvml, device if device is not None else device_identity(0)
            )
            self.name = _text(nvml.nvmlDeviceGetName(self._handle))
        except nvml.NVMLError as err:
            self.unavailable = f"NVML lists no GPU to watch ({err})"
            log.warning("NVML lists no GPU to watch (%s): GPU health and energy are not recorded", err)
            self._nvml = None
            return
        self.sample()  # finds out which counters this GPU gives
        self._probing = False
        if self.missing:
            log.warning(
                "NVML on %s does not give %s: measurements go on without them", self.name, self.describe_missing()
            )

    @property
    def available(self) -> bool:
        return self._nvml is not None

    @property
    def energy_supported(self) -> bool:
        return self.available and "energy" not in self.missing

    def describe_missing(self) -> str:
        return ", ".join(f"{name} ({why})" for name, why in self.missing.items())

    def describe(self) -> str:
        """One line for the run's log: which GPU is watched and what NVML gives for it."""
        if not self.available:
            return f"NVML: not available ({self.unavailable})"
        given = [name for name in FIELDS if name not in self.missing]
        missing = f"; not given: {self.describe_missing()}" if self.missing else ""
        return (
            f"NVML: watching GPU {self.index} ({self.name}), {self.mapping}; gives "
            f"{', '.join(given) or 'nothing'}{missing}"
        )

    @staticmethod
    def _find(nvml: Any, identity: DeviceIdentity | None) -> tuple[Any, int | None, str]:
        """(handle, NVML index, how it was matched) of the GPU ``identity`` names."""
        count = nvml.nvmlDeviceGetCount()
        if identity is not None and identity.uuid:
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if _uuid_digits(nvml.nvmlDeviceGetUUID(handle)) == identity.uuid:
                    return handle, index, f"CUDA device {identity.ordinal} matched by UUID"
                for mig in _mig_devices(nvml, handle):
                    if _uuid_digits(nvml.nvmlDeviceGetUUID(mig)) == identity.uuid:
                        return mig, index, f"CUDA device {identity.ordinal} matched by UUID (a MIG instance of it)"
        if identity is not None and identity.pci_bus_id:
            handle = nvml.nvmlDeviceGetHandleByPciBusId(identity.pci_bus_id)
            return (
                handle,
                nvml.nvmlDeviceGetIndex(handle),
                f"CUDA device {identity.ordinal} matched by PCI bus id {identity.pci_bus_id}",
            )
        if count == 0:
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
        return (
            nvml.nvmlDeviceGetHandleByIndex(0),
            0,
            "CUDA's device could not be identified (no driver answer): assumed to be NVML's GPU 0",
        )

    def device_names(self) -> list[str]:
        if not self.available:
            return []
        nvml = self._nvml
        return [
            _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())
        ]

    def sample(self) -> GpuSample | None:
        if not self.available:
            return None
        nvml, handle = self._nvml, self._handle
        return GpuSample(
            utilization=self._read("utilization", lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            sm_clock_mhz=self._read("sm_clock", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
            temperature_c=self._read(
                "temperature", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ),
            power_w=self._read("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3),  # mW
            energy_j=self._read("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3),  # mJ
        )

    def _read(self, name: str, read: Callable[[], Any]) -> Any:
        """One counter; a counter NVML refuses is left out from then on, and said once."""
        if name in self.missing:
            return None
        try:
            return read()
        except self._nvml.NVMLError as err:
            self.missing[name] = str(err)
            if not self._probing:
                log.warning("NVML on %s stopped giving %s (%s): measurements go on without it", self.name, name, err)
            return None

    def memory_by_process(self) -> dict[int, int] | None:
        """Bytes of the watched GPU's memory each process holds, by pid (NVML's pids: those of this
        machine's process namespace on a VM, the host's inside some containers); None without NVML."""
        if not self.available:
            return None
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._nvml.NVMLError:
            return None
        return {p.pid: int(p.usedGpuMemory) for p in processes if p.usedGpuMemory is not None}

    def total_memory(self) -> int | None:
        """Bytes of memory on the watched GPU; None without NVML."""
        if not self.available:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        except self._nvml.NVMLError:
            return None

    @contextmanager
    def watch(self) -> Iterator[list[MeasurementHealth]]:
        """``with monitor.watch() as health:`` ... afterwards ``health`` holds one
        MeasurementHealth, or nothing without NVML."""
        found: list[MeasurementHealth] = []
        before = self.sample()
        yield found
        after = self.sample()
        if before is not None and after is not None:
            found.append(self.assess(before, after))

    def energy_between(self, before: GpuSample | None, after: GpuSample | None) -> float | None:
        if before is None or after is None or before.energy_j is None or after.energy_j is None:
            return None
        return after.energy_j - before.energy_j

    def assess(self, before: GpuSample, after: GpuSample) -> MeasurementHealth:
        flags = []
        if before.sm_clock_mhz is not None and after.sm_clock_mhz is not None:
            clock_change = abs(after.sm_clock_mhz - before.sm_clock_mhz) / max(1, before.sm_clock_mhz)
            if clock_change > self.limits.sm_clock:
                flags.append(f"SM clock moved {before.sm_clock_mhz} -> {after.sm_clock_mhz} MHz")
        if before.temperature_c is not None and after.temperature_c is not None:
            if abs(after.temperature_c - before.temperature_c) > self.limits.temperature_c:
                flags.append(f"temperature moved {before.temperature_c} -> {after.temperature_c} C")
        return MeasurementHealth(before, after, self.energy_between(before, after), flags)

    def close(self) -> None:
        if self.available:
            self._nvml.nvmlShutdown()
            self._nvml = None


def split_energy(joules: float | None, results: list[MeasureResult]) -> None:
    """Share the device energy of a window whose candidates were timed at once among them, in
    proportion to the time each spent in its timed region (equally if none got that far), so
    that the energies of a run's results add up to what the device spent."""
    weights = [max(0.0, r.run_seconds) for r in results]
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] * len(results), float(len(results))
    for result, weight in zip(results, weights, strict=True):
        result.energy_j = None if joules is None else joules * weight / total


def _mig_devices(nvml: Any, handle: Any) -> list[Any]:
    """The MIG instances of a GPU in MIG mode; none otherwise (or where NVML cannot tell)."""
    try:
        current, _ = nvml.nvmlDeviceGetMigMode(handle)
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        found = []
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
            except nvml.NVMLError:  # an empty slot
                continue
        return found
    except nvml.NVMLError:
        return []


def _uuid_digits(uuid: bytes | str) -> str:
    """NVML's "GPU-xxxxxxxx-..." or "MIG-xxxxxxxx-..." without its prefix, lower case."""
    text = _text(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return text


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
