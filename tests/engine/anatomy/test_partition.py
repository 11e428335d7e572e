"""A model's decoded tissue channels become a partition: GM + WM + CSF + background = 1 in every voxel, no tissue
outside the head's tissue region, ventricles inside CSF; segmented maps are one already."""

from __future__ import annotations

import numpy as np
import pytest

from engine.anatomy.partition import partition_channels, partition_error
from engine.anatomy.segment import segment
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels


def _decoded_channels(seed: int = 0) -> dict[str, np.ndarray]:
    """Channels as a decoder leaves them: the phantom's tissues with soft edges, 10-30 % too strong (so they
    overlap where they meet), a faint haze over the whole field of view, a few negative values, and ventricles
    poking out of the CSF."""
    from scipy import ndimage

    rng = np.random.default_rng(seed)
    labels = phantom_labels()
    maps = {}
    for value, name in ((1, "CSF"), (2, "GM"), (3, "WM")):
        soft = ndimage.gaussian_filter((labels == value).astype(np.float32), 0.8)
        haze = rng.uniform(-0.02, 0.04, labels.shape)
        maps[name] = soft * rng.uniform(1.1, 1.3, labels.shape) + haze
    maps["ventricles"] = maps["CSF"] * 1.2
    return {name: m.astype(np.float32) for name, m in maps.items()}


def test_decoded_channels_become_a_partition_that_keeps_the_tissues():
    raw = _decoded_channels()
    clipped = {name: np.clip(m, 0, 1) for name, m in raw.items()}
    assert partition_error(clipped) > 0.2  # as the channels were clipped before: sums up to 1.24 and more
    maps = partition_channels(raw)
    assert partition_error(maps) < 1e-6
    total = maps["GM"] + maps["WM"] + maps["CSF"]
    assert float(total.max()) <= 1.0 + 1e-6 and float(min(m.min() for m in maps.values())) >= 0.0
    # the haze away from the head's tissue is background now (a soft edge of a few voxels stays)
    from scipy import ndimage

    away = ndimage.distance_transform_edt(phantom_labels() == 0) > 4
    assert float(sum(clipped[n][away].sum() for n in ("GM", "WM", "CSF"))) > 100  # mL of haze before
    assert float(total[away].max()) == 0.0
    # inside the head the tissue that led still leads, by the same ratios (a sum over 1 is divided, not cut)
    names = ("CSF", "GM", "WM")
    head = phantom_labels() > 0
    before = np.stack([clipped[n] for n in names])[:, head]
    after = np.stack([maps[n] for n in names])[:, head]
    assert np.array_equal(before.argmax(0), after.argmax(0))
    ratio = after.sum(0) / np.maximum(before.sum(0), 1e-6)
    assert np.allclose(after, before * ratio, atol=1e-5)
    assert np.all(maps["ventricles"] <= maps["CSF"])


def test_maps_without_the_three_tissues_are_only_clipped():
    maps = partition_channels({"GM": np.array([[[1.4, -0.2]]], np.float32)})
    assert np.array_equal(maps["GM"], np.array([[[1.0, 0.0]]], np.float32))


@pytest.mark.slow
def test_segmented_maps_are_a_partition():
    made = segment(phantom("t1w"), phantom_affine(), "t1w")
    assert partition_error(made.maps) < 1e-5
