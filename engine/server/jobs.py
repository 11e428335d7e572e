"""The job queue: jobs, their event logs and watchers, and the manager that runs them on one backend.

Jobs belong to the client that submitted them (the name of its token, or its address on a server with
none): only it reads, streams or cancels them, and it has its own share of the queue. Waiting jobs run
in turn by client (round robin), so one client's queue does not go ahead of another's.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import wire
from engine.api import SamplingRequest, run
from engine.errors import BackendUnavailable, EngineError
from engine.server.limits import ServerLimits

#: Seconds per denoising step assumed until the server has timed a job of its own.
DEFAULT_STEP_S = 1.0
#: Steps assumed for a job that asks for its model's default, until a job of that model has run.
DEFAULT_STEPS = 50
MAX_RETRY_AFTER_S = 3600
#: An event that tells the client something and is not its job's end (older clients skip unknown types).
NOTICE = "notice"


class QueueFull(Exception):
    """The queue (``mine`` False) or the client's share of it (``mine`` True) is full."""

    def __init__(self, retry_after_s: int, mine: bool = False, waiting: int = 0) -> None:
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.mine = mine
        self.waiting = waiting


@dataclass(eq=False)
class Job:
    id: str
    request: SamplingRequest
    owner: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    volumes: np.ndarray | None = None
    finished_at: float | None = None
    read_at: float | None = None  # when its owner first fetched its volumes
    step: int = 0  # the last denoising progress reported, for the queue's time estimates
    total: int = 0
    denoise_started: tuple[float, int] | None = field(default=None, repr=False)  # (when, at which step)
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
            if event["type"] == wire.PROGRESS and event.get("stage") in ("denoise", "decode"):
                self.step, self.total = int(event.get("step", 0)), int(event.get("total", 0))
                if self.denoise_started is None:
                    self.denoise_started = (time.monotonic(), self.step)
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
    """Runs jobs on one backend: at most ``max_concurrent_jobs`` at once, at most ``max_queued_jobs`` waiting,
    of which at most ``max_queued_per_client`` of one client.

    A finished job is kept for its owner until it has read the volumes (then ``read_ttl_s`` more, for a
    retry) or ``job_ttl_s`` passes; other clients' jobs never push it out. A client with more than
    ``finished_jobs_kept`` finished jobs loses its own oldest, read ones first. ``Retry-After`` is an
    estimate: the work ahead (steps left of running jobs, steps of the queued ones before the slot frees)
    times the seconds per step this server measured (``DEFAULT_STEP_S`` until it has run a job).
    Worker threads start when work arrives and end when the queue is empty, so an idle server holds none.
    """

    def __init__(self, backend, limits: ServerLimits | None = None):
        self.backend = backend
        self.limits = limits or ServerLimits()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self._pending: OrderedDict[str, deque[Job]] = OrderedDict()  # owner -> its waiting jobs; next first
        self._running: set[Job] = set()
        self._lock = threading.Lock()
        self._workers = 0
        self._step_s: float | None = None  # measured seconds per step (moving average)
        self._model_steps: dict[str, int] = {}  # steps a model's default turned out to be
        self.closing = False

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def get(self, job_id: str, owner: str | None = None) -> Job | None:
        """The job, if ``owner`` (when given) made it: for anyone else it does not exist."""
        with self._lock:
            job = self.jobs.get(job_id)
        if job is None or (owner is not None and job.owner != owner):
            return None
        return job

    def submit(self, request: SamplingRequest, owner: str = "") -> Job:
        """Queue a job; ``QueueFull`` when the queue or ``owner``'s share of it is full."""
        with self._lock:
            if self.closing:
                raise BackendUnavailable("the engine server is shutting down; submit the job again later")
            self._expire()
            mine = len(self._pending.get(owner, ()))
            if mine >= self.limits.max_queued_per_client:
                raise QueueFull(self._retry_after_s(owner), mine=True, waiting=mine)
            if self.queued >= self.limits.max_queued_jobs:
                raise QueueFull(self._retry_after_s(None), waiting=self.queued)
            job = Job(id=uuid.uuid4().hex, request=request, owner=owner)
            job.emit(wire.queued_event())
            self.jobs[job.id] = job
            self._pending.setdefault(owner, deque()).append(job)
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
            waiting = self._unqueue(job)
            self.jobs.pop(job.id, None)
        if waiting:
            job.emit(wire.cancelled_event())

    def volumes_read(self, job: Job) -> None:
        """Its owner has the volumes: the job is kept ``read_ttl_s`` more (for a retry), not ``job_ttl_s``."""
        if job.read_at is None:
            job.read_at = time.monotonic()

    def shutdown(self, grace_s: float, on_expired=None) -> None:
        """Refuse new jobs; end the queued ones now, the running ones when ``grace_s`` has passed.

        Clients of queued jobs get an ``error`` event at once; clients of running jobs a ``notice`` event
        at once, and the ``error`` at the grace's end unless their job finished within it.
        """
        with self._lock:
            self.closing = True
            queued = [job for q in self._pending.values() for job in q]
            self._pending.clear()
            running = list(self._running)
        for job in queued:
            job.cancel.set()
            job.emit(
                wire.error_event(BackendUnavailable("the engine server is shutting down; the job never ran"))
            )
        for job in running:
            job.emit(
                {
                    "type": NOTICE,
                    "message": f"the engine server is shutting down; the job is cancelled unless it ends "
                    f"within {grace_s:g} s",
                }
            )

        expired = threading.Event()

        def expire() -> None:
            with self._lock:
                if expired.is_set():
                    return
                expired.set()
            for job in running:
                job.cancel.set()
                job.emit(
                    wire.error_event(
                        BackendUnavailable(
                            f"the engine server shut down; the job was cancelled after the {grace_s:g} s grace"
                        )
                    )
                )
            if on_expired is not None:
                on_expired()

        timer = threading.Timer(grace_s, expire)
        timer.daemon = True
        timer.start()
        self._shutdown_timer = timer
        self._expire_running = expire

    def end_grace_now(self) -> bool:
        """During a shutdown, cancel the running jobs now instead of at the grace's end (a second Ctrl-C).

        Their clients get the same ``error`` event the grace's end would send. False before a shutdown.
        """
        expire = getattr(self, "_expire_running", None)
        if expire is None:
            return False
        self._shutdown_timer.cancel()
        expire()
        return True

    def _unqueue(self, job: Job) -> bool:
        waiting = self._pending.get(job.owner)
        if waiting is None or job not in waiting:
            return False
        waiting.remove(job)
        if not waiting:
            del self._pending[job.owner]
        return True

    def _next(self) -> Job | None:
        """The next job to run: the first waiting job of the client first in turn, which then goes last."""
        if not self._pending:
            return None
        owner, waiting = next(iter(self._pending.items()))
        job = waiting.popleft()
        del self._pending[owner]
        if waiting:
            self._pending[owner] = waiting  # back of the turn
        return job

    def _order(self) -> list[Job]:
        """The waiting jobs in the order they will run (round robin by client, as ``_next`` takes them)."""
        queues = [list(q) for q in self._pending.values()]
        order = []
        while any(queues):
            for q in queues:
                if q:
                    order.append(q.pop(0))
        return order

    def _steps_of(self, job: Job) -> int:
        if job.total:
            return job.total
        return job.request.steps or self._model_steps.get(job.request.model, DEFAULT_STEPS)

    def _retry_after_s(self, owner: str | None) -> int:
        """Seconds until a slot frees: for the queue, when the next job starts; for a client's share,
        when that client's first waiting job starts."""
        step_s = self._step_s if self._step_s is not None else self._running_step_s()
        lanes = max(1, self.limits.max_concurrent_jobs)
        running_left = sorted(max(0, self._steps_of(j) - j.step) for j in self._running)
        soonest = running_left[0] if running_left else 0
        ahead = 0
        if owner is not None:
            for job in self._order():
                if job.owner == owner:
                    break
                ahead += self._steps_of(job)
            work = (sum(running_left) + ahead) / lanes
        else:
            work = soonest
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(work * step_s))))

    def _running_step_s(self) -> float:
        """Seconds per step measured on the running jobs, before any job has finished (``DEFAULT_STEP_S``
        until one has taken a step): the estimate was 1 s a step while a real step took seconds."""
        now = time.monotonic()
        rates = [
            (now - job.denoise_started[0]) / (job.step - job.denoise_started[1])
            for job in self._running
            if job.denoise_started is not None and job.step > job.denoise_started[1]
        ]
        return max(rates) if rates else DEFAULT_STEP_S

    def _expire(self) -> None:
        now = time.monotonic()
        finished = [j for j in self.jobs.values() if j.finished_at is not None]
        for job in finished:
            unread_expired = now - job.finished_at > self.limits.job_ttl_s
            read_expired = job.read_at is not None and now - job.read_at > self.limits.read_ttl_s
            if unread_expired or read_expired:
                del self.jobs[job.id]
        by_owner: dict[str, list[Job]] = {}
        for job in self.jobs.values():
            if job.finished_at is not None:
                by_owner.setdefault(job.owner, []).append(job)
        for jobs in by_owner.values():
            over = len(jobs) - self.limits.finished_jobs_kept
            if over > 0:  # that client's own: read ones first, then the oldest
                for job in sorted(jobs, key=lambda j: (j.read_at is None, j.finished_at))[:over]:
                    del self.jobs[job.id]

    def _work(self) -> None:
        while True:
            with self._lock:
                job = self._next()
                if job is None:
                    self._workers -= 1
                    return
                self._running.add(job)
            try:
                self._run(job)
            except BaseException as exc:  # noqa: BLE001 - a worker reports and goes on
                job.emit(wire.error_event(exc))
            finally:
                if not job.done:
                    job.emit(wire.error_event(EngineError("the job ended without a result")))
                with self._lock:
                    self._running.discard(job)
                    self._measured(job)

    def _measured(self, job: Job) -> None:
        """Learn the seconds per step (and a model's default steps) from a job that ran to its result:
        from its first denoising step to its result (decoding included: it is part of the work)."""
        if job.denoise_started is None or job.finished_at is None or job.events[-1]["type"] != wire.RESULT:
            return
        if not job.request.steps:
            self._model_steps[job.request.model] = job.total
        began, first_step = job.denoise_started
        steps = job.total - first_step
        if steps <= 0:
            return
        per_step = (job.finished_at - began) / steps
        self._step_s = per_step if self._step_s is None else 0.7 * self._step_s + 0.3 * per_step

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
