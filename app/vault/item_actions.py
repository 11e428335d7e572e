"""Actions on one vault item from the browser: edit its details (label, patient, study), compute its tissue maps
(kept with it, encrypted) and delete it.

A rename follows into the session: a volume opened from (or saved as) the item takes the vault's new name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QMessageBox, QPushButton, QWidget

from app.core import vault_items as model
from app.core.tissue_source import AUTO, maps_source_text
from app.vault.dialogs import ItemDetailsDialog
from app.vault.listing import VaultListing
from app.vault.opening import VaultOpen
from app.vault.saving import VaultSave
from app.vault.session import VaultSession
from app.vault.tasks import VaultTask, VaultTasks
from engine.errors import InvalidRequest


class VaultItemActions:
    """Edit and delete items of the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Saves, segments and deletes in the background (``VaultTasks``).
        listing: The listed items (``VaultListing``), listed again after each change.
        opening: The volumes opened from the vault (``VaultOpen.opened``): they follow a rename and get new maps.
        saving: The volumes saved to the vault (``VaultSave.saved``): their "saved as" follows a rename.
        state: The app's session (``AppState``), whose names follow a rename.
        show_status: ``(text, timeout_ms)``, the window's status line.
        parent: Parent of the details dialog and the delete question (window-modal).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        listing: VaultListing,
        opening: VaultOpen,
        saving: VaultSave,
        state: Any,
        show_status: Callable[..., None],
        parent: QWidget | None,
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._listing = listing
        self._opening = opening
        self._saving = saving
        self._state = state
        self._show_status = show_status
        self._parent = parent
        self.details_dialog: ItemDetailsDialog | None = None
        self.confirm_box: QMessageBox | None = None
        self.confirm_delete_button: QPushButton | None = None
        self._pending_delete: str | None = None
        self._pending_tissue = ""  # the label of the item being segmented, for its messages

    # -- details -------------------------------------------------------------------------------------

    def edit_dialog_for(self, item_id: str) -> ItemDetailsDialog | None:
        """Edit an item's label, patient and study details (non-blocking dialog; saved in the background)."""
        info = self._listing.item(item_id)
        if info is None or not self._session.is_unlocked:
            return None
        dialog = ItemDetailsDialog(info, self._parent)
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
        self._tasks.start(
            "edit", model.update_item, self._session.vault, item_id, details, finished=self._on_item_edited
        )

    def _on_item_edited(self, info) -> None:
        # The session shows the vault's name of what came from (or went to) this item: a rename follows.
        state = self._state
        opened, saved = self._opening.opened, self._saving.saved
        for entry in list(state.volumes):
            if opened.get(entry.uid) == info.id and entry.name != info.label:
                state.rename_volume(entry, info.label)
            elif saved.get(entry.uid) == info.id:
                state.mark_saved(entry, f"the vault as \u201c{info.label}\u201d")
        self._listing.refresh()
        self._show_status(f"Saved the details of \u201c{info.label}\u201d", 6000)

    # -- tissue maps ---------------------------------------------------------------------------------

    def compute_tissue_maps(self, item_id: str) -> None:
        """Segment an item (GM, WM, CSF, brain mask) and keep the maps with it, encrypted, in the background;
        maps it has from its model's channels are kept instead (a message says so)."""
        info = self._listing.item(item_id)
        if info is None or not self._session.is_unlocked:
            return
        made = (info.provenance or {}).get("tissue_maps_made") or {}
        if info.tissue_maps and made.get("tissue_maps_source") != "method":
            self._show_status(
                f"\u201c{info.label}\u201d has its model's own tissue maps; they are kept", 8000
            )
            return
        self._pending_tissue = info.label
        computed = self._session_maps(item_id)
        # Maps computed for it in this session (Viewer > Compute Tissue Maps) are kept as they are; otherwise it is
        # segmented, again (replacing its maps) when asked: e.g. after the item's contrast was corrected.
        function: Callable[..., Any]
        args: tuple[Any, ...]
        if computed is not None:
            function, args, title = model.keep_session_maps, (item_id, *computed), "Keeping Tissue Maps"
            text = f"Keeping the maps of \u201c{info.label}\u201d computed in this session"
        else:
            function, args, title = model.segment_vault_item, (item_id, AUTO), "Computing Tissue Maps"
            text = f"Segmenting \u201c{info.label}\u201d"
        self._tasks.start(
            "tissue",
            function,
            self._session.vault,
            *args,
            bool(info.tissue_maps),
            finished=self._on_tissue_computed,
            failed=self._on_tissue_failed,
            progress=title,
            text=text,
        )

    def _session_maps(self, item_id: str) -> tuple[dict, dict] | None:
        """The maps an open session entry of the item got in this session by segmentation (not yet in the
        vault), with the record of how they were made; None when there are none."""
        for entry in self._state.volumes:
            info = entry.vault_item
            made = entry.provenance.get("tissue_maps_made")
            if (
                info is not None
                and info.id == item_id
                and model.session_only_maps(entry)
                and isinstance(made, dict)
                and made.get("tissue_maps_source") == "method"
            ):
                return dict(entry.tissue), dict(made)
        return None

    def _on_tissue_computed(self, value) -> None:
        info, maps, made = value
        state, opened = self._state, self._opening.opened
        for entry in list(state.volumes):
            if opened.get(entry.uid) == info.id:  # open in the session: it shows them at once
                entry.tissue = dict(maps)
                entry.provenance = {**entry.provenance, "tissue_maps_made": made}
                entry.volume.info = info
                state.volumes_changed.emit()
                if state.shown is entry:
                    state.shown_changed.emit(entry)
                    state.set_show_tissue(True)
        self._listing.refresh()
        source = maps_source_text(info.provenance or {}, "opened", True)
        self._show_status(
            f"Tissue maps of \u201c{info.label}\u201d kept with it in the vault, encrypted ({source})", 10000
        )

    def _on_tissue_failed(self, task: VaultTask, message: str) -> None:
        label = self._pending_tissue or "the item"
        if isinstance(task.worker.error, InvalidRequest):  # refused (not brain-like, SWI...): one line
            self._show_status(f"No tissue maps for \u201c{label}\u201d: {' '.join(message.split())}", 15000)
            return
        QMessageBox.critical(self._parent, "Cannot compute tissue maps", message)

    # -- delete --------------------------------------------------------------------------------------

    def delete_item(self, item_id: str, *, confirm: bool = True) -> None:
        """Delete an item after asking (a non-blocking question box); ``confirm=False`` deletes at once."""
        info = self._listing.item(item_id)
        if info is None or not self._session.is_unlocked:
            return
        if not confirm:
            self._tasks.start(
                "delete", model.delete_item, self._session.vault, item_id, finished=self._on_deleted
            )
            return
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Delete from the Vault",
            f"Delete \u201c{info.label}\u201d from the vault?",
            QMessageBox.StandardButton.Cancel,
            self._parent,
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
        self._listing.refresh()
        self._show_status("Deleted the item from the vault", 6000)

    def forget(self) -> None:
        """The vault locked: the delete question and the details dialog close unanswered."""
        self._pending_delete = None
        for dialog in (self.confirm_box, self.details_dialog):
            if dialog is not None:
                dialog.reject()
        self.confirm_box = self.details_dialog = None
