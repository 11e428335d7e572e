"""Exports in progress: an encrypted note in the vault folder says where an export writes its partial
files while it runs (a lock on the note tells a running export from a killed one), and the next unlock
removes what a killed export left."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import VaultLocked
from engine.vault import crypto
from engine.vault.crypto import DecryptionFailed
from engine.vault.fsio import FileLock, remove_leftovers
from engine.vault.layout import EXPORT_TMP_PREFIX, PENDING_EXPORT_PREFIX, STAGING_NAME

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def pending_ctx(state: VaultState, token: str) -> bytes:
    """The encryption context of one export's note."""
    assert state.keys is not None
    return crypto.context(state.keys.vault_id, "pending-export", token)


@contextlib.contextmanager
def pending_export(
    state, folders: list[Path], *, targets: Sequence[Path] = (), overwrite: bool = False
) -> Iterator[str]:
    """Note (encrypted, in the vault folder) where an export writes its partial files, for as long as
    it runs; a lock on the note tells a running export from one that was killed. Yields the export's
    temporary-file prefix."""
    assert state.keys is not None
    token = secrets.token_hex(8)
    prefix = f"{EXPORT_TMP_PREFIX}{token}-"
    note = state.path / f"{PENDING_EXPORT_PREFIX}{token}.vse"
    lock = FileLock(state.path / f"{PENDING_EXPORT_PREFIX}{token}.lock", "export {pid} running")
    lock.acquire()
    try:
        body = json.dumps(
            {
                "folders": [str(f.absolute()) for f in folders],
                "prefix": prefix,
                "targets": [str(t.absolute()) for t in targets],
                "overwrite": overwrite,
            }
        ).encode()
        # Written in place (not through a temp file that another process's clean-up could take): a
        # torn note is reported as unreadable and removed.
        fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(crypto.encrypt_bytes(state.keys.index, pending_ctx(state, token), body))
            fh.flush()
            os.fsync(fh.fileno())
        yield prefix
    finally:
        with contextlib.suppress(FileNotFoundError):
            note.unlink()
        lock.release()
        with contextlib.suppress(FileNotFoundError):
            lock.path.unlink()


def clean_stale_exports(state: VaultState) -> None:
    """Remove the partial files of exports that were killed (their note is there, its lock is free), with
    a notice each; exports still running are left alone."""
    assert state.keys is not None
    for note in sorted(state.path.glob(f"{PENDING_EXPORT_PREFIX}*.vse")):
        token = note.name[len(PENDING_EXPORT_PREFIX) : -len(".vse")]
        lock = FileLock(state.path / f"{PENDING_EXPORT_PREFIX}{token}.lock", "export {pid} running")
        try:
            lock.acquire(0.0)
        except VaultLocked:
            continue  # that export is still running
        try:
            try:
                body = json.loads(
                    crypto.decrypt_bytes(state.keys.index, pending_ctx(state, token), note.read_bytes())
                )
                folders, prefix = [Path(f) for f in body["folders"]], str(body["prefix"])
                targets = [Path(t) for t in body.get("targets", [])]
                overwrite = bool(body.get("overwrite", True))
            except FileNotFoundError:
                continue  # finished meanwhile
            except (DecryptionFailed, ValueError, KeyError, TypeError):
                state.notices.append(f"an unreadable note of an interrupted export ({note.name}) was removed")
                folders, prefix, targets, overwrite = [], "", [], True
            removed = 0
            for folder in folders:
                if prefix.startswith(EXPORT_TMP_PREFIX) and len(prefix) > len(EXPORT_TMP_PREFIX):
                    removed += remove_leftovers(folder, prefix)
                    staging = folder / f"{prefix}{STAGING_NAME}"
                    if staging.is_dir():
                        removed += sum(1 for p in staging.rglob("*") if p.is_file())
                        shutil.rmtree(staging, ignore_errors=True)
                        # It was killed before or while moving its files into place: any that were
                        # moved are a partial set (they did not exist before, unless overwriting).
                        for target in targets if not overwrite else []:
                            if target.parent == folder and target.exists():
                                removed += 1
                                shutil.rmtree(target) if target.is_dir() else target.unlink()
            if removed:
                where = ", ".join(str(f) for f in folders)
                state.notices.append(
                    f"removed {removed} partial file(s) of an interrupted export (in {where})"
                )
            with contextlib.suppress(FileNotFoundError):
                note.unlink()
        finally:
            lock.release()
            with contextlib.suppress(FileNotFoundError):
                lock.path.unlink()
