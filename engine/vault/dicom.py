"""Reading a DICOM series into a volume with the right orientation and affine.

Geometry (DICOM PS3.3 C.7.6.2.1.1): a pixel at row r, column c of a slice lies at
``ImagePositionPatient + c * dc * row_cos + r * dr * col_cos`` in the patient's LPS frame, where
``ImageOrientationPatient = row_cos + col_cos`` (row_cos is the direction along a row, i.e. of increasing
column index) and ``PixelSpacing = [dr, dc]`` (spacing between rows, then between columns).

The volume is indexed ``[i, j, k] = [column, row, slice]``, slices sorted along the slice normal
``row_cos x col_cos``. Its NIfTI affine maps voxels to RAS (NIfTI's convention), which is LPS with x and
y negated::

    LPS affine columns: row_cos * dc, col_cos * dr, slice_step, IPP of the first slice
    RAS affine = diag(-1, -1, 1, 1) @ LPS affine

``slice_step`` is the vector between consecutive slice positions, so a tilted gantry gives a sheared (but
correct) sform. Voxel values are ``stored * RescaleSlope + RescaleIntercept`` as float32.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import InvalidRequest
from engine.nifti.checks import check_voxel_count, open_regular_file

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: Slices whose spacing differs from the mean by more than this fraction cannot share one affine.
SPACING_TOLERANCE = 0.01
_MEDIA_STORAGE_DIRECTORY = "1.2.840.10008.1.3.10"


@dataclass(frozen=True)
class DicomSeries:
    """A checked, sorted DICOM series ready to import.

    Attributes:
        files: Slice files, sorted along the slice normal.
        shape: (columns, rows, slices).
        affine: Voxel -> RAS mm.
        patient: Patient attributes (name, id, birth date, sex), empty values dropped.
        study: Study and series attributes (date, descriptions, modality, UIDs...).
        sop_uids: SOPInstanceUID of each file, in ``files`` order (checked again when the file is read).
    """

    files: tuple[Path, ...]
    shape: tuple[int, int, int]
    affine: np.ndarray
    patient: dict
    study: dict
    sop_uids: tuple[str, ...]


def _pydicom():
    import pydicom  # imported lazily: only DICOM import/export needs it

    return pydicom


def _candidate_files(source: Path | Sequence[Path]) -> list[Path]:
    if isinstance(source, str | os.PathLike):
        source = Path(source)
        if source.is_dir():
            return sorted(p for p in source.rglob("*") if p.is_file())
        if source.is_file():
            return [source]
        if source.exists():
            open_regular_file(source).close()  # raises, saying what it is (a FIFO, a device...)
        raise InvalidRequest(f"no such file or folder: {source}")
    files = [Path(p) for p in source]
    for p in files:
        if p.exists() and not p.is_file():
            open_regular_file(p).close()  # raises, saying what it is
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise InvalidRequest(f"no such file: {missing[0]}")
    return files


def _text(ds, keyword: str) -> str:
    value = ds.get(keyword)
    if value is None:
        return ""
    return str(value).strip()


def _patient_study(ds) -> tuple[dict, dict]:
    patient = {
        "name": _text(ds, "PatientName"),
        "id": _text(ds, "PatientID"),
        "birth_date": _text(ds, "PatientBirthDate"),
        "sex": _text(ds, "PatientSex"),
    }
    study = {
        "date": _text(ds, "StudyDate"),
        "time": _text(ds, "StudyTime"),
        "description": _text(ds, "StudyDescription"),
        "series_description": _text(ds, "SeriesDescription"),
        "modality": _text(ds, "Modality"),
        "accession_number": _text(ds, "AccessionNumber"),
        "institution": _text(ds, "InstitutionName"),
        "study_instance_uid": _text(ds, "StudyInstanceUID"),
        "series_instance_uid": _text(ds, "SeriesInstanceUID"),
    }
    return {k: v for k, v in patient.items() if v}, {k: v for k, v in study.items() if v}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]


def _floats(ds, keyword: str, count: int, path: Path) -> np.ndarray:
    """A numeric multi-value attribute as ``count`` finite floats, or a one-line refusal naming the file."""
    try:
        raw = ds[keyword].value
        values = [raw] if isinstance(raw, str | bytes | int | float) else list(raw)
        out = np.array([float(v) for v in values], dtype=np.float64)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise InvalidRequest(
            f"{path.name} has an unreadable {keyword} ({_first_line(exc)}); the file is damaged"
        ) from None
    if out.shape != (count,) or not np.all(np.isfinite(out)):
        raise InvalidRequest(
            f"{path.name} has an invalid {keyword} {str(ds[keyword].value)[:80]!r}: expected {count} finite numbers"
        )
    return out


def _int(ds, keyword: str, path: Path, default: int | None = None) -> int:
    try:
        value = ds.get(keyword, default)
        if value is None or value == "":
            if default is None:
                raise KeyError(keyword)
            return default
        return int(value)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise InvalidRequest(
            f"{path.name} has an unreadable {keyword} ({_first_line(exc)}); the file is damaged"
        ) from None


def scan_series(source: Path | Sequence[Path], *, series_uid: str | None = None) -> DicomSeries:
    """Find the DICOM slices in a folder (or a list of files), check them and sort them.

    Non-DICOM files and DICOMDIR files are skipped. Headers only are read here; pixel data is read slice by
    slice at import.

    Args:
        source: A folder (searched recursively), one file, or a list of files.
        series_uid: Which series to take when the folder holds more than one.

    Raises:
        InvalidRequest: No usable slices, several series and no ``series_uid``, multi-frame or colour
            images, missing geometry, inconsistent slices, duplicate positions or uneven spacing.
    """
    chosen = _choose_series(_read_headers(source), source, series_uid)
    orientation, spacing, rows, cols = _check_geometry(chosen, source)
    first = chosen[0][1]  # before sorting: its patient, study and (one slice) thickness are taken
    row_cos, col_cos = orientation[:3], orientation[3:]
    normal = np.cross(row_cos, col_cos)
    if not np.isclose(np.linalg.norm(normal), 1.0, atol=1e-3):
        raise InvalidRequest(f"{chosen[0][0]} has an invalid ImageOrientationPatient {list(orientation)}")
    positions = [_floats(ds, "ImagePositionPatient", 3, path) for path, ds in chosen]
    order = sorted(range(len(chosen)), key=lambda n: float(positions[n] @ normal))
    chosen = [chosen[n] for n in order]
    positions = [positions[n] for n in order]
    step = _slice_step(positions, normal, first)
    lps = np.eye(4)
    lps[:3, 0] = row_cos * spacing[1]  # i = column index: moves along a row, by the column spacing
    lps[:3, 1] = col_cos * spacing[0]  # j = row index: moves down a column, by the row spacing
    lps[:3, 2] = step
    lps[:3, 3] = positions[0]
    patient, study = _patient_study(first)
    return DicomSeries(
        files=tuple(p for p, _ in chosen),
        shape=(cols, rows, len(chosen)),
        affine=LPS_TO_RAS @ lps,
        patient=patient,
        study=study,
        sop_uids=tuple(str(ds.get("SOPInstanceUID", "")) for _, ds in chosen),
    )


def _read_headers(source: Path | Sequence[Path]) -> list[tuple[Path, object]]:
    """(file, header) of every DICOM image file in ``source``; non-DICOM files and DICOMDIRs are skipped."""
    pydicom = _pydicom()
    headers = []
    for path in _candidate_files(source):
        try:
            with open_regular_file(path) as fh:  # a FIFO swapped in after the listing must not block
                ds = pydicom.dcmread(fh, stop_before_pixels=True)
            meta = getattr(ds, "file_meta", None)
            if meta is not None and str(meta.get("MediaStorageSOPClassUID", "")) == _MEDIA_STORAGE_DIRECTORY:
                continue
            if "SeriesInstanceUID" not in ds:
                continue
            str(ds.SeriesInstanceUID)
        except Exception:  # noqa: BLE001 - not DICOM, or a header pydicom cannot parse: not an image here
            continue
        headers.append((path, ds))
    if not headers:
        raise InvalidRequest(f"no DICOM image files found in {source}")
    return headers


def _choose_series(headers: list, source, series_uid: str | None) -> list:
    """The files of the one series asked for (or the only one there is)."""
    by_series: dict[str, list] = {}
    for path, ds in headers:
        by_series.setdefault(str(ds.SeriesInstanceUID), []).append((path, ds))
    if series_uid is not None:
        if series_uid not in by_series:
            raise InvalidRequest(f"series {series_uid} is not in {source}")
        return by_series[series_uid]
    if len(by_series) > 1:
        listing = "; ".join(
            f"{uid} ({_text(items[0][1], 'SeriesDescription') or 'no description'}, {len(items)} files)"
            for uid, items in sorted(by_series.items())
        )
        raise InvalidRequest(f"{source} holds {len(by_series)} series; choose one by its UID: {listing}")
    return next(iter(by_series.values()))


def _check_geometry(chosen: list, source) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(orientation, pixel spacing, rows, columns) shared by every slice of the series; InvalidRequest for
    missing geometry, multi-frame or colour images, or slices that differ."""
    first = chosen[0][1]
    for keyword in ("ImageOrientationPatient", "ImagePositionPatient", "PixelSpacing", "Rows", "Columns"):
        missing = [str(p) for p, ds in chosen if keyword not in ds]
        if missing:
            raise InvalidRequest(
                f"{missing[0]} has no {keyword}; only image series with patient geometry can be imported"
            )
    for path, ds in chosen:
        if _int(ds, "NumberOfFrames", path, 1) > 1:
            raise InvalidRequest(f"{path} is a multi-frame image; multi-frame DICOM is not supported yet")
        if _int(ds, "SamplesPerPixel", path, 1) != 1:
            raise InvalidRequest(f"{path} is a colour image; only greyscale series can be imported")

    first_path = chosen[0][0]
    orientation = _floats(first, "ImageOrientationPatient", 6, first_path)
    spacing = _floats(first, "PixelSpacing", 2, first_path)
    if np.any(spacing <= 0):
        raise InvalidRequest(
            f"{first_path.name} has PixelSpacing {[float(v) for v in spacing]}; spacings must be positive (mm)"
        )
    rows, cols = _int(first, "Rows", first_path), _int(first, "Columns", first_path)
    if rows <= 0 or cols <= 0:
        raise InvalidRequest(f"{first_path.name} claims {rows} x {cols} pixels; the file is damaged")
    check_voxel_count((cols, rows, len(chosen)), f"the DICOM series in {Path(str(source)).name}")
    for path, ds in chosen[1:]:
        if not np.allclose(_floats(ds, "ImageOrientationPatient", 6, path), orientation, atol=1e-4):
            raise InvalidRequest(f"{path} has a different orientation from the rest of the series")
        if not np.allclose(_floats(ds, "PixelSpacing", 2, path), spacing, rtol=1e-4):
            raise InvalidRequest(f"{path} has a different pixel spacing from the rest of the series")
        if (_int(ds, "Rows", path), _int(ds, "Columns", path)) != (rows, cols):
            raise InvalidRequest(f"{path} has a different image size from the rest of the series")
    return orientation, spacing, rows, cols


