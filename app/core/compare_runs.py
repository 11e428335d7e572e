"""What the Compare window runs, Qt-free: the comparison as a backend ``Worker.generation`` can drive (A shown
as soon as its run is done), the repeats, which choices cannot apply on a device, and the difference's window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SideReady:
    """Reported through the worker's ``progressed`` signal when A's run has finished, before B's starts."""

    side: str  # "a"
    measured: Any  # engine.compare.SideMeasurement


class _TappedBackend:
    """Passes runs through to ``backend`` and keeps each finished run's result, in order."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.results: list[Any] = []

    def __getattr__(self, name: str) -> Any:  # info() and anything else a backend has
        return getattr(self.backend, name)

    def sample(self, request):
        result = yield from self.backend.sample(request)
        self.results.append(result)
        return result


class ComparingBackend:
    """Looks like a backend to ``Worker.generation``: ``sample(request)`` runs the whole comparison.

    Besides the comparison's ``Progress`` it yields one ``SideReady`` as soon as A's run is done, so the
    window shows A while B runs.
    """

    def __init__(self, backend, a, b, labels: tuple[str, str], profile_steps: int) -> None:
        self.backend, self.a, self.b, self.labels, self.profile_steps = backend, a, b, labels, profile_steps

    def sample(self, request):
        from engine.api import relay
        from engine.compare import compare_settings, measure

        tapped = _TappedBackend(self.backend)
        job = compare_settings(
            tapped, request, self.a, self.b, self.labels, kernel_profile_steps=self.profile_steps
        )
        announced = False

        def each(progress):
            nonlocal announced
            if not announced and tapped.results:  # A finished; B has just begun
                announced = True
                yield SideReady("a", measure(self.labels[0], tapped.results[0]))
            yield progress

        return (yield from relay(job, each))


def comparing_backend(pool, device: str, a, b, labels, profile_steps) -> ComparingBackend:
    return ComparingBackend(pool.get(device), a, b, labels, profile_steps)


def repeat_job(pool, device: str, comparison, times: int):
    """Called in the worker thread: the device's backend (a local one imports torch), then the repeats."""
    from engine.compare import repeat_comparison

    return repeat_comparison(pool.get(device), comparison, times)


def difference_window(diff: np.ndarray) -> tuple[float, float]:
    """(window, level) for a B - A volume: centred on zero, wide enough for 99.9 % of the voxels."""
    spread = float(np.percentile(np.abs(diff), 99.9)) if diff.size else 0.0
    if not spread > 0:
        spread = float(np.abs(diff).max()) if diff.size else 0.0
    return max(2.0 * spread, 1e-6), 0.0


def availability(device: str, choices: dict[str, dict[str, Any]], spec=None) -> dict[str, str]:
    """For each named choice that cannot (fully) apply on ``device``: why not, in one line.

    Runs in a worker thread (``engine.optimization.apply`` imports torch). A device this machine cannot check (an
    engine server's) gives an empty answer: the server decides."""
    from engine.api.optimization_config import OptimizationConfig
    from engine.errors import EngineError
    from engine.optimization.apply import expected_report

    if device.startswith("remote:"):
        return {}
    reasons: dict[str, str] = {}
    for name, values in choices.items():
        try:
            report = expected_report(OptimizationConfig.from_dict(values), device, spec)
        except EngineError as exc:
            reasons[name] = str(exc).splitlines()[0]
            continue
        missing = [
            entry.get("reason") or f"{setting} does not apply"
            for setting, entry in report.items()
            if entry.get("requested") not in (False, None, "default") and not entry.get("applied")
        ]
        if missing:
            reasons[name] = "; ".join(missing)
    return reasons
