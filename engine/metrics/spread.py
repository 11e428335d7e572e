"""Median and interquartile range: how every timing table sums up its samples (``volsynth bench``,
``volsynth tune``, ``volsynth compare``, the benchmarks), defined once so an IQR means the same in each.

Here, beside the noise rule (:mod:`engine.metrics.speed_verdict`), rather than in the measuring harness
(:mod:`engine.measure.harness`, which hands both on): ``engine.compare`` sits below the measuring code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def iqr(values: Sequence[float]) -> float:
    """The 75th minus the 25th percentile (numpy's linear interpolation); 0 for no samples."""
    if not len(values):
        return 0.0
    high, low = np.percentile(values, [75, 25])
    return float(high - low)


def median_iqr(values: Sequence[float]) -> tuple[float, float]:
    """(median, IQR) of ``values``."""
    return float(np.median(values)), iqr(values)
