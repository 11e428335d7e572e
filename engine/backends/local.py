"""Run requests in this process on the CPU, a CUDA GPU or Apple's MPS."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from typing import Any

from engine.api import BackendInfo, SamplingRequest
from engine.backends.in_process import InProcessBackend
from engine.backends.provenance import machine_record
from engine.errors import InvalidRequest, OutOfMemory
from engine.machine.devices import device_name, resolve_device
from engine.machine.software import library_versions
from engine.models.registry import ModelRegistry


class LocalBackend(InProcessBackend):
    """Keeps the most recently used model loaded so repeated generations skip the load.

    Not thread-safe for concurrent ``sample`` calls on one instance (the app runs one job at a time);
    the model cache itself is guarded so ``info()`` can be called from another thread. The run itself is
    :meth:`InProcessBackend.sample`, shared with the XLA backend; this class fills in the torch parts.
    """

    name = "local"

    def __init__(self, device: str | None = "auto", registry: ModelRegistry | None = None):
        super().__init__()
        self.device = resolve_device(device)
        self.registry = registry or ModelRegistry()

    def info(self) -> BackendInfo:
        return BackendInfo(
            name=self.name,
            device=str(self.device),
            device_name=device_name(self.device),
            details={"platform": platform.platform(), **library_versions(), "machine": machine_record()},
        )

    def _build(self, source):
        return source.load().to(self.device)

    def _check(self, run: dict, source, request: SamplingRequest, resolved: SamplingRequest) -> None:
        from engine.optimization.apply import check_combination
        from engine.optimization.tune_store import load_result

        if request.xla_plan:
            raise InvalidRequest(
                f"xla_plan {request.xla_plan!r} splits a run over an XLA server's devices; this is the "
                f"{self.device} torch backend. Clear it, or connect to an XLA engine server."
            )
        # Settings expected slower than fp32 here (this machine's probe and its measurements of the model)
        # are refused before the load too.
        run["measured"] = load_result(source.weights_sha256())
        run["verdict"] = check_combination(request.optimization, self.device, measured=run["measured"])

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        import torch

        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise OutOfMemory(
                f"{self.device} ran out of memory ({str(exc).splitlines()[0][:120]}); lower the batch size, "
                "enable streamed decoding or bf16, or use a device with more memory"
            ) from exc
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _prepare(self, run: dict, model, request: SamplingRequest, resolved: SamplingRequest):
        from engine.optimization.apply import prepare
        from engine.telemetry.kernel_profile import KernelProfiler, profiled_steps

        prepared = prepare(model, request.optimization, self.device, verdict=run["verdict"])
        run["prepared"] = prepared
        if not request.kernel_profile_steps:
            return prepared
        run["profiler"] = KernelProfiler(
            prepared, profiled_steps(request.kernel_profile_steps, resolved.steps), self.device
        )
        return run["profiler"]

    def _loop_device(self):
        return self.device

    def _described(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "device_name": device_name(self.device),
            "versions": library_versions(),
        }

    def _finish(self, run: dict, prepared, provenance: dict[str, Any]) -> None:
        # The report as the run left it (a compilation that failed at its first call ran eager).
        provenance["optimization"]["report"] = run["prepared"].report
        if "profiler" in run:
            provenance["kernel_profile"] = run["profiler"].summary()
