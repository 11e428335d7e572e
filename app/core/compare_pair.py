"""Two volumes side by side (Qt-free): which space they share, how one's crosshair maps into the other, and
the other's slice resampled onto this one's for a blend.

The model is 3D Slicer's: a background volume (A, the one shown) and a foreground volume (B) over it at an
opacity, with every view linked through world coordinates (RAS millimetres). Linking through millimetres
means anatomy only where both volumes name the same template space (MNI152 for both, say); a scan in its
scanner's millimetres and a synthetic volume in a template do not share one, and then the views are linked
centre to centre (the same offset in millimetres from each volume's centre), which ``link_text`` says. A scan
whose header says "aligned to a template" without naming it (sform code 2: nilearn's MNI152 files) may be
declared MNI152 by the user (``to_declare``), and is then linked by millimetres.
"""

from __future__ import annotations

import numpy as np

from app.core.tissue import ALIGNED_TO_TEMPLATE, is_mni
from app.core.volumes import ras_to_voxel, voxel_to_ras


def space_name(entry) -> str:
    """The template space a volume names, for people: "MNI152"; when it names none, "scanner millimetres"
    for a scan and "no template space" for a synthetic volume (its millimetres are its grid's only)."""
    space = getattr(entry, "space", None)
    if is_mni(space):
        return "MNI152"
    if space:
        return str(space)
    return "no template space" if getattr(entry, "synthetic", False) else "scanner millimetres"


def shared_space(a, b) -> str:
    """The template space both volumes are in ("" when they do not name the same one)."""
    sa, sb = getattr(a, "space", None), getattr(b, "space", None)
    if not sa or not sb:
        return ""
    if is_mni(sa) and is_mni(sb):
        return "MNI152"
    return str(sa) if str(sa) == str(sb) else ""


def declarable(entry) -> bool:
    """Whether ``entry`` may be declared MNI152: its header says it is aligned to a template without naming one
    (sform code 2, as nilearn writes the MNI152 template)."""
    return getattr(entry, "space", None) == ALIGNED_TO_TEMPLATE


def to_declare(a, b):
    """The volume of the pair whose declaration as MNI152 would link the two by millimetres (A first), or None:
    one that may be declared beside one in MNI152 (or one that may be declared too)."""
    if shared_space(a, b):
        return None
    for one, other in ((a, b), (b, a)):
        if declarable(one) and (is_mni(getattr(other, "space", None)) or declarable(other)):
            return one
    return None


def link_text(a, b) -> str:
    """One line on how the two are linked, for the bar above the views."""
    space = shared_space(a, b)
    if space:
        return f"Linked in {space} millimetres: the crosshair is at the same place in both."
    return (
        f"No shared space (A: {space_name(a)}, B: {space_name(b)}): linked centre to centre in millimetres, "
        "not by anatomy."
    )


def linked_ras(source, target, ras) -> np.ndarray:
    """The point of ``target`` that ``ras`` (a point of ``source``) is linked to: the same millimetres in a
    shared space, else the same offset from each volume's centre. Clamped to ``target``'s voxels."""
    ras = np.asarray(ras, dtype=np.float64)
    if not shared_space(source, target):
        ras = target.center_ras() + (ras - source.center_ras())
    ijk = np.clip(np.round(ras_to_voxel(target.affine, ras)), 0, np.asarray(target.shape) - 1)
    return voxel_to_ras(target.affine, ijk)


def resampled_plane(a, b, geometry, index: int) -> np.ndarray:
    """B's values on the pixels of A's display plane ``index`` (nearest voxel), NaN where B has none.

    ``geometry`` is the view's ``PlaneGeometry``; the mapping is the one ``linked_ras`` uses.
    """
    rows, cols = geometry.display_shape(a.shape)
    row, col = np.mgrid[0:rows, 0:cols].astype(np.float64)
    ijk = np.empty((4, rows, cols))
    ijk[geometry.slice_axis] = index
    ijk[geometry.col_axis] = (cols - 1 - col) if geometry.col_flip else col
    ijk[geometry.row_axis] = (rows - 1 - row) if geometry.row_flip else row
    ijk[3] = 1.0
    world = np.tensordot(np.asarray(a.affine, dtype=np.float64), ijk, axes=1)[:3]
    if not shared_space(a, b):
        world += (b.center_ras() - a.center_ras())[:, None, None]
    inverse = np.linalg.inv(np.asarray(b.affine, dtype=np.float64))
    target = np.rint(np.tensordot(inverse[:3, :3], world, axes=1) + inverse[:3, 3, None, None]).astype(int)
    shape = np.asarray(b.shape)[:, None, None]
    inside = np.all((target >= 0) & (target < shape), axis=0)
    out = np.full((rows, cols), np.nan, dtype=np.float32)
    clipped = np.clip(target, 0, shape - 1)
    values = np.asarray(b.data)[clipped[0], clipped[1], clipped[2]]
    out[inside] = values[inside]
    return out
