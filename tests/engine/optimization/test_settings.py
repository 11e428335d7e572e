"""Each setting changes what actually runs; settings that cannot apply say why; bad combinations are refused."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InvalidRequest
from engine.metrics.image import psnr
from engine.optimization.apply import OptimizationConfig, clear_cache, prepare
from engine.quantization import MIN_MIXED_SHARE
from tests.engine.optimization.conftest import run_loop


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_default_config_applies_nothing_and_reports_every_setting(tiny_loaded, cpu):
    prepared = prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False)
    assert prepared.unet is tiny_loaded.unet  # nothing to rewrite: no copy
    assert set(prepared.report) == {
        "tf32",
        "autocast",
        "attention",
        "unet_subpixel",
        "quantization",
        "channels_last_3d",
        "compile_mode",
        "cuda_graphs",
        "streamed_decode",
        "decoder_autocast",
        "decoder_quantization",
        "decoder_channels_last",
        "step_cache",
    }
    assert not any(entry["applied"] for entry in prepared.report.values())
    assert prepared.autoencoder is tiny_loaded.autoencoder  # no decoder setting: the decoder is not copied


def test_not_applicable_settings_say_why(tiny_loaded, cpu):
    prepared = prepare(tiny_loaded, OptimizationConfig(tf32=True, quantization="fp8"), cpu, use_cache=False)
    assert prepared.report["tf32"]["applied"] is False
    assert "compute capability 8.0" in prepared.report["tf32"]["reason"]
    assert prepared.report["quantization"]["applied"] is False
    assert "8.9" in prepared.report["quantization"]["reason"]


def test_streamed_decode_is_not_applicable_to_pixel_models(registry, cpu):
    model = registry.get("tiny-pixel").load()
    prepared = prepare(model, OptimizationConfig(streamed_decode=True), cpu, use_cache=False)
    assert prepared.report["streamed_decode"]["applied"] is False
    assert "no decoder" in prepared.report["streamed_decode"]["reason"]


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"quantization": "int8", "autocast": "fp16"}, "bf16"),
        ({"quantization": "mixed", "compile_mode": "default"}, "compil"),
        ({"cuda_graphs": True, "compile_mode": "reduce-overhead"}, "already captures CUDA graphs"),
        ({"psnr_budget_db": 0.0}, "PSNR budget"),
        ({"psnr_budget_db": float("nan")}, "PSNR budget"),
    ],
)
def test_conflicting_combinations_are_refused(fields, words):
    with pytest.raises(InvalidRequest, match=words):
        OptimizationConfig(**fields)


def test_cuda_graphs_off_cuda_are_refused(tiny_loaded, cpu):
    with pytest.raises(InvalidRequest, match="CUDA graphs need an NVIDIA GPU"):
        prepare(tiny_loaded, OptimizationConfig(cuda_graphs=True), cpu)


def test_channels_last_reaches_the_first_convolution_and_leaves_the_cached_model_alone(tiny_loaded, cpu):
    before = _state(tiny_loaded.unet)
    prepared = prepare(tiny_loaded, OptimizationConfig(channels_last_3d=True), cpu, use_cache=False)
    conv_in = prepared.unet.conv_in.conv
    assert conv_in.weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert not tiny_loaded.unet.conv_in.conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    seen = []
    handle = conv_in.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last_3d))
    )
    try:
        run_loop(prepared, tiny_loaded.spec, steps=2)
    finally:
        handle.remove()
    assert seen == [True, True]  # every step's input, not only the first
    assert all(torch.equal(before[k], v) for k, v in tiny_loaded.unet.state_dict().items())


def test_bf16_autocast_runs_convolutions_in_bf16_and_returns_fp32(tiny_loaded, cpu):
    prepared = prepare(tiny_loaded, OptimizationConfig(autocast="bf16"), cpu, use_cache=False)
    dtypes = []
    handle = prepared.unet.conv_in.conv.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))
    try:
        x = torch.randn(1, 5, 4, 6, 4)
        with torch.inference_mode():
            out = prepared.denoiser(x, torch.tensor([10.0]), torch.rand(1, 1, 2))
    finally:
        handle.remove()
    assert dtypes == [torch.bfloat16]
    assert out.dtype == torch.float32


def test_sdpa_routes_attention_through_scaled_dot_product_attention(tiny_loaded, cpu, monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    reference = run_loop(prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False), tiny_loaded.spec)
    assert calls == []
    prepared = prepare(tiny_loaded, OptimizationConfig(attention="sdpa"), cpu, use_cache=False)
    volumes = run_loop(prepared, tiny_loaded.spec)
    assert calls and prepared.report["attention"]["applied"]
    assert not any(getattr(m, "use_flash_attention", False) for m in tiny_loaded.unet.modules())
    assert psnr(reference, volumes) > 60  # same maths, different kernel


def test_int8_swaps_in_quantized_kernels_and_stays_close(tiny_loaded, cpu, monkeypatch):
    from engine.quantization import DynamicInt8Linear, Int8Conv3d

    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 2)
    reference = run_loop(prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False), tiny_loaded.spec)
    # This tiny model's Linear layers are far below the size where int8 pays: they stay float ...
    small = prepare(tiny_loaded, OptimizationConfig(quantization="int8"), cpu, use_cache=False)
    assert Int8Conv3d in {type(m) for m in small.unet.modules()}
    assert DynamicInt8Linear not in {type(m) for m in small.unet.modules()}
    assert " and 0 Linear" in small.report["quantization"]["reason"]
    # ... unless the threshold says otherwise.
    monkeypatch.setattr("engine.quantization.MIN_INT8_LINEAR_MACS", 0)
    prepared = prepare(tiny_loaded, OptimizationConfig(quantization="int8"), cpu, use_cache=False)
    kinds = {type(m) for m in prepared.unet.modules()}
    assert {Int8Conv3d, DynamicInt8Linear} <= kinds
    # no float Conv3d left that int8 could have taken (grouped ones are not candidates)
    assert not any(type(m) is torch.nn.Conv3d and m.groups == 1 for m in prepared.unet.modules())
    assert Int8Conv3d not in {type(m) for m in tiny_loaded.unet.modules()}
    assert prepared.report["quantization"]["applied"]
    # The loop really runs the integer kernels: oneDNN's int8 convolution and int8 matmul.
    calls = {"qconv": 0, "qlinear": 0}
    real_qconv, real_qlinear = torch.ops.onednn.qconv_pointwise, torch.ops.onednn.qlinear_pointwise

    def counting_qconv(*args):
        calls["qconv"] += 1
        assert args[0].dtype == torch.uint8
        return real_qconv(*args)

    def counting_qlinear(*args):
        calls["qlinear"] += 1
        assert args[0].dtype == torch.uint8
        return real_qlinear(*args)

    monkeypatch.setattr(torch.ops.onednn, "qconv_pointwise", counting_qconv)
    monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", counting_qlinear)
    volumes = run_loop(prepared, tiny_loaded.spec)
    assert calls["qconv"] and calls["qlinear"]
    assert torch.isfinite(volumes).all()
    assert psnr(reference, volumes) > 15  # lossy but the same volume, not noise


@pytest.mark.slow  # sensitivity search: ~70 loop runs (~30 s idle machine, 225 s contended)
def test_mixed_precision_meets_its_budget_on_the_calibration_run(tiny_loaded, cpu, monkeypatch):
    import engine.optimization.apply as optimization
    from engine.quantization import Int8Conv3d

    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 2)
    calls = []
    real_run = optimization._run_calibration

    def counting_run(model, unet, device, decode, autocast=None):
        calls.append((unet, decode, autocast))
        return real_run(model, unet, device, decode, autocast)

    monkeypatch.setattr(optimization, "_run_calibration", counting_run)
    prepared = prepare(
        tiny_loaded, OptimizationConfig(quantization="mixed", psnr_budget_db=45.0), cpu, use_cache=False
    )
    # The unquantized fp32 volume (the budget's reference) is computed once, not once more as a reference.
    # Calibration runs see the U-Net before any layer is swapped, so the first call's U-Net is that one.
    base = calls[0][0]
    assert sum(1 for unet, decode, _ in calls if unet is base and decode) == 1
    plan = prepared.details["mixed_plan"]
    assert plan["achieved_psnr_db"] >= 45.0
    # the budget forces a real split on this model (its most sensitive layer alone costs ~35 dB)
    assert plan["quantized"] and set(plan["kept_float"]) - set(plan["skipped_small"])
    # the layers kept in float are those adding the most error per unit of compute int8 would speed up
    sens, share = plan["sensitivity_psnr_db"], plan["compute_share"]

    def error_per_compute(name):
        return 10 ** (-sens[name] / 10) / share[name]

    kept = [n for n in plan["kept_float"] if n in sens]
    assert min(error_per_compute(n) for n in kept) >= max(error_per_compute(n) for n in plan["quantized"])
    assert set(plan["skipped_small"]) <= set(plan["kept_float"])
    small_linears = {
        n for n in plan["skipped_small"] if isinstance(tiny_loaded.unet.get_submodule(n), torch.nn.Linear)
    }
    assert small_linears  # this tiny model's Linear layers are far below MIN_INT8_LINEAR_MACS per call
    assert all(share[n] < MIN_MIXED_SHARE for n in set(plan["skipped_small"]) - small_linears)
    assert 0 < plan["int8_compute_share"] < 1
    swapped = {name for name, m in prepared.unet.named_modules() if isinstance(m, Int8Conv3d)}
    assert swapped and swapped <= set(plan["quantized"])


def test_mixed_precision_under_autocast_refuses_a_budget_autocast_alone_misses(tiny_loaded, cpu, monkeypatch):
    from engine.quantization import Int8Conv3d

    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 2)
    prepared = prepare(
        tiny_loaded,
        OptimizationConfig(quantization="mixed", autocast="bf16", psnr_budget_db=140.0),
        cpu,
        use_cache=False,
    )
    entry = prepared.report["quantization"]
    assert not entry["applied"]
    assert "bf16 autocast alone" in entry["reason"] and "140 dB" in entry["reason"]
    assert prepared.details["mixed_plan"]["float_psnr_db"] < 140.0
    assert not any(isinstance(m, Int8Conv3d) for m in prepared.unet.modules())


def test_prepared_variants_are_cached_per_config(tiny_loaded, cpu):
    clear_cache()
    first = prepare(tiny_loaded, OptimizationConfig(channels_last_3d=True), cpu)
    again = prepare(tiny_loaded, OptimizationConfig(channels_last_3d=True), cpu)
    other = prepare(tiny_loaded, OptimizationConfig(attention="sdpa"), cpu)
    assert again.unet is first.unet and again.report is not first.report
    assert other.unet is not first.unet
    clear_cache()


def test_backend_provenance_records_what_applied(registry):
    from engine.api import SamplingRequest, run
    from engine.backends.local import LocalBackend

    backend = LocalBackend(device="cpu", registry=registry)
    request = SamplingRequest(
        model="tiny-latent",
        steps=2,
        optimization=OptimizationConfig(autocast="bf16", tf32=True, streamed_decode=True),
    )
    result = run(backend.sample(request))
    report = result.provenance["optimization"]["report"]
    assert report["autocast"]["applied"] and report["streamed_decode"]["applied"]
    assert report["tf32"]["applied"] is False and report["tf32"]["reason"]
    clear_cache()


@pytest.mark.parametrize(
    "model_id, fields",
    [
        ("tiny-latent", {}),
        ("tiny-latent", {"tf32": True, "quantization": "fp8", "attention": "sdpa"}),
        ("tiny-latent", {"autocast": "bf16", "channels_last_3d": True, "streamed_decode": True}),
        ("tiny-latent", {"autocast": "fp16", "compile_mode": "max-autotune"}),
        ("tiny-latent", {"quantization": "int8", "autocast": "bf16"}),
        ("tiny-pixel", {"streamed_decode": True, "attention": "sdpa", "tf32": True}),
        ("tiny-latent", {"decoder_autocast": "bf16", "decoder_channels_last": True, "streamed_decode": True}),
        ("tiny-latent", {"decoder_autocast": "fp32", "decoder_quantization": "int8"}),
        (
            "tiny-pixel",
            {"decoder_autocast": "bf16", "decoder_quantization": "mixed", "decoder_channels_last": True},
        ),
    ],
)
def test_expected_report_agrees_with_prepare_on_cpu(registry, cpu, monkeypatch, model_id, fields):
    from engine.optimization.apply import expected_report

    monkeypatch.setattr("engine.optimization.apply.CALIBRATION_STEPS", 1)
    source = registry.get(model_id)
    config = OptimizationConfig(**fields)
    predicted = expected_report(config, "cpu", source.spec)
    report = prepare(source.load(), config, cpu, use_cache=False).report
    assert list(predicted) == list(report)
    for name, entry in report.items():
        assert predicted[name]["requested"] == entry["requested"], name
        assert predicted[name]["applied"] == entry["applied"], name
        if not entry["applied"] or name not in (
            "attention",
            "quantization",
            "decoder_quantization",
        ):  # why not is decided by the device (and the spec): the same words
            assert predicted[name]["reason"] == entry["reason"], name


def test_expected_report_refuses_what_prepare_refuses(tiny_loaded, cpu):
    from engine.optimization.apply import expected_report

    config = OptimizationConfig(cuda_graphs=True)
    with pytest.raises(InvalidRequest) as predicted:
        expected_report(config, cpu)
    with pytest.raises(InvalidRequest) as prepared:
        prepare(tiny_loaded, config, cpu, use_cache=False)
    assert str(predicted.value) == str(prepared.value)
