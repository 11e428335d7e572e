"""The XLA port of MONAI's networks against MONAI itself, and the xla backend against the torch backend.

The issue's bar: the final volume of a DDIM run within 1e-4 relative of the torch path's, same seed, for
the shipped model and a bundle-architecture model. Network-level checks use tighter float32 tolerances so
a wrong block cannot hide behind a short run.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.backends.xla import XlaBackend
from engine.errors import InvalidRequest
from engine.models.networks import build_network
from engine.models.reference import perturb_
from engine.models.registry import ModelRegistry
from engine.testing import build_tiny_networks, make_tiny_model, tiny_spec
from engine.xla import convert
from tests.engine.models.bundles import SCALED_AUTOENCODER, SCALED_UNET, write_bundle

# Bound by the first test that runs here, not at collection (tests/engine/xla/conftest.py).
jax = jnp = nets = None


NETWORK_TOLERANCE = 2e-5  # float32 rounding through a dozen blocks; measured 0.7-1.5e-6
RUN_TOLERANCE = 1e-4  # the bar for a whole DDIM run


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def perturbed(definition: dict, seed: int = 0):
    """A MONAI network with random, non-zero weights (MONAI zero-initialises output convolutions)."""
    torch.manual_seed(seed)
    return perturb_(build_network(definition).eval(), 0.05)


def channels_last(t: torch.Tensor) -> jax.Array:
    return jnp.asarray(t.numpy().transpose(0, 2, 3, 4, 1))


def unet_outputs(unet, spatial, context_dim):
    torch.manual_seed(1)
    x = torch.randn(2, unet.in_channels, *spatial)
    t = torch.tensor([999.0, 17.0])
    context = torch.randn(2, 1, context_dim) if context_dim else None
    with torch.no_grad():
        expected = unet(x, t, context).numpy()
    params = {k: jnp.asarray(v) for k, v in convert.numpy_params(unet).items()}
    arch = convert.unet_arch(unet)
    out = jax.jit(lambda p, x, t, c: nets.unet_apply(arch, p, x, t, c))(
        params,
        channels_last(x),
        jnp.asarray(t.numpy()),
        None if context is None else jnp.asarray(context.numpy()),
    )
    return np.asarray(out).transpose(0, 4, 1, 2, 3), expected


@pytest.mark.parametrize(
    "definition, spatial, context_dim",
    [
        # the tiny test model: conditioned, SpatialTransformer on the last level, strided-conv downsampling
        (tiny_spec().networks["unet"], (4, 6, 4), 2),
        # unconditioned: SpatialAttentionBlock instead of the transformer
        (tiny_spec(conditioned=False).networks["unet"], (4, 6, 4), 0),
        # the brain-LDM bundle architecture, scaled: resblock_updown, two attention levels, 4-d context
        (SCALED_UNET, (8, 12, 8), 4),
    ],
    ids=["tiny", "tiny-unconditioned", "bundle-architecture"],
)
@pytest.mark.slow
def test_unet_port_matches_monai(definition, spatial, context_dim):
    out, expected = unet_outputs(perturbed(definition), spatial, context_dim)
    assert out.shape == expected.shape
    assert relative_error(out, expected) < NETWORK_TOLERANCE


@pytest.mark.parametrize(
    "definition",
    [tiny_spec().networks["autoencoder"], SCALED_AUTOENCODER],
    ids=["tiny", "bundle-architecture"],
)
@pytest.mark.slow
def test_decoder_port_matches_monai(definition):
    autoencoder = perturbed(definition)
    arch = convert.decoder_arch(autoencoder)
    z = torch.randn(1, arch.latent_channels, 3, 4, 3)
    with torch.no_grad():
        expected = autoencoder.decode(z).numpy()
    params = {k: jnp.asarray(v) for k, v in convert.numpy_params(autoencoder).items()}
    out = np.asarray(jax.jit(lambda p, z: nets.decoder_apply(arch, p, z))(params, channels_last(z)))
    assert relative_error(out.transpose(0, 4, 1, 2, 3), expected) < NETWORK_TOLERANCE


def test_a_monai_block_the_port_lacks_is_refused_by_name():
    definition = dict(tiny_spec().networks["unet"], num_class_embeds=3)
    with pytest.raises(convert.UnsupportedNetwork, match="class-embedding"):
        convert.unet_arch(convert.meta_network(definition))
    transposed = dict(tiny_spec().networks["autoencoder"], use_convtranspose=True)
    with pytest.raises(convert.UnsupportedNetwork, match="ConvTranspose3d|transposed"):
        convert.decoder_arch(convert.meta_network(transposed))


def test_meta_network_gives_shapes_without_weights():
    unet = convert.meta_network(SCALED_UNET)
    abstract = convert.abstract_params(unet)
    concrete = convert.numpy_params(perturbed(SCALED_UNET))
    assert abstract.keys() == concrete.keys()
    assert all(abstract[k].shape == concrete[k].shape for k in concrete)


def both_backends(registry, request):
    xla = run(XlaBackend(registry).sample(request))
    torch_result = run(LocalBackend("cpu", registry).sample(request))
    return xla, torch_result


@pytest.mark.slow
def test_shipped_model_ddim_run_matches_torch_with_its_tissue_maps():
    """With the model's defaults: classifier-free guidance at scale 3 (a doubled batch), both conditions."""
    registry = ModelRegistry()
    request = SamplingRequest(model="brain-t1-demo", seed=11, steps=4, sampler="ddim")
    xla, reference = both_backends(registry, request)
    assert xla.request.guidance_scale == 3.0
    assert xla.volumes.shape == reference.volumes.shape == (1, 5, 80, 96, 80)
    assert relative_error(xla.volumes, reference.volumes) < RUN_TOLERANCE
    for i in range(4):  # each tissue map on its own, not only the whole stack
        xla_map, torch_map = xla.volumes[0, 1 + i], reference.volumes[0, 1 + i]
        assert np.abs(xla_map - torch_map).max() < RUN_TOLERANCE * np.abs(torch_map).max()
    assert xla.label_names == reference.label_names == ("GM", "WM", "CSF", "ventricles")
    assert xla.provenance["space"] == reference.provenance["space"]
    assert xla.provenance["backend"] == "xla"
    assert xla.provenance["xla"]["precision"] == "highest"
    assert xla.provenance["seed"] == 11
    assert xla.provenance["timings"]["compile_s"] > 0
    np.testing.assert_array_equal(xla.affine, reference.affine)


