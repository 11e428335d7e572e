"""The engine server: runs sampling jobs for remote clients over HTTP(S) (FastAPI).

Protocol (JSON unless noted; every route, the schema and ``/docs`` included, under the bearer token when
the server has one; encodings in :mod:`engine.wire`):

* ``GET /info`` -> backend info; ``GET /models`` -> model specs; ``GET /metrics`` -> a telemetry sample.
* ``POST /jobs`` with a ``SamplingRequest`` as JSON (described in the OpenAPI schema as ``JobRequest``)
  -> ``{"id": ...}``. ``model`` must be one of the server's registered model ids (never a path). Jobs run
  ``max_concurrent_jobs`` at a time (one device: 1); at most ``max_queued_jobs`` wait, beyond that the
  answer is 429 with ``Retry-After``.
* ``GET /jobs/{id}/events?since=N`` -> newline-delimited JSON events from index N (see ``engine.wire``).
  Every stream ends: at the job's terminal event, at once when a finished job has nothing after N, or
  after ``stream_idle_s`` without an event (a ``reconnect`` event says where to resume). Quiet streams
  get a ``keepalive`` line every ``keepalive_s``. Streams are async: open streams hold no threads.
* ``GET /jobs/{id}/volumes`` -> the result volumes as a ``.npy`` file (application/octet-stream).
* ``DELETE /jobs/{id}`` -> cancel and forget the job (later requests for it get 404); a queued job ends at
  once, a running one at its next step boundary (open streams still get its ``cancelled`` event).

Abuse limits: request bodies over ``max_body_bytes`` get 413 before they are parsed; every malformed body
gets a 4xx; connections that send nothing or send slowly are closed and cannot crowd out real requests
(:mod:`engine.server_connections`); wrong tokens from one client are answered ever more slowly after ``auth_free_failures``;
error messages are short and never echo a request back. Volumes leave the server only to the client that
asked for them; finished jobs are dropped after ``job_ttl_s`` or when more than ``finished_jobs_kept``
are held.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hmac
import ipaddress
import math
import os
import secrets
import ssl
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    create_model,
)

from engine import wire
from engine.api import (
    MAX_BATCH,
    MAX_EDGE,
    MAX_PROFILED_STEPS,
    MAX_STEPS,
    SamplingRequest,
    optimization_config,
    run,
)
from engine.errors import BackendUnavailable, EngineError, InvalidRequest, ModelNotFound
from engine.server_connections import ConnectionLimits, InFlightLimit
from engine.xla.planning import DEFAULT_COMPILE_TOP, MAX_COMPILE_TOP

TOKEN_BYTES = 32
MIN_TOKEN_CHARS = 43  # len(secrets.token_urlsafe(32)): 32 random bytes in URL-safe base64
MIN_TOKEN_BITS = 128  # estimated guessing entropy a token must have (a new token has ~256)


@dataclass(frozen=True)
class ServerLimits:
    """What one client may take from the server. The defaults suit one device and a few users."""

    max_concurrent_jobs: int = 1  # jobs running at once (one device: one)
    max_queued_jobs: int = 8  # jobs waiting to run; one more is answered 429
    max_body_bytes: int = 64 * 1024  # a request is < 2 kB; 413 beyond this, before parsing
    max_streams: int = 256  # open event streams; one more is answered 429
    keepalive_s: float = 15.0  # a quiet stream gets a keepalive line this often
    stream_idle_s: float = 120.0  # ... and ends (``reconnect``) after this long without an event
    finished_jobs_kept: int = 16  # finished jobs (with their volumes) held for their clients
    job_ttl_s: float = 15 * 60.0  # ... for at most this long
    auth_free_failures: int = 3  # wrong tokens per client answered at once; later ones wait
    auth_base_delay_s: float = 0.25  # the first wait; it doubles with every further failure
    auth_max_delay_s: float = 10.0  # ... up to this
    auth_max_waiting: int = 16  # wrong guesses of one client waiting their turn; more are answered 429
    # sockets and request deadlines (idle and slow-header connections), see engine.server_connections
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


# -- request bodies as the OpenAPI schema describes them ---------------------------------------------------


def _real_number(value: Any) -> Any:
    """JSON Schema's number: never true or "1.5" (pydantic's lax float would take both)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a number is needed")
    return value


