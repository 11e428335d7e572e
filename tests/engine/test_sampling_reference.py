"""The engine's loop against MONAI's own inferers: same network, scheduler and noise -> same volume."""

from __future__ import annotations

import pytest
import torch
from monai.inferers import DiffusionInferer, LatentDiffusionInferer

from engine.api import SamplingRequest, run
from engine.models.networks import build_scheduler
from engine.optimization.apply import OptimizationConfig, prepare
from engine.sampling import denoise
from engine.testing import build_tiny_networks, tiny_spec


class _Loaded:
    def __init__(self, nets):
        self.unet = nets["unet"]
        self.autoencoder = nets.get("autoencoder")


def _engine_volume(spec, nets, request):
    prepared = prepare(_Loaded(nets), OptimizationConfig(), torch.device("cpu"))
    return run(denoise(prepared, spec, request, torch.device("cpu"))).volumes


def _reference_noise(spec, seed, batch=1):
    # The engine draws its initial noise first from a CPU generator seeded with the request's seed;
    # seeding the global RNG the same way makes MONAI's inferer (which uses the global RNG) see the same
    # noise and, for DDPM, the same per-step noise.
    torch.manual_seed(seed)
    return torch.randn((batch, *spec.diffusion_shape))


@pytest.mark.parametrize("sampler", ["ddim", "ddpm", "pndm"])
def test_pixel_loop_matches_diffusion_inferer(sampler):
    spec = tiny_spec(kind="pixel", conditioned=False)
    nets = build_tiny_networks(spec, seed=3)
    request = SamplingRequest(model=spec.id, sampler=sampler, steps=6, seed=11)
    ours = _engine_volume(spec, nets, request)

    scheduler = build_scheduler(sampler, spec.schedule)
    scheduler.set_timesteps(6)
    noise = _reference_noise(spec, 11)
    with torch.no_grad():
        reference = DiffusionInferer(scheduler).sample(noise, nets["unet"], scheduler, verbose=False)
    assert ours.shape == reference.shape
    assert torch.max(torch.abs(ours - reference)).item() <= 1e-5


def test_rflow_loop_matches_diffusion_inferer():
    spec = tiny_spec(kind="pixel", conditioned=False, samplers=("rflow",))
    nets = build_tiny_networks(spec, seed=5)
    ours = _engine_volume(spec, nets, SamplingRequest(model=spec.id, steps=5, seed=2))
    scheduler = build_scheduler("rflow", spec.schedule)
    noise = _reference_noise(spec, 2)
    scheduler.set_timesteps(5, input_img_size_numel=int(torch.tensor(noise.shape[2:]).prod()))
    with torch.no_grad():
        reference = DiffusionInferer(scheduler).sample(noise, nets["unet"], scheduler, verbose=False)
    assert torch.max(torch.abs(ours - reference)).item() <= 1e-5


@pytest.mark.parametrize("mode", ["crossattn", "concat"])
def test_latent_loop_matches_latent_diffusion_inferer(mode):
    base = tiny_spec(kind="latent", conditioned=True)
    # One conditioning mode at a time: MONAI's inferer supports either, not both together.
    unet = dict(base.networks["unet"])
    if mode == "crossattn":
        unet["in_channels"] = 3
    else:
        unet["with_conditioning"], unet["cross_attention_dim"] = False, None
    from dataclasses import replace

    spec = replace(
        base, networks={**base.networks, "unet": unet}, conditioning_modes=(mode,), scale_factor=0.7
    )
    nets = build_tiny_networks(spec, seed=7)
    values = {"brain_volume": 1300.0, "ventricle_volume": 40.0}
    request = SamplingRequest(model=spec.id, sampler="ddim", steps=5, seed=4, conditioning=values)
    ours = _engine_volume(spec, nets, request)

    scheduler = build_scheduler("ddim", spec.schedule)
    scheduler.set_timesteps(5)
    noise = _reference_noise(spec, 4)
    vector = torch.tensor([[spec.condition(k).normalise(v) for k, v in values.items()]])
    if mode == "crossattn":
        conditioning = vector.unsqueeze(1)
    else:
        conditioning = vector[:, :, None, None, None].expand(-1, -1, *noise.shape[2:])
    inferer = LatentDiffusionInferer(scheduler, scale_factor=spec.scale_factor)
    with torch.no_grad():
        reference = inferer.sample(
            noise,
            nets["autoencoder"],
            nets["unet"],
            scheduler,
            conditioning=conditioning,
            mode=mode,
            verbose=False,
        )
    assert ours.shape == reference.shape == (1, 1, *spec.output_shape[1:])
    assert torch.max(torch.abs(ours - reference)).item() <= 1e-5


