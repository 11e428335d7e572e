"""The job routes: ``POST /jobs``, a job's event stream, its volumes, and ``DELETE /jobs/{id}``.

Jobs are linked in the schema (``submit`` -> ``events``, ``volumes``, ``cancel``) so that stateful
fuzzing follows real job ids. Event streams are async: an open stream holds no thread. A job is its
client's (``request.state.client``, set by the token gate): to any other it answers 404, as if it did not
exist.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from engine import wire
from engine.errors import BackendUnavailable, EngineError
from engine.formatting import rough_duration
from engine.server.allowed_models import check_model
from engine.server.jobs import Job, JobManager, QueueFull
from engine.server.limits import ServerLimits
from engine.server.schemas import (
    ERRORS,
    NOT_FOUND,
    CancelBody,
    ErrorBody,
    JobCreated,
    JobId,
    Refused,
    request_body,
)


def add_job_routes(
    app: FastAPI, manager: JobManager, limits: ServerLimits, streams: dict, clients: int = 1
) -> None:
    """``streams`` counts the open event streams (``open``, ``peak``, ``opened``, and ``by_client`` and
    ``by_address``); ``/events`` keeps it. With several ``clients`` each has ``max_streams // clients`` of
    them; every address has ``max_streams_per_address``."""
    per_client = max(1, limits.max_streams // clients) if clients > 1 else limits.max_streams
    per_address = max(1, min(limits.max_streams, limits.max_streams_per_address))
    streams.setdefault("by_client", {})
    streams.setdefault("by_address", {})

    def job_or_404(job_id: str, request: Request) -> Job:
        job = manager.get(job_id, owner=client_of(request))
        if job is None:
            raise Refused(404, f"no job {job_id}; it may have expired", "InvalidRequest")
        return job

    job_links = {
        name: {"operationId": name, "parameters": {"job_id": "$response.body#/id"}}
        for name in ("events", "volumes", "cancel")
    }

    def submit(body: BaseModel, http: Request) -> dict[str, str]:
        try:
            request = wire.decode_request(body.model_dump())
            check_model(manager.backend, request.model)
        except BackendUnavailable:
            raise
        except EngineError as exc:
            raise Refused(422, str(exc), type(exc).__name__) from exc
        try:
            job = manager.submit(request, owner=client_of(http))
        except QueueFull as exc:
            whose = "of yours are" if exc.mine else "are"
            raise Refused(
                429,
                f"the engine server is busy ({exc.waiting} jobs {whose} waiting, about "
                f"{rough_duration(exc.work_s)} of work at {rough_duration(exc.job_s)} a job, {exc.basis}); "
                f"try again in about {exc.retry_after_s} s, when a place frees",
                "BackendUnavailable",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from exc
        return {"id": job.id}

    # The body is made now, from the request field rows and the samplers registered now (engine.samplers), so
    # a sampler registered before the app is made is on the wire; the annotation is set before FastAPI reads it.
    submit.__annotations__["body"] = request_body()
    app.post(
        "/jobs",
        operation_id="submit",
        response_model=JobCreated,
        responses={200: {"description": "the job's id", "links": job_links}, **ERRORS},
    )(submit)

    @app.get(
        "/jobs/{job_id}/events",
        operation_id="events",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {wire.NDJSON: {"schema": EVENT_STREAM_SCHEMA}},
                "description": "the job's events, one JSON object a line, until its terminal event",
            },
            401: ERRORS[401],
            **NOT_FOUND,
            422: ERRORS[422],
            429: ERRORS[429],
        },
    )
    async def events(
        job_id: JobId, request: Request, since: Annotated[int, Query(ge=0, le=10**9)] = 0
    ) -> Response:
        job = job_or_404(job_id, request)
        # Check and take the slot in one step (no await between): streams arriving together cannot all
        # pass the check before any of them counts; the stream's own end gives the slot back.
        client = client_of(request)
        address = request.client.host if request.client else "?"
        full = None
        if streams["open"] >= limits.max_streams:
            full = f"too many open event streams ({streams['open']}); try again shortly"
        elif streams["by_client"].get(client, 0) >= per_client:
            full = f"this client has {per_client} event streams open, its share; close one first"
        elif streams["by_address"].get(address, 0) >= per_address:
            full = f"this address has {per_address} event streams open, its share; close one first"
        if full:
            return JSONResponse(
                wire.error_body(full, "BackendUnavailable"), status_code=429, headers={"Retry-After": "5"}
            )
        streams["open"] += 1
        streams["opened"] += 1
        streams["peak"] = max(streams["peak"], streams["open"])
        for counts, key in ((streams["by_client"], client), (streams["by_address"], address)):
            counts[key] = counts.get(key, 0) + 1
        return SlotStreamingResponse(
            event_stream(job, since, limits), streams, media_type=wire.NDJSON, holder=(client, address)
        )

    @app.get(
        "/jobs/{job_id}/volumes",
        operation_id="volumes",
        response_class=Response,
        responses={
            200: {
                "content": {wire.NPY: {"schema": {"type": "string", "format": "binary"}}},
                "description": "the volumes as a .npy file (float32, batch x channel x D x H x W)",
            },
            401: ERRORS[401],
            **NOT_FOUND,
            409: {"model": ErrorBody, "description": "the job has no result (yet)"},
            422: ERRORS[422],
        },
    )
    def volumes(job_id: JobId, request: Request) -> Response:
        job = job_or_404(job_id, request)
        if job.volumes is None:
            raise Refused(409, "the job has no result (yet)")
        response = Response(wire.encode_volumes(job.volumes), media_type=wire.NPY)
        manager.volumes_read(job)
        return response

    @app.delete(
        "/jobs/{job_id}",
        operation_id="cancel",
        response_model=CancelBody,
        responses={401: ERRORS[401], **NOT_FOUND, 422: ERRORS[422]},
    )
    def cancel(job_id: JobId, request: Request) -> dict[str, str]:
        manager.cancel(job_or_404(job_id, request))
        return {"status": "cancelled"}


def client_of(request: Request) -> str:
    """The client a request comes from, as the token gate named it."""
    return getattr(request.state, "client", "")


EVENT_STREAM_SCHEMA = {
    "type": "string",
    "description": "newline-delimited JSON: each line an object with a 'type' (queued, progress, "
    "notice, result, error, cancelled; keepalive and reconnect on one stream only) and its fields "
    "(engine.wire)",
}


class SlotStreamingResponse(StreamingResponse):
    """A stream holding one of ``streams["open"]``, taken by the route, given back when the response
    ends however it ends (finished, cut off by the client, or never iterated)."""

    def __init__(self, content, streams: dict, holder: tuple[str, str] | None = None, **kwargs) -> None:
        super().__init__(self._releasing(content), **kwargs)
        self._streams = streams
        self._holder = holder
        self._held = True

    async def _releasing(self, content):
        try:
            async for chunk in content:
                yield chunk
        finally:  # before the last (empty) body message: a client that has read the stream sees it freed
            self.release()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._streams["open"] -= 1
            if self._holder is not None:
                for name, key in zip(("by_client", "by_address"), self._holder, strict=True):
                    counts = self._streams[name]
                    counts[key] -= 1
                    if not counts[key]:
                        del counts[key]


async def event_stream(job: Job, since: int, limits: ServerLimits):
    """A job's events from index ``since`` as NDJSON lines, until its terminal event (or ``reconnect``).

    A finished job with nothing after ``since`` ends at once; a quiet one gets a keepalive line every
    ``keepalive_s`` and a ``reconnect`` event after ``stream_idle_s`` without an event.
    """
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    job.watch(loop, wake)
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
