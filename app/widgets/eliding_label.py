"""A one-line label that shrinks with the room it gets and ends its text in a visible ellipsis.

A plain ``QLabel`` asks for the whole width of its text: as a permanent status-bar field, a long engine
message ("planning the best split of ... over 8 XLA devices ...") widened the main window past the screen.
This label asks for its text's width up to a maximum, accepts as little as ``min_chars`` characters, draws
the text elided to the width it is given, and keeps the whole text in its tooltip while it is cut.
``shown_text()`` is the text on screen, for tests and for anyone who must know.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidingLabel(QLabel):
    """A single-line ``QLabel`` elided at the right to its width; the full text is ``text()``."""

    def __init__(self, text: str = "", parent=None, *, max_width: int = 420, min_chars: int = 12) -> None:
        super().__init__(text, parent)
        self._max_width, self._min_chars = max_width, min_chars
        self._tip = ""  # what the tooltip says besides the whole text when it is cut
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def _text_room(self) -> int:
        margins = self.contentsMargins()
        return max(0, self.width() - margins.left() - margins.right())

    def shown_text(self) -> str:
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self._text_room())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().sizeHint()
        return QSize(min(hint.width(), self._max_width), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        margins = self.contentsMargins()
        least = self.fontMetrics().averageCharWidth() * self._min_chars + margins.left() + margins.right()
        return QSize(min(least, self.sizeHint().width()), super().minimumSizeHint().height())

    def set_tip(self, tip: str) -> None:
        """A tooltip of the label's own, kept under the whole text while that is cut."""
        self._tip = tip
        self._update_tooltip()

    def _update_tooltip(self) -> None:
        cut = self.shown_text() != self.text()
        self.setToolTip("\n".join(part for part in (self.text() if cut else "", self._tip) if part))

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self._update_tooltip()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._update_tooltip()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect()
        painter.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), self.shown_text())