def test_guidance_matches_monai_cfg():
    spec = tiny_spec(kind="pixel", conditioned=True)
    from dataclasses import replace

    unet = dict(spec.networks["unet"], in_channels=1)
    spec = replace(spec, networks={"unet": unet}, conditioning_modes=("crossattn",))
    nets = build_tiny_networks(spec, seed=1)
    values = {"brain_volume": 1000.0, "ventricle_volume": 10.0}
    ours = _engine_volume(
        spec,
        nets,
        SamplingRequest(
            model=spec.id, sampler="ddim", steps=4, seed=9, conditioning=values, guidance_scale=3.0
        ),
    )
    scheduler = build_scheduler("ddim", spec.schedule)
    scheduler.set_timesteps(4)
    noise = _reference_noise(spec, 9)
    context = torch.tensor([[[spec.condition(k).normalise(v) for k, v in values.items()]]])
    with torch.no_grad():
        reference = DiffusionInferer(scheduler).sample(
            noise,
            nets["unet"],
            scheduler,
            conditioning=context,
            mode="crossattn",
            verbose=False,
            cfg=3.0,
            cfg_fill_value=-1.0,
        )
    # Guidance on random weights amplifies values to ~1e2, so float32 rounding alone reaches ~1e-4 there:
    # compare relative to the volume's magnitude.
    scale = max(1.0, torch.max(torch.abs(reference)).item())
    assert torch.max(torch.abs(ours - reference)).item() <= 1e-5 * scale


def _loop_before_adapters(spec, nets, request):
    """The denoising loop as it was before samplers became adapters: one branch per sampler name (unconditioned
    pixel models, on the CPU). Kept here so the adapters are held to it bit for bit."""
    shape = (request.batch_size, *spec.diffusion_shape)
    scheduler = build_scheduler(request.sampler, spec.schedule)
    if request.sampler == "rflow":
        scheduler.set_timesteps(
            request.steps, device="cpu", input_img_size_numel=int(torch.tensor(shape[2:]).prod())
        )
    else:
        scheduler.set_timesteps(request.steps, device="cpu")
    generator = torch.Generator().manual_seed(request.seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float32)
    timesteps = scheduler.timesteps
    next_timesteps = torch.cat((timesteps[1:], torch.tensor([0], dtype=timesteps.dtype)))
    for t, next_t in zip(timesteps, next_timesteps, strict=True):
        with torch.inference_mode():
            output = nets["unet"](x, torch.full((shape[0],), float(t)), None)
        if request.sampler == "rflow":
            x, _ = scheduler.step(output, t, x, next_t)
        elif request.sampler == "ddpm":
            x, _ = scheduler.step(output, t, x, generator=generator)
        else:
            x, _ = scheduler.step(output, t, x)
    return x


@pytest.mark.parametrize("sampler", ["ddpm", "ddim", "pndm", "rflow"])
def test_the_adapters_sample_bit_for_bit_as_the_loop_did_before_them(sampler):
    spec = tiny_spec(kind="pixel", conditioned=False, samplers=(sampler,))
    nets = build_tiny_networks(spec, seed=8)
    request = SamplingRequest(model=spec.id, sampler=sampler, steps=6, seed=21, batch_size=2)
    assert torch.equal(_engine_volume(spec, nets, request), _loop_before_adapters(spec, nets, request))
