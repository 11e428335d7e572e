"""Cohort verdicts kept per machine and model, so that bench and tune can carry them in their JSON.

``volsynth quality`` keeps each setting's verdict under ``<user cache>/quality/<machine fingerprint>/<model
key>.json`` (``$VOLSYNTH_QUALITY_DIR`` instead of ``<user cache>/quality`` where set), keyed by the settings'
fields. ``quality_block`` is what bench and tune put under "quality": per row the cohort verdict measured
here, or the command that measures it. A verdict belongs to the machine it was measured on (int8 kernels and
bf16 rounding differ between CPUs) and to the request it was measured with (steps, guidance), which it records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

FORMAT = "volsynth-quality/1"


def quality_root() -> Path:
    override = os.environ.get("VOLSYNTH_QUALITY_DIR")
    if override:
        return Path(override)
    from engine.files.user_folders import user_cache_dir

    return user_cache_dir() / "quality"


def settings_key(config: Mapping[str, Any], steps: int | None = None) -> str:
    """The key a verdict is kept under: the settings' fields that differ from fp32, sorted (allow_slower aside),
    and the number of steps of a candidate with a schedule of its own."""
    from engine.api.optimization_config import OptimizationConfig

    values = OptimizationConfig.from_dict(dict(config)).to_dict()
    defaults = OptimizationConfig().to_dict()
    changed = {k: v for k, v in values.items() if v != defaults.get(k) and k != "allow_slower"}
    if steps is not None:
        changed["steps"] = steps
    return json.dumps(changed, sort_keys=True)


def _path(fingerprint: str, model_key: str) -> Path:
    return quality_root() / fingerprint / f"{model_key}.json"


def load(fingerprint: str, model_key: str) -> dict[str, Any]:
    try:
        data = json.loads(_path(fingerprint, model_key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data.get("verdicts", {}) if isinstance(data, dict) and data.get("format") == FORMAT else {}


def save_run(run, fingerprint: str, model_key: str, created: str) -> Path:
    """Keep each setting's verdict of ``run`` (a ``QualityRun``), replacing earlier ones for the same settings."""
    from engine.nifti.io import atomic_files

    verdicts = load(fingerprint, model_key)
    settings, schedules = run.request.get("settings", {}), run.request.get("schedules", {})
    for label, report in run.reports.items():
        verdicts[settings_key(settings[label], schedules.get(label))] = {
            "label": label,
            "verdict": report.verdict,
            "within_noise": report.within_noise,
            "decided_by": report.decided_by,
            "seeds": len(run.seeds),
            "psnr_median_db": report.to_dict()["psnr_median_db"],
            "tissue_source": run.tissue_source,
            "steps": schedules.get(label, run.request.get("steps")),
            "guidance_scale": run.request.get("guidance_scale"),
            "created": created,
        }
    path = _path(fingerprint, model_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files([path]) as (temp,):
        temp.write_text(json.dumps({"format": FORMAT, "verdicts": verdicts}, indent=2), encoding="utf-8")
    return path


def quality_block(
    fingerprint: str,
    model_key: str,
    rows: Iterable[tuple[str, Mapping[str, Any]]],
    model: str = "",
    schedules: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The "quality" block of a bench or tune JSON: per row (name, settings fields) the cohort verdict kept for
    this machine and model, or None with the command that measures it; the per-seed PSNR/SSIM stay in the rows.
    ``schedules``: row name -> steps, for rows that are shorter schedules (kept under their steps)."""
    kept = load(fingerprint, model_key)
    schedules = schedules or {}
    cohort: dict[str, Any] = {}
    missing: list[str] = []
    for name, config in rows:
        try:
            key = settings_key(config, schedules.get(name))
        except Exception:  # noqa: BLE001 - a row whose settings no longer parse is reported, not fatal
            cohort[name] = None
            continue
        cohort[name] = kept.get(key)
        if cohort[name] is None and key != "{}":
            missing.append(name)
    block: dict[str, Any] = {
        "per_seed": "psnr_db / ssim / max_abs_err of each row: one seed against fp32 on the same seed",
        "cohort": cohort,
        "rule": "engine/quality/__init__.py: within seed-to-seed variation, or shifts the distribution",
    }
    if missing:
        from engine.api.optimization_config import NAMED_SETTINGS
        from engine.quality.run import SCHEDULE_PREFIX

        model_arg = f" --model {model}" if model else ""
        # Names `volsynth quality --settings` takes as they are; a tune row of its own naming is a placeholder.
        block["measure"] = f"volsynth quality{model_arg} --seeds 16 --settings " + " ".join(
            f"'{n}'" if n in NAMED_SETTINGS or n.startswith(SCHEDULE_PREFIX) else f"'<settings of {n}>'"
            for n in missing
        )
    return block
