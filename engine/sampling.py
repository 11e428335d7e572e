"""The one denoising loop, for pixel-space and latent diffusion models.

Read top to bottom; the numbered steps follow diffusers' pipelines. MONAI supplies the networks and the
schedulers; its ``DiffusionInferer.sample`` has no per-step callback or cancel, so the engine owns the loop
and keeps MONAI's inferers as the reference it is tested against (tests/engine/test_sampling_reference.py).

Conditioning follows MONAI's brain latent-diffusion bundle: the normalised condition vector goes in as
cross-attention context (B, 1, n) and/or as n constant channels concatenated to the noisy input.
Classifier-free guidance runs the unconditioned and conditioned inputs as one doubled batch, the
unconditioned one filled with the model's null value (MONAI's ``cfg_fill_value``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.api import Progress, SamplingRequest
from engine.errors import InvalidRequest, ModelInvalid, NonFiniteOutput
from engine.models.networks import build_sampler
from engine.models.output_geometry import resolve_output
from engine.models.spec import ModelSpec
from engine.samplers import SchedulerAdapter

PREVIEW_MAX_EDGE = 128


@dataclass(frozen=True)
class StepIndex:
    """Where the loop is while it calls the denoiser: ``run`` is unique to one run of the loop."""

    run: int
    index: int  # 0-based
    total: int


# Set by the loop around each denoiser call, so a per-step schedule (step caching,
# engine/optimization/step_cache.py) knows the step and the run through any proxy of the prepared model
# (bench timers, the kernel profiler) without a second loop or a changed denoiser signature.
CURRENT_STEP: ContextVar[StepIndex | None] = ContextVar("volsynth_current_step", default=None)
_RUNS = itertools.count(1)


@dataclass
class PreviewPacer:
    """Decides at which due steps a preview is made, so previews never dominate a run.

    A latent model's preview is a decode of the whole latent (see ``preview_image``). On a GPU that is
    milliseconds, but on a CPU it can cost several denoising steps (the demo model's fp32 decode: 0.85 s
    against 0.13 s per step), and a preview every 5 steps then doubled the run. So a due preview is skipped
    while previews so far have taken more than ``max_share`` of the run's elapsed time; cheap previews (last
    one under ``cheap_s``) are never skipped, and the first due preview is always made, since it measures
    the cost.
    """

    interval: int
    max_share: float = 0.25
    cheap_s: float = 0.1
    spent_s: float = 0.0  # time spent making previews so far
    last_cost_s: float | None = None

    def due(self, step: int, total: int, elapsed_s: float) -> bool:
        if not self.interval or step % self.interval or step >= total:
            return False
        if self.last_cost_s is None or self.last_cost_s < self.cheap_s:
            return True
        return self.spent_s <= self.max_share * elapsed_s

    def record(self, cost_s: float) -> None:
        self.spent_s += cost_s
        self.last_cost_s = cost_s


@dataclass
class LoopOutput:
    volumes: torch.Tensor  # (batch, channels, x, y, z), float32 on the CPU
    request: SamplingRequest  # with the model's defaults filled in
    conditioning: dict[str, float]  # in user units
    conditioning_normalised: list[float]
    scheduler_config: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    output: dict[str, Any] = field(default_factory=dict)  # modality, size, spacing, intensity handling
    step_times_s: list[float] = field(default_factory=list)


def resolve_request(spec: ModelSpec, request: SamplingRequest) -> tuple[SamplingRequest, dict[str, float]]:
    """Fill in the model's defaults and check the request against what this model can do."""
    sampler = request.sampler or spec.default_sampler
    if sampler not in spec.samplers:
        raise InvalidRequest(
            f"model {spec.id!r} cannot sample with {sampler!r}; it supports {', '.join(spec.samplers)}"
        )
    steps = request.steps or spec.default_steps
    train_steps = int(spec.schedule["num_train_timesteps"])
    if steps > train_steps:
        raise InvalidRequest(f"steps ({steps}) cannot exceed the model's {train_steps} training timesteps")
    conditioning = spec.resolve_conditioning(request.conditioning)
    guidance = (
        spec.default_guidance_scale if request.guidance_scale is None else float(request.guidance_scale)
    )
    if guidance != 1.0 and not spec.supports_guidance:
        raise InvalidRequest(
            f"model {spec.id!r} was not trained for classifier-free guidance; set guidance scale to 1.0"
        )
    output = resolve_output(spec, request.modality, request.output_size, request.voxel_spacing_mm)
    chosen = (
        # A model with a choosable output records what it made; the others keep these fields unset.
        {"modality": output.modality, "output_size": output.size, "voxel_spacing_mm": output.spacing_mm}
        if spec.geometry is not None
        else {}
    )
    resolved = request.replace(
        model=request.model or spec.id,
        sampler=sampler,
        steps=steps,
        conditioning=conditioning,
        guidance_scale=guidance,
        **chosen,
    )
    return resolved, conditioning


