"""Open NVIDIA's NV-Generate-MR-Brain (``rflow-mr-brain``, MAISI v2) as a user has it, safely.

Layout (the NV-Generate-CTMR repository root after ``python -m scripts.download_model_data --version
rflow-mr-brain --model_only``, or the same files in a folder of their own, with or without ``configs/``)::

    configs/config_network_rflow.json                         network definitions, ``@`` references
    configs/config_maisi_diff_model_rflow-mr-brain.json       diffusion_unet_inference: dim, spacing, steps...
    configs/environment_maisi_diff_model_rflow-mr-brain.json  where the checkpoints are
    configs/modality_mapping.json                             modality name -> class label
    models/autoencoder_v1.pt                                  AutoencoderKlMaisi state_dict
    models/diff_unet_3d_rflow-mr-brain_v1.pt                  {"unet_state_dict", "scale_factor", ...}
    README.md, docs/inference.md, LICENSE.weights             licence, recommended fields of view (optional)

What is read: only the three definitions this model needs (``autoencoder_def``, ``diffusion_unet_def``,
``noise_scheduler``), their ``@`` references resolved as plain lookups. Everything else in the network file
(``controlnet_def``, ``mask_generation_*``, ``_target_``s of the repository's own ``scripts`` package) is
never looked at: neither refused nor built. ``$`` expressions inside the needed definitions are refused.
Checkpoints load with ``torch.load(weights_only=True)``: one that needs pickled objects is refused (NVIDIA's
own loader uses ``weights_only=False``).

The model's inference (NV-Generate's ``scripts/diff_model_infer.py``, read, not copied) is followed:

* the U-Net takes ``class_labels`` (the modality's code) and ``spacing_tensor`` (spacing in mm x 100); the
  unconditioned half of classifier-free guidance has class label 0 (``unknown``) and the same spacing;
* latents are divided by the checkpoint's ``scale_factor`` before decoding;
* MR intensities: the decoder's output x 1000, clipped below at 0, cast to int16 (stored here as whole
  numbers in float32); the NIfTI affine is diagonal (the spacing; RAS axes), VolSynth centres it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import EngineError, ModelInvalid, OutOfMemory
from engine.models import networks
from engine.models.bundle import _resolve
from engine.models.network_limits import check_network_sizes
from engine.models.source import LoadedModel, ModelSource, check_finite_weights, inside, read_json_limited
from engine.models.spec import ModelSpec, one_line

VARIANT = "rflow-mr-brain"
NETWORK_FILE = "config_network_rflow.json"
MODEL_FILE = f"config_maisi_diff_model_{VARIANT}.json"
ENVIRONMENT_FILE = f"environment_maisi_diff_model_{VARIANT}.json"
MODALITY_FILE = "modality_mapping.json"
#: modality_mapping.json names -> the names a VolSynth request uses.
MODALITY_NAMES = {
    "mri_t1": "t1w",
    "mri_t2": "t2w",
    "mri_flair": "flair",
    "mri_swi": "swi",
    "mri_mra": "mra",
    "mri_t1_skull_stripped": "t1w-skullstripped",
    "mri_t2_skull_stripped": "t2w-skullstripped",
    "mri_flair_skull_stripped": "flair-skullstripped",
    "mri_swi_skull_stripped": "swi-skullstripped",
    "mri_mra_skull_stripped": "mra-skullstripped",
}
NULL_MODALITY = "unknown"  # the class label of the unconditioned half of guidance (0 in the mapping)
#: The model's stated maximum volume (NV-Generate-CTMR README, "Max Volume" of rflow-mr-brain).
MAX_SIZE = (512, 512, 256)
#: VolSynth's bounds on a requested spacing: the U-Net is told it, and brain MRI is acquired within these.
SPACING_RANGE_MM = (0.25, 8.0)
#: Recommended fields of view (mm) per modality and plane, from NV-Generate-CTMR docs/inference.md
#: ("Recommended FOV for MR rflow-mr-brain model", August 2026); used only when the folder has no docs.
DOCUMENTED_FOV_MM: dict[str, list[list[float]]] = {
    "t1w": [[240, 240, 174], [176, 250, 250], [240, 200, 240]],
    "t2w": [[240, 240, 158], [162, 240, 240], [200, 180, 200]],
    "flair": [[250, 250, 175], [176, 250, 250], [250, 200, 250]],
    "swi": [[230, 230, 145], [140, 230, 230], [230, 155, 230]],
}
FOV_TOLERANCE = 0.25  # a field of view within 25 % of a recommended one on every axis counts as near it
_FOV_SECTION = re.compile(r"^#+ .*recommended fov.*rflow-mr-brain", re.IGNORECASE)
_FOV_ROW = re.compile(
    r"^\|\s*(T1|T2|FLAIR|SWI)\s*\|\s*(\w+)\s*\|\s*([\d.]+)\s*[x×]\s*([\d.]+)\s*[x×]\s*([\d.]+)"
)
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")


def looks_like_maisi(folder: Path) -> bool:
    """Whether ``folder`` holds NV-Generate's rflow-mr-brain configuration (as a repo root or flat)."""
    return any(
        (base / MODEL_FILE).is_file() and (base / NETWORK_FILE).is_file() for base in _config_dirs(folder)
    )


