"""NVIDIA GPU metrics over NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

:class:`GpuMonitor` never raises. No driver, no GPU or no ``nvidia-ml-py`` means ``available`` is ``False``
and ``reason`` says ``"no NVIDIA GPU: <why>"``. A metric one GPU does not support (``NOT_SUPPORTED``, an old
driver without the function) is ``None`` with a reason in ``GpuSample.unavailable``. A GPU that falls off
the bus (``GPU_IS_LOST``) is reported as an unavailable device from then on, and the other GPUs carry on.

NVML is initialised lazily, on the first call that needs it, under a lock: constructing a monitor is free,
and two threads asking at once initialise it once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from engine.telemetry.samples import GpuSample

log = logging.getLogger(__name__)

NO_GPU_PREFIX = "no NVIDIA GPU: "

# NVML's clock event ("throttle") reason bits, named as in nvml.h. Kept here rather than read from pynvml
# because older nvidia-ml-py releases only have the ``ClocksThrottleReason`` spelling of these constants.
_THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (0x0001, "gpu_idle"),
    (0x0002, "applications_clocks_setting"),
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal_slowdown"),
    (0x0040, "hw_thermal_slowdown"),
    (0x0080, "hw_power_brake_slowdown"),
    (0x0100, "display_clock_setting"),
    (0x0200, "board_limit"),
    (0x0400, "reliability"),
)

# Fallback values of NVML error codes (nvml.h), used only if the loaded pynvml lacks a constant.
_ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_GPU_NOT_FOUND": 28,
}

# Every metric field of GpuSample, so a lost device can say why each one is missing.
_METRIC_FIELDS = (
    "sm_util_pct",
    "mem_util_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "process_memory_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pcie_tx_kb_s",
    "pcie_rx_kb_s",
    "throttle_reasons",
    "throttle_mask",
    "energy_mj",
)


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the clock event reason bits set in ``mask``.

    Args:
        mask: Value of ``nvmlDeviceGetCurrentClocksEventReasons``.

    Returns:
        Names such as ``"sw_power_cap"``; a bit this table does not know is given as ``"0x..."``.
    """
    names = [name for bit, name in _THROTTLE_BITS if mask & bit]
    known = 0
    for bit, _ in _THROTTLE_BITS:
        known |= bit
    unknown = mask & ~known
    bit = 1
    while unknown:
        if unknown & bit:
            names.append(f"0x{bit:x}")
            unknown &= ~bit
        bit <<= 1
    return names


def _text(value: Any) -> str:
    # nvidia-ml-py returns str on Python 3, but releases before 11.515 returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _DeviceLost(Exception):
    """Internal: an NVML call said this device is gone; the sample reports it unavailable."""


@dataclass
class _Device:
    index: int
    handle: Any = None
    name: str | None = None
    uuid: str | None = None
    lost_reason: str | None = None
    # Field -> reason, for fields that failed with NOT_SUPPORTED or a missing function. Hardware does not
    # grow features, so these are not asked again: it keeps a 4 Hz sampler cheap on consumer cards.
    unsupported: dict[str, str] = field(default_factory=dict)
    # Field group -> index of the first getter in a fallback chain that worked (see _first_supported).
    chosen: dict[str, int] = field(default_factory=dict)
    pcie_next: float = 0.0
    pcie_last: tuple[int | None, int | None, dict[str, str]] | None = None


@dataclass(frozen=True)
class GpuReading:
    """What :meth:`GpuMonitor.sample` returns.

    Attributes:
        available: ``True`` when NVML works and at least one GPU is usable.
        reason: ``"no NVIDIA GPU: <why>"`` when ``available`` is ``False``.
        driver_version: The NVIDIA driver's version, e.g. ``"550.54.15"``.
        gpus: One :class:`GpuSample` per NVML device, lost devices included.
    """

    available: bool
    reason: str | None
    driver_version: str | None
    gpus: list[GpuSample]


