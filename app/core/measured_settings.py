"""What ``volsynth tune`` measured for the selected model on this machine: the model the presets are a view of.

Qt-free. The tune controller (app/generation/tuning.py) fills it; the Optimization panel reads it to label
each preset measured-here (with its ratio and PSNR) or not measured-here, and to offer "Fastest here", the
fastest measured setting that keeps the volume within the PSNR floor of fp32 and that the noise rule calls
faster than fp32 end to end (engine.optimization.tune_store.recommendation: a setting measured slower is never offered).
"""

from __future__ import annotations

import math
from typing import Any

from app.core.events import Event
from engine.optimization import tune_store

FASTEST_HERE = "Fastest here"
NOT_MEASURED = "not measured here"
#: The time budget of Measure now (the settings, step caching and fewer steps), said where the button is.
MEASURE_BUDGET_S = 240.0
#: The step-caching rows Measure now times and judges (the panel's default, the forecast, at two intervals).
MEASURED_CACHE_ROWS = ("cache:k3-l1-f", "cache:k6-l1-f")


def budget_words(budget_s: float = MEASURE_BUDGET_S) -> str:
    return f"about {budget_s / 60:.0f} minutes" if budget_s >= 90 else f"about {budget_s:.0f} s"


class MeasuredSettings:
    """Events: changed() when the result, the floor, or the measuring state changes."""

    def __init__(self) -> None:
        self.result: dict[str, Any] | None = None
        self.model_id: str | None = None  # the model the result (or its absence) belongs to
        self.looked_up = False  # False until the store was asked for the selected model
        self.min_psnr_db = tune_store.DEFAULT_MIN_PSNR_DB
        self.running = False
        self.progress_text = ""
        self.error = ""
        self.changed = Event()

    # -- updates (from the controller) ---------------------------------------------------------------

    def set_result(self, model_id: str | None, result: dict[str, Any] | None) -> None:
        self.model_id, self.result, self.looked_up, self.error = model_id, result, True, ""
        self.changed.emit()

    def forget(self) -> None:
        """A model the store cannot be asked for (remote, or none selected)."""
        self.model_id, self.result, self.looked_up = None, None, False
        self.changed.emit()

    def set_running(self, running: bool, text: str = "") -> None:
        self.running, self.progress_text = running, text
        self.changed.emit()

    def set_error(self, message: str) -> None:
        self.running, self.error = False, message
        self.changed.emit()

    def set_min_psnr(self, value: float) -> None:
        if value != self.min_psnr_db:
            self.min_psnr_db = float(value)
            self.changed.emit()

    # -- what the presets show ------------------------------------------------------------------------

    @property
    def measured(self) -> bool:
        return self.result is not None

    def fastest(self) -> dict[str, Any] | None:
        """The recommended row (fp32 when nothing measured is clearly faster at the floor), or None."""
        return tune_store.recommendation(self.result, self.min_psnr_db)

    def fastest_values(self) -> dict[str, Any] | None:
        row = self.fastest()
        return None if row is None else dict(row.get("config", {}))

    def preset_row(self, preset: str) -> dict[str, Any] | None:
        """The measured row of a named preset ("Exact fp32" is the fp32 row)."""
        if not self.result:
            return None
        wanted = "fp32" if preset == "Exact fp32" else f"preset:{preset}"
        return next((r for r in self.result.get("rows", ()) if r.get("name") == wanted), None)

    def setting_row(self, name: str) -> dict[str, Any] | None:
        """The measured row of a setting by its `volsynth bench` name ("int8+sdpa"), timed end to end."""
        if not self.result:
            return None
        row = next((r for r in self.result.get("rows", ()) if r.get("name") == name), None)
        return row if row is not None and "end_to_end_s" in row else None

    def setting_label(self, name: str) -> str:
        """A named setting's text: "int8+sdpa · 1.31x fp32 here" where it was measured (with its PSNR against
        fp32 for a row that changes the result by design: step caching), else its name."""
        row = self.setting_row(name)
        if row is None:
            return name
        quality = f", {_db(row)}" if tune_store.trades_fidelity(row) else ""
        return f"{name} \u00b7 {_ratio(row)}{quality} here"

    def trade_rows(self) -> list[dict[str, Any]]:
        """The measured rows that change the result by design (step caching, fewer steps), fastest first."""
        rows = [
            r
            for r in (self.result or {}).get("rows", ())
            if "end_to_end_s" in r and tune_store.trades_fidelity(r)
        ]
        return sorted(rows, key=lambda r: -(r.get("speedup_end_to_end") or 0.0))

    def trade_words(self) -> str:
        """Speed and quality cost side by side for each measured trade, one line for the panel."""
        parts = []
        for row in self.trade_rows():
            config = row.get("config") or {}
            if row.get("steps") is not None:
                what = f"{row['steps']} steps instead of {row.get('default_steps')}"
            else:
                held = "forecast" if config.get("step_cache_forecast") else "held"
                what = (
                    f"step caching every {config.get('step_cache_interval')} "
                    f"(level {config.get('step_cache_level', 1)}, {held})"
                )
            verdict = (row.get("end_to_end_verdict") or {}).get("verdict", "")
            parts.append(f"{what}: {_ratio(row)} ({verdict}), {_db(row)}")
        if not parts:
            return ""
        return "Trades measured here (speed; PSNR of a whole run vs fp32's): " + " \u00b7 ".join(parts)

    def not_measured_reason(self, preset: str) -> str:
        if not self.result:
            return ""
        row = next(
            (r for r in self.result.get("not_measured", ()) if r.get("name") == f"preset:{preset}"), None
        )
        return "" if row is None else str(row.get("reason", ""))

    def label(self, preset: str) -> str:
        """The combo box text: "Fast decode (CPU) · 1.05x here", "Low memory · not measured here"."""
        if preset == FASTEST_HERE:
            row = self.fastest()
            floor = f"\u2265 {self.min_psnr_db:g} dB"
            if row is None:
                return f"{FASTEST_HERE} ({floor}) \u00b7 {NOT_MEASURED}"
            if row.get("name") == "fp32":
                return f"{FASTEST_HERE} ({floor}) \u00b7 fp32: nothing measured clearly faster"
            return f"{FASTEST_HERE} ({floor}) \u00b7 {_row_name(row)}, {_ratio(row)} here"
        row = self.preset_row(preset)
        if row is None or "end_to_end_s" not in row:
            return f"{preset} \u00b7 {NOT_MEASURED}" if self.looked_up else preset
        if row.get("name") == "fp32":  # what the others' ratios are to
            return f"{preset} \u00b7 the reference, {row['end_to_end_s']:.1f} s here"
        return f"{preset} \u00b7 {_ratio(row)} here"

    def words(self, preset: str) -> str:
        """What a preset measured on this machine, for its tooltip and the panel's line."""
        if preset == FASTEST_HERE:
            row = self.fastest()
            if row is None:
                return (
                    "Not measured on this machine yet: Generate > Measure Settings on This Machine "
                    "(or 'Measure now') finds the fastest settings that keep the volume within the PSNR floor"
                )
            if row.get("name") == "fp32":
                return (
                    f"Nothing measured here was clearly faster than fp32 at \u2265 {self.min_psnr_db:g} dB "
                    f"(noise rule), so this is exact fp32. {_when(self.result)}"
                )
            return f"Measured fastest here: {_row_name(row)}. {_row_words(row)} {_when(self.result)}"
        row = self.preset_row(preset)
        if row is None or "end_to_end_s" not in row:
            reason = self.not_measured_reason(preset)
            return f"Not measured on this machine{': ' + reason if reason else ''}."
        return f"Measured on this machine: {_row_words(row)} {_when(self.result)}"


