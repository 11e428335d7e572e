"""The generation form: the one owner of what the next generation request will be (Qt-free).

The form holds a request draft (``draft``, the engine's ``SamplingRequest``: sampler, steps, seed, guidance,
batch, conditioning, modality, output size, voxel spacing) and its own app state: the model source, the device,
the optimization settings as the user set them (refused ones included: a block says why, and an XLA server
receives none), the preview setting and the XLA plan with the server it was chosen for. ``form.steps`` and the
other request fields read the draft; ``set`` edits it, the engine's validation refusing a bad value at once.
The Generate and Optimization panels are views of the form (they write what the user changes and redraw on
``changed``); the main window, the Compare window, the Cohort dialog and the engine-server controller read it.
``to_request()`` is the draft with the app state filled in; ``to_dict()``/``restore()`` keep it across
restarts, with the values set for each model (a model chosen again gets its own values back).

Anything that makes the form unusable for the chosen target (refused optimization settings, a model the
chosen engine server lacks) is a *block*: a reason keyed by who set it, shown on the Generate button.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from app.core.events import Event
from engine.api.optimization_config import SETTING_ROWS

REMOTE_PREFIX = "remote:"  # device ids of engine servers: "remote:http://host:port" (app/remote)
# Previews during a run: ``preview_interval`` > 0 is every that many steps, 0 the final volume only, and -n
# n previews spread over the run. A latent model's preview is a decode of the whole latent (the shipped model
# on a 2-core CPU: 0.85 s in fp32, about six denoising steps; about 0.4 of that in bf16, where the CPU has
# native bf16 kernels), so the default is two per run, not one every few steps.
AUTO_PREVIEW = -2
PREVIEW_CHOICES = (
    (0, "Final volume only"),
    (-1, "Once, halfway"),
    (-2, "Twice per run"),
    (-4, "4 per run"),
    (-10, "About 10 per run"),
    (1, "Every step"),
)
#: The request fields the form edits in its draft, and those that are the form's own (app state).
DRAFT_FIELDS = (
    "sampler",
    "steps",
    "seed",
    "guidance_scale",
    "batch_size",
    "conditioning",
    # For models that let a request choose (NV-Generate-MR-Brain): "" / None mean the model's default.
    "modality",
    "output_size",
    "voxel_spacing_mm",
)
FIELDS = (
    *DRAFT_FIELDS,
    "device",
    "optimization",
    "preview_interval",
    # An XLA engine server's plan over its devices ("" = one device), for the device it was chosen for.
    "xla_plan",
)
#: What a model's values are (``set_model`` puts them back when that model is chosen again); the first five are
#: also kept across restarts.
MODEL_VALUES = (
    "sampler",
    "steps",
    "guidance_scale",
    "conditioning",
    "modality",
    "output_size",
    "voxel_spacing_mm",
)
_SAVED_MODEL_VALUES: dict[str, type | tuple[type, ...]] = {
    "sampler": str,
    "steps": int,
    "guidance_scale": (int, float),
    "conditioning": Mapping,
    "modality": str,
}
MAX_SEED = 2**31 - 1
# Settings whose speed and quality are the model's own (measured per model): a switch of model drops them,
# with the PSNR budgets that mean nothing without them.
QUANTIZATIONS = frozenset(row.name for row in SETTING_ROWS if row.per_model)
_BUDGETS = frozenset(row.name for row in SETTING_ROWS if row.budget_of in QUANTIZATIONS)


def _device_name(device: str) -> str:
    """``remote:http://host:8765`` -> ``the server host:8765``; ``cpu`` -> ``this computer's cpu``."""
    if device.startswith(REMOTE_PREFIX):
        return f"the server {device[len(REMOTE_PREFIX) :].split('://', 1)[-1]}"
    return f"this computer's {device}" if device not in ("", "auto") else "this computer"


def random_seed() -> int:
    return random.SystemRandom().randrange(0, MAX_SEED)


def auto_preview_interval(steps: int, previews: int = -AUTO_PREVIEW) -> int:
    """The step interval that makes ``previews`` previews in a run of ``steps`` (the final step makes none)."""
    return max(1, math.ceil(steps / (previews + 1)))


