"""The built-in samplers: MONAI's DDPM, DDIM, PNDM and rectified-flow schedulers behind one adapter each.

Each adapter calls its scheduler exactly as MONAI's own inferers do (tests/engine/test_sampling_reference.py
holds the engine's loop to them), so putting a scheduler behind an adapter changes no voxel. torch is imported
only when a step runs.
"""

from __future__ import annotations

from typing import Any

from engine.samplers.registry import FLOW, NOISE_SCHEDULE, SchedulerAdapter, StepResult, register_sampler

_SCHEDULERS = "monai.networks.schedulers"
_BETA_SCHEDULE = frozenset({"num_train_timesteps", "schedule", "beta_start", "beta_end", "prediction_type"})


class NoiseScheduleAdapter(SchedulerAdapter):
    """A sampler of a DDPM-style noise schedule: the clean-sample estimate follows from the cumulative alphas
    and what the network predicts (noise, v or the sample itself)."""

    family = NOISE_SCHEDULE

    def estimate_x0(self, model_output: Any, t: Any, sample: Any) -> Any:
        scheduler = self.scheduler
        prediction = str(getattr(scheduler, "prediction_type", "epsilon"))
        alpha_bar = scheduler.alphas_cumprod[int(t)].to(sample.device, sample.dtype)
        if "sample" in prediction:
            return model_output
        if "v_prediction" in prediction:
            return alpha_bar.sqrt() * sample - (1 - alpha_bar).sqrt() * model_output
        return (sample - (1 - alpha_bar).sqrt() * model_output) / alpha_bar.sqrt()


@register_sampler
class DDPMAdapter(NoiseScheduleAdapter):
    """Ancestral sampling: each step adds fresh noise from the run's generator."""

    name = "ddpm"
    title = "DDPM (stochastic)"
    scheduler_class = (_SCHEDULERS, "DDPMScheduler")
    schedule_args = _BETA_SCHEDULE | {"variance_type", "clip_sample", "clip_sample_min", "clip_sample_max"}

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        x_next, x0 = self.scheduler.step(model_output, t, sample, generator=generator)
        return StepResult(x_next, x0)


@register_sampler
class DDIMAdapter(NoiseScheduleAdapter):
    """Deterministic DDIM (eta 0)."""

    name = "ddim"
    title = "DDIM (deterministic)"
    scheduler_class = (_SCHEDULERS, "DDIMScheduler")
    schedule_args = _BETA_SCHEDULE | {
        "clip_sample",
        "set_alpha_to_one",
        "steps_offset",
        "clip_sample_min",
        "clip_sample_max",
    }

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        x_next, x0 = self.scheduler.step(model_output, t, sample)
        return StepResult(x_next, x0)


@register_sampler
class PNDMAdapter(NoiseScheduleAdapter):
    """PLMS: a linear multistep method over the last model outputs (its scheduler keeps them)."""

    name = "pndm"
    title = "PNDM (linear multistep)"
    scheduler_class = (_SCHEDULERS, "PNDMScheduler")
    schedule_args = _BETA_SCHEDULE | {"skip_prk_steps", "set_alpha_to_one", "steps_offset"}
    # PRK warm-up steps need 3 model calls each; PLMS alone is what diffusers and MONAI users run.
    schedule_defaults = {"skip_prk_steps": True}

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        x_next, _ = self.scheduler.step(model_output, t, sample)  # PNDM gives no estimate of its own
        return StepResult(x_next, lambda: self.estimate_x0(model_output, t, sample))


@register_sampler
class RFlowAdapter(SchedulerAdapter):
    """Rectified flow: Euler steps along the predicted velocity, the timesteps shifted for the image size."""

    name = "rflow"
    family = FLOW
    title = "Rectified flow (Euler)"
    scheduler_class = (_SCHEDULERS, "RFlowScheduler")
    schedule_args = frozenset(
        {
            "num_train_timesteps",
            "use_discrete_timesteps",
            "sample_method",
            "loc",
            "scale",
            "use_timestep_transform",
            "transform_scale",
            "steps_offset",
            "base_img_size_numel",
            "spatial_dim",
        }
    )

    def set_timesteps(self, steps: int, device: Any, sample_shape: tuple[int, ...]) -> None:
        numel = 1
        for edge in sample_shape[2:]:
            numel *= int(edge)
        self.scheduler.set_timesteps(steps, device=device, input_img_size_numel=numel)

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        x_next, x0 = self.scheduler.step(model_output, t, sample, next_t)
        return StepResult(x_next, x0)

    def estimate_x0(self, model_output: Any, t: Any, sample: Any) -> Any:
        return sample + (float(t) / self.scheduler.num_train_timesteps) * model_output
