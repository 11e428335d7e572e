"""A run whose step never ends: Cancel gives up after a deadline it counts down, and Quit always quits,
for a local run and for one on a real engine server (uvicorn on 127.0.0.1); stage messages are shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.services.workers import abandoned_threads_running
from engine.server import create_app
from engine.testing import ServerThread
from tests.app.remote.xla_server import connect_remote
from tests.app.stuck_backend import DENOISE_MESSAGE, LOAD_MESSAGE, StuckBackend

pytestmark = pytest.mark.render
REPO = Path(__file__).resolve().parents[3]
TOKEN = "t0ken-for-stuck-tests"
DEADLINE_S = 1.0  # the shipped 10 s, shortened so the test waits less; the count-down logic is the same


@pytest.fixture
def short_deadline(monkeypatch):
    import app.generation.controller as controller

    monkeypatch.setattr(controller, "CANCEL_DEADLINE_S", DEADLINE_S)


@pytest.fixture
def stuck(registry):
    backend = StuckBackend(registry)
    yield backend
    backend.release.set()  # lets an abandoned run end, so no thread outlives the test


def _label(generating) -> str:
    return generating.sampling_panel.progress_label.text()


def _wait_abandoned_threads_ended(qtbot):
    qtbot.waitUntil(lambda: abandoned_threads_running() == 0, timeout=30_000)


@pytest.mark.slow
def test_cancel_of_a_stuck_local_step_counts_down_then_abandons_and_drops_the_result(
    qtbot, generating, stuck, short_deadline
):
    services = generating.services
    host, runner, backends = services.parent, services.runner, services.backends
    backends._backends["auto"] = stuck  # the form's device is "auto": this run uses the stuck one
    before = len(services.state.volumes)
    qtbot.keyClick(host, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # Ctrl+G
    qtbot.waitUntil(lambda: stuck.entered.is_set() and DENOISE_MESSAGE in _label(generating), timeout=20_000)
    assert "Step 0/" in _label(generating)  # the stage message is said beside the step

    outcomes = []
    generating.generation.ended.connect(outcomes.append)
    qtbot.keyClick(host, Qt.Key.Key_Escape)  # Cancel
    assert "abandoned in 1 s if it does not stop" in _label(generating)
    assert "abandoned in" in host.statusBar().currentMessage()
    with qtbot.waitSignal(generating.generation.ended, timeout=20_000) as ended:
        pass
    assert ended.args == ["abandoned"] and outcomes == ["abandoned"]
    assert "Abandoned" in _label(generating) and "result will be dropped" in _label(generating)
    # The app is free at once although the step still runs: a new run may start.
    generation = generating.generation
    assert generation.generate_action.isEnabled() and not generation.cancel_action.isEnabled()
    assert not runner.jobs and abandoned_threads_running() == 1
    assert "auto" not in backends._backends  # the next run gets a fresh backend

    stuck.release.set()  # the step ends on its own later...
    _wait_abandoned_threads_ended(qtbot)
    assert stuck.finished_steps == 1
    assert len(services.state.volumes) == before and outcomes == ["abandoned"]  # ...and its result is dropped


@pytest.fixture
def stuck_server(stuck):
    app = create_app(stuck, token=TOKEN)
    with ServerThread(app) as url:
        yield url, app
    stuck.release.set()


def _connect(qtbot, remote, host, url):
    connect_remote(qtbot, remote, url, TOKEN)
    host.activateWindow()  # Xvfb has no window manager to give the focus back when the dialog closes
    qtbot.waitUntil(host.isActiveWindow, timeout=5_000)


@pytest.mark.slow
def test_a_stuck_remote_step_shows_the_servers_messages_and_is_abandoned_with_the_server_told(
    qtbot, generating, stuck, stuck_server, short_deadline
):
    url, server_app = stuck_server
    host = generating.services.parent
    _connect(qtbot, generating.remote, host, url)
    seen = []
    generating.services.state.progress_changed.connect(lambda tracker: seen.append(tracker.text()))
    generating.sampling_panel.generate_button.click()
    # The server's stage messages reach the panel as a local run's do, not a silent "Step 0/N".
    qtbot.waitUntil(lambda: stuck.entered.is_set() and DENOISE_MESSAGE in _label(generating), timeout=20_000)
    assert any(LOAD_MESSAGE.capitalize() + "..." in text for text in seen), seen
    assert len(server_app.state.manager.jobs) == 1

    qtbot.keyClick(host, Qt.Key.Key_Escape)
    assert "abandoned in" in _label(generating)
    with qtbot.waitSignal(generating.generation.ended, timeout=20_000) as ended:
        pass
    assert ended.args == ["abandoned"]
    # The server was asked to cancel (it forgot the job) and the connection was cut: the worker thread
    # ends while the server's step is still stuck.
    qtbot.waitUntil(lambda: not server_app.state.manager.jobs, timeout=10_000)
    _wait_abandoned_threads_ended(qtbot)
    assert not stuck.release.is_set()
    assert generating.generation.generate_action.isEnabled()


@pytest.mark.slow
def test_quit_during_a_stuck_remote_run_closes_the_window(qtbot, main_window, stuck, stuck_server):
    """The window's Quit (Ctrl+Q, answered Yes) during a run on a server whose step never ends."""
    url, server_app = stuck_server
    window = main_window
    _connect(qtbot, window.remote, window, url)
    window.sampling_panel.generate_button.click()
    qtbot.waitUntil(stuck.entered.is_set, timeout=20_000)
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)  # Ctrl+Q (answered Yes)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=20_000)
    qtbot.waitUntil(lambda: not server_app.state.manager.jobs, timeout=10_000)  # the server was told
    _wait_abandoned_threads_ended(qtbot)
    assert not stuck.release.is_set()


@pytest.mark.slow
def test_quit_during_a_stuck_local_step_ends_the_process(tmp_path, tiny_models_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(tmp_path / "data")}
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_quit_mid_step.py")),
            str(tiny_models_dir),
            str(tmp_path / "s.ini"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a bound for a hung process, not a speed check: it should end seconds after Quit
    )
    assert "stuck in a step; File > Quit" in done.stdout, done.stderr[-2000:]
    assert "event loop ended" in done.stdout and done.returncode == 0, done.stderr[-2000:]
    assert "abandoned run(s) still running" in done.stderr
