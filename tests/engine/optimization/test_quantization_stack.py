"""The int8 stack itself: oneDNN int8 Conv3d and Linear against fp32, the legacy API's presence, torchao's
silent import, 7-bit activations where the CPU has no VNNI, float8 Conv3d refused on a CPU."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.metrics.image import psnr
from engine.quantization import (
    Calibration,
    DynamicInt8Linear,
    Int8Conv3d,
    candidate_layers,
    int8_dot_has_vnni,
    quantize_int8,
)

REPO = Path(__file__).resolve().parents[3]


class TinyBlock(nn.Module):
    """Conv3d -> GroupNorm -> SiLU -> strided Conv3d -> a Linear over channels (attention-like), residual."""

    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv3d(4, 32, 3, padding=1)
        self.norm = nn.GroupNorm(8, 32)
        self.down = nn.Conv3d(32, 32, 3, stride=2, padding=1)
        self.proj = nn.Linear(32, 32)
        self.conv_out = nn.Conv3d(32, 4, 1)

    def forward(self, x):
        h = nn.functional.silu(self.norm(self.conv_in(x)))
        h = self.down(h)
        b, c, *space = h.shape
        tokens = h.flatten(2).transpose(1, 2)
        h = h + self.proj(tokens).transpose(1, 2).reshape(b, c, *space)
        return self.conv_out(h)


def _calibrated(model, x):
    calibration = Calibration()
    handles = calibration.attach(model, candidate_layers(model))
    with torch.inference_mode():
        model(x)
    for handle in handles:
        handle.remove()
    return calibration


def test_int8_tiny_model_runs_integer_kernels_and_stays_within_a_psnr_floor(monkeypatch):
    monkeypatch.setattr("engine.quantization.MIN_INT8_LINEAR_MACS", 0)  # this Linear is tiny: int8 anyway
    torch.manual_seed(0)
    model = TinyBlock().eval()
    x = torch.randn(2, 4, 12, 12, 12)
    with torch.inference_mode():
        reference = model(x)
    quantized = copy.deepcopy(model)
    done = quantize_int8(quantized, _calibrated(model, x), candidate_layers(model))
    assert set(done) == {"conv_in", "down", "proj", "conv_out"}
    assert isinstance(quantized.conv_in, Int8Conv3d) and isinstance(quantized.proj, DynamicInt8Linear)
    assert quantized.conv_in.weight_int8.dtype == quantized.proj.weight_int8.dtype == torch.int8
    calls = {"qconv": 0, "qlinear": 0}
    real_qconv, real_qlinear = torch.ops.onednn.qconv_pointwise, torch.ops.onednn.qlinear_pointwise

    def counting_qconv(*args):
        calls["qconv"] += 1
        return real_qconv(*args)

    def counting_qlinear(*args):
        calls["qlinear"] += 1
        return real_qlinear(*args)

    monkeypatch.setattr(torch.ops.onednn, "qconv_pointwise", counting_qconv)
    monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", counting_qlinear)
    with torch.inference_mode():
        out = quantized(x)
    assert calls == {"qconv": 3, "qlinear": 1}
    assert out.shape == reference.shape
    assert psnr(reference, out) >= 35.0


def test_int8_conv3d_with_other_padding_and_copies_is_the_same_function():
    torch.manual_seed(1)
    conv = nn.Conv3d(8, 16, 3, padding=1).eval()
    model = nn.Sequential(conv)
    x = torch.randn(1, 8, 6, 7, 5)
    layer = Int8Conv3d(conv, _calibrated(model, x).ranges["0"])
    with torch.inference_mode():
        full = layer(x)
        # the streamed decoder pads the first axis itself: zero rows, then padding (0, 1, 1)
        rows = layer.with_padding((0, 1, 1))(nn.functional.pad(x, (0, 0, 0, 0, 1, 1)))
        copied = copy.deepcopy(layer)(x)  # the packed oneDNN weight cannot be copied: it is rebuilt
    assert torch.equal(full, rows)
    assert torch.equal(full, copied)
    assert layer.with_padding((0, 1, 1)) is layer.with_padding((0, 1, 1))


def test_no_vnni_means_7_bit_activations(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not int8_dot_has_vnni()
    conv = nn.Conv3d(4, 4, 3, padding=1)
    layer = Int8Conv3d(conv, _calibrated(nn.Sequential(conv), torch.randn(1, 4, 4, 4, 4)).ranges["0"])
    assert layer.reduce_range and DynamicInt8Linear(nn.Linear(4, 4)).reduce_range
    assert int(layer.quantize_input(torch.full((1, 4, 2, 2, 2), 1e6)).max()) == 127


@pytest.mark.slow
def test_under_the_avx2_stand_in_the_default_avoids_int16_saturation():
    """With oneDNN capped at AVX2 (no VNNI) full 8-bit activations saturate; the default (7 bits) does not."""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2", PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_int8_saturation.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.strip().splitlines()]
    (_, full_flag, full_db), (_, default_flag, default_db) = rows
    assert full_flag == "False" and default_flag == "True"
    assert float(default_db) >= 50.0
    assert float(default_db) > float(full_db) + 10.0  # saturation is real on this ISA, and avoided


@pytest.mark.slow
def test_torchao_imports_without_a_word_to_the_user():
    """torchao logs 'Failed to load ..._C_mxfp8...so' and a pytree deprecation at import; nobody sees them."""
    pytest.importorskip("torchao")  # the `torchao` extra (float8 Conv3d on Hopper, the bench's rows)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("child_torchao_quiet.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert done.stderr == ""


def test_float8_conv3d_is_refused_on_a_cpu_with_the_reason():
    from engine.quantization import torchao_support

    ok, why = torchao_support.fp8_conv3d_support(torch.device("cpu"))
    assert not ok
    assert "9.0" in why and "cpu" in why
    with pytest.raises(ValueError, match="Hopper"):
        torchao_support.quantize_fp8_conv3d(nn.Conv3d(16, 16, 3), 1.0, torch.device("cpu"))
    # quantize_fp8 with a calibration on a CPU: no Linear is fp8-eligible here and no Conv3d is touched
    from engine.quantization import quantize_fp8

    conv = nn.Conv3d(16, 16, 3, padding=1)
    model = nn.Sequential(conv)
    assert quantize_fp8(model, _calibrated(model, torch.randn(1, 16, 4, 4, 4)), torch.device("cpu")) == []
    assert model[0] is conv and conv.weight.dtype == torch.float32


def test_the_legacy_torch_ao_int8_api_is_still_there():
    """FAILS (does not skip) the day torch removes the deprecated quantized-tensor API.

    Then remove engine/quantization/legacy.py and the ``legacy`` row of benchmarks.int8_kernels: the engine
    itself does not run on it (it was measured slower than the oneDNN path: `python -m benchmarks.int8_kernels`).
    """
    from engine.quantization import legacy

    assert legacy.missing_apis() == [], (
        f"torch {torch.__version__} removed {legacy.missing_apis()}: delete engine/quantization/legacy.py "
        "and the 'legacy' row of benchmarks.int8_kernels"
    )
    torch.manual_seed(2)
    conv = nn.Conv3d(8, 8, 3, padding=1).eval()
    x = torch.randn(1, 8, 6, 6, 6)
    layer = legacy.LegacyInt8Conv3d(conv, _calibrated(nn.Sequential(conv), x).ranges["0"])
    with torch.inference_mode():
        assert psnr(conv(x), layer(x)) >= 30.0


def test_the_mixed_search_stops_at_once_when_every_layer_in_int8_meets_the_budget(monkeypatch):
    """The bundle-sized U-Net put all 27 searched layers in int8 after 33 sampling runs (1999 s at 8x12x8,
    hours at full size); the search now tries that plan first, and ranks layers only when it misses."""
    from engine.quantization import mixed_precision_plan

    monkeypatch.setattr("engine.quantization.MIN_INT8_LINEAR_MACS", 0)
    torch.manual_seed(0)
    model = TinyBlock().eval()
    x = torch.randn(2, 4, 12, 12, 12)
    calibration = _calibrated(model, x)
    runs = []

    def run(module):
        runs.append(module)
        with torch.inference_mode():
            return module(x)

    names = candidate_layers(model)
    easy = mixed_precision_plan(model, calibration, names, 20.0, run, run, min_share=0.0)
    assert set(easy.quantized) == set(names) and easy.kept == [] and easy.sensitivity_db == {}
    assert easy.evaluations == len(runs) == 2 and easy.achieved_psnr_db >= 20.0
    with torch.inference_mode():  # what it reports is what that plan gives
        check = copy.deepcopy(model)
        quantize_int8(check, calibration, easy.quantized)
        assert psnr(model(x), check(x)) == pytest.approx(easy.achieved_psnr_db)
    # A budget every layer in int8 misses: the per-layer search runs, and keeps some layer in float.
    runs.clear()
    hard = mixed_precision_plan(
        model, calibration, names, easy.achieved_psnr_db + 3.0, run, run, min_share=0.0
    )
    assert hard.kept and set(hard.sensitivity_db) == set(names)
    assert hard.evaluations == len(runs) and hard.achieved_psnr_db >= easy.achieved_psnr_db + 3.0
