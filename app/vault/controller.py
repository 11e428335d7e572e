"""The app side of the encrypted vault: owns the ``engine.vault.Vault``, runs its work in the background,
locks it after idle time, and turns every failure into a dialog with the engine's message.

Threads (DESIGN.md, "App"): every vault operation that reads or writes items runs in a worker moved to a
QThread through ``window.runner``; its signals reach bound methods of ``Job`` objects in the GUI thread,
which call the callbacks below. The vault serialises its own operations, so a list, an import and an open
may be in flight together without the GUI thread ever waiting on the vault's lock.

Locking forgets the keys and the decrypted index, clears the browser and closes the volumes opened from
the vault. A result that arrives after a lock (an open that was already decrypting) is dropped: each task
remembers the lock epoch it was started in.

``engine.vault`` is imported on first use, not at start-up (it pulls in cryptography, nibabel, pydicom).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox

from app.core import vault_items as model
from app.core.volumes import VolumeEntry
from app.vault.dialogs import (
    ChangePassphraseDialog,
    ExportDialog,
    ImportDetailsDialog,
    ItemDetailsDialog,
    TaskProgressDialog,
    VaultUnlockDialog,
)
from app.vault.privacy import forget_paths, protect_process, remember_recent
from app.workers import user_message
from engine.errors import Cancelled, DuplicateItem, EngineError, VaultCorrupted, VaultLocked, VaultRolledBack
from engine.nifti.io import is_nifti

log = logging.getLogger(__name__)

DEFAULT_AUTO_LOCK_MIN = 15  # engine.vault.DEFAULT_IDLE_TIMEOUT_S, without importing the vault at start-up
IDLE_CHECK_MS = 1000
NIFTI_FILTER = "NIfTI volumes (*.nii *.nii.gz);;All files (*)"
_ACTIVITY = (QEvent.Type.KeyPress, QEvent.Type.MouseButtonPress, QEvent.Type.Wheel)

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


@dataclass(eq=False)
class _Task:
    name: str
    epoch: int
    worker: VaultWorker
    finished: Callable[[Any], None] | None
    failed: Callable[[_Task, str], None] | None
    progress: TaskProgressDialog | None = None
    outcome: str = ""


def _create_vault(path: Path, passphrase: str, kdf, idle_timeout_s, clock, report) -> Any:
    from engine.vault import Vault

    report(None, "Creating the vault")
    return Vault.create(path, passphrase, kdf=kdf, idle_timeout_s=idle_timeout_s, clock=clock)


def _unlock(vault, passphrase: str, report) -> Any:
    report(None, "Unlocking")
    vault.unlock(passphrase)
    return vault


def _list_items(vault, query: str, kind: str | None, report) -> list:
    return vault.search(query, kind=kind)


def _delete(vault, item_id: str, report) -> str:
    vault.delete(item_id)
    return item_id


def _change_passphrase(vault, old: str, new: str, kdf, report) -> None:
    report(None, "Changing the passphrase")
    vault.change_passphrase(old, new, kdf=kdf)


def _rekey(vault, old: str, new: str, kdf, report) -> None:
    """Re-encrypt the whole vault under a new key (engine.vault.rekey), with progress."""
    report(None, "Re-encrypting the vault")

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, "Re-encrypting the vault")

    vault.rekey(old, new, kdf=kdf, progress=progress)


def _lock(vault, report) -> None:
    vault.lock()


def _repair_check(path: Path, passphrase: str, idle_timeout_s, clock, report) -> tuple:
    """Unlock a rolled-back vault for repair only and plan the repair (nothing is changed)."""
    from engine.vault import Vault

    report(None, "Checking the vault")
    vault = Vault(path, idle_timeout_s=idle_timeout_s, clock=clock)
    vault.unlock(passphrase, allow_rollback=True)
    try:
        return vault, vault.repair(dry_run=True)
    except BaseException:
        vault.lock()
        raise


def _repair_now(vault, report) -> tuple:
    report(None, "Repairing the vault")
    return vault, vault.repair()


class VaultController(QObject):
    """The vault of one main window. Created by ``app.vault.install_vault(window)``.

    Signals (GUI thread): ``state_changed()`` when locked/unlocked/moved, ``items_changed(list)`` with the
    listed ``ItemInfo`` s, ``task_ended(name, outcome)`` after each background task's thread ended
    (outcome ``finished``, ``failed`` or ``cancelled``), ``auto_lock_tick(seconds or None)`` once a second.

    Attributes:
        kdf: Argon2id parameters for new passphrases; None is the engine's default (RFC 9106). Tests set
            small ones.
        clock: Monotonic clock in seconds, read through the vault for idle time (replaceable in tests).
    """

    state_changed = Signal()
    items_changed = Signal(object)
    task_ended = Signal(str, str)
    auto_lock_tick = Signal(object)

    def __init__(self, window, clock: Callable[[], float] | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.settings = window.settings
        self.clock = clock or time.monotonic
        self.kdf = None
        self.vault = None
        self.items: list = []
        self.query = ""
        self.kind: str | None = None
        self.last_export = None
        self.last_verify = None
        self.last_info: tuple[str, str] | None = None
        self.last_warning: tuple[str, str] | None = None
        self.unlock_dialog: VaultUnlockDialog | None = None
        self.passphrase_dialog: ChangePassphraseDialog | None = None
        self.import_dialog: ImportDetailsDialog | None = None
        self.export_dialog: ExportDialog | None = None
        self.details_dialog: ItemDetailsDialog | None = None
        self.confirm_box: QMessageBox | None = None
        self.duplicate_box: QMessageBox | None = None
        self.repair_box: QMessageBox | None = None
        self._repair_vault = None  # unlocked for repair only, while the user decides
        self.core_dump_note = ""  # why core dumps could not be turned off, if they could not
        self.remember_action = None  # set by install_vault (app.vault.privacy)
        self.browser = self.menu = self.status_button = None  # set by install_vault
        self._path: Path | None = None
        self._unlocked = False
        self._epoch = 0
        self._list_seq = 0
        self._tasks: list[_Task] = []
        self._opened: dict[int, str] = {}  # session entry uid -> vault item id
        self._after_unlock: list[Callable[[], None]] = []
        self._pending_import: list[model.ImportJob] = []
        self._pending_delete: str | None = None
        self._pending_duplicate: Callable[[], None] | None = None
        self._saved: dict[int, str] = {}  # session entry uid -> the vault item it was saved as
        self._idle_timer = QTimer(self)
        self._idle_timer.setInterval(IDLE_CHECK_MS)
        self._idle_timer.timeout.connect(self._on_idle_timer_timeout)
        app = QApplication.instance()
        if app is not None:  # user activity postpones auto-lock; the filter goes away with this object
            app.installEventFilter(self)

    # -- state ---------------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The vault folder: the ``vault/path`` setting, else ``engine.vault.default_vault_path()``."""
        if self._path is None:
            saved = self.settings.value("vault/path", "", type=str)
            if saved:
                self._path = Path(saved).expanduser()
            else:
                from engine.vault import default_vault_path

                self._path = default_vault_path()
        return self._path

    @property
    def exists(self) -> bool:
        from engine.vault import Vault

        return Vault.exists(self.path)

    @property
    def is_unlocked(self) -> bool:
        return self._unlocked

    @property
    def auto_lock_minutes(self) -> int:
        """Minutes without activity before the vault locks itself; 0 never."""
        return max(0, self.settings.value("vault/auto_lock_minutes", DEFAULT_AUTO_LOCK_MIN, type=int))

    def set_auto_lock_minutes(self, minutes: int) -> None:
        minutes = max(0, int(minutes))
        self.settings.setValue("vault/auto_lock_minutes", minutes)
        if self.vault is not None:
            self.vault.idle_timeout_s = minutes * 60.0 if minutes else None
        self.state_changed.emit()

    def _idle_timeout_s(self) -> float | None:
        minutes = self.auto_lock_minutes
        return minutes * 60.0 if minutes else None

    def _now(self) -> float:
        return self.clock()

    def set_vault_path(self, path: str | Path) -> None:
        """Use the vault in ``path`` (locking the current one); remembered in the settings."""
        path = Path(path).expanduser()
        if self._unlocked:
            self.lock()
        self._path = path
        self.vault = None
        self.settings.setValue("vault/path", str(path))
        self.state_changed.emit()

    def item(self, item_id: str):
        return next((info for info in self.items if info.id == item_id), None)

    def entry_is_from_vault(self, entry: VolumeEntry | None) -> bool:
        return entry is not None and entry.uid in self._opened

    # -- background tasks ----------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        function: Callable[..., Any],
        *args: Any,
        finished: Callable[[Any], None] | None = None,
        failed: Callable[[_Task, str], None] | None = None,
        progress: str | None = None,
        text: str = "",
        cancellable: bool = True,
    ) -> _Task:
        worker = VaultWorker(function, *args)
        task = _Task(name, self._epoch, worker, finished, failed)
        job = self.window.runner.start(
            f"vault-{name}",
            worker,
            progressed=partial(self._on_task_progressed, task),
            finished=partial(self._on_task_finished, task),
            failed=partial(self._on_task_failed, task),
            cancelled=partial(self._on_task_cancelled, task),
            ended=partial(self._on_task_ended, task),
        )
        if progress:
            task.progress = TaskProgressDialog(progress, text or progress, job, cancellable, self.window)
        self._tasks.append(task)
        if name != "list":
            self.state_changed.emit()
        return task

    def _close_progress(self, task: _Task) -> None:
        if task.progress is not None:
            task.progress.close()
            task.progress.deleteLater()
            task.progress = None

    def _on_task_progressed(self, task: _Task, value) -> None:
        if task.progress is not None:
            task.progress.report(*value)

    def _on_task_finished(self, task: _Task, value) -> None:
        task.outcome = "finished"
        self._close_progress(task)
        if task.epoch != self._epoch:
            log.info("vault %s finished after the vault was locked; result dropped", task.name)
            return
        if task.finished is not None:
            task.finished(value)

    def _on_task_failed(self, task: _Task, message: str) -> None:
        task.outcome = "failed"
        self._close_progress(task)
        if task.epoch != self._epoch:  # the vault was locked under it: nothing to tell
            log.info("vault %s ended after the vault was locked: %s", task.name, message)
            return
        if task.failed is not None:
            task.failed(task, message)
        else:
            self._show_error(ERROR_TITLES.get(task.name, "Vault error"), message)
        if (
            self._unlocked
            and isinstance(task.worker.error, VaultLocked)
            and self.vault is not None
            and not self.vault.is_unlocked
        ):
            self._epoch += 1
            self._after_lock("elsewhere")  # locked by code outside this controller

    def _on_task_cancelled(self, task: _Task) -> None:
        task.outcome = "cancelled"
        self._close_progress(task)
        if task.epoch == self._epoch:
            self.window.show_status(f"Vault {task.name} cancelled", 5000)

    def _on_task_ended(self, task: _Task) -> None:
        self._close_progress(task)
        if task in self._tasks:
            self._tasks.remove(task)
        if task.name != "list":
            self.state_changed.emit()
        self.task_ended.emit(task.name, task.outcome or "cancelled")

    def _show_error(self, title: str, message: str) -> None:
        self.window.show_error(title, message)

    def _warn(self, title: str, text: str) -> QMessageBox:
        """A non-blocking warning box (no nested event loop)."""
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self.window)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.last_warning = (title, text)
        box.open()
        return box

    def _inform(self, title: str, text: str, *, details: str = "") -> QMessageBox:
        """A non-blocking information box (no nested event loop); ``details`` go behind "Show Details..."."""
        box = QMessageBox(
            QMessageBox.Icon.Information, title, text, QMessageBox.StandardButton.Ok, self.window
        )
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        if details:
            box.setDetailedText(details)
        self.last_info = (title, text)
        self.last_info_box = box
        box.open()
        return box

    # -- unlock / create / lock ----------------------------------------------------------------------

    def request_unlock(self) -> VaultUnlockDialog | None:
        """Show the create or unlock dialog (non-blocking); the browser follows when it succeeds."""
        self.window_show_browser()
        if self._unlocked:
            return None
        self._protect()  # before the passphrase is typed
        if self.unlock_dialog is not None and self.unlock_dialog.isVisible():
            self.unlock_dialog.raise_()
            return self.unlock_dialog
        mode = "unlock" if self.exists else "create"
        dialog = VaultUnlockDialog(mode, self.path, self.window)
        dialog.submitted.connect(self._on_unlock_dialog_submitted)
        dialog.rejected.connect(self._on_unlock_dialog_rejected)
        self.unlock_dialog = dialog
        dialog.open()
        return dialog

    def _on_unlock_dialog_submitted(self, passphrase: str) -> None:
        dialog = self.unlock_dialog
        if dialog is None:
            return
        if dialog.mode == "create":
            self.create(passphrase)
        elif dialog.mode == "repair":
            self._start(
                "repair",
                _repair_check,
                self.path,
                passphrase,
                self._idle_timeout_s(),
                self._now,
                finished=self._on_repair_checked,
                failed=self._on_repair_check_failed,
            )
        else:
            self.unlock(passphrase)

    def _on_unlock_dialog_rejected(self) -> None:
        self._after_unlock.clear()
        self.unlock_dialog = None

    def _protect(self) -> None:
        """Core dumps off while a vault is (about to be) unlocked: a dump would hold decrypted volumes,
        patient details and the passphrase. Stays off for the app's life (see app.vault.privacy)."""
        self.core_dump_note = protect_process()
        if self.core_dump_note:
            log.warning("core dumps stay possible: %s", self.core_dump_note)

    def create(self, passphrase: str) -> None:
        """Create a new vault at ``path`` (in the background) and keep it unlocked."""
        self._protect()
        self._start(
            "create",
            _create_vault,
            self.path,
            passphrase,
            self.kdf,
            self._idle_timeout_s(),
            self._now,
            finished=self._on_unlocked,
            failed=self._on_unlock_failed,
        )

    def unlock(self, passphrase: str) -> None:
        """Unlock the vault at ``path`` with ``passphrase`` (Argon2id runs in the background)."""
        from engine.vault import Vault

        self._protect()
        try:
            # A fresh object each time: a lock still finishing in the background can never undo this unlock.
            vault = Vault(self.path, idle_timeout_s=self._idle_timeout_s(), clock=self._now)
        except EngineError as exc:
            self._unlock_refused(exc, str(exc))
            return
        self._start(
            "unlock", _unlock, vault, passphrase, finished=self._on_unlocked, failed=self._on_unlock_failed
        )

    def _on_unlocked(self, vault) -> None:
        self.vault = vault
        self._unlocked = True
        self._idle_timer.start()
        if self.unlock_dialog is not None:
            self.unlock_dialog.accept()
            self.unlock_dialog = None
        self.window.show_status(f"Vault unlocked: {self.path}", 5000)
        self.state_changed.emit()
        self.auto_lock_tick.emit(vault.seconds_until_auto_lock())
        self.refresh()
        if vault.notices:  # e.g. partial files of an interrupted import or export, removed
            self._inform("Vault cleaned up", "\n\n".join(vault.notices))
        if vault.warnings:  # what rollback detection could not check at this unlock, or a broken anchor
            self._warn("Vault unlocked with a warning", "\n\n".join(vault.warnings))
        if vault.audit_problem:
            self._show_error(
                "The vault's audit trail is damaged",
                f"{vault.audit_problem}\n\nChanges and views are refused until it is repaired; "
                "Vault > Verify All lists what is wrong.",
            )
        pending, self._after_unlock = self._after_unlock, []
        for action in pending:
            action()

    def _on_unlock_failed(self, task: _Task, message: str) -> None:
        self._unlock_refused(task.worker.error, message)

    def _unlock_refused(self, error: BaseException | None, message: str) -> None:
        if isinstance(error, VaultRolledBack):  # typing again would not help; a repair might
            if self.unlock_dialog is not None:
                self.unlock_dialog.reject()
            self.offer_repair(message)
            return
        title = ERROR_TITLES[
            "create" if self.unlock_dialog is not None and self.unlock_dialog.mode == "create" else "unlock"
        ]
        dialog = self.unlock_dialog
        if isinstance(error, VaultLocked) and dialog is not None and dialog.mode == "unlock":
            dialog.retry("Wrong passphrase. Try again.")  # said once, where the user is typing
            return
        self._show_error(title, message)
        if dialog is not None:  # a damaged header or an unusable folder: typing again would not help
            dialog.reject()

    # -- repair after a rollback ---------------------------------------------------------------------

    def offer_repair(self, message: str) -> QMessageBox:
        """Say what was rolled back and offer Repair... (non-blocking)."""
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "The vault was rolled back",
            message,
            QMessageBox.StandardButton.Close,
            self.window,
        )
        self.repair_offer_button = box.addButton("Repair...", QMessageBox.ButtonRole.AcceptRole)
        box.finished.connect(self._on_repair_offer_finished)
        self.repair_box = box
        self.last_info = ("The vault was rolled back", message)
        box.open()
        return box

    def _on_repair_offer_finished(self, _result: int) -> None:
        box, self.repair_box = self.repair_box, None
        if box is not None:
            if box.clickedButton() is self.repair_offer_button:
                self.request_repair()
            box.deleteLater()

    def request_repair(self) -> VaultUnlockDialog:
        """Ask for the passphrase, then show what a repair would do (see Vault.repair)."""
        self._protect()
        dialog = VaultUnlockDialog("repair", self.path, self.window)
        dialog.submitted.connect(self._on_unlock_dialog_submitted)
        dialog.rejected.connect(self._on_unlock_dialog_rejected)
        self.unlock_dialog = dialog
        dialog.open()
        return dialog

    def _on_repair_check_failed(self, task: _Task, message: str) -> None:
        dialog = self.unlock_dialog
        self._show_error(ERROR_TITLES["repair"], message)
        if dialog is not None:
            if isinstance(task.worker.error, VaultLocked):
                dialog.retry("Wrong passphrase. Try again.")
            else:
                dialog.reject()

    def _on_repair_checked(self, value) -> None:
        vault, plan = value
        if self.unlock_dialog is not None:
            self.unlock_dialog.accept()
            self.unlock_dialog = None
        if not plan.changed:
            vault.lock()
            self._inform("Nothing to repair", "The vault is consistent; unlock it as usual.")
            return
        lines = [f"\u2022 accept: {line}" for line in plan.accepted]
        lines += [
            f"\u2022 put back: \u201c{label}\u201d ({item_id[:12]})" for item_id, label in plan.reindexed
        ]
        if plan.records_written:
            lines.append(f"\u2022 write {plan.records_written} missing item record(s)")
        lines += [f"\u2022 left alone: {line}" for line in plan.skipped]
        self._repair_vault = vault
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Repair the Vault",
            "A repair would:\n\n" + "\n".join(lines) + "\n\nNothing is deleted.",
            QMessageBox.StandardButton.Cancel,
            self.window,
        )
        self.repair_confirm_button = box.addButton("Repair", QMessageBox.ButtonRole.AcceptRole)
        box.finished.connect(self._on_repair_confirm_finished)
        self.repair_box = box
        box.open()

    def _on_repair_confirm_finished(self, _result: int) -> None:
        box, self.repair_box = self.repair_box, None
        vault, self._repair_vault = self._repair_vault, None
        if box is None or vault is None:
            return
        if box.clickedButton() is self.repair_confirm_button:
            self._start(
                "repair", _repair_now, vault, finished=self._on_repaired, progress="Repairing the Vault"
            )
        else:
            vault.lock()
        box.deleteLater()

    def _on_repaired(self, value) -> None:
        vault, report = value
        self._on_unlocked(vault)
        self._inform(
            "Vault repaired",
            f"{len(report.reindexed)} item(s) put back into the vault; nothing was deleted.",
        )

    def lock(self, reason: str = "manual") -> None:
        """Lock now: forget the keys, clear the browser, close volumes opened from the vault."""
        if not self._unlocked:
            return
        self._epoch += 1
        running = [t for t in self._tasks if t.epoch < self._epoch]
        for task in running:
            task.worker.cancel()
        vault = self.vault
        if running:  # the vault finishes its current chunk first; never wait for that in the GUI thread
            self._start("lock", _lock, vault)
        else:
            vault.lock()
        self._after_lock(reason)

    def _after_lock(self, reason: str) -> None:
        self._unlocked = False
        self._idle_timer.stop()
        self._pending_import = []
        self._pending_delete = None
        self._pending_duplicate = None
        dialogs = (
            self.export_dialog,
            self.passphrase_dialog,
            self.import_dialog,
            self.confirm_box,
            self.details_dialog,
            self.duplicate_box,
        )
        for dialog in dialogs:
            if dialog is not None:
                dialog.reject()
        self.export_dialog = self.passphrase_dialog = self.import_dialog = self.confirm_box = None
        self.details_dialog = self.duplicate_box = None
        for uid in list(self._opened):
            entry = next((e for e in self.window.state.volumes if e.uid == uid), None)
            if entry is not None:
                self.window.state.remove_volume(entry)
        self._opened.clear()
        self.items = []
        self.items_changed.emit([])
        self.state_changed.emit()
        self.auto_lock_tick.emit(None)
        if reason == "idle":
            minutes = self.auto_lock_minutes
            self.window.show_status(f"Vault locked after {minutes} min without activity", 0)
        else:
            self.window.show_status("Vault locked", 5000)

    def check_idle(self) -> bool:
        """Lock if idle for the auto-lock time (the timer calls this every second). True if it locked."""
        if not self._unlocked or self.vault is None:
            return False
        if self.vault.lock_if_idle():
            self._epoch += 1
            self._after_lock("idle")
            return True
        if not self.vault.is_unlocked:  # locked behind our back (it cannot be, unless by code)
            self._epoch += 1
            self._after_lock("elsewhere")
            return True
        self.auto_lock_tick.emit(self.vault.seconds_until_auto_lock())
        return False

    def _on_idle_timer_timeout(self) -> None:
        self.check_idle()

    def touch(self) -> None:
        if self._unlocked and self.vault is not None:
            self.vault.touch()

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        etype = event.type()
        if etype in _ACTIVITY:
            if self._unlocked:
                self.touch()
        elif etype == QEvent.Type.Close and obj is self.window:
            self.shutdown()
        return False

    def shutdown(self) -> None:
        """The window is closing: stop the timer and lock (the audit trail records it); forget the paths
        the main window noted if remembering them is off."""
        self._idle_timer.stop()
        if not remember_recent(self.settings):
            forget_paths(self.settings)
        if self._unlocked:
            for task in self._tasks:
                task.worker.cancel()
            self._unlocked = False
            try:
                self.vault.lock()
            except Exception:  # noqa: BLE001 - closing must never fail
                log.warning("could not lock the vault on close", exc_info=True)

    def _ensure_unlocked(self, then: Callable[[], None]) -> bool:
        """True if unlocked; otherwise ask for the passphrase and run ``then`` once unlocked."""
        if self._unlocked:
            return True
        self._after_unlock.append(then)
        self.request_unlock()
        return False

    # -- listing -------------------------------------------------------------------------------------

    def set_filter(self, query: str, kind: str | None = None) -> None:
        self.query, self.kind = query, kind
        self.refresh()

    def refresh(self) -> None:
        """List the items matching the current search, in the background."""
        if not self._unlocked:
            return
        self._list_seq += 1
        self._start(
            "list",
            _list_items,
            self.vault,
            self.query,
            self.kind,
            finished=partial(self._on_listed, self._list_seq),
        )

    def _on_listed(self, seq: int, items: list) -> None:
        if seq != self._list_seq:  # an older search answered after a newer one was started
            return
        self.items = list(items)
        self.items_changed.emit(self.items)

    # -- import --------------------------------------------------------------------------------------

    def import_nifti_dialog(self) -> None:
        if not self._ensure_unlocked(self.import_nifti_dialog):
            return
        paths, _ = QFileDialog.getOpenFileNames(
            self.window,
            "Import NIfTI files into the vault",
            self._last_dir("vault/last_import_dir"),
            NIFTI_FILTER,
        )
        if paths:
            self._remember_dir("vault/last_import_dir", Path(paths[0]).parent)
            self.ask_import_details(paths)

    def import_dicom_dialog(self) -> None:
        if not self._ensure_unlocked(self.import_dicom_dialog):
            return
        folder = QFileDialog.getExistingDirectory(
            self.window,
            "Import a DICOM series folder into the vault",
            self._last_dir("vault/last_import_dir"),
        )
        if folder:
            self._remember_dir("vault/last_import_dir", Path(folder).parent)
            self.import_sources([model.ImportJob(folder, "dicom")])

    def _last_dir(self, key: str) -> str:
        """Where a file dialog starts: the folder last used for it (if remembering is on), else home."""
        if remember_recent(self.settings):
            saved = self.settings.value(key, "", type=str)
            if saved and Path(saved).is_dir():
                return saved
        return str(Path.home())

    def _remember_dir(self, key: str, folder: Path) -> None:
        if remember_recent(self.settings):
            self.settings.setValue(key, str(folder))

    def import_dropped(self, paths: list[str | Path]) -> None:
        """Files dropped on the browser: NIfTI files (details asked once), DICOM folders or files."""
        paths = [Path(p) for p in paths]
        if not paths:
            return
        if not self._ensure_unlocked(partial(self.import_dropped, paths)):
            return
        nifti = [p for p in paths if is_nifti(p)]
        jobs = [model.ImportJob(p, "dicom") for p in paths if p.is_dir()]
        loose = [p for p in paths if p.is_file() and not is_nifti(p)]
        if loose:
            jobs.append(model.ImportJob(loose, "dicom"))
        if nifti:
            self.ask_import_details(nifti, jobs)
        elif jobs:
            self.import_sources(jobs)

    def ask_import_details(self, paths: list[str | Path], extra: list[model.ImportJob] | None = None) -> None:
        """Ask for patient and study details (non-blocking); files VolSynth generated are named in the dialog
        and stored as synthetic, without patient details."""
        dialog = ImportDetailsDialog(paths, self.window, synthetic=model.synthetic_names(paths))
        self._pending_import = list(extra or [])
        dialog.accepted.connect(self._on_import_dialog_accepted)
        dialog.rejected.connect(self._on_import_dialog_rejected)
        self.import_dialog = dialog
        dialog.open()

    def _on_import_dialog_accepted(self) -> None:
        dialog, self.import_dialog = self.import_dialog, None
        if dialog is None:
            return
        details = dialog.details()
        jobs = [
            model.ImportJob(
                p,
                "nifti",
                label=details["label"],
                # a generated volume has no patient: the details apply to the scans among the files
                patient={} if p.name in dialog.synthetic else details["patient"],
                study=details["study"],
            )
            for p in dialog.paths
        ]
        extra, self._pending_import = self._pending_import, []
        self.import_sources(jobs + extra)

    def _on_import_dialog_rejected(self) -> None:
        self.import_dialog = None
        self._pending_import = []

    def import_nifti(
        self,
        paths: list[str | Path],
        *,
        label: str | None = None,
        patient: dict | None = None,
        study: dict | None = None,
    ) -> None:
        """Import NIfTI files without asking (scripts and tests); details apply to every file."""
        self.import_sources(
            [
                model.ImportJob(p, "nifti", label=label, patient=dict(patient or {}), study=dict(study or {}))
                for p in paths
            ]
        )

    def import_sources(self, jobs: list[model.ImportJob]) -> None:
        if not jobs or not self._ensure_unlocked(partial(self.import_sources, jobs)):
            return
        self._start(
            "import",
            model.import_batch,
            self.vault,
            jobs,
            finished=self._on_imported,
            progress="Importing into the Vault",
            text="Encrypting...",
        )

    def _on_imported(self, report: model.ImportReport) -> None:
        self.refresh()
        done = len(report.imported)
        if report.cancelled:
            self.window.show_status(f"Import cancelled: {done} of {report.total} imported", 8000)
        elif done:
            what = f"\u201c{report.imported[0].label}\u201d" if done == 1 else f"{done} items"
            self.window.show_status(f"Imported {what} into the vault", 8000)
        if report.duplicates:
            names = "\n\n".join(message for _job, message in report.duplicates)
            jobs = [job for job, _message in report.duplicates]
            for job in jobs:
                job.allow_duplicate = True
            self.ask_duplicate(
                f"{names}\n\nImport another copy?", "Import a Copy", partial(self.import_sources, jobs)
            )
        if report.errors:
            if report.total == 1:
                self._show_error(ERROR_TITLES["import"], report.errors[0])
            else:
                self._show_error(
                    "Some items were not imported",
                    f"{len(report.errors)} of {report.total} could not be imported:\n\n"
                    + "\n\n".join(report.errors),
                )

    # -- save generated volumes ----------------------------------------------------------------------

    def can_save(self, entry: VolumeEntry | None) -> bool:
        if entry is None or entry.kind == "preview" or self.entry_is_from_vault(entry):
            return False
        return (
            entry.kind == "generated" or entry.synthetic or (entry.path is not None and is_nifti(entry.path))
        )

    def save_entry(self, entry: VolumeEntry | None = None) -> None:
        """Store a session volume: a generated one with its provenance (``add_synthetic``); one opened from a
        NIfTI file by importing that file unchanged."""
        entry = entry if entry is not None else self.window.state.shown
        if not self.can_save(entry):
            why = (
                "it is already in the vault"
                if self.entry_is_from_vault(entry)
                else "generate or open a volume first"
            )
            self.window.show_status(f"Nothing to save to the vault: {why}", 6000)
            return
        if not self._ensure_unlocked(partial(self.save_entry, entry)):
            return
        saved_as = self.item(self._saved.get(entry.uid, ""))
        if saved_as is not None:  # asks first: the same volume twice is rarely what is wanted
            self.ask_duplicate(
                f"\u201c{entry.name}\u201d is already in the vault as \u201c{saved_as.label}\u201d. "
                "Save another copy?",
                "Save a Copy",
                partial(self._save_now, entry, True),
            )
            return
        self._save_now(entry, False)

    def _save_now(self, entry: VolumeEntry, allow_duplicate: bool) -> None:
        if entry.kind == "generated" or (entry.synthetic and entry.path is None):
            provenance = model.jsonable({**entry.provenance, "synthetic": True})
            self._start(
                "save",
                model.save_volume,
                self.vault,
                entry.data,
                entry.affine,
                provenance,
                entry.name,
                allow_duplicate,
                entry.tissue or None,  # its tissue maps go with it, as parts of the same item
                finished=partial(self._on_saved, entry),
                failed=partial(self._on_save_failed, entry),
                progress="Saving to the Vault",
                text="Encrypting...",
            )
        else:
            self.ask_import_details([entry.path])

    def _on_save_failed(self, entry: VolumeEntry, task: _Task, message: str) -> None:
        if isinstance(task.worker.error, DuplicateItem):  # same voxels already stored (e.g. before a restart)
            self.ask_duplicate(
                f"{message}\n\nSave another copy?", "Save a Copy", partial(self._save_now, entry, True)
            )
        else:
            self._show_error(ERROR_TITLES["save"], message)

    def ask_duplicate(self, text: str, yes: str, then: Callable[[], None]) -> QMessageBox:
        """Ask (non-blocking) whether to store a volume the vault already holds; ``then`` runs on yes."""
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Already in the Vault",
            text,
            QMessageBox.StandardButton.Cancel,
            self.window,
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

    def _on_saved(self, entry: VolumeEntry, info) -> None:
        self._saved[entry.uid] = info.id
        self.window.state.mark_saved(entry, f"the vault as \u201c{info.label}\u201d")
        self.refresh()
        self.window.show_status(f"Saved \u201c{info.label}\u201d to the vault", 8000)

    # -- open, export, delete, verify ----------------------------------------------------------------

    def open_item(self, item_id: str) -> None:
        """Decrypt an item into memory and add it to the session (shown); once in the session, just show it."""
        for uid, opened_id in self._opened.items():
            entry = next((e for e in self.window.state.volumes if e.uid == uid), None)
            if opened_id == item_id and entry is not None:
                self.window.state.show(entry)
                return
        info = self.item(item_id)
        label = info.label if info is not None else item_id[:12]
        self.window.show_status(f"Decrypting \u201c{label}\u201d...")
        self._start(
            "open",
            model.open_for_session,
            self.vault,
            item_id,
            finished=self._on_item_opened,
            failed=partial(self._on_open_failed, label),
        )

    def _on_item_opened(self, opened) -> None:  # engine.nifti.volume.Volume, its ItemInfo in .info
        info = opened.info
        entry = VolumeEntry(info.label or f"vault item {info.id[:8]}", volume=opened, kind="opened")
        self._opened[entry.uid] = info.id
        self.window.state.add_volume(entry)
        maps = f" with tissue maps {', '.join(entry.tissue_names)}" if entry.tissue else ""
        self.window.show_status(
            f"Opened \u201c{entry.name}\u201d from the vault{maps} (decrypted in memory only)", 6000
        )
        self.window.volume_opened.emit(entry)

    def _on_open_failed(self, label: str, task: _Task, message: str) -> None:
        self.window.show_status(f"Could not open \u201c{label}\u201d", 6000)
        if isinstance(task.worker.error, VaultCorrupted):
            message += "\n\nVault > Verify All checks every item."
        self._show_error(f"Cannot open \u201c{label}\u201d from the vault", message)

    def edit_dialog_for(self, item_id: str) -> ItemDetailsDialog | None:
        """Edit an item's label, patient and study details (non-blocking dialog; saved in the background)."""
        info = self.item(item_id)
        if info is None or not self._unlocked:
            return None
        dialog = ItemDetailsDialog(info, self.window)
        dialog.accepted.connect(self._on_details_dialog_accepted)
        dialog.rejected.connect(self._on_details_dialog_rejected)
        self.details_dialog = dialog
        dialog.open()
        return dialog

    def _on_details_dialog_accepted(self) -> None:
        dialog, self.details_dialog = self.details_dialog, None
        if dialog is not None:
            self.edit_item(dialog.info.id, dialog.details())

    def _on_details_dialog_rejected(self) -> None:
        self.details_dialog = None

    def edit_item(self, item_id: str, details: dict) -> None:
        """Save new details (``label``, ``patient``, ``study``) of an item, in the background."""
        self._start("edit", model.update_item, self.vault, item_id, details, finished=self._on_item_edited)

    def _on_item_edited(self, info) -> None:
        # The session shows the vault's name of what came from (or went to) this item: a rename follows.
        state = self.window.state
        for entry in list(state.volumes):
            if self._opened.get(entry.uid) == info.id and entry.name != info.label:
                state.rename_volume(entry, info.label)
            elif self._saved.get(entry.uid) == info.id:
                state.mark_saved(entry, f"the vault as \u201c{info.label}\u201d")
        self.refresh()
        self.window.show_status(f"Saved the details of \u201c{info.label}\u201d", 6000)

    def export_dialog_for(self, item_id: str) -> ExportDialog | None:
        info = self.item(item_id)
        if info is None or not self._unlocked:
            return None
        dialog = ExportDialog(info, self._last_dir("vault/last_export_dir"), self.window)
        dialog.accepted.connect(self._on_export_dialog_accepted)
        dialog.rejected.connect(self._on_export_dialog_rejected)
        self.export_dialog = dialog
        dialog.open()
        return dialog

    def _on_export_dialog_accepted(self) -> None:
        dialog, self.export_dialog = self.export_dialog, None
        if dialog is not None:
            self.export_item(dialog.info.id, **dialog.options())

    def _on_export_dialog_rejected(self) -> None:
        self.export_dialog = None

    def export_item(
        self,
        item_id: str,
        dest: str | Path,
        *,
        deidentify: bool = True,
        include_dicom: bool = True,
        overwrite: bool = False,
    ) -> None:
        dest = Path(dest).expanduser()
        self._remember_dir("vault/last_export_dir", dest)
        self._start(
            "export",
            model.export_item,
            self.vault,
            item_id,
            dest,
            deidentify,
            include_dicom,
            overwrite,
            finished=self._on_exported,
            progress="Exporting from the Vault",
            text="Decrypting...",
        )

    def _on_exported(self, result) -> None:
        self.last_export = result
        if not result.files:
            return
        folder = result.files[0].parent
        how = " (de-identified)" if result.deidentified else ""
        summary = f"Wrote {model.export_summary(result.files)} to {folder}{how}"
        self.window.show_status(summary, 10000)
        text = summary
        if result.warnings:
            text += "\n\nDe-identification could not fix everything; check before sharing:\n\n" + "\n".join(
                f"\u2022 {w}" for w in result.warnings
            )
        # Every path is one click away ("Show Details..."), not a wall of 95 DICOM paths in the box.
        details = "\n".join(str(path) for path in result.files)
        self._inform(
            "Exported, with warnings" if result.warnings else "Exported from the Vault", text, details=details
        )

    def delete_item(self, item_id: str, *, confirm: bool = True) -> None:
        """Delete an item after asking (a non-blocking question box); ``confirm=False`` deletes at once."""
        info = self.item(item_id)
        if info is None or not self._unlocked:
            return
        if not confirm:
            self._start("delete", _delete, self.vault, item_id, finished=self._on_deleted)
            return
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Delete from the Vault",
            f"Delete \u201c{info.label}\u201d from the vault?",
            QMessageBox.StandardButton.Cancel,
            self.window,
        )
        box.setInformativeText("Its encrypted files are removed. This cannot be undone.")
        self.confirm_delete_button = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.finished.connect(self._on_confirm_box_finished)
        self._pending_delete = item_id
        self.confirm_box = box
        box.open()

    def _on_confirm_box_finished(self, _result: int) -> None:
        box, self.confirm_box = self.confirm_box, None
        item_id, self._pending_delete = self._pending_delete, None
        if box is not None and item_id and box.clickedButton() is self.confirm_delete_button:
            self.delete_item(item_id, confirm=False)
        if box is not None:
            box.deleteLater()

    def _on_deleted(self, item_id: str) -> None:
        self.refresh()
        self.window.show_status("Deleted the item from the vault", 6000)

    def verify_all(self) -> None:
        if not self._ensure_unlocked(self.verify_all):
            return
        self._start(
            "verify",
            model.verify_all,
            self.vault,
            finished=self._on_verified,
            progress="Verifying the Vault",
            text="Checking every item...",
        )

    def _on_verified(self, value) -> None:
        report, items = value
        self.last_verify = report
        notes = "".join(f"\n\n{note}" for note in report.notes)
        if report.ok:
            self._inform(
                "Vault verified",
                f"All {report.items_checked} items are intact: "
                f"{model.format_size(report.bytes_checked)} authenticated, and the audit trail's "
                f"{report.audit_entries} entries are unbroken.{notes}",
            )
        else:
            problems = model.label_problems(report.problems, items)
            self._show_error(
                "The vault failed verification",
                f"{len(problems)} problem(s) found:\n\n"
                + "\n\n".join(problems)
                + f"\n\n{report.items_checked} other item(s) are intact.{notes}",
            )

    # -- passphrase, settings ------------------------------------------------------------------------

    def change_passphrase_dialog(self) -> ChangePassphraseDialog | None:
        if not self._ensure_unlocked(self.change_passphrase_dialog):
            return None
        dialog = ChangePassphraseDialog(self.window)
        dialog.submitted.connect(self._on_passphrase_dialog_submitted)
        dialog.rejected.connect(self._on_passphrase_dialog_rejected)
        self.passphrase_dialog = dialog
        dialog.open()
        return dialog

    def _on_passphrase_dialog_submitted(self, old: str, new: str) -> None:
        rekey = self.passphrase_dialog is not None and self.passphrase_dialog.rekey_box.isChecked()
        self._start(
            "passphrase",
            _rekey if rekey else _change_passphrase,
            self.vault,
            old,
            new,
            self.kdf,
            finished=self._on_passphrase_changed,
            failed=self._on_passphrase_failed,
        )

    def _on_passphrase_dialog_rejected(self) -> None:
        self.passphrase_dialog = None

    def _on_passphrase_changed(self, _value) -> None:
        if self.passphrase_dialog is not None:
            self.passphrase_dialog.accept()
            self.passphrase_dialog = None
        self.window.show_status("Vault passphrase changed", 8000)

    def _on_passphrase_failed(self, task: _Task, message: str) -> None:
        self._show_error(ERROR_TITLES["passphrase"], message)
        dialog = self.passphrase_dialog
        if dialog is not None:
            if isinstance(task.worker.error, VaultLocked):
                dialog.retry("The current passphrase is wrong.")
            else:
                dialog.set_busy(False)

    def auto_lock_dialog(self) -> None:
        minutes, ok = QInputDialog.getInt(
            self.window,
            "Vault Auto-Lock",
            "Lock the vault after this many minutes without activity (0: never):",
            self.auto_lock_minutes,
            0,
            24 * 60,
            1,
        )
        if ok:
            self.set_auto_lock_minutes(minutes)

    def choose_vault_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self.window, "Open or create a vault folder", str(self.path.parent)
        )
        if folder:
            self.set_vault_path(folder)
            self.request_unlock()

    def window_show_browser(self) -> None:
        dock = self.window.docks.get("vaultDock")
        if dock is not None:
            dock.show()
            dock.raise_()
