"""The field's cohort measures, each with a bootstrap interval and judged against fp32's seed-to-seed floor.

Four measures a researcher can quote beside published work:

- **FRD** (Fréchet Radiomics Distance; Konz, Osuala et al., MedIA 2026): the Fréchet distance between the
  Gaussians fitted to two sets' radiomic features (``engine.quality.radiomics``), each feature standardised
  by the reference set's mean and standard deviation (features that are constant or not finite there are
  dropped), reported as ``log(d²)`` as the paper does. ``tr sqrt(S1 S2)`` is the nuclear norm of ``A B^T``
  (``A``, ``B``: the centred feature rows over ``sqrt(n - 1)``), the same value as ``scipy.linalg.sqrtm`` of
  the F x F product but on an N x N matrix, so a thousand bootstrap samples take a second.
- **Tissue-volume distance** (after WASABI, 2025: a multivariate Wasserstein distance between regional volume
  distributions): the 1-Wasserstein distance between the two sets' (GM, WM, CSF) volume vectors in mL, exact
  for two equal-size sets (``scipy.optimize.linear_sum_assignment`` on the Euclidean costs): the mean number of
  mL a volume must move to turn one cohort into the other.
- **MS-SSIM diversity**: the mean MS-SSIM between seeds within a set (``engine.quality.measures``); the
  measure is its absolute difference from the reference set's.
- **Reliability**: the share of volumes whose tissue maps pass the anatomy check (``engine.anatomy.checks``:
  "within normative ranges", all in the model's one space); the measure is the drop in that share against
  the reference. Each set's share comes with a Wilson score interval (a bootstrap of 32 passes out of 32 would
  give the empty interval [1, 1]); Wu et al. found only 3 of 6 published brain generators at >= 95 %.

The rule, the same for all four: the candidate (the setting on seed set A) is compared with fp32 on set A, the
**floor** is fp32 on set A against fp32 on set B. ``BOOTSTRAP`` resamples of the seeds (fixed seed) give each
its percentile interval: a resample draws seeds of set A (the candidate takes the same seeds: the sets are
paired by seed) and, on its own, seeds of set B. On every resample the candidate's value minus the floor's is
its **excess**; a measure **flags** the setting when the lower end of the excess's 95 % interval is above
zero: the setting moves the cohort further than drawing other seeds does, beyond the sampling noise of both.
Comparing resample with resample matters: FRD on a resample with repeated seeds is biased upwards, on the
candidate's side and the floor's alike, so the bias cancels in the excess.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.metrics.reliability import CONFIDENCE, PASSED, RELIABLE_SHARE, share, wilson

__all__ = ["CONFIDENCE", "PASSED", "RELIABLE_SHARE", "judge", "share", "wilson"]

BOOTSTRAP = 1000
_BOOTSTRAP_SEED = 20261207
MEASURES = ("frd", "volume_distance", "diversity", "reliability")
NAMES = {
    "frd": "FRD",
    "volume_distance": "tissue-volume distance",
    "diversity": "MS-SSIM diversity",
    "reliability": "reliability",
}
UNITS = {
    "frd": "log(d²)",
    "volume_distance": "mL (W1 over GM, WM, CSF)",
    "diversity": "|Δ mean MS-SSIM|",
    "reliability": "drop in the share passing the anatomy check",
}

Statistic = Callable[[np.ndarray, np.ndarray], float]


def standardise(reference: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Feature matrices in the reference's units (its mean and standard deviation, as FRD normalises by the
    reference set); features constant or not finite in any matrix are dropped from all."""
    mean = reference.mean(axis=0)
    std = reference.std(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = [(m - mean) / std for m in (reference, *others)]
    keep = np.all([np.isfinite(m).all(axis=0) for m in scaled], axis=0) & (std > 1e-12 * np.abs(mean).clip(1))
    return [m[:, keep] for m in scaled]


def frechet_distance(x: np.ndarray, y: np.ndarray) -> float:
    """The squared Fréchet distance between Gaussians fitted to rows ``x`` (n, F) and ``y`` (m, F)."""
    mx, my = x.mean(axis=0), y.mean(axis=0)
    a = (x - mx) / math.sqrt(max(len(x) - 1, 1))
    b = (y - my) / math.sqrt(max(len(y) - 1, 1))
    trace_product = float(np.linalg.svd(a @ b.T, compute_uv=False).sum())
    return float(((mx - my) ** 2).sum() + (a * a).sum() + (b * b).sum() - 2.0 * trace_product)


def log_frd(x: np.ndarray, y: np.ndarray) -> float:
    """FRD as the paper reports it: ``log`` of the squared Fréchet distance (floored at 1e-12)."""
    return math.log(max(frechet_distance(x, y), 1e-12))


def volume_distance(x: np.ndarray, y: np.ndarray) -> float:
    """The 1-Wasserstein distance (mL) between two equal-size sets of tissue-volume vectors (n, 3)."""
    from scipy.optimize import linear_sum_assignment

    cost = np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(axis=2))
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def mean_difference(x: np.ndarray, y: np.ndarray) -> float:
    """|mean(x) - mean(y)|: the diversity measure on MS-SSIM values."""
    return abs(float(np.mean(x)) - float(np.mean(y)))


