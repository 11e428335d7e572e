"""The vault's integrity in the app: Verify All, and the repair offered after a rollback.

A repair unlocks the vault for repair only, shows what it would do (nothing is changed yet), and runs only
when the user confirms; nothing is ever deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QMessageBox, QWidget

from app.core import vault_items as model
from app.vault import operations
from app.vault.dialogs import VaultUnlockDialog
from app.vault.tasks import ERROR_TITLES, VaultTask
from engine.errors import VaultLocked
from engine.formatting import count_of

if TYPE_CHECKING:  # (the controller imports this module)
    from app.vault.controller import VaultController


class VaultIntegrity:
    """Verify All and repair of the vault ``hub`` (the ``VaultController``) holds.

    Args:
        hub: The vault's state and signals, and the other pieces (``VaultController``).
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the question boxes (window-modal).
    """

    def __init__(
        self, hub: VaultController, show_error: Callable[[str, str], None], parent: QWidget | None
    ) -> None:
        self._hub = hub
        self._show_error = show_error
        self._parent = parent
        self.last_verify = None
        self.repair_box: QMessageBox | None = None
        self.repair_offer_button = None
        self.repair_confirm_button = None
        self._repair_vault = None  # unlocked for repair only, while the user decides

    # -- verify --------------------------------------------------------------------------------------

    def verify_all(self) -> None:
        hub = self._hub
        if not hub.locking.ensure_unlocked(self.verify_all):
            return
        hub.tasks.start(
            "verify",
            model.verify_all,
            hub.vault,
            finished=self._on_verified,
            progress="Verifying the Vault",
            text="Checking every item...",
        )

    def _on_verified(self, value) -> None:
        report, items = value
        self.last_verify = report
        notes = "".join(f"\n\n{note}" for note in report.notes)
        if report.ok:
            self._hub.messages.inform(
                "Vault verified",
                f"All {report.items_checked} items are intact: "
                f"{model.format_size(report.bytes_checked)} authenticated, and the audit trail's "
                f"{report.audit_entries} entries are unbroken.{notes}",
            )
        else:
            problems = model.label_problems(report.problems, items)
            intact = count_of(report.items_checked, "other item") + (
                " is" if report.items_checked == 1 else " are"
            )
            self._show_error(
                "The vault failed verification",
                f"{count_of(len(problems), 'problem')} found:\n\n"
                + "\n\n".join(problems)
                + f"\n\n{intact} intact.{notes}",
            )

    # -- repair after a rollback ---------------------------------------------------------------------

    def offer_repair(self, message: str) -> QMessageBox:
        """Say what was rolled back and offer Repair... (non-blocking)."""
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "The vault was rolled back",
            message,
            QMessageBox.StandardButton.Close,
            self._parent,
        )
        self.repair_offer_button = box.addButton("Repair...", QMessageBox.ButtonRole.AcceptRole)
        box.finished.connect(self._on_repair_offer_finished)
        self.repair_box = box
        self._hub.messages.last_info = ("The vault was rolled back", message)
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
        locking = self._hub.locking
        locking.protect()
        return locking.open_unlock_dialog("repair")

    def check_repair(self, passphrase: str) -> None:
        """The passphrase of the repair dialog: plan the repair in the background (nothing is changed)."""
        hub = self._hub
        hub.tasks.start(
            "repair",
            operations.repair_check,
            hub.path,
            passphrase,
            hub.idle_timeout_s(),
            hub.now,
            finished=self._on_repair_checked,
            failed=self._on_repair_check_failed,
        )

    def _on_repair_check_failed(self, task: VaultTask, message: str) -> None:
        dialog = self._hub.locking.unlock_dialog
        self._show_error(ERROR_TITLES["repair"], message)
        if dialog is not None:
            if isinstance(task.worker.error, VaultLocked):
                dialog.retry("Wrong passphrase. Try again.")
            else:
                dialog.reject()

    def _on_repair_checked(self, value) -> None:
        vault, plan = value
        locking = self._hub.locking
        if locking.unlock_dialog is not None:
            locking.unlock_dialog.accept()
            locking.unlock_dialog = None
        if not plan.changed:
            vault.lock()
            self._hub.messages.inform("Nothing to repair", "The vault is consistent; unlock it as usual.")
            return
        lines = [f"\u2022 accept: {line}" for line in plan.accepted]
        lines += [
            f"\u2022 put back: \u201c{label}\u201d ({item_id[:12]})" for item_id, label in plan.reindexed
        ]
        if plan.records_written:
            lines.append(f"\u2022 write {count_of(plan.records_written, 'missing item record')}")
        lines += [f"\u2022 left alone: {line}" for line in plan.skipped]
        self._repair_vault = vault
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Repair the Vault",
            "A repair would:\n\n" + "\n".join(lines) + "\n\nNothing is deleted.",
            QMessageBox.StandardButton.Cancel,
            self._parent,
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
            self._hub.tasks.start(
                "repair",
                operations.repair_now,
                vault,
                finished=self._on_repaired,
                progress="Repairing the Vault",
            )
        else:
            vault.lock()
        box.deleteLater()

    def _on_repaired(self, value) -> None:
        vault, report = value
        self._hub.locking.unlocked_with(vault)
        self._hub.messages.inform(
            "Vault repaired",
            f"{count_of(len(report.reindexed), 'item')} put back into the vault; nothing was deleted.",
        )
