"""The vault's integrity in the app: Verify All, and the repair offered after a rollback.

A repair unlocks the vault for repair only, shows what it would do (nothing is changed yet), and runs only
when the user confirms; nothing is ever deleted. The repair asks for the passphrase in a dialog of its own and
hands the repaired vault to ``VaultLocking``; locking only tells when an unlock found a rolled-back vault
(``rolled_back``), so the two depend one way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

from app.core import vault_items as model
from app.vault.dialogs import VaultUnlockDialog
from app.vault.locking import VaultLocking
from app.vault.messages import VaultMessages
from app.vault.session import VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks
from engine.errors import VaultLocked
from engine.formatting import count_of


class VaultIntegrity:
    """Verify All and repair of the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Runs the verification and the repair in the background (``VaultTasks``).
        locking: Unlocks before Verify All, keeps the repaired vault, and says when an unlock found the vault
            rolled back (its ``rolled_back`` signal offers the repair here).
        messages: Tells the results (``VaultMessages``).
        show_error: ``(title, message)``, the app's error dialog.
        parent: Parent of the passphrase dialog and the question boxes (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        locking: VaultLocking,
        messages: VaultMessages,
        show_error: Callable[[str, str], None],
        parent: QWidget | None,
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._locking = locking
        self._messages = messages
        self._show_error = show_error
        self._parent = parent
        locking.rolled_back.connect(self.offer_repair)
        self.last_verify: Any = None
        self.repair_dialog: VaultUnlockDialog | None = None  # the passphrase of a repair, while asked
        self.repair_box: QMessageBox | None = None
        self.repair_offer_button: QPushButton | None = None
        self.repair_confirm_button: QPushButton | None = None
        self._repair_vault: Any = None  # unlocked for repair only, while the user decides

    # -- verify --------------------------------------------------------------------------------------

    def verify_all(self) -> None:
        if not self._locking.ensure_unlocked(self.verify_all):
            return
        self._tasks.start(
            "verify",
            model.verify_all,
            self._session.vault,
            finished=self._on_verified,
            progress="Verifying the Vault",
            text="Checking every item...",
        )

    def _on_verified(self, value) -> None:
        report, items = value
        self.last_verify = report
        notes = "".join(f"\n\n{note}" for note in report.notes)
        if report.ok:
            self._messages.inform(
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
        self._messages.last_info = ("The vault was rolled back", message)
        box.open()
        return box

    def _on_repair_offer_finished(self, _result: int) -> None:
        box, self.repair_box = self.repair_box, None
        if box is not None:
            if box.clickedButton() is self.repair_offer_button:
                self.request_repair()
            box.deleteLater()

    def request_repair(self) -> VaultUnlockDialog:
        """Ask for the passphrase (non-blocking), then show what a repair would do (see Vault.repair)."""
        self._locking.protect()  # before the passphrase is typed
        dialog = VaultUnlockDialog("repair", self._session.path, self._parent)
        dialog.submitted.connect(self.check_repair)
        dialog.rejected.connect(self._on_repair_dialog_rejected)
        self.repair_dialog = dialog
        dialog.open()
        return dialog

    def _on_repair_dialog_rejected(self) -> None:
        self.repair_dialog = None

    def check_repair(self, passphrase: str) -> None:
        """The passphrase of the repair dialog: plan the repair in the background (nothing is changed)."""
        session = self._session
        self._tasks.start(
            "repair",
            model.plan_repair,
            session.path,
            passphrase,
            session.idle_timeout_s(),
            session.now,
            finished=self._on_repair_checked,
            failed=self._on_repair_check_failed,
        )

    def _on_repair_check_failed(self, task: VaultTask, message: str) -> None:
        dialog = self.repair_dialog
        self._show_error(ERROR_TITLES["repair"], message)
        if dialog is not None:
            if isinstance(task.worker.error, VaultLocked):
                dialog.retry("Wrong passphrase. Try again.")
            else:
                dialog.reject()

    def _on_repair_checked(self, value) -> None:
        vault, plan = value
        if self.repair_dialog is not None:
            self.repair_dialog.accept()
            self.repair_dialog = None
        if not plan.changed:
            vault.lock()
            self._messages.inform("Nothing to repair", "The vault is consistent; unlock it as usual.")
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
            self._tasks.start(
                "repair",
                model.repair_vault,
                vault,
                finished=self._on_repaired,
                progress="Repairing the Vault",
            )
        else:
            vault.lock()
        box.deleteLater()

    def _on_repaired(self, value) -> None:
        vault, report = value
        self._locking.unlocked_with(vault)
        self._messages.inform(
            "Vault repaired",
            f"{count_of(len(report.reindexed), 'item')} put back into the vault; nothing was deleted.",
        )
