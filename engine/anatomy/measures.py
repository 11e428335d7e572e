"""Measurements on a brain T1 image: the brain mask and the ventricle volume, shared by evaluation and cohort reports."""

from __future__ import annotations

import numpy as np

from engine.anatomy.template import VOXEL_ML


def brain_mask(volume: np.ndarray) -> np.ndarray:
    """Brain mask of a skull-stripped T1 volume: Otsu threshold, largest component, closed, holes filled."""
    from scipy import ndimage
    from skimage.filters import threshold_otsu

    vol = np.nan_to_num(np.asarray(volume, np.float32))
    if float(vol.max()) - float(vol.min()) < 1e-6:
        return np.zeros(vol.shape, bool)
    mask = vol > threshold_otsu(vol)
    labels, n = ndimage.label(mask)
    if n > 1:
        sizes = ndimage.sum(mask, labels, index=np.arange(1, n + 1))
        mask = labels == (int(np.argmax(sizes)) + 1)
    # Closing adds the sulcal CSF between gyri (dark, so below Otsu) as brain masks conventionally do.
    mask = ndimage.binary_closing(
        mask, structure=ndimage.generate_binary_structure(3, 1), iterations=2, border_value=0
    )
    # Fill holes slice by slice too: a ventricle touching the mask edge in 3D is still enclosed in 2D.
    mask = ndimage.binary_fill_holes(mask)
    for axis in range(3):
        mask = np.stack([ndimage.binary_fill_holes(s) for s in np.moveaxis(mask, axis, 0)], axis=axis)
    return mask


def ventricle_volume_ml(volume: np.ndarray, roi: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Ventricle volume (mL) measured on an image: dark voxels inside the eroded brain mask and ``roi``."""
    from scipy import ndimage

    vol = np.asarray(volume, np.float32)
    mask = brain_mask(vol) if mask is None else np.asarray(mask, bool)
    if not mask.any():
        return 0.0
    inner = ndimage.binary_erosion(mask, iterations=2) & roi
    dark = vol < 0.5 * float(np.median(vol[mask]))
    return float((dark & inner).sum() * VOXEL_ML)
