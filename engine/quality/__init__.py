"""The quality cost of a setting at cohort level: per seed and per distribution, always against a noise floor.

``quality_report(reference, candidate, noise_floor, ...)`` is the one entry point (the CLI ``volsynth quality``,
bench, tune and the Compare window's quality view call it). ``engine.quality.run`` generates the volumes for it
through a backend.

The verdict rule (in the style of ``engine.metrics.speed_verdict``: one rule, fixed seeds, reproducible):

1. The reference is fp32 on seed set A; the candidate is the setting on the same seeds A; the noise floor is fp32
   on seed set A against fp32 on another seed set B. The 2N fp32 volumes of A and B form the *pool*: two sets
   drawn from one distribution.
2. Three statistics between two sets of volumes:
   - **tissue**: MMD (MONAI ``MMDMetric``, linear kernel) of the GM/WM/CSF volumes, each standardised by its
     seed-to-seed standard deviation over the pool;
   - **features**: the same MMD on all features of ``engine.quality.measures.features`` (tissue volumes,
     intensity quantiles inside the brain, texture, a downsampled intensity vector), each group weighted alike;
   - **diversity**: the difference of the mean MS-SSIM (MONAI ``MultiScaleSSIMMetric``, 3D) of ring pairs of
     volumes within each set (lower MS-SSIM: more diverse).
3. Their seed-to-seed distribution: the pool split at random into two halves of N, ``PERMUTATIONS`` times (fixed
   seed), each statistic computed on each split (diversity: the ring-pair values of A and B shuffled between the
   two sets).
4. A setting **shifts the distribution** when any of its statistics against the reference lies above the
   ``1 - ALPHA / 3`` quantile of that statistic's seed-to-seed distribution (Bonferroni over the three, so the
   family's false-alarm rate is at most ``ALPHA``); the verdict names what moved. Otherwise it is **within
   seed-to-seed variation**. With fewer than ``MIN_SEEDS`` seeds a side, or no tissue volumes, it says so: a
   report without enough evidence is never called within the noise.

5. Beside the permutation rule, the field's measures (``engine.quality.field``): FRD over IBSI radiomic features,
   the tissue-volume Wasserstein distance, the MS-SSIM diversity difference and the drop in the share of volumes
   passing the anatomy check, each with a bootstrap interval against fp32's seed-to-seed floor (fp32 on set A
   against set B). A measure whose whole interval lies above the floor flags the setting. The verdict is
   "shifts the distribution" when a field measure flags it or the permutation rule does, and names each
   statistic that decided (``QualityReport.decided_by``), the field's first.

The candidate shares its seeds with the reference, so its shift is judged against what changing the seeds
does: a setting passes when it moves the cohort less than drawing another cohort would. Per-seed PSNR/SSIM
against fp32 on the same seed (``engine.metrics.image``) are reported beside it, not voted on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from engine.quality import field, measures, radiomics

ALPHA = 0.05
PERMUTATIONS = 2000
MIN_SEEDS = 4
_PERMUTATION_SEED = 20261204
WITHIN = "within seed-to-seed variation"
SHIFTS = "shifts the distribution"
STATISTICS = ("tissue", "features", "diversity")
TISSUE_FROM_MODEL = "model"  # the model's own decoded tissue channels
TISSUE_FROM_SEGMENTATION = "segmentation"  # engine.anatomy.segment on each volume

__all__ = [
    "ALPHA",
    "NoiseFloor",
    "QualityReport",
    "SetSummary",
    "noise_floor",
    "quality_report",
]


@dataclass(frozen=True)
class SetSummary:
    """One set of volumes (one setting over N seeds): what the report says about the set on its own."""

    label: str
    count: int
    tissue_ml: dict[str, list[float]]  # per tissue, one value per seed (empty without tissue volumes)
    diversity: list[float]  # MS-SSIM of each ring pair within the set

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "count": self.count,
            "tissue_ml": self.tissue_ml,
            "tissue_ml_mean": {k: float(np.mean(v)) for k, v in self.tissue_ml.items()},
            "tissue_ml_sd": {
                k: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for k, v in self.tissue_ml.items()
            },
            "ms_ssim_pairs": self.diversity,
            "ms_ssim_mean": float(np.mean(self.diversity)) if self.diversity else None,
        }


@dataclass
class NoiseFloor:
    """fp32 on seed set A and on seed set B, measured once and shared by every setting's report.

    Made by ``noise_floor(a, b, ...)``; ``quality_report`` also takes a plain ``(a, b)`` pair and makes it."""

    a: SetSummary
    b: SetSummary
    features_a: list[dict[str, np.ndarray]]
    features_b: list[dict[str, np.ndarray]]
    volumes_a: list[np.ndarray]
    volumes_b: list[np.ndarray]
    low: float  # the common intensity range MS-SSIM rescales by (fp32 set A's min and max)
    high: float
    tissue_source: str | None
    null: dict[str, np.ndarray] = dataclass_field(
        default_factory=dict
    )  # seed-to-seed distribution of each statistic
    observed: dict[str, float] = dataclass_field(
        default_factory=dict
    )  # each statistic between A and B itself
    # IBSI radiomic features of A and B (``engine.quality.radiomics``), the inputs of FRD, and their cost.
    radiomics_a: np.ndarray | None = None
    radiomics_b: np.ndarray | None = None
    radiomics_s: float = 0.0
    # The anatomy check's status of each volume of A and B ("within" passes), where checked.
    checks_a: list[str] | None = None
    checks_b: list[str] | None = None

    @property
    def count(self) -> int:
        return self.a.count

    def threshold(self, name: str) -> float:
        return float(np.quantile(self.null[name], 1.0 - ALPHA / len(STATISTICS)))

    def p_value(self, name: str, value: float) -> float:
        """The share of seed-to-seed splits at least as far apart as ``value`` (with the +1 of a permutation test)."""
        null = self.null[name]
        return float((1 + np.sum(null >= value)) / (1 + len(null)))


@dataclass
class QualityReport:
    """A setting's quality cost against fp32: per seed, per distribution, and the verdict by the rule above."""

    label: str
    reference_label: str
    verdict: str
    within_noise: bool
    per_seed: list[dict[str, float | None]]
    statistics: dict[str, dict[str, Any]]
    reference: SetSummary
    candidate: SetSummary
    noise_a: SetSummary
    noise_b: SetSummary
    noise_statistics: dict[str, dict[str, Any]]
    tissue_source: str | None
    seeds: list[int] | None = None
    noise_seeds: list[int] | None = None
    ms_ssim: dict[str, Any] = dataclass_field(default_factory=dict)
    # The field's measures (``engine.quality.field``), by name: value, interval, floor, n, flagged.
    measures: dict[str, dict[str, Any]] = dataclass_field(default_factory=dict)
    # Each set's share of volumes passing the anatomy check: reference, candidate, floor_b (where checked).
    reliability: dict[str, dict[str, Any]] = dataclass_field(default_factory=dict)
    # The statistics that made the verdict "shifts": field measure names, then "permutation:<statistic>".
    decided_by: list[str] = dataclass_field(default_factory=list)
    radiomics_s: float = 0.0  # seconds spent on the candidate's radiomic features

    @property
    def psnr_median_db(self) -> float | None:
        values = [row["psnr_db"] for row in self.per_seed if row["psnr_db"] is not None]
        return float(np.median(values)) if values else None

    def words(self) -> str:
        """One line for people: "int8: within seed-to-seed variation (16 seeds; PSNR median 46.1 dB)"."""
        psnr = self.psnr_median_db
        dist = "n/a" if psnr is None else "identical" if math.isinf(psnr) else f"{psnr:.1f} dB"
        return f"{self.label}: {self.verdict} ({self.candidate.count} seeds; PSNR median against fp32 {dist})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "reference": self.reference_label,
            "verdict": self.verdict,
            "within_noise": self.within_noise,
            "words": self.words(),
            "seeds": self.seeds,
            "noise_seeds": self.noise_seeds,
            "tissue_source": self.tissue_source,
            "per_seed": [{k: _json_float(v) for k, v in row.items()} for row in self.per_seed],
            "psnr_median_db": _json_float(self.psnr_median_db),
            "statistics": self.statistics,
            "noise_floor": {
                "what": "fp32 on seed set A against fp32 on seed set B",
                "statistics": self.noise_statistics,
                "a": self.noise_a.to_dict(),
                "b": self.noise_b.to_dict(),
            },
            "reference_set": self.reference.to_dict(),
            "candidate_set": self.candidate.to_dict(),
            "ms_ssim": self.ms_ssim,
            "measures": self.measures,
            "reliability": self.reliability,
            "decided_by": self.decided_by,
            "field_rule": (
                f"a measure flags the setting when the lower end of its {100 * field.CONFIDENCE:.0f} % bootstrap "
                f"interval ({field.BOOTSTRAP} resamples of the seeds) lies above fp32's seed-to-seed floor (fp32 "
                "on seed set A against seed set B); engine/quality/field.py"
            ),
            "radiomics": radiomics.FEATURE_SET,
            "rule": (
                f"shifts the distribution when the tissue-volume MMD, the feature MMD or the MS-SSIM diversity "
                f"difference against fp32 exceeds the {100 * (1 - ALPHA / len(STATISTICS)):.1f} % quantile of "
                f"its seed-to-seed distribution ({PERMUTATIONS} random splits of fp32 seed sets A and B); "
                "engine/quality/__init__.py"
            ),
        }


