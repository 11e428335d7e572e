"""Evaluate a brain-T1 model: brain-mask Dice, GM/WM contrast, diversity, ventricle conditioning, finiteness.

Every sample comes from :class:`engine.backends.local.LocalBackend` with a :class:`engine.api.SamplingRequest`
(the product's one sampling loop). The metric functions take plain arrays so they are tested on synthetic
inputs, including failing ones (tests/engine/training/test_metrics.py).

Measurements on generated images, which have no labels:

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
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DICE_TARGET = 0.80
SPEARMAN_TARGET = 0.7
DIP_TARGET = 0.9  # histogram minimum between the GM and WM modes, relative to the lower mode's height
SSIM_MAX = 0.95  # mean pairwise SSIM above this means the model collapsed to (nearly) one output
VOXEL_ML = 0.008


# -- metric functions on arrays -------------------------------------------------------------------------


def brain_mask(volume: np.ndarray) -> np.ndarray:
    """Brain mask of a skull-stripped T1 volume: Otsu threshold, largest component, closed, holes filled."""
    from scipy import ndimage
    from skimage.filters import threshold_otsu

    vol = np.nan_to_num(np.asarray(volume, np.float32))
    if float(vol.max()) - float(vol.min()) < 1e-6:
        return np.zeros(vol.shape, bool)
    mask = vol > threshold_otsu(vol)
    labels, n = ndimage.label(mask)
    if n > 1:
        sizes = ndimage.sum(mask, labels, index=np.arange(1, n + 1))
        mask = labels == (int(np.argmax(sizes)) + 1)
    # Closing adds the sulcal CSF between gyri (dark, so below Otsu) as brain masks conventionally do.
    mask = ndimage.binary_closing(
        mask, structure=ndimage.generate_binary_structure(3, 1), iterations=2, border_value=0
    )
    # Fill holes slice by slice too: a ventricle touching the mask edge in 3D is still enclosed in 2D.
    mask = ndimage.binary_fill_holes(mask)
    for axis in range(3):
        mask = np.stack([ndimage.binary_fill_holes(s) for s in np.moveaxis(mask, axis, 0)], axis=axis)
    return mask


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


def ventricle_volume_ml(volume: np.ndarray, roi: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Ventricle volume (mL) measured on an image: dark voxels inside the eroded brain mask and ``roi``."""
    from scipy import ndimage

    vol = np.asarray(volume, np.float32)
    mask = brain_mask(vol) if mask is None else np.asarray(mask, bool)
    if not mask.any():
        return 0.0
    inner = ndimage.binary_erosion(mask, iterations=2) & roi
    dark = vol < 0.5 * float(np.median(vol[mask]))
    return float((dark & inner).sum() * VOXEL_ML)


def mean_pairwise_ssim(volumes: list[np.ndarray]) -> tuple[float, float]:
    """Mean and max SSIM over all pairs of volumes (data range 1)."""
    from skimage.metrics import structural_similarity

    scores = [
        structural_similarity(np.asarray(a, np.float32), np.asarray(b, np.float32), data_range=1.0)
        for a, b in itertools.combinations(volumes, 2)
    ]
    return float(np.mean(scores)), float(np.max(scores))


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0  # a constant response cannot follow the request
    return float(spearmanr(x, y).statistic)


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


