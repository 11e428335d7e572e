"""Putting items into the vault: a NIfTI file (with the tissue maps its provenance lists), a DICOM series,
a generated array, or another vault's item (``vault rekey``), each streamed into encrypted parts and
committed under the write lock (payloads and record first, then the audit entry, then the index)."""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import DuplicateItem, InvalidRequest, OutputError, VaultCorrupted
from engine.nifti.checks import refuse_non_finite
from engine.nifti.io import is_nifti
from engine.vault import crypto, dicom, guards, item_index, nifti, record_files
from engine.vault import synthetic as synthetic_marks
from engine.vault.fingerprint import array_slices, file_slices, same_volume, volume_fingerprint
from engine.vault.fsio import fsync_dir
from engine.vault.header import now_iso
from engine.vault.layout import blob_dir
from engine.vault.metadata import (
    check_dates,
    check_tissue,
    check_tissue_name,
    json_copy,
    json_dict,
    template_space,
)
from engine.vault.payload import PartWriter, Progress
from engine.vault.records import KINDS, TISSUE_PART_PREFIX, ItemInfo, refuse_patient_if_synthetic

if TYPE_CHECKING:
    from engine.nifti.volume import Volume
    from engine.vault.state import VaultState


def import_nifti(
    state: VaultState,
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
    ``engine.nifti.io.save_volume`` writes them beside the image) are imported with it, byte for byte,
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
    kind, provenance = _file_kind(path, kind, patient, provenance)
    info = nifti.probe(path)
    maps = tissue_files(state, path, provenance, info) if kind == "synthetic" else []
    total = path.stat().st_size + sum(m.stat().st_size for _, m, _ in maps)
    name = path.name
    record = {
        "kind": kind,
        "label": label if label is not None else name.removesuffix(".gz").removesuffix(".nii"),
        "source": "nifti",
        "original_name": name,
        "patient": json_dict(patient, "patient metadata"),
        "study": json_dict(study, "study metadata"),
        "provenance": json_copy(provenance, "provenance") if provenance is not None else None,
        "volume": {
            "shape": list(info.shape),
            "dtype": info.dtype,
            "affine": [list(r) for r in info.affine],
            "format": f"nifti{info.version}",
            "compressed": info.compressed,
            "descrip": info.descrip,
            "fingerprint": volume_fingerprint(
                file_slices(path, info.shape), info.shape, info.affine, provenance
            ),
        },
    }
    # Tissue parts record whether their bytes are gzip'ed (the volume's flag is in "volume").
    sources: list[tuple[str, Path, bool | None]] = [("volume", path, None)] + [
        (TISSUE_PART_PREFIX + n, m, c) for n, m, c in maps
    ]
    write_parts = _file_parts(sources, total, progress)
    return store_item(state, record, write_parts, allow_duplicate=allow_duplicate)


def _file_kind(
    path: Path, kind: str | None, patient: dict | None, provenance: dict | None
) -> tuple[str, dict | None]:
    """The kind a NIfTI file is filed as, and its provenance: a file with SYNTHETIC marks is synthetic
    (with its sidecar's provenance) and refused as a scan or with a patient."""
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
    return kind, provenance


def _file_parts(
    sources: list[tuple[str, Path, bool | None]], total: int, progress: Progress | None
) -> Callable[[Callable[[str], PartWriter]], list[dict]]:
    """A ``write_parts`` for :func:`store_item` that streams files byte for byte, one part each
    ((part name, file, gzip'ed flag to record or None))."""

    def write_parts(new_part: Callable[[str], PartWriter]) -> list[dict]:
        parts = []
        done = 0
        for part_name, source, compressed in sources:
            part = new_part(part_name)
            if compressed is not None:
                part.extra["compressed"] = compressed
            with reading_source(source) as fh:
                while chunk := fh.read(crypto.IO_CHUNK):
                    part.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
            parts.append(part.close())
        return parts

    return write_parts


