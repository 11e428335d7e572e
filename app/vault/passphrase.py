"""Changing the vault's passphrase: re-wrap the key (fast), or re-encrypt the whole vault under a new key.

The dialog stays open until the change is done; a wrong current passphrase is said where the user types.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QWidget

from app.core import vault_items as model
from app.vault.dialogs import ChangePassphraseDialog
from app.vault.locking import VaultLocking
from app.vault.messages import VaultMessages
from app.vault.session import VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks
from engine.errors import VaultLocked
from engine.formatting import count_of, format_duration


class VaultPassphrase:
    """Change the passphrase of the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``) and the Argon2id parameters for the new passphrase.
        tasks: Re-wraps or re-encrypts in the background (``VaultTasks``).
        locking: Unlocks first when the vault is locked (``VaultLocking``).
        messages: Tells what a re-encryption did (``VaultMessages``).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the dialog (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        locking: VaultLocking,
        messages: VaultMessages,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._locking = locking
        self._messages = messages
        self._show_status = show_status
        self._show_error = show_error
        self._parent = parent
        self.passphrase_dialog: ChangePassphraseDialog | None = None

    def change_passphrase_dialog(self) -> ChangePassphraseDialog | None:
        if not self._locking.ensure_unlocked(self.change_passphrase_dialog):
            return None
        dialog = ChangePassphraseDialog(self._parent)
        dialog.submitted.connect(self._on_passphrase_dialog_submitted)
        dialog.rejected.connect(self._on_passphrase_dialog_rejected)
        self.passphrase_dialog = dialog
        dialog.open()
        return dialog

    def _on_passphrase_dialog_submitted(self, old: str, new: str) -> None:
        rekey = self.passphrase_dialog is not None and self.passphrase_dialog.rekey_box.isChecked()
        self._tasks.start(
            "passphrase",
            model.rekey_vault if rekey else model.change_passphrase,
            self._session.vault,
            old,
            new,
            self._session.kdf,
            finished=self._on_passphrase_changed,
            failed=self._on_passphrase_failed,
        )

    def _on_passphrase_dialog_rejected(self) -> None:
        self.passphrase_dialog = None

    def _on_passphrase_changed(self, report) -> None:
        if self.passphrase_dialog is not None:
            self.passphrase_dialog.accept()
            self.passphrase_dialog = None
        if report is None:  # re-wrapped: the key is the same
            self._show_status(
                "Vault passphrase changed (the key was re-wrapped: older copies of the vault still open with "
                "the old passphrase)",
                15000,
            )
            return
        # Re-encrypted: say what, and what it does not reach, in a box that stays until read.
        self._show_status("Vault re-encrypted under a new key", 15000)
        self._messages.inform(
            "Vault Re-encrypted",
            f"{count_of(report.items, 'item')} and {count_of(report.audit_entries, 'audit entry', 'audit entries')} "
            "are now encrypted under a new key that only the new passphrase opens "
            f"({format_duration(report.seconds)}).\n\n"
            "Copies of the vault made before now (backups, synced folders) are not changed: they still open "
            "with the old passphrase. Delete them if it may have leaked.",
            details=f"Old vault id: {report.old_vault_id}\nNew vault id: {report.new_vault_id}",
        )

    def _on_passphrase_failed(self, task: VaultTask, message: str) -> None:
        self._show_error(ERROR_TITLES["passphrase"], message)
        dialog = self.passphrase_dialog
        if dialog is not None:
            if isinstance(task.worker.error, VaultLocked):
                dialog.retry("The current passphrase is wrong.")
            else:
                dialog.set_busy(False)

    def forget(self) -> None:
        """The vault locked: the dialog closes unanswered."""
        if self.passphrase_dialog is not None:
            self.passphrase_dialog.reject()
        self.passphrase_dialog = None
