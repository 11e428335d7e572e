"""A request's modality, output size and voxel spacing, checked against what a model can take.

Most models make one fixed volume (``ModelSpec.output_shape`` at ``voxel_spacing_mm``). A model with a
``geometry`` (MAISI v2: NVIDIA's NV-Generate-MR-Brain) lets a request choose the size and spacing; its
U-Net is told the spacing and, through a class label, the modality. Three outcomes for a choice:

* inside what the networks can take and near a recommended field of view (size x spacing): fine;
* inside what the networks can take but away from every recommended field of view for that modality: a
  warning naming the recommended ones (the model's documentation says such output can be unusable);
* outside what the networks can take (a size the U-Net's downsampling cannot halve, beyond the model's
  stated maximum volume, a non-physical spacing): refused with ``InvalidRequest``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import InvalidRequest, ModelInvalid


@dataclass(frozen=True)
class ResolvedOutput:
    """What a request will make: modality ("" when the model takes none), size and spacing, warnings."""

    modality: str
    class_label: int | None
    size: tuple[int, int, int]
    spacing_mm: tuple[float, float, float]
    warnings: tuple[str, ...] = field(default=())

    @property
    def fov_mm(self) -> tuple[float, float, float]:
        return tuple(n * s for n, s in zip(self.size, self.spacing_mm, strict=True))  # type: ignore[return-value]


def _triple(values: Any, kind, where: str) -> tuple:
    if not isinstance(values, list | tuple) or len(values) != 3:
        raise ModelInvalid(f"geometry {where} must be three numbers, got {str(values)[:60]}")
    return tuple(kind(v) for v in values)


def check_geometry(spec) -> None:
    """Refuse a spec whose ``geometry`` cannot work (ModelInvalid naming the key)."""
    geometry = spec.geometry
    try:
        factor = int(geometry["latent_factor"])
        multiple = int(geometry["size_multiple"])
        max_size = _triple(geometry["max_size"], int, "max_size")
        low, high = (float(v) for v in geometry["spacing_range_mm"])
        int(geometry["max_voxels"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelInvalid(
            f"model spec geometry is malformed ({exc!s:.80}); see engine/models/output_geometry.py"
        ) from None
    if factor < 1 or multiple < factor or multiple % factor or min(max_size) < multiple:
        raise ModelInvalid("model spec geometry: latent_factor, size_multiple and max_size do not agree")
    if not (0 < low < high and math.isfinite(high)):
        raise ModelInvalid("model spec geometry: spacing_range_mm must be two increasing positive numbers")
    for name, rows in (geometry.get("recommended_fov_mm") or {}).items():
        for row in rows:
            _triple(row, float, f"recommended_fov_mm.{name}")


def parse_triple(text: str, kind, what: str) -> tuple:
    """``256x256x128`` (or ``256,256,128``) -> a tuple of three; InvalidRequest naming ``what`` otherwise."""
    parts = str(text).lower().replace(",", "x").split("x")
    try:
        if len(parts) != 3:
            raise ValueError
        return tuple(kind(p.strip()) for p in parts)
    except ValueError:
        raise InvalidRequest(f"{what} must be three numbers such as 256x256x128, got {text!r}") from None


def _fmt(values: Iterable[float]) -> str:
    return "x".join(f"{v:g}" for v in values)


def recommended_fovs(spec, modality: str) -> list[tuple[float, float, float]]:
    """The recommended fields of view (mm) for ``modality`` (skull-stripped variants share them)."""
    table = (spec.geometry or {}).get("recommended_fov_mm") or {}
    rows = table.get(modality) or table.get(modality.removesuffix("-skullstripped")) or []
    return [tuple(float(v) for v in row) for row in rows]  # type: ignore[misc]


def fov_warning(spec, modality: str, size, spacing) -> str:
    """A warning when ``size`` x ``spacing`` is away from every recommended field of view, else ""."""
    rows = recommended_fovs(spec, modality)
    if not rows:
        return ""
    tolerance = float(spec.geometry.get("fov_tolerance", 0.25))
    fov = [n * s for n, s in zip(size, spacing, strict=True)]
    for row in rows:
        if all(abs(f - r) <= tolerance * r for f, r in zip(fov, row, strict=True)):
            return ""
    listed = ", ".join(f"{_fmt(r)} mm" for r in rows)
    source = spec.geometry.get("fov_source", "the model's documentation")
    return (
        f"field of view {_fmt(round(f, 1) for f in fov)} mm is outside the recommended field of view for "
        f"{modality} ({listed}; {source}); the model's documentation warns that output outside it can be "
        "unusable"
    )


def resolve_output(spec, modality: str, size, spacing) -> ResolvedOutput:
    """The request's modality, size and spacing with the model's defaults filled in, checked."""
    if spec.geometry is None:
        if modality:
            spec.modality_label(modality)  # a model without modalities: says it takes none
        fixed_size = tuple(spec.output_shape[1:4])
        fixed_spacing = tuple(spec.voxel_spacing_mm)
        if size is not None and tuple(size) != fixed_size:
            raise InvalidRequest(
                f"model {spec.id!r} makes {_fmt(fixed_size)} volumes only; leave the output size unset"
            )
        if spacing is not None and not all(
            math.isclose(a, b, rel_tol=1e-6) for a, b in zip(spacing, fixed_spacing, strict=True)
        ):
            raise InvalidRequest(
                f"model {spec.id!r} makes volumes at {_fmt(fixed_spacing)} mm only; leave the spacing unset"
            )
        label = spec.modality_label(modality) if modality else None
        return ResolvedOutput(modality, label, fixed_size, fixed_spacing)

    geometry = spec.geometry
    modality = modality or spec.default_modality
    label = spec.modality_label(modality) if spec.modalities else None
    size = tuple(int(n) for n in (size or spec.output_shape[1:4]))
    spacing = tuple(float(v) for v in (spacing or spec.voxel_spacing_mm))
    multiple = int(geometry["size_multiple"])
    max_size = [int(v) for v in geometry["max_size"]]
    if any(n < multiple or n % multiple for n in size):
        raise InvalidRequest(
            f"output size {_fmt(size)}: every edge must be a multiple of {multiple} voxels (the autoencoder "
            f"and the U-Net halve it {int(math.log2(multiple))} times), e.g. 256x256x128"
        )
    if any(n > m for n, m in zip(size, max_size, strict=True)) or math.prod(size) > int(
        geometry["max_voxels"]
    ):
        raise InvalidRequest(
            f"output size {_fmt(size)} is beyond the model's maximum volume ({_fmt(max_size)} voxels, "
            f"at most {int(geometry['max_voxels']):,} in all)"
        )
    low, high = (float(v) for v in geometry["spacing_range_mm"])
    if not all(math.isfinite(v) and low <= v <= high for v in spacing):
        raise InvalidRequest(
            f"voxel spacing {_fmt(spacing)} mm: each must be from {low:g} to {high:g} mm (the spacings brain "
            "MRI is acquired at; the U-Net is told the spacing)"
        )
    warning = fov_warning(spec, modality, size, spacing)
    return ResolvedOutput(modality, label, size, spacing, (warning,) if warning else ())
