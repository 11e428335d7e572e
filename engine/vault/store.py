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
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import hmac
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from engine.errors import (
    DuplicateItem,
    InvalidRequest,
    OutputError,
    VaultCorrupted,
    VaultError,
    VaultLocked,
    VaultRolledBack,
)
from engine.nifti.io import is_nifti, provenance_sidecar, tissue_path, xform_code
from engine.vault import crypto, deid, dicom, nifti
from engine.vault import synthetic as synthetic_marks
from engine.vault.anchor import Anchor, AnchorState
from engine.vault.audit import FAILED_NAME as _FAILED_NAME
from engine.vault.audit import HEAD_NAME as _AUDIT_HEAD
from engine.vault.audit import LOCK_NAME as _AUDIT_LOCK
from engine.vault.audit import LOG_NAME as _AUDIT_LOG
from engine.vault.audit import AuditLog, ChainScan
from engine.vault.crypto import DecryptionFailed, KdfParams
from engine.vault.fsio import (
    TMP_WRITE_PREFIX,
    AtomicWriter,
    FileLock,
    fsync_dir,
    remove_leftovers,
    write_atomic,
)
from engine.vault.records import (
    KINDS,
    TISSUE_PART_PREFIX,
    AuditTrail,
    ExportResult,
    ItemInfo,
    OpenedVolume,
    RepairReport,
    VerifyReport,
    opened_volume,
    refuse_patient_if_synthetic,
    tissue_names,
)
from engine.vault.rekey import finish_interrupted_swap, remove_retired

HEADER_NAME = "vault.json"
INDEX_NAME = "index.vsi"
BLOB_DIR = "blobs"
BLOB_SUFFIX = ".vsb"
RECORD_SUFFIX = ".vsr"
#: A second copy of each record: one lost or damaged record file (with an index rolled back past its item)
#: no longer loses the item, ``repair`` re-indexes it from the other.
RECORD_COPY_SUFFIX = ".vsm"
PENDING_EXPORT_PREFIX = ".export-"
WRITE_LOCK_NAME = ".write.lock"
FORMAT = "volsynth-vault"
VERSION = 1
DEFAULT_IDLE_TIMEOUT_S = 15 * 60
EXPORT_TMP_PREFIX = ".volsynth-export-"
STAGING_NAME = "staging"  # <dest>/.volsynth-export-<token>-staging: an export's files until all are written
_OWN_NAMES = {HEADER_NAME, INDEX_NAME, BLOB_DIR, WRITE_LOCK_NAME, _AUDIT_LOG, _AUDIT_HEAD, _AUDIT_LOCK}
#: Left by an interrupted ``create``: a folder holding only these may be initialised again.
_LEFTOVER_PREFIXES = (_FAILED_NAME, ".tmp-")
_ROLLBACK_ADVICE = (
    "Nothing was deleted. Put the newer files back from a backup, or run `volsynth vault repair --dry-run` "
    "to see how the vault can be accepted as it is (it re-indexes the items whose encrypted files are still "
    "there), then `volsynth vault repair`."
)

Progress = Callable[[int, int], None]
"""Progress callback: (bytes done, bytes total). It may raise (e.g. ``Cancelled``) to abort cleanly."""


def default_vault_path() -> Path:
    """Where the vault lives unless told otherwise: ``$VOLSYNTH_VAULT``, else a per-user data folder
    (``$XDG_DATA_HOME/volsynth/vault``, ``~/.local/share/volsynth/vault``; the platform's application-data
    folder on Windows and macOS)."""
    env = os.environ.get("VOLSYNTH_VAULT")
    if env:
        return Path(env).expanduser()
    from engine.files.user_folders import user_data_dir

    return user_data_dir() / "vault"


def _now_iso() -> str:
    # Microseconds: items are listed in creation order, and imports are serialised by the write lock.
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json_copy(value, what: str):
    """Deep copy through JSON, refusing what would not survive the round trip unchanged."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} must be JSON data (strings, numbers, lists, dicts): {exc}") from exc
    out = json.loads(text)
    if out != value:
        raise InvalidRequest(f"{what} must be JSON data; tuples or non-string keys change in storage")
    return out


# Provenance keys that describe one file of a volume (its sidecar's neighbours, its batch position in a
# folder), not the volume: two files of the same volume differ there.
_FILE_SPECIFIC_PROVENANCE = frozenset({"tissue_maps", "file", "batch_index", "recovery_name"})


def volume_fingerprint(slices: Iterator[np.ndarray], shape: Sequence[int], affine, provenance) -> str:
    """SHA-256 of what makes two items the same volume: the voxel values (as float64, slice by slice over
    the last axis, so a file and an array hash alike whatever their dtype or compression), the affine (at
    the float32 precision a NIfTI header keeps) and the provenance less its file-specific keys.

    File bytes are no test: saving one volume twice gives two gzip streams with different headers.
    """
    prov = provenance if isinstance(provenance, Mapping) else {}
    head = {
        "shape": [int(n) for n in shape],
        "affine": np.asarray(affine, dtype=np.float32).astype(np.float64).round(5).tolist(),
        "provenance": {k: v for k, v in prov.items() if k not in _FILE_SPECIFIC_PROVENANCE},
    }
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode("utf-8"))
    for plane in slices:
        digest.update(np.ascontiguousarray(plane, dtype="<f8").tobytes())
    return digest.hexdigest()


def _array_slices(arr: np.ndarray) -> Iterator[np.ndarray]:
    for index in range(arr.shape[-1]):
        yield arr[..., index]


def _file_slices(path: Path, shape: Sequence[int], chunk: int = 16) -> Iterator[np.ndarray]:
    """A NIfTI file's voxels (scaled as nibabel reads them), a few slices at a time: never all in memory."""
    import nibabel as nib

    proxy = nib.load(str(path)).dataobj
    for start in range(0, int(shape[-1]), chunk):
        block = np.asarray(proxy[..., start : start + chunk])
        for index in range(block.shape[-1]):
            yield block[..., index]