def _config_dirs(folder: Path) -> list[Path]:
    return [folder / "configs", folder]


def _optional_config(folder: Path, name: str) -> dict[str, Any] | None:
    for base in _config_dirs(folder):
        path = base / name
        if path.is_file() or path.is_symlink():
            data = read_json_limited(path, folder, "NV-Generate config")
            if not isinstance(data, dict):
                raise ModelInvalid(f"{name} must hold a JSON object")
            return data
    return None


def _config(folder: Path, name: str) -> dict[str, Any]:
    data = _optional_config(folder, name)
    if data is None:
        raise ModelInvalid(f"{folder.name}: no {name} (looked in configs/ and the folder itself)")
    return data


def _checkpoint(folder: Path, configured: str | None, default: str, what: str) -> Path:
    """The checkpoint the environment file names (relative to the repository root), else by file name."""
    candidates = []
    for rel in (configured, default):
        if isinstance(rel, str) and rel:
            candidates += [folder / rel, folder / Path(rel).name]
    for path in candidates:
        if path.is_file() or path.is_symlink():
            inside(folder, path, "checkpoint")
            return path
    names = ", ".join(sorted({str(p.relative_to(folder)) for p in candidates}))
    raise ModelInvalid(
        f"{folder.name}: no {what} checkpoint (looked for {names}); run NV-Generate's "
        f"`python -m scripts.download_model_data --version {VARIANT} --model_only` in it"
    )


def _definition(config: dict[str, Any], key: str, short: str) -> dict[str, Any]:
    raw = config.get(key)
    if not isinstance(raw, dict):
        raise ModelInvalid(f"{NETWORK_FILE} has no {key} definition")
    target = raw.get("_target_")
    if not isinstance(target, str) or networks.short_target(target) != short:
        raise ModelInvalid(f"{NETWORK_FILE}: {key} must be a {short}, not {str(target)[:80]!r}")
    definition = _resolve(config, raw)
    networks.check_literal({k: v for k, v in definition.items() if not k.startswith("_")}, key)
    # before the latent factor and sizes are derived from the levels, and long before anything is built
    check_network_sizes(definition, key)
    return definition


def _modalities(mapping: dict[str, Any]) -> tuple[tuple[tuple[str, int], ...], int]:
    found = []
    for key, name in MODALITY_NAMES.items():
        code = mapping.get(key)
        if isinstance(code, int) and not isinstance(code, bool):
            found.append((name, code))
    if not found:
        raise ModelInvalid(
            f"{MODALITY_FILE} names none of the brain MR modalities ({', '.join(MODALITY_NAMES)})"
        )
    null = mapping.get(NULL_MODALITY, 0)
    return tuple(found), int(null) if isinstance(null, int) else 0


