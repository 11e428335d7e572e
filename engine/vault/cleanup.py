"""Clean-up of what interrupted writes leave: temporary files of imports and changes, partial exports, the
pre-re-key copy; and the listing of payload files no index references (those are never deleted here)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import VaultError
from engine.vault import pending_exports
from engine.vault.folders import remove_retired
from engine.vault.fsio import TMP_WRITE_PREFIX, remove_leftovers
from engine.vault.layout import BLOB_SUFFIX, RECORD_COPY_SUFFIX, RECORD_SUFFIX, blob_dir

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def orphan_blobs(state: VaultState) -> list[Path]:
    """Payload and record files the index does not reference (never deleted automatically)."""
    assert state.index is not None
    used = {p["blob"] for rec in state.index["items"].values() for p in rec["parts"]}
    items = set(state.index["items"])
    try:
        entries = list(os.scandir(blob_dir(state.path)))
    except FileNotFoundError:
        return []
    return sorted(
        Path(e.path)
        for e in entries
        if (e.name.endswith(BLOB_SUFFIX) and e.name[: -len(BLOB_SUFFIX)] not in used)
        or (e.name.endswith(RECORD_SUFFIX) and e.name[: -len(RECORD_SUFFIX)] not in items)
        or (e.name.endswith(RECORD_COPY_SUFFIX) and e.name[: -len(RECORD_COPY_SUFFIX)] not in items)
    )


def remove_crash_leftovers(state: VaultState) -> int:
    """Remove the temporary files of interrupted writes (never a committed or unreferenced payload).
    Safe only under the write lock: every writer of these files holds it. Returns how many."""
    removed = remove_leftovers(state.path, TMP_WRITE_PREFIX) + remove_leftovers(
        blob_dir(state.path), TMP_WRITE_PREFIX
    )
    if removed:
        state.notices.append(
            f"removed {removed} partial file(s) left in the vault by an interrupted import or change"
        )
    return removed


def clean_stale_files(state: VaultState) -> None:
    """At unlock: remove partial files of interrupted imports (if no other process is writing) and of
    interrupted exports (beside their targets), and say so in :attr:`notices`. Never raises."""
    try:
        state.write_lock.acquire(0.0)
    except VaultError:
        pass  # another process is writing: its partial files are live
    else:
        try:
            remove_crash_leftovers(state)
        except OSError:
            pass
        finally:
            state.write_lock.release()
    try:
        pending_exports.clean_stale_exports(state)
    except (OSError, VaultError) as exc:
        state.notices.append(f"could not check for interrupted exports: {exc}")
    try:
        if (notice := remove_retired(state.path)) is not None:
            state.notices.append(notice)
    except OSError as exc:
        state.notices.append(f"could not delete the vault's pre-re-key copy: {exc}")
