"""Exporting an item: its NIfTI (and tissue maps and provenance sidecar, or original DICOM files) written
into a hidden staging folder at the destination and moved into place only once all of it is there.

File names never carry identifiers; a de-identified export clears NIfTI free text and de-identifies DICOM
files (PS3.15 Annex E basic profile); a synthetic item always leaves marked SYNTHETIC.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import InvalidRequest, OutputError
from engine.nifti.io import provenance_sidecar, tissue_path
from engine.vault import deid, guards, item_index, nifti, payload, pending_exports
from engine.vault import synthetic as synthetic_marks
from engine.vault.fsio import AtomicWriter, fsync_dir, write_atomic
from engine.vault.layout import STAGING_NAME
from engine.vault.metadata import template_space
from engine.vault.payload import Progress
from engine.vault.records import TISSUE_PART_PREFIX, ExportResult

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def export(
    state: VaultState,
    item_id: str,
    dest_dir: str | os.PathLike,
    *,
    deidentify: bool = False,
    include_dicom: bool = True,
    include_tissue: bool = True,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Write an item out as NIfTI (and its original DICOM files, if it came from DICOM, and its tissue maps).

    File names never carry identifiers: ``<kind>-<id prefix>.nii[.gz]``, a ``<kind>-<id prefix>-dicom``
    folder of ``IM00001.dcm``.... Without de-identification the NIfTI and DICOM files of a scan are
    byte-identical to what was imported; a de-identified NIfTI always leaves as ``.nii.gz``. A synthetic item always leaves as ``.nii.gz`` with every
    SYNTHETIC field that ``volsynth generate`` writes (``descrip``, ``intent_name``, ``aux_file``, a
    comment extension) and its provenance in the same ``<stem>.json`` sidecar, so opening the export
    shows its provenance; its tissue maps, if it has any, go beside it as
    ``<stem>_label-<name>_probseg.nii.gz`` (``engine.nifti.io.tissue_path``), marked the same way, and
    the sidecar lists them (``"tissue_maps": {name: file name}``). A scan's tissue maps (kept with it by
    ``add_tissue_maps``) go beside it under the same names, so opening the export brings them back; a scan
    gets no sidecar (a sidecar marks a file as generated). A provenance naming a template
    ``space`` sets the sform code of every file (4 for MNI152). Recorded in the audit trail. While it
    runs, an encrypted note in the vault folder says where its partial files are; if the process is
    killed, the next unlock removes them.

    Args:
        item_id: Item id or unique prefix.
        dest_dir: Destination folder (created if needed).
        deidentify: Clear NIfTI free-text fields and extensions; de-identify DICOM files with the
            PS3.15 Annex E basic profile. Synthetic volumes stay marked SYNTHETIC.
        include_dicom: Also write the original DICOM files (DICOM items only).
        include_tissue: Also write the item's tissue maps beside its NIfTI (the audit entry names them).
        overwrite: Replace existing files instead of refusing.
        progress: Called with (bytes done, bytes total).

    Raises:
        OutputError: The destination cannot be written, or files exist and ``overwrite`` is False.
        VaultCorrupted: The item failed authentication; nothing is left at the destination.
    """
    dest = Path(dest_dir).expanduser()
    with guards.operation(state):
        rec = item_index.find_record(state, item_id)
        plan = _plan(
            rec, dest, deidentify=deidentify, include_dicom=include_dicom, include_tissue=include_tissue
        )
        if not overwrite and (clash := [str(t) for t in plan.targets if t.exists()]):
            raise OutputError(f"{clash[0]} already exists; choose another folder or allow overwriting")
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {dest}: {exc.strerror}") from exc
        detail = {
            "folder": str(dest.absolute()),
            "deidentified": deidentify,
            "dicom_files": len(plan.dicom_parts),
        }
        if plan.tissue_parts:
            detail["tissue_maps"] = [p["name"][len(TISSUE_PART_PREFIX) :] for p in plan.tissue_parts]
        state.record("export", rec["id"], detail)
        counter = _Counter(progress, sum(int(p["size"]) for p in plan.parts()))
        warnings = _stage_and_move(state, plan, deidentify=deidentify, overwrite=overwrite, counter=counter)
        files = [plan.nii_path, *plan.map_paths]
        files += [plan.dicom_dir / f"IM{n:05d}.dcm" for n in range(1, len(plan.dicom_parts) + 1)]
        files += [plan.prov_path] if plan.synthetic else []
        return ExportResult(files=tuple(files), deidentified=deidentify, warnings=tuple(warnings))