class GpuMonitor:
    """Reads every NVIDIA GPU's metrics through NVML. Thread-safe; never raises.

    Args:
        nvml: The NVML binding module; ``None`` imports ``pynvml`` (from ``nvidia-ml-py``) on first use.
            Tests pass a stand-in with the same functions.
        pcie_interval_s: How often PCIe throughput is read. NVML measures it by counting bytes over a
            20 ms window per direction, so each reading blocks for about 40 ms per GPU; reading it on
            every 4 Hz tick would eat a sixth of the sampling period. Between readings the last value is
            repeated. ``0`` reads it every sample.
        pid: Process whose GPU memory is reported as ``process_memory_bytes``; default this process.
        clock: Monotonic clock, injectable for tests.
    """

    def __init__(
        self,
        nvml: ModuleType | Any | None = None,
        *,
        pcie_interval_s: float = 1.0,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml_given = nvml
        self._pcie_interval_s = max(0.0, float(pcie_interval_s))
        self._pid = os.getpid() if pid is None else pid
        self._clock = clock
        # Re-entrant: sample() holds it and calls _ensure_init(), which takes it too.
        self._lock = threading.RLock()
        self._reset_state()

    def _reset_state(self) -> None:
        self._attempted = False
        self._nvml: Any = None
        self._nvml_open = False
        self._reason: str | None = None
        self._driver: str | None = None
        self._devices: list[_Device] = []
        self._codes: dict[str, int] = {}

    # -- public -----------------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """``True`` when NVML initialised and at least one GPU is usable (initialises NVML if needed)."""
        with self._lock:
            self._ensure_init()
            return self._reason is None and any(d.lost_reason is None for d in self._devices)

    @property
    def reason(self) -> str | None:
        """``"no NVIDIA GPU: <why>"`` when :attr:`available` is ``False``, else ``None``."""
        with self._lock:
            self._ensure_init()
            return self._overall_reason()

    @property
    def driver_version(self) -> str | None:
        """The NVIDIA driver version, or ``None`` without a driver."""
        with self._lock:
            self._ensure_init()
            return self._driver

    @property
    def device_count(self) -> int:
        """Number of NVML devices found at initialisation (lost ones included)."""
        with self._lock:
            self._ensure_init()
            return len(self._devices)

    def sample(self) -> GpuReading:
        """Read every device once.

        Returns:
            A :class:`GpuReading`; on a machine without an NVIDIA GPU it has ``available=False``, a reason
            and no devices.
        """
        with self._lock:
            self._ensure_init()
            gpus = [self._sample_device(d) for d in self._devices]
            reason = self._overall_reason()
            return GpuReading(available=reason is None, reason=reason, driver_version=self._driver, gpus=gpus)

    def reset(self) -> None:
        """Forget everything, shut NVML down, and initialise again on the next call.

        For a "retry" after the user installed a driver or a lost GPU was reset.
        """
        self.close()

    def close(self) -> None:
        """Shut NVML down. The monitor stays usable: the next call initialises it again."""
        with self._lock:
            if self._nvml_open:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # a lost GPU or unloaded driver must not turn shutdown into a crash
                    log.debug("nvmlShutdown failed", exc_info=True)
            self._reset_state()

    # -- initialisation ---------------------------------------------------------------------------------

    def _ensure_init(self) -> None:
        if self._attempted:
            return
        self._attempted = True
        try:
            self._init()
        except Exception as exc:  # defensive: whatever a binding does, "no GPU" is the answer
            log.debug("NVML initialisation failed", exc_info=True)
            self._reason = f"{NO_GPU_PREFIX}{type(exc).__name__}: {exc}"
            self._devices = []

    def _init(self) -> None:
        if self._nvml_given is None:
            try:
                import pynvml as nvml  # lazy: ~15 ms of import, paid only where GPU metrics are wanted
            except ImportError:
                self._reason = f"{NO_GPU_PREFIX}nvidia-ml-py is not installed"
                return
        else:
            nvml = self._nvml_given
        self._nvml = nvml
        self._codes = {name: getattr(nvml, name, value) for name, value in _ERROR_CODES.items()}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._reason = NO_GPU_PREFIX + self._init_failure(exc)
            return
        self._nvml_open = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._reason = f"{NO_GPU_PREFIX}cannot count devices ({self._describe(exc)})"
            return
        if count == 0:
            self._reason = f"{NO_GPU_PREFIX}the driver reports no devices"
            return
        try:
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self._driver = None  # not worth refusing the GPUs over
        for index in range(count):
            self._devices.append(self._open_device(index))

    def _open_device(self, index: int) -> _Device:
        nvml = self._nvml
        device = _Device(index=index)
        try:
            device.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            # e.g. NO_PERMISSION for a GPU hidden by cgroups, GPU_IS_LOST for one that is dead at start
            device.lost_reason = f"cannot open GPU {index}: {self._describe(exc)}"
            return device
        try:
            device.name = _text(nvml.nvmlDeviceGetName(device.handle))
        except nvml.NVMLError as exc:
            if self._is_fatal(exc):
                device.lost_reason = self._describe(exc)
        try:
            device.uuid = _text(nvml.nvmlDeviceGetUUID(device.handle))
        except nvml.NVMLError as exc:
            if self._is_fatal(exc):
                device.lost_reason = self._describe(exc)
        return device

    def _init_failure(self, exc: Exception) -> str:
        code: Any = getattr(exc, "value", None)  # whatever the binding's error carries
        nvml_text = self._describe(exc)
        codes = self._codes
        friendly = {
            codes[
                "NVML_ERROR_LIBRARY_NOT_FOUND"
            ]: "the NVIDIA driver library (libnvidia-ml) is not installed",
            codes["NVML_ERROR_DRIVER_NOT_LOADED"]: "the NVIDIA driver is not loaded",
            codes["NVML_ERROR_NO_PERMISSION"]: "no permission to talk to the NVIDIA driver",
            codes["NVML_ERROR_LIB_RM_VERSION_MISMATCH"]: (
                "the NVIDIA driver and its library versions differ (reboot after a driver update)"
            ),
        }.get(code)
        return f"{friendly} ({nvml_text})" if friendly else nvml_text

    def _overall_reason(self) -> str | None:
        if self._reason is not None:
            return self._reason
        if not self._devices:
            return f"{NO_GPU_PREFIX}not initialised"
        if all(d.lost_reason is not None for d in self._devices):
            return f"{NO_GPU_PREFIX}every GPU became unavailable ({self._devices[0].lost_reason})"
        return None

    # -- sampling ---------------------------------------------------------------------------------------

    def _describe(self, exc: BaseException) -> str:
        try:
            text = str(exc)
        except Exception:  # NVMLError.__str__ can call into the library for codes it does not know
            text = ""
        return text or f"NVML error {getattr(exc, 'value', '?')}"

    def _is_fatal(self, exc: BaseException) -> bool:
        code = getattr(exc, "value", None)
        return code in (
            self._codes["NVML_ERROR_GPU_IS_LOST"],
            self._codes["NVML_ERROR_RESET_REQUIRED"],
            self._codes["NVML_ERROR_GPU_NOT_FOUND"],
        )

    def _is_unsupported(self, exc: BaseException) -> bool:
        if isinstance(exc, AttributeError):  # this nvidia-ml-py predates the function
            return True
        mismatch = getattr(self._nvml, "NVMLLibraryMismatchError", None)
        if mismatch is not None and isinstance(exc, mismatch):  # pynvml's wrapper for a missing symbol
            return True
        code = getattr(exc, "value", None)
        return code in (self._codes["NVML_ERROR_NOT_SUPPORTED"], self._codes["NVML_ERROR_FUNCTION_NOT_FOUND"])

    def _sample_device(self, device: _Device) -> GpuSample:
        if device.lost_reason is None:
            try:
                return self._read_device(device)
            except _DeviceLost as lost:
                device.lost_reason = str(lost)
                log.warning("GPU %d is unavailable: %s", device.index, device.lost_reason)
        return GpuSample(
            index=device.index,
            name=device.name,
            uuid=device.uuid,
            available=False,
            reason=device.lost_reason,
            unavailable=dict.fromkeys(_METRIC_FIELDS, device.lost_reason),
        )

    def _failed(
        self, device: _Device, fields: Sequence[str], exc: BaseException, missing: dict[str, str]
    ) -> None:
        """Record why ``fields`` have no value; raise :class:`_DeviceLost` if the device is gone."""
        if self._is_fatal(exc):
            raise _DeviceLost(self._describe(exc)) from exc
        if self._is_unsupported(exc):
            if getattr(exc, "value", None) == self._codes["NVML_ERROR_NOT_SUPPORTED"]:
                reason = "not supported by this GPU"
            else:
                reason = f"not supported by this driver ({self._describe(exc)})"
            for name in fields:
                device.unsupported[name] = reason
        elif isinstance(exc, getattr(self._nvml, "NVMLError", ())):
            reason = self._describe(exc)  # e.g. NO_PERMISSION, TIMEOUT: may work next time, so ask again
        else:
            reason = f"{type(exc).__name__}: {self._describe(exc)}"
        missing.update(dict.fromkeys(fields, reason))

    def _call(
        self, device: _Device, fields: Sequence[str], getter: Callable[[], Any], missing: dict[str, str]
    ) -> Any:
        """Run one NVML getter for ``fields``; ``None`` (reason in ``missing``) when it fails."""
        for name in fields:
            if name in device.unsupported:
                missing.update(dict.fromkeys(fields, device.unsupported[name]))
                return None
        try:
            return getter()
        except Exception as exc:
            self._failed(device, fields, exc, missing)
            return None

    def _first_supported(
        self,
        device: _Device,
        group: str,
        fields: Sequence[str],
        getters: Sequence[Callable[[], Any]],
        missing: dict[str, str],
    ) -> Any:
        """Like :meth:`_call` over a chain of equivalent NVML functions, for old and new drivers.

        A getter that is unsupported moves the chain on for good (``device.chosen``), so each sample makes
        one call once the working variant is known.
        """
        for name in fields:
            if name in device.unsupported:
                missing.update(dict.fromkeys(fields, device.unsupported[name]))
                return None
        for position in range(device.chosen.get(group, 0), len(getters)):
            try:
                value = getters[position]()
            except Exception as exc:
                if position + 1 < len(getters) and not self._is_fatal(exc) and self._is_unsupported(exc):
                    device.chosen[group] = position + 1
                    continue
                self._failed(device, fields, exc, missing)
                return None
            device.chosen[group] = position
            return value
        return None

    def _read_device(self, device: _Device) -> GpuSample:
        """One sample of ``device``: every metric it reports, and for each it does not, the reason."""
        missing: dict[str, str] = {}
        values: dict[str, Any] = {}
        self._read_load(device, values, missing)
        self._read_power(device, values, missing)
        self._read_clocks(device, values, missing)
        self._read_pcie(device, values, missing)
        self._read_throttle(device, values, missing)
        self._read_process_memory(device, values, missing)
        self._read_energy(device, values, missing)
        return GpuSample(
            index=device.index,
            name=device.name,
            uuid=device.uuid,
            available=True,
            unavailable=missing,
            **values,
        )

    def _read_load(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """SM and memory-controller utilisation, memory used and total."""
        nvml = self._nvml
        handle = device.handle
        util = self._call(
            device,
            ("sm_util_pct", "mem_util_pct"),
            lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
            missing,
        )
        if util is not None:
            values["sm_util_pct"] = float(util.gpu)
            values["mem_util_pct"] = float(util.memory)

        memory = self._call(
            device,
            ("memory_used_bytes", "memory_total_bytes"),
            lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
            missing,
        )
        if memory is not None:
            values["memory_used_bytes"] = int(memory.used)
            values["memory_total_bytes"] = int(memory.total)

    def _read_power(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """Temperature, power draw and the enforced power limit."""
        nvml = self._nvml
        handle = device.handle
        # nvmlDeviceGetTemperature is deprecated for CUDA 14 but is what every driver in the field has;
        # nvmlDeviceGetTemperatureV is the successor and only exists in recent drivers.
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        temperature = self._first_supported(
            device,
            "temperature",
            ("temperature_c",),
            (
                lambda: nvml.nvmlDeviceGetTemperature(handle, sensor),
                lambda: nvml.nvmlDeviceGetTemperatureV(handle, sensor),
            ),
            missing,
        )
        if temperature is not None:
            values["temperature_c"] = float(temperature)

        power = self._call(device, ("power_w",), lambda: nvml.nvmlDeviceGetPowerUsage(handle), missing)
        if power is not None:
            values["power_w"] = power / 1000.0  # NVML reports milliwatts
        limit = self._call(
            device, ("power_limit_w",), lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), missing
        )
        if limit is not None:
            values["power_limit_w"] = limit / 1000.0

    def _read_clocks(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """The SM and memory clocks."""
        nvml = self._nvml
        handle = device.handle
        sm_clock = self._call(
            device,
            ("sm_clock_mhz",),
            lambda: nvml.nvmlDeviceGetClockInfo(handle, getattr(nvml, "NVML_CLOCK_SM", 1)),
            missing,
        )
        if sm_clock is not None:
            values["sm_clock_mhz"] = int(sm_clock)
        mem_clock = self._call(
            device,
            ("mem_clock_mhz",),
            lambda: nvml.nvmlDeviceGetClockInfo(handle, getattr(nvml, "NVML_CLOCK_MEM", 2)),
            missing,
        )
        if mem_clock is not None:
            values["mem_clock_mhz"] = int(mem_clock)

    def _read_throttle(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """Why the clocks are held down: the raw mask and its decoded reasons."""
        nvml = self._nvml
        handle = device.handle
        # "Throttle reasons" were renamed "clock event reasons" in driver 535; old drivers only have the
        # old function, and CUDA 14 will drop it.
        mask = self._first_supported(
            device,
            "throttle",
            ("throttle_reasons", "throttle_mask"),
            (
                lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
                lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
            ),
            missing,
        )
        if mask is not None:
            values["throttle_mask"] = int(mask)
            values["throttle_reasons"] = decode_throttle_reasons(int(mask))

    def _read_process_memory(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """This process's own GPU memory, or why it cannot be told."""
        nvml = self._nvml
        handle = device.handle
        processes = self._call(
            device,
            ("process_memory_bytes",),
            lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle),
            missing,
        )
        if processes is not None:
            mine = [p for p in processes if getattr(p, "pid", None) == self._pid]
            used = [getattr(p, "usedGpuMemory", None) for p in mine]
            if not mine:
                # Not an error and not zero either: inside a container NVML lists host PIDs, so "absent"
                # can also mean "present under another PID".
                missing["process_memory_bytes"] = (
                    "this process has no CUDA context on this GPU (or its PID is hidden)"
                )
            elif any(u is None for u in used):
                missing["process_memory_bytes"] = "the driver does not report per-process memory (WDDM)"
            else:
                values["process_memory_bytes"] = int(sum(u for u in used if u is not None))

    def _read_energy(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        """The energy counter since the driver loaded (millijoules)."""
        nvml = self._nvml
        handle = device.handle
        energy = self._call(
            device, ("energy_mj",), lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle), missing
        )
        if energy is not None:
            values["energy_mj"] = int(energy)

    def _read_pcie(self, device: _Device, values: dict[str, Any], missing: dict[str, str]) -> None:
        now = self._clock()
        if device.pcie_last is None or now >= device.pcie_next:
            nvml = self._nvml
            pcie_missing: dict[str, str] = {}
            tx = self._call(
                device,
                ("pcie_tx_kb_s",),
                lambda: nvml.nvmlDeviceGetPcieThroughput(
                    device.handle, getattr(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)
                ),
                pcie_missing,
            )
            rx = self._call(
                device,
                ("pcie_rx_kb_s",),
                lambda: nvml.nvmlDeviceGetPcieThroughput(
                    device.handle, getattr(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
                ),
                pcie_missing,
            )
            device.pcie_last = (tx, rx, pcie_missing)
            device.pcie_next = now + self._pcie_interval_s
        tx, rx, pcie_missing = device.pcie_last
        missing.update(pcie_missing)
        if tx is not None:
            values["pcie_tx_kb_s"] = int(tx)
        if rx is not None:
            values["pcie_rx_kb_s"] = int(rx)
