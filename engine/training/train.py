"""Train the shipped brain-T1 latent diffusion model on a 2-core CPU: data, autoencoder, latents, U-Net.

The run is split into phases, each resumable from what it left in the work folder:

1. ``data``: synthetic T1 volumes (:mod:`engine.training.synth`) with their measured brain and ventricle
   volumes, saved once to ``data.npz``.
2. ``ae``: a small fully convolutional ``AutoencoderKL`` trained on random patches (whole volumes are far
   too slow on this CPU; a fully convolutional network decodes whole volumes all the same). Loss: L1 +
   image-gradient L1 (keeps edges sharper without a perceptual network) + a small KL term.
3. ``latents``: every training volume encoded once (posterior mean and sigma cached); the latent
   ``scale_factor`` = 1 / std of sampled latents, as in MONAI's latent diffusion tutorials.
4. ``unet``: a ``DiffusionModelUNet`` on the cached latents, conditioned on normalised brain and ventricle
   volume by concatenation *and* cross-attention (the MONAI brain-LDM bundle's path), with 10% condition
   dropout to the null value -1 so the model supports classifier-free guidance. Exponential moving average
   (EMA) weights are what is exported: on short runs they give much cleaner samples.
5. ``export``: the model folder (spec.json, weights.safetensors, MODEL_CARD.md) via
   :func:`engine.models.export.save_model_folder`.

Checkpoints (model, optimizer, EMA, RNG states, step) are written every ``checkpoint_every`` steps and at
the end of each phase; ``resume=True`` continues from them. The number of steps is part of the config, not
derived from wall time, so a run is reproducible from its seed (up to floating-point nondeterminism of
multithreaded CPU kernels).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.anatomy.template import MNI_SPACE, OUTPUT_SHAPE, crop_affine
from engine.training.synth import TISSUE_NAMES

MODEL_ID = "brain-t1-demo"
NULL_VALUE = -1.0
# The guidance scale the shipped model samples with unless asked otherwise. At 1.0 the conditions move the
# anatomy too little against seed-to-seed variation (measured ventricle volume rose by ~18 mL over a
# requested 7-104 mL sweep, same seeds); at 3.0 it rose by ~45 mL with the same brain-mask Dice. CFG doubles
# the U-Net batch, which the inference budget allows (see the model card).
DEFAULT_GUIDANCE = 3.0


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (saved next to the checkpoints and in the spec)."""

    n_volumes: int = 320
    ae_channels: tuple[int, ...] = (16, 32, 32)
    latent_channels: int = 8
    ae_steps: int = 1600
    ae_batch: int = 4
    ae_patch: int = 40
    ae_lr: float = 1e-3
    kl_weight: float = 1e-6
    # Initial posterior sigma of the autoencoder (its log-variance head starts constant). MONAI's default
    # starts at sigma 1, and with a KL weight of 1e-6 only the reconstruction gradient pulls sigma down: after
    # 1200 CPU steps half the latent channels still had sigma ~0.9 against a mean spread of ~0.45, so the
    # decoder learned to ignore them and blurred the GM/WM boundary. Starting small keeps every channel
    # informative; the sampled latents still carry noise, so the latent space stays smooth for diffusion.
    ae_init_sigma: float = 0.1
    # Whole-volume decoder fine-tuning after patch training: GroupNorm statistics of a whole volume (half
    # background) differ from those of brain-centred patches, which shifts whole-volume decodes.
    decoder_steps: int = 100
    decoder_lr: float = 3e-4
    grad_weight: float = 0.5
    # Paired tissue maps (GM, WM, CSF, ventricles) are extra autoencoder channels, encoded and decoded with
    # the image, so every generated image comes with its maps from the same latent; L1 on them, this weight.
    tissue_weight: float = 1.0
    # Adversarial patch loss (MONAI PatchDiscriminator, least squares) on the image channel, switched on
    # after ``adv_start`` of the autoencoder steps (a discriminator facing an untrained decoder only adds
    # noise): L1 and gradient losses alone regress the 2 mm GM ribbon to the GM/WM average; the
    # discriminator penalises that blur, which no pixel loss does. Needs no pretrained weights.
    adv_weight: float = 0.02
    adv_start: float = 0.35
    disc_channels: int = 16
    disc_lr: float = 5e-4
    unet_channels: tuple[int, ...] = (32, 64, 64)
    unet_head_channels: int = 32
    unet_steps: int = 3000
    unet_batch: int = 8
    unet_lr: float = 3e-4
    ema_decay: float = 0.998
    cond_dropout: float = 0.1
    # Min-SNR-gamma loss weighting (Hang et al., ICCV 2023): low-noise timesteps, whose targets are
    # easy but dominate the plain MSE's gradient, are down-weighted; the high-noise steps that decide the
    # anatomy (and where the conditions act) get more of a short CPU budget. 0 = plain MSE.
    min_snr_gamma: float = 5.0
    # v-prediction (Salimans & Ho 2022): at high noise the network in effect predicts the clean latent, which
    # an epsilon-predicting network can only give through a 1/sqrt(alpha_bar) amplification of its error
    # (x0 error 34 at t=900 after 1500 epsilon steps here: samples were noise). The anatomy is decided there.
    prediction_type: str = "v_prediction"
    checkpoint_every: int = 100
    # Condition ranges (user units) mapped to [0, 1]; they cover the synthetic training distribution.
    brain_ml_range: tuple[float, float] = (850.0, 1700.0)
    ventricle_ml_range: tuple[float, float] = (0.0, 160.0)
    num_train_timesteps: int = 1000

    @classmethod
    def quick(cls) -> TrainConfig:
        """A tiny configuration for tests: seconds, not minutes; the output is not a useful model."""
        return cls(
            n_volumes=2,
            ae_channels=(8, 16, 16),
            ae_steps=3,
            ae_batch=1,
            ae_patch=32,  # the patch discriminator's 3 strided layers need at least 32
            adv_start=0.5,
            disc_channels=8,
            decoder_steps=2,
            unet_channels=(32, 32, 32),
            unet_head_channels=8,
            unet_steps=3,
            unet_batch=2,
            checkpoint_every=2,
        )


