"""Evaluation metrics on synthetic inputs, including the cases that must fail."""

from __future__ import annotations

import numpy as np
import pytest

from engine.anatomy import measures
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
    assert ev.dice(measures.brain_mask(vol), brain) > 0.95
    assert not measures.brain_mask(np.zeros(SHAPE, np.float32)).any()


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
    sizes = [measures.ventricle_volume_ml(_phantom(ventricle_radius=r)[0], roi) for r in (2, 3, 4, 5)]
    assert sizes == sorted(sizes) and sizes[-1] > 5 * sizes[0]
    assert ev.spearman([2, 3, 4, 5], sizes) == pytest.approx(1.0)
    assert ev.spearman([2, 3, 4, 5], [1.0, 1.0, 1.0, 1.0]) == 0.0  # a constant response fails
    assert measures.ventricle_volume_ml(np.zeros(SHAPE, np.float32), roi) == 0.0


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


def _phantom_maps(ventricle_radius=3.0):
    """The phantom's true tissue maps (hard, as probabilities 0/1)."""
    brain = _ellipsoid((16, 20, 16))
    wm = _ellipsoid((12, 16, 12))
    vent = _ellipsoid((ventricle_radius, 2 * ventricle_radius, ventricle_radius))
    return {
        "GM": (brain & ~wm).astype(np.float32),
        "WM": (wm & ~vent).astype(np.float32),
        "CSF": vent.astype(np.float32),
        "ventricles": vent.astype(np.float32),
    }


def test_kmeans_orders_clusters_by_intensity():
    values = np.concatenate([np.full(50, 0.8), np.full(50, 0.1), np.full(50, 0.5)])
    labels, centres = ev.kmeans_1d(values, 3)
    np.testing.assert_allclose(centres, [0.1, 0.5, 0.8])
    assert (labels[:50] == 2).all() and (labels[50:100] == 0).all() and (labels[100:] == 1).all()


def test_tissue_agreement_true_maps_pass_swapped_maps_fail():
    vol, brain = _phantom(ventricle_radius=4)
    maps = _phantom_maps(ventricle_radius=4)
    good = ev.tissue_agreement(vol, maps, brain)
    assert good["GM"] > 0.95 and good["WM"] > 0.95
    swapped = {**maps, "GM": maps["WM"], "WM": maps["GM"]}  # maps that do not belong to the image
    bad = ev.tissue_agreement(vol, swapped, brain)
    assert bad["GM"] < 0.2 and bad["WM"] < 0.2


def _folded(phase: float) -> np.ndarray:
    """A 'brain' with cortex-like structure: intensity ripples of a 8-11 voxel period, no noise."""
    brain = _ellipsoid((16, 20, 16))
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in SHAPE], indexing="ij")
    ripple = np.sin(i / 1.5 + phase) * np.sin(j / 1.7 + 2 * phase) * np.sin(k / 1.3)
    return np.where(brain, 0.6 + 0.25 * ripple, 0.0).astype(np.float32)


def test_blur_equivalence_reads_back_a_known_blur():
    from scipy import ndimage

    vols = [_folded(phase) for phase in (0.0, 0.7, 1.9)]
    curve = ev.blur_curve(vols)
    assert all(a > b for a, b in zip(curve, curve[1:], strict=False))  # blur lowers the score, every step
    for sigma in (0.6, 1.0, 1.3):
        blurred = ev.edge_score(ndimage.gaussian_filter(_folded(3.1), sigma))
        assert ev.blur_equivalence(blurred, curve) == pytest.approx(sigma, abs=0.15)
    assert ev.blur_equivalence(curve[0] * 1.1, curve) == 0.0  # sharper than the references
    assert ev.blur_equivalence(curve[-1] * 0.5, curve) == float("inf")  # blurrier than every point
    # A contrast change is not a blur.
    assert ev.edge_score(0.5 * _folded(0.0)) == pytest.approx(ev.edge_score(_folded(0.0)), rel=1e-3)


@pytest.mark.slow
def test_reference_mask_is_placed_by_the_affines_not_shifted():
    from engine.anatomy.template import crop_affine, template_brain_mask

    affine = crop_affine()
    ref = template_brain_mask()
    assert ev.dice(ev.reference_mask(ref.shape, affine), ref) == 1.0
    moved = affine.copy()
    moved[:3, 3] += 12.0  # a volume whose affine says it lies 12 mm away: compared where it says it is
    assert ev.dice(ev.reference_mask(ref.shape, moved), ref) < 0.8


def test_montage_with_tissue_rows(tmp_path):
    vols = [_phantom(seed=s)[0] for s in range(2)]
    maps = [_phantom_maps() for _ in vols]
    rgb = ev.tissue_rgb(vols[0], maps[0])
    assert rgb.shape == (*SHAPE, 3) and rgb.min() >= 0 and rgb.max() <= 1
    # Outside the brain the overlay leaves the grey image alone; inside it tints it.
    assert np.allclose(rgb[0, 0, 0], 0) and not np.allclose(rgb[20, 24, 20], rgb[20, 24, 20, 0])
    path = ev.save_montage(vols, tmp_path / "m.png", "test", tissue=maps)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
