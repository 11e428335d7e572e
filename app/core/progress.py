"""Progress of the running job for people: step i/N, steps per second, ETA (Qt-free)."""

from __future__ import annotations

import re
import time

from engine.formatting import format_duration
from engine.metrics.pace import pace

QUIET_NOTE_S = 5.0  # a stage with no report for this long says how long it has been waiting
_STEP_ECHO = re.compile(r"step \d+/\d+")  # the loop's own "step i/N" adds nothing to "Step i/N"


class ProgressTracker:
    """Step i/N, steps per second and ETA from the engine's ``Progress`` reports.

    The rate is measured over the denoising steps only (loading and compiling are one-off), from the
    first denoise report to the latest one.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.stage = ""
        self.step = 0
        self.total = 0
        self.elapsed_s = 0.0
        self.message = ""
        self.reported_at = 0.0  # time.monotonic() of the latest report
        self._first: tuple[int, float] | None = None

    def update(self, stage: str, step: int, total: int, elapsed_s: float, message: str = "") -> None:
        self.stage, self.step, self.total, self.elapsed_s, self.message = (
            stage,
            step,
            total,
            elapsed_s,
            message,
        )
        self.reported_at = time.monotonic()
        if stage == "denoise" and self._first is None:
            self._first = (step, elapsed_s)

    def _pace(self) -> tuple[float | None, float | None]:
        """(steps/s, seconds left) of the denoising since its first reported step (engine.metrics.pace)."""
        if self._first is None or self.stage != "denoise":
            return None, None
        return pace(self.step - self._first[0], self.elapsed_s - self._first[1], self.total - self.step)

    @property
    def steps_per_second(self) -> float | None:
        return self._pace()[0]

    @property
    def eta_s(self) -> float | None:
        return self._pace()[1]

    @property
    def percent(self) -> int:
        if self.stage == "decode":
            return 100
        return int(round(100 * self.step / self.total)) if self.total else 0

    @property
    def stage_message(self) -> str:
        """What the engine (or an engine server) said about the stage, unless it only repeats the step."""
        message = self.message.strip()
        return "" if not message or _STEP_ECHO.fullmatch(message) else message

    def quiet_s(self, now: float | None = None) -> float:
        """Seconds since the latest report (a first step that compiles, a server still loading)."""
        return max(0.0, (time.monotonic() if now is None else now) - self.reported_at) if self.stage else 0.0

    def text(self, now: float | None = None) -> str:
        """One line for the progress label: 'Step 12/50 · 3.4 it/s · ETA 0:11', with the engine's stage
        message ('loading demo for XLA', 'denoising') and, when nothing came for a while, how long."""
        if not self.stage:
            return "Ready"
        said = self.stage_message
        if self.stage in ("load", "compile"):
            default = "Loading model" if self.stage == "load" else "Compiling"
            parts = [f"{(said or default)[:1].upper()}{(said or default)[1:]}..."]
        elif self.stage == "decode":
            parts = [f"Decoding volume... ({format_duration(self.elapsed_s)} so far)"]
        else:
            parts = [f"Step {self.step}/{self.total}"]
            if said:
                parts.append(said)
            rate = self.steps_per_second
            if rate is not None:
                parts.append(f"{rate:.2f} it/s" if rate < 10 else f"{rate:.0f} it/s")
                parts.append(f"ETA {format_duration(self.eta_s or 0.0)}")
        quiet = self.quiet_s(now)
        if quiet >= QUIET_NOTE_S:
            parts.append(f"waiting {format_duration(quiet)} for the next report")
        return "  \u00b7  ".join(parts)
