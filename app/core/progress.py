"""Progress of the running job for people: step i/N, steps per second, ETA (Qt-free)."""

from __future__ import annotations

from engine.formatting import format_duration


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
        self._first: tuple[int, float] | None = None

    def update(self, stage: str, step: int, total: int, elapsed_s: float, message: str = "") -> None:
        self.stage, self.step, self.total, self.elapsed_s, self.message = (
            stage,
            step,
            total,
            elapsed_s,
            message,
        )
        if stage == "denoise" and self._first is None:
            self._first = (step, elapsed_s)

    @property
    def steps_per_second(self) -> float | None:
        if self._first is None or self.stage != "denoise":
            return None
        steps = self.step - self._first[0]
        seconds = self.elapsed_s - self._first[1]
        if steps <= 0 or seconds <= 0:
            return None
        return steps / seconds

    @property
    def eta_s(self) -> float | None:
        rate = self.steps_per_second
        if rate is None:
            return None
        return max(0.0, (self.total - self.step) / rate)

    @property
    def percent(self) -> int:
        if self.stage == "decode":
            return 100
        return int(round(100 * self.step / self.total)) if self.total else 0

    def text(self) -> str:
        """One line for the progress label: 'denoise 12/50 - 3.4 it/s - ETA 0:11'."""
        if not self.stage:
            return "Ready"
        if self.stage == "load":
            return "Loading model..."
        if self.stage == "compile":
            return "Compiling..."
        if self.stage == "decode":
            return f"Decoding volume... ({format_duration(self.elapsed_s)} so far)"
        parts = [f"Step {self.step}/{self.total}"]
        rate = self.steps_per_second
        if rate is not None:
            parts.append(f"{rate:.2f} it/s" if rate < 10 else f"{rate:.0f} it/s")
            parts.append(f"ETA {format_duration(self.eta_s or 0.0)}")
        return "  \u00b7  ".join(parts)
