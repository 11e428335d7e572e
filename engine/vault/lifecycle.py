"""A vault's lifecycle beyond opening its folder: creating one, unlocking it (with the rollback checks and
the clean-up of interrupted writes), locking it, and re-pointing an open state at the vault a re-key swapped
in. Every function takes the :class:`~engine.vault.state.VaultState`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import (
    InvalidRequest,
    OutputError,
    VaultCorrupted,
    VaultError,
    VaultLocked,
    VaultRolledBack,
)
from engine.vault import cleanup, crypto, item_index, rollback
from engine.vault.audit import AuditLog
from engine.vault.crypto import DecryptionFailed, KdfParams
from engine.vault.fsio import FileLock, fsync_dir, write_atomic
from engine.vault.header import Header, Keys, now_iso, sha256
from engine.vault.layout import (
    BLOB_DIR,
    FORMAT,
    HEADER_NAME,
    LEFTOVER_PREFIXES,
    OWN_NAMES,
    ROLLBACK_ADVICE,
    VERSION,
    WRITE_LOCK_NAME,
)

if TYPE_CHECKING:
    from engine.vault.state import VaultState


@dataclass(frozen=True)
class NewVault:
    """A vault :func:`create` just wrote: open its folder (``VaultState.open``), then :func:`adopt_new`."""

    folder: Path
    keys: Keys
    audit_last: tuple[int, bytes]  # (seq, MAC) of its first audit entry, for the anchor


def create(path: str | os.PathLike, passphrase: str | bytes, *, kdf: KdfParams | None = None) -> NewVault:
    """Create a new, empty vault on disk (its keys kept for :func:`adopt_new`).

    Args:
        path: A new or empty folder.
        passphrase: At least 8 characters.
        kdf: Argon2id parameters. The default is RFC 9106's 64 MiB / t=3 / p=4; smaller values are for
            tests only.

    Raises:
        VaultError: A vault already exists there.
        InvalidRequest: The folder holds other files, or the passphrase is too short.
    """
    folder = Path(path).expanduser().absolute()
    pw = crypto.encode_passphrase(passphrase, new=True)
    kdf = kdf or KdfParams()
    if (folder / HEADER_NAME).exists():
        raise VaultError(f"a vault already exists at {folder}")
    if folder.exists():
        if not folder.is_dir():
            raise InvalidRequest(f"{folder} is a file; choose a folder for the vault")
        foreign = [
            p.name
            for p in folder.iterdir()
            if p.name not in OWN_NAMES and not p.name.startswith(LEFTOVER_PREFIXES)
        ]
        if foreign:
            raise InvalidRequest(f"{folder} is not empty; choose a new or empty folder for the vault")
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        (folder / BLOB_DIR).mkdir(exist_ok=True, mode=0o700)
    except OSError as exc:
        raise OutputError(f"cannot create the vault folder {folder}: {exc.strerror}") from exc

    vault_id = os.urandom(16)
    master = os.urandom(crypto.KEY_BYTES)
    header = Header.wrapping(vault_id, now_iso(), kdf, pw, master)
    keys = Keys(master, vault_id)
    creating = FileLock(
        folder / WRITE_LOCK_NAME, "another VolSynth process (pid {pid}) is creating this vault"
    )
    with creating.hold():
        audit = AuditLog(folder, vault_id)
        audit.attach_keys(keys.audit_enc, keys.audit_mac)
        audit.start()
        audit.append("create", None, {"kdf": kdf.to_dict(), "generation": 0})
        assert audit.last_appended is not None
        index = {
            "format": FORMAT,
            "version": VERSION,
            "vault_id": vault_id.hex(),
            "generation": 0,
            "audit_seq": audit.last_appended[0],
            "audit_mac": audit.last_appended[1].hex(),
            "header_sha256": sha256(header.to_bytes()),
            "record_copies": 2,  # every item has .vsr and .vsm (older vaults: from their repair on)
            "items": {},
        }
        item_index.write_index_file(folder, keys, index)
        # The header goes last: its presence is what makes the folder a vault.
        write_atomic(folder / HEADER_NAME, header.to_bytes())
        with contextlib.suppress(OSError):
            fsync_dir(folder.parent)
    return NewVault(folder, keys, audit.last_appended)


def adopt_new(state: VaultState, new: NewVault) -> None:
    """Unlock the state of a vault :func:`create` made with the keys it made (no passphrase asked again)."""
    state.anchor.update(generation=0, audit=new.audit_last)
    with state.mutex:
        adopt_keys(state, new.keys)


def adopt_keys(state: VaultState, keys: Keys) -> None:
    """Take unlocked keys: attach them to the audit trail, read the index unless it is already read."""
    state.keys = keys
    state.audit.attach_keys(keys.audit_enc, keys.audit_mac)
    if state.index is None:
        state.index, state.index_stamp = item_index.read_index(state.path, keys)
    state.touch()


def lock(state: VaultState, reason: str) -> None:
    """Forget the keys and the decrypted index (an audit entry ``lock`` with ``reason`` first, if it can
    be written: locking must always succeed). Call under ``state.mutex``."""
    if state.keys is None:
        return
    with contextlib.suppress(VaultError):
        state.audit.append("lock", None, {"reason": reason})
    state.audit.detach_keys()
    state.keys.wipe()
    state.keys = None
    state.index = None
    state.index_stamp = None


def unlock(state: VaultState, passphrase: str | bytes, *, allow_rollback: bool = False) -> None:
    """Unlock with the passphrase (Argon2id takes a fraction of a second to a few seconds by design).

    Then checks for rollback (see the module docstring) and removes temporary files of interrupted
    writes (imports and exports), reporting them in :attr:`notices`.

    Args:
        passphrase: The vault's passphrase.
        allow_rollback: Unlock even if a rollback is found (for :meth:`verify` and :meth:`repair`):
            reading is allowed, every change but :meth:`repair` is refused, :attr:`rolled_back` says why.

    Raises:
        VaultLocked: Wrong passphrase (the attempt is recorded in the audit trail).
        VaultCorrupted: The header or the index is damaged or was edited.
        VaultRolledBack: The index, the audit trail or the header is an older version than the one
            this vault had (nothing is deleted; the message says what to do).
    """
    with state.mutex:
        if state.keys is not None:
            state.touch()
            return
        pw = crypto.encode_passphrase(passphrase)
        header = Header.read(state.path)  # another process may have changed the passphrase
        header_bytes = header.to_bytes()  # exactly the file's bytes (Header.read checks that)
        try:
            master = header.unwrap(pw)
        except DecryptionFailed:
            AuditLog.record_failed_unlock(state.path)
            raise VaultLocked(f"wrong passphrase for the vault at {state.path}") from None
        state.header = header
        keys = Keys(master, header.vault_id)
        index, stamp = item_index.read_index(state.path, keys)
        state.audit.attach_keys(keys.audit_enc, keys.audit_mac)
        try:
            problems = rollback.rollback_problems(state, index, header_bytes)
        except BaseException:
            state.audit.detach_keys()
            keys.wipe()
            raise
        if problems and not allow_rollback:
            state.audit.detach_keys()
            keys.wipe()
            raise VaultRolledBack(
                f"the vault at {state.path} is older than it was: "
                + "; ".join(problems)
                + ". "
                + ROLLBACK_ADVICE
            )
        state.rolled_back = problems
        state.index, state.index_stamp = index, stamp
        adopt_keys(state, keys)
        state.notices, state.opening_notices = state.opening_notices, []
        state.warnings = rollback.detection_limits(state, index) if not problems else []
        if not problems:
            state.anchor.update(generation=int(index.get("generation", 0)))
        if state.anchor.problem:
            state.warnings.append(
                f"{state.anchor.problem}. Without it this computer cannot tell an older copy of the vault "
                "put back from the real one; make that folder writable (or set $VOLSYNTH_ANCHOR_DIR)."
            )
        try:
            state.audit.record_unlock()
            state.audit_problem = None
        except VaultCorrupted as exc:
            state.audit_problem = str(exc)
        state.notices += state.audit.repairs
        state.audit.repairs = []
        cleanup.clean_stale_files(state)


def reopen(state: VaultState, keys: Keys) -> None:
    """Point this state at the vault now at its path (after ``vault rekey`` swapped it in) and adopt
    that vault's keys."""
    with state.mutex:
        if state.keys is not None:
            state.audit.detach_keys()
            state.keys.wipe()
        state.keys = None
        state.index = state.index_stamp = None
        state.rebind(Header.read(state.path))
        adopt_keys(state, keys)
