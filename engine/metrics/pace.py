"""The one rate-and-time-left rule for a run in progress: units done per second since it began, and the
seconds the rest takes at that rate.

The CLI's progress line (steps/s), the app's progress model (it/s) and the cohort runner (volumes/min) all
ask here. Light on purpose (no numpy, no torch): the CLI imports it at start-up.
"""

from __future__ import annotations


def pace(done: float, elapsed_s: float, remaining: float) -> tuple[float | None, float | None]:
    """(units per second, seconds left) after ``done`` units in ``elapsed_s`` with ``remaining`` to go.

    Both are None until something is done in a measurable time: a rate from nothing would be a guess. The
    time left is never negative.
    """
    if done <= 0 or elapsed_s <= 0:
        return None, None
    rate = done / elapsed_s
    return rate, max(0.0, remaining / rate)
