"""Read and write NIfTI volumes, with the provenance sidecar, never leaving a partial file behind.

Writing: every file goes to a temporary name in the destination folder, is fsynced, then renamed over the
target with ``os.replace`` and the folder fsynced. A failure at any point (disk full, permissions, ...)
removes the temporaries and raises ``OutputError``; a previous file at the target stays untouched.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidRequest, OutOfMemory, OutputError
from engine.files.durable import fsync_dir
from engine.nifti.volume import Volume, provenance_space

SYNTHETIC_DESCRIP = "SYNTHETIC (VolSynth Studio)"
SYNTHETIC_MARK = "SYNTHETIC"
NIFTI_SUFFIXES = (".nii.gz", ".nii")
#: Starts the content of the header extension that carries a volume's provenance record.
PROVENANCE_EXTENSION_TAG = b"VOLSYNTH-PROVENANCE "
MAX_SIDECAR_BYTES = 16 << 20


def is_nifti(path: str | os.PathLike) -> bool:
    """The one test of a NIfTI file name (``.nii`` or ``.nii.gz``, any case) for the engine and the app."""
    return os.fspath(path).lower().endswith(NIFTI_SUFFIXES)


def split_nifti_name(path: Path) -> tuple[str, str]:
    name = path.name
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)], suffix
    raise InvalidRequest(f"output file {path} must end in .nii.gz or .nii")


def sidecar_path(nifti_path: Path) -> Path:
    stem, _ = split_nifti_name(nifti_path)
    return nifti_path.with_name(stem + ".json")


#: The BIDS suffixes of the anatomical images VolSynth writes (``swi`` is BEP004's, the SWI proposal: BIDS 1.10 has
#: no SWI suffix yet; ``angio`` is BIDS's suffix for MR angiography).
BIDS_IMAGE_SUFFIXES = ("T1w", "T2w", "FLAIR", "swi", "angio")
_IMAGE_SUFFIX = re.compile(r"_(" + "|".join(BIDS_IMAGE_SUFFIXES) + r")$")
_DESC_ENTITY = re.compile(r"^(.*?)(_desc-[A-Za-z0-9]+)?$")


def tissue_path(image_path: Path, name: str) -> Path:
    """Where tissue map ``name`` of an image goes, BIDS-derivative style: ``sub-01_T1w.nii.gz`` ->
    ``sub-01_label-GM_probseg.nii.gz`` (the image's suffix, ``_T1w`` or another of BIDS_IMAGE_SUFFIXES, gives
    way to ``_probseg``); the image's other entities stay, ``label`` placed before a ``desc`` as BIDS orders
    them: ``sub-01_space-MNI152NLin2009aSym_desc-skullstripped_T2w`` ->
    ``sub-01_space-MNI152NLin2009aSym_label-GM_desc-skullstripped_probseg``."""
    stem, suffix = split_nifti_name(image_path)
    stem = _IMAGE_SUFFIX.sub("", stem)
    match = _DESC_ENTITY.match(stem)
    if match is None:  # the pattern matches any text; this says so to the reader
        raise ValueError(f"cannot split the desc entity from {stem!r}")
    head, desc = match.groups()
    return image_path.with_name(f"{head}_label-{name}{desc or ''}_probseg{suffix}")


def xform_code(space: str | None) -> int:
    """NIfTI sform/qform code for volumes in ``space``: 4 (MNI152) for the MNI152 templates, 2 (aligned to
    another named template), 1 (scanner anatomical) when the space is not named."""
    if not space:
        return 1
    return 4 if space.upper().startswith("MNI152") else 2


def batch_paths(out: Path, count: int) -> list[Path]:
    """``out.nii.gz`` for one volume; ``out_00.nii.gz``, ``out_01.nii.gz``... for a batch."""
    if count == 1:
        return [out]
    stem, suffix = split_nifti_name(out)
    return [out.with_name(f"{stem}_{i:02d}{suffix}") for i in range(count)]


def _explain(exc: OSError, target: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"the disk is full while writing {target}; free some space or choose another folder"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write to {target.parent}: permission denied or read-only; choose a writable folder"
    if exc.errno == errno.ENOENT:
        return f"folder {target.parent} does not exist; create it or choose another output path"
    if exc.errno == errno.ENOTDIR:
        return f"{target.parent} is not a folder; choose another output path"
    return f"cannot write {target}: {exc.strerror or exc}"


def check_output_path(out: str | Path) -> Path:
    """Fail fast (before minutes of sampling) if ``out`` cannot be written: folder, rights, name."""
    out = Path(out).expanduser()
    split_nifti_name(out)
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.exists():
        raise OutputError(f"output folder {folder} does not exist; create it or choose another output path")
    if not folder.is_dir():
        raise OutputError(f"{folder} is not a folder; choose another output path")
    # Try it for real: as root, permission bits say nothing; a read-only mount still refuses.
    try:
        fd, probe = tempfile.mkstemp(prefix=".volsynth-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(_explain(exc, out)) from exc
    return out


def _default_file_mode() -> int:
    """What ``open()`` would give a new file (0o666 less the umask); mkstemp's 0o600 is for secrets."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()  # read once: umask is process state, and changing it is not thread-safe


