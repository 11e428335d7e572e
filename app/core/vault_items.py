"""Qt-free model of the vault browser: rows of items, labels, date checks, import jobs (the vault UI views it),
and every function the vault's background tasks run.

Nothing here imports Qt. The work functions (``create_vault``, ``import_batch``, ``open_for_session``, ...) are
the one home of what ``app.vault`` runs in a worker thread (``Worker.reporting_call``); each takes the vault (or
what opens one) and ends with ``report(fraction, text)``, a callable that raises ``Cancelled`` when the user
cancelled, so cancelling interrupts the engine's streaming at its next chunk and the engine cleans up.
``engine.vault`` is imported inside them, on first use, not at the app's start-up.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.core.tissue import ordered_names
from app.core.tissue_source import contrast_for, segment_session_volume
from engine.errors import Cancelled, DuplicateItem, EngineError, InvalidRequest, VaultLocked
from engine.formatting import format_bytes
from engine.nifti.io import is_nifti
from engine.nifti.volume import Volume
from engine.vault.records import refuse_patient_if_synthetic

Report = Callable[[float | None, str], None]
"""Progress for the UI: (fraction done 0..1, or None when unknown; one line of text). May raise Cancelled."""

COLUMNS = ("Patient", "Study", "Date", "Kind", "Label")
KIND_TITLES = {"scan": "Scan", "synthetic": "Synthetic"}


# -- how an item reads ------------------------------------------------------------------------------------


def person_name(value: str) -> str:
    """A DICOM person name (``Family^Given^Middle``) as people write it: ``Family, Given Middle``."""
    parts = [p.strip() for p in str(value).split("=")[0].split("^")]
    family, given = parts[0], " ".join(p for p in parts[1:] if p)
    return f"{family}, {given}" if family and given else family or given


def dicom_date(value: str) -> str:
    """``20240131`` -> ``2024-01-31``; other text unchanged."""
    text = str(value).strip()
    if len(text) == 8 and text.isdigit():
        return f"{text[:4]}-{text[4:6]}-{text[6:]}"
    return text


def local_date(iso: str) -> str:
    """An ISO 8601 timestamp (UTC) as the local calendar date."""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d")
    except (TypeError, ValueError):
        return str(iso)[:10]


def item_patient(info) -> str:
    if info.kind == "synthetic":
        return "\u2014"  # no patient: generated
    name = person_name(info.patient.get("name", ""))
    return name or info.patient.get("id", "") or "\u2014"


def item_study(info) -> str:
    if info.kind == "synthetic":
        prov = info.provenance or {}
        model = prov.get("model")
        model_id = model.get("id") if isinstance(model, Mapping) else prov.get("model_id")
        bits = [str(model_id) if model_id else "generated"]
        if prov.get("seed") is not None:
            bits.append(f"seed {prov['seed']}")
        return " \u00b7 ".join(bits)
    study = info.study
    description = study.get("description") or study.get("series_description") or ""
    modality = study.get("modality") or ""
    if description and modality and modality.lower() not in description.lower():
        return f"{modality} \u00b7 {description}"
    return description or modality or "\u2014"


def item_date(info) -> str:
    """The study date when the item has one, else the date it entered the vault."""
    date = info.study.get("date") if info.kind == "scan" else None
    return dicom_date(date) if date else local_date(info.created)


def item_row(info) -> tuple[str, str, str, str, str]:
    """The table's cells, in ``COLUMNS`` order."""
    return (
        item_patient(info),
        item_study(info),
        item_date(info),
        KIND_TITLES.get(info.kind, info.kind),
        info.label or "\u2014",
    )


#: The vault views' name for the engine's one byte formatter (``model.format_size`` in the browser and the
#: controller); kept as a name only, the formatting is engine.formatting's.
format_size = format_bytes


