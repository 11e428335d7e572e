"""A backend whose first denoising step does not end until the test lets it: a stuck run to cancel."""

from __future__ import annotations

import threading

import numpy as np

from engine.api import BackendInfo, Progress, SamplingResult

LOAD_MESSAGE = "loading the stuck test model"
DENOISE_MESSAGE = "denoising"


class StuckBackend:
    """``sample`` reports load and the start of denoising, then blocks in step 1 until ``release`` is set
    (or ``limit_s`` passes, so a failed test cannot leave a thread behind for ever)."""

    name = "stuck"

    def __init__(self, registry=None, limit_s: float = 300.0) -> None:
        self.registry = registry  # the models an engine server over this backend lists and accepts
        self.entered = threading.Event()  # set once the run is inside the step that does not end
        self.release = threading.Event()
        self.limit_s = limit_s
        self.finished_steps = 0

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, "cpu", "stuck test backend")

    def sample(self, request):
        yield Progress("load", 0, 1, 0.0, LOAD_MESSAGE)
        yield Progress("denoise", 0, request.steps, 0.01, DENOISE_MESSAGE)
        self.entered.set()
        self.release.wait(self.limit_s)
        self.finished_steps += 1
        yield Progress("denoise", 1, request.steps, 0.02, f"step 1/{request.steps}")
        volumes = np.zeros((request.batch_size, 1, 4, 4, 4), np.float32)
        return SamplingResult(
            volumes, np.eye(4), request, {"model": {"id": request.model}, "backend": "stuck"}
        )
