"""Anatomy checks: is this volume a brain, and are its measures within normative adult ranges?

From tissue maps (a model's own channels or ``engine.anatomy.segment``'s) on the volume's grid:

* brain volume: GM + WM (mL);
* tissue fractions: CSF of the intracranial volume the maps cover (GM + WM + CSF), GM of the parenchyma
  (GM / (GM + WM)); GM and WM of the intracranial volume are reported beside them;
* ventricle volume: the maps' own ventricle map where they have one (the shipped model decodes it); otherwise
  the CSF inside the MNI152 template's ventricles (lateral + third, ``engine.anatomy.template``) placed on the
  volume with rotation, scale and shift (``segment.template_transform``: its brain outline, then its tissue
  priors on the maps), grown by 8 mm, and at least 8 mm inside the
  brain mask, so that sulcal CSF at the surface never counts;
* left-right asymmetry: |L - R| / mean(L, R) of GM + WM, split at the template's midline (x = 0 mm of the
  template, placed on the volume as above).

Each is compared with ``engine.anatomy.norms`` (published sources, converted to these terms and to the volume's
space there). Before any range, the maps must look like a brain, judged by measured evidence (``BRAIN_LIKE``):
how well the GM and WM maps correlate with the template's priors placed on the volume, how certain the tissue
labels are, and how smooth the maps are (the noise of random weights has neighbours that do not correlate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.anatomy.norms import SOURCES, NormRange, ranges_for, space_label, space_scale, volume_unit

WITHIN = "within normative ranges"
OUTSIDE = "outside range"
NOT_BRAIN_LIKE = "not brain-like"
#: Least value of each piece of brain-likeness evidence. Measured (``python -m benchmarks.anatomy_checks``):
#: the MNI152 template's maps 0.96 / 0.88 / 0.73 (prior correlation / certainty / neighbour correlation), its
#: 1 mm T1 segmented 0.94 / 0.80 / 0.75, sixteen shipped-model volumes' decoded maps 0.52-0.71 / 0.56-0.58 /
#: 0.94, random probability maps 0.00 / 0.15 / 0.00. The thresholds sit in the gap between brains and noise.
BRAIN_LIKE = {
    "prior_correlation": 0.35,  # mean Pearson r of the GM and WM maps with the placed template priors
    "label_certainty": 0.35,  # 1 - mean normalised entropy of (CSF, GM, WM) inside the brain
    "neighbour_correlation": 0.4,  # mean correlation of the GM map with itself shifted one voxel, per axis
}
_EVIDENCE_LABELS = {
    "prior_correlation": "GM/WM maps correlate with the template's priors",
    "label_certainty": "tissue labels certainty",
    "neighbour_correlation": "spatial smoothness (neighbour correlation)",
}
_VENTRICLE_GROW_MM = 8.0
_VENTRICLE_INSET_MM = 8.0
_EVIDENCE_SPACING_MM = (
    2.0  # evidence is measured on a grid no finer than this (it is about shape, not detail)
)


@dataclass(frozen=True)
class Measure:
    """One measure, its value and the range it was compared with (None: not measured)."""

    name: str
    label: str
    value: float | None
    unit: str
    low: float
    high: float
    source: str
    # The space the value and the range are in (None: native mm). An absolute volume in a template space is
    # larger than the brain it stands for: its text names the space and gives the native equivalent.
    space: str | None = None

    @property
    def within(self) -> bool | None:
        if self.value is None or not np.isfinite(self.value):
            return None
        return self.low <= self.value <= self.high

    @property
    def below(self) -> bool:
        """The value lies under the range (False when it was not measured)."""
        return self.value is not None and self.value < self.low

    @property
    def scale(self) -> float:
        """How much larger the value is than a native brain's (1 for fractions and native volumes)."""
        return space_scale(self.space) if self.unit == "mL" else 1.0

    def text(self) -> str:
        """``ventricles 2.1 % (range 0.25-4.2 %)``: the value and the range in the measure's units; a volume in a
        template space names it and says both in native terms too (``brain volume (GM+WM) 1042 MNI152 mL (range
        1201-2156 MNI152 mL; native 764 mL, range 881-1582 mL)``)."""
        unit = volume_unit(self.space) if self.unit == "mL" else self.unit
        # Whole millilitres, bounds rounded inwards: a value shown as the bound is never said to lie outside it.
        low, high = (
            (math.ceil(self.low), math.floor(self.high)) if self.unit == "mL" else (self.low, self.high)
        )
        text = f"{self.label} {_fmt(self.value, unit)} (range {_fmt(low, unit, False)}-{_fmt(high, unit)}"
        if self.scale != 1.0 and self.value is not None:
            scale = self.scale
            native = f"{math.ceil(self.low / scale)}-{math.floor(self.high / scale)}"
            text += f"; native {self.value / scale:.0f} mL, range {native} mL"
        return text + ")"

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": None if self.value is None else round(float(self.value), 4),
            "unit": self.unit or "fraction",
            "range": [round(float(self.low), 4), round(float(self.high), 4)],
            "within": self.within,
            "source": self.source,
            **(
                {
                    "space": space_label(self.space),
                    "native_value": None if self.value is None else round(float(self.value) / self.scale, 4),
                    "native_range": [round(self.low / self.scale, 4), round(self.high / self.scale, 4)],
                }
                if self.scale != 1.0
                else {}
            ),
        }


