"""Changing what is stored: deleting an item, editing its details, changing the passphrase. Each is one
commit under the write lock, recorded in the audit trail."""

from __future__ import annotations

import contextlib
import copy
import hmac
from typing import TYPE_CHECKING

from engine.errors import InvalidRequest, VaultCorrupted, VaultError, VaultLocked
from engine.vault import crypto, guards, item_index, record_files
from engine.vault.audit import AuditLog
from engine.vault.crypto import DecryptionFailed, KdfParams
from engine.vault.fsio import fsync_dir, write_atomic
from engine.vault.header import Header, now_iso, sha256
from engine.vault.layout import HEADER_NAME, blob_dir, blob_path
from engine.vault.metadata import check_dates, json_dict
from engine.vault.records import ItemInfo, refuse_patient_if_synthetic

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def delete(state: VaultState, item_id: str) -> None:
    """Delete an item and its encrypted files. Recorded in the audit trail."""
    with guards.operation(state), guards.writing(state):
        assert state.index is not None
        rec = item_index.find_record(state, item_id)
        index = copy.deepcopy(state.index)
        del index["items"][rec["id"]]
        item_index.commit(state, "delete", rec["id"], {"kind": rec["kind"]}, index)
        # The user asked for this item's files to go; nothing else is ever deleted.
        record_files.unlink_records(state, rec["id"])
        for part in rec["parts"]:
            with contextlib.suppress(FileNotFoundError):
                blob_path(state.path, part["blob"]).unlink()
        fsync_dir(blob_dir(state.path))


def update_item(
    state: VaultState,
    item_id: str,
    *,
    label: str | None = None,
    patient: dict | None = None,
    study: dict | None = None,
) -> ItemInfo:
    """Change an item's details after import (the payload is not touched). Recorded in the audit trail.

    Args:
        item_id: Item id or unique prefix.
        label: New display name (None keeps it).
        patient: New patient details, replacing the old ones (None keeps them; scans only).
        study: New study details, replacing the old ones (None keeps them). Dates are checked.

    Raises:
        InvalidRequest: Bad values, or patient details for a synthetic item.
    """
    with guards.operation(state), guards.writing(state):
        assert state.index is not None
        rec = copy.deepcopy(item_index.find_record(state, item_id))
        changed = []
        if label is not None:
            if not str(label).strip():
                raise InvalidRequest("the label cannot be empty")
            rec["label"] = str(label).strip()
            changed.append("label")
        if patient is not None:
            patient = json_dict(patient, "patient metadata")
            refuse_patient_if_synthetic(rec["kind"], patient)
            rec["patient"] = patient
            changed.append("patient")
        if study is not None:
            rec["study"] = json_dict(study, "study metadata")
            changed.append("study")
        check_dates(rec)
        if not changed:
            return ItemInfo.from_record(rec)
        rec["modified"] = now_iso()
        record_files.write_record(state, rec)
        fsync_dir(blob_dir(state.path))
        index = copy.deepcopy(state.index)
        index["items"][rec["id"]] = rec
        item_index.commit(state, "edit", rec["id"], {"fields": changed}, index)
        return ItemInfo.from_record(rec)


def change_passphrase(
    state: VaultState, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None
) -> None:
    """Re-wrap the master key under a new passphrase; no item is re-encrypted.

    This does not lock out the old passphrase: with it and any old copy of ``vault.json`` the same
    master key unwraps, and it decrypts every item, including those added later. :meth:`rekey` does.

    Args:
        old: The current passphrase (asked again even though the vault is unlocked).
        new: The new passphrase (at least 8 characters).
        kdf: Argon2id parameters for the new passphrase (default: RFC 9106's 64 MiB / t=3 / p=4).

    Raises:
        VaultLocked: ``old`` is wrong.
    """
    new_pw = crypto.encode_passphrase(new, new=True)
    old_pw = crypto.encode_passphrase(old)
    kdf = kdf or KdfParams()
    with guards.operation(state), guards.writing(state):
        assert state.keys is not None
        header = Header.read(state.path)
        try:
            master = header.unwrap(old_pw)
        except DecryptionFailed:
            AuditLog.record_failed_unlock(state.path)
            raise VaultLocked("the current passphrase is wrong; the passphrase was not changed") from None
        if not hmac.compare_digest(master, bytes(state.keys.master)):
            raise VaultCorrupted("the vault header no longer matches this vault's key")
        assert state.index is not None
        new_header = Header.wrapping(header.vault_id, header.created, kdf, new_pw, master)
        # Audit entry (naming the new header) -> header -> index recording the header's hash: restoring
        # the old vault.json later no longer matches the index (see engine.vault.rollback).
        state.header = new_header
        try:
            item_index.commit(
                state,
                "passphrase_changed",
                None,
                {"kdf": kdf.to_dict(), "header_sha256": sha256(new_header.to_bytes())},
                copy.deepcopy(state.index),
                before_index=lambda: write_atomic(state.path / HEADER_NAME, new_header.to_bytes()),
            )
        except BaseException:
            with contextlib.suppress(VaultError):
                state.header = Header.read(state.path)
            raise
