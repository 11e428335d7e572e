"""Numbers for people: byte counts and durations, written one way in the CLI, the server and the app."""

from __future__ import annotations

import math


def format_bytes(count: float | None) -> str:
    """``20.0 GiB``, ``512 MiB``; ``n/a`` for ``None``."""
    if count is None:
        return "n/a"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            value = count / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{count:.0f} B"


def format_duration(seconds: float) -> str:
    """``0:07``, ``12:30``, ``1:02:03`` (whole seconds, rounded up so a countdown never shows 0:00 early)."""
    seconds = max(0, int(math.ceil(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
