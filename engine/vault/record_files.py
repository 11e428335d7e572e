"""Each item's own record files (``blobs/<id>.vsr`` and its copy ``.vsm``): what ``repair`` re-indexes from.

Each is encrypted under the record key in a context that binds the item id, so a file swapped between
items fails to authenticate.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import VaultCorrupted
from engine.vault import crypto
from engine.vault.crypto import DecryptionFailed
from engine.vault.fsio import write_atomic
from engine.vault.layout import RECORD_COPY_SUFFIX, RECORD_SUFFIX, blob_dir
from engine.vault.records import KINDS

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def record_ctx(state: VaultState, item_id: str) -> bytes:
    assert state.keys is not None
    return crypto.context(state.keys.vault_id, "record", item_id)


def record_path(state: VaultState, item_id: str) -> Path:
    return blob_dir(state.path) / f"{item_id}{RECORD_SUFFIX}"


def record_copy_path(state: VaultState, item_id: str) -> Path:
    return blob_dir(state.path) / f"{item_id}{RECORD_COPY_SUFFIX}"


def write_record(state: VaultState, rec: dict) -> None:
    """Write both copies of an item's record (each atomically; the caller fsyncs the folder)."""
    assert state.keys is not None
    plain = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
    for path in (record_path(state, rec["id"]), record_copy_path(state, rec["id"])):
        write_atomic(
            path,
            crypto.encrypt_bytes(state.keys.record, record_ctx(state, rec["id"]), plain),
            sync_dir=False,
        )


def unlink_records(state: VaultState, item_id: str) -> None:
    for path in (record_path(state, item_id), record_copy_path(state, item_id)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_record_file(state: VaultState, path: Path, item_id: str) -> dict:
    """One record file, authenticated (its context binds the item id: a swapped file fails)."""
    assert state.keys is not None
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise VaultCorrupted(f"the record of item {item_id} ({path.name}) is missing") from None
    try:
        rec = json.loads(crypto.decrypt_bytes(state.keys.record, record_ctx(state, item_id), raw))
        if rec["id"] != item_id or rec["kind"] not in KINDS or not isinstance(rec["parts"], list):
            raise ValueError("not this item's record")
    except (DecryptionFailed, ValueError, KeyError, TypeError) as exc:
        raise VaultCorrupted(
            f"the record of item {item_id} ({path.name}) does not authenticate (modified, truncated, "
            "emptied or swapped)"
        ) from exc
    return rec


def read_record(state: VaultState, item_id: str) -> dict:
    """An item's record, from whichever copy authenticates; VaultCorrupted if neither does."""
    try:
        return read_record_file(state, record_path(state, item_id), item_id)
    except VaultCorrupted as first:
        try:
            return read_record_file(state, record_copy_path(state, item_id), item_id)
        except VaultCorrupted:
            raise first from None


def record_problems(state: VaultState, rec: dict) -> tuple[list[str], bool]:
    """What is wrong with an indexed item's record files: (problems, files merely absent in a vault made
    before every item had two record files: a note, ``repair`` writes them)."""
    assert state.index is not None
    problems: list[str] = []
    absent = False
    two_expected = state.index.get("record_copies") == 2
    for path in (record_path(state, rec["id"]), record_copy_path(state, rec["id"])):
        if not path.exists() and not two_expected:
            absent = True
            continue
        try:
            on_disk = read_record_file(state, path, rec["id"])
        except VaultCorrupted as exc:
            problems.append(f"{exc}; `volsynth vault repair` rewrites it from the index")
            continue
        if on_disk != rec:
            problems.append(
                f"the record of item {rec['id']} ({path.name}) differs from the index (an older copy was "
                "put back?); `volsynth vault repair` rewrites it from the index"
            )
    return problems, absent and not problems


def records_need_writing(state: VaultState, rec: dict) -> bool:
    for path in (record_path(state, rec["id"]), record_copy_path(state, rec["id"])):
        try:
            if read_record_file(state, path, rec["id"]) != rec:
                return True
        except VaultCorrupted:
            return True
    return False