def preview_interval_for(setting: int, steps: int) -> int:
    """The request's ``preview_interval`` for the form's setting (see ``AUTO_PREVIEW``)."""
    return auto_preview_interval(steps, -setting) if setting < 0 else setting


def condition_problem(condition, value: float) -> str:
    """Why ``value`` is outside what ``condition`` (a model spec's ``ConditionSpec``) allows, or ""."""
    if not math.isfinite(value):
        return f"{condition.label} must be a number"
    if value < condition.min or value > condition.max:
        unit = f" {condition.unit}" if condition.unit else ""
        return (
            f"{condition.label} must be between {condition.min:g} and {condition.max:g}{unit}; got {value:g}"
        )
    return ""


def extrapolation_note(condition, value: float) -> str:
    """A note when ``value`` is allowed but outside the range the model saw in training, else ""."""
    low = getattr(condition, "trained_min", None)
    high = getattr(condition, "trained_max", None)
    if low is None or high is None or low <= value <= high:
        return ""
    unit = f" {condition.unit}" if condition.unit else ""
    return f"extrapolation: trained on {low:g} to {high:g}{unit}"


class GenerationForm:
    """What the next generation will be. Change it with ``set``/``set_model``; listen to ``changed``.

    Events:
        changed(name): a field changed (``"model"`` when the model did; its defaults follow).
        blocks_changed(): a block was set or lifted.
    """

    def __init__(self) -> None:
        from engine.api import SamplingRequest

        self.model: Any | None = None  # engine ModelSource (or app/remote's RemoteModelSource)
        # The request being written: its model, previews, plan and optimization are filled in by to_request.
        self.draft = SamplingRequest()
        self.device = "auto"
        self.optimization: dict[str, Any] = {}  # OptimizationConfig fields as set; {} is exact fp32
        self.preview_interval = AUTO_PREVIEW
        # The plan belongs to the server (device) it was chosen for: choosing another device clears it,
        # and xla_plan_cleared says why until the next plan is chosen or the note is dismissed.
        self.xla_plan = ""
        self.xla_plan_device = ""
        self.xla_plan_origin = ""  # where it was chosen, for the panel's line ("Plan view")
        self.xla_plan_cleared = ""
        self._cleared_plan = ("", "")  # (plan, device) of the plan a change of device cleared
        self._blocks: dict[str, str] = {}
        self.switch_note = ""  # what the last switch of model reset or dropped, for the user ("" if nothing)
        # Each model's values (MODEL_VALUES) by model id: set for it in this session, or restored from the settings.
        self._per_model: dict[str, dict[str, Any]] = {}
        # What each connected engine server said of itself (GET /info's details: its hardware probe, XLA
        # devices...), by device id: what the settings will meet there. Set by app/remote.
        self.server_details: dict[str, dict[str, Any]] = {}
        self.changed = Event()
        self.blocks_changed = Event()

    # -- the draft's fields, read through ------------------------------------------------------------

    sampler = property(lambda self: self.draft.sampler, doc='"" is the model\'s default')
    steps = property(lambda self: self.draft.steps, doc="0 is the model's default")
    seed = property(lambda self: self.draft.seed)
    guidance_scale = property(lambda self: self.draft.guidance_scale, doc="None: the model's default")
    batch_size = property(lambda self: self.draft.batch_size)
    conditioning = property(lambda self: self.draft.conditioning, doc="condition name -> value")
    modality = property(lambda self: self.draft.modality, doc='"" is the model\'s default')
    output_size = property(lambda self: self.draft.output_size, doc="None is the model's default")
    voxel_spacing_mm = property(lambda self: self.draft.voxel_spacing_mm, doc="None is the model's default")

    # -- editing -------------------------------------------------------------------------------------

    def set(self, **values: Any) -> None:
        """Set fields by name; emits ``changed(name)`` for each one that really changed.

        Raises:
            ValueError: an unknown field, a conditioning value outside the model's allowed range (the
                message names the range, so a view can show it instead of silently clamping), or a value
                the request refuses (``InvalidRequest``, which is a ValueError); the field keeps its value.
        """
        for name, value in values.items():
            if name not in FIELDS:
                raise ValueError(f"unknown generation setting {name!r}")
            if name == "conditioning":
                value = self._checked_conditioning(value)
            elif name == "optimization":
                value = dict(value or {})
            elif name in ("steps", "seed", "batch_size", "preview_interval"):
                value = int(value)
            elif name == "guidance_scale" and value is not None:
                value = float(value)
            elif name == "modality":
                value = self._checked_modality(str(value or ""))
            elif name == "output_size" and value is not None:
                value = tuple(int(v) for v in value)
            elif name == "voxel_spacing_mm" and value is not None:
                value = tuple(float(v) for v in value)
            elif name == "xla_plan":
                self.use_xla_plan(str(value or ""), self.device)
                continue
            if getattr(self, name) == value:
                continue
            if name in DRAFT_FIELDS:
                self.draft = self.draft.replace(**{name: value})
            else:
                setattr(self, name, value)
            self.changed.emit(name)
            if name == "device" and self.xla_plan and value != self.xla_plan_device:
                self._cleared_plan = (self.xla_plan, self.xla_plan_device)
                self.clear_xla_plan(
                    f"Plan {self.xla_plan} cleared: it was for {_device_name(self.xla_plan_device)}; "
                    "the next run uses one device."
                )
            elif name == "device" and self.xla_plan_cleared and self._cleared_plan[1] == value:
                # Back on the plan's server: "it was for the server X" would read as stale there.
                self.clear_xla_plan(
                    f"Plan {self._cleared_plan[0]} was cleared when another device was chosen: the next "
                    "run here uses one device (Use this plan in the Plan view sets it again)."
                )

    def use_xla_plan(self, plan: str, device: str, origin: str = "") -> None:
        """Run the next generations with ``plan`` (a name as ``volsynth plan`` prints it, or ``best``) on
        ``device`` (an XLA engine server's ``remote:`` id); "" clears it. ``origin`` says where it was chosen.

        Raises:
            ValueError: not a plan name.
        """
        from engine.api import XLA_PLAN_PATTERN

        plan = plan.strip()
        if plan and not re.fullmatch(XLA_PLAN_PATTERN, plan):
            raise ValueError(f"{plan!r} is not a plan name (dp2, d2xh2, dp2xd2/cut@2 or best)")
        before = (self.xla_plan, self.xla_plan_device, self.xla_plan_cleared)
        self.xla_plan, self.xla_plan_device = plan, (device if plan else "")
        self.xla_plan_origin = origin if plan else ""
        self.xla_plan_cleared = ""
        if (self.xla_plan, self.xla_plan_device, self.xla_plan_cleared) != before:
            self.changed.emit("xla_plan")

    def clear_xla_plan(self, reason: str = "") -> None:
        """Back to one device; ``reason`` (kept in ``xla_plan_cleared``) tells the user why."""
        if not self.xla_plan and self.xla_plan_cleared == reason:
            return
        self.xla_plan = self.xla_plan_device = self.xla_plan_origin = ""
        self.xla_plan_cleared = reason
        self.changed.emit("xla_plan")

    def set_condition(self, name: str, value: float) -> None:
        self.set(conditioning={**self.conditioning, name: float(value)})

    def set_model(self, source: Any | None) -> None:
        """Select a model; sampler, steps, guidance, conditioning, modality, size and spacing go to what was set
        for it before (in this session, or saved last time), else to its defaults."""
        if source is self.model:
            return
        previous, before = self.model, self._model_values()
        if previous is not None:
            self._per_model[previous.spec.id] = {name: before[name] for name in MODEL_VALUES}
        self.model = source
        self.switch_note = ""
        if source is not None:
            spec = source.spec
            draft = self.draft.replace(
                sampler=spec.default_sampler,
                steps=spec.default_steps,
                guidance_scale=spec.default_guidance_scale if spec.supports_guidance else 1.0,
                conditioning={c.name: float(c.default) for c in spec.conditioning},
                modality=getattr(spec, "default_modality", ""),
                output_size=None,
                voxel_spacing_mm=None,
            )
            for name, value in self._per_model.get(spec.id, {}).items():
                try:
                    if name == "sampler" and value not in spec.samplers:
                        continue
                    if name == "modality" and value not in getattr(spec, "modality_names", ()):
                        continue
                    if name == "conditioning":
                        value = self._checked_conditioning({**draft.conditioning, **value}, spec)
                    draft = draft.replace(**{name: value})
                except (TypeError, ValueError):
                    continue  # a value the model (or the request) no longer allows: its default stands
            self.draft = draft
            if previous is not None:
                self.switch_note = self._switch_note(spec, before)
        if self.switch_note and QUANTIZATIONS & set(before["optimization"]):
            self.changed.emit("optimization")  # first: views re-read their controls when the model changes
        self.changed.emit("model")

    def _model_values(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in MODEL_VALUES},
            "conditioning": dict(self.conditioning),
            "optimization": dict(self.optimization),
        }

    def _switch_note(self, spec, before: Mapping[str, Any]) -> str:
        """What a switch of model changed that the user had set: its defaults replace steps, sampler,
        guidance and conditioning, and a quantization (chosen and measured for another model) is dropped."""
        changed = []
        if before["steps"] != self.steps:
            changed.append(f"steps {before['steps']} \u2192 {self.steps}")
        if before["sampler"] != self.sampler:
            changed.append(f"sampler {before['sampler'] or 'default'} \u2192 {self.sampler or 'default'}")
        if before["guidance_scale"] != self.guidance_scale:
            changed.append(f"guidance {before['guidance_scale']} \u2192 {self.guidance_scale}")
        if before["conditioning"] != self.conditioning:
            changed.append("conditioning to its defaults" if self.conditioning else "no conditioning")
        dropped = sorted(QUANTIZATIONS & set(self.optimization))
        if dropped:
            what = ", ".join(f"{name.replace('_', ' ')} {self.optimization[name]}" for name in dropped)
            self.optimization = {
                k: v for k, v in self.optimization.items() if k not in QUANTIZATIONS and k not in _BUDGETS
            }
            changed.append(
                f"{what} off (it was chosen for another model; Measure now tells whether it pays here)"
            )
        return f"{spec.name}: {'; '.join(changed)}." if changed else ""

    def _checked_modality(self, name: str) -> str:
        if not name or self.model is None:
            return name
        names = getattr(self.model.spec, "modality_names", ())
        if name not in names:
            raise ValueError(
                f"{self.model.spec.name} has no modality {name!r}"
                + (f"; choose one of {', '.join(names)}" if names else "")
            )
        return name

    def _checked_conditioning(self, values: Mapping[str, Any], spec=None) -> dict[str, float]:
        spec = spec if spec is not None else (self.model.spec if self.model is not None else None)
        checked = {str(k): float(v) for k, v in dict(values).items()}
        if spec is not None:
            known = {c.name: c for c in spec.conditioning}
            for name, value in checked.items():
                if name not in known:
                    raise ValueError(f"{spec.name} has no conditioning input {name!r}")
                problem = condition_problem(known[name], value)
                if problem:
                    raise ValueError(problem)
        return checked

    # -- reading -------------------------------------------------------------------------------------

    @property
    def remote(self) -> bool:
        return self.device.startswith(REMOTE_PREFIX)

    @property
    def xla_server(self) -> bool:
        """The chosen device is an engine server that runs the networks as XLA programs (its /info lists XLA
        devices): it refuses every torch optimization setting."""
        return self.remote and bool(self.server_details.get(self.device, {}).get("xla_devices"))

    def sent_optimization(self) -> dict[str, Any]:
        """The optimization settings the request carries: none on an XLA server, which refuses them (they stay
        in the form for the next torch device), else the form's."""
        return {} if self.xla_server else dict(self.optimization)

    def model_reference(self) -> str:
        """How the request names the model: an engine server resolves ids in its own registry; this machine
        uses the folder path (the same model whichever registry the backend searches, and opened folders such
        as MONAI bundles need no registration)."""
        if self.model is None:
            return ""
        return self.model.spec.id if self.remote else str(self.model.path)

    def to_request(self, **overrides: Any):
        """The engine's ``SamplingRequest``: the draft with the model reference, optimization settings, previews
        and plan filled in (the engine validates it: InvalidRequest says what to fix).

        ``overrides`` replace request fields (the Compare window asks for batch 1 and no previews).
        """
        guidance = self.guidance_scale
        if self.model is not None and not self.model.spec.supports_guidance:
            guidance = 1.0
        return self.draft.replace(
            **{
                "model": self.model_reference(),
                "guidance_scale": guidance,
                "optimization": self.sent_optimization(),
                "preview_interval": preview_interval_for(self.preview_interval, self.steps),
                "xla_plan": self.xla_plan if self.device == self.xla_plan_device else "",
                **overrides,
            }
        )

    # -- blocks --------------------------------------------------------------------------------------

    def set_server_details(self, device: str, details: Mapping[str, Any] | None) -> None:
        """Remember (or, with None, forget) what the engine server behind ``device`` said of itself."""
        if details is None:  # the device goes away with it, and that change is announced on its own
            self.server_details.pop(device, None)
            return
        self.server_details[device] = dict(details)
        if device == self.device:
            self.changed.emit("device")

    def set_blocked(self, source: str, reason: str | None) -> None:
        """Generation is off while ``source`` has a ``reason``; ``None`` lifts the block."""
        before = dict(self._blocks)
        if reason:
            self._blocks[source] = reason
        else:
            self._blocks.pop(source, None)
        if self._blocks != before:
            self.blocks_changed.emit()

    def blocked_reason(self, ignore: Iterable[str] = ()) -> str:
        """Why generation is off ("" if it is not), leaving out the blocks of the ``ignore`` sources."""
        ignore = tuple(ignore)
        return "\n".join(reason for source, reason in self._blocks.items() if source not in ignore)

    # -- persistence ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the settings file. This computer's device is kept (the device list chooses Auto
        at the next start if it is gone); an engine server is not (its token is kept in memory only). The
        chosen model's values are at the top; ``models`` holds every model's (``MODEL_VALUES`` that are kept:
        sampler, steps, guidance, conditioning, modality)."""
        models = dict(self._per_model)
        if self.model is not None:
            models[self.model.spec.id] = self._model_values()
        return {
            "device": "auto" if self.remote else self.device,
            "model": self.model.spec.id if self.model is not None else "",
            "sampler": self.sampler,
            "steps": self.steps,
            "seed": self.seed,
            "guidance_scale": self.guidance_scale,
            "batch_size": self.batch_size,
            "conditioning": dict(self.conditioning),
            "optimization": dict(self.optimization),
            "modality": self.modality,
            "preview_interval": self.preview_interval,
            "models": {
                model_id: {name: values[name] for name in _SAVED_MODEL_VALUES if name in values}
                for model_id, values in models.items()
            },
        }

    def restore(self, saved: Mapping[str, Any]) -> str:
        """Take back what ``to_dict`` wrote. Model-specific values wait until that model is selected; wrong
        types are dropped (a hand-edited settings file must not stop the app). Returns the saved model id."""
        if not isinstance(saved, Mapping):
            return ""
        saved_model = saved.get("model")
        model_id = saved_model if isinstance(saved_model, str) else ""
        models = saved.get("models")
        for other_id, values in models.items() if isinstance(models, Mapping) else ():
            if isinstance(other_id, str) and isinstance(values, Mapping):
                self._per_model.setdefault(other_id, {}).update(_model_values_of(values))
        if model_id:  # the chosen model's values at the top (as every version wrote them)
            self._per_model.setdefault(model_id, {}).update(_model_values_of(saved))
        general: dict[str, Any] = {}  # keyword arguments of set(): seed, batch size, optimization, device
        seed = saved.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED:
            general["seed"] = seed
        batch = saved.get("batch_size")
        if isinstance(batch, int) and not isinstance(batch, bool) and 1 <= batch <= 16:
            general["batch_size"] = batch
        previews = saved.get("preview_interval")
        if isinstance(previews, int) and not isinstance(previews, bool) and previews >= -100:
            general["preview_interval"] = previews
        if isinstance(saved.get("optimization"), Mapping):
            general["optimization"] = dict(saved["optimization"])
        device = saved.get("device")
        if isinstance(device, str) and device and not device.startswith(REMOTE_PREFIX):
            general["device"] = device
        self.set(**general)
        if self.model is not None and self.model.spec.id in self._per_model:
            current, self.model = self.model, None
            self.set_model(current)  # the saved values of the model already selected apply now
        return model_id


def _model_values_of(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The model values of a saved form that have the right types (a hand-edited settings file must not stop the
    app; ``set_model`` drops those the model no longer allows)."""
    return {
        name: saved[name]
        for name, kind in _SAVED_MODEL_VALUES.items()
        if isinstance(saved.get(name), kind) and not isinstance(saved.get(name), bool)
    }
