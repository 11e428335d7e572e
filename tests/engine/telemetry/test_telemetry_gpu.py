"""GpuMonitor: the real no-GPU path, and the NVML path against the documented-behaviour stand-in."""

from __future__ import annotations

import inspect
import os
import threading

import pynvml
import pytest

from engine.telemetry import NO_GPU_PREFIX, GpuMonitor, decode_throttle_reasons
from tests.engine.telemetry.fake_nvml import FUNCTIONS, FakeGpu, FakeNvml

GiB = 2**30


def test_stand_in_matches_the_real_pynvml_api():
    # The stand-in is only worth something if the engine could not tell it from the real module.
    for name in FUNCTIONS:
        assert hasattr(pynvml, name), name
        real_params = list(inspect.signature(getattr(pynvml, name)).parameters)
        fake_params = list(inspect.signature(getattr(FakeNvml([]), name)).parameters)
        assert fake_params == real_params, name
    for name in (
        "NVML_ERROR_NOT_SUPPORTED",
        "NVML_ERROR_GPU_IS_LOST",
        "NVML_CLOCK_SM",
        "NVML_PCIE_UTIL_TX_BYTES",
    ):
        assert getattr(FakeNvml([]), name) == getattr(pynvml, name)


def test_real_pynvml_without_driver_reports_no_gpu(no_nvidia_driver):
    monitor = GpuMonitor()  # the installed nvidia-ml-py; nvmlInit fails on this machine
    reading = monitor.sample()
    assert reading.available is False
    assert reading.gpus == []
    assert reading.reason.startswith(NO_GPU_PREFIX)
    assert "NVML" in reading.reason  # NVML's own words are kept for bug reports
    assert monitor.available is False
    monitor.close()


def test_values_and_units_follow_nvml(fake_monitor):
    reading = fake_monitor.sample()
    assert reading.available and reading.reason is None
    assert reading.driver_version == "550.54.15"
    gpu0, gpu1 = reading.gpus
    assert (gpu0.index, gpu0.name, gpu0.uuid) == (
        0,
        "NVIDIA RTX A6000",
        "GPU-6f1a2b3c-0000-1111-2222-333344445555",
    )
    assert gpu0.available and gpu0.unavailable == {}
    assert (gpu0.sm_util_pct, gpu0.mem_util_pct) == (87.0, 45.0)
    assert (gpu0.memory_used_bytes, gpu0.memory_total_bytes) == (20 * GiB, 48 * GiB)
    assert gpu0.process_memory_bytes == 3 * GiB  # only this PID's entry, not the other process's
    assert gpu0.temperature_c == 66.0
    assert gpu0.power_w == pytest.approx(251.5)  # milliwatts -> watts
    assert gpu0.power_limit_w == pytest.approx(300.0)
    assert (gpu0.sm_clock_mhz, gpu0.mem_clock_mhz) == (1800, 8001)
    assert (gpu0.pcie_tx_kb_s, gpu0.pcie_rx_kb_s) == (2048, 512)
    assert gpu0.throttle_reasons == ["sw_power_cap"] and gpu0.throttle_mask == 0x4
    assert gpu0.energy_mj == 5_000_000
    assert gpu1.name == "NVIDIA GeForce RTX 3060"
    assert gpu1.throttle_reasons == ["gpu_idle"]
    assert gpu1.process_memory_bytes is None
    assert "no CUDA context" in gpu1.unavailable["process_memory_bytes"]


def test_unsupported_fields_are_none_with_reason_and_not_asked_again():
    nvml = FakeNvml(
        [
            FakeGpu(
                unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput"},
                processes=[(os.getpid(), GiB)],
            )
        ]
    )
    monitor = GpuMonitor(nvml, pcie_interval_s=0)
    first = monitor.sample().gpus[0]
    second = monitor.sample().gpus[0]
    for gpu in (first, second):
        assert gpu.available
        assert gpu.power_w is None and gpu.pcie_tx_kb_s is None and gpu.pcie_rx_kb_s is None
        assert gpu.unavailable["power_w"] == "not supported by this GPU"
        assert set(gpu.unavailable) == {"power_w", "pcie_tx_kb_s", "pcie_rx_kb_s"}
        assert gpu.sm_util_pct == 87.0  # everything else is still there
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 2  # tx and rx, once each
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 2


