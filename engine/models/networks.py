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
from engine.samplers import SchedulerAdapter, sampler_adapter, sampler_for_scheduler_class, sampler_names

# short name -> the class's home in MONAI; imported lazily so this module stays cheap to import.
_NETWORKS = {
    "DiffusionModelUNet": ("monai.networks.nets", "DiffusionModelUNet"),
    "AutoencoderKL": ("monai.networks.nets", "AutoencoderKL"),
    "ControlNet": ("monai.networks.nets", "ControlNet"),
    # MAISI v2 (NVIDIA's NV-Generate models): the networks live in MONAI's apps, not in monai.networks.
    "DiffusionModelUNetMaisi": (
        "monai.apps.generation.maisi.networks.diffusion_model_unet_maisi",
        "DiffusionModelUNetMaisi",
    ),
    "AutoencoderKlMaisi": ("monai.apps.generation.maisi.networks.autoencoderkl_maisi", "AutoencoderKlMaisi"),
}
#: Classes whose arguments kept GenerativeModels' names (``num_channels``): never renamed for them.
_KEEPS_OLD_ARG_NAMES = frozenset({"DiffusionModelUNetMaisi", "AutoencoderKlMaisi"})
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


def _clean_args(definition: Mapping[str, Any], where: str, rename: bool = True) -> dict[str, Any]:
    args = {}
    for key, value in definition.items():
        if key.startswith("_"):  # _target_, _requires_, _disabled_, _desc_: bundle metadata, not arguments
            continue
        check_literal(value, f"{where}.{key}")
        args[_RENAMED_ARGS.get(key, key) if rename else key] = value
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
    """Instantiate an allow-listed MONAI network from a JSON definition (weights untouched).

    Every size field is bounded first: MONAI builds whatever it is told, and a hostile count of blocks
    would keep it busy for minutes before anything could refuse it.
    """
    from engine.models.network_limits import check_network_sizes

    name = network_class_name(definition)
    check_network_sizes(definition, where)
    args = _clean_args(definition, where, rename=name not in _KEEPS_OLD_ARG_NAMES)
    flash_without_cuda = bool(args.get("use_flash_attention")) and not _cuda_available()
    if flash_without_cuda:
        # MONAI refuses to build a network with flash attention where CUDA is absent ("Flash attention is
        # only available for GPU"). The same weights run with torch's scaled-dot-product attention, which
        # has CPU kernels: build without, then switch the attention blocks (attention_note says so).
        args["use_flash_attention"] = False
    try:
        net = _import(*_NETWORKS[name])(**args)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ModelInvalid(f"cannot build {name} from the model's {where} definition: {exc}") from exc
    if "use_flash_attention" in definition:
        switched = switch_to_sdpa(net) if flash_without_cuda else 0
        net.attention_note = _attention_note(
            bool(definition["use_flash_attention"]), flash_without_cuda, switched
        )
    return net


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def switch_to_sdpa(net) -> int:
    """Run MONAI's attention blocks through ``torch.nn.functional.scaled_dot_product_attention``; returns
    how many were switched (blocks that save attention maps or add positional terms cannot be)."""
    switched = 0
    for module in net.modules():
        if type(module).__name__ not in ("SABlock", "CrossAttentionBlock"):
            continue
        if (
            getattr(module, "save_attn", False)
            or getattr(module, "rel_positional_embedding", None) is not None
        ):
            continue
        module.use_flash_attention = True
        switched += 1
    return switched


def _attention_note(asked_flash: bool, flash_without_cuda: bool, switched: int) -> dict[str, Any]:
    """What attention a built network runs, for provenance."""
    if not asked_flash:
        return {"requested": "plain", "kernel": "plain", "reason": "the definition asks for plain attention"}
    if flash_without_cuda:
        kernel = "sdpa" if switched else "plain"
        return {
            "requested": "flash",
            "kernel": kernel,
            "blocks": switched,
            "reason": "flash attention needs CUDA, absent here: built without it (MONAI refuses otherwise) "
            + (
                f"and {switched} attention blocks switched to torch SDPA"
                if switched
                else "with plain attention"
            ),
        }
    return {
        "requested": "flash",
        "kernel": "sdpa",
        "reason": "CUDA present: MONAI's flash setting runs torch SDPA, which picks its flash kernel where it can",
    }


def scheduler_name_for_target(target: str) -> str:
    """The registered sampler whose scheduler class a model file's ``_target_`` names."""
    name = short_target(target)
    sampler = sampler_for_scheduler_class(name)
    if sampler is None:
        allowed = sorted({sampler_adapter(n).scheduler_class[1] for n in sampler_names()})
        raise ModelInvalid(f"scheduler _target_ {target!r} is not allowed; allowed: {', '.join(allowed)}")
    return sampler


def build_sampler(sampler: str, schedule: Mapping[str, Any]) -> SchedulerAdapter:
    """A fresh sampler (its adapter over a new scheduler) configured with the model's training schedule.

    Each sampler takes the schedule arguments its scheduler accepts and drops the rest, so one schedule drives
    every sampler of its family (a DDPM-trained epsilon model samples with DDIM or PNDM too).
    """
    try:
        adapter = sampler_adapter(sampler)
    except KeyError:
        raise ModelInvalid(f"unknown sampler {sampler!r}; known: {', '.join(sampler_names())}") from None
    check_literal(dict(schedule), "schedule")
    try:
        return adapter(schedule)
    except (TypeError, ValueError) as exc:
        raise ModelInvalid(f"cannot build the {sampler} scheduler from the model's schedule: {exc}") from exc


def build_scheduler(sampler: str, schedule: Mapping[str, Any]):
    """The bare scheduler of ``build_sampler`` (MONAI's inferers take it: the loop's reference)."""
    return build_sampler(sampler, schedule).scheduler