def _slice_step(positions: list[np.ndarray], normal: np.ndarray, first) -> np.ndarray:
    """The vector from one slice to the next (slices sorted along ``normal``); InvalidRequest for slices at
    the same position or unevenly spaced. One slice: its thickness along the normal."""
    if len(positions) > 1:
        dist = np.array([float(p @ normal) for p in positions])
        gaps = np.diff(dist)
        if np.any(np.abs(gaps) < 1e-3):
            raise InvalidRequest(
                "the series has several slices at the same position (multi-echo, dynamic or duplicate "
                "files); import one echo/time point at a time"
            )
        mean_gap = float(gaps.mean())
        if np.max(np.abs(gaps - mean_gap)) > SPACING_TOLERANCE * abs(mean_gap) + 1e-3:
            raise InvalidRequest(
                f"the slices are unevenly spaced ({gaps.min():.3f} to {gaps.max():.3f} mm, missing slices?); "
                "a volume needs evenly spaced slices"
            )
        return (positions[-1] - positions[0]) / (len(positions) - 1)
    try:
        thickness = float(first.get("SpacingBetweenSlices") or first.get("SliceThickness") or 1.0)
    except (TypeError, ValueError):
        thickness = 1.0
    if not np.isfinite(thickness) or thickness <= 0:
        thickness = 1.0  # one slice: the step only sets the voxel's depth, not where anything lies
    return normal * thickness


