"""The menu shortcuts work whatever has the keyboard focus (a slice view, the 3D view after a click, a text
field, the session list), and the keys a text field owns (arrows, +/-) stay the field's. By keys."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.render


def _count(action) -> list:
    fired: list = []
    action.triggered.connect(lambda *_: fired.append(1))
    return fired


def _press(sequence: str) -> None:
    """Type ``sequence`` into whatever has the keyboard focus, as the keyboard would."""
    target = QApplication.focusWidget() or QApplication.activeWindow()
    assert target is not None
    QTest.keySequence(target, QKeySequence(sequence))


def _focus_targets(window):
    """What a user may have clicked last: (name, function that gives it the focus the way a click does)."""

    def click(widget, at=None):
        def go():
            QTest.mouseClick(
                widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, at or QPoint()
            )

        return go

    view3d = window.viewer.view3d
    interactor = view3d.plotter.interactor if view3d.plotter is not None else None
    targets = [
        ("axial view", click(window.viewer.axial, window.viewer.axial.rect().center())),
        ("steps field", click(window.sampling_panel.steps_spin.lineEdit())),
        ("session list", click(window.session_panel.list.viewport())),
    ]
    if interactor is not None:
        targets.append(("3D view", click(interactor, interactor.rect().center())))
    return targets


SHORTCUT_KEYS = ("Ctrl+/", "Ctrl+R", "Ctrl+Shift+X", "Ctrl+I")


def _actions(window) -> dict:
    return {
        "Ctrl+/": window.help.shortcuts_action,
        "Ctrl+R": window.generation.random_seed_action,
        "Ctrl+Shift+X": window.viewer_toolbar.crosshair_action,
        "Ctrl+I": window.window_actions.smooth,
    }


def _press_all(window, focus, wait_until) -> list[str]:
    """Give the focus with ``focus()``, type each shortcut into the focus widget; the keys that did nothing."""
    actions = _actions(window)
    fired = {keys: _count(action) for keys, action in actions.items()}
    missed = []
    focus()
    for keys in SHORTCUT_KEYS:
        before = len(fired[keys])
        _press(keys)
        if keys == "Ctrl+/":
            wait_until(lambda: window.help.shortcuts_dialog is not None)
            window.help.shortcuts_dialog.close()
            window.activateWindow()
            wait_until(window.isActiveWindow)
            focus()
        if len(fired[keys]) != before + 1:
            missed.append(keys)
    return missed


def test_menu_shortcuts_fire_wherever_the_focus_is(qtbot, main_window):
    window = main_window

    def wait_until(condition):
        qtbot.waitUntil(condition, timeout=5_000)

    for name, focus in _focus_targets(window):
        assert not _press_all(window, focus, wait_until), f"with the focus on the {name}"


# The 3D view needs its own process: under Xvfb without a window manager a second window with a 3D view in
# one process never becomes active (see tests/app/conftest.py, window_3d), and window shortcuts need an active window.


@pytest.mark.slow
def test_menu_shortcuts_fire_after_a_click_in_the_3d_view(tmp_path, tiny_models_dir):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo), "XDG_DATA_HOME": str(tmp_path / "data")}
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_shortcuts_after_3d_click.py")),
            str(tiny_models_dir),
            str(tmp_path / "s.ini"),
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "missed: none" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "generate after a click in 3D: True" in done.stdout


def test_a_text_field_keeps_its_own_keys(qtbot, main_window):
    window = main_window
    steps = window.sampling_panel.steps_spin
    steps.setValue(10)
    QTest.mouseClick(steps.lineEdit(), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(steps.hasFocus, timeout=5_000)
    zoom = window.viewer.axial.zoom
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Up)
    assert steps.value() == 11
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Down)
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Down)
    assert steps.value() == 9
    steps.selectAll()
    qtbot.keyClicks(QApplication.focusWidget(), "12")
    assert steps.value() == 12 and window.viewer.axial.zoom == zoom  # no view zoomed or stepped
