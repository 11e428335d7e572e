"""Tissue maps (GM, WM, CSF probabilities and a brain mask) for any brain MRI volume, on its own grid.

The method is classical and needs no weights: the MNI152 2009 template (resources/mni152, the files nilearn
distributes: engine.anatomy.mni152) gives tissue priors; they are placed on the volume with rotation, per-axis
scale and shift (``engine.anatomy.register``: the template's brain outline on the volume's, then, after a first
fit, its tissue priors on the fitted tissues), and an EM fit of one Gaussian per tissue, with those priors, a
smooth bias field and a mean-field smoothing of the posteriors, labels the voxels. The contrast only decides the
order in which the tissue
intensities are expected (T1w: CSF < GM < WM; T2w: WM < GM < CSF; FLAIR: CSF < WM < GM), which seeds the fit
and is checked twice: before it against where the template puts each tissue (which also catches noise), and
after it on the fitted means. Why this and not antspyx's Atropos: see docs/segment.md (measured with
``benchmarks/segmentation.py``).

Everything works on arrays in RAS+ orientation with their voxel -> RAS mm affine; reading and writing files
is the caller's (the CLI's) job, so this module stays on the anatomy floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.anatomy.register import Placement, register_mask, register_tissues
from engine.anatomy.template import template_priors_1mm
from engine.errors import InvalidRequest

METHOD = "em-gmm-mni152-priors"
TISSUES = ("CSF", "GM", "WM")
_CSF, _GM = TISSUES.index("CSF"), TISSUES.index("GM")
CONTRASTS = ("t1w", "t2w", "flair")
#: Expected order of the tissue means, darkest first, per contrast (indices into TISSUES).
_ORDER = {"t1w": ("CSF", "GM", "WM"), "t2w": ("WM", "GM", "CSF"), "flair": ("CSF", "WM", "GM")}
#: Contrasts this method refuses, with the reason (their intensities do not separate GM, WM and CSF).
_REFUSED = {
    "swi": "SWI shows susceptibility (veins, iron), not a GM/WM/CSF contrast",
    "mra": "MRA (angiography) shows flowing blood; brain tissue is suppressed",
    "tof": "time-of-flight MRA shows flowing blood; brain tissue is suppressed",
    "dwi": "diffusion-weighted images do not separate GM, WM and CSF reliably",
    "ct": "CT does not separate GM from WM well enough for tissue maps",
}
CONTRAST_LABELS = {"t1w": "T1w", "t2w": "T2w", "flair": "FLAIR"}
_PRIOR_FLOOR = 0.05
# Least spread of the tissues' median intensities (fraction of the brain's intensity range) for a brain: the
# MNI template spreads about 0.8, the shipped model's volumes 0.5-0.65, noise under 0.02.
_MIN_TISSUE_SPREAD = 0.1  # a tissue the template rules out can still win where the image insists
_EM_ITERATIONS = 12
_FIRST_FIT_ITERATIONS = 5
_BIAS_ITERATIONS = (1, 3, 6, 9)  # the fit's iterations that re-estimate the bias field first
_BIAS_SMOOTH_MM = 30.0  # the bias field varies over this scale (a coil's shading), tissues over far less  # enough for the tissue layout the second round of the placement reads
_SMOOTH_BETA = 1.0  # weight of the neighbours' posteriors (mean-field MRF), in units of the log prior
_WORK_SPACING_MM = 1.5  # the fit runs on a grid no finer than this; maps are interpolated back


class NotBrainLike(InvalidRequest):
    """The volume is refused because it does not look like a brain (noise, nothing brain-sized, no tissue
    contrast where the template expects tissues): evidence for the anatomy check's "not brain-like" verdict."""


@dataclass(frozen=True)
class TissueMaps:
    """Probability maps on the input grid (float32, summing to the brain mask) and how they were made."""

    maps: dict[str, np.ndarray]  # "GM", "WM", "CSF", "brain"
    contrast: str
    means: dict[str, float]
    info: dict = field(default_factory=dict)

    def sidecar(self) -> dict:
        """What the maps' JSON sidecar says about how they were made."""
        import scipy

        from engine.anatomy.mni152 import SOURCE

        return {
            "tissue_maps_source": "method",
            "method": METHOD,
            "method_description": (
                "EM fit of one Gaussian per tissue with MNI152 2009 priors placed by a rigid + per-axis scale "
                "registration (brain outline, then tissue layout), bias-field correction, mean-field smoothing of "
                "the posteriors"
            ),
            "library_versions": {"numpy": np.__version__, "scipy": scipy.__version__},
            "template": SOURCE,
            "contrast": self.contrast,
            "tissue_means": self.means,
            **self.info,
        }


