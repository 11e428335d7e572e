"""What the Cohort dialog edits, without Qt: a cohort spec being written, its count and time estimate.

The request every volume is made from is the generation form's (:func:`cohort_template`: model, sampler,
steps, guidance, modality, size, spacing and optimization settings, as the Generate panel holds them); the
draft holds it as it is (``request``) and only what is the cohort's own beside it: its name, seeds, draws and
how each of the model's conditions varies: ``default`` (the model's default), ``fixed`` (one value), ``grid``
(``a`` to ``b`` in ``n`` steps), ``normal`` (mean ``a``, sd ``b``) or ``uniform`` (``a`` to ``b``).
``to_spec()`` builds the engine's :class:`engine.cohort.spec.CohortSpec`, which validates everything.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.api import XLA_PLAN_PATTERN
from engine.errors import EngineError
from engine.formatting import count_of

MODES = ("default", "fixed", "grid", "normal", "uniform")
# As many as the XLA backend's fake host devices: room for the 2-D plans `volsynth plan` prints (dp2xh2...).
DEFAULT_XLA_DEVICES = 8
_PLAN_NAME = re.compile(f"(?:{XLA_PLAN_PATTERN})")


@dataclass
class ConditionDraft:
    mode: str = "default"
    a: float = 0.0
    b: float = 0.0
    n: int = 3

    def to_spec(self) -> Any:
        if self.mode == "fixed":
            return {"values": [self.a]}
        if self.mode == "grid":
            return {"grid": {"start": self.a, "stop": self.b, "num": int(self.n)}}
        if self.mode == "normal":
            return {"distribution": "normal", "mean": self.a, "sd": self.b}
        if self.mode == "uniform":
            return {"distribution": "uniform", "min": self.a, "max": self.b}
        return None

    @property
    def values(self) -> int:
        return int(self.n) if self.mode == "grid" else 1


def cohort_template(form) -> tuple[Any, str]:
    """The generation form's request as a cohort's template (``engine.api.SamplingRequest``), and why it cannot
    run ("" when it can). What the Generate panel holds goes to every volume: model, sampler, steps, guidance,
    modality, size, spacing, and its optimization settings (the panel's own, whichever device it is set to: a
    cohort runs on its own device). Seeds and conditioning are the cohort's; batch, previews and the Plan view's
    plan are the Generate panel's (a cohort makes one volume per item, and chooses its own plan).

    Optimization settings the engine refuses leave the template plain fp32, with the reason."""
    from engine.api import SamplingRequest

    cohort_own = {"seed": 0, "conditioning": {}, "batch_size": 1, "preview_interval": 0, "xla_plan": ""}
    try:
        return form.to_request(**cohort_own, optimization=dict(form.optimization)), ""
    except EngineError as exc:
        problem = f"the Generate panel's settings cannot run: {exc}"
    try:
        return form.to_request(**cohort_own, optimization={}), problem
    except EngineError:
        return SamplingRequest(), problem


def default_name(form) -> str:
    """A cohort's name until the user writes one: the model's id (``brain-t1-demo-cohort``)."""
    if form.model is None:
        return "cohort"
    return f"{form.model.spec.id}-cohort".replace(".", "-")[:64]


@dataclass
class CohortDraft:
    name: str = "cohort"
    request: Any = (
        None  # engine.api.SamplingRequest: the form's (cohort_template); None is the default request
    )
    seeds: int = 1
    draws: int = 1
    draw_seed: int = 0
    conditions: dict[str, ConditionDraft] = field(default_factory=dict)
    problem: str = ""  # why the template cannot run as the Generate panel holds it ("" when it can)
    model_id: str = ""  # the model the conditions are for

    def __post_init__(self) -> None:
        if self.request is None:
            from engine.api import SamplingRequest

            self.request = SamplingRequest()

    @classmethod
    def from_form(cls, form) -> CohortDraft:
        """Start from the generation form: its request as the template, the model's conditions at its values."""
        draft = cls(name=default_name(form))
        draft.follow(form)
        return draft

    def follow(self, form) -> bool:
        """Take the form's request as it is now; a switch of model starts the conditions again from the new
        model's (at the form's values). Returns whether the model changed."""
        self.request, self.problem = cohort_template(form)
        model_id = form.model.spec.id if form.model is not None else ""
        switched, self.model_id = model_id != self.model_id, model_id
        if switched:
            self.conditions = {}
            for cond in form.model.spec.conditioning if form.model is not None else ():
                value = form.conditioning.get(cond.name, cond.default)
                self.conditions[cond.name] = ConditionDraft("default", float(value), float(cond.max), 3)
        return switched

    @property
    def has_distribution(self) -> bool:
        return any(c.mode in ("normal", "uniform") for c in self.conditions.values())

    def to_dict(self) -> dict[str, Any]:
        from engine.cohort.spec import template_fields

        return {
            "name": self.name,
            **template_fields(self.request),
            "seeds": int(self.seeds),
            "draws": int(self.draws) if self.has_distribution else 1,
            "draw_seed": int(self.draw_seed),
            "conditioning": {
                name: cond.to_spec() for name, cond in self.conditions.items() if cond.mode != "default"
            },
        }

    def to_spec(self):
        """The engine's CohortSpec (raises InvalidRequest with what to fix)."""
        from engine.cohort.spec import CohortSpec

        return CohortSpec.from_dict(self.to_dict())

    @property
    def count(self) -> int:
        grid = math.prod(c.values for c in self.conditions.values())
        draws = int(self.draws) if self.has_distribution else 1
        return grid * draws * int(self.seeds)


