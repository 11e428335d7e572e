"""Text for people about runs: optimization reports and telemetry summaries (Qt-free).

Durations and byte counts are formatted by ``engine.formatting`` so the CLI and the app read the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.api.optimization_config import SETTING_ROWS, SettingRow
from engine.formatting import format_bytes, format_duration  # noqa: F401 - the app's panels import them here


def setting_labels(rows: Sequence[SettingRow] = SETTING_ROWS) -> dict[str, str]:
    """Names for people of the optimization settings and of the report entries that say whether they applied
    (``step_cache`` is the step-caching pair's entry; ``measured_here`` is what ``volsynth tune`` measured)."""
    labels = {row.name: row.label for row in rows}
    labels.update({row.report_entry: row.label for row in rows if row.report_entry})
    return {**labels, "measured_here": "Measured here"}


def setting_tips(rows: Sequence[SettingRow] = SETTING_ROWS) -> dict[str, str]:
    """Each setting's one explanation, the tooltip of its control."""
    return {row.name: row.tip for row in rows}


def setting_choices(rows: Sequence[SettingRow] = SETTING_ROWS) -> dict[str, list[tuple[str, Any]]]:
    """The values a setting's box offers, ``(label shown, value in the config)``; check boxes and number boxes
    have none."""
    return {row.name: list(row.choices) for row in rows if row.choices}


OPTIMIZATION_LABELS = setting_labels()

_MODALITY_TITLES = {"t1w": "T1w", "t2w": "T2w", "flair": "FLAIR", "swi": "SWI", "mra": "MRA"}


def modality_title(name: str) -> str:
    """``flair-skullstripped`` -> ``FLAIR, skull-stripped`` (the name a request uses stays the item's data)."""
    base, _, rest = name.partition("-")
    title = _MODALITY_TITLES.get(base, base)
    return (
        f"{title}, skull-stripped" if rest == "skullstripped" else title if not rest else f"{title} ({rest})"
    )


APPLIED_MARK, NOT_APPLIED_MARK = "\u2713", "\u2013"  # check mark, en dash
SLOWER_MARK = "\u25bc"  # down-pointing triangle: applies, but expected slower than fp32 on this machine


def setting_requested(value: Any) -> bool:
    """Whether a setting's requested value asks for a change from plain fp32 (False, None and "default" do not)."""
    return value not in (None, False, "default")


def setting_text(name: str, value: Any) -> str:
    """``TF32``, ``Autocast bf16``, ``Quantization mixed``: a requested setting in a few words."""
    label = OPTIMIZATION_LABELS.get(name, name)
    return label if isinstance(value, bool) else f"{label} {value}"


def optimization_lines(report: Mapping[str, Any]) -> list[str]:
    """What a run's optimization report says (provenance["optimization"]["report"]), for the details pane.

    One line per requested setting: a check mark if it applied, then a dash and the engine's reason if not.
    """
    requested = sorted(
        (
            (name, entry)
            for name, entry in report.items()
            if isinstance(entry, Mapping) and setting_requested(entry.get("requested"))
        ),
        key=lambda item: not item[1].get("applied"),
    )
    if not requested:
        return ["optimization: none (exact fp32)"]
    lines = ["optimization:"]
    for name, entry in requested:
        text = setting_text(name, entry["requested"])
        if entry.get("expected_slower"):
            lines.append(
                f"  {SLOWER_MARK} {text}: expected slower than fp32 here: {entry['expected_slower']}"
            )
        elif entry.get("applied"):
            lines.append(f"  {APPLIED_MARK} {text}")
        else:
            reason = entry.get("reason") or "not applied"
            lines.append(f"  {NOT_APPLIED_MARK} {text}: {reason}")
    return lines


def run_summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """Two short lines describing a run's telemetry summary (``engine.telemetry`` ``mark_run_end``).

    Duration and mean GPU utilisation (or "no GPU"), then peak memory and energy. Without a GPU the peak
    memory is this process's resident set and energy is not measured.
    """
    duration = summary.get("duration_s")
    first = [f"{duration:.1f} s" if isinstance(duration, int | float) else "duration n/a"]
    if summary.get("gpu_available"):
        util = summary.get("mean_gpu_util_pct")
        first.append(f"GPU {util:.0f}% mean" if util is not None else "GPU utilisation n/a")
        energy = summary.get("energy_j")
        second = [
            f"peak GPU memory {format_bytes(summary.get('peak_gpu_memory_bytes'))}",
            f"{energy:,.0f} J"
            if energy is not None and energy >= 100
            else f"{energy:.1f} J"
            if energy is not None
            else "energy n/a",
        ]
    else:
        first.append("no GPU")
        cpu = summary.get("cpu") or {}
        if cpu.get("mean_cpu_pct") is not None:
            first.append(f"CPU {cpu['mean_cpu_pct']:.0f}% mean")
        second = [f"peak RSS {format_bytes(cpu.get('peak_process_rss_bytes'))}", "energy n/a"]
    return ["telemetry: " + ", ".join(first), ", ".join(second)]


def xla_run_lines(xla: Mapping[str, Any]) -> list[str]:
    """What an XLA run's provenance (``provenance["xla"]``) says of where it ran, for the details pane:
    one device, or the plan, its placement on the devices, and the predicted against the measured step."""
    plan = xla.get("plan")
    where = f"{xla.get('platform', '?')} {xla.get('device_kind', '')}".strip()
    if not isinstance(plan, Mapping):
        return [f"XLA: one device ({where}), no plan"]
    mesh = plan.get("mesh")
    if isinstance(mesh, Mapping):
        mesh_text = " \u00d7 ".join(f"{k} {v}" for k, v in mesh.items())
    elif isinstance(mesh, list | tuple):
        mesh_text = " \u00d7 ".join(
            f"{k} {v}" for k, v in zip(("data", "depth", "height"), mesh, strict=False)
        )
    else:
        mesh_text = "?"
    used, available = plan.get("devices_used"), plan.get("devices_available")
    devices = f"{used} of {available}" if available and available != used else f"{used or '?'}"
    requested = plan.get("requested")
    chosen = f" (asked: {requested})" if requested and requested != plan.get("name") else ""
    lines = [
        f"XLA plan {plan.get('name', '?')}{chosen}, {plan.get('kind', '?')}: mesh {mesh_text} on {devices} "
        f"device(s)",
        f"  placement {plan.get('placement') or '?'}"
        + (f" on {plan['topology']}" if plan.get("topology") else ""),
    ]
    from app.core.plan_table import format_duration_ms  # the Plan view's units (us, ms, s)

    measured = plan.get("measured_median_step_ms", plan.get("measured_step_ms"))
    predicted = plan.get("predicted_step_ms")
    lines.append(
        f"  step: predicted {format_duration_ms(predicted) if predicted is not None else 'none'}, "
        f"measured {format_duration_ms(measured) if measured is not None else 'n/a'}"
        + (f" (median, {plan['measured_on']})" if plan.get("measured_on") else "")
    )
    if plan.get("prediction"):
        lines.append(f"  prediction: {plan['prediction']}")
    lines.extend(_decoder_lines(plan.get("decoder")))
    if plan.get("measured_note"):
        lines.append(f"  {plan['measured_note']}")
    return lines


def _decoder_lines(decoder: Any) -> list[str]:
    """How a planned run decoded: split over its devices (the split, memory per device) or on one."""
    if not isinstance(decoder, Mapping):
        return []
    used = decoder.get("devices_used")
    if not isinstance(used, int) or used < 2:
        note = f": {decoder['note']}" if decoder.get("note") else ""
        return [f"  decoder on one device{note}"]
    skip = ("devices_used", "memory_per_device_bytes", "collectives", "note")
    split = ", ".join(
        f"{k} {v}" for k, v in decoder.items() if k not in skip and isinstance(v, str | int | float)
    )
    memory = decoder.get("memory_per_device_bytes")
    return [
        f"  decoder split over {used} devices"
        + (f" ({split})" if split else "")
        + (f", {format_bytes(memory)} per device" if isinstance(memory, int | float) else "")
    ]
