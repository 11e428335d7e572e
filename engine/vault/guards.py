"""How an operation holds a vault: :func:`operation` (this object's mutex, unlocked, the latest index)
and :func:`writing` (the inter-process write lock, crash leftovers cleared). Every operation module runs
inside them::

    with guards.operation(state), guards.writing(state):
        ...change files, then item_index.commit(state, ...)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.errors import VaultLocked, VaultRolledBack
from engine.vault import cleanup, item_index
from engine.vault.layout import ROLLBACK_ADVICE
from engine.vault.state import VaultState


@contextlib.contextmanager
def operation(state: VaultState) -> Iterator[None]:
    """Run one operation: under the mutex, on an unlocked vault, with the index another process may have
    changed re-read; counts as activity before and after.

    Raises:
        VaultLocked: The vault is locked.
    """
    with state.mutex:
        if state.keys is None:
            raise VaultLocked(f"the vault at {state.path} is locked; unlock it with its passphrase")
        state.touch()
        try:
            item_index.refresh_index(state)
            yield
        finally:
            state.touch()


@contextlib.contextmanager
def writing(state: VaultState, *, repairing: bool = False) -> Iterator[None]:
    """Hold the inter-process write lock; on entry, see the latest index and clear crash leftovers.

    Raises:
        VaultRolledBack: The vault was unlocked with a rollback found (only ``repairing`` may write).
        VaultLocked: Another process holds the write lock past ``state.write_lock_wait_s``.
    """
    if state.rolled_back and not repairing:
        raise VaultRolledBack(
            f"the vault at {state.path} was rolled back ({'; '.join(state.rolled_back)}); changes are "
            f"refused until it is repaired. {ROLLBACK_ADVICE}"
        )
    state.write_lock.acquire(state.write_lock_wait_s)
    try:
        item_index.refresh_index(state)
        cleanup.remove_crash_leftovers(state)
        yield
    finally:
        state.write_lock.release()
