"""Reliability: the share of volumes whose tissue maps pass the anatomy check, with its interval.

One record for the quality report (per setting, ``engine.quality.field``) and the cohort report (per cohort):
how many passed ("within normative ranges", ``engine.anatomy.checks``), of how many checked, the share, its
Wilson score interval (a bootstrap of 32 passes out of 32 would give the empty interval [1, 1]) and whether it
reaches the 95 % that Wu et al. found only 3 of 6 published brain generators reach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95
RELIABLE_SHARE = 0.95  # Wu et al.: the share of reliable segmentations a generator should reach
#: The anatomy-check status that counts as reliable (``engine.anatomy.checks``).
PASSED = "within"


def wilson(passed: int, count: int) -> tuple[float, float]:
    """The Wilson score interval (``CONFIDENCE``) of a share of ``passed`` out of ``count``."""
    if count == 0:
        return 0.0, 1.0
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - (1.0 - CONFIDENCE) / 2.0))
    p = passed / count
    centre = (p + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(p * (1 - p) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return max(0.0, centre - half), min(1.0, centre + half)


def share(statuses: Sequence[str]) -> dict[str, Any]:
    """A set's reliability: how many of its volumes passed the anatomy check, of how many, with an interval."""
    passed = sum(s == PASSED for s in statuses)
    low, high = wilson(passed, len(statuses))
    return {
        "passed": passed,
        "count": len(statuses),
        "share": passed / len(statuses) if statuses else None,
        "interval": [low, high],
        "interval_method": "Wilson score",
        "by_status": {s: sum(x == s for x in statuses) for s in sorted(set(statuses))},
        "reaches_95": bool(statuses) and passed / len(statuses) >= RELIABLE_SHARE,
    }
