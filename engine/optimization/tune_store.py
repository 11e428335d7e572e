"""Where ``volsynth tune`` keeps what it measured: per machine, per model, per library versions.

A measurement is only true for the machine, model and libraries it was taken with, so results are kept
under the user cache as ``tune/<machine fingerprint>/<model key>-<versions key>.json``: another machine, a
retrained model or a torch upgrade finds nothing and measures again. The optimization report reads these
files (:func:`measured_row`) to say "measured slower than fp32 here" and never recommends such a setting;
the app's presets are a view of them (:func:`recommendation`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TUNE_FORMAT = 1
DEFAULT_MIN_PSNR_DB = 40.0


def model_key(weights_sha256: Mapping[str, str]) -> str:
    """One short id of a model's weights (the sha256 of every weights file, by name)."""
    joined = "\n".join(f"{name}:{digest}" for name, digest in sorted(weights_sha256.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def versions_key(versions: Mapping[str, str]) -> str:
    joined = "\n".join(f"{k}={v}" for k, v in sorted(versions.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:8]


def tune_root() -> Path:
    """``$VOLSYNTH_TUNE_DIR`` or ``<user cache>/tune`` (read at each call, so tests can point it elsewhere)."""
    override = os.environ.get("VOLSYNTH_TUNE_DIR")
    if override:
        return Path(override)
    from engine.files.user_folders import user_cache_dir

    return user_cache_dir() / "tune"


def result_path(fingerprint: str, model: str, versions: str) -> Path:
    return tune_root() / fingerprint / f"{model}-{versions}.json"


def current_versions() -> dict[str, str]:
    """The libraries whose kernels decide the timings (a change invalidates a measurement)."""
    from engine.machine.software import library_versions

    versions = library_versions()
    from contextlib import suppress
    from importlib.metadata import PackageNotFoundError, version

    with suppress(PackageNotFoundError):  # metadata, not an import: torchao prints loader noise
        versions["torchao"] = version("torchao")
    return versions


def save_result(result: Mapping[str, Any]) -> Path:
    """Write a tune result atomically where :func:`load_result` finds it; returns the path."""
    from engine.nifti.io import atomic_files

    path = result_path(result["fingerprint"], result["model"]["key"], result["versions_key"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files([path]) as (temp,):
        temp.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return path


def load_result(
    weights_sha256: Mapping[str, str],
    fingerprint: str | None = None,
    versions: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """The stored tune result for this model on this machine and these libraries, or None."""
    if fingerprint is None:
        from engine.machine.probe import probe_machine

        fingerprint = probe_machine().fingerprint()
    versions = current_versions() if versions is None else versions
    path = result_path(fingerprint, model_key(weights_sha256), versions_key(versions))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != TUNE_FORMAT:
        return None
    return data


def config_key(values: Mapping[str, Any]) -> str:
    """The settings of a row as a canonical string (the override is not a setting)."""
    from engine.api.optimization_config import OptimizationConfig

    config = OptimizationConfig.from_dict(dict(values)).settings
    return json.dumps(config.to_dict(), sort_keys=True)


def measured_row(result: Mapping[str, Any] | None, config) -> dict[str, Any] | None:
    """The measured row of ``result`` with exactly the settings of ``config`` (an OptimizationConfig)."""
    if not result:
        return None
    wanted = json.dumps(config.settings.to_dict(), sort_keys=True)
    for row in result.get("rows", ()):
        if "config" in row and config_key(row["config"]) == wanted:
            return row
    return None


def measured_slower(row: Mapping[str, Any] | None) -> bool:
    """Whether the row was measured slower than fp32 end to end by the noise rule."""
    return row is not None and (row.get("end_to_end_verdict") or {}).get("verdict") == "slower"


def trades_fidelity(row: Mapping[str, Any]) -> bool:
    """Whether a row changes the result by design, not by rounding: step caching (deep features reused across
    steps) or a shorter schedule than the model's default. PSNR against fp32 cannot clear such a row: it
    must carry a quality verdict that holds (:func:`quality_holds`)."""
    config = row.get("config") or {}
    interval = config.get("step_cache_interval", 1)
    shorter = row.get("steps") is not None and row.get("steps") != row.get("default_steps")
    return (isinstance(interval, int | float) and interval > 1) or shorter


def quality_holds(row: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> bool:
    """Whether the row's cohort quality verdict (engine.quality.quality_report's ``within_noise``) holds: the
    row's own ``quality``, or the verdict ``volsynth quality`` kept for it (the result's ``quality`` block)."""
    quality = row.get("quality")
    if not isinstance(quality, Mapping) and result:
        cohort = (result.get("quality") or {}).get("cohort") or {}
        quality = cohort.get(row.get("name", ""))
    return isinstance(quality, Mapping) and quality.get("within_noise") is True


def recommendation(result: Mapping[str, Any] | None, min_psnr_db: float = DEFAULT_MIN_PSNR_DB):
    """The fastest measured row at or above ``min_psnr_db`` that the noise rule calls faster than fp32 end to
    end, or the fp32 row when none is (a setting measured slower, or not clearly faster, is never recommended).
    A row that trades fidelity for speed (step caching) is recommended only when its quality verdict holds
    (:func:`trades_fidelity`, :func:`quality_holds`); a shorter schedule is never the recommended settings (its
    settings are fp32's), :func:`schedule_advice` says when one keeps the verdict.

    "Fastest" is the largest speed-up over the fp32 measured in the same run, side by side: a result merged
    from several runs (``volsynth tune --rows``) holds rows timed at different times, under different load,
    whose seconds do not compare, but whose ratios to their own run's fp32 do.
    """
    if not result:
        return None
    rows = [r for r in result.get("rows", ()) if "error" not in r and r.get("end_to_end_s")]
    fp32 = next((r for r in rows if r.get("name") == "fp32"), None)

    def speedup(row) -> float:
        if row.get("speedup_end_to_end"):
            return float(row["speedup_end_to_end"])
        return fp32["end_to_end_s"] / row["end_to_end_s"] if fp32 else 1.0 / row["end_to_end_s"]

    best = fp32
    for row in rows:
        if row is fp32 or (row.get("end_to_end_verdict") or {}).get("verdict") != "faster":
            continue
        if row.get("steps") not in (None, row.get("default_steps")):  # a schedule: schedule_advice weighs it
            continue
        if trades_fidelity(row) and not quality_holds(row, result):
            continue
        psnr = row.get("psnr_db")
        if psnr is None or not (math.isinf(psnr) or psnr >= min_psnr_db):
            continue
        bar = 0.0 if best is None else 1.0 if best is fp32 else speedup(best)
        if speedup(row) > bar:
            best = row
    return best


def schedule_advice(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The fastest shorter-schedule row (``volsynth tune --rows steps:25``) that the noise rule calls faster than
    fp32 and whose cohort quality verdict holds, or None: a schedule is advised with its measured cost, never
    chosen silently (it is the request's steps, not a setting a preset can carry)."""
    if not result:
        return None
    best = None
    for row in result.get("rows", ()):
        if row.get("steps") is None or not trades_fidelity(row) or not quality_holds(row, result):
            continue
        if (row.get("end_to_end_verdict") or {}).get("verdict") != "faster":
            continue
        if best is None or row.get("speedup_end_to_end", 0) > best.get("speedup_end_to_end", 0):
            best = row
    return best


def merge_results(stored: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` (a measurement of some rows) merged into the ``stored`` result of the same model, machine and
    libraries: the rows ``new`` measured replace theirs, the others are kept, and the recommendation is made
    again from the merged rows.

    Every row's verdict is the noise rule (:func:`engine.metrics.speed_verdict.speed_verdict`) applied anew to
    its own end-to-end samples against those of the fp32 measured in the same run (kept with the row as
    ``reference_end_to_end_samples_s``), never against another run's fp32: rows of different runs were timed
    under different load. A row kept from an older format without samples keeps its verdict.
    """
    from engine.metrics.speed_verdict import paired_speed_verdict, speed_verdict

    merged = json.loads(json.dumps(new, default=str))  # a copy, JSON-shaped like the stored file
    if stored and _same_measurement(stored, new):
        measured = {row["name"] for row in merged["rows"]}
        kept = [copy_row(row, stored) for row in stored.get("rows", ()) if row.get("name") not in measured]
        merged["rows"] = [*merged["rows"], *kept]
        merged["kept_from_earlier_runs"] = sorted(row["name"] for row in kept)
    for row in merged["rows"]:
        samples, reference = row.get("end_to_end_samples_s"), row.get("reference_end_to_end_samples_s")
        if row.get("name") != "fp32" and samples and reference:
            # A projected row's samples come from fp32's own runs, one for one: judged as pairs.
            judge = paired_speed_verdict if row.get("projected") else speed_verdict
            verdict = judge(reference, samples)
            row["end_to_end_verdict"] = verdict.to_dict("it", "fp32")
            row["speedup_end_to_end"] = verdict.ratio
    best = recommendation(merged)
    merged["recommended"] = best["name"] if best else None
    schedule = schedule_advice(merged)
    merged["shorter_schedule"] = schedule["name"] if schedule else None
    return merged


def copy_row(row: Mapping[str, Any], stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored row, marked with when it was measured (the run it came from) if it is not yet."""
    return {**row, "measured": row.get("measured") or stored.get("created")}


def _same_measurement(stored: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``stored`` is for the same machine, model, libraries and device as ``new`` (only then merge)."""
    return (
        stored.get("format") == new.get("format")
        and stored.get("fingerprint") == new.get("fingerprint")
        and (stored.get("model") or {}).get("key") == (new.get("model") or {}).get("key")
        and stored.get("versions_key") == new.get("versions_key")
        and stored.get("device") == new.get("device")
    )