def item_details(info) -> str:
    """A few plain-text lines for the table's tooltip."""
    shape = " x ".join(str(s) for s in info.shape)
    lines = [
        info.label or "(no label)",
        f"{KIND_TITLES.get(info.kind, info.kind)} \u00b7 {shape} voxels "
        f"\u00b7 {format_size(info.size_bytes)}",
    ]
    if info.kind == "scan":
        patient = info.patient
        who = [
            person_name(patient["name"]) if patient.get("name") else "",
            f"ID {patient['id']}" if patient.get("id") else "",
            f"born {dicom_date(patient['birth_date'])}" if patient.get("birth_date") else "",
        ]
        if any(who):
            lines.append("Patient: " + ", ".join(w for w in who if w))
    maps = tuple(getattr(info, "tissue_maps", ()) or ())
    if maps:
        lines.append(f"Tissue maps: {', '.join(ordered_names(maps))}")
    space = (info.provenance or {}).get("space") if info.kind == "synthetic" else None
    if isinstance(space, str) and space:
        lines.append(f"Space: {space}")
    if info.source == "dicom":
        lines.append(f"From a DICOM series ({info.dicom_files} original files kept)")
    elif info.original_name:
        lines.append(f"Imported from {info.original_name}")
    lines.append(f"Added {local_date(info.created)} \u00b7 id {info.id[:12]}")
    return "\n".join(lines)


def label_problems(problems: Iterable[str], items: Iterable) -> list[str]:
    """Prefix each problem that names an item id with that item's label, so people know which one it is."""
    labels = {info.id: info.label for info in items}
    out = []
    for problem in problems:
        named = next((label for item_id, label in labels.items() if item_id in problem), None)
        out.append(f"\u201c{named}\u201d: {problem}" if named else problem)
    return out


# -- values that cross into the vault ---------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Provenance as plain JSON data: tuples become lists, numpy scalars numbers, NaN None, others text.

    The vault refuses values that would change in storage; session provenance carries tuples and numpy
    numbers, so it is normalised here once.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def clean_metadata(values: Mapping[str, str]) -> dict[str, str]:
    """Drop empty fields and surrounding spaces from what was typed in the import dialog."""
    return {k: v.strip() for k, v in values.items() if v and v.strip()}


# -- work run in a background thread ----------------------------------------------------------------------


@dataclass
class ImportJob:
    """One thing to import: a NIfTI file, or a DICOM series (folder, file or list of files)."""

    source: str | Path | list[Path]
    format: str = "nifti"  # "nifti" or "dicom"
    label: str | None = None
    patient: dict = field(default_factory=dict)
    study: dict = field(default_factory=dict)
    allow_duplicate: bool = False

    @property
    def name(self) -> str:
        if isinstance(self.source, list):
            return f"{len(self.source)} DICOM files" if len(self.source) != 1 else Path(self.source[0]).name
        return Path(self.source).name


@dataclass
class ImportReport:
    """What an import batch did: items added, per-source errors, the jobs refused as duplicates (with the
    engine's message), and whether the user stopped it."""

    imported: list = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    duplicates: list[tuple[ImportJob, str]] = field(default_factory=list)
    cancelled: bool = False
    total: int = 0


def synthetic_marks(path: str | Path):
    """VolSynth's SYNTHETIC marks on a NIfTI file (``engine.vault.synthetic.find_marks``): header fields,
    extensions, provenance sidecar. Reads the header only, never the voxels."""
    from engine.vault.synthetic import find_marks

    return find_marks(Path(path))


def synthetic_names(paths: Iterable[str | Path]) -> list[str]:
    """The names of the files among ``paths`` that VolSynth generated (they are stored as synthetic)."""
    return [Path(p).name for p in paths if is_nifti(p) and synthetic_marks(p).synthetic]


def check_date(text: str, what: str) -> str:
    """A date typed in a dialog (``YYYY-MM-DD``; empty is fine) as the vault stores it (``YYYYMMDD``).

    Raises:
        InvalidRequest: Not a real date, naming the field and the form to use.
    """
    if not text.strip():
        return ""
    from engine.vault.store import normalize_date

    return normalize_date(text, what)


