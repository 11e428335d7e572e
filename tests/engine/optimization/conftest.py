"""A tiny conditioned latent model loaded once per module, plus a helper that runs the real loop."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def no_calibration_cache(monkeypatch):
    """Calibration ranges and mixed plans are measured afresh in every test (and never written to the
    user's cache); the tests of the cache itself turn it on."""
    monkeypatch.setenv("VOLSYNTH_CALIBRATION_CACHE", "0")


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    from engine.models import open_model_folder
    from engine.testing import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("opt") / "tiny-latent", model_id="tiny-latent")
    return open_model_folder(folder).load()


@pytest.fixture(scope="module")
def cpu():
    return torch.device("cpu")


def run_loop(prepared, spec, steps: int = 3, seed: int = 1):
    """Final volumes from the engine's one denoising loop."""
    from engine.api import SamplingRequest, run
    from engine.sampling import denoise

    return run(denoise(prepared, spec, SamplingRequest(steps=steps, seed=seed), torch.device("cpu"))).volumes
