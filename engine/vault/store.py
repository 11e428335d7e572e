"""The encrypted vault: real patient scans and generated volumes, protected at rest.

On disk (one folder; no file name says anything about its content)::

    vault.json           header: format, vault id, Argon2id parameters and salt, the wrapped master key,
                         and a SHA-256 checksum line (so an edit is told apart from a wrong passphrase)
    index.vsi            encrypted index: every item's metadata (patient, study, provenance) and its parts
    blobs/<random>.vsb   encrypted payloads: one per volume, one per original DICOM file and one per tissue
                         map of a generated volume (part ``tissue/<name>``)
    blobs/<item id>.vsr  encrypted copy of one item's index record (what ``vault repair`` re-indexes from)
    blobs/<item id>.vsm  a second copy of it (so that losing one file does not lose the item)
    audit.log, audit.head, unlock-failures.log   the audit trail (see engine.vault.audit)
    .write.lock, .audit.lock                     inter-process locks
    .export-<random>.vse/.lock                   an export in progress (where its partial files are)

Writes follow one order so that a crash at any point leaves either the old state or the new one:
payload files and the item's record (temp file, fsync, rename, folder fsync) -> audit entry (write-ahead)
-> index (same atomic replace). The index is the commit point. Payloads it does not reference are never
deleted automatically (they may be all that is left of items an older index forgot): ``verify`` lists
them and ``repair`` re-indexes those whose record still authenticates. Only temporary ``.part`` files of
interrupted writes are removed, at the next unlock or change, and reported in :attr:`Vault.notices`.

Rollback (an older index.vsi, audit.log + audit.head, or vault.json put back): every commit increments the
index's ``generation``, writes it into its MAC'ed audit entry, and records that entry's seq and MAC and the
header's SHA-256 in the index; an anchor outside the folder (``engine.vault.anchor``) remembers the latest
generation and audit entry this computer saw. Unlock checks all of them and raises
:class:`VaultRolledBack` naming what went back; nothing is deleted because of it.

Threads: one ``Vault`` object may be shared by threads (the app's GUI timer and a worker); its operations
run one at a time. Processes: changes are serialised by the write lock; a second writer gets
:class:`VaultLocked` at once (or after ``write_lock_wait_s``) and nothing is corrupted; readers are never
blocked by a writer.

Where each part lives: this module holds :class:`Vault`, a facade that owns the open state (a
:class:`~engine.vault.state.VaultState`: path, header, keys, decrypted index, mutex, write lock, audit log,
anchor) and delegates each operation to a module of this package that takes that state explicitly (inside
:func:`~engine.vault.guards.operation` and :func:`~engine.vault.guards.writing`):
:mod:`~engine.vault.lifecycle` (create, unlock, lock),
:mod:`~engine.vault.item_index` (the index and commits), :mod:`~engine.vault.rollback`,
:mod:`~engine.vault.importing`, :mod:`~engine.vault.reading`, :mod:`~engine.vault.exporting`,
:mod:`~engine.vault.editing`, :mod:`~engine.vault.checking` (verify, repair), :mod:`~engine.vault.cleanup`
and :mod:`~engine.vault.pending_exports`, over :mod:`~engine.vault.payload` (encrypted parts),
:mod:`~engine.vault.record_files`, :mod:`~engine.vault.header`, :mod:`~engine.vault.layout` (file names) and
:mod:`~engine.vault.folders` (the folders a re-key puts beside the vault). Those modules read and set the
state's fields; nothing outside this package does (tests read ``vault.state.index``). The modules import
downward only: an import-linter layers contract in pyproject.toml keeps them so (``docs/vault-internals.md``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.vault import (
    adding_maps,
    checking,
    editing,
    exporting,
    guards,
    importing,
    item_index,
    lifecycle,
    reading,
    rekey,
)
from engine.vault.crypto import KdfParams
from engine.vault.fingerprint import volume_fingerprint
from engine.vault.header import Header
from engine.vault.layout import (
    BLOB_DIR,
    BLOB_SUFFIX,
    EXPORT_TMP_PREFIX,
    FORMAT,
    HEADER_NAME,
    INDEX_NAME,
    PENDING_EXPORT_PREFIX,
    RECORD_COPY_SUFFIX,
    RECORD_SUFFIX,
    STAGING_NAME,
    VERSION,
    WRITE_LOCK_NAME,
)
from engine.vault.metadata import MAX_TISSUE_NAME, normalize_date
from engine.vault.payload import Progress
from engine.vault.records import AuditTrail, ExportResult, ItemInfo, OpenedVolume, RepairReport, VerifyReport
from engine.vault.state import VaultState

if TYPE_CHECKING:
    from engine.nifti.volume import Volume

# Names callers and tests import from here (they moved into the modules above).
_Header = Header
__all__ = [
    "BLOB_DIR",
    "BLOB_SUFFIX",
    "DEFAULT_IDLE_TIMEOUT_S",
    "EXPORT_TMP_PREFIX",
    "FORMAT",
    "HEADER_NAME",
    "INDEX_NAME",
    "MAX_TISSUE_NAME",
    "PENDING_EXPORT_PREFIX",
    "RECORD_COPY_SUFFIX",
    "RECORD_SUFFIX",
    "STAGING_NAME",
    "VERSION",
    "WRITE_LOCK_NAME",
    "Progress",
    "Vault",
    "default_vault_path",
    "normalize_date",
    "volume_fingerprint",
]

DEFAULT_IDLE_TIMEOUT_S = 15 * 60


def default_vault_path() -> Path:
    """Where the vault lives unless told otherwise: ``$VOLSYNTH_VAULT``, else a per-user data folder
    (``$XDG_DATA_HOME/volsynth/vault``, ``~/.local/share/volsynth/vault``; the platform's application-data
    folder on Windows and macOS)."""
    env = os.environ.get("VOLSYNTH_VAULT")
    if env:
        return Path(env).expanduser()
    from engine.files.user_folders import user_data_dir

    return user_data_dir() / "vault"


class Vault:
    """An encrypted store of patient scans and generated volumes.

    Open an existing vault with ``Vault(path)`` (locked) and :meth:`unlock` it, or make a new one with
    :meth:`Vault.create` (returned unlocked). Every method that touches items needs the vault unlocked and
    counts as activity for auto-lock.

    Args:
        path: The vault folder.
        idle_timeout_s: Seconds of inactivity after which :meth:`lock_if_idle` locks the vault; None never.
        clock: Monotonic clock in seconds (injectable for tests).
        write_lock_wait_s: How long a change waits for another process's write to finish before raising
            :class:`VaultLocked`.

    Raises:
        VaultError: No vault at ``path``.
        VaultCorrupted: The header is damaged or was edited.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        write_lock_wait_s: float = 0.0,
    ) -> None:
        self._state = VaultState.open(
            Path(path).expanduser().absolute(), clock=clock, write_lock_wait_s=write_lock_wait_s
        )
        self.idle_timeout_s = idle_timeout_s

    # -- lifecycle (engine.vault.lifecycle) -------------------------------------------------------------
    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        """Whether ``path`` holds a vault (a header file)."""
        return (Path(path).expanduser() / HEADER_NAME).is_file()

    @classmethod
    def create(
        cls, path: str | os.PathLike, passphrase: str | bytes, *, kdf: KdfParams | None = None, **kwargs
    ) -> Vault:
        """Create a new, empty vault and return it unlocked (see :func:`engine.vault.lifecycle.create`).

        Args:
            path: A new or empty folder.
            passphrase: At least 8 characters.
            kdf: Argon2id parameters (default RFC 9106's 64 MiB / t=3 / p=4; smaller ones for tests only).
            **kwargs: Passed to the constructor (``idle_timeout_s``, ``clock``, ``write_lock_wait_s``).
        """
        new = lifecycle.create(path, passphrase, kdf=kdf)
        vault = cls(new.folder, **kwargs)
        lifecycle.adopt_new(vault.state, new)
        return vault

    # -- state ------------------------------------------------------------------------------------------
    @property
    def state(self) -> VaultState:
        """The open state the operations of this package work on (:mod:`engine.vault.state`); for them and
        for tests, not for callers of the vault (its methods are the API)."""
        return self._state

    @property
    def path(self) -> Path:
        """The vault folder (absolute)."""
        return self._state.path

    @property
    def is_unlocked(self) -> bool:
        return self._state.is_unlocked

    @property
    def vault_id(self) -> str:
        return self._state.vault_id

    @property
    def kdf_params(self) -> KdfParams:
        """The Argon2id parameters currently protecting the master key."""
        return self._state.header.kdf

    @property
    def write_lock_wait_s(self) -> float:
        """How long a change waits for another process's write to finish before raising VaultLocked."""
        return self._state.write_lock_wait_s

    @write_lock_wait_s.setter
    def write_lock_wait_s(self, seconds: float) -> None:
        self._state.write_lock_wait_s = seconds

    @property
    def notices(self) -> list[str]:
        """Things the last unlock or change cleaned up or noticed (stale partial files removed...), one line
        each, for the CLI to print and the app to show. Cleared at each unlock."""
        return self._state.notices

    @notices.setter
    def notices(self, lines: list[str]) -> None:
        self._state.notices = lines

    @property
    def warnings(self) -> list[str]:
        """What the user must see at unlock (the CLI prints "warning:", the app a warning box): the limits
        of rollback detection met at this unlock, and an anchor that cannot be read or written."""
        return self._state.warnings

    @warnings.setter
    def warnings(self, lines: list[str]) -> None:
        self._state.warnings = lines

    @property
    def audit_problem(self) -> str | None:
        """Set when the audit trail could not be extended at unlock (it was damaged); changes and views
        are refused until it is repaired, while :meth:`verify` still works."""
        return self._state.audit_problem

    @property
    def rolled_back(self) -> tuple[str, ...]:
        """What was found rolled back at unlock (only when unlocked with ``allow_rollback=True``)."""
        return tuple(self._state.rolled_back)

    def unlock(self, passphrase: str | bytes, *, allow_rollback: bool = False) -> None:
        """Unlock with the passphrase; then check for rollback and remove temporary files of interrupted
        writes, reporting them in :attr:`notices` (see :func:`engine.vault.lifecycle.unlock`).

        Raises:
            VaultLocked: Wrong passphrase (the attempt is recorded in the audit trail).
            VaultCorrupted: The header or the index is damaged or was edited.
            VaultRolledBack: A file of the vault is older than the vault recorded (unless
                ``allow_rollback``: then only reading and :meth:`repair` are allowed).
        """
        lifecycle.unlock(self._state, passphrase, allow_rollback=allow_rollback)

    def lock(self) -> None:
        """Forget the keys and the decrypted index. Waits for a running operation to finish."""
        with self._state.mutex:
            lifecycle.lock(self._state, "manual")

    def touch(self, now: float | None = None) -> None:
        """Record user activity (the app calls this on input); postpones auto-lock."""
        self._state.touch(now)

    def seconds_until_auto_lock(self, now: float | None = None) -> float | None:
        """Seconds left before :meth:`lock_if_idle` would lock; None if locked or auto-lock is off."""
        state = self._state
        if state.keys is None or self.idle_timeout_s is None:
            return None
        now = state.clock() if now is None else now
        return max(0.0, self.idle_timeout_s - (now - state.last_activity))

    def lock_if_idle(self, now: float | None = None) -> bool:
        """Lock if idle for ``idle_timeout_s``; meant to be called from a timer. Never blocks: while an
        operation is running the vault is not idle.

        Returns:
            True if this call locked the vault.
        """
        if not self._state.mutex.acquire(blocking=False):
            return False
        try:
            left = self.seconds_until_auto_lock(now)
            if left is None or left > 0:
                return False
            lifecycle.lock(self._state, "idle")
            return True
        finally:
            self._state.mutex.release()

    def close(self) -> None:
        """Lock the vault (same as :meth:`lock`)."""
        self.lock()

    def __enter__(self) -> Vault:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- listing and reading (engine.vault.reading) -----------------------------------------------------
    def items(self, kind: str | None = None) -> list[ItemInfo]:
        """All items (optionally of one kind), oldest first."""
        return self.search("", kind=kind)

    def search(self, query: str = "", *, kind: str | None = None) -> list[ItemInfo]:
        """Items whose id, label, patient, study or provenance contains every word of ``query``
        (case-insensitive), optionally of one ``kind`` (``"scan"`` or ``"synthetic"``), oldest first."""
        return reading.search(self._state, query, kind=kind)

    def get(self, item_id: str) -> ItemInfo:
        """One item's metadata; ``item_id`` may be a unique prefix of at least 4 characters."""
        with guards.operation(self._state):
            return ItemInfo.from_record(item_index.find_record(self._state, item_id))

    def open_item(self, item_id: str, *, as_float32: bool = True, with_tissue: bool = False) -> OpenedVolume:
        """Decrypt an item's volume (and, ``with_tissue``, its tissue maps) into memory; recorded as a view.
        Details: :func:`engine.vault.reading.open_item`."""
        return reading.open_item(self._state, item_id, as_float32=as_float32, with_tissue=with_tissue)

    def open_tissue(self, item_id: str, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Decrypt a generated item's tissue maps (all, or the ``names`` given) into memory; recorded as a
        view. Details: :func:`engine.vault.reading.open_tissue`."""
        return reading.open_tissue(self._state, item_id, names)

    # -- import (engine.vault.importing) ----------------------------------------------------------------
    def import_nifti(
        self,
        path: str | os.PathLike,
        *,
        kind: str | None = None,
        label: str | None = None,
        patient: dict | None = None,
        study: dict | None = None,
        provenance: dict | None = None,
        progress: Progress | None = None,
        allow_duplicate: bool = False,
    ) -> ItemInfo:
        """Import a .nii or .nii.gz file (and the tissue maps a synthetic one lists), its bytes unchanged;
        a file with SYNTHETIC marks is filed as synthetic. Details: :func:`engine.vault.importing.import_nifti`.

        Raises:
            InvalidRequest: Not a single-file NIfTI, bad metadata, or a synthetic file asked to be a scan.
            DuplicateItem: The same volume is already in the vault (and ``allow_duplicate`` is False).
        """
        return importing.import_nifti(
            self._state,
            path,
            kind=kind,
            label=label,
            patient=patient,
            study=study,
            provenance=provenance,
            progress=progress,
            allow_duplicate=allow_duplicate,
        )

    def import_dicom(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        label: str | None = None,
        series_uid: str | None = None,
        progress: Progress | None = None,
        allow_duplicate: bool = False,
    ) -> ItemInfo:
        """Import a DICOM series (a folder, a file or a list of files): the volume and the original files.
        Details: :func:`engine.vault.importing.import_dicom`."""
        return importing.import_dicom(
            self._state,
            source,
            label=label,
            series_uid=series_uid,
            progress=progress,
            allow_duplicate=allow_duplicate,
        )

    def add_synthetic(
        self,
        volume: Volume,
        *,
        label: str | None = None,
        progress: Progress | None = None,
        allow_duplicate: bool = False,
    ) -> ItemInfo:
        """Store a generated volume (an ``engine.nifti.volume.Volume``: float32 NIfTI marked SYNTHETIC) with
        its provenance and tissue maps. Details: :func:`engine.vault.importing.add_synthetic`."""
        return importing.add_synthetic(
            self._state, volume, label=label, progress=progress, allow_duplicate=allow_duplicate
        )

    def add_tissue_maps(
        self,
        item_id: str,
        maps: Mapping[str, np.ndarray],
        made: dict,
        *,
        replace: bool = False,
        progress: Progress | None = None,
    ) -> ItemInfo:
        """Keep tissue maps computed for an item already stored (a scan, a volume whose model makes none) with
        it, encrypted, and how they were made in its provenance. Details:
        :func:`engine.vault.adding_maps.add_tissue_maps`."""
        return adding_maps.add_tissue_maps(
            self._state, item_id, maps, made, replace=replace, progress=progress
        )

    # -- export (engine.vault.exporting) ----------------------------------------------------------------
    def export(
        self,
        item_id: str,
        dest_dir: str | os.PathLike,
        *,
        deidentify: bool = False,
        include_dicom: bool = True,
        include_tissue: bool = True,
        overwrite: bool = False,
        progress: Progress | None = None,
    ) -> ExportResult:
        """Write an item out as NIfTI (with its tissue maps, and its provenance sidecar or its original DICOM
        files), optionally de-identified. Details: :func:`engine.vault.exporting.export`.

        Raises:
            OutputError: The destination cannot be written, or files exist and ``overwrite`` is False.
            VaultCorrupted: The item failed authentication; nothing is left at the destination.
        """
        return exporting.export(
            self._state,
            item_id,
            dest_dir,
            deidentify=deidentify,
            include_dicom=include_dicom,
            include_tissue=include_tissue,
            overwrite=overwrite,
            progress=progress,
        )

    def record_copy_out(self, item_id: str, event: str, files: Sequence[str | os.PathLike], **detail) -> None:
        """Record that a copy of an item's pixels was written outside the vault by the user's choice (the app's
        "Save a Copy Outside the Vault", a screenshot of it). Details: :func:`engine.vault.exporting.record_copy_out`.
        """
        exporting.record_copy_out(self._state, item_id, event, files, **detail)

    # -- changes (engine.vault.editing, engine.vault.rekey) ---------------------------------------------
    def delete(self, item_id: str) -> None:
        """Delete an item and its encrypted files. Recorded in the audit trail."""
        editing.delete(self._state, item_id)

    def update_item(
        self,
        item_id: str,
        *,
        label: str | None = None,
        patient: dict | None = None,
        study: dict | None = None,
    ) -> ItemInfo:
        """Change an item's label, patient or study details (None keeps each). Recorded in the audit trail.
        Details: :func:`engine.vault.editing.update_item`."""
        return editing.update_item(self._state, item_id, label=label, patient=patient, study=study)

    def rekey(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None, progress=None):
        """Re-encrypt everything under a new master key and passphrase (see :mod:`engine.vault.rekey`)."""
        return rekey.rekey(self._state, old, new, kdf=kdf, progress=progress)

    def change_passphrase(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None) -> None:
        """Re-wrap the master key under a new passphrase; no item is re-encrypted (so the old passphrase
        with an old ``vault.json`` still opens it: :meth:`rekey` does not). Details:
        :func:`engine.vault.editing.change_passphrase`."""
        editing.change_passphrase(self._state, old, new, kdf=kdf)

    # -- checking (engine.vault.checking) ---------------------------------------------------------------
    def verify(
        self,
        item_ids: Sequence[str] | None = None,
        *,
        check_audit: bool = True,
        progress: Progress | None = None,
    ) -> VerifyReport:
        """Authenticate every byte of every item (or of the given items) and check the audit chain; never
        raises for tampering, every problem is in the report. Details: :func:`engine.vault.checking.verify`."""
        return checking.verify(self._state, item_ids, check_audit=check_audit, progress=progress)

    def repair(self, *, dry_run: bool = False, remove_leftovers: bool = False) -> RepairReport:
        """Accept the vault as it is now and put back into the index every item whose files are still
        there. Details: :func:`engine.vault.checking.repair`."""
        return checking.repair(self._state, dry_run=dry_run, remove_leftovers=remove_leftovers)

    def audit_trail(self) -> AuditTrail:
        """The decrypted audit trail, with any tampering found in it."""
        return checking.audit_trail(self._state)
