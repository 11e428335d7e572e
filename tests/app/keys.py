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
