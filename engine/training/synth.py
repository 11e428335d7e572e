"""Synthetic, skull-stripped T1-weighted brain volumes derived from the MNI152 2009 template.

The template's grey-matter, white-matter and brain-mask maps (the files nilearn distributes, shipped in
resources/mni152, so nothing is downloaded) are cropped once to the output grid: 80 x 96 x 80 voxels of the
template's own 2 mm grid, RAS (voxel i -> +R, j -> +A, k -> +S), the crop chosen so the brain is centred. The
crop is a whole number of template voxels, so nothing is interpolated and :func:`crop_affine` (the crop's
voxel -> MNI mm affine) puts every volume in the template's space, ``MNI152NLin2009aSym`` in BIDS/TemplateFlow
terms (the files are the ICBM 2009a *symmetric* nonlinear template). Each sample then gets, in this order:

1. a ventricle deformation: a smooth radial displacement centred on the lateral ventricles that expands
   (ex-vacuo enlargement) or shrinks them; MONAI has no such transform, so it is a ``grid_sample`` here;
2. an isotropic scaling (MONAI ``Affine``) for brain size, then MONAI ``Rand3DElastic`` for small
   rotations, per-axis scaling, translations and smooth elastic deformation;
3. per-class intensities drawn with the T1 ordering WM > GM > CSF (background 0), mixed by the deformed
   partial-volume maps;
4. MONAI ``RandBiasField``, ``RandGaussianSmooth`` and ``RandRicianNoise``; clipped to [0, 1].

Brain volume (GM + WM, mL) and ventricle volume (mL) are measured on the deformed maps of every sample, so
the conditioning values are exact for the image they label. The deformed maps themselves (GM, WM, CSF
partial volumes and the ventricles) are kept with the image: they are the paired tissue labels the model
learns to generate with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.anatomy.template import OUTPUT_SHAPE, VOXEL_ML, template_maps

# Tissue maps kept with every sample, in this order (the model's label channels).
TISSUE_NAMES = ("GM", "WM", "CSF", "ventricles")

# Channels of the stacked tissue maps the geometric transforms act on.
_GM, _WM, _MASK, _VENT = range(4)


@dataclass(frozen=True)
class SynthConfig:
    """Ranges of the random draws. Defaults are tuned to give adult-like brains (see the model card).

    Attributes:
        iso_scale: isotropic scale factor of the brain (the MNI152 template brain is larger than average).
        ventricle_strength: amplitude of the radial ventricle displacement (< 0 shrinks, > 0 enlarges).
        ventricle_dilation_vox: how far the ventricles grow into the surrounding tissue (voxels), the
            tissue they replace is lost (as in atrophy).
        rotate_deg: maximal rotation about each axis.
        axis_scale: maximal extra per-axis scaling (fraction).
        translate_vox: maximal translation in voxels.
        elastic_sigma: smoothness of the elastic field (voxels).
        elastic_magnitude: magnitude of the elastic field (voxels).
        wm, gm, csf: intensity ranges per tissue class, drawn in this order with WM > GM > CSF enforced.
        bias_coeff: maximal coefficient of the polynomial bias field.
        smooth_sigma: range of Gaussian blur sigma (voxels).
        noise_std: range of the Rician noise standard deviation.
    """

    iso_scale: tuple[float, float] = (0.84, 1.0)
    ventricle_strength: tuple[float, float] = (-0.5, 0.6)
    ventricle_dilation_vox: tuple[float, float] = (0.0, 2.5)
    rotate_deg: float = 6.0
    axis_scale: float = 0.04
    translate_vox: float = 2.0
    elastic_sigma: tuple[float, float] = (6.0, 8.0)
    elastic_magnitude: tuple[float, float] = (0.0, 1.5)
    wm: tuple[float, float] = (0.72, 0.88)
    gm: tuple[float, float] = (0.42, 0.58)
    csf: tuple[float, float] = (0.08, 0.2)
    # Bias field and blur as left by preprocessing (bias correction, 2 mm resampling), not raw scanner
    # output: with coefficients to 0.15 and blur to 0.8 voxels the GM/WM histogram dip of the training
    # volumes was shallow (mean dip ratio 0.79, 14 of 16 bimodal), too little for a model to learn.
    bias_coeff: float = 0.08
    smooth_sigma: tuple[float, float] = (0.0, 0.4)
    noise_std: tuple[float, float] = (0.005, 0.03)


@dataclass
class SynthSample:
    """One synthetic volume with what was measured on it."""

    image: np.ndarray  # (80, 96, 80) float32 in [0, 1]
    brain_ml: float  # GM + WM volume of the deformed maps
    ventricle_ml: float  # lateral/third ventricle volume of the deformed maps
    brain_mask: np.ndarray  # (80, 96, 80) bool, deformed brain mask (GM + WM + CSF inside the template mask)
    labels: np.ndarray  # (80, 96, 80) uint8, most likely class: 0 background, 1 CSF, 2 GM, 3 WM
    tissue: np.ndarray  # (4, 80, 96, 80) float32 in [0, 1]: GM, WM, CSF partial volumes and ventricles


def _ventricle_displacement(strength: float, centre_vox: np.ndarray) -> torch.Tensor:
    """Sampling grid (1, X, Y, Z, 3) for grid_sample that expands (strength > 0) the ventricles.

    Backward mapping out(x) = in(x - u(x)) with u(x) = s (x - c) exp(-r^2 / 2), r measured in units of an
    anisotropic Gaussian that matches the ventricles' extent (long in y). |s| < 1 keeps it invertible.
    """
    # Voxels: wider than the lateral ventricles so the displacement is nearly a uniform expansion across
    # them; weaker along y (anterior-posterior) because enlargement mostly widens the ventricles.
    sigma = np.array([12.0, 18.0, 12.0])
    weight = torch.tensor([1.0, 0.4, 1.0])
    axes = [torch.arange(n, dtype=torch.float32) for n in OUTPUT_SHAPE]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (X, Y, Z, 3) voxel coords
    rel = grid - torch.as_tensor(centre_vox, dtype=torch.float32)
    r2 = ((rel / torch.as_tensor(sigma, dtype=torch.float32)) ** 2).sum(-1, keepdim=True)
    src = grid - strength * weight * rel * torch.exp(-r2 / 2)
    # grid_sample wants (x, y, z) normalised to [-1, 1] with the last index = the first spatial dim of W.
    size = torch.as_tensor(OUTPUT_SHAPE, dtype=torch.float32)
    norm = 2 * src / (size - 1) - 1
    return norm.flip(-1).unsqueeze(0)


def generate(seed: int, config: SynthConfig | None = None) -> SynthSample:
    """One synthetic T1 volume, fully determined by ``seed``.

    Args:
        seed: seeds every random draw (numpy and MONAI); the same seed gives the same volume.
        config: ranges of the random draws.

    Returns:
        The image with its measured brain and ventricle volumes.
    """
    from monai.transforms import Affine, Rand3DElastic, RandBiasField, RandGaussianSmooth, RandRicianNoise
    from scipy import ndimage

    cfg = config or SynthConfig()
    rng = np.random.RandomState(seed % (2**32))
    maps = template_maps()
    # 1. Ventricle size: (a) the ventricles grow into the tissue around them (ex-vacuo enlargement: the
    #    tissue becomes CSF), (b) a radial displacement about their centroid expands or shrinks them.
    grow = rng.uniform(*cfg.ventricle_dilation_vox)
    soft = np.clip(grow + 0.5 - maps["ventricle_distance"], 0, 1) * maps["inner_mask"]
    keep = 1 - soft
    vent0 = np.maximum(maps["ventricles"], soft)
    stack = torch.from_numpy(np.stack([maps["gm"] * keep, maps["wm"] * keep, maps["mask"], vent0]))
    centre = np.array(ndimage.center_of_mass(maps["ventricles"]))
    strength = rng.uniform(*cfg.ventricle_strength)
    stack = torch.nn.functional.grid_sample(
        stack[None],
        _ventricle_displacement(strength, centre),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    )[0]

    # 2. Brain size and pose. MONAI's Affine maps output to input coordinates, so a scale parameter s
    #    makes the brain 1/s times as large; we draw the brain's scale and pass its inverse.
    iso = rng.uniform(*cfg.iso_scale)
    stack = Affine(scale_params=(1 / iso,) * 3, padding_mode="zeros", image_only=True)(stack)
    rot = np.deg2rad(cfg.rotate_deg)
    elastic = Rand3DElastic(
        sigma_range=cfg.elastic_sigma,
        magnitude_range=cfg.elastic_magnitude,
        prob=1.0,
        rotate_range=(rot, rot, rot),
        scale_range=(cfg.axis_scale,) * 3,
        translate_range=(cfg.translate_vox,) * 3,
        padding_mode="zeros",
    )
    elastic.set_random_state(state=np.random.RandomState(rng.randint(2**31)))
    stack = torch.as_tensor(elastic(stack)).float().clamp(0, 1)
    gm, wm, mask, vent = (stack[i].numpy() for i in range(4))
    mask = (mask > 0.5).astype(np.float32)
    gm, wm = gm * mask, wm * mask
    csf = np.clip(mask - gm - wm, 0, 1)
    vent = vent * mask

    # 3. Tissue intensities with the T1 ordering enforced (ranges overlap only if misconfigured).
    i_wm = rng.uniform(*cfg.wm)
    i_gm = min(rng.uniform(*cfg.gm), i_wm - 0.18)  # WM/GM ratio of T1 at 1.5-3 T is about 1.3-1.6
    i_csf = min(rng.uniform(*cfg.csf), i_gm - 0.15)
    image = (wm * i_wm + gm * i_gm + csf * i_csf)[None].astype(np.float32)

    # 4. Scanner effects: bias field (multiplicative), blur, Rician noise (only where there is signal
    #    would be more faithful, but Rician noise on zero background is what real magnitude images show).
    bias = RandBiasField(degree=3, coeff_range=(0.0, cfg.bias_coeff), prob=1.0)
    bias.set_random_state(state=np.random.RandomState(rng.randint(2**31)))
    image = np.asarray(bias(image), np.float32)
    sig = tuple(cfg.smooth_sigma)
    smooth = RandGaussianSmooth(sigma_x=sig, sigma_y=sig, sigma_z=sig, prob=1.0)
    smooth.set_random_state(state=np.random.RandomState(rng.randint(2**31)))
    image = np.asarray(smooth(image), np.float32)
    noise = RandRicianNoise(prob=1.0, std=float(rng.uniform(*cfg.noise_std)), sample_std=False)
    noise.set_random_state(state=np.random.RandomState(rng.randint(2**31)))
    image = np.clip(np.asarray(noise(image), np.float32)[0], 0.0, 1.0)

    return SynthSample(
        image=image,
        brain_ml=float((gm + wm).sum() * VOXEL_ML),
        ventricle_ml=float((vent > 0.5).sum() * VOXEL_ML),
        brain_mask=mask > 0.5,
        labels=np.where(mask > 0.5, 1 + np.argmax(np.stack([csf, gm, wm]), axis=0), 0).astype(np.uint8),
        tissue=np.stack([gm, wm, csf, vent]).astype(np.float32),
    )


def generate_dataset(n: int, seed: int, config: SynthConfig | None = None, log=None):
    """``n`` samples from seeds derived from ``seed``.

    Returns:
        (images, tissue, brain_ml, ventricle_ml): images (n, 80, 96, 80) float16 (half the memory);
        tissue maps (n, 4, 80, 96, 80) uint8 (probability x 255, in TISSUE_NAMES order); volumes float32.
    """
    import time

    images = np.empty((n, *OUTPUT_SHAPE), np.float16)
    tissue = np.empty((n, len(TISSUE_NAMES), *OUTPUT_SHAPE), np.uint8)
    brain = np.empty(n, np.float32)
    vent = np.empty(n, np.float32)
    started = time.perf_counter()
    for i in range(n):
        s = generate(seed * 100_003 + i, config)
        images[i], brain[i], vent[i] = s.image, s.brain_ml, s.ventricle_ml
        tissue[i] = np.round(np.clip(s.tissue, 0, 1) * 255).astype(np.uint8)
        if log and ((i + 1) % 25 == 0 or i + 1 == n):
            elapsed = time.perf_counter() - started
            log(f"data {i + 1}/{n}  {elapsed:.0f}s  eta {elapsed / (i + 1) * (n - i - 1):.0f}s")
    return images, tissue, brain, vent
