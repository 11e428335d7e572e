"""The XLA port of MAISI v2's ``DiffusionModelUNetMaisi`` against MONAI's module, and its planning view."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.models.bundle import _resolve
from engine.models.networks import build_network
from engine.models.reference import MAISI_UNET, perturb_
from engine.testing import MAISI_NETWORK_CONFIG, maisi_definitions
from engine.xla import convert

jax = jnp = nets = None  # bound by the first test that runs here (tests/engine/xla/conftest.py)
NETWORK_TOLERANCE = 2e-5  # as tests/engine/xla/test_parity.py: float32 rounding through a dozen blocks


def tiny_maisi_definition(**overrides) -> dict:
    """engine.testing's tiny MAISI U-Net (the brain config's classes and inputs, 8-16 channels)."""
    config = maisi_definitions(tiny=True)
    return {**_resolve(config, config["diffusion_unet_def"]), **overrides}


# Two levels (attention on the second) for the variants of the inputs: the embeddings are what they test.
TWO_LEVELS = {"num_channels": [8, 16], "attention_levels": [False, True], "num_head_channels": [0, 8]}


def perturbed(definition: dict, seed: int = 0):
    torch.manual_seed(seed)
    return perturb_(build_network(definition).eval(), 0.05)  # MONAI zero-initialises the output conv


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def channels_last(t: torch.Tensor):
    return jnp.asarray(t.numpy().transpose(0, 2, 3, 4, 1))


def test_the_reference_definition_is_the_one_the_nv_generate_config_gives():
    resolved = _resolve(MAISI_NETWORK_CONFIG, MAISI_NETWORK_CONFIG["diffusion_unet_def"])
    assert resolved == MAISI_UNET


@pytest.mark.parametrize(
    "overrides",
    [
        {"include_top_region_index_input": True, "include_bottom_region_index_input": True, **TWO_LEVELS},
        {"num_class_embeds": None, "include_spacing_input": False, "include_fc": False, **TWO_LEVELS},
    ],
    ids=["with-region-indices", "no-class-no-spacing"],
)
@pytest.mark.slow
def test_maisi_port_matches_monai_for_each_input(overrides):
    """Every optional input of DiffusionModelUNetMaisi, passed as MONAI's forward takes them."""
    unet = perturbed(tiny_maisi_definition(**overrides))
    arch = convert.maisi_unet_arch(unet)
    torch.manual_seed(1)
    x = torch.randn(2, unet.in_channels, 4, 6, 4)
    t = torch.tensor([999.0, 17.0])
    labels = torch.tensor([9, 0])
    spacing = torch.tensor([[94.0, 94.0, 136.0], [100.0, 120.0, 80.0]])
    regions = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    kwargs, inputs = {}, {}
    if arch.class_embedding is not None:
        kwargs["class_labels"] = labels
    for name, _keys in arch.input_embeddings:
        value = spacing if name == "spacing" else regions
        kwargs["spacing_tensor" if name == "spacing" else f"{name}_tensor"] = value
        inputs[name] = jnp.asarray(value.numpy())
    with torch.no_grad():
        expected = unet(x, t, **kwargs).numpy()
    params = {k: jnp.asarray(v) for k, v in convert.numpy_params(unet).items()}
    out = jax.jit(lambda p, x, t, labels, inputs: nets.maisi_unet_apply(arch, p, x, t, labels, inputs))(
        params,
        channels_last(x),
        jnp.asarray(t.numpy()),
        None if arch.class_embedding is None else jnp.asarray(labels.numpy()),
        inputs,
    )
    out = np.asarray(out).transpose(0, 4, 1, 2, 3)
    assert out.shape == expected.shape
    assert relative_error(out, expected) < NETWORK_TOLERANCE


@pytest.mark.slow
def test_brain_model_port_matches_monai_through_the_packed_context():
    """The brain model's structure (4 levels, resblock up/down, attention on two levels, include_fc, class
    label + spacing), called as VolSynth's sampling loop calls a MAISI denoiser."""
    from engine.models.maisi import maisi_denoiser

    unet = perturbed(tiny_maisi_definition())
    arch = convert.maisi_unet_arch(unet)
    torch.manual_seed(2)
    x = torch.randn(2, unet.in_channels, 8, 8, 8)
    t = torch.tensor([500.0, 3.0])
    context = torch.tensor([[[9.0, 94.0, 94.0, 136.0]], [[0.0, 94.0, 94.0, 136.0]]])  # guided, unguided
    with torch.no_grad():
        expected = maisi_denoiser(unet)(x, t, context).numpy()
    params = {k: jnp.asarray(v) for k, v in convert.numpy_params(unet).items()}
    out = jax.jit(lambda p, x, t, c: nets.maisi_denoiser_apply(arch, p, x, t, c))(
        params, channels_last(x), jnp.asarray(t.numpy()), jnp.asarray(context.numpy())
    )
    assert relative_error(np.asarray(out).transpose(0, 4, 1, 2, 3), expected) < NETWORK_TOLERANCE


def test_region_inputs_do_not_fit_the_packed_context():
    definition = tiny_maisi_definition(include_top_region_index_input=True)
    arch = convert.maisi_unet_arch(convert.meta_network(definition))
    params = convert.abstract_params(convert.meta_network(definition))
    x = jax.ShapeDtypeStruct((1, 8, 8, 8, 4), jnp.float32)
    t = jax.ShapeDtypeStruct((1,), jnp.float32)
    ctx = jax.ShapeDtypeStruct((1, 1, 4), jnp.float32)
    with pytest.raises(ValueError, match="top_region_index"):
        jax.eval_shape(lambda p, x, t, c: nets.maisi_denoiser_apply(arch, p, x, t, c), params, x, t, ctx)


def test_a_plain_unet_is_not_read_as_maisi_and_maisi_not_as_plain():
    from engine.testing import tiny_spec

    with pytest.raises(convert.UnsupportedNetwork, match="DiffusionModelUNetMaisi"):
        convert.maisi_unet_arch(convert.meta_network(tiny_spec().networks["unet"]))
    with pytest.raises(convert.UnsupportedNetwork, match="DiffusionModelUNet denoisers"):
        convert.unet_arch(convert.meta_network(tiny_maisi_definition()))
