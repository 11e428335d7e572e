"""Answering the next modal dialog of a GUI test from its own event loop, once it is shown.

A modal dialog runs a nested event loop, so the test cannot act on it after the call that opens it returns.
``answer_modal`` waits for the event, not the clock: the dialog's Show event queues the answer, which runs
in the dialog's loop once it is up.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget


class _ModalAnswerer(QObject):
    """Watches every Show event of the application for a modal window; answers the first that is still the
    active modal one when the queued answer runs (a modal shown and gone before then is passed over)."""

    def __init__(self, callback: Callable[[QWidget], object], errors: list) -> None:
        super().__init__()
        self.callback, self.errors = callback, errors
        self.answered = False
        QApplication.instance().installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if (
            not self.answered
            and event.type() == QEvent.Type.Show
            and isinstance(watched, QWidget)
            and watched.isWindow()
            and watched.isModal()
        ):
            QTimer.singleShot(0, self._answer)
        return False

    def _answer(self) -> None:
        dialog = QApplication.activeModalWidget()
        if self.answered or dialog is None or not dialog.isVisible():
            return  # not up (any more): the next modal Show queues another try
        self.retire()
        try:
            self.callback(dialog)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
            dialog.reject()

    def retire(self) -> None:
        self.answered = True
        QApplication.instance().removeEventFilter(self)


_pending: list[_ModalAnswerer] = []  # the one waiting (kept alive here until the next call)


def answer_modal(callback: Callable[[QWidget], object], errors: list) -> None:
    """Run ``callback(dialog)`` on the next modal dialog once it is shown.

    A failing callback closes the dialog and lands in ``errors``, so the test fails instead of hanging. One
    answer waits at a time: a call retires one that an earlier test left unanswered.
    """
    for earlier in _pending:
        earlier.retire()
    _pending[:] = [_ModalAnswerer(callback, errors)]
