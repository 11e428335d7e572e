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
  redone, and the files of the item a kill interrupted (no index entry names them) are deleted first;
* a crash after the staging vault was marked complete (``rekey-complete``) but before the swap: the next
  run starts over from the items (the mark says the audit was replayed, which must happen once, last);
* a crash between the two renames leaves no folder at the vault's path: opening the vault finishes the
  swap (:func:`engine.vault.folders.finish_interrupted_swap`, key-free: both folders are whole);
* a crash before the old folder is deleted: the next unlock deletes it and says so.

Cost: one decryption and one encryption of every byte, plus one SHA-256, and twice the vault's size on
disk for the duration (checked before the staging folder is made: :func:`space_needed`). See docs/vault.md
for a measured figure.

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
from engine.vault import crypto, editing, guards, importing, item_index, lifecycle, payload, record_files
from engine.vault.anchor import Anchor
from engine.vault.audit import HEAD_NAME, LOG_NAME, AuditLog
from engine.vault.cleanup import orphan_blobs
from engine.vault.crypto import DecryptionFailed, KdfParams
from engine.vault.folders import COMPLETE_MARK, remove_retired, retired_path, staging_path
from engine.vault.fsio import fsync_dir, write_atomic
from engine.vault.header import Header
from engine.vault.layout import HEADER_NAME, INDEX_NAME, blob_dir, blob_path
from engine.vault.state import VaultState

REPLAY_BATCH = 512  # audit entries appended to the new chain in one locked step

