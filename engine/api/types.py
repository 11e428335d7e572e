"""The engine's public data types: what a caller asks for, hears while it runs, and gets back.

``SamplingRequest`` crosses the wire to remote backends, so it is a frozen dataclass that round-trips
through JSON. ``Backend.sample(request)`` is a generator: it yields ``Progress`` and returns a
``SamplingResult``; closing the generator cancels the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, overload, runtime_checkable

import numpy as np

from engine.api.optimization_config import OptimizationConfig
from engine.api.relay import drive
from engine.api.request_fields import SETTINGS, request_field
from engine.errors import InvalidRequest
from engine.nifti.volume import Volume

STAGES = ("load", "compile", "denoise", "decode")


@dataclass(frozen=True)
class SamplingRequest:
    """One generation job. Each field's bounds, help, CLI flag and wire rule are its row in
    ``engine.api.request_fields.REQUEST_FIELDS``, which ``__post_init__`` checks it against.

    Attributes:
        model: model id from the registry, or a model folder path. Empty means the shipped default.
        sampler: a registered sampler's name (``engine.samplers``: ddpm, ddim, pndm, rflow...); empty means the
            model's default.
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
        # Each field is checked by its row (engine.api.request_fields), the one statement of its bounds; frozen,
        # so the canonical values (tuples, a dict of conditions) are set via object.__setattr__ and equality and
        # hashing see them.
        for name in self.__dataclass_fields__:
            row, value = request_field(name), getattr(self, name)
            if row.kind == SETTINGS:
                if isinstance(value, Mapping):
                    object.__setattr__(self, name, OptimizationConfig.from_dict(value))
                elif not isinstance(value, OptimizationConfig):
                    raise InvalidRequest(f"optimization must be a table of settings, got {str(value)[:60]}")
                continue
            object.__setattr__(self, name, row.checked(value))

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


@overload
def run(
    job: Generator[Progress, None, SamplingResult],
    on_progress: Callable[[Progress], Any] | None = None,
    should_cancel: None = None,
) -> SamplingResult: ...


@overload
def run(
    job: Generator[Progress, None, SamplingResult],
    on_progress: Callable[[Progress], Any] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> SamplingResult | None: ...


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