#: The audit events of copies the user writes outside the vault from an item shown in the app, besides
#: ``export``: the image with its maps and sidecar (``copy_out``), a picture of it (``screenshot``).
COPY_OUT_EVENTS = ("copy_out", "screenshot")


def record_copy_out(
    state: VaultState, item_id: str, event: str, files: Sequence[str | os.PathLike], **detail
) -> None:
    """Write the audit entry of a copy of an item written outside the vault by the app (not by ``export``):
    which item, the files (absolute paths) and what they hold. Recorded before the files are written, as every
    change here is (write-ahead): an entry whose write then failed says more than a write with no entry.

    Raises:
        InvalidRequest: ``event`` is not one of ``COPY_OUT_EVENTS`` or no file is named.
        VaultLocked / ItemNotFound: as for any operation on an item.
    """
    if event not in COPY_OUT_EVENTS:
        raise InvalidRequest(f"unknown copy event {event!r}; one of {', '.join(COPY_OUT_EVENTS)}")
    if not files:
        raise InvalidRequest("name the files the copy is written to")
    with guards.operation(state):
        rec = item_index.find_record(state, item_id)
        state.record(event, rec["id"], {"files": [str(Path(f).absolute()) for f in files], **detail})


@dataclass
class _ExportPlan:
    """Where each part of one item goes, and the provenance record a synthetic item leaves with."""

    rec: dict
    dest: Path
    synthetic: bool
    compressed: bool  # the stored volume's bytes are gzip'ed
    gzip_output: bool  # a de-identified plain .nii leaves as .nii.gz
    nii_path: Path
    dicom_parts: list[dict]
    dicom_dir: Path
    prov_path: Path
    tissue_parts: list[dict]
    map_paths: list[Path]
    record: dict | None  # the provenance sidecar of a synthetic item
    space: str | None  # the template space its provenance names

    @property
    def volume(self) -> dict:
        return next(p for p in self.rec["parts"] if p["name"] == "volume")

    @property
    def targets(self) -> list[Path]:
        """What appears at the destination (the DICOM folder as one)."""
        return (
            [self.nii_path, *self.map_paths]
            + ([self.dicom_dir] if self.dicom_parts else [])
            + ([self.prov_path] if self.synthetic else [])
        )

    def parts(self) -> list[dict]:
        """The parts that are exported (their plaintext sizes make the progress total)."""
        return [
            p
            for p in self.rec["parts"]
            if p["name"] == "volume" or p in self.dicom_parts or p in self.tissue_parts
        ]


