"""A model whose networks are built and weights loaded, ready for the sampling loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from engine.models.source import ModelSource
    from engine.models.spec import ModelSpec


@dataclass
class LoadedModel:
    source: ModelSource
    unet: torch.nn.Module
    autoencoder: torch.nn.Module | None = None

    @property
    def spec(self) -> ModelSpec:
        return self.source.spec

    def to(self, device: torch.device) -> LoadedModel:
        self.unet.to(device)
        if self.autoencoder is not None:
            self.autoencoder.to(device)
        return self