@pytest.mark.slow
def test_bundle_architecture_ddim_run_matches_torch(tmp_path):
    bundle = write_bundle(tmp_path / "brain_ldm")
    registry = ModelRegistry([tmp_path])
    request = SamplingRequest(model=str(bundle), seed=5, steps=3, sampler="ddim")
    xla, reference = both_backends(registry, request)
    assert relative_error(xla.volumes, reference.volumes) < RUN_TOLERANCE


@pytest.mark.slow
def test_previews_and_cancel_follow_the_one_loop(tmp_path):
    folder = make_tiny_model(tmp_path / "tiny")
    backend = XlaBackend(ModelRegistry([tmp_path]))
    job = backend.sample(SamplingRequest(model=str(folder), steps=5, preview_interval=2))
    previews, steps = [], []
    for progress in job:
        if progress.stage == "denoise" and progress.step:
            steps.append(progress.step)
            if progress.preview is not None:
                previews.append(progress.step)
            if progress.step == 3:
                job.close()  # cancel, as the app does
                break
    assert steps == [1, 2, 3]
    assert previews == [2]


@pytest.mark.slow
def test_torch_optimization_settings_are_refused_with_a_reason(tmp_path):
    from engine.api.optimization_config import OptimizationConfig

    folder = make_tiny_model(tmp_path / "tiny")
    backend = XlaBackend(ModelRegistry([tmp_path]))
    request = SamplingRequest(model=str(folder), steps=2, optimization=OptimizationConfig(tf32=True))
    with pytest.raises(InvalidRequest, match="torch settings"):
        run(backend.sample(request))
    with pytest.raises(InvalidRequest, match="unknown XLA precision"):
        XlaBackend(precision="bf16")


def test_info_lists_the_xla_devices():
    info = XlaBackend().info()
    assert info.name == "xla"
    devices = info.details["xla_devices"]
    assert devices and devices[0]["platform"] == "cpu"
    assert info.details["xla_precision"] == "highest"
    assert "jax" in info.details


def test_tiny_networks_helper_still_builds_the_models_the_port_runs():
    networks = build_tiny_networks(tiny_spec())
    assert convert.unet_arch(networks["unet"]).levels == 2


@pytest.mark.slow
def test_xla_server_drives_the_remote_backend_like_a_local_one(tmp_path):
    """``volsynth serve --device xla``'s backend behind a real uvicorn server, used by the remote client."""
    from engine.backends.remote import RemoteBackend
    from engine.cli.serve import serving_backend
    from engine.server import create_app
    from engine.testing import ServerThread

    make_tiny_model(tmp_path / "tiny")
    backend = serving_backend(argparse.Namespace(device="xla", xla_precision="highest"))
    backend.registry = ModelRegistry([tmp_path])
    request = SamplingRequest(model="tiny-latent", seed=9, steps=3)  # servers take registered ids only
    reference = run(LocalBackend("cpu", ModelRegistry([tmp_path])).sample(request))
    with ServerThread(create_app(backend, token="s3cret")) as url:
        remote = RemoteBackend(url, token="s3cret")
        info = remote.info()
        result = run(remote.sample(request))
    assert info.details["xla_devices"][0]["platform"] == "cpu"
    assert result.provenance["backend"] == "remote"
    assert result.provenance["server_backend"] == "xla"
    assert result.provenance["xla"]["precision"] == "highest"
    assert relative_error(result.volumes, reference.volumes) < RUN_TOLERANCE


@pytest.mark.slow
def test_the_server_plans_for_its_clients(tmp_path):
    """``POST /plan`` through the remote client: a plan table for the tiny model on a TPU v5e slice."""
    from engine.backends.remote import RemoteBackend
    from engine.server import create_app
    from engine.testing import ServerThread

    make_tiny_model(tmp_path / "tiny")
    with ServerThread(create_app(XlaBackend(ModelRegistry([tmp_path])), token="s3cret")) as url:
        remote = RemoteBackend(url, token="s3cret")
        result = remote.plan("tiny-latent", "v5e:2x2", batch=1, compile_top=1)
        with pytest.raises(InvalidRequest, match="v5e:0x2.*known: v5e:2x2"):
            remote.plan("tiny-latent", "v5e:0x2")  # the form is right, the slice cannot exist
        with pytest.raises(InvalidRequest, match="topology"):
            remote.plan("tiny-latent", "v9z:3x3")  # not a topology name at all: refused by the schema
    assert result["topology"]["name"] == "v5e:2x2"
    assert result["counts"]["compiled"] == 1
    assert result["counts"]["enumerated"] == len(result["rows"])
    assert result["best"] is not None and result["best"]["step_ms"] > 0