def _plan(
    rec: dict, dest: Path, *, deidentify: bool, include_dicom: bool, include_tissue: bool
) -> _ExportPlan:
    synthetic = rec["kind"] == "synthetic"
    compressed = bool(rec["volume"].get("compressed"))
    stem = f"{rec['kind']}-{rec['id'][:12]}"
    # A de-identified copy is a new file anyway (its header is rewritten), so it leaves compressed:
    # what is shared is smaller. Only a plain export keeps the imported bytes (and suffix) as they are.
    gzip_output = deidentify and not compressed and not synthetic
    nii_path = dest / (stem + (".nii.gz" if compressed or synthetic or gzip_output else ".nii"))
    dicom_parts = [p for p in rec["parts"] if p["name"].startswith("dicom/")] if include_dicom else []
    tissue_parts = (
        [p for p in rec["parts"] if p["name"].startswith(TISSUE_PART_PREFIX)] if include_tissue else []
    )
    map_paths = [tissue_path(nii_path, p["name"][len(TISSUE_PART_PREFIX) :]) for p in tissue_parts]
    record = {**(rec.get("provenance") or {}), "synthetic": True} if synthetic else None
    space = template_space(record)
    if record is not None:
        # The maps that leave with the image, under the names they get here (an imported file's
        # provenance names the files it was imported with).
        record.pop("tissue_maps", None)
        if tissue_parts:
            record["tissue_maps"] = {
                p["name"][len(TISSUE_PART_PREFIX) :]: path.name
                for p, path in zip(tissue_parts, map_paths, strict=True)
            }
    return _ExportPlan(
        rec=rec,
        dest=dest,
        synthetic=synthetic,
        compressed=compressed,
        gzip_output=gzip_output,
        nii_path=nii_path,
        dicom_parts=dicom_parts,
        dicom_dir=dest / f"{stem}-dicom",
        prov_path=dest / f"{stem}.json",  # engine.nifti.io.sidecar_path: what load_nifti reads back
        tissue_parts=tissue_parts,
        map_paths=map_paths,
        record=record,
        space=space,
    )


class _Counter:
    """Plaintext bytes exported so far, reported to the caller's progress callback."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0

    def stream(self, pieces: Iterator[bytes]) -> Iterator[bytes]:
        """``pieces``, reporting progress as they pass (from the count so far)."""
        if self.progress is None:
            return pieces
        return payload.counting(pieces, self.progress, self.done, self.total)

    def add(self, n: int, *, report: bool = False) -> None:
        self.done += n
        if report and self.progress is not None:
            self.progress(self.done, self.total)


def _stage_and_move(
    state: VaultState, plan: _ExportPlan, *, deidentify: bool, overwrite: bool, counter: _Counter
) -> list[str]:
    """Write everything into a hidden staging folder in the destination, then move it into place (one
    rename per target; the DICOM folder moves whole), so a killed export leaves no partial set among the
    user's files; the next unlock removes the staging folder. Returns the de-identification warnings."""
    written: list[Path] = []
    with pending_exports.pending_export(
        state, [plan.dest], targets=plan.targets, overwrite=overwrite
    ) as prefix:
        staging = plan.dest / f"{prefix}{STAGING_NAME}"
        staged_maps = [staging / m.name for m in plan.map_paths]
        staged_dicom = staging / plan.dicom_dir.name
        staged_prov = staging / plan.prov_path.name
        try:
            try:
                staging.mkdir(mode=0o700)
                if plan.dicom_parts:
                    staged_dicom.mkdir()
            except OSError as exc:
                raise OutputError(f"cannot write in {plan.dest}: {exc.strerror}") from exc
            _write_volume(state, plan, staging / plan.nii_path.name, prefix, deidentify, counter)
            _write_tissue_maps(state, plan, staged_maps, prefix, deidentify, counter)
            warnings = _write_dicom(state, plan, staged_dicom, prefix, deidentify, counter)
            if plan.record is not None:  # a synthetic item: the provenance sidecar every route writes
                # (engine.nifti.io.save_volume)
                write_atomic(staged_prov, provenance_sidecar(plan.record), prefix=prefix, output=True)
            fsync_dir(staging)
            # Into place: the NIfTI last, so that whatever is in place without it is what a crash in
            # these few renames left (and the next unlock removes it, see clean_stale_exports).
            moves = [(staged_dicom, plan.dicom_dir)] if plan.dicom_parts else []
            moves += list(zip(staged_maps, plan.map_paths, strict=True))
            moves += [(staged_prov, plan.prov_path)] if plan.synthetic else []
            moves += [(staging / plan.nii_path.name, plan.nii_path)]
            for src, dst in moves:
                move_into_place(src, dst)
                written.append(dst)
            fsync_dir(plan.dest)
            with contextlib.suppress(OSError):
                staging.rmdir()
        except BaseException:
            if not overwrite:  # moved targets did not exist before this export
                for path in written:
                    with contextlib.suppress(OSError):
                        shutil.rmtree(path) if path.is_dir() else path.unlink()
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return warnings


