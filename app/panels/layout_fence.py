"""A box that keeps a widget's frequent changes (a run's progress line, at every step) from laying out the
whole window again.

A label's ``setText`` asks its parent's layout for a new layout, and each layout that runs asks its own
parent, up to the main window: ``QMainWindow``'s layout then repaints its dock separators, a second paint of
the window at every step. Once the window has held an OpenGL widget (the 3D view), Qt composes every paint of
the window through OpenGL, even with that widget hidden: on a machine without a GPU that is the software
renderer's threads (Mesa llvmpipe) at work, competing with the denoising for the cores.

This box has no layout, so the request stops at it; it passes it on only when the widget no longer fits the
room it has: a text that needs another line, or more width than it was given. A widget that needs less room
keeps its room until the window is laid out again for another reason.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize
from PySide6.QtWidgets import QWidget


class LayoutFence(QWidget):
    """Holds ``widget`` at its own size: the layout it sits in sees the widget's size hints, but only a change
    that no longer fits (see the module) asks that layout to run again."""

    def __init__(self, widget: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.widget = widget
        widget.setParent(self)
        self.setSizePolicy(widget.sizePolicy())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return self.widget.sizeHint()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return self.widget.minimumSizeHint()

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return self.widget.hasHeightForWidth()

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        return self.widget.heightForWidth(width)

    def fits(self) -> bool:
        """Whether the widget's content fits the room it has now."""
        hint = self.widget.sizeHint()
        if self.widget.hasHeightForWidth():  # a wrapped text: as many lines as it has room for
            return self.widget.heightForWidth(self.width()) == self.height()
        return hint.width() <= self.width() and hint.height() <= self.height()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.widget.setGeometry(self.rect())

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest and not self.fits():
            self.updateGeometry()
        return super().event(event)