@contextlib.contextmanager
def atomic_files(targets: list[Path]) -> Iterator[list[Path]]:
    """Yield temporary paths (same folders, same suffixes) to write; on success rename them all into place.

    If anything fails, every temporary is removed and no target is created or changed. The files get the
    permissions an ordinary new file would get (they are results to share, unlike the vault's files).
    """
    temps: list[Path] = []
    try:
        for target in targets:
            suffix = "".join(target.suffixes[-2:]) if target.name.endswith(".nii.gz") else target.suffix
            fd, name = tempfile.mkstemp(
                prefix=f".{target.name}.", suffix=f".partial{suffix}", dir=target.parent
            )
            os.fchmod(fd, _FILE_MODE)
            os.close(fd)
            temps.append(Path(name))
        yield temps
        for temp in temps:
            with open(temp, "rb+") as handle:
                os.fsync(handle.fileno())
        for temp, target in zip(temps, targets, strict=True):
            os.replace(temp, target)
        for folder in {t.parent for t in targets}:
            fsync_dir(folder)
    except OSError as exc:
        raise OutputError(_explain(exc, targets[0])) from exc
    finally:
        for temp in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def float32_header(
    shape: tuple[int, ...],
    affine: np.ndarray,
    *,
    descrip: str,
    space: str | None = None,
    synthetic: bool = False,
    intensity_range: tuple[float, float] = (0.0, 0.0),
):
    """The one NIfTI-1 header recipe for the float32 volumes VolSynth writes: the nibabel writer
    (:func:`make_nifti`) and the vault's streaming writer (``engine.vault.nifti.stream_header``) both start
    from it, so a volume's codes, units and marks are the same whichever way it is written.

    Millimetres and seconds; the qform scanner-anatomical (code 1), the sform code from ``space``
    (:func:`xform_code`: 4 for MNI152), the convention of MNI-space derivatives (fMRIPrep, FSL). ``descrip``
    is the caller's text (79 ASCII characters kept): the generator's :data:`SYNTHETIC_DESCRIP`, the vault's
    longer one, a scan's own words. A ``synthetic`` header also carries the SYNTHETIC ``intent_name`` and
    ``aux_file`` marks. ``intensity_range`` is ``cal_min``/``cal_max`` ((0, 0) is NIfTI's "unknown").
    """
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.float32)
    header.set_xyzt_units(xyz="mm", t="sec")
    header["cal_min"], header["cal_max"] = intensity_range
    header.set_qform(affine, code=1)  # scanner-anatomical RAS
    header.set_sform(affine, code=xform_code(space))
    header["descrip"] = descrip.encode("ascii", "replace")[:79]
    if synthetic:
        header["intent_name"] = b"SYNTHETIC"
        header["aux_file"] = b"volsynth-synthetic"
    return header


