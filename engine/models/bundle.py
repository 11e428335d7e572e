"""Open MONAI model-zoo bundles (``configs/inference.json``, ``configs/metadata.json``, ``models/*.pt``).

Only data is read from the JSON. The network and scheduler definitions are found by their ``_target_``
(allow-listed in :mod:`engine.models.networks`); ``@name`` references are resolved by plain dictionary
lookup; ``$`` expressions are never evaluated — a definition that needs one is refused. Shapes and
conditioning come from ``metadata.json``'s ``network_data_format``, the latent shape from the
autoencoder's definition.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.errors import ModelInvalid
from engine.models import networks
from engine.models.network_limits import check_network_sizes
from engine.models.source import ModelSource, inside, read_json_limited, snake_case
from engine.models.spec import ConditionSpec, ModelSpec

# Where bundles keep their checkpoints, most specific first.
_CHECKPOINTS = {
    "unet": (
        "models/model.pt",
        "models/diffusion_model.pt",
        "models/model_diffusion.pt",
        "models/model.safetensors",
    ),
    "autoencoder": ("models/autoencoder.pt", "models/model_autoencoder.pt", "models/autoencoder.safetensors"),
}


def _load_json(path: Path, folder: Path) -> dict[str, Any]:
    data = read_json_limited(path, folder, "bundle file")
    if not isinstance(data, dict):
        raise ModelInvalid(f"{path} must hold a JSON object")
    return data


def _resolve(config: dict[str, Any], value: Any, depth: int = 0) -> Any:
    """Follow ``@name`` references (plain lookups of top-level keys), at most a few levels deep."""
    while isinstance(value, str) and value.startswith("@") and depth < 8:
        key = value[1:]
        if key not in config:
            raise ModelInvalid(f"bundle reference {value!r} names no key in inference.json")
        value, depth = config[key], depth + 1
    if isinstance(value, dict):
        # "_requires_" and friends order MONAI's own evaluation; they are not data, so never followed.
        return {k: (v if k.startswith("_") else _resolve(config, v, depth + 1)) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(config, v, depth + 1) for v in value]
    return value


def _find_definitions(config: dict[str, Any]) -> tuple[dict[str, dict], tuple[str, dict] | None]:
    nets: dict[str, dict] = {}
    scheduler = None
    for key, raw in config.items():
        if not isinstance(raw, dict) or "_target_" not in raw:
            continue
        target = raw["_target_"]
        if not isinstance(target, str) or target.startswith(("$", "%", "@")):
            continue
        short = target.split(".")[-1]
        if short == "DiffusionModelUNet":
            nets.setdefault("unet", _resolve(config, raw))
        elif short == "AutoencoderKL":
            nets.setdefault("autoencoder", _resolve(config, raw))
        elif short.endswith("Scheduler") and scheduler is None:
            scheduler = (networks.scheduler_name_for_target(target), _resolve(config, raw))
        _ = key
    return nets, scheduler


def _spacing_from_metadata(metadata: dict[str, Any]) -> tuple[float, float, float]:
    text = str(metadata.get("image_classes", ""))
    match = re.search(r"(\d+(?:\.\d+)?)\s*x\s*(\d+(?:\.\d+)?)\s*x\s*(\d+(?:\.\d+)?)\s*mm", text)
    if match:
        return tuple(float(g) for g in match.groups())  # type: ignore[return-value]
    return (1.0, 1.0, 1.0)


def _conditions(metadata: dict[str, Any], config: dict[str, Any]) -> tuple[ConditionSpec, ...]:
    inputs = (metadata.get("network_data_format") or {}).get("inputs") or {}
    for entry in inputs.values():
        if not isinstance(entry, dict) or entry.get("type") != "tabular":
            continue
        low, high = (entry.get("value_range") or [0.0, 1.0])[:2]
        channel_def = entry.get("channel_def") or {}
        conditions = []
        for index in sorted(channel_def, key=lambda k: int(k)):
            label = str(channel_def[index])
            name = snake_case(label)
            # Defaults: the bundle's own example value when a top-level key names this input.
            default = next(
                (
                    float(v)
                    for k, v in config.items()
                    if isinstance(v, int | float)
                    and not isinstance(v, bool)
                    and k != "load_old"
                    and (name == k or name.startswith(k))
                ),
                (float(low) + float(high)) / 2,
            )
            conditions.append(
                ConditionSpec(
                    name=name,
                    label=label,
                    unit="",
                    min=float(low),
                    max=float(high),
                    default=min(max(default, float(low)), float(high)),
                )
            )
        return tuple(conditions)
    return ()


def open_bundle(folder: Path) -> ModelSource:
    config = _load_json(folder / "configs" / "inference.json", folder)
    metadata_path = folder / "configs" / "metadata.json"
    metadata = _load_json(metadata_path, folder) if metadata_path.is_file() else {}

    nets, scheduler = _find_definitions(config)
    if "unet" not in nets:
        raise ModelInvalid(f"bundle {folder.name}: inference.json defines no DiffusionModelUNet")
    for role, definition in nets.items():
        networks.check_literal(
            {k: v for k, v in definition.items() if k != "_requires_"}, f"{role} definition"
        )
        # before the latent shape is derived from the levels, and long before anything is built
        check_network_sizes(definition, f"{role} definition")
    if scheduler is None:
        raise ModelInvalid(
            f"bundle {folder.name}: inference.json defines no scheduler (DDPM/DDIM/PNDM/RFlow)"
        )
    sampler_name, scheduler_def = scheduler
    schedule = {k: v for k, v in scheduler_def.items() if not k.startswith("_")}
    networks.check_literal(schedule, "scheduler definition")

    outputs = (metadata.get("network_data_format") or {}).get("outputs") or {}
    pred: dict[str, Any] = next(iter(outputs.values()), {}) if outputs else {}
    spatial = pred.get("spatial_shape")
    if not spatial or len(spatial) != 3:
        raise ModelInvalid(f"bundle {folder.name}: metadata.json has no 3D output spatial_shape")
    output_shape = (int(pred.get("num_channels", 1)), *[int(s) for s in spatial])

    unet_def = nets["unet"]
    conditions = _conditions(metadata, config)
    modes = []
    if conditions:
        ae_latent = int(nets.get("autoencoder", {}).get("latent_channels", output_shape[0]))
        if int(unet_def.get("in_channels", 0)) == ae_latent + len(conditions):
            modes.append("concat")
        if unet_def.get("with_conditioning") and unet_def.get("cross_attention_dim") == len(conditions):
            modes.append("crossattn")

    latent_shape = None
    kind = "pixel"
    if "autoencoder" in nets:
        kind = "latent"
        ae = nets["autoencoder"]
        levels = len(ae.get("channels", ae.get("num_channels", (32, 64, 64, 64))))
        factor = 2 ** (levels - 1)
        if any(s % factor for s in output_shape[1:]):
            raise ModelInvalid(
                f"bundle {folder.name}: output shape {output_shape[1:]} is not divisible by the "
                f"autoencoder's downsampling factor {factor}"
            )
        latent_shape = (int(ae.get("latent_channels", 3)), *[s // factor for s in output_shape[1:]])

    scale = config.get("scale_factor", 1.0)
    weight_files = {}
    for role in nets:
        found = next((folder / rel for rel in _CHECKPOINTS[role] if (folder / rel).is_file()), None)
        if found is None:
            raise ModelInvalid(
                f"bundle {folder.name}: no {role} checkpoint (looked for {', '.join(_CHECKPOINTS[role])})"
            )
        weight_files[role] = found
        inside(folder, found, "checkpoint")

    spec = ModelSpec(
        id=folder.name,
        name=str(metadata.get("task") or metadata.get("name") or folder.name),
        kind=kind,
        networks=nets,
        schedule=schedule,
        output_shape=output_shape,
        latent_shape=latent_shape,
        default_sampler=sampler_name,  # the model offers every sampler of its family (ModelSpec.samplers)
        default_steps=50,
        scale_factor=float(scale) if isinstance(scale, int | float) else 1.0,
        voxel_spacing_mm=_spacing_from_metadata(metadata),
        conditioning=conditions,
        conditioning_modes=tuple(modes),
        intensity_range=tuple(float(v) for v in pred.get("value_range", (0.0, 1.0)))[:2],
        description=str(metadata.get("description", "")),
        source="monai-bundle",
        extra={"monai_version": metadata.get("monai_version"), "version": metadata.get("version")},
    )
    spec.validate()
    readme = folder / "docs" / "README.md"
    if readme.is_file():
        inside(folder, readme, "model card")
    return ModelSource(
        spec=spec,
        path=folder,
        weight_files=weight_files,
        load_old=bool(config.get("load_old", 0)),
        card_path=readme if readme.is_file() else None,
    )
