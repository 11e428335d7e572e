"""Rank statistics: Spearman's correlation between what was asked for and what came out (evaluation, cohorts)."""

from __future__ import annotations

import numpy as np


def spearman(x, y, *, min_points: int = 0, constant: float = 0.0) -> float:
    """Spearman's rank correlation of ``x`` and ``y``.

    ``nan`` with fewer than ``min_points`` pairs (a cohort report draws no rho from two points); ``constant``
    when either side does not vary: the training evaluation scores a constant response 0.0 (it cannot follow
    the request), the cohort report shows it as no rho (``nan``)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < min_points:
        return float("nan")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return constant
    return float(spearmanr(x, y).statistic)
