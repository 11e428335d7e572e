"""Evaluate a brain-T1 model: brain-mask Dice, GM/WM contrast, diversity, ventricle conditioning, finiteness.

Every sample comes from :class:`engine.backends.local.LocalBackend` with a :class:`engine.api.SamplingRequest`
(the product's one sampling loop). The metric functions take plain arrays so they are tested on synthetic
inputs, including failing ones (tests/engine/training/test_metrics.py).

Generated tissue maps are checked against the image they came with (Dice of their hard labels against a
3-class k-means of the image's intensities inside the brain) and against the request (ventricle volume of
the generated ventricle map vs the requested value). Sharpness is a *blur equivalence*: the Gaussian sigma
(voxels) at which training volumes lose as much edge contrast as the samples show (:func:`edge_score`).

Measurements on generated images (the ruler for models without tissue maps):

* brain mask: Otsu threshold, largest connected component, closing (sulcal CSF), holes filled (ventricles
  are inside the brain);
* ventricle volume: voxels darker than half the brain's median intensity (CSF; GM and WM are far brighter
  in T1) inside the eroded brain mask and inside a fixed central region around the template ventricles.
  The same measurement is run on labelled synthetic training volumes and its agreement with the label
  volumes is reported, so the conditioning metric's ruler is itself checked.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engine.anatomy.measures import brain_mask, ventricle_volume_ml
from engine.machine.peak_memory import process_peak_rss_bytes
from engine.metrics.rank import spearman

DICE_TARGET = 0.80
SPEARMAN_TARGET = 0.7
TISSUE_DICE_TARGET = 0.80  # GM and WM maps vs a 3-class k-means of the image they came with
LABEL_SPEARMAN_TARGET = 0.8  # ventricle volume of the generated label vs the requested one
BLUR_TARGET = 0.8  # voxels: samples at most as blurred as training volumes under this Gaussian sigma
# Blur steps of the ruler (voxels). Not 0.25: a sampled Gaussian that narrow is the identity. Not beyond 2:
# the blurred brain/background edge then reaches 3 voxels inside the brain mask and the score rises again.
BLUR_SIGMAS = (0.0, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
DIP_TARGET = 0.9  # histogram minimum between the GM and WM modes, relative to the lower mode's height
SSIM_MAX = 0.95  # mean pairwise SSIM above this means the model collapsed to (nearly) one output
VOXEL_ML = 0.008


# -- metric functions on arrays -------------------------------------------------------------------------


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    total = a.sum() + b.sum()
    return 1.0 if total == 0 else float(2 * np.logical_and(a, b).sum() / total)


def tissue_modes(volume: np.ndarray, mask: np.ndarray | None = None, bins: int = 64) -> dict[str, Any]:
    """GM and WM modes of the intensity histogram inside the brain, and how deep the dip between them is.

    The histogram of voxels above the CSF level (half the brain median) is smoothed; the two highest local
    maxima at least 0.06 apart are the GM (lower) and WM (upper) modes. ``dip_ratio`` is the histogram
    minimum between them divided by the lower of the two peak heights: 1.0 means no dip (unimodal),
    small values mean well separated tissue classes.

    Returns:
        dict with gm_mode, wm_mode, dip_ratio (nan and bimodal False when there are not two modes).
    """
    from scipy import ndimage

    vol = np.asarray(volume, np.float32)
    mask = brain_mask(vol) if mask is None else np.asarray(mask, bool)
    inner = ndimage.binary_erosion(mask, iterations=1)
    values = vol[inner]
    failed = {"gm_mode": float("nan"), "wm_mode": float("nan"), "dip_ratio": float("nan"), "bimodal": False}
    if values.size < 100:
        return failed
    values = values[values > 0.5 * np.median(values)]  # drop CSF: we look for the two tissue modes
    hist, edges = np.histogram(values, bins=bins, range=(0.0, 1.0))
    hist = ndimage.gaussian_filter1d(hist.astype(np.float64), 1.0)
    centres = (edges[:-1] + edges[1:]) / 2
    peaks = [
        i
        for i in range(1, bins - 1)
        if hist[i] >= hist[i - 1] and hist[i] > hist[i + 1] and hist[i] > 0.05 * hist.max()
    ]
    pairs = [(a, b) for a, b in itertools.combinations(peaks, 2) if centres[b] - centres[a] >= 0.06]
    if not pairs:
        return failed
    a, b = max(pairs, key=lambda p: min(hist[p[0]], hist[p[1]]))
    dip = float(hist[a : b + 1].min() / min(hist[a], hist[b]))
    return {
        "gm_mode": float(centres[a]),
        "wm_mode": float(centres[b]),
        "dip_ratio": dip,
        "bimodal": dip <= DIP_TARGET,
    }


def mean_pairwise_ssim(volumes: list[np.ndarray]) -> tuple[float, float]:
    """Mean and max SSIM over all pairs of volumes (data range 1)."""
    from skimage.metrics import structural_similarity

    scores = [
        structural_similarity(np.asarray(a, np.float32), np.asarray(b, np.float32), data_range=1.0)
        for a, b in itertools.combinations(volumes, 2)
    ]
    return float(np.mean(scores)), float(np.max(scores))


def reference_mask(shape: tuple[int, ...], affine: np.ndarray) -> np.ndarray:
    """The MNI152 brain mask resampled onto a volume's grid through the two affines (nearest neighbour).

    No shifting or registration: a volume that claims MNI space is compared where its affine puts it.
    """
    from nibabel.processing import resample_from_to

    from engine.anatomy.template import template_mask_image

    resampled = resample_from_to(template_mask_image(), (tuple(shape[:3]), np.asarray(affine)), order=0)
    return np.asarray(resampled.get_fdata()) > 0.5


def kmeans_1d(values: np.ndarray, k: int = 3, iterations: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means on intensities, started at evenly spaced percentiles (deterministic).

    Returns:
        (labels 0..k-1 ordered by centre intensity, the sorted centres).
    """
    values = np.asarray(values, np.float64).ravel()
    centres = np.percentile(values, np.linspace(100 / (2 * k), 100 - 100 / (2 * k), k))
    labels = np.zeros(values.shape, np.int64)
    for _ in range(iterations):
        labels = np.abs(values[:, None] - centres[None, :]).argmin(axis=1)
        new = np.array([values[labels == j].mean() if (labels == j).any() else centres[j] for j in range(k)])
        if np.allclose(new, centres):
            break
        centres = new
    order = np.argsort(centres)
    rank = np.empty(k, np.int64)
    rank[order] = np.arange(k)
    return rank[labels], centres[order]


