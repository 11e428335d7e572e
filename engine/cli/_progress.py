"""A terminal progress line for long jobs: bar, step i/N, steps per second, ETA. Writes to stderr.

Rate and ETA count the denoising steps of the run in progress, from its own first step: a command that runs
several jobs in a row (``volsynth compare`` runs A then B on one step counter) must not credit the second
run with the first run's steps.
"""

from __future__ import annotations

import sys
import time

from engine.formatting import format_duration
from engine.metrics.pace import pace


class ProgressLine:
    def __init__(self, stream=None, width: int = 28, clock=time.perf_counter):
        self.stream = stream or sys.stderr
        self.width = width
        self.clock = clock
        self.stage = ""
        self.stage_started = clock()
        self.stage_first_step = 0  # the step counter when this stage began
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_len = 0

    def update(self, progress) -> None:
        now = self.clock()
        if progress.stage != self.stage:
            if self.stage:
                self._newline()
            self.stage, self.stage_started, self.stage_first_step = progress.stage, now, progress.step
        if progress.stage == "denoise" and progress.total:
            done = progress.step
            run_steps = done - self.stage_first_step  # steps of this run since its denoising began
            elapsed = now - self.stage_started
            rate, eta = pace(run_steps, elapsed, progress.total - done)
            rate, eta = rate or 0.0, eta or 0.0
            filled = int(self.width * done / progress.total)
            bar = "#" * filled + "-" * (self.width - filled)
            text = f"denoise [{bar}] {done}/{progress.total}  {rate:.2f} steps/s  ETA {format_duration(eta)}"
        else:
            text = f"{progress.stage}: {progress.message}"
        if self.interactive:
            pad = max(0, self._last_len - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._last_len = len(text)
        elif progress.stage != "denoise" or progress.step in (0, progress.total) or progress.step % 10 == 0:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _newline(self) -> None:
        if self.interactive:
            self.stream.write("\n")
            self._last_len = 0

    def close(self) -> None:
        self._newline()
        self.stream.flush()
