"""``vault rekey``: re-encrypt a whole vault under a new master key, so an old passphrase stops working.

``vault passwd`` re-wraps the same master key: whoever holds the old passphrase and any old copy of
``vault.json`` (a backup) can still unwrap it and read every item, also those added after the change.
A re-key instead builds a new vault beside the old one (``.<name>.rekey``: a new vault id, a new random
master key under the new passphrase), copies every item into it with its id, metadata and parts (each part
decrypted, authenticated, re-encrypted and its SHA-256 compared), replays the audit trail into the new
chain (each entry keeps its time, event and item, and notes its old seq, pid and user), and then swaps
the folders with two renames: ``vault -> .<name>.pre-rekey``, ``.<name>.rekey -> vault``. The old folder
(everything in it is encrypted under the old key) is then deleted.

Crash safety, at every point:

* while items are copied the old vault is untouched (and locked for writing); the staging folder is a
  vault itself, with its own crash safety. Running ``rekey`` again with the same new passphrase resumes:
  items already copied are kept (checked against the old records), items deleted or edited meanwhile are
  redone;
* a crash after the staging vault was marked complete (``rekey-complete``) but before the swap: the next
  run starts over from the items (the mark says the audit was replayed, which must happen once, last);
* a crash between the two renames leaves no folder at the vault's path: opening the vault finishes the
  swap (:func:`finish_interrupted_swap`, key-free: both folders are whole);
* a crash before the old folder is deleted: the next unlock deletes it and says so.

Cost: one decryption and one encryption of every byte, plus one SHA-256, and twice the vault's size on
disk for the duration (checked before starting). See the README for a measured figure.

What it cannot do: copies of the vault made *before* the re-key (backups) still open with the old
passphrase, and a deleted file's blocks may survive on the disk until overwritten.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import InvalidRequest, OutputError, VaultCorrupted, VaultLocked, VaultRolledBack
from engine.vault import crypto, importing, item_index, payload
from engine.vault.audit import AuditLog
from engine.vault.crypto import DecryptionFailed, KdfParams
from engine.vault.fsio import fsync_dir, write_atomic
from engine.vault.header import Header
from engine.vault.layout import HEADER_NAME

STAGING_SUFFIX = ".rekey"
RETIRED_SUFFIX = ".pre-rekey"
COMPLETE_MARK = "rekey-complete"

Progress = Callable[[int, int], None]


def staging_path(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}{STAGING_SUFFIX}")


def retired_path(folder: Path) -> Path:
    return folder.with_name(f".{folder.name}{RETIRED_SUFFIX}")


@dataclass(frozen=True)
class RekeyReport:
    """What a re-key did."""

    items: int  # items in the re-keyed vault
    copied: int  # items re-encrypted by this run
    kept: int  # items a previous, interrupted run had already re-encrypted
    bytes_copied: int  # plaintext bytes re-encrypted by this run
    audit_entries: int  # entries replayed into the new chain
    seconds: float
    old_vault_id: str
    new_vault_id: str


def finish_interrupted_swap(folder: Path) -> str | None:
    """Finish a re-key killed between its two renames (no folder at ``folder``, a complete staging one
    beside it). Needs no key. Returns a notice, or None when there was nothing to finish."""
    staging = staging_path(folder)
    if folder.exists() or not (staging / COMPLETE_MARK).is_file() or not (staging / HEADER_NAME).is_file():
        return None
    os.rename(staging, folder)
    with contextlib.suppress(FileNotFoundError):
        (folder / COMPLETE_MARK).unlink()
    fsync_dir(folder.parent)
    return "finished a re-key that was interrupted while the vault folder was being swapped"


def remove_retired(folder: Path) -> str | None:
    """Delete the pre-re-key folder a crash left behind (all of it is encrypted under the old key)."""
    retired = retired_path(folder)
    if not retired.exists():
        return None
    shutil.rmtree(retired)
    return f"deleted {retired.name}, the copy of the vault under its old key left by an interrupted re-key"


def _same_item(a: dict, b: dict) -> bool:
    """Whether two records describe the same item (blob names and ciphertext sizes aside)."""

    def plain(rec: dict) -> dict:
        rec = copy.deepcopy(rec)
        for part in rec.get("parts", []):
            part.pop("blob", None)
            part.pop("ct_size", None)
        return rec

    return plain(a) == plain(b)


def rekey(
    vault,
    old: str | bytes,
    new: str | bytes,
    *,
    kdf: KdfParams | None = None,
    progress: Progress | None = None,
) -> RekeyReport:
    """Re-encrypt every item, record, index and audit entry of ``vault`` under a new master key.

    Args:
        vault: An unlocked :class:`~engine.vault.Vault`. On return it is unlocked on the re-keyed vault
            (same path, new vault id).
        old: The current passphrase (asked again although the vault is unlocked).
        new: The new passphrase (may equal the old one: the key still changes).
        kdf: Argon2id parameters for the new passphrase (default: RFC 9106's).
        progress: Called with (plaintext bytes done, bytes total) as items are re-encrypted; it may raise
            to stop (the run can be resumed).

    Raises:
        VaultLocked: ``old`` is wrong, the vault is locked, or another process is writing to it.
        InvalidRequest: An interrupted re-key waits with another new passphrase, or the audit trail is
            damaged (re-key would carry the damage over: repair it first).
        OutputError: Not enough free disk space for the copy.
    """
    from engine.vault import lifecycle  # (lifecycle -> cleanup -> this module)

    started = time.monotonic()
    new_pw = crypto.encode_passphrase(new, new=True)
    old_pw = crypto.encode_passphrase(old)
    folder = vault.path
    staging = staging_path(folder)
    with vault._mutex:
        if vault._rolled_back:
            raise VaultRolledBack(f"the vault at {folder} was rolled back; repair it before re-keying")
        with vault._op(), vault._writing():
            master, old_id = _check_old_vault(vault, old_pw)
            target = _open_staging(staging, new_pw, kdf)
            try:
                copied = _copy_items(vault, target, progress)
                # The audit trail last, under the old chain's lock: nothing can be appended to it meanwhile.
                with vault._audit._lock.hold(wait_s=10.0):
                    replayed = _replay_audit(vault, target, old_id, len(copied.source_items))
                    write_atomic(staging / COMPLETE_MARK, old_id.encode() + b"\n")
                    new_keys, target._keys = target._keys, None  # handed to ``vault`` below, not wiped
                    target._audit.detach_keys()
                    new_id = target.vault_id
                    retired = retired_path(folder)
                    os.rename(folder, retired)
                    os.rename(staging, folder)
                    fsync_dir(folder.parent)
            except BaseException:
                if target._keys is not None:
                    target.lock()
                raise
        # After the swap, outside the old folder's locks (their files moved with it).
        with contextlib.suppress(FileNotFoundError):
            (folder / COMPLETE_MARK).unlink()
        lifecycle.reopen(vault, new_keys)
        try:
            shutil.rmtree(retired)
        except OSError as exc:
            vault.notices.append(f"could not delete {retired} (the vault under its old key): {exc}")
        with contextlib.suppress(OSError):
            vault._anchor.__class__(old_id).path.unlink()  # the old id is gone for good
        del master  # only checked against the passphrase; ``bytes`` cannot be zeroed in place
    return RekeyReport(
        items=len(copied.source_items),
        copied=len(copied.todo),
        kept=copied.kept,
        bytes_copied=copied.done,
        audit_entries=replayed,
        seconds=time.monotonic() - started,
        old_vault_id=old_id,
        new_vault_id=new_id,
    )


def _check_old_vault(vault, old_pw: bytes) -> tuple[bytes, str]:
    """The old master key and vault id, once the old passphrase and the audit chain check out; removes a
    pre-re-key copy an earlier run left."""
    folder = vault.path
    header = Header.read(folder)
    try:
        master = header.unwrap(old_pw)
    except DecryptionFailed:
        AuditLog.record_failed_unlock(folder)
        raise VaultLocked("the current passphrase is wrong; nothing was re-keyed") from None
    audit = vault._audit.check()
    if audit.problems:
        raise InvalidRequest(
            "the audit trail is damaged (" + "; ".join(audit.problems[:3]) + "); run "
            "`volsynth vault verify` and `volsynth vault repair` before re-keying"
        )
    with contextlib.suppress(OSError):
        if (notice := remove_retired(folder)) is not None:
            vault.notices.append(notice)
    return master, header.vault_id.hex()


@dataclass(frozen=True)
class _Copied:
    source_items: dict  # the old vault's items, by id
    todo: list  # the records this run re-encrypted
    kept: int  # items an interrupted run had already copied
    done: int  # plaintext bytes re-encrypted by this run


def _copy_items(vault, target, progress: Progress | None) -> _Copied:
    """Bring the staging vault ``target`` in line with ``vault``: drop what was deleted or edited since an
    interrupted run, then re-encrypt every item it lacks (each part authenticated and its hash compared)."""
    source_items: dict = vault._index["items"]
    staged: dict = target._index["items"]
    for item_id in [i for i in staged if i not in source_items or not _same_item(staged[i], source_items[i])]:
        target.delete(item_id)  # deleted or edited in the old vault since the interrupted run
    todo = [rec for i, rec in sorted(source_items.items()) if i not in target._index["items"]]
    kept = len(source_items) - len(todo)
    total = sum(int(p["size"]) for rec in todo for p in rec["parts"])
    _check_space(vault.path, sum(int(p["ct_size"]) for rec in todo for p in rec["parts"]))
    done = 0
    if progress is not None:
        progress(0, total)
    for rec in todo:

        def read_part(part: dict, rec: dict = rec):
            return payload.iter_part(vault, rec, part, check_hash=True)

        done += importing.copy_in(target, rec, read_part)
        if progress is not None:
            progress(done, total)
    return _Copied(source_items=source_items, todo=todo, kept=kept, done=done)


def _replay_audit(vault, target, old_id: str, items: int) -> int:
    """Append every entry of the old audit chain to the new one (each keeps its time, event and item and
    notes its old seq, pid and user), then commit the re-key. Returns how many were replayed."""
    entries = vault._audit.check().entries
    replayed = [
        (e.event, e.item_id, {**e.detail, "replayed": {"seq": e.seq, "pid": e.pid, "user": e.user}}, e.time)
        for e in entries
    ]
    for start in range(0, len(replayed), 512):
        target._audit.append_many(replayed[start : start + 512])
    with target._op(), target._writing():
        item_index.commit(
            target,
            "rekey",
            None,
            {"from_vault": old_id, "items": items, "replayed": len(replayed)},
            copy.deepcopy(target._index),
        )
    return len(replayed)


def _open_staging(staging: Path, new_pw: bytes, kdf: KdfParams | None):
    """The staging vault of an interrupted run (same new passphrase), or a new one."""
    from engine.vault.store import Vault

    if Vault.exists(staging):
        target = Vault(staging, idle_timeout_s=None)
        try:
            target.unlock(new_pw)
        except VaultLocked:
            raise InvalidRequest(
                f"an interrupted re-key waits in {staging} under another new passphrase; give that one, "
                f"or delete {staging} to start over (the vault itself was not changed)"
            ) from None
        except (VaultCorrupted, VaultRolledBack):
            target = None
        if target is not None and not (staging / COMPLETE_MARK).exists():
            return target
        if target is not None:
            target.lock()
        shutil.rmtree(staging)  # damaged, or complete but not swapped in: the audit must be replayed once
    elif staging.exists():
        shutil.rmtree(staging)  # a staging vault whose creation was cut short: nothing in it yet
    return Vault.create(staging, new_pw, kdf=kdf, idle_timeout_s=None)


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder.parent).free
    if needed + 64 * 1024 * 1024 > free:
        raise OutputError(
            f"re-keying needs about {needed // 2**20 + 64} MiB free beside the vault (a full copy is made "
            f"before the old one is deleted); {free // 2**20} MiB are free"
        )