def ae_definition(cfg: TrainConfig) -> dict[str, Any]:
    """AutoencoderKL as a JSON definition (what spec.json stores and build_network reads)."""
    channels = 1 + len(TISSUE_NAMES)
    return {
        "_target_": "AutoencoderKL",
        "spatial_dims": 3,
        "in_channels": channels,
        "out_channels": channels,
        "channels": list(cfg.ae_channels),
        "latent_channels": cfg.latent_channels,
        "num_res_blocks": 1,
        "norm_num_groups": min(cfg.ae_channels),
        "attention_levels": [False] * len(cfg.ae_channels),
        "with_encoder_nonlocal_attn": False,
        "with_decoder_nonlocal_attn": False,
    }


def unet_definition(cfg: TrainConfig) -> dict[str, Any]:
    """DiffusionModelUNet with concat (2 extra input channels) and cross-attention conditioning."""
    levels = len(cfg.unet_channels)
    return {
        "_target_": "DiffusionModelUNet",
        "spatial_dims": 3,
        "in_channels": cfg.latent_channels + 2,
        "out_channels": cfg.latent_channels,
        "channels": list(cfg.unet_channels),
        "attention_levels": [False] * (levels - 1) + [True],
        "num_res_blocks": 1,
        "num_head_channels": [0] * (levels - 1) + [cfg.unet_head_channels],
        "norm_num_groups": min(32, min(cfg.unet_channels)),
        "with_conditioning": True,
        "cross_attention_dim": 2,
    }


def schedule(cfg: TrainConfig) -> dict[str, Any]:
    return {
        "num_train_timesteps": cfg.num_train_timesteps,
        "schedule": "scaled_linear_beta",
        "beta_start": 0.0015,
        "beta_end": 0.0205,
        "prediction_type": cfg.prediction_type,
        "clip_sample": False,
    }


# Settings that only the U-Net phase reads.
UNET_ONLY_SETTINGS = (
    "unet_channels",
    "unet_head_channels",
    "unet_batch",
    "unet_lr",
    "ema_decay",
    "cond_dropout",
    "min_snr_gamma",
    "prediction_type",
)


@dataclass
class RunState:
    """What the run has produced so far; written to ``state.json`` in the work folder."""

    phases_done: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    scale_factor: float | None = None
    losses: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)  # every invocation that contributed, in order
    # One entry per invocation (a "part" of the run): its command and the training seconds it added.
    parts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> RunState:
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))


def _rng_state() -> dict[str, Any]:
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])


def _save_checkpoint(path: Path, **payload) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)  # atomic: a crash mid-write never leaves a truncated checkpoint


def _load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    # weights_only=False: our own checkpoints hold numpy RNG state tuples; never used on downloaded files.
    return torch.load(path, map_location="cpu", weights_only=False)


