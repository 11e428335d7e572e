"""Every size field of a model definition is bounded before anything is built (issue 37 point 5).

``num_res_blocks: 100000`` used to hang ``volsynth generate --model`` at 100 % CPU: the network was built
(on torch's meta device) to count its parameters for the memory estimate. Now each field is checked
against a range first and the count is computed from the fields. Tests replace MONAI's constructors with
one that fails, so a refusal that came after a build cannot pass.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json

import pytest

from engine.cli import main
from engine.errors import ModelInvalid
from engine.models import networks, open_model_folder
from engine.models.budget import parameter_count
from engine.models.bundle import _resolve
from engine.models.network_limits import FIELD_CHECKS, check_network_sizes
from engine.testing import (
    MAISI_ENVIRONMENT,
    MAISI_INFERENCE_CONFIG,
    MAISI_MODALITY_MAPPING,
    maisi_definitions,
    tiny_spec,
)
from tests.engine.models.bundles import SCALED_AUTOENCODER, SCALED_UNET


@pytest.fixture
def nothing_is_built(monkeypatch):
    """Fail the test if any allow-listed MONAI network class is even imported for construction."""

    def refuse(module, name):
        if (module, name) in networks._NETWORKS.values():
            raise AssertionError(f"{name} was built before the definition was refused")
        return importlib.import_module(module).__dict__[name]

    monkeypatch.setattr(networks, "_import", refuse)


# field -> (value out of range, what the message must say) for a VolSynth folder's U-Net / autoencoder
UNET_CASES = {
    "num_res_blocks": (100000, "num_res_blocks is 100000; allowed: a whole number from 0 to 16"),
    "channels": ([8, 16] * 50, "channels has 100 entries; allowed: 1 to 8"),
    "transformer_num_layers": (
        10**6,
        "transformer_num_layers is 1000000; allowed: a whole number from 1 to 16",
    ),
    "num_class_embeds": (10**9, "num_class_embeds is 1000000000; allowed: a whole number from 1 to 4,096"),
    "cross_attention_dim": (
        10**7,
        "cross_attention_dim is 10000000; allowed: a whole number from 1 to 4,096",
    ),
    "norm_num_groups": (10**6, "norm_num_groups is 1000000; allowed: a whole number from 1 to 1,024"),
    "num_head_channels": ([0, 10**8], r"num_head_channels\[1\] is 100000000; allowed: .* 0 to 16,384"),
    "in_channels": (10**6, "in_channels is 1000000; allowed: a whole number from 1 to 256"),
    "out_channels": (-1, "out_channels is -1; allowed: a whole number from 1 to 256"),
    "spatial_dims": (7, "spatial_dims is 7; allowed: 3"),
    "attention_levels": ([False] * 1000, "attention_levels has 1,000 entries; allowed: 1 to 8"),
    "norm_eps": (float("inf"), r"norm_eps is inf; allowed: a number in \(0, 1\]"),
    "resblock_updown": ("yes", "resblock_updown is 'yes'; allowed: true or false"),
}
AUTOENCODER_CASES = {
    "num_res_blocks": ([1, 1, 10**5], r"num_res_blocks\[2\] is 100000; allowed: a whole number from 0 to 16"),
    "latent_channels": (10**5, "latent_channels is 100000; allowed: a whole number from 1 to 64"),
    "channels": ([8, 2**40, 8], r"channels\[1\] is 1099511627776; allowed: .* 1 to 16,384"),
}


def _hostile_folder(tiny_models_dir, tmp_path, role, field, value):
    import shutil

    folder = tmp_path / f"{role}-{field}"
    shutil.copytree(tiny_models_dir / "tiny-latent", folder)
    spec = json.loads((folder / "spec.json").read_text())
    spec["networks"][role][field] = value
    (folder / "spec.json").write_text(json.dumps(spec))
    return folder


@pytest.mark.parametrize(
    ("role", "field"),
    [("unet", f) for f in UNET_CASES] + [("autoencoder", f) for f in AUTOENCODER_CASES],
)
def test_each_size_field_out_of_range_is_refused_when_the_folder_opens(
    role, field, tiny_models_dir, tmp_path, nothing_is_built
):
    value, message = (UNET_CASES if role == "unet" else AUTOENCODER_CASES)[field]
    folder = _hostile_folder(tiny_models_dir, tmp_path, role, field, value)
    with pytest.raises(ModelInvalid, match=f"networks.{role}.{message}") as refused:
        open_model_folder(folder)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300


def test_generate_with_100000_res_blocks_exits_with_one_line_and_writes_nothing(
    tiny_models_dir, tmp_path, capsys, nothing_is_built
):
    folder = _hostile_folder(tiny_models_dir, tmp_path, "unet", "num_res_blocks", 100000)
    out = tmp_path / "out.nii.gz"
    assert main(["generate", "--model", str(folder), "--steps", "2", "--out", str(out)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("networks.unet.num_res_blocks is 100000; allowed: a whole number from 0 to 16")
    assert not out.exists()


def test_build_network_itself_refuses_before_constructing(nothing_is_built):
    """Training, XLA conversion and the GPU check build from definitions too: the check is in the builder."""
    hostile = dict(tiny_spec().networks["unet"], num_res_blocks=[1, 100000])
    with pytest.raises(ModelInvalid, match=r"unet.num_res_blocks\[1\] is 100000"):
        networks.build_network(hostile, where="unet")


def test_fields_each_in_range_but_too_many_attention_layers_together_are_refused(nothing_is_built):
    """8 levels x 33 attention blocks x 16 layers: every field allowed, 128k modules to build."""
    hostile = dict(
        tiny_spec().networks["unet"],
        channels=[8] * 8,
        attention_levels=[True] * 8,
        num_head_channels=8,
        num_res_blocks=16,
        transformer_num_layers=16,
    )
    with pytest.raises(ModelInvalid, match="unet has 4,240 attention layers in all .*allowed: at most 256"):
        networks.build_network(hostile, where="unet")
    published = dict(
        hostile, num_res_blocks=2, attention_levels=[False] * 6 + [True] * 2, transformer_num_layers=1
    )
    check_network_sizes(published, "unet")  # MAISI-like: 11 attention layers


def test_per_level_lists_must_match_the_levels():
    hostile = dict(tiny_spec().networks["unet"], num_res_blocks=[1, 1, 1])
    with pytest.raises(ModelInvalid, match="num_res_blocks has 3 entries but channels has 2"):
        check_network_sizes(hostile, "unet")


def test_every_constructor_argument_of_the_allowed_classes_has_a_bound():
    """A MONAI upgrade that adds a size field to an allow-listed class fails here until it is bounded."""
    unbounded = []
    for short, (module, name) in networks._NETWORKS.items():
        for parameter in list(inspect.signature(getattr(importlib.import_module(module), name)).parameters)[
            1:
        ]:
            if parameter not in FIELD_CHECKS:
                unbounded.append(f"{short}.{parameter}")
    assert unbounded == []


def _write_bundle_json(folder, unet: dict, autoencoder: dict) -> None:
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    config = {
        "network_def": unet,
        "autoencoder_def": autoencoder,
        "noise_scheduler": {
            "_target_": "monai.networks.schedulers.DDIMScheduler",
            "num_train_timesteps": 1000,
            "schedule": "scaled_linear_beta",
            "beta_start": 0.0015,
            "beta_end": 0.0205,
        },
    }
    metadata = {
        "network_data_format": {"outputs": {"pred": {"num_channels": 1, "spatial_shape": [32, 64, 32]}}}
    }
    (folder / "configs" / "inference.json").write_text(json.dumps(config))
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata))
    for name in ("model.pt", "autoencoder.pt"):  # opening a bundle finds checkpoints, it does not read them
        (folder / "models" / name).write_bytes(b"")


def test_a_bundle_with_a_hostile_size_field_is_refused_on_open(tmp_path, nothing_is_built):
    good = tmp_path / "good"
    _write_bundle_json(good, SCALED_UNET, SCALED_AUTOENCODER)
    assert open_model_folder(good).spec.latent_shape == (3, 4, 8, 4)
    bad = tmp_path / "bad"
    _write_bundle_json(bad, SCALED_UNET, dict(SCALED_AUTOENCODER, channels=[8] * 40))
    with pytest.raises(ModelInvalid, match="autoencoder definition.channels has 40 entries; allowed: 1 to 8"):
        open_model_folder(bad)


def _write_maisi_json(folder, network: dict) -> None:
    (folder / "configs").mkdir(parents=True)
    (folder / "models").mkdir()
    files = {
        "config_network_rflow.json": network,
        "config_maisi_diff_model_rflow-mr-brain.json": MAISI_INFERENCE_CONFIG,
        "environment_maisi_diff_model_rflow-mr-brain.json": MAISI_ENVIRONMENT,
        "modality_mapping.json": MAISI_MODALITY_MAPPING,
    }
    for name, data in files.items():
        (folder / "configs" / name).write_text(json.dumps(data))
    for name in ("diff_unet_3d_rflow-mr-brain_v1.pt", "autoencoder_v1.pt"):
        (folder / "models" / name).write_bytes(b"")


@pytest.mark.parametrize(
    ("key", "field", "value", "message"),
    [
        ("diffusion_unet_def", "num_res_blocks", 100000, "diffusion_unet_def.num_res_blocks is 100000"),
        (
            "diffusion_unet_def",
            "num_class_embeds",
            10**9,
            "diffusion_unet_def.num_class_embeds is 1000000000",
        ),
        (
            "autoencoder_def",
            "num_splits",
            10**6,
            "autoencoder_def.num_splits is 1000000; allowed: .* 1 to 128",
        ),
        ("autoencoder_def", "num_channels", [8] * 60, "autoencoder_def.num_channels has 60 entries"),
    ],
)
def test_a_maisi_folder_with_a_hostile_size_field_is_refused_on_open(
    key, field, value, message, tmp_path, nothing_is_built
):
    network = maisi_definitions(tiny=True)
    good = tmp_path / "good"
    _write_maisi_json(good, network)
    assert open_model_folder(good).spec.source == "nv-generate"
    hostile = copy.deepcopy(network)
    hostile[key][field] = value
    bad = tmp_path / "bad"
    _write_maisi_json(bad, hostile)
    with pytest.raises(ModelInvalid, match=message):
        open_model_folder(bad)


def _definitions() -> dict[str, dict]:
    unet = tiny_spec().networks["unet"]
    autoencoder = tiny_spec().networks["autoencoder"]
    plain = tiny_spec(conditioned=False).networks["unet"]
    cases = {
        "tiny unet": unet,
        "tiny autoencoder": autoencoder,
        "resblock_updown": dict(unet, resblock_updown=True),
        "2 transformer layers": dict(unet, transformer_num_layers=2),
        "class embeddings": dict(unet, num_class_embeds=10),
        "no attention projection": dict(unet, include_fc=False),
        "uneven res blocks": dict(unet, num_res_blocks=[3, 1], channels=[16, 32], num_head_channels=[0, 16]),
        "self-attention": dict(plain, attention_levels=[True, True], num_head_channels=8),
        "autoencoder attention": dict(
            autoencoder,
            attention_levels=[False, True, True],
            with_decoder_nonlocal_attn=True,
            include_fc=False,
        ),
        "autoencoder transposed convolutions": dict(autoencoder, use_convtranspose=True),
        "controlnet": {
            "_target_": "ControlNet",
            "spatial_dims": 3,
            "in_channels": 3,
            "channels": [8, 16],
            "attention_levels": [False, True],
            "num_res_blocks": 1,
            "norm_num_groups": 8,
            "num_head_channels": [0, 8],
            "conditioning_embedding_in_channels": 1,
            "conditioning_embedding_num_channels": [8, 16],
        },
        "bundle unet": SCALED_UNET,
        "bundle autoencoder": SCALED_AUTOENCODER,
    }
    for tiny in (True, False):  # the full MAISI v2 networks too: 180 M + 21 M parameters
        config = maisi_definitions(tiny)
        cases[f"maisi unet tiny={tiny}"] = _resolve(config, config["diffusion_unet_def"])
        cases[f"maisi autoencoder tiny={tiny}"] = {
            **_resolve(config, config["autoencoder_def"]),
            "norm_float16": False,
        }
    cases["maisi regions"] = dict(
        cases["maisi unet tiny=True"],
        include_top_region_index_input=True,
        include_bottom_region_index_input=True,
    )
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_definitions()))
def test_the_parameter_count_from_the_fields_equals_the_built_networks(case):
    import torch

    definition = _definitions()[case]
    with torch.device("meta"):
        built = sum(p.numel() for p in networks.build_network(definition, where=case).parameters())
    assert parameter_count(definition, case) == built


def test_the_memory_estimate_builds_nothing(registry, nothing_is_built):
    estimate = registry.get("tiny-latent").memory_estimate()
    assert estimate["weights"] > 4 * (130_971 + 29_784)  # both networks' parameters x 4 bytes, and the file
