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


def test_menu_shortcuts_fire_wherever_the_focus_is(qtbot, main_window_3d):
    window = main_window_3d
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=10_000)
    actions = {
        "Ctrl+/": window.help.shortcuts_action,
        "Ctrl+R": window.random_seed_action,
        "Ctrl+Shift+X": window.viewer_toolbar.crosshair_action,
        "Ctrl+I": window.smooth_action,
    }
    fired = {keys: _count(action) for keys, action in actions.items()}
    for name, focus in _focus_targets(window):
        focus()
        for keys in actions:
            before = len(fired[keys])
            _press(keys)
            if keys == "Ctrl+/":
                qtbot.waitUntil(lambda: window.help.shortcuts_dialog is not None, timeout=5_000)
                window.help.shortcuts_dialog.close()
                window.activateWindow()
                qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
                focus()
            assert len(fired[keys]) == before + 1, f"{keys} did nothing with the focus on the {name}"
    # Ctrl+G and Esc from the 3D view (the last one clicked): a run starts and is cancelled.
    assert "3D" in name
    with qtbot.waitSignal(window.generation.ended, timeout=120_000) as ended:
        _press("Ctrl+G")
        assert window.generation.running
        _press("Esc")
    assert ended.args[0] in ("cancelled", "finished")


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