def request_warnings(spec: ModelSpec, request: SamplingRequest) -> list[str]:
    """What the user should know before this (resolved) request runs: a field of view away from the
    recommended ones; a full decode that would not fit in memory."""
    output = resolve_output(spec, request.modality, request.output_size, request.voxel_spacing_mm)
    warnings = list(output.warnings)
    if spec.geometry is not None and spec.kind == "latent" and not request.optimization.streamed_decode:
        from engine.formatting import format_bytes
        from engine.models.budget import decoder_activation_bytes
        from engine.nifti.checks import available_memory

        needed = request.batch_size * decoder_activation_bytes(
            spec.networks["autoencoder"], (spec.output_shape[0], *output.size)
        )
        if needed > available_memory():
            warnings.append(
                f"the full decode of {'x'.join(map(str, output.size))} needs about {format_bytes(needed)}, "
                "more than is available; turn on streamed decode (same volume, bounded memory)"
            )
    return warnings


def _preview_array(volume: torch.Tensor) -> tuple[np.ndarray, int]:
    """Batch item 0, channel 0, strided down so no edge exceeds PREVIEW_MAX_EDGE voxels; and the stride."""
    vol = volume[0, 0].detach().float().cpu().numpy()
    stride = max(1, int(np.ceil(max(vol.shape) / PREVIEW_MAX_EDGE)))
    return np.ascontiguousarray(vol[::stride, ::stride, ::stride]), stride


def denoise(
    prepared,
    spec: ModelSpec,
    request: SamplingRequest,
    device: torch.device,
    *,
    resolved: tuple[SamplingRequest, dict[str, float]] | None = None,
) -> Generator[Progress, None, LoopOutput]:
    """Run one request on a prepared model. Yields Progress; returns the volumes on the CPU.

    ``resolved`` is ``resolve_request(spec, request)`` when the caller has it already (the backends resolve
    before the load, to fail fast); without it the request is resolved here. Closing the generator stops
    it at the next step boundary.
    """
    started = time.perf_counter()

    # 1. Resolve the request against the model: sampler, steps, conditioning values, and (for models that
    #    let a request choose) modality, output size and spacing.
    request, conditioning = resolved or resolve_request(spec, request)
    made = resolve_output(spec, request.modality, request.output_size, request.voxel_spacing_mm)
    warnings = request_warnings(spec, request)
    shape = (request.batch_size, *spec.latent_shape_for(request.output_size))

    # 2. A fresh sampler for this run (schedulers hold per-run state such as PNDM's history); the loop knows
    #    it only through its adapter (engine.samplers), never by its name.
    sampler = build_sampler(request.sampler, spec.schedule)
    sampler.set_timesteps(request.steps, device, shape)
    _check_schedule(sampler.scheduler, spec)

    # 3. Initial noise from a CPU generator, so the same seed gives the same noise on every device.
    #    On the CPU the same generator then drives DDPM's per-step noise.
    cpu_generator = torch.Generator().manual_seed(request.seed)
    x = torch.randn(shape, generator=cpu_generator, dtype=torch.float32).to(device)
    step_generator = (
        cpu_generator if device.type == "cpu" else torch.Generator(device).manual_seed(request.seed)
    )

    # 4. Conditioning tensors: normalised to [0, 1]; context (B, 1, n) and/or concat channels (B, n, ...).
    normalised = [spec.condition(name).normalise(value) for name, value in conditioning.items()]
    context, concat = _conditioning_tensors(spec, request, made, normalised, shape, device)

    message = "denoising" + "".join(f"; warning: {w}" for w in warnings)
    yield Progress("denoise", 0, request.steps, time.perf_counter() - started, message)

    # 5. The denoising loop.
    denoise_started = time.perf_counter()
    x, step_times = yield from _denoising_steps(
        prepared, spec, request, sampler, x, (context, concat), step_generator, device, started
    )
    denoise_s = time.perf_counter() - denoise_started

    # 6. Decode latents to an image (latent models), then hand back float32 on the CPU.
    decode_s = 0.0
    if spec.kind == "latent":
        yield Progress("decode", request.steps, request.steps, time.perf_counter() - started, "decoding")
        decode_started = time.perf_counter()
        image = _to_image(prepared, spec, x)
        decode_s = time.perf_counter() - decode_started
    else:
        image = x

    # 7. Refuse a volume with NaN or infinite voxels before anyone can write it: every backend, bench,
    #    cohort and the CLI get their volumes from this loop.
    volumes = image.detach().float().cpu()
    if not bool(torch.isfinite(volumes).all()):
        bad = int((~torch.isfinite(volumes)).sum())
        raise NonFiniteOutput(
            f"model {spec.id!r} decoded a volume with {bad:,} of {volumes.numel():,} voxels NaN or infinite "
            f"(the denoised latent was finite); nothing was written. {_NON_FINITE_ADVICE}"
        )

    return LoopOutput(
        volumes=volumes,
        request=request,
        conditioning=conditioning,
        conditioning_normalised=normalised,
        scheduler_config={
            "class": type(sampler.scheduler).__name__,
            "sampler": request.sampler,
            "steps": request.steps,
            **spec.schedule,
        },
        timings={"denoise_s": denoise_s, "decode_s": decode_s, "loop_total_s": time.perf_counter() - started},
        step_times_s=step_times,
        warnings=warnings,
        output=_output_record(spec, made),
    )


