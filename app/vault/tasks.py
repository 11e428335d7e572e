"""The vault's background tasks: start the app's one ``Worker`` (``Worker.reporting_call``) through the app's ``JobRunner.run``, show its progress,
and drop a result that arrives after the vault was locked.

Every vault operation that reads or writes items runs in a worker moved to a QThread by the JobRunner; the
worker's signals reach bound methods of the runner's ``Job`` objects in the GUI thread, which call the
callbacks here (with PySide6 6.12 a lambda or free function connected to a worker's signal can run in the
worker's thread; a bound method of a GUI-thread object runs in the GUI thread). The vault serialises its own operations, so a list, an import and an open may be in flight
together without the GUI thread ever waiting on the vault's lock.

Each task remembers the lock epoch it was started in: locking starts a new epoch, and a result of an older
one (an open that was already decrypting) is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from PySide6.QtWidgets import QWidget

from app.services.workers import Worker
from app.vault.dialogs import TaskProgressDialog

log = logging.getLogger(__name__)

# Titles of the error dialogs, per task.
ERROR_TITLES = {
    "create": "Cannot create the vault",
    "unlock": "Cannot unlock the vault",
    "list": "Cannot list the vault",
    "import": "Cannot import into the vault",
    "save": "Cannot save to the vault",
    "open": "Cannot open from the vault",
    "export": "Cannot export from the vault",
    "delete": "Cannot delete from the vault",
    "verify": "Cannot verify the vault",
    "passphrase": "Cannot change the passphrase",
    "edit": "Cannot change the item's details",
    "repair": "Cannot repair the vault",
}


@dataclass(eq=False)
class VaultTask:
    """One operation in flight: its worker, the callbacks for its result, its progress dialog, if any."""

    name: str
    epoch: int
    worker: Worker
    finished: Callable[[Any], None] | None
    failed: Callable[[VaultTask, str], None] | None
    progress: TaskProgressDialog | None = None


class VaultTasks:
    """The vault's tasks in flight, started through ``runner`` (the app's ``JobRunner``).

    Args:
        runner: Starts a worker in a thread (``JobRunner.start``).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog (a task without its own ``failed``).
        parent: Parent of the progress dialogs (window-modal).
        changed: Called when a task other than a listing starts or ends (the menu and browser update).
        ended: ``(name, outcome)`` after a task's thread ended: ``finished``, ``failed`` or ``cancelled``.
        failed_after: Called with each failed task of the current epoch, after its message was shown
            (the lock notices a vault locked by code outside the app here).
    """

    def __init__(
        self,
        runner,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
        *,
        changed: Callable[[], None],
        ended: Callable[[str, str], None],
        failed_after: Callable[[VaultTask], None],
    ) -> None:
        self._runner = runner
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self._changed = changed
        self._ended = ended
        self._failed_after = failed_after
        self.epoch = 0
        self.running: list[VaultTask] = []

    def start(
        self,
        name: str,
        function: Callable[..., Any],
        *args: Any,
        finished: Callable[[Any], None] | None = None,
        failed: Callable[[VaultTask, str], None] | None = None,
        progress: str | None = None,
        text: str = "",
        cancellable: bool = True,
    ) -> VaultTask:
        """Run ``function(*args, report=...)`` in the background; ``progress`` titles a progress dialog."""
        worker = Worker.reporting_call(function, *args)
        task = VaultTask(name, self.epoch, worker, finished, failed)
        job = self._runner.run(
            f"vault-{name}",
            worker,
            what=f"Vault {name}",
            done=partial(self._on_task_finished, task),
            progressed=partial(self._on_task_progressed, task),  # its progress dialog, if it has one
            failed=partial(self._on_task_failed, task),  # the title per task; dropped after a lock
            cancelled=partial(self._on_task_cancelled, task),  # said only for the vault as it is now
            ended=partial(self._on_task_ended, task),
        )
        if progress:
            task.progress = TaskProgressDialog(progress, text or progress, job, cancellable, self._parent)
        self.running.append(task)
        if name != "list":
            self._changed()
        return task

    def new_epoch(self) -> list[VaultTask]:
        """The vault is being locked: results of the tasks running now are dropped; returns those tasks."""
        self.epoch += 1
        return [t for t in self.running if t.epoch < self.epoch]

    def cancel_all(self) -> None:
        for task in self.running:
            task.worker.cancel()

    def _close_progress(self, task: VaultTask) -> None:
        if task.progress is not None:
            task.progress.close()
            task.progress.deleteLater()
            task.progress = None

    def _on_task_progressed(self, task: VaultTask, value) -> None:
        if task.progress is not None:
            task.progress.report(*value)

    def _on_task_finished(self, task: VaultTask, value) -> None:
        self._close_progress(task)
        if task.epoch != self.epoch:
            log.info("vault %s finished after the vault was locked; result dropped", task.name)
            return
        if task.finished is not None:
            task.finished(value)

    def _on_task_failed(self, task: VaultTask, message: str) -> None:
        self._close_progress(task)
        if task.epoch != self.epoch:  # the vault was locked under it: nothing to tell
            log.info("vault %s ended after the vault was locked: %s", task.name, message)
            return
        if task.failed is not None:
            task.failed(task, message)
        else:
            self._show_error(ERROR_TITLES.get(task.name, "Vault error"), message)
        self._failed_after(task)

    def _on_task_cancelled(self, task: VaultTask) -> None:
        self._close_progress(task)
        if task.epoch == self.epoch:
            self._show_status(f"Vault {task.name} cancelled", 5000)

    def _on_task_ended(self, task: VaultTask, outcome: str) -> None:
        self._close_progress(task)
        if task in self.running:
            self.running.remove(task)
        if task.name != "list":
            self._changed()
        self._ended(task.name, outcome)
