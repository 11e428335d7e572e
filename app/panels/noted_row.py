"""A form row with a note under it: the Sampling group's conditions and its Plan line."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.widgets.theme import NOTE_COLOUR


def noted_row(owner: QWidget, wide: QWidget, side: QWidget) -> QLabel:
    """Lay ``owner`` out as ``wide`` with ``side`` at its right and, under both, a wrapped amber note, hidden
    until there is something to say; returns the note. Under, not beside: a wrapped label beside a button
    would be cut to the button's height."""
    note = QLabel()
    note.setObjectName("hint")
    note.setStyleSheet(f"color: {NOTE_COLOUR};")
    note.setWordWrap(True)
    note.hide()
    row = QHBoxLayout()
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(wide, 1)
    row.addWidget(side)
    box = QVBoxLayout(owner)
    box.setContentsMargins(0, 0, 0, 0)
    box.setSpacing(2)
    box.addLayout(row)
    box.addWidget(note)
    return note
