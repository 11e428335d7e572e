"""A combo box whose current text, when wider than the box, ends in a visible ellipsis instead of being cut.

``QComboBox`` draws its current text clipped to the edit field on the Fusion style, so a long entry such as
"Exact fp32 · not measured here" reads "Exact fp32 · not meas" with nothing to show that text is missing.
This subclass draws the same frame and arrow and elides the text at the right; the list shows entries whole.
``shown_text()`` is the text on screen, for tests and for anyone who must know.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox, QStylePainter


class ElidingComboBox(QComboBox):
    """A ``QComboBox`` that elides its current text at the right (with "…") when the box is too narrow."""

    def _edit_field_width(self, option: QStyleOptionComboBox) -> int:
        field = self.style().subControlRect(
            QStyle.ComplexControl.CC_ComboBox, option, QStyle.SubControl.SC_ComboBoxEditField, self
        )
        return field.width()

    def shown_text(self) -> str:
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        return self.fontMetrics().elidedText(
            option.currentText, Qt.TextElideMode.ElideRight, self._edit_field_width(option)
        )

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        if self.isEditable():  # an editable box shows its line edit, which scrolls instead
            super().paintEvent(event)
            return
        painter = QStylePainter(self)
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        painter.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, option)
        option.currentText = self.shown_text()
        painter.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, option)
