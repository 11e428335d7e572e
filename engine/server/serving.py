"""Running the engine server: uvicorn's server with a bounded, told shutdown.

uvicorn alone, on SIGTERM or SIGINT, stops accepting and then waits for every open request, so a running
job's event stream keeps it up until the job ends (minutes; unbounded for a long job), and the client
of a queued job learns nothing until then. :class:`EngineServer` ends the jobs first
(``JobManager.shutdown``): queued jobs end at once with a "shutting down" error on their streams, a
running job's client is told at once (a ``notice`` event) and its job is cancelled, with that error,
``shutdown_grace_s`` later unless it finished; uvicorn's own graceful timeout is set a few seconds past
the grace, so nothing holds the exit longer.
"""

from __future__ import annotations

import math

import uvicorn

#: Seconds past the grace that uvicorn waits for the last responses (the error lines) to go out.
EXIT_MARGIN_S = 5


class EngineServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose shutdown first ends the app's jobs (``app.state.manager``)."""

    def __init__(self, config: uvicorn.Config, manager, grace_s: float) -> None:
        super().__init__(config)
        self.manager = manager
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        self.manager.shutdown(self.grace_s)
        await super().shutdown(sockets)


def serve(app, **options) -> None:
    """Run ``app`` (from ``create_app``) until SIGTERM/SIGINT; ``options`` go to ``uvicorn.Config``."""
    grace_s = app.state.limits.shutdown_grace_s
    options.setdefault("timeout_graceful_shutdown", math.ceil(grace_s) + EXIT_MARGIN_S)
    EngineServer(uvicorn.Config(app, **options), app.state.manager, grace_s).run()
