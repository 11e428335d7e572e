"""Driving widgets from the keyboard, as a user does."""

from __future__ import annotations

from PySide6.QtCore import Qt


def pick(qtbot, box, data) -> None:
    """Choose the item holding ``data`` (or at index ``data`` when it is an int) with the arrow keys, as a user
    does in a focused combo box."""
    box.setFocus()
    qtbot.waitUntil(box.hasFocus, timeout=5_000)
    target = box.findData(data) if not isinstance(data, int) else data
    assert target >= 0, data
    key = Qt.Key.Key_Down if target > box.currentIndex() else Qt.Key.Key_Up
    for _ in range(abs(target - box.currentIndex())):
        qtbot.keyClick(box, key)
    assert box.currentIndex() == target


def type_into(qtbot, spin, text: str) -> None:
    """Replace a spin box's text by typing, then leave it with Tab (which commits the value)."""
    spin.lineEdit().selectAll()
    qtbot.keyClicks(spin.lineEdit(), text)
    qtbot.keyClick(spin.lineEdit(), Qt.Key.Key_Tab)


def click_item(qtbot, combo, text: str) -> None:
    """Open the combo box's list with a click and pick the item in it with the keys, as a person does (a
    click inside a list that has only just opened is taken by Qt as the end of the opening click)."""
    qtbot.mouseClick(combo, Qt.MouseButton.LeftButton)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5_000)
    row = combo.findText(text)
    assert row >= 0, f"no {text!r} among {[combo.itemText(i) for i in range(combo.count())]}"
    qtbot.keyClick(view, Qt.Key.Key_Home)
    for _ in range(row):
        qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5_000)
    assert combo.currentText() == text
