"""The measuring harness: the repeat order, median and IQR, and that bench, tune, compare and the benchmarks
use this one definition of each."""

from __future__ import annotations

import math

import numpy as np


def test_each_repeat_runs_every_row_once_and_the_first_row_moves_on():
    from engine.measure.harness import interleaved, rotated

    rows = ["fp32", "bf16", "int8"]
    assert [rotated(rows, repeat) for repeat in range(4)] == [
        ["fp32", "bf16", "int8"],
        ["bf16", "int8", "fp32"],
        ["int8", "fp32", "bf16"],
        ["fp32", "bf16", "int8"],
    ]
    assert rotated([], 3) == []
    assert list(interleaved(rows, 2)) == [
        (0, "fp32"),
        (0, "bf16"),
        (0, "int8"),
        (1, "bf16"),
        (1, "int8"),
        (1, "fp32"),
    ]
    assert list(interleaved(rows, 0)) == []


def test_median_and_iqr_are_numpys_linear_percentiles():
    from engine.measure.harness import iqr, median_iqr

    values = [4.0, 1.0, 3.0, 2.0, 10.0]
    assert median_iqr(values) == (3.0, 2.0)  # 75th percentile 4, 25th 2
    assert median_iqr([5.0]) == (5.0, 0.0)
    assert iqr([]) == 0.0  # a row with no timed samples reports no spread rather than failing
    assert math.isclose(
        iqr([0.1, 0.2, 0.3, 0.4]), float(np.subtract(*np.percentile([0.1, 0.2, 0.3, 0.4], [75, 25])))
    )


def test_measuring_code_takes_its_repeats_statistics_and_verdicts_from_the_harness():
    """One definition of each: a second copy would make these names point elsewhere."""
    from benchmarks import gpu_check, int8_kernels, maisi
    from engine import compare
    from engine.measure import bench, harness, tune
    from engine.metrics import speed_verdict, spread

    assert harness.median_iqr is spread.median_iqr and harness.iqr is spread.iqr
    assert harness.speed_verdict is speed_verdict.speed_verdict
    assert bench.interleaved is harness.interleaved and bench.median_iqr is spread.median_iqr
    assert bench.speed_verdict is speed_verdict.speed_verdict
    assert tune.rotated is harness.rotated and tune.median_iqr is spread.median_iqr
    assert tune.speed_verdict is speed_verdict.speed_verdict
    assert compare.median_iqr is spread.median_iqr
    assert int8_kernels.interleaved is harness.interleaved and int8_kernels.median_iqr is spread.median_iqr
    assert gpu_check.iqr is maisi.iqr is spread.iqr
