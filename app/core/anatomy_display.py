"""The anatomy check of a volume, as the session panel's details say it (Qt-free).

A volume's check comes from its provenance (``anatomy_check``: what ``volsynth generate`` and ``volsynth segment``
write into the sidecar) or is made from its tissue maps (``engine.anatomy.checks``) off the GUI thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

PENDING = {"status": "pending", "verdict": "measuring\u2026"}
_SHORT = {
    "brain_volume_ml": "brain",
    "csf_fraction": "CSF",
    "gm_share": "GM/(GM+WM)",
    "ventricle_volume_ml": "ventricles",
    "asymmetry_pct": "asymmetry",
}
_MARKS = {"within": "\u2713", "outside": "\u26a0", "not_brain_like": "\u2717"}  # check, warning sign, cross


def stored_check(provenance: Mapping[str, Any]) -> dict[str, Any] | None:
    """The check a volume's provenance carries, or None."""
    record = provenance.get("anatomy_check")
    return dict(record) if isinstance(record, Mapping) and record.get("verdict") else None


def checkable(tissue: Mapping[str, np.ndarray]) -> bool:
    """Whether the maps are enough for a check (GM, WM and CSF)."""
    return {"GM", "WM", "CSF"} <= set(tissue)


def maps_source(provenance: Mapping[str, Any]) -> str:
    """How the maps were made, as the check's record says it: the model's channels or the segmentation method."""
    made = provenance.get("tissue_maps_made")
    if isinstance(made, Mapping) and made.get("tissue_maps_source") == "method":
        return str(made.get("method") or "segmentation")
    return "model channels" if provenance.get("label_channels") else "tissue maps"


def check_tissue(tissue: Mapping[str, np.ndarray], affine, space: str | None, source: str) -> dict[str, Any]:
    """Run the anatomy check of a volume's maps (call it off the GUI thread: about a second); a failure is a
    record saying so, never an exception."""
    from engine.anatomy.checks import check_maps

    try:
        return check_maps(dict(tissue), np.asarray(affine), space=space, maps_from=source).to_dict()
    except Exception as exc:  # noqa: BLE001 - the details must say it, not lose the panel
        return {"status": "failed", "verdict": f"could not be checked: {exc}"}


def _unit(unit: str, space: str | None) -> str:
    from engine.anatomy.norms import volume_unit

    return volume_unit(space) if unit == "mL" else unit


def condition_space_hint(condition, value: float, space: str | None) -> str:
    """Which space a model's volume input is in, with the native equivalent of ``value``: "MNI152 mL ·
    ≈ 957 mL native" for the shipped model's Brain volume (its output grid is the MNI152 template's, whose
    brain is larger than a native one); "" for any other input or space."""
    from engine.anatomy.norms import native_text

    if getattr(condition, "unit", "") != "mL":
        return ""
    native = native_text(float(value), space)
    return f"{_unit('mL', space)} \u00b7 {native}" if native else ""


def condition_norm_note(condition, value: float, space: str | None) -> str:
    """Why the anatomy check will flag a brain of ``value`` (a model's input the check measures, such as Brain
    volume, outside the adult range), capitalised for a note under the control; "" otherwise."""
    from engine.anatomy.norms import condition_against_norm

    note = condition_against_norm(condition.name, float(value), getattr(condition, "unit", ""), space)
    return note[:1].upper() + note[1:]


def asked_lines(provenance: Mapping[str, Any], spec) -> list[str]:
    """The details' lines for the conditioning a volume was asked for outside the adult ranges the check uses
    (``spec``: its model's spec, for the inputs' units), so that a flag on what was asked for says why."""
    from engine.anatomy.norms import condition_against_norm

    asked = provenance.get("conditioning") or {}
    space = provenance.get("space")
    lines = []
    for condition in getattr(spec, "conditioning", ()) if spec is not None else ():
        value = asked.get(condition.name)
        if not isinstance(value, int | float):
            continue
        note = condition_against_norm(condition.name, float(value), condition.unit, space)
        if note:
            unit = _unit(condition.unit, space)
            lines.append(f"  asked for {condition.label.lower()} {value:g} {unit}: {note}")
    return lines


def anatomy_lines(record: Mapping[str, Any] | None, asked: list[str] | None = None) -> list[str]:
    """The details' lines for a check record: the verdict with a mark, the measures in a line, the space their
    volumes are in, then ``asked`` (``asked_lines``: why the check flags what the volume was asked for)."""
    if not record:
        return []
    status = str(record.get("status", ""))
    lines = [f"anatomy check: {_MARKS.get(status, '')} {record.get('verdict', '')}".replace(":  ", ": ")]
    measures = record.get("measures") or {}
    space = record.get("space") if record.get("space") != "native" else None
    scale = float(record.get("space_scale") or 1.0)
    parts = []
    for name, measure in measures.items():
        value = measure.get("value") if isinstance(measure, Mapping) else None
        if value is None:
            continue
        unit = measure.get("unit")
        text = (
            f"{value:.0f} {_unit('mL', space if scale != 1.0 else None)}"
            if unit == "mL"
            else f"{value:.1f} %"
            if unit == "%"
            else f"{100 * value:.1f} %"
        )
        parts.append(f"{_SHORT.get(name, name)} {text}" + ("" if measure.get("within", True) else " (!)"))
    if parts:
        lines.append("  " + " \u00b7 ".join(parts))
    if space and measures and scale != 1.0:
        # A template space is larger than a native brain: say which numbers are in it, and the brain natively.
        brain = (measures.get("brain_volume_ml") or {}).get("value")
        native = f"; brain \u2248 {brain / scale:.0f} mL native" if brain else ""
        lines.append(
            f"  volumes in {_unit('mL', space)} ({space}: a brain there is \u00d7 {scale:.2f} its native "
            f"size; ranges scaled to it){native}"
        )
    if record.get("status") == "outside":
        lines += list(asked or ())
    return lines
