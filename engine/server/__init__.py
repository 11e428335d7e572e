"""The engine server: runs sampling jobs for remote clients over HTTP(S) (FastAPI).

Protocol (JSON unless noted; every route, the schema included, under the bearer token when the server
has one: ``Authorization: Bearer <token>``, the scheme in any case; encodings in :mod:`engine.wire`):

* ``GET /openapi.json`` -> the OpenAPI schema, with the bearer ``securitySchemes`` (no ``/docs``: see
  :mod:`engine.server.routes.schema`).
* ``GET /info`` -> backend info; ``GET /models`` -> model specs; ``GET /metrics`` -> a telemetry sample.
* ``POST /jobs`` with a ``SamplingRequest`` as JSON (described in the OpenAPI schema as ``JobRequest``)
  -> ``{"id": ...}``. ``model`` must be one of the server's registered model ids (never a path). Jobs run
  ``max_concurrent_jobs`` at a time (one device: 1); at most ``max_queued_jobs`` wait, of them at most
  ``max_queued_per_client`` of one client, in turn by client; beyond that the answer is 429 with a
  ``Retry-After`` of when a place frees, estimated from the median time of recent jobs (``jobs``).
* ``GET /jobs/{id}/events?since=N`` -> newline-delimited JSON events from index N (see ``engine.wire``).
  Every stream ends: at the job's terminal event, at once when a finished job has nothing after N, or
  after ``stream_idle_s`` without an event (a ``reconnect`` event says where to resume). Quiet streams
  get a ``keepalive`` line every ``keepalive_s``; a ``notice`` event says something (the server is
  shutting down) without ending the job; a waiting job gets a ``queued`` event with its place and wait
  whenever its place changes. Streams are async: open streams hold no threads.
* ``GET /jobs/{id}/volumes`` -> the result volumes as a ``.npy`` file (application/octet-stream).
* ``DELETE /jobs/{id}`` -> cancel and forget the job (later requests for it get 404); a queued job ends at
  once, a running one at its next step boundary (open streams still get its ``cancelled`` event).

A job belongs to the client that submitted it (its token's name, one token per client with
``--tokens-file``; its address on a server without a token): for every other client it does not exist
(404). Its result is kept until its owner has read it (then ``read_ttl_s``) or ``job_ttl_s`` passes;
other clients' jobs never push it out.

Abuse limits: the token is checked on the headers, before the body is read or the request counts as in
flight (:class:`engine.server.middleware.RequestGate`); heads over 16 kB get 400; request bodies over
``max_body_bytes`` get 413 before they are parsed; every malformed body gets a 4xx; connections that send
nothing or send slowly are closed and cannot crowd out real requests (:mod:`engine.server.connections`);
wrong tokens are answered ever more slowly per address after ``auth_free_failures``, waiting outside the
in-flight count and capped per address and overall; error messages are short and never echo a request
back. On SIGTERM queued jobs end at once and a running one after ``shutdown_grace_s``
(:mod:`engine.server.serving`).

Modules: ``app`` (``create_app``, which assembles the rest), ``schemas`` (bodies and ``Refused``),
``jobs`` (the queue), ``auth`` (tokens and the token gate), ``middleware`` (the request gate and the body limit),
``connections`` (socket and in-flight limits, uvicorn's options), ``limits`` (``ServerLimits``),
``serving`` (uvicorn's server with the bounded shutdown),
``allowed_models``, ``refusals`` (error answers), ``routes/`` (one module per route group) and ``tls``
(network binds and certificates). The public names below are importable from ``engine.server``. The
long schemathesis run is ``python -m tests.engine.fuzz_server``.
"""

from engine.server.allowed_models import check_model, registered_model_ids, registered_sources
from engine.server.app import create_app
from engine.server.auth import (
    MIN_TOKEN_BITS,
    MIN_TOKEN_CHARS,
    TOKEN_BYTES,
    TokenGate,
    check_token,
    new_token,
    token_strength_bits,
)
from engine.server.connections import ConnectionLimits, InFlightLimit, uvicorn_options
from engine.server.jobs import Job, JobManager, QueueFull
from engine.server.limits import ServerLimits
from engine.server.middleware import BodyLimit
from engine.server.schemas import (
    CancelBody,
    ErrorBody,
    InfoBody,
    JobCreated,
    JobRequest,
    OptimizationBody,
    PlanRequest,
    Refused,
)
from engine.server.tls import (
    certificate_file_fingerprint,
    check_bind,
    default_tls_dir,
    self_signed_certificate,
)

__all__ = [
    "MIN_TOKEN_BITS",
    "MIN_TOKEN_CHARS",
    "TOKEN_BYTES",
    "BodyLimit",
    "CancelBody",
    "ConnectionLimits",
    "ErrorBody",
    "InFlightLimit",
    "InfoBody",
    "Job",
    "JobCreated",
    "JobManager",
    "JobRequest",
    "OptimizationBody",
    "PlanRequest",
    "QueueFull",
    "Refused",
    "ServerLimits",
    "TokenGate",
    "certificate_file_fingerprint",
    "check_bind",
    "check_model",
    "check_token",
    "create_app",
    "default_tls_dir",
    "new_token",
    "registered_model_ids",
    "registered_sources",
    "self_signed_certificate",
    "token_strength_bits",
    "uvicorn_options",
]