def _licence(folder: Path) -> str:
    """The weights' licence as the folder states it: README's table, else LICENSE.weights' first line."""
    readme = folder / "README.md"
    if readme.is_file():
        try:
            text = inside(folder, readme, "README").read_text(encoding="utf-8", errors="replace")[:200_000]
        except (OSError, ModelInvalid):
            text = ""
        header = None
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None and any(f"`{VARIANT}`" == c for c in cells):
                header = cells
            elif header is not None and cells and cells[0].strip("*").lower() == "license":
                column = header.index(f"`{VARIANT}`")
                if column < len(cells):
                    text = _MD_LINK.sub(r"\1", cells[column]).strip()
                    return text if text.lower().endswith(("license", "licence")) else f"{text} License"
    for name in ("LICENSE.weights", "LICENSE"):
        path = folder / name
        if path.is_file():
            try:
                first = inside(folder, path, "licence").read_text(encoding="utf-8", errors="replace")
            except (OSError, ModelInvalid):
                continue
            line = next((ln.strip().lstrip("\ufeff") for ln in first.splitlines() if ln.strip()), "")
            if line:
                return f"{line} (from {name})"
    return "not stated in the folder"


def _documented_fov(folder: Path) -> tuple[dict[str, list[list[float]]], str]:
    doc = folder / "docs" / "inference.md"
    if doc.is_file():
        try:
            text = inside(folder, doc, "documentation").read_text(encoding="utf-8", errors="replace")[
                :500_000
            ]
        except (OSError, ModelInvalid):
            text = ""
        table: dict[str, list[list[float]]] = {}
        in_section = False
        for line in text.splitlines():
            if line.startswith("#"):
                in_section = bool(_FOV_SECTION.match(line))
                continue
            match = _FOV_ROW.match(line) if in_section else None
            if match:
                name = {"T1": "t1w", "T2": "t2w", "FLAIR": "flair", "SWI": "swi"}[match.group(1)]
                table.setdefault(name, []).append([float(match.group(i)) for i in (3, 4, 5)])
        if table:
            return table, "docs/inference.md of this folder"
    return DOCUMENTED_FOV_MM, "NV-Generate-CTMR docs/inference.md, August 2026 (not in this folder)"


