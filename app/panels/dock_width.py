"""Widening a side dock to the width its panel asks for, taking the room from the dock across the viewer
when the viewer is already at its minimum width (a 1024-px window)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow

_ACROSS = {
    Qt.DockWidgetArea.LeftDockWidgetArea: Qt.DockWidgetArea.RightDockWidgetArea,
    Qt.DockWidgetArea.RightDockWidgetArea: Qt.DockWidgetArea.LeftDockWidgetArea,
}


def widen_dock(window: QMainWindow, dock: QDockWidget, width: int) -> None:
    """Make ``dock`` ``width`` px wide if the window has room: first from the viewer, then (the viewer at its
    minimum) from the visible dock on the other side, down to that dock's own minimum. A floating dock is
    left alone."""
    if dock.isFloating():
        return
    window.resizeDocks([dock], [width], Qt.Orientation.Horizontal)
    short = width - dock.width()
    across = _ACROSS.get(window.dockWidgetArea(dock))
    if short <= 0 or across is None:
        return
    others = [
        d
        for d in window.findChildren(QDockWidget)
        # on screen: a dock tabbed behind another says it is visible, but has no region shown
        if d.isVisible()
        and not d.visibleRegion().isEmpty()
        and not d.isFloating()
        and window.dockWidgetArea(d) == across
    ]
    if not others:
        return
    other = others[0]
    give = min(short, other.width() - other.minimumSizeHint().width())
    if give > 0:
        window.resizeDocks(
            [dock, other], [dock.width() + give, other.width() - give], Qt.Orientation.Horizontal
        )
