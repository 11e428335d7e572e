"""Opening vault items into the app's session: decrypted in memory only, never written to disk.

An item already in the session is just shown again. Volumes opened from the vault leave the session when
the vault locks (``close_opened``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from app.core import vault_items as model
from app.core.volumes import VolumeEntry
from app.vault.listing import VaultListing
from app.vault.session import VaultSession
from app.vault.tasks import VaultTask, VaultTasks
from engine.errors import VaultCorrupted


class VaultOpen:
    """Opens items of the vault ``session`` holds into the app's session ``state``.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Decrypts in the background (``VaultTasks``).
        listing: The listed items (``VaultListing``), for an item's label.
        state: The app's session (``AppState``).
        show_status: ``(text, timeout_ms)``, the window's status line.
        show_error: ``(title, message)``, the app's error dialog.
        opened: Called with the ``VolumeEntry`` of each item that came into the session (the app shows it).
    """

    def __init__(
        self,
        session: VaultSession,
        tasks: VaultTasks,
        listing: VaultListing,
        state: Any,
        show_status: Callable[..., None],
        show_error: Callable[[str, str], None],
        *,
        opened: Callable[[VolumeEntry], None],
    ) -> None:
        self._session = session
        self._tasks = tasks
        self._listing = listing
        self._volume_opened = opened
        self._state = state
        self._show_status = show_status
        self._show_error = show_error
        self.opened: dict[int, str] = {}  # session entry uid -> vault item id

    def entry_is_from_vault(self, entry: VolumeEntry | None) -> bool:
        return entry is not None and entry.vault_item is not None

    def open_item(self, item_id: str) -> None:
        """Decrypt an item into memory and add it to the session (shown); once in the session, just show it."""
        state = self._state
        for uid, opened_id in self.opened.items():
            entry = next((e for e in state.volumes if e.uid == uid), None)
            if opened_id == item_id and entry is not None:
                state.show(entry)
                return
        info = self._listing.item(item_id)
        label = info.label if info is not None else item_id[:12]
        self._show_status(f"Decrypting \u201c{label}\u201d...")
        self._tasks.start(
            "open",
            model.open_for_session,
            self._session.vault,
            item_id,
            finished=self._on_item_opened,
            failed=partial(self._on_open_failed, label),
        )

    def _on_item_opened(self, opened) -> None:  # engine.nifti.volume.Volume, its ItemInfo in .info
        info = opened.info
        entry = VolumeEntry(info.label or f"vault item {info.id[:8]}", volume=opened, kind="opened")
        self.opened[entry.uid] = info.id
        self._state.add_volume(entry)
        maps = f" with tissue maps {', '.join(entry.tissue_names)}" if entry.tissue else ""
        self._show_status(
            f"Opened \u201c{entry.name}\u201d from the vault{maps} (decrypted in memory only)", 6000
        )
        self._volume_opened(entry)

    def _on_open_failed(self, label: str, task: VaultTask, message: str) -> None:
        self._show_status(f"Could not open \u201c{label}\u201d", 6000)
        if isinstance(task.worker.error, VaultCorrupted):
            message += "\n\nVault > Verify All checks every item."
        self._show_error(f"Cannot open \u201c{label}\u201d from the vault", message)

    def close_opened(self) -> None:
        """The vault locked: what was decrypted from it leaves the session."""
        for uid in list(self.opened):
            entry = next((e for e in self._state.volumes if e.uid == uid), None)
            if entry is not None:
                self._state.remove_volume(entry)
        self.opened.clear()
