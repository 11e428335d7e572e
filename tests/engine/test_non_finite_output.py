"""A model that makes NaN or infinite voxels is refused and nothing is written (issue 37 point 7).

Before: NaN weights or a NaN schedule value wrote an all-NaN volume with exit 0 and "done". Now NaN weights
and schedule values are refused when the model loads or opens (ModelInvalid), and a model whose finite
weights still overflow is stopped by the sampling loop (NonFiniteOutput) before any writer sees a voxel;
the writers (NIfTI + sidecar, the vault) refuse non-finite volumes on their own as well.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.api import SamplingRequest, SamplingResult, run
from engine.backends.local import LocalBackend
from engine.cli import main
from engine.errors import ModelInvalid, NonFiniteOutput
from engine.models import open_model_folder
from engine.models.registry import ModelRegistry
from engine.nifti.io import generated_volumes
from engine.nifti.volume import Volume


def _copy_with_weights(tiny_models_dir, tmp_path, name, change) -> str:
    folder = tmp_path / name
    shutil.copytree(tiny_models_dir / "tiny-latent", folder)
    tensors = load_file(folder / "weights.safetensors")
    change(tensors)
    save_file(tensors, folder / "weights.safetensors")
    spec = json.loads((folder / "spec.json").read_text())
    spec["id"] = name
    (folder / "spec.json").write_text(json.dumps(spec))
    return folder


def _nan_weight(tensors):
    tensors["autoencoder.decoder.blocks.1.conv1.conv.weight"][0, 0, 1, 1, 1] = float("nan")


def _overflowing(tensors):
    # finite weights (1e38 is a float32) whose first step overflows to infinity
    tensors["unet.out.2.conv.weight"] = tensors["unet.out.2.conv.weight"] * 1e38


def _generate(folder, out, capsys) -> tuple[int, str]:
    rc = main(["generate", "--model", str(folder), "--steps", "3", "--out", str(out)])
    return rc, capsys.readouterr().err


@pytest.mark.slow
def test_nan_weights_are_refused_at_load_and_generate_writes_nothing(tiny_models_dir, tmp_path, capsys):
    folder = _copy_with_weights(tiny_models_dir, tmp_path, "nan-weights", _nan_weight)
    with pytest.raises(ModelInvalid, match="autoencoder weights in weights.safetensors hold NaN or infinite"):
        open_model_folder(folder).load()
    out = tmp_path / "out" / "nan.nii.gz"
    out.parent.mkdir()
    rc, err = _generate(folder, out, capsys)
    assert rc == 4 and "hold NaN or infinite values (1 of" in err and "Traceback" not in err
    assert "done in" not in err
    assert list(out.parent.iterdir()) == []


def test_an_overflowing_model_stops_at_the_first_step_and_writes_nothing(tiny_models_dir, tmp_path, capsys):
    folder = _copy_with_weights(tiny_models_dir, tmp_path, "overflows", _overflowing)
    open_model_folder(folder).load()  # every weight is finite: only the sampling loop can catch it
    out = tmp_path / "out" / "inf.nii.gz"
    out.parent.mkdir()
    rc, err = _generate(folder, out, capsys)
    assert rc == NonFiniteOutput.exit_code == 8
    last = err.strip().splitlines()[-1]
    assert "produced NaN or infinite values at denoising step 1 of 3; nothing was written" in last
    assert "done in" not in err and "Traceback" not in err
    assert list(out.parent.iterdir()) == []


def test_every_backend_gets_the_check_from_the_one_loop(tiny_models_dir, tmp_path):
    folder = _copy_with_weights(tiny_models_dir, tmp_path, "overflows", _overflowing)
    backend = LocalBackend("cpu", registry=ModelRegistry([tmp_path]))
    with pytest.raises(NonFiniteOutput, match="at denoising step 1 of 2"):
        run(backend.sample(SamplingRequest(model=str(folder), steps=2, seed=0)))


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_schedule_value_is_refused_when_the_folder_opens(tiny_models_dir, tmp_path, value):
    folder = tmp_path / "nan-schedule"
    shutil.copytree(tiny_models_dir / "tiny-latent", folder)
    text = (folder / "spec.json").read_text()
    data = json.loads(text)
    data["schedule"]["beta_end"] = 0.0205
    text = json.dumps(data).replace('"beta_end": 0.0205', f'"beta_end": {value}')
    (folder / "spec.json").write_text(text)
    with pytest.raises(ModelInvalid, match=f"schedule beta_end is {value.lower().replace('inity', '')}"):
        open_model_folder(folder)


def _nan_result(request) -> SamplingResult:
    volumes = np.zeros((1, 1, 4, 4, 4), np.float32)
    volumes[0, 0, 1, 2, 3] = np.nan
    return SamplingResult(volumes, np.eye(4), request, {"model": {"id": "x"}, "seed": 0})


def test_a_nan_result_is_refused_before_anything_is_written(tmp_path):
    """Results from an engine server or a caller's own code reach the writer without the loop's check."""
    request = SamplingRequest(model="tiny-latent", steps=2, seed=0)
    with pytest.raises(NonFiniteOutput, match="1 of 64 voxels NaN or infinite"):
        generated_volumes(_nan_result(request))
    assert list(tmp_path.iterdir()) == []


def test_the_vault_refuses_a_nan_synthetic_volume(tmp_path):
    from engine.vault import KdfParams, Vault

    vault = Vault.create(tmp_path / "vault", "a long test passphrase", kdf=KdfParams(1024, 1, 1))
    volume = np.ones((4, 4, 4), np.float32)
    volume[0, 0, 0] = np.inf
    try:
        with pytest.raises(NonFiniteOutput, match="synthetic volume has 1 of 64 voxels"):
            vault.add_synthetic(Volume(volume, np.eye(4), provenance={"model_id": "x", "seed": 0}))
        assert vault.items() == []
    finally:
        vault.lock()


def test_the_weights_check_reads_every_tensor(tmp_path):
    from engine.models.source import check_finite_weights

    check_finite_weights({"a": torch.ones(3), "step": torch.tensor(5)}, "unet", "w.safetensors")
    with pytest.raises(ModelInvalid, match=r"2 of 3 in b\)"):
        check_finite_weights(
            {"a": torch.ones(3), "b": torch.tensor([1.0, float("inf"), float("nan")])},
            "unet",
            "w.safetensors",
        )


def test_a_remote_client_gets_the_same_error_and_no_volume(tiny_models_dir, tmp_path):
    """The engine server runs the same loop; its client gets NonFiniteOutput, not a NaN volume."""
    from engine.backends.remote import RemoteBackend
    from engine.server import create_app
    from engine.testing import ServerThread

    models = tmp_path / "models"
    models.mkdir()
    _copy_with_weights(tiny_models_dir, models, "overflows", _overflowing)
    app = create_app(LocalBackend("cpu", ModelRegistry([models])), token="a-test-token-of-some-length")
    with ServerThread(app) as url:
        remote = RemoteBackend(url, token="a-test-token-of-some-length")
        with pytest.raises(
            NonFiniteOutput, match="at denoising step 1 of 2; nothing was written.*on the engine server"
        ):
            run(remote.sample(SamplingRequest(model="overflows", steps=2, seed=0)))