class _Progress:
    """Progress lines with rate and ETA, printed at most every ``every`` seconds."""

    def __init__(self, phase: str, total: int, start: int, log: Callable[[str], None], every: float = 15.0):
        self.phase, self.total, self.start, self.log, self.every = phase, total, start, log, every
        self.t0 = self.last = time.perf_counter()

    def update(self, step: int, loss: float, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        done = step - self.start
        rate = (now - self.t0) / max(done, 1)
        self.log(
            f"{self.phase} step {step}/{self.total}  loss {loss:.4f}  {rate:.2f} s/step  "
            f"eta {rate * (self.total - step) / 60:.1f} min"
        )


def normalise_conditions(cfg: TrainConfig, brain_ml: np.ndarray, ventricle_ml: np.ndarray) -> np.ndarray:
    """(n, 2) conditions in [0, 1] (clipped) with the spec's linear mapping."""
    b = (brain_ml - cfg.brain_ml_range[0]) / (cfg.brain_ml_range[1] - cfg.brain_ml_range[0])
    v = (ventricle_ml - cfg.ventricle_ml_range[0]) / (cfg.ventricle_ml_range[1] - cfg.ventricle_ml_range[0])
    return np.clip(np.stack([b, v], axis=1), 0.0, 1.0).astype(np.float32)


# -- phases -------------------------------------------------------------------------------------------


def phase_data(cfg: TrainConfig, work: Path, seed: int, log) -> None:
    from engine.training.synth import generate_dataset

    images, tissue, brain, vent = generate_dataset(cfg.n_volumes, seed, log=log)
    tmp = work / "data.tmp.npz"
    np.savez(tmp, images=images, tissue=tissue, brain_ml=brain, ventricle_ml=vent)
    tmp.replace(work / "data.npz")
    log(
        f"data: {cfg.n_volumes} volumes; brain {brain.min():.0f}-{brain.max():.0f} mL "
        f"(median {np.median(brain):.0f}); ventricles {vent.min():.1f}-{vent.max():.1f} mL "
        f"(median {np.median(vent):.1f})"
    )


class _TrainingVolumes:
    """The training set as the autoencoder sees it: image + tissue maps, (channels, x, y, z) float32."""

    def __init__(self, work: Path):
        data = np.load(work / "data.npz")
        self.images, self.tissue = data["images"], data["tissue"]

    def __len__(self) -> int:
        return len(self.images)

    def get(self, i: int, region: tuple[slice, ...] = ()) -> np.ndarray:
        image = self.images[(i, *region)].astype(np.float32)[None]
        tissue = self.tissue[(i, slice(None), *region)].astype(np.float32) / 255.0
        return np.concatenate([image, tissue])

    def batch(self, indices, regions=None):
        import torch

        regions = regions or [()] * len(indices)
        return torch.from_numpy(np.stack([self.get(i, r) for i, r in zip(indices, regions, strict=True)]))


def _reconstruction_loss(recon, target, cfg: TrainConfig):
    """L1 + gradient L1 on the image channel, L1 on the tissue channels; returns (loss, image L1)."""
    import torch

    image, ref = recon[:, :1], target[:, :1]
    l1 = (image - ref).abs().mean()
    grad = sum((torch.diff(image, dim=d) - torch.diff(ref, dim=d)).abs().mean() for d in (2, 3, 4))
    tissue = (recon[:, 1:] - target[:, 1:]).abs().mean() if recon.shape[1] > 1 else 0.0
    return l1 + cfg.grad_weight * grad + cfg.tissue_weight * tissue, l1


def _kl(z_mu, z_sigma):
    import torch

    return (
        0.5
        * (z_mu.pow(2) + z_sigma.pow(2) - torch.log(z_sigma.pow(2) + 1e-8) - 1).sum(dim=(1, 2, 3, 4)).mean()
    )


class _Adversary:
    """A patch discriminator on the image channel and its least-squares GAN losses."""

    def __init__(self, cfg: TrainConfig):
        import torch
        from monai.losses import PatchAdversarialLoss
        from monai.networks.nets import PatchDiscriminator

        self.net = PatchDiscriminator(
            spatial_dims=3,
            num_layers_d=3,
            channels=cfg.disc_channels,
            in_channels=1,
            out_channels=1,
            norm="INSTANCE",
        )
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.disc_lr)
        self.loss = PatchAdversarialLoss(criterion="least_squares")

    def generator_loss(self, recon):
        return self.loss(
            self.net(recon[:, :1].contiguous())[-1], target_is_real=True, for_discriminator=False
        )

    def train_step(self, recon, real) -> float:
        fake_logits = self.net(recon[:, :1].detach().contiguous())[-1]
        real_logits = self.net(real[:, :1].contiguous())[-1]
        loss = 0.5 * (
            self.loss(fake_logits, target_is_real=False, for_discriminator=True)
            + self.loss(real_logits, target_is_real=True, for_discriminator=True)
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()

    def state_dict(self) -> dict:
        return {"model": self.net.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])