def check_contrast(contrast: str) -> str:
    """The contrast name in lower case, or InvalidRequest saying why it cannot be segmented."""
    key = str(contrast).strip().lower()
    if key in CONTRASTS:
        return key
    if key in ("t1", "t2"):
        return key + "w"
    reason = _REFUSED.get(key)
    if reason:
        raise InvalidRequest(
            f"cannot make tissue maps of a {contrast} volume: {reason}; give a T1w, T2w or FLAIR volume"
        )
    raise InvalidRequest(f"unknown contrast {contrast!r}; choose t1w, t2w or flair")


def contrast_from_modality(modality: str, default: str = "t1w") -> str:
    """The contrast ``segment`` takes for a generation modality (``t1w-skullstripped`` -> ``t1w``; the method
    handles skull-stripped and whole-head alike); ``default`` for a model that takes no modality. SWI, MRA and
    unknown names raise InvalidRequest with the reason."""
    key = str(modality or "").strip().lower().removesuffix("-skullstripped")
    return check_contrast(key or default)


def maps_or_reason(volume: np.ndarray, affine: np.ndarray, contrast: str, *, on_stage=None):
    """``(maps, record)`` for a generated image: its tissue maps and how they were made (``sidecar()``), or
    ``({}, {"tissue_maps_not_made": why})`` when the method refuses the volume (the noise of random weights,
    intensities against the contrast). The volume itself is still valid then, so this is no error."""
    try:
        made = segment(volume, affine, contrast, on_stage=on_stage)
    except NotBrainLike as exc:
        return {}, {"tissue_maps_not_made": str(exc), "not_brain_like": True}
    except InvalidRequest as exc:
        return {}, {"tissue_maps_not_made": str(exc)}
    except MemoryError:  # the sampled volume must not be lost to its maps' working memory
        shape = "x".join(str(n) for n in np.shape(volume))
        return {}, {"tissue_maps_not_made": f"not enough memory to make tissue maps of a {shape} volume"}
    return made.maps, made.sidecar()


def check_volume(volume: np.ndarray, name: str = "the volume") -> np.ndarray:
    """float32 3D array with finite, varying voxels, or InvalidRequest saying what is wrong."""
    data = np.asarray(volume)
    if data.ndim != 3:
        raise InvalidRequest(f"{name} is {data.ndim}D (shape {data.shape}); tissue maps need a 3D volume")
    if min(data.shape) < 8:
        raise InvalidRequest(
            f"{name} is too small for tissue maps (shape {data.shape}); it needs 8+ voxels per axis"
        )
    data = data.astype(np.float32, copy=False)
    finite = np.isfinite(data)
    if not finite.all():
        bad = int((~finite).sum())
        raise InvalidRequest(f"{name} has {bad} NaN or infinite voxels; tissue maps need finite intensities")
    if float(data.max()) - float(data.min()) <= 1e-6 * max(1.0, abs(float(data.max()))):
        raise InvalidRequest(f"{name} is constant; there is no tissue contrast to segment")
    return data


def head_brain_mask(volume: np.ndarray, spacing: np.ndarray, on_step=None) -> np.ndarray:
    """Brain mask of a whole-head or skull-stripped volume: foreground, eroded until the brain comes apart from
    scalp and skull (4 mm), largest component, grown back inside the foreground, closed, holes filled.

    Erosion and dilation by a ball are thresholds of Euclidean distance maps (linear time, where a 9-voxel
    structuring element costs seconds on a 1 mm head)."""
    from scipy import ndimage
    from skimage.filters import threshold_otsu

    background = _background_value(volume)
    above = volume[volume > background]
    if above.size == 0:  # 99 % of the voxels at the top value: a filled box, no head on a background
        raise NotBrainLike(
            "no brain-sized object found in the volume (nothing stands out from its background); is it a brain MRI?"
        )
    fg = volume > threshold_otsu(above) * 0.5 + 0.5 * background
    step = on_step or (lambda: None)  # called between the slow steps (a caller's cancel may raise there)
    fg = ndimage.binary_fill_holes(fg)
    step()
    core = _erode(fg, spacing, 4.0)
    step()
    if not core.any():
        core = fg
    labels, n = ndimage.label(core)
    if n > 1:
        sizes = ndimage.sum(core, labels, index=np.arange(1, n + 1))
        core = labels == (int(np.argmax(sizes)) + 1)
    mask = _dilate(core, spacing, 4.0) & fg
    step()
    mask = _erode(_dilate(mask, spacing, 3.0), spacing, 3.0)
    step()
    return ndimage.binary_fill_holes(mask)