def make_nifti(
    volume: np.ndarray,
    affine: np.ndarray,
    *,
    synthetic: bool,
    descrip: str = "",
    provenance: dict[str, Any] | None = None,
    space: str | None = None,
):
    """A NIfTI-1 float32 image with the :func:`float32_header` recipe; a synthetic one carries the SYNTHETIC
    mark in descrip, intent_name, aux_file and a comment extension, and its provenance (if given) in a VolSynth
    extension.

    ``cal_min``/``cal_max`` are the volume's robust range (:func:`display_range`), so viewers show the
    model's background, negative for the shipped model, as black instead of guessing from 0/0. The voxels
    are written as given: what the model made is not changed.
    """
    import nibabel as nib

    data = np.asarray(volume, dtype=np.float32)
    affine = np.asarray(affine, dtype=np.float64)
    header = float32_header(
        data.shape,
        affine,
        descrip=SYNTHETIC_DESCRIP if synthetic else descrip,
        space=space,
        synthetic=synthetic,
        intensity_range=display_range(data),
    )
    image = nib.Nifti1Image(data, affine, header=header)
    if synthetic:
        image.header.extensions.append(
            nib.nifti1.Nifti1Extension(
                "comment", b"SYNTHETIC volume generated by VolSynth Studio; not a patient scan"
            )
        )
        # Only a synthetic volume's record goes into the file itself: an opened scan's "provenance" can
        # name the patient's file, which must not travel inside the image.
        if provenance is not None:
            image.header.extensions.append(provenance_extension(provenance))
    return image


#: Percentiles of the finite voxels that cal_min/cal_max take: a stray extreme voxel does not set the range.
DISPLAY_PERCENTILES = (0.5, 99.5)


def display_range(data: np.ndarray) -> tuple[float, float]:
    """(cal_min, cal_max) for ``data``: the 0.5th and 99.5th percentiles of its finite voxels, widened to
    the full range when they coincide (a binary or nearly constant map); (0, 0), NIfTI's "unknown", for a
    constant or empty volume."""
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return 0.0, 0.0
    low, high = (float(v) for v in np.percentile(finite, DISPLAY_PERCENTILES))
    if high <= low:
        low, high = float(finite.min()), float(finite.max())
    return (low, high) if high > low else (0.0, 0.0)


def image_files(path: Path, volume: Volume) -> list[Path]:
    """Every file ``save_volume`` writes for ``volume`` at ``path``: the NIfTI, its sidecar (when the volume has
    provenance or tissue maps to record), and its tissue maps (``tissue_path``)."""
    sidecar = [sidecar_path(path)] if volume.provenance or volume.tissue else []
    return [path, *sidecar, *(tissue_path(path, name) for name in volume.tissue)]


def _write_volume_files(temp_of: dict[Path, Path], path: Path, volume: Volume) -> None:
    """Write ``image_files(path, volume)`` to their temporaries (``temp_of``, from ``atomic_files``): the image
    with its provenance (listing the maps as ``tissue_maps``), its sidecar, and each map with
    the image's affine and space, its provenance naming the map and the image.

    How the maps were made (``tissue_maps_made`` of the provenance: model channels, or a method with its
    version and contrast) stays in the image's record when there are maps (its sidecar is the one a reader
    opens); each map's record carries it whole, at its top level."""
    provenance = volume.provenance
    made = provenance.get("tissue_maps_made")
    made = dict(made) if isinstance(made, dict) and volume.tissue else None
    record = {
        key: value for key, value in provenance.items() if key not in ("tissue_maps", "tissue_maps_made")
    }
    if volume.tissue:
        record["tissue_maps"] = {name: tissue_path(path, name).name for name in volume.tissue}
        if made:
            record["tissue_maps_made"] = made
    make_nifti(
        volume.data, volume.affine, synthetic=volume.synthetic, provenance=record, space=volume.space
    ).to_filename(str(temp_of[path]))
    if sidecar_path(path) in temp_of:
        temp_of[sidecar_path(path)].write_bytes(provenance_sidecar(record))
    for name, array in volume.tissue.items():
        map_record = {**record, **(made or {}), "tissue_map": name, "image": path.name}
        make_nifti(
            array, volume.affine, synthetic=volume.synthetic, provenance=map_record, space=volume.space
        ).to_filename(str(temp_of[tissue_path(path, name)]))


