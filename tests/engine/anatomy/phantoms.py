"""A small three-tissue brain phantom for the segmentation tests: the MNI152 tissue layout (argmax of nilearn's
GM/WM/CSF maps) shrunk by 8% and shifted by a few mm onto a 3 mm grid, so the method must place its priors; each
tissue drawn at one intensity per contrast, with noise."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

SHAPE = (52, 60, 52)
SPACING = 3.0
SCALE = 0.92
SHIFT_MM = (5.0, -4.0, 3.0)
# Mean intensity of (CSF, GM, WM) per contrast: T1w CSF < GM < WM, T2w the reverse, FLAIR CSF dark and GM > WM.
LEVELS = {"t1w": (0.2, 0.5, 0.8), "t2w": (0.9, 0.55, 0.35), "flair": (0.1, 0.7, 0.5)}


def phantom_affine() -> np.ndarray:
    affine = np.diag([SPACING, SPACING, SPACING, 1.0])
    affine[:3, 3] = -(np.array(SHAPE) - 1) / 2.0 * SPACING + np.array([0.0, -18.0, 8.0])
    return affine


@lru_cache(maxsize=1)
def phantom_labels() -> np.ndarray:
    """0 background, 1 CSF, 2 GM, 3 WM."""
    from scipy import ndimage

    from engine.anatomy.template import template_priors_1mm

    priors, mask, taffine = template_priors_1mm()
    # phantom world x -> template world (x - shift) / scale
    to_template = np.diag([1 / SCALE, 1 / SCALE, 1 / SCALE, 1.0])
    to_template[:3, 3] = -np.array(SHIFT_MM) / SCALE
    vox = np.linalg.inv(taffine) @ to_template @ phantom_affine()
    sampled = np.stack([ndimage.affine_transform(p, vox, output_shape=SHAPE, order=1) for p in priors])
    inside = ndimage.affine_transform(mask.astype(np.float32), vox, output_shape=SHAPE, order=1) > 0.5
    return np.where(inside, sampled.argmax(0) + 1, 0).astype(np.int8)


def phantom(contrast: str, seed: int = 0, noise: float = 0.04) -> np.ndarray:
    labels = phantom_labels()
    values = np.array([0.0, *LEVELS[contrast]], np.float32)
    rng = np.random.default_rng(seed)
    return (values[labels] + rng.normal(0, noise, labels.shape)).astype(np.float32)
