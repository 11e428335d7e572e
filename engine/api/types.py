"""The engine's public data types: what a caller asks for, hears while it runs, and gets back.

``SamplingRequest`` crosses the wire to remote backends, so it is a frozen dataclass that round-trips
through JSON. ``Backend.sample(request)`` is a generator: it yields ``Progress`` and returns a
``SamplingResult``; closing the generator cancels the run.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine.api.optimization_config import OptimizationConfig
from engine.api.relay import drive
from engine.errors import InvalidRequest
from engine.nifti.volume import Volume
from engine.samplers import sampler_names

MAX_BATCH = 16
MAX_STEPS = 10_000
MAX_PROFILED_STEPS = 10  # profiler traces grow with every step; a few steps show the steady state
STAGES = ("load", "compile", "denoise", "decode")
MAX_EDGE = 4096  # voxels along one axis of a requested output size (a model's own limits are tighter)
_MODALITY_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
# ``best``, or a plan name as ``volsynth plan`` prints it: mesh axes dp/d/h with their sizes, and a variant.
XLA_PLAN_PATTERN = r"best|single|(dp|d|h)\d{1,3}(x(d|h)\d{1,3}){0,2}(/cut@\d{1,2})?"
_XLA_PLAN_NAME = re.compile(XLA_PLAN_PATTERN)


@dataclass(frozen=True)
class SamplingRequest:
    """One generation job.

    Attributes:
        model: model id from the registry, or a model folder path. Empty means the shipped default.
        sampler: "ddim", "ddpm", "pndm" or "rflow"; empty means the model's default.
        steps: number of denoising steps; 0 means the model's default.
        seed: seeds the initial noise (and DDPM's per-step noise). Same request + device = same volume.
        conditioning: condition name -> value in the units the model spec gives (mL, years...).
        guidance_scale: classifier-free guidance scale; 1.0 means plain conditional sampling, None the
            model's default (its spec's ``guidance.default_scale``).
        batch_size: number of volumes generated together.
        optimization: speed/precision settings; defaults are plain fp32.
        preview_interval: yield an x0 preview every this many steps (0 = never). Slow previews (CPU decodes)
            are thinned so that they take at most a quarter of the run (``engine.sampling.PreviewPacer``).
        kernel_profile_steps: run ``torch.profiler`` around this many denoising steps (from step 2; step 1
            warms up) and put their top operators in ``provenance["kernel_profile"]``. Profiled steps run
            slower; their numbers are listed there so that latency statistics can leave them out.
        modality: categorical conditioning by name (MAISI v2 brain: ``t1w``, ``t2w``, ``flair``, ``swi`` and
            the same with ``-skullstripped``); empty means the model's default, or none for models that take
            none.
        output_size: (x, y, z) voxels, for models that let a request choose; None means the model's default.
        voxel_spacing_mm: (x, y, z) mm, likewise; None means the model's default.
        xla_plan: how an XLA engine server splits the run over its devices: empty = one device, ``best`` =
            the planner's best plan for its devices, or a plan by the name ``volsynth plan`` prints
            (``dp2xd2``, ``d4/cut@2``). Other backends refuse a plan.
    """

    model: str = ""
    sampler: str = ""
    steps: int = 0
    seed: int = 0
    conditioning: Mapping[str, float] = field(default_factory=dict)
    guidance_scale: float | None = None
    batch_size: int = 1
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    preview_interval: int = 0
    kernel_profile_steps: int = 0
    # -- what the output is, for models that let a request choose (engine.models.output_geometry) --------
    modality: str = ""
    output_size: tuple[int, int, int] | None = None
    voxel_spacing_mm: tuple[float, float, float] | None = None
    # -- where it runs, for backends with several devices ------------------------------------------------
    xla_plan: str = ""

    def __post_init__(self) -> None:
        # Frozen: normalise via object.__setattr__ so equality and hashing see canonical values.
        object.__setattr__(self, "conditioning", dict(self.conditioning))
        if isinstance(self.optimization, Mapping):
            object.__setattr__(self, "optimization", OptimizationConfig.from_dict(self.optimization))
        if self.sampler and self.sampler not in sampler_names():
            raise InvalidRequest(
                f"unknown sampler {self.sampler!r}; choose one of {', '.join(sampler_names())}"
            )
        if not isinstance(self.steps, int) or isinstance(self.steps, bool):
            raise InvalidRequest(f"steps must be a whole number, got {self.steps!r}")
        if self.steps < 0 or self.steps > MAX_STEPS:
            raise InvalidRequest(
                f"steps must be between 1 and {MAX_STEPS} (0 = model default), got {self.steps}"
            )
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise InvalidRequest(f"seed must be a whole number from 0 to 2^63-1, got {self.seed!r}")
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= MAX_BATCH:
            raise InvalidRequest(f"batch size must be between 1 and {MAX_BATCH}, got {self.batch_size!r}")
        if self.guidance_scale is not None and (
            isinstance(self.guidance_scale, bool)
            or not isinstance(self.guidance_scale, int | float)
            or not math.isfinite(self.guidance_scale)
            or self.guidance_scale < 0
        ):
            raise InvalidRequest(f"guidance scale must be a finite number >= 0, got {self.guidance_scale}")
        if not isinstance(self.preview_interval, int) or self.preview_interval < 0:
            raise InvalidRequest(f"preview interval must be >= 0 steps, got {self.preview_interval!r}")
        if (
            not isinstance(self.kernel_profile_steps, int)
            or isinstance(self.kernel_profile_steps, bool)
            or not 0 <= self.kernel_profile_steps <= MAX_PROFILED_STEPS
        ):
            raise InvalidRequest(
                f"kernel profile steps must be a whole number from 0 to {MAX_PROFILED_STEPS}, "
                f"got {self.kernel_profile_steps!r}"
            )
        for name, value in self.conditioning.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise InvalidRequest(f"condition {name!r} must be a finite number, got {value!r}")
        self._check_output_fields()

    def _check_output_fields(self) -> None:
        if not isinstance(self.xla_plan, str) or not _XLA_PLAN_NAME.fullmatch(self.xla_plan or "best"):
            raise InvalidRequest(
                f"xla_plan must be empty, 'best' or a plan name such as dp2xd2 (see `volsynth plan`), "
                f"got {str(self.xla_plan)[:60]!r}"
            )
        if not isinstance(self.modality, str) or not _MODALITY_NAME.fullmatch(self.modality or "x"):
            raise InvalidRequest(
                f"modality must be a name such as t1w or flair-skullstripped, got {str(self.modality)[:60]!r}"
            )
        if self.output_size is not None:
            size = self.output_size
            if (
                not isinstance(size, list | tuple)
                or len(size) != 3
                or not all(
                    isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_EDGE for n in size
                )
            ):
                raise InvalidRequest(
                    f"output size must be three whole numbers from 1 to {MAX_EDGE}, got {str(size)[:60]}"
                )
            object.__setattr__(self, "output_size", tuple(size))
        if self.voxel_spacing_mm is not None:
            spacing = self.voxel_spacing_mm
            if (
                not isinstance(spacing, list | tuple)
                or len(spacing) != 3
                or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in spacing
                )
            ):
                raise InvalidRequest(
                    f"voxel spacing must be three positive numbers (mm), got {str(spacing)[:60]}"
                )
            object.__setattr__(self, "voxel_spacing_mm", tuple(float(v) for v in spacing))

    def replace(self, **changes: Any) -> SamplingRequest:
        data = self.to_dict()
        data.update(
            {k: (v.to_dict() if isinstance(v, OptimizationConfig) else v) for k, v in changes.items()}
        )
        return SamplingRequest.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["optimization"] = self.optimization.to_dict()
        data["conditioning"] = dict(self.conditioning)
        for name in ("output_size", "voxel_spacing_mm"):
            if data[name] is not None:
                data[name] = list(data[name])
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingRequest:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise InvalidRequest(f"unknown request field(s): {', '.join(sorted(unknown))}")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, text: str) -> SamplingRequest:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"request is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class Progress:
    """A report from a running job.

    ``preview`` (when present) is a small float32 array (batch item 0, channel 0) of the current
    estimate of the clean volume, already decoded for latent models and scaled to the model's
    intensity range. ``preview_stride`` is the step between the output voxels it keeps, the same on every
    axis (the preview's voxel size is the model's times this).
    """

    stage: str
    step: int
    total: int
    elapsed_s: float
    message: str = ""
    preview: np.ndarray | None = field(default=None, compare=False, repr=False)
    preview_stride: int = 1

    @property
    def fraction(self) -> float:
        return self.step / self.total if self.total else 0.0


@dataclass
class SamplingResult:
    """Generated volumes and how they were made.

    Attributes:
        volumes: float32 array (batch, channels, x, y, z).
        affine: 4x4 voxel -> RAS mm (NIfTI convention), shared by all volumes of the batch.
        request: the request as run (model defaults filled in).
        provenance: JSON-ready record: model + weights sha256, scheduler, seed, conditioning,
            optimization requested/applied, device, library versions, timings.
    """

    volumes: np.ndarray
    affine: np.ndarray
    request: SamplingRequest
    provenance: dict[str, Any]

    @property
    def label_names(self) -> tuple[str, ...]:
        """Names of the tissue maps in channels 1.. (the model spec's ``label_channels``), or ()."""
        names = tuple(str(n) for n in self.provenance.get("label_channels") or ())
        return names if names and len(names) + 1 == self.volumes.shape[1] else ()

    @property
    def space(self) -> str | None:
        """The template space the affine maps into (e.g. ``MNI152NLin2009aSym``), None if unnamed."""
        return self.provenance.get("space") or None

    @property
    def images(self) -> np.ndarray:
        """The generated images without tissue maps: (batch, channels, x, y, z)."""
        return self.volumes[:, :1] if self.label_names else self.volumes

    def volume(self, index: int = 0) -> np.ndarray:
        """One image as (x, y, z) when single-channel, else (channels, x, y, z); never the tissue maps."""
        vol = self.images[index]
        return vol[0] if vol.shape[0] == 1 else vol

    def tissue_maps(self, index: int = 0) -> dict[str, np.ndarray]:
        """The tissue maps decoded with image ``index``, name -> (x, y, z) float32 probabilities in [0, 1] that
        are a partition (GM + WM + CSF + background = 1 per voxel; ``engine.anatomy.partition``)."""
        from engine.anatomy.partition import partition_channels

        return partition_channels(
            {name: self.volumes[index, channel] for channel, name in enumerate(self.label_names, start=1)}
        )

    @property
    def tissue_maps_made(self) -> dict[str, Any]:
        """How ``tissue_maps`` were made, for their sidecar (``tissue_maps_made``): the model's channels, made a
        partition."""
        from engine.anatomy.partition import PARTITION_RECORD

        return {"tissue_maps_source": "model channels", "partition": PARTITION_RECORD}

    def member(self, index: int = 0) -> Volume:
        """Batch member ``index`` as the engine's one volume record: its image (``volume(index)``), the batch's
        affine, its tissue maps, and the provenance with its ``batch_index`` (as ``generated_volumes`` gives it to ``save_volume``)."""
        return Volume(
            data=self.volume(index),
            affine=self.affine,
            tissue=self.tissue_maps(index),
            provenance={**self.provenance, "batch_index": index},
            synthetic=True,
            space=self.space,
        )


@dataclass(frozen=True)
class BackendInfo:
    name: str  # "local", "remote", "xla"
    device: str  # "cpu", "cuda:0", "http://host:port (cuda:0)"...
    device_name: str
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """Something that runs sampling requests. Cancel by closing the generator ``sample`` returned."""

    def info(self) -> BackendInfo: ...

    def sample(self, request: SamplingRequest) -> Generator[Progress, None, SamplingResult]: ...


def run(
    job: Generator[Progress, None, SamplingResult],
    on_progress: Callable[[Progress], Any] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> SamplingResult | None:
    """Drive a sampling generator to the end. Returns None if ``should_cancel`` said stop.

    The name callers have long used for :func:`engine.api.relay.drive`, the one relay: cancellation closes
    the generator in this thread, so the backend's ``finally`` blocks release memory and files before this
    returns.
    """
    return drive(job, on_progress=on_progress, should_stop=should_cancel)
