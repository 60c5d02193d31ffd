"""The NVML monitor: says once that NVML is missing and keeps working; flags drift when present."""

import logging

from measure.nvml import GpuSample, NvmlMonitor


def test_without_nvml_it_reports_once_and_returns_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="tensor_tuner.measure"):
        monitor = NvmlMonitor()
    if monitor.available:  # a machine with a GPU driver: the real readings must make sense
        sample = monitor.sample(0)
        assert sample.sm_clock_mhz > 0 and sample.power_w > 0 and monitor.device_names()
        return
    assert sum("no NVML" in r.message for r in caplog.records) == 1
    assert monitor.sample(0) is None and monitor.device_names() == []
    with monitor.watch(0) as health:
        pass
    assert health == []


def test_clock_and_temperature_drift_flag_a_measurement():
    monitor = NvmlMonitor()
    steady = monitor.assess(GpuSample(90, 1980, 60, 400.0, 1000.0), GpuSample(95, 1980, 62, 410.0, 1003.5))
    assert not steady.suspect and abs(steady.energy_j - 3.5) < 1e-9
    throttled = monitor.assess(GpuSample(90, 1980, 60, 400.0, None), GpuSample(99, 1600, 71, 700.0, None))
    assert throttled.suspect and len(throttled.flags) == 2 and throttled.energy_j is None
    assert "1980 -> 1600" in throttled.flags[0]