def phase_ae(cfg: TrainConfig, work: Path, seed: int, log, resume: bool) -> float:
    import torch

    volumes = _TrainingVolumes(work)
    torch.manual_seed(seed + 1)  # before building: the initial weights come from this seed
    ae = new_autoencoder(cfg)
    adversary = _Adversary(cfg)
    opt = torch.optim.AdamW(ae.parameters(), lr=cfg.ae_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.ae_steps))
    ckpt = work / "ae.ckpt"
    step = 0
    rng = np.random.RandomState(seed + 1)
    if resume and ckpt.exists():
        state = _load_checkpoint(ckpt)
        ae.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["lr"])
        adversary.load_state_dict(state["adversary"])
        _set_rng_state(state["rng"])
        rng.set_state(state["patch_rng"])
        step = state["step"]
        log(f"ae: resumed at step {step}")
    ae.train()
    p = cfg.ae_patch
    shape = OUTPUT_SHAPE
    adv_from = int(cfg.adv_start * cfg.ae_steps)
    progress = _Progress("ae", cfg.ae_steps, step, log)
    loss_val = float("nan")
    while step < cfg.ae_steps:
        if step == adv_from and step > 0:
            # Kept to measure what the adversarial loss bought (the model card's blur comparison).
            _save_checkpoint(work / "ae_before_adversarial.ckpt", model=ae.state_dict(), step=step)
        idx = rng.randint(len(volumes), size=cfg.ae_batch)
        # Patches centred mostly on the brain (the background is trivially easy to reconstruct).
        corners = [
            [rng.randint(max(1, int(0.15 * (n - p))), max(2, int(0.85 * (n - p)) + 1)) for n in shape]
            for _ in idx
        ]
        x = volumes.batch(idx, [tuple(slice(c, c + p) for c in corner) for corner in corners])
        recon, z_mu, z_sigma = ae(x)
        loss, l1 = _reconstruction_loss(recon, x, cfg)
        loss = loss + cfg.kl_weight * _kl(z_mu, z_sigma)
        adversarial = step >= adv_from
        if adversarial:
            loss = loss + cfg.adv_weight * adversary.generator_loss(recon)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if adversarial:
            adversary.train_step(recon, x)
        step += 1
        loss_val = l1.item()
        progress.update(step, loss_val, force=step == cfg.ae_steps)
        if step % cfg.checkpoint_every == 0 or step == cfg.ae_steps:
            _save_checkpoint(
                ckpt,
                model=ae.state_dict(),
                optimizer=opt.state_dict(),
                lr=sched.state_dict(),
                adversary=adversary.state_dict(),
                rng=_rng_state(),
                patch_rng=rng.get_state(),
                step=step,
            )
    return loss_val


def new_autoencoder(cfg: TrainConfig):
    """A freshly initialised AutoencoderKL whose posterior sigma starts at ``cfg.ae_init_sigma``."""
    import torch

    from engine.models.networks import build_network

    ae = build_network(ae_definition(cfg), "autoencoder")
    head = ae.quant_conv_log_sigma.conv  # outputs log(sigma^2)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(2 * math.log(cfg.ae_init_sigma))
    return ae


def _cosine(total: int, warmup: int = 50):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def load_autoencoder(cfg: TrainConfig, work: Path, finetuned: bool = True):
    """The trained autoencoder; with ``finetuned``, the whole-volume decoder fine-tuning when it exists."""
    from engine.models.networks import build_network

    ae = build_network(ae_definition(cfg), "autoencoder")
    path = work / "decoder.ckpt"
    if not (finetuned and path.exists()):
        path = work / "ae.ckpt"
    ae.load_state_dict(_load_checkpoint(path)["model"])
    return ae.eval()


def phase_latents(cfg: TrainConfig, work: Path, seed: int, log) -> tuple[float, float]:
    import torch

    ae = load_autoencoder(cfg, work, finetuned=False)
    volumes = _TrainingVolumes(work)
    mus, sigmas = [], []
    recon_err = []
    started = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(volumes), 4):
            x = volumes.batch(range(i, min(i + 4, len(volumes))))
            mu, sigma = ae.encode(x)
            mus.append(mu)
            sigmas.append(sigma)
            if i < 16:  # whole-volume reconstruction error on a few volumes, for the log and the card
                recon_err.append(float((ae.decode(mu)[:, :1] - x[:, :1]).abs().mean()))
            if (i // 4) % 20 == 0:
                log(f"latents {i + len(x)}/{len(volumes)}  {time.perf_counter() - started:.0f}s")
    mu, sigma = torch.cat(mus), torch.cat(sigmas)
    gen = torch.Generator().manual_seed(seed + 2)
    z = mu + sigma * torch.randn(mu.shape, generator=gen)
    scale_factor = float(1.0 / z.std())
    torch.save({"mu": mu, "sigma": sigma}, work / "latents.pt")
    log(
        f"latents: shape {tuple(mu.shape[1:])}, scale_factor {scale_factor:.4f}, "
        f"whole-volume L1 of reconstructions {np.mean(recon_err):.4f}"
    )
    return scale_factor, float(np.mean(recon_err))


def phase_decoder(cfg: TrainConfig, work: Path, seed: int, log) -> float:
    """Fine-tune the decoder on whole volumes from the cached latents; the encoder stays frozen.

    The autoencoder trained on brain-centred patches; its GroupNorm layers normalise over space, so a whole
    volume (about half background) gets different statistics and decodes with an intensity offset. The
    encoder is frozen so the cached latents, on which the U-Net trains, stay valid (this phase can run
    while the U-Net trains). Writes ``decoder.ckpt`` (whole autoencoder + optimizer + RNG + step + seconds).
    """
    import torch

    ae = load_autoencoder(cfg, work, finetuned=False)
    params = list(ae.decoder.parameters()) + list(ae.post_quant_conv.parameters())
    ae.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.decoder_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.decoder_steps, warmup=10))
    lat = torch.load(work / "latents.pt", weights_only=True)
    mu, sigma = lat["mu"], lat["sigma"]
    volumes = _TrainingVolumes(work)
    # The discriminator carries on from the patch phase, so whole-volume decodes stay as sharp.
    adversary = _Adversary(cfg)
    adversary.load_state_dict(_load_checkpoint(work / "ae.ckpt")["adversary"])
    ckpt = work / "decoder.ckpt"
    step, seconds = 0, 0.0
    if ckpt.exists():
        state = _load_checkpoint(ckpt)
        ae.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["lr"])
        adversary.load_state_dict(state["adversary"])
        _set_rng_state(state["rng"])
        step, seconds = state["step"], state["seconds"]
        log(f"decoder: resumed at step {step}")
    else:
        torch.manual_seed(seed + 4)
    ae.train()
    progress = _Progress("decoder", cfg.decoder_steps, step, log)
    started = time.perf_counter() - seconds
    while step < cfg.decoder_steps:
        i = int(torch.randint(len(mu), (1,)))
        z = mu[i : i + 1] + sigma[i : i + 1] * torch.randn_like(mu[i : i + 1])
        x = volumes.batch([i])
        recon = ae.decode(z)
        loss, l1 = _reconstruction_loss(recon, x, cfg)
        loss = loss + cfg.adv_weight * adversary.generator_loss(recon)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        adversary.train_step(recon, x)
        step += 1
        progress.update(step, l1.item(), force=step == cfg.decoder_steps)
        if step % 20 == 0 or step == cfg.decoder_steps:
            _save_checkpoint(
                ckpt,
                model=ae.state_dict(),
                optimizer=opt.state_dict(),
                lr=sched.state_dict(),
                adversary=adversary.state_dict(),
                rng=_rng_state(),
                step=step,
                seconds=time.perf_counter() - started,
            )
    ae.eval()
    with torch.inference_mode():
        errs = [
            float((ae.decode(mu[i : i + 1])[:, :1] - volumes.batch([i])[:, :1]).abs().mean())
            for i in range(min(8, len(mu)))
        ]
    log(f"decoder: whole-volume L1 of reconstructions {np.mean(errs):.4f}")
    return float(np.mean(errs))