def tissue_agreement(image: np.ndarray, maps: dict[str, np.ndarray], mask: np.ndarray | None = None) -> dict:
    """Dice of the maps' hard labels (argmax of CSF, GM, WM) against a 3-class k-means of the image.

    Inside the brain mask (the image's own, :func:`brain_mask`, unless given), k-means clusters are named by
    intensity as a T1 orders them: darkest CSF, then GM, brightest WM.
    """
    image = np.asarray(image, np.float32)
    mask = brain_mask(image) if mask is None else np.asarray(mask, bool)
    if mask.sum() < 100:
        return {"GM": 0.0, "WM": 0.0, "CSF": 0.0}
    clusters, _ = kmeans_1d(image[mask], 3)
    stack = np.stack([maps["CSF"][mask], maps["GM"][mask], maps["WM"][mask]])
    labels = stack.argmax(axis=0)
    return {name: dice(labels == k, clusters == k) for k, name in enumerate(("CSF", "GM", "WM"))}


def edge_score(volume: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Gradient energy (mean squared gradient magnitude, "Tenengrad") inside the brain, eroded 3 voxels so
    the brain/background edge does not count, per squared unit of the brain's 5-95th percentile intensity
    spread: blur lowers it, a contrast change does not. (The mean gradient *magnitude* would not do: the
    total variation of a step edge is the same however blurred it is.)"""
    from scipy import ndimage

    vol = np.asarray(volume, np.float32)
    mask = brain_mask(vol) if mask is None else np.asarray(mask, bool)
    inner = ndimage.binary_erosion(mask, iterations=3)
    if inner.sum() < 100:
        return 0.0
    energy = np.zeros(vol.shape, np.float64)
    for gradient in np.gradient(vol):
        energy += gradient.astype(np.float64) ** 2
    spread = float(np.percentile(vol[mask], 95) - np.percentile(vol[mask], 5))
    return float(energy[inner].mean() / spread**2) if spread > 1e-6 else 0.0


def blur_curve(volumes: list[np.ndarray], sigmas=BLUR_SIGMAS) -> list[float]:
    """Mean :func:`edge_score` of ``volumes`` blurred by each Gaussian sigma (voxels); the ruler."""
    from scipy import ndimage

    masks = [brain_mask(v) for v in volumes]
    return [
        float(
            np.mean(
                [
                    edge_score(ndimage.gaussian_filter(v, s) if s > 0 else v, m)
                    for v, m in zip(volumes, masks, strict=True)
                ]
            )
        )
        for s in sigmas
    ]


def blur_equivalence(score: float, curve: list[float], sigmas=BLUR_SIGMAS) -> float:
    """The sigma at which the blurred training volumes score ``score`` (linear between the curve's points;
    0 when at least as sharp as the unblurred volumes; the largest sigma + when blurrier than all)."""
    if score >= curve[0]:
        return 0.0
    for (s0, c0), (s1, c1) in itertools.pairwise(zip(sigmas, curve, strict=True)):
        if c1 <= score <= c0:
            return float(s0 + (s1 - s0) * (c0 - score) / (c0 - c1)) if c0 > c1 else float(s0)
    return float("inf")


# -- montage ---------------------------------------------------------------------------------------------


def radiological_slices(volume: np.ndarray) -> list[np.ndarray]:
    """Axial, coronal, sagittal mid-slices of a RAS volume as 2D display arrays (row 0 = top).

    Axial: anterior up, patient right on the image left (radiological). Coronal: superior up, patient
    right on the image left. Sagittal: superior up, anterior on the image left.
    """
    x, y, z = volume.shape
    axial = volume[:, :, z // 2]  # [i (R), j (A)]
    coronal = volume[:, y // 2, :]  # [i (R), k (S)]
    sagittal = volume[x // 2, :, :]  # [j (A), k (S)]
    # D[r, c] = A[n0 - 1 - c, n1 - 1 - r]: the first axis runs right-to-left across, the second top-down.
    return [np.ascontiguousarray(s[::-1, ::-1].T) for s in (axial, coronal, sagittal)]


# Overlay colours of the hard tissue labels (RGB 0-1), the app's overlay palette (app/core/tissue.py):
# GM orange, WM blue, CSF cyan-green, ventricles purple.
TISSUE_COLOURS = {
    "GM": (255 / 255, 150 / 255, 40 / 255),
    "WM": (60 / 255, 160 / 255, 255 / 255),
    "CSF": (60 / 255, 220 / 255, 200 / 255),
    "ventricles": (215 / 255, 80 / 255, 235 / 255),
}


def tissue_rgb(image: np.ndarray, maps: dict[str, np.ndarray], opacity: float = 0.45) -> np.ndarray:
    """The image in grey with the maps' most likely class (ventricles over CSF) blended in colour."""
    grey = np.clip(np.asarray(image, np.float32), 0, 1)[..., None].repeat(3, axis=-1)
    names = [n for n in ("CSF", "GM", "WM") if n in maps]
    stack = np.stack([maps[n] for n in names])
    winner = stack.argmax(axis=0)
    inside = stack.sum(axis=0) > 0.5
    colour = np.zeros_like(grey)
    for k, name in enumerate(names):
        colour[winner == k] = TISSUE_COLOURS[name]
    if "ventricles" in maps:
        colour[maps["ventricles"] > 0.5] = TISSUE_COLOURS["ventricles"]
    alpha = opacity * inside[..., None]
    return grey * (1 - alpha) + colour * alpha


def save_montage(
    volumes: list[np.ndarray], path: Path, title: str = "", tissue: list[dict[str, np.ndarray]] | None = None
) -> Path:
    """A PNG with one column per volume and rows axial / coronal / sagittal, radiological orientation; with
    ``tissue``, three more rows show the same slices with the generated tissue labels overlaid."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(volumes)
    rows = 3 * (2 if tissue else 1)
    fig = Figure(figsize=(1.6 * n, 1.9 * rows + 0.4), dpi=110)
    FigureCanvasAgg(fig)
    fig.patch.set_facecolor("black")
    names = ("axial", "coronal", "sagittal")
    for col, vol in enumerate(volumes):
        panels = list(enumerate(radiological_slices(vol)))
        if tissue:
            rgb = tissue_rgb(vol, tissue[col])
            channels = [radiological_slices(rgb[..., c]) for c in range(3)]
            panels += [(3 + r, np.stack([channels[c][r] for c in range(3)], axis=-1)) for r in range(3)]
        for row, sl in panels:
            ax = fig.add_subplot(rows, n, row * n + col + 1)
            ax.imshow(sl, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                label = names[row % 3] + (" + tissue" if row >= 3 else "")
                ax.set_ylabel(label, color="white", fontsize=8)
            if row % 3 < 2:  # orientation marks: patient right is on the image left (radiological)
                ax.text(0.02, 0.5, "R", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
                ax.text(0.92, 0.5, "L", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
            else:
                ax.text(0.02, 0.5, "A", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
                ax.text(0.92, 0.5, "P", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
    if title:
        fig.suptitle(title, color="white", fontsize=9)
    fig.subplots_adjust(
        left=0.03, right=0.99, top=1 - 0.45 / (1.9 * rows + 0.4), bottom=0.01, wspace=0.03, hspace=0.03
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor="black")
    return path


# -- sampling --------------------------------------------------------------------------------------------


def _run(backend, request):
    """The SamplingResult of ``request`` (images: ``result.volume(i)``, maps: ``result.tissue_maps(i)``)."""
    from engine.api import run

    return run(backend.sample(request))


def inference_benchmark(model: str, steps: int = 50, guidance_scale: float | None = None) -> dict[str, Any]:
    """One volume, ``steps`` DDIM steps + decode, in this process: seconds (excluding load) and peak RSS."""
    import torch

    from engine.api import SamplingRequest, run
    from engine.backends import make_backend

    torch.set_num_threads(2)
    backend = make_backend("cpu")
    gen = backend.sample(
        SamplingRequest(model=model, sampler="ddim", steps=steps, seed=0, guidance_scale=guidance_scale)
    )
    started = cpu_started = None

    def on_progress(progress) -> None:
        nonlocal started, cpu_started
        if progress.stage == "denoise" and started is None:
            started = time.perf_counter()  # after the model is loaded: the generation itself
            cpu_started = _cpu_seconds()

    result = run(gen, on_progress)
    seconds = time.perf_counter() - (started or time.perf_counter())
    cpu = _cpu_seconds() - (cpu_started or 0.0)
    peak_kb = process_peak_rss_bytes() / 1024
    # On a shared machine wall time depends on the other jobs; CPU seconds / threads is what the same
    # work takes on an idle machine with those threads, so both are reported.
    return {
        "steps": steps,
        "guidance_scale": guidance_scale,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "idle_estimate_s": cpu / 2,
        "load_average_1min": os.getloadavg()[0],
        "peak_rss_gb": peak_kb / 1024**2,
        "threads": 2,
        "timings": {k: round(v, 2) for k, v in result.provenance.get("timings", {}).items()}
        if isinstance(result.provenance.get("timings"), dict)
        else {},
    }


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _inference_in_fresh_process(model: str, steps: int, guidance_scale: float) -> dict[str, Any]:
    """Peak RSS must not include the evaluation's batch-8 runs: measure in a new interpreter."""
    code = (
        "import json, sys; from engine.training.evaluate import inference_benchmark; "
        "print('RESULT', json.dumps(inference_benchmark(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, model, str(steps), str(guidance_scale)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def measurement_check(n: int = 12) -> dict[str, Any]:
    """The image-based rulers against the truth, on labelled synthetic volumes (seeds outside training):
    ventricle volume measured on the image vs the label, and k-means tissue classes vs the tissue maps."""
    from engine.anatomy.template import template_brain_mask, ventricle_roi
    from engine.training.synth import TISSUE_NAMES, generate

    roi = ventricle_roi()
    ref = template_brain_mask()
    label, measured, dices, agreement = [], [], [], []
    for seed in range(10_000, 10_000 + n):
        s = generate(seed)
        label.append(s.ventricle_ml)
        measured.append(ventricle_volume_ml(s.image, roi))
        dices.append(dice(brain_mask(s.image), ref))
        agreement.append(tissue_agreement(s.image, dict(zip(TISSUE_NAMES, s.tissue, strict=True))))
    return {
        "n": n,
        "spearman_label_vs_measured": spearman(label, measured),
        "label_ml": [round(v, 1) for v in label],
        "measured_ml": [round(v, 1) for v in measured],
        "training_like_dice_mean": float(np.mean(dices)),
        "kmeans_vs_true_maps_dice": {
            k: float(np.mean([a[k] for a in agreement])) for k in ("GM", "WM", "CSF")
        },
    }


def _held_out_volumes(n: int = 8):
    """Labelled synthetic volumes from seeds outside the training set: (images, tissue stacks)."""
    from engine.training.synth import generate

    samples = [generate(20_000 + i) for i in range(n)]
    return [s.image for s in samples], [s.tissue for s in samples]


def reconstructions(loaded, images: list[np.ndarray], tissue: list[np.ndarray]) -> list[np.ndarray]:
    """The autoencoder's whole-volume reconstructions (posterior mean) of ``images``: how much blur the
    autoencoder alone adds. Models whose encoder takes the tissue maps get them as extra channels."""
    import torch

    ae = loaded.autoencoder
    channels = loaded.spec.networks["autoencoder"].get("in_channels", 1)
    out = []
    with torch.inference_mode():
        for image, maps in zip(images, tissue, strict=True):
            x = np.concatenate([image[None], maps])[:channels] if channels > 1 else image[None]
            mu, _ = ae.encode(torch.from_numpy(np.ascontiguousarray(x, np.float32))[None])
            out.append(ae.decode(mu)[0, 0].float().numpy())
    return out


def evaluate_model(
    model: str = "",
    n_samples: int = 16,
    steps: int = 50,
    write_card: bool = True,
    write_montage: bool = True,
    log: Callable[[str], None] = print,
    sweep_seeds: int = 3,
    batch: int = 8,
    inference: bool = True,
    guidance_scale: float | None = None,
) -> dict[str, Any]:
    """Sample the model, compute every metric, and (optionally) update its card, evaluation.json, montage.

    Args:
        model: model id or folder ("" = the shipped default).
        n_samples: samples at default conditions for Dice, contrast, tissue maps, sharpness and diversity.
        steps: DDIM steps per sample.
        write_card: rewrite MODEL_CARD.md and evaluation.json in the model folder.
        write_montage: write montage.png (first 8 default samples) in the model folder.
        log: where progress lines go.
        sweep_seeds: samples per requested ventricle volume.
        batch: batch size of the sampling requests.
        inference: also time one generation in a fresh process (time and peak RSS).
        guidance_scale: classifier-free guidance scale of every evaluation sample (1.0 = none); None = the
            model's default, which is what users get.

    Returns:
        The evaluation dict (also written to evaluation.json), with ``all_pass``.
    """
    import torch

    from engine.api import SamplingRequest
    from engine.backends import make_backend
    from engine.models.registry import ModelRegistry

    torch.set_num_threads(2)
    started = time.perf_counter()
    source = ModelRegistry().get(model or None)
    spec = source.spec
    if guidance_scale is None:
        guidance_scale = spec.default_guidance_scale
    backend = make_backend("cpu")
    model_ref = str(source.path)

    def sample(**request):
        """Every evaluation sample: DDIM ``steps`` at the evaluation's guidance scale."""
        return _run(
            backend,
            SamplingRequest(
                model=model_ref, sampler="ddim", steps=steps, guidance_scale=guidance_scale, **request
            ),
        )

    def progress(text: str) -> None:
        """A progress line, with the seconds since the evaluation started."""
        log(f"{text}  {time.perf_counter() - started:.0f}s")

    defaults = _sample_defaults(sample, n_samples, batch, progress)
    measured = _measure_defaults(spec, defaults)
    sharpness = _sharpness(source, defaults["samples"], measured["masks"], progress)
    sweep = _ventricle_sweep(sample, spec, sweep_seeds, measured["has_maps"], progress)
    check = measurement_check()
    log(
        f"evaluate: measurement check on labelled synthetic volumes: Spearman "
        f"{check['spearman_label_vs_measured']:.3f}"
    )
    inf = _inference_in_fresh_process(model_ref, 50, guidance_scale) if inference else None

    metrics = {
        "dice": measured["dice"],
        "contrast": measured["contrast"],
        "sharpness": sharpness,
        "diversity": measured["diversity"],
        "conditioning": _conditioning_metric(spec, sweep, check),
        "finite": {"pass": bool(defaults["finite"] and sweep["finite"])},
    }
    if measured["has_maps"]:
        metrics["tissue_maps"] = _tissue_map_metric(measured["agreement"], sweep)
    result = {
        "model": spec.id,
        "metrics": metrics,
        "all_pass": all(m["pass"] for m in metrics.values()),
        "sampling": (
            f"DDIM {steps} steps, guidance scale {guidance_scale:g}, {n_samples} samples at default conditions "
            f"(seeds 0-{defaults['seeds'] - 1}, batches of {batch}); ventricle sweep {sweep_seeds} samples per "
            "value"
        ),
        "inference": inf,
        "seconds": time.perf_counter() - started,
        "machine": f"{_machine_words()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
    }
    log(_summary(result))
    _write_outputs(source, result, defaults, measured["has_maps"], steps, write_montage, write_card, log)
    return result


def _sample_defaults(sample, n_samples: int, batch: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Step 1: ``n_samples`` at default conditions (seeds 0, 1, ... of ``batch`` each), with their maps."""
    samples: list[np.ndarray] = []
    sample_maps: list[dict[str, np.ndarray]] = []
    seed = 0
    while len(samples) < n_samples:
        size = min(batch, n_samples - len(samples))
        result = sample(seed=seed, batch_size=size)
        samples += [result.volume(i) for i in range(size)]
        sample_maps += [result.tissue_maps(i) for i in range(size)]
        affine = result.affine
        seed += 1
        progress(f"evaluate: {len(samples)}/{n_samples} default samples")
    return {
        "samples": samples,
        "maps": sample_maps,
        "affine": affine,
        "seeds": seed,
        "finite": all(np.isfinite(s).all() for s in samples),
    }


def _measure_defaults(spec, defaults: dict[str, Any]) -> dict[str, Any]:
    """The default samples' Dice, contrast and diversity metrics, their brain masks, and tissue agreement."""
    from engine.anatomy.template import template_brain_mask

    samples, sample_maps = defaults["samples"], defaults["maps"]
    # A model that names its space is compared with the MNI152 mask where its affine puts it; one that does
    # not is compared voxel for voxel on the training grid (it cannot be placed).
    ref = reference_mask(samples[0].shape, defaults["affine"]) if spec.space else template_brain_mask()
    masks = [brain_mask(s) for s in samples]
    dices = [dice(m, ref) for m in masks]
    modes = [tissue_modes(s, m) for s, m in zip(samples, masks, strict=True)]
    bimodal = [m for m in modes if m["bimodal"]]
    n_div = min(8, len(samples))
    mean_ssim, max_ssim = mean_pairwise_ssim(samples[:n_div])
    has_maps = bool(spec.label_channels) and all(sample_maps)
    agreement = (
        [tissue_agreement(s, m, k) for s, m, k in zip(samples, sample_maps, masks, strict=True)]
        if has_maps
        else []
    )
    return {
        "masks": masks,
        "has_maps": has_maps,
        "agreement": agreement,
        "dice": {
            "mean": float(np.mean(dices)),
            "min": float(np.min(dices)),
            "n": len(dices),
            "target": DICE_TARGET,
            "pass": float(np.mean(dices)) >= DICE_TARGET,
            "values": [round(d, 4) for d in dices],
            "reference": "MNI152 brain mask through the affines"
            if spec.space
            else "template mask, same grid",
        },
        "contrast": {
            "gm_mode": float(np.nanmean([m["gm_mode"] for m in modes])) if bimodal else float("nan"),
            "wm_mode": float(np.nanmean([m["wm_mode"] for m in modes])) if bimodal else float("nan"),
            "dip_ratio": float(np.nanmean([m["dip_ratio"] for m in modes])) if bimodal else 1.0,
            "bimodal_fraction": len(bimodal) / len(modes),
            "dip_target": DIP_TARGET,
            "pass": len(bimodal) >= 0.75 * len(modes) and all(m["wm_mode"] > m["gm_mode"] for m in bimodal),
            "per_sample": modes,
        },
        "diversity": {
            "mean_ssim": mean_ssim,
            "max_pair_ssim": max_ssim,
            "n": n_div,
            "max_ssim": SSIM_MAX,
            "pass": mean_ssim < SSIM_MAX and max_ssim < 0.99,
        },
    }


def _sharpness(source, samples: list[np.ndarray], masks, progress: Callable[[str], None]) -> dict[str, Any]:
    """Step 2: blur equivalence of the samples and of the autoencoder's reconstructions, against held-out
    training-like volumes blurred by known amounts."""
    held_images, held_tissue = _held_out_volumes()
    curve = blur_curve(held_images)
    sample_score = float(np.mean([edge_score(s, m) for s, m in zip(samples, masks, strict=True)]))
    blur: dict[str, Any] = {
        "sigmas": list(BLUR_SIGMAS),
        "training_scores": curve,
        "sample_score": sample_score,
        "samples_sigma": blur_equivalence(sample_score, curve),
        "target": BLUR_TARGET,
    }
    if source.spec.kind == "latent":
        recon = reconstructions(source.load(), held_images, held_tissue)
        blur["reconstruction_score"] = float(np.mean([edge_score(r) for r in recon]))
        blur["reconstructions_sigma"] = blur_equivalence(blur["reconstruction_score"], curve)
    blur["pass"] = blur["samples_sigma"] <= BLUR_TARGET
    progress(f"evaluate: blur equivalence of samples {blur['samples_sigma']:.2f} voxel")
    return blur


def _ventricle_sweep(
    sample, spec, sweep_seeds: int, has_maps: bool, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Step 3: six requested ventricle volumes over the training range at the default brain volume, each
    measured on the image and, with maps, on the generated ventricle label."""
    from engine.anatomy.template import ventricle_roi

    voxel_ml = float(np.prod(spec.voxel_spacing_mm)) / 1000.0
    vcond = spec.condition("ventricle_volume")
    data = spec.extra.get("training", {}).get("data", {})
    lo = max(vcond.min, data.get("ventricle_ml_p1", vcond.min))
    hi = min(vcond.max, data.get("ventricle_ml_p99", vcond.max))
    requested = [float(v) for v in np.linspace(lo, hi, 6).round(1)]
    roi = ventricle_roi()
    finite = True
    measured: list[list[float]] = []
    from_label: list[list[float]] = []
    for k, value in enumerate(requested):
        result = sample(seed=1000 + k, batch_size=sweep_seeds, conditioning={"ventricle_volume": value})
        vols = [result.volume(i) for i in range(sweep_seeds)]
        finite = finite and all(np.isfinite(v).all() for v in vols)
        measured.append([ventricle_volume_ml(v, roi) for v in vols])
        if has_maps:
            from_label.append(
                [
                    float((result.tissue_maps(i)["ventricles"] > 0.5).sum() * voxel_ml)
                    for i in range(sweep_seeds)
                ]
            )
        progress(
            f"evaluate: ventricles requested {value:.1f} mL -> measured "
            f"{', '.join(f'{m:.1f}' for m in measured[-1])}"
            + (f"; label {', '.join(f'{m:.1f}' for m in from_label[-1])}" if has_maps else "")
        )
    flat_requested = [r for r, ms in zip(requested, measured, strict=True) for _ in ms]
    return {
        "requested": requested,
        "measured": measured,
        "from_label": from_label,
        "flat_requested": flat_requested,
        "finite": finite,
    }


def _conditioning_metric(spec, sweep: dict[str, Any], check: dict[str, Any]) -> dict[str, Any]:
    """Does the measured ventricle volume follow the requested one (Spearman over every sweep sample)?"""
    rho = spearman(sweep["flat_requested"], [m for ms in sweep["measured"] for m in ms])
    return {
        "spearman": rho,
        "target": SPEARMAN_TARGET,
        "pass": rho >= SPEARMAN_TARGET,
        "requested_ml": sweep["requested"],
        "measured_ml": sweep["measured"],
        "measured_ml_mean": [float(np.mean(m)) for m in sweep["measured"]],
        "brain_volume_ml": spec.condition("brain_volume").default,
        "measurement_check": check,
    }


def _tissue_map_metric(agreement: list[dict[str, float]], sweep: dict[str, Any]) -> dict[str, Any]:
    """Do the generated maps agree with their image (k-means Dice) and with the request (label Spearman)?"""
    mean_agreement = {k: float(np.mean([a[k] for a in agreement])) for k in ("GM", "WM", "CSF")}
    label_rho = spearman(sweep["flat_requested"], [m for ms in sweep["from_label"] for m in ms])
    return {
        "dice_vs_kmeans": mean_agreement,
        "dice_min": {k: float(np.min([a[k] for a in agreement])) for k in ("GM", "WM", "CSF")},
        "target": TISSUE_DICE_TARGET,
        "ventricle_label_spearman": label_rho,
        "ventricle_label_ml": sweep["from_label"],
        "ventricle_label_ml_mean": [float(np.mean(m)) for m in sweep["from_label"]],
        "spearman_target": LABEL_SPEARMAN_TARGET,
        "pass": min(mean_agreement["GM"], mean_agreement["WM"]) >= TISSUE_DICE_TARGET
        and label_rho >= LABEL_SPEARMAN_TARGET,
    }


def _write_outputs(
    source,
    result: dict[str, Any],
    defaults: dict[str, Any],
    has_maps: bool,
    steps: int,
    write_montage: bool,
    write_card: bool,
    log: Callable[[str], None],
) -> None:
    """montage.png of the first 8 default samples, and evaluation.json with the card, in the model folder."""
    from engine.training.card import render_card

    spec, folder = source.spec, source.path
    if write_montage:
        save_montage(
            defaults["samples"][:8],
            folder / "montage.png",
            title=f"{spec.id}: 8 samples (DDIM {steps}, default conditions)"
            + (", below with their generated tissue labels" if has_maps else ""),
            tissue=defaults["maps"][:8] if has_maps else None,
        )
    if write_card:
        (folder / "evaluation.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        (folder / "MODEL_CARD.md").write_text(render_card(spec, folder, result), encoding="utf-8")
        log(f"evaluate: wrote {folder / 'evaluation.json'} and {folder / 'MODEL_CARD.md'}")


def sharpness_ablation(
    model: str, work: Path, baseline: str = "", steps: int = 50, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """What each change bought, on the sharpness ruler: the blur equivalence of autoencoder reconstructions
    at each stage of training (checkpoints in ``work``) and of the previous model's (``baseline``), and of
    8 samples of the baseline next to 8 of the model. Writes ``sharpness_ablation.json`` and, with a
    baseline, ``before_after.png`` (baseline samples above, the model's below) in the model folder.
    """
    import types

    import torch

    from engine.api import SamplingRequest
    from engine.backends import make_backend
    from engine.models.networks import build_network
    from engine.models.registry import ModelRegistry

    torch.set_num_threads(2)
    source = ModelRegistry().get(model or None)
    held_images, held_tissue = _held_out_volumes()
    curve = blur_curve(held_images)

    def sigma_of(volumes: list[np.ndarray]) -> float:
        return blur_equivalence(float(np.mean([edge_score(v) for v in volumes])), curve)

    stages: dict[str, float] = {}
    if baseline:
        base = ModelRegistry().get(baseline)
        stages["baseline autoencoder"] = sigma_of(reconstructions(base.load(), held_images, held_tissue))
    definition = source.spec.networks["autoencoder"]
    for name, file in (
        ("autoencoder before the adversarial loss", "ae_before_adversarial.ckpt"),
        ("autoencoder after patch training with the adversarial loss", "ae.ckpt"),
        ("autoencoder after the whole-volume decoder fine-tuning (shipped)", "decoder.ckpt"),
    ):
        path = Path(work) / file
        if not path.exists():
            continue
        ae = build_network(definition, "autoencoder")
        ae.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"])
        loaded = types.SimpleNamespace(autoencoder=ae.eval(), spec=source.spec)
        stages[name] = sigma_of(reconstructions(loaded, held_images, held_tissue))
        log(f"ablation: {name}: blur equivalence {stages[name]:.2f}")

    backend = make_backend("cpu")
    samples: dict[str, list[np.ndarray]] = {}
    for label, ref in (("baseline", baseline), ("model", str(source.path))):
        if not ref:
            continue
        result = _run(backend, SamplingRequest(model=ref, sampler="ddim", steps=steps, seed=0, batch_size=8))
        samples[label] = [result.volume(i) for i in range(8)]
        stages[f"{label} samples"] = sigma_of(samples[label])
        log(f"ablation: {label} samples: blur equivalence {stages[f'{label} samples']:.2f}")
    out = {
        "sigmas": list(BLUR_SIGMAS),
        "training_scores": curve,
        "blur_equivalence": stages,
        "baseline": baseline,
    }
    (source.path / "sharpness_ablation.json").write_text(json.dumps(out, indent=2, default=float) + "\n")
    if "baseline" in samples:
        _before_after(samples["baseline"], samples["model"], source.path / "before_after.png")
    return out


def _before_after(before: list[np.ndarray], after: list[np.ndarray], path: Path) -> Path:
    """One PNG: the baseline's montage above the model's (same seeds, same slices)."""
    import tempfile

    from matplotlib import image as mpimg

    with tempfile.TemporaryDirectory() as tmp:
        top = mpimg.imread(
            save_montage(before, Path(tmp) / "a.png", "before: the previous shipped model, seeds 0-7")
        )
        bottom = mpimg.imread(save_montage(after, Path(tmp) / "b.png", "after: this model, seeds 0-7"))
    mpimg.imsave(path, np.concatenate([top, bottom], axis=0))
    return path


def _summary(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [
        f"Dice vs MNI152 brain mask: {m['dice']['mean']:.3f} (min {m['dice']['min']:.3f})  "
        f"{'PASS' if m['dice']['pass'] else 'FAIL'}",
        f"GM/WM modes: {m['contrast']['gm_mode']:.3f} / {m['contrast']['wm_mode']:.3f}, dip ratio "
        f"{m['contrast']['dip_ratio']:.2f}, bimodal {m['contrast']['bimodal_fraction']:.0%}  "
        f"{'PASS' if m['contrast']['pass'] else 'FAIL'}",
        f"Diversity: mean pairwise SSIM {m['diversity']['mean_ssim']:.3f} (max {m['diversity']['max_pair_ssim']:.3f})"
        f"  {'PASS' if m['diversity']['pass'] else 'FAIL'}",
        f"Conditioning: Spearman {m['conditioning']['spearman']:.3f}  "
        f"{'PASS' if m['conditioning']['pass'] else 'FAIL'}",
        f"Finite: {'PASS' if m['finite']['pass'] else 'FAIL'}",
        f"Sharpness: blur equivalence of samples {m['sharpness']['samples_sigma']:.2f} voxel"
        + (
            f", of autoencoder reconstructions {m['sharpness']['reconstructions_sigma']:.2f}"
            if "reconstructions_sigma" in m["sharpness"]
            else ""
        )
        + f"  {'PASS' if m['sharpness']['pass'] else 'FAIL'}",
    ]
    if "tissue_maps" in m:
        t = m["tissue_maps"]
        lines.append(
            f"Tissue maps vs k-means of the image: GM {t['dice_vs_kmeans']['GM']:.3f}, WM "
            f"{t['dice_vs_kmeans']['WM']:.3f}, CSF {t['dice_vs_kmeans']['CSF']:.3f}; ventricle label vs "
            f"request Spearman {t['ventricle_label_spearman']:.3f}  {'PASS' if t['pass'] else 'FAIL'}"
        )
    if result.get("inference"):
        inf = result["inference"]
        lines.append(
            f"Inference: {inf['steps']} DDIM steps + decode {inf['seconds']:.1f} s wall "
            f"({inf['cpu_seconds']:.1f} CPU-s on 2 threads, load average {inf['load_average_1min']:.1f}), "
            f"peak RSS {inf['peak_rss_gb']:.2f} GB"
        )
    return "\n".join(lines)


def _machine_words() -> str:
    """The CPU as the probe sees it (model, oneDNN ISA, native bf16...): every speed figure names its machine."""
    from engine.machine.probe import probe_machine

    return probe_machine().describe()
