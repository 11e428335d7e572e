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
      "intensity_range": [0.0, 1.0],
      "space": "MNI152NLin2009aSym",
      "affine": [[2, 0, 0, -78], [0, 2, 0, -116], [0, 0, 2, -70], [0, 0, 0, 1]],
      "label_channels": ["GM", "WM", "CSF", "ventricles"]
    }

``space`` (a TemplateFlow / BIDS template name) and ``affine`` (voxel -> that template's mm) say where the
generated volumes lie; without them a volume is centred at the origin of an unnamed scanner space.
``label_channels`` names output channels 1..n (channel 0 is the image): tissue maps in [0, 1] decoded with
every image, so an output_shape of [5, ...] goes with four names.

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
from engine.samplers import family_of, sampler_names, samplers_of

SPEC_FORMAT = "volsynth-model/1"
CONDITIONING_MODES = ("concat", "crossattn")
#: Size limits checked while a spec is read, before anything is built from it.
MAX_TIMESTEPS = 100_000
MAX_CHANNELS = 64  # image or latent channels of one volume
MAX_CONDITIONS = 64
MAX_TEXT = 10_000  # characters of any name or description
MAX_CONDITION_VALUE = 1e9  # a condition's range (the app's value fields stop there too)


def one_line(text: str) -> str:
    """Collapse a message to one line (errors are shown on one line in the CLI, in a dialog in the app)."""
    return " ".join(str(text).split())


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ModelInvalid(f"model spec: {where} must be an object, got {type(value).__name__}")
    return value


def _sequence(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ModelInvalid(f"model spec: {where} must be a list, got {type(value).__name__}")
    return list(value)


def _listed_samplers(data: Mapping[str, Any]) -> str:
    """The spec's default sampler. A spec may list its samplers (files written before samplers had families do,
    and ``to_dict`` still writes them for older readers): the model offers its whole family whatever the list
    says, so a listed sampler must be of the default's family; one not registered here (written where more
    samplers were registered, an engine server's model list) is passed over."""
    listed = [str(v) for v in _sequence(data.get("samplers", ()), "samplers")]
    default = str(data.get("default_sampler") or (listed[0] if listed else "ddim"))
    known = [name for name in listed if name in sampler_names()]
    if default in sampler_names():
        other = [name for name in known if family_of(name) != family_of(default)]
        if other:
            raise ModelInvalid(
                f"samplers {other} are not of the {family_of(default)} family of default_sampler {default!r}"
            )
    return default


@dataclass(frozen=True)
class ConditionSpec:
    """One conditioning input: a scalar with a name, a unit and an allowed range.

    ``trained_min``/``trained_max`` (optional) give the range the training data covered; values allowed by
    ``min``/``max`` but outside it are extrapolation, and the app says so.
    """

    name: str
    label: str
    unit: str
    min: float
    max: float
    default: float
    description: str = ""
    trained_min: float | None = None
    trained_max: float | None = None

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
            **(
                {"trained_min": self.trained_min, "trained_max": self.trained_max}
                if self.trained_min is not None and self.trained_max is not None
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConditionSpec:
        data = _mapping(data, "each conditioning entry")
        try:
            spec = cls(
                name=str(data["name"]),
                label=str(data.get("label", data["name"])),
                unit=str(data.get("unit", "")),
                min=float(data["min"]),
                max=float(data["max"]),
                default=float(data.get("default", (float(data["min"]) + float(data["max"])) / 2)),
                description=str(data.get("description", "")),
                trained_min=float(data["trained_min"]) if data.get("trained_min") is not None else None,
                trained_max=float(data["trained_max"]) if data.get("trained_max") is not None else None,
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ModelInvalid(
                one_line(
                    f"conditioning entry {str(dict(data))[:200]} is malformed ({exc}); each needs name, "
                    "min and max"
                )
            ) from None
        if not all(
            math.isfinite(v) and abs(v) <= MAX_CONDITION_VALUE for v in (spec.min, spec.max, spec.default)
        ):
            raise ModelInvalid(
                f"condition {spec.name[:80]!r}: min, max and default must be finite numbers within "
                f"+/-{MAX_CONDITION_VALUE:g}"
            )
        if not spec.max > spec.min:
            raise ModelInvalid(
                f"condition {spec.name!r}: max ({spec.max}) must be greater than min ({spec.min})"
            )
        if not spec.min <= spec.default <= spec.max:
            raise ModelInvalid(
                f"condition {spec.name!r}: default {spec.default} is outside [{spec.min}, {spec.max}]"
            )
        low, high = spec.trained_min, spec.trained_max
        if (low is None) != (high is None) or (
            low is not None
            and high is not None
            and not (math.isfinite(low) and math.isfinite(high) and low < high)
        ):
            raise ModelInvalid(
                f"condition {spec.name!r}: trained_min and trained_max must both be given, finite, "
                "and trained_min < trained_max"
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
    # The sampler the model was trained for; the model offers every registered sampler of its family
    # (``samplers``), so a newly registered sampler of that family is offered at once.
    default_sampler: str = "ddim"
    default_steps: int = 50
    scale_factor: float = 1.0
    voxel_spacing_mm: tuple[float, ...] = (1.0, 1.0, 1.0)  # three; __post_init__ checks
    conditioning: tuple[ConditionSpec, ...] = ()
    conditioning_modes: tuple[str, ...] = ()
    guidance_null_value: float | None = None  # value of an "unconditioned" input; None = no CFG
    # Guidance scale used when a request leaves it unset; a trained model's card says why it is not 1.
    default_guidance_scale: float = 1.0
    intensity_range: tuple[float, ...] = (0.0, 1.0)  # (low, high); __post_init__ checks
    description: str = ""
    source: str = "volsynth"  # "volsynth" model folder or "monai-bundle"
    extra: dict[str, Any] = field(default_factory=dict)
    space: str | None = None  # template space of the output (BIDS name), None = unknown scanner space
    world_affine: tuple[tuple[float, ...], ...] | None = None  # voxel -> mm of ``space``; None = centred
    label_channels: tuple[str, ...] = ()  # names of output channels 1.. (channel 0 is the image)
    # -- categorical conditioning and a chosen output size (MAISI v2: engine.models.maisi) --------------
    # Modality name -> the class label the U-Net embeds; the unconditioned half of guidance uses
    # ``null_modality``. Empty for models conditioned on numbers only.
    modalities: tuple[tuple[str, int], ...] = ()
    default_modality: str = ""
    null_modality: int | None = None
    # None: one fixed output (output_shape, voxel_spacing_mm). Otherwise the size and spacing a request may
    # choose: {"latent_factor", "size_multiple", "min_size", "max_size", "max_voxels", "spacing_range_mm",
    # "recommended_fov_mm": {modality: [[x, y, z] mm, ...]}, "fov_tolerance", "fov_source"}
    # (engine.models.output_geometry reads it).
    geometry: dict[str, Any] | None = None
    # None: the decoder's output is the volume. Otherwise how the model's own inference maps it to
    # intensities: {"scale", "offset", "clip_min", "clip_max", "truncate", "description"}.
    output_intensity: dict[str, Any] | None = None

    # -- derived -------------------------------------------------------------------------------------

    @property
    def family(self) -> str:
        """The sampler family the model was trained for (``engine.samplers``: a noise schedule or a flow);
        "" when its default sampler is not registered (``validate`` refuses that)."""
        try:
            return family_of(self.default_sampler)
        except KeyError:
            return ""

    @property
    def samplers(self) -> tuple[str, ...]:
        """The samplers the model offers: its default, then every other registered sampler of its family."""
        if not self.family:
            return ()
        return (self.default_sampler, *(s for s in samplers_of(self.family) if s != self.default_sampler))

    @property
    def condition_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.conditioning)

    @property
    def supports_guidance(self) -> bool:
        if self.modalities and self.null_modality is not None:
            return True
        return self.guidance_null_value is not None and bool(self.conditioning)

    @property
    def modality_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.modalities)

    def modality_label(self, name: str) -> int:
        """The class label of modality ``name`` (InvalidRequest naming the choices for anything else)."""
        for known, label in self.modalities:
            if known == name:
                return label
        if not self.modalities:
            raise InvalidRequest(f"model {self.id!r} takes no modality; leave it empty")
        raise InvalidRequest(
            f"model {self.id!r} has no modality {name!r}; choose one of {', '.join(self.modality_names)}"
        )

    @property
    def diffusion_shape(self) -> tuple[int, ...]:
        """Shape (without batch) of the tensor the denoising loop works on."""
        if self.kind == "latent":
            assert self.latent_shape is not None
            return self.latent_shape
        return self.output_shape

    def latent_shape_for(self, size: tuple[int, ...] | None) -> tuple[int, ...]:
        """The diffusion shape for an output ``size`` (x, y, z) a request chose; ``None``: the default."""
        if size is None or self.geometry is None:
            return self.diffusion_shape
        factor = int(self.geometry["latent_factor"])
        return (self.diffusion_shape[0], *(int(n) // factor for n in size))

    def affine(
        self, size: tuple[int, ...] | None = None, spacing: tuple[float, ...] | None = None
    ) -> np.ndarray:
        """Voxel -> RAS mm, NIfTI convention: the template affine of ``space`` when the spec gives one,
        else axes along +R, +A, +S at the voxel spacing with the volume centre at the origin.

        ``size``/``spacing``: what a request chose for a model with a choosable output (``geometry``)."""
        if self.world_affine is not None:
            return np.array(self.world_affine, dtype=np.float64)
        spacing_mm = np.asarray(spacing or self.voxel_spacing_mm, dtype=np.float64)
        shape = np.asarray(size or self.output_shape[1:4], dtype=np.float64)
        affine = np.diag([*spacing_mm, 1.0])
        affine[:3, 3] = -spacing_mm * (shape - 1) / 2.0
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
            **({"space": self.space} if self.space else {}),
            **({"affine": [list(row) for row in self.world_affine]} if self.world_affine else {}),
            **({"label_channels": list(self.label_channels)} if self.label_channels else {}),
            **(
                {
                    "modalities": dict(self.modalities),
                    "default_modality": self.default_modality,
                    "null_modality": self.null_modality,
                }
                if self.modalities
                else {}
            ),
            **({"geometry": self.geometry} if self.geometry is not None else {}),
            **({"output_intensity": self.output_intensity} if self.output_intensity is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "volsynth") -> ModelSpec:
        """Read a spec from its JSON form; every problem is one ModelInvalid line naming the field."""
        data = _mapping(data, "the spec")
        if data.get("format", SPEC_FORMAT) != SPEC_FORMAT:
            raise ModelInvalid(
                f"unsupported model spec format {str(data.get('format'))[:80]!r}; expected {SPEC_FORMAT!r}"
            )
        try:
            guidance = _mapping(data.get("guidance") or {}, "guidance")
            conditioning = _sequence(data.get("conditioning") or [], "conditioning")
            if len(conditioning) > MAX_CONDITIONS:
                raise ModelInvalid(f"model spec has {len(conditioning)} conditions; at most {MAX_CONDITIONS}")
            null_value = guidance.get("null_value")
            spec = cls(
                id=str(data["id"]),
                name=str(data.get("name", data["id"])),
                kind=str(data["kind"]),
                networks=dict(_mapping(data["networks"], "networks")),
                schedule=dict(_mapping(data["schedule"], "schedule")),
                output_shape=tuple(int(v) for v in _sequence(data["output_shape"], "output_shape")),
                latent_shape=tuple(int(v) for v in _sequence(data["latent_shape"], "latent_shape"))
                if data.get("latent_shape")
                else None,
                default_sampler=_listed_samplers(data),
                default_steps=int(data.get("default_steps", 50)),
                scale_factor=float(data.get("scale_factor", 1.0)),
                voxel_spacing_mm=tuple(
                    float(v)
                    for v in _sequence(data.get("voxel_spacing_mm", (1.0, 1.0, 1.0)), "voxel_spacing_mm")
                ),
                conditioning=tuple(ConditionSpec.from_dict(c) for c in conditioning),
                conditioning_modes=tuple(
                    str(v) for v in _sequence(data.get("conditioning_modes", ()), "conditioning_modes")
                ),
                guidance_null_value=None if null_value is None else float(null_value),
                default_guidance_scale=float(guidance.get("default_scale", 1.0)),
                intensity_range=tuple(
                    float(v) for v in _sequence(data.get("intensity_range", (0.0, 1.0)), "intensity_range")
                ),
                description=str(data.get("description", "")),
                source=source,
                extra=dict(_mapping(data.get("extra") or {}, "extra")),
                space=str(data["space"]) if data.get("space") else None,
                world_affine=tuple(
                    tuple(float(v) for v in _sequence(row, "affine row"))
                    for row in _sequence(data["affine"], "affine")
                )
                if data.get("affine") is not None
                else None,
                label_channels=tuple(
                    str(v) for v in _sequence(data.get("label_channels") or (), "label_channels")
                ),
                modalities=tuple(
                    (str(k), int(v)) for k, v in _mapping(data.get("modalities") or {}, "modalities").items()
                ),
                default_modality=str(data.get("default_modality") or ""),
                null_modality=None if data.get("null_modality") is None else int(data["null_modality"]),
                geometry=dict(_mapping(data["geometry"], "geometry")) if data.get("geometry") else None,
                output_intensity=dict(_mapping(data["output_intensity"], "output_intensity"))
                if data.get("output_intensity")
                else None,
            )
        except ModelInvalid:
            raise
        except KeyError as exc:
            raise ModelInvalid(f"model spec has no {exc}; see engine/models/spec.py for the format") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise ModelInvalid(
                one_line(
                    f"model spec is malformed: {str(exc)[:200]}; see engine/models/spec.py for the format"
                )
            ) from None
        spec.validate()
        return spec

    def validate(self) -> None:
        """Refuse specs that cannot work, with a message naming the field."""
        self._check_networks_and_shapes()
        self._check_placement()
        self._check_channels()
        if self.geometry is not None:
            from engine.models.output_geometry import check_geometry

            check_geometry(self)
        if len(self.id) > 200 or any(len(t) > MAX_TEXT for t in (self.name, self.description)):
            raise ModelInvalid("model spec: id, name or description is too long")
        self._check_sampling()
        self._check_grid_and_schedule()
        self._check_numbers()

    def _check_networks_and_shapes(self) -> None:
        """The kind, its networks, and the output and latent shapes (four positive numbers, bounded)."""
        if self.kind not in ("latent", "pixel"):
            raise ModelInvalid(f"model kind must be 'latent' or 'pixel', not {self.kind!r}")
        if "unet" not in self.networks:
            raise ModelInvalid("model spec has no 'unet' network")
        if self.kind == "latent" and ("autoencoder" not in self.networks or not self.latent_shape):
            raise ModelInvalid("a latent model needs an 'autoencoder' network and a 'latent_shape'")
        from engine.models.network_limits import check_network_sizes

        for role, definition in self.networks.items():
            if not isinstance(definition, Mapping):
                raise ModelInvalid(f"model spec: networks.{role} must be an object with a _target_")
            check_network_sizes(definition, f"networks.{role}")
        for field_name, shape in (("output_shape", self.output_shape), ("latent_shape", self.latent_shape)):
            if shape is None:
                continue
            if len(shape) != 4 or min(shape) <= 0:
                raise ModelInvalid(
                    f"{field_name} must be four positive numbers (channels, x, y, z), got {list(shape)[:8]}"
                )
            if shape[0] > MAX_CHANNELS:
                raise ModelInvalid(
                    f"{field_name} has {shape[0]} channels; at most {MAX_CHANNELS} are accepted"
                )
            from engine.nifti.checks import check_voxel_count

            try:
                check_voxel_count(tuple(shape[1:]), f"the {field_name} of model {self.id[:80]!r}")
            except InvalidRequest as exc:
                raise ModelInvalid(str(exc)) from None

    def _check_placement(self) -> None:
        """The affine into world space, and the template space's name."""
        if self.world_affine is not None:
            matrix = np.array(self.world_affine, dtype=np.float64)
            if (
                matrix.shape != (4, 4)
                or not np.isfinite(matrix).all()
                or not np.allclose(matrix[3], [0, 0, 0, 1])
                or abs(np.linalg.det(matrix[:3, :3])) < 1e-9
            ):
                raise ModelInvalid(
                    "affine must be 4 rows of 4 finite numbers, last row [0, 0, 0, 1], invertible"
                )
        if self.space is not None and (len(self.space) > 100 or not self.space.replace("+", "").isalnum()):
            raise ModelInvalid(
                f"space {self.space[:40]!r} is not a template name (letters and digits, e.g. MNI152NLin2009aSym)"
            )

    def _check_channels(self) -> None:
        """The tissue-map channel names (one output channel each) and the modality names."""
        if self.label_channels:
            if len(self.label_channels) + 1 != self.output_shape[0]:
                raise ModelInvalid(
                    f"label_channels names {len(self.label_channels)} maps, so output_shape needs "
                    f"{len(self.label_channels) + 1} channels (image + maps), not {self.output_shape[0]}"
                )
            if len(set(self.label_channels)) != len(self.label_channels) or not all(
                name.isalnum() and len(name) <= 40 for name in self.label_channels
            ):
                raise ModelInvalid(
                    f"label_channels must be distinct names of letters and digits, got {list(self.label_channels)[:8]}"
                )
        if self.modalities:
            names = self.modality_names
            if len(set(names)) != len(names) or not all(
                0 < len(n) <= 40 and n.replace("-", "").isalnum() for n in names
            ):
                raise ModelInvalid(
                    f"modalities must be distinct names of letters, digits and '-', got {names[:8]}"
                )
            if self.default_modality not in names:
                raise ModelInvalid(f"default_modality {self.default_modality!r} is not among {list(names)}")

    def _check_sampling(self) -> None:
        """The samplers, the default one, and the conditioning modes."""
        if not self.family:
            raise ModelInvalid(
                f"unknown default_sampler {self.default_sampler!r}; known: {', '.join(sampler_names())}"
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

    def _check_grid_and_schedule(self) -> None:
        """The voxel spacing, the training schedule's length, and the default step count within it."""
        if (
            len(self.voxel_spacing_mm) != 3
            or min(self.voxel_spacing_mm) <= 0
            or not all(math.isfinite(v) for v in self.voxel_spacing_mm)
        ):
            raise ModelInvalid(
                f"voxel_spacing_mm must be three positive numbers, got {list(self.voxel_spacing_mm)}"
            )
        if "num_train_timesteps" not in self.schedule:
            raise ModelInvalid("schedule needs num_train_timesteps")
        for key, value in self.schedule.items():
            # JSON readers accept NaN and Infinity; a schedule holding one samples an all-NaN volume
            if isinstance(value, float) and not math.isfinite(value):
                raise ModelInvalid(f"schedule {key} is {value}; it must be a finite number")
        for key in ("beta_start", "beta_end"):
            # MONAI takes the square root of both for scaled_linear_beta (a negative one is a complex
            # number torch refuses mid-sampling) and a beta of 1 or more makes alpha <= 0
            value = self.schedule.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ModelInvalid(
                    f"schedule {key} must be a number from 0 to below 1, got {str(value)[:40]}"
                )
        timesteps = self.schedule["num_train_timesteps"]
        if (
            isinstance(timesteps, bool)
            or not isinstance(timesteps, int)
            or not 1 <= timesteps <= MAX_TIMESTEPS
        ):
            raise ModelInvalid(
                f"schedule num_train_timesteps must be a whole number from 1 to {MAX_TIMESTEPS:,}, "
                f"got {str(timesteps)[:40]}"
            )
        if not 1 <= self.default_steps <= timesteps:
            raise ModelInvalid(
                f"default_steps must be from 1 to num_train_timesteps ({timesteps}), got {self.default_steps}"
            )

    def _check_numbers(self) -> None:
        """The latent scale factor, the intensity range, and the guidance settings."""
        if not math.isfinite(self.scale_factor) or self.scale_factor == 0:
            raise ModelInvalid(f"scale_factor must be a finite, non-zero number, got {self.scale_factor}")
        if len(self.intensity_range) != 2 or not all(math.isfinite(v) for v in self.intensity_range):
            raise ModelInvalid(
                f"intensity_range must be two finite numbers, got {list(self.intensity_range)[:4]}"
            )
        if self.guidance_null_value is not None and not math.isfinite(self.guidance_null_value):
            raise ModelInvalid("guidance null_value must be a finite number or null")
        if not math.isfinite(self.default_guidance_scale) or self.default_guidance_scale < 0:
            raise ModelInvalid(
                f"guidance default_scale must be a finite number >= 0, got {self.default_guidance_scale}"
            )
        if self.default_guidance_scale != 1.0 and not self.supports_guidance:
            raise ModelInvalid(
                f"guidance default_scale is {self.default_guidance_scale:g}, but the model has no "
                "guidance null_value or no conditions; remove default_scale or set it to 1"
            )
