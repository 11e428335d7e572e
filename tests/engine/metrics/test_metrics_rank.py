"""engine.metrics.rank.spearman is the one Spearman: the training evaluation's and the cohort report's rules."""

import math

import pytest

from engine.metrics.rank import spearman


def test_spearman_follows_the_ranks():
    assert spearman([2, 3, 4, 5], [1.0, 2.5, 2.6, 9.0]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_a_constant_response_scores_what_the_caller_says():
    assert spearman([2, 3, 4, 5], [1.0, 1.0, 1.0, 1.0]) == 0.0  # the evaluation: it cannot follow the request
    assert math.isnan(spearman([1, 2, 3], [4, 4, 4], min_points=3, constant=float("nan")))  # the report


def test_too_few_points_give_no_rho():
    assert math.isnan(spearman([1, 2], [1, 2], min_points=3))


def test_the_users_import_the_one_spearman():
    from engine.cohort import report
    from engine.training import evaluate

    assert evaluate.spearman is spearman and report.spearman is spearman


def test_one_peak_memory_reader_per_question():
    """engine.machine.peak_memory holds the readers; the bench and the evaluation use them."""
    import torch

    from engine.machine import peak_memory
    from engine.measure import bench
    from engine.training import evaluate

    peak, kind = peak_memory.device_peak_bytes(torch.device("cpu"))
    assert kind == "process_rss" and peak == peak_memory.peak_rss_bytes() > 0
    assert peak_memory.process_peak_rss_bytes() > 0
    assert bench.device_peak_bytes is peak_memory.device_peak_bytes
    assert evaluate.process_peak_rss_bytes is peak_memory.process_peak_rss_bytes