def _finite(**constraints):
    return Annotated[float, Field(allow_inf_nan=False, **constraints), BeforeValidator(_real_number)]


def _whole_number(value: Any) -> int:
    """JSON Schema's integer: 4 and 4.0, never true, "4" or 4.5."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a whole number is needed")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("a whole number is needed")
        return int(value)
    return value


def _whole(**constraints):
    return Annotated[int, Field(**constraints), BeforeValidator(_whole_number)]


# The choices of OptimizationConfig's text settings, by field (constants of engine.api.optimization_config).
_CHOICES = {
    "autocast": "AUTOCAST_DTYPES",
    "quantization": "QUANTIZATION_MODES",
    "compile_mode": "COMPILE_MODES",
    "attention": "ATTENTION_KERNELS",
    "decoder_autocast": "DECODER_AUTOCAST_DTYPES",
    "decoder_quantization": "DECODER_QUANTIZATION_MODES",
}


def _optimization_field(name: str, default: Any) -> tuple[Any, Any]:
    """The pydantic type of one ``OptimizationConfig`` field, from its default and its choices."""
    if isinstance(default, bool):
        return StrictBool, default
    if isinstance(default, int | float):
        return (_finite(ge=10.0, le=150.0) if name.endswith("psnr_budget_db") else _finite()), default
    choices = getattr(optimization_config, _CHOICES.get(name, ""), None)
    if choices:
        named = tuple(c for c in choices if c is not None)
        kind = Literal[named]  # type: ignore[valid-type]
        return (kind | None if None in choices else kind), default
    return Annotated[str, StringConstraints(max_length=64)] | None, default


def _incompatible(fields) -> dict[str, Any]:
    """The combinations OptimizationConfig refuses on every device, stated in the schema too."""
    quantized = {"enum": ["int8", "mixed"]}
    cases = [
        {
            "required": ["quantization", "autocast"],
            "properties": {"quantization": quantized, "autocast": {"const": "fp16"}},
        },
        {
            "required": ["quantization", "compile_mode"],
            "properties": {"quantization": quantized, "compile_mode": {"type": "string"}},
        },
        {
            "required": ["cuda_graphs", "compile_mode"],
            "properties": {
                "cuda_graphs": {"const": True},
                "compile_mode": {"enum": ["reduce-overhead", "max-autotune"]},
            },
        },
    ]
    if {"decoder_quantization", "decoder_autocast"} <= set(fields):
        cases += [
            {
                "required": ["decoder_quantization", "decoder_autocast"],
                "properties": {
                    "decoder_quantization": {"type": "string"},
                    "decoder_autocast": {"const": "fp16"},
                },
            },
            {
                "required": ["decoder_quantization", "autocast"],
                "properties": {
                    "decoder_quantization": {"type": "string"},
                    "autocast": {"const": "fp16"},
                    "decoder_autocast": {"type": "null"},
                },
            },
        ]
    return {"not": {"anyOf": cases}}


# ``OptimizationConfig`` on the wire, made from its fields so that a new setting is on the wire at once.
_OPTIMIZATION_FIELDS = {
    f.name: _optimization_field(f.name, f.default)
    for f in dataclasses.fields(optimization_config.OptimizationConfig)
}
OptimizationBody = create_model(
    "OptimizationBody",
    __config__=ConfigDict(extra="forbid", json_schema_extra=_incompatible(_OPTIMIZATION_FIELDS)),
    __doc__="``OptimizationConfig`` on the wire (engine.api.optimization_config).",
    **_OPTIMIZATION_FIELDS,
)


ConditionName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class JobRequest(BaseModel):
    """``SamplingRequest`` on the wire (engine.api); ``model`` is one of the server's model ids."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: Annotated[str, StringConstraints(max_length=128)] = ""
    sampler: Literal["", "ddpm", "ddim", "pndm", "rflow"] = ""
    steps: _whole(ge=0, le=MAX_STEPS) = 0
    seed: _whole(ge=0, lt=2**63) = 0
    conditioning: Annotated[dict[ConditionName, _finite()], Field(max_length=32)] = Field(
        default_factory=dict
    )
    guidance_scale: _finite(ge=0.0) | None = None
    batch_size: _whole(ge=1, le=MAX_BATCH) = 1
    optimization: OptimizationBody = Field(default_factory=OptimizationBody)
    preview_interval: _whole(ge=0, le=MAX_STEPS) = 0
    kernel_profile_steps: _whole(ge=0, le=MAX_PROFILED_STEPS) = 0
    # What the output is, for models that let a request choose (engine.models.output_geometry).
    modality: Annotated[str, StringConstraints(pattern=r"^([a-z0-9][a-z0-9-]{0,39})?$")] = ""
    output_size: Annotated[list[_whole(ge=1, le=MAX_EDGE)], Field(min_length=3, max_length=3)] | None = None
    voxel_spacing_mm: Annotated[list[_finite(gt=0.0)], Field(min_length=3, max_length=3)] | None = None


