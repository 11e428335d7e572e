"""A vault's lifecycle beyond its constructor: creating one, unlocking it (with the rollback checks and
the clean-up of interrupted writes), and re-pointing an open object at the vault a re-key swapped in."""

from __future__ import annotations

import contextlib
import os
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
from engine.vault.anchor import Anchor
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
    from engine.vault.store import Vault


def create(
    cls: type[Vault],
    path: str | os.PathLike,
    passphrase: str | bytes,
    *,
    kdf: KdfParams | None = None,
    **kwargs,
) -> Vault:
    """Create a new, empty vault and return it unlocked.

    Args:
        path: A new or empty folder.
        passphrase: At least 8 characters.
        kdf: Argon2id parameters. The default is RFC 9106's 64 MiB / t=3 / p=4; smaller values are for
            tests only.
        **kwargs: Passed to the constructor (``idle_timeout_s``, ``clock``, ``write_lock_wait_s``).

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
    lock = FileLock(folder / WRITE_LOCK_NAME, "another VolSynth process (pid {pid}) is creating this vault")
    with lock.hold():
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
    vault = cls(folder, **kwargs)
    vault._anchor.update(generation=0, audit=audit.last_appended)
    with vault._mutex:
        vault._adopt_keys(keys)
    return vault


def unlock(vault: Vault, passphrase: str | bytes, *, allow_rollback: bool = False) -> None:
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
    with vault._mutex:
        if vault._keys is not None:
            vault.touch()
            return
        pw = crypto.encode_passphrase(passphrase)
        header = Header.read(vault.path)  # another process may have changed the passphrase
        header_bytes = header.to_bytes()  # exactly the file's bytes (Header.read checks that)
        try:
            master = header.unwrap(pw)
        except DecryptionFailed:
            AuditLog.record_failed_unlock(vault.path)
            raise VaultLocked(f"wrong passphrase for the vault at {vault.path}") from None
        vault._header = header
        keys = Keys(master, header.vault_id)
        index, stamp = item_index.read_index(vault.path, keys)
        vault._audit.attach_keys(keys.audit_enc, keys.audit_mac)
        try:
            problems = rollback.rollback_problems(vault, index, header_bytes)
        except BaseException:
            vault._audit.detach_keys()
            keys.wipe()
            raise
        if problems and not allow_rollback:
            vault._audit.detach_keys()
            keys.wipe()
            raise VaultRolledBack(
                f"the vault at {vault.path} is older than it was: "
                + "; ".join(problems)
                + ". "
                + ROLLBACK_ADVICE
            )
        vault._rolled_back = problems
        vault._index, vault._index_stamp = index, stamp
        vault._adopt_keys(keys)
        vault.notices, vault._opening_notices = vault._opening_notices, []
        vault.warnings = rollback.detection_limits(vault, index) if not problems else []
        if not problems:
            vault._anchor.update(generation=int(index.get("generation", 0)))
        if vault._anchor.problem:
            vault.warnings.append(
                f"{vault._anchor.problem}. Without it this computer cannot tell an older copy of the vault "
                "put back from the real one; make that folder writable (or set $VOLSYNTH_ANCHOR_DIR)."
            )
        try:
            vault._audit.record_unlock()
            vault._audit_problem = None
        except VaultCorrupted as exc:
            vault._audit_problem = str(exc)
        vault.notices += vault._audit.repairs
        vault._audit.repairs = []
        cleanup.clean_stale_files(vault)


def reopen(vault: Vault, keys: Keys) -> None:
    """Point this object at the vault now at its path (after ``vault rekey`` swapped it in) and adopt
    that vault's keys."""
    with vault._mutex:
        if vault._keys is not None:
            vault._audit.detach_keys()
            vault._keys.wipe()
        vault._keys = None
        vault._index = vault._index_stamp = None
        vault._header = Header.read(vault.path)
        vault._audit = AuditLog(vault.path, vault._header.vault_id)
        vault._audit.on_append = vault._on_audit_appended
        vault._anchor = Anchor(vault._header.vault_id.hex())
        vault._rolled_back = []
        vault._adopt_keys(keys)
