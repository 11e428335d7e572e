"""Volumes in the session and their coordinate maths: voxel <-> RAS mm, window presets, preview affines.

Qt-free: the slice views, the 3D view and the tests all use these.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.core.display import optimization_lines, run_summary_lines
from app.core.slicing import format_intensity, intensity_decimals
from app.core.tissue import ordered_names

WINDOW_PRESETS = ("Auto (1-99%)", "Full range", "Soft (0.5-99.5%)", "High contrast (10-90%)")
CUSTOM_PRESET = "Custom"  # a window/level set by hand (typed, or right-dragged in a slice view)

_uids = itertools.count(1)


@dataclass(eq=False)
class VolumeEntry:
    """A volume in this session: generated, opened from disk, or a transient denoising preview."""

    name: str
    data: np.ndarray  # float32 (x, y, z), RAS+
    affine: np.ndarray  # voxel -> RAS mm
    kind: str = "opened"  # "generated", "opened" or "preview"
    path: Path | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    synthetic: bool = False
    uid: int = field(default_factory=lambda: next(_uids))
    saved: bool = (
        False  # the user wrote it to a file or the vault in this session (crash recovery lets it go)
    )
    saved_file: Path | None = None  # the NIfTI file it was last saved to: Save writes there again
    saved_to: str = ""  # where it was last saved, for people ("/data/a.nii.gz", "the vault as ...")
    time_points: int = 1  # how many volumes the file holds (a 4D series); ``data`` is one of them
    preview_step: tuple[int, int] | None = None  # a preview's (denoising step, of steps) its image is from
    time_index: int = 0  # which one, counted from 0
    # Tissue maps that go with the image (app.core.tissue), name -> float32 (x, y, z) probabilities in
    # [0, 1] on the image's grid; empty for volumes without.
    tissue: dict[str, np.ndarray] = field(default_factory=dict)
    # The template space the affine maps into (e.g. MNI152NLin2009aSym), or what the NIfTI header says of
    # it (``MNI152 (sform code 4)``); None for scanner millimetres. From the provenance when not given.
    space: str | None = None
    _percentiles: dict[float, float] = field(default_factory=dict, repr=False)
    _integer: bool | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.space is None and isinstance(self.provenance.get("space"), str) and self.provenance["space"]:
            self.space = self.provenance["space"]

    @property
    def space_name(self) -> str:
        """The space for people: the template's name, or ``scanner`` when none is named."""
        return self.space or "scanner"

    @property
    def tissue_names(self) -> list[str]:
        """The tissue maps' names in display order (GM, WM, CSF, ventricles, then others)."""
        return ordered_names(self.tissue)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.data.shape[:3])  # type: ignore[return-value]

    @property
    def spacing(self) -> tuple[float, float, float]:
        return tuple(float(v) for v in np.sqrt((np.asarray(self.affine)[:3, :3] ** 2).sum(axis=0)))  # type: ignore[return-value]

    def percentile(self, q: float) -> float:
        """Intensity percentile, cached (the volume never changes once in the session)."""
        if q not in self._percentiles:
            sample = (
                self.data
                if self.data.size <= 2_000_000
                else self.data.ravel()[:: self.data.size // 2_000_000]
            )
            self._percentiles[q] = float(np.percentile(sample, q))
        return self._percentiles[q]

    @property
    def integer_valued(self) -> bool:
        """Whether every intensity is a whole number (CT, most raw MRI): shown without decimals."""
        if self._integer is None:
            sample = self.data.ravel()[:: max(1, self.data.size // 2_000_000)]
            self._integer = bool(np.all(np.isfinite(sample)) and np.array_equal(sample, np.round(sample)))
        return self._integer

    @property
    def window_decimals(self) -> int:
        """Decimals for this volume's window and level, the same in the W/L fields and the slice overlay."""
        return intensity_decimals(self.percentile(100.0) - self.percentile(0.0), self.integer_valued)

    def center_ras(self) -> np.ndarray:
        centre = (np.asarray(self.shape, dtype=np.float64) - 1) / 2.0
        return voxel_to_ras(self.affine, centre)

    def contains_ras(self, ras: np.ndarray) -> bool:
        ijk = ras_to_voxel(self.affine, ras)
        return bool(np.all(ijk >= -0.5) and np.all(ijk <= np.asarray(self.shape) - 0.5))

    @property
    def needs_saving(self) -> bool:
        """A generated volume not yet written anywhere: the title and the session list mark it."""
        return self.kind == "generated" and not self.saved

    @property
    def save_state(self) -> str:
        """One line: where it was saved, or that it was not."""
        if self.saved_to:
            return f"saved to {self.saved_to}"
        if self.needs_saving:
            return "not saved yet (Ctrl+S saves it)"
        return ""  # an opened file: its path is listed below

    def describe(self) -> str:
        """A few lines for the session panel."""
        sx, sy, sz = self.spacing
        lines = [self.save_state] if self.save_state and self.kind != "preview" else []
        lines += [
            f"{self.shape[0]} x {self.shape[1]} x {self.shape[2]} voxels, {sx:.2g} x {sy:.2g} x {sz:.2g} mm",
            f"range {format_intensity(self.data.min(), self.integer_valued)} .. "
            f"{format_intensity(self.data.max(), self.integer_valued)}",
        ]
        lines.append(f"space {self.space_name}")
        if self.tissue:
            lines.append(f"tissue maps: {', '.join(self.tissue_names)}")
        if self.time_points > 1:
            lines.append(f"4D: time point {self.time_index} of 0..{self.time_points - 1}")
        if self.synthetic:
            lines.append("SYNTHETIC")
        prov = self.provenance
        if prov.get("model"):
            lines.append(f"model {prov['model'].get('id', '?')}, seed {prov.get('seed', '?')}")
            req = prov.get("request") or {}
            if req:
                lines.append(
                    f"{req.get('sampler', '?')} x {req.get('steps', '?')} steps, "
                    f"guidance {req.get('guidance_scale', 1.0):g}"
                )
            for name, value in (prov.get("conditioning") or {}).items():
                lines.append(f"  {name} = {value:g}")
            timings = prov.get("timings") or {}
            if "total_s" in timings:
                lines.append(f"took {timings['total_s']:.1f} s on {prov.get('device', '?')}")
            if isinstance(prov.get("telemetry"), Mapping):
                lines.extend(run_summary_lines(prov["telemetry"]))
            optimization = prov.get("optimization") or {}
            if isinstance(optimization.get("report"), Mapping):
                lines.extend(optimization_lines(optimization["report"]))
        if self.path is not None:
            lines.append(str(self.path))
        return "\n".join(lines)


def file_stem(name: str) -> str:
    """A file name stem from a session name: no NIfTI suffix, nothing a file system may refuse
    (``brain seed 7 \u00b7 14:03:22`` -> ``brain_seed_7_14-03-22``)."""
    for suffix in (".nii.gz", ".nii"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    name = name.replace(":", "-")
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    stem = "_".join(part for part in stem.split("_") if part).strip(".")
    return stem or "volume"


def voxel_to_ras(affine: np.ndarray, ijk: Iterable[float]) -> np.ndarray:
    ijk = np.asarray(list(ijk), dtype=np.float64)
    return (np.asarray(affine, dtype=np.float64) @ np.append(ijk, 1.0))[:3]


def ras_to_voxel(affine: np.ndarray, ras: Iterable[float]) -> np.ndarray:
    ras = np.asarray(list(ras), dtype=np.float64)
    return (np.linalg.inv(np.asarray(affine, dtype=np.float64)) @ np.append(ras, 1.0))[:3]


def window_for_preset(entry: VolumeEntry, preset: str) -> tuple[float, float]:
    """(window, level) for a named preset; percentiles make the presets work for any intensity scale."""
    low_q, high_q = {
        "Auto (1-99%)": (1.0, 99.0),
        "Full range": (0.0, 100.0),
        "Soft (0.5-99.5%)": (0.5, 99.5),
        "High contrast (10-90%)": (10.0, 90.0),
    }.get(preset, (1.0, 99.0))
    low, high = entry.percentile(low_q), entry.percentile(high_q)
    if not high > low:
        high = low + 1.0
    return high - low, (high + low) / 2.0


def preview_affine(
    model_affine: np.ndarray,
    output_xyz: tuple[int, int, int],
    preview_shape: tuple[int, ...],
    stride: int | None = None,
) -> np.ndarray:
    """The affine of a strided preview: the engine keeps every ``stride``-th voxel of the output volume.

    Without the engine's stride it is guessed from the shapes, which is ambiguous on short axes (9 voxels
    at stride 4 give 3, as 9 at stride 3 do); ``Progress.preview_stride`` says it exactly.
    """
    if stride is not None:
        strides = [int(stride)] * 3
    else:
        strides = [max(1, math.ceil(o / p)) for o, p in zip(output_xyz, preview_shape[:3], strict=True)]
    affine = np.array(model_affine, dtype=np.float64, copy=True)
    affine[:3, :3] = affine[:3, :3] @ np.diag(strides)
    return affine