def save_volumes(volumes: list[Volume], paths: list[Path]) -> list[Path]:
    """The one writer of volumes: each ``Volume`` as NIfTI at its path, with its provenance sidecar and its
    tissue maps beside it (``image_files``). All files of all the volumes appear together or none does
    (``atomic_files``). Returns the image paths.

    Raises:
        engine.errors.OutputError: the files cannot be written (nothing is left behind).
    """
    paths = [check_output_path(path) for path in paths]
    targets = [p for path, volume in zip(paths, volumes, strict=True) for p in image_files(path, volume)]
    with atomic_files(targets) as temps:
        temp_of = dict(zip(targets, temps, strict=True))
        for path, volume in zip(paths, volumes, strict=True):
            _write_volume_files(temp_of, path, volume)
    return paths


def save_volume(volume: Volume, path: str | Path) -> Path:
    """Write one ``Volume`` (``save_volumes``): the image, its sidecar and its tissue maps, atomically."""
    return save_volumes([volume], [Path(path)])[0]


def generated_volumes(result, made_tissue=None, anatomy_checks=None) -> list[Volume]:
    """Each volume of a SamplingResult as the ``Volume`` to write (``save_volumes``); a non-finite volume is
    refused. Write them to ``batch_paths(out, len(volumes))``.

    A model with tissue channels has its own maps (``tissue_maps_source`` "model channels"). For one without,
    ``made_tissue`` may give, per batch member, ``(maps, record)``: maps made from the image (a segmentation)
    and the record of how they were made (``tissue_maps_made``); a member whose maps could not be made has
    ``{}`` maps and a record saying why (``tissue_maps_not_made``), which goes into its provenance.
    ``anatomy_checks`` may give, per batch member, the record of its anatomy check (``engine.anatomy.checks``,
    ``to_dict()``) or None; it goes into the member's provenance as ``anatomy_check``."""
    from engine.nifti.checks import refuse_non_finite

    refuse_non_finite(result.volumes, "the generated volume")
    volumes = []
    for index in range(result.volumes.shape[0]):
        volume = result.member(index)
        if result.label_names:
            volume.provenance["tissue_maps_made"] = result.tissue_maps_made
        elif made_tissue is not None:
            maps, record = made_tissue[index]
            volume.tissue = dict(maps)
            if maps:
                volume.provenance["tissue_maps_made"] = dict(record)
            elif record:
                volume.provenance.update(record)  # why no maps were made, said with the image
        if anatomy_checks is not None and anatomy_checks[index] is not None:
            volume.provenance["anatomy_check"] = anatomy_checks[index]
        volumes.append(volume)
    return volumes


def _time_index(shape: tuple[int, ...], time_index: int, name: str) -> int | None:
    """Which volume of a 4D array to take (None for 3D data); refuses an index past the end."""
    count = shape[3] if len(shape) > 3 else 1
    if not 0 <= time_index < count:
        raise InvalidRequest(
            f"{name} has {count} time point{'s' if count != 1 else ''}; "
            f"choose one from 0 to {count - 1}, not {time_index}"
        )
    return time_index if len(shape) > 3 else None