def import_batch(vault, jobs: list[ImportJob], report: Report) -> ImportReport:
    """Import every job in turn; one failing file does not stop the others (a locked vault does)."""
    result = ImportReport(total=len(jobs))
    count = len(jobs)
    for index, job in enumerate(jobs):
        text = f"Encrypting {job.name}" + (f" ({index + 1} of {count})" if count > 1 else "")
        report(index / count, text)

        def progress(done: int, total: int, index=index, text=text) -> None:
            report((index + (done / total if total else 1.0)) / count, text)

        try:
            if job.format == "dicom":
                info = vault.import_dicom(job.source, label=job.label, progress=progress)
            else:
                if isinstance(job.source, list):  # only a DICOM series comes as a list of files
                    raise InvalidRequest(f"a NIfTI import is one file, not a list of {len(job.source)}")
                path = Path(job.source)
                marks = synthetic_marks(path)
                # the dialog says so too; refused with the reason before anything is encrypted
                kind = "synthetic" if marks.synthetic else "scan"
                refuse_patient_if_synthetic(kind, job.patient, reason=marks.reason(path))
                # The vault decides the kind from the marks: a generated volume stays synthetic.
                info = vault.import_nifti(
                    path,
                    label=job.label,
                    patient=job.patient,
                    study=job.study,
                    progress=progress,
                    allow_duplicate=job.allow_duplicate,
                )
        except Cancelled:
            result.cancelled = True
            break
        except VaultLocked:
            raise
        except DuplicateItem as exc:
            result.duplicates.append((job, f"{job.name}: {exc}"))
            continue
        except EngineError as exc:
            result.errors.append(f"{job.name}: {exc}")
            continue
        result.imported.append(info)
    if not result.cancelled:
        report(1.0, "Done")
    return result


def save_volume(vault, volume: Volume, label: str, allow_duplicate: bool, report: Report):
    """Store a session volume's record (``VolumeEntry.volume``: float32, marked SYNTHETIC) with its provenance
    and its tissue maps, as parts of the same item. Its provenance is made plain JSON first (``jsonable``) and
    says it is synthetic."""

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, f"Encrypting {label}")

    report(0.0, f"Encrypting {label}")
    stored = replace(volume, provenance=jsonable({**volume.provenance, "synthetic": True}))
    return vault.add_synthetic(stored, label=label, progress=progress, allow_duplicate=allow_duplicate)


def update_item(vault, item_id: str, details: dict, report: Report):
    """Change an item's label, patient and study details (``details`` as the details dialog gives them)."""
    report(None, "Saving the details")
    return vault.update_item(
        item_id, label=details.get("label"), patient=details.get("patient"), study=details.get("study")
    )


def to_session_volume(data: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the viewer expects, exactly as ``engine.nifti.io.load_nifti`` gives it for the same file:
    first volume of 4D data, reoriented to the closest canonical (RAS+) orientation, non-finite values zeroed.
    Done on an in-memory image: nothing decrypted is written anywhere."""
    import nibabel as nib

    from engine.nifti.io import canonical_volume

    return canonical_volume(
        nib.Nifti1Image(np.asarray(data), np.asarray(affine, dtype=np.float64)), "the item"
    )


def open_for_session(vault, item_id: str, report: Report):
    """Decrypt an item into memory and shape it for the viewer: the vault's volume record (its ``ItemInfo`` in
    ``info``), float32 (x, y, z) in RAS+ orientation, in memory only, its tissue maps reoriented with it."""
    report(None, "Decrypting")
    opened = vault.open_item(item_id, with_tissue=True)
    stored_affine = opened.affine
    opened.data, opened.affine = to_session_volume(opened.data, stored_affine)
    for name, array in list(opened.tissue.items()):  # stored on the volume's grid: reoriented as it is
        reoriented, _ = to_session_volume(array, stored_affine)
        opened.tissue[name] = np.clip(reoriented, 0.0, 1.0, out=reoriented)
    return opened


def export_item(
    vault,
    item_id: str,
    dest: Path,
    deidentify: bool,
    include_dicom: bool,
    include_tissue: bool,
    overwrite: bool,
    report: Report,
):
    label = vault.get(item_id).label

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, f"Exporting {label}")

    report(0.0, f"Exporting {label}")
    return vault.export(
        item_id,
        dest,
        deidentify=deidentify,
        include_dicom=include_dicom,
        include_tissue=include_tissue,
        overwrite=overwrite,
        progress=progress,
    )


def verify_all(vault, report: Report):
    """Authenticate every item and the audit trail; returns (report, the items for naming problems)."""
    items = vault.items()

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, "Checking every item")

    report(0.0, "Checking every item")
    return vault.verify(progress=progress), items


def list_items(vault, query: str, kind: str | None, report: Report) -> list:
    """The items matching the browser's search (``Vault.search``)."""
    return vault.search(query, kind=kind)


