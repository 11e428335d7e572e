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

Where each part lives: this module holds :class:`Vault`, a facade that owns the open state (path, header,
keys, decrypted index, mutex, write lock, audit log, anchor) and delegates each operation to a module of
this package that takes the vault explicitly: :mod:`~engine.vault.lifecycle` (create, unlock),
:mod:`~engine.vault.item_index` (the index and commits), :mod:`~engine.vault.rollback`,
:mod:`~engine.vault.importing`, :mod:`~engine.vault.reading`, :mod:`~engine.vault.exporting`,
:mod:`~engine.vault.editing`, :mod:`~engine.vault.checking` (verify, repair), :mod:`~engine.vault.cleanup`
and :mod:`~engine.vault.pending_exports`, over :mod:`~engine.vault.payload` (encrypted parts),
:mod:`~engine.vault.record_files`, :mod:`~engine.vault.header` and :mod:`~engine.vault.layout` (file names).
Those modules read and set the underscore attributes of :class:`Vault`; nothing outside this package does
(tests peek at ``_index`` and ``_keys``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.errors import VaultError, VaultLocked, VaultRolledBack
from engine.vault import (
    checking,
    cleanup,
    editing,
    exporting,
    importing,
    item_index,
    lifecycle,
    reading,
)
from engine.vault.anchor import Anchor
from engine.vault.audit import AuditLog
from engine.vault.crypto import KdfParams
from engine.vault.fingerprint import volume_fingerprint
from engine.vault.fsio import FileLock
from engine.vault.header import Header, Keys
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
    ROLLBACK_ADVICE,
    STAGING_NAME,
    VERSION,
    WRITE_LOCK_NAME,
)
from engine.vault.metadata import MAX_TISSUE_NAME, normalize_date
from engine.vault.payload import Progress
from engine.vault.records import AuditTrail, ExportResult, ItemInfo, OpenedVolume, RepairReport, VerifyReport
from engine.vault.rekey import finish_interrupted_swap

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
        self.path = Path(path).expanduser().absolute()
        swapped = finish_interrupted_swap(self.path)  # a re-key killed between its two renames
        self._header = Header.read(self.path)
        self.idle_timeout_s = idle_timeout_s
        self.write_lock_wait_s = write_lock_wait_s
        self._clock = clock
        self._last_activity = clock()
        self._mutex = threading.RLock()
        self._keys: Keys | None = None
        self._index: dict | None = None
        self._index_stamp: tuple | None = None
        self._audit = AuditLog(self.path, self._header.vault_id)
        self._audit.on_append = self._on_audit_appended
        self._audit_problem: str | None = None
        self._anchor = Anchor(self._header.vault_id.hex())
        self._rolled_back: list[str] = []
        #: Things the last unlock or change cleaned up or noticed (stale partial files removed...), one line
        #: each, for the CLI to print and the app to show. Cleared at each unlock.
        self.notices: list[str] = []
        #: What the user must see at unlock (the CLI prints "warning:", the app a warning box): the limits
        #: of rollback detection met at this unlock, and an anchor that cannot be read or written.
        self.warnings: list[str] = []
        self._opening_notices: list[str] = [swapped] if swapped else []  # shown at the next unlock
        self._write_lock = FileLock(
            self.path / WRITE_LOCK_NAME,
            "the vault is being written by another VolSynth process (pid {pid}); try again when it finishes",
        )

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
        return lifecycle.create(cls, path, passphrase, kdf=kdf, **kwargs)

    # -- state ------------------------------------------------------------------------------------------
    @property
    def is_unlocked(self) -> bool:
        return self._keys is not None

    @property
    def vault_id(self) -> str:
        return self._header.vault_id.hex()

    @property
    def kdf_params(self) -> KdfParams:
        """The Argon2id parameters currently protecting the master key."""
        return self._header.kdf

    @property
    def audit_problem(self) -> str | None:
        """Set when the audit trail could not be extended at unlock (it was damaged); changes and views
        are refused until it is repaired, while :meth:`verify` still works."""
        return self._audit_problem

    @property
    def rolled_back(self) -> tuple[str, ...]:
        """What was found rolled back at unlock (only when unlocked with ``allow_rollback=True``)."""
        return tuple(self._rolled_back)

    def unlock(self, passphrase: str | bytes, *, allow_rollback: bool = False) -> None:
        """Unlock with the passphrase; then check for rollback and remove temporary files of interrupted
        writes, reporting them in :attr:`notices` (see :func:`engine.vault.lifecycle.unlock`).

        Raises:
            VaultLocked: Wrong passphrase (the attempt is recorded in the audit trail).
            VaultCorrupted: The header or the index is damaged or was edited.
            VaultRolledBack: A file of the vault is older than the vault recorded (unless
                ``allow_rollback``: then only reading and :meth:`repair` are allowed).
        """
        lifecycle.unlock(self, passphrase, allow_rollback=allow_rollback)

    def _adopt_keys(self, keys: Keys) -> None:
        self._keys = keys
        self._audit.attach_keys(keys.audit_enc, keys.audit_mac)
        if self._index is None:
            self._index, self._index_stamp = item_index.read_index(self.path, keys)
        self.touch()

    def lock(self) -> None:
        """Forget the keys and the decrypted index. Waits for a running operation to finish."""
        with self._mutex:
            self._lock_now("manual")

    def _lock_now(self, reason: str) -> None:
        if self._keys is None:
            return
        with contextlib.suppress(VaultError):  # locking must always succeed
            self._audit.append("lock", None, {"reason": reason})
        self._audit.detach_keys()
        self._keys.wipe()
        self._keys = None
        self._index = None
        self._index_stamp = None

    def touch(self, now: float | None = None) -> None:
        """Record user activity (the app calls this on input); postpones auto-lock."""
        self._last_activity = self._clock() if now is None else now

    def seconds_until_auto_lock(self, now: float | None = None) -> float | None:
        """Seconds left before :meth:`lock_if_idle` would lock; None if locked or auto-lock is off."""
        if self._keys is None or self.idle_timeout_s is None:
            return None
        now = self._clock() if now is None else now
        return max(0.0, self.idle_timeout_s - (now - self._last_activity))

    def lock_if_idle(self, now: float | None = None) -> bool:
        """Lock if idle for ``idle_timeout_s``; meant to be called from a timer. Never blocks: while an
        operation is running the vault is not idle.

        Returns:
            True if this call locked the vault.
        """
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            left = self.seconds_until_auto_lock(now)
            if left is None or left > 0:
                return False
            self._lock_now("idle")
            return True
        finally:
            self._mutex.release()

    def close(self) -> None:
        """Lock the vault (same as :meth:`lock`)."""
        self.lock()

    def __enter__(self) -> Vault:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- operation scaffolding --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _op(self) -> Iterator[None]:
        with self._mutex:
            if self._keys is None:
                raise VaultLocked(f"the vault at {self.path} is locked; unlock it with its passphrase")
            self.touch()
            try:
                item_index.refresh_index(self)
                yield
            finally:
                self.touch()

    @contextlib.contextmanager
    def _writing(self, *, repairing: bool = False) -> Iterator[None]:
        """Hold the inter-process write lock; on entry, see the latest index and clear crash leftovers."""
        if self._rolled_back and not repairing:
            raise VaultRolledBack(
                f"the vault at {self.path} was rolled back ({'; '.join(self._rolled_back)}); changes are "
                f"refused until it is repaired. {ROLLBACK_ADVICE}"
            )
        self._write_lock.acquire(self.write_lock_wait_s)
        try:
            item_index.refresh_index(self)
            cleanup.remove_crash_leftovers(self)
            yield
        finally:
            self._write_lock.release()

    def _audit_write(self, event: str, item_id: str | None = None, detail: dict | None = None) -> None:
        self._audit.append(event, item_id, detail)
        self._audit_problem = None

    def _on_audit_appended(self, seq: int, mac: bytes) -> None:
        if not self._rolled_back:  # a rolled-back chain must not move the anchor (repair resets it)
            self._anchor.update(audit=(seq, mac))

    # -- listing and reading (engine.vault.reading) -----------------------------------------------------
    def items(self, kind: str | None = None) -> list[ItemInfo]:
        """All items (optionally of one kind), oldest first."""
        return self.search("", kind=kind)

    def search(self, query: str = "", *, kind: str | None = None) -> list[ItemInfo]:
        """Items whose id, label, patient, study or provenance contains every word of ``query``
        (case-insensitive), optionally of one ``kind`` (``"scan"`` or ``"synthetic"``), oldest first."""
        return reading.search(self, query, kind=kind)

    def get(self, item_id: str) -> ItemInfo:
        """One item's metadata; ``item_id`` may be a unique prefix of at least 4 characters."""
        with self._op():
            return ItemInfo.from_record(item_index.find_record(self, item_id))

    def open_item(self, item_id: str, *, as_float32: bool = True, with_tissue: bool = False) -> OpenedVolume:
        """Decrypt an item's volume (and, ``with_tissue``, its tissue maps) into memory; recorded as a view.
        Details: :func:`engine.vault.reading.open_item`."""
        return reading.open_item(self, item_id, as_float32=as_float32, with_tissue=with_tissue)

    def open_tissue(self, item_id: str, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Decrypt a generated item's tissue maps (all, or the ``names`` given) into memory; recorded as a
        view. Details: :func:`engine.vault.reading.open_tissue`."""
        return reading.open_tissue(self, item_id, names)

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
            self,
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
            self,
            source,
            label=label,
            series_uid=series_uid,
            progress=progress,
            allow_duplicate=allow_duplicate,
        )

    def add_synthetic(
        self,
        volume: np.ndarray,
        affine: np.ndarray,
        provenance: dict,
        *,
        label: str | None = None,
        progress: Progress | None = None,
        allow_duplicate: bool = False,
        tissue: Mapping[str, np.ndarray] | None = None,
    ) -> ItemInfo:
        """Store a generated volume (float32 NIfTI marked SYNTHETIC) with its provenance and tissue maps.
        Details: :func:`engine.vault.importing.add_synthetic`."""
        return importing.add_synthetic(
            self,
            volume,
            affine,
            provenance,
            label=label,
            progress=progress,
            allow_duplicate=allow_duplicate,
            tissue=tissue,
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
        from engine.vault.adding_maps import add_tissue_maps

        return add_tissue_maps(self, item_id, maps, made, replace=replace, progress=progress)

    # -- export (engine.vault.exporting) ----------------------------------------------------------------
    def export(
        self,
        item_id: str,
        dest_dir: str | os.PathLike,
        *,
        deidentify: bool = False,
        include_dicom: bool = True,
        overwrite: bool = False,
        progress: Progress | None = None,
    ) -> ExportResult:
        """Write an item out as NIfTI (with its tissue maps and provenance sidecar, or its original DICOM
        files), optionally de-identified. Details: :func:`engine.vault.exporting.export`.

        Raises:
            OutputError: The destination cannot be written, or files exist and ``overwrite`` is False.
            VaultCorrupted: The item failed authentication; nothing is left at the destination.
        """
        return exporting.export(
            self,
            item_id,
            dest_dir,
            deidentify=deidentify,
            include_dicom=include_dicom,
            overwrite=overwrite,
            progress=progress,
        )

    # -- changes (engine.vault.editing, engine.vault.rekey) ---------------------------------------------
    def delete(self, item_id: str) -> None:
        """Delete an item and its encrypted files. Recorded in the audit trail."""
        editing.delete(self, item_id)

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
        return editing.update_item(self, item_id, label=label, patient=patient, study=study)

    def rekey(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None, progress=None):
        """Re-encrypt everything under a new master key and passphrase (see :mod:`engine.vault.rekey`)."""
        from engine.vault.rekey import rekey

        return rekey(self, old, new, kdf=kdf, progress=progress)

    def change_passphrase(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None) -> None:
        """Re-wrap the master key under a new passphrase; no item is re-encrypted (so the old passphrase
        with an old ``vault.json`` still opens it: :meth:`rekey` does not). Details:
        :func:`engine.vault.editing.change_passphrase`."""
        editing.change_passphrase(self, old, new, kdf=kdf)

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
        return checking.verify(self, item_ids, check_audit=check_audit, progress=progress)

    def repair(self, *, dry_run: bool = False, remove_leftovers: bool = False) -> RepairReport:
        """Accept the vault as it is now and put back into the index every item whose files are still
        there. Details: :func:`engine.vault.checking.repair`."""
        return checking.repair(self, dry_run=dry_run, remove_leftovers=remove_leftovers)

    def audit_trail(self) -> AuditTrail:
        """The decrypted audit trail, with any tampering found in it."""
        return checking.audit_trail(self)
