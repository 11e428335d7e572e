"""Numbers for people: byte counts, durations and counts of things, written one way in the CLI, the server
and the app."""

from __future__ import annotations

import math
import re


def format_bytes(count: float | None, *, decimal: bool = False, sep: str = " ") -> str:
    """The project's one byte formatter: ``20.0 GiB``, ``512 MiB``; ``n/a`` for ``None``.

    ``decimal=True`` writes SI units with at most three significant digits (``1.25 GB``, ``13 MB``), for numbers
    that are decimal at their source (the XLA planner's memory, the vault CLI's sizes). ``sep`` goes between
    number and unit (the Plan table passes a no-break space so a wrapped cell keeps them together)."""
    if count is None:
        return "n/a"
    if decimal:
        for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if count >= size:
                return f"{significant(count / size)}{sep}{unit}"
        return f"{count:.0f}{sep}B"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            value = count / size
            return f"{value:.1f}{sep}{unit}" if value < 100 else f"{value:.0f}{sep}{unit}"
    return f"{count:.0f}{sep}B"


def significant(value: float) -> str:
    """At most three significant digits, no exponent: 0.03261 -> 0.0326, 103.4 -> 103, 1234 -> 1234, 1.0 -> 1."""
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 1.00 -> 1: no precision we lack


def format_duration(seconds: float) -> str:
    """``0:07``, ``12:30``, ``1:02:03`` (whole seconds, rounded up so a countdown never shows 0:00 early)."""
    seconds = max(0, int(math.ceil(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rough_duration(seconds: float) -> str:
    """An estimate's length, as rough as it is: ``5 s``, ``40 s``, ``2 min``, ``1 h 05 min``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{max(1, math.ceil(seconds))} s"
    if seconds < 90:
        return f"{5 * math.ceil(seconds / 5):.0f} s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def ordinal(number: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def count_of(count: int, noun: str, plural: str | None = None) -> str:
    """``1 volume``, ``3 volumes``, ``0 volumes``: the count with its noun in the number it needs."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


# ESC-introduced sequences: CSI (ESC [ ... final byte), OSC/DCS/SOS/PM/APC strings (ESC ] P X ^ _ ... up to
# BEL or ESC \), and two-byte escapes; then every other C0/C1 control and the bidirectional overrides.
_ESCAPES = re.compile(
    r"[\x1b]\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x1b\x9b\x9d\x90\x98\x9e\x9f][\]PX^_]?[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]?"
)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str, *, newlines: bool = True) -> str:
    """``text`` from an untrusted source (a hub, a catalogue, a model's metadata) with no escape or control
    sequences: nothing in it can move the cursor, retitle the window, write the clipboard (OSC 52) or
    reorder what is shown. Tabs are kept; newlines too unless ``newlines`` is False (then they are spaces)."""
    text = _CONTROLS.sub("", _ESCAPES.sub("", str(text)))
    return text if newlines else text.replace("\n", " ").replace("\r", " ")