def _fmt(value: float | None, unit: str, with_unit: bool = True) -> str:
    if value is None:
        return "n/a"
    if unit.endswith("mL"):
        return f"{value:.0f}" + (f" {unit}" if with_unit else "")
    if unit == "%":
        return f"{value:.1f}" + (" %" if with_unit else "")
    return f"{100 * value:.1f}" + (" %" if with_unit else "")


@dataclass(frozen=True)
class AnatomyCheck:
    """The anatomy check of one volume: its measures against their ranges, the brain-likeness evidence, the
    flags and the verdict (``WITHIN``, ``OUTSIDE: ...`` or ``NOT_BRAIN_LIKE: ...``)."""

    status: str  # "within", "outside", "not_brain_like"
    verdict: str
    measures: tuple[Measure, ...] = ()
    evidence: dict[str, float] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    space: str = "native"
    maps_from: str = ""
    ventricles_from: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "within"

    def summary(self) -> str:
        """One line for a CLI or a details pane: the verdict, then the measures that decided it."""
        if self.status == "not_brain_like" or not self.measures:
            return f"anatomy check: {self.verdict}"
        brief = ", ".join(_brief(m) for m in self.measures if m.within is not False)
        scale = space_scale(None if self.space == "native" else self.space)
        where = f"; volumes in {self.space} mL: ranges x {scale:.2f} a native brain's" if scale != 1.0 else ""
        return f"anatomy check: {self.verdict}" + (f" ({brief}{where})" if self.status == "within" else where)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record for the sidecar: verdict, status, flags, measures with ranges and sources."""
        return {
            "verdict": self.verdict,
            "status": self.status,
            "flags": list(self.flags),
            "measures": {m.name: m.to_dict() for m in self.measures},
            "brain_like_evidence": {k: round(float(v), 4) for k, v in self.evidence.items()},
            "brain_like_thresholds": dict(BRAIN_LIKE),
            "space": self.space,
            "space_scale": round(space_scale(None if self.space == "native" else self.space), 4),
            "maps_from": self.maps_from,
            "ventricles_from": self.ventricles_from,
            **(
                {"also_measured": {k: round(float(v), 4) for k, v in self.extra.items()}}
                if self.extra
                else {}
            ),
            "sources": {
                key: SOURCES[key].citation
                for m in self.measures
                for key in m.source.split("+")  # a range from two sources names both
                if key in SOURCES
            },
        }


def _brief(m: Measure) -> str:
    short = {
        "brain_volume_ml": "brain",
        "csf_fraction": "CSF",
        "gm_share": "GM/(GM+WM)",
        "ventricle_volume_ml": "ventricles",
        "asymmetry_pct": "asymmetry",
    }
    return f"{short.get(m.name, m.name)} {_fmt(m.value, volume_unit(m.space) if m.unit == 'mL' else m.unit)}"


def not_brain_like(reason: str, *, maps_from: str = "", evidence: dict | None = None) -> AnatomyCheck:
    """The check of a volume that is not a brain by ``reason`` (e.g. segmentation refused it as noise)."""
    return AnatomyCheck(
        status="not_brain_like",
        verdict=f"{NOT_BRAIN_LIKE}: {reason}",
        evidence=dict(evidence or {}),
        flags=("not_brain_like",),
        maps_from=maps_from,
    )


def check_maps(
    maps: dict[str, np.ndarray],
    affine: np.ndarray,
    *,
    space: str | None = None,
    maps_from: str = "",
) -> AnatomyCheck:
    """The anatomy check of a volume from its tissue maps.

    Args:
        maps: float probability maps on the volume's grid: "GM", "WM", "CSF" (required), "ventricles" and
            "brain" (optional; the brain mask is GM + WM + CSF >= 0.5 without it).
        affine: voxel -> RAS mm of the grid (RAS+ orientation).
        space: the template space the affine maps into (e.g. ``MNI152NLin2009aSym``), None for native mm.
        maps_from: how the maps were made, said in the record ("model channels", the segmentation method).
    """
    from engine.anatomy.segment import template_transform

    missing = [name for name in ("GM", "WM", "CSF") if name not in maps]
    if missing:
        raise ValueError(f"anatomy checks need GM, WM and CSF maps; missing {', '.join(missing)}")
    gm, wm, csf = (np.clip(np.nan_to_num(np.asarray(maps[n], np.float32)), 0, 1) for n in ("GM", "WM", "CSF"))
    affine = np.asarray(affine, np.float64)
    spacing = np.sqrt((affine[:3, :3] ** 2).sum(0))
    voxel_ml = float(abs(np.linalg.det(affine[:3, :3]))) / 1000.0
    tissue = gm + wm + csf
    brain = np.asarray(maps["brain"]) >= 0.5 if "brain" in maps else tissue >= 0.5
    space_name = str(space) if space else "native"
    if brain.sum() * voxel_ml < 50.0:  # 50 mL: no brain is that small
        return not_brain_like(
            f"the tissue maps cover {brain.sum() * voxel_ml:.0f} mL, far less than any brain",
            maps_from=maps_from,
        )

    to_template = template_transform(brain, affine, np.stack([csf, gm, wm])).to_template
    evidence = _evidence(gm, wm, csf, brain, affine, to_template)
    weak = [k for k, least in BRAIN_LIKE.items() if evidence[k] < least]
    if weak:
        reasons = "; ".join(f"{_EVIDENCE_LABELS[k]} {evidence[k]:.2f} < {BRAIN_LIKE[k]}" for k in weak)
        return AnatomyCheck(
            status="not_brain_like",
            verdict=f"{NOT_BRAIN_LIKE}: {reasons}",
            evidence=evidence,
            flags=("not_brain_like", *(f"weak_{k}" for k in weak)),
            space=space_name,
            maps_from=maps_from,
        )

    icv_ml = float(tissue[brain].sum()) * voxel_ml
    parenchyma = float(gm[brain].sum() + wm[brain].sum())
    brain_ml = parenchyma * voxel_ml
    extra: dict[str, float] = {
        "intracranial_ml": icv_ml,
        "gm_fraction": float(gm[brain].sum()) * voxel_ml / icv_ml,
        "wm_fraction": float(wm[brain].sum()) * voxel_ml / icv_ml,
    }
    roi = _ventricle_roi(brain, affine, to_template, spacing)
    csf_in_roi_ml = float(csf[roi].sum()) * voxel_ml
    if "ventricles" in maps:
        ventricles_ml = float(np.clip(np.asarray(maps["ventricles"], np.float32), 0, 1).sum()) * voxel_ml
        ventricles_from = "the maps' own ventricle map"
        extra["csf_in_template_ventricles_ml"] = csf_in_roi_ml
    else:
        ventricles_ml = csf_in_roi_ml
        ventricles_from = (
            f"CSF inside the MNI152 template ventricles placed by brain-mask moments, grown {_VENTRICLE_GROW_MM:g} mm, "
            f"{_VENTRICLE_INSET_MM:g} mm inside the brain mask"
        )
    extra["ventricles_ml"] = ventricles_ml
    left, right = _hemispheres(gm + wm, brain, affine, to_template)
    asymmetry = 200.0 * abs(left - right) / max(left + right, 1e-6)
    values = {
        "brain_volume_ml": brain_ml,
        "csf_fraction": float(csf[brain].sum()) * voxel_ml / icv_ml,
        "gm_share": float(gm[brain].sum()) / max(parenchyma, 1e-6),
        "ventricle_volume_ml": ventricles_ml,
        "asymmetry_pct": asymmetry,
    }
    measures = tuple(_measure(norm, values[name], space) for name, norm in ranges_for(space).items())
    outside = [m for m in measures if m.within is False]
    if outside:
        status = "outside"
        verdict = f"{OUTSIDE}: " + "; ".join(m.text() for m in outside)
    else:
        status, verdict = "within", WITHIN
    return AnatomyCheck(
        status=status,
        verdict=verdict,
        measures=measures,
        evidence=evidence,
        flags=tuple(f"{m.name}_{'low' if m.below else 'high'}" for m in outside),
        space=space_name,
        maps_from=maps_from,
        ventricles_from=ventricles_from,
        extra=extra,
    )


def _measure(norm: NormRange, value: float, space: str | None) -> Measure:
    return Measure(norm.name, norm.label, float(value), norm.unit, norm.low, norm.high, norm.source, space)


def _evidence(gm, wm, csf, brain, affine, to_template) -> dict[str, float]:
    """Brain-likeness evidence on a grid no finer than _EVIDENCE_SPACING_MM (see BRAIN_LIKE)."""
    from scipy import ndimage

    from engine.anatomy.segment import _block_mean
    from engine.anatomy.template import template_priors_1mm

    spacing = np.sqrt((affine[:3, :3] ** 2).sum(0))
    factor = np.maximum(1, np.floor(_EVIDENCE_SPACING_MM / spacing + 1e-6)).astype(int)
    work_affine = affine @ np.diag([*factor.astype(float), 1.0])
    work_affine[:3, 3] = affine[:3, :3] @ ((factor - 1) / 2.0) + affine[:3, 3]  # block centres
    gm_w, wm_w, csf_w = (_block_mean(m, factor) for m in (gm, wm, csf))
    brain_w = _block_mean(brain.astype(np.float32), factor) >= 0.5
    work_shape = gm_w.shape
    priors, tmask, taffine = template_priors_1mm()
    vox = np.linalg.inv(taffine) @ to_template @ work_affine
    placed = [
        ndimage.affine_transform(priors[k], vox, output_shape=work_shape, order=1, cval=0.0) for k in (1, 2)
    ]
    tmask_w = ndimage.affine_transform(tmask.astype(np.float32), vox, output_shape=work_shape, order=1) >= 0.5
    region = brain_w | tmask_w
    correlation = float(
        np.mean([_pearson(m[region], p[region]) for m, p in zip((gm_w, wm_w), placed, strict=True)])
    )
    stack = np.stack([csf_w[brain_w], gm_w[brain_w], wm_w[brain_w]]).astype(np.float64)
    stack = stack / np.maximum(stack.sum(0, keepdims=True), 1e-6)
    entropy = -(stack * np.log(np.maximum(stack, 1e-12))).sum(0) / np.log(3.0)
    certainty = float(1.0 - entropy.mean()) if entropy.size else 0.0
    neighbour = []
    inside = brain_w
    for axis in range(3):
        a = np.take(gm_w, np.arange(gm_w.shape[axis] - 1), axis=axis)
        b = np.take(gm_w, np.arange(1, gm_w.shape[axis]), axis=axis)
        both = np.take(inside, np.arange(inside.shape[axis] - 1), axis=axis) & np.take(
            inside, np.arange(1, inside.shape[axis]), axis=axis
        )
        neighbour.append(_pearson(a[both], b[both]))
    return {
        "prior_correlation": correlation,
        "label_certainty": certainty,
        "neighbour_correlation": float(np.mean(neighbour)),
    }


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.size < 3:
        return 0.0
    a = a - a.mean()
    b = b - b.mean()
    denom = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / denom) if denom > 0 else 0.0


def _ventricle_roi(brain, affine, to_template, spacing) -> np.ndarray:
    """Where ventricles are measured on a grid: the template's ventricles placed, grown and kept inside."""
    from scipy import ndimage

    from engine.anatomy.segment import _dilate, _erode
    from engine.anatomy.template import crop_affine, template_maps

    vent = template_maps()["ventricles"]
    vox = np.linalg.inv(crop_affine()) @ to_template @ affine
    placed = ndimage.affine_transform(vent, vox, output_shape=brain.shape, order=1, cval=0.0) >= 0.5
    return _dilate(placed, spacing, _VENTRICLE_GROW_MM) & _erode(brain, spacing, _VENTRICLE_INSET_MM)


