"""Saving session volumes to the vault: a generated one with its provenance and tissue maps, one opened
from a NIfTI file by importing that file unchanged.

The same volume saved twice is asked about first (rarely what is wanted); the session then names where
each volume went ("saved to the vault as ...").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from app.core import vault_items as model
from app.core.volumes import VolumeEntry
from app.vault.importing import VaultImport
from app.vault.listing import VaultListing
from app.vault.locking import VaultLocking
from app.vault.messages import VaultMessages
from app.vault.opening import VaultOpen
from app.vault.session import VaultSession
from app.vault.tasks import ERROR_TITLES, VaultTask, VaultTasks
from engine.errors import DuplicateItem
from engine.nifti.io import is_nifti


class VaultSave:
    """Stores volumes of the app's session ``state`` in the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Encrypts in the background (``VaultTasks``).
        locking: Unlocks first when the vault is locked (``VaultLocking``).
        listing: The listed items (``VaultListing``): what a volume was saved as, listed again after a save.
        messages: Asks before the same volume is stored twice (``VaultMessages``).
        opening: Knows the volumes that came from the vault (``VaultOpen``): those are not saved to it again.
        importing: Imports a volume opened from a NIfTI file, asking its details (``VaultImport``).
        state: The app's session (``AppState``): its shown volume, and where each was saved.
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        locking: VaultLocking,
        listing: VaultListing,
        messages: VaultMessages,
        opening: VaultOpen,
        importing: VaultImport,
        state: Any,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._locking = locking
        self._listing = listing
        self._messages = messages
        self._opening = opening
        self._importing = importing
        self._state = state
        self._show_status = show_status
        self._show_error = show_error
        self.saved: dict[int, str] = {}  # session entry uid -> the vault item it was saved as

    def can_save(self, entry: VolumeEntry | None) -> bool:
        if entry is None or entry.kind == "preview" or self._opening.entry_is_from_vault(entry):
            return False
        return (
            entry.kind == "generated" or entry.synthetic or (entry.path is not None and is_nifti(entry.path))
        )

    def save_entry(self, entry: VolumeEntry | None = None) -> None:
        """Store a session volume: a generated one with its provenance (``add_synthetic``); one opened from a
        NIfTI file by importing that file unchanged."""
        entry = entry if entry is not None else self._state.shown
        if entry is None or not self.can_save(entry):
            why = (
                "it is already in the vault"
                if self._opening.entry_is_from_vault(entry)
                else "generate or open a volume first"
            )
            self._show_status(f"Nothing to save to the vault: {why}", 6000)
            return
        if not self._locking.ensure_unlocked(partial(self.save_entry, entry)):
            return
        saved_as = self._listing.item(self.saved.get(entry.uid, ""))
        if saved_as is not None:  # asks first: the same volume twice is rarely what is wanted
            self._messages.ask_duplicate(
                f"\u201c{entry.name}\u201d is already in the vault as \u201c{saved_as.label}\u201d. "
                "Save another copy?",
                "Save a Copy",
                partial(self._save_now, entry, True),
            )
            return
        self._save_now(entry, False)

    def _save_now(self, entry: VolumeEntry, allow_duplicate: bool) -> None:
        if entry.kind == "generated" or (entry.synthetic and entry.path is None):
            self._tasks.start(
                "save",
                model.save_volume,
                self._session.vault,
                entry.volume,  # the record itself: image, affine, provenance and its tissue maps
                entry.name,
                allow_duplicate,
                finished=partial(self._on_saved, entry),
                failed=partial(self._on_save_failed, entry),
                progress="Saving to the Vault",
                text="Encrypting...",
            )
        elif entry.path is not None:
            self._importing.ask_import_details([entry.path])

    def _on_save_failed(self, entry: VolumeEntry, task: VaultTask, message: str) -> None:
        if isinstance(task.worker.error, DuplicateItem):  # same voxels already stored (e.g. before a restart)
            self._messages.ask_duplicate(
                f"{message}\n\nSave another copy?", "Save a Copy", partial(self._save_now, entry, True)
            )
        else:
            self._show_error(ERROR_TITLES["save"], message)

    def _on_saved(self, entry: VolumeEntry, info) -> None:
        self.saved[entry.uid] = info.id
        self._state.mark_saved(entry, f"the vault as \u201c{info.label}\u201d")
        self._listing.refresh()
        self._show_status(f"Saved \u201c{info.label}\u201d to the vault", 8000)
