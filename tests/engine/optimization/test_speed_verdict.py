"""The one noise rule (engine.metrics.speed_verdict): faster, slower, same and undecided on known samples."""

import numpy as np
import pytest

from engine.metrics.speed_verdict import speed_verdict


def _noisy(centre: float, n: int, spread: float, seed: int) -> list[float]:
    return list(centre * (1 + spread * np.random.default_rng(seed).standard_normal(n)))


def test_clear_speed_up_is_faster():
    v = speed_verdict(_noisy(1.0, 12, 0.02, 1), _noisy(0.5, 12, 0.02, 2))
    assert v.verdict == "faster"
    assert v.ratio == pytest.approx(2.0, rel=0.05)
    assert v.low > 1.0
    assert "2.0" in v.words() and "as fast as" in v.words()


def test_clear_slow_down_is_slower():
    v = speed_verdict(_noisy(1.0, 6, 0.02, 3), _noisy(3.0, 6, 0.02, 4))
    assert v.verdict == "slower"
    assert v.high < 1.0


def test_equal_quiet_samples_are_same():
    v = speed_verdict(_noisy(1.0, 30, 0.01, 5), _noisy(1.0, 30, 0.01, 6))
    assert v.verdict == "same"


def test_one_lucky_run_on_a_noisy_machine_is_undecided():
    # The trap the Compare window fell into: B's median looks 3.8x faster only because A hit a busy spell.
    a = [1.0, 4.0, 4.1, 0.9, 4.2]
    b = [1.0, 1.05, 0.95, 1.1, 1.0]
    v = speed_verdict(a, b)
    assert v.ratio > 3.5
    assert v.verdict == "undecided"
    assert "measure more" in v.words()


def test_too_few_samples_never_decide():
    v = speed_verdict([1.0, 1.0], [0.1, 0.1])
    assert v.verdict == "undecided" and not v.decided
    assert speed_verdict([], [1.0]).ratio is None


def test_small_differences_are_never_called_faster():
    v = speed_verdict(_noisy(1.0, 200, 0.001, 7), _noisy(0.97, 200, 0.001, 8))
    assert v.verdict != "faster"  # 3 % is under the 5 % minimum effect


def test_verdict_is_reproducible():
    a, b = _noisy(1.0, 5, 0.2, 9), _noisy(0.8, 5, 0.2, 10)
    assert speed_verdict(a, b) == speed_verdict(a, b)


def test_a_projection_from_the_same_runs_is_judged_as_pairs():
    """Runs under different load (1 s, 3 s, 9 s) projected to 60 % of each: independent resampling sees the
    load's spread and cannot call it, the pairs share their run's load and are 1.67x faster in every run."""
    from engine.metrics.speed_verdict import paired_speed_verdict

    reference = [1.0, 3.0, 9.0]
    projected = [0.6 * t for t in reference]
    assert speed_verdict(reference, projected).verdict == "undecided"
    paired = paired_speed_verdict(reference, projected)
    assert paired.verdict == "faster" and paired.low == pytest.approx(1 / 0.6)
    assert paired_speed_verdict(reference, [0.99 * t for t in reference]).verdict == "same"
    assert paired_speed_verdict([1.0, 2.0], [0.5, 1.0]).verdict == "undecided"  # too few runs
