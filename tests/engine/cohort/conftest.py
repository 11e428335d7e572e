"""A real local Ray runtime (started once for these tests, stopped after) and a tiny model to run on it."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")


@pytest.fixture(scope="session")
def ray_runtime():
    """Ray on 127.0.0.1 with 2 CPUs and no dashboard; yields the GCS address other processes can join."""
    import ray

    from engine.cohort.runner import start_ray, stop_ray

    assert start_ray(num_cpus=2), "a Ray runtime was already running in the test process"
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        stop_ray()


@pytest.fixture(scope="session")
def cohort_model(tmp_path_factory):
    """A tiny conditioned latent model (weights perturbed: MONAI zero-initialises the U-Net's output)."""
    from engine.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("cohort-models") / "tiny-cohort", model_id="tiny-cohort")


def spec_dict(model, **changes):
    data = {
        "name": "tiny-cohort",
        "model": str(model),
        "sampler": "ddim",
        "steps": 4,
        "seeds": 2,
        "draws": 2,
        "draw_seed": 11,
        "conditioning": {
            "brain_volume": {"distribution": "normal", "mean": 1200.0, "sd": 150.0},
            "ventricle_volume": {"values": [20.0, 60.0]},
        },
    }
    data.update(changes)
    return data
