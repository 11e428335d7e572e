"""The MNI152 2009 template, on the demo model's output grid: tissue maps, brain mask, ventricles.

Reference anatomy for the synthetic training data (engine.training.synth) and for the measurements that
evaluation and cohort reports make on generated volumes (engine.anatomy.measures). Offline: the template files
the product ships (engine.anatomy.mni152, the files nilearn distributes), nothing is fetched."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

OUTPUT_SHAPE = (80, 96, 80)
SPACING_MM = 2.0
VOXEL_ML = SPACING_MM**3 / 1000.0
SHARPEN_POWER = 4.0  # see _sharpen
# The template shipped in resources/mni152 (mni_icbm152_*_tal_nlin_sym_09a): its TemplateFlow / BIDS space name.
MNI_SPACE = "MNI152NLin2009aSym"
# Lateral-ventricle search box in MNI mm (x, y, z); the ventricles of the 2009 template lie well inside it.
_VENT_BOX_MNI = ((-28.0, 28.0), (-48.0, 32.0), (-6.0, 36.0))


def _template_data():
    """The loaders of the shipped MNI152 files (engine.anatomy.mni152: nilearn's ``load_mni152_*`` without
    nilearn)."""
    from engine.anatomy import mni152

    return mni152


@lru_cache(maxsize=1)
def template_priors_1mm() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Priors (CSF, GM, WM stacked, float32) and brain mask of MNI152 2009 at 1 mm, and their affine: what
    segmentation (engine.anatomy.segment), registration, the norms and the anatomy checks place on a volume."""
    datasets = _template_data()
    gm_img = datasets.load_mni152_gm_template(resolution=1)
    gm = np.clip(np.asarray(gm_img.get_fdata(), np.float32), 0, 1)
    wm = np.clip(np.asarray(datasets.load_mni152_wm_template(resolution=1).get_fdata(), np.float32), 0, 1)
    mask = np.asarray(datasets.load_mni152_brain_mask(resolution=1).get_fdata() > 0.5)
    csf = np.clip(1.0 - gm - wm, 0, 1) * mask
    return np.stack([csf, gm, wm]), mask, np.asarray(gm_img.affine, np.float64)


@lru_cache(maxsize=1)
def _template_images():
    datasets = _template_data()
    return {
        "t1": datasets.load_mni152_template(resolution=2),
        "gm": datasets.load_mni152_gm_template(resolution=2),
        "wm": datasets.load_mni152_wm_template(resolution=2),
        "mask": datasets.load_mni152_brain_mask(resolution=2),
    }


def template_mask_image():
    """The MNI152 2009 brain mask on its own 2 mm grid (a nibabel image), for Dice through the affines."""
    return _template_images()["mask"]


def _crop_offset() -> np.ndarray:
    """Template voxel index of the crop's first voxel: the brain mask's centroid at the crop's centre."""
    from scipy import ndimage

    mask = np.asarray(_template_images()["mask"].get_fdata() > 0.5)
    centroid = np.array(ndimage.center_of_mass(mask))
    return np.round(centroid - (np.array(OUTPUT_SHAPE) - 1) / 2.0).astype(int)


def crop_affine() -> np.ndarray:
    """Voxel -> MNI152 mm affine of the output grid (a whole-voxel crop of the template's 2 mm grid)."""
    affine = np.asarray(_template_images()["t1"].affine, np.float64)
    shift = np.eye(4)
    shift[:3, 3] = _crop_offset()
    return affine @ shift


