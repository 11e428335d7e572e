"""Model folders, MONAI bundles and the registry: what loads, and what is refused (with which message)."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.errors import InvalidRequest, ModelInvalid, ModelNotFound
from engine.models import open_model_folder
from engine.models.registry import ModelRegistry
from engine.models.spec import ModelSpec
from engine.testing import tiny_spec
from tests.engine.models.bundles import write_bundle


def test_spec_json_round_trip():
    spec = tiny_spec()
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec


def test_spec_default_guidance_round_trips_and_is_checked():
    spec = tiny_spec(default_guidance_scale=2.5)
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["guidance"] == {"null_value": -1.0, "default_scale": 2.5}
    assert ModelSpec.from_dict(data).default_guidance_scale == 2.5
    del data["guidance"]["default_scale"]  # specs written before the field existed
    assert ModelSpec.from_dict(data).default_guidance_scale == 1.0
    with pytest.raises(ModelInvalid, match="default_scale must be a finite number >= 0"):
        ModelSpec.from_dict({**data, "guidance": {"null_value": -1.0, "default_scale": -2}})
    unguided = tiny_spec(conditioned=False).to_dict()
    with pytest.raises(ModelInvalid, match="default_scale is 3, but the model has no guidance null_value"):
        ModelSpec.from_dict({**unguided, "guidance": {"null_value": None, "default_scale": 3.0}})


def test_affine_is_ras_and_centred():
    spec = tiny_spec(output_xyz=(16, 24, 16))
    affine = spec.affine()
    assert affine[0, 0] > 0 and affine[1, 1] > 0 and affine[2, 2] > 0  # +R, +A, +S
    centre = affine @ [7.5, 11.5, 7.5, 1]
    assert centre[:3] == pytest.approx([0, 0, 0])


def test_condition_checks():
    spec = tiny_spec()
    assert spec.resolve_conditioning({"brain_volume": 1000}) == {
        "brain_volume": 1000.0,
        "ventricle_volume": 25.0,
    }
    with pytest.raises(InvalidRequest, match="no condition 'age'.*brain_volume, ventricle_volume"):
        spec.resolve_conditioning({"age": 3})
    with pytest.raises(
        InvalidRequest, match=r"brain_volume=5000 is outside the model's range \[900, 1500\] mL"
    ):
        spec.resolve_conditioning({"brain_volume": 5000})


def test_registry_lists_and_resolves(registry, tiny_models_dir):
    ids = {s.id for s in registry.list()}
    assert {"tiny-latent", "tiny-pixel", "tiny-rflow"} <= ids
    assert registry.get("tiny-latent").spec.kind == "latent"
    assert registry.get(str(tiny_models_dir / "tiny-pixel")).spec.id == "tiny-pixel"
    with pytest.raises(ModelNotFound, match="unknown model 'nope'; available: .*tiny-latent"):
        registry.get("nope")


def test_weights_sha256_is_recorded(registry):
    import hashlib

    source = registry.get("tiny-latent")
    expected = hashlib.sha256((source.path / "weights.safetensors").read_bytes()).hexdigest()
    assert source.weights_sha256() == {"weights.safetensors": expected}


def test_spec_with_expression_is_refused(tmp_path, tiny_models_dir):
    import shutil

    folder = tmp_path / "evil"
    shutil.copytree(tiny_models_dir / "tiny-latent", folder)
    spec = json.loads((folder / "spec.json").read_text())
    spec["networks"]["unet"]["channels"] = "$__import__('os').system('touch pwned')"
    (folder / "spec.json").write_text(json.dumps(spec))
    with pytest.raises(ModelInvalid, match="expression"):
        open_model_folder(folder)


def test_scaled_brain_bundle_opens_and_samples(tmp_path):
    bundle = write_bundle(tmp_path / "brain_ldm")
    source = open_model_folder(bundle)
    spec = source.spec
    assert spec.source == "monai-bundle"
    assert spec.kind == "latent"
    assert spec.output_shape == (1, 32, 64, 32)
    assert spec.latent_shape == (3, 4, 8, 4)  # three downsamplings of the 4-level autoencoder
    assert spec.condition_names == ("gender", "age", "ventricular_volume", "brain_volume")
    assert spec.condition("ventricular_volume").default == pytest.approx(0.2)  # from "ventricular_vol"
    assert set(spec.conditioning_modes) == {"concat", "crossattn"}
    assert spec.default_sampler == "ddim"
    assert spec.voxel_spacing_mm == (1.0, 1.0, 1.0)
    backend = LocalBackend("cpu", ModelRegistry([tmp_path]))
    result = run(backend.sample(SamplingRequest(model=str(bundle), steps=2, conditioning={"age": 0.5})))
    assert result.volumes.shape == (1, 1, 32, 64, 32)
    assert set(result.provenance["model"]["weights_sha256"]) == {"autoencoder.pt", "model.pt"}


def test_bundle_with_code_in_network_definition_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    bundle = write_bundle(
        tmp_path / "evil",
        inference_overrides={
            "diffusion_def": {
                "_target_": "monai.networks.nets.DiffusionModelUNet",
                "spatial_dims": f"$__import__('os').system('touch {marker}') or 3",
            }
        },
    )
    with pytest.raises(ModelInvalid, match="holds an expression.*never evaluates code"):
        open_model_folder(bundle)
    assert not marker.exists()


def test_bundle_with_non_monai_target_is_refused(tmp_path):
    bundle = write_bundle(
        tmp_path / "evil", inference_overrides={"diffusion_def": {"_target_": "os.system", "command": "true"}}
    )
    with pytest.raises(ModelInvalid):
        open_model_folder(bundle).load()


class _Exploit:
    """Unpickled with code execution, it would create ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        import shlex

        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_malicious_pickle_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    bundle = write_bundle(tmp_path / "evil")
    with open(bundle / "models" / "model.pt", "wb") as handle:
        pickle.dump({"weight": _Exploit(marker)}, handle)
    with pytest.raises(ModelInvalid, match="refusing to load checkpoint model.pt"):
        open_model_folder(bundle).load()
    assert not marker.exists()


def test_load_old_bundle_goes_through_load_old_state_dict(tmp_path):
    new = open_model_folder(write_bundle(tmp_path / "new", seed=1)).load()
    old_source = open_model_folder(write_bundle(tmp_path / "old", seed=1, load_old=True))
    assert old_source.load_old
    old_keys = torch.load(old_source.weight_files["unet"], weights_only=True).keys()
    assert any(".to_out.0." in k for k in old_keys)  # really the old naming
    old = old_source.load()
    for key, value in new.unet.state_dict().items():
        assert torch.equal(value, old.unet.state_dict()[key]), key


@pytest.mark.slow
def test_weights_that_do_not_fit_are_refused(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    inference = json.loads((bundle / "configs" / "inference.json").read_text())
    inference["diffusion_def"]["channels"] = [8, 16, 32]
    (bundle / "configs" / "inference.json").write_text(json.dumps(inference))
    with pytest.raises(ModelInvalid, match="unet weights do not fit"):
        open_model_folder(bundle).load()
