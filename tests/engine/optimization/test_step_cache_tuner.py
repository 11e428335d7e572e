"""The tuner recommends a step-caching or shorter-schedule row only when its quality verdict holds."""

from __future__ import annotations

import math

from engine.measure.tune import opt_in_rows
from engine.optimization import tune_store


def _row(name, e2e, config=None, quality=None, **extra):
    return {
        "name": name,
        "config": config or {},
        "end_to_end_s": e2e,
        "end_to_end_verdict": {"verdict": "same" if name == "fp32" else "faster"},
        "psnr_db": math.inf if name == "fp32" else 45.0,
        **({"quality": quality} if quality is not None else {}),
        **extra,
    }


CACHED = {"step_cache_interval": 3, "step_cache_level": 1}
WITHIN = {"verdict": "within seed-to-seed variation", "within_noise": True}
SHIFTS = {"verdict": "shifts the distribution: tissue volumes", "within_noise": False}


def test_a_fidelity_trading_row_needs_a_quality_verdict_that_holds():
    base = [_row("fp32", 10.0), _row("int8", 6.0, {"quantization": "int8"})]
    for quality in (None, SHIFTS, {"verdict": "too few seeds to tell", "within_noise": False}):
        rows = [*base, _row("cache:k3-l1", 4.0, CACHED, quality)]
        assert tune_store.recommendation({"rows": rows})["name"] == "int8"
    rows = [*base, _row("cache:k3-l1", 4.0, CACHED, WITHIN)]
    assert tune_store.recommendation({"rows": rows})["name"] == "cache:k3-l1"
    # A shorter schedule is gated alike, and advised apart: its settings are fp32's, so it is never the
    # recommended settings (a preset cannot carry a number of steps); the model's own default steps are not.
    short = _row("steps:25", 3.0, steps=25, default_steps=50)
    assert tune_store.recommendation({"rows": [*base, short]})["name"] == "int8"
    assert tune_store.schedule_advice({"rows": [*base, short]}) is None
    with_verdict = {"rows": [*base, {**short, "quality": WITHIN}]}
    assert tune_store.recommendation(with_verdict)["name"] == "int8"
    assert tune_store.schedule_advice(with_verdict)["name"] == "steps:25"
    assert tune_store.schedule_advice({"rows": [*base, {**short, "quality": SHIFTS}]}) is None
    # The verdict volsynth quality kept for the row (the tune result's quality block) counts too.
    kept = {"rows": [*base, _row("cache:k3-l1", 4.0, CACHED)], "quality": {"cohort": {"cache:k3-l1": WITHIN}}}
    assert tune_store.recommendation(kept)["name"] == "cache:k3-l1"
    kept["quality"]["cohort"]["cache:k3-l1"] = SHIFTS
    assert tune_store.recommendation(kept)["name"] == "int8"
    default = _row("ddim-50", 3.0, steps=50, default_steps=50)
    assert not tune_store.trades_fidelity(default)
    assert tune_store.recommendation({"rows": [*base, default]})["name"] == "ddim-50"


def test_caching_rows_are_measured_only_when_asked_for():
    names = [name for name, _ in opt_in_rows()]
    assert "cache:k3-l1" in names
    assert all(values["step_cache_interval"] > 1 for _, values in opt_in_rows())