def _crop(volume: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``volume`` cut to OUTPUT_SHAPE from ``offset``; voxels outside the template are 0."""
    out = np.zeros(OUTPUT_SHAPE, np.float32)
    src, dst = [], []
    for o, n, size in zip(offset, OUTPUT_SHAPE, volume.shape, strict=True):
        lo, hi = max(o, 0), min(o + n, size)
        src.append(slice(lo, hi))
        dst.append(slice(lo - o, hi - o))
    out[tuple(dst)] = volume[tuple(src)]
    return out


@lru_cache(maxsize=1)
def template_maps() -> dict[str, np.ndarray]:
    """GM, WM, brain mask and ventricle maps of MNI152 2009 on the output grid, plus the template T1.

    Returns:
        dict with float32 arrays "gm", "wm", "mask", "ventricles", "t1" of shape OUTPUT_SHAPE and
        "centre_mni" (the MNI mm coordinate of the volume centre).
    """
    from scipy import ndimage

    images = _template_images()
    offset = _crop_offset()
    out = {k: _crop(np.asarray(img.get_fdata(), np.float32), offset) for k, img in images.items()}
    affine = crop_affine()
    out["mask"] = (out["mask"] > 0.5).astype(np.float32)
    out["gm"], out["wm"] = _sharpen(np.clip(out["gm"], 0, 1), np.clip(out["wm"], 0, 1), out["mask"])
    ijk = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in OUTPUT_SHAPE], indexing="ij")
    mni = [sum(affine[r, c] * ijk[c] for c in range(3)) + affine[r, 3] for r in range(3)]
    out["ventricles"] = _ventricle_label(out["gm"], out["wm"], out["mask"], mni).astype(np.float32)
    # Distance (voxels) from the ventricles, limited to the eroded mask, for the ventricle dilation.
    out["ventricle_distance"] = ndimage.distance_transform_edt(out["ventricles"] < 0.5).astype(np.float32)
    out["inner_mask"] = ndimage.binary_erosion(out["mask"] > 0.5, iterations=4).astype(np.float32)
    centre = (np.array(OUTPUT_SHAPE) - 1) / 2.0
    out["centre_mni"] = (affine[:3, :3] @ centre + affine[:3, 3]).astype(np.float32)
    return out


def _sharpen(gm: np.ndarray, wm: np.ndarray, mask: np.ndarray, power: float = SHARPEN_POWER):
    """Crisper tissue maps: p_c^power / sum_c p_c^power over GM, WM and CSF, inside the mask.

    The 2009 template is an average of 152 brains, so its tissue boundaries are far more blurred than any
    one brain's; mixing intensities with the raw maps gives a continuum between GM and WM instead of the
    two histogram modes of a real T1 scan. Raising the class probabilities to a power restores individual-
    scan-like boundaries while keeping partial volume at the edges.
    """
    csf = np.clip(1.0 - gm - wm, 0, 1)
    stack = np.stack([gm, wm, csf]) ** power
    stack /= np.maximum(stack.sum(0, keepdims=True), 1e-6)
    return (stack[0] * mask).astype(np.float32), (stack[1] * mask).astype(np.float32)


def _ventricle_label(gm: np.ndarray, wm: np.ndarray, mask: np.ndarray, mni: list[np.ndarray]) -> np.ndarray:
    """CSF (neither GM nor WM) inside the eroded brain mask, in the central box, largest components."""
    from scipy import ndimage

    csf = (mask > 0.5) & (gm + wm < 0.5)
    inner = ndimage.binary_erosion(mask > 0.5, iterations=3)
    box = np.ones_like(inner)
    for axis, (lo, hi) in enumerate(_VENT_BOX_MNI):
        box &= (mni[axis] >= lo) & (mni[axis] <= hi)
    cand = csf & inner & box
    labels, n = ndimage.label(cand)
    if n == 0:
        return cand
    sizes = ndimage.sum(cand, labels, index=np.arange(1, n + 1))
    # Keep components of at least 10% of the largest one: both lateral ventricles and the third ventricle,
    # not the scattered sulcal CSF that the box also catches.
    keep = np.flatnonzero(sizes >= 0.1 * sizes.max()) + 1
    return np.isin(labels, keep)


def ventricle_roi() -> np.ndarray:
    """Boolean central region (output grid) where ventricles are measured on generated images.

    The template ventricles dilated by 6 voxels: wide enough for the largest ventricles and brain-size
    changes in the training distribution, narrow enough to exclude most sulcal CSF.
    """
    from scipy import ndimage

    vent = template_maps()["ventricles"] > 0.5
    return ndimage.binary_dilation(vent, iterations=6)


def template_brain_mask() -> np.ndarray:
    """The MNI152 brain mask on the output grid (bool), the reference for Dice in the evaluation."""
    return template_maps()["mask"] > 0.5