@dataclass(frozen=True)
class LocalDevices:
    """What this computer offers a cohort, found without starting JAX (on a TPU VM, the process that starts
    JAX takes every chip, and the cohort's workers would find none)."""

    cuda_gpus: int = 0
    cuda_name: str = ""
    jax: bool = False
    tpu: bool = False
    cpu_cores: int = 1


def local_devices() -> LocalDevices:
    """This machine's devices, from the engine's (cached) machine probe: torch's CUDA GPUs, JAX installed
    (found, not imported), TPU chips attached."""
    from engine.machine.probe import probe_machine

    probe = probe_machine()
    return LocalDevices(
        cuda_gpus=len(probe.gpus),
        cuda_name=probe.gpus[0].name if probe.gpus else "",
        jax=bool(probe.xla.get("jax_installed")),
        tpu=bool(probe.xla.get("tpu_present")),
        cpu_cores=max(1, probe.cpu.logical_cores or os.cpu_count() or 1),
    )


@dataclass
class DeviceChoice:
    """Where a cohort's workers run: ``device`` as the engine names it, and on ``xla`` how many XLA devices
    in all and the plan each worker runs over its group of them ("" = one device per worker)."""

    device: str = "auto"
    xla_devices: int = DEFAULT_XLA_DEVICES
    xla_plan: str = ""

    def run_options(self) -> dict[str, Any]:
        """The keyword arguments of ``engine.cohort.run_cohort`` that say where it runs."""
        if self.device != "xla":
            return {"device": self.device}
        return {"device": "xla", "xla_plan": self.xla_plan.strip(), "xla_devices": int(self.xla_devices)}

    def groups(self, workers: int | None, tpu_chips: int = 0):
        """The engine's split of the XLA devices into worker groups (``engine.cohort.xla_groups``); raises
        InvalidRequest / BackendUnavailable with what does not fit."""
        from engine.cohort.xla_groups import device_groups

        return device_groups(tpu_chips, plan=self.xla_plan.strip(), workers=workers, devices=self.xla_devices)

    def plan_problem(
        self, workers: int | None, *, tpu: bool = False, cluster: bool = False, guidance_scale: float = 1.0
    ) -> str:
        """Why the XLA devices and plan cannot run (one line, what to change), or "" when they can.

        The group arithmetic is the engine's. On this computer without TPU chips every worker starts its own
        fake host devices; with TPU chips (here, or on a cluster, which the dialog cannot see before Ray
        starts) ``best`` and the chip counts are checked when the run starts.
        """
        if self.device != "xla":
            return ""
        from engine.cohort.xla_groups import plan_devices

        plan = self.xla_plan.strip()
        if plan and not _PLAN_NAME.fullmatch(plan):
            return (
                f"{plan!r} is not a plan name: leave it empty (one device per worker) or write one as "
                "`volsynth plan` and the Plan view name them: dp2, d2xh2, dp2xd2/cut@2, best"
            )
        per_group = plan_devices(plan)
        if per_group is None:  # best: chosen per group on a TPU slice's topology
            if tpu or cluster:
                return ""
            return (
                "best is chosen on a TPU slice's topology, and this computer has no TPU: name a plan "
                "(dp2, d2xh2... as the Plan view lists them)"
            )
        if self.xla_devices % per_group:
            fits = ", ".join(str(per_group * k) for k in range(1, 4))
            return (
                f"plan {plan} runs each volume on {per_group} devices, and {self.xla_devices} devices do not "
                f"split into groups of {per_group}: choose {fits}... devices"
            )
        try:
            self.groups(workers, tpu_chips=self.xla_devices if tpu else 0)
        except EngineError as exc:
            return str(exc)
        return _batch_problem(plan, guidance_scale)

    def describe(self, workers: int | None, *, tpu: bool = False, cluster: bool = False) -> str:
        """``8 fake host devices in 4 worker(s) of 2, each volume sharded as plan dp2`` ("" if it cannot
        run); on a cluster, whose devices the dialog cannot see, ``XLA devices``."""
        try:
            groups = self.groups(workers, tpu_chips=self.xla_devices if tpu else 0)
        except EngineError:
            return ""
        plan = f"each volume sharded as plan {groups.plan}" if groups.plan else "each volume on one device"
        what = "TPU chips" if tpu else ("XLA devices" if cluster else "fake host devices")
        in_workers = count_of(groups.groups, "worker")
        return f"{groups.devices} {what} in {in_workers} of {groups.devices_per_group}, {plan}"