def _json_float(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _volumes(items: Sequence, name: str) -> list[np.ndarray]:
    out = [measures.as_volume(v, f"{name} volume {i + 1}") for i, v in enumerate(items)]
    if not out:
        raise ValueError(f"{name} has no volumes")
    shape = out[0].shape
    for i, v in enumerate(out):
        if v.shape != shape:
            raise ValueError(f"{name} volume {i + 1} has shape {v.shape}, the others {shape}")
    return out


def _tissue(items: Sequence | None, count: int, voxel_ml: float, name: str) -> list[dict[str, float]] | None:
    if items is None:
        return None
    if len(items) != count:
        raise ValueError(f"{name} has {count} volumes but {len(items)} tissue entries")
    return [measures.tissue_volumes_ml(t, voxel_ml) for t in items]


def _checks(items: Sequence[str] | None, count: int, name: str) -> list[str] | None:
    if items is None:
        return None
    if len(items) != count:
        raise ValueError(f"{name} has {count} volumes but {len(items)} anatomy checks")
    return [str(status) for status in items]


def _summary(
    label: str, tissue: list[dict[str, float]] | None, diversity: np.ndarray, count: int
) -> SetSummary:
    by_tissue = {name: [t[name] for t in tissue] for name in measures.TISSUES} if tissue else {}
    return SetSummary(label, count, by_tissue, [float(v) for v in diversity])


def noise_floor(
    a: Sequence,
    b: Sequence,
    *,
    tissue_a: Sequence | None = None,
    tissue_b: Sequence | None = None,
    voxel_ml: float = 1.0,
    tissue_source: str | None = None,
    labels: tuple[str, str] = ("fp32 (seeds A)", "fp32 (seeds B)"),
    checks_a: Sequence[str] | None = None,
    checks_b: Sequence[str] | None = None,
) -> NoiseFloor:
    """Measure fp32 on seed set A against fp32 on seed set B once (see ``quality_report`` for the arguments;
    ``checks_a``, ``checks_b``: each volume's anatomy-check status, for the reliability share)."""
    vol_a, vol_b = _volumes(a, "noise-floor set A"), _volumes(b, "noise-floor set B")
    if vol_a[0].shape != vol_b[0].shape:
        raise ValueError(f"noise-floor sets A and B differ in shape: {vol_a[0].shape} and {vol_b[0].shape}")
    t_a = _tissue(tissue_a, len(vol_a), voxel_ml, "noise-floor set A")
    t_b = _tissue(tissue_b, len(vol_b), voxel_ml, "noise-floor set B")
    if (t_a is None) != (t_b is None):
        raise ValueError("give tissue volumes for both noise-floor sets or for neither")
    low = float(min(v.min() for v in vol_a))
    high = float(max(v.max() for v in vol_a))
    no_tissue_a: list[dict[str, float] | None] = [None] * len(vol_a)
    no_tissue_b: list[dict[str, float] | None] = [None] * len(vol_b)
    feats_a = [measures.features(v, t) for v, t in zip(vol_a, t_a or no_tissue_a, strict=True)]
    feats_b = [measures.features(v, t) for v, t in zip(vol_b, t_b or no_tissue_b, strict=True)]
    div_a = measures.ms_ssim_pairs(vol_a, measures.ring_pairs(len(vol_a)), low, high)
    div_b = measures.ms_ssim_pairs(vol_b, measures.ring_pairs(len(vol_b)), low, high)
    started = time.perf_counter()
    rad_a, _names = radiomics.radiomic_features(vol_a, low, high)
    rad_b, _names = radiomics.radiomic_features(vol_b, low, high)
    took = time.perf_counter() - started
    floor = NoiseFloor(
        a=_summary(labels[0], t_a, div_a, len(vol_a)),
        b=_summary(labels[1], t_b, div_b, len(vol_b)),
        features_a=feats_a,
        features_b=feats_b,
        volumes_a=vol_a,
        volumes_b=vol_b,
        low=low,
        high=high,
        tissue_source=(tissue_source or "given") if t_a is not None else None,
        radiomics_a=rad_a,
        radiomics_b=rad_b,
        radiomics_s=took,
        checks_a=_checks(checks_a, len(vol_a), "noise-floor set A"),
        checks_b=_checks(checks_b, len(vol_b), "noise-floor set B"),
    )
    _fill_null(floor)
    return floor


def _matrices(floor: NoiseFloor, *sets: list[dict[str, np.ndarray]], only: str | None = None):
    pool = floor.features_a + floor.features_b

    def pick(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {only: features[only]} if only else features

    matrices, _names = measures.standardize([[pick(f) for f in s] for s in sets], [pick(f) for f in pool])
    return matrices


def _fill_null(floor: NoiseFloor) -> None:
    """The seed-to-seed distribution of each statistic, from random half-splits of the fp32 pool A + B."""
    n_a, n_b = len(floor.features_a), len(floor.features_b)
    if min(n_a, n_b) < 2:
        return
    rng = np.random.default_rng(_PERMUTATION_SEED)
    total = n_a + n_b
    splits = [rng.permutation(total) for _ in range(PERMUTATIONS)]
    groups: dict[str, str | None] = {"features": None}
    if floor.tissue_source is not None:
        groups["tissue"] = "tissue_ml"
    pool = floor.features_a + floor.features_b
    for name, only in groups.items():
        (matrix,) = _matrices(floor, pool, only=only)
        gram = matrix @ matrix.T
        floor.null[name] = np.array([measures.mmd_from_gram(gram, s[:n_a], s[n_a:]) for s in splits])
        floor.observed[name] = measures.mmd_from_gram(gram, np.arange(n_a), np.arange(n_a, total))
    pairs = np.concatenate([floor.a.diversity, floor.b.diversity])
    if len(floor.a.diversity) >= 1 and len(floor.b.diversity) >= 1:
        k = len(floor.a.diversity)
        shuffled = [rng.permutation(len(pairs)) for _ in range(PERMUTATIONS)]
        floor.null["diversity"] = np.array([abs(pairs[s[:k]].mean() - pairs[s[k:]].mean()) for s in shuffled])
        floor.observed["diversity"] = abs(
            float(np.mean(floor.a.diversity)) - float(np.mean(floor.b.diversity))
        )


def _judge(floor: NoiseFloor, values: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in STATISTICS:
        if name not in values or name not in floor.null:
            continue
        value = float(values[name])
        threshold = floor.threshold(name)
        out[name] = {
            "value": value,
            "seed_to_seed_threshold": threshold,
            "seed_to_seed_median": float(np.median(floor.null[name])),
            "p_value": floor.p_value(name, value),
            "beyond_noise": bool(value > threshold),
        }
    return out


_GROUP_WORDS = {
    "tissue_ml": "tissue volumes",
    "intensity_quantiles": "intensity quantiles",
    "texture": "texture",
    "downsampled": "layout (downsampled intensities)",
}


def _what_moved(name: str, reference: SetSummary, candidate: SetSummary, stat: dict | None = None) -> str:
    if name == "tissue":
        parts = []
        for tissue in measures.TISSUES:
            ref, cand = np.mean(reference.tissue_ml[tissue]), np.mean(candidate.tissue_ml[tissue])
            parts.append(f"{tissue} {ref:.0f} -> {cand:.0f} mL")
        return "tissue volumes (" + ", ".join(parts) + ")"
    if name == "diversity":
        ref, cand = np.mean(reference.diversity), np.mean(candidate.diversity)
        return f"diversity (MS-SSIM between seeds {ref:.3f} -> {cand:.3f})"
    groups = {k: max(v, 0.0) for k, v in ((stat or {}).get("by_group") or {}).items()}
    total = sum(groups.values())
    if total <= 0:
        return "image features (intensities, texture, layout)"
    shares = sorted(((v / total, k) for k, v in groups.items()), reverse=True)
    return (
        "image features ("
        + ", ".join(f"{_GROUP_WORDS[k]} {100 * f:.0f} %" for f, k in shares if f >= 0.1)
        + ")"
    )


def _tissue_rows(summary: SetSummary) -> np.ndarray:
    return np.array([summary.tissue_ml[t] for t in measures.TISSUES], np.float64).T


def _passes(statuses: Sequence[str]) -> np.ndarray:
    return np.array([s == field.PASSED for s in statuses], np.float64)


def _field_measures(
    floor: NoiseFloor,
    rad_ref: np.ndarray | None,
    rad_cand: np.ndarray,
    tissue: tuple[SetSummary, SetSummary] | None,
    diversity: tuple[np.ndarray, np.ndarray],
    checks: tuple[list[str] | None, list[str] | None],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The field's four measures of a candidate against fp32 (``engine.quality.field``), those the inputs allow,
    and each set's reliability share."""
    out: dict[str, dict[str, Any]] = {}
    if rad_ref is not None and floor.radiomics_b is not None and len(rad_ref) >= 2:
        z_ref, z_cand, z_b = field.standardise(rad_ref, rad_cand, floor.radiomics_b)
        if z_ref.shape[1]:
            out["frd"] = field.judge("frd", field.log_frd, z_ref, z_cand, z_b)
            out["frd"]["features"] = int(z_ref.shape[1])
    if tissue is not None and floor.b.tissue_ml:
        out["volume_distance"] = field.judge(
            "volume_distance",
            field.volume_distance,
            _tissue_rows(tissue[0]),
            _tissue_rows(tissue[1]),
            _tissue_rows(floor.b),
        )
    div_ref, div_cand = diversity
    if len(div_ref) and len(div_cand) == len(div_ref) and floor.b.diversity:
        out["diversity"] = field.judge(
            "diversity", field.mean_difference, div_ref, div_cand, np.asarray(floor.b.diversity)
        )
        out["diversity"]["n"] = len(div_cand)  # ring pairs of seeds
    reliability: dict[str, dict[str, Any]] = {}
    checks_ref, checks_cand = checks
    if checks_ref is not None and checks_cand is not None and floor.checks_b is not None:
        out["reliability"] = field.judge(
            "reliability",
            field.share_drop,
            _passes(checks_ref),
            _passes(checks_cand),
            _passes(floor.checks_b),
            floor_statistic=field.floor_share_gap,
        )
        reliability = {
            "reference": field.share(checks_ref),
            "candidate": field.share(checks_cand),
            "floor_b": field.share(floor.checks_b),
        }
    return out, reliability


def quality_report(
    reference: Sequence,
    candidate: Sequence,
    noise_floor: tuple[Sequence, Sequence] | NoiseFloor,
    *,
    reference_tissue: Sequence | None = None,
    candidate_tissue: Sequence | None = None,
    noise_tissue: tuple[Sequence, Sequence] | None = None,
    voxel_ml: float = 1.0,
    tissue_source: str | None = None,
    label: str = "candidate",
    reference_label: str = "fp32",
    seeds: Sequence[int] | None = None,
    noise_seeds: Sequence[int] | None = None,
    tissue_missing: str = "none given",
    reference_checks: Sequence[str] | None = None,
    candidate_checks: Sequence[str] | None = None,
) -> QualityReport:
    """Judge whether a setting's volumes keep the distribution of fp32's (the rule: this module's docstring).

    Args:
        reference: fp32 volumes, one per seed of set A (numpy arrays (x, y, z) or (1, x, y, z)).
        candidate: the setting's volumes on the same seeds, in the same order.
        noise_floor: ``(fp32 on seed set A, fp32 on seed set B)`` as two lists of volumes, or a ``NoiseFloor``
            made once by ``noise_floor(...)`` and shared by several settings' reports (saves its MS-SSIM).
            Set A is usually ``reference`` itself.
        reference_tissue, candidate_tissue: optional tissue per volume, each a mapping with "GM", "WM", "CSF" to
            probability maps (summed x ``voxel_ml``) or to volumes in mL. Without them the tissue statistic is
            left out and the verdict says the evidence is incomplete.
        noise_tissue: the same for the noise-floor pair, ``(tissue of A, tissue of B)``.
        voxel_ml: the volume of one voxel in mL (0.008 at 2 mm).
        tissue_source: where the tissue came from, for the record: ``"model"`` (the model's decoded channels) or
            ``"segmentation"`` (``engine.anatomy.segment``).
        label, reference_label: names of the setting and of the reference, for the verdict and the JSON.
        seeds, noise_seeds: the seeds of sets A and B, for the record.
        tissue_missing: why there are no tissue volumes, for the verdict, when there are none.
        reference_checks, candidate_checks: each volume's anatomy-check status (``engine.anatomy.checks``:
            "within" passes), for the reliability share; the noise floor's come with it (``noise_floor``).

    Returns:
        QualityReport with ``.verdict`` ("within seed-to-seed variation" or "shifts the distribution: <what>",
        or why the report cannot tell), ``.within_noise`` (True only for the first) and ``.to_dict()`` (JSON).

    Raises:
        ValueError: volumes that are not 3D, differ in shape, hold NaN, or sets of different sizes.
    """
    ref = _volumes(reference, "reference")
    cand = _volumes(candidate, "candidate")
    if len(ref) != len(cand):
        raise ValueError(
            f"reference has {len(ref)} volumes and candidate {len(cand)}: one per seed on each side"
        )
    if ref[0].shape != cand[0].shape:
        raise ValueError(f"reference volumes are {ref[0].shape} and candidate volumes {cand[0].shape}")
    if isinstance(noise_floor, NoiseFloor):
        floor = noise_floor
    else:
        a, b = noise_floor
        floor = globals()["noise_floor"](
            a,
            b,
            tissue_a=noise_tissue[0] if noise_tissue else None,
            tissue_b=noise_tissue[1] if noise_tissue else None,
            voxel_ml=voxel_ml,
            tissue_source=tissue_source,
        )
    if floor.volumes_a[0].shape != ref[0].shape:
        raise ValueError(
            f"the noise floor's volumes are {floor.volumes_a[0].shape}, the reference's {ref[0].shape}"
        )
    t_ref = _tissue(reference_tissue, len(ref), voxel_ml, "reference")
    t_cand = _tissue(candidate_tissue, len(cand), voxel_ml, "candidate")
    has_tissue = t_ref is not None and t_cand is not None and floor.tissue_source is not None

    per_seed = []
    from engine.metrics.image import compare

    for i, (r, c) in enumerate(zip(ref, cand, strict=True)):
        moved = compare(r, c)
        row: dict[str, float | None] = {"seed": seeds[i] if seeds is not None else i}
        row.update(psnr_db=moved["psnr_db"], ssim=moved["ssim"], max_abs_err=moved["max_abs_err"])
        per_seed.append(row)

    pairs = measures.ring_pairs(len(ref))
    same_as_a = len(ref) == len(floor.volumes_a) and all(
        np.array_equal(x, y) for x, y in zip(ref, floor.volumes_a, strict=True)
    )
    div_ref = (
        np.asarray(floor.a.diversity)
        if same_as_a
        else measures.ms_ssim_pairs(ref, pairs, floor.low, floor.high)
    )
    div_cand = measures.ms_ssim_pairs(cand, pairs, floor.low, floor.high)
    no_tissue: list[dict[str, float] | None] = [None] * len(ref)
    f_ref = [
        measures.features(v, t)
        for v, t in zip(ref, (t_ref if has_tissue else None) or no_tissue, strict=True)
    ]
    f_cand = [
        measures.features(v, t)
        for v, t in zip(cand, (t_cand if has_tissue else None) or no_tissue, strict=True)
    ]
    values: dict[str, float] = {}
    if len(ref) >= 2:
        m_ref, m_cand = _matrices(floor, f_ref, f_cand)
        values["features"] = measures.mmd(m_ref, m_cand)
        # The linear MMD of standardised groups is the sum of each group's: say which groups moved.
        by_group = {}
        for group in measures.FEATURE_GROUPS:
            if all(group in f for f in f_ref + f_cand + floor.features_a + floor.features_b):
                g_ref, g_cand = _matrices(floor, f_ref, f_cand, only=group)
                by_group[group] = measures.mmd(g_ref, g_cand)
        if has_tissue:
            m_ref, m_cand = _matrices(floor, f_ref, f_cand, only="tissue_ml")
            values["tissue"] = measures.mmd(m_ref, m_cand)
    if len(div_ref) and len(div_cand):
        values["diversity"] = abs(float(div_ref.mean()) - float(div_cand.mean()))

    reference_set = _summary(reference_label, t_ref if has_tissue else None, div_ref, len(ref))
    candidate_set = _summary(label, t_cand if has_tissue else None, div_cand, len(cand))
    statistics = _judge(floor, values)
    if "features" in statistics:
        statistics["features"]["by_group"] = by_group
    noise_statistics = _judge(floor, floor.observed)
    started = time.perf_counter()
    rad_ref = floor.radiomics_a if same_as_a else radiomics.radiomic_features(ref, floor.low, floor.high)[0]
    same_as_b = len(cand) == len(floor.volumes_b) and all(
        np.array_equal(x, y) for x, y in zip(cand, floor.volumes_b, strict=True)
    )
    rad_cand = (
        floor.radiomics_b
        if same_as_b and floor.radiomics_b is not None
        else radiomics.radiomic_features(cand, floor.low, floor.high)[0]
    )
    radiomics_s = time.perf_counter() - started
    checks_ref = _checks(reference_checks, len(ref), "reference") or (floor.checks_a if same_as_a else None)
    checks_cand = _checks(candidate_checks, len(cand), "candidate")
    field_measures, reliability = _field_measures(
        floor,
        rad_ref,
        rad_cand,
        (reference_set, candidate_set) if has_tissue else None,
        (div_ref, div_cand),
        (checks_ref, checks_cand),
    )
    decided_by = [name for name, m in field_measures.items() if m["flagged"]]
    reasons = [field.describe(name, field_measures[name]) for name in decided_by]
    for name, stat in statistics.items():
        if stat["beyond_noise"]:
            decided_by.append(f"permutation:{name}")
            reasons.append(_what_moved(name, reference_set, candidate_set, stat) + " (permutation rule)")
    too_few = min(len(ref), floor.a.count, floor.b.count) < MIN_SEEDS
    if reasons and not too_few:
        verdict, within = f"{SHIFTS}: {'; '.join(reasons)}", False
    elif too_few:
        decided_by = []
        verdict, within = (
            f"too few seeds to tell: {min(len(ref), floor.a.count, floor.b.count)} a set, the rule needs "
            f"{MIN_SEEDS}",
            False,
        )
    elif not has_tissue:
        verdict, within = f"{WITHIN} (tissue volumes not compared: {tissue_missing})", True
    else:
        verdict, within = WITHIN, True
    kernel, weights = measures.ms_ssim_config(ref[0].shape)
    return QualityReport(
        label=label,
        reference_label=reference_label,
        verdict=verdict,
        within_noise=within,
        per_seed=per_seed,
        statistics=statistics,
        reference=reference_set,
        candidate=candidate_set,
        noise_a=floor.a,
        noise_b=floor.b,
        noise_statistics=noise_statistics,
        tissue_source=floor.tissue_source if has_tissue else None,
        seeds=list(seeds) if seeds is not None else None,
        noise_seeds=list(noise_seeds) if noise_seeds is not None else None,
        measures=field_measures,
        reliability=reliability,
        decided_by=decided_by,
        radiomics_s=radiomics_s,
        ms_ssim={
            "kernel_size": kernel,
            "kernel_sigma": measures.MS_SSIM_SIGMA,
            "weights": list(weights),
            "pairs": "ring: (0,1), (1,2) ... (n-1,0) within each set",
        },
    )
