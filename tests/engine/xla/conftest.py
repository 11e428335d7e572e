"""Fixtures of the XLA tests: JAX started with 8 fake host devices, and the tiny U-Net the planner plans."""

from __future__ import annotations

import importlib

import pytest

# What a test module may declare at module level (``jax = jnp = None``) to have bound once JAX has started.
_LATE_MODULES = {
    "jax": "jax",
    "jnp": "jax.numpy",
    "nets": "engine.xla.nets",
    "sharded_decode": "engine.xla.sharded_decode",
}


@pytest.fixture(scope="module", autouse=True)
def _jax_started(request) -> int:
    """JAX configured for 8 host devices and started by the first test of each module, never at collection:
    once JAX is imported its threads live in the pytest process, and tests in other folders fork children.

    Binds the module's late names (``_LATE_MODULES``, those it declares as None) and returns the count of
    CPU devices in effect: fewer than 8 when something in this process started JAX first.
    """
    from engine.xla.runtime import configure_jax

    count = configure_jax(8)
    for name, module_name in _LATE_MODULES.items():
        if hasattr(request.module, name) and getattr(request.module, name) is None:
            setattr(request.module, name, importlib.import_module(module_name))
    return count


@pytest.fixture(scope="module")
def eight_host_devices(_jax_started) -> None:
    """Fails, never skips, when something in this pytest process started JAX with fewer host devices."""
    assert _jax_started >= 8, f"JAX started with {_jax_started} host device(s) before configure_jax(8) ran"


@pytest.fixture(scope="module")
def tiny_net(_jax_started):
    """The tiny model's U-Net as the planner sees it: latent 3x8x8x8, two levels (8^3 and 4^3), concat and
    cross-attention conditioning, classifier-free guidance doubling the batch."""
    from engine.testing import tiny_spec
    from engine.xla.planner import network_from_definition

    spec = tiny_spec(output_xyz=(32, 32, 32))
    return network_from_definition("tiny", spec.networks["unet"], spec.latent_shape[1:], batch=1, cfg=True)
