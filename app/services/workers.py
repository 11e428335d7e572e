"""Long work off the UI thread: the one worker QObject, moved to a QThread, and the runner that owns them.

The rules every worker keeps (the app's threading rules):
  * the worker drives the engine generator itself and, on cancel, calls ``gen.close()`` in its own thread
    so the engine's ``finally`` blocks run where the work ran;
  * signals are past tense (``progressed``, ``finished``, ``failed``, ``cancelled``);
  * PySide6 6.12 may run a lambda connected to a worker signal in the worker thread, so the runner connects
    worker signals only to bound methods of QObjects living in the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtGui import QGuiApplication

from app.services.job_view import JobActivity, JobStrip
from engine.errors import Cancelled, EngineError

log = logging.getLogger(__name__)


def user_message(exc: BaseException) -> str:
    """What the user sees: the engine's own message, or a short line for anything unexpected."""
    if isinstance(exc, EngineError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "The computer ran out of memory. Close other volumes or lower the batch size, then try again."
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".strip(": ")
    return f"Unexpected error ({type(exc).__name__}: {exc}). Details were written to the log."


class BackendPool:
    """One backend per device, created lazily in a worker thread (a ``LocalBackend`` imports torch).

    Keeping the backend keeps its loaded model, so a second generation skips the load. Engine servers
    (``add_server``) get a ``RemoteBackend`` under their ``remote:`` device id.
    """

    def __init__(self, registry=None) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._backends: dict[str, Any] = {}
        self._servers: dict[str, tuple[str, str | None, str | None]] = {}  # device -> (url, token, pin)

    def add_server(self, device: str, url: str, token: str | None, fingerprint: str | None = None) -> None:
        with self._lock:
            self._servers[device] = (url, token, fingerprint)
            self._backends.pop(device, None)

    def remove(self, device: str) -> None:
        with self._lock:
            self._servers.pop(device, None)
            backend = self._backends.pop(device, None)
        if backend is not None and hasattr(backend, "close"):
            backend.close()

    def discard(self, device: str) -> None:
        """Forget ``device``'s backend without closing it: an abandoned run may still be using it, and the next
        run gets a fresh one instead of sharing it with that run."""
        with self._lock:
            self._backends.pop(device, None)

    def get(self, device: str):
        with self._lock:
            backend = self._backends.get(device)
            if backend is None:
                from engine.backends import make_backend

                if device in self._servers:
                    url, token, fingerprint = self._servers[device]
                    backend = make_backend(server=url, token=token, fingerprint=fingerprint)
                else:  # this machine: cpu / cuda:N / mps / auto, or xla / tpu when JAX is installed
                    backend = make_backend(device, registry=self._registry)
                self._backends[device] = backend
            return backend


# Abandoned threads still running. A QThread destroyed while it runs aborts the process, so they are kept
# referenced here, not by their (closed) window; the app exits without waiting for them (app/__main__.py).
_abandoned: list[tuple[QThread, QObject]] = []
_abandoned_lock = threading.Lock()


def _keep_until_finished(thread: QThread, worker: QObject) -> None:
    with _abandoned_lock:
        _abandoned[:] = [(t, w) for t, w in _abandoned if t.isRunning()]
        _abandoned.append((thread, worker))


def abandoned_threads_running() -> int:
    """How many abandoned runs have not ended yet (the app does not wait for them when it exits)."""
    with _abandoned_lock:
        return sum(1 for thread, _ in _abandoned if thread.isRunning())


class _Stopped(Exception):
    """Raised inside a worker's thread when a cancel was asked for: the run ends as ``cancelled``."""


class Worker(QObject):
    """Runs one piece of work in a QThread and reports it: the one worker every feature uses.

    ``work(worker)`` runs in the worker thread; its return value is reported as ``finished``, an exception
    whose type is in ``cancelled_by`` as ``cancelled``, any other exception as ``failed`` (the user's message,
    with the traceback in the log unless it is an ``EngineError``). The thread is quit when the work ends.
    Use the constructors below rather than writing ``work`` by hand:

    * ``Worker.call(function, *args)``: a plain function (load, save, list devices...);
    * ``Worker.generator(make_job)``: any engine generator (``Progress`` out, a value returned);
    * ``Worker.generation(request, backend_provider)``: one ``SamplingRequest`` on a backend, abandonable;
    * ``Worker.reporting_call(function, *args)``: ``function(*args, report=...)`` whose ``report`` raises
      ``engine.errors.Cancelled`` after ``cancel()`` (the vault's imports and exports).
    """

    progressed = Signal(object)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(
        self,
        work: Callable[[Worker], Any],
        *,
        what: str = "background task",
        cancelled_by: tuple[type[BaseException], ...] = (_Stopped,),
        abandonable: bool = False,
    ) -> None:
        super().__init__()
        self._work = work
        self._what = what  # names the work in the log ("generation failed: ...")
        self._cancelled_by = cancelled_by
        self._cancel = threading.Event()
        self._last_report = 0.0
        self.can_abandon = abandonable  # JobRunner.shutdown abandons such a job instead of waiting for it
        self.backend: Any = None  # the backend a generation runs on, once it has one (abandon() reaches it)
        self.error: BaseException | None = None  # set before ``failed`` is emitted

    # -- the kinds of work -------------------------------------------------------------------------------

    @classmethod
    def call(cls, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Worker:
        """Runs ``function(*args, **kwargs)`` and reports its return value; cancel() does not interrupt it."""
        return cls(lambda _worker: function(*args, **kwargs), what="background task")

    @classmethod
    def generator(cls, make_job: Callable[[], Any]) -> Worker:
        """Drives the generator ``make_job()`` returns; ``make_job`` is called in the worker thread, so the
        engine imports and starts its work off the UI thread. Cancel closes the generator there."""
        return cls(lambda worker: worker.drive(make_job()), what="background job")

    @classmethod
    def generation(cls, request, backend_provider: Callable[[], Any]) -> Worker:
        """Runs one ``SamplingRequest`` on ``backend_provider()`` (called in the worker thread). A run that
        ends after cancel() counts as cancelled, its result dropped; the run can be abandoned."""

        def work(worker: Worker):
            worker.backend = backend_provider()
            result = worker.drive(worker.backend.sample(request))
            if worker.cancel_requested:
                raise _Stopped
            return result

        return cls(work, what="generation", abandonable=True)

    @classmethod
    def reporting_call(cls, function: Callable[..., Any], *args: Any) -> Worker:
        """Runs ``function(*args, report=worker.report)``; ``report`` raises ``Cancelled`` after cancel(), so
        the engine stops at its next chunk and removes what it had started."""
        return cls(
            lambda worker: function(*args, report=worker.report), what="vault task", cancelled_by=(Cancelled,)
        )

    # -- called from the GUI thread ------------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the work to stop at its next step or chunk (thread-safe)."""
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def abandon(self) -> None:
        """Give up on a run that did not stop (called from the GUI thread; returns at once).

        A backend that can (an engine server's) asks the server to cancel and cuts the connection, in a
        thread of its own so a slow network never blocks the window; a local step is left to finish on its
        own. Whatever the worker reports afterwards is dropped by its job.
        """
        self._cancel.set()
        abandon = getattr(self.backend, "abandon", None)
        if abandon is not None:
            threading.Thread(target=abandon, name="volsynth-abandon", daemon=True).start()

    # -- called in the worker thread -----------------------------------------------------------------

    def drive(self, job) -> Any:
        """Run an engine generator through the engine's one relay: each ``Progress`` is relayed, its value
        returned; on cancel it is closed here, in the worker thread, so the engine's ``finally`` blocks run
        where the work ran."""
        from engine.api import drive

        value = drive(job, on_progress=self.progressed.emit, should_stop=self._cancel.is_set)
        if value is None and self._cancel.is_set():  # stopped before the end (drive closed the generator)
            raise _Stopped
        return value

    def report(self, fraction: float | None, text: str = "") -> None:
        """A ``report`` callback for engine functions that take one: ``progressed((fraction, text))``."""
        if self._cancel.is_set():
            raise Cancelled("cancelled by the user")
        now = time.monotonic()
        if fraction is None or fraction >= 1.0 or now - self._last_report >= 0.1:  # at most ~10 redraws/s
            self._last_report = now
            self.progressed.emit((fraction, text))

    @Slot()
    def run(self) -> None:
        try:
            value = self._work(self)
        except self._cancelled_by:
            self.cancelled.emit()
        except BaseException as exc:  # noqa: BLE001 - everything must reach the user as a message
            if not isinstance(exc, EngineError):
                log.error("%s failed:\n%s", self._what, traceback.format_exc())
            self.error = exc
            self.failed.emit(user_message(exc))
        else:
            self.finished.emit(value)
        finally:
            QThread.currentThread().quit()


def progress_line(value: Any) -> tuple[float | None, str] | None:
    """What a strip shows of a worker's report: ``(fraction, text)`` from a ``report`` call's tuple or from an
    engine ``Progress`` (its ``fraction`` and ``message``, else its stage); None for anything else."""
    if isinstance(value, tuple) and len(value) == 2:
        return value
    if hasattr(value, "fraction"):
        return value.fraction, getattr(value, "message", "") or getattr(value, "stage", "")
    return None


class Job(QObject):
    """A worker in its own thread, plus GUI-thread slots that forward its signals to plain callbacks.

    The callbacks are called in the GUI thread (the forwarding slots are bound methods of this object,
    which lives there). When the thread ends the job removes itself from its runner. ``outcome`` is
    ``finished``, ``failed`` or ``cancelled`` once the worker has said.
    """

    def __init__(
        self, runner: JobRunner, name: str, worker: Worker, callbacks: dict[str, Callable[..., Any]]
    ):
        super().__init__(runner)
        self.name = name
        self.worker = worker
        self.callbacks = callbacks
        self.worker_thread = QThread()
        self.worker_thread.setObjectName(f"volsynth-{name}")
        self._runner = runner
        worker.moveToThread(self.worker_thread)
        self.worker_thread.started.connect(worker.run)
        for signal_name, slot in (
            ("progressed", self._on_worker_progressed),
            ("finished", self._on_worker_finished),
            ("failed", self._on_worker_failed),
            ("cancelled", self._on_worker_cancelled),
        ):
            signal = getattr(worker, signal_name, None)
            if signal is not None:
                signal.connect(slot)
        self.worker_thread.finished.connect(self._on_thread_finished)
        self.abandoned = False
        self.outcome = ""
        self.strip: JobStrip | None = None  # shows the job (``JobRunner.run``)
        # What ends the job for the user (strip, busy mark, ``ended``): ``JobRunner.run`` sets it; called once.
        self.stop_showing: Callable[[], None] = _ignore
        self.cancelling_text = "Cancelling\u2026"

    def start(self) -> None:
        self.worker_thread.start()

    def cancel(self) -> None:
        """Ask the work to stop (Cancel, Esc, closing the window); its strip says so until it ends."""
        cancel = getattr(self.worker, "cancel", None)
        if cancel is not None:
            cancel()
        if self.strip is not None and self.strip.job is self and not self.outcome:
            self.strip.show_cancelling(self.cancelling_text)

    @property
    def can_abandon(self) -> bool:
        """Whether the job may be left running (a generation: its result can be dropped; a file write cannot)."""
        return getattr(self.worker, "can_abandon", False)

    def _call(self, key: str, *args: Any) -> None:
        if self.abandoned:  # an abandoned run's late result, error or "cancelled" is dropped
            return
        callback = self.callbacks.get(key)
        if callback is not None:
            callback(*args)

    @Slot(object)
    def _on_worker_progressed(self, value: Any) -> None:
        self._call("progressed", value)

    @Slot(object)
    def _on_worker_finished(self, value: Any) -> None:
        self.outcome = "finished"
        self._call("finished", value)

    @Slot(str)
    def _on_worker_failed(self, message: str) -> None:
        self.outcome = "failed"
        self._call("failed", message)

    @Slot()
    def _on_worker_cancelled(self) -> None:
        self.outcome = "cancelled"
        self._call("cancelled")

    @Slot()
    def _on_thread_finished(self) -> None:
        self._runner._forget(self)
        self._call("ended")


class JobRunner(QObject):
    """Starts workers in threads and keeps them alive until their threads end. Lives in the GUI thread.

    ``run`` is what a feature calls: it starts the worker and owns the job's life as the user sees it (the
    strip's progress and Cancel, the one error dialog, the one "cancelled" state, the busy mark). ``start``
    and ``run_task`` are the plain forms underneath, for look-ups and writes nobody watches.

    Args:
        show_error: ``(title, message)``, the app's one error dialog (a failed job without its own handler).
        show_status: ``(text, timeout_ms)``, the status line ("Tissue maps cancelled").
        hold_engine: ``(running)``, called with True when a job that needs the engine to itself starts and
            with False when it ends (``AppState.set_job_running``: one engine job at a time).
    """

    busy_changed = Signal(bool)  # the first job started with ``run`` began, or the last one ended

    def __init__(
        self,
        parent: QObject | None = None,
        *,
        show_error: Callable[[str, str], None] | None = None,
        show_status: Callable[..., None] | None = None,
        hold_engine: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(parent)
        self.jobs: list[Job] = []
        self.closing = False
        self._show_error = show_error or _log_error
        self._show_status = show_status or _ignore
        self._hold_engine = hold_engine or _ignore
        self.activity = JobActivity()  # the main window puts it in its status bar
        self.shown: list[Job] = []  # the jobs started with ``run``, in the order they started
        self.busy = False  # whether any of them runs (the busy mark is up)

    def run(
        self,
        name: str,
        worker: Worker,
        *,
        what: str,
        done: Callable[[Any], None],
        strip: JobStrip | None = None,
        text: str = "Starting\u2026",
        cancelling_text: str = "Cancelling\u2026",
        progressed: Callable[[Any], None] | None = None,
        describe: Callable[[Any], tuple[float | None, str] | None] = progress_line,
        failed: Callable[[str], None] | None = None,
        cancelled: Callable[[], None] | None = None,
        ended: Callable[[str], None] | None = None,
        holds_engine: bool = False,
        cancellable: bool = True,
    ) -> Job:
        """Start ``worker`` as a job the user sees; ``what`` names it to them ("Tissue maps").

        ``done(value)`` gets the result. ``strip`` shows the progress (``describe(report)`` gives its
        ``(fraction, text)``, None to leave it) and its Cancel stops the job; ``progressed(report)`` is the
        feature's own view of each report. A failure goes to ``failed(message)`` when given (a dialog that says
        it in place), else to the error dialog titled "<what> failed"; a cancel ends as "cancelled", said in the
        status line unless ``cancelled()`` says it otherwise. ``ended(outcome)`` comes last, after the thread
        ended (or the job was abandoned): "finished", "failed", "cancelled" or "abandoned". ``holds_engine``:
        no other engine job may start meanwhile (a generation, a comparison).
        """
        job = self.start(
            name,
            worker,
            progressed=lambda value: self._on_job_progressed(job, value, progressed, describe),
            finished=lambda value: self._on_job_finished(job, value, done),
            failed=lambda message: self._on_job_failed(job, what, message, failed),
            cancelled=lambda: self._on_job_cancelled(job, what, cancelled),
            ended=lambda: job.stop_showing(),
        )
        job.stop_showing = partial(self._on_job_ended, job, holds_engine, ended)
        job.setObjectName(what)
        job.cancelling_text = cancelling_text
        if strip is not None:
            job.strip = strip
            strip.begin(job, text, cancellable)
        if holds_engine:
            self._hold_engine(True)
        self.shown.append(job)
        self._show_busy()
        return job

    # The callbacks below run in the GUI thread: the Job calls them from its own slots (see Job).

    def _on_job_progressed(self, job: Job, value: Any, progressed, describe) -> None:
        if job.strip is not None:
            line = describe(value)
            if line is not None:
                job.strip.report(*line)
        if progressed is not None:
            progressed(value)

    def _on_job_finished(self, job: Job, value: Any, done: Callable[[Any], None]) -> None:
        if job.strip is not None:
            job.strip.end("finished")
        done(value)

    def _on_job_failed(self, job: Job, what: str, message: str, failed) -> None:
        if job.strip is not None:
            job.strip.end("failed")
        if failed is not None:
            failed(message)
        else:
            self._show_error(f"{what} failed", message)

    def _on_job_cancelled(self, job: Job, what: str, cancelled) -> None:
        if job.strip is not None:
            job.strip.end("cancelled")
        if cancelled is not None:
            cancelled()
        else:
            self._show_status(f"{what} cancelled", 5000)

    def _on_job_ended(self, job: Job, holds_engine: bool, ended) -> None:
        job.stop_showing = _ignore
        if job.strip is not None and job.strip.job is job:  # ended without a word (an abandoned thread)
            job.strip.end(job.outcome or "cancelled")
        if job in self.shown:
            self.shown.remove(job)
        if holds_engine:  # first: what the feature does at the end may start the next engine job
            self._hold_engine(False)
        self._show_busy()
        if ended is not None:
            ended(job.outcome or "cancelled")

    def _show_busy(self) -> None:
        """The busy mark: the status bar's hourglass (its tooltip names the jobs) and the busy pointer."""
        self.activity.show_jobs([job.objectName() for job in self.shown])
        busy = bool(self.shown)
        if busy != self.busy:
            self.busy = busy
            if busy:
                QGuiApplication.setOverrideCursor(Qt.CursorShape.BusyCursor)
            else:
                QGuiApplication.restoreOverrideCursor()
            self.busy_changed.emit(busy)

    def start(self, name: str, worker: Worker, **callbacks: Callable[..., Any]) -> Job:
        """Start ``worker.run`` in a new thread. Callbacks: progressed, finished, failed, cancelled, ended."""
        job = Job(self, name, worker, callbacks)
        self.jobs.append(job)
        job.start()
        return job

    def run_task(
        self, name: str, function: Callable[..., Any], *args: Any, **callbacks: Callable[..., Any]
    ) -> Job:
        """Run ``function(*args)`` in a thread; keyword arguments are callbacks (bind others with partial)."""
        unknown = set(callbacks) - {"progressed", "finished", "failed", "cancelled", "ended"}
        if unknown:
            raise TypeError(
                f"unknown callback(s) {sorted(unknown)}; bind function arguments with functools.partial"
            )
        return self.start(name, Worker.call(function, *args), **callbacks)

    def running(self, name: str | None = None) -> list[Job]:
        return [job for job in self.jobs if name is None or job.name == name]

    def _forget(self, job: Job) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
        job.worker_thread.wait()
        job.worker.deleteLater()
        job.deleteLater()

    def abandon(self, job: Job) -> None:
        """Leave ``job`` running unheard (a generation that did not stop): it no longer counts as running."""
        if job in self.jobs:
            self.jobs.remove(job)
        job.abandoned = True
        job.worker.abandon()
        _keep_until_finished(job.worker_thread, job.worker)
        job.outcome = job.outcome or "abandoned"
        job.stop_showing()  # its thread's end will not be heard

    def shutdown(self, timeout_ms: int = 10_000, abandon_after_ms: int = 2_000) -> None:
        """Cancel everything and wait for the threads (called when the window closes).

        A run that can be abandoned gets ``abandon_after_ms`` to stop at a step, then is abandoned, so quitting
        never waits on a step that does not end. Everything else (saves, recovery, vault tasks, look-ups) is
        waited for until it ends: a write's data must reach the disk, and a QThread destroyed while it runs
        aborts the process (a look-up slower than a fixed wait on a busy machine did exactly that). Each
        ``timeout_ms`` of waiting is logged, so a task that does not end is named.
        """
        self.closing = True  # features that start background work on events stop doing so now
        for job in list(self.jobs):
            job.cancel()
        for job in list(self.jobs):
            if job.can_abandon and not job.worker_thread.wait(abandon_after_ms):
                self.abandon(job)
                continue
            while not job.worker_thread.wait(timeout_ms):
                log.warning("closing: still waiting for %s to finish", job.name)


def _log_error(title: str, message: str) -> None:
    log.error("%s: %s", title, message)


def _ignore(*_args: Any) -> None:
    pass
