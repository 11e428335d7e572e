"""The job queue: jobs, their event logs and watchers, and the manager that runs them on one backend."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import wire
from engine.api import SamplingRequest, run
from engine.errors import EngineError
from engine.server.limits import ServerLimits


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
