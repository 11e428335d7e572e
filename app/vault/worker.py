"""The vault's background worker: runs one vault operation in a QThread, with progress and cancel.

The lead folds this into the app's one worker (``app/workers.py``) at merge; until then it lives here so the
vault does not depend on a file that is being rewritten.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.workers import user_message
from engine.errors import Cancelled, EngineError

log = logging.getLogger(__name__)


class VaultWorker(QObject):
    """Runs ``function(*args, report=...)`` in a QThread; ``report`` raises ``Cancelled`` after ``cancel()``.

    The engine's progress callbacks call ``report`` between chunks, so a cancel stops an import or export
    at the next chunk and the engine removes what it had started.
    """

    progressed = Signal(object)  # (fraction or None, text)
    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        super().__init__()
        self._call = (function, args)
        self._cancel = threading.Event()
        self._last_report = 0.0
        self.error: BaseException | None = None  # set before ``failed`` is emitted

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def report(self, fraction: float | None, text: str = "") -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled by the user")
        now = time.monotonic()
        if fraction is None or fraction >= 1.0 or now - self._last_report >= 0.1:  # at most ~10 redraws/s
            self._last_report = now
            self.progressed.emit((fraction, text))

    @Slot()
    def run(self) -> None:
        function, args = self._call
        try:
            value = function(*args, report=self.report)
        except Cancelled:
            self.cancelled.emit()
        except BaseException as exc:  # noqa: BLE001 - everything must reach the user as a message
            if not isinstance(exc, EngineError):
                log.error("vault task failed:\n%s", traceback.format_exc())
            self.error = exc
            self.failed.emit(user_message(exc))
        else:
            self.finished.emit(value)
        finally:
            QThread.currentThread().quit()