def share_drop(x: np.ndarray, y: np.ndarray) -> float:
    """The reference's share of passes minus the candidate's (x, y: 1.0 for a pass, 0.0 otherwise)."""
    return float(np.mean(x)) - float(np.mean(y))


def floor_share_gap(x: np.ndarray, y: np.ndarray) -> float:
    """How far two fp32 seed sets' shares of passes lie apart (either way)."""
    return abs(float(np.mean(x)) - float(np.mean(y)))


def judge(
    name: str,
    statistic: Statistic,
    reference: np.ndarray,
    candidate: np.ndarray,
    floor_b: np.ndarray,
    floor_statistic: Statistic | None = None,
) -> dict[str, Any]:
    """One measure of a setting: its value and interval, the floor's value and interval, and whether it flags.

    ``reference`` and ``candidate`` are paired row by row (the same seeds); ``floor_b`` is fp32 on set B, judged
    against ``reference`` with ``floor_statistic`` (``statistic`` unless given)."""
    on_floor = floor_statistic or statistic
    rng = np.random.default_rng(_BOOTSTRAP_SEED + MEASURES.index(name))
    n, m = len(reference), len(floor_b)
    values, floors = np.empty(BOOTSTRAP), np.empty(BOOTSTRAP)
    for k in range(BOOTSTRAP):
        i, j = rng.integers(0, n, n), rng.integers(0, m, m)
        values[k] = statistic(reference[i], candidate[i])
        floors[k] = on_floor(reference[i], floor_b[j])
    excess = _interval(values - floors)
    return {
        "name": NAMES[name],
        "unit": UNITS[name],
        "value": statistic(reference, candidate),
        "interval": _interval(values),
        "floor": on_floor(reference, floor_b),
        "floor_interval": _interval(floors),
        "excess_interval": excess,
        "n": len(candidate),
        "floor_n": [n, m],
        "flagged": bool(excess[0] > 0.0),
    }


def _interval(values: np.ndarray) -> list[float]:
    tail = (1.0 - CONFIDENCE) / 2.0
    return [float(np.quantile(values, tail)), float(np.quantile(values, 1.0 - tail))]


_FORMATS: dict[str, Callable[[float], str]] = {
    "frd": lambda v: f"{v:.2f}",
    "volume_distance": lambda v: f"{v:.1f} mL",
    "diversity": lambda v: f"{v:.4f}",
    "reliability": lambda v: f"{100 * v:.0f} points",
}


def fmt(name: str, value: float) -> str:
    """A measure's value in its unit, as reports print it."""
    return _FORMATS[name](value)


def describe(name: str, result: dict[str, Any]) -> str:
    """One phrase for a verdict: "FRD 6.12 (95 % interval 5.98 to 6.30, n=32) above the fp32 floor 4.01"."""
    low, high = result["interval"]
    return (
        f"{NAMES[name]} {fmt(name, result['value'])} (95 % interval {fmt(name, low)} to {fmt(name, high)}, "
        f"n={result['n']}) above the fp32 floor {fmt(name, result['floor'])}"
    )
