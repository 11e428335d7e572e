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
    return bool(row) and (row.get("end_to_end_verdict") or {}).get("verdict") == "slower"


def recommendation(result: Mapping[str, Any] | None, min_psnr_db: float = DEFAULT_MIN_PSNR_DB):
    """The fastest measured row at or above ``min_psnr_db`` that the noise rule calls faster than fp32 end to
    end, or the fp32 row when none is (a setting measured slower, or not clearly faster, is never recommended).
    """
    if not result:
        return None
    rows = [r for r in result.get("rows", ()) if "error" not in r and r.get("end_to_end_s")]
    fp32 = next((r for r in rows if r.get("name") == "fp32"), None)
    best = fp32
    for row in rows:
        if row is fp32 or (row.get("end_to_end_verdict") or {}).get("verdict") != "faster":
            continue
        psnr = row.get("psnr_db")
        if psnr is None or not (math.isinf(psnr) or psnr >= min_psnr_db):
            continue
        if best is None or row["end_to_end_s"] < best["end_to_end_s"]:
            best = row
    return best
