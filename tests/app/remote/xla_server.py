"""A real ``volsynth serve --device xla`` in its own process (tiny model), as users run it, for GUI tests
that talk to it over HTTP only; and connecting the main window to it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from engine.testing import make_tiny_model

REPO = Path(__file__).resolve().parents[3]
PLAN_TIMEOUT_MS = 180_000  # the tiny model plans in seconds, but the machine is shared
TOKEN = "plan-dialog-test-Zr7Qw2Lp9Xc4Vb8Nm3Ks6Hj1Gf5Dd0Ta"  # `serve` refuses weak tokens


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def xla_server(root: Path, *serve_args: str) -> Iterator[str]:
    """The server's URL once it answers ``/info``; a server that exits instead fails the test with what it
    printed. ``serve_args`` follow ``serve --device xla`` (e.g. ``--xla-devices 4``)."""
    make_tiny_model(root / "tiny-latent", model_id="tiny-latent")
    port = free_port()
    env = dict(os.environ, VOLSYNTH_MODEL_PATH=str(root), VOLSYNTH_SERVER_TOKEN=TOKEN)
    command = ["serve", "--device", "xla", *serve_args, "--port", str(port)]
    log = root / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "engine", *command],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5) as client:
            for _attempt in range(600):
                if server.poll() is not None:
                    pytest.fail(f"volsynth {' '.join(command)} exited: {log.read_text()[-2000:]}")
                try:
                    if client.get(f"{url}/info").status_code == 200:
                        break
                except httpx.TransportError:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        server.wait(timeout=0.2)  # not listening yet: wait a little, or see it exit
            else:
                pytest.fail(f"volsynth {' '.join(command)} did not answer: {log.read_text()[-2000:]}")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def connect(qtbot, window, url: str) -> None:
    """File > Connect to Engine Server..., the URL and token typed, Connect clicked; waits for the link."""
    connect_remote(qtbot, window.remote, url)


def connect_remote(qtbot, remote, url: str, token: str = TOKEN) -> None:
    """Connect to Engine Server... of the ``RemoteController`` ``remote``, the URL and token typed, Connect
    clicked; waits for the link."""
    count = len(remote.connections)
    remote.connect_action.trigger()
    dialog = remote.dialog
    dialog.url_edit.setText(url)
    dialog.token_edit.setText(token)
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(remote.connections) > count, timeout=30_000)


def open_plan_dialog(qtbot, window):
    """Generate > Plan Multi-Device Run... by its shortcut, in the active window; the dialog once shown."""
    return open_plan_dialog_of(qtbot, window, window.remote)


def open_plan_dialog_of(qtbot, host, remote):
    """Plan Multi-Device Run... of ``remote`` by its shortcut, pressed in ``host`` (the window its actions
    are in), made the active window; the dialog once shown."""
    assert remote.plan_action.isEnabled()
    host.activateWindow()  # the connect dialog had the focus; shortcuts fire in the active window
    qtbot.waitUntil(host.isActiveWindow, timeout=5_000)
    QTest.keySequence(host, remote.plan_action.shortcut())
    qtbot.waitUntil(lambda: remote.plan_dialog is not None and remote.plan_dialog.isVisible(), timeout=5_000)
    return remote.plan_dialog
