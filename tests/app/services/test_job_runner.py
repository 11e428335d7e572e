"""``JobRunner.run``, the one job lifecycle every background feature uses, on a real ``AppServices``: the strip
shows the progress and its Cancel (pressed from the keyboard) stops the job, a failure is the one error dialog,
a cancel is the one "cancelled" state, the busy mark is up while a job runs and the engine is held for a job
that needs it to itself."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.services.job_view import JobStrip
from app.services.workers import Worker
from engine.errors import InvalidRequest

pytestmark = pytest.mark.render


def _placed_strip(app_services) -> JobStrip:
    """A strip placed whole in the host window, as a feature's panel would place it."""
    strip = JobStrip(app_services.parent, cancel_tip="Stop the test job")
    app_services.add_dock(strip.row(), "Test job")
    return strip


def _held_reports(reached: threading.Event):
    """Reports half-way, then again until Cancel makes ``report`` raise ``Cancelled``."""

    def work(report):
        report(0.5, "half-way")
        reached.set()
        while True:
            report(0.5, "still half-way")
            threading.Event().wait(0.01)

    return work


def test_cancel_from_the_keyboard_ends_in_the_one_cancelled_state(qtbot, app_services, screenshot):
    strip, reached, ended = _placed_strip(app_services), threading.Event(), []
    runner, state = app_services.runner, app_services.state
    job = runner.run(
        "test-job",
        Worker.reporting_call(_held_reports(reached)),
        what="Test job",
        done=pytest.fail,
        strip=strip,
        text="Starting the test job",
        ended=ended.append,
        holds_engine=True,
    )
    assert strip.progress_label.text() == "Starting the test job" and strip.cancel_button.isEnabled()
    assert state.job_running and runner.busy and runner.activity.isVisible()  # engine held, busy mark up
    assert runner.activity.toolTip() == "Running in the background: Test job"
    assert QApplication.overrideCursor().shape() == Qt.CursorShape.BusyCursor
    qtbot.waitUntil(lambda: strip.progress_label.text() == "half-way", timeout=10_000)
    assert strip.progress_bar.value() == strip.progress_bar.maximum() // 2
    screenshot(
        app_services.parent, "job-runner-running"
    )  # the strip half-way, the hourglass in the status bar

    strip.cancel_button.setFocus()
    qtbot.waitUntil(strip.cancel_button.hasFocus, timeout=5_000)
    qtbot.keyClick(strip.cancel_button, Qt.Key.Key_Space)
    assert strip.progress_label.text() == "Cancelling\u2026" and not strip.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: ended == ["cancelled"], timeout=10_000)
    assert job.outcome == "cancelled" and strip.progress_label.text() == "Cancelled"
    assert app_services.parent.statusBar().currentMessage() == "Test job cancelled"
    assert not state.job_running and not runner.busy and not runner.activity.isVisible()
    assert QApplication.overrideCursor() is None
    screenshot(app_services.parent, "job-runner-cancelled")


def test_a_failure_is_the_one_error_dialog_unless_the_feature_says_it_in_place(
    qtbot, app_services, error_dialogs
):
    strip, ended = _placed_strip(app_services), []

    def refuse():
        raise InvalidRequest("steps must be at least 1")

    app_services.runner.run(
        "test-job", Worker.call(refuse), what="Test job", done=pytest.fail, strip=strip, ended=ended.append
    )
    qtbot.waitUntil(lambda: ended == ["failed"], timeout=10_000)
    assert error_dialogs == [("Test job failed", "steps must be at least 1")]
    assert strip.progress_label.text() == "Failed" and not strip.cancel_button.isEnabled()

    said = []
    app_services.runner.run(
        "test-job",
        Worker.call(refuse),
        what="Test job",
        done=pytest.fail,
        failed=said.append,
        ended=ended.append,
    )
    qtbot.waitUntil(lambda: ended == ["failed", "failed"], timeout=10_000)
    assert said == ["steps must be at least 1"] and len(error_dialogs) == 1


def test_the_result_goes_to_done_and_the_strip_says_done(qtbot, app_services):
    strip, results, ended = _placed_strip(app_services), [], []
    app_services.runner.run(
        "test-job",
        Worker.call(lambda a, b: a + b, 2, 3),
        what="Test job",
        done=results.append,
        strip=strip,
        ended=ended.append,
    )
    qtbot.waitUntil(lambda: ended == ["finished"], timeout=10_000)
    assert results == [5] and strip.progress_label.text() == "Done"
    assert strip.progress_bar.value() == strip.progress_bar.maximum()
    assert not app_services.runner.busy and not app_services.state.job_running  # held only when asked
