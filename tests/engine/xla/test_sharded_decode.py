"""The decoder split into slabs over fake host devices: equal to the one-device decode, less memory each.

Eight fake CPU devices (``configure_jax(8)``, before JAX starts). Latents are tiny so each compile takes a
few seconds; memory is read from XLA's analysis of compiled (not run) programs, so those shapes can be
larger at no run cost.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.errors import InvalidRequest
from engine.models.networks import build_network
from engine.models.reference import perturb_
from engine.models.registry import ModelRegistry
from engine.xla import convert
from tests.engine.models.bundles import SCALED_AUTOENCODER

# Bound by the first test that runs here, not at import: JAX must not start before configure_jax
# (tests/engine/xla/conftest.py).
jax = jnp = nets = sharded_decode = None

RUN_TOLERANCE = 1e-4  # the bar; measured 1.1-1.9e-6 (float32 reduction order of the statistics)


@pytest.fixture(scope="module", autouse=True)
def _eight_host_devices_or_skip(_jax_started):
    if _jax_started < 8:
        pytest.skip("JAX started in this process with fewer than 8 CPU devices")


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def _perturbed(definition: dict):
    torch.manual_seed(0)
    return perturb_(build_network(definition).eval(), 0.05)  # MONAI zero-initialises output convolutions


AUTOENCODERS = {
    "shipped": lambda: ModelRegistry().get("brain-t1-demo").load().autoencoder,  # trained weights
    "bundle-architecture": lambda: _perturbed(SCALED_AUTOENCODER),
    # MONAI's decoder mid-block self-attention over the whole latent volume
    "bundle-attention": lambda: _perturbed(dict(SCALED_AUTOENCODER, with_decoder_nonlocal_attn=True)),
}


@pytest.fixture(scope="module")
def decoders():
    """Per autoencoder: (arch, params, latent, one-device decode), built once for the module."""
    out = {}
    for name, build in AUTOENCODERS.items():
        autoencoder = build()
        arch = convert.decoder_arch(autoencoder)
        params = {k: jnp.asarray(v) for k, v in convert.numpy_params(autoencoder).items()}
        latent = np.random.default_rng(3).standard_normal((2, 8, 4, 4, arch.latent_channels))  # two samples
        z = jnp.asarray(latent.astype(np.float32))
        single = np.asarray(jax.jit(lambda p, z, arch=arch: nets.decoder_apply(arch, p, z))(params, z))
        out[name] = (arch, params, z, single)
    return out


@pytest.mark.parametrize(
    "name, n, axes",
    [
        ("shipped", 2, ("depth",)),
        ("shipped", 4, ("depth",)),
        ("shipped", 8, ("depth",)),
        ("shipped", 8, ("depth", "height")),
        ("bundle-architecture", 2, ("depth",)),
        ("bundle-architecture", 4, ("depth",)),
        ("bundle-architecture", 8, ("depth",)),
        ("bundle-architecture", 8, ("depth", "height")),
        ("bundle-attention", 4, ("depth",)),
    ],
)
@pytest.mark.slow
def test_sharded_decode_equals_one_device(decoders, name, n, axes):
    arch, params, z, single = decoders[name]
    program, in_shardings = sharded_decode.sharded_decoder_program(arch, jax.devices()[:n], axes=axes)
    out = program(jax.device_put(params, in_shardings[0]), jax.device_put(z, in_shardings[1]))
    assert out.shape == single.shape
    assert relative_error(np.asarray(out), single) < RUN_TOLERANCE
    # The image stays in slabs: each device holds 1/n of it, split along the asked axes.
    mesh = dict(zip(axes, program.mesh_shape, strict=True))
    expected = list(single.shape)
    for axis, parts in mesh.items():
        expected[sharded_decode.SPATIAL_AXES[axis]] //= parts
    assert {tuple(s.data.shape) for s in out.addressable_shards} == {tuple(expected)}
    assert len(out.addressable_shards) == n


def test_an_extent_that_does_not_divide_is_refused_with_what_would(decoders):
    arch, params, _, _ = decoders["bundle-architecture"]
    program, _ = sharded_decode.sharded_decoder_program(arch, jax.devices()[:4])
    z = jnp.zeros((1, 6, 4, 4, arch.latent_channels), jnp.float32)
    with pytest.raises(
        InvalidRequest, match=r"depth \(6\) does not divide over 4 devices; split it over 1, 2, 3, 6"
    ):
        program(params, z)
    with pytest.raises(InvalidRequest, match="not valid"):
        sharded_decode.sharded_decoder_program(arch, jax.devices()[:4], axes=("time",))
    with pytest.raises(InvalidRequest, match="does not fit 4 devices"):
        sharded_decode.sharded_decoder_program(arch, jax.devices()[:4], mesh_shape=(3,))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bundle-architecture", "bundle-attention"])
def test_per_device_memory_falls_with_the_device_count(name):
    """XLA's memory analysis of the compiled programs (nothing runs): temp bytes per device about 1/N.

    Measured on the bundle-architecture decoder, latent 1x16x8x8x3 (image 128x64x64): temp ratio 0.71
    (2 devices; the one-device program reuses buffers better), 0.36 (4), 0.18 (8); the same with the
    mid-block attention, whose keys and values are all-gathered (a few 10 kB) while queries stay split.
    """
    definition = dict(SCALED_AUTOENCODER, with_decoder_nonlocal_attn=name == "bundle-attention")
    module = convert.meta_network(definition)
    arch, abstract = convert.decoder_arch(module), convert.abstract_params(module)
    ratios = {}
    for n in (4, 8):
        record = sharded_decode.decoder_memory_per_device(arch, abstract, (1, 16, 8, 8, 3), jax.devices()[:n])
        ratios[n] = record["temp_ratio"]
        assert record["sharded"]["output_bytes"] * n == record["one_device"]["output_bytes"]
        assert record["collectives"]["collective-permute"]["count"] > 0  # the halos
        assert record["collectives"]["all-reduce"]["count"] > 0  # the GroupNorm statistics
        if name == "bundle-attention":
            assert record["collectives"]["all-gather"]["count"] > 0  # attention's keys and values
    assert ratios[4] < 0.5
    assert ratios[8] < 0.3


def test_split_for_picks_slabs_then_a_2d_split_then_refuses_with_what_would():
    shipped = (1, 20, 24, 20, 8)  # the shipped model's latent, channels-last
    assert sharded_decode.split_for(shipped, 4) == (("depth",), (4,))
    assert sharded_decode.split_for(shipped, 8) == (("depth", "height"), (4, 2))  # 20 does not divide by 8
    assert sharded_decode.split_for((1, 5, 24, 20, 8), 8) == (("height",), (8,))
    with pytest.raises(InvalidRequest, match="does not split over 3 devices.*use one of 1, 2, 4, 5, 7, 8,"):
        sharded_decode.split_for((1, 20, 28, 20, 3), 3)


def test_decoder_apply_constrains_the_latent_and_every_op_output(decoders):
    """The hook's contract (the sharded program relies on it): index 0 is the latent, i + 1 follows op i."""
    arch, params, z, _ = decoders["bundle-attention"]
    seen = []

    def record(index, h):
        seen.append((index, h.shape))
        return h

    jax.eval_shape(lambda p, z: nets.decoder_apply(arch, p, z, constrain=record), params, z)
    assert [i for i, _ in seen] == list(range(len(arch.ops) + 1))
    assert seen[0][1] == z.shape