def _row_name(row: dict[str, Any]) -> str:
    """A row's name as the presets box shows it: "Low memory" for the row "preset:Low memory"."""
    return str(row.get("name", "")).removeprefix("preset:")


def _ratio(row: dict[str, Any]) -> str:
    ratio = row.get("speedup_end_to_end")
    return "n/a" if ratio is None else f"{ratio:.2f}x fp32"


def _row_words(row: dict[str, Any]) -> str:
    verdict = (row.get("end_to_end_verdict") or {}).get("words", "")
    psnr = row.get("psnr_db")
    quality = "identical to fp32" if psnr is None or math.isinf(psnr) else f"PSNR {psnr:.1f} dB vs fp32"
    return (
        f"end to end {row['end_to_end_s']:.1f} s (U-Net step {row['step_ms_median']:.0f} ms, decode "
        f"{row['decode_s_median']:.2f} s); {verdict}; {quality}."
    )


def _db(row: dict[str, Any]) -> str:
    psnr = row.get("psnr_db")
    if psnr is None:
        return "quality not measured"
    return "identical to fp32" if math.isinf(psnr) else f"{psnr:.1f} dB"


def _when(result: dict[str, Any] | None) -> str:
    if not result:
        return ""
    return f"(volsynth tune, {result.get('created', '')}, {result.get('machine_words', '')})"
