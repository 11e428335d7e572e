"""A terminal progress line for long jobs: bar, step i/N, steps per second, ETA. Writes to stderr."""

from __future__ import annotations

import sys
import time

from engine.formatting import format_duration


class ProgressLine:
    def __init__(self, stream=None, width: int = 28):
        self.stream = stream or sys.stderr
        self.width = width
        self.stage = ""
        self.stage_started = time.perf_counter()
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_len = 0

    def update(self, progress) -> None:
        now = time.perf_counter()
        if progress.stage != self.stage:
            if self.stage:
                self._newline()
            self.stage, self.stage_started = progress.stage, now
        if progress.stage == "denoise" and progress.total:
            done = progress.step
            elapsed = now - self.stage_started
            rate = done / elapsed if elapsed > 0 and done else 0.0
            eta = (progress.total - done) / rate if rate else 0.0
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
