"""The engine server: runs sampling jobs for remote clients over HTTP (FastAPI).

Protocol (JSON unless noted; all under an optional bearer token):

* ``GET /info`` -> backend info; ``GET /models`` -> model specs; ``GET /metrics`` -> a telemetry sample.
* ``POST /jobs`` with a ``SamplingRequest`` as JSON -> ``{"id": ...}``. Jobs run one at a time (one device).
* ``GET /jobs/{id}/events?since=N`` -> newline-delimited JSON events from index N until the job ends:
  ``progress`` (with an optional base64 ``.npy`` preview), then one of ``result`` (provenance + affine),
  ``error`` (engine error class + message) or ``cancelled``.
* ``GET /jobs/{id}/volumes`` -> the result volumes as a ``.npy`` file (application/octet-stream).
* ``DELETE /jobs/{id}`` -> cancel; the job's generator is closed at the next step boundary.

Volumes leave the server only to the client that asked for them; finished jobs are kept for
``JOB_TTL_S`` seconds and then dropped from memory.
"""

from __future__ import annotations

import base64
import hmac
import io
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from engine.api import SamplingRequest
from engine.errors import EngineError

JOB_TTL_S = 15 * 60
TERMINAL = ("result", "error", "cancelled")


def encode_array(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_array(text: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


@dataclass
class Job:
    id: str
    request: SamplingRequest
    events: list[dict[str, Any]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)
    volumes: np.ndarray | None = None
    finished_at: float | None = None

    def emit(self, event: dict[str, Any]) -> None:
        with self.changed:
            self.events.append(event)
            if event["type"] in TERMINAL:
                self.finished_at = time.monotonic()
            self.changed.notify_all()

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1]["type"] in TERMINAL


class JobManager:
    """Runs jobs on one backend, one at a time, each in its own thread."""

    def __init__(self, backend):
        self.backend = backend
        self.jobs: dict[str, Job] = {}
        self._run_lock = threading.Lock()
        self._jobs_lock = threading.Lock()

    def submit(self, request: SamplingRequest) -> Job:
        job = Job(id=uuid.uuid4().hex, request=request)
        with self._jobs_lock:
            self._expire()
            self.jobs[job.id] = job
        job.emit({"type": "queued"})
        threading.Thread(target=self._run, args=(job,), name=f"job-{job.id[:8]}", daemon=True).start()
        return job

    def _expire(self) -> None:
        now = time.monotonic()
        for job_id in [j.id for j in self.jobs.values() if j.finished_at and now - j.finished_at > JOB_TTL_S]:
            del self.jobs[job_id]

    def _run(self, job: Job) -> None:
        with self._run_lock:
            if job.cancel.is_set():
                job.emit({"type": "cancelled"})
                return
            gen = self.backend.sample(job.request)
            try:
                while True:
                    try:
                        progress = next(gen)
                    except StopIteration as done:
                        result = done.value
                        break
                    event = {
                        "type": "progress",
                        "stage": progress.stage,
                        "step": progress.step,
                        "total": progress.total,
                        "elapsed_s": progress.elapsed_s,
                        "message": progress.message,
                    }
                    if progress.preview is not None:
                        event["preview"] = encode_array(progress.preview)
                    job.emit(event)
                    if job.cancel.is_set():
                        gen.close()  # in this (the iterating) thread, as the Backend contract asks
                        job.emit({"type": "cancelled"})
                        return
            except EngineError as exc:
                job.emit({"type": "error", "error_class": type(exc).__name__, "message": str(exc)})
                return
            except Exception as exc:  # a server must report, not die; the client shows the message
                job.emit(
                    {
                        "type": "error",
                        "error_class": "EngineError",
                        "message": f"the engine server failed: {type(exc).__name__}: {exc}",
                    }
                )
                return
            finally:
                gen.close()
            job.volumes = result.volumes
            job.emit(
                {
                    "type": "result",
                    "provenance": result.provenance,
                    "affine": result.affine.tolist(),
                    "request": result.request.to_dict(),
                    "shape": list(result.volumes.shape),
                }
            )


def create_app(backend=None, token: str | None = None, metrics_source=None):
    """Build the FastAPI application. ``backend`` defaults to a LocalBackend on the best device."""
    if backend is None:
        from engine.backends.local import LocalBackend

        backend = LocalBackend("auto")
    manager = JobManager(backend)

    def authorise(request: Request) -> None:
        if not token:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong token; pass the server's --token")

    app = FastAPI(title="VolSynth engine server", dependencies=[Depends(authorise)])
    app.state.manager = manager

    def job_or_404(job_id: str) -> Job:
        job = manager.jobs.get(job_id)
        if job is None:
            raise HTTPException(status_code=404, detail=f"no job {job_id}; it may have expired")
        return job

    @app.get("/info")
    def info() -> dict[str, Any]:
        details = backend.info()
        return {
            "name": details.name,
            "device": details.device,
            "device_name": details.device_name,
            "details": details.details,
        }

    @app.get("/models")
    def models() -> list[dict[str, Any]]:
        return [source.spec.to_dict() for source in backend.registry.list()]

    @app.get("/metrics")
    def metrics() -> dict[str, Any]:
        if metrics_source is None:
            raise HTTPException(status_code=404, detail="this server does not report metrics")
        sample = metrics_source.latest()
        return sample.to_dict() if sample is not None else {}

    @app.post("/jobs")
    async def submit(request: Request) -> dict[str, str]:
        try:
            sampling_request = SamplingRequest.from_json((await request.body()).decode("utf-8"))
        except (EngineError, TypeError, UnicodeDecodeError) as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        return {"id": manager.submit(sampling_request).id}

    @app.get("/jobs/{job_id}/events")
    def events(job_id: str, since: int = 0) -> StreamingResponse:
        job = job_or_404(job_id)

        def stream():
            index = since
            while True:
                with job.changed:
                    while index >= len(job.events):
                        job.changed.wait(timeout=15)
                        if index >= len(job.events):
                            break  # keep-alive: send nothing, loop again
                    batch = job.events[index:]
                for event in batch:
                    yield json.dumps(event) + "\n"
                    index += 1
                    if event["type"] in TERMINAL:
                        return

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.get("/jobs/{job_id}/volumes")
    def volumes(job_id: str) -> Response:
        job = job_or_404(job_id)
        if job.volumes is None:
            raise HTTPException(status_code=409, detail="the job has no result (yet)")
        buffer = io.BytesIO()
        np.save(buffer, job.volumes, allow_pickle=False)
        return Response(buffer.getvalue(), media_type="application/octet-stream")

    @app.delete("/jobs/{job_id}")
    def cancel(job_id: str) -> dict[str, str]:
        job_or_404(job_id).cancel.set()
        return {"status": "cancelling"}

    return app