class ErrorBody(BaseModel):
    detail: str
    error_class: str = "EngineError"


class PlanRequest(BaseModel):
    """``POST /plan``: plan one denoising step of a model on a topology (engine.xla.planning)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: Annotated[str, StringConstraints(max_length=128)] = ""
    topology: Annotated[
        str,
        StringConstraints(
            pattern=r"^(v5e:\d{1,2}x\d{1,2}|v5p:\d{1,2}x\d{1,2}x\d{1,2}|\dxH100-(nvlink|pcie))$"
        ),
    ]
    batch: _whole(ge=1, le=MAX_BATCH) = 1
    cfg: bool = True
    compile_top: _whole(ge=1, le=MAX_COMPILE_TOP) = DEFAULT_COMPILE_TOP


class InfoBody(BaseModel):
    name: str
    device: str
    device_name: str
    details: dict[str, Any]


class JobCreated(BaseModel):
    id: str


class CancelBody(BaseModel):
    status: str


JobId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$", description="a job id from POST /jobs")]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "the body is not parseable JSON"),
        (401, "missing or wrong token"),
        (413, "request body too large"),
        (422, "malformed request"),
        (429, "too many jobs or streams; see Retry-After"),
    )
}
NOT_FOUND = {404: {"model": ErrorBody, "description": "no such job (it may have expired)"}}


class Refused(HTTPException):
    """An HTTP refusal with an engine error class, answered as ``ErrorBody``."""

    def __init__(self, status: int, message: str, error_class: str = "EngineError", headers=None):
        super().__init__(status_code=status, detail=wire.short(message), headers=headers)
        self.error_class = error_class


# -- jobs ---------------------------------------------------------------------------------------------------


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Job:
    id: str
    request: SamplingRequest
    events: list[dict[str, Any]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    volumes: np.ndarray | None = None
    finished_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _watchers: set = field(default_factory=set, repr=False)  # (event loop, asyncio.Event) of open streams
    _last_preview: int | None = field(default=None, repr=False)

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            if self.done:
                return  # one terminal event per job
            if "preview" in event:
                # Keep only the newest preview: a long run with previews must not grow without bound.
                if self._last_preview is not None:
                    self.events[self._last_preview] = {
                        k: v for k, v in self.events[self._last_preview].items() if k != "preview"
                    }
                self._last_preview = len(self.events)
            self.events.append(event)
            if event["type"] in wire.TERMINAL:
                self.finished_at = time.monotonic()
            watchers = list(self._watchers)
        for loop, wake in watchers:
            with contextlib.suppress(RuntimeError):  # that stream's loop has closed
                loop.call_soon_threadsafe(wake.set)

    def watch(self, loop, wake) -> None:
        with self._lock:
            self._watchers.add((loop, wake))

    def unwatch(self, loop, wake) -> None:
        with self._lock:
            self._watchers.discard((loop, wake))

    def events_since(self, index: int) -> tuple[list[dict[str, Any]], bool]:
        with self._lock:
            return self.events[index:], self.done

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1]["type"] in wire.TERMINAL


class JobManager:
    """Runs jobs on one backend: at most ``max_concurrent_jobs`` at once, at most ``max_queued_jobs`` waiting.

    Worker threads start when work arrives and end when the queue is empty, so an idle server holds none.
    """

    def __init__(self, backend, limits: ServerLimits | None = None):
        self.backend = backend
        self.limits = limits or ServerLimits()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self._pending: deque[Job] = deque()
        self._lock = threading.Lock()
        self._workers = 0
        self._durations: deque[float] = deque(maxlen=20)

    @property
    def queued(self) -> int:
        return len(self._pending)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def submit(self, request: SamplingRequest) -> Job:
        """Queue a job; ``QueueFull`` when ``max_queued_jobs`` already wait."""
        with self._lock:
            self._expire()
            if len(self._pending) >= self.limits.max_queued_jobs:
                raise QueueFull(self._retry_after_s())
            job = Job(id=uuid.uuid4().hex, request=request)
            job.emit(wire.queued_event())
            self.jobs[job.id] = job
            self._pending.append(job)
            start = self._workers < self.limits.max_concurrent_jobs
            if start:
                self._workers += 1
        if start:
            threading.Thread(target=self._work, name="engine-job-worker", daemon=True).start()
        return job

    def cancel(self, job: Job) -> None:
        """Cancel and forget a job: its volumes are freed and later requests for it get 404."""
        job.cancel.set()
        with self._lock:
            waiting = job in self._pending
            if waiting:
                self._pending.remove(job)
            self.jobs.pop(job.id, None)
        if waiting:
            job.emit(wire.cancelled_event())

    def _retry_after_s(self) -> int:
        per_job = sum(self._durations) / len(self._durations) if self._durations else 5.0
        estimate = per_job * (len(self._pending) + 1) / max(1, self.limits.max_concurrent_jobs)
        return int(min(600, max(1, round(estimate))))

    def _expire(self) -> None:
        now = time.monotonic()
        finished = [j for j in self.jobs.values() if j.finished_at is not None]
        for job in finished:
            if now - job.finished_at > self.limits.job_ttl_s:
                del self.jobs[job.id]
        finished = [j for j in self.jobs.values() if j.finished_at is not None]
        for job in finished[: max(0, len(finished) - self.limits.finished_jobs_kept)]:
            del self.jobs[job.id]  # oldest first: their volumes are freed

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._workers -= 1
                    return
                job = self._pending.popleft()
            started = time.monotonic()
            try:
                self._run(job)
            except BaseException as exc:  # noqa: BLE001 - a worker reports and goes on
                job.emit(wire.error_event(exc))
            finally:
                if not job.done:
                    job.emit(wire.error_event(EngineError("the job ended without a result")))
                self._durations.append(time.monotonic() - started)

    def _run(self, job: Job) -> None:
        if job.cancel.is_set():
            job.emit(wire.cancelled_event())
            return
        try:
            # run() closes the generator in this (the iterating) thread, as the Backend contract asks.
            result = run(
                self.backend.sample(job.request),
                on_progress=lambda progress: job.emit(wire.progress_event(progress)),
                should_cancel=job.cancel.is_set,
            )
        except Exception as exc:  # a server must report, not die; the client shows the message
            job.emit(wire.error_event(exc))
            return
        if result is None:
            job.emit(wire.cancelled_event())
            return
        job.volumes = result.volumes
        job.emit(wire.result_event(result))


# -- the token gate --------------------------------------------------------------------------------------


class TokenGate:
    """Checks the bearer token; wrong tokens from one client are answered ever more slowly, one at a time.

    The first ``free_failures`` failures of a client (by address) are answered at once, then each waits
    twice as long as the one before (from ``base_delay_s``) up to ``max_delay_s``; a right token resets the
    count. Wrong guesses of one client wait *in turn* (an ``asyncio.Lock`` per address), so guesses sent in
    parallel get no more answers per second than guesses sent one after another. While ``max_waiting``
    wrong guesses of a client are waiting, its further requests are answered 429 before their token is
    looked at (a verdict given at once would undo the waiting; a queue without bound would hold a
    connection per guess). The waits are ``asyncio.sleep``: waiting clients hold no threads.
    """

    MAX_CLIENTS = 4096  # failure counts kept (oldest dropped first)

    def __init__(
        self,
        token: str | None,
        free_failures: int = 3,
        base_delay_s: float = 0.25,
        max_delay_s: float = 10.0,
        max_waiting: int = 16,
    ) -> None:
        self.token = token
        self.free_failures = free_failures
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.max_waiting = max_waiting
        self.failures: OrderedDict[str, int] = OrderedDict()
        self.total_failures = 0
        self.delays: deque[float] = deque(maxlen=64)  # the waits imposed, newest last
        self.answered: deque[tuple[float, float]] = deque(maxlen=256)  # (wait start, answer) per wrong guess
        self.refused_busy = 0
        self._turns: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}

    def delay_for(self, failures: int) -> float:
        over = failures - self.free_failures
        return 0.0 if over <= 0 else min(self.max_delay_s, self.base_delay_s * 2 ** min(over - 1, 16))

    async def __call__(self, request: Request) -> None:
        if not self.token:
            return
        client = request.client.host if request.client else "?"
        if self._waiting.get(client, 0) >= self.max_waiting:
            self.refused_busy += 1
            raise Refused(
                429,
                "too many wrong tokens from this address are waiting to be answered; try again later",
                "BackendUnavailable",
                headers={"Retry-After": str(max(1, math.ceil(self.max_delay_s)))},
            )
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode("utf-8", "replace"), f"Bearer {self.token}".encode()):
            self.failures.pop(client, None)
            return
        self._waiting[client] = self._waiting.get(client, 0) + 1
        turn = self._turns.setdefault(client, asyncio.Lock())
        try:
            async with turn:  # one wrong guess of this client at a time: its wait counts from its turn
                count = self.failures.pop(client, 0) + 1
                self.failures[client] = count
                while len(self.failures) > self.MAX_CLIENTS:
                    self.failures.popitem(last=False)
                self.total_failures += 1
                delay = self.delay_for(count)
                self.delays.append(delay)
                started = time.monotonic()
                if delay:
                    await asyncio.sleep(delay)
                self.answered.append((started, time.monotonic()))
        finally:
            self._waiting[client] -= 1
            if not self._waiting[client]:
                del self._waiting[client]
                self._turns.pop(client, None)
        raise Refused(
            401,
            "missing or wrong token; pass the server's token (--token)",
            "BackendUnavailable",
            headers={"WWW-Authenticate": "Bearer"},
        )


# -- request body limit ------------------------------------------------------------------------------------


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is answered 413 before anything parses it.

    Bodies are small (a request is < 2 kB), so the body is read here, up to the limit, and replayed.
    """

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        response = JSONResponse(
            wire.error_body(f"the request body is over {self.limit} bytes", "InvalidRequest"),
            status_code=413,
            headers={"Connection": "close"},
        )
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