def _erode(mask: np.ndarray, spacing: np.ndarray, mm: float) -> np.ndarray:
    from scipy import ndimage

    padded = np.pad(mask, 1)  # the volume's edge counts as outside
    return (ndimage.distance_transform_edt(padded, sampling=spacing) > mm)[1:-1, 1:-1, 1:-1]


def _dilate(mask: np.ndarray, spacing: np.ndarray, mm: float) -> np.ndarray:
    from scipy import ndimage

    if not mask.any():
        return mask
    return ndimage.distance_transform_edt(~mask, sampling=spacing) <= mm


def _background_value(volume: np.ndarray) -> float:
    """The intensity outside the head: the 1st percentile, which the corners of any head image sit at."""
    return float(np.percentile(volume, 1.0))


def _bounding_box(mask: np.ndarray) -> tuple[slice, ...]:
    idx = np.argwhere(mask)
    lo, hi = idx.min(0), idx.max(0) + 1
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi, strict=True))


def _work_grid(shape: tuple[int, ...], affine: np.ndarray) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """A grid no finer than _WORK_SPACING_MM over the input: its shape, affine, and voxel zoom factors."""
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(0))
    factor = np.maximum(1, np.floor(_WORK_SPACING_MM / spacing + 1e-6)).astype(int)
    work_shape = tuple(int(np.ceil(n / f)) for n, f in zip(shape, factor, strict=True))
    scale = np.diag([*factor.astype(float), 1.0])
    work_affine = affine @ scale
    # Voxel centres of a block average sit half a block in.
    work_affine[:3, 3] = affine[:3, :3] @ ((factor - 1) / 2.0) + affine[:3, 3]
    return work_shape, work_affine, factor