def tissue_files(
    state, path: Path, provenance: dict | None, image: nifti.NiftiInfo
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
            check_tissue_name(name)
            if not isinstance(file_name, str) or Path(file_name).name != file_name or not is_nifti(file_name):
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
            state.notices.append(f"tissue map {str(name)[:60]} of {path.name} was not imported: {exc}")
            continue
        out.append((name, source, found.compressed))
    return out


def import_dicom(
    state: VaultState,
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
    if isinstance(source, list | tuple):
        scanned: Path | list[Path] = [Path(p) for p in source]
    elif isinstance(source, str | os.PathLike):
        scanned = Path(source)
    else:
        raise TypeError(f"a DICOM source is a folder, a file or a list of files, not {type(source).__name__}")
    series = dicom.scan_series(scanned, series_uid=series_uid)
    header = nifti.stream_header(series.shape, series.affine, "VolSynth volume from a DICOM series")
    sizes = [p.stat().st_size for p in series.files]
    total = sum(sizes) + len(header) + 4 * int(np.prod(series.shape))
    default_label = " ".join(
        v for v in (series.study.get("modality"), series.study.get("series_description")) if v
    )
    record = {
        "kind": "scan",
        "label": label if label is not None else (default_label or "DICOM series"),
        "source": "dicom",
        "original_name": scanned.name if isinstance(scanned, Path) else "",
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

    def write_parts(new_part: Callable[[str], PartWriter]) -> list[dict]:
        volume = new_part("volume")
        volume.write(header)
        done = len(header)
        files = []
        for n, (path, uid) in enumerate(zip(series.files, series.sop_uids, strict=True), start=1):
            with reading_source(path) as fh:
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

    return store_item(state, record, write_parts, allow_duplicate=allow_duplicate)


def add_synthetic(
    state: VaultState,
    volume: Volume,
    *,
    label: str | None = None,
    progress: Progress | None = None,
    allow_duplicate: bool = False,
) -> ItemInfo:
    """Store a generated volume (as float32 NIfTI marked SYNTHETIC) with its provenance and tissue maps.

    Args:
        volume: The engine's volume record (``SamplingResult.member(i)``, a session entry's ``volume``):
            ``data`` (3D, or more dimensions), ``affine`` (voxel -> RAS mm, 4x4), ``provenance`` (how it was
            made: model id and weights hash, seed, sampler, settings...; a ``"space"`` such as
            ``MNI152NLin2009aSym`` sets the sform code of the stored and exported NIfTI headers, 4 for
            MNI152, as ``volsynth generate`` writes them) and ``tissue``, the maps decoded with it (name ->
            (x, y, z) on its grid), each stored as one more encrypted part of the same item
            (``tissue/<name>``, float32 NIfTI with the volume's affine and SYNTHETIC marks): verified,
            exported and deleted with the volume, read back with :meth:`open_tissue`. Its other fields
            (path, description...) are the session's, not stored.
        label: Display name (default: from the provenance's model id and seed).
        progress: Called with (bytes done, bytes total).
        allow_duplicate: Store it even if the vault already holds exactly the same volume.

    Raises:
        DuplicateItem: The same volume is already in the vault (and ``allow_duplicate`` is False).
        InvalidRequest: Bad volume, affine or provenance, or a tissue map off the volume's grid.
    """
    tissue, provenance, affine = volume.tissue or None, volume.provenance, volume.affine
    arr = np.asarray(volume.data)
    if arr.ndim < 3 or not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise InvalidRequest(
            f"a volume must be a real-valued array with 3+ dimensions, got {arr.dtype} {arr.shape}"
        )
    aff = np.asarray(affine, dtype=np.float64)
    if aff.shape != (4, 4) or not np.all(np.isfinite(aff)):
        raise InvalidRequest("the affine must be a finite 4x4 matrix")
    refuse_non_finite(arr, "the synthetic volume")  # a generated volume of NaN is a broken model, not data
    prov = json_copy(provenance, "provenance")
    if not isinstance(prov, dict):
        raise InvalidRequest("provenance must be a dict")
    maps = check_tissue(tissue, arr.shape)
    space = template_space(prov)  # sform code 1 (as before) unless the provenance names a template space
    header = nifti.stream_header(arr.shape, aff, nifti.SYNTHETIC_DESCRIP, space=space, synthetic=True)
    map_header = nifti.stream_header(arr.shape[:3], aff, nifti.SYNTHETIC_DESCRIP, space=space, synthetic=True)
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
            "fingerprint": volume_fingerprint(array_slices(arr), arr.shape, aff, prov),
        },
    }

    def write_parts(new_part: Callable[[str], PartWriter]) -> list[dict]:
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

    return store_item(state, record, write_parts, allow_duplicate=allow_duplicate)


def store_item(
    state: VaultState,
    record: dict,
    write_parts: Callable[[Callable[[str], PartWriter]], list[dict]],
    *,
    allow_duplicate: bool = False,
) -> ItemInfo:
    """Store a new item: ``write_parts(new_part)`` streams its parts (``new_part(name)`` gives a writer),
    then its record and the commit; a duplicate volume is refused and leaves nothing behind."""
    if record["source"] != "dicom":  # DICOM dates come from the scanner, as they are
        check_dates(record)
    with guards.operation(state), guards.writing(state):
        assert state.keys is not None and state.index is not None
        item_id = secrets.token_hex(16)
        with _new_item(state, item_id) as new_part:
            record = {**record, "id": item_id, "created": now_iso()}
            record["parts"] = write_parts(new_part)
            if not allow_duplicate and (same := same_volume(state.index, record)) is not None:
                raise DuplicateItem(
                    f"this volume is already in the vault as \u201c{same.get('label', '')}\u201d "
                    f"(item {same['id'][:12]}, added {same['created'][:10]}); nothing was added",
                    existing=same["id"],
                )
            detail = {"kind": record["kind"], "source": record["source"], "parts": len(record["parts"])}
            _commit_item(state, record, detail)
        return ItemInfo.from_record(record)


def copy_in(state: VaultState, rec: dict, read_part: Callable[[dict], Iterator[bytes]]) -> int:
    """Store another vault's item record under this vault's keys, keeping its id (``vault rekey``).

    ``read_part(part)`` yields the part's plaintext (authenticated by the source vault); each part is
    re-encrypted into a new blob and its SHA-256 compared with the record's before the commit. Returns
    the plaintext bytes written.
    """
    with guards.operation(state), guards.writing(state):
        assert state.keys is not None and state.index is not None
        item_id = rec["id"]
        parts: list[dict] = []
        written = 0
        with _new_item(state, item_id) as new_part:
            for part in rec["parts"]:
                writer = new_part(part["name"])
                for chunk in read_part(part):
                    writer.write(chunk)
                done = writer.close()
                if done["sha256"] != part["sha256"] or done["size"] != part["size"]:
                    raise VaultCorrupted(f"item {item_id} changed while it was being re-encrypted")
                parts.append({**part, "blob": done["blob"], "ct_size": done["ct_size"]})
                written += done["size"]
            _commit_item(
                state, {**copy.deepcopy(rec), "parts": parts}, {"kind": rec["kind"], "rekey_copy": True}
            )
        return written


@contextlib.contextmanager
def _new_item(state: VaultState, item_id: str) -> Iterator[Callable[[str], PartWriter]]:
    """The part writers of a new item (``new_part(name)``). If the body raises, the item's files are
    removed unless the index on disk already references it (a failure after the rename, e.g. of the
    folder fsync, leaves the item committed). These files belong to this item only: no index ever
    referenced them."""
    assert state.keys is not None
    key = state.keys.item(item_id)
    writers: list[PartWriter] = []

    def new_part(name: str) -> PartWriter:
        assert state.keys is not None
        writer = PartWriter(
            blob_dir(state.path), key, crypto.context(state.keys.vault_id, item_id, name), name
        )
        writers.append(writer)
        return writer

    try:
        yield new_part
    except BaseException:
        if not item_index.on_disk_has(state, item_id):
            for writer in writers:
                writer.discard()
            record_files.unlink_records(state, item_id)
        raise


def _commit_item(state: VaultState, record: dict, detail: dict) -> None:
    """Write the item's record files, then commit the index that lists it (audit entry ``import``)."""
    assert state.index is not None
    record_files.write_record(state, record)
    fsync_dir(blob_dir(state.path))
    index = copy.deepcopy(state.index)
    index["items"][record["id"]] = record
    item_index.commit(state, "import", record["id"], detail, index)


@contextlib.contextmanager
def reading_source(path: Path) -> Iterator:
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
