"""The generation request as the user builds it (placeholder, replaced by GenerationForm)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def random_seed() -> int:
    return random.SystemRandom().randrange(0, 2**31 - 1)


def auto_preview_interval(steps: int) -> int:
    """About ten previews per run: each preview of a latent model costs a decode."""
    return max(1, steps // 10)


@dataclass
class GenerationSettings:
    """What the sampling panel holds; ``to_request`` turns it into the engine's ``SamplingRequest``."""

    model: str = ""
    sampler: str = ""
    steps: int = 0
    seed: int = 0
    conditioning: dict[str, float] = field(default_factory=dict)
    guidance_scale: float | None = None  # None = the model's default
    batch_size: int = 1
    device: str = "auto"
    preview_interval: int = -1  # -1 = automatic
    optimization: Mapping[str, Any] | None = None

    def to_request(self):
        """Build the request (the engine validates it and raises InvalidRequest with a readable message)."""
        from engine.api import SamplingRequest
        from engine.optimization import OptimizationConfig

        interval = auto_preview_interval(self.steps) if self.preview_interval < 0 else self.preview_interval
        optimization = (
            OptimizationConfig.from_dict(self.optimization) if self.optimization else OptimizationConfig()
        )
        return SamplingRequest(
            model=self.model,
            sampler=self.sampler,
            steps=int(self.steps),
            seed=int(self.seed),
            conditioning=dict(self.conditioning),
            guidance_scale=self.guidance_scale,
            batch_size=int(self.batch_size),
            optimization=optimization,
            preview_interval=int(interval),
        )
