"""The NVML monitor: watches the GPU the measuring workers use, degrades counter by counter, says
once what is missing; and the engine counts each window's energy once.

Without a GPU here, the tests that need NVML's answers give ``NvmlMonitor`` a small stand-in for
the pynvml module (``FakeNvml``): the monitor's own logic (which GPU, which counters, what to say)
is what they test, not NVML. Its errors are pynvml's real exception classes."""

import logging
import time
from types import SimpleNamespace

import faulty
import psutil
import pynvml
import pytest

from measure import EngineConfig, MeasureEngine, MeasureInput, TimingConfig
from measure.cuda.runtime import DeviceIdentity, format_uuid
from measure.nvml import GpuSample, NvmlMonitor, split_energy
from measure.types import MeasureResult, Status
from tuner.errors import TunerError
from tuner.search.objectives import Objectives, check_measurable


class FakeNvml:
    """pynvml's interface over made-up GPUs: ``gpus`` are dicts with uuid, pci, name and
    optionally ``mig`` (a list of instance UUIDs); ``refused`` names counters that answer Not
    Supported (on a MIG instance, utilization always does); energy grows at ``watts``."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus: list[dict], refused: set[str] = frozenset(), watts: float = 100.0):
        self.gpus, self.refused, self.watts = gpus, set(refused), watts
        self.started = time.monotonic()

    def _answer(self, counter: str, handle, value):
        if counter in self.refused or (counter == "utilization" and handle[0] == "mig"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetIndex(self, handle):
        return handle[1]

    def nvmlDeviceGetHandleByPciBusId(self, pci):
        for index, gpu in enumerate(self.gpus):
            if _pci_numbers(gpu["pci"]) == _pci_numbers(pci):  # NVML takes a 4- or 8-digit domain alike
                return ("gpu", index)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle):
        gpu = self.gpus[handle[1]]
        return f"MIG-{gpu['mig'][handle[2]]}" if handle[0] == "mig" else f"GPU-{gpu['uuid']}"

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle[1]]["name"] + (" MIG 1g.10gb" if handle[0] == "mig" else "")

    def nvmlDeviceGetMigMode(self, handle):
        return [int("mig" in self.gpus[handle[1]]), 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        if index >= len(self.gpus[handle[1]]["mig"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._answer("utilization", handle, type("Rates", (), {"gpu": 80})())

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return self._answer("sm_clock", handle, 1980)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._answer("temperature", handle, 60)

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._answer("power", handle, 300_000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):  # mJ
        return self._answer("energy", handle, int(1e6 + self.watts * 1e3 * (time.monotonic() - self.started)))

    context_bytes: int | None = None  # what each process under this one holds of the GPU (None: none listed)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.context_bytes is None:
            return []
        children = psutil.Process().children(recursive=True)
        return [SimpleNamespace(pid=child.pid, usedGpuMemory=self.context_bytes) for child in children]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 << 30)


def _pci_numbers(pci: str) -> list[int]:
    return [int(part, 16) for part in pci.replace(".", ":").split(":")]


def _uuid(n: int) -> str:
    return format_uuid(bytes([n]) * 16)


H100S = [{"uuid": _uuid(i), "pci": f"00000000:{0x18 + i:02X}:00.0", "name": "NVIDIA H100 80GB HBM3"} for i in range(4)]


def test_without_nvml_it_reports_once_and_returns_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="tensor_tuner.measure"):
        monitor = NvmlMonitor()
    if monitor.available:  # a machine with a GPU driver: the real readings must make sense
        sample = monitor.sample()
        assert sample.sm_clock_mhz > 0 and sample.power_w > 0 and monitor.device_names() and monitor.name
        return
    assert sum("no NVML" in r.message for r in caplog.records) == 1
    assert monitor.sample() is None and monitor.device_names() == [] and not monitor.energy_supported
    with monitor.watch() as health:
        pass
    assert health == []


def test_the_gpu_watched_is_the_one_cuda_calls_device_0_found_by_uuid():
    """Under CUDA_VISIBLE_DEVICES=2 the runners' device 0 is NVML's GPU 2."""
    monitor = NvmlMonitor(device=DeviceIdentity(0, _uuid(2), H100S[2]["pci"]), nvml=FakeNvml(H100S))
    assert (
        monitor.index == 2
        and "by UUID" in monitor.mapping
        and monitor.describe().startswith("NVML: watching GPU 2 (NVIDIA H100")
    )


def test_without_a_uuid_the_pci_bus_id_finds_it_and_without_either_gpu_0_is_assumed():
    assert NvmlMonitor(device=DeviceIdentity(0, None, "0000:1A:00.0"), nvml=FakeNvml(H100S)).index == 2
    unknown = NvmlMonitor(device=DeviceIdentity(0, None, None), nvml=FakeNvml(H100S))
    assert unknown.index == 0 and "could not be identified" in unknown.mapping


def test_a_mig_instance_is_watched_as_itself_and_its_missing_utilization_said_once(caplog):
    gpus = [H100S[0], {**H100S[1], "mig": [_uuid(7), _uuid(8)]}]
    with caplog.at_level(logging.WARNING, logger="tensor_tuner.measure"):
        monitor = NvmlMonitor(device=DeviceIdentity(0, _uuid(8), gpus[1]["pci"]), nvml=FakeNvml(gpus))
        first, second = monitor.sample(), monitor.sample()
    assert monitor.index == 1 and "MIG" in monitor.name and "MIG instance" in monitor.mapping
    assert (
        first.utilization is None
        and second.utilization is None
        and first.sm_clock_mhz == 1980
        and first.energy_j is not None
    )
    assert [r.message for r in caplog.records if "does not give" in r.message] == [
        f"NVML on {monitor.name} does not give utilization (Not Supported): measurements go on without them"
    ]
    assert monitor.energy_supported


def test_counters_the_gpu_refuses_are_left_out_and_an_energy_budget_refused(tmp_path, llvm_target, caplog):
    with caplog.at_level(logging.WARNING, logger="tensor_tuner.measure"):
        monitor = NvmlMonitor(
            device=DeviceIdentity(0, _uuid(0), None), nvml=FakeNvml(H100S, refused={"energy", "utilization"})
        )
    assert monitor.missing.keys() == {"energy", "utilization"} and len(caplog.records) == 1
    assert "utilization (Not Supported), energy (Not Supported)" in caplog.records[0].message
    with monitor.watch() as health:
        pass
    assert health[0].energy_j is None and health[0].before.power_w == 300.0 and not health[0].suspect
    engine = MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=0), monitor=monitor)
    try:
        assert not engine.energy_measurable
        with pytest.raises(TunerError, match="energy budget"):
            check_measurable(Objectives(joules=100.0), engine.energy_measurable, "for the run")
    finally:
        engine.close()


def test_a_counter_that_stops_answering_mid_run_is_said_once_and_the_rest_go_on(caplog):
    nvml = FakeNvml(H100S)
    monitor = NvmlMonitor(device=DeviceIdentity(0, _uuid(0), None), nvml=nvml)
    nvml.refused.add("temperature")
    with caplog.at_level(logging.WARNING, logger="tensor_tuner.measure"):
        samples = [monitor.sample() for _ in range(3)]
    assert all(s.temperature_c is None and s.sm_clock_mhz == 1980 for s in samples)
    assert len(caplog.records) == 1 and "stopped giving temperature" in caplog.records[0].message


def test_clock_and_temperature_drift_flag_a_measurement_and_missing_counters_flag_nothing():
    monitor = NvmlMonitor(nvml=FakeNvml(H100S))
    steady = monitor.assess(GpuSample(90, 1980, 60, 400.0, 1000.0), GpuSample(95, 1980, 62, 410.0, 1003.5))
    assert not steady.suspect and abs(steady.energy_j - 3.5) < 1e-9
    throttled = monitor.assess(GpuSample(90, 1980, 60, 400.0, None), GpuSample(99, 1600, 71, 700.0, None))
    assert throttled.suspect and len(throttled.flags) == 2 and throttled.energy_j is None
    assert "1980 -> 1600" in throttled.flags[0]
    blind = monitor.assess(GpuSample(None, None, None, None, None), GpuSample(None, None, None, None, None))
    assert not blind.suspect and blind.energy_j is None


def test_a_windows_energy_is_shared_by_time_in_the_timed_region():
    results = [MeasureResult(k, Status.OK, run_seconds=s) for k, s in (("a", 0.3), ("b", 0.1), ("c", 0.0))]
    split_energy(8.0, results)
    assert [r.energy_j for r in results] == pytest.approx([6.0, 2.0, 0.0])
    failed = [MeasureResult("x", Status.RUN_ERROR), MeasureResult("y", Status.RUN_CRASH)]
    split_energy(3.0, failed)
    assert [r.energy_j for r in failed] == [1.5, 1.5]
    split_energy(None, results)
    assert all(r.energy_j is None for r in results)


def test_energy_at_dop_2_adds_up_to_what_the_device_spent_not_once_per_candidate(tmp_path, llvm_target):
    """Two candidates timed at once used to be charged each the energy of the whole overlap."""
    watts = 100.0
    monitor = NvmlMonitor(device=DeviceIdentity(0, _uuid(0), None), nvml=FakeNvml(H100S, watts=watts))
    config = EngineConfig(
        build_workers=1,
        max_dop=2,
        remember_dop=False,
        timing=TimingConfig(min_repeats=5, max_repeats=5, budget_seconds=0.05),
    )
    inputs = [MeasureInput(f"c{i}", faulty.copy(1 << 16)) for i in range(15)]
    with MeasureEngine(llvm_target, tmp_path, config, monitor=monitor) as engine:
        builds = list(engine.build(inputs))
        started = time.monotonic()
        results = list(engine.measure_built(builds))
        wall = time.monotonic() - started
        assert any(d.dop == 2 for d in engine.dop_decisions)
    assert all(r.ok and r.energy_j is not None and r.energy_j >= 0 for r in results)
    assert sum(r.energy_j for r in results) <= watts * wall * 1.01


def test_a_measuring_worker_holding_more_than_its_share_of_the_gpus_memory_is_restarted(tmp_path, llvm_target):
    """A CUDA context keeps the local memory its greediest kernel needed: on an H100, nine workers
    holding up to 17 GB each filled the GPU and an innocent kernel's launch failed."""
    nvml = FakeNvml(H100S)
    monitor = NvmlMonitor(device=DeviceIdentity(0, _uuid(0), None), nvml=nvml)
    config = EngineConfig(
        build_workers=1, max_dop=1, remember_dop=False, timing=TimingConfig(min_repeats=3, max_repeats=3)
    )
    inputs = [MeasureInput(f"c{i}", faulty.copy(1 << 12)) for i in range(4)]
    with MeasureEngine(llvm_target, tmp_path, config, monitor=monitor) as engine:
        builds = list(engine.build(inputs))
        nvml.context_bytes = 1 << 30  # a fresh context's size: never above the cap
        within = list(engine.measure_built(builds[:2], serial=True))
        restarts_within = engine.worker_restarts
        nvml.context_bytes = 80 << 30  # all of the GPU: above any worker's share
        beyond = list(engine.measure_built(builds[2:], serial=True))
        restarts_beyond = engine.worker_restarts
    assert all(r.ok for r in within + beyond)
    assert restarts_within == 0 and restarts_beyond == 1  # checked when the worker's queue is done