def min_snr_weights(alphas_cumprod, t, gamma: float, prediction_type: str = "epsilon"):
    """Per-sample loss weights under Min-SNR-gamma (1 if gamma is 0).

    The weight on the x0-error, min(SNR, gamma), expressed on the network's target: divided by SNR for an
    epsilon target and by SNR + 1 for a v target (Hang et al. 2023).
    """
    import torch

    if gamma <= 0:
        return torch.ones(len(t))
    snr = alphas_cumprod[t] / (1 - alphas_cumprod[t])
    return snr.clamp(max=gamma) / (snr + 1 if prediction_type == "v_prediction" else snr)


def phase_unet(
    cfg: TrainConfig,
    work: Path,
    seed: int,
    scale_factor: float,
    log,
    resume: bool,
    deadline: float | None = None,
) -> float:
    import torch
    from monai.networks.schedulers import DDPMScheduler

    from engine.models.networks import build_network

    lat = torch.load(work / "latents.pt", weights_only=True)
    mu, sigma = lat["mu"], lat["sigma"]
    data = np.load(work / "data.npz")
    cond = torch.from_numpy(normalise_conditions(cfg, data["brain_ml"], data["ventricle_ml"]))
    torch.manual_seed(seed + 3)  # before building: the initial weights come from this seed
    unet = build_network(unet_definition(cfg), "unet")
    ema = build_network(unet_definition(cfg), "unet")
    ema.load_state_dict(unet.state_dict())
    ema.requires_grad_(False)
    opt = torch.optim.AdamW(unet.parameters(), lr=cfg.unet_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.unet_steps))
    s = schedule(cfg)
    noise_sched = DDPMScheduler(
        num_train_timesteps=s["num_train_timesteps"],
        schedule=s["schedule"],
        beta_start=s["beta_start"],
        beta_end=s["beta_end"],
        prediction_type=s["prediction_type"],
    )
    ckpt = work / "unet.ckpt"
    step = 0
    if resume and ckpt.exists():
        state = _load_checkpoint(ckpt)
        unet.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["lr"])
        _set_rng_state(state["rng"])
        step = state["step"]
        log(f"unet: resumed at step {step}")

    def save(step: int) -> None:
        _save_checkpoint(
            ckpt,
            model=unet.state_dict(),
            ema=ema.state_dict(),
            optimizer=opt.state_dict(),
            lr=sched.state_dict(),
            rng=_rng_state(),
            step=step,
        )

    unet.train()
    progress = _Progress("unet", cfg.unet_steps, step, log)
    loss_avg = None
    while step < cfg.unet_steps:
        if deadline is not None and time.perf_counter() > deadline:
            # Out of wall-clock budget (a shared CPU can be much slower than measured): stop cleanly with
            # a checkpoint; the card records the steps actually run, and --resume can extend it.
            log(f"unet: time budget reached at step {step}; stopping")
            save(step)
            break
        loss = _unet_batch_loss(cfg, unet, noise_sched, mu, sigma, cond, scale_factor)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        # EMA with a warm-up: early on the average follows the raw weights closely.
        decay = min(cfg.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pu in zip(ema.parameters(), unet.parameters(), strict=True):
                pe.lerp_(pu, 1 - decay)
        loss_avg = loss.item() if loss_avg is None else 0.98 * loss_avg + 0.02 * loss.item()
        progress.update(step, loss_avg, force=step == cfg.unet_steps)
        if step % cfg.checkpoint_every == 0 or step == cfg.unet_steps:
            save(step)
    return float(loss_avg) if loss_avg is not None else float("nan")


def _unet_batch_loss(cfg: TrainConfig, unet, noise_sched, mu, sigma, cond, scale_factor: float):
    """The U-Net's weighted loss on one random batch of latents (drawn from the cached posteriors), its
    conditions dropped to the null value at the configured rate; the draws in the order training has
    always made them (resumed runs rely on it)."""
    import torch

    idx = torch.randint(len(mu), (cfg.unet_batch,))
    z = (mu[idx] + sigma[idx] * torch.randn_like(mu[idx])) * scale_factor
    c = cond[idx].clone()
    drop = torch.rand(len(idx)) < cfg.cond_dropout
    c[drop] = NULL_VALUE  # the unconditioned input classifier-free guidance uses at sampling time
    noise = torch.randn_like(z)
    t = torch.randint(0, cfg.num_train_timesteps, (len(idx),))
    noisy = noise_sched.add_noise(z, noise, t)
    concat = c[:, :, None, None, None].expand(-1, -1, *z.shape[2:])
    pred = unet(torch.cat([noisy, concat], dim=1), t, c[:, None, :])
    target = noise_sched.get_velocity(z, noise, t) if cfg.prediction_type == "v_prediction" else noise
    per_sample = (pred - target).pow(2).mean(dim=(1, 2, 3, 4))
    weights = min_snr_weights(noise_sched.alphas_cumprod, t, cfg.min_snr_gamma, cfg.prediction_type)
    loss = (per_sample * weights).mean()
    return loss


def build_spec(cfg: TrainConfig, scale_factor: float, data_stats: dict[str, float], provenance: dict):
    """The ModelSpec of the trained model."""
    from engine.models.spec import ConditionSpec, ModelSpec

    return ModelSpec(
        id=MODEL_ID,
        name="Brain T1 demo (MNI152-derived, synthetic)",
        kind="latent",
        description=(
            "Latent diffusion model of skull-stripped T1-weighted brain MRI at 2 mm, trained on "
            "synthetic volumes derived from the MNI152 2009 template. Research and education only."
        ),
        networks={"unet": unet_definition(cfg), "autoencoder": ae_definition(cfg)},
        schedule=schedule(cfg),
        default_sampler="ddim",
        default_steps=50,
        output_shape=(1 + len(TISSUE_NAMES), *OUTPUT_SHAPE),
        latent_shape=(cfg.latent_channels, *(n // 4 for n in OUTPUT_SHAPE)),
        scale_factor=scale_factor,
        voxel_spacing_mm=(2.0, 2.0, 2.0),
        conditioning=(
            ConditionSpec(
                "brain_volume",
                "Brain volume",
                "mL",
                cfg.brain_ml_range[0],
                cfg.brain_ml_range[1],
                round(data_stats["brain_ml_median"]),
                "Grey + white matter volume (the synthetic training data span "
                f"{data_stats['brain_ml_p1']:.0f}-{data_stats['brain_ml_p99']:.0f} mL, 1st-99th pct).",
            ),
            ConditionSpec(
                "ventricle_volume",
                "Ventricle volume",
                "mL",
                cfg.ventricle_ml_range[0],
                cfg.ventricle_ml_range[1],
                round(data_stats["ventricle_ml_median"]),
                "Lateral + third ventricle volume (training data span "
                f"{data_stats['ventricle_ml_p1']:.0f}-{data_stats['ventricle_ml_p99']:.0f} mL).",
            ),
        ),
        conditioning_modes=("concat", "crossattn"),
        guidance_null_value=NULL_VALUE,
        default_guidance_scale=DEFAULT_GUIDANCE,
        intensity_range=(0.0, 1.0),
        extra={"training": provenance},
        space=MNI_SPACE,
        world_affine=tuple(tuple(float(v) for v in row) for row in crop_affine()),
        label_channels=TISSUE_NAMES,
    )


def data_stats(work: Path) -> dict[str, float]:
    data = np.load(work / "data.npz")
    out = {}
    for key in ("brain_ml", "ventricle_ml"):
        v = data[key]
        out[f"{key}_median"] = float(np.median(v))
        out[f"{key}_p1"] = float(np.percentile(v, 1))
        out[f"{key}_p99"] = float(np.percentile(v, 99))
        out[f"{key}_min"] = float(v.min())
        out[f"{key}_max"] = float(v.max())
    return out


def train(
    out: Path,
    work: Path,
    seed: int = 0,
    resume: bool = False,
    cfg: TrainConfig | None = None,
    log: Callable[[str], None] = print,
    command: str = "",
    minutes_budget: float | None = None,
    stop_after: str | None = None,
) -> Path | None:
    """Run (or resume) every phase and write the model folder to ``out``.

    Args:
        out: model folder to write (spec.json, weights.safetensors, MODEL_CARD.md).
        work: folder for data, checkpoints and the run state.
        seed: seeds data generation, initialisation and every random draw of training.
        resume: continue from the work folder's checkpoints instead of starting over.
        cfg: training configuration; the default is the shipped model's.
        log: where progress lines go.
        command: the command line, recorded in the spec's provenance and the model card.
        minutes_budget: wall-clock budget of this invocation; the U-Net phase stops early (with a
            checkpoint) when it runs out. The steps actually run are recorded.
        stop_after: run the phases up to and including this one ("data", "ae", "latents", "decoder",
            "unet") and return None without exporting.

    Returns:
        The model folder.
    """

    import torch

    cfg = cfg or TrainConfig()
    deadline = time.perf_counter() + 60 * minutes_budget if minutes_budget else None
    torch.set_num_threads(min(2, torch.get_num_threads()))
    work.mkdir(parents=True, exist_ok=True)
    cfg_dict = {**asdict(cfg), "seed": seed}
    restart_decoder = _prepare_work(work, cfg, cfg_dict, resume)
    state_path = work / "state.json"
    state, seconds_before = _open_state(
        state_path, work, command or f"volsynth train-demo --seed {seed}", restart_decoder, log
    )
    _reopen_phases(state, work, cfg, resume)
    if not _run_phases(state, state_path, cfg, work, seed, log, deadline, stop_after):
        return None
    state.parts.append(
        {"command": state.commands[-1], "seconds": sum(state.seconds.values()) - seconds_before}
    )
    state.save(state_path)
    return _export(out, work, cfg, cfg_dict, seed, state, log)


def _prepare_work(work: Path, cfg: TrainConfig, cfg_dict: dict[str, Any], resume: bool) -> bool:
    """Check that a resumed work folder was made by a compatible configuration (or clear it for a fresh run),
    then record this configuration. Returns whether the decoder fine-tuning must be redone."""
    config_path = work / "config.json"
    restart_decoder = False
    if resume and config_path.exists():
        saved = json.loads(config_path.read_text())
        # Step counts may change on resume (to extend a run), and so may the decoder fine-tuning's learning
        # rate: the fine-tuning is then redone. Nothing downstream depends on it (the U-Net trains on the
        # frozen encoder's latents).
        free: tuple[str, ...] = ("ae_steps", "unet_steps", "decoder_steps", "decoder_lr")
        restart_decoder = saved.get("decoder_lr") != cfg.decoder_lr
        if not (work / "unet.ckpt").exists():
            # No U-Net trained yet: its own settings may change (a new U-Net on the same autoencoder).
            free += UNET_ONLY_SETTINGS
        if {k: v for k, v in saved.items() if k not in free} != json.loads(
            json.dumps({k: v for k, v in cfg_dict.items() if k not in free})
        ):
            raise ValueError(
                f"--resume: {config_path} was written by a different configuration or seed; "
                "use a fresh --work folder"
            )
    elif not resume:
        for name in ("state.json", "data.npz", "ae.ckpt", "latents.pt", "decoder.ckpt", "unet.ckpt"):
            (work / name).unlink(missing_ok=True)
    config_path.write_text(json.dumps(cfg_dict, indent=2))
    return restart_decoder


def _open_state(
    state_path: Path, work: Path, command: str, restart_decoder: bool, log: Callable[[str], None]
) -> tuple[RunState, float]:
    """The run state with this invocation's command appended; also the training seconds before it."""
    state = RunState.load(state_path)
    seconds_before = sum(state.seconds.values())
    if len(state.parts) < len(state.commands):
        # Invocations from before parts were recorded: one entry for what they did together.
        done = sum(part["seconds"] for part in state.parts)
        state.parts.append(
            {"command": " && ".join(state.commands[len(state.parts) :]), "seconds": seconds_before - done}
        )
    state.commands.append(command)
    if restart_decoder:
        log(
            "decoder: its learning rate changed; fine-tuning it again from the autoencoder (the U-Net is kept)"
        )
        state.phases_done = [p for p in state.phases_done if p != "decoder"]
        (work / "decoder.ckpt").unlink(missing_ok=True)
    state.save(state_path)
    return state, seconds_before


def _reopen_phases(state: RunState, work: Path, cfg: TrainConfig, resume: bool) -> None:
    """Mark undone the phases whose checkpoints hold fewer steps than this configuration asks for."""
    # The U-Net phase may be extended by a resumed run with more steps: it is never marked done for good.
    if "unet" in state.phases_done and _checkpoint_step(work / "unet.ckpt") < cfg.unet_steps and resume:
        state.phases_done.remove("unet")
    if "ae" in state.phases_done and _checkpoint_step(work / "ae.ckpt") < cfg.ae_steps:
        state.phases_done = [p for p in state.phases_done if p not in ("ae", "latents", "decoder", "unet")]
        (work / "unet.ckpt").unlink(missing_ok=True)
        (work / "decoder.ckpt").unlink(missing_ok=True)
    if "decoder" in state.phases_done and _checkpoint_step(work / "decoder.ckpt") < cfg.decoder_steps:
        state.phases_done.remove("decoder")


def _run_phases(
    state: RunState,
    state_path: Path,
    cfg: TrainConfig,
    work: Path,
    seed: int,
    log: Callable[[str], None],
    deadline: float | None,
    stop_after: str | None,
) -> bool:
    """Data, autoencoder, latents, decoder, U-Net, each skipped when done earlier and timed into the state.
    Returns False when ``stop_after`` stopped it before the end."""

    def timed(name: str, fn):
        if name in state.phases_done:
            log(f"{name}: done earlier, skipped")
            return None
        started = time.perf_counter()
        result = fn()
        state.seconds[name] = state.seconds.get(name, 0.0) + time.perf_counter() - started
        state.phases_done.append(name)
        state.save(state_path)
        return result

    timed("data", lambda: phase_data(cfg, work, seed, log))
    if stop_after == "data":
        return False
    ae_l1 = timed("ae", lambda: phase_ae(cfg, work, seed, log, resume=True))
    if ae_l1 is not None:
        state.losses["ae_patch_l1"] = ae_l1
    if stop_after == "ae":
        return False
    lat = timed("latents", lambda: phase_latents(cfg, work, seed, log))
    if lat is not None:
        state.scale_factor, state.losses["ae_volume_l1"] = lat
    state.save(state_path)
    if stop_after == "latents":
        return False
    dec = timed("decoder", lambda: phase_decoder(cfg, work, seed, log))
    if dec is not None:
        state.losses["ae_volume_l1_finetuned"] = dec
        state.seconds["decoder"] = _load_checkpoint(work / "decoder.ckpt")["seconds"]
        state.save(state_path)
    if stop_after == "decoder":
        return False

    def train_unet() -> float:
        return phase_unet(cfg, work, seed, _scale_factor(state), log, resume=True, deadline=deadline)

    unet_loss = timed("unet", train_unet)
    if unet_loss is not None:
        state.losses["unet_mse_ema"] = unet_loss
        state.save(state_path)
    return True


def _scale_factor(state: RunState) -> float:
    """The latents phase's scale factor, which the U-Net and the exported model need."""
    if state.scale_factor is None:
        raise RuntimeError("the run's state has no scale factor: the latents phase has not run")
    return float(state.scale_factor)


def _export(
    out: Path,
    work: Path,
    cfg: TrainConfig,
    cfg_dict: dict[str, Any],
    seed: int,
    state: RunState,
    log: Callable[[str], None],
) -> Path:
    """Write the model folder (spec with the run's provenance, EMA weights, card) and provenance.json."""
    import torch

    from engine.machine.probe import probe_machine
    from engine.models.export import save_model_folder
    from engine.training.card import render_card

    provenance: dict[str, Any] = {
        "command": " && ".join(state.commands),
        "parts": [{"command": part["command"], "seconds": round(part["seconds"], 1)} for part in state.parts],
        "commands": state.commands,
        "seed": seed,
        "config": cfg_dict,
        "ae_steps": cfg.ae_steps,
        "decoder_steps": _checkpoint_step(work / "decoder.ckpt"),
        "unet_steps": _checkpoint_step(work / "unet.ckpt"),
        "unet_steps_planned": cfg.unet_steps,
        "seconds": {k: round(v, 1) for k, v in state.seconds.items()},
        "losses": state.losses,
        "machine": f"{probe_machine().describe()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}",
        "data": data_stats(work),
    }
    spec = build_spec(cfg, _scale_factor(state), provenance["data"], provenance)
    ae = load_autoencoder(cfg, work)
    unet = _load_ema_unet(cfg, work)
    folder = save_model_folder(out, spec, {"unet": unet, "autoencoder": ae}, render_card(spec, out))
    (work / "provenance.json").write_text(json.dumps(provenance, indent=2))
    log(f"export: {folder} ({sum(state.seconds.values()) / 60:.1f} min of training in total)")
    return folder


def _checkpoint_step(path: Path) -> int:
    return int(_load_checkpoint(path)["step"]) if path.exists() else 0


def _load_ema_unet(cfg: TrainConfig, work: Path):
    from engine.models.networks import build_network

    unet = build_network(unet_definition(cfg), "unet")
    unet.load_state_dict(_load_checkpoint(work / "unet.ckpt")["ema"])
    return unet.eval()


def config_with_steps(
    cfg: TrainConfig, ae_steps: int | None, unet_steps: int | None, decoder_steps: int | None = None
) -> TrainConfig:
    """The config with step counts overridden (extending a resumed run)."""
    return replace(
        cfg,
        ae_steps=ae_steps or cfg.ae_steps,
        unet_steps=unet_steps or cfg.unet_steps,
        decoder_steps=decoder_steps or cfg.decoder_steps,
    )