def _null_value(value: float | None, spec: ModelSpec, what: str) -> float:
    """The unconditioned value of a guided run's null half. A model guided through its modality alone (or
    its numbers alone) has none for the other input: refused in one line rather than failing in ``float``."""
    if value is None:
        raise InvalidRequest(
            f"model {spec.id!r} has no unconditioned value for its {what}; set guidance scale to 1.0"
        )
    return float(value)


def _conditioning_tensors(spec: ModelSpec, request: SamplingRequest, made, normalised, shape, device):
    """(context, concat) for the network: the condition vector as cross-attention context (B, 1, n) and/or
    n constant channels, and MAISI's categorical context; each doubled with its null half under guidance."""
    batch, guided = request.batch_size, request.guidance_scale != 1.0
    context = concat = None
    if spec.conditioning:
        vector = (
            torch.tensor(normalised, dtype=torch.float32, device=device).view(1, 1, -1).repeat(batch, 1, 1)
        )
        if guided:
            null = torch.full_like(vector, _null_value(spec.guidance_null_value, spec, "numeric conditions"))
            vector = torch.cat([null, vector], dim=0)
        if "crossattn" in spec.conditioning_modes:
            context = vector
        if "concat" in spec.conditioning_modes:
            concat = vector[:, 0, :, None, None, None].expand(-1, -1, *shape[2:])
    # Categorical conditioning (MAISI): the modality's class label and the spacing (mm x 100, as the model's
    # own inference passes it) ride in the context as (B, 1, 4); the unconditioned half of guidance has
    # the null class label and the same spacing.
    if spec.modalities:
        spacing = [100.0 * v for v in made.spacing_mm]
        labels = torch.tensor([[float(made.class_label), *spacing]], dtype=torch.float32, device=device)
        context = labels.view(1, 1, 4).repeat(batch, 1, 1)
        if guided:
            null = context.clone()
            null[:, 0, 0] = _null_value(spec.null_modality, spec, "modality")
            context = torch.cat([null, context], dim=0)
    return context, concat


def _denoising_steps(
    prepared,
    spec: ModelSpec,
    request: SamplingRequest,
    sampler: SchedulerAdapter,
    x,
    conditions,
    step_generator,
    device,
    started,
) -> Generator[Progress, None, tuple[torch.Tensor, list[float]]]:
    """The steps of the loop, each yielding its Progress (with a preview when one is due); returns the final
    latent (or image) and each step's time."""
    context, concat = conditions
    guided = request.guidance_scale != 1.0
    timesteps = sampler.timesteps
    next_timesteps = torch.cat(
        (timesteps[1:], torch.tensor([0], dtype=timesteps.dtype, device=timesteps.device))
    )
    step_times: list[float] = []
    pacer = PreviewPacer(request.preview_interval)
    run_id = next(_RUNS)
    denoise_started = time.perf_counter()
    for i, (t, next_t) in enumerate(zip(timesteps, next_timesteps, strict=True)):
        step_started = time.perf_counter()
        model_input = torch.cat([x, x], dim=0) if guided else x
        if concat is not None:
            model_input = torch.cat([model_input, concat], dim=1)
        t_batch = torch.full((model_input.shape[0],), float(t), device=device)
        at_step = CURRENT_STEP.set(StepIndex(run_id, i, request.steps))
        try:
            with torch.inference_mode():
                output = prepared.denoiser(model_input, t_batch, context)
        finally:
            CURRENT_STEP.reset(at_step)
        if guided:
            uncond, cond = output.chunk(2)
            output = uncond + request.guidance_scale * (cond - uncond)

        stepped = sampler.step(output, t, next_t, x, step_generator)

        preview, preview_stride = None, 1
        step = i + 1
        if pacer.due(step, request.steps, time.perf_counter() - denoise_started):
            preview_started = time.perf_counter()
            preview, preview_stride = _preview_array(preview_image(prepared, spec, stepped.x0, device))
            pacer.record(time.perf_counter() - preview_started)
        x = stepped.sample
        # One reduction per step on the small latent: a model that went NaN stops here, not after
        # the remaining steps and a decode, and the message says when it happened.
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteOutput(
                f"model {spec.id!r} produced NaN or infinite values at denoising step {i + 1} of "
                f"{request.steps}; nothing was written. {_NON_FINITE_ADVICE}"
            )
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_times.append(time.perf_counter() - step_started)
        yield Progress(
            "denoise",
            step,
            request.steps,
            time.perf_counter() - started,
            f"step {step}/{request.steps}",
            preview,
            preview_stride,
        )
    return x, step_times


