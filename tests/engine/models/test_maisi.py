"""NV-Generate-MR-Brain (MAISI v2) folders: opened safely, sampled through the one loop on every path.

The folders are built at test time in NV-Generate's layout (engine.testing.write_maisi_folder): the real
network classes and config structure with few channels, seeded random weights perturbed (MONAI
zero-initialises output convolutions), 32x32x32 volumes at a spacing whose field of view is the recommended
T1 one. Full size belongs in the benchmark (benchmarks/maisi.py).
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
import torch

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.errors import InvalidRequest, ModelInvalid
from engine.models import networks
from engine.models.registry import ModelRegistry, open_model_folder
from engine.testing import build_maisi_networks, write_maisi_folder

SIZE = (32, 32, 32)
SPACING = (7.52, 7.52, 5.44)  # 240.6 x 240.6 x 174 mm: the recommended axial T1 field of view


@pytest.fixture(scope="module")
def maisi_root(tmp_path_factory):
    """A models folder holding one NV-Generate repository root, as its download script leaves it."""
    root = tmp_path_factory.mktemp("maisi-models")
    write_maisi_folder(root / "NV-Generate-CTMR", dim=SIZE, spacing=SPACING)
    return root


@pytest.fixture(scope="module")
def maisi_folder(maisi_root):
    return maisi_root / "NV-Generate-CTMR"


@pytest.fixture(scope="module")
def backend(maisi_root):
    return LocalBackend("cpu", ModelRegistry([maisi_root]))


def _copy(folder: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


def _edit_network_config(folder: pathlib.Path, edit) -> None:
    path = folder / "configs" / "config_network_rflow.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


# -- 1. opening ----------------------------------------------------------------------------------------------


def test_the_repository_root_is_listed_with_a_card_from_what_the_folder_says(maisi_root):
    registry = ModelRegistry([maisi_root])
    (source,) = registry.list()
    assert not registry.broken
    spec = source.spec
    assert spec.name == "NV-Generate-MR-Brain (rflow-mr-brain, MAISI v2) v1"
    assert spec.modality_names == (
        "t1w", "t2w", "flair", "swi", "mra",
        "t1w-skullstripped", "t2w-skullstripped", "flair-skullstripped", "swi-skullstripped", "mra-skullstripped",
    )  # fmt: skip
    assert dict(spec.modalities)["flair-skullstripped"] == 31 and spec.null_modality == 0
    assert spec.default_modality == "t1w" and spec.default_steps == 30 and spec.default_guidance_scale == 2
    assert spec.latent_shape == (4, 8, 8, 8) and spec.geometry["size_multiple"] == 32
    card = source.model_card()
    for text in (
        "**Version** v1",
        "NVIDIA Open Model License",
        "`t2w` — class label 10",
        "t1w: 240 x 240 x 174",
        "docs/inference.md of this folder",
        "No tissue maps",
    ):
        assert text in card


def test_volsynth_models_lists_the_folder(maisi_root, monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.setenv("VOLSYNTH_MODEL_PATH", str(maisi_root))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "NV-Generate-MR-Brain (rflow-mr-brain, MAISI v2) v1" in out
    assert "--modality {t1w,t2w,flair,swi,mra,t1w-skullstripped" in out
    assert "licence: NVIDIA Open Model License" in out


def test_the_same_files_in_a_folder_of_their_own_open_too(tmp_path):
    flat = write_maisi_folder(tmp_path / "mr-brain", dim=SIZE, spacing=SPACING, flat=True, docs=False)
    source = open_model_folder(flat)
    assert source.spec.modality_names[:4] == ("t1w", "t2w", "flair", "swi")
    # Without the repository's docs, the card says where its field-of-view table comes from instead.
    assert "not in this folder" in source.model_card()
    assert "licence: not stated" not in source.model_card()


def test_only_the_needed_definitions_are_built(maisi_folder, monkeypatch):
    """controlnet_def, mask_generation_* and a scripts-package _target_ with an expression are ignored."""
    config = json.loads((maisi_folder / "configs" / "config_network_rflow.json").read_text())
    assert config["mask_generation_helper"]["_target_"].startswith("scripts.")
    assert "controlnet_def" in config
    built = []
    real_import = networks._import
    monkeypatch.setattr(
        networks, "_import", lambda module, name: built.append(name) or real_import(module, name)
    )
    open_model_folder(maisi_folder).load()
    # Each is built twice: on the meta device for the memory estimate, then for real.
    assert set(built) == {"AutoencoderKlMaisi", "DiffusionModelUNetMaisi"}


def test_an_expression_in_a_needed_definition_is_refused_and_never_runs(maisi_folder, tmp_path):
    marker = tmp_path / "expression-ran"
    expression = f"$__import__('pathlib').Path({str(marker)!r}).touch() or 2"
    for edit in (
        lambda c: c["diffusion_unet_def"].update(num_res_blocks=expression),
        # The same expression reached through an @ reference.
        lambda c: c.update(spatial_dims=expression),
    ):
        folder = _copy(maisi_folder, tmp_path / f"case{len(list(tmp_path.iterdir()))}")
        _edit_network_config(folder, edit)
        with pytest.raises(ModelInvalid, match="expression") as info:
            open_model_folder(folder)
        assert "\n" not in str(info.value)
    assert not marker.exists()


class _RunsCodeWhenUnpickled:
    """Unpickling this object touches a file: the proof of whether a loader ran code."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def test_a_checkpoint_that_needs_pickled_objects_is_refused_and_nothing_runs(maisi_folder, tmp_path):
    folder = _copy(maisi_folder, tmp_path)
    checkpoint = folder / "models" / "diff_unet_3d_rflow-mr-brain_v1.pt"
    marker = tmp_path / "unpickled-code-ran"
    saved = torch.load(checkpoint, weights_only=True)
    saved["training_hook"] = _RunsCodeWhenUnpickled(marker)
    torch.save(saved, checkpoint)

    with pytest.raises(ModelInvalid, match="needs pickled Python objects") as info:
        open_model_folder(folder).load()
    assert "\n" not in str(info.value) and checkpoint.name in str(info.value)
    assert not marker.exists()
    # The file really carries code: NV-Generate's own loader (weights_only=False) would have run it.
    torch.load(checkpoint, weights_only=False)
    assert marker.exists()


