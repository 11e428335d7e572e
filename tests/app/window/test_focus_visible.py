"""Keyboard focus is visible on every Tab stop of the Generate panel: a widget looks different with the
focus than without it. Walked by Tab, as a keyboard user walks it."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

pytestmark = pytest.mark.render


def _image(widget):
    return widget.grab().toImage()


def test_every_tab_stop_of_the_generate_panel_shows_the_focus(qtbot, main_window, screenshot):
    window = main_window
    panel = window.sampling_panel
    panel.model_box.setFocus(Qt.FocusReason.TabFocusReason)
    qtbot.waitUntil(panel.model_box.hasFocus, timeout=5_000)
    seen, invisible = [], []
    for _ in range(40):  # more than the panel has: the walk leaves it
        widget = QApplication.focusWidget()
        if widget is None or not panel.isAncestorOf(widget) or widget in seen:
            break
        seen.append(widget)
        focused = _image(widget)
        if widget is panel.generate_button:
            screenshot(window, "focus-on-generate")
        if widget is panel.steps_spin:
            screenshot(window, "focus-on-steps")
        qtbot.keyClick(widget, Qt.Key.Key_Tab)
        qtbot.waitUntil(lambda w=widget: not w.hasFocus(), timeout=5_000)
        if _image(widget) == focused:
            invisible.append(f"{type(widget).__name__} {widget.objectName() or widget.toolTip()[:40]!r}")
    names = {type(w).__name__ for w in seen}
    assert {"QComboBox", "QSpinBox", "QPushButton"} <= names and panel.generate_button in seen
    assert not invisible, f"focus not visible on {invisible}"