def slice_voxels(
    raw: bytes, *, expected_sop_uid: str, shape: tuple[int, int], label: str = "a slice"
) -> bytes:
    """Decode one slice file's pixels into the volume's on-disk layout.

    Returns little-endian float32 bytes of the ``[i=column, j=row]`` plane in NIfTI (Fortran) order, which
    is the DICOM pixel array (rows x columns) in C order.

    Args:
        raw: The file's bytes (the same bytes that are stored encrypted, so the two cannot disagree).
        expected_sop_uid: The SOPInstanceUID seen when the series was scanned (the file must not have
            changed in between).
        shape: (columns, rows).
        label: How errors name the slice ("slice 3 of 95"): never by its UIDs, which are identifiers.
    """
    pydicom = _pydicom()
    try:
        ds = pydicom.dcmread(io.BytesIO(raw))
    except Exception as exc:  # noqa: BLE001 - the header was read at scan time; now it fails: changed file
        raise InvalidRequest(f"a DICOM file can no longer be read ({_first_line(exc)}); try again") from None
    if str(ds.get("SOPInstanceUID", "")) != expected_sop_uid:
        raise InvalidRequest("a DICOM file changed while it was being imported; try again")
    try:
        pixels = ds.pixel_array
    except Exception as exc:  # pydicom raises several types for missing decoders / bad data
        raise InvalidRequest(
            f"cannot decode the pixel data of {label} "
            f"(transfer syntax {ds.file_meta.get('TransferSyntaxUID', 'unknown')}): {_first_line(exc)}"
        ) from None
    if pixels.shape != (shape[1], shape[0]):
        raise InvalidRequest(f"{label} has {pixels.shape} pixels, expected {(shape[1], shape[0])}")
    return rescale(ds, pixels).astype("<f4").tobytes(order="C")


def rescale(ds, pixels: np.ndarray) -> np.ndarray:
    """Stored values -> real-world values (``* RescaleSlope + RescaleIntercept``), as float32."""
    try:
        slope = float(ds.get("RescaleSlope", 1) or 1)
        intercept = float(ds.get("RescaleIntercept", 0) or 0)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"a slice has an unreadable RescaleSlope/RescaleIntercept ({exc})") from None
    if not (np.isfinite(slope) and np.isfinite(intercept)):
        raise InvalidRequest(f"a slice has a non-finite rescale ({slope}, {intercept}); the file is damaged")
    return (pixels.astype(np.float64) * slope + intercept).astype(np.float32)
