"""Stopping a running cohort from the keyboard (the dialog alone, on app services): Alt+S stops it after the
volumes in flight, the dialog says so while it stops and how it ended, and Run is offered again."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

pytestmark = [pytest.mark.render, pytest.mark.slow]


class HeldRun:
    """Stands in for ``engine.cohort.run_cohort``: one volume done, then waits for Stop, then for the test
    (the volumes in flight), and returns the summary of a stopped cohort, as the engine does."""

    def __init__(self) -> None:
        self.reached_stop_wait = threading.Event()
        self.in_flight_done = threading.Event()

    def __call__(self, spec, root, *, on_progress, should_stop, **options):
        from engine.cohort.runner import CohortProgress, CohortSummary

        on_progress(
            CohortProgress("done", 1, 0, spec.count, 0, 1.0, 60.0, None, "sub-01", str(Path(root) / "a"))
        )
        self.reached_stop_wait.set()
        while not should_stop():
            threading.Event().wait(0.01)  # the engine's loop polls should_stop between its items the same way
        self.in_flight_done.wait(10)
        return CohortSummary(Path(root), "cohort-id", spec.count, 1, 0, 0, 1, 1.0, 1, 1, "cpu", stopped=True)


def test_a_running_cohort_stops_with_alt_s(qtbot, app_services, tmp_path, monkeypatch, screenshot):
    import engine.cohort
    from app.cohort import CohortController

    run = HeldRun()
    monkeypatch.setattr(engine.cohort, "run_cohort", run)  # where cohort_worker imports it from
    app_services.state.select_model(app_services.state.model_by_id("tiny-latent"))
    dialog = CohortController(app_services).open()
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    qtbot.waitUntil(dialog.isActiveWindow, timeout=5_000)
    dialog.out_edit.setText(str(tmp_path / "cohort"))

    qtbot.keyClick(dialog, Qt.Key.Key_R, Qt.KeyboardModifier.AltModifier)  # Run Cohort
    qtbot.waitUntil(lambda: dialog.job is not None and run.reached_stop_wait.is_set(), timeout=10_000)
    qtbot.waitUntil(lambda: dialog.done_list.count() == 1, timeout=5_000)
    assert dialog.stop_button.isEnabled() and not dialog.run_button.isEnabled()
    assert app_services.runner.activity.isVisible()  # the busy mark names the running cohort
    assert "Cohort" in app_services.runner.activity.toolTip()

    qtbot.keyClick(dialog, Qt.Key.Key_S, Qt.KeyboardModifier.AltModifier)  # Stop (its click is animated)
    qtbot.waitUntil(lambda: dialog.status.text() == "Stopping after the volumes in flight...", timeout=5_000)
    assert not dialog.stop_button.isEnabled()
    screenshot(dialog, "cohort-stopping")
    run.in_flight_done.set()
    qtbot.waitUntil(lambda: dialog.job is None, timeout=10_000)
    assert dialog.status.text().startswith("Stopped: 1/2 volumes")
    assert dialog.run_button.isEnabled() and not dialog.stop_button.isEnabled()
    assert not app_services.runner.activity.isVisible()
