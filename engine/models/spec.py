"""What a model is, as data: networks, noise schedule, shapes, conditioning inputs, voxel geometry.

A VolSynth model folder holds ``spec.json`` (this structure), ``weights.safetensors`` (tensors named
``unet.*`` and, for latent models, ``autoencoder.*``) and ``MODEL_CARD.md``. MONAI bundles are translated
into the same ``ModelSpec`` by :mod:`engine.models.bundle`, so everything downstream has one code path.

Example ``spec.json``::

    {
      "format": "volsynth-model/1",
      "id": "brain-t1-demo", "name": "Brain T1 demo (MNI152-derived)",
      "kind": "latent",
      "networks": {"unet": {"_target_": "DiffusionModelUNet", ...},
                   "autoencoder": {"_target_": "AutoencoderKL", ...}},
      "schedule": {"num_train_timesteps": 1000, "schedule": "scaled_linear_beta",
                   "beta_start": 0.0015, "beta_end": 0.0205, "prediction_type": "epsilon"},
      "samplers": ["ddim", "ddpm", "pndm"], "default_sampler": "ddim", "default_steps": 50,
      "latent_shape": [3, 20, 24, 20], "output_shape": [1, 80, 96, 80], "scale_factor": 1.0,
      "voxel_spacing_mm": [2.0, 2.0, 2.0],
      "conditioning": [{"name": "brain_volume", "label": "Brain volume", "unit": "mL",
                        "min": 900, "max": 1500, "default": 1200}],
      "conditioning_modes": ["concat", "crossattn"],
      "guidance": {"null_value": -1.0},
      "intensity_range": [0.0, 1.0]
    }

Conditions are given in the units a user knows and mapped linearly to [0, 1] for the network
(``min`` -> 0, ``max`` -> 1), the convention of MONAI's brain latent-diffusion bundle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.errors import InvalidRequest, ModelInvalid

SPEC_FORMAT = "volsynth-model/1"
SAMPLERS = ("ddpm", "ddim", "pndm", "rflow")
CONDITIONING_MODES = ("concat", "crossattn")


@dataclass(frozen=True)
class ConditionSpec:
    """One conditioning input: a scalar with a name, a unit and an allowed range."""

    name: str
    label: str
    unit: str
    min: float
    max: float
    default: float
    description: str = ""

    def normalise(self, value: float) -> float:
        """Map a value in user units to the network's [0, 1] scale."""
        return (value - self.min) / (self.max - self.min)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "unit": self.unit,
            "min": self.min,
            "max": self.max,
            "default": self.default,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConditionSpec:
        try:
            spec = cls(
                name=str(data["name"]),
                label=str(data.get("label", data["name"])),
                unit=str(data.get("unit", "")),
                min=float(data["min"]),
                max=float(data["max"]),
                default=float(data.get("default", (float(data["min"]) + float(data["max"])) / 2)),
                description=str(data.get("description", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelInvalid(
                f"conditioning entry {dict(data)!r} is malformed ({exc}); each needs name, min and max"
            ) from exc
        if not spec.max > spec.min:
            raise ModelInvalid(
                f"condition {spec.name!r}: max ({spec.max}) must be greater than min ({spec.min})"
            )
        if not spec.min <= spec.default <= spec.max:
            raise ModelInvalid(
                f"condition {spec.name!r}: default {spec.default} is outside [{spec.min}, {spec.max}]"
            )
        return spec


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about a model besides its weights."""

    id: str
    name: str
    kind: str  # "latent" (autoencoder + U-Net) or "pixel" (U-Net on the image itself)
    networks: dict[str, dict[str, Any]]
    schedule: dict[str, Any]
    output_shape: tuple[int, ...]  # (channels, x, y, z) of one generated volume
    latent_shape: tuple[int, ...] | None = None  # (channels, x, y, z) for latent models
    samplers: tuple[str, ...] = ("ddim", "ddpm", "pndm")
    default_sampler: str = "ddim"
    default_steps: int = 50
    scale_factor: float = 1.0
    voxel_spacing_mm: tuple[float, float, float] = (1.0, 1.0, 1.0)
    conditioning: tuple[ConditionSpec, ...] = ()
    conditioning_modes: tuple[str, ...] = ()
    guidance_null_value: float | None = None  # value of an "unconditioned" input; None = no CFG
    # Guidance scale used when a request leaves it unset; a trained model's card says why it is not 1.
    default_guidance_scale: float = 1.0
    intensity_range: tuple[float, float] = (0.0, 1.0)
    description: str = ""
    source: str = "volsynth"  # "volsynth" model folder or "monai-bundle"
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived -------------------------------------------------------------------------------------

    @property
    def condition_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.conditioning)

    @property
    def supports_guidance(self) -> bool:
        return self.guidance_null_value is not None and bool(self.conditioning)

    @property
    def diffusion_shape(self) -> tuple[int, ...]:
        """Shape (without batch) of the tensor the denoising loop works on."""
        if self.kind == "latent":
            assert self.latent_shape is not None
            return self.latent_shape
        return self.output_shape

    def affine(self) -> np.ndarray:
        """Voxel -> RAS mm, NIfTI convention: axes along +R, +A, +S; the volume centre at the origin."""
        spacing = np.asarray(self.voxel_spacing_mm, dtype=np.float64)
        shape = np.asarray(self.output_shape[1:4], dtype=np.float64)
        affine = np.diag([*spacing, 1.0])
        affine[:3, 3] = -spacing * (shape - 1) / 2.0
        return affine

    def condition(self, name: str) -> ConditionSpec:
        for cond in self.conditioning:
            if cond.name == name:
                return cond
        raise InvalidRequest(
            f"model {self.id!r} has no condition {name!r}; its conditions are: "
            f"{', '.join(self.condition_names) or 'none'}"
        )

    def resolve_conditioning(self, values: Mapping[str, float]) -> dict[str, float]:
        """Full set of conditions in user units: given values checked against ranges, the rest defaulted."""
        for name in values:
            self.condition(name)  # raises for unknown names
        resolved: dict[str, float] = {}
        for cond in self.conditioning:
            value = float(values.get(cond.name, cond.default))
            if not math.isfinite(value) or not cond.min <= value <= cond.max:
                unit = f" {cond.unit}" if cond.unit else ""
                raise InvalidRequest(
                    f"condition {cond.name}={value:g} is outside the model's range "
                    f"[{cond.min:g}, {cond.max:g}]{unit}; choose a value inside it"
                )
            resolved[cond.name] = value
        return resolved

    # -- (de)serialisation ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SPEC_FORMAT,
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "networks": self.networks,
            "schedule": self.schedule,
            "samplers": list(self.samplers),
            "default_sampler": self.default_sampler,
            "default_steps": self.default_steps,
            "output_shape": list(self.output_shape),
            "latent_shape": list(self.latent_shape) if self.latent_shape else None,
            "scale_factor": self.scale_factor,
            "voxel_spacing_mm": list(self.voxel_spacing_mm),
            "conditioning": [c.to_dict() for c in self.conditioning],
            "conditioning_modes": list(self.conditioning_modes),
            "guidance": {
                "null_value": self.guidance_null_value,
                "default_scale": self.default_guidance_scale,
            },
            "intensity_range": list(self.intensity_range),
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "volsynth") -> ModelSpec:
        if data.get("format", SPEC_FORMAT) != SPEC_FORMAT:
            raise ModelInvalid(
                f"unsupported model spec format {data.get('format')!r}; expected {SPEC_FORMAT!r}"
            )
        try:
            kind = str(data["kind"])
            networks = dict(data["networks"])
            spec = cls(
                id=str(data["id"]),
                name=str(data.get("name", data["id"])),
                kind=kind,
                networks=networks,
                schedule=dict(data["schedule"]),
                output_shape=tuple(int(v) for v in data["output_shape"]),
                latent_shape=tuple(int(v) for v in data["latent_shape"])
                if data.get("latent_shape")
                else None,
                samplers=tuple(data.get("samplers", ("ddim", "ddpm", "pndm"))),
                default_sampler=str(data.get("default_sampler", "ddim")),
                default_steps=int(data.get("default_steps", 50)),
                scale_factor=float(data.get("scale_factor", 1.0)),
                voxel_spacing_mm=tuple(float(v) for v in data.get("voxel_spacing_mm", (1.0, 1.0, 1.0))),
                conditioning=tuple(ConditionSpec.from_dict(c) for c in data.get("conditioning", ())),
                conditioning_modes=tuple(data.get("conditioning_modes", ())),
                guidance_null_value=(data.get("guidance") or {}).get("null_value"),
                default_guidance_scale=float((data.get("guidance") or {}).get("default_scale", 1.0)),
                intensity_range=tuple(float(v) for v in data.get("intensity_range", (0.0, 1.0))),
                description=str(data.get("description", "")),
                source=source,
                extra=dict(data.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelInvalid(
                f"model spec is malformed: {exc!r}; see engine/models/spec.py for the format"
            ) from exc
        spec.validate()
        return spec

    def validate(self) -> None:
        """Refuse specs that cannot work, with a message naming the field."""
        if self.kind not in ("latent", "pixel"):
            raise ModelInvalid(f"model kind must be 'latent' or 'pixel', not {self.kind!r}")
        if "unet" not in self.networks:
            raise ModelInvalid("model spec has no 'unet' network")
        if self.kind == "latent" and ("autoencoder" not in self.networks or not self.latent_shape):
            raise ModelInvalid("a latent model needs an 'autoencoder' network and a 'latent_shape'")
        if len(self.output_shape) != 4:
            raise ModelInvalid(f"output_shape must be (channels, x, y, z), got {list(self.output_shape)}")
        unknown = [s for s in self.samplers if s not in SAMPLERS]
        if unknown or not self.samplers:
            raise ModelInvalid(f"unknown sampler(s) {unknown}; known: {', '.join(SAMPLERS)}")
        if self.default_sampler not in self.samplers:
            raise ModelInvalid(
                f"default_sampler {self.default_sampler!r} is not among samplers {list(self.samplers)}"
            )
        bad_modes = [m for m in self.conditioning_modes if m not in CONDITIONING_MODES]
        if bad_modes:
            raise ModelInvalid(
                f"unknown conditioning mode(s) {bad_modes}; known: {', '.join(CONDITIONING_MODES)}"
            )
        if self.conditioning and not self.conditioning_modes:
            raise ModelInvalid(
                "a conditioned model must say how: conditioning_modes 'concat' and/or 'crossattn'"
            )
        if len(self.voxel_spacing_mm) != 3 or min(self.voxel_spacing_mm) <= 0:
            raise ModelInvalid(
                f"voxel_spacing_mm must be three positive numbers, got {list(self.voxel_spacing_mm)}"
            )
        if "num_train_timesteps" not in self.schedule:
            raise ModelInvalid("schedule needs num_train_timesteps")
        if not math.isfinite(self.default_guidance_scale) or self.default_guidance_scale < 0:
            raise ModelInvalid(
                f"guidance default_scale must be a finite number >= 0, got {self.default_guidance_scale}"
            )
        if self.default_guidance_scale != 1.0 and not self.supports_guidance:
            raise ModelInvalid(
                f"guidance default_scale is {self.default_guidance_scale:g}, but the model has no "
                "guidance null_value or no conditions; remove default_scale or set it to 1"
            )