# -- the application ---------------------------------------------------------------------------------------


def registered_sources(backend) -> list | None:
    """The backend's registered models (``ModelSource``), or None when it has no registry to ask."""
    registry = getattr(backend, "registry", None)
    if registry is None:
        return None
    try:
        return registry.list()
    except EngineError:
        raise
    except Exception as exc:  # a broken model folder must not turn into a 500
        raise BackendUnavailable(
            f"the engine server cannot list its models ({type(exc).__name__}); see `volsynth models` there"
        ) from exc


def registered_model_ids(backend) -> list[str] | None:
    """The ids a request may name, or None when the backend has no registry to ask."""
    sources = registered_sources(backend)
    return None if sources is None else [source.id for source in sources]


def check_model(backend, model: str) -> None:
    """Only the server's registered models, by id: never a path, and no hint of which paths exist."""
    ids = registered_model_ids(backend)
    if ids is None:
        if any(c in model for c in "/\\") or model.startswith((".", "~")):
            raise ModelNotFound("this engine server runs its registered models only, chosen by id")
        return
    if model == "":
        from engine.models.registry import DEFAULT_MODEL_ID

        if DEFAULT_MODEL_ID in ids:
            return
        raise ModelNotFound(f"this engine server has no default model; choose one of: {', '.join(ids)}")
    if model not in ids:
        known = ", ".join(ids) or "none"
        raise ModelNotFound(
            f"this engine server has no model with id {wire.short(model, 60)!r}; it runs its registered "
            f"models only, chosen by id (never a path): {known}"
        )


