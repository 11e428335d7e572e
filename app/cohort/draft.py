"""What the Cohort dialog edits, without Qt: a cohort spec being written, its count and time estimate.

Each of the model's conditions is ``default`` (the model's default), ``fixed`` (one value), ``grid``
(``a`` to ``b`` in ``n`` steps), ``normal`` (mean ``a``, sd ``b``) or ``uniform`` (``a`` to ``b``).
``to_spec()`` builds the engine's :class:`engine.cohort.spec.CohortSpec`, which validates everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MODES = ("default", "fixed", "grid", "normal", "uniform")


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


@dataclass
class CohortDraft:
    name: str = "cohort"
    model: str = ""
    sampler: str = ""
    steps: int = 0
    guidance_scale: float | None = None
    optimization: dict[str, Any] = field(default_factory=dict)
    seeds: int = 1
    draws: int = 1
    draw_seed: int = 0
    conditions: dict[str, ConditionDraft] = field(default_factory=dict)

    @classmethod
    def from_form(cls, form) -> CohortDraft:
        """Start from the generation form: its model, sampler, steps, guidance and optimization settings."""
        draft = cls(
            model=form.model_reference(),
            sampler=form.sampler,
            steps=int(form.steps),
            guidance_scale=form.guidance_scale,
            optimization=dict(form.optimization),
        )
        if form.model is not None:
            draft.name = f"{form.model.spec.id}-cohort".replace(".", "-")[:64]
            for cond in form.model.spec.conditioning:
                value = form.conditioning.get(cond.name, cond.default)
                draft.conditions[cond.name] = ConditionDraft("default", float(value), float(cond.max), 3)
        return draft

    @property
    def has_distribution(self) -> bool:
        return any(c.mode in ("normal", "uniform") for c in self.conditions.values())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "model": self.model,
            "sampler": self.sampler,
            "steps": int(self.steps),
            "optimization": dict(self.optimization),
            "seeds": int(self.seeds),
            "draws": int(self.draws) if self.has_distribution else 1,
            "draw_seed": int(self.draw_seed),
            "conditioning": {
                name: cond.to_spec() for name, cond in self.conditions.items() if cond.mode != "default"
            },
        }
        if self.guidance_scale is not None:
            data["guidance_scale"] = float(self.guidance_scale)
        return data

    def to_spec(self):
        """The engine's CohortSpec (raises InvalidRequest with what to fix)."""
        from engine.cohort.spec import CohortSpec

        return CohortSpec.from_dict(self.to_dict())

    @property
    def count(self) -> int:
        grid = math.prod(c.values for c in self.conditions.values())
        draws = int(self.draws) if self.has_distribution else 1
        return grid * draws * int(self.seeds)


def estimate_seconds(count: int, steps: int, step_s: float | None, workers: int = 1) -> float | None:
    """Time for ``count`` volumes of ``steps`` steps at ``step_s`` seconds per step (decode not counted)."""
    if not step_s or not steps or count <= 0:
        return None
    return count * steps * step_s / max(1, workers)


def last_step_seconds(volumes) -> float | None:
    """Median seconds per denoising step of the most recent generated volume in the session, if any."""
    for entry in reversed(list(volumes)):
        times = (getattr(entry, "provenance", None) or {}).get("step_times_s") or []
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


def load_montage(paths: list[str], sample: int = 12) -> np.ndarray:
    """A montage of up to ``sample`` of the files, spread evenly over the list (runs in a worker thread)."""
    from engine.nifti.io import load_nifti

    if len(paths) > sample:
        picks = sorted(set(np.linspace(0, len(paths) - 1, sample).round().astype(int).tolist()))
        paths = [paths[i] for i in picks]
    return montage([load_nifti(p).data for p in paths])