def canonical_volume(image, name: str, time_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A nibabel image as float32 (x, y, z) in RAS+ and its affine: one volume of 4D data (the first by
    default), non-finite values zeroed. Works on in-memory images too (the vault never writes decrypted
    data). Only the chosen volume is read, and it is converted to float32 before it is reoriented, so a
    scaled or 4D file never needs a float64 or whole-series copy."""
    import nibabel as nib

    shape = tuple(int(n) for n in image.shape)
    while len(shape) > 3 and shape[-1] == 1:
        shape = shape[:-1]
    if len(shape) not in (3, 4):
        raise InvalidRequest(f"{name} has {len(shape)} dimensions; VolSynth shows 3D volumes")
    if 0 in shape:
        raise InvalidRequest(f"{name} has a zero-length axis (shape {shape}); there are no voxels to show")
    index = _time_index(shape, time_index, name)
    dataobj = image.dataobj
    if len(image.shape) > len(shape):  # trailing singleton axes past the ones kept
        data = np.asarray(dataobj, dtype=np.float32).reshape(shape)
        data = data[..., index] if index is not None else data
    elif index is None:
        data = np.asarray(dataobj, dtype=np.float32)
    else:
        data = np.asarray(dataobj[..., index], dtype=np.float32)
    affine = np.asarray(image.affine, dtype=np.float64)
    if not np.all(np.isfinite(affine)) or abs(np.linalg.det(affine[:3, :3])) < 1e-12:
        raise InvalidRequest(f"{name} has a broken voxel-to-world transform (NaN, infinite or singular)")
    ornt = nib.orientations.io_orientation(affine)
    data = np.ascontiguousarray(nib.orientations.apply_orientation(data, ornt))
    affine = affine @ nib.orientations.inv_ornt_aff(ornt, data.shape)
    if not np.all(np.isfinite(data)):
        np.nan_to_num(data, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    return data, affine


def load_nifti(path: str | Path, *, time_index: int = 0) -> Volume:
    """Read a 3D NIfTI (or one volume of a 4D one, the first by default) as float32 in RAS+ orientation.

    The header passes :func:`engine.nifti.checks.inspect_nifti` (shape, type, affine, offsets, voxel and
    memory budget) before any voxel is read. A .nii.gz is decompressed once, bounded by what its header
    describes and checked complete (CRC included), as ``vault import`` checks it. The provenance comes
    from the sidecar beside the file or, failing that, from the VolSynth header extension (see
    :func:`read_provenance`).

    Raises:
        InvalidRequest: Missing file, or a file that is not a readable, sane NIfTI volume.
        OutOfMemory: Reading the volume would need more memory than is available.
    """
    import nibabel as nib

    from engine.nifti.checks import MemoryReader, check_memory, gunzip_file_bounded, inspect_nifti

    path = Path(path).expanduser()
    info = inspect_nifti(path)  # also refuses a folder, a FIFO or a device, saying which
    _time_index(info.shape, time_index, path.name)
    klass = nib.Nifti2Image if info.version == 2 else nib.Nifti1Image
    try:
        if info.compressed:
            # One bounded pass decompresses the whole stream (so a truncated, damaged or bomb .nii.gz is
            # refused, CRC included) into memory, and nibabel reads the chosen volume from there.
            per_voxel = info.read_bytes_per_voxel() - info.dtype.itemsize
            check_memory(info.expected_size + info.volume_voxels * per_voxel, f"reading {path.name}")
            holder = nib.FileHolder(filename=str(path), fileobj=MemoryReader(gunzip_file_bounded(path, info)))
            image = klass.from_file_map({"header": holder, "image": holder})
        else:
            info.check_read_memory(info.volume_voxels)
            image = klass.from_filename(str(path))
        data, affine = canonical_volume(image, path.name, time_index)
    except (InvalidRequest, OutOfMemory):
        raise
    except MemoryError as exc:
        raise OutOfMemory(f"not enough memory to read {path.name}; close other programs") from exc
    except Exception as exc:  # noqa: BLE001 - nibabel, gzip and zlib raise many types on damaged files
        first = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidRequest(
            f"{path.name} is not a readable NIfTI file ({first[:200]}); check the file is complete"
        ) from None
    description = _text_field(image.header, "descrip")
    provenance = read_provenance(path, image.header)
    synthetic = bool(provenance.get("synthetic")) or any(
        SYNTHETIC_MARK in _text_field(image.header, key).upper() for key in ("descrip", "intent_name")
    )
    return Volume(
        data=data,
        affine=affine,
        path=path,
        provenance=provenance,
        synthetic=synthetic,
        space=provenance_space(provenance),
        description=description,
        time_points=info.time_points,
        time_index=time_index,
    )


def _text_field(header, key: str) -> str:
    try:
        value = header.get(key)
    except Exception:  # noqa: BLE001
        return ""
    if value is None:
        return ""
    raw = value.item() if hasattr(value, "item") else value
    return raw.decode("latin-1", "replace").strip("\x00 ") if isinstance(raw, bytes) else str(raw)


# -- provenance: one sidecar format, one writer, one reader ------------------------------------------------


def provenance_sidecar(provenance: dict[str, Any], **extra: Any) -> bytes:
    """The one provenance sidecar format: the provenance record as a flat JSON object (``<stem>.json``
    beside the NIfTI, the BIDS convention), keys sorted, plus ``extra`` keys (batch_index, file...)."""
    record = {**provenance, **extra}
    return (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8")


def provenance_extension(provenance: dict[str, Any]):
    """The same record as a NIfTI header extension (a comment extension tagged VolSynth), so a file keeps
    its provenance when it travels without its sidecar (the vault stores the NIfTI bytes only)."""
    import nibabel as nib

    body = json.dumps(provenance, sort_keys=True, default=str, separators=(",", ":")).encode("utf-8")
    return nib.nifti1.Nifti1Extension("comment", PROVENANCE_EXTENSION_TAG + body)


def provenance_sidecars(path: Path) -> list[Path]:
    """Where a NIfTI file's provenance sidecar may be, in the order they are read."""
    try:
        stem, _ = split_nifti_name(path)
    except InvalidRequest:
        return []
    # <stem>.json is the format; <stem>.provenance.json is what vault exports wrote before it existed.
    return [path.with_name(stem + ".json"), path.with_name(stem + ".provenance.json")]


def _sidecar_record(side: Path) -> dict[str, Any] | None:
    from engine.errors import InvalidRequest
    from engine.nifti.checks import open_regular_file

    try:
        with open_regular_file(side) as fh:  # a FIFO named like a sidecar is skipped, not waited on
            raw = fh.read(MAX_SIDECAR_BYTES + 1)
        if len(raw) > MAX_SIDECAR_BYTES:
            return None
        record = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError, InvalidRequest):
        return None
    if not isinstance(record, dict):
        return None
    inner = record.get("provenance")
    if isinstance(inner, dict) and set(record) <= {"synthetic", "note", "provenance"}:
        return {**inner, "synthetic": bool(record.get("synthetic") or inner.get("synthetic"))}
    return record


