"""The browser's model: the vault items matching the current search, listed in the background.

An older search that answers after a newer one was started is dropped, so typing fast never shows stale rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from app.core import vault_items as model
from app.vault.session import VaultSession
from app.vault.tasks import VaultTasks


class VaultListing:
    """The listed items of the vault ``session`` holds.

    Args:
        session: The open vault (``VaultSession``).
        tasks: Runs the listing in the background (``VaultTasks``).
        changed: Called with the listed ``ItemInfo`` s whenever they change (the browser shows them).
    """

    def __init__(self, session: VaultSession, tasks: VaultTasks, *, changed: Callable[[list], None]) -> None:
        self._session = session
        self._tasks = tasks
        self._changed = changed
        self.items: list = []
        self.query = ""
        self.kind: str | None = None
        self._list_seq = 0

    def item(self, item_id: str) -> Any:
        return next((info for info in self.items if info.id == item_id), None)

    def set_filter(self, query: str, kind: str | None = None) -> None:
        self.query, self.kind = query, kind
        self.refresh()

    def refresh(self) -> None:
        """List the items matching the current search, in the background."""
        session = self._session
        if not session.is_unlocked:
            return
        self._list_seq += 1
        self._tasks.start(
            "list",
            model.list_items,
            session.vault,
            self.query,
            self.kind,
            finished=partial(self._on_listed, self._list_seq),
        )

    def _on_listed(self, seq: int, items: list) -> None:
        if seq != self._list_seq:  # an older search answered after a newer one was started
            return
        self.items = list(items)
        self._changed(self.items)

    def clear(self) -> None:
        """The vault locked: no items, and the browser is told."""
        self.items = []
        self._changed([])
