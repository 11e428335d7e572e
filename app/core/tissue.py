"""Tissue maps that go with a volume (GM, WM, CSF, ventricles...) and the template space it lies in: how
they are found beside a NIfTI file and read, how they are written with it, and how they are coloured over
a slice. Qt-free: the slice views, the main window's open and save, and the tests use these.

On disk a tissue map is a probability map beside its image, named BIDS-derivative style by
``engine.nifti.io.tissue_path`` (``brain_T1w.nii.gz`` -> ``brain_label-GM_probseg.nii.gz``); the image's
provenance lists them (``tissue_maps: {name: file name}``), as ``engine.nifti.io.save_result`` writes them.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.nifti.volume import Volume

#: The maps the shipped model makes, in the order they are listed; other names follow in their own order.
TISSUE_ORDER = ("GM", "WM", "CSF", "ventricles")
#: Overlay colours (RGB): distinct from one another and from grey anatomy, and readable to red-green colour
#: blindness (orange against blue), in the spirit of the FreeSurfer colour table (ventricles purple).
TISSUE_COLOURS: dict[str, tuple[int, int, int]] = {
    "GM": (255, 150, 40),  # orange
    "WM": (60, 160, 255),  # blue
    "CSF": (60, 220, 200),  # cyan-green
    "ventricles": (215, 80, 235),  # purple
}
OTHER_COLOURS = ((240, 220, 60), (240, 90, 90), (150, 230, 90), (250, 250, 250))
TISSUE_TITLES = {
    "GM": "grey matter",
    "WM": "white matter",
    "CSF": "cerebrospinal fluid",
    "ventricles": "ventricles",
}
#: Maps that lie inside another map (the ventricles are CSF): in the label map they are drawn over it.
SUBREGIONS = frozenset({"ventricles"})
ALL_TISSUES = "All tissues"
DEFAULT_OPACITY = 0.4
#: Below this probability a voxel belongs to no map in the label map (background).
LABEL_THRESHOLD = 0.5


def ordered_names(names: Iterable[str]) -> list[str]:
    """Tissue names in display order: the known ones first (GM, WM, CSF, ventricles), then the rest."""
    names = list(dict.fromkeys(names))
    known = [n for n in TISSUE_ORDER if n in names]
    return known + [n for n in names if n not in known]


def tissue_colour(name: str, names: Iterable[str] = ()) -> tuple[int, int, int]:
    """The overlay colour of map ``name`` (``names``: all maps of its volume, for a stable colour of others)."""
    if name in TISSUE_COLOURS:
        return TISSUE_COLOURS[name]
    others = [n for n in ordered_names(names) if n not in TISSUE_COLOURS]
    index = others.index(name) if name in others else 0
    return OTHER_COLOURS[index % len(OTHER_COLOURS)]


def tissue_title(name: str) -> str:
    """``GM (grey matter)``; other names as they are."""
    return f"{name} ({TISSUE_TITLES[name]})" if name in TISSUE_TITLES and name != "ventricles" else name


def space_text(space: str | None, sform_code: int | None = None) -> str | None:
    """What to call a volume's space: its template name when one is known, else what the NIfTI header's
    sform code says (``MNI152 (sform code 4)``); None when neither names one (scanner millimetres)."""
    if space:
        return str(space)
    return {
        4: "MNI152 (sform code 4)",
        3: "Talairach (sform code 3)",
        2: "aligned to a template (sform code 2)",
    }.get(sform_code if sform_code is not None else -1)


def is_mni(space: str | None) -> bool:
    return bool(space) and str(space).upper().startswith("MNI152")


# -- files -----------------------------------------------------------------------------------------------


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


def save_volume_files(
    path: str | Path,
    data: np.ndarray,
    affine: np.ndarray,
    *,
    provenance: Mapping[str, Any],
    synthetic: bool,
    tissue: Mapping[str, np.ndarray] | None = None,
    space: str | None = None,
) -> Path:
    """Write a volume as NIfTI + provenance sidecar, with its tissue maps beside it (worker thread).

    As ``engine.nifti.io.save_result`` writes a generated batch: the maps go to ``tissue_path`` names, the
    image's provenance lists them (``tissue_maps``), every file has the image's affine and the sform code of
    ``space`` (4 for MNI152), and all files appear together or none does (``atomic_files``).

    Raises:
        engine.errors.OutputError: the files cannot be written (nothing is left behind).
    """
    from engine.nifti.io import atomic_files, check_output_path, image_files, write_image_files

    path = check_output_path(path)
    tissue = {name: (tissue or {})[name] for name in ordered_names(tissue or {})}
    targets = image_files(path, tissue)
    with atomic_files(targets) as temps:
        write_image_files(
            dict(zip(targets, temps, strict=True)),
            path,
            data,
            affine,
            dict(provenance),
            tissue,
            synthetic=synthetic,
            space=space,
        )
    return path


# -- overlay ---------------------------------------------------------------------------------------------


def label_map(planes: Mapping[str, np.ndarray]) -> np.ndarray:
    """The most likely class of each pixel: 0 for none (background wins), else 1 + its index in ``planes``.

    The maps that partition the brain (GM, WM, CSF) compete with the background (what they leave of 1);
    a subregion (the ventricles, inside CSF) is drawn over them where it is at least ``LABEL_THRESHOLD``.
    """
    names = list(planes)
    if not names:
        raise ValueError("no tissue maps")
    shape = next(iter(planes.values())).shape
    parts = [i for i, n in enumerate(names) if n not in SUBREGIONS] or list(range(len(names)))
    stack = np.stack([np.asarray(planes[names[i]], dtype=np.float32) for i in parts])
    background = np.clip(1.0 - stack.sum(axis=0), 0.0, 1.0)
    best = stack.argmax(axis=0)
    labels = np.where(stack.max(axis=0) > background, np.asarray(parts)[best] + 1, 0)
    for index, name in enumerate(names):
        if name in SUBREGIONS and index not in parts:
            labels = np.where(np.asarray(planes[name]) >= LABEL_THRESHOLD, index + 1, labels)
    return labels.astype(np.int32).reshape(shape)


def overlay_rgba(planes: Mapping[str, np.ndarray], choice: str, opacity: float) -> np.ndarray:
    """A premultiplied RGBA (rows, cols, 4) uint8 image to paint over a slice.

    ``choice`` names one map, drawn in its colour with alpha = opacity x probability, or ``ALL_TISSUES``:
    the label map of the most likely class, each in its colour at ``opacity``.
    """
    names = ordered_names(planes)
    planes = {name: planes[name] for name in names}
    opacity = float(min(max(opacity, 0.0), 1.0))
    shape = next(iter(planes.values())).shape
    rgb = np.zeros((*shape, 3), dtype=np.float32)
    if choice in planes:
        alpha = np.clip(np.asarray(planes[choice], dtype=np.float32), 0.0, 1.0) * opacity
        rgb[:] = tissue_colour(choice, names)
    else:
        labels = label_map(planes)
        palette = np.array([(0, 0, 0)] + [tissue_colour(n, names) for n in names], dtype=np.float32)
        rgb = palette[labels]
        alpha = np.where(labels > 0, opacity, 0.0).astype(np.float32)
    out = np.empty((*shape, 4), dtype=np.uint8)
    out[..., :3] = np.rint(rgb * alpha[..., None])
    out[..., 3] = np.rint(alpha * 255.0)
    return out


def tissue_at(tissue: Mapping[str, np.ndarray], voxel: Iterable[int], choice: str) -> str:
    """The readout of the tissue under a voxel: ``GM 0.82`` for one map, or the most likely class of the
    label map (``WM 0.91``; ``background`` where none wins)."""
    if not tissue:
        return ""
    index = tuple(int(v) for v in voxel)
    names = ordered_names(tissue)
    values = {name: float(tissue[name][index]) for name in names}
    if choice in values:
        return f"{choice} {values[choice]:.2f}"
    label = int(label_map({name: np.asarray(values[name]) for name in names}))
    if label == 0:
        return "background"
    name = names[label - 1]
    return f"{name} {values[name]:.2f}"
