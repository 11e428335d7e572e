"""A stand-in for the ``pynvml`` module (nvidia-ml-py), for testing GpuMonitor without a GPU.

Written from nvidia-ml-py's documented behaviour and its source:

* the same function names and parameter names (checked against the installed pynvml by a test);
* the same return types: ``nvmlDeviceGetUtilizationRates`` and ``nvmlDeviceGetMemoryInfo`` return the real
  ctypes structures, ``nvmlDeviceGetComputeRunningProcesses`` a list of ``nvmlFriendlyObject`` with
  ``usedGpuMemory=None`` where the driver cannot tell (WDDM), names and versions are ``str``;
* the same units: power and power limit in milliwatts, energy in millijoules, clocks in MHz, PCIe
  throughput in KB/s, memory in bytes;
* the same errors: the real ``pynvml.NVMLError`` with NVML's codes (``NOT_SUPPORTED`` for a metric the GPU
  lacks, ``FUNCTION_NOT_FOUND`` for a function the driver predates, ``GPU_IS_LOST`` for every call once a
  GPU fell off the bus, ``UNINITIALIZED`` before ``nvmlInit``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pynvml as real

GiB = 2**30


@dataclass
class FakeGpu:
    """What one simulated GPU reports. Function names in ``unsupported`` raise NOT_SUPPORTED, those in
    ``missing_functions`` raise FUNCTION_NOT_FOUND (an older driver); ``lost`` makes every call raise
    GPU_IS_LOST."""

    name: str = "NVIDIA RTX A6000"
    uuid: str = "GPU-6f1a2b3c-0000-1111-2222-333344445555"
    util_gpu: int = 87
    util_memory: int = 45
    memory_total: int = 48 * GiB
    memory_used: int = 20 * GiB
    temperature: int = 66
    power_mw: int = 251_500
    power_limit_mw: int = 300_000
    sm_clock: int = 1800
    mem_clock: int = 8001
    pcie_tx_kb: int = 2048
    pcie_rx_kb: int = 512
    clock_event_reasons: int = 0x4  # sw_power_cap
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    energy_mj: int = 5_000_000
    unsupported: set[str] = field(default_factory=set)
    missing_functions: set[str] = field(default_factory=set)
    lost: bool = False


class _Handle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


class FakeNvml:
    """Module-like stand-in for ``pynvml``. ``calls`` counts calls per function name."""

    NVMLError = real.NVMLError
    NVMLLibraryMismatchError = real.NVMLLibraryMismatchError

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        driver: str = "550.54.15",
        init_delay_s: float = 0.0,
    ) -> None:
        # Every NVML_* constant (error codes, clock types, sensors, PCIe counters) as the real module has it.
        for name in dir(real):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(real, name))
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver = driver
        self.init_delay_s = init_delay_s
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _check(self, name: str, handle: _Handle | None = None) -> FakeGpu | None:
        self._count(name)
        if not self.initialized:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = handle.gpu
        if gpu.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.missing_functions:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if name in gpu.unsupported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- library ----------------------------------------------------------------------------------------

    def nvmlInit(self):
        self._count("nvmlInit")
        if self.init_delay_s:
            time.sleep(self.init_delay_s)  # widens the window in which two threads could both initialise
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self):
        self._check("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self):
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self):
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.gpus[index])

    # -- device -----------------------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle):
        return self._check("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        return self._check("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._check("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._check("nvmlDeviceGetMemoryInfo", handle)
        return real.c_nvmlMemory_t(
            total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used
        )

    def nvmlDeviceGetTemperature(self, handle, sensor):
        gpu = self._check("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetTemperatureV(self, handle, sensor, version=real.nvmlTemperature_v1):
        gpu = self._check("nvmlDeviceGetTemperatureV", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._check("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._check("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle, type):  # noqa: A002 - pynvml's parameter name
        gpu = self._check("nvmlDeviceGetClockInfo", handle)
        clocks = {real.NVML_CLOCK_SM: gpu.sm_clock, real.NVML_CLOCK_MEM: gpu.mem_clock}
        if type not in clocks:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return clocks[type]

    def nvmlDeviceGetPcieThroughput(self, device, counter):
        gpu = self._check("nvmlDeviceGetPcieThroughput", device)
        counters = {
            real.NVML_PCIE_UTIL_TX_BYTES: gpu.pcie_tx_kb,
            real.NVML_PCIE_UTIL_RX_BYTES: gpu.pcie_rx_kb,
        }
        if counter not in counters:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return counters[counter]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._check("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu = self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            real.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in gpu.processes
        ]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._check("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj


# Names of the stand-in's NVML functions, for the conformance test against the real module.
FUNCTIONS = sorted(name for name in vars(FakeNvml) if name.startswith("nvml"))
