"""The one noise rule: when a measured speed difference between two settings may be called real.

These machines are shared and noisy, so a ratio of two medians alone says little: one busy second can make
a setting look 3x faster. Compare Settings, ``volsynth compare``, ``volsynth bench`` and ``volsynth tune``
all decide "faster", "slower" or "no clear difference" here, and nowhere else.

The rule, for time samples of a reference A and a candidate B (seconds, one per step or per run):

1. ratio = median(A) / median(B): B's speed as a multiple of A's (> 1: B is faster).
2. Its 95 % interval by bootstrap: both sample sets resampled with replacement (fixed seed, so the
   verdict is reproducible), the ratio of medians taken each time, the 2.5th and 97.5th percentiles kept.
3. Verdict:
   - **faster** when the whole interval lies above 1 and the ratio is at least ``1 + min_effect``;
   - **slower** when the whole interval lies below 1 and the ratio is at most ``1 / (1 + min_effect)``;
   - **same** when the whole interval lies within ``[1 / (1 + min_effect), 1 + min_effect]``;
   - **undecided** otherwise, or with fewer than ``min_samples`` samples on either side: measure more.

With three runs a side, B is called faster only when nearly every resample agrees, i.e. its runs beat A's
almost without overlap. Step times from one run are not independent (a busy spell slows several steps in a
row), so callers that have whole runs should judge on runs; per-step samples are fine for a first look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

MIN_EFFECT = 0.05  # differences under 5 % are never called faster or slower
MIN_SAMPLES = 3
BOOTSTRAP_RESAMPLES = 2000
_BOOTSTRAP_SEED = 20261201
VERDICTS = ("faster", "slower", "same", "undecided")


@dataclass(frozen=True)
class SpeedVerdict:
    """What the rule decided for one pair of sample sets; ``ratio`` is B's speed as a multiple of A's."""

    verdict: str
    ratio: float | None
    low: float | None
    high: float | None
    samples: tuple[int, int]
    min_effect: float = MIN_EFFECT
    min_samples: int = MIN_SAMPLES

    @property
    def too_few(self) -> bool:
        """True when either side has fewer samples than the rule needs (one run each, say)."""
        return min(self.samples) < self.min_samples

    @property
    def decided(self) -> bool:
        """True when the difference (or its absence) is real by the rule: faster, slower or same."""
        return self.verdict != "undecided"

    def words(self, what: str = "B", than: str = "A") -> str:
        """One line for people: "B is 1.42x as fast as A (95 % interval 1.31-1.55x; 12 vs 12 samples)"."""
        if self.ratio is None:
            return f"{what} vs {than}: not enough samples to compare ({self.samples[1]} vs {self.samples[0]})"
        if self.too_few:
            # A bootstrap of one sample a side has no spread to show: say why the rule cannot decide instead.
            return (
                f"too few samples to call: {what} at {self.ratio:.2f}x {than}'s speed from "
                f"{self.samples[1]} vs {self.samples[0]} sample(s), and the rule needs {self.min_samples} a "
                "side: measure more"
            )
        span = (
            f"95 % interval {self.low:.2f}-{self.high:.2f}x; {self.samples[1]} vs {self.samples[0]} samples"
        )
        if self.verdict == "faster":
            return f"{what} is {self.ratio:.2f}x as fast as {than} ({span})"
        if self.verdict == "slower":
            return f"{what} is slower than {than}: {self.ratio:.2f}x its speed ({span})"
        if self.verdict == "same":
            return (
                f"{what} and {than} run at the same speed within {100 * self.min_effect:.0f} % "
                f"({self.ratio:.2f}x; {span})"
            )
        return (
            f"no clear difference yet: {what} at {self.ratio:.2f}x {than}'s speed, but the noise allows "
            f"{self.low:.2f}-{self.high:.2f}x ({self.samples[1]} vs {self.samples[0]} samples): measure more"
        )

    def to_dict(self, what: str = "B", than: str = "A") -> dict:
        data = asdict(self)
        data["samples"] = list(self.samples)
        data["words"] = self.words(what, than)
        return data


def speed_verdict(
    reference_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    min_effect: float = MIN_EFFECT,
    min_samples: int = MIN_SAMPLES,
) -> SpeedVerdict:
    """Apply the noise rule (module docstring) to times of a reference A and a candidate B."""
    a = np.asarray([t for t in reference_s if t is not None and math.isfinite(t) and t > 0], dtype=float)
    b = np.asarray([t for t in candidate_s if t is not None and math.isfinite(t) and t > 0], dtype=float)
    counts = (len(a), len(b))
    if min(counts) == 0:
        return SpeedVerdict("undecided", None, None, None, counts, min_effect, min_samples)
    ratio = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    a_med = np.median(a[rng.integers(0, len(a), size=(BOOTSTRAP_RESAMPLES, len(a)))], axis=1)
    b_med = np.median(b[rng.integers(0, len(b), size=(BOOTSTRAP_RESAMPLES, len(b)))], axis=1)
    low, high = (float(v) for v in np.percentile(a_med / b_med, [2.5, 97.5]))
    return _decide(ratio, low, high, counts, min_effect, min_samples)


def paired_speed_verdict(
    reference_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    min_effect: float = MIN_EFFECT,
    min_samples: int = MIN_SAMPLES,
) -> SpeedVerdict:
    """The noise rule for a candidate projected from the reference's own runs (sample i of B computed from run i
    of A, e.g. a shorter schedule from fp32's steps): the runs' load is shared, so the interval is the range of
    the per-run ratios instead of a bootstrap of two independent sets."""
    pairs = [
        (x, y)
        for x, y in zip(reference_s, candidate_s, strict=True)
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and x > 0 and y > 0
    ]
    counts = (len(pairs), len(pairs))
    if not pairs:
        return SpeedVerdict("undecided", None, None, None, counts, min_effect, min_samples)
    ratios = [x / y for x, y in pairs]
    return _decide(float(np.median(ratios)), min(ratios), max(ratios), counts, min_effect, min_samples)


def _decide(
    ratio: float, low: float, high: float, counts: tuple[int, int], min_effect: float, min_samples: int
) -> SpeedVerdict:
    """The verdict from the ratio and its interval (module docstring, step 3)."""
    band = 1.0 + min_effect
    if min(counts) < min_samples:
        verdict = "undecided"
    elif low > 1.0 and ratio >= band:
        verdict = "faster"
    elif high < 1.0 and ratio <= 1.0 / band:
        verdict = "slower"
    elif low >= 1.0 / band and high <= band:
        verdict = "same"
    else:
        verdict = "undecided"
    return SpeedVerdict(verdict, ratio, low, high, counts, min_effect, min_samples)
