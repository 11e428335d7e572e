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


def anatomy_lines(record: Mapping[str, Any] | None) -> list[str]:
    """The details' lines for a check record: the verdict with a mark, then the measures in a line."""
    if not record:
        return []
    status = str(record.get("status", ""))
    lines = [f"anatomy check: {_MARKS.get(status, '')} {record.get('verdict', '')}".replace(":  ", ": ")]
    measures = record.get("measures") or {}
    parts = []
    for name, measure in measures.items():
        value = measure.get("value") if isinstance(measure, Mapping) else None
        if value is None:
            continue
        unit = measure.get("unit")
        text = (
            f"{value:.0f} mL" if unit == "mL" else f"{value:.1f} %" if unit == "%" else f"{100 * value:.1f} %"
        )
        parts.append(f"{_SHORT.get(name, name)} {text}" + ("" if measure.get("within", True) else " (!)"))
    if parts:
        lines.append("  " + " \u00b7 ".join(parts))
    scale = float(record.get("space_scale") or 1.0)
    if record.get("space") and record.get("space") != "native" and measures and scale != 1.0:
        # A template space is larger than a native brain: say what the brain volume is in native terms.
        brain = (measures.get("brain_volume_ml") or {}).get("value")
        native = f", brain \u2248 {brain / scale:.0f} mL in native terms" if brain else ""
        lines.append(f"  {record['space']}: volume ranges \u00d7 {scale:.2f}{native}")
    return lines
