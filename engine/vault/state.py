"""The open state of one vault: what every operation of the package reads and changes.

:class:`~engine.vault.store.Vault` owns one :class:`VaultState` and hands it to the operation modules
(:mod:`~engine.vault.lifecycle`, :mod:`~engine.vault.importing`, :mod:`~engine.vault.checking`...), which
take the state, never the ``Vault``: the facade keeps the public API and the auto-lock policy, the state
keeps the folder, the keys, the decrypted index, the audit trail and the locks. A re-key works on a
second state (its staging vault) without making a second ``Vault``.

The fields are public because the operations share them; nothing outside ``engine.vault`` should touch
them (the ``Vault`` methods are the API). How operations hold the locks is in :mod:`engine.vault.guards`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.vault.anchor import Anchor
from engine.vault.audit import AuditLog
from engine.vault.folders import finish_interrupted_swap
from engine.vault.fsio import FileLock
from engine.vault.header import Header, Keys
from engine.vault.layout import WRITE_LOCK_NAME


@dataclass(eq=False)
class VaultState:
    """One vault folder as an open object sees it (see the module docstring).

    ``keys`` and ``index`` are set together by an unlock and cleared together by a lock.
    """

    #: The vault folder (absolute).
    path: Path
    #: ``vault.json`` as last read (replaced by an unlock, a passphrase change, a re-key).
    header: Header
    #: The audit trail of this vault id (its keys are attached while unlocked).
    audit: AuditLog
    #: This computer's record of the latest generation and audit entry seen (rollback detection).
    anchor: Anchor
    #: The inter-process lock every change holds (see :func:`engine.vault.guards.writing`).
    write_lock: FileLock
    #: Monotonic clock in seconds: when the user was last active (auto-lock).
    clock: Callable[[], float] = time.monotonic
    #: How long a change waits for another process's write to finish before raising ``VaultLocked``.
    write_lock_wait_s: float = 0.0
    #: Serialises this object's operations between threads (the app's GUI timer and a worker).
    mutex: threading.RLock = field(default_factory=threading.RLock)
    keys: Keys | None = None
    #: The decrypted index (``{"generation": ..., "items": {id: record}}``) and its file's stamp.
    index: dict | None = None
    index_stamp: tuple | None = None
    #: Set when the audit trail could not be extended at unlock; cleared by the next audit entry.
    audit_problem: str | None = None
    #: What unlock found rolled back (only with ``allow_rollback``): changes but repair are refused.
    rolled_back: list[str] = field(default_factory=list)
    #: Things cleaned up or noticed by the last unlock or change, one line each (``Vault.notices``).
    notices: list[str] = field(default_factory=list)
    #: What the user must see at unlock (``Vault.warnings``).
    warnings: list[str] = field(default_factory=list)
    #: Notices from opening the folder (a finished re-key swap), moved to ``notices`` at the next unlock.
    opening_notices: list[str] = field(default_factory=list)
    last_activity: float = 0.0

    @classmethod
    def open(
        cls, path: Path, *, clock: Callable[[], float] = time.monotonic, write_lock_wait_s: float = 0.0
    ) -> VaultState:
        """The locked state of the vault at ``path`` (absolute), after finishing a re-key's swap that a
        kill interrupted (it needs no key).

        Raises:
            VaultError: No vault at ``path``.
            VaultCorrupted: The header is damaged or was edited.
        """
        swapped = finish_interrupted_swap(path)
        header = Header.read(path)
        state = cls(
            path=path,
            header=header,
            audit=AuditLog(path, header.vault_id),
            anchor=Anchor(header.vault_id.hex()),
            write_lock=FileLock(
                path / WRITE_LOCK_NAME,
                "the vault is being written by another VolSynth process (pid {pid}); try again when it finishes",
            ),
            clock=clock,
            write_lock_wait_s=write_lock_wait_s,
            opening_notices=[swapped] if swapped else [],
            last_activity=clock(),
        )
        state.audit.on_append = state.on_audit_appended
        return state

    def rebind(self, header: Header) -> None:
        """Follow the vault now in the folder (a re-key swapped in another vault id): its header, audit
        trail and anchor. Call with the state locked."""
        self.header = header
        self.audit = AuditLog(self.path, header.vault_id)
        self.audit.on_append = self.on_audit_appended
        self.anchor = Anchor(header.vault_id.hex())
        self.rolled_back = []

    @property
    def vault_id(self) -> str:
        return self.header.vault_id.hex()

    @property
    def is_unlocked(self) -> bool:
        return self.keys is not None

    def touch(self, now: float | None = None) -> None:
        """Record user activity (postpones auto-lock)."""
        self.last_activity = self.clock() if now is None else now

    def record(self, event: str, item_id: str | None = None, detail: dict | None = None) -> None:
        """Append an audit entry; a successful one clears :attr:`audit_problem`."""
        self.audit.append(event, item_id, detail)
        self.audit_problem = None

    def on_audit_appended(self, seq: int, mac: bytes) -> None:
        """Called by the audit trail after every append: move the anchor to the new entry."""
        if not self.rolled_back:  # a rolled-back chain must not move the anchor (repair resets it)
            self.anchor.update(audit=(seq, mac))
