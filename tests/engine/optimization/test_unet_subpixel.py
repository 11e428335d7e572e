"""Sub-pixel upsampling in the U-Net: MONAI's output within fp32 rounding, in both upsampling forms."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.optimization.unet_subpixel import (
    SubpixelResnetUp,
    SubpixelWrappedUpsample,
    call_macs,
    subpixel_rewrite_unet,
    upsampling_conv_names,
)


def _tiny_unet(resblock_updown: bool):
    from monai.networks.nets import DiffusionModelUNet

    torch.manual_seed(0)
    unet = DiffusionModelUNet(
        spatial_dims=3,
        in_channels=2,
        out_channels=2,
        channels=(8, 16, 16),
        attention_levels=(False, False, True),
        num_res_blocks=1,
        num_head_channels=(0, 0, 8),
        norm_num_groups=8,
        resblock_updown=resblock_updown,
    ).eval()
    with torch.no_grad():  # MONAI zero-initialises output convolutions: perturb so every layer matters
        for p in unet.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return unet


@pytest.mark.parametrize(
    ("resblock_updown", "kind"), [(False, SubpixelWrappedUpsample), (True, SubpixelResnetUp)]
)
def test_the_rewritten_unet_gives_monais_output_with_fewer_multiply_adds(resblock_updown, kind):
    unet = _tiny_unet(resblock_updown)
    rewritten = copy.deepcopy(unet)
    names_before = upsampling_conv_names(rewritten)
    blocks = subpixel_rewrite_unet(rewritten)
    assert len(blocks) == 2 and all(isinstance(rewritten.get_submodule(b), kind) for b in blocks)
    # The layer names stay: calibration ranges and mixed plans of the plain U-Net apply to the rewritten one.
    assert all(isinstance(rewritten.get_submodule(n), torch.nn.Conv3d) for n in names_before)
    x, t = torch.randn(1, 2, 8, 12, 8), torch.tensor([500])
    with torch.inference_mode():
        expected, got = unet(x, timesteps=t), rewritten(x, timesteps=t)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), (got - expected).abs().max()
    before, after = sum(call_macs(unet, x, t).values()), sum(call_macs(rewritten, x, t).values())
    assert after < before
    assert subpixel_rewrite_unet(rewritten) == []  # nothing left to rewrite


def test_the_setting_applies_through_prepare_and_combines_with_int8(tiny_loaded, cpu):
    from engine.optimization.apply import OptimizationConfig, expected_report, prepare

    from .conftest import run_loop

    exact = run_loop(prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False), tiny_loaded.spec)
    sub = prepare(tiny_loaded, OptimizationConfig(unet_subpixel=True), cpu, use_cache=False)
    assert sub.report["unet_subpixel"]["applied"] and sub.details["unet_subpixel_blocks"]
    assert any(isinstance(m, SubpixelWrappedUpsample) for m in sub.unet.modules())
    assert not any(isinstance(m, SubpixelWrappedUpsample) for m in tiny_loaded.unet.modules())  # a copy
    assert torch.allclose(run_loop(sub, tiny_loaded.spec), exact, atol=1e-4)
    both = prepare(
        tiny_loaded, OptimizationConfig(quantization="int8", unet_subpixel=True), cpu, use_cache=False
    )
    assert both.report["unet_subpixel"]["applied"] and both.report["quantization"]["applied"]
    from engine.quantization import Int8Conv3d

    ups = [both.unet.get_submodule(b) for b in both.details["unet_subpixel_blocks"]]
    assert ups and all(isinstance(u.postconv.conv, Int8Conv3d) for u in ups)  # quantized like the others
    assert expected_report(OptimizationConfig(unet_subpixel=True), cpu)["unet_subpixel"]["applied"]
    assert OptimizationConfig(unet_subpixel=True).summary() == "subpixel"
    assert "unet_subpixel" not in OptimizationConfig().to_dict()  # old requests read as before