Progress = Callable[[int, int], None]


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
    state: VaultState,
    old: str | bytes,
    new: str | bytes,
    *,
    kdf: KdfParams | None = None,
    progress: Progress | None = None,
) -> RekeyReport:
    """Re-encrypt every item, record, index and audit entry of a vault under a new master key.

    Args:
        state: An unlocked vault's state (``Vault.state``). On return it is unlocked on the re-keyed vault
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
    started = time.monotonic()
    new_pw = crypto.encode_passphrase(new, new=True)
    old_pw = crypto.encode_passphrase(old)
    folder = state.path
    staging = staging_path(folder)
    with state.mutex:
        if state.rolled_back:
            raise VaultRolledBack(f"the vault at {folder} was rolled back; repair it before re-keying")
        with guards.operation(state), guards.writing(state):
            master, old_id = _check_old_vault(state, old_pw)
            assert state.index is not None
            fresh = not staging.exists()
            if fresh:
                # Before the staging folder is made: a refusal leaves nothing behind.
                _check_space(state, list(state.index["items"].values()))
            target = _open_staging(staging, new_pw, kdf)
            try:
                copied = _copy_items(state, target, progress)
                # The audit trail last, under the old chain's lock: nothing can be appended to it meanwhile.
                with state.audit.held():
                    replayed = _replay_audit(state, target, old_id, len(copied.source_items))
                    write_atomic(staging / COMPLETE_MARK, old_id.encode() + b"\n")
                    new_keys, target.keys = target.keys, None  # handed to ``state`` below, not wiped
                    assert new_keys is not None  # _open_staging unlocked it
                    target.audit.detach_keys()
                    new_id = target.vault_id
                    retired = retired_path(folder)
                    os.rename(folder, retired)
                    os.rename(staging, folder)
                    fsync_dir(folder.parent)
            except BaseException:
                empty = target.index is not None and not target.index["items"]
                if target.keys is not None:
                    _lock(target)
                if fresh and empty and folder.is_dir() and not (staging / COMPLETE_MARK).exists():
                    # Made by this run, nothing copied into it yet and the swap not begun (an empty vault
                    # is swapped like any other): nothing worth resuming.
                    shutil.rmtree(staging, ignore_errors=True)
                raise
        # After the swap, outside the old folder's locks (their files moved with it).
        with contextlib.suppress(FileNotFoundError):
            (folder / COMPLETE_MARK).unlink()
        lifecycle.reopen(state, new_keys)
        try:
            shutil.rmtree(retired)
        except OSError as exc:
            state.notices.append(f"could not delete {retired} (the vault under its old key): {exc}")
        with contextlib.suppress(OSError):
            Anchor(old_id).path.unlink()  # the old id is gone for good
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


def _lock(target: VaultState) -> None:
    """Lock the staging vault (as ``Vault.lock`` does: an audit entry, then the keys wiped)."""
    with target.mutex:
        lifecycle.lock(target, "manual")


def _check_old_vault(state: VaultState, old_pw: bytes) -> tuple[bytes, str]:
    """The old master key and vault id, once the old passphrase and the audit chain check out; removes a
    pre-re-key copy an earlier run left."""
    folder = state.path
    header = Header.read(folder)
    try:
        master = header.unwrap(old_pw)
    except DecryptionFailed:
        AuditLog.record_failed_unlock(folder)
        raise VaultLocked("the current passphrase is wrong; nothing was re-keyed") from None
    audit = state.audit.check()
    if audit.problems:
        raise InvalidRequest(
            "the audit trail is damaged (" + "; ".join(audit.problems[:3]) + "); run "
            "`volsynth vault verify` and `volsynth vault repair` before re-keying"
        )
    with contextlib.suppress(OSError):
        if (notice := remove_retired(folder)) is not None:
            state.notices.append(notice)
    return master, header.vault_id.hex()


@dataclass(frozen=True)
class _Copied:
    source_items: dict  # the old vault's items, by id
    todo: list  # the records this run re-encrypted
    kept: int  # items an interrupted run had already copied
    done: int  # plaintext bytes re-encrypted by this run


def _copy_items(state: VaultState, target: VaultState, progress: Progress | None) -> _Copied:
    """Bring the staging vault ``target`` in line with ``vault``: drop what was deleted or edited since an
    interrupted run, then re-encrypt every item it lacks (each part authenticated and its hash compared)."""
    assert state.index is not None and target.index is not None
    source_items: dict = state.index["items"]
    staged: dict = target.index["items"]
    _drop_partial_copies(target)
    for item_id in [i for i in staged if i not in source_items or not _same_item(staged[i], source_items[i])]:
        editing.delete(target, item_id)  # deleted or edited in the old vault since the interrupted run
    todo = [rec for i, rec in sorted(source_items.items()) if i not in target.index["items"]]
    kept = len(source_items) - len(todo)
    total = sum(int(p["size"]) for rec in todo for p in rec["parts"])
    _check_space(state, todo)
    done = 0
    if progress is not None:
        progress(0, total)
    for rec in todo:

        def read_part(part: dict, rec: dict = rec):
            return payload.iter_part(state, rec, part, check_hash=True)

        done += importing.copy_in(target, rec, read_part)
        if progress is not None:
            progress(done, total)
    return _Copied(source_items=source_items, todo=todo, kept=kept, done=done)


def _replay_audit(state: VaultState, target: VaultState, old_id: str, items: int) -> int:
    """Append every entry of the old audit chain to the new one (each keeps its time, event and item and
    notes its old seq, pid and user), then commit the re-key. Returns how many were replayed (by this run
    and an interrupted one before it)."""
    entries = state.audit.check().entries
    # A run killed inside the replay left part of it in the staging chain (whole entries, in order): a
    # resumed run appends only the rest, so no entry appears twice. Old seqs are unique and never change
    # (the old chain is append-only and still ours, locked for writing).
    done = {
        e.detail["replayed"].get("seq")
        for e in target.audit.check().entries
        if isinstance(e.detail.get("replayed"), dict)
    }
    replayed = [
        (e.event, e.item_id, {**e.detail, "replayed": {"seq": e.seq, "pid": e.pid, "user": e.user}}, e.time)
        for e in entries
        if e.seq not in done
    ]
    for start in range(0, len(replayed), REPLAY_BATCH):
        target.audit.append_many(replayed[start : start + REPLAY_BATCH])
    with guards.operation(target), guards.writing(target):
        assert target.index is not None
        item_index.commit(
            target,
            "rekey",
            None,
            {"from_vault": old_id, "items": items, "replayed": len(replayed) + len(done)},
            copy.deepcopy(target.index),
        )
    return len(replayed) + len(done)


def _open_staging(staging: Path, new_pw: bytes, kdf: KdfParams | None) -> VaultState:
    """The staging vault of an interrupted run (same new passphrase), or a new one."""
    if (staging / HEADER_NAME).is_file():
        target = VaultState.open(staging)
        unlocked = True
        try:
            lifecycle.unlock(target, new_pw)
        except VaultLocked:
            raise InvalidRequest(
                f"an interrupted re-key waits in {staging} under another new passphrase; give that one, "
                f"or delete {staging} to start over (the vault itself was not changed)"
            ) from None
        except (VaultCorrupted, VaultRolledBack):
            unlocked = False
        if unlocked and not (staging / COMPLETE_MARK).exists():
            return target
        if unlocked:
            _lock(target)
        shutil.rmtree(staging)  # damaged, or complete but not swapped in: the audit must be replayed once
    elif staging.exists():
        shutil.rmtree(staging)  # a staging vault whose creation was cut short: nothing in it yet
    new = lifecycle.create(staging, new_pw, kdf=kdf)
    target = VaultState.open(new.folder)
    lifecycle.adopt_new(target, new)
    return target


def _drop_partial_copies(target: VaultState) -> int:
    """Delete the files of the staging vault that its index does not reference; returns how many.

    A run killed inside an item's copy leaves that item's finished payload (and maybe record) files with no
    index entry; the resumed run copies the item again under new blob names, and the old ones would be
    carried into the re-keyed vault, where ``verify`` lists them every time. Deleting them here is safe:
    the staging vault holds only copies made by re-key runs (the old vault is their source and stays
    untouched until the swap), no other writer can reach it (this run holds the old vault's write lock),
    and anything its index references is never among them.
    """
    with guards.operation(target), guards.writing(target):
        leftovers = orphan_blobs(target)
        for path in leftovers:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if leftovers:
            fsync_dir(blob_dir(target.path))
    return len(leftovers)


_BLOCK = 4096  # file systems allocate whole blocks: each file is counted rounded up to one
SPACE_MARGIN = 0.10  # on top of the estimate: file-system metadata, a slightly longer replayed audit entry
SPACE_MARGIN_MIN = 1 << 20


def _allocated(path: Path) -> int:
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    return -(-size // _BLOCK) * _BLOCK


def space_needed(state: VaultState, todo: list[dict]) -> tuple[int, int]:
    """(bytes the copy of ``todo`` will write beside the vault, of which the stated margin).

    The new files have the old ones' sizes (each part is re-encrypted into the same chunked format), so
    the estimate is what those files take on disk now: every part and both record files of each item to
    copy, the audit trail twice (its replay, and the replayed entries' notes of their old seq, pid and
    user make each entry longer), the index twice (an atomic write keeps the old one until the rename),
    and the header; plus a margin of 10 % (at least 1 MiB).
    """
    folder = state.path
    items = sum(
        sum(
            _allocated(blob_path(folder, p["blob"])) or -(-int(p["ct_size"]) // _BLOCK) * _BLOCK
            for p in rec["parts"]
        )
        + _allocated(record_files.record_path(state, rec["id"]))
        + _allocated(record_files.record_copy_path(state, rec["id"]))
        for rec in todo
    )
    audit = 2 * (_allocated(folder / LOG_NAME) + _allocated(folder / HEAD_NAME))
    rest = 2 * _allocated(folder / INDEX_NAME) + _allocated(folder / HEADER_NAME)
    estimate = items + audit + rest
    margin = max(SPACE_MARGIN_MIN, int(estimate * SPACE_MARGIN))
    return estimate + margin, margin


def _check_space(state: VaultState, todo: list[dict]) -> None:
    needed, margin = space_needed(state, todo)
    free = shutil.disk_usage(state.path.parent).free
    if needed > free:
        raise OutputError(
            f"re-keying needs about {needed / 2**20:.1f} MiB free beside the vault (a full copy is made before "
            f"the old one is deleted; {margin / 2**20:.1f} MiB of that is margin), but {free / 2**20:.1f} MiB are "
            "free; free some space and run it again (nothing was changed)"
        )