def delete_item(vault, item_id: str, report: Report) -> str:
    vault.delete(item_id)
    return item_id


# -- the vault itself: create, unlock, lock, passphrase, repair (run in a background thread) ---------------


def create_vault(path: Path, passphrase: str, kdf, idle_timeout_s: float | None, clock, report: Report):
    """A new vault in ``path``, unlocked (Argon2id runs here, not in the GUI thread)."""
    from engine.vault import Vault

    report(None, "Creating the vault")
    return Vault.create(path, passphrase, kdf=kdf, idle_timeout_s=idle_timeout_s, clock=clock)


def unlock_vault(vault, passphrase: str, report: Report):
    report(None, "Unlocking")
    vault.unlock(passphrase)
    return vault


def lock_vault(vault, report: Report) -> None:
    """Lock after the running tasks' current chunk (the vault serialises its operations)."""
    vault.lock()


def change_passphrase(vault, old: str, new: str, kdf, report: Report) -> None:
    """Re-wrap the vault's key under a new passphrase (fast); returns None, where ``rekey_vault`` reports."""
    report(None, "Changing the passphrase")
    vault.change_passphrase(old, new, kdf=kdf)


def rekey_vault(vault, old: str, new: str, kdf, report: Report):
    """Re-encrypt the whole vault under a new key (``engine.vault.rekey``), with progress; its ``RekeyReport``."""
    report(None, "Re-encrypting the vault")

    def progress(done: int, total: int) -> None:
        report(done / total if total else 1.0, "Re-encrypting the vault")

    return vault.rekey(old, new, kdf=kdf, progress=progress)


def plan_repair(path: Path, passphrase: str, idle_timeout_s: float | None, clock, report: Report) -> tuple:
    """Unlock a rolled-back vault for repair only and plan the repair (nothing is changed): (vault, plan)."""
    from engine.vault import Vault

    report(None, "Checking the vault")
    vault = Vault(path, idle_timeout_s=idle_timeout_s, clock=clock)
    vault.unlock(passphrase, allow_rollback=True)
    try:
        return vault, vault.repair(dry_run=True)
    except BaseException:
        vault.lock()
        raise


def repair_vault(vault, report: Report) -> tuple:
    """Carry out the repair planned by ``plan_repair``: (vault, report)."""
    report(None, "Repairing the vault")
    return vault, vault.repair()


# -- tissue maps kept with an item (run in a background thread) --------------------------------------------


def segment_vault_item(vault, item_id: str, contrast_choice: str, replace: bool, report: Report):
    """Segment a vault item and keep its maps with it, encrypted (``Vault.add_tissue_maps``; ``replace``: the
    segmented maps it has).

    The item is decrypted in memory only; it is segmented in RAS+ orientation (as the viewer shows it), and
    the maps are put back on the stored grid. Returns ``(ItemInfo, maps on the session grid, record)``."""
    report(None, "Decrypting")
    opened = vault.open_item(item_id)
    info = opened.info
    contrast, _note = contrast_for(opened.provenance, [info.original_name, info.label], contrast_choice)
    data, affine = to_session_volume(opened.data, opened.affine)

    def segmenting(fraction: float | None, text: str) -> None:  # the last tenth is storing the maps
        report(None if fraction is None else fraction * 0.9, text)

    maps, made = segment_session_volume(data, affine, contrast, segmenting)
    return keep_maps_in_vault(vault, item_id, opened.affine, maps, made, replace, report)


