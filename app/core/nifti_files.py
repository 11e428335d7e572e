"""The app's NIfTI files: open a volume with the tissue maps beside it, save one with them (worker thread).

On disk a tissue map is a probability map beside its image, named BIDS-derivative style by
``engine.nifti.io.tissue_path`` (``brain_T1w.nii.gz`` -> ``brain_label-GM_probseg.nii.gz``); the image's
provenance lists them (``tissue_maps: {name: file name}``), as ``engine.nifti.io.save_volume`` writes them.
Qt-free: the main window's open, crash recovery and the tests use these; saving is ``save_volume``'s.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from app.core.tissue import ordered_names, space_text
from engine.nifti.volume import Volume


def _plain_file_name(value: Any) -> str | None:
    """A file name with no folder part (a sidecar is untrusted text: it never points elsewhere)."""
    if not isinstance(value, str) or not value or value in (".", ".."):
        return None
    return value if Path(value).name == value and "\\" not in value and "/" not in value else None


def tissue_files(image_path: str | Path, provenance: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """The tissue-map files beside ``image_path`` that exist: those its provenance lists (``tissue_maps``),
    else the standard names (``<stem>_label-<name>_probseg.nii.gz``, see ``engine.nifti.io.tissue_path``)."""
    from engine.errors import InvalidRequest
    from engine.nifti.io import tissue_path

    image_path = Path(image_path)
    found: dict[str, Path] = {}
    if (provenance or {}).get("tissue_map"):  # this file is itself a tissue map (its record names the rest)
        return {}
    listed = (provenance or {}).get("tissue_maps")
    if isinstance(listed, Mapping):
        for name, file_name in listed.items():
            plain = _plain_file_name(file_name)
            if plain is not None and (image_path.parent / plain).is_file():
                found[str(name)] = image_path.parent / plain
        if found:
            return {name: found[name] for name in ordered_names(found)}
    # Any <stem>_label-<name>_probseg file beside the image, named as tissue_path names it.
    try:
        probe = tissue_path(image_path, "\0")
    except InvalidRequest:  # not a NIfTI name
        return {}
    prefix, tail = probe.name.split("\0")
    for candidate in sorted(image_path.parent.glob(glob.escape(prefix) + "*" + glob.escape(tail))):
        name = candidate.name[len(prefix) : len(candidate.name) - len(tail)]
        if name.isalnum() and candidate != image_path and candidate.is_file():
            found[name] = candidate
    return {name: found[name] for name in ordered_names(found)}


def _sform_code(path: Path) -> int | None:
    from engine.nifti.checks import inspect_nifti

    try:
        return int(inspect_nifti(path).header["sform_code"])
    except Exception:  # noqa: BLE001 - an unreadable header just names no space
        return None


def open_volume(path: str | Path, time_index: int = 0) -> Volume:
    """Read a NIfTI volume (worker thread) and the tissue maps beside it: the engine's volume record, its
    ``space`` said for people (``space_text``) and its ``tissue`` filled.

    A map that cannot be read, or does not match the image voxel for voxel (shape and affine), is left
    out with a note (``notes``) saying why; it never stops the image from opening.

    Raises:
        engine.errors.InvalidRequest, OutOfMemory: the image itself cannot be read (as ``load_nifti``).
    """
    from engine.errors import EngineError
    from engine.nifti.io import load_nifti

    opened = load_nifti(path, time_index=time_index)
    path = opened.path or Path(path)
    opened.space = space_text(opened.space, _sform_code(path))
    for name, map_path in tissue_files(path, opened.provenance).items():
        try:
            tissue = load_nifti(map_path)
        except EngineError as exc:
            opened.notes.append(f"tissue map {name} ({map_path.name}) skipped: {exc}")
            continue
        if tissue.data.shape != opened.data.shape:
            opened.notes.append(
                f"tissue map {name} ({map_path.name}) skipped: its shape {tissue.data.shape} is not the "
                f"image's {opened.data.shape}"
            )
        elif not np.allclose(tissue.affine, opened.affine, atol=1e-3):
            opened.notes.append(
                f"tissue map {name} ({map_path.name}) skipped: it lies elsewhere in space than the image "
                "(a different affine)"
            )
        else:
            opened.tissue[name] = np.clip(tissue.data, 0.0, 1.0, out=tissue.data)
    return opened
