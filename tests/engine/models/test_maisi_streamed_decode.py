"""The streamed decode of MONAI's AutoencoderKlMaisi equals MONAI's own decode (its splits included)."""

from __future__ import annotations

import pytest
import torch

from engine.optimization.streamed_decode import streamed_decode
from engine.testing import build_maisi_networks


@pytest.fixture(scope="module")
def autoencoder():
    return build_maisi_networks(tiny=True, seed=3)[1]


@pytest.mark.parametrize("slab", [None, 3])
def test_streamed_decode_equals_monais_decode(autoencoder, slab):
    z = torch.randn(1, 4, 10, 12, 6, generator=torch.Generator().manual_seed(slab or 0))
    with torch.inference_mode():
        expected = autoencoder.decode_stage_2_outputs(z)
    stats: dict = {}
    got = streamed_decode(autoencoder, z, slab=slab, stats=stats)
    assert got.shape == expected.shape == (1, 1, 40, 48, 24)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    assert stats["upsampled_rows_computed"] > 0  # the trilinear upsampling was streamed, not run whole


def test_a_small_budget_recomputes_the_upsampled_rows_and_still_matches(autoencoder):
    z = torch.randn(2, 4, 8, 8, 8, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        expected = autoencoder.decode_stage_2_outputs(z)
    stats: dict = {}
    got = streamed_decode(autoencoder, z, budget_bytes=1, stats=stats)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    assert stats.get("upsampled_recomputed")  # nothing full-resolution was stored beyond what must be


def test_norm_float16_blocks_run_as_monai_runs_them(autoencoder):
    """The config's norm_float16 (a CUDA-autocast memory saver) is off as VolSynth builds the model; a
    decoder that has it on is not streamed through the fp32 path (it would compute another function)."""
    from monai.apps.generation.maisi.networks.autoencoderkl_maisi import MaisiGroupNorm3D

    norms = [m for m in autoencoder.decoder.modules() if isinstance(m, MaisiGroupNorm3D)]
    assert norms and not any(m.norm_float16 for m in norms)
