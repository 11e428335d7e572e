"""Hostile and broken model folders (issue 18 point 4): listed as broken with one-line reasons, refused
before anything large is allocated, never read outside their folder, never stopping `volsynth models`."""

from __future__ import annotations

import json

import pytest

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.cli import main
from engine.errors import EngineError, ModelInvalid, OutOfMemory
from engine.models import open_model_folder
from engine.models.registry import ModelRegistry
from tests.engine.hostile.corpus import build_model_corpus

# folder -> what its one-line reason must say (refused when the folder is opened)
REFUSED_ON_OPEN = {
    "huge-output-shape": "output_shape.*4096 x 4096 x 4096.*VOLSYNTH_MAX_VOXELS",
    "huge-timesteps": "num_train_timesteps must be a whole number from 1 to 100,000",
    "negative-beta-start": "schedule beta_start must be a number from 0 to below 1, got -0.5",
    "beta-end-one": "schedule beta_end must be a number from 0 to below 1, got 1.0",
    "many-latent-channels": "latent_shape has 100000 channels",
    "deeply-nested": "nests more than 32 levels deep",
    "networks-is-a-list": "'networks' must be an object",
    "network-is-a-string": "networks.unet must be an object",
    "guidance-is-a-list": "guidance must be an object",
    "conditioning-is-a-string": "conditioning must be a list",
    "conditioning-entry-is-a-number": "each conditioning entry must be an object",
    "output-shape-words": "malformed",
    "spacing-nan": "voxel_spacing_mm must be three positive numbers",
    "condition-range-1e308": "min, max and default must be finite numbers within",
    "samplers-is-a-dict": "samplers must be a list",
    "spec-not-json": "spec.json is not valid JSON",
    "spec-is-a-list": "must hold a JSON object",
    "spec-too-big": "a model's JSON files are at most",
    "card-links-outside": "MODEL_CARD.md is a link to .*outside the model folder",
    "weights-link-outside": "weights.safetensors is a link to .*outside the model folder",
    "spec-links-outside": "spec.json is a link to .*outside the model folder",
}


@pytest.fixture(scope="module")
def model_corpus(tmp_path_factory, tiny_models_dir):
    root = tmp_path_factory.mktemp("hostile-models")
    secret = root / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    folders = build_model_corpus(root / "models", tiny_models_dir / "tiny-latent", secret)
    return root / "models", folders, secret


@pytest.mark.parametrize("case", sorted(REFUSED_ON_OPEN))
def test_bad_folder_is_refused_with_one_line(case, model_corpus):
    _, folders, secret = model_corpus
    with pytest.raises(ModelInvalid, match=REFUSED_ON_OPEN[case]) as refused:
        open_model_folder(folders[case])
    text = str(refused.value)
    assert "\n" not in text and len(text) < 600
    assert "root:x:0:0" not in text


def test_registry_lists_broken_folders_and_keeps_the_good_ones(model_corpus, tiny_models_dir):
    root, folders, _ = model_corpus
    registry = ModelRegistry([root, tiny_models_dir])
    ids = {s.id for s in registry.list()}
    assert {"tiny-latent", "tiny-pixel", "tiny-rflow", "huge-channels"} <= ids
    broken = {b.name: b.reason for b in registry.broken}
    assert set(broken) == set(REFUSED_ON_OPEN)
    assert all("\n" not in reason for reason in broken.values())
    # asking for a broken model by its folder name says why it cannot be used
    with pytest.raises(ModelInvalid, match="guidance-is-a-list cannot be used: .*guidance must be an object"):
        registry.get("guidance-is-a-list")


def test_volsynth_models_lists_broken_folders_and_exits_0(model_corpus, tiny_models_dir, monkeypatch, capsys):
    root, folders, _ = model_corpus
    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", f"{root}:{tiny_models_dir}")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny-latent" in out and "Traceback" not in out and "root:x:0:0" not in out
    for case in REFUSED_ON_OPEN:
        assert f"{case}  [broken, not usable]" in out
    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {e["id"] for e in listing if e.get("broken")} == set(REFUSED_ON_OPEN)


def test_huge_channels_refused_by_the_memory_estimate_before_allocating(model_corpus, tiny_models_dir):
    root, folders, _ = model_corpus
    source = open_model_folder(folders["huge-channels"])
    estimate = source.memory_estimate()
    assert estimate["weights"] > 50 * 2**30  # ~52 G parameters, counted on the meta device
    with pytest.raises(
        OutOfMemory, match="would need about .* GiB of memory .*only .* is available"
    ) as refused:
        source.load()
    assert "\n" not in str(refused.value)
    # generate through the local backend: the same one-line refusal, from the registry's folder
    backend = LocalBackend("cpu", registry=ModelRegistry([root, tiny_models_dir]))
    with pytest.raises(OutOfMemory):
        run(backend.sample(SamplingRequest(model="huge-channels", steps=2, seed=0)))


def test_estimate_of_a_real_model_is_modest(registry):
    estimate = registry.get("tiny-latent").memory_estimate()
    assert 0 < estimate["total"] < 64 * 2**20
    assert set(estimate) == {"weights", "denoising", "decoding", "schedule", "total"}


def test_model_card_never_follows_a_link_out(model_corpus, tmp_path, tiny_models_dir):
    """Even if the link appears after the folder was opened, the card reads as empty, not the target."""
    import os
    import shutil

    _, _, secret = model_corpus
    folder = tmp_path / "late-link"
    shutil.copytree(tiny_models_dir / "tiny-latent", folder)
    source = open_model_folder(folder)
    assert "Random weights" in source.model_card()
    (folder / "MODEL_CARD.md").unlink()
    os.symlink(secret, folder / "MODEL_CARD.md")
    assert source.model_card() == ""


def test_every_corpus_case_is_an_engine_error_through_generate(model_corpus, tiny_models_dir):
    root, folders, _ = model_corpus
    backend = LocalBackend("cpu", registry=ModelRegistry([root, tiny_models_dir]))
    for case in ("deeply-nested", "huge-output-shape", "card-links-outside"):
        with pytest.raises(EngineError) as refused:
            run(backend.sample(SamplingRequest(model=str(folders[case]), steps=2, seed=0)))
        assert "\n" not in str(refused.value)
