"""The job queue: jobs, their event logs and watchers, and the manager that runs them on one backend.

Jobs belong to the client that submitted them (the name of its token, or its address on a server with
none): only it reads, streams or cancels them, and it has its own share of the queue. Waiting jobs run
in turn by client (round robin), so one client's queue does not go ahead of another's.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine import wire
from engine.api import SamplingRequest, run
from engine.errors import BackendUnavailable, EngineError
from engine.formatting import count_of
from engine.server.limits import ServerLimits

#: How many of the latest finished jobs the estimates take the median time of.
RECENT_JOBS = 16
#: Seconds a job is assumed to take until one has finished here (or the running one has taken two steps).
DEFAULT_JOB_S = 60.0
MAX_RETRY_AFTER_S = 3600
#: Seconds a 503 asks a client to wait when no job runs (its slots are held by requests, not streams).
BUSY_RETRY_S = 5
#: ``queued`` events one job gets for a place no nearer the front than one it was told before (another
#: client's job put ahead of it): past these only its moves to the front are told, so a client that submits
#: and cancels over and over cannot grow another client's event log without bound.
MAX_QUEUE_EVENTS = 64
#: An event that tells the client something and is not its job's end (older clients skip unknown types).
NOTICE = "notice"


class QueueFull(Exception):
    """The queue (``mine`` False) or the client's share of it (``mine`` True) is full.

    ``retry_after_s``: when a place is expected to free; ``work_s``: when a job at the back of the queue as it
    is now would start; ``job_s``: the time of one job these take, and ``basis`` what that time is.
    """

    def __init__(
        self,
        retry_after_s: int,
        mine: bool = False,
        waiting: int = 0,
        work_s: float = 0.0,
        job_s: float = DEFAULT_JOB_S,
        basis: str = "",
    ) -> None:
        super().__init__(f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.mine = mine
        self.waiting = waiting
        self.work_s = work_s
        self.job_s = job_s
        self.basis = basis


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
    started_at: float | None = None  # when a worker took it from the queue
    told_place: int | None = field(default=None, repr=False)  # the place its last ``queued`` event said
    best_place: int | None = field(default=None, repr=False)  # the nearest the front it was told
    queue_events: int = field(default=0, repr=False)  # ``queued`` events that were not a new best place
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # the manager's
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
                    self.denoise_started = (self.clock(), self.step)
            if event["type"] in wire.TERMINAL:
                self.finished_at = self.clock()
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
    ``finished_jobs_kept`` finished jobs loses its own oldest, read ones first.

    Waits are estimated from the jobs this server ran: one job takes the median time of the latest
    ``RECENT_JOBS`` that finished (before one has, the running job's own pace; before that
    ``DEFAULT_JOB_S``), a running job has its own pace over its steps left, and a waiting job starts after
    the running jobs' time left plus one job time per job ahead of it, over the jobs run at once. Each
    waiting job is told its place and wait (a ``queued`` event) whenever its place changes; a full queue's
    ``Retry-After`` is when a place frees (:meth:`submit`).
    Worker threads start when work arrives and end when the queue is empty, so an idle server holds none.
    """

    def __init__(
        self, backend, limits: ServerLimits | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.backend = backend
        self.limits = limits or ServerLimits()
        self.clock = clock  # seconds, for every estimate and expiry (a test may step it by hand)
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self._pending: OrderedDict[str, deque[Job]] = OrderedDict()  # owner -> its waiting jobs; next first
        self._running: set[Job] = set()
        self._lock = threading.Lock()
        self._workers = 0
        self._job_times: deque[float] = deque(maxlen=RECENT_JOBS)  # seconds, queue exit to result
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
        """Queue a job; ``QueueFull`` when the queue or ``owner``'s share of it is full, with a
        ``retry_after_s`` of when a place is expected to free: for the queue, when the running job that ends
        first ends (the next waiting job starts then); for a client's share, when its first waiting job
        starts. Sooner would find it still full, later would lose the place to a client that came sooner.
        """
        with self._lock:
            if self.closing:
                raise BackendUnavailable("the engine server is shutting down; submit the job again later")
            self._expire()
            mine = len(self._pending.get(owner, ()))
            if mine >= self.limits.max_queued_per_client:
                raise self._queue_full(owner, mine)
            if self.queued >= self.limits.max_queued_jobs:
                raise self._queue_full(None, self.queued)
            job = Job(id=uuid.uuid4().hex, request=request, owner=owner, clock=self.clock)
            self.jobs[job.id] = job
            self._pending.setdefault(owner, deque()).append(job)
            self._tell_places()  # its first event, under the lock: before a worker can start it
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
                self._tell_places()
        if waiting:
            job.emit(wire.cancelled_event())

    def volumes_read(self, job: Job) -> None:
        """Its owner has the volumes: the job is kept ``read_ttl_s`` more (for a retry), not ``job_ttl_s``."""
        if job.read_at is None:
            job.read_at = self.clock()

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

    def next_end_s(self) -> int:
        """Seconds until the running job that ends first ends, when its event streams end and free their
        in-flight slots: a 503's ``Retry-After``. ``BUSY_RETRY_S`` when no job runs."""
        with self._lock:
            _, left, _, _ = self._waits(self.clock())
        return self._bounded(left[0]) if left else BUSY_RETRY_S

    @staticmethod
    def _bounded(seconds: float) -> int:
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds))))

    def _job_time(self, now: float) -> tuple[float, str]:
        """Seconds one job takes here, and what that number is: the median of the latest finished jobs;
        before one has finished, the running jobs' own pace; before they have taken two steps, a guess."""
        if self._job_times:
            recent = count_of(len(self._job_times), "job")
            return statistics.median(self._job_times), f"the median of the last {recent}"
        projected = [t for t in (self._projected_s(job, now) for job in self._running) if t is not None]
        if projected:
            return max(projected), "the running job's pace"
        return DEFAULT_JOB_S, "a guess until a job has run here"

    @staticmethod
    def _pace_s(job: Job, now: float) -> float | None:
        """Seconds per step of a running job since its first denoising step (None before its next one)."""
        if job.denoise_started is None:
            return None
        began, first_step = job.denoise_started
        return (now - began) / (job.step - first_step) if job.step > first_step else None

    def _projected_s(self, job: Job, now: float) -> float | None:
        """A running job's whole time at its own pace: loading, then all its steps."""
        pace = self._pace_s(job, now)
        if pace is None or job.started_at is None or job.denoise_started is None:
            return None
        began, first_step = job.denoise_started
        return (began - job.started_at) + pace * (job.total - first_step)

    def _left_s(self, job: Job, job_s: float, now: float) -> float:
        """Seconds until a running job ends: the longer of its own pace over its steps left and the job time
        less its time so far (decoding comes after the last step: a decoding job's pace says 0 s, and
        Retry-After said 1 s for the 20 s a demo model's decoding took); a quarter of the job time for a
        job already past both."""
        pace = self._pace_s(job, now)
        by_pace = pace * max(0, job.total - job.step) if pace is not None else 0.0
        elapsed = now - (job.started_at if job.started_at is not None else now)
        left = max(by_pace, job_s - elapsed)
        return left if left > 0 else job_s / 4

    def _waits(self, now: float) -> tuple[list[tuple[Job, float]], list[float], float, str]:
        """The waiting jobs in the order they will start, each with the seconds until it starts (the running
        jobs' time left plus one job time per job ahead, over the jobs run at once); the running jobs' times
        left, soonest first; the job time and what it is."""
        job_s, basis = self._job_time(now)
        left = sorted(self._left_s(job, job_s, now) for job in self._running)
        lanes = max(1, self.limits.max_concurrent_jobs)
        waits = [(job, (sum(left) + ahead * job_s) / lanes) for ahead, job in enumerate(self._order())]
        return waits, left, job_s, basis

    def _queue_full(self, owner: str | None, waiting: int) -> QueueFull:
        """The refusal of a job: the queue is full (``owner`` None) or ``owner``'s share of it is."""
        waits, left, job_s, basis = self._waits(self.clock())
        if owner is None:
            free_s = left[0] if left else 0.0
        else:
            free_s = next((wait_s for job, wait_s in waits if job.owner == owner), 0.0)
        lanes = max(1, self.limits.max_concurrent_jobs)
        work_s = (sum(left) + len(waits) * job_s) / lanes
        return QueueFull(self._bounded(free_s), owner is not None, waiting, work_s, job_s, basis)

    def _tell_places(self) -> None:
        """A ``queued`` event (place, wait) for each waiting job whose place changed: always when it is
        nearer the front than ever (at most ``max_queued_jobs`` of those; clients count them as the line
        moving), else up to ``MAX_QUEUE_EVENTS``. Called under the lock after every change of the queue, so
        a job's ``queued`` events come before any event of its run."""
        waits, _, job_s, _ = self._waits(self.clock())
        for place, (job, wait_s) in enumerate(waits, 1):
            if job.told_place == place:
                continue
            if job.best_place is None or place < job.best_place:
                job.best_place = place
            elif job.queue_events >= MAX_QUEUE_EVENTS:
                continue
            else:
                job.queue_events += 1
            job.told_place = place
            job.emit(wire.queued_event(place, wait_s, job_s))

    def _expire(self) -> None:
        now = self.clock()
        finished = [(j, j.finished_at) for j in self.jobs.values() if j.finished_at is not None]
        for job, finished_at in finished:
            unread_expired = now - finished_at > self.limits.job_ttl_s
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
                job.started_at = self.clock()
                self._running.add(job)
                self._tell_places()  # every job behind it moved up
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
        """Keep the time of a job that ran to its result, from leaving the queue to its result (loading and
        decoding included: a waiting job waits for them too)."""
        if job.started_at is None or job.finished_at is None or job.events[-1]["type"] != wire.RESULT:
            return
        self._job_times.append(job.finished_at - job.started_at)

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
