"""What the Metrics dock shows: this machine's telemetry sampler (made on first need, off the start-up path),
or an engine server's metrics feed while that server is the chosen device; and where a run is marked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class MetricsSources:
    """The sampler of this machine and the remote feeds the Metrics dock switches between.

    ``remote_source_for(device)`` (set by ``follow_remote``; the engine-server feature gives it) is an engine
    server's metrics source for a ``remote:`` device, None for this machine's devices.
    """

    def __init__(self, dock, sampler=None, current_device: Callable[[], str] = lambda: "") -> None:
        self.dock = dock
        self.sampler = sampler
        self._current_device = current_device
        self._remote_source_for: Callable[[str], Any] = lambda _device: None

    def follow_remote(self, remote_source_for: Callable[[str], Any]) -> None:
        self._remote_source_for = remote_source_for

    def start(self) -> None:
        """Create (if needed) and start the sampler, and the Metrics dock's redraws. Idempotent."""
        if self.sampler is None:
            from engine.telemetry import Sampler

            self.sampler = Sampler()
            self.show(self._remote_source_for(self._current_device()))
        self.sampler.start()
        self.dock.start()

    def show(self, remote_source=None) -> None:
        """The dock shows an engine server's metrics while it is the chosen device, else this machine's."""
        source = remote_source if remote_source is not None else self.sampler
        if source is not None and source is not self.dock.source:
            self.dock.set_source(source)

    def run_source(self, device: str):
        """Start the telemetry if needed; the source a run on ``device`` is marked on."""
        self.start()
        return self._remote_source_for(device) or self.sampler

    def stop(self) -> None:
        self.dock.stop()
        if self.sampler is not None:
            self.sampler.stop()
