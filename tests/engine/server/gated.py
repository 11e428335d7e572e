"""A backend that holds its jobs until a test opens the gate."""

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
