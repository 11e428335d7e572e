"""The decoder's own optimization settings: validated, reported, applied to the full and the streamed decode."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.errors import InvalidRequest
from engine.metrics.image import psnr
from engine.optimization.apply import OptimizationConfig, decoder_calibration_latent, prepare
from engine.optimization.streamed_decode import SubpixelUpsample, streamed_decode


@pytest.fixture(scope="module")
def latent(tiny_loaded):
    spec = tiny_loaded.spec
    noise = torch.Generator().manual_seed(5)
    return torch.randn((1, *spec.latent_shape), generator=noise) / spec.scale_factor


@pytest.fixture
def short_calibration(monkeypatch):
    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 1)


def _streamed(tiny_loaded, fields, cpu):
    return prepare(tiny_loaded, OptimizationConfig(streamed_decode=True, **fields), cpu, use_cache=False)


# -- the settings as data ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"decoder_autocast": "int4"}, "decoder autocast"),
        ({"decoder_quantization": "fp8"}, "decoder quantization"),
        ({"decoder_quantization": "int8", "decoder_autocast": "fp16"}, "bf16"),
        ({"decoder_quantization": "mixed", "autocast": "fp16"}, "bf16"),
        ({"decoder_psnr_budget_db": 5.0}, "decoder PSNR budget"),
        ({"decoder_channels_last": "yes"}, "true or false"),
    ],
)
def test_bad_decoder_settings_are_refused(fields, words):
    with pytest.raises(InvalidRequest, match=words):
        OptimizationConfig(**fields)


def test_decoder_settings_round_trip_and_stay_out_of_requests_that_do_not_use_them():
    plain = OptimizationConfig(autocast="bf16", streamed_decode=True)
    assert not any(k.startswith("decoder_") for k in plain.to_dict())  # what older clients and servers read
    assert OptimizationConfig.from_dict(plain.to_dict()) == plain
    config = OptimizationConfig(
        decoder_autocast="bf16",
        decoder_quantization="mixed",
        decoder_channels_last=True,
        streamed_decode=True,
    )
    data = json.loads(json.dumps(config.to_dict()))
    assert data["decoder_psnr_budget_db"] == 40.0 and data["decoder_quantization"] == "mixed"
    assert OptimizationConfig.from_dict(data) == config
    assert config.summary() == "streamed+dec:bf16-mixed-cl"


# -- reported and applied -----------------------------------------------------------------------------


def test_decoder_settings_are_reported_and_applied_on_a_copy(tiny_loaded, cpu, latent):
    config = OptimizationConfig(decoder_autocast="bf16", decoder_channels_last=True)
    prepared = prepare(tiny_loaded, config, cpu, use_cache=False)
    report = prepared.report
    assert report["decoder_autocast"]["applied"] and "sub-pixel" in report["decoder_autocast"]["reason"]
    assert report["decoder_channels_last"]["applied"]
    assert report["decoder_quantization"] == {"requested": None, "applied": False, "reason": ""}
    assert prepared.unet is tiny_loaded.unet  # U-Net settings untouched: no copy
    blocks = prepared.autoencoder.decoder.blocks
    assert any(isinstance(b, SubpixelUpsample) for b in blocks)
    assert not any(isinstance(b, SubpixelUpsample) for b in tiny_loaded.autoencoder.decoder.blocks)
    conv = blocks[-1].conv
    assert conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    seen = []
    handle = conv.register_forward_hook(lambda _m, _args, out: seen.append(out.dtype))
    try:
        volume = prepared.decode(latent)
    finally:
        handle.remove()
    assert seen == [torch.bfloat16]  # autocast reached the decoder's last convolution
    assert volume.dtype == torch.float32
    with torch.inference_mode():
        reference = tiny_loaded.autoencoder.decode(latent)
    assert 35 < psnr(reference, volume) < math.inf


def test_decoder_fp32_keeps_the_decoder_exact_under_unet_autocast(tiny_loaded, cpu, latent):
    follows = prepare(tiny_loaded, OptimizationConfig(autocast="bf16"), cpu, use_cache=False)
    exact = prepare(
        tiny_loaded, OptimizationConfig(autocast="bf16", decoder_autocast="fp32"), cpu, use_cache=False
    )
    with torch.inference_mode():
        reference = tiny_loaded.autoencoder.decode(latent)
    assert psnr(reference, follows.decode(latent)) < 90  # as before: the decode follows autocast
    assert psnr(reference, exact.decode(latent)) > 100  # fp32 (sub-pixel upsampling: summation order only)


def test_decoder_settings_on_a_pixel_model_say_why_not(registry, cpu):
    model = registry.get("tiny-pixel").load()
    fields = {"decoder_autocast": "bf16", "decoder_quantization": "int8", "decoder_channels_last": True}
    report = prepare(model, OptimizationConfig(**fields), cpu, use_cache=False).report
    for name in fields:
        assert report[name]["applied"] is False and "no decoder" in report[name]["reason"]


# -- the streamed decode at the same settings ----------------------------------------------------------


@pytest.mark.parametrize(
    "fields, min_db",
    [
        ({}, 100.0),  # exact up to summation order
        ({"decoder_autocast": "bf16", "decoder_channels_last": True}, 45.0),
        ({"decoder_quantization": "int8"}, 45.0),
        ({"decoder_quantization": "int8", "decoder_autocast": "bf16", "decoder_channels_last": True}, 45.0),
    ],
)
def test_streamed_decode_matches_the_full_decode_at_the_same_settings(
    tiny_loaded, cpu, latent, fields, min_db
):
    full = prepare(tiny_loaded, OptimizationConfig(**fields), cpu, use_cache=False)
    streamed = _streamed(tiny_loaded, fields, cpu)
    assert streamed.report["streamed_decode"]["applied"]
    expected = full.decode(latent)
    got = streamed.decode(latent)
    assert got.shape == expected.shape
    assert psnr(expected, got) >= min_db
    assert streamed.details["streamed_decode"]["budget_bytes"] > 0  # it really ran the streamed path


def test_streamed_decode_with_int8_layers_reads_them_with_a_halo(tiny_loaded, cpu, latent, short_calibration):
    """Small slabs and no budget: every int8 convolution runs on row slabs with halos, still the same."""
    from engine.quantization import Int8Conv3d

    prepared = prepare(tiny_loaded, OptimizationConfig(decoder_quantization="int8"), cpu, use_cache=False)
    assert any(isinstance(m, Int8Conv3d) for m in prepared.autoencoder.decoder.modules())
    expected = prepared.decode(latent)
    stats = {}
    got = streamed_decode(prepared.autoencoder, latent, slab=2, budget_bytes=0, stats=stats)
    assert stats["upsampled_recomputed"] and not stats.get("upsampled_stored")
    assert psnr(expected, got) >= 45.0


# -- int8 and the mixed plan: accuracy on the decoded volume -------------------------------------------


def test_int8_and_mixed_decoders_against_fp32(tiny_loaded, cpu, short_calibration):
    from engine.quantization import Int8Conv3d

    calibration = decoder_calibration_latent(tiny_loaded, cpu)
    with torch.inference_mode():
        reference = tiny_loaded.autoencoder.decode(calibration)
    int8 = prepare(tiny_loaded, OptimizationConfig(decoder_quantization="int8"), cpu, use_cache=False)
    assert int8.report["decoder_quantization"]["applied"]
    int8_db = psnr(reference, int8.decode(calibration))
    assert 15 < int8_db < math.inf  # lossy, but the same volume
    assert abs(int8.details["decoder"]["int8_psnr_db"] - int8_db) < 1.0  # what the report says is measured

    budget = min(60.0, int8_db + 10.0)  # a budget all-int8 misses: the plan must keep layers in float
    mixed = prepare(
        tiny_loaded,
        OptimizationConfig(decoder_quantization="mixed", decoder_psnr_budget_db=budget),
        cpu,
        use_cache=False,
    )
    plan = mixed.details["decoder"]["mixed_plan"]
    assert plan["kept_float"] and plan["achieved_psnr_db"] >= budget
    swapped = {n for n, m in mixed.autoencoder.named_modules() if isinstance(m, Int8Conv3d)}
    assert swapped == {f"{n}" for n in plan["quantized"]}
    assert psnr(reference, mixed.decode(calibration)) >= budget - 0.5
    assert f"budget {budget:g} dB" in mixed.report["decoder_quantization"]["reason"]


def test_subpixel_upsample_is_nearest_upsampling_then_the_convolution():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 3, 5, 4)
    with torch.inference_mode():
        expected = conv(torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"))
        got = SubpixelUpsample(conv)(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-5)


def test_decoder_setting_info_describes_every_decoder_field_with_valid_values():
    from engine.api.optimization_config import DECODER, SETTING_ROWS

    decoder_rows = [row for row in SETTING_ROWS if row.part == DECODER]
    assert {row.name for row in decoder_rows} == {
        n for n in OptimizationConfig().__dict__ if n.startswith("decoder_")
    }
    for row in decoder_rows:
        assert row.label and row.tip
        for _text, value in row.choices:
            OptimizationConfig(**{row.name: value})  # every offered value is accepted
