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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidRequest, OutputError

SYNTHETIC_DESCRIP = "SYNTHETIC (VolSynth Studio)"
NIFTI_SUFFIXES = (".nii.gz", ".nii")


def split_nifti_name(path: Path) -> tuple[str, str]:
    name = path.name
    for suffix in NIFTI_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)], suffix
    raise InvalidRequest(f"output file {path} must end in .nii.gz or .nii")


def sidecar_path(nifti_path: Path) -> Path:
    stem, _ = split_nifti_name(nifti_path)
    return nifti_path.with_name(stem + ".json")


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


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def make_nifti(volume: np.ndarray, affine: np.ndarray, *, synthetic: bool, descrip: str = ""):
    import nibabel as nib

    image = nib.Nifti1Image(np.asarray(volume, dtype=np.float32), np.asarray(affine, dtype=np.float64))
    header = image.header
    header.set_xyzt_units(xyz="mm", t="sec")
    header.set_qform(affine, code=1)  # scanner-anatomical RAS
    header.set_sform(affine, code=1)
    text = SYNTHETIC_DESCRIP if synthetic else descrip
    header["descrip"] = text[:79].encode("ascii", "replace")
    if synthetic:
        header["intent_name"] = b"SYNTHETIC"
        header["aux_file"] = b"volsynth-synthetic"
        image.header.extensions.append(
            nib.nifti1.Nifti1Extension(
                "comment", b"SYNTHETIC volume generated by VolSynth Studio; not a patient scan"
            )
        )
    return image


def save_result(result, out: str | Path) -> list[Path]:
    """Write each volume of a SamplingResult as NIfTI + JSON sidecar. Returns the NIfTI paths."""
    out = check_output_path(out)
    nifti_paths = batch_paths(out, result.volumes.shape[0])
    targets = [p for path in nifti_paths for p in (path, sidecar_path(path))]
    with atomic_files(targets) as temps:
        for index, path in enumerate(nifti_paths):
            nii_temp, json_temp = temps[2 * index], temps[2 * index + 1]
            make_nifti(result.volume(index), result.affine, synthetic=True).to_filename(str(nii_temp))
            sidecar = dict(result.provenance)
            sidecar["batch_index"] = index
            sidecar["file"] = path.name
            json_temp.write_text(json.dumps(sidecar, indent=2, sort_keys=True, default=str), encoding="utf-8")
    return nifti_paths


def save_volume(
    volume: np.ndarray,
    affine: np.ndarray,
    out: str | Path,
    *,
    provenance: dict[str, Any] | None = None,
    synthetic: bool = False,
) -> Path:
    """Write one volume (and its sidecar if provenance is given) atomically."""
    out = check_output_path(out)
    targets = [out] + ([sidecar_path(out)] if provenance is not None else [])
    with atomic_files(targets) as temps:
        make_nifti(volume, affine, synthetic=synthetic).to_filename(str(temps[0]))
        if provenance is not None:
            temps[1].write_text(
                json.dumps(provenance, indent=2, sort_keys=True, default=str), encoding="utf-8"
            )
    return out


@dataclass
class LoadedVolume:
    """A volume read from disk, reoriented to RAS+ so the viewer's labels are right."""

    data: np.ndarray  # float32 (x, y, z)
    affine: np.ndarray  # voxel -> RAS mm
    path: Path | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    synthetic: bool = False
    description: str = ""

    @property
    def spacing(self) -> tuple[float, float, float]:
        return tuple(float(v) for v in np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0)))  # type: ignore[return-value]


def canonical_volume(image, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A nibabel image as float32 (x, y, z) in RAS+ and its affine: the first volume of 4D data,
    non-finite values zeroed. Works on in-memory images too (the vault never writes decrypted data)."""
    import nibabel as nib

    image = nib.as_closest_canonical(image)
    data = np.asanyarray(image.dataobj, dtype=np.float32)
    if data.ndim == 4:
        data = data[..., 0]
    if data.ndim != 3:
        raise InvalidRequest(f"{name} has {data.ndim} dimensions; VolSynth shows 3D volumes")
    if not np.all(np.isfinite(data)):
        data = np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0)
    return np.ascontiguousarray(data), np.asarray(image.affine, dtype=np.float64)


def load_nifti(path: str | Path) -> LoadedVolume:
    """Read a 3D NIfTI (or the first volume of a 4D one) as float32 in RAS+ orientation."""
    import nibabel as nib
    from nibabel.filebasedimages import ImageFileError

    path = Path(path).expanduser()
    if not path.is_file():
        raise InvalidRequest(f"no file at {path}")
    try:
        image = nib.load(str(path))
        data, affine = canonical_volume(image, path.name)
    except InvalidRequest:
        raise
    except (ImageFileError, OSError, ValueError, EOFError, MemoryError) as exc:
        raise InvalidRequest(
            f"{path.name} is not a readable NIfTI file ({exc}); check the file is complete"
        ) from exc
    except Exception as exc:  # gzip/zlib raise their own error types on truncated files
        raise InvalidRequest(f"{path.name} could not be read as NIfTI ({type(exc).__name__}: {exc})") from exc
    descrip = image.header.get("descrip")
    description = descrip.item().decode("ascii", "replace").strip("\x00 ") if descrip is not None else ""
    provenance: dict[str, Any] = {}
    side = None
    with contextlib.suppress(InvalidRequest):
        side = sidecar_path(path)
    if side is not None and side.is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            provenance = json.loads(side.read_text(encoding="utf-8"))
    synthetic = "SYNTHETIC" in description.upper() or bool(provenance.get("synthetic"))
    return LoadedVolume(
        data=data,
        affine=affine,
        path=path,
        provenance=provenance,
        synthetic=synthetic,
        description=description,
    )