def test_flash_attention_becomes_sdpa_without_cuda_and_provenance_says_so(backend, maisi_folder):
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine the configured flash attention is built as it is")
    from monai.apps.generation.maisi.networks.diffusion_model_unet_maisi import DiffusionModelUNetMaisi

    with pytest.raises(ValueError, match="Flash attention is only available for GPU"):
        DiffusionModelUNetMaisi(spatial_dims=3, in_channels=4, out_channels=4, use_flash_attention=True)
    result = run(backend.sample(SamplingRequest(model="NV-Generate-CTMR", steps=1, seed=1)))
    attention = result.provenance["model_build"]["attention"]
    assert attention["requested"] == "flash" and attention["kernel"] == "sdpa" and attention["blocks"] > 0
    assert "CUDA" in attention["reason"]


# -- 2. generating --------------------------------------------------------------------------------------------


def test_t2w_and_flair_volumes_in_their_spacing_with_marks_and_provenance(backend):
    results = {
        modality: run(
            backend.sample(SamplingRequest(model="NV-Generate-CTMR", steps=2, seed=7, modality=modality))
        )
        for modality in ("t2w", "flair")
    }
    t2w, flair = results["t2w"], results["flair"]
    assert t2w.volumes.shape == (1, 1, *SIZE)
    assert not np.array_equal(t2w.volumes, flair.volumes)  # the modality reaches the U-Net
    for result, label in ((t2w, 10), (flair, 11)):
        assert np.allclose(np.diag(result.affine)[:3], SPACING)
        assert result.provenance["synthetic"] is True
        output = result.provenance["output"]
        assert output["class_label"] == label and output["null_class_label"] == 0
        assert output["spacing_tensor"] == pytest.approx([752.0, 752.0, 544.0])
        assert output["scale_factor"] == pytest.approx(1.25)
        assert "x 1000, clipped below at 0" in output["intensity"]
        assert result.request.output_size == SIZE and result.request.voxel_spacing_mm == SPACING
        assert result.request.guidance_scale == 2.0 and result.request.steps == 2
        volume = result.volumes
        assert volume.min() >= 0 and np.array_equal(volume, np.trunc(volume)) and volume.max() > 1
        assert "warnings" not in result.provenance  # the recommended field of view


