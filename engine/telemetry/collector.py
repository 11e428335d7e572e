"""One call that measures everything local: GPUs, CPU/RAM and the torch allocator, as one :class:`Sample`."""

from __future__ import annotations

import threading
import time
from typing import Literal

from engine.telemetry.gpu import GpuMonitor
from engine.telemetry.samples import Sample, TorchSample
from engine.telemetry.system import SystemMonitor
from engine.telemetry.torch_stats import torch_allocator_stats

TorchMode = Literal["auto", "import", "off"]


class LocalCollector:
    """Measures this machine. Used by :class:`~engine.telemetry.sampler.Sampler` and ``volsynth monitor``.

    Args:
        gpu: The GPU monitor; default a :class:`GpuMonitor` over the installed ``pynvml``.
        system: The CPU/RAM monitor; default a :class:`SystemMonitor` of this process.
        torch_mode: ``"auto"`` reads the allocator only if torch is already imported; ``"import"`` imports
            it; ``"off"`` never looks.
        source: Name written into every sample's ``source``.
    """

    def __init__(
        self,
        gpu: GpuMonitor | None = None,
        system: SystemMonitor | None = None,
        *,
        torch_mode: TorchMode = "auto",
        source: str = "local",
    ) -> None:
        self.gpu = gpu if gpu is not None else GpuMonitor()
        self.system = system if system is not None else SystemMonitor()
        self._torch_mode = torch_mode
        self._source = source
        self._lock = threading.Lock()

    def collect(self, seq: int = 0) -> Sample:
        """Measure everything once. Never raises.

        Args:
            seq: Sequence number to stamp (a buffer re-stamps it when it stores the sample).

        Returns:
            The :class:`Sample`.
        """
        with self._lock:
            timestamp, monotonic = time.time(), time.monotonic()
            gpu = self.gpu.sample()
            system = self.system.sample()
            if self._torch_mode == "off":
                torch = TorchSample(available=False, reason="torch statistics are switched off")
            else:
                torch = torch_allocator_stats(import_torch=self._torch_mode == "import")
            return Sample(
                seq=seq,
                timestamp=timestamp,
                monotonic=monotonic,
                source=self._source,
                gpu_available=gpu.available,
                gpu_reason=gpu.reason,
                driver_version=gpu.driver_version,
                gpus=gpu.gpus,
                system=system,
                torch=torch,
            )

    def close(self) -> None:
        """Release NVML. The collector initialises it again if used afterwards."""
        self.gpu.close()
