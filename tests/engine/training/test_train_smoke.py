"""A tiny ``train-demo --quick`` run: every phase, checkpoints, resume/extend, and a loadable model folder."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.cli import main
from engine.models import open_model_folder


def _steps(path):
    return torch.load(path, map_location="cpu", weights_only=False)["step"]


@pytest.mark.slow
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
    assert spec["networks"]["unet"]["in_channels"] == 8 + 2  # 8 latent channels + 2 condition channels
    assert spec["schedule"]["prediction_type"] == "v_prediction"
    assert (
        spec["networks"]["unet"]["with_conditioning"] and spec["networks"]["unet"]["cross_attention_dim"] == 2
    )
    assert np.isfinite(spec["scale_factor"]) and spec["scale_factor"] > 0
    # MNI space: the affine of the training crop in the template's grid, and four tissue-map channels that
    # the autoencoder encodes and decodes with the image.
    assert spec["space"] == "MNI152NLin2009aSym"
    assert np.allclose(np.array(spec["affine"])[:3, :3], 2 * np.eye(3))
    assert spec["label_channels"] == ["GM", "WM", "CSF", "ventricles"]
    assert spec["output_shape"] == [5, 80, 96, 80]
    assert (
        spec["networks"]["autoencoder"]["in_channels"] == spec["networks"]["autoencoder"]["out_channels"] == 5
    )
    assert (work / "ae_before_adversarial.ckpt").exists()  # kept to measure what the adversarial loss bought
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
    assert source.spec.latent_shape == (8, 20, 24, 20)
    assert "MNI152" in source.model_card()
    commands = source.spec.extra["training"]["commands"]
    assert len(commands) == 2 and "--resume" in commands[1]
    # Each invocation is a part of the run, with the training time it added (the card lists them).
    parts = source.spec.extra["training"]["parts"]
    assert [p["command"] for p in parts] == commands and all(p["seconds"] > 0 for p in parts)
    assert "Parts (each invocation" in source.model_card() or "part 2" in source.model_card()
    gen = LocalBackend(device="cpu").sample(
        SamplingRequest(model=str(out), steps=2, batch_size=1, guidance_scale=2.0)
    )
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        result = stop.value
    assert result.volumes.shape == (1, 5, 80, 96, 80) and np.isfinite(result.volumes).all()
    assert result.volume(0).shape == (80, 96, 80) and result.space == "MNI152NLin2009aSym"
    maps = result.tissue_maps(0)
    assert list(maps) == ["GM", "WM", "CSF", "ventricles"]
    assert all(m.shape == (80, 96, 80) and m.min() >= 0 and m.max() <= 1 for m in maps.values())
    np.testing.assert_array_equal(result.affine, np.array(spec["affine"]))


@pytest.mark.slow
def test_stop_after_runs_only_the_first_phases(tmp_path):
    work, out = tmp_path / "work", tmp_path / "model"
    assert (
        main(["train-demo", "--quick", "--work", str(work), "--out", str(out), "--stop-after", "data"]) == 0
    )
    assert (work / "data.npz").exists() and not (work / "ae.ckpt").exists() and not out.exists()
    data = np.load(work / "data.npz")
    assert data["images"].shape == (2, 80, 96, 80) and (data["brain_ml"] > 500).all()
    assert data["tissue"].shape == (2, 4, 80, 96, 80) and data["tissue"].dtype == np.uint8


def test_resume_refuses_a_different_seed(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text(json.dumps({"seed": 99}))
    import pytest

    from engine.training.train import TrainConfig, train

    with pytest.raises(ValueError, match="different configuration"):
        train(tmp_path / "out", work, seed=1, resume=True, cfg=TrainConfig.quick(), log=lambda _: None)


@pytest.mark.slow
def test_resume_may_change_unet_settings_only_before_a_unet_exists(tmp_path):
    import pytest

    from engine.training.train import TrainConfig, config_with_steps, train

    work, out = tmp_path / "work", tmp_path / "out"
    quick = config_with_steps(TrainConfig.quick(), None, 2)
    train(out, work, seed=1, cfg=quick, log=lambda _: None, stop_after="decoder")
    eps = replace(quick, prediction_type="epsilon", min_snr_gamma=0.0)
    train(out, work, seed=1, resume=True, cfg=eps, log=lambda _: None)  # a new U-Net on the same autoencoder
    assert json.loads((out / "spec.json").read_text())["schedule"]["prediction_type"] == "epsilon"
    with pytest.raises(ValueError, match="different configuration"):  # now a U-Net exists: no switching
        train(out, work, seed=1, resume=True, cfg=config_with_steps(quick, None, 3), log=lambda _: None)
    with pytest.raises(ValueError, match="different configuration"):  # the autoencoder never may change
        train(out, work, seed=1, resume=True, cfg=replace(eps, ae_lr=5e-4), log=lambda _: None)


def test_min_snr_weights_down_weight_only_the_low_noise_steps():
    import torch
    from monai.networks.schedulers import DDPMScheduler

    from engine.training.train import min_snr_weights

    sched = DDPMScheduler(
        num_train_timesteps=1000, schedule="scaled_linear_beta", beta_start=0.0015, beta_end=0.0205
    )
    t = torch.tensor([0, 50, 200, 500, 999])
    w = min_snr_weights(sched.alphas_cumprod, t, 5.0)
    snr = sched.alphas_cumprod[t] / (1 - sched.alphas_cumprod[t])
    assert torch.allclose(w[snr <= 5], torch.ones(int((snr <= 5).sum())))  # noisy steps keep full weight
    assert (w[snr > 5] < 1).all() and w[0] < 0.01  # t=0 has SNR ~ 700: weight 5/700
    assert torch.equal(min_snr_weights(sched.alphas_cumprod, t, 0.0), torch.ones(5))  # gamma 0 = plain MSE
    v = min_snr_weights(sched.alphas_cumprod, t, 5.0, "v_prediction")  # min(SNR, 5) / (SNR + 1)
    assert torch.allclose(v, snr.clamp(max=5) / (snr + 1))
    assert v[-1] < 0.01 and v[0] < w[0] * 1.01 and (v <= 1).all()


def test_new_autoencoder_starts_with_the_configured_posterior_sigma():
    from engine.training.train import TrainConfig, new_autoencoder

    x = torch.rand(1, 5, 16, 16, 16)  # the image + 4 tissue maps
    for sigma in (0.1, 0.5):
        ae = new_autoencoder(replace(TrainConfig.quick(), ae_init_sigma=sigma))
        with torch.no_grad():
            mu, z_sigma = ae.encode(x)
        assert torch.allclose(z_sigma, torch.full_like(z_sigma, sigma), rtol=1e-5)
        assert mu.std() > 0  # only the variance head is fixed; the mean still depends on the input


@pytest.mark.slow
def test_resume_redoes_the_decoder_when_its_settings_change_and_keeps_the_unet(tmp_path):
    from engine.training.train import TrainConfig, train

    work, out = tmp_path / "work", tmp_path / "out"
    quick = TrainConfig.quick()
    train(out, work, seed=1, cfg=quick, log=lambda _: None)
    unet_before = (work / "unet.ckpt").read_bytes()
    decoder_before = torch.load(work / "decoder.ckpt", weights_only=False)["model"]
    lines: list[str] = []
    train(out, work, seed=1, resume=True, cfg=replace(quick, decoder_lr=1e-3), log=lines.append)
    assert any("fine-tuning it again" in line for line in lines)
    assert (work / "unet.ckpt").read_bytes() == unet_before
    decoder_after = torch.load(work / "decoder.ckpt", weights_only=False)["model"]
    changed = {k for k in decoder_before if not torch.equal(decoder_before[k], decoder_after[k])}
    assert changed and all(k.startswith(("decoder.", "post_quant_conv.")) for k in changed)  # encoder frozen
    assert json.loads((out / "spec.json").read_text())["extra"]["training"]["config"]["decoder_lr"] == 1e-3
