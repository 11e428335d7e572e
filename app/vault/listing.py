"""The browser's model: the vault items matching the current search, listed in the background.

An older search that answers after a newer one was started is dropped, so typing fast never shows stale rows.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from app.vault import operations

if TYPE_CHECKING:  # (the controller imports this module)
    from app.vault.controller import VaultController


class VaultListing:
    """The listed items of the vault ``hub`` (the ``VaultController``) holds; ``hub.items_changed`` tells
    the browser."""

    def __init__(self, hub: VaultController) -> None:
        self._hub = hub
        self.items: list = []
        self.query = ""
        self.kind: str | None = None
        self._list_seq = 0

    def item(self, item_id: str):
        return next((info for info in self.items if info.id == item_id), None)

    def set_filter(self, query: str, kind: str | None = None) -> None:
        self.query, self.kind = query, kind
        self.refresh()

    def refresh(self) -> None:
        """List the items matching the current search, in the background."""
        hub = self._hub
        if not hub.is_unlocked:
            return
        self._list_seq += 1
        hub.tasks.start(
            "list",
            operations.list_items,
            hub.vault,
            self.query,
            self.kind,
            finished=partial(self._on_listed, self._list_seq),
        )

    def _on_listed(self, seq: int, items: list) -> None:
        if seq != self._list_seq:  # an older search answered after a newer one was started
            return
        self.items = list(items)
        self._hub.items_changed.emit(self.items)

    def clear(self) -> None:
        """The vault locked: no items, and the browser is told."""
        self.items = []
        self._hub.items_changed.emit([])