def _hemispheres(parenchyma, brain, affine, to_template) -> tuple[float, float]:
    """GM + WM on each side of the template's midline (x = 0 mm there) placed on the volume; a voxel the
    midline crosses is shared by the fraction of it on each side (whole, it would tip a symmetric brain by
    the width of one column)."""
    ijk = np.indices(brain.shape, dtype=np.float32).reshape(3, -1)
    world = affine[:3, :3] @ ijk + affine[:3, 3:4]
    x_template = to_template[0, :3] @ world + to_template[0, 3]
    width = float(
        np.linalg.norm(to_template[:3, :3] @ affine[:3, :3], axis=0).max()
    )  # a voxel, in template mm
    right_part = np.clip(0.5 + x_template / max(width, 1e-6), 0.0, 1.0)  # RAS: x > 0 is the right
    values = (parenchyma * brain).ravel()
    right = float((values * right_part).sum())
    return float(values.sum()) - right, right


def check_image(
    volume: np.ndarray, affine: np.ndarray, contrast: str, *, space: str | None = None
) -> AnatomyCheck:
    """Segment an image (``engine.anatomy.segment``) and check its maps; an image the segmentation refuses as
    no brain (``NotBrainLike``: noise, no brain-sized object) is not brain-like, with that reason. Any other
    refusal (a contrast the method does not handle, intensities against the contrast) is raised."""
    from engine.anatomy.segment import NotBrainLike, segment

    try:
        made = segment(volume, affine, contrast)
    except NotBrainLike as exc:
        return not_brain_like(f"segmentation refused it: {exc}", maps_from="segmentation")
    return check_maps(made.maps, affine, space=space, maps_from=made.sidecar()["method"])


def check_from_record(
    maps: dict[str, np.ndarray], affine: np.ndarray, record: dict[str, Any] | None, *, space: str | None
) -> AnatomyCheck | None:
    """The check of one written volume: from its maps when it has them; not brain-like when its record says
    segmentation refused it as no brain (``not_brain_like`` beside ``tissue_maps_not_made``); None when there is
    nothing to check (no maps for another reason: a model without them, SWI, memory)."""
    record = record or {}
    if maps and {"GM", "WM", "CSF"} <= set(maps):
        source = record.get("tissue_maps_source")
        how = "model channels" if source == "model channels" else str(record.get("method") or source or "")
        return check_maps(maps, affine, space=space, maps_from=how)
    if record.get("not_brain_like") and record.get("tissue_maps_not_made"):
        return not_brain_like(
            f"segmentation refused it: {record['tissue_maps_not_made']}", maps_from="segmentation"
        )
    return None
