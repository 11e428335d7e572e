"""The job routes: ``POST /jobs``, a job's event stream, its volumes, and ``DELETE /jobs/{id}``.

Jobs are linked in the schema (``submit`` -> ``events``, ``volumes``, ``cancel``) so that stateful
fuzzing follows real job ids. Event streams are async: an open stream holds no thread.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import FastAPI, Query
from fastapi.responses import Response, StreamingResponse

from engine import wire
from engine.errors import BackendUnavailable, EngineError
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
    JobRequest,
    Refused,
)


def add_job_routes(app: FastAPI, manager: JobManager, limits: ServerLimits, streams: dict[str, int]) -> None:
    """``streams`` counts the open event streams (``open``, ``peak``, ``opened``); ``/events`` keeps it."""

    def job_or_404(job_id: str) -> Job:
        job = manager.get(job_id)
        if job is None:
            raise Refused(404, f"no job {job_id}; it may have expired", "InvalidRequest")
        return job

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
            check_model(manager.backend, request.model)
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
        return StreamingResponse(event_stream(job, since, limits, streams), media_type=wire.NDJSON)

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


async def event_stream(job: Job, since: int, limits: ServerLimits, streams: dict[str, int]):
    """A job's events from index ``since`` as NDJSON lines, until its terminal event (or ``reconnect``).

    A finished job with nothing after ``since`` ends at once; a quiet one gets a keepalive line every
    ``keepalive_s`` and a ``reconnect`` event after ``stream_idle_s`` without an event.
    """
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
