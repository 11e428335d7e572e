"""What a consumer reads about a generated volume's intensities: cal_min/cal_max give its robust range
(the shipped model writes model units with a negative background), while the voxels stay exactly what the
model made."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest

from engine.nifti.io import display_range, make_nifti


def _brain_like(shape=(20, 24, 20), background=-0.62, seed=0):
    """A negative background around a brighter 'brain' with a few extreme voxels."""
    rng = np.random.default_rng(seed)
    data = np.full(shape, background, np.float32) + rng.normal(0, 0.01, shape).astype(np.float32)
    data[5:15, 6:18, 5:15] = rng.uniform(0.2, 0.9, (10, 12, 10)).astype(np.float32)
    data[0, 0, 0], data[1, 0, 0] = 40.0, -40.0  # outliers must not set the display range
    return data


def test_cal_min_and_max_are_the_robust_range_and_the_voxels_are_unchanged(tmp_path):
    data = _brain_like()
    path = tmp_path / "v.nii.gz"
    make_nifti(data, np.eye(4), synthetic=True).to_filename(str(path))
    img = nib.load(path)
    low, high = float(img.header["cal_min"]), float(img.header["cal_max"])
    assert -0.70 < low < -0.55  # the background, not the -40 outlier
    assert 0.8 < high < 0.95  # the bright tissue, not the +40 outlier
    assert np.array_equal(np.asarray(img.dataobj), data)  # what the model made, bit for bit
    assert (low, high) == pytest.approx(np.percentile(data, [0.5, 99.5]), abs=1e-6)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (np.zeros((4, 4, 4), np.float32), (0.0, 0.0)),  # constant: NIfTI's "unknown"
        (np.full((4, 4, 4), np.nan, np.float32), (0.0, 0.0)),
        (np.array([0.0] * 999 + [1.0], np.float32), (0.0, 1.0)),  # a sparse map: widened to its range
    ],
)
def test_display_range_edge_cases(data, expected):
    assert display_range(data) == pytest.approx(expected)


def test_non_finite_voxels_do_not_reach_the_range():
    data = _brain_like()
    data[2, 2, 2] = np.inf
    data[3, 3, 3] = np.nan
    low, high = display_range(data)
    assert np.isfinite(low) and np.isfinite(high) and low < 0 < high
