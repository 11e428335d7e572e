"""Helpers for tests of the job queue: a backend that holds its jobs until a test opens the gate, and a
clock for the job manager that moves only when the test moves it."""

import threading

from engine.errors import BackendUnavailable


class GatedBackend:
    """A backend whose jobs each wait for ``gate`` before it starts: jobs stay running while a
    test opens streams or fills the queue."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.registry = inner.registry
        self.gate = threading.Event()
        self.started = threading.Event()

    def info(self):
        return self.inner.info()

    def sample(self, request):
        self.started.set()
        if not self.gate.wait(120):
            raise BackendUnavailable("the test never opened the gate")
        return (yield from self.inner.sample(request))


class StoppedClock:
    """A clock for the job manager (``manager.clock``) that moves only when told (``advance``): its
    estimates are then exact numbers."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
