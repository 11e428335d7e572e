"""The plain data a metrics source produces: one :class:`Sample` per tick.

Samples are frozen dataclasses of JSON types only (numbers, strings, lists, dicts, ``None``) so that the
same objects can be plotted by the app, written one per line by ``volsynth monitor --json``, and sent by a
remote server to a client, which rebuilds them with :meth:`Sample.from_dict`.

A metric the hardware or driver cannot report is ``None``, and its field name maps to the reason in the
``unavailable`` dict of the object that holds it: "not available" is data, never an exception.

``from_dict`` ignores keys it does not know and defaults keys that are missing, so a client and a server
one version apart still understand each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

_T = TypeVar("_T")


def _known_fields(cls: type[_T], data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class GpuSample:
    """One NVIDIA GPU at one instant.

    Attributes:
        index: NVML device index (PCI bus order, which is not always CUDA's order).
        name: Marketing name, e.g. ``"NVIDIA H100 80GB HBM3"``.
        uuid: Stable device id, e.g. ``"GPU-8c3e..."``; ``None`` if NVML would not say.
        available: ``False`` once the device is gone (``GPU_IS_LOST``); every metric is then ``None``.
        reason: Why the device is unavailable; ``None`` while it is available.
        sm_util_pct: Percent of the last sample period in which a kernel ran (NVML ``utilization.gpu``).
        mem_util_pct: Percent of the last sample period in which device memory was read or written.
        memory_used_bytes: Device memory in use by all processes.
        memory_total_bytes: Device memory installed.
        process_memory_bytes: Device memory used by this process, from NVML's compute process list.
        temperature_c: Core temperature in degrees Celsius.
        power_w: Board power draw in watts.
        power_limit_w: Enforced power limit in watts.
        sm_clock_mhz: Current SM clock.
        mem_clock_mhz: Current memory clock.
        pcie_tx_kb_s: PCIe transmit throughput in KB/s, as NVML reports it (refreshed at most about once
            a second; see ``GpuMonitor``).
        pcie_rx_kb_s: PCIe receive throughput in KB/s.
        throttle_reasons: Names of the active clock event (throttle) reasons, e.g. ``["sw_power_cap"]``;
            an empty list means clocks are not held back.
        throttle_mask: The raw NVML clock event reason bit mask.
        energy_mj: NVML's energy counter in millijoules since the driver loaded (Volta and newer).
        unavailable: Field name -> reason, for every metric above that is ``None``.
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    available: bool = True
    reason: str | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    process_memory_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_tx_kb_s: int | None = None
    pcie_rx_kb_s: int | None = None
    throttle_reasons: list[str] | None = None
    throttle_mask: int | None = None
    energy_mj: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuSample:
        """Rebuild from :meth:`to_dict` output (unknown keys are ignored)."""
        kwargs = _known_fields(cls, data)
        kwargs["unavailable"] = dict(kwargs.get("unavailable") or {})
        if kwargs.get("throttle_reasons") is not None:
            kwargs["throttle_reasons"] = list(kwargs["throttle_reasons"])
        return cls(**kwargs)


@dataclass(frozen=True)
class SystemSample:
    """CPU, RAM and this process, from psutil.

    Attributes:
        cpu_pct_per_core: Busy percent of each logical core since the previous sample.
        cpu_pct: Mean of ``cpu_pct_per_core``.
        ram_used_bytes: Memory not available to new programs (``total - available``).
        ram_total_bytes: Physical memory.
        ram_pct: ``ram_used_bytes`` as a percent of ``ram_total_bytes``.
        process_rss_bytes: Resident set size of this process.
        process_cpu_pct: CPU used by this process since the previous sample, in percent of one core
            (can exceed 100 on several cores).
        unavailable: Field name -> reason, for every metric above that is ``None``.
    """

    cpu_pct_per_core: list[float] = field(default_factory=list)
    cpu_pct: float | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    ram_pct: float | None = None
    process_rss_bytes: int | None = None
    process_cpu_pct: float | None = None
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SystemSample:
        """Rebuild from :meth:`to_dict` output (unknown keys are ignored)."""
        kwargs = _known_fields(cls, data)
        kwargs["cpu_pct_per_core"] = [float(v) for v in kwargs.get("cpu_pct_per_core") or []]
        kwargs["unavailable"] = dict(kwargs.get("unavailable") or {})
        return cls(**kwargs)


@dataclass(frozen=True)
class TorchDeviceStats:
    """The PyTorch CUDA caching allocator on one device (``torch.cuda.memory_stats``).

    Attributes:
        device: CUDA device index (CUDA's order).
        allocated_bytes: Memory held by live tensors.
        reserved_bytes: Memory the caching allocator holds from the driver (allocated plus cached).
        peak_allocated_bytes: Highest ``allocated_bytes`` since start or the last peak reset.
        peak_reserved_bytes: Highest ``reserved_bytes`` since start or the last peak reset.
        num_alloc_retries: Allocations that had to free the cache and retry (a sign of pressure).
        num_ooms: Out-of-memory errors the allocator raised.
    """

    device: int
    allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TorchDeviceStats:
        """Rebuild from :meth:`to_dict` output (unknown keys are ignored)."""
        return cls(**_known_fields(cls, data))


@dataclass(frozen=True)
class TorchSample:
    """The torch allocator's view, or why there is none.

    Attributes:
        available: ``True`` when the statistics below are real.
        reason: Why they are not (torch not loaded, no CUDA, CUDA not initialized yet).
        devices: One entry per CUDA device.
    """

    available: bool = False
    reason: str | None = None
    devices: list[TorchDeviceStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TorchSample:
        """Rebuild from :meth:`to_dict` output (unknown keys are ignored)."""
        kwargs = _known_fields(cls, data)
        kwargs["devices"] = [TorchDeviceStats.from_dict(d) for d in kwargs.get("devices") or []]
        return cls(**kwargs)


@dataclass(frozen=True)
class Sample:
    """Everything measured at one tick.

    Attributes:
        seq: Position in the source's stream, increasing by one per sample (the buffer assigns it, so
            a client can ask for ``history(after_seq=...)`` without comparing floats).
        timestamp: Wall-clock time, seconds since the epoch; use it for display and plot x axes.
        monotonic: Monotonic clock of the machine that measured, in seconds; use it for durations and
            integrals, it never jumps. Only differences within one source are meaningful.
        source: ``"local"`` or the name of the remote server that measured.
        gpu_available: ``False`` when there is no usable NVIDIA GPU at all.
        gpu_reason: ``"no NVIDIA GPU: <reason>"`` when ``gpu_available`` is ``False``.
        driver_version: NVIDIA driver version string.
        gpus: One entry per NVML device (empty without a GPU).
        system: CPU, RAM and process metrics; always live.
        torch: The torch allocator's statistics, or why there are none.
    """

    seq: int
    timestamp: float
    monotonic: float
    source: str = "local"
    gpu_available: bool = False
    gpu_reason: str | None = None
    driver_version: str | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    system: SystemSample = field(default_factory=SystemSample)
    torch: TorchSample = field(default_factory=TorchSample)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``json.dumps(sample.to_dict())`` always works."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Rebuild a sample from :meth:`to_dict` output, e.g. one line of ``volsynth monitor --json``.

        Args:
            data: The mapping; keys this version does not know are ignored.

        Returns:
            An equal :class:`Sample` (``Sample.from_dict(s.to_dict()) == s``).
        """
        kwargs = _known_fields(cls, data)
        kwargs.setdefault("seq", 0)
        kwargs.setdefault("timestamp", 0.0)
        # A sender that only has wall time still gives a usable (if jumpier) clock for integrals.
        kwargs.setdefault("monotonic", kwargs["timestamp"])
        kwargs["gpus"] = [GpuSample.from_dict(g) for g in kwargs.get("gpus") or []]
        kwargs["system"] = SystemSample.from_dict(kwargs.get("system") or {})
        kwargs["torch"] = TorchSample.from_dict(kwargs.get("torch") or {})
        return cls(**kwargs)
