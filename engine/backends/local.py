"""Run requests in this process on the CPU, a CUDA GPU or Apple's MPS."""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Generator
from typing import Any

from engine.api import BackendInfo, Progress, SamplingRequest, SamplingResult
from engine.backends.provenance import machine_record, run_provenance
from engine.errors import OutOfMemory
from engine.machine.devices import device_name, resolve_device
from engine.machine.software import library_versions
from engine.models.registry import ModelRegistry


class LocalBackend:
    """Keeps the most recently used model loaded so repeated generations skip the load.

    Not thread-safe for concurrent ``sample`` calls on one instance (the app runs one job at a time);
    the model cache itself is guarded so ``info()`` can be called from another thread.
    """

    name = "local"

    def __init__(self, device: str | None = "auto", registry: ModelRegistry | None = None):
        self.device = resolve_device(device)
        self.registry = registry or ModelRegistry()
        self._lock = threading.Lock()
        self._cache: dict[str, Any] = {}  # model folder -> LoadedModel on self.device

    def info(self) -> BackendInfo:
        return BackendInfo(
            name=self.name,
            device=str(self.device),
            device_name=device_name(self.device),
            details={"platform": platform.platform(), **library_versions(), "machine": machine_record()},
        )

    def _loaded(self, source):
        key = str(source.path.resolve())
        with self._lock:
            model = self._cache.get(key)
            if model is None:
                model = source.load().to(self.device)
                self._cache.clear()  # one model resident at a time: 3D U-Nets are large
                self._cache[key] = model
            return model

    def sample(self, request: SamplingRequest) -> Generator[Progress, None, SamplingResult]:
        import torch

        from engine.machine.peak_memory import PeakMemory
        from engine.optimization.apply import check_combination, prepare
        from engine.optimization.tune_store import load_result
        from engine.sampling import denoise, resolve_request
        from engine.telemetry.kernel_profile import KernelProfiler, profiled_steps

        started = time.perf_counter()
        source = self.registry.get(request.model or None)
        # Validate cheap things before the expensive load so bad input fails fast; settings expected slower
        # than fp32 here (this machine's probe and its measurements of the model) are refused here too.
        resolved, _ = resolve_request(source.spec, request)
        measured = load_result(source.weights_sha256())
        check_combination(request.optimization, self.device, measured=measured)
        yield Progress("load", 0, 1, 0.0, f"loading {source.spec.name}")
        load_started = time.perf_counter()
        try:
            model = self._loaded(source)
            # The loaded model's own source: a MAISI checkpoint's scale_factor and build notes live there.
            source = model.source
            load_s = time.perf_counter() - load_started
            prepared = prepare(model, request.optimization, self.device, measured=measured)
            profiler = None
            if request.kernel_profile_steps:
                profiler = KernelProfiler(
                    prepared, profiled_steps(request.kernel_profile_steps, resolved.steps), self.device
                )
            with PeakMemory(self.device) as peak:
                loop = yield from denoise(profiler or prepared, source.spec, request, self.device)
        except torch.OutOfMemoryError as exc:
            raise OutOfMemory(
                f"{self.device} ran out of memory ({str(exc).splitlines()[0][:120]}); lower the batch size, "
                "enable streamed decoding or bf16, or use a device with more memory"
            ) from exc
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

        timings = {"load_s": load_s, **loop.timings, "total_s": time.perf_counter() - started}
        provenance = run_provenance(
            source,
            loop,
            backend=self.name,
            device=str(self.device),
            device_name=device_name(self.device),
            versions=library_versions(),
            optimization={"requested": request.optimization.to_dict(), "report": prepared.report},
            timings=timings,
            memory=peak.record,
        )
        if profiler is not None:
            provenance["kernel_profile"] = profiler.summary()
        return SamplingResult(
            volumes=loop.volumes.numpy(),
            affine=source.spec.affine(loop.request.output_size, loop.request.voxel_spacing_mm),
            request=loop.request,
            provenance=provenance,
        )
