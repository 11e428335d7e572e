"""The streamed decoder computes AutoencoderKL.decode exactly, whatever the slab size and storage policy."""

from __future__ import annotations

import pytest
import torch

from engine.models.networks import build_network
from engine.models.reference import perturb_
from engine.optimization.streamed_decode import streamed_decode


def _autoencoder(channels, latent=3, seed=0, attention=False):
    torch.manual_seed(seed)
    ae = build_network(
        {
            "_target_": "AutoencoderKL",
            "spatial_dims": 3,
            "in_channels": 1,
            "out_channels": 1,
            "latent_channels": latent,
            "channels": list(channels),
            "num_res_blocks": [1, 2, 1][: len(channels)],
            "attention_levels": [False] * (len(channels) - 1) + [attention],
            "norm_num_groups": 4,
            "with_encoder_nonlocal_attn": attention,
            "with_decoder_nonlocal_attn": attention,
        }
    )
    return perturb_(ae, 0.1).eval()


@pytest.mark.parametrize(("slab", "budget"), [(1, 0), (3, 0), (8, 2**40), (5, 2**17), (None, 2**40)])
def test_matches_full_decode(slab, budget):
    # channels (8, 16, 12): the widths change between levels, so shortcuts are 1x1 convolutions there.
    ae = _autoencoder((8, 16, 12))
    z = torch.randn(2, 3, 5, 6, 4, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = ae.decode(z)
    ours = streamed_decode(ae, z, slab=slab, budget_bytes=budget)
    assert ours.shape == full.shape == (2, 1, 20, 24, 16)
    assert torch.max(torch.abs(ours - full)).item() <= 1e-4 * max(1.0, full.abs().max().item())


def test_blocks_it_does_not_stream_still_run_exactly():
    ae = _autoencoder((8, 8), attention=True)  # a non-local attention block in the decoder
    z = torch.randn(1, 3, 4, 4, 4, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full = ae.decode(z)
    assert torch.allclose(streamed_decode(ae, z, slab=2, budget_bytes=0), full, atol=1e-4)


def test_input_is_not_modified():
    ae = _autoencoder((8, 8))
    z = torch.randn(1, 3, 4, 4, 4)
    before = z.clone()
    streamed_decode(ae, z, slab=2)
    assert torch.equal(z, before)
