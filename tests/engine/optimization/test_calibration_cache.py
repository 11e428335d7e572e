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
