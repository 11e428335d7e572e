"""The encrypted index (``index.vsi``): reading it, seeing another process's changes, committing a change,
and finding an item in it by id or prefix.

The index is the commit point of every change (see :mod:`engine.vault.store`): :func:`commit` writes the
audit entry first (write-ahead), then the index that records that entry, then moves the anchor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import InvalidRequest, VaultCorrupted, VaultError, VaultRolledBack
from engine.vault import crypto
from engine.vault.crypto import DecryptionFailed
from engine.vault.fsio import write_atomic
from engine.vault.header import Keys, sha256
from engine.vault.layout import INDEX_NAME, ROLLBACK_ADVICE

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def index_ctx(vault_id: bytes) -> bytes:
    """The encryption context of a vault's index."""
    return crypto.context(vault_id, "index")


def write_index_file(folder: Path, keys: Keys, index: dict) -> None:
    """Encrypt ``index`` into ``folder/index.vsi`` (atomic replace: the commit point)."""
    plain = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    write_atomic(folder / INDEX_NAME, crypto.encrypt_bytes(keys.index, index_ctx(keys.vault_id), plain))


def read_index(folder: Path, keys: Keys) -> tuple[dict, tuple]:
    """The decrypted index of the vault in ``folder`` and its file's stamp (inode, mtime, size)."""
    path = folder / INDEX_NAME
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            raw = fh.read()
    except FileNotFoundError as exc:
        raise VaultCorrupted(f"the vault index ({path}) is missing; restore the vault from a backup") from exc
    try:
        index = json.loads(crypto.decrypt_bytes(keys.index, index_ctx(keys.vault_id), raw))
        if index["vault_id"] != keys.vault_id.hex() or not isinstance(index["items"], dict):
            raise ValueError("index of another vault")
    except (DecryptionFailed, ValueError, KeyError, TypeError) as exc:
        raise VaultCorrupted(
            f"the vault index ({path}) is corrupted or was edited; restore the vault from a backup"
        ) from exc
    return index, (st.st_ino, st.st_mtime_ns, st.st_size)


def refresh_index(state: VaultState) -> None:
    """Re-read the index if another process (or object) changed it; an older one is refused."""
    assert state.keys is not None and state.index is not None
    try:
        st = os.stat(state.path / INDEX_NAME)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        stamp = None
    if stamp != state.index_stamp:
        index, new_stamp = read_index(state.path, state.keys)
        old_gen, new_gen = int(state.index.get("generation", 0)), int(index.get("generation", 0))
        if new_gen < old_gen:
            raise VaultRolledBack(
                f"index.vsi of the vault at {state.path} was replaced by an older version while the vault "
                f"was open (generation {new_gen}, it was at {old_gen}). {ROLLBACK_ADVICE}"
            )
        state.index, state.index_stamp = index, new_stamp


def commit(
    state: VaultState,
    event: str,
    item_id: str | None,
    detail: dict,
    index: dict,
    *,
    generation: int | None = None,
    before_index: Callable[[], None] | None = None,
) -> None:
    """Commit a change: the audit entry (write-ahead, carrying the new generation), then the index that
    records that entry's seq and MAC and the header's hash, then the anchor."""
    assert state.keys is not None and state.index is not None
    if generation is None:
        generation = int(state.index.get("generation", 0)) + 1
    state.record(event, item_id, {**detail, "generation": generation})
    if before_index is not None:
        before_index()
    assert state.audit.last_appended is not None
    seq, mac = state.audit.last_appended
    index = {
        **index,
        "generation": generation,
        "audit_seq": seq,
        "audit_mac": mac.hex(),
        "header_sha256": sha256(state.header.to_bytes()),
    }
    write_index_file(state.path, state.keys, index)
    st = os.stat(state.path / INDEX_NAME)
    state.index, state.index_stamp = index, (st.st_ino, st.st_mtime_ns, st.st_size)
    if not state.rolled_back:
        state.anchor.update(generation=generation)


def on_disk_has(state: VaultState, item_id: str) -> bool | None:
    """After a failed commit: does the index on disk reference the item? None if it cannot be told."""
    assert state.keys is not None
    try:
        index, _ = read_index(state.path, state.keys)
    except VaultError:
        return None
    return item_id in index["items"]


def find_record(state: VaultState, item_id: str) -> dict:
    """An indexed item's record by id or unique prefix (at least 4 characters)."""
    assert state.index is not None
    items = state.index["items"]
    if item_id in items:
        return items[item_id]
    key = str(item_id).strip().lower()
    if len(key) >= 4:
        matches = [k for k in items if k.startswith(key)]
        if len(matches) == 1:
            return items[matches[0]]
        if len(matches) > 1:
            raise InvalidRequest(f"{item_id} matches {len(matches)} items; give more of the id")
    raise InvalidRequest(f"there is no item {item_id} in the vault")
