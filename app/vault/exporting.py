"""Exporting a vault item to files: de-identified by default, with its original DICOM files if wanted.

The result is summed up in the status line and a box whose "Show Details..." lists every file written, and
what de-identification could not fix is said before anything is shared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QWidget

from app.core import vault_items as model
from app.vault.dialogs import ExportDialog
from app.vault.listing import VaultListing
from app.vault.messages import VaultMessages
from app.vault.privacy import last_dir, remember_dir
from app.vault.session import VaultSession
from app.vault.tasks import VaultTasks


class VaultExport:
    """Exports items of the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Decrypts and writes in the background (``VaultTasks``).
        listing: The listed items (``VaultListing``), for the item the dialog is about.
        messages: Tells what was written (``VaultMessages``).
        settings: The app's QSettings (the folder the export dialog starts in).
        show_status: ``(text, timeout_ms)``, the window's status line.
        parent: Parent of the export dialog (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        listing: VaultListing,
        messages: VaultMessages,
        settings: Any,
        show_status: Callable[..., None],
        parent: QWidget | None,
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._listing = listing
        self._messages = messages
        self._settings = settings
        self._show_status = show_status
        self._parent = parent
        self.export_dialog: ExportDialog | None = None
        self.last_export: Any = None

    def export_dialog_for(self, item_id: str, session_only: Sequence[str] = ()) -> ExportDialog | None:
        """Ask where and how to export the item (``session_only``: maps the shown item has that the vault does
        not keep, which the dialog names as not exported)."""
        info = self._listing.item(item_id)
        if info is None or not self._session.is_unlocked:
            return None
        folder = last_dir(self._settings, "vault/last_export_dir")
        dialog = ExportDialog(info, folder, self._parent, session_only=session_only)
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
        include_tissue: bool = True,
        overwrite: bool = False,
    ) -> None:
        dest = Path(dest).expanduser()
        remember_dir(self._settings, "vault/last_export_dir", dest)
        self._tasks.start(
            "export",
            model.export_item,
            self._session.vault,
            item_id,
            dest,
            deidentify,
            include_dicom,
            include_tissue,
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
        self._show_status(summary, 10000)
        text = summary
        if result.warnings:
            text += "\n\nDe-identification could not fix everything; check before sharing:\n\n" + "\n".join(
                f"\u2022 {w}" for w in result.warnings
            )
        # Every path is one click away ("Show Details..."), not a wall of 95 DICOM paths in the box.
        details = "\n".join(str(path) for path in result.files)
        self._messages.inform(
            "Exported, with warnings" if result.warnings else "Exported from the Vault", text, details=details
        )

    def forget(self) -> None:
        """The vault locked: the export dialog closes unanswered."""
        if self.export_dialog is not None:
            self.export_dialog.reject()
        self.export_dialog = None
