"""Long work off the UI thread: worker QObjects moved to QThreads, and the runner that owns them.

Rules (see DESIGN.md, "App"):
  * the worker drives the engine generator itself and, on cancel, calls ``gen.close()`` in its own thread
    so the engine's ``finally`` blocks run where the work ran;
  * signals are past tense (``progressed``, ``finished``, ``failed``, ``cancelled``);
  * PySide6 6.12 may run a lambda connected to a worker signal in the worker thread, so the runner connects
    worker signals only to bound methods of QObjects living in the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.errors import EngineError

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
                if device in self._servers:
                    from engine.backends.remote import RemoteBackend

                    url, token, fingerprint = self._servers[device]
                    backend = RemoteBackend(url, token=token, fingerprint=fingerprint)
                else:
                    from engine.backends.local import LocalBackend

                    backend = LocalBackend(device=device, registry=self._registry)
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


class GenerationWorker(QObject):
    """Runs one ``SamplingRequest`` on a backend; lives in a QThread."""

    progressed = Signal(object)  # engine.api.Progress
    finished = Signal(object)  # engine.api.SamplingResult
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, request, backend_provider: Callable[[], Any]) -> None:
        super().__init__()
        self.request = request
        self._backend_provider = backend_provider
        self._cancel = threading.Event()
        self._backend = None

    def cancel(self) -> None:
        """Ask the run to stop at the next step boundary (thread-safe; the worker closes the generator)."""
        self._cancel.set()

    def abandon(self) -> None:
        """Give up on a run that did not stop (called from the GUI thread; returns at once).

        A backend that can (an engine server's) asks the server to cancel and cuts the connection, in a
        thread of its own so a slow network never blocks the window; a local step is left to finish on its
        own. Whatever the worker reports afterwards is dropped by its job.
        """
        self._cancel.set()
        abandon = getattr(self._backend, "abandon", None)
        if abandon is not None:
            threading.Thread(target=abandon, name="volsynth-abandon", daemon=True).start()

    @Slot()
    def run(self) -> None:
        try:
            backend = self._backend_provider()
            self._backend = backend
            job = backend.sample(self.request)
            try:
                while True:
                    if self._cancel.is_set():
                        job.close()  # in this (the worker) thread: the engine cleans up here
                        self.cancelled.emit()
                        return
                    try:
                        progress = next(job)
                    except StopIteration as done:
                        result = done.value
                        break
                    self.progressed.emit(progress)
            finally:
                job.close()
            if self._cancel.is_set():
                self.cancelled.emit()
            else:
                self.finished.emit(result)
        except BaseException as exc:  # noqa: BLE001 - everything must reach the user as a message
            if not isinstance(exc, EngineError):
                log.error("generation failed:\n%s", traceback.format_exc())
            self.failed.emit(user_message(exc))
        finally:
            QThread.currentThread().quit()


class TaskWorker(QObject):
    """Runs one function (load, save, list devices...) in a QThread and reports its return value."""

    finished = Signal(object)
    failed = Signal(str)

    def __init__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._call = (function, args, kwargs)

    @Slot()
    def run(self) -> None:
        function, args, kwargs = self._call
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            if not isinstance(exc, EngineError):
                log.error("background task failed:\n%s", traceback.format_exc())
            self.failed.emit(user_message(exc))
        else:
            self.finished.emit(value)
        finally:
            QThread.currentThread().quit()


class Job(QObject):
    """A worker in its own thread, plus GUI-thread slots that forward its signals to plain callbacks.

    The callbacks are called in the GUI thread (the forwarding slots are bound methods of this object,
    which lives there). When the thread ends the job removes itself from its runner.
    """

    def __init__(
        self, runner: JobRunner, name: str, worker: QObject, callbacks: dict[str, Callable[..., Any]]
    ):
        super().__init__(runner)
        self.name = name
        self.worker = worker
        self.callbacks = callbacks
        self.thread = QThread()
        self.thread.setObjectName(f"volsynth-{name}")
        self._runner = runner
        worker.moveToThread(self.thread)
        self.thread.started.connect(worker.run)
        for signal_name, slot in (
            ("progressed", self._on_worker_progressed),
            ("finished", self._on_worker_finished),
            ("failed", self._on_worker_failed),
            ("cancelled", self._on_worker_cancelled),
        ):
            signal = getattr(worker, signal_name, None)
            if signal is not None:
                signal.connect(slot)
        self.thread.finished.connect(self._on_thread_finished)
        self.abandoned = False

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        cancel = getattr(self.worker, "cancel", None)
        if cancel is not None:
            cancel()

    @property
    def can_abandon(self) -> bool:
        """Whether the job may be left running (a generation: its result can be dropped; a file write cannot)."""
        return hasattr(self.worker, "abandon")

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
        self._call("finished", value)

    @Slot(str)
    def _on_worker_failed(self, message: str) -> None:
        self._call("failed", message)

    @Slot()
    def _on_worker_cancelled(self) -> None:
        self._call("cancelled")

    @Slot()
    def _on_thread_finished(self) -> None:
        self._runner._forget(self)
        self._call("ended")


class JobRunner(QObject):
    """Starts workers in threads and keeps them alive until their threads end. Lives in the GUI thread."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.jobs: list[Job] = []
        self.closing = False

    def start(self, name: str, worker: QObject, **callbacks: Callable[..., Any]) -> Job:
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
        return self.start(name, TaskWorker(function, *args), **callbacks)

    def running(self, name: str | None = None) -> list[Job]:
        return [job for job in self.jobs if name is None or job.name == name]

    def _forget(self, job: Job) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
        job.thread.wait()
        job.worker.deleteLater()
        job.deleteLater()

    def abandon(self, job: Job) -> None:
        """Leave ``job`` running unheard (a generation that did not stop): it no longer counts as running."""
        if job in self.jobs:
            self.jobs.remove(job)
        job.abandoned = True
        job.worker.abandon()
        _keep_until_finished(job.thread, job.worker)

    def shutdown(self, timeout_ms: int = 10_000, abandon_after_ms: int = 2_000) -> None:
        """Cancel everything and wait for the threads (called when the window closes).

        Writes (saves, recovery) are waited for up to ``timeout_ms``: their data must reach the disk. A run
        that can be abandoned gets ``abandon_after_ms`` to stop at a step, then is abandoned, so quitting
        never waits on a step that does not end.
        """
        self.closing = True  # features that start background work on events stop doing so now
        for job in list(self.jobs):
            job.cancel()
        for job in list(self.jobs):
            if job.can_abandon and not job.thread.wait(abandon_after_ms):
                self.abandon(job)
                continue
            job.thread.wait(timeout_ms)


class GeneratorWorker(QObject):
    """Drives any engine generator (``Progress`` out, a value returned) in a QThread; cancel closes it there.

    ``make_job`` is called in the worker thread, so the engine imports and starts its work off the UI thread.
    """

    progressed = Signal(object)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, make_job: Callable[[], Any]) -> None:
        super().__init__()
        self._make_job = make_job
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @Slot()
    def run(self) -> None:
        try:
            job = self._make_job()
            try:
                while not self._cancel.is_set():
                    try:
                        self.progressed.emit(next(job))
                    except StopIteration as done:
                        self.finished.emit(done.value)
                        return
            finally:
                job.close()  # in this thread: the engine's clean-up (child processes...) runs here
            self.cancelled.emit()
        except BaseException as exc:  # noqa: BLE001 - everything must reach the user as a message
            if not isinstance(exc, EngineError):
                log.error("background job failed:\n%s", traceback.format_exc())
            self.failed.emit(user_message(exc))
        finally:
            QThread.currentThread().quit()
