"""Saving session volumes to the vault: a generated one with its provenance and tissue maps, one opened
from a NIfTI file by importing that file unchanged.

The same volume saved twice is asked about first (rarely what is wanted); the session then names where
each volume went ("saved to the vault as ...").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from app.core import vault_items as model
from app.core.volumes import VolumeEntry
from app.vault.tasks import ERROR_TITLES, VaultTask
from engine.errors import DuplicateItem
from engine.nifti.io import is_nifti

if TYPE_CHECKING:  # (the controller imports this module)
    from app.vault.controller import VaultController


class VaultSave:
    """Stores volumes of the session ``state`` in the vault ``hub`` (the ``VaultController``) holds.

    Args:
        hub: The vault's state and signals, and the other pieces (``VaultController``).
        state: The app's session (``AppState``): its shown volume, and where each was saved.
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
    """

    def __init__(
        self,
        hub: VaultController,
        state,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
    ) -> None:
        self._hub = hub
        self._state = state
        self._show_status = show_status
        self._show_error = show_error
        self.saved: dict[int, str] = {}  # session entry uid -> the vault item it was saved as

    def can_save(self, entry: VolumeEntry | None) -> bool:
        if entry is None or entry.kind == "preview" or self._hub.opening.entry_is_from_vault(entry):
            return False
        return (
            entry.kind == "generated" or entry.synthetic or (entry.path is not None and is_nifti(entry.path))
        )

    def save_entry(self, entry: VolumeEntry | None = None) -> None:
        """Store a session volume: a generated one with its provenance (``add_synthetic``); one opened from a
        NIfTI file by importing that file unchanged."""
        hub = self._hub
        entry = entry if entry is not None else self._state.shown
        if not self.can_save(entry):
            why = (
                "it is already in the vault"
                if hub.opening.entry_is_from_vault(entry)
                else "generate or open a volume first"
            )
            self._show_status(f"Nothing to save to the vault: {why}", 6000)
            return
        if not hub.locking.ensure_unlocked(partial(self.save_entry, entry)):
            return
        saved_as = hub.listing.item(self.saved.get(entry.uid, ""))
        if saved_as is not None:  # asks first: the same volume twice is rarely what is wanted
            hub.messages.ask_duplicate(
                f"\u201c{entry.name}\u201d is already in the vault as \u201c{saved_as.label}\u201d. "
                "Save another copy?",
                "Save a Copy",
                partial(self._save_now, entry, True),
            )
            return
        self._save_now(entry, False)

    def _save_now(self, entry: VolumeEntry, allow_duplicate: bool) -> None:
        hub = self._hub
        if entry.kind == "generated" or (entry.synthetic and entry.path is None):
            hub.tasks.start(
                "save",
                model.save_volume,
                hub.vault,
                entry.volume,  # the record itself: image, affine, provenance and its tissue maps
                entry.name,
                allow_duplicate,
                finished=partial(self._on_saved, entry),
                failed=partial(self._on_save_failed, entry),
                progress="Saving to the Vault",
                text="Encrypting...",
            )
        else:
            hub.importing.ask_import_details([entry.path])

    def _on_save_failed(self, entry: VolumeEntry, task: VaultTask, message: str) -> None:
        if isinstance(task.worker.error, DuplicateItem):  # same voxels already stored (e.g. before a restart)
            self._hub.messages.ask_duplicate(
                f"{message}\n\nSave another copy?", "Save a Copy", partial(self._save_now, entry, True)
            )
        else:
            self._show_error(ERROR_TITLES["save"], message)

    def _on_saved(self, entry: VolumeEntry, info) -> None:
        self.saved[entry.uid] = info.id
        self._state.mark_saved(entry, f"the vault as \u201c{info.label}\u201d")
        self._hub.listing.refresh()
        self._show_status(f"Saved \u201c{info.label}\u201d to the vault", 8000)
