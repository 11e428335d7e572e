"""A tiny ``train-demo --quick`` run: every phase, checkpoints, resume/extend, and a loadable model folder."""

from __future__ import annotations

import json

import numpy as np
import torch

from engine.cli import main
from engine.models import open_model_folder


def _steps(path):
    return torch.load(path, map_location="cpu", weights_only=False)["step"]


def test_quick_train_resume_and_sample(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "model"
    args = ["train-demo", "--quick", "--seed", "1", "--work", str(work), "--out", str(out)]
    assert main([*args, "--unet-steps", "2"]) == 0
    first = capsys.readouterr().out
    assert "ae step 3/3" in first and "unet step 2/2" in first and "eta" in first
    assert "decoder step 2/2" in first and "decoder: whole-volume L1" in first
    assert _steps(work / "ae.ckpt") == 3 and _steps(work / "decoder.ckpt") == 2
    assert _steps(work / "unet.ckpt") == 2
    spec = json.loads((out / "spec.json").read_text())
    assert spec["id"] == "brain-t1-demo"
    assert spec["extra"]["training"]["unet_steps"] == 2
    assert spec["guidance"]["null_value"] == -1.0
    assert spec["networks"]["unet"]["in_channels"] == 3 + 2
    assert spec["networks"]["unet"]["with_conditioning"] and spec["networks"]["unet"]["cross_attention_dim"] == 2
    assert np.isfinite(spec["scale_factor"]) and spec["scale_factor"] > 0
    weights_before = (out / "weights.safetensors").read_bytes()

    # Resume with more U-Net steps: data, autoencoder and latents are reused, the U-Net continues at step 2.
    assert main([*args, "--unet-steps", "4", "--resume"]) == 0
    second = capsys.readouterr().out
    assert "data: done earlier, skipped" in second and "ae: done earlier, skipped" in second
    assert "decoder: done earlier, skipped" in second
    assert "unet: resumed at step 2" in second
    assert _steps(work / "unet.ckpt") == 4
    assert (out / "weights.safetensors").read_bytes() != weights_before

    # The folder is a valid VolSynth model the product's sampling path can run.
    from engine.api import SamplingRequest
    from engine.backends.local import LocalBackend

    source = open_model_folder(out)
    assert source.spec.latent_shape == (3, 20, 24, 20)
    assert "MNI152" in source.model_card()
    commands = source.spec.extra["training"]["commands"]
    assert len(commands) == 2 and "--resume" in commands[1]
    gen = LocalBackend(device="cpu").sample(SamplingRequest(model=str(out), steps=2, batch_size=1,
                                                            guidance_scale=2.0))
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        volumes = stop.value.volumes
    assert volumes.shape == (1, 1, 80, 96, 80) and np.isfinite(volumes).all()


def test_stop_after_runs_only_the_first_phases(tmp_path):
    work, out = tmp_path / "work", tmp_path / "model"
    assert main(["train-demo", "--quick", "--work", str(work), "--out", str(out), "--stop-after", "data"]) == 0
    assert (work / "data.npz").exists() and not (work / "ae.ckpt").exists() and not out.exists()
    data = np.load(work / "data.npz")
    assert data["images"].shape == (2, 80, 96, 80) and (data["brain_ml"] > 500).all()


def test_resume_refuses_a_different_seed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text(json.dumps({"seed": 99}))
    import pytest

    from engine.training.train import TrainConfig, train

    with pytest.raises(ValueError, match="different configuration"):
        train(tmp_path / "out", work, seed=1, resume=True, cfg=TrainConfig.quick(), log=lambda _: None)