def test_old_driver_falls_back_to_throttle_reasons_and_legacy_names():
    nvml = FakeNvml(
        [FakeGpu(missing_functions={"nvmlDeviceGetCurrentClocksEventReasons"}, clock_event_reasons=0x60)]
    )
    monitor = GpuMonitor(nvml)
    for _ in range(3):
        gpu = monitor.sample().gpus[0]
        assert gpu.throttle_reasons == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # learnt once, then skipped
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_temperature_uses_successor_when_legacy_function_is_gone():
    nvml = FakeNvml([FakeGpu(missing_functions={"nvmlDeviceGetTemperature"}, temperature=71)])
    gpu = GpuMonitor(nvml).sample().gpus[0]
    assert gpu.temperature_c == 71.0
    assert "temperature_c" not in gpu.unavailable
    assert nvml.calls["nvmlDeviceGetTemperatureV"] == 1


def test_wddm_process_memory_is_not_available():
    nvml = FakeNvml([FakeGpu(processes=[(os.getpid(), None)])])
    gpu = GpuMonitor(nvml).sample().gpus[0]
    assert gpu.process_memory_bytes is None
    assert "WDDM" in gpu.unavailable["process_memory_bytes"]


def test_gpu_lost_mid_run_marks_only_that_device(fake_nvml, fake_monitor):
    assert all(g.available for g in fake_monitor.sample().gpus)
    fake_nvml.gpus[0].lost = True
    reading = fake_monitor.sample()
    lost, alive = reading.gpus
    assert reading.available  # the other GPU carries on
    assert lost.available is False and lost.reason == "GPU is lost"
    assert lost.name == "NVIDIA RTX A6000"  # still identifiable in the UI
    assert lost.power_w is None and lost.unavailable["power_w"] == "GPU is lost"
    assert alive.available and alive.power_w == pytest.approx(15.0)
    calls_before = fake_nvml.calls["nvmlDeviceGetUtilizationRates"]
    again = fake_monitor.sample()
    assert again.gpus[0].available is False
    assert fake_nvml.calls["nvmlDeviceGetUtilizationRates"] == calls_before + 1  # the lost GPU is not polled


def test_all_gpus_lost_means_no_gpu():
    nvml = FakeNvml([FakeGpu()])
    monitor = GpuMonitor(nvml)
    monitor.sample()
    nvml.gpus[0].lost = True
    reading = monitor.sample()
    assert reading.available is False
    assert reading.reason.startswith(NO_GPU_PREFIX) and "GPU is lost" in reading.reason
    assert monitor.available is False


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_init_failures_become_reasons(code, words):
    monitor = GpuMonitor(FakeNvml([FakeGpu()], init_error=code))
    reading = monitor.sample()
    assert not reading.available and reading.gpus == []
    assert reading.reason.startswith(NO_GPU_PREFIX) and words in reading.reason


def test_zero_devices_is_no_gpu():
    reading = GpuMonitor(FakeNvml([])).sample()
    assert not reading.available
    assert reading.reason == f"{NO_GPU_PREFIX}the driver reports no devices"


def test_init_is_lazy_and_happens_once_across_threads():
    nvml = FakeNvml([FakeGpu()], init_delay_s=0.02)
    monitor = GpuMonitor(nvml)
    assert nvml.calls["nvmlInit"] == 0  # constructing is free
    barrier = threading.Barrier(8)
    results = []

    def probe():
        barrier.wait()
        results.append(monitor.available)

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 8
    assert nvml.calls["nvmlInit"] == 1


def test_close_shuts_down_and_reinitialises_on_demand(fake_nvml, fake_monitor):
    fake_monitor.sample()
    fake_monitor.close()
    assert fake_nvml.calls["nvmlShutdown"] == 1 and not fake_nvml.initialized
    assert fake_monitor.sample().available
    assert fake_nvml.calls["nvmlInit"] == 2


def test_pcie_is_read_at_its_own_slower_cadence():
    now = [100.0]
    nvml = FakeNvml([FakeGpu(pcie_tx_kb=10)])
    monitor = GpuMonitor(nvml, pcie_interval_s=1.0, clock=lambda: now[0])
    assert monitor.sample().gpus[0].pcie_tx_kb_s == 10
    nvml.gpus[0].pcie_tx_kb = 20
    now[0] += 0.25
    assert monitor.sample().gpus[0].pcie_tx_kb_s == 10  # last reading repeated within the second
    now[0] += 1.0
    assert monitor.sample().gpus[0].pcie_tx_kb_s == 20
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 4


def test_decode_throttle_reasons_names_unknown_bits():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(0x4 | 0x8) == ["sw_power_cap", "hw_slowdown"]
    assert decode_throttle_reasons(0x1 | 0x10000) == ["gpu_idle", "0x10000"]