def _write_volume(
    state: VaultState, plan: _ExportPlan, target: Path, prefix: str, deidentify: bool, counter: _Counter
) -> None:
    """The item's NIfTI: a synthetic one re-marked SYNTHETIC with its provenance, a scan's bytes as
    imported (or rewritten de-identified, then gzip'ed if they were not)."""
    volume = plan.volume
    with AtomicWriter(target, prefix=prefix, output=True) as writer:
        stream = counter.stream(payload.iter_part(state, plan.rec, volume))
        if plan.synthetic:
            pieces = synthetic_marks.export_stream(
                stream,
                compressed=plan.compressed,
                deidentify=deidentify,
                provenance=plan.record,
                space=plan.space,
            )
        else:
            pieces = nifti.rewrite_stream(
                stream, compressed=plan.compressed, deidentify=deidentify, synthetic=False
            )
            if plan.gzip_output:
                pieces = nifti.gzip_stream(pieces)
        for piece in pieces:
            writer.write(piece)
    counter.add(int(volume["size"]))


def _write_tissue_maps(
    state: VaultState,
    plan: _ExportPlan,
    targets: list[Path],
    prefix: str,
    deidentify: bool,
    counter: _Counter,
) -> None:
    for part, target in zip(plan.tissue_parts, targets, strict=True):
        # Each map carries the image's provenance naming the map, and how the maps were made (model channels,
        # or a segmentation method and its versions) at the top of its record, as save_volume writes it.
        made = (plan.record or {}).get("tissue_maps_made")
        map_record = {
            **(plan.record or {}),
            **(made if isinstance(made, dict) else {}),
            "tissue_map": part["name"][len(TISSUE_PART_PREFIX) :],
            "image": plan.nii_path.name,
        }
        compressed = bool(part.get("compressed"))
        with AtomicWriter(target, prefix=prefix, output=True) as writer:
            stream = counter.stream(payload.iter_part(state, plan.rec, part))
            if plan.synthetic:
                pieces = synthetic_marks.export_stream(
                    stream,
                    compressed=compressed,
                    deidentify=deidentify,
                    provenance=map_record,
                    space=plan.space,
                )
            else:  # a scan's map: its own plain header (no words of the scan's), compressed as the image is
                pieces = nifti.rewrite_stream(
                    stream, compressed=compressed, deidentify=deidentify, synthetic=False
                )
                if target.name.endswith(".gz") and not compressed:
                    pieces = nifti.gzip_stream(pieces)
            for piece in pieces:
                writer.write(piece)
        counter.add(int(part["size"]))


def _write_dicom(
    state: VaultState, plan: _ExportPlan, folder: Path, prefix: str, deidentify: bool, counter: _Counter
) -> list[str]:
    """The original DICOM files as ``IM00001.dcm``... (de-identified if asked); returns the warnings of
    the de-identification, each once."""
    warnings: list[str] = []
    uids = deid.UidMapper()
    for n, part in enumerate(plan.dicom_parts, start=1):
        raw = bytes(payload.read_part(state, plan.rec, part))
        if deidentify:
            raw, found = deid.deidentify_dicom(raw, uids)
            warnings.extend(w for w in found if w not in warnings)
        write_atomic(folder / f"IM{n:05d}.dcm", raw, prefix=prefix, output=True, sync_dir=False)
        counter.add(int(part["size"]), report=True)
    if plan.dicom_parts:
        fsync_dir(folder)
    return warnings


def move_into_place(src: Path, dst: Path) -> None:
    """Rename a staged export file or folder to its target (replacing it: the caller checked overwrite)."""
    try:
        if src.is_dir() and dst.is_dir():
            shutil.rmtree(dst)
        os.replace(src, dst)
    except OSError as exc:
        raise OutputError(f"cannot move the export into place at {dst}: {exc.strerror}") from exc