def save_montage(volumes: list[np.ndarray], path: Path, title: str = "") -> Path:
    """A PNG with one column per volume and rows axial / coronal / sagittal, radiological orientation."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(volumes)
    fig = Figure(figsize=(1.6 * n, 1.9 * 3 + 0.4), dpi=110)
    FigureCanvasAgg(fig)
    fig.patch.set_facecolor("black")
    names = ("axial", "coronal", "sagittal")
    for col, vol in enumerate(volumes):
        for row, sl in enumerate(radiological_slices(vol)):
            ax = fig.add_subplot(3, n, row * n + col + 1)
            ax.imshow(sl, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(names[row], color="white", fontsize=8)
            if row < 2:  # orientation marks: patient right is on the image left (radiological)
                ax.text(0.02, 0.5, "R", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
                ax.text(0.92, 0.5, "L", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
            else:
                ax.text(0.02, 0.5, "A", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
                ax.text(0.92, 0.5, "P", color="yellow", fontsize=6, transform=ax.transAxes, va="center")
    if title:
        fig.suptitle(title, color="white", fontsize=9)
    fig.subplots_adjust(left=0.03, right=0.99, top=0.93, bottom=0.01, wspace=0.03, hspace=0.03)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor="black")
    return path


# -- sampling --------------------------------------------------------------------------------------------


def _run(backend, request) -> np.ndarray:
    from engine.api import run

    return run(backend.sample(request)).volumes[:, 0]


def inference_benchmark(model: str, steps: int = 50, guidance_scale: float | None = None) -> dict[str, Any]:
    """One volume, ``steps`` DDIM steps + decode, in this process: seconds (excluding load) and peak RSS."""
    import resource

    import torch

    from engine.api import SamplingRequest, run
    from engine.backends.local import LocalBackend

    torch.set_num_threads(2)
    backend = LocalBackend(device="cpu")
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
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
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
    """The image-based ventricle measurement against label volumes on labelled synthetic volumes."""
    from engine.training.synth import generate, template_brain_mask, ventricle_roi

    roi = ventricle_roi()
    ref = template_brain_mask()
    label, measured, dices = [], [], []
    for seed in range(10_000, 10_000 + n):  # seeds outside the training set's range
        s = generate(seed)
        label.append(s.ventricle_ml)
        measured.append(ventricle_volume_ml(s.image, roi))
        dices.append(dice(brain_mask(s.image), ref))
    return {
        "n": n,
        "spearman_label_vs_measured": spearman(label, measured),
        "label_ml": [round(v, 1) for v in label],
        "measured_ml": [round(v, 1) for v in measured],
        "training_like_dice_mean": float(np.mean(dices)),
    }


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
        n_samples: samples at default conditions for Dice, contrast and diversity.
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
    from engine.backends.local import LocalBackend
    from engine.models.registry import ModelRegistry
    from engine.training.card import render_card
    from engine.training.synth import template_brain_mask, ventricle_roi

    torch.set_num_threads(2)
    started = time.perf_counter()
    source = ModelRegistry().get(model or None)
    spec = source.spec
    folder = source.path
    if guidance_scale is None:
        guidance_scale = spec.default_guidance_scale
    backend = LocalBackend(device="cpu")
    model_ref = str(folder)

    # 1. Default-condition samples: Dice, contrast, diversity, montage.
    samples: list[np.ndarray] = []
    seed = 0
    while len(samples) < n_samples:
        size = min(batch, n_samples - len(samples))
        samples += list(
            _run(
                backend,
                SamplingRequest(
                    model=model_ref,
                    sampler="ddim",
                    steps=steps,
                    seed=seed,
                    batch_size=size,
                    guidance_scale=guidance_scale,
                ),
            )
        )
        seed += 1
        log(f"evaluate: {len(samples)}/{n_samples} default samples  {time.perf_counter() - started:.0f}s")
    finite = all(np.isfinite(s).all() for s in samples)
    ref = template_brain_mask()
    masks = [brain_mask(s) for s in samples]
    dices = [dice(m, ref) for m in masks]
    modes = [tissue_modes(s, m) for s, m in zip(samples, masks, strict=True)]
    bimodal = [m for m in modes if m["bimodal"]]
    n_div = min(8, len(samples))
    mean_ssim, max_ssim = mean_pairwise_ssim(samples[:n_div])

    # 2. Ventricle sweep at the default brain volume.
    vcond = spec.condition("ventricle_volume")
    data = spec.extra.get("training", {}).get("data", {})
    lo = max(vcond.min, data.get("ventricle_ml_p1", vcond.min))
    hi = min(vcond.max, data.get("ventricle_ml_p99", vcond.max))
    requested = [float(v) for v in np.linspace(lo, hi, 6).round(1)]
    roi = ventricle_roi()
    measured: list[list[float]] = []
    for k, value in enumerate(requested):
        vols = _run(
            backend,
            SamplingRequest(
                model=model_ref,
                sampler="ddim",
                steps=steps,
                seed=1000 + k,
                batch_size=sweep_seeds,
                conditioning={"ventricle_volume": value},
                guidance_scale=guidance_scale,
            ),
        )
        finite = finite and bool(np.isfinite(vols).all())
        measured.append([ventricle_volume_ml(v, roi) for v in vols])
        log(
            f"evaluate: ventricles requested {value:.1f} mL -> measured "
            f"{', '.join(f'{m:.1f}' for m in measured[-1])}  {time.perf_counter() - started:.0f}s"
        )
    flat_req = [r for r, ms in zip(requested, measured, strict=True) for _ in ms]
    flat_meas = [m for ms in measured for m in ms]
    rho = spearman(flat_req, flat_meas)

    check = measurement_check()
    log(
        f"evaluate: measurement check on labelled synthetic volumes: Spearman "
        f"{check['spearman_label_vs_measured']:.3f}"
    )
    inf = _inference_in_fresh_process(model_ref, 50, guidance_scale) if inference else None

    metrics = {
        "dice": {
            "mean": float(np.mean(dices)),
            "min": float(np.min(dices)),
            "n": len(dices),
            "target": DICE_TARGET,
            "pass": float(np.mean(dices)) >= DICE_TARGET,
            "values": [round(d, 4) for d in dices],
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
        "conditioning": {
            "spearman": rho,
            "target": SPEARMAN_TARGET,
            "pass": rho >= SPEARMAN_TARGET,
            "requested_ml": requested,
            "measured_ml": measured,
            "measured_ml_mean": [float(np.mean(m)) for m in measured],
            "brain_volume_ml": spec.condition("brain_volume").default,
            "measurement_check": check,
        },
        "finite": {"pass": bool(finite)},
    }
    result = {
        "model": spec.id,
        "metrics": metrics,
        "all_pass": all(m["pass"] for m in metrics.values()),
        "sampling": (
            f"DDIM {steps} steps, guidance scale {guidance_scale:g}, {n_samples} samples at default conditions "
            f"(seeds 0-{seed - 1}, batches of {batch}); ventricle sweep {sweep_seeds} samples per value"
        ),
        "inference": inf,
        "seconds": time.perf_counter() - started,
        "machine": f"{platform.machine()} CPU, 2 torch threads, torch {torch.__version__}",
    }
    log(_summary(result))
    if write_montage:
        save_montage(
            samples[:8],
            folder / "montage.png",
            title=f"{spec.id}: 8 samples (DDIM {steps}, default conditions)",
        )
    if write_card:
        (folder / "evaluation.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        (folder / "MODEL_CARD.md").write_text(render_card(spec, folder, result), encoding="utf-8")
        log(f"evaluate: wrote {folder / 'evaluation.json'} and {folder / 'MODEL_CARD.md'}")
    return result


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
    ]
    if result.get("inference"):
        inf = result["inference"]
        lines.append(
            f"Inference: {inf['steps']} DDIM steps + decode {inf['seconds']:.1f} s wall "
            f"({inf['cpu_seconds']:.1f} CPU-s on 2 threads, load average {inf['load_average_1min']:.1f}), "
            f"peak RSS {inf['peak_rss_gb']:.2f} GB"
        )
    return "\n".join(lines)