def _batch_problem(plan: str, guidance_scale: float) -> str:
    """A plan's data axis must divide the U-Net's batch (the engine's rule, engine.xla.execution); a cohort
    makes one volume per item, so that batch is 1, or 2 with guidance (its two halves)."""
    if not plan or plan == "best":
        return ""
    from engine.xla.execution import effective_batch, mesh_of_name

    data = mesh_of_name(plan)[0]
    batch = effective_batch(1, guidance_scale)
    if batch % data == 0:
        return ""
    if batch == 1:
        what, fix = "guidance 1: no second half", "use a plan without a data axis (d2, h2, d2xh2)"
        fix += ", or guidance other than 1 in the Generate panel (a batch of 2)" if data == 2 else ""
    else:
        what, fix = "its two guidance halves", "use a plan with a data axis of 2 or none (dp2, d2, dp2xh2)"
    return (
        f"plan {plan} splits the U-Net's batch {data} ways, but each cohort volume gives it a batch of {batch} "
        f"({what}): {fix}"
    )


def settings_text(config) -> str:
    """An ``OptimizationConfig`` for people, as the Optimization panel names its controls: ``Streamed decode,
    Autocast bf16``; ``plain float32 (exact)`` when nothing is changed."""
    from engine.api.optimization_config import SETTING_ROWS

    parts = []
    for row in SETTING_ROWS:
        value = getattr(config, row.name)
        if value == row.default:
            continue
        parts.append(
            row.label
            if value is True
            else f"{row.label} {value:g}"
            if isinstance(value, float)
            else f"{row.label} {value}"
        )
    return ", ".join(parts) or "plain float32 (exact)"


def torch_settings_problem(optimization) -> str:
    """Why the Generate panel's optimization settings (an ``OptimizationConfig``, or its fields) cannot go to an
    XLA cohort ("" if they can): they are torch settings, and the engine refuses them on ``--device xla``."""
    from engine.api.optimization_config import OptimizationConfig

    config = (
        optimization
        if isinstance(optimization, OptimizationConfig)
        else OptimizationConfig.from_dict(dict(optimization or {}))
    )
    if config.is_default:
        return ""
    what = config.settings.summary()
    what = "the allow-slower override" if what == "fp32" else what
    return (
        f"The Generate panel's optimization settings ({what}) are torch settings: XLA devices run float32 "
        "XLA programs, and the engine refuses them there."
    )


