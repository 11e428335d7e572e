"""The reference model shapes benchmarks and the planner use are the networks they say they are."""

from __future__ import annotations

from engine.models.reference import bundle_half_spec, bundle_sized_spec, demo_shaped_spec
from engine.training.train import TrainConfig, ae_definition, unet_definition


def test_demo_shaped_has_the_networks_train_demo_builds():
    spec = demo_shaped_spec()
    config = TrainConfig()
    assert spec.networks["unet"] == unet_definition(config)
    assert spec.networks["autoencoder"] == ae_definition(config)
    assert spec.latent_shape == (config.latent_channels, 20, 24, 20)


def test_bundle_half_is_the_bundle_at_half_resolution():
    full, half = bundle_sized_spec(), bundle_half_spec()
    assert half.networks == full.networks
    assert [2 * n for n in half.output_shape[1:]] == list(full.output_shape[1:])
