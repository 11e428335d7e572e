"""The measures of a cohort's quality report, on arrays: features anyone can reproduce offline, MS-SSIM diversity
and MMD (both MONAI's metrics), and the per-seed distance to fp32.

Nothing here generates or segments; ``engine.quality`` puts the measures together into a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: The tissues whose volumes the report compares, in this order.
TISSUES = ("GM", "WM", "CSF")
#: Intensity quantiles inside the brain (the voxels above the volume's Otsu threshold) used as features.
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: The downsampled intensity vector has about this many voxels along the shortest axis.
DOWNSAMPLED_MIN_AXIS = 10
#: Wang, Simoncelli and Bovik (2003): the weights of the five MS-SSIM scales.
MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
MS_SSIM_SIGMA = 1.5
FEATURE_GROUPS = ("tissue_ml", "intensity_quantiles", "texture", "downsampled")


def as_volume(array, name: str = "volume") -> np.ndarray:
    """One 3D float32 volume from (x, y, z) or (1, x, y, z); ValueError naming what is wrong."""
    data = np.asarray(array, dtype=np.float32)
    if data.ndim == 4 and data.shape[0] == 1:
        data = data[0]
    if data.ndim != 3:
        raise ValueError(f"{name} must be a 3D volume (x, y, z), got shape {data.shape}")
    if not np.isfinite(data).all():
        raise ValueError(f"{name} has NaN or infinite voxels")
    return data


def tissue_volumes_ml(tissue: Mapping[str, Any], voxel_ml: float) -> dict[str, float]:
    """GM, WM and CSF volumes in mL from maps (probability arrays, summed x voxel volume) or from numbers in mL."""
    out = {}
    for name in TISSUES:
        if name not in tissue:
            raise ValueError(f"tissue volumes need {', '.join(TISSUES)}; {name} is missing")
        value = tissue[name]
        if np.ndim(value) == 0:
            out[name] = float(value)
        else:
            out[name] = float(np.clip(np.asarray(value, np.float64), 0.0, 1.0).sum() * voxel_ml)
    return out


def _otsu(values: np.ndarray) -> float:
    from skimage.filters import threshold_otsu

    if float(values.max()) - float(values.min()) < 1e-12:
        return float(values.min())
    return float(threshold_otsu(values))


def _block_mean(volume: np.ndarray, factor: int) -> np.ndarray:
    shape = tuple((s // factor) * factor for s in volume.shape)
    cropped = volume[: shape[0], : shape[1], : shape[2]]
    return cropped.reshape(
        shape[0] // factor, factor, shape[1] // factor, factor, shape[2] // factor, factor
    ).mean(axis=(1, 3, 5))


def features(volume: np.ndarray, tissue_ml: Mapping[str, float] | None) -> dict[str, np.ndarray]:
    """The offline, reproducible features of one volume, by group (see ``FEATURE_GROUPS``).

    - ``tissue_ml``: GM, WM, CSF volumes in mL (absent when no tissue volumes are known);
    - ``intensity_quantiles``: the 5/25/50/75/95 % quantiles of the intensities above the volume's Otsu threshold;
    - ``texture``: the mean gradient magnitude and the standard deviation of the Laplacian inside that mask (a
      setting that adds noise or blurs moves these first);
    - ``downsampled``: the volume block-averaged to about 10 voxels along its shortest axis (10x12x10 at 80x96x80).
    """
    from scipy import ndimage

    vol = np.asarray(volume, np.float32)
    mask = vol > _otsu(vol.ravel())
    inside = vol[mask] if mask.any() else vol.ravel()
    grad = np.sqrt(sum(g.astype(np.float64) ** 2 for g in np.gradient(vol)))
    lap = ndimage.laplace(vol.astype(np.float64))
    factor = max(1, min(vol.shape) // DOWNSAMPLED_MIN_AXIS)
    out = {
        "intensity_quantiles": np.quantile(inside, QUANTILES).astype(np.float64),
        "texture": np.array(
            [float(grad[mask].mean()) if mask.any() else 0.0, float(lap[mask].std()) if mask.any() else 0.0]
        ),
        "downsampled": _block_mean(vol, factor).ravel().astype(np.float64),
    }
    if tissue_ml is not None:
        out["tissue_ml"] = np.array([float(tissue_ml[name]) for name in TISSUES])
    return out


def standardize(
    groups: Sequence[Sequence[Mapping[str, np.ndarray]]], basis: Sequence[Mapping[str, np.ndarray]]
):
    """Feature matrices of ``groups`` in the units of ``basis`` (the fp32 volumes): each feature centred on the
    basis mean and divided by its standard deviation (floored at 1 % of the group's largest magnitude), each group divided by the square root of its size so that
    the 1200 voxels of the downsampled vector weigh as much as the three tissue volumes. Returns (N, F) arrays."""
    # Only the groups every volume has: a set given without tissue volumes is compared on the rest.
    names = [
        name
        for name in FEATURE_GROUPS
        if all(name in f for f in basis) and all(name in f for g in groups for f in g)
    ]
    blocks = []
    for name in names:
        ref = np.stack([f[name] for f in basis])
        mean = ref.mean(axis=0)
        std = ref.std(axis=0, ddof=1) if len(ref) > 1 else np.ones_like(mean)
        # A feature fp32 leaves nearly constant over seeds (a background block) would turn a harmless 0.1 %
        # offset into a huge shift: its spread is floored at 1 % of the group's largest magnitude.
        floor = max(0.01 * float(np.abs(ref).max()), 1e-12)
        scale = np.maximum(std, floor)
        blocks.append((name, mean, scale, np.sqrt(ref.shape[1])))
    matrices = []
    for group in groups:
        parts = [
            (np.stack([f[name] for f in group]) - mean) / scale / root for name, mean, scale, root in blocks
        ]
        matrices.append(np.concatenate(parts, axis=1))
    return matrices, names


def mmd(x: np.ndarray, y: np.ndarray) -> float:
    """MONAI's ``MMDMetric`` (linear kernel, unbiased estimate) between two sets of feature rows (N, F); MONAI
    asks for sets of one size (the report compares N seeds with N seeds)."""
    import torch
    from monai.metrics import MMDMetric

    value = MMDMetric()(torch.as_tensor(y, dtype=torch.float64), torch.as_tensor(x, dtype=torch.float64))
    return float(value)


def mmd_from_gram(gram: np.ndarray, i: np.ndarray, j: np.ndarray) -> float:
    """The same estimate as ``mmd`` for rows ``i`` and ``j`` of a pooled Gram matrix (for permutations)."""
    kii = gram[np.ix_(i, i)]
    kjj = gram[np.ix_(j, j)]
    m, n = len(i), len(j)
    a = (kii.sum() - np.trace(kii)) / (m * (m - 1))
    b = (kjj.sum() - np.trace(kjj)) / (n * (n - 1))
    return float(a + b - 2.0 * gram[np.ix_(i, j)].mean())


def ms_ssim_config(shape: Sequence[int]) -> tuple[int, tuple[float, ...]]:
    """The MS-SSIM kernel size and scale weights for volumes of ``shape``.

    The five scales of Wang et al. (2003) when they fit, with the largest odd Gaussian kernel (at most 11,
    sigma 1.5) that MONAI's size check accepts along the shortest axis: MONAI asks ``axis // (scales - 1) ** 2 >
    kernel - 1``, so 80x96x80 gets kernel 5 with all five scales. Smaller volumes drop the coarsest scales
    (weights renormalised) until a kernel of at least 3 fits: 16x24x16 gets kernel 3 on three scales.
    """
    shortest = int(min(shape))
    for scales in range(len(MS_SSIM_WEIGHTS), 0, -1):
        div = max(1, scales - 1) ** 2
        kernel = min(11, shortest // div)  # MONAI needs axis // div > kernel - 1
        if kernel % 2 == 0:
            kernel -= 1
        if kernel >= 3:
            weights = MS_SSIM_WEIGHTS[:scales]
            total = sum(weights)
            return kernel, tuple(w / total for w in weights)
    raise ValueError(f"volumes of shape {tuple(shape)} are too small for MS-SSIM (need 3+ voxels per axis)")


def ms_ssim_pairs(volumes: Sequence[np.ndarray], pairs: Sequence[tuple[int, int]], low: float, high: float):
    """MS-SSIM (MONAI ``MultiScaleSSIMMetric``, spatial_dims=3) of each pair of ``volumes``, on intensities
    rescaled by the common range ``low..high`` (clipped to 0..1, data range 1). Returns a float array."""
    import torch
    from monai.metrics import MultiScaleSSIMMetric

    if not pairs:
        return np.zeros(0)
    kernel, weights = ms_ssim_config(volumes[0].shape)
    metric = MultiScaleSSIMMetric(
        spatial_dims=3,
        data_range=1.0,
        kernel_size=kernel,
        kernel_sigma=MS_SSIM_SIGMA,
        weights=weights,
        reduction="none",
    )
    span = max(high - low, 1e-12)

    def scaled(index: int) -> torch.Tensor:
        return torch.from_numpy(np.clip((volumes[index] - low) / span, 0.0, 1.0).astype(np.float32))[None]

    values = []
    for start in range(0, len(pairs), 8):  # a few pairs at a time keep the memory at a few hundred MB
        chunk = pairs[start : start + 8]
        first = torch.stack([scaled(i) for i, _ in chunk])
        second = torch.stack([scaled(j) for _, j in chunk])
        values.append(metric(first, second).reshape(-1).double().numpy())
    return np.concatenate(values)


def ring_pairs(count: int) -> list[tuple[int, int]]:
    """The pairs (0, 1), (1, 2) ... (n-1, 0): each volume in two pairs, n pairs in all (all n(n-1)/2 pairs of 16
    volumes of 80x96x80 would take about 45 s per set on two cores)."""
    if count < 2:
        return []
    if count == 2:
        return [(0, 1)]
    return [(i, (i + 1) % count) for i in range(count)]
