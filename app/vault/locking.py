"""Unlocking, creating and locking the vault, and its auto-lock after idle time.

Locking forgets the keys and the decrypted index; ``locked`` tells the pieces, which drop their dialogs and what
came from the vault (the browser empties, the volumes opened from it leave the session). The open vault's
state (``VaultSession``) is changed here and nowhere else. User activity anywhere in the app (keys, clicks, wheel)
postpones the auto-lock; the vault itself keeps the idle clock, and a timer asks it once a second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QWidget

from app.core import vault_items as model
from app.vault.dialogs import VaultUnlockDialog
from app.vault.listing import VaultListing
from app.vault.messages import VaultMessages
from app.vault.privacy import forget_paths, protect_process, remember_recent
from app.vault.session import AUTO_LOCK_KEY, VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks
from engine.errors import EngineError, VaultLocked, VaultRolledBack

log = logging.getLogger(__name__)

IDLE_CHECK_MS = 1000
_ACTIVITY = (QEvent.Type.KeyPress, QEvent.Type.MouseButtonPress, QEvent.Type.Wheel)


class VaultLocking(QObject):
    """Unlock / create / lock / auto-lock of the vault ``session`` holds: the one writer of the session.

    Signals (GUI thread): ``locked()`` after the vault locked (here, after idle time or by code outside the
    app), once the session says so: the pieces drop what came from it; ``rolled_back(message)`` when an unlock
    was refused because the vault was rolled back (a repair may help: ``VaultIntegrity`` offers it).

    Args:
        session: The open vault (``VaultSession``), changed only here.
        tasks: Runs unlock, create and a lock behind running tasks in the background (``VaultTasks``).
        listing: Listed again once unlocked (``VaultListing``).
        messages: Tells what an unlock cleaned up or could not check (``VaultMessages``).
        settings: The app's QSettings (auto-lock minutes; remembered paths are forgotten on close when
            remembering is off).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the unlock dialogs; its Close event locks the vault (the app is closing).
        changed: Called when locked, unlocked, moved or the auto-lock time changed (menu and browser update).
        tick: Called with the seconds until the auto-lock (None when locked), once a second while unlocked.
        show_browser: Brings up the Vault dock (an unlock asked for anywhere shows where it leads).
    """

    locked = Signal()
    rolled_back = Signal(str)

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        listing: VaultListing,
        messages: VaultMessages,
        settings: Any,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
        *,
        changed: Callable[[], None],
        tick: Callable[[float | None], None],
        show_browser: Callable[[], None],
    ) -> None:
        super().__init__(parent)
        self._session = session
        self._tasks = tasks
        self._listing = listing
        self._messages = messages
        self._settings = settings
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self._changed = changed
        self._tick = tick
        self._show_browser = show_browser
        self.unlock_dialog: VaultUnlockDialog | None = None
        self.core_dump_note = ""  # why core dumps could not be turned off, if they could not
        self._after_unlock: list[Callable[[], object]] = []
        self._idle_timer = QTimer(self)
        self._idle_timer.setInterval(IDLE_CHECK_MS)
        self._idle_timer.timeout.connect(self._on_idle_timer_timeout)
        app = QApplication.instance()
        if app is not None:  # user activity postpones auto-lock; the filter goes away with this object
            app.installEventFilter(self)

    # -- unlock / create -----------------------------------------------------------------------------

    def request_unlock(self) -> VaultUnlockDialog | None:
        """Show the create or unlock dialog (non-blocking); the browser follows when it succeeds."""
        self._show_browser()
        if self._session.is_unlocked:
            return None
        self.protect()  # before the passphrase is typed
        if self.unlock_dialog is not None and self.unlock_dialog.isVisible():
            self.unlock_dialog.raise_()
            return self.unlock_dialog
        mode = "unlock" if self._session.exists else "create"
        dialog = VaultUnlockDialog(mode, self._session.path, self._parent)
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
        else:
            self.unlock(passphrase)

    def _on_unlock_dialog_rejected(self) -> None:
        self._after_unlock.clear()
        self.unlock_dialog = None

    def protect(self) -> None:
        """Core dumps off while a vault is (about to be) unlocked: a dump would hold decrypted volumes,
        patient details and the passphrase. Stays off for the app's life (see app.vault.privacy)."""
        self.core_dump_note = protect_process()
        if self.core_dump_note:
            log.warning("core dumps stay possible: %s", self.core_dump_note)

    def create(self, passphrase: str) -> None:
        """Create a new vault at ``path`` (in the background) and keep it unlocked."""
        session = self._session
        self.protect()
        self._tasks.start(
            "create",
            model.create_vault,
            session.path,
            passphrase,
            session.kdf,
            session.idle_timeout_s(),
            session.now,
            finished=self.unlocked_with,
            failed=self._on_unlock_failed,
        )

    def unlock(self, passphrase: str) -> None:
        """Unlock the vault at ``path`` with ``passphrase`` (Argon2id runs in the background)."""
        from engine.vault import Vault

        session = self._session
        self.protect()
        try:
            # A fresh object each time: a lock still finishing in the background can never undo this unlock.
            vault = Vault(session.path, idle_timeout_s=session.idle_timeout_s(), clock=session.now)
        except EngineError as exc:
            self._unlock_refused(exc, str(exc))
            return
        self._tasks.start(
            "unlock",
            model.unlock_vault,
            vault,
            passphrase,
            finished=self.unlocked_with,
            failed=self._on_unlock_failed,
        )

    def unlocked_with(self, vault) -> None:
        """``vault`` is unlocked (created, unlocked or repaired): show it, and run what waited for it."""
        self._session.set_unlocked(vault)
        self._idle_timer.start()
        if self.unlock_dialog is not None:
            self.unlock_dialog.accept()
            self.unlock_dialog = None
        self._show_status(f"Vault unlocked: {self._session.path}", 5000)
        self._changed()
        self._tick(vault.seconds_until_auto_lock())
        self._listing.refresh()
        if vault.notices:  # e.g. partial files of an interrupted import or export, removed
            self._messages.inform("Vault cleaned up", "\n\n".join(vault.notices))
        if vault.warnings:  # what rollback detection could not check at this unlock, or a broken anchor
            self._messages.warn("Vault unlocked with a warning", "\n\n".join(vault.warnings))
        if vault.audit_problem:
            self._show_error(
                "The vault's audit trail is damaged",
                f"{vault.audit_problem}\n\nChanges and views are refused until it is repaired; "
                "Vault > Verify All lists what is wrong.",
            )
        pending, self._after_unlock = self._after_unlock, []
        for action in pending:
            action()

    def _on_unlock_failed(self, task: VaultTask, message: str) -> None:
        self._unlock_refused(task.worker.error, message)

    def _unlock_refused(self, error: BaseException | None, message: str) -> None:
        if isinstance(error, VaultRolledBack):  # typing again would not help; a repair might
            if self.unlock_dialog is not None:
                self.unlock_dialog.reject()
            self.rolled_back.emit(message)
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

    def ensure_unlocked(self, then: Callable[[], object]) -> bool:
        """True if unlocked; otherwise ask for the passphrase and run ``then`` once unlocked."""
        if self._session.is_unlocked:
            return True
        self._after_unlock.append(then)
        self.request_unlock()
        return False

    # -- lock ----------------------------------------------------------------------------------------

    def lock(self, reason: str = "manual") -> None:
        """Lock now: forget the keys, clear the browser, close volumes opened from the vault."""
        session = self._session
        vault = session.vault
        if not session.is_unlocked or vault is None:
            return
        running = self._tasks.new_epoch()
        for task in running:
            task.worker.cancel()
        if running:  # the vault finishes its current chunk first; never wait for that in the GUI thread
            self._tasks.start("lock", model.lock_vault, vault)
        else:
            vault.lock()
        self._after_lock(reason)

    def _after_lock(self, reason: str) -> None:
        self._session.set_locked()
        self._idle_timer.stop()
        self.locked.emit()
        self._changed()
        self._tick(None)
        if reason == "idle":
            minutes = self._session.auto_lock_minutes
            self._show_status(f"Vault locked after {minutes} min without activity", 0)
        else:
            self._show_status("Vault locked", 5000)

    def notice_locked_elsewhere(self, task: VaultTask) -> None:
        """A task failed because the vault was locked by code outside the app: follow it."""
        session = self._session
        if (
            session.is_unlocked
            and isinstance(task.worker.error, VaultLocked)
            and session.vault is not None
            and not session.vault.is_unlocked
        ):
            self._tasks.new_epoch()
            self._after_lock("elsewhere")  # locked by code outside the app

    # -- auto-lock -----------------------------------------------------------------------------------

    def check_idle(self) -> bool:
        """Lock if idle for the auto-lock time (the timer calls this every second). True if it locked."""
        vault = self._session.vault
        if not self._session.is_unlocked or vault is None:
            return False
        if vault.lock_if_idle():
            self._tasks.new_epoch()
            self._after_lock("idle")
            return True
        if not vault.is_unlocked:  # locked behind our back (it cannot be, unless by code)
            self._tasks.new_epoch()
            self._after_lock("elsewhere")
            return True
        self._tick(vault.seconds_until_auto_lock())
        return False

    def _on_idle_timer_timeout(self) -> None:
        self.check_idle()

    def touch(self) -> None:
        vault = self._session.vault
        if self._session.is_unlocked and vault is not None:
            vault.touch()

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        etype = event.type()
        if etype in _ACTIVITY:
            if self._session.is_unlocked:
                self.touch()
        elif etype == QEvent.Type.Close and self._parent is not None and obj is self._parent:
            self.shutdown()
        return False

    def shutdown(self) -> None:
        """The window is closing: stop the timer and lock (the audit trail records it); forget the paths
        the main window noted if remembering them is off."""
        session = self._session
        self._idle_timer.stop()
        if not remember_recent(self._settings):
            forget_paths(self._settings)
        if session.is_unlocked and session.vault is not None:
            self._tasks.cancel_all()
            session.set_locked()
            try:
                session.vault.lock()
            except Exception:  # noqa: BLE001 - closing must never fail
                log.warning("could not lock the vault on close", exc_info=True)

    # -- settings dialogs ----------------------------------------------------------------------------

    def set_auto_lock_minutes(self, minutes: int) -> None:
        """Lock after ``minutes`` without activity (0: never), from now on; remembered in the settings."""
        minutes = max(0, int(minutes))
        self._settings.setValue(AUTO_LOCK_KEY, minutes)
        if self._session.vault is not None:
            self._session.vault.idle_timeout_s = self._session.idle_timeout_s()
        self._changed()

    def set_vault_path(self, path: str | Path) -> None:
        """Use the vault in ``path`` (locking the current one); remembered in the settings."""
        if self._session.is_unlocked:
            self.lock()
        self._session.set_path(Path(path).expanduser())
        self._changed()

    def auto_lock_dialog(self) -> None:
        minutes, ok = QInputDialog.getInt(
            self._parent,
            "Vault Auto-Lock",
            "Lock the vault after this many minutes without activity (0: never):",
            self._session.auto_lock_minutes,
            0,
            24 * 60,
            1,
        )
        if ok:
            self.set_auto_lock_minutes(minutes)

    def choose_vault_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self._parent, "Open or create a vault folder", str(self._session.path.parent)
        )
        if folder:
            self.set_vault_path(folder)
            self.request_unlock()
