"""A status bar whose message, when longer than the room beside the permanent fields, ends in a visible
ellipsis (the whole message is its tooltip) instead of being cut off mid-word at the fields' edge.

``QStatusBar`` paints its temporary message itself, clipped to the room left of the first permanent widget
and never elided; this subclass paints the same panel and item frames and draws the message elided into
that room. ``shown_message()`` is the text on screen, for tests and for anyone who must know.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QStatusBar, QStyle, QStyleOption, QWidget

MESSAGE_LEFT, MESSAGE_RIGHT_GAP, GRIP_ROOM = 6, 2, 12  # QStatusBar's own message margins


class ElidingStatusBar(QStatusBar):
    """A ``QStatusBar`` that elides its message at the right (with "…") and keeps it whole in its tooltip."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._items: list[tuple[QWidget, bool]] = []  # (widget, permanent), in the order they were added
        self.messageChanged.connect(self.setToolTip)

    def addWidget(self, widget: QWidget, stretch: int | None = 0) -> None:  # noqa: N802 - Qt override
        super().addWidget(widget, stretch)
        self._items.append((widget, False))

    def addPermanentWidget(self, widget: QWidget, stretch: int | None = 0) -> None:  # noqa: N802 - Qt override
        super().addPermanentWidget(widget, stretch)
        self._items.append((widget, True))

    def removeWidget(self, widget: QWidget) -> None:  # noqa: N802 - Qt override
        super().removeWidget(widget)
        self._items = [item for item in self._items if item[0] is not widget]

    def message_rect(self) -> QRect:
        """Where the message goes: from the left margin to just before the leftmost visible permanent field."""
        right = self.width() - GRIP_ROOM
        shown = [w for w, permanent in self._items if permanent and w.isVisible()]
        if shown:
            right = min(right, min(w.x() for w in shown) - MESSAGE_RIGHT_GAP)
        return QRect(MESSAGE_LEFT, 0, max(0, right - MESSAGE_LEFT), self.height())

    def shown_message(self) -> str:
        """The message as drawn: whole when it fits, else cut at the right with an ellipsis."""
        return self.fontMetrics().elidedText(
            self.currentMessage(), Qt.TextElideMode.ElideRight, self.message_rect().width()
        )

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        # QStatusBar.paintEvent, with the message elided (the C++ one draws it clipped).
        message = self.currentMessage()
        painter = QPainter(self)
        option = QStyleOption()
        option.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, option, painter, self)
        for widget, permanent in self._items:
            if widget.isVisible() and (permanent or not message):
                frame = QStyleOption()
                frame.rect = widget.geometry().adjusted(-2, -1, 2, 1)
                frame.palette = self.palette()
                frame.state = QStyle.StateFlag.State_None
                if event.rect().intersects(frame.rect):
                    self.style().drawPrimitive(
                        QStyle.PrimitiveElement.PE_FrameStatusBarItem, frame, painter, widget
                    )
        if message:
            painter.setPen(self.palette().windowText().color())
            painter.drawText(
                self.message_rect(),
                Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextSingleLine,
                self.shown_message(),
            )
        painter.end()
