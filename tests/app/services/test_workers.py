"""The one app worker (app/services/workers.py ``Worker``) in its four kinds, run by a real ``JobRunner`` thread."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QCoreApplication

from app.services.workers import JobRunner, Worker
from engine.errors import Cancelled, InvalidRequest

pytestmark = pytest.mark.render


_RUNNERS: list[JobRunner] = []  # a JobRunner lives as long as its window does: never collected mid-test


def _runner() -> JobRunner:
    _RUNNERS.append(JobRunner())
    return _RUNNERS[-1]


def _run(qtbot, worker: Worker, cancel_when: threading.Event | None = None) -> list:
    runner = _runner()
    seen: list = []
    job = runner.start(
        "test",
        worker,
        progressed=lambda value: seen.append(("progressed", value)),
        finished=lambda value: seen.append(("finished", value)),
        failed=lambda message: seen.append(("failed", message)),
        cancelled=lambda: seen.append(("cancelled",)),
        ended=lambda: seen.append(("ended",)),
    )
    if cancel_when is not None:
        assert cancel_when.wait(10)
        job.cancel()
    qtbot.waitUntil(lambda: seen[-1:] == [("ended",)], timeout=10_000)
    return seen


def test_call_reports_its_value_or_the_engines_message(qtbot):
    assert _run(qtbot, Worker.call(lambda a, b: a + b, 2, 3)) == [("finished", 5), ("ended",)]

    def refuse():
        raise InvalidRequest("steps must be at least 1")

    assert _run(qtbot, Worker.call(refuse)) == [("failed", "steps must be at least 1"), ("ended",)]
    assert not Worker.call(refuse).can_abandon


def test_generator_relays_progress_and_closes_the_generator_in_its_thread_on_cancel(qtbot):
    started, closed_in = threading.Event(), []

    def job():
        try:
            yield 1
            started.set()
            while True:
                yield 2
        finally:
            closed_in.append(threading.current_thread().name)

    seen = _run(qtbot, Worker.generator(job), cancel_when=started)
    assert seen[0] == ("progressed", 1) and seen[-2:] == [("cancelled",), ("ended",)]
    assert closed_in and closed_in[0] != threading.main_thread().name  # closed in the worker thread

    def done():
        yield 1
        return "value"

    assert _run(qtbot, Worker.generator(done)) == [("progressed", 1), ("finished", "value"), ("ended",)]


class _Backend:
    def __init__(self, release: threading.Event, reached: threading.Event) -> None:
        self.release, self.reached, self.abandoned = release, reached, threading.Event()

    def sample(self, request):
        yield "step"
        self.reached.set()
        self.release.wait(10)  # a step that ends only after the cancel
        return f"result of {request}"

    def abandon(self):
        self.abandoned.set()


def test_generation_counts_a_result_that_arrives_after_cancel_as_cancelled(qtbot):
    release, reached = threading.Event(), threading.Event()
    backend = _Backend(release, reached)
    worker = Worker.generation("req", lambda: backend)
    assert worker.can_abandon
    runner = _runner()
    seen: list = []
    job = runner.start(
        "generate",
        worker,
        finished=lambda value: seen.append(("finished", value)),
        cancelled=lambda: seen.append(("cancelled",)),
        ended=lambda: seen.append(("ended",)),
    )
    assert reached.wait(10)
    job.cancel()
    release.set()
    qtbot.waitUntil(lambda: seen[-1:] == [("ended",)], timeout=10_000)
    assert seen == [("cancelled",), ("ended",)]

    assert _run(qtbot, Worker.generation("r2", lambda: _Backend(_set(), threading.Event()))) == [
        ("progressed", "step"),
        ("finished", "result of r2"),
        ("ended",),
    ]


def _set() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def test_abandon_asks_the_backend_to_abandon_and_drops_late_reports(qtbot):
    release, reached = threading.Event(), threading.Event()
    backend = _Backend(release, reached)
    runner = _runner()
    seen: list = []
    job = runner.start("generate", Worker.generation("req", lambda: backend), finished=seen.append)
    assert reached.wait(10)
    runner.abandon(job)
    assert backend.abandoned.wait(10) and not runner.jobs
    release.set()
    qtbot.waitUntil(lambda: not job.worker_thread.isRunning(), timeout=10_000)
    # The worker's result and the thread's end were posted to this thread before the thread stopped
    # running: deliver them, then look (no wait on the clock for them to arrive).
    QCoreApplication.sendPostedEvents()
    assert seen == []  # the abandoned run's result is dropped


@pytest.mark.parametrize("cancel", [False, True])
def test_reporting_call_stops_at_the_next_report_after_cancel(qtbot, cancel):
    """The vault's kind: ``function(*args, report=...)`` whose report raises Cancelled after cancel()."""
    started, saw_cancelled = threading.Event(), []

    def import_chunks(count, report):
        report(0.0, "starting")
        started.set()
        try:
            for index in range(count):
                report((index + 1) / count, f"chunk {index}")
                if cancel:
                    threading.Event().wait(0.01)
        except Cancelled:
            saw_cancelled.append(True)
            raise
        return "imported"

    worker = Worker.reporting_call(import_chunks, 100_000 if cancel else 3)
    seen = _run(qtbot, worker, cancel_when=started if cancel else None)
    assert seen[0] == ("progressed", (0.0, "starting"))
    if cancel:
        assert seen[-2:] == [("cancelled",), ("ended",)] and saw_cancelled == [True]
    else:
        assert seen[-3:] == [("progressed", (1.0, "chunk 2")), ("finished", "imported"), ("ended",)]
        assert worker.error is None


def test_closing_waits_for_a_task_slower_than_the_wait_instead_of_destroying_its_thread(qtbot, caplog):
    """A look-up still running when the window closes is waited for, not left to a QThread destroyed while it
    runs (which aborts the process): seen with Generate's tune look-up on a busy machine."""
    import logging

    release = threading.Event()

    class ReleaseOnWaitLog(logging.Handler):
        def emit(self, record):
            if "still waiting for tune-lookup" in record.getMessage():
                release.set()  # the task ends only once shutdown has waited past its timeout once

    handler = ReleaseOnWaitLog()
    logging.getLogger("app.services.workers").addHandler(handler)
    try:
        runner = _runner()
        job = runner.run_task("tune-lookup", lambda: release.wait(60))
        runner.shutdown(timeout_ms=20, abandon_after_ms=20)
    finally:
        logging.getLogger("app.services.workers").removeHandler(handler)
    assert release.is_set()
    assert job.worker_thread.isFinished()
