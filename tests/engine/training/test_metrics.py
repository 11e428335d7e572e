"""Evaluation metrics on synthetic inputs, including the cases that must fail."""

from __future__ import annotations

import numpy as np
import pytest

from engine.training import evaluate as ev

SHAPE = (40, 48, 40)


def _ellipsoid(radii, centre=None, shape=SHAPE):
    centre = np.array(centre if centre is not None else [(n - 1) / 2 for n in shape])
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), axis=-1)
    return (((grid - centre) / np.array(radii)) ** 2).sum(-1) <= 1.0


def _phantom(ventricle_radius=3.0, seed=0, gm=0.5, wm=0.8):
    """A 'brain': GM shell around a WM core around a dark ventricle, on a zero background."""
    rng = np.random.default_rng(seed)
    brain = _ellipsoid((16, 20, 16))
    vol = np.zeros(SHAPE, np.float32)
    vol[brain] = gm
    vol[_ellipsoid((12, 16, 12))] = wm
    vol[_ellipsoid((ventricle_radius, 2 * ventricle_radius, ventricle_radius))] = 0.12
    vol += rng.normal(0, 0.02, SHAPE).astype(np.float32) * (vol > 0)
    return np.clip(vol, 0, 1), brain


def test_dice():
    a = _ellipsoid((10, 10, 10))
    assert ev.dice(a, a) == 1.0
    assert ev.dice(a, np.zeros_like(a)) == 0.0
    assert ev.dice(np.zeros_like(a), np.zeros_like(a)) == 1.0
    shifted = np.roll(a, 5, axis=0)
    assert 0.3 < ev.dice(a, shifted) < 0.9


def test_brain_mask_includes_ventricles_and_fails_on_empty():
    vol, brain = _phantom(ventricle_radius=4)
    assert ev.dice(ev.brain_mask(vol), brain) > 0.95
    assert not ev.brain_mask(np.zeros(SHAPE, np.float32)).any()


def test_tissue_modes_two_classes_pass_one_class_fails():
    vol, brain = _phantom()
    modes = ev.tissue_modes(vol, brain)
    assert modes["bimodal"]
    assert modes["gm_mode"] == pytest.approx(0.5, abs=0.05)
    assert modes["wm_mode"] == pytest.approx(0.8, abs=0.05)
    assert modes["dip_ratio"] < 0.2
    flat, brain = _phantom(gm=0.65, wm=0.65)  # no GM/WM contrast
    assert not ev.tissue_modes(flat, brain)["bimodal"]


def test_ventricle_measurement_follows_ventricle_size():
    roi = _ellipsoid((10, 14, 10))
    sizes = [ev.ventricle_volume_ml(_phantom(ventricle_radius=r)[0], roi) for r in (2, 3, 4, 5)]
    assert sizes == sorted(sizes) and sizes[-1] > 5 * sizes[0]
    assert ev.spearman([2, 3, 4, 5], sizes) == pytest.approx(1.0)
    assert ev.spearman([2, 3, 4, 5], [1.0, 1.0, 1.0, 1.0]) == 0.0  # a constant response fails
    assert ev.ventricle_volume_ml(np.zeros(SHAPE, np.float32), roi) == 0.0


def test_diversity_identical_collapses_distinct_do_not():
    a, _ = _phantom(seed=1)
    same_mean, same_max = ev.mean_pairwise_ssim([a, a.copy(), a.copy()])
    assert same_mean > 0.999 and same_max > 0.999  # collapsed: must fail the < 0.95 target
    vols = [_phantom(ventricle_radius=r, seed=s)[0] for r, s in ((2, 1), (5, 2), (3, 3))]
    vols[1] = np.roll(vols[1], 6, axis=1)
    mean, _ = ev.mean_pairwise_ssim(vols)
    assert mean < ev.SSIM_MAX


def test_radiological_slices_orientation():
    vol = np.zeros((10, 12, 14), np.float32)
    vol[8, 6, 7] = 1.0  # right of centre (+R) in the axial and coronal mid-slices
    vol[5, 10, 7] = 2.0  # anterior (+A) in the axial and sagittal mid-slices
    vol[5, 6, 12] = 3.0  # superior (+S) in the coronal and sagittal mid-slices
    axial, coronal, sagittal = ev.radiological_slices(vol)
    assert axial.shape == (12, 10) and coronal.shape == (14, 10) and sagittal.shape == (14, 12)
    r, c = np.argwhere(axial == 1.0)[0]
    assert c < 5  # patient right on the image left
    r, c = np.argwhere(axial == 2.0)[0]
    assert r < 6  # anterior up
    r, c = np.argwhere(coronal == 3.0)[0]
    assert r < 7  # superior up
    r, c = np.argwhere(sagittal == 2.0)[0]
    assert c < 6  # anterior on the image left
    r, c = np.argwhere(sagittal == 3.0)[0]
    assert r < 7


def test_save_montage_writes_png(tmp_path):
    vols = [_phantom(seed=s)[0] for s in range(2)]
    path = ev.save_montage(vols, tmp_path / "m.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