def _block_mean(volume: np.ndarray, factor: np.ndarray) -> np.ndarray:
    if np.all(factor == 1):
        return volume
    pads = [(0, (-n) % f) for n, f in zip(volume.shape, factor, strict=True)]
    padded = np.pad(volume, pads, mode="edge")
    shape = []
    for n, f in zip(padded.shape, factor, strict=True):
        shape += [n // f, f]
    return padded.reshape(shape).mean(axis=(1, 3, 5)).astype(np.float32)


def template_transform(brain: np.ndarray, affine: np.ndarray, tissues: np.ndarray | None = None) -> Placement:
    """Where the MNI152 template goes on a volume (rotation, per-axis scale, shift; ``engine.anatomy.register``):
    its brain outline overlaid on ``brain`` (a mask on the grid of ``affine``) and, given ``tissues`` ((3, x, y,
    z) CSF, GM, WM probabilities on that grid), its tissue priors overlaid on them."""
    placement = register_mask(brain, affine)
    if tissues is not None:
        placement = register_tissues(placement, tissues, affine)
    return placement


def _place_priors(
    placement: Placement, affine: np.ndarray, shape: tuple[int, ...], on_step=None
) -> tuple[np.ndarray, np.ndarray]:
    """The template's priors (CSF, GM, WM) and brain mask resampled onto a grid by ``placement``."""
    from scipy import ndimage

    priors, tmask, taffine = template_priors_1mm()
    vox = np.linalg.inv(taffine) @ placement.to_template @ affine  # volume voxel -> template voxel
    out = np.empty((3, *shape), np.float32)
    for k in range(3):
        if on_step is not None:  # each resampling of a 1 mm prior takes seconds: a cancel may stop between
            on_step(k)
        out[k] = ndimage.affine_transform(priors[k], vox, output_shape=shape, order=1, cval=0.0)
    mask = ndimage.affine_transform(tmask.astype(np.float32), vox, output_shape=shape, order=1, cval=0.0)
    return out, mask


def _priors_at(priors: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The priors of the fitted voxels, normalised; no prior (1/3 each) where the template has no brain."""
    pri = priors.reshape(3, -1)[:, index]
    pri = pri / np.maximum(pri.sum(0, keepdims=True), 1e-6)
    pri[:, pri.sum(0) < 0.5] = 1 / 3  # inside the volume's brain but outside the template's: no prior
    return pri


def _em(
    values: np.ndarray,
    priors: np.ndarray,
    order: tuple[str, ...],
    index: np.ndarray,
    shape: tuple[int, ...],
    on_iteration=None,
    iterations: int = _EM_ITERATIONS,
    spacing: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EM over the masked voxels; posteriors (3, n) and the means and sds of CSF, GM, WM. ``on_iteration(i, n)``
    is called after each iteration (it may raise to stop the fit). Given the grid's ``spacing`` (mm), a smooth
    multiplicative bias field (a coil's shading) is estimated as it goes and divided out (``_bias_field``)."""
    from scipy import ndimage

    raw = values

    logp = np.log(priors * (1 - 3 * _PRIOR_FLOOR) + _PRIOR_FLOOR).astype(np.float32)
    # Seed: the tissues' means at quantiles of the brain's intensities in the order the contrast expects.
    seeds = np.quantile(values, (0.1, 0.5, 0.85))
    mean = np.empty(3, np.float32)
    for rank, name in enumerate(order):
        mean[TISSUES.index(name)] = seeds[rank]
    sd = np.full(3, values.std() / 3 + 1e-6, np.float32)
    smooth = np.zeros_like(logp)
    post = priors
    for iteration in range(iterations):
        if on_iteration is not None:
            on_iteration(iteration, iterations)
        ll = -0.5 * ((values[None] - mean[:, None]) / sd[:, None]) ** 2 - np.log(sd)[:, None]
        score = ll + logp + _SMOOTH_BETA * smooth
        score -= score.max(0, keepdims=True)
        post = np.exp(score)
        post /= post.sum(0, keepdims=True)
        if spacing is not None and iteration in _BIAS_ITERATIONS:
            values = raw / _bias_field(raw, post.T @ mean, index, shape, spacing)
        weight = post.sum(1) + 1e-6
        mean = (post @ values) / weight
        sd = np.sqrt(np.maximum((post * (values[None] - mean[:, None]) ** 2).sum(1) / weight, 1e-12))
        sd = np.maximum(sd, 0.02 * (values.max() - values.min()) + 1e-6)
        # CSF spreads no wider than GM: its fitted spread takes in the partial-volume band at the GM/CSF border
        # (and the ventricles' extremes), and unbounded its Gaussian claimed that band: on the MNI152 template
        # 115k voxels the reference calls GM (mean intensity 0.52, GM's 0.6) came out CSF (GM Dice 0.927 -> 0.940).
        sd[_CSF] = min(sd[_CSF], sd[_GM])
        # Mean-field smoothing: each voxel sees the average posterior of its 3x3x3 block (log domain).
        for k in range(3):
            full = np.zeros(shape, np.float32)
            full.flat[index] = post[k]
            avg = ndimage.uniform_filter(full, size=3, mode="constant")
            smooth[k] = np.log(avg.flat[index] + np.float32(1e-3))
    return post.astype(np.float32), mean, sd


def _bias_field(
    values: np.ndarray, expected: np.ndarray, index: np.ndarray, shape: tuple[int, ...], spacing: np.ndarray
) -> np.ndarray:
    """The smooth multiplicative field b that best explains ``values`` as b x ``expected`` (the fitted tissue
    means) in every _BIAS_SMOOTH_MM neighbourhood: a local least-squares ratio, computed on a grid of about
    6 mm and interpolated back, bounded to 0.6-1.6. Returned at the fitted voxels (``index`` into ``shape``)."""
    from scipy import ndimage

    factor = np.maximum(1, np.round(6.0 / spacing)).astype(int)
    num = np.zeros(shape, np.float32)
    den = np.zeros(shape, np.float32)
    num.flat[index] = values * expected
    den.flat[index] = expected * expected
    coarse_num, coarse_den = _block_mean(num, factor), _block_mean(den, factor)
    sigma = _BIAS_SMOOTH_MM / (spacing * factor)
    ratio = ndimage.gaussian_filter(coarse_num, sigma) / np.maximum(
        ndimage.gaussian_filter(coarse_den, sigma), 1e-6
    )
    # The ratio's grid is a block mean of the fitted grid: read it back at the fitted voxels' block coordinates.
    coords = np.stack(np.unravel_index(index, shape)).astype(np.float32)
    coords = (coords - (factor[:, None] - 1) / 2.0) / factor[:, None]
    field = ndimage.map_coordinates(ratio, coords, order=1, mode="nearest")
    return np.clip(field, 0.6, 1.6).astype(np.float32)


def _check_order_against_priors(values: np.ndarray, priors: np.ndarray, contrast: str) -> None:
    """Refuse a volume whose intensities, averaged where the template expects each tissue, run against the
    claimed contrast: the EM fit would otherwise follow its seeds and give WM the CSF label without a sign.

    Only the two pairs the contrasts differ by are checked: CSF vs WM (T2w against T1w/FLAIR) and GM vs WM (FLAIR
    against T1w), with weights sharpened so that partial volume does not blur them together.
    """
    # Weighted medians, not means: where the template's placement is off, the other tissues' voxels under a prior
    # drag a mean along, while the median stays with the tissue that fills most of it.
    weights = priors**4
    order = np.argsort(values)
    prior_mean = {}
    for k, name in enumerate(TISSUES):
        cumulative = np.cumsum(weights[k][order])
        prior_mean[name] = float(values[order][np.searchsorted(cumulative, cumulative[-1] / 2)])
    spread = max(prior_mean.values()) - min(prior_mean.values())
    if spread < _MIN_TISSUE_SPREAD:
        raise NotBrainLike(
            f"the volume's intensities hardly differ where the template expects CSF, GM and WM (spread "
            f"{spread:.3f} of its range); it does not look like a brain MRI (noise, or another kind of image)"
        )
    expected = _ORDER[contrast]
    for a, b in (("CSF", "WM"), ("GM", "WM")):
        if (expected.index(a) < expected.index(b)) != (prior_mean[a] < prior_mean[b]):
            looks = next(
                (
                    c
                    for c, order in _ORDER.items()
                    if (order.index(a) < order.index(b)) == (prior_mean[a] < prior_mean[b])
                ),
                "another contrast",
            )
            raise InvalidRequest(
                f"where the template expects {a} and {b}, this volume is {'darker' if prior_mean[a] < prior_mean[b] else 'brighter'} "
                f"in {a}, which a {CONTRAST_LABELS[contrast]} volume is not (it looks like {CONTRAST_LABELS.get(looks, looks)}); check --contrast"
            )


def segment(
    volume: np.ndarray,
    affine: np.ndarray,
    contrast: str = "t1w",
    *,
    on_stage=None,
) -> TissueMaps:
    """GM, WM and CSF probability maps and a brain mask of a brain MRI volume.

    Args:
        volume: 3D intensities in RAS+ orientation (any grid and spacing), whole-head or skull-stripped.
        affine: Voxel -> RAS mm affine of ``volume``.
        contrast: ``t1w``, ``t2w`` or ``flair``; SWI, MRA and others are refused with the reason.
        on_stage: Optional callback ``(stage: str, fraction: float)`` for a progress line, called between stages
            and at each iteration of the fit; an exception it raises stops the work there and propagates (how
            a caller cancels: the app's worker raises ``Cancelled``).

    Returns:
        TissueMaps with float32 maps "GM", "WM", "CSF" (summing to the brain mask's value) and "brain" (0/1).

    Raises:
        InvalidRequest: A volume that is not 3D, has NaN/inf or no contrast, or an unsupported contrast.
    """

    report = on_stage or (lambda stage, fraction: None)
    contrast = check_contrast(contrast)
    data = check_volume(volume)
    affine = np.asarray(affine, np.float64)
    if (
        affine.shape != (4, 4)
        or not np.all(np.isfinite(affine))
        or abs(np.linalg.det(affine[:3, :3])) < 1e-12
    ):
        raise InvalidRequest("the volume's voxel-to-world affine is broken (not 4x4, NaN or singular)")

    report("mask", 0.0)
    work_shape, work_affine, factor = _work_grid(data.shape, affine)
    work = _block_mean(data, factor)
    spacing = np.sqrt((work_affine[:3, :3] ** 2).sum(0))
    brain = head_brain_mask(work, spacing, on_step=lambda: report("mask", 0.1))
    if brain.sum() * np.prod(spacing) < 50_000:  # 50 mL: far less than any brain
        raise NotBrainLike(
            "no brain-sized object found in the volume (under 50 mL of foreground); is it a brain MRI?"
        )

    report("priors", 0.25)
    # Everything from here runs in the brain's bounding box (a margin for the template's mask): a whole head
    # or a wide field of view is mostly background.
    box = _bounding_box(_dilate(brain, spacing, 6.0))
    corner = np.array([s.start for s in box], np.float64)
    box_affine = work_affine.copy()
    box_affine[:3, 3] = work_affine[:3, :3] @ corner + work_affine[:3, 3]
    box_shape = tuple(s.stop - s.start for s in box)
    brain_box = brain[box]
    # Round 1 of the placement: the template's brain outline on the volume's (rotation included).
    placement = template_transform(brain_box, box_affine)
    priors, tmask = _place_priors(
        placement, box_affine, box_shape, lambda k: report("priors", 0.25 + 0.03 * k)
    )
    # The placed template mask keeps what the erosion could not cut off (eyes, neck) out of the brain.
    brain_box &= _dilate(tmask > 0.5, spacing, 3.0)
    index = np.flatnonzero(brain_box)
    values = work[box].flat[index].astype(np.float32)
    lo, hi = np.percentile(values, (0.5, 99.5))
    values = np.clip((values - lo) / max(hi - lo, 1e-6), -0.5, 1.5).astype(np.float32)
    pri = _priors_at(priors, index)

    # The check looks 5 mm inside the mask: at its edge a skull-stripped volume's zeros sit under the CSF prior.
    inner = _erode(brain_box, spacing, 5.0).flat[index]
    _check_order_against_priors(values[inner], pri[:, inner], contrast)

    # A first fit, then round 2: the template's tissue priors on the fitted tissues (the inner structure), and the
    # fit again with the priors placed there.
    report("fit", 0.35)
    post, _mean, _sd = _em(
        values,
        pri,
        _ORDER[contrast],
        index,
        box_shape,
        lambda i, n: report("fit", 0.35 + 0.15 * i / n),
        iterations=_FIRST_FIT_ITERATIONS,
    )
    fitted = np.zeros((3, *box_shape), np.float32)
    fitted.reshape(3, -1)[:, index] = post
    placement = register_tissues(placement, fitted, box_affine)
    del fitted
    report("priors", 0.5)
    priors, _tmask = _place_priors(placement, box_affine, box_shape)
    pri = _priors_at(priors, index)
    del priors
    info = placement.record()

    report("fit", 0.55)
    post, mean, _sd = _em(
        values,
        pri,
        _ORDER[contrast],
        index,
        box_shape,
        lambda i, n: report("fit", 0.55 + 0.3 * i / n),
        spacing=spacing,
    )
    ranked = tuple(TISSUES[k] for k in np.argsort(mean))
    if ranked != _ORDER[contrast]:
        raise InvalidRequest(
            f"the tissue intensities come out in the order {' < '.join(ranked)}, not the "
            f"{' < '.join(_ORDER[contrast])} a {CONTRAST_LABELS[contrast]} volume has; check --contrast"
        )
    brain = np.zeros(work_shape, bool)
    brain[box] = brain_box

    report("maps", 0.85)
    maps: dict[str, np.ndarray] = {}
    for k, name in enumerate(TISSUES):
        inner = np.zeros(box_shape, np.float32)
        inner.flat[index] = post[k]
        full = np.zeros(work_shape, np.float32)
        full[box] = inner
        maps[name] = _to_input_grid(full, factor, data.shape)
    brain_full = _to_input_grid(brain.astype(np.float32), factor, data.shape)
    total = maps["CSF"] + maps["GM"] + maps["WM"]
    scale = np.where(total > 1e-6, brain_full / np.maximum(total, 1e-6), 0.0)
    for name in TISSUES:
        maps[name] = (maps[name] * scale).astype(np.float32)
    maps["brain"] = (brain_full >= 0.5).astype(np.float32)
    means = {name: round(float(mean[k] * (hi - lo) + lo), 4) for k, name in enumerate(TISSUES)}
    info["work_spacing_mm"] = [round(float(s), 3) for s in spacing]
    report("done", 1.0)
    return TissueMaps(maps=maps, contrast=contrast, means=means, info=info)


def _to_input_grid(work: np.ndarray, factor: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A work-grid map interpolated (linear) back onto the input grid."""
    from scipy import ndimage

    if np.all(factor == 1):
        return work
    # Input voxel i sits at work coordinate (i - (f - 1) / 2) / f.
    f = factor.astype(np.float64)
    return ndimage.affine_transform(
        work, 1.0 / f, offset=-(f - 1) / (2 * f), output_shape=shape, order=1, mode="nearest"
    ).astype(np.float32)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    total = a.sum() + b.sum()
    return 1.0 if total == 0 else float(2 * (a & b).sum() / total)
