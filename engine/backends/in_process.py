"""The sample body and one-model cache shared by the backends that run in this process (torch, XLA).

Both backends do the same run: find the model, resolve the request once (bad input fails before the
expensive load), refuse what they cannot do, load the model through a one-model cache, run the one
sampling loop (:func:`engine.sampling.denoise`) with the request already resolved, and wrap what it made
with timings and provenance. They differ only in the hooks below: what they refuse, how a loaded model is
prepared, which device the loop and the memory reading use, and what they add to provenance.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from engine.api import Progress, SamplingRequest, SamplingResult
from engine.backends.provenance import run_provenance


class OneModelCache:
    """The most recently used model, built once per model folder; one resident at a time (3D U-Nets are large).

    Guarded by a lock so ``info()`` and a run can use the backend from different threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, Any] = {}  # model folder -> the backend's loaded model

    def get(self, source, build: Callable[[Any], Any]) -> Any:
        key = str(source.path.resolve())
        with self._lock:
            model = self._models.get(key)
            if model is None:
                model = build(source)
                self._models.clear()
                self._models[key] = model
            return model


class InProcessBackend:
    """A backend whose networks run in this process. Subclasses set ``name`` and ``registry`` and fill in
    the hooks; ``sample`` is the one body they share. Each hook gets ``run``, a dict that lives for one
    ``sample`` call, for what one hook hands to a later one. Not thread-safe for concurrent ``sample`` calls
    on one instance (the app runs one job at a time)."""

    name = ""
    registry: Any

    def __init__(self) -> None:
        self._models = OneModelCache()

    # -- hooks --------------------------------------------------------------------------------------------

    def _check(self, run: dict, source, request: SamplingRequest, resolved: SamplingRequest) -> None:
        """Refuse, before the load, what this backend cannot run."""

    def _load_message(self, spec) -> str:
        return f"loading {spec.name}"

    def _build(self, source) -> Any:
        """The model loaded from ``source`` the way this backend runs it (the cache calls this)."""
        raise NotImplementedError

    def _loaded(self, source) -> Any:
        return self._models.get(source, self._build)

    def _guard(self) -> contextlib.AbstractContextManager:
        """Around the load and the loop: turns the device's out-of-memory errors into OutOfMemory."""
        return contextlib.nullcontext()

    def _prepare_message(self, run: dict, resolved: SamplingRequest) -> str:
        """What the user reads while :meth:`_prepare` works, when that can take long ("" when it cannot)."""
        return ""

    def _prepare(self, run: dict, model, request: SamplingRequest, resolved: SamplingRequest) -> Any:
        """What the loop runs: the model with the request's settings applied (:meth:`_finish` records their
        report)."""
        return model

    def _loop_device(self):
        """The torch device the loop's noise and scheduler live on (and whose peak memory is read)."""
        raise NotImplementedError

    def _described(self) -> dict[str, Any]:
        """``device``, ``device_name`` and ``versions`` for provenance."""
        raise NotImplementedError

    def _timings(self, run: dict, load_s: float, loop_timings: dict[str, float]) -> dict[str, float]:
        return {"load_s": load_s, **loop_timings}

    def _finish(self, run: dict, prepared, provenance: dict[str, Any]) -> None:
        """Add this backend's own records to provenance (in place) once the loop is done."""

    # -- the one body ---------------------------------------------------------------------------------------

    def sample(self, request: SamplingRequest) -> Generator[Progress, None, SamplingResult]:
        from engine.machine.peak_memory import PeakMemory
        from engine.sampling import denoise, resolve_request

        started = time.perf_counter()
        run: dict[str, Any] = {}
        source = self.registry.get(request.model or None)
        # Resolved once, here: cheap things fail fast before the expensive load, and the loop gets it as is.
        resolved = resolve_request(source.spec, request)
        self._check(run, source, request, resolved[0])
        yield Progress("load", 0, 1, 0.0, self._load_message(source.spec))
        load_started = time.perf_counter()
        with self._guard():
            model = self._loaded(source)
            # The loaded model's own source where it keeps one: a MAISI checkpoint's scale_factor and build
            # notes live there.
            source = getattr(model, "source", source)
            load_s = time.perf_counter() - load_started
            message = self._prepare_message(run, resolved[0])
            if message:
                yield Progress("load", 0, 1, time.perf_counter() - started, message)
            prepared = self._prepare(run, model, request, resolved[0])
            device = self._loop_device()
            with PeakMemory(device) as peak:
                loop = yield from denoise(prepared, source.spec, request, device, resolved=resolved)
        timings = {**self._timings(run, load_s, loop.timings), "total_s": time.perf_counter() - started}
        provenance = run_provenance(
            source,
            loop,
            backend=self.name,
            **self._described(),
            optimization={"requested": request.optimization.to_dict(), "report": {}},
            timings=timings,
            memory=peak.record,
        )
        self._finish(run, prepared, provenance)
        return SamplingResult(
            volumes=loop.volumes.numpy(),
            affine=source.spec.affine(loop.request.output_size, loop.request.voxel_spacing_mm),
            request=loop.request,
            provenance=provenance,
        )
