"""Running the engine server: uvicorn's server with a bounded, told shutdown.

uvicorn alone, on SIGTERM or SIGINT, stops accepting and then waits for every open request, so a running
job's event stream keeps it up until the job ends (minutes; unbounded for a long job), and the client
of a queued job learns nothing until then. :class:`EngineServer` ends the jobs first
(``JobManager.shutdown``): queued jobs end at once with a "shutting down" error on their streams, a
running job's client is told at once (a ``notice`` event) and its job is cancelled, with that error,
``shutdown_grace_s`` later unless it finished; uvicorn's own graceful timeout is set a few seconds past
the grace, so nothing holds the exit longer.

Ctrl-C (SIGINT) ends it the same way as SIGTERM. uvicorn re-raises the signal once it has shut down; for
SIGINT that was Python's ``KeyboardInterrupt``, which unwound into interpreter finalisation while torch's
threads were still alive (``terminate called without an active exception``, exit -6). So SIGINT gets the
default disposition while the server runs, and the process ends by the signal, like SIGTERM (exit -2, 130
in a shell), after the same bounded shutdown. A second Ctrl-C or SIGTERM does not cut the streams (uvicorn's
``force_exit``): it ends the grace at once, so running jobs are cancelled now and every client still gets
its final ``error`` event.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading

import uvicorn

from engine.server.connections import GuardedServer

#: Seconds past the grace that uvicorn waits for the last responses (the error lines) to go out.
EXIT_MARGIN_S = 5

log = logging.getLogger("uvicorn.error")


class EngineServer(GuardedServer):
    """A ``uvicorn.Server`` whose shutdown first ends the app's jobs (``app.state.manager``)."""

    def __init__(
        self, config: uvicorn.Config, manager, grace_s: float, handshake_timeout_s: float = 10.0
    ) -> None:
        super().__init__(config)
        self.manager = manager
        self.grace_s = grace_s
        self.handshake_timeout_s = handshake_timeout_s

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            super().handle_exit(sig, frame)
            return
        # Already shutting down: never uvicorn's force_exit (it cuts event streams without their last
        # line); end the grace now instead. Runs in the signal handler: only sets flags and events.
        self._captured_signals.append(sig)
        if self.manager.end_grace_now():
            log.info("Shutting down now: running jobs are cancelled without waiting for the grace")

    async def shutdown(self, sockets=None) -> None:
        self.manager.shutdown(self.grace_s)
        await super().shutdown(sockets)


def raise_file_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (systemd's default soft limit is
    1024 with a hard limit far above); returns (soft, hard) as they are now. Not on Windows: (0, 0)."""
    try:
        import resource
    except ImportError:
        return 0, 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft, hard


def files_open() -> int:
    """How many files this process has open now (0 where the system does not say)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


def serve(app, **options) -> None:
    """Run ``app`` (from ``create_app``) until SIGTERM/SIGINT; ``options`` go to ``uvicorn.Config``."""
    grace_s = app.state.limits.shutdown_grace_s
    options.setdefault("timeout_graceful_shutdown", math.ceil(grace_s) + EXIT_MARGIN_S)
    server = EngineServer(
        uvicorn.Config(app, **options),
        app.state.manager,
        grace_s,
        handshake_timeout_s=app.state.limits.connections.header_timeout_s,
    )
    if threading.current_thread() is threading.main_thread():
        # uvicorn restores the handler it found and re-raises the signal after its shutdown: with the
        # default disposition, SIGINT then ends the process as SIGTERM does, with no KeyboardInterrupt
        # unwinding through half-stopped threads. Before run() and after it, Ctrl-C ends it at once.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    server.run()
