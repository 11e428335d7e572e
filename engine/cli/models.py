"""``volsynth models``: every model the registry finds, with its conditioning inputs and ranges, and every
folder in the search path that could not be opened, listed as broken with its reason."""

from __future__ import annotations

import json


def register(sub) -> None:
    parser = sub.add_parser("models", help="list available models and their conditioning inputs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.models.registry import DEFAULT_MODEL_ID, ModelRegistry

    registry = ModelRegistry()
    sources = registry.list()
    if args.json:
        listing = [{**s.spec.to_dict(), "path": str(s.path)} for s in sources]
        listing += [{"id": b.name, "path": str(b.path), "broken": b.reason} for b in registry.broken]
        print(json.dumps(listing, indent=2))
        return 0
    if not sources:
        print("No models found. Searched: " + ", ".join(str(p) for p in registry.search_path))
    for source in sources:
        spec = source.spec
        default = "  [default]" if spec.id == DEFAULT_MODEL_ID else ""
        shape = "x".join(str(s) for s in spec.output_shape[1:])
        spacing = "x".join(f"{s:g}" for s in spec.voxel_spacing_mm)
        print(f"{spec.id}{default}")
        print(f"  {spec.name}  ({spec.kind}, {shape} voxels at {spacing} mm, {source.path})")
        print(
            f"  samplers: {', '.join(spec.samplers)} (default {spec.default_sampler}, {spec.default_steps} steps)"
            + ("; classifier-free guidance" if spec.supports_guidance else "")
        )
        if spec.modalities:
            print(f"  --modality {{{','.join(spec.modality_names)}}}  (default {spec.default_modality})")
        if spec.geometry:
            geometry = spec.geometry
            preview = geometry.get("preview") or {}
            largest = "x".join(str(v) for v in geometry["max_size"])
            small = "x".join(str(v) for v in preview.get("size", ()))
            small_spacing = "x".join(f"{v:g}" for v in preview.get("spacing_mm", ()))
            print(
                f"  --size / --spacing: multiples of {geometry['size_multiple']} voxels up to {largest}; "
                f"--preview-size: {small} at {small_spacing} mm"
            )
            extra = spec.extra
            print(f"  version {extra.get('version')}, licence: {extra.get('licence')}; no tissue maps")
        for cond in spec.conditioning:
            unit = f" {cond.unit}" if cond.unit else ""
            print(
                f"  --cond {cond.name}=VALUE   {cond.label}: {cond.min:g} to {cond.max:g}{unit} "
                f"(default {cond.default:g})"
            )
    for broken in registry.broken:
        print(f"{broken.name}  [broken, not usable]")
        print(f"  {broken.path}: {broken.reason}")
    return 0
