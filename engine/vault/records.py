"""Plain result types of the vault API (no Qt, no I/O): what the app shows and the CLI prints."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import InvalidRequest
from engine.nifti.volume import Volume, provenance_space
from engine.vault.audit import AuditEntry

KINDS = ("scan", "synthetic")
#: Parts named ``tissue/<name>`` hold a synthetic item's tissue maps (float32 NIfTI on the image's grid).
TISSUE_PART_PREFIX = "tissue/"


def refuse_patient_if_synthetic(kind: str, patient, *, reason: str = "") -> None:
    """The one place of the rule "a synthetic volume has no patient": raises InvalidRequest when patient
    details come with a synthetic item (import, a later edit, or the app's import before it encrypts).

    ``reason`` (e.g. which SYNTHETIC mark the file carries) is put before the rule in the message."""
    if kind == "synthetic" and patient:
        rule = (
            "a synthetic volume has no patient (it cannot be filed as a patient scan); "
            "leave out the patient details"
        )
        raise InvalidRequest(f"{reason}: {rule}" if reason else rule)


def tissue_names(rec: dict) -> tuple[str, ...]:
    """The names of the tissue maps an item record holds, in the order they were stored."""
    return tuple(
        p["name"][len(TISSUE_PART_PREFIX) :] for p in rec["parts"] if p["name"].startswith(TISSUE_PART_PREFIX)
    )


@dataclass(frozen=True)
class ItemInfo:
    """What the vault knows about one item (decrypted from the index; never touches payloads).

    Attributes:
        id: Random 32-hex-digit id; the CLI accepts any unique prefix.
        kind: ``"scan"`` (a real patient scan) or ``"synthetic"`` (a generated volume).
        label: Display name.
        created: When it was imported (UTC, ISO 8601).
        source: ``"nifti"``, ``"dicom"`` (a series; the original files are kept too) or ``"array"``
            (generated in this app).
        patient: Patient attributes, e.g. ``name``, ``id``, ``birth_date``, ``sex`` (scans only).
        study: Study/series attributes, e.g. ``date``, ``description``, ``modality``.
        provenance: How a synthetic volume was made (model, seed, settings...); None for scans.
        shape: Voxel array shape.
        dtype: Stored data type.
        affine: Voxel -> RAS mm, 4x4, as nested tuples.
        compressed: Stored as .nii.gz.
        size_bytes: Plaintext bytes stored (volume plus any DICOM files and tissue maps).
        dicom_files: Number of original DICOM files kept.
        original_name: File or folder name it was imported from.
        tissue_maps: Names of the tissue maps stored with a generated volume (e.g. ``("GM", "WM", "CSF",
            "ventricles")``), in the model's channel order; empty when it has none.
    """

    id: str
    kind: str
    label: str
    created: str
    source: str
    patient: dict
    study: dict
    provenance: dict | None
    shape: tuple[int, ...]
    dtype: str
    affine: tuple[tuple[float, ...], ...]
    compressed: bool
    size_bytes: int
    dicom_files: int
    original_name: str
    tissue_maps: tuple[str, ...] = ()

    @property
    def is_synthetic(self) -> bool:
        return self.kind == "synthetic"

    @classmethod
    def from_record(cls, rec: dict) -> ItemInfo:
        vol = rec["volume"]
        return cls(
            id=rec["id"],
            kind=rec["kind"],
            label=rec.get("label", ""),
            created=rec["created"],
            source=rec["source"],
            patient=copy.deepcopy(rec.get("patient") or {}),
            study=copy.deepcopy(rec.get("study") or {}),
            provenance=copy.deepcopy(rec.get("provenance")),
            shape=tuple(vol["shape"]),
            dtype=vol["dtype"],
            affine=tuple(tuple(row) for row in vol["affine"]),
            compressed=bool(vol.get("compressed", False)),
            size_bytes=sum(int(p["size"]) for p in rec["parts"]),
            dicom_files=sum(1 for p in rec["parts"] if p["name"].startswith("dicom/")),
            original_name=rec.get("original_name", ""),
            tissue_maps=tissue_names(rec),
        )


#: What :meth:`Vault.open_item` returns: the engine's one volume record (``engine.nifti.volume.Volume``),
#: with the item's :class:`ItemInfo` in ``info``. The name stays for the vault's callers.
OpenedVolume = Volume


def opened_volume(
    data: np.ndarray, affine: np.ndarray, info: ItemInfo, tissue: dict[str, np.ndarray]
) -> Volume:
    """The record of an item decrypted into memory: voxels as stored (float32 unless ``as_float32=False``),
    the index's float64 affine, its tissue maps when asked for, and what the index says of it."""
    provenance = dict(info.provenance or {})
    return Volume(
        data=data,
        affine=affine,
        tissue=tissue,
        provenance=provenance,
        synthetic=info.kind == "synthetic",
        space=provenance_space(provenance),
        description=info.label,
        info=info,
    )


@dataclass(frozen=True)
class ExportResult:
    """What :meth:`Vault.export` wrote.

    Attributes:
        files: Every file written (NIfTI first, then DICOM files or tissue maps, then a provenance
            sidecar).
        deidentified: Whether de-identification was applied.
        warnings: Things de-identification could not fix (e.g. burned-in annotations).
    """

    files: tuple[Path, ...]
    deidentified: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`Vault.verify`.

    Attributes:
        ok: No problem found.
        items_checked: Items fully decrypted and checked.
        bytes_checked: Plaintext bytes authenticated.
        audit_entries: Audit entries whose chain was checked (0 when the audit trail was not checked).
        problems: One line per problem; an item's problem names its id; a rolled-back file is named.
        notes: Harmless findings.
        unreferenced: Encrypted files in ``blobs/`` the index does not reference (never deleted
            automatically; ``repair`` re-indexes the items whose record still authenticates).
        rolled_back: What was found rolled back (also in ``problems``).
    """

    ok: bool
    items_checked: int
    bytes_checked: int
    audit_entries: int
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    unreferenced: tuple[str, ...] = ()
    rolled_back: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepairReport:
    """What :meth:`Vault.repair` did (or, with ``dry_run``, would do).

    Attributes:
        dry_run: Nothing was changed.
        reindexed: (item id, label) of the items put back into the index.
        accepted: The rollbacks accepted (the vault is taken as it is now).
        skipped: Unreferenced files left alone, each with the reason (no authentic record, a part
            missing or damaged, deleted according to the audit trail).
        records_written: Items whose record files were rewritten from the index (missing, damaged, swapped,
            stale, or the second copy of a vault made before there were two).
        removed: Files removed because ``remove_leftovers`` was asked: those of items the audit trail shows
            deleted, and payloads no record names (with ``dry_run``: what would be removed).
    """

    dry_run: bool
    reindexed: tuple[tuple[str, str], ...] = ()
    accepted: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    records_written: int = 0
    removed: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.reindexed or self.accepted or self.records_written or self.removed)


@dataclass(frozen=True)
class AuditTrail:
    """The decrypted audit trail and any tampering found in it.

    Attributes:
        entries: Entries in order (those that could be decrypted).
        problems: Edits, removals or truncation found; empty when the chain is intact.
    """

    entries: tuple[AuditEntry, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems
