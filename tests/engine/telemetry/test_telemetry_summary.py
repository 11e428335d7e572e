"""Run summaries on synthetic samples whose answers are known by hand."""

from __future__ import annotations

import json

import pytest

from engine.telemetry import RunAccumulator, summarize_run
from tests.engine.telemetry.synthetic import make_sample


def test_energy_is_the_trapezoid_integral_of_power():
    # Power 100, 200, 200, 0, 100 W at t = 0..4 s: trapezoids 150 + 200 + 100 + 50 = 500 J.
    powers = [100.0, 200.0, 200.0, 0.0, 100.0]
    samples = [
        make_sample(float(t), p, util=10.0 * t, memory_used=1000 + 10 * t) for t, p in enumerate(powers)
    ]
    summary = summarize_run(samples, "synthetic")
    assert summary["energy_j"] == pytest.approx(500.0)
    assert summary["duration_s"] == pytest.approx(4.0)
    assert summary["samples"] == 5
    assert summary["mean_gpu_util_pct"] == pytest.approx(20.0)  # mean of 0, 10, 20, 30, 40
    assert summary["peak_gpu_memory_bytes"] == 1040
    gpu = summary["gpus"][0]
    assert gpu["energy_complete"] is True
    assert gpu["mean_power_w"] == pytest.approx(125.0)
    assert summary["cpu"] == {
        "mean_cpu_pct": 10.0,
        "peak_process_rss_bytes": 100,
        "peak_ram_used_bytes": None,
    }


def test_uneven_intervals_are_weighted_by_time():
    # 0 s: 100 W, 0.5 s: 100 W, 3.5 s: 300 W -> 50 + 3 * 200 = 650 J.
    samples = [make_sample(0.0, 100.0), make_sample(0.5, 100.0), make_sample(3.5, 300.0)]
    assert summarize_run(samples)["energy_j"] == pytest.approx(650.0)


def test_window_edges_interpolate_inside_and_hold_outside():
    # Power ramps 0 -> 400 W over 0..4 s. Run from 1 s to 5 s:
    # 1..4 s under the ramp = (100 + 400) / 2 * 3 = 750 J, then 4..5 s holding 400 W = 400 J.
    samples = [make_sample(float(t), 100.0 * t) for t in range(5)]
    summary = summarize_run(samples, start=1.0, end=5.0)
    assert summary["energy_j"] == pytest.approx(1150.0)
    assert summary["duration_s"] == pytest.approx(4.0)
    assert summary["samples"] == 4  # the 0 s sample only anchors the interpolation


def test_previous_sample_anchors_a_run_that_starts_between_samples():
    accumulator = RunAccumulator("r", start=0.5, started_at=10.5, previous=make_sample(0.0, 100.0))
    accumulator.add(make_sample(1.0, 300.0))
    summary = accumulator.finish(end=1.0)
    # The line from (0, 100) to (1, 300) over 0.5..1 s: (200 + 300) / 2 * 0.5 = 125 J.
    assert summary["energy_j"] == pytest.approx(125.0)
    assert summary["started_at"] == 10.5 and summary["ended_at"] == pytest.approx(11.0)


def test_a_run_shorter_than_one_interval_still_gets_energy():
    accumulator = RunAccumulator("short", start=0.1, previous=make_sample(0.0, 200.0))
    summary = accumulator.finish(end=0.2)
    assert summary["samples"] == 0
    assert summary["energy_j"] == pytest.approx(20.0)  # 200 W held for 0.1 s


def test_power_gap_is_not_counted_and_flags_incomplete():
    samples = [
        make_sample(0.0, 100.0),
        make_sample(1.0, 100.0),
        make_sample(2.0, util=50.0),
        make_sample(3.0, 100.0),
    ]
    summary = summarize_run(samples)
    assert summary["energy_j"] == pytest.approx(100.0)  # only 0..1 s is known
    assert summary["gpus"][0]["energy_complete"] is False


def test_energy_counter_delta_is_reported_in_joules():
    samples = [make_sample(float(t), 100.0, energy_mj=1_000_000 + 100_000 * t) for t in range(3)]
    assert summarize_run(samples)["gpus"][0]["energy_counter_j"] == pytest.approx(200.0)


def test_no_gpu_run_has_cpu_figures_and_a_reason():
    samples = [make_sample(float(t), cpu=20.0 + t, rss=100 + t) for t in range(3)]
    summary = summarize_run(samples, "cpu-only")
    assert summary["gpu_available"] is False
    assert summary["gpu_reason"] == "no NVIDIA GPU: synthetic"
    assert summary["energy_j"] is None and summary["mean_gpu_util_pct"] is None and summary["gpus"] == []
    assert summary["cpu"]["mean_cpu_pct"] == pytest.approx(21.0)
    assert summary["cpu"]["peak_process_rss_bytes"] == 102
    json.dumps(summary, allow_nan=False)  # provenance-ready: plain JSON, no NaN


def test_finish_is_idempotent_and_closes_the_run():
    accumulator = RunAccumulator("r")
    accumulator.add(make_sample(0.0, 100.0))
    accumulator.add(make_sample(1.0, 100.0))
    first = accumulator.finish(end=2.0)
    accumulator.add(make_sample(3.0, 100.0))
    assert accumulator.finish(end=9.0) == first
    assert first["energy_j"] == pytest.approx(200.0)
