"""``create_app``: the engine server's FastAPI application, assembled from the pieces of this package.

The job queue (:mod:`.jobs`); outermost the request gate (:mod:`.middleware`: header size and token, on
the headers alone), inside it the in-flight request limit (:mod:`.connections`), inside that the body
limit (:mod:`.middleware`); the error answers (:mod:`.refusals`) and the routes (:mod:`.routes`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI

from engine.server.auth import TokenGate
from engine.server.connections import InFlightLimit
from engine.server.jobs import JobManager
from engine.server.limits import ServerLimits
from engine.server.middleware import BodyLimit, RequestGate
from engine.server.refusals import add_error_handlers
from engine.server.routes.about import add_about_routes
from engine.server.routes.jobs import add_job_routes
from engine.server.routes.plan import add_plan_route
from engine.server.routes.schema import add_schema_routes


def create_app(
    backend=None,
    token: str | Mapping[str, str] | None = None,
    metrics_source=None,
    limits: ServerLimits | None = None,
):
    """Build the FastAPI application. ``backend`` defaults to a LocalBackend on the best device.

    ``token`` is the one token of the server, or client names -> tokens: each client sees and cancels
    only its own jobs and has its own share of the queue. With no token the client is the address.

    ``app.state`` holds the ``manager`` (``JobManager``), the ``gate`` (``TokenGate``), the open
    ``streams`` counts and the ``limits``, for ``volsynth serve``, the fuzzer and tests.
    """
    if backend is None:
        from engine.backends import make_backend

        backend = make_backend("auto")
    limits = limits or ServerLimits()
    manager = JobManager(backend, limits)
    gate = TokenGate(
        token,
        limits.auth_free_failures,
        limits.auth_base_delay_s,
        limits.auth_max_delay_s,
        limits.auth_max_waiting,
        limits.auth_max_waiting_total,
    )
    streams = {"open": 0, "peak": 0, "opened": 0}

    app = FastAPI(
        title="VolSynth engine server",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by routes.schema, behind the token like every other route
    )
    app.state.manager = manager
    app.state.gate = gate
    app.state.streams = streams
    app.state.limits = limits
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(
        InFlightLimit,
        limit=limits.connections.max_in_flight_requests,
        clients=len(gate.tokens) or 1,
        per_address=limits.connections.max_in_flight_per_address,
        retry_after_s=manager.next_end_s,
    )
    # outermost: no body is read and no in-flight slot is taken before the token is right
    app.add_middleware(RequestGate, gate=gate, max_header_bytes=limits.connections.max_header_bytes)
    add_error_handlers(app)
    add_schema_routes(app, backend, secured=bool(gate.tokens))
    add_about_routes(app, backend, metrics_source)
    add_plan_route(app, backend)
    add_job_routes(app, manager, limits, streams, clients=len(gate.tokens) or 1)
    return app