def open_maisi_folder(folder: Path) -> MaisiModelSource:
    """Open an NV-Generate-MR-Brain folder: JSON only (fast, no torch); checkpoints are found, not read."""
    network = _config(folder, NETWORK_FILE)
    inference_config = _config(folder, MODEL_FILE)
    environment = _optional_config(folder, ENVIRONMENT_FILE) or {}
    mapping = _config(folder, MODALITY_FILE)
    inference = _inference_section(inference_config)
    unet_def = _definition(network, "diffusion_unet_def", "DiffusionModelUNetMaisi")
    ae_def = _definition(network, "autoencoder_def", "AutoencoderKlMaisi")
    schedule = _rflow_schedule(network)
    unet_file, ae_file = _checkpoints(folder, environment)
    modalities, null_modality, default_modality = _modality_codes(mapping, inference, unet_def)
    size, spacing, steps, guidance = _sampling_grid(inference)
    latent_factor, latent_channels, geometry = _geometry(folder, ae_def, unet_def, size, spacing)
    version_match = re.search(r"_v(\d+)\.pt$", unet_file.name)
    version = f"v{version_match.group(1)}" if version_match else "unversioned"
    licence = _licence(folder)
    # norm_float16 rounds the autoencoder's normalised activations to fp16, a GPU memory saver that only
    # works under CUDA autocast (on a CPU MONAI's decode then fails on mixed dtypes). VolSynth decodes at
    # the precision the optimization settings ask and bounds memory with the streamed decode instead.
    ae_built = {**ae_def, "norm_float16": False}
    spec = ModelSpec(
        id=folder.name,
        name=f"NV-Generate-MR-Brain ({VARIANT}, MAISI v2) {version}",
        kind="latent",
        networks={"unet": unet_def, "autoencoder": ae_built},
        schedule=schedule,
        output_shape=(int(ae_def.get("out_channels", 1)), *size),
        latent_shape=(latent_channels, *(n // latent_factor for n in size)),
        default_sampler="rflow",
        default_steps=steps,
        scale_factor=1.0,  # the U-Net checkpoint's own scale_factor replaces it when the model loads
        voxel_spacing_mm=spacing,
        default_guidance_scale=guidance,
        intensity_range=(0.0, 1000.0),
        description=(
            "NVIDIA NV-Generate-MR-Brain: 3D brain MRI (T1w, T2w, FLAIR, SWI, MRA; whole-brain or skull-stripped) "
            "from a rectified-flow latent diffusion model (MAISI v2). No tissue maps."
        ),
        source="nv-generate",
        extra={
            "variant": VARIANT,
            "version": version,
            "licence": licence,
            "files": {"unet": unet_file.name, "autoencoder": ae_file.name},
            "norm_float16_in_config": bool(ae_def.get("norm_float16", False)),
            "num_splits": ae_def.get("num_splits"),
            "example_seed": inference.get("random_seed"),
        },
        modalities=modalities,
        default_modality=default_modality,
        null_modality=null_modality,
        geometry=geometry,
        output_intensity={
            "scale": 1000.0,
            "offset": 0.0,
            "clip_min": 0.0,
            "clip_max": None,
            "truncate": True,
            "description": "as NV-Generate's diff_model_infer.py does for MR: decoder output x 1000, clipped "
            "below at 0, truncated to whole numbers (it casts to int16); stored as float32",
        },
    )
    spec.validate()
    return MaisiModelSource(spec=spec, path=folder, weight_files={"unet": unet_file, "autoencoder": ae_file})


def _inference_section(inference_config: dict) -> dict:
    """The ``diffusion_unet_inference`` section of the model config, checked to be plain literals."""
    inference = inference_config.get("diffusion_unet_inference")
    if not isinstance(inference, dict):
        raise ModelInvalid(f"{MODEL_FILE} has no diffusion_unet_inference section")
    networks.check_literal(inference, "diffusion_unet_inference")
    return inference


def _rflow_schedule(network: dict) -> dict:
    """The noise scheduler's settings (without ``_target_`` and other private keys); it must be RFlow."""
    scheduler_raw = network.get("noise_scheduler")
    if not isinstance(scheduler_raw, dict) or not isinstance(scheduler_raw.get("_target_"), str):
        raise ModelInvalid(f"{NETWORK_FILE} has no noise_scheduler definition")
    if networks.scheduler_name_for_target(scheduler_raw["_target_"]) != "rflow":
        raise ModelInvalid(
            f"{NETWORK_FILE}: {VARIANT} samples with RFlowScheduler; noise_scheduler is not one"
        )
    scheduler_def = _resolve(network, scheduler_raw)
    schedule = {k: v for k, v in scheduler_def.items() if not k.startswith("_")}
    networks.check_literal(schedule, "noise_scheduler")
    return schedule


def _checkpoints(folder: Path, environment: dict) -> tuple[Path, Path]:
    """The U-Net and autoencoder checkpoint files, where the environment config names them or by default."""
    model_dir = environment.get("model_dir") or "models"
    unet_file = _checkpoint(
        folder,
        f"{model_dir}/{environment['model_filename']}"
        if isinstance(environment.get("model_filename"), str)
        else None,
        f"models/diff_unet_3d_{VARIANT}_v1.pt",
        "U-Net",
    )
    ae_file = _checkpoint(
        folder, environment.get("trained_autoencoder_path"), "models/autoencoder_v1.pt", "autoencoder"
    )
    return unet_file, ae_file


def _modality_codes(mapping: dict, inference: dict, unet_def: dict) -> tuple[Any, int, str]:
    """The (name, code) modalities, the null code, and the default modality; the U-Net must embed them."""
    modalities, null_modality = _modalities(mapping)
    codes = {code: name for name, code in modalities}
    default_code = inference.get("modality", 9)
    default_modality = codes.get(default_code, modalities[0][0])
    classes = unet_def.get("num_class_embeds")
    if (
        not isinstance(classes, int)
        or max(code for _, code in modalities) >= classes
        or null_modality >= classes
    ):
        raise ModelInvalid(f"diffusion_unet_def.num_class_embeds ({classes}) cannot embed the modality codes")
    return modalities, null_modality, default_modality


def _sampling_grid(inference: dict) -> tuple[tuple[int, ...], tuple[float, ...], int, float]:
    """The example's output size, spacing (mm), steps and guidance scale."""
    try:
        size = tuple(int(v) for v in inference["dim"])
        spacing = tuple(float(v) for v in inference["spacing"])
        steps = int(inference.get("num_inference_steps", 30))
        guidance = float(inference.get("cfg_guidance_scale", 1.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelInvalid(
            f"{MODEL_FILE}: diffusion_unet_inference is malformed ({one_line(str(exc))[:80]})"
        ) from None
    if len(size) != 3 or len(spacing) != 3:
        raise ModelInvalid(f"{MODEL_FILE}: dim and spacing must have three entries")
    return size, spacing, steps, guidance


def _geometry(
    folder: Path, ae_def: dict, unet_def: dict, size: tuple[int, ...], spacing: tuple[float, ...]
) -> tuple[int, int, dict[str, Any]]:
    """The latent factor, latent channels, and the spec's geometry: sizes the networks take, the spacing
    range, the documented field of view, and a preview grid where one fits."""
    ae_levels = len(ae_def.get("num_channels") or ())
    unet_levels = len(unet_def.get("num_channels") or ())
    if not ae_levels or not unet_levels:
        raise ModelInvalid(f"{NETWORK_FILE}: the networks' num_channels are missing")
    latent_factor = 2 ** (ae_levels - 1)
    size_multiple = latent_factor * 2 ** (unet_levels - 1)
    latent_channels = int(ae_def.get("latent_channels", 4))
    if int(unet_def.get("in_channels", -1)) != latent_channels:
        raise ModelInvalid(
            f"{NETWORK_FILE}: the U-Net's in_channels differ from the autoencoder's latent_channels"
        )
    fov, fov_source = _documented_fov(folder)
    geometry = {
        "latent_factor": latent_factor,
        "size_multiple": size_multiple,
        "min_size": [size_multiple] * 3,
        "max_size": list(MAX_SIZE),
        "max_voxels": math.prod(MAX_SIZE),
        "spacing_range_mm": list(SPACING_RANGE_MM),
        "recommended_fov_mm": fov,
        "fov_tolerance": FOV_TOLERANCE,
        "fov_source": fov_source,
    }
    # Half the edges at twice the spacing: the same field of view, an eighth of the voxels (where the
    # halved edges are still multiples the networks take and the doubled spacing is one VolSynth allows).
    preview_size = [n // 2 for n in size]
    preview_spacing = [round(s * 2, 4) for s in spacing]
    if all(n >= size_multiple and n % size_multiple == 0 for n in preview_size) and all(
        SPACING_RANGE_MM[0] <= s <= SPACING_RANGE_MM[1] for s in preview_spacing
    ):
        geometry["preview"] = {"size": preview_size, "spacing_mm": preview_spacing}
    return latent_factor, latent_channels, geometry


# ------------------------------------------------------------------------------------------- loading


def _read_checkpoint(path: Path) -> Any:
    """``torch.load(weights_only=True)``; anything that needs pickled objects is refused in one line."""
    import pickle

    import torch

    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        AttributeError,
        TypeError,
    ) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelInvalid(
            f"refusing to load checkpoint {path.name}: it needs pickled Python objects, which could run code "
            f"({first[:160]}). VolSynth loads tensors only (weights_only=True); re-save the checkpoint's "
            "state_dict and scale_factor as plain tensors"
        ) from None


def _state_dict(checkpoint: Any, path: Path) -> dict[str, Any]:
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("unet_state_dict"), dict):
        checkpoint = checkpoint["unet_state_dict"]
    if (
        not isinstance(checkpoint, dict)
        or not checkpoint
        or not all(hasattr(v, "shape") for v in checkpoint.values())
    ):
        raise ModelInvalid(f"checkpoint {path.name} holds no state_dict of tensors")
    return checkpoint


def _scale_factor(checkpoint: Any, path: Path) -> float:
    # Whatever the checkpoint holds (a tensor, a number, anything else): float() refuses what is not a number.
    value: Any = checkpoint.get("scale_factor") if isinstance(checkpoint, dict) else None
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        raise ModelInvalid(
            f"checkpoint {path.name} has no scale_factor (NV-Generate saves one with the U-Net)"
        ) from None
    if not math.isfinite(number) or number == 0:
        raise ModelInvalid(f"checkpoint {path.name}: scale_factor {number} is not a usable number")
    return number


def _load(net, state: dict[str, Any], role: str, strict: bool, file_name: str = "") -> dict[str, Any]:
    check_finite_weights(state, role, file_name or "its checkpoint")
    result = net.load_state_dict(state, strict=False)
    if result.missing_keys:
        raise ModelInvalid(
            f"the {role} checkpoint lacks {len(result.missing_keys)} of the network's weights "
            f"(first: {result.missing_keys[0]}); it does not belong to this network definition"
        )
    if strict and result.unexpected_keys:
        raise ModelInvalid(
            f"the {role} checkpoint has weights the network lacks (first: {result.unexpected_keys[0]})"
        )
    return {"unexpected_keys": len(result.unexpected_keys)}


def maisi_denoiser(unet):
    """The U-Net as the sampling loop calls every denoiser: ``(x, timesteps, context)``.

    ``context`` (B, 1, 4) carries the categorical conditioning as numbers: the class label, then the
    spacing tensor (mm x 100) of each batch item. Packing it this way keeps one loop and one call signature
    for every backend, compiler and profiler; the module unpacks it into DiffusionModelUNetMaisi's
    ``class_labels`` and ``spacing_tensor``.
    """
    import torch

    class MaisiDenoiser(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.unet = inner
            self.attention_note = getattr(inner, "attention_note", None)

        def forward(self, x, timesteps, context=None):
            if context is None or context.shape[-1] != 4:
                raise ValueError("a MAISI U-Net needs its modality and spacing (context of shape (B, 1, 4))")
            labels = context[:, 0, 0].round().long()
            spacing = context[:, 0, 1:4].to(x.dtype)
            return self.unet(
                x,
                timesteps=timesteps,
                class_labels=labels if self.unet.num_class_embeds is not None else None,
                spacing_tensor=spacing if self.unet.include_spacing_input else None,
            )

    return MaisiDenoiser(unet)


@dataclass
class MaisiModelSource(ModelSource):
    """An NV-Generate-MR-Brain folder: its checkpoints are read the MAISI way, its card made from the folder."""

    build_notes: dict[str, Any] = field(default_factory=dict, repr=False)

    def read_weights(self, role: str, path: Path) -> dict[str, Any]:
        """The network's tensors out of a MAISI checkpoint (``unet_state_dict`` and its other keys around them)."""
        return _state_dict(_read_checkpoint(path), path)

    def load(self) -> LoadedModel:
        self.check_memory()
        try:
            unet_checkpoint = _read_checkpoint(self.weight_files["unet"])
            ae_checkpoint = _read_checkpoint(self.weight_files["autoencoder"])
            scale = _scale_factor(unet_checkpoint, self.weight_files["unet"])
            unet = networks.build_network(self.spec.networks["unet"], where="diffusion_unet_def")
            notes = {
                "unet": _load(
                    unet,
                    _state_dict(unet_checkpoint, self.weight_files["unet"]),
                    "U-Net",
                    False,
                    self.weight_files["unet"].name,
                )
            }
            del unet_checkpoint
            autoencoder = networks.build_network(self.spec.networks["autoencoder"], where="autoencoder_def")
            notes["autoencoder"] = _load(
                autoencoder,
                _state_dict(ae_checkpoint, self.weight_files["autoencoder"]),
                "autoencoder",
                True,
                self.weight_files["autoencoder"].name,
            )
            del ae_checkpoint
        except EngineError:
            raise
        except MemoryError as exc:
            raise OutOfMemory(f"not enough memory to load model {self.id!r}; close other programs") from exc
        except RuntimeError as exc:
            from engine.models.copy_check import load_refusal

            raise load_refusal(self, exc) from exc
        self.spec = replace(self.spec, scale_factor=scale)
        self.build_notes = {
            "attention": getattr(unet, "attention_note", None),
            "scale_factor": scale,
            "scale_factor_source": f"{self.weight_files['unet'].name} (scale_factor)",
            "norm_float16": "off (the config's GPU memory saver; see engine/models/maisi.py)"
            if self.spec.extra.get("norm_float16_in_config")
            else "off",
            "checkpoints": notes,
        }
        return LoadedModel(
            source=self,
            unet=maisi_denoiser(unet.eval().requires_grad_(False)).eval(),
            autoencoder=autoencoder.eval().requires_grad_(False),
        )

    def memory_estimate(self) -> dict[str, int]:
        """As for every model, except that decoding is counted as the streamed decode's working set: the
        full decode of the default volume (``decoding_full``, not in ``total``) would not fit a workstation."""
        estimate = super().memory_estimate()
        full = estimate.pop("decoding")
        estimate.pop("total")
        from engine.models.budget import STREAMED_DECODE_BUDGET_BYTES

        output = 4 * math.prod(self.spec.output_shape)
        estimate["decoding"] = min(full, STREAMED_DECODE_BUDGET_BYTES + 3 * output)
        estimate["total"] = sum(estimate.values())
        estimate["decoding_full"] = full
        return estimate

    def check_memory(self) -> dict[str, int]:
        from engine.formatting import format_bytes
        from engine.nifti.checks import available_memory

        estimate = self.memory_estimate()
        available = available_memory()
        if estimate["total"] > available:
            raise OutOfMemory(
                f"model {self.id!r} would need about {format_bytes(estimate['total'])} of memory (with streamed "
                f"decode), but only {format_bytes(available)} is available; close other programs"
            )
        return estimate

    def model_card(self) -> str:
        return model_card(self)


def model_card(source: ModelSource) -> str:
    """The card shown in the model picker, from what the folder says."""
    spec = source.spec
    extra, geometry = spec.extra, spec.geometry or {}

    def fmt(values) -> str:
        return " x ".join(f"{v:g}" for v in values)

    lines = [
        f"# {spec.name}",
        "",
        f"**Version** {extra.get('version')} · **Licence** {extra.get('licence')} · MAISI v2 (rectified flow), "
        f"opened from `{source.path}`",
        "",
        "SYNTHETIC images for research; not for diagnosis.",
        "",
        "## Modalities",
        "",
        *[
            f"- `{name}`" + (" (default)" if name == spec.default_modality else "") + f" — class label {code}"
            for name, code in spec.modalities
        ],
        f"- guidance's unconditioned half: class label {spec.null_modality} (`{NULL_MODALITY}`)",
        "",
        "## Output",
        "",
        f"- default {fmt(spec.output_shape[1:])} voxels at {fmt(spec.voxel_spacing_mm)} mm, "
        f"{spec.default_steps} steps, guidance {spec.default_guidance_scale:g}",
        (
            f"- preview {fmt(geometry['preview']['size'])} voxels at {fmt(geometry['preview']['spacing_mm'])} mm "
            "(same field of view)"
            if geometry.get("preview")
            else "- no preview size (half the edges would not fit the networks)"
        ),
        f"- sizes: multiples of {geometry.get('size_multiple')} voxels, up to {fmt(geometry.get('max_size', ()))}; "
        "spacing {:g} to {:g} mm".format(*geometry.get("spacing_range_mm", (0, 0))),
        f"- intensities: {spec.output_intensity['description'] if spec.output_intensity else 'as decoded'}",
        "",
        f"## Recommended field of view (mm; {geometry.get('fov_source')})",
        "",
        "Output far from these can be unusable (the model's documentation); VolSynth warns.",
        "",
        *[
            f"- {name}: " + "; ".join(fmt(row) for row in rows)
            for name, rows in (geometry.get("recommended_fov_mm") or {}).items()
        ],
        "",
        "## What it lacks",
        "",
        "- No tissue maps: no overlay, no label columns in cohort reports.",
        "- Brain and ventricle measurements in cohort reports assume a T1-like contrast: skipped for others.",
        "",
        f"Files: {', '.join(f'{k}: {v}' for k, v in extra.get('files', {}).items())}",
    ]
    return "\n".join(lines)