def keep_maps_in_vault(vault, item_id: str, stored_affine, maps, made: dict, replace: bool, report: Report):
    """Keep maps made on the session grid (RAS+, as the viewer holds the item) with the vault item, encrypted,
    put back on its stored grid (``stored_affine``: the same axis flips and swaps, reversed). Returns
    ``(ItemInfo, maps on the session grid, record)``."""
    import nibabel as nib

    ornt = nib.orientations.io_orientation(np.asarray(stored_affine, dtype=np.float64))
    back = nib.orientations.ornt_transform(nib.orientations.axcodes2ornt("RAS"), ornt)
    stored = {
        name: np.ascontiguousarray(nib.orientations.apply_orientation(m, back)) for name, m in maps.items()
    }

    def progress(done: int, total: int) -> None:
        report(0.9 + 0.1 * done / max(total, 1), "Encrypting the maps into the vault")

    info = vault.add_tissue_maps(item_id, stored, made, replace=replace, progress=progress)
    return info, maps, made


def keep_session_maps(vault, item_id: str, maps, made: dict, replace: bool, report: Report):
    """Keep the maps computed in this session for a vault item open in it (not segmented again)."""
    report(0.9, "Encrypting the maps into the vault")
    stored_affine = vault.get(item_id).affine
    return keep_maps_in_vault(vault, item_id, stored_affine, maps, made, replace, report)


def export_summary(files: Iterable[Path]) -> str:
    """What an export wrote, counted by kind: "1 NIfTI and 95 DICOM files" (the paths go in the details)."""
    counts = {"NIfTI": 0, "DICOM": 0, "JSON": 0, "other": 0}
    for path in files:
        name = path.name.lower()
        if name.endswith((".nii", ".nii.gz")):
            kind = "NIfTI"
        elif name.endswith(".dcm"):
            kind = "DICOM"
        else:  # a synthetic volume's provenance sidecar
            kind = "JSON" if name.endswith(".json") else "other"
        counts[kind] += 1
    parts = [f"{n} {kind}" for kind, n in counts.items() if n]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text + (" file" if sum(counts.values()) == 1 else " files")


# -- copies outside the vault (app.vault.boundary) --------------------------------------------------------


def session_only_maps(entry) -> list[str]:
    """The tissue maps of a session entry opened from the vault that the vault does not keep (computed in this
    session), in display order; [] for an entry not from the vault."""
    info = entry.vault_item
    if info is None:
        return []
    kept = set(info.tissue_maps)
    return [name for name in ordered_names(entry.tissue) if name not in kept]


def copy_volume(entry) -> Volume:
    """The ``Volume`` a copy of a shown vault item writes: the entry's record, its maps in display order, and a
    provenance that names the item by id only (its label and patient details stay in the vault)."""
    info = entry.vault_item
    provenance = {key: value for key, value in entry.provenance.items() if key != "tissue_maps"}
    provenance.update(copied_from_vault_item=info.id[:12], synthetic=entry.synthetic)
    tissue = {name: entry.tissue[name] for name in ordered_names(entry.tissue)}
    return replace(entry.volume, tissue=tissue, provenance=provenance)


def save_copy_outside(vault, item_id: str, volume, path: Path, report: Report) -> Path:
    """The user's copy of a shown vault item, outside the vault: recorded in the audit trail first (write-ahead,
    as the vault's own changes are), then written by the one volume writer (image, maps, sidecar; all or none)."""
    from engine.nifti.io import check_output_path, image_files, save_volume

    path = check_output_path(path)
    report(None, "Recording the copy in the audit trail")
    vault.record_copy_out(
        item_id, "copy_out", image_files(path, volume), tissue_maps=ordered_names(volume.tissue)
    )
    report(None, f"Writing {path.name}")
    return save_volume(volume, path)


def save_screenshot_outside(vault, item_id: str, png: bytes, path: Path, report: Report) -> Path:
    """A screenshot of a shown vault item, marked as patient data (``png``): recorded in the audit trail, then
    written atomically."""
    from engine.errors import OutputError
    from engine.nifti.io import atomic_files

    path = Path(path).expanduser()
    if not path.parent.is_dir():
        raise OutputError(f"{path.parent} is not a folder; choose another place for the screenshot")
    report(None, "Recording the screenshot in the audit trail")
    vault.record_copy_out(item_id, "screenshot", [path], marked="patient data")
    with atomic_files([path]) as (temp,):
        temp.write_bytes(png)
    return path