def parallel_workers(
    choice: DeviceChoice, workers: int | None, machine: LocalDevices, *, cluster: bool = False
) -> int:
    """How many volumes are made at once, for the time estimate: the workers, which on this computer's CPU
    (the cpu device, fake XLA host devices) share its cores."""
    if choice.device == "xla":
        try:
            count = choice.groups(workers, tpu_chips=choice.xla_devices if machine.tpu else 0).groups
        except EngineError:
            count = workers or 1
        on_cpu = not (machine.tpu or cluster)
    elif choice.device == "cuda" or (choice.device == "auto" and machine.cuda_gpus and not cluster):
        return max(1, workers or machine.cuda_gpus or 1)
    else:
        count, on_cpu = workers or 1, not cluster
    return max(1, min(count, machine.cpu_cores) if on_cpu else count)


def step_device_kind(choice: DeviceChoice, machine: LocalDevices) -> str:
    """The kind of device a cohort's step time is measured on: ``xla``, ``cuda`` or ``cpu``."""
    if choice.device == "auto":
        return "cuda" if machine.cuda_gpus else "cpu"
    return choice.device


def estimate_seconds(count: int, steps: int, step_s: float | None, workers: int = 1) -> float | None:
    """Time for ``count`` volumes of ``steps`` steps at ``step_s`` seconds per step (decode not counted)."""
    if not step_s or not steps or count <= 0:
        return None
    return count * steps * step_s / max(1, workers)


def last_step_seconds(volumes, device_kind: str = "") -> float | None:
    """Median seconds per denoising step of the most recent generated volume in the session, if any; with
    ``device_kind`` (``cpu``, ``cuda``, ``xla``), of the most recent one made on that kind of device (its
    provenance ``device``: ``cpu``, ``cuda:0``, ``xla:cpu:0``)."""
    for entry in reversed(list(volumes)):
        provenance = getattr(entry, "provenance", None) or {}
        times = provenance.get("step_times_s") or []
        device = str(provenance.get("device", ""))
        if device_kind and device.split(":")[0] != device_kind:
            continue
        if times:
            return float(np.median(times))
    return None


def montage(images: list[np.ndarray], columns: int = 6) -> np.ndarray:
    """Axial mid-slices of 3D volumes as one uint8 image (anterior up), each scaled to its 99.5th percentile."""
    if not images:
        return np.zeros((1, 1), np.uint8)
    tiles = []
    for volume in images:
        tile = np.asarray(volume, np.float32)[:, :, volume.shape[2] // 2].T[::-1]
        top = max(1e-6, float(np.percentile(tile, 99.5)))
        tiles.append(np.clip(tile / top * 255, 0, 255).astype(np.uint8))
    height = max(t.shape[0] for t in tiles)
    width = max(t.shape[1] for t in tiles)
    rows = -(-len(tiles) // columns)
    cols = min(columns, len(tiles))
    out = np.zeros((rows * (height + 2), cols * (width + 2)), np.uint8)
    for i, tile in enumerate(tiles):
        r, c = divmod(i, columns)
        y, x = r * (height + 2), c * (width + 2)
        out[y : y + tile.shape[0], x : x + tile.shape[1]] = tile
    return out


MONTAGE_SAMPLE = 12


def montage_picks(paths: list[str], sample: int = MONTAGE_SAMPLE) -> list[str]:
    """Up to ``sample`` of the files, spread evenly over the list, in the montage's order (row by row)."""
    if len(paths) > sample:
        picks = sorted(set(np.linspace(0, len(paths) - 1, sample).round().astype(int).tolist()))
        paths = [paths[i] for i in picks]
    return list(paths)


def montage_caption(paths: list[str], total: int, columns: int = 6) -> str:
    """What the montage shows, for its caption: how many of how many, which slice, and in which order."""
    names = [os.path.basename(p).split("_")[0] for p in paths]  # sub-synth0001
    return (
        f"Axial mid-slices of {len(paths)} of {count_of(total, 'volume')} (anterior up, each scaled to its "
        f"99.5th percentile), {min(columns, len(paths))} per row: {', '.join(names)}"
    )


def load_montage(paths: list[str], sample: int = MONTAGE_SAMPLE) -> np.ndarray:
    """A montage of up to ``sample`` of the files, spread evenly over the list (runs in a worker thread)."""
    from engine.nifti.io import load_nifti

    return montage([load_nifti(p).data for p in montage_picks(paths, sample)])
