"""Tissue maps that go with a volume (GM, WM, CSF, ventricles...) and the template space it lies in: their
names, order and colours, what to call the space, and how the maps are coloured over a slice. Qt-free: the
slice views, the tissue toolbar and the tests use these; ``app.core.nifti_files`` reads and writes the maps
with their image."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

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
    "brain": "brain mask",
}
#: Maps that lie inside another map (the ventricles are CSF): in the label map they are drawn over it.
SUBREGIONS = frozenset({"ventricles"})
#: Masks that hold the classes (a segmentation's brain mask): no class of the label map, shown on their own.
MASKS = frozenset({"brain"})
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


#: A header that says its millimetres are a template's without naming which (sform code 2): nilearn writes its
#: MNI152 files so. The user may declare it MNI152 (``DECLARED_MNI``).
ALIGNED_TO_TEMPLATE = "aligned to a template (sform code 2)"
DECLARED_MNI = "MNI152 (declared)"


def space_text(space: str | None, sform_code: int | None = None) -> str | None:
    """What to call a volume's space: its template name when one is known, else what the NIfTI header's
    sform code says (``MNI152 (sform code 4)``); None when neither names one (scanner millimetres)."""
    if space:
        return str(space)
    return {
        4: "MNI152 (sform code 4)",
        3: "Talairach (sform code 3)",
        2: ALIGNED_TO_TEMPLATE,
    }.get(sform_code if sform_code is not None else -1)


def is_mni(space: str | None) -> bool:
    return bool(space) and str(space).upper().startswith("MNI152")


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
    parts = (
        [i for i, n in enumerate(names) if n not in SUBREGIONS | MASKS]
        or [i for i, n in enumerate(names) if n not in MASKS]
        or list(range(len(names)))
    )
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
