"""Tissue maps that are a partition: in every voxel GM + WM + CSF + background = 1.

A model decodes its tissue maps as free channels: each clipped to [0, 1] they can sum past 1 (the shipped model's
reached 1.24, 5.4 % of brain voxels over 1.05), and the decoder leaves faint values all over the field of view
(about 72 mL of probability outside the brain). ``partition_channels`` makes them a partition the way a
segmentation's maps are one:

1. each map clipped to [0, 1];
2. outside the head's tissue (the largest connected region where GM + WM + CSF >= 0.5, grown by 2 voxels) the
   tissues are 0: that probability is the background's;
3. where GM + WM + CSF exceeds 1 the three are divided by their sum (their ratios kept), so the background,
   1 - (GM + WM + CSF), is never negative;
4. a map contained in a tissue (ventricles: CSF) is clipped to it.

``PARTITION_RECORD`` says so in the maps' sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

PARTITION = ("GM", "WM", "CSF")
#: Maps that lie inside one of the partition's tissues.
CONTAINED_IN = {"ventricles": "CSF"}
PARTITION_RECORD = (
    "GM + WM + CSF + background = 1 per voxel: channels clipped to [0, 1], tissue outside the largest region where "
    "GM + WM + CSF >= 0.5 (grown by 2 voxels) set to background, sums over 1 divided by the sum, ventricles "
    "clipped to CSF"
)


def partition_channels(maps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A model's decoded tissue channels as a partition (see the module's docstring); maps of other names are
    only clipped to [0, 1]. Maps without all of GM, WM and CSF are only clipped."""
    from scipy import ndimage

    out = {name: np.clip(np.asarray(m, np.float32), 0.0, 1.0) for name, m in maps.items()}
    if not all(name in out for name in PARTITION):
        return out
    total = out["GM"] + out["WM"] + out["CSF"]
    labels, count = ndimage.label(total >= 0.5)
    if count:
        sizes = ndimage.sum_labels(np.ones_like(total), labels, index=np.arange(1, count + 1))
        region = ndimage.binary_dilation(labels == int(np.argmax(sizes)) + 1, iterations=2)
        for name in PARTITION:
            out[name] *= region
        total *= region
    over = total > 1.0
    if over.any():
        scale = np.where(over, 1.0 / np.maximum(total, 1.0), 1.0).astype(np.float32)
        for name in PARTITION:
            out[name] *= scale
    for name, tissue in CONTAINED_IN.items():
        if name in out:
            out[name] = np.minimum(out[name], out[tissue])
    return out


def partition_error(maps: Mapping[str, np.ndarray]) -> float:
    """The largest |GM + WM + CSF + background - 1| over the voxels, with background = max(0, 1 - their sum):
    how far the maps are from a partition (0 for one)."""
    total = np.asarray(maps["GM"], np.float64) + np.asarray(maps["WM"]) + np.asarray(maps["CSF"])
    background = np.maximum(0.0, 1.0 - total)
    lowest = min(float(np.min(maps[name])) for name in PARTITION)
    return max(float(np.abs(total + background - 1.0).max()), max(0.0, -lowest))
