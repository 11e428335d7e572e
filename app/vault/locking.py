"""Unlocking, creating and locking the vault, and its auto-lock after idle time.

Locking forgets the keys and the decrypted index, clears the browser and closes the volumes opened from
the vault (``VaultController.forget_unlocked``). User activity anywhere in the app (keys, clicks, wheel)
postpones the auto-lock; the vault itself keeps the idle clock, and a timer asks it once a second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QWidget

from app.vault import operations
from app.vault.dialogs import VaultUnlockDialog
from app.vault.privacy import forget_paths, protect_process, remember_recent
from app.vault.tasks import ERROR_TITLES, VaultTask
from engine.errors import EngineError, VaultLocked, VaultRolledBack

if TYPE_CHECKING:  # (the controller imports this module)
    from app.vault.controller import VaultController

log = logging.getLogger(__name__)

IDLE_CHECK_MS = 1000
_ACTIVITY = (QEvent.Type.KeyPress, QEvent.Type.MouseButtonPress, QEvent.Type.Wheel)


class VaultLocking(QObject):
    """Unlock / create / lock / auto-lock of the vault ``hub`` (the ``VaultController``) holds.

    Args:
        hub: The vault's state and signals, and the other pieces (``VaultController``).
        settings: The app's QSettings (remembered paths are forgotten on close when remembering is off).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the unlock dialogs; its Close event locks the vault (the app is closing).
    """

    def __init__(
        self,
        hub: VaultController,
        settings,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
    ) -> None:
        super().__init__(hub)
        self._hub = hub
        self._settings = settings
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self.unlock_dialog: VaultUnlockDialog | None = None
        self.core_dump_note = ""  # why core dumps could not be turned off, if they could not
        self._after_unlock: list[Callable[[], None]] = []
        self._idle_timer = QTimer(self)
        self._idle_timer.setInterval(IDLE_CHECK_MS)
        self._idle_timer.timeout.connect(self._on_idle_timer_timeout)
        app = QApplication.instance()
        if app is not None:  # user activity postpones auto-lock; the filter goes away with this object
            app.installEventFilter(self)

    # -- unlock / create -----------------------------------------------------------------------------

    def request_unlock(self) -> VaultUnlockDialog | None:
        """Show the create or unlock dialog (non-blocking); the browser follows when it succeeds."""
        hub = self._hub
        hub.window_show_browser()
        if hub.is_unlocked:
            return None
        self.protect()  # before the passphrase is typed
        if self.unlock_dialog is not None and self.unlock_dialog.isVisible():
            self.unlock_dialog.raise_()
            return self.unlock_dialog
        mode = "unlock" if hub.exists else "create"
        return self.open_unlock_dialog(mode)

    def open_unlock_dialog(self, mode: str) -> VaultUnlockDialog:
        """The passphrase dialog in ``mode`` (create, unlock or repair), opened non-blocking."""
        dialog = VaultUnlockDialog(mode, self._hub.path, self._parent)
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
            self._hub.integrity.check_repair(passphrase)
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
        hub = self._hub
        self.protect()
        hub.tasks.start(
            "create",
            operations.create_vault,
            hub.path,
            passphrase,
            hub.kdf,
            hub.idle_timeout_s(),
            hub.now,
            finished=self.unlocked_with,
            failed=self._on_unlock_failed,
        )

    def unlock(self, passphrase: str) -> None:
        """Unlock the vault at ``path`` with ``passphrase`` (Argon2id runs in the background)."""
        from engine.vault import Vault

        hub = self._hub
        self.protect()
        try:
            # A fresh object each time: a lock still finishing in the background can never undo this unlock.
            vault = Vault(hub.path, idle_timeout_s=hub.idle_timeout_s(), clock=hub.now)
        except EngineError as exc:
            self._unlock_refused(exc, str(exc))
            return
        hub.tasks.start(
            "unlock",
            operations.unlock,
            vault,
            passphrase,
            finished=self.unlocked_with,
            failed=self._on_unlock_failed,
        )

    def unlocked_with(self, vault) -> None:
        """``vault`` is unlocked (created, unlocked or repaired): show it, and run what waited for it."""
        hub = self._hub
        hub.vault = vault
        hub.unlocked = True
        self._idle_timer.start()
        if self.unlock_dialog is not None:
            self.unlock_dialog.accept()
            self.unlock_dialog = None
        self._show_status(f"Vault unlocked: {hub.path}", 5000)
        hub.state_changed.emit()
        hub.auto_lock_tick.emit(vault.seconds_until_auto_lock())
        hub.listing.refresh()
        if vault.notices:  # e.g. partial files of an interrupted import or export, removed
            hub.messages.inform("Vault cleaned up", "\n\n".join(vault.notices))
        if vault.warnings:  # what rollback detection could not check at this unlock, or a broken anchor
            hub.messages.warn("Vault unlocked with a warning", "\n\n".join(vault.warnings))
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
            self._hub.integrity.offer_repair(message)
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

    def ensure_unlocked(self, then: Callable[[], None]) -> bool:
        """True if unlocked; otherwise ask for the passphrase and run ``then`` once unlocked."""
        if self._hub.is_unlocked:
            return True
        self._after_unlock.append(then)
        self.request_unlock()
        return False

    # -- lock ----------------------------------------------------------------------------------------

    def lock(self, reason: str = "manual") -> None:
        """Lock now: forget the keys, clear the browser, close volumes opened from the vault."""
        hub = self._hub
        if not hub.is_unlocked:
            return
        running = hub.tasks.new_epoch()
        for task in running:
            task.worker.cancel()
        vault = hub.vault
        if running:  # the vault finishes its current chunk first; never wait for that in the GUI thread
            hub.tasks.start("lock", operations.lock, vault)
        else:
            vault.lock()
        self._after_lock(reason)

    def _after_lock(self, reason: str) -> None:
        hub = self._hub
        hub.unlocked = False
        self._idle_timer.stop()
        hub.forget_unlocked()
        hub.state_changed.emit()
        hub.auto_lock_tick.emit(None)
        if reason == "idle":
            minutes = hub.auto_lock_minutes
            self._show_status(f"Vault locked after {minutes} min without activity", 0)
        else:
            self._show_status("Vault locked", 5000)

    def notice_locked_elsewhere(self, task: VaultTask) -> None:
        """A task failed because the vault was locked by code outside the app: follow it."""
        hub = self._hub
        if (
            hub.is_unlocked
            and isinstance(task.worker.error, VaultLocked)
            and hub.vault is not None
            and not hub.vault.is_unlocked
        ):
            hub.tasks.new_epoch()
            self._after_lock("elsewhere")  # locked by code outside this controller

    # -- auto-lock -----------------------------------------------------------------------------------

    def check_idle(self) -> bool:
        """Lock if idle for the auto-lock time (the timer calls this every second). True if it locked."""
        hub = self._hub
        if not hub.is_unlocked or hub.vault is None:
            return False
        if hub.vault.lock_if_idle():
            hub.tasks.new_epoch()
            self._after_lock("idle")
            return True
        if not hub.vault.is_unlocked:  # locked behind our back (it cannot be, unless by code)
            hub.tasks.new_epoch()
            self._after_lock("elsewhere")
            return True
        hub.auto_lock_tick.emit(hub.vault.seconds_until_auto_lock())
        return False

    def _on_idle_timer_timeout(self) -> None:
        self.check_idle()

    def touch(self) -> None:
        if self._hub.is_unlocked and self._hub.vault is not None:
            self._hub.vault.touch()

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        etype = event.type()
        if etype in _ACTIVITY:
            if self._hub.is_unlocked:
                self.touch()
        elif etype == QEvent.Type.Close and self._parent is not None and obj is self._parent:
            self.shutdown()
        return False

    def shutdown(self) -> None:
        """The window is closing: stop the timer and lock (the audit trail records it); forget the paths
        the main window noted if remembering them is off."""
        hub = self._hub
        self._idle_timer.stop()
        if not remember_recent(self._settings):
            forget_paths(self._settings)
        if hub.is_unlocked:
            hub.tasks.cancel_all()
            hub.unlocked = False
            try:
                hub.vault.lock()
            except Exception:  # noqa: BLE001 - closing must never fail
                log.warning("could not lock the vault on close", exc_info=True)

    # -- settings dialogs ----------------------------------------------------------------------------

    def auto_lock_dialog(self) -> None:
        hub = self._hub
        minutes, ok = QInputDialog.getInt(
            self._parent,
            "Vault Auto-Lock",
            "Lock the vault after this many minutes without activity (0: never):",
            hub.auto_lock_minutes,
            0,
            24 * 60,
            1,
        )
        if ok:
            hub.set_auto_lock_minutes(minutes)

    def choose_vault_folder(self) -> None:
        hub = self._hub
        folder = QFileDialog.getExistingDirectory(
            self._parent, "Open or create a vault folder", str(hub.path.parent)
        )
        if folder:
            hub.set_vault_path(folder)
            self.request_unlock()
