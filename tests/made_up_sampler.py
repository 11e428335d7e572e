"""A sampler no part of the product knows: deterministic DDIM written out by hand over MONAI's DDPM noise schedule.

Tests register it (the ``made_up_sampler`` fixture) to show that a sampler is one registered adapter: the loop,
the CLI, the engine server and the app's sampler box take it with no other edit.
"""

from __future__ import annotations

from typing import Any

from engine.samplers import StepResult
from engine.samplers.monai_schedulers import NoiseScheduleAdapter


class HandWrittenDDIM(NoiseScheduleAdapter):
    """x0 from the model output, then straight to the next timestep's noise level along the same noise."""

    name = "hand-ddim"
    title = "DDIM written out (a test's sampler)"
    scheduler_class = ("monai.networks.schedulers", "DDPMScheduler")  # for its betas and timesteps only
    schedule_args = frozenset(
        {"num_train_timesteps", "schedule", "beta_start", "beta_end", "prediction_type"}
    )

    def step(self, model_output: Any, t: Any, next_t: Any, sample: Any, generator: Any) -> StepResult:
        alphas = self.scheduler.alphas_cumprod.to(sample.device, sample.dtype)
        alpha, x0 = alphas[int(t)], self.estimate_x0(model_output, t, sample)
        noise = (sample - alpha.sqrt() * x0) / (1 - alpha).sqrt()
        next_alpha = alphas[int(next_t)] if int(next_t) < int(t) else alphas.new_tensor(1.0)  # the last step
        return StepResult(next_alpha.sqrt() * x0 + (1 - next_alpha).sqrt() * noise, x0)