def _extension_record(header) -> dict[str, Any] | None:
    for ext in getattr(header, "extensions", ()):
        try:
            content = ext.get_content()
        except Exception:  # noqa: BLE001
            continue
        if isinstance(content, bytes | bytearray) and content.startswith(PROVENANCE_EXTENSION_TAG):
            try:
                record = json.loads(bytes(content[len(PROVENANCE_EXTENSION_TAG) :]).rstrip(b"\x00"))
            except (ValueError, RecursionError):
                return None
            return record if isinstance(record, dict) else None
    return None


def read_provenance(path: str | Path, header=None) -> dict[str, Any]:
    """A NIfTI file's provenance: its sidecar (``<stem>.json``, or ``<stem>.provenance.json`` from a vault
    export) if there is one, else the VolSynth header extension; ``{}`` when it has neither.

    Args:
        path: The NIfTI file.
        header: Its already-parsed header (with extensions); read from the file when not given.
    """
    path = Path(path)
    for side in provenance_sidecars(path):
        if side.is_file() and (record := _sidecar_record(side)) is not None:
            return record
    if header is None:
        from engine.nifti.checks import inspect_nifti

        try:
            import nibabel as nib

            info = inspect_nifti(path)
            klass = nib.Nifti2Image if info.version == 2 else nib.Nifti1Image
            header = klass.from_filename(str(path)).header
        except Exception:  # noqa: BLE001 - an unreadable file simply has no provenance here
            return {}
    return _extension_record(header) or {}
