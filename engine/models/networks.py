"""Build MONAI networks and schedulers from JSON definitions without running any code from the file.

A model file is untrusted input. MONAI's bundle config parser evaluates ``$...`` strings as Python, so
we never hand a definition to it. Instead:

* ``_target_`` must name one of a short allow-list of MONAI classes (by short name, by their
  ``monai.networks...`` path, or by the old ``generative.networks...`` path of MONAI GenerativeModels);
* every argument must be a JSON literal (number, string, bool, null, list, dict). Strings that start
  with ``$`` (expression) or ``%`` (macro) are refused. ``@name`` references are resolved as a plain
  dictionary lookup by :mod:`engine.models.bundle` before anything reaches this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import ModelInvalid

# short name -> the class's home in MONAI; imported lazily so this module stays cheap to import.
_NETWORKS = {
    "DiffusionModelUNet": ("monai.networks.nets", "DiffusionModelUNet"),
    "AutoencoderKL": ("monai.networks.nets", "AutoencoderKL"),
    "ControlNet": ("monai.networks.nets", "ControlNet"),
}
_SCHEDULERS = {
    "ddpm": ("monai.networks.schedulers", "DDPMScheduler"),
    "ddim": ("monai.networks.schedulers", "DDIMScheduler"),
    "pndm": ("monai.networks.schedulers", "PNDMScheduler"),
    "rflow": ("monai.networks.schedulers", "RFlowScheduler"),
}
_SCHEDULER_CLASS_TO_NAME = {cls: name for name, (_, cls) in _SCHEDULERS.items()}

# Arguments renamed when GenerativeModels moved into MONAI core (1.4).
_RENAMED_ARGS = {"num_channels": "channels"}


def short_target(target: str) -> str:
    """``monai.networks.nets.autoencoderkl.AutoencoderKL`` -> ``AutoencoderKL`` (only for allowed prefixes)."""
    if not isinstance(target, str):
        raise ModelInvalid(f"_target_ must be a class name, got {target!r}")
    if target.startswith(("$", "%", "@")):
        raise ModelInvalid(f"_target_ {target!r} is an expression; model files may only name MONAI classes")
    parts = target.split(".")
    if len(parts) > 1 and parts[0] not in ("monai", "generative"):
        raise ModelInvalid(f"_target_ {target!r} is not a MONAI class; refusing to construct it")
    return parts[-1]


def check_literal(value: Any, where: str) -> None:
    """Raise if ``value`` holds an expression or macro anywhere inside it."""
    if isinstance(value, str):
        if value.startswith(("$", "%")):
            raise ModelInvalid(
                f"{where} holds an expression ({value[:60]!r}); VolSynth never evaluates code from model "
                "files. Replace it with a literal value."
            )
        if value.startswith("@"):
            raise ModelInvalid(f"{where} holds an unresolved reference {value!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_literal(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_literal(item, f"{where}[{index}]")
    elif value is not None and not isinstance(value, bool | int | float):
        raise ModelInvalid(
            f"{where} has a value of type {type(value).__name__}; only JSON literals are allowed"
        )


def _clean_args(definition: Mapping[str, Any], where: str) -> dict[str, Any]:
    args = {}
    for key, value in definition.items():
        if key.startswith("_"):  # _target_, _requires_, _disabled_, _desc_: bundle metadata, not arguments
            continue
        check_literal(value, f"{where}.{key}")
        args[_RENAMED_ARGS.get(key, key)] = value
    return args


def _import(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(module), name)


def network_class_name(definition: Mapping[str, Any]) -> str:
    name = short_target(definition.get("_target_", ""))
    if name not in _NETWORKS:
        raise ModelInvalid(
            f"network _target_ {definition.get('_target_')!r} is not allowed; allowed: {', '.join(_NETWORKS)}"
        )
    return name


def build_network(definition: Mapping[str, Any], where: str = "network"):
    """Instantiate an allow-listed MONAI network from a JSON definition (weights untouched)."""
    name = network_class_name(definition)
    args = _clean_args(definition, where)
    try:
        return _import(*_NETWORKS[name])(**args)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ModelInvalid(f"cannot build {name} from the model's {where} definition: {exc}") from exc


def scheduler_name_for_target(target: str) -> str:
    name = short_target(target)
    if name not in _SCHEDULER_CLASS_TO_NAME:
        raise ModelInvalid(
            f"scheduler _target_ {target!r} is not allowed; allowed: {', '.join(_SCHEDULER_CLASS_TO_NAME)}"
        )
    return _SCHEDULER_CLASS_TO_NAME[name]


# Arguments each scheduler class accepts from a model's training schedule; the rest are dropped so one
# schedule can drive any sampler (a DDPM-trained epsilon model samples with DDIM or PNDM too).
_SCHEDULER_ARGS = {
    "ddpm": {
        "num_train_timesteps",
        "schedule",
        "beta_start",
        "beta_end",
        "variance_type",
        "clip_sample",
        "prediction_type",
        "clip_sample_min",
        "clip_sample_max",
    },
    "ddim": {
        "num_train_timesteps",
        "schedule",
        "beta_start",
        "beta_end",
        "clip_sample",
        "set_alpha_to_one",
        "steps_offset",
        "prediction_type",
        "clip_sample_min",
        "clip_sample_max",
    },
    "pndm": {
        "num_train_timesteps",
        "schedule",
        "beta_start",
        "beta_end",
        "skip_prk_steps",
        "set_alpha_to_one",
        "prediction_type",
        "steps_offset",
    },
    "rflow": {
        "num_train_timesteps",
        "use_discrete_timesteps",
        "sample_method",
        "loc",
        "scale",
        "use_timestep_transform",
        "transform_scale",
        "steps_offset",
        "base_img_size_numel",
        "spatial_dim",
    },
}


def build_scheduler(sampler: str, schedule: Mapping[str, Any]):
    """A fresh MONAI scheduler of the requested kind configured with the model's training schedule."""
    if sampler not in _SCHEDULERS:
        raise ModelInvalid(f"unknown sampler {sampler!r}; known: {', '.join(_SCHEDULERS)}")
    check_literal(dict(schedule), "schedule")
    args = {k: v for k, v in schedule.items() if k in _SCHEDULER_ARGS[sampler]}
    if sampler == "pndm":
        # PRK warm-up steps need 3 model calls each; PLMS alone is what diffusers and MONAI users run.
        args.setdefault("skip_prk_steps", True)
    try:
        return _import(*_SCHEDULERS[sampler])(**args)
    except (TypeError, ValueError) as exc:
        raise ModelInvalid(f"cannot build the {sampler} scheduler from the model's schedule: {exc}") from exc
