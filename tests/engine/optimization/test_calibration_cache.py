"""int8 calibration is a one-off cost: measured once per model and machine, then read from the cache."""

from __future__ import annotations

import copy
import dataclasses

import torch

from engine.optimization import apply as optimization
from engine.optimization.apply import OptimizationConfig, prepare
from tests.engine.optimization.conftest import run_loop


def test_a_second_prepare_reads_the_ranges_and_gives_the_same_volume(tiny_loaded, cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    real = optimization._run_calibration
    monkeypatch.setattr(optimization, "_run_calibration", lambda *a, **k: calls.append(1) or real(*a, **k))
    config = OptimizationConfig(quantization="int8", decoder_quantization="int8")

    first = prepare(tiny_loaded, config, cpu, use_cache=False)
    assert not first.details["calibration"]["from_cache"]
    runs_first = len(calls)
    assert runs_first >= 2  # the U-Net's ranges, and the latent the decoder is calibrated on
    assert list((tmp_path / "volsynth" / "calibration").glob("*.json"))

    second = prepare(tiny_loaded, config, cpu, use_cache=False)
    assert second.details["calibration"]["from_cache"] and len(calls) == runs_first  # no calibration run
    assert "from the calibration cache" in second.report["quantization"]["reason"]
    assert torch.equal(run_loop(first, tiny_loaded.spec), run_loop(second, tiny_loaded.spec))

    # Other weights are another network: calibrated afresh.
    other = dataclasses.replace(tiny_loaded, unet=copy.deepcopy(tiny_loaded.unet))
    with torch.no_grad():
        next(other.unet.parameters()).add_(0.01)
    third = prepare(other, config, cpu, use_cache=False)
    assert not third.details["calibration"]["from_cache"] and len(calls) > runs_first


def test_a_damaged_cache_entry_is_measured_again(tiny_loaded, cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = OptimizationConfig(quantization="int8")
    prepare(tiny_loaded, config, cpu, use_cache=False)
    for path in (tmp_path / "volsynth" / "calibration").glob("*.json"):
        path.write_text("{not json")
    again = prepare(tiny_loaded, config, cpu, use_cache=False)
    assert not again.details["calibration"]["from_cache"]


def test_a_second_mixed_prepare_reads_the_plan_instead_of_searching(tiny_loaded, cpu, tmp_path, monkeypatch):
    from engine import quantization as q

    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(optimization, "CALIBRATION_STEPS", 2)  # a shorter search: the cache is the point
    searches = []
    real = q.mixed_precision_plan
    monkeypatch.setattr(q, "mixed_precision_plan", lambda *a, **k: searches.append(1) or real(*a, **k))
    config = OptimizationConfig(quantization="mixed", psnr_budget_db=30.0)

    first = prepare(tiny_loaded, config, cpu, use_cache=False)
    plan = first.details["mixed_plan"]
    assert len(searches) == 1 and not plan["from_cache"] and plan["search_s"] > 0
    assert "plan searched in" in first.report["quantization"]["reason"]

    second = prepare(tiny_loaded, config, cpu, use_cache=False)
    assert len(searches) == 1  # the second use reads the plan
    again = second.details["mixed_plan"]
    assert again["from_cache"] and again["search_s"] == plan["search_s"]  # the one-off cost, as measured
    assert again["quantized"] == plan["quantized"]
    assert again["sensitivity_psnr_db"] == plan["sensitivity_psnr_db"]
    assert "plan from the cache" in second.report["quantization"]["reason"]
    assert torch.equal(run_loop(first, tiny_loaded.spec), run_loop(second, tiny_loaded.spec))


def test_the_mixed_plan_key_is_the_weights_floor_machine_and_versions(tmp_path, monkeypatch):
    from engine import quantization as q
    from engine.optimization import calibration_cache

    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    searches = []

    def search():
        searches.append(1)
        return q.MixedPlan(["a"], ["b"], {"a": 50.0}, 45.0, 40.0, 3, {"a": 0.9, "b": 0.1})

    net = torch.nn.Linear(4, 4)
    facts = {"budget_db": 40.0, "layers": ["a", "b"]}
    machine = calibration_cache.machine_facts()
    assert machine["machine"] and machine["versions"]["torch"]

    plan, cached, _ = calibration_cache.mixed_plan(net, facts, search)
    assert not cached and len(searches) == 1
    again, cached, _ = calibration_cache.mixed_plan(net, facts, search)
    assert cached and len(searches) == 1 and again == plan
    calibration_cache.mixed_plan(net, {**facts, "budget_db": 35.0}, search)  # another PSNR floor
    assert len(searches) == 2
    other = torch.nn.Linear(4, 4)  # other weights
    calibration_cache.mixed_plan(other, facts, search)
    assert len(searches) == 3
    monkeypatch.setattr(calibration_cache, "machine_facts", lambda: {**machine, "machine": "another-cpu"})
    calibration_cache.mixed_plan(net, facts, search)
    assert len(searches) == 4
    newer = {**machine, "versions": {**machine["versions"], "torch": "9.0"}}
    monkeypatch.setattr(calibration_cache, "machine_facts", lambda: newer)
    calibration_cache.mixed_plan(net, facts, search)
    assert len(searches) == 5
    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "0")  # off: always searched
    calibration_cache.mixed_plan(net, facts, search)
    assert len(searches) == 6