def _json_dict(value, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a dict, got {type(value).__name__}")
    return _json_copy(value, what)


_DATE_FIELDS = (("patient", "birth_date", "birth date"), ("study", "date", "study date"))


def normalize_date(value, what: str) -> str:
    """A calendar date typed by a person (``YYYY-MM-DD`` or DICOM's ``YYYYMMDD``) as ``YYYYMMDD``.

    Raises:
        InvalidRequest: Not a real date, before 1850 or in the future, naming the field and the form to use.
    """
    text = str(value).strip()
    digits = text.replace("-", "") if len(text) == 10 and text[4] == "-" and text[7] == "-" else text
    try:
        if len(digits) != 8 or not digits.isdigit():
            raise ValueError("wrong form")
        day = datetime.strptime(digits, "%Y%m%d").date()
    except ValueError:
        raise InvalidRequest(
            f"{what} {text!r} is not a valid date; use YYYY-MM-DD (for example 2024-01-31)"
        ) from None
    today = datetime.now(UTC).date()
    if day.year < 1850 or (day - today).days > 1:
        raise InvalidRequest(f"{what} {text!r} is out of range: it must lie between 1850 and today")
    return digits


def _check_dates(record: dict) -> None:
    """Validate and normalise the dates people type (patient birth date, study date) in place."""
    for section, key, what in _DATE_FIELDS:
        values = record.get(section) or {}
        if values.get(key) not in (None, ""):
            values[key] = normalize_date(values[key], what)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- header -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Header:
    vault_id: bytes
    created: str
    kdf: KdfParams
    salt: bytes
    wrap_nonce: bytes
    wrapped_key: bytes

    def _bound(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "vault_id": self.vault_id.hex(),
            "created": self.created,
            "kdf": {"alg": "argon2id", "salt": _b64(self.salt), **self.kdf.to_dict()},
            "cipher": "cobblestone-256",
        }

    def aad(self) -> bytes:
        """Everything but the wrapped key: editing any of it makes the unwrap fail."""
        return json.dumps(self._bound(), sort_keys=True, separators=(",", ":")).encode()

    def to_bytes(self) -> bytes:
        body = {
            **self._bound(),
            "wrap": {"alg": "aes-256-gcm", "nonce": _b64(self.wrap_nonce), "key": _b64(self.wrapped_key)},
        }
        text = (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()
        return text + b"sha256 " + hashlib.sha256(text).hexdigest().encode() + b"\n"

    @classmethod
    def read(cls, folder: Path) -> _Header:
        path = folder / HEADER_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise VaultError(
                f"there is no vault at {folder}; create one first (volsynth vault init)"
            ) from exc
        except OSError as exc:
            raise VaultError(f"cannot read the vault header {path}: {exc.strerror}") from exc
        bad = VaultCorrupted(
            f"the vault header ({path}) is corrupted or was edited; restore the vault folder from a backup"
        )
        cut = data.rfind(b"sha256 ")
        if cut <= 0 or data[cut:] != b"sha256 " + hashlib.sha256(data[:cut]).hexdigest().encode() + b"\n":
            raise bad
        try:
            body = json.loads(data[:cut])
            if body["format"] != FORMAT:
                raise bad
            if body["version"] != VERSION:
                raise VaultError(
                    f"the vault at {folder} has format version {body['version']}; this VolSynth reads "
                    f"version {VERSION} (update VolSynth)"
                )
            kdf = body["kdf"]
            if kdf["alg"] != "argon2id" or body["cipher"] != "cobblestone-256":
                raise bad
            header = cls(
                vault_id=bytes.fromhex(body["vault_id"]),
                created=str(body["created"]),
                kdf=KdfParams.from_dict(kdf),
                salt=base64.b64decode(kdf["salt"], validate=True),
                wrap_nonce=base64.b64decode(body["wrap"]["nonce"], validate=True),
                wrapped_key=base64.b64decode(body["wrap"]["key"], validate=True),
            )
        except (ValueError, KeyError, TypeError, InvalidRequest) as exc:
            raise bad from exc
        if header.to_bytes() != data:  # also rejects fields we do not know
            raise bad
        return header


# -- keys -------------------------------------------------------------------------------------------------
class _Keys:
    """The unlocked key material. ``wipe()`` overwrites the master key (derived keys are short-lived
    ``bytes`` that Python cannot reliably zero; they are dropped with this object)."""

    def __init__(self, master: bytes, vault_id: bytes) -> None:
        self.master = bytearray(master)
        self.vault_id = vault_id
        self.index = crypto.subkey(self.master, vault_id, "index")
        self.audit_enc = crypto.subkey(self.master, vault_id, "audit-enc")
        self.audit_mac = crypto.subkey(self.master, vault_id, "audit-mac")
        self.record = crypto.subkey(self.master, vault_id, "record")

    def item(self, item_id: str) -> bytes:
        return crypto.subkey(self.master, self.vault_id, "item", item_id)

    def wipe(self) -> None:
        for n in range(len(self.master)):
            self.master[n] = 0
        self.index = self.audit_enc = self.audit_mac = self.record = b""


# -- payload writer ---------------------------------------------------------------------------------------
class _PartWriter:
    """Streams one part (volume or DICOM file) into an encrypted blob, hashing the plaintext."""

    def __init__(self, folder: Path, key: bytes, ctx: bytes, name: str) -> None:
        self.name = name
        self.blob = secrets.token_hex(16)
        self.path = folder / f"{self.blob}{BLOB_SUFFIX}"
        self._writer = AtomicWriter(self.path)
        self._enc = crypto.StreamEncryptor(key, ctx)
        self._sha = hashlib.sha256()
        self.size = 0
        self.ct_size = 0
        self.extra: dict = {}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._sha.update(data)
        self.size += len(data)
        out = self._enc.update(data)
        self.ct_size += len(out)
        self._writer.write(out)

    def close(self) -> dict:
        out = self._enc.finalize()
        self.ct_size += len(out)
        self._writer.write(out)
        self._writer.commit(sync_dir=False)  # the blob folder is fsync'ed once, before the index commit
        return {
            "name": self.name,
            "blob": self.blob,
            "size": self.size,
            "ct_size": self.ct_size,
            "sha256": self._sha.hexdigest(),
            **self.extra,
        }

    def discard(self) -> None:
        self._writer.abort()
        if self._writer.replaced:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _part_label(name: str) -> str:
    if name.startswith("dicom/"):
        return f"DICOM file {int(name.split('/')[1])}"
    if name.startswith(TISSUE_PART_PREFIX):
        return f"tissue map {name[len(TISSUE_PART_PREFIX) :]}"
    return "volume data"


#: A tissue map's name: what a BIDS ``label-<name>`` entity allows (letters and digits), as model specs do.
MAX_TISSUE_NAME = 40


def _check_tissue_name(name) -> str:
    if not isinstance(name, str) or not name.isascii() or not name.isalnum() or len(name) > MAX_TISSUE_NAME:
        raise InvalidRequest(
            f"a tissue map name must be 1-{MAX_TISSUE_NAME} letters and digits (e.g. GM), "
            f"got {str(name)[:60]!r}"
        )
    return name


def _check_tissue(tissue, shape: tuple[int, ...]) -> list[tuple[str, np.ndarray]]:
    """The tissue maps to store with a volume of ``shape``: (name, 3D real array on the volume's grid)."""
    if not tissue:
        return []
    if not hasattr(tissue, "items"):
        raise InvalidRequest(f"tissue maps must be a mapping of name -> array, got {type(tissue).__name__}")
    out = []
    for name, value in tissue.items():
        _check_tissue_name(name)
        arr = np.asarray(value)
        if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr) or arr.shape != tuple(shape[:3]):
            raise InvalidRequest(
                f"tissue map {name} must be a real-valued array of the volume's grid {tuple(shape[:3])}, "
                f"got {arr.dtype} {arr.shape}"
            )
        out.append((name, arr))
    return out


def _space(provenance: dict | None) -> str | None:
    """The template space a provenance record names (``"space"``, e.g. ``MNI152NLin2009aSym``), if any."""
    space = (provenance or {}).get("space")
    return space if isinstance(space, str) and space else None


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
        self._header = _Header.read(self.path)
        self.idle_timeout_s = idle_timeout_s
        self.write_lock_wait_s = write_lock_wait_s
        self._clock = clock
        self._last_activity = clock()
        self._mutex = threading.RLock()
        self._keys: _Keys | None = None
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

    # -- creation ---------------------------------------------------------------------------------------
    @staticmethod
    def exists(path: str | os.PathLike) -> bool:
        """Whether ``path`` holds a vault (a header file)."""
        return (Path(path).expanduser() / HEADER_NAME).is_file()

    @classmethod
    def create(
        cls, path: str | os.PathLike, passphrase: str | bytes, *, kdf: KdfParams | None = None, **kwargs
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
                if p.name not in _OWN_NAMES and not p.name.startswith(_LEFTOVER_PREFIXES)
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
        salt = os.urandom(crypto.SALT_BYTES)
        draft = _Header(vault_id, _now_iso(), kdf, salt, b"", b"")
        nonce, wrapped = crypto.wrap_key(crypto.derive_kek(pw, salt, kdf), master, draft.aad())
        header = _Header(vault_id, draft.created, kdf, salt, nonce, wrapped)
        keys = _Keys(master, vault_id)
        lock = FileLock(
            folder / WRITE_LOCK_NAME, "another VolSynth process (pid {pid}) is creating this vault"
        )
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
                "header_sha256": _sha256(header.to_bytes()),
                "record_copies": 2,  # every item has .vsr and .vsm (older vaults: from their repair on)
                "items": {},
            }
            cls._write_index_file(folder, keys, index)
            # The header goes last: its presence is what makes the folder a vault.
            write_atomic(folder / HEADER_NAME, header.to_bytes())
            with contextlib.suppress(OSError):
                fsync_dir(folder.parent)
        vault = cls(folder, **kwargs)
        vault._anchor.update(generation=0, audit=audit.last_appended)
        with vault._mutex:
            vault._adopt_keys(keys)
        return vault

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
        with self._mutex:
            if self._keys is not None:
                self.touch()
                return
            pw = crypto.encode_passphrase(passphrase)
            header = _Header.read(self.path)  # another process may have changed the passphrase
            header_bytes = header.to_bytes()  # exactly the file's bytes (_Header.read checks that)
            kek = crypto.derive_kek(pw, header.salt, header.kdf)
            try:
                master = crypto.unwrap_key(kek, header.wrap_nonce, header.wrapped_key, header.aad())
            except DecryptionFailed:
                AuditLog.record_failed_unlock(self.path)
                raise VaultLocked(f"wrong passphrase for the vault at {self.path}") from None
            self._header = header
            keys = _Keys(master, header.vault_id)
            index, stamp = self._read_index(keys)
            self._audit.attach_keys(keys.audit_enc, keys.audit_mac)
            try:
                problems = self._rollback_problems(index, header_bytes)
            except BaseException:
                self._audit.detach_keys()
                keys.wipe()
                raise
            if problems and not allow_rollback:
                self._audit.detach_keys()
                keys.wipe()
                raise VaultRolledBack(
                    f"the vault at {self.path} is older than it was: "
                    + "; ".join(problems)
                    + ". "
                    + _ROLLBACK_ADVICE
                )
            self._rolled_back = problems
            self._index, self._index_stamp = index, stamp
            self._adopt_keys(keys)
            self.notices, self._opening_notices = self._opening_notices, []
            self.warnings = self._detection_limits(index) if not problems else []
            if not problems:
                self._anchor.update(generation=int(index.get("generation", 0)))
            if self._anchor.problem:
                self.warnings.append(
                    f"{self._anchor.problem}. Without it this computer cannot tell an older copy of the vault "
                    "put back from the real one; make that folder writable (or set $VOLSYNTH_ANCHOR_DIR)."
                )
            try:
                self._audit.record_unlock()
                self._audit_problem = None
            except VaultCorrupted as exc:
                self._audit_problem = str(exc)
            self.notices += self._audit.repairs
            self._audit.repairs = []
            self._clean_stale_files()

    def _reopen(self, keys: _Keys) -> None:
        """Point this object at the vault now at its path (after ``vault rekey`` swapped it in) and adopt
        that vault's keys."""
        with self._mutex:
            if self._keys is not None:
                self._audit.detach_keys()
                self._keys.wipe()
            self._keys = None
            self._index = self._index_stamp = None
            self._header = _Header.read(self.path)
            self._audit = AuditLog(self.path, self._header.vault_id)
            self._audit.on_append = self._on_audit_appended
            self._anchor = Anchor(self._header.vault_id.hex())
            self._rolled_back = []
            self._adopt_keys(keys)

    def _adopt_keys(self, keys: _Keys) -> None:
        self._keys = keys
        self._audit.attach_keys(keys.audit_enc, keys.audit_mac)
        if self._index is None:
            self._index, self._index_stamp = self._read_index(keys)
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

    # -- index ------------------------------------------------------------------------------------------
    @staticmethod
    def _index_ctx(vault_id: bytes) -> bytes:
        return crypto.context(vault_id, "index")

    @classmethod
    def _write_index_file(cls, folder: Path, keys: _Keys, index: dict) -> None:
        plain = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
        write_atomic(
            folder / INDEX_NAME, crypto.encrypt_bytes(keys.index, cls._index_ctx(keys.vault_id), plain)
        )

    def _read_index(self, keys: _Keys) -> tuple[dict, tuple]:
        path = self.path / INDEX_NAME
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                raw = fh.read()
        except FileNotFoundError as exc:
            raise VaultCorrupted(
                f"the vault index ({path}) is missing; restore the vault from a backup"
            ) from exc
        try:
            index = json.loads(crypto.decrypt_bytes(keys.index, self._index_ctx(keys.vault_id), raw))
            if index["vault_id"] != keys.vault_id.hex() or not isinstance(index["items"], dict):
                raise ValueError("index of another vault")
        except (DecryptionFailed, ValueError, KeyError, TypeError) as exc:
            raise VaultCorrupted(
                f"the vault index ({path}) is corrupted or was edited; restore the vault from a backup"
            ) from exc
        return index, (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh_index(self) -> None:
        """Re-read the index if another process (or object) changed it; an older one is refused."""
        assert self._keys is not None and self._index is not None
        try:
            st = os.stat(self.path / INDEX_NAME)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._index_stamp:
            index, new_stamp = self._read_index(self._keys)
            old_gen, new_gen = int(self._index.get("generation", 0)), int(index.get("generation", 0))
            if new_gen < old_gen:
                raise VaultRolledBack(
                    f"index.vsi of the vault at {self.path} was replaced by an older version while the vault "
                    f"was open (generation {new_gen}, it was at {old_gen}). {_ROLLBACK_ADVICE}"
                )
            self._index, self._index_stamp = index, new_stamp

    def _commit(
        self,
        event: str,
        item_id: str | None,
        detail: dict,
        index: dict,
        *,
        generation: int | None = None,
        before_index: Callable[[], None] | None = None,
    ) -> None:
        """Commit a change: the audit entry (write-ahead, carrying the new generation), then the index that
        records that entry's seq and MAC and the header's hash, then the anchor."""
        assert self._keys is not None and self._index is not None
        if generation is None:
            generation = int(self._index.get("generation", 0)) + 1
        self._audit_write(event, item_id, {**detail, "generation": generation})
        if before_index is not None:
            before_index()
        assert self._audit.last_appended is not None
        seq, mac = self._audit.last_appended
        index = {
            **index,
            "generation": generation,
            "audit_seq": seq,
            "audit_mac": mac.hex(),
            "header_sha256": _sha256(self._header.to_bytes()),
        }
        self._write_index_file(self.path, self._keys, index)
        st = os.stat(self.path / INDEX_NAME)
        self._index, self._index_stamp = index, (st.st_ino, st.st_mtime_ns, st.st_size)
        if not self._rolled_back:
            self._anchor.update(generation=generation)

    def _on_audit_appended(self, seq: int, mac: bytes) -> None:
        if not self._rolled_back:  # a rolled-back chain must not move the anchor (repair resets it)
            self._anchor.update(audit=(seq, mac))

    def _rollback_problems(self, index: dict, header_bytes: bytes) -> list[str]:
        """What in the vault folder is older than what the vault itself (audit chain, index) or this
        computer's anchor recorded. Needs the audit keys attached. One line per rolled-back file."""
        problems: list[str] = []
        generation = int(index.get("generation", 0))
        bound_seq = int(index.get("audit_seq", 0))
        try:
            scan = self._audit.scan(after_seq=bound_seq)
        except VaultCorrupted:  # audit.log missing: audit_problem reports it; the head still counts below
            scan = ChainScan(macs={}, last_seq=0, after=[])
        anchor = self._anchor.read()

        # vault.json: the index records the header it was committed with; a passphrase change that was
        # interrupted before its index commit left an audit entry naming the new header.
        actual = _sha256(header_bytes)
        recorded = index.get("header_sha256")
        if recorded and recorded != actual:
            pending = any(
                e.event == "passphrase_changed" and e.detail.get("header_sha256") == actual
                for e in scan.after
            )
            if not pending:
                problems.append(
                    "vault.json is an older version than the one the index was committed with (as after "
                    "restoring it from before a passphrase change: a passphrase that was changed opens it "
                    "again)"
                )

        # index.vsi against the audit chain: later commits in the chain mean the index went back. One
        # commit of difference is also what a crash between the audit entry and the index leaves; the
        # anchor tells the two apart.
        later = [
            int(e.detail["generation"])
            for e in scan.after
            if isinstance(e.detail.get("generation"), int) and e.event != "create"
        ]
        chain_gen = max(later, default=generation)
        anchor_gen = anchor.generation if anchor is not None else 0
        if chain_gen >= generation + 2 or (chain_gen == generation + 1 and anchor_gen > generation):
            problems.append(
                f"index.vsi was rolled back: it is at generation {generation} but the audit trail records "
                f"changes up to generation {chain_gen}; items added or changed since are missing from it"
            )
        elif anchor_gen > generation:
            problems.append(
                f"index.vsi was rolled back: it is at generation {generation} but this computer last saw "
                f"generation {anchor_gen} ({anchor.updated or 'date unknown'}); items added or changed since "
                "are missing from it"
            )

        # audit.log + audit.head: the index and the anchor name entries the chain must still hold. A log cut
        # short behind an intact head is truncation, which the head itself reports (see audit_problem).
        audit_what = "audit.log and audit.head were rolled back"
        last = max(scan.last_seq, self._audit.head_seq() or 0)
        if bound_seq and last < bound_seq:
            problems.append(
                f"{audit_what}: the audit trail ends at entry {last} but the index was committed "
                f"at entry {bound_seq}"
            )
        elif bound_seq and bound_seq in scan.macs and scan.macs[bound_seq].hex() != index.get("audit_mac"):
            problems.append(
                f"audit.log was replaced: entry {bound_seq} is not the one the index was committed with"
            )
        elif anchor is not None and anchor.audit_seq:
            if last < anchor.audit_seq:
                problems.append(
                    f"{audit_what}: the audit trail ends at entry {last} but this computer last saw "
                    f"entry {anchor.audit_seq} ({anchor.updated or 'date unknown'})"
                )
            elif anchor.audit_seq in scan.macs and scan.macs[anchor.audit_seq].hex() != anchor.audit_mac:
                problems.append(
                    f"audit.log was replaced: entry {anchor.audit_seq} is not the one this computer last saw"
                )
        return problems

    def _detection_limits(self, index: dict) -> list[str]:
        """Where this unlock could not have detected a rollback, said in words (see ``warnings``)."""
        out: list[str] = []
        anchor = self._anchor.read()
        if anchor is None and not self._anchor.problem:
            out.append(
                f"this computer has no record of this vault (first unlock here or under this account, or its "
                f"anchor {self._anchor.path} was removed): if the whole vault folder is an older copy, that "
                "cannot be detected now (from this unlock on it can)"
            )
        generation = int(index.get("generation", 0))
        if anchor is not None and anchor.generation >= generation:
            return out  # the anchor saw this index committed: one entry more in the chain is a crash
        with contextlib.suppress(VaultCorrupted):
            later = [
                int(e.detail["generation"])
                for e in self._audit.scan(after_seq=int(index.get("audit_seq", 0))).after
                if isinstance(e.detail.get("generation"), int) and e.event != "create"
            ]
            if later and max(later) == generation + 1:
                out.append(
                    "index.vsi is one change behind the audit trail: either the last change was interrupted "
                    "(a crash), or the index was put back by one change, which cannot be told apart without "
                    "this computer's anchor; if an item added or changed last is missing, run "
                    "`volsynth vault repair --dry-run`"
                )
        return out

    def _on_disk_has(self, item_id: str) -> bool | None:
        """After a failed commit: does the index on disk reference the item? None if it cannot be told."""
        assert self._keys is not None
        try:
            index, _ = self._read_index(self._keys)
        except VaultError:
            return None
        return item_id in index["items"]

    # -- operation scaffolding --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _op(self) -> Iterator[None]:
        with self._mutex:
            if self._keys is None:
                raise VaultLocked(f"the vault at {self.path} is locked; unlock it with its passphrase")
            self.touch()
            try:
                self._refresh_index()
                yield
            finally:
                self.touch()

    @contextlib.contextmanager
    def _writing(self, *, repairing: bool = False) -> Iterator[None]:
        """Hold the inter-process write lock; on entry, see the latest index and clear crash leftovers."""
        if self._rolled_back and not repairing:
            raise VaultRolledBack(
                f"the vault at {self.path} was rolled back ({'; '.join(self._rolled_back)}); changes are "
                f"refused until it is repaired. {_ROLLBACK_ADVICE}"
            )
        self._write_lock.acquire(self.write_lock_wait_s)
        try:
            self._refresh_index()
            self._remove_crash_leftovers()
            yield
        finally:
            self._write_lock.release()

    def _blob_dir(self) -> Path:
        return self.path / BLOB_DIR

    def _orphan_blobs(self) -> list[Path]:
        """Payload and record files the index does not reference (never deleted automatically)."""
        assert self._index is not None
        used = {p["blob"] for rec in self._index["items"].values() for p in rec["parts"]}
        items = set(self._index["items"])
        try:
            entries = list(os.scandir(self._blob_dir()))
        except FileNotFoundError:
            return []
        return sorted(
            Path(e.path)
            for e in entries
            if (e.name.endswith(BLOB_SUFFIX) and e.name[: -len(BLOB_SUFFIX)] not in used)
            or (e.name.endswith(RECORD_SUFFIX) and e.name[: -len(RECORD_SUFFIX)] not in items)
            or (e.name.endswith(RECORD_COPY_SUFFIX) and e.name[: -len(RECORD_COPY_SUFFIX)] not in items)
        )

    def _remove_crash_leftovers(self) -> int:
        """Remove the temporary files of interrupted writes (never a committed or unreferenced payload).
        Safe only under the write lock: every writer of these files holds it. Returns how many."""
        removed = remove_leftovers(self.path, TMP_WRITE_PREFIX) + remove_leftovers(
            self._blob_dir(), TMP_WRITE_PREFIX
        )
        if removed:
            self.notices.append(
                f"removed {removed} partial file(s) left in the vault by an interrupted import or change"
            )
        return removed

    def _clean_stale_files(self) -> None:
        """At unlock: remove partial files of interrupted imports (if no other process is writing) and of
        interrupted exports (beside their targets), and say so in :attr:`notices`. Never raises."""
        try:
            self._write_lock.acquire(0.0)
        except VaultError:
            pass  # another process is writing: its partial files are live
        else:
            try:
                self._remove_crash_leftovers()
            except OSError:
                pass
            finally:
                self._write_lock.release()
        try:
            self._clean_stale_exports()
        except (OSError, VaultError) as exc:
            self.notices.append(f"could not check for interrupted exports: {exc}")
        try:
            if (notice := remove_retired(self.path)) is not None:
                self.notices.append(notice)
        except OSError as exc:
            self.notices.append(f"could not delete the vault's pre-re-key copy: {exc}")

    # -- item records (what repair re-indexes from) -------------------------------------------------------
    def _record_ctx(self, item_id: str) -> bytes:
        assert self._keys is not None
        return crypto.context(self._keys.vault_id, "record", item_id)

    def _record_path(self, item_id: str) -> Path:
        return self._blob_dir() / f"{item_id}{RECORD_SUFFIX}"

    def _record_copy_path(self, item_id: str) -> Path:
        return self._blob_dir() / f"{item_id}{RECORD_COPY_SUFFIX}"

    def _write_record(self, rec: dict) -> None:
        """Write both copies of an item's record (each atomically; the caller fsyncs the folder)."""
        assert self._keys is not None
        plain = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
        for path in (self._record_path(rec["id"]), self._record_copy_path(rec["id"])):
            write_atomic(
                path,
                crypto.encrypt_bytes(self._keys.record, self._record_ctx(rec["id"]), plain),
                sync_dir=False,
            )

    def _unlink_records(self, item_id: str) -> None:
        for path in (self._record_path(item_id), self._record_copy_path(item_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _read_record_file(self, path: Path, item_id: str) -> dict:
        """One record file, authenticated (its context binds the item id: a swapped file fails)."""
        assert self._keys is not None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise VaultCorrupted(f"the record of item {item_id} ({path.name}) is missing") from None
        try:
            rec = json.loads(crypto.decrypt_bytes(self._keys.record, self._record_ctx(item_id), raw))
            if rec["id"] != item_id or rec["kind"] not in KINDS or not isinstance(rec["parts"], list):
                raise ValueError("not this item's record")
        except (DecryptionFailed, ValueError, KeyError, TypeError) as exc:
            raise VaultCorrupted(
                f"the record of item {item_id} ({path.name}) does not authenticate (modified, truncated, "
                "emptied or swapped)"
            ) from exc
        return rec

    def _read_record(self, item_id: str) -> dict:
        """An item's record, from whichever copy authenticates; VaultCorrupted if neither does."""
        try:
            return self._read_record_file(self._record_path(item_id), item_id)
        except VaultCorrupted as first:
            try:
                return self._read_record_file(self._record_copy_path(item_id), item_id)
            except VaultCorrupted:
                raise first from None

    def _record_problems(self, rec: dict) -> tuple[list[str], bool]:
        """What is wrong with an indexed item's record files: (problems, files merely absent in a vault made
        before every item had two record files: a note, ``repair`` writes them)."""
        assert self._index is not None
        problems: list[str] = []
        absent = False
        two_expected = self._index.get("record_copies") == 2
        for path in (self._record_path(rec["id"]), self._record_copy_path(rec["id"])):
            if not path.exists() and not two_expected:
                absent = True
                continue
            try:
                on_disk = self._read_record_file(path, rec["id"])
            except VaultCorrupted as exc:
                problems.append(f"{exc}; `volsynth vault repair` rewrites it from the index")
                continue
            if on_disk != rec:
                problems.append(
                    f"the record of item {rec['id']} ({path.name}) differs from the index (an older copy was "
                    "put back?); `volsynth vault repair` rewrites it from the index"
                )
        return problems, absent and not problems

    def _pending_ctx(self, token: str) -> bytes:
        assert self._keys is not None
        return crypto.context(self._keys.vault_id, "pending-export", token)

    @contextlib.contextmanager
    def _pending_export(
        self, folders: list[Path], *, targets: Sequence[Path] = (), overwrite: bool = False
    ) -> Iterator[str]:
        """Note (encrypted, in the vault folder) where an export writes its partial files, for as long as
        it runs; a lock on the note tells a running export from one that was killed. Yields the export's
        temporary-file prefix."""
        assert self._keys is not None
        token = secrets.token_hex(8)
        prefix = f"{EXPORT_TMP_PREFIX}{token}-"
        note = self.path / f"{PENDING_EXPORT_PREFIX}{token}.vse"
        lock = FileLock(self.path / f"{PENDING_EXPORT_PREFIX}{token}.lock", "export {pid} running")
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
                fh.write(crypto.encrypt_bytes(self._keys.index, self._pending_ctx(token), body))
                fh.flush()
                os.fsync(fh.fileno())
            yield prefix
        finally:
            with contextlib.suppress(FileNotFoundError):
                note.unlink()
            lock.release()
            with contextlib.suppress(FileNotFoundError):
                lock.path.unlink()

    def _clean_stale_exports(self) -> None:
        assert self._keys is not None
        for note in sorted(self.path.glob(f"{PENDING_EXPORT_PREFIX}*.vse")):
            token = note.name[len(PENDING_EXPORT_PREFIX) : -len(".vse")]
            lock = FileLock(self.path / f"{PENDING_EXPORT_PREFIX}{token}.lock", "export {pid} running")
            try:
                lock.acquire(0.0)
            except VaultLocked:
                continue  # that export is still running
            try:
                try:
                    body = json.loads(
                        crypto.decrypt_bytes(self._keys.index, self._pending_ctx(token), note.read_bytes())
                    )
                    folders, prefix = [Path(f) for f in body["folders"]], str(body["prefix"])
                    targets = [Path(t) for t in body.get("targets", [])]
                    overwrite = bool(body.get("overwrite", True))
                except FileNotFoundError:
                    continue  # finished meanwhile
                except (DecryptionFailed, ValueError, KeyError, TypeError):
                    self.notices.append(
                        f"an unreadable note of an interrupted export ({note.name}) was removed"
                    )
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
                    self.notices.append(
                        f"removed {removed} partial file(s) of an interrupted export (in {where})"
                    )
                with contextlib.suppress(FileNotFoundError):
                    note.unlink()
            finally:
                lock.release()
                with contextlib.suppress(FileNotFoundError):
                    lock.path.unlink()

    def _audit_write(self, event: str, item_id: str | None = None, detail: dict | None = None) -> None:
        self._audit.append(event, item_id, detail)
        self._audit_problem = None

    def _record(self, item_id: str) -> dict:
        assert self._index is not None
        items = self._index["items"]
        if item_id in items:
            return items[item_id]
        key = str(item_id).strip().lower()
        if len(key) >= 4:
            matches = [k for k in items if k.startswith(key)]
            if len(matches) == 1:
                return items[matches[0]]
            if len(matches) > 1:
                raise InvalidRequest(f"{item_id} matches {len(matches)} items; give more of the id")
        raise InvalidRequest(f"there is no item {item_id} in the vault")

    # -- listing ----------------------------------------------------------------------------------------
    def items(self, kind: str | None = None) -> list[ItemInfo]:
        """All items (optionally of one kind), oldest first."""
        return self.search("", kind=kind)

    def search(self, query: str = "", *, kind: str | None = None) -> list[ItemInfo]:
        """Items whose id, label, patient, study or provenance contains ``query`` (case-insensitive).

        Args:
            query: Text to look for; every whitespace-separated word must match somewhere.
            kind: ``"scan"`` or ``"synthetic"`` to filter.
        """
        if kind is not None and kind not in KINDS:
            raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        words = query.lower().split()
        with self._op():
            assert self._index is not None
            out = []
            for rec in self._index["items"].values():
                if kind is not None and rec["kind"] != kind:
                    continue
                haystack = " ".join(
                    [
                        rec["id"],
                        rec.get("label", ""),
                        rec.get("original_name", ""),
                        rec["kind"],
                        json.dumps(rec.get("patient") or {}, ensure_ascii=False),
                        json.dumps(rec.get("study") or {}, ensure_ascii=False),
                        json.dumps(rec.get("provenance") or {}, ensure_ascii=False),
                    ]
                ).lower()
                if all(w in haystack for w in words):
                    out.append(ItemInfo.from_record(rec))
        return sorted(out, key=lambda i: (i.created, i.id))

    def get(self, item_id: str) -> ItemInfo:
        """One item's metadata; ``item_id`` may be a unique prefix of at least 4 characters."""
        with self._op():
            return ItemInfo.from_record(self._record(item_id))

    # -- import -----------------------------------------------------------------------------------------
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
        """Import a .nii or .nii.gz file, streaming its bytes unchanged into the vault.

        Synthetic stays synthetic: a file carrying any of VolSynth's SYNTHETIC marks (``descrip``,
        ``intent_name``, ``aux_file``, a header extension, a provenance sidecar beside it; see
        :func:`engine.vault.synthetic.find_marks`) is imported as ``"synthetic"`` with the sidecar's
        provenance, and refused as a scan.

        The tissue maps a synthetic volume's provenance lists (``"tissue_maps": {name: file name}``, as
        ``engine.nifti.io.save_result`` writes them beside the image) are imported with it, byte for byte,
        as parts of the same item. A listed map that is missing, unreadable or not on the image's grid is
        left out, and :attr:`notices` says so (:attr:`ItemInfo.tissue_maps` names those kept).

        Args:
            path: The file.
            kind: ``"scan"`` for a real patient scan, ``"synthetic"`` for a generated volume; None (the
                default) decides from the file's marks.
            label: Display name (default: the file name).
            patient: Patient metadata, e.g. ``{"name": ..., "id": ..., "birth_date": ...}`` (scans only).
            study: Study metadata, e.g. ``{"date": ..., "description": ..., "modality": ...}``. Dates are
                checked and stored as ``YYYYMMDD``.
            provenance: How a synthetic volume was made; required for ``kind="synthetic"`` unless the file
                has a provenance sidecar or SYNTHETIC marks.
            progress: Called with (bytes done, bytes total).
            allow_duplicate: Store the volume even if the vault already holds exactly the same one.

        Raises:
            InvalidRequest: Not a single-file NIfTI, bad metadata, or a synthetic file asked to be a scan.
            DuplicateItem: The same volume is already in the vault (and ``allow_duplicate`` is False).
        """
        path = Path(path)
        if kind is not None and kind not in KINDS:
            raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        marks = synthetic_marks.find_marks(path)
        if marks.synthetic:
            if kind == "scan":
                raise InvalidRequest(
                    f"{marks.reason(path)}: it cannot be filed as a patient scan; import it as synthetic"
                )
            refuse_patient_if_synthetic("synthetic", patient, reason=marks.reason(path))
            kind = "synthetic"
            provenance = {**(marks.provenance or {}), **(provenance or {})}
        kind = kind or "scan"
        if kind == "synthetic" and provenance is None:
            raise InvalidRequest("a synthetic volume needs its provenance (model, seed, settings)")
        refuse_patient_if_synthetic(kind, patient)
        info = nifti.probe(path)
        maps = self._tissue_files(path, provenance, info) if kind == "synthetic" else []
        total = path.stat().st_size + sum(m.stat().st_size for _, m, _ in maps)
        name = path.name
        record = {
            "kind": kind,
            "label": label if label is not None else name.removesuffix(".gz").removesuffix(".nii"),
            "source": "nifti",
            "original_name": name,
            "patient": _json_dict(patient, "patient metadata"),
            "study": _json_dict(study, "study metadata"),
            "provenance": _json_copy(provenance, "provenance") if provenance is not None else None,
            "volume": {
                "shape": list(info.shape),
                "dtype": info.dtype,
                "affine": [list(r) for r in info.affine],
                "format": f"nifti{info.version}",
                "compressed": info.compressed,
                "descrip": info.descrip,
                "fingerprint": volume_fingerprint(
                    _file_slices(path, info.shape), info.shape, info.affine, provenance
                ),
            },
        }

        def write_parts(new_part: Callable[[str], _PartWriter]) -> list[dict]:
            parts = []
            done = 0
            # Tissue parts record whether their bytes are gzip'ed (the volume's flag is in "volume").
            for part_name, source, compressed in [("volume", path, None)] + [
                (TISSUE_PART_PREFIX + n, m, c) for n, m, c in maps
            ]:
                part = new_part(part_name)
                if compressed is not None:
                    part.extra["compressed"] = compressed
                with _reading(source) as fh:
                    while chunk := fh.read(crypto.IO_CHUNK):
                        part.write(chunk)
                        done += len(chunk)
                        if progress is not None:
                            progress(done, total)
                parts.append(part.close())
            return parts

        return self._import(record, write_parts, allow_duplicate=allow_duplicate)

    def _tissue_files(
        self, path: Path, provenance: dict | None, image: nifti.NiftiInfo
    ) -> list[tuple[str, Path, bool]]:
        """The tissue maps a generated file's provenance lists beside it: (name, file, gzip'ed), each checked
        complete and on the image's grid. Those that are not are left out, with a notice."""
        listed = (provenance or {}).get("tissue_maps")
        if not isinstance(listed, dict):
            return []
        # In the model's channel order (the sidecar's keys are sorted).
        channels = (provenance or {}).get("label_channels")
        order = [str(c) for c in channels] if isinstance(channels, list) else []
        entries = sorted(listed.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        out = []
        for name, file_name in entries:
            try:
                _check_tissue_name(name)
                if (
                    not isinstance(file_name, str)
                    or Path(file_name).name != file_name
                    or not is_nifti(file_name)
                ):
                    raise InvalidRequest(f"{str(file_name)[:80]!r} is not a NIfTI file name")
                source = path.with_name(file_name)
                if not source.is_file():
                    raise InvalidRequest(f"{file_name} is not beside {path.name}")
                found = nifti.probe(source)
                if found.shape[:3] != image.shape[:3] or not np.allclose(
                    found.affine, image.affine, rtol=0, atol=1e-3
                ):
                    raise InvalidRequest(f"{file_name} is not on the grid of {path.name}")
            except InvalidRequest as exc:
                self.notices.append(f"tissue map {str(name)[:60]} of {path.name} was not imported: {exc}")
                continue
            out.append((name, source, found.compressed))
        return out

    def import_dicom(
        self,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        label: str | None = None,
        series_uid: str | None = None,
        progress: Progress | None = None,
        allow_duplicate: bool = False,
    ) -> ItemInfo:
        """Import a DICOM series: the volume (sorted, oriented, RAS affine) and the original files.

        Patient and study metadata come from the DICOM headers. Pixel data is decoded one slice at a time.

        Args:
            source: A folder (searched recursively), a file, or a list of files.
            label: Display name (default: modality and series description).
            series_uid: Which series, when ``source`` holds several.
            progress: Called with (bytes done, bytes total).

        Raises:
            InvalidRequest: No usable series, several series, or slices that do not form a volume.
        """
        series = dicom.scan_series(
            [Path(p) for p in source] if isinstance(source, list | tuple) else Path(source),
            series_uid=series_uid,
        )
        header = nifti.float32_header(series.shape, series.affine, "VolSynth volume from a DICOM series")
        sizes = [p.stat().st_size for p in series.files]
        total = sum(sizes) + len(header) + 4 * int(np.prod(series.shape))
        default_label = " ".join(
            v for v in (series.study.get("modality"), series.study.get("series_description")) if v
        )
        record = {
            "kind": "scan",
            "label": label if label is not None else (default_label or "DICOM series"),
            "source": "dicom",
            "original_name": Path(source).name if not isinstance(source, list | tuple) else "",
            "patient": series.patient,
            "study": series.study,
            "provenance": None,
            "volume": {
                "shape": list(series.shape),
                "dtype": "float32",
                "affine": series.affine.tolist(),
                "format": "nifti1",
                "compressed": False,
                "descrip": "",
            },
        }

        def write_parts(new_part: Callable[[str], _PartWriter]) -> list[dict]:
            volume = new_part("volume")
            volume.write(header)
            done = len(header)
            files = []
            for n, (path, uid) in enumerate(zip(series.files, series.sop_uids, strict=True), start=1):
                with _reading(path) as fh:
                    raw = fh.read()
                part = new_part(f"dicom/{n:05d}")
                part.extra["filename"] = path.name
                part.write(raw)
                files.append(part.close())
                plane = dicom.slice_voxels(
                    raw,
                    expected_sop_uid=uid,
                    shape=series.shape[:2],
                    label=f"slice {n} of {len(series.files)}",
                )
                volume.write(plane)
                done += len(raw) + len(plane)
                if progress is not None:
                    progress(done, total)
            return [volume.close(), *files]

        return self._import(record, write_parts, allow_duplicate=allow_duplicate)

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
        """Store a generated volume (as float32 NIfTI marked SYNTHETIC) with its provenance.

        Args:
            volume: The voxels (3D, or more dimensions).
            affine: Voxel -> RAS mm, 4x4.
            provenance: How it was made (model id and weights hash, seed, sampler, settings...). A
                ``"space"`` (e.g. ``MNI152NLin2009aSym``) sets the sform code of the stored and exported
                NIfTI headers (4 for MNI152), as ``volsynth generate`` writes them.
            label: Display name (default: from the provenance's model id and seed).
            progress: Called with (bytes done, bytes total).
            allow_duplicate: Store it even if the vault already holds exactly the same volume.
            tissue: Tissue maps decoded with the volume (``SamplingResult.tissue_maps(i)``: name -> (x, y, z)
                on the volume's grid). Each is stored as one more encrypted part of the same item
                (``tissue/<name>``, float32 NIfTI with the volume's affine and SYNTHETIC marks): verified,
                exported and deleted with the volume, read back with :meth:`open_tissue`.

        Raises:
            DuplicateItem: The same volume is already in the vault (and ``allow_duplicate`` is False).
            InvalidRequest: Bad volume, affine or provenance, or a tissue map off the volume's grid.
        """
        arr = np.asarray(volume)
        if arr.ndim < 3 or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise InvalidRequest(
                f"a volume must be a real-valued array with 3+ dimensions, got {arr.dtype} {arr.shape}"
            )
        aff = np.asarray(affine, dtype=np.float64)
        if aff.shape != (4, 4) or not np.all(np.isfinite(aff)):
            raise InvalidRequest("the affine must be a finite 4x4 matrix")
        prov = _json_copy(provenance, "provenance")
        if not isinstance(prov, dict):
            raise InvalidRequest("provenance must be a dict")
        maps = _check_tissue(tissue, arr.shape)
        code = xform_code(_space(prov))  # 1 (as before) unless the provenance names a template space
        header = nifti.float32_header(arr.shape, aff, nifti.SYNTHETIC_DESCRIP, sform_code=code)
        map_header = nifti.float32_header(arr.shape[:3], aff, nifti.SYNTHETIC_DESCRIP, sform_code=code)
        total = len(header) + 4 * arr.size + sum(len(map_header) + 4 * m.size for _, m in maps)
        if label is None:
            bits = [str(prov["model_id"])] if prov.get("model_id") is not None else []
            bits += [f"seed {prov['seed']}"] if prov.get("seed") is not None else []
            label = "synthetic " + " ".join(bits) if bits else "synthetic volume"
        record = {
            "kind": "synthetic",
            "label": label,
            "source": "array",
            "original_name": "",
            "patient": {},
            "study": {},
            "provenance": prov,
            "volume": {
                "shape": list(arr.shape),
                "dtype": "float32",
                "affine": aff.tolist(),
                "format": "nifti1",
                "compressed": False,
                "descrip": nifti.SYNTHETIC_DESCRIP,
                "fingerprint": volume_fingerprint(_array_slices(arr), arr.shape, aff, prov),
            },
        }

        def write_parts(new_part: Callable[[str], _PartWriter]) -> list[dict]:
            parts = []
            done = 0
            for name, data, head in [("volume", arr, header)] + [
                (TISSUE_PART_PREFIX + n, m, map_header) for n, m in maps
            ]:
                part = new_part(name)
                part.write(head)
                done += len(head)
                for slab in nifti.iter_volume_slabs(data):
                    part.write(slab)
                    done += len(slab)
                    if progress is not None:
                        progress(done, total)
                parts.append(part.close())
            return parts

        return self._import(record, write_parts, allow_duplicate=allow_duplicate)

    def _import(
        self,
        record: dict,
        write_parts: Callable[[Callable[[str], _PartWriter]], list[dict]],
        *,
        allow_duplicate: bool = False,
    ) -> ItemInfo:
        if record["source"] != "dicom":  # DICOM dates come from the scanner, as they are
            _check_dates(record)
        with self._op(), self._writing():
            assert self._keys is not None and self._index is not None
            item_id = secrets.token_hex(16)
            key = self._keys.item(item_id)
            writers: list[_PartWriter] = []

            def new_part(name: str) -> _PartWriter:
                writer = _PartWriter(
                    self._blob_dir(), key, crypto.context(self._keys.vault_id, item_id, name), name
                )
                writers.append(writer)
                return writer

            record = {**record, "id": item_id, "created": _now_iso()}
            try:
                record["parts"] = write_parts(new_part)
                if not allow_duplicate and (same := self._same_volume(record)) is not None:
                    raise DuplicateItem(
                        f"this volume is already in the vault as \u201c{same.get('label', '')}\u201d "
                        f"(item {same['id'][:12]}, added {same['created'][:10]}); nothing was added",
                        existing=same["id"],
                    )
                self._write_record(record)
                fsync_dir(self._blob_dir())
                index = copy.deepcopy(self._index)
                index["items"][item_id] = record
                self._commit(
                    "import",
                    item_id,
                    {"kind": record["kind"], "source": record["source"], "parts": len(record["parts"])},
                    index,
                )
            except BaseException:
                # Remove the payloads unless the index on disk already references them (a failure after
                # the rename, e.g. of the folder fsync, leaves the item committed). These files belong to
                # this import only: no index ever referenced them.
                if not self._on_disk_has(item_id):
                    for writer in writers:
                        writer.discard()
                    self._unlink_records(item_id)
                raise
            return ItemInfo.from_record(record)

    def _copy_in(self, rec: dict, read_part: Callable[[dict], Iterator[bytes]]) -> int:
        """Store another vault's item record under this vault's keys, keeping its id (``vault rekey``).

        ``read_part(part)`` yields the part's plaintext (authenticated by the source vault); each part is
        re-encrypted into a new blob and its SHA-256 compared with the record's before the commit. Returns
        the plaintext bytes written.
        """
        with self._op(), self._writing():
            assert self._keys is not None and self._index is not None
            item_id = rec["id"]
            key = self._keys.item(item_id)
            writers: list[_PartWriter] = []
            parts: list[dict] = []
            written = 0
            try:
                for part in rec["parts"]:
                    ctx = crypto.context(self._keys.vault_id, item_id, part["name"])
                    writer = _PartWriter(self._blob_dir(), key, ctx, part["name"])
                    writers.append(writer)
                    for chunk in read_part(part):
                        writer.write(chunk)
                    done = writer.close()
                    if done["sha256"] != part["sha256"] or done["size"] != part["size"]:
                        raise VaultCorrupted(f"item {item_id} changed while it was being re-encrypted")
                    parts.append({**part, "blob": done["blob"], "ct_size": done["ct_size"]})
                    written += done["size"]
                record = {**copy.deepcopy(rec), "parts": parts}
                self._write_record(record)
                fsync_dir(self._blob_dir())
                index = copy.deepcopy(self._index)
                index["items"][item_id] = record
                self._commit("import", item_id, {"kind": rec["kind"], "rekey_copy": True}, index)
            except BaseException:
                if not self._on_disk_has(item_id):
                    for writer in writers:
                        writer.discard()
                    self._unlink_records(item_id)
                raise
            return written

    def _same_volume(self, record: dict) -> dict | None:
        """An item already holding this volume: the same voxels, affine and provenance
        (``volume_fingerprint``), or, for items stored before fingerprints, the same plaintext bytes."""
        assert self._index is not None
        fingerprint = record.get("volume", {}).get("fingerprint")
        if fingerprint:
            for rec in self._index["items"].values():
                if rec.get("volume", {}).get("fingerprint") == fingerprint:
                    return rec
        volume = next(p for p in record["parts"] if p["name"] == "volume")
        for rec in self._index["items"].values():
            for part in rec["parts"]:
                if (
                    part["name"] == "volume"
                    and part["sha256"] == volume["sha256"]
                    and part["size"] == volume["size"]
                ):
                    return rec
        return None

    # -- reading ----------------------------------------------------------------------------------------
    def _corrupted(self, rec: dict, part: dict, why: str) -> VaultCorrupted:
        return VaultCorrupted(
            f"item {rec['id']} is corrupted: its {_part_label(part['name'])} {why}; no data was returned"
        )

    def _open_part(self, rec: dict, part: dict):
        """Open a part's blob after checking its exact length; returns (file, decryptor)."""
        assert self._keys is not None
        path = self._blob_dir() / f"{part['blob']}{BLOB_SUFFIX}"
        try:
            fh = open(path, "rb")  # noqa: SIM115 - the callers close it
        except FileNotFoundError:
            raise VaultCorrupted(
                f"item {rec['id']} is damaged: its {_part_label(part['name'])} file is missing"
            ) from None
        size = os.fstat(fh.fileno()).st_size
        if size != part["ct_size"]:
            fh.close()
            raise self._corrupted(
                rec, part, f"file was truncated or extended ({size} bytes, not {part['ct_size']})"
            )
        ctx = crypto.context(self._keys.vault_id, rec["id"], part["name"])
        return fh, crypto.StreamDecryptor(self._keys.item(rec["id"]), ctx)

    def _iter_part(self, rec: dict, part: dict, *, check_hash: bool = False) -> Iterator[bytes]:
        """Decrypt one part, yielding plaintext pieces; raises VaultCorrupted naming the item.

        Integrity comes from the AEAD: every chunk is authenticated under a key and context unique to this
        item and part, and ``finalize`` proves the stream complete. Pieces are therefore genuine as they
        come, but only a generator run to completion proves nothing was cut off: consumers act on the data
        (return it, rename a file into place) only after that. ``check_hash`` adds the SHA-256 recorded at
        import as a second, independent check (used by verify).
        """
        fh, dec = self._open_part(rec, part)
        sha = hashlib.sha256() if check_hash else None
        n = 0
        with fh:
            try:
                while chunk := fh.read(crypto.IO_CHUNK):
                    out = dec.update(chunk)
                    if out:
                        if sha is not None:
                            sha.update(out)
                        n += len(out)
                        yield out
                out = dec.finalize()
            except DecryptionFailed:
                raise self._corrupted(
                    rec, part, "failed authentication (modified, damaged or swapped)"
                ) from None
        if out:
            if sha is not None:
                sha.update(out)
            n += len(out)
            yield out
        if n != part["size"] or (
            sha is not None and not hmac.compare_digest(sha.hexdigest(), part["sha256"])
        ):
            raise self._corrupted(rec, part, "does not match the index")

    def _read_part(self, rec: dict, part: dict) -> memoryview:
        """Decrypt one part into memory (never to disk), without intermediate copies."""
        size = int(part["size"])
        # Uninitialised memory: nothing is zeroed first, and on failure it is dropped unread.
        buf = np.empty(size + crypto.IO_CHUNK + crypto.StreamDecryptor.INTO_SLACK, dtype=np.uint8)
        fh, dec = self._open_part(rec, part)
        pos = 0
        with fh:
            try:
                while chunk := fh.read(crypto.IO_CHUNK):
                    pos += dec.update_into(chunk, buf[pos:])
                    if pos > size:
                        raise self._corrupted(rec, part, "is longer than recorded")
                tail = dec.finalize()
            except DecryptionFailed:
                raise self._corrupted(
                    rec, part, "failed authentication (modified, damaged or swapped)"
                ) from None
        buf[pos : pos + len(tail)] = np.frombuffer(tail, dtype=np.uint8)
        pos += len(tail)
        if pos != size:
            raise self._corrupted(rec, part, "does not match the index")
        return memoryview(buf)[:size]

    def open_item(self, item_id: str, *, as_float32: bool = True, with_tissue: bool = False) -> OpenedVolume:
        """Decrypt an item's volume into memory (nothing is written to disk). Recorded as a view.

        Args:
            item_id: Item id or unique prefix.
            as_float32: Return float32 voxels (scaling applied); otherwise nibabel's view of the stored
                values (the stored dtype when the file has no scaling).
            with_tissue: Also decrypt its tissue maps into :attr:`OpenedVolume.tissue` (see
                :meth:`open_tissue`).

        Raises:
            VaultCorrupted: The item failed authentication (no data is returned).
        """
        with self._op():
            rec = self._record(item_id)
            names = tissue_names(rec) if with_tissue else ()
            self._audit_write("view", rec["id"], {"tissue": list(names)} if names else {})
            volume = next(p for p in rec["parts"] if p["name"] == "volume")
            raw = self._read_part(rec, volume)
            data, _ = nifti.load(raw, compressed=bool(rec["volume"].get("compressed")), as_float32=as_float32)
            del raw
            tissue = self._read_tissue(rec, names)
            # The index holds the affine at full precision (NIfTI-1 stores the sform as float32); for a NIfTI
            # import it is exactly what nibabel reads from the file.
            affine = np.array(rec["volume"]["affine"], dtype=np.float64)
            return opened_volume(data, affine, ItemInfo.from_record(rec), tissue)

    def open_tissue(self, item_id: str, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Decrypt a generated item's tissue maps into memory (nothing is written to disk). Recorded as a
        view.

        Args:
            item_id: Item id or unique prefix.
            names: The maps wanted (e.g. ``["GM"]``); None for all of them.

        Returns:
            Name -> float32 (x, y, z) on the grid of the item's volume (same affine), in stored order; empty
            for an item without maps.

        Raises:
            InvalidRequest: The item has no map of a name asked for.
            VaultCorrupted: A map failed authentication (no data is returned).
        """
        with self._op():
            rec = self._record(item_id)
            stored = tissue_names(rec)
            wanted = stored if names is None else tuple(str(n) for n in names)
            missing = [n for n in wanted if n not in stored]
            if missing:
                have = ", ".join(stored) if stored else "none"
                raise InvalidRequest(
                    f"item {rec['id'][:12]} has no tissue map {missing[0]!r} (its tissue maps: {have})"
                )
            if not wanted:
                return {}
            self._audit_write("view", rec["id"], {"tissue": list(wanted)})
            return self._read_tissue(rec, wanted)

    def _read_tissue(self, rec: dict, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Decrypt and parse the named tissue parts of an item; all of them or none (raises)."""
        out = {}
        for name in names:
            part = next(p for p in rec["parts"] if p["name"] == TISSUE_PART_PREFIX + name)
            raw = self._read_part(rec, part)
            out[name], _ = nifti.load(raw, compressed=bool(part.get("compressed")), as_float32=True)
            del raw
        return out

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
        """Write an item out as NIfTI (and its original DICOM files, if it came from DICOM).

        File names never carry identifiers: ``<kind>-<id prefix>.nii[.gz]``, a ``<kind>-<id prefix>-dicom``
        folder of ``IM00001.dcm``.... Without de-identification the NIfTI and DICOM files of a scan are
        byte-identical to what was imported; a de-identified NIfTI always leaves as ``.nii.gz``. A synthetic item always leaves as ``.nii.gz`` with every
        SYNTHETIC field that ``volsynth generate`` writes (``descrip``, ``intent_name``, ``aux_file``, a
        comment extension) and its provenance in the same ``<stem>.json`` sidecar, so opening the export
        shows its provenance; its tissue maps, if it has any, go beside it as
        ``<stem>_label-<name>_probseg.nii.gz`` (``engine.nifti.io.tissue_path``), marked the same way, and
        the sidecar lists them (``"tissue_maps": {name: file name}``). A provenance naming a template
        ``space`` sets the sform code of every file (4 for MNI152). Recorded in the audit trail. While it
        runs, an encrypted note in the vault folder says where its partial files are; if the process is
        killed, the next unlock removes them.

        Args:
            item_id: Item id or unique prefix.
            dest_dir: Destination folder (created if needed).
            deidentify: Clear NIfTI free-text fields and extensions; de-identify DICOM files with the
                PS3.15 Annex E basic profile. Synthetic volumes stay marked SYNTHETIC.
            include_dicom: Also write the original DICOM files (DICOM items only).
            overwrite: Replace existing files instead of refusing.
            progress: Called with (bytes done, bytes total).

        Raises:
            OutputError: The destination cannot be written, or files exist and ``overwrite`` is False.
            VaultCorrupted: The item failed authentication; nothing is left at the destination.
        """
        dest = Path(dest_dir).expanduser()
        with self._op():
            rec = self._record(item_id)
            synthetic = rec["kind"] == "synthetic"
            compressed = bool(rec["volume"].get("compressed"))
            stem = f"{rec['kind']}-{rec['id'][:12]}"
            # A de-identified copy is a new file anyway (its header is rewritten), so it leaves compressed:
            # what is shared is smaller. Only a plain export keeps the imported bytes (and suffix) as they are.
            gzip_output = deidentify and not compressed and not synthetic
            nii_path = dest / (stem + (".nii.gz" if compressed or synthetic or gzip_output else ".nii"))
            dicom_parts = [p for p in rec["parts"] if p["name"].startswith("dicom/")] if include_dicom else []
            dicom_dir = dest / f"{stem}-dicom"
            prov_path = dest / f"{stem}.json"  # engine.nifti.io.sidecar_path: what load_nifti reads back
            tissue_parts = (
                [p for p in rec["parts"] if p["name"].startswith(TISSUE_PART_PREFIX)] if synthetic else []
            )
            map_paths = [tissue_path(nii_path, p["name"][len(TISSUE_PART_PREFIX) :]) for p in tissue_parts]
            targets = (
                [nii_path, *map_paths]
                + ([dicom_dir] if dicom_parts else [])
                + ([prov_path] if synthetic else [])
            )
            if not overwrite and (clash := [str(t) for t in targets if t.exists()]):
                raise OutputError(f"{clash[0]} already exists; choose another folder or allow overwriting")
            try:
                dest.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OutputError(f"cannot create {dest}: {exc.strerror}") from exc

            detail = {
                "folder": str(dest.absolute()),
                "deidentified": deidentify,
                "dicom_files": len(dicom_parts),
            }
            if tissue_parts:
                detail["tissue_maps"] = len(tissue_parts)
            self._audit_write("export", rec["id"], detail)
            total = sum(
                int(p["size"])
                for p in rec["parts"]
                if p["name"] == "volume" or p in dicom_parts or p in tissue_parts
            )
            done = 0
            written: list[Path] = []
            warnings: list[str] = []
            record = {**(rec.get("provenance") or {}), "synthetic": True} if synthetic else None
            space = _space(record)
            if record is not None:
                # The maps that leave with the image, under the names they get here (an imported file's
                # provenance names the files it was imported with).
                record.pop("tissue_maps", None)
                if tissue_parts:
                    record["tissue_maps"] = {
                        p["name"][len(TISSUE_PART_PREFIX) :]: path.name
                        for p, path in zip(tissue_parts, map_paths, strict=True)
                    }
            # Everything is written into a hidden staging folder in ``dest`` and moved into place only once
            # all of it is there (one rename per target; the DICOM folder moves whole), so a killed export
            # leaves no partial set among the user's files; the next unlock removes the staging folder.
            pending = self._pending_export([dest], targets=targets, overwrite=overwrite)
            prefix = pending.__enter__()
            staging = dest / f"{prefix}{STAGING_NAME}"
            staged_nii = staging / nii_path.name
            staged_maps = [staging / m.name for m in map_paths]
            staged_dicom = staging / dicom_dir.name
            staged_prov = staging / prov_path.name
            try:
                try:
                    staging.mkdir(mode=0o700)
                    if dicom_parts:
                        staged_dicom.mkdir()
                except OSError as exc:
                    raise OutputError(f"cannot write in {dest}: {exc.strerror}") from exc
                volume = next(p for p in rec["parts"] if p["name"] == "volume")
                with AtomicWriter(staged_nii, prefix=prefix, output=True) as writer:
                    stream = self._iter_part(rec, volume)
                    if progress is not None:
                        stream = _counting(stream, progress, done, total)
                    if synthetic:
                        pieces = synthetic_marks.export_stream(
                            stream,
                            compressed=compressed,
                            deidentify=deidentify,
                            provenance=record,
                            space=space,
                        )
                    else:
                        pieces = nifti.rewrite_stream(
                            stream, compressed=compressed, deidentify=deidentify, synthetic=False
                        )
                        if gzip_output:
                            pieces = nifti.gzip_stream(pieces)
                    for piece in pieces:
                        writer.write(piece)
                done += int(volume["size"])
                for part, staged_map in zip(tissue_parts, staged_maps, strict=True):
                    # Each map carries the image's provenance naming the map, as save_result writes it.
                    map_record = {
                        **(record or {}),
                        "tissue_map": part["name"][len(TISSUE_PART_PREFIX) :],
                        "image": nii_path.name,
                    }
                    with AtomicWriter(staged_map, prefix=prefix, output=True) as writer:
                        stream = self._iter_part(rec, part)
                        if progress is not None:
                            stream = _counting(stream, progress, done, total)
                        for piece in synthetic_marks.export_stream(
                            stream,
                            compressed=bool(part.get("compressed")),
                            deidentify=deidentify,
                            provenance=map_record,
                            space=space,
                        ):
                            writer.write(piece)
                    done += int(part["size"])
                uids = deid.UidMapper()
                for n, part in enumerate(dicom_parts, start=1):
                    raw = bytes(self._read_part(rec, part))
                    if deidentify:
                        raw, found = deid.deidentify_dicom(raw, uids)
                        warnings.extend(w for w in found if w not in warnings)
                    target = staged_dicom / f"IM{n:05d}.dcm"
                    write_atomic(target, raw, prefix=prefix, output=True, sync_dir=False)
                    done += int(part["size"])
                    if progress is not None:
                        progress(done, total)
                if dicom_parts:
                    fsync_dir(staged_dicom)
                if synthetic:  # the provenance sidecar every route writes (engine.nifti.io.save_volume)
                    write_atomic(staged_prov, provenance_sidecar(record), prefix=prefix, output=True)
                fsync_dir(staging)
                # Into place: the NIfTI last, so that whatever is in place without it is what a crash in
                # these few renames left (and the next unlock removes it, see _clean_stale_exports).
                moves = [(staged_dicom, dicom_dir)] if dicom_parts else []
                moves += list(zip(staged_maps, map_paths, strict=True))
                moves += [(staged_prov, prov_path)] if synthetic else []
                moves += [(staged_nii, nii_path)]
                for src, dst in moves:
                    _move_into_place(src, dst)
                    written.append(dst)
                fsync_dir(dest)
                with contextlib.suppress(OSError):
                    staging.rmdir()
            except BaseException:
                if not overwrite:  # moved targets did not exist before this export
                    for path in written:
                        with contextlib.suppress(OSError):
                            shutil.rmtree(path) if path.is_dir() else path.unlink()
                shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                pending.__exit__(None, None, None)
            files = [nii_path, *map_paths]
            files += [dicom_dir / f"IM{n:05d}.dcm" for n in range(1, len(dicom_parts) + 1)]
            files += [prov_path] if synthetic else []
            return ExportResult(files=tuple(files), deidentified=deidentify, warnings=tuple(warnings))

    # -- changes ----------------------------------------------------------------------------------------
    def delete(self, item_id: str) -> None:
        """Delete an item and its encrypted files. Recorded in the audit trail."""
        with self._op(), self._writing():
            assert self._index is not None
            rec = self._record(item_id)
            index = copy.deepcopy(self._index)
            del index["items"][rec["id"]]
            self._commit("delete", rec["id"], {"kind": rec["kind"]}, index)
            # The user asked for this item's files to go; nothing else is ever deleted.
            self._unlink_records(rec["id"])
            for part in rec["parts"]:
                with contextlib.suppress(FileNotFoundError):
                    (self._blob_dir() / f"{part['blob']}{BLOB_SUFFIX}").unlink()
            fsync_dir(self._blob_dir())

    def update_item(
        self,
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
        with self._op(), self._writing():
            assert self._index is not None
            rec = copy.deepcopy(self._record(item_id))
            changed = []
            if label is not None:
                if not str(label).strip():
                    raise InvalidRequest("the label cannot be empty")
                rec["label"] = str(label).strip()
                changed.append("label")
            if patient is not None:
                patient = _json_dict(patient, "patient metadata")
                refuse_patient_if_synthetic(rec["kind"], patient)
                rec["patient"] = patient
                changed.append("patient")
            if study is not None:
                rec["study"] = _json_dict(study, "study metadata")
                changed.append("study")
            _check_dates(rec)
            if not changed:
                return ItemInfo.from_record(rec)
            rec["modified"] = _now_iso()
            self._write_record(rec)
            fsync_dir(self._blob_dir())
            index = copy.deepcopy(self._index)
            index["items"][rec["id"]] = rec
            self._commit("edit", rec["id"], {"fields": changed}, index)
            return ItemInfo.from_record(rec)

    def rekey(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None, progress=None):
        """Re-encrypt everything under a new master key and passphrase (see :mod:`engine.vault.rekey`)."""
        from engine.vault.rekey import rekey

        return rekey(self, old, new, kdf=kdf, progress=progress)

    def change_passphrase(self, old: str | bytes, new: str | bytes, *, kdf: KdfParams | None = None) -> None:
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
        with self._op(), self._writing():
            assert self._keys is not None
            header = _Header.read(self.path)
            kek = crypto.derive_kek(old_pw, header.salt, header.kdf)
            try:
                master = crypto.unwrap_key(kek, header.wrap_nonce, header.wrapped_key, header.aad())
            except DecryptionFailed:
                AuditLog.record_failed_unlock(self.path)
                raise VaultLocked("the current passphrase is wrong; the passphrase was not changed") from None
            if not hmac.compare_digest(master, bytes(self._keys.master)):
                raise VaultCorrupted("the vault header no longer matches this vault's key")
            salt = os.urandom(crypto.SALT_BYTES)
            draft = _Header(header.vault_id, header.created, kdf, salt, b"", b"")
            nonce, wrapped = crypto.wrap_key(crypto.derive_kek(new_pw, salt, kdf), master, draft.aad())
            new_header = _Header(header.vault_id, header.created, kdf, salt, nonce, wrapped)
            # Audit entry (naming the new header) -> header -> index recording the header's hash: restoring
            # the old vault.json later no longer matches the index (see _rollback_problems).
            self._header = new_header
            try:
                self._commit(
                    "passphrase_changed",
                    None,
                    {"kdf": kdf.to_dict(), "header_sha256": _sha256(new_header.to_bytes())},
                    copy.deepcopy(self._index),
                    before_index=lambda: write_atomic(self.path / HEADER_NAME, new_header.to_bytes()),
                )
            except BaseException:
                with contextlib.suppress(VaultError):
                    self._header = _Header.read(self.path)
                raise

    # -- checking ---------------------------------------------------------------------------------------
    def verify(
        self,
        item_ids: Sequence[str] | None = None,
        *,
        check_audit: bool = True,
        progress: Progress | None = None,
    ) -> VerifyReport:
        """Authenticate every byte of every item (or of the given items) and check the audit chain.

        Never raises for tampering: every problem found is listed in the report, naming the item.

        Args:
            item_ids: Items to check (ids or prefixes); None for all.
            check_audit: Also check the audit trail's chain.
            progress: Called with (bytes done, bytes total).
        """
        with self._op():
            assert self._index is not None
            assert self._keys is not None
            problems: list[str] = []
            notes: list[str] = []
            rolled_back: list[str] = []
            try:
                header = _Header.read(self.path)
                if header.vault_id != self._header.vault_id:
                    problems.append("the vault header belongs to another vault")
                else:
                    on_disk, _ = self._read_index(self._keys)
                    rolled_back = self._rollback_problems(on_disk, header.to_bytes())
                    problems.extend(rolled_back)
            except VaultError as exc:
                problems.append(str(exc))
            records = (
                list(self._index["items"].values())
                if item_ids is None
                else [self._record(i) for i in item_ids]
            )
            total = sum(int(p["size"]) for rec in records for p in rec["parts"])
            done = 0
            checked = 0
            without_copy = 0
            for rec in records:
                record_problems, copy_absent = self._record_problems(rec)
                problems.extend(record_problems)
                without_copy += copy_absent
                try:
                    for part in rec["parts"]:
                        for piece in self._iter_part(rec, part, check_hash=True):
                            done += len(piece)
                            if progress is not None:
                                progress(done, total)
                    checked += 1
                except VaultCorrupted as exc:
                    problems.append(str(exc))
            if self._anchor.problem:
                problems.append(f"rollback detection is weakened: {self._anchor.problem}")
            if without_copy:
                notes.append(
                    f"{without_copy} item(s) lack one or both record files (a vault made by an older VolSynth); "
                    "`volsynth vault repair` writes them, and from then on a missing one is a problem"
                )
            orphans = self._orphan_blobs() if item_ids is None else []
            if orphans:
                notes.append(
                    f"{len(orphans)} encrypted file(s) in {self._blob_dir()} are not in the index (left by an "
                    "interrupted import, or items an older index forgot); they are kept: "
                    "`volsynth vault repair` re-indexes those whose record still authenticates"
                )
            audit_entries = 0
            if check_audit:
                chk = self._audit.check()
                problems.extend(chk.problems)
                audit_entries = len(chk.entries)
            with contextlib.suppress(VaultError):
                self._audit_write("verify", None, {"ok": not problems, "items": len(records)})
            return VerifyReport(
                ok=not problems,
                items_checked=checked,
                bytes_checked=done,
                audit_entries=audit_entries,
                problems=tuple(problems),
                notes=tuple(notes),
                unreferenced=tuple(p.name for p in orphans),
                rolled_back=tuple(rolled_back),
            )

    def repair(self, *, dry_run: bool = False, remove_leftovers: bool = False) -> RepairReport:
        """Accept the vault as it is now and put back into the index every item whose files are still there.

        The explicit answer to a rollback (or to unreferenced files): an unreferenced item record that
        authenticates, whose parts all exist and authenticate end to end, and which the audit trail does not
        show as deleted, is re-indexed. Nothing is deleted. The index gets a generation above every one seen,
        and the anchor is reset to the vault's present state, so the rollback is no longer reported (the
        repair itself is in the audit trail, naming what was accepted).

        Args:
            dry_run: Only report what would be done.
            remove_leftovers: Also delete the files nothing can bring back: those of items the audit trail
                shows deleted (a delete interrupted after its commit) and payloads that no record names (an
                import interrupted before its record, or items of a vault made before records existed). Not
                done while any record fails to authenticate: its payloads could come back with it.
        """
        with self._op(), self._writing(repairing=True):
            assert self._keys is not None and self._index is not None
            header_bytes = _Header.read(self.path).to_bytes()
            accepted = self._rollback_problems(self._index, header_bytes)
            scan = self._audit.scan(after_seq=0)
            deleted = {e.item_id for e in scan.after if e.event == "delete" and e.item_id}
            index = copy.deepcopy(self._index)
            reindexed: list[tuple[str, str]] = []
            skipped: list[str] = []
            claimed: set[str] = set()
            leftovers: list[Path] = []
            unreadable_record = False
            orphan_ids = sorted(
                {
                    p.name[: -len(suffix)]
                    for p in self._orphan_blobs()
                    for suffix in (RECORD_SUFFIX, RECORD_COPY_SUFFIX)
                    if p.name.endswith(suffix)
                }
            )
            for item_id in orphan_ids:
                path = self._record_path(item_id)
                try:
                    rec = self._read_record(item_id)
                except VaultCorrupted as exc:
                    skipped.append(f"{path.name}: {exc}")
                    unreadable_record = True
                    continue
                blobs = [f"{p['blob']}{BLOB_SUFFIX}" for p in rec["parts"]]
                if item_id in deleted:
                    skipped.append(
                        f"{path.name} and its {len(blobs)} payload file(s): item {item_id} was deleted"
                    )
                    claimed.update(blobs)
                    leftovers += [
                        path,
                        self._record_copy_path(item_id),
                        *(self._blob_dir() / b for b in blobs),
                    ]
                    continue
                try:
                    for part in rec["parts"]:
                        for _piece in self._iter_part(rec, part, check_hash=True):
                            pass
                except VaultCorrupted as exc:
                    skipped.append(f"{path.name}: {exc}")
                    continue
                claimed.update(blobs)
                index["items"][item_id] = rec
                reindexed.append((item_id, rec.get("label", "")))
            for path in self._orphan_blobs():
                if path.name.endswith(BLOB_SUFFIX) and path.name not in claimed:
                    skipped.append(f"{path.name}: no authentic record names it")
                    leftovers.append(path)
            if not remove_leftovers or unreadable_record:
                leftovers = []
            # Records of indexed items that are missing, damaged, swapped or stale are rewritten from the
            # index (the index is the commit point; the records are its copies for re-indexing).
            missing = [rid for rid, rec in index["items"].items() if self._records_need_writing(rec)]
            if not missing and index.get("record_copies") != 2 and not dry_run:
                index["record_copies"] = 2  # (committed below only if something else changes)
            report = RepairReport(
                dry_run=dry_run,
                reindexed=tuple(reindexed),
                accepted=tuple(accepted),
                skipped=tuple(
                    s for s in skipped if not leftovers or not any(s.startswith(p.name) for p in leftovers)
                ),
                records_written=len(missing),
                removed=tuple(p.name for p in leftovers if p.exists()),
            )
            if dry_run or not report.changed:
                return report
            for rid in missing:
                self._write_record(index["items"][rid])
            index["record_copies"] = 2
            fsync_dir(self._blob_dir())
            seen = [
                int(e.detail["generation"]) for e in scan.after if isinstance(e.detail.get("generation"), int)
            ]
            anchor = self._anchor.read()
            generation = 1 + max(
                [int(self._index.get("generation", 0)), *seen, anchor.generation if anchor else 0]
            )
            self._commit(
                "repair",
                None,
                {
                    "reindexed": [rid for rid, _ in reindexed],
                    "accepted": list(accepted),
                    "removed": len(report.removed),
                },
                index,
                generation=generation,
            )
            for name in report.removed:  # asked for explicitly, and recorded in the audit entry above
                with contextlib.suppress(FileNotFoundError):
                    (self._blob_dir() / name).unlink()
            if report.removed:
                fsync_dir(self._blob_dir())
            assert self._audit.last_appended is not None
            self._rolled_back = []
            seq, mac = self._audit.last_appended
            self._anchor.reset(AnchorState(generation, seq, mac.hex()))
            return report

    def _records_need_writing(self, rec: dict) -> bool:
        for path in (self._record_path(rec["id"]), self._record_copy_path(rec["id"])):
            try:
                if self._read_record_file(path, rec["id"]) != rec:
                    return True
            except VaultCorrupted:
                return True
        return False

    def audit_trail(self) -> AuditTrail:
        """The decrypted audit trail, with any tampering found in it."""
        with self._op():
            chk = self._audit.check()
            return AuditTrail(entries=tuple(chk.entries), problems=tuple(chk.problems))


@contextlib.contextmanager
def _reading(path: Path) -> Iterator:
    """Open a source file for import; a read error is the user's to fix, so it becomes InvalidRequest."""
    from engine.nifti.checks import open_regular_file

    fh = open_regular_file(path)  # a FIFO named like a scan must not block the import forever
    try:
        with fh:
            yield fh
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        raise InvalidRequest(f"cannot read {path}: {exc.strerror}") from exc


def _move_into_place(src: Path, dst: Path) -> None:
    """Rename a staged export file or folder to its target (replacing it: the caller checked overwrite)."""
    try:
        if src.is_dir() and dst.is_dir():
            shutil.rmtree(dst)
        os.replace(src, dst)
    except OSError as exc:
        raise OutputError(f"cannot move the export into place at {dst}: {exc.strerror}") from exc


def _counting(stream: Iterator[bytes], progress: Progress, start: int, total: int) -> Iterator[bytes]:
    done = start
    for piece in stream:
        done += len(piece)
        progress(done, total)
        yield piece