_NON_FINITE_ADVICE = (
    "Its weights or noise schedule may be broken; if a reduced-precision setting (autocast, quantization) "
    "is on, run again without it"
)


def _check_schedule(scheduler, spec: ModelSpec) -> None:
    """Refuse a noise schedule with NaN or infinite values (a finite spec can still make one, e.g. beta
    ends that drive a cumulative product to 0 and its inverse square root to infinity)."""
    for name in ("betas", "alphas_cumprod", "timesteps"):
        values = getattr(scheduler, name, None)
        if (
            isinstance(values, torch.Tensor)
            and values.is_floating_point()
            and not bool(torch.isfinite(values).all())
        ):
            raise ModelInvalid(
                f"model {spec.id!r}: its noise schedule has NaN or infinite {name}; check the spec's schedule "
                f"({', '.join(f'{k}={v}' for k, v in list(spec.schedule.items())[:6])})"
            )


def _output_record(spec: ModelSpec, made) -> dict[str, Any]:
    """What the run made, for provenance: size, spacing and field of view, modality, intensity handling."""
    return {
        "size": list(made.size),
        "spacing_mm": list(made.spacing_mm),
        "fov_mm": [round(v, 3) for v in made.fov_mm],
        **({"modality": made.modality, "class_label": made.class_label} if made.modality else {}),
        **(
            {
                "null_class_label": spec.null_modality,
                "spacing_tensor": [100.0 * v for v in made.spacing_mm],
                "scale_factor": spec.scale_factor,
            }
            if spec.modalities
            else {}
        ),
        **({"intensity": spec.output_intensity["description"]} if spec.output_intensity else {}),
    }


def preview_precision(device: torch.device) -> torch.dtype | None:
    """The reduced precision a preview's decode runs in on ``device``: bf16 where the device has native bf16
    kernels (a CPU with AVX-512 BF16 or AMX, an NVIDIA GPU of compute capability 8.0+); None (fp32) elsewhere,
    where emulated bf16 would cost more than it saves."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else None
    if device.type == "cpu":
        from engine.machine.probe import probe_machine

        return torch.bfloat16 if probe_machine().cpu.native_bf16 else None
    return None


def preview_image(prepared, spec: ModelSpec, x0: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What a preview shows of the clean-sample estimate ``x0``: for a latent model its decode, in the
    device's native reduced precision (``preview_precision``) and, on a CPU, with the latent in NDHWC, where
    oneDNN's bf16 convolutions run faster. The slice views only need a recognisable estimate mid-run; the
    final volume is always the full-precision decode (``_to_image``).

    On the shipped model (2-core AMD EPYC, AVX-512 BF16) this took 0.33-0.47 of the fp32 decode's CPU time,
    and the preview was 51-52 dB PSNR (correlation 0.9999) from the fp32 decode of the same estimate. A
    decode of the latent downsampled 2x took 0.1-0.3 but blurred and darkened the brain (20 dB, correlation
    0.94), so it is not used. A pixel-space model's preview is its estimate itself, as before.
    """
    dtype = preview_precision(device) if spec.kind == "latent" else None
    if dtype is None:
        return _to_image(prepared, spec, x0)
    if device.type == "cpu":
        x0 = x0.contiguous(memory_format=torch.channels_last_3d)
    with torch.autocast(device.type, dtype=dtype):
        return _to_image(prepared, spec, x0)


def _to_image(prepared, spec: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    if spec.kind != "latent":
        return _intensities(spec, x)
    with torch.inference_mode():
        return _intensities(spec, prepared.decode(x / spec.scale_factor))


def _intensities(spec: ModelSpec, image: torch.Tensor) -> torch.Tensor:
    """The decoder's output mapped to intensities the way the model's own inference does (most models:
    unchanged; MAISI MR: x 1000, clipped below at 0, truncated to whole numbers)."""
    mapping = spec.output_intensity
    if not mapping:
        return image
    image = image.float() * float(mapping.get("scale", 1.0)) + float(mapping.get("offset", 0.0))
    if mapping.get("clip_min") is not None or mapping.get("clip_max") is not None:
        image = image.clamp(min=mapping.get("clip_min"), max=mapping.get("clip_max"))
    return image.trunc() if mapping.get("truncate") else image
