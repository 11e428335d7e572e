"""The vault's message boxes: information, warnings and the "already in the vault" question.

Every box here is opened with ``open()`` (window-modal, never a nested event loop); the last text shown is
kept (``last_info``, ``last_warning``) so tests and scripts can read what the user was told.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget


class VaultMessages:
    """Non-blocking message boxes parented to ``parent`` (the window the vault belongs to)."""

    def __init__(self, parent: QWidget | None) -> None:
        self._parent = parent
        self.last_info: tuple[str, str] | None = None
        self.last_warning: tuple[str, str] | None = None
        self.last_info_box: QMessageBox | None = None
        self.duplicate_box: QMessageBox | None = None
        self.duplicate_yes_button: QPushButton | None = None
        self._pending_duplicate: Callable[[], None] | None = None

    def warn(self, title: str, text: str) -> QMessageBox:
        """A non-blocking warning box (no nested event loop)."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self._parent)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.last_warning = (title, text)
        box.open()
        return box

    def inform(self, title: str, text: str, *, details: str = "") -> QMessageBox:
        """A non-blocking information box (no nested event loop); ``details`` go behind "Show Details..."."""
        box = QMessageBox(
            QMessageBox.Icon.Information, title, text, QMessageBox.StandardButton.Ok, self._parent
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        if details:
            box.setDetailedText(details)
        self.last_info = (title, text)
        self.last_info_box = box
        box.open()
        return box

    def ask_duplicate(self, text: str, yes: str, then: Callable[[], None]) -> QMessageBox:
        """Ask (non-blocking) whether to store a volume the vault already holds; ``then`` runs on yes."""
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Already in the Vault",
            text,
            QMessageBox.StandardButton.Cancel,
            self._parent,
        )
        self.duplicate_yes_button = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.finished.connect(self._on_duplicate_box_finished)
        self._pending_duplicate = then
        self.duplicate_box = box
        box.open()
        return box

    def _on_duplicate_box_finished(self, _result: int) -> None:
        box, self.duplicate_box = self.duplicate_box, None
        then, self._pending_duplicate = self._pending_duplicate, None
        if box is not None:
            if then is not None and box.clickedButton() is self.duplicate_yes_button:
                then()
            box.deleteLater()

    def forget_question(self) -> None:
        """The vault locked: the pending question is dropped, its box closed."""
        self._pending_duplicate = None
        if self.duplicate_box is not None:
            self.duplicate_box.reject()
        self.duplicate_box = None
