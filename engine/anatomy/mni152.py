"""The MNI152 ICBM 2009a template files the product ships (``resources/mni152``) and their loaders.

The T1 template and the grey- and white-matter maps at 1 mm are the files nilearn distributes
(``mni_icbm152_{t1,gm,wm}_tal_nlin_sym_09a_converted.nii.gz``; their licence is ``resources/mni152/LICENSE``).
The loaders give what nilearn's ``load_mni152_template``, ``load_mni152_gm_template``,
``load_mni152_wm_template`` and ``load_mni152_brain_mask`` give (each map scaled to a maximum of 1; another
resolution resampled as nilearn does: the same grid, cubic spline, clipped to the data's range;
tests/engine/anatomy/test_mni152.py compares them), so the anatomy check, segmentation and the training
data read the same template with or without nilearn installed. The installable build ships these files and
leaves nilearn (with scikit-learn and pandas) out.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

FOLDER = "mni152"
FILES = {
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}
#: What made the files, for provenance records (sidecars say which template data a method used).
SOURCE = "MNI152 ICBM 2009a nonlinear symmetric, 1 mm, as distributed by nilearn 0.14 (resources/mni152)"


def path(kind: str):
    """Path of the shipped 1 mm file of ``kind`` (t1, gm or wm); FileNotFoundError naming it if it is missing."""
    from engine.files.shipped import resource_path

    found = resource_path(FOLDER, FILES[kind])
    if not found.is_file():
        raise FileNotFoundError(f"the MNI152 template file {found} is missing; reinstall VolSynth Studio")
    return found


@lru_cache(maxsize=3)
def _scaled_1mm(kind: str):
    """The 1 mm image of ``kind`` as float32 scaled to a maximum of 1 (nilearn's typecast and re-scale)."""
    import nibabel as nib

    image = nib.load(path(kind))
    if not isinstance(image, nib.Nifti1Image):
        raise TypeError(f"the {kind} template is not a NIfTI image ({type(image).__name__})")
    data = np.asanyarray(image.dataobj).astype("float32")
    data /= data.max()
    return nib.Nifti1Image(data, image.affine, image.header)


def _resampled(image, resolution: float):
    """``image`` on a grid of ``resolution`` mm voxels covering the same box: nilearn's ``resample_img`` with a
    3x3 target affine (its continuous interpolation, a cubic spline, clipped to the range of the data and 0)."""
    import nibabel as nib
    from scipy.ndimage import affine_transform

    data = np.asanyarray(image.dataobj)
    affine = np.asarray(image.affine, np.float64)
    target = np.eye(4)
    target[:3, :3] = np.eye(3) * resolution
    to_target = np.linalg.inv(target) @ affine
    corners = np.array([[i, j, k, 1.0] for i in (0, data.shape[0] - 1) for j in (0, data.shape[1] - 1)
                        for k in (0, data.shape[2] - 1)]).T  # fmt: skip
    box = (to_target @ corners)[:3]
    low, high = box.min(axis=1), box.max(axis=1)
    target[:3, 3] = target[:3, :3] @ low
    shape = tuple(int(np.ceil(extent)) + 1 for extent in high - low)
    transform = np.linalg.inv(affine) @ target
    matrix, offset = transform[:3, :3], transform[:3, 3]
    if np.all(np.diag(np.diag(matrix)) == matrix):
        matrix = np.diag(matrix)
    out = np.zeros(shape, dtype=data.dtype)
    affine_transform(data, matrix, offset=offset, output_shape=shape, output=out, cval=0, order=3)
    out.clip(min(np.nanmin(data), 0), max(np.nanmax(data), 0), out=out)
    return nib.Nifti1Image(out, target, image.header)


def _load(kind: str, resolution: float | None):
    image = _scaled_1mm(kind)
    if resolution and resolution != 1:
        return _resampled(image, resolution)
    import nibabel as nib

    return nib.Nifti1Image(np.array(image.dataobj), image.affine, image.header)  # a copy: callers may edit it


def load_mni152_template(resolution: float | None = None):
    """The skull-stripped T1 template, scaled to 0..1, at ``resolution`` mm (default 1)."""
    return _load("t1", resolution)


def load_mni152_gm_template(resolution: float | None = None):
    """The grey-matter probability map, scaled to 0..1, at ``resolution`` mm (default 1)."""
    return _load("gm", resolution)


def load_mni152_wm_template(resolution: float | None = None):
    """The white-matter probability map, scaled to 0..1, at ``resolution`` mm (default 1)."""
    return _load("wm", resolution)


def load_mni152_brain_mask(resolution: float | None = None, threshold: float = 0.2):
    """The whole-brain mask: the T1 template above ``threshold`` (int8), at ``resolution`` mm (default 1)."""
    import nibabel as nib

    t1 = load_mni152_template(resolution)
    mask = (np.asanyarray(t1.dataobj) > threshold).astype("int8")
    return nib.Nifti1Image(mask, t1.affine, t1.header)