def create_app(
    backend=None, token: str | None = None, metrics_source=None, limits: ServerLimits | None = None
):
    """Build the FastAPI application. ``backend`` defaults to a LocalBackend on the best device."""
    if backend is None:
        from engine.backends.local import LocalBackend

        backend = LocalBackend("auto")
    limits = limits or ServerLimits()
    manager = JobManager(backend, limits)
    gate = TokenGate(
        token,
        limits.auth_free_failures,
        limits.auth_base_delay_s,
        limits.auth_max_delay_s,
        limits.auth_max_waiting,
    )
    streams = {"open": 0, "peak": 0, "opened": 0}

    app = FastAPI(
        title="VolSynth engine server",
        dependencies=[Depends(gate)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind the token like every other route
    )
    app.state.manager = manager
    app.state.gate = gate
    app.state.streams = streams
    app.state.limits = limits
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    app.add_middleware(InFlightLimit, limit=limits.connections.max_in_flight_requests)  # outermost

    @app.exception_handler(Refused)
    async def refused(_request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse(
            wire.error_body(exc.detail, exc.error_class), exc.status_code, headers=exc.headers
        )

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(wire.error_body(str(exc.detail)), exc.status_code, headers=exc.headers)

    @app.exception_handler(EngineError)
    async def engine_error(_request: Request, exc: EngineError) -> JSONResponse:
        status = 503 if isinstance(exc, BackendUnavailable) else 422
        return JSONResponse(wire.error_body(str(exc), type(exc).__name__), status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # Only where and what, never the input: a reply must not echo a (large) request back.
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            if error.get("type") == "extra_forbidden":
                problems.append(f"unknown request field {wire.short(where, 80)!r}")
            else:
                problems.append(f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", "")))
        message = "; ".join(problems) or "the body does not match the schema"
        return JSONResponse(wire.error_body(f"malformed request: {message}", "InvalidRequest"), 422)

    def job_or_404(job_id: str) -> Job:
        job = manager.get(job_id)
        if job is None:
            raise Refused(404, f"no job {job_id}; it may have expired", "InvalidRequest")
        return job

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        schema = copy.deepcopy(app.openapi())
        with contextlib.suppress(EngineError, OSError):  # the schema stays usable without the list
            ids = registered_model_ids(backend)
            if ids:  # the models a job may name, as they are now
                from engine.models.registry import DEFAULT_MODEL_ID

                job_schema = schema["components"]["schemas"]["JobRequest"]
                if DEFAULT_MODEL_ID in ids:
                    job_schema["properties"]["model"]["enum"] = ["", *ids]
                else:  # no default model here: a job must name one
                    job_schema["properties"]["model"]["enum"] = ids
                    job_schema["required"] = ["model"]
        return JSONResponse(schema)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="VolSynth engine server")

    @app.get("/info", operation_id="info", response_model=InfoBody, responses={401: ERRORS[401]})
    def info() -> dict[str, Any]:
        details = backend.info()
        return {
            "name": details.name,
            "device": details.device,
            "device_name": details.device_name,
            "details": jsonable_encoder(details.details),
        }

    planning = threading.Lock()  # one plan at a time: each compiles several programs on the server's CPUs

    @app.post(
        "/plan",
        operation_id="plan",
        responses={**ERRORS, 503: {"model": ErrorBody, "description": "no JAX on this server"}},
    )
    def plan(body: PlanRequest) -> dict[str, Any]:
        from engine.xla.planning import BUNDLE_MODEL, plan_model

        if body.model != BUNDLE_MODEL:
            check_model(backend, body.model)
        if not planning.acquire(blocking=False):
            raise Refused(
                429, "the engine server is planning already; try again when it finishes", "BackendUnavailable"
            )
        try:
            result = plan_model(
                body.model,
                body.topology,
                batch=body.batch,
                cfg=body.cfg,
                compile_top=body.compile_top,
                registry=getattr(backend, "registry", None),
            )
        finally:
            planning.release()
        return jsonable_encoder(result.to_dict())

    @app.get("/models", operation_id="models", responses={401: ERRORS[401]})
    def models() -> list[dict[str, Any]]:
        return [source.spec.to_dict() for source in registered_sources(backend) or []]

    @app.get("/metrics", operation_id="metrics", responses={401: ERRORS[401], **NOT_FOUND})
    def metrics() -> dict[str, Any]:
        if metrics_source is None:
            raise Refused(404, "this server does not report metrics")
        sample = metrics_source.latest()
        return sample.to_dict() if sample is not None else {}

    job_links = {
        name: {"operationId": name, "parameters": {"job_id": "$response.body#/id"}}
        for name in ("events", "volumes", "cancel")
    }

    @app.post(
        "/jobs",
        operation_id="submit",
        response_model=JobCreated,
        responses={200: {"description": "the job's id", "links": job_links}, **ERRORS},
    )
    def submit(body: JobRequest) -> dict[str, str]:
        try:
            request = wire.decode_request(body.model_dump())
            check_model(backend, request.model)
        except BackendUnavailable:
            raise
        except EngineError as exc:
            raise Refused(422, str(exc), type(exc).__name__) from exc
        try:
            job = manager.submit(request)
        except QueueFull as exc:
            raise Refused(
                429,
                f"the engine server is busy ({manager.queued} jobs waiting); try again in "
                f"{exc.retry_after_s} s",
                "BackendUnavailable",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from exc
        return {"id": job.id}

    @app.get(
        "/jobs/{job_id}/events",
        operation_id="events",
        response_class=StreamingResponse,
        responses={
            200: {"content": {wire.NDJSON: {"schema": {"type": "string"}}}, "description": "job events"},
            401: ERRORS[401],
            **NOT_FOUND,
            422: ERRORS[422],
            429: ERRORS[429],
        },
    )
    async def events(job_id: JobId, since: Annotated[int, Query(ge=0, le=10**9)] = 0) -> StreamingResponse:
        job = job_or_404(job_id)
        if streams["open"] >= limits.max_streams:
            raise Refused(
                429,
                f"too many open event streams ({streams['open']}); try again shortly",
                "BackendUnavailable",
                headers={"Retry-After": "5"},
            )
        return StreamingResponse(_stream(job, since), media_type=wire.NDJSON)

    async def _stream(job: Job, since: int):
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        job.watch(loop, wake)
        streams["open"] += 1
        streams["opened"] += 1
        streams["peak"] = max(streams["peak"], streams["open"])
        try:
            index, quiet_s = since, 0.0
            while True:
                wake.clear()
                batch, done = job.events_since(index)
                if batch:
                    quiet_s = 0.0
                    for event in batch:
                        yield wire.encode_event(event)
                        index += 1
                        if event["type"] in wire.TERMINAL:
                            return
                    continue
                if done:
                    return  # a finished job has nothing after its last event: close at once
                if quiet_s >= limits.stream_idle_s:
                    yield wire.encode_event(wire.reconnect_event(index))
                    return
                wait_s = min(limits.keepalive_s, limits.stream_idle_s - quiet_s)
                try:
                    await asyncio.wait_for(wake.wait(), timeout=wait_s)
                except TimeoutError:
                    quiet_s += wait_s
                    yield wire.encode_event(wire.keepalive_event())
        finally:
            job.unwatch(loop, wake)
            streams["open"] -= 1

    @app.get(
        "/jobs/{job_id}/volumes",
        operation_id="volumes",
        response_class=Response,
        responses={
            200: {"content": {wire.NPY: {}}, "description": "the volumes as a .npy file"},
            401: ERRORS[401],
            **NOT_FOUND,
            409: {"model": ErrorBody, "description": "the job has no result (yet)"},
            422: ERRORS[422],
        },
    )
    def volumes(job_id: JobId) -> Response:
        job = job_or_404(job_id)
        if job.volumes is None:
            raise Refused(409, "the job has no result (yet)")
        return Response(wire.encode_volumes(job.volumes), media_type=wire.NPY)

    @app.delete(
        "/jobs/{job_id}",
        operation_id="cancel",
        response_model=CancelBody,
        responses={401: ERRORS[401], **NOT_FOUND, 422: ERRORS[422]},
    )
    def cancel(job_id: JobId) -> dict[str, str]:
        manager.cancel(job_or_404(job_id))
        return {"status": "cancelled"}

    return app


# -- binding and TLS (used by ``volsynth serve``) -------------------------------------------------------------


def new_token() -> str:
    """A bearer token of 32 random bytes (43 URL-safe characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_strength_bits(token: str) -> float:
    """A conservative estimate of a token's guessing entropy, in bits.

    Each character counts ``log2`` of the size of the character classes the token uses (lower case,
    upper case, digits, other printable: 26/26/10/33), except characters that only continue a pattern:
    a step of a run with a constant stride of at most 3 code points ("abcd", "aaaa", "0246", "zyx"), a
    step of a walk along a QWERTY row ("qwer", "lkjh"), or the end of a 3-character piece seen earlier in
    the token ("abcabc"), count 1 bit. So the alphabet,
    repeated characters and repeated chunks are weak however long; random characters are not. Words are
    not recognised (no dictionary): that is why a token should come from ``volsynth serve --new-token``.
    """
    classes = 0
    classes += 26 if any(c.islower() for c in token) else 0
    classes += 26 if any(c.isupper() for c in token) else 0
    classes += 10 if any(c.isdigit() for c in token) else 0
    classes += 33 if any(not c.isalnum() for c in token) else 0
    per_char = math.log2(max(classes, 2))
    bits = 0.0
    for i, c in enumerate(token):
        stride = ord(c) - ord(token[i - 1]) if i >= 1 else None
        if i >= 2 and stride == ord(token[i - 1]) - ord(token[i - 2]) and abs(stride) <= 3:
            bits += 1.0  # continues a run
        elif i >= 2 and _keyboard_step(token[i - 2], token[i - 1]) == _keyboard_step(token[i - 1], c) != 0:
            bits += 1.0  # continues a walk along a keyboard row ("qwerty", "lkjh")
        elif i >= 3 and token[i - 2 : i + 1] in token[: i - 1]:
            bits += 1.0  # repeats an earlier piece
        else:
            bits += per_char
    return bits


_KEYBOARD_ROWS = ("1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard_step(a: str, b: str) -> int:
    """+1 or -1 when ``b`` is next to ``a`` on a QWERTY row (either case), else 0."""
    a, b = a.lower(), b.lower()
    for row in _KEYBOARD_ROWS:
        if a in row and b in row:
            step = row.index(b) - row.index(a)
            return step if abs(step) == 1 else 0
    return 0


def check_token(token: str) -> None:
    """Refuse a weak token, on any address (on this machine it keeps other local users out)."""
    bits = token_strength_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise InvalidRequest(
            f"the token is too easy to guess (about {bits:.0f} bits; at least {MIN_TOKEN_BITS} needed, "
            f"e.g. {TOKEN_BYTES} random bytes); make one with `volsynth serve --new-token`"
        )


def check_bind(host: str, token: str | None, tls: bool, allow_plain_http: bool = False) -> None:
    """Refuse a weak token anywhere, and a network bind without a token and TLS (``InvalidRequest`` saying
    what to do)."""
    if token:
        check_token(token)
    if wire.is_loopback(host):
        return
    if not token:
        raise InvalidRequest(
            f"serving on {host} (beyond this machine) needs a token: volumes may hold patient data. "
            "Make one with `volsynth serve --new-token` and pass it as --token or $VOLSYNTH_SERVER_TOKEN"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidRequest(
            f"a token for a network bind needs at least {TOKEN_BYTES} random bytes ({MIN_TOKEN_CHARS}+ "
            f"characters), this one has {len(token)} characters; make one with `volsynth serve --new-token`"
        )
    if not tls and not allow_plain_http:
        raise InvalidRequest(
            f"serving on {host} without TLS sends the token and volumes in clear; add --tls-self-signed "
            "(or --tls-cert and --tls-key), or --allow-plain-http behind a TLS-terminating proxy"
        )


def certificate_file_fingerprint(path: str | Path) -> str:
    """The SHA-256 fingerprint of the first certificate in a PEM file."""
    text = Path(path).read_text(encoding="ascii", errors="replace")
    end = "-----END CERTIFICATE-----"
    if end not in text:
        raise InvalidRequest(f"{path} holds no PEM certificate")
    first = text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)]
    return wire.certificate_fingerprint(ssl.PEM_cert_to_DER_cert(first))


def default_tls_dir() -> Path:
    from engine.files.user_folders import user_config_dir

    return user_config_dir() / "server-tls"


def self_signed_certificate(folder: str | Path, hosts: list[str], days: int = 825) -> tuple[Path, Path]:
    """A self-signed certificate and key in ``folder`` (kept and reused while valid for 30 more days).

    Reusing it keeps the fingerprint clients pinned. The key file is readable by its owner only.
    """
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = Path(folder).expanduser()
    cert_path, key_path = folder / "server-cert.pem", folder / "server-key.pem"
    now = datetime.now(UTC)
    if cert_path.is_file() and key_path.is_file():
        with contextlib.suppress(ValueError, OSError):
            existing = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if existing.not_valid_after_utc > now + timedelta(days=30):
                return cert_path, key_path
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", "::1", *hosts]):
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            names.append(x509.DNSName(host))
        else:
            if not address.is_unspecified:
                names.append(x509.IPAddress(address))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "VolSynth engine server")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for path, data, mode in (
        (key_path, key_bytes, 0o600),
        (cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644),
    ):
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    return cert_path, key_path
