"""A sampler registered once, in a test, runs through ``volsynth generate`` and the engine server with no other
edit: the CLI's choices, the server's schema and the models' offers all read the sampler registry."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.api import SamplingRequest, run
from engine.backends.remote import RemoteBackend
from engine.cli import main
from engine.errors import ModelInvalid
from engine.models.spec import ModelSpec
from engine.server import create_app
from engine.testing import ServerThread, tiny_spec


def test_volsynth_generate_runs_a_made_up_sampler(made_up_sampler, model_path_env, tmp_path, capsys):
    out = tmp_path / "vol.nii.gz"
    argv = [
        "generate",
        "--model",
        "tiny-latent",
        "--sampler",
        made_up_sampler,
        "--steps",
        "3",
        "--out",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    sidecar = json.loads((tmp_path / "vol.json").read_text())
    assert sidecar["scheduler"]["sampler"] == made_up_sampler and sidecar["scheduler"]["steps"] == 3
    assert sidecar["scheduler"]["class"] == "DDPMScheduler"  # the schedule it runs on


def test_the_engine_server_offers_and_runs_a_made_up_sampler(made_up_sampler, backend):
    app = create_app(backend, token="s3cret")
    sampler_schema = app.openapi()["components"]["schemas"]["JobRequest"]["properties"]["sampler"]
    assert made_up_sampler in sampler_schema["enum"]
    request = SamplingRequest(model="tiny-latent", sampler=made_up_sampler, steps=3, seed=4)
    with ServerThread(app) as url:
        remote = RemoteBackend(url, token="s3cret")
        model = next(m for m in remote.models() if m["id"] == "tiny-latent")
        assert made_up_sampler in model["samplers"]  # the model offers every sampler of its family
        result = run(remote.sample(request))
    assert result.provenance["scheduler"]["sampler"] == made_up_sampler
    assert np.array_equal(result.volumes, run(backend.sample(request)).volumes)


def test_a_model_offers_its_family_whatever_its_file_lists(made_up_sampler):
    data = tiny_spec().to_dict()
    data["samplers"] = ["ddim", "a-sampler-registered-elsewhere"]  # e.g. an engine server's model list
    assert ModelSpec.from_dict(data).samplers == ("ddim", "ddpm", "pndm", made_up_sampler)
    data["samplers"] = ["ddim", "rflow"]
    with pytest.raises(ModelInvalid, match="not of the noise-schedule family"):
        ModelSpec.from_dict(data)
