"""Speed and precision settings, and the one place they are applied to a model.

Each setting reports whether it applied on this device and, if not, why; the report goes into the
provenance record and the UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from engine.errors import InvalidRequest

AUTOCAST_DTYPES = (None, "bf16", "fp16")
QUANTIZATION_MODES = (None, "int8", "fp8", "mixed")
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune")
ATTENTION_KERNELS = ("default", "sdpa")


@dataclass(frozen=True)
class OptimizationConfig:
    """What to change relative to plain fp32 NCDHW eager execution."""

    tf32: bool = False
    channels_last_3d: bool = False
    autocast: str | None = None
    attention: str = "default"
    compile_mode: str | None = None
    cuda_graphs: bool = False
    quantization: str | None = None
    psnr_budget_db: float = 40.0
    tiled_decode: bool = False

    def __post_init__(self) -> None:
        if self.autocast not in AUTOCAST_DTYPES:
            raise InvalidRequest(f"autocast must be one of bf16, fp16 or none, got {self.autocast!r}")
        if self.quantization not in QUANTIZATION_MODES:
            raise InvalidRequest(f"quantization must be one of int8, fp8, mixed or none, got {self.quantization!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise InvalidRequest(f"compile mode must be one of {COMPILE_MODES[1:]} or none, got {self.compile_mode!r}")
        if self.attention not in ATTENTION_KERNELS:
            raise InvalidRequest(f"attention must be one of {ATTENTION_KERNELS}, got {self.attention!r}")

    @property
    def is_default(self) -> bool:
        return self == OptimizationConfig()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizationConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidRequest(f"unknown optimization setting(s): {', '.join(sorted(unknown))}")
        return cls(**dict(data))


@dataclass
class PreparedModel:
    """A loaded model with an ``OptimizationConfig`` applied, plus the report of what applied.

    ``report`` maps each setting to ``{"requested": ..., "applied": bool, "reason": str}``.
    The sampling loop calls only ``denoiser(x, t, context)``, ``decode(z)`` and ``autocast()``, so new
    settings change this class, never the loop.
    """

    unet: Any
    autoencoder: Any
    config: OptimizationConfig
    device: Any
    report: dict[str, dict[str, Any]]

    def autocast(self):
        import contextlib

        import torch

        if self.config.autocast and self.report.get("autocast", {}).get("applied"):
            dtype = torch.bfloat16 if self.config.autocast == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def prepare_input(self, x):
        import torch

        if self.report.get("channels_last_3d", {}).get("applied"):
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x

    def denoiser(self, x, timesteps, context=None):
        with self.autocast():
            out = self.unet(self.prepare_input(x), timesteps=timesteps, context=context)
        return out.float()

    def decode(self, z):
        with self.autocast():
            out = self.autoencoder.decode_stage_2_outputs(self.prepare_input(z))
        return out.float()


def prepare(model, config: OptimizationConfig, device) -> PreparedModel:
    """Apply ``config`` to ``model`` (a LoadedModel already on ``device``).

    Settings that cannot apply here are reported with the reason instead of failing.
    """
    report: dict[str, dict[str, Any]] = {}
    for name, value in config.to_dict().items():
        if name in ("psnr_budget_db",):
            continue
        requested = value not in (False, None, "default")
        report[name] = {"requested": value, "applied": False,
                        "reason": "" if not requested else "not implemented in this build"}
    return PreparedModel(unet=model.unet, autoencoder=model.autoencoder, config=config, device=device, report=report)