def _reference(folder: pathlib.Path, modality_label: int, steps: int, seed: int, guidance: float):
    """NV-Generate's own sequence written out with direct MONAI calls: RFlowScheduler, the U-Net with
    class_labels / spacing_tensor (conditioned half first, its unconditioned half with class 0), the
    autoencoder's decode of latent / scale_factor, then x 1000, clip at 0, truncate."""
    from monai.networks.schedulers import RFlowScheduler

    unet, autoencoder = build_maisi_networks(tiny=True, seed=0)
    config = json.loads((folder / "configs" / "config_network_rflow.json").read_text())
    schedule = {k: v for k, v in config["noise_scheduler"].items() if not k.startswith("_")}
    scheduler = RFlowScheduler(**schedule)
    latent = (1, 4, *(n // 4 for n in SIZE))
    scheduler.set_timesteps(steps, input_img_size_numel=int(np.prod(latent[2:])))
    x = torch.randn(latent, generator=torch.Generator().manual_seed(seed))
    spacing = torch.tensor([[100.0 * v for v in SPACING]] * 2)
    labels = torch.tensor([modality_label, 0])
    timesteps = scheduler.timesteps
    next_timesteps = torch.cat((timesteps[1:], torch.tensor([0], dtype=timesteps.dtype)))
    with torch.inference_mode():
        for t, next_t in zip(timesteps, next_timesteps, strict=True):
            out = unet(
                torch.cat([x, x]),
                timesteps=torch.full((2,), float(t)),
                class_labels=labels,
                spacing_tensor=spacing,
            )
            cond, uncond = out.chunk(2)
            x, _ = scheduler.step(uncond + guidance * (cond - uncond), t, x, next_t)
        image = autoencoder.decode_stage_2_outputs(x / 1.25)
    return (image * 1000).clamp(min=0).trunc().numpy()


def test_the_loop_matches_direct_calls_of_rflow_scheduler_and_the_maisi_unet(backend, maisi_folder):
    result = run(
        backend.sample(SamplingRequest(model="NV-Generate-CTMR", steps=3, seed=11, modality="flair"))
    )
    expected = _reference(maisi_folder, 11, steps=3, seed=11, guidance=2.0)
    difference = np.abs(result.volumes - expected)
    # Truncation to whole numbers can flip a voxel by 1 where float rounding differs at the last bit.
    assert difference.max() <= 1.0 and (difference == 0).mean() > 0.999


def test_guidance_one_runs_the_conditioned_half_only(backend, maisi_folder):
    result = run(
        backend.sample(
            SamplingRequest(model="NV-Generate-CTMR", steps=2, seed=5, modality="t2w", guidance_scale=1.0)
        )
    )
    expected = _reference(maisi_folder, 10, steps=2, seed=5, guidance=1.0)
    assert np.abs(result.volumes - expected).max() <= 1.0


def test_size_spacing_and_modality_outside_what_the_networks_take_are_refused(backend):
    cases = {
        "multiple of 32": dict(output_size=(48, 32, 32)),
        "beyond the model's maximum volume": dict(output_size=(1024, 512, 256)),
        "from 0.25 to 8 mm": dict(voxel_spacing_mm=(0.1, 1.0, 1.0)),
        "has no modality 'pd'": dict(modality="pd"),
    }
    for message, fields in cases.items():
        with pytest.raises(InvalidRequest, match=message):
            run(backend.sample(SamplingRequest(model="NV-Generate-CTMR", steps=1, **fields)))
    with pytest.raises(InvalidRequest, match="modality must be a name"):
        SamplingRequest(modality="T1 w")
    with pytest.raises(InvalidRequest, match="three whole numbers"):
        SamplingRequest(output_size=(64, 64))


def test_models_without_modality_or_size_choice_refuse_them(registry):
    local = LocalBackend("cpu", registry)
    with pytest.raises(InvalidRequest, match="takes no modality"):
        run(local.sample(SamplingRequest(model="tiny-latent", steps=1, modality="t2w")))
    with pytest.raises(InvalidRequest, match="makes 16x24x16 volumes only"):
        run(local.sample(SamplingRequest(model="tiny-latent", steps=1, output_size=(32, 32, 32))))
    # Unset, they stay unset in the request as run: the old models' records do not change.
    result = run(local.sample(SamplingRequest(model="tiny-latent", steps=1)))
    assert result.request.modality == "" and result.request.output_size is None


def test_a_field_of_view_away_from_the_recommended_one_warns_naming_it(backend):
    events = []
    request = SamplingRequest(
        model="NV-Generate-CTMR",
        steps=1,
        modality="t2w",
        output_size=(64, 64, 32),
        voxel_spacing_mm=(1.0, 1.0, 1.0),
    )
    result = run(backend.sample(request), events.append)
    (warning,) = result.provenance["warnings"]
    assert (
        "field of view 64x64x32 mm" in warning and "t2w (240x240x158 mm" in warning and "unusable" in warning
    )
    assert any(warning in e.message for e in events)  # the CLI and the app show it while it runs
    assert result.volumes.shape == (1, 1, 64, 64, 32)
    assert np.allclose(np.diag(result.affine)[:3], 1.0)


def test_the_cli_writes_the_volume_in_its_spacing_and_prints_the_warning(maisi_folder, tmp_path, capsys):
    import nibabel as nib

    from engine.cli import main

    out = tmp_path / "flair.nii.gz"
    args = ["generate", "--model", str(maisi_folder), "--modality", "flair", "--steps", "1"]
    assert main([*args, "--size", "32x32x64", "--spacing", "1x1x1", "--out", str(out)]) == 0
    image = nib.load(out)
    assert image.shape == (32, 32, 64) and np.allclose(image.header.get_zooms(), 1.0)
    assert b"SYNTHETIC" in image.header["descrip"].tobytes()
    assert "warning: field of view 32x32x64 mm is outside" in capsys.readouterr().err
    sidecar = json.loads(out.with_name("flair.json").read_text())
    assert sidecar["output"]["modality"] == "flair" and sidecar["request"]["output_size"] == [32, 32, 64]
    assert main(["generate", "--model", str(maisi_folder), "--size", "30x32x32", "--out", str(out)]) == 2


@pytest.mark.slow
def test_tissue_maps_of_random_weights_are_refused_and_the_volume_still_written(
    maisi_folder, tmp_path, capsys
):
    from engine.cli import main

    out = tmp_path / "x.nii.gz"
    args = ["generate", "--model", str(maisi_folder), "--modality", "t1w-skullstripped", "--steps", "1"]
    assert (
        main([*args, "--tissue-maps", "--out", str(out)]) == 0
    )  # the volume is valid; only maps are missing
    line = next(
        x for x in capsys.readouterr().err.splitlines() if x.startswith("no tissue maps for x.nii.gz")
    )
    assert "the volume is written" in line and "does not look like a brain MRI" in line
    assert out.is_file() and not list(tmp_path.glob("*probseg*"))
    sidecar = json.loads(out.with_name("x.json").read_text())
    assert sidecar["tissue_maps_not_made"] in line and "tissue_maps" not in sidecar


def test_the_engine_server_runs_the_same_request(backend):
    from engine.backends.remote import RemoteBackend
    from engine.server import create_app
    from engine.testing import ServerThread

    request = SamplingRequest(
        model="NV-Generate-CTMR", steps=1, seed=2, modality="swi-skullstripped", voxel_spacing_mm=SPACING
    )
    with ServerThread(create_app(backend, token="t0ken")) as url:
        remote = RemoteBackend(url, token="t0ken")
        result = run(remote.sample(request))
        # The app builds its picker entry for a server's model from /models: the choices come through.
        from engine.models.spec import ModelSpec

        listed = ModelSpec.from_dict(next(m for m in remote.models() if m["id"] == "NV-Generate-CTMR"))
        assert listed.modality_names[:2] == ("t1w", "t2w") and listed.geometry["size_multiple"] == 32
        import httpx

        refused = httpx.post(
            f"{url}/jobs", json={"model": "NV-Generate-CTMR", "output_size": [32, 32]},
            headers={"Authorization": "Bearer t0ken"},
        )  # fmt: skip
    expected = run(backend.sample(request))
    assert np.array_equal(result.volumes, expected.volumes)
    assert np.array_equal(result.affine, expected.affine)
    assert result.request.modality == "swi-skullstripped" and result.provenance["output"]["class_label"] == 32
    assert refused.status_code == 422 and "output_size" in refused.text


# -- 3. fitting a workstation ---------------------------------------------------------------------------------


def test_the_streamed_decode_gives_the_same_volume(backend):
    from engine.api.optimization_config import OptimizationConfig

    request = SamplingRequest(model="NV-Generate-CTMR", steps=1, seed=4, modality="t1w-skullstripped")
    plain = run(backend.sample(request))
    streamed = run(backend.sample(request.replace(optimization=OptimizationConfig(streamed_decode=True))))
    assert streamed.provenance["optimization"]["report"]["streamed_decode"]["applied"]
    difference = np.abs(streamed.volumes - plain.volumes)
    assert difference.max() <= 1.0 and (difference == 0).mean() > 0.999  # whole numbers: see the parity test


def test_memory_is_estimated_before_loading_and_a_machine_too_small_is_refused(maisi_folder, monkeypatch):
    from engine.errors import OutOfMemory
    from engine.nifti import checks as input_checks

    source = open_model_folder(maisi_folder)
    estimate = source.memory_estimate()
    assert estimate["total"] == sum(v for k, v in estimate.items() if k not in ("total", "decoding_full"))
    assert estimate["decoding"] <= estimate["decoding_full"]
    from engine.models import maisi

    read = []
    monkeypatch.setattr(maisi, "_read_checkpoint", lambda path: read.append(path))
    monkeypatch.setattr(input_checks, "available_memory", lambda: 1 << 20)
    with pytest.raises(OutOfMemory, match="would need about .* but only 1.0 MiB is available"):
        source.load()
    assert not read  # refused before a checkpoint was read


def test_the_setting_measured_fastest_here_reaches_a_maisi_generation(
    maisi_folder, tmp_path, monkeypatch, capsys
):
    """Point 3: the model runs under the machine's best measured settings. A tune result kept for this folder's
    weights on this machine (a recorded record, so the test does not spend minutes measuring) makes
    ``--settings fastest-here`` run with the recommended row, and the sidecar records what applied."""
    from engine.cli import main
    from engine.machine.probe import probe_machine
    from engine.optimization import tune_store

    monkeypatch.setenv("VOLSYNTH_TUNE_DIR", str(tmp_path / "tune"))
    out = tmp_path / "t2w.nii.gz"
    args = ["generate", "--model", str(maisi_folder), "--settings", "fastest-here", "--steps", "1"]
    assert main([*args, "--out", str(out)]) == 2
    assert "nothing measured for this model on this machine yet" in capsys.readouterr().err
    versions = tune_store.current_versions()
    sha = open_model_folder(maisi_folder).weights_sha256()

    def row(name, config, seconds, verdict):
        return {"name": name, "config": config, "end_to_end_s": seconds, "psnr_db": 90.0,
                "end_to_end_verdict": {"verdict": verdict}}  # fmt: skip

    tune_store.save_result({
        "format": tune_store.TUNE_FORMAT, "fingerprint": probe_machine().fingerprint(),
        "model": {"key": tune_store.model_key(sha)}, "versions": versions,
        "versions_key": tune_store.versions_key(versions),
        "rows": [row("fp32", {}, 10.0, "reference"), row("Low memory", {"streamed_decode": True}, 7.0, "faster")],
    })  # fmt: skip
    assert main([*args, "--out", str(out)]) == 0
    sidecar = json.loads(out.with_name("t2w.json").read_text())
    assert sidecar["request"]["optimization"]["streamed_decode"] is True
    assert sidecar["optimization"]["report"]["streamed_decode"]["applied"] is True
