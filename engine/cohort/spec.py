"""A cohort specification: what to generate, as a file a person writes (TOML or JSON), and its expansion.

A spec names a model and the sampling settings shared by every volume, the seeds, and the conditioning:

.. code-block:: toml

    name = "ventricle-sweep"
    model = "brain-t1-demo"
    sampler = "ddim"
    steps = 20
    guidance_scale = 3.0
    seeds = 2                 # a count (seeds start at seed_start), or a list: [11, 42]
    draws = 5                 # points drawn from the distributions per grid point
    draw_seed = 1234          # seeds the draws, so the cohort is reproducible

    [conditioning]
    ventricle_volume = { grid = { start = 20, stop = 80, num = 4 } }   # or values = [20, 50, 80]
    brain_volume = { distribution = "normal", mean = 1300, sd = 120 }  # clipped to the model's range

    [optimization]            # engine OptimizationConfig fields; default plain fp32

    [output]
    target = "folder"         # or "vault" (with vault = "path/to/vault")

Expansion: the grid/list conditions are crossed; for each grid point ``draws`` values are drawn from the
distributions; each of those conditioning points gets ``seeds`` volumes. By default every point gets its
own seeds (``seed_start + point * count + k``); ``paired_seeds = true`` gives every point the same seeds,
so the effect of a condition is seen on the same noise. Items are numbered in that order; the expansion
depends only on the spec and the model's condition ranges, so a re-run or a resume produces the same items.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidRequest

MAX_ITEMS = 100_000
MAX_SPEC_BYTES = 1 << 20  # a spec is a few hundred bytes; refused beyond this before it is read
DISTRIBUTIONS = ("normal", "uniform")
TARGETS = ("folder", "vault")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
#: The spec's keys that are the request template's fields (the rest are the cohort's own: seeds, draws,
#: conditions, where it goes).
TEMPLATE_KEYS = (
    "model",
    "sampler",
    "steps",
    "guidance_scale",
    "optimization",
    "modality",
    "output_size",
    "voxel_spacing_mm",
)
_TOP_KEYS = {
    "name",
    *TEMPLATE_KEYS,
    "seeds",
    "seed_start",
    "paired_seeds",
    "draws",
    "draw_seed",
    "conditioning",
    "output",
}


def template_fields(request) -> dict[str, Any]:
    """A request template's fields as a spec's dict names them: the optimization settings that differ from plain
    fp32 only, and the guidance and output choices only when set, so that the cohort id of a spec without them
    stays what it was."""
    from engine.api.optimization_config import OptimizationConfig

    plain = OptimizationConfig().to_dict()
    fields: dict[str, Any] = {
        "model": request.model,
        "sampler": request.sampler,
        "steps": request.steps,
        "optimization": {k: v for k, v in request.optimization.to_dict().items() if plain.get(k) != v},
    }
    if request.guidance_scale is not None:
        fields["guidance_scale"] = float(request.guidance_scale)
    if request.modality:
        fields["modality"] = request.modality
    if request.output_size is not None:
        fields["output_size"] = list(request.output_size)
    if request.voxel_spacing_mm is not None:
        fields["voxel_spacing_mm"] = list(request.voxel_spacing_mm)
    return fields


@dataclass(frozen=True)
class Condition:
    """How one conditioning input varies: fixed ``values`` (a list or a grid) or a ``distribution``."""

    name: str
    values: tuple[float, ...] = ()
    distribution: str = ""
    params: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        if self.distribution:
            return {"distribution": self.distribution, **dict(self.params)}
        return {"values": list(self.values)}


@dataclass(frozen=True)
class CohortItem:
    """One volume to generate. ``index`` is 1-based; the participant label comes from it."""

    index: int
    seed: int
    conditioning: Mapping[str, float]
    width: int = 4

    @property
    def participant(self) -> str:
        return f"sub-synth{self.index:0{self.width}d}"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "seed": self.seed, "conditioning": dict(self.conditioning)}


@dataclass(frozen=True)
class CohortSpec:
    """A cohort: the request every volume is made from (``request``, the engine's ``SamplingRequest`` without a
    seed or conditioning: model, sampler, steps, guidance, optimization, modality, size, spacing), and the
    cohort's own settings: which seeds, how the conditions vary, where the volumes go."""

    name: str
    request: Any = (
        None  # engine.api.SamplingRequest; None is the default request (the default model's defaults)
    )
    seeds: tuple[int, ...] | int = 1
    seed_start: int = 0
    paired_seeds: bool = False
    draws: int = 1
    draw_seed: int = 0
    conditions: tuple[Condition, ...] = ()
    target: str = "folder"
    vault: str = ""

    def __post_init__(self) -> None:
        from engine.api import SamplingRequest

        if self.request is None:
            object.__setattr__(self, "request", SamplingRequest())
        template = self.request
        if not isinstance(template, SamplingRequest):
            raise InvalidRequest("a cohort's request template must be a SamplingRequest")
        if template.seed or template.conditioning or template.batch_size != 1 or template.xla_plan:
            raise InvalidRequest(
                "a cohort's request template has no seed, conditioning, batch or plan: the cohort's items and "
                "the run choose them"
            )

    # -- reading ---------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CohortSpec:
        if not isinstance(data, Mapping):
            raise InvalidRequest("a cohort spec must be a table of settings (name, model, seeds, ...)")
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise InvalidRequest(
                f"unknown cohort setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_TOP_KEYS))}"
            )
        name = data.get("name", "")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest(
                f"cohort name must be 1-64 letters, digits, '-' or '_' (it names the dataset), got {_shown(name)}"
            )
        model = _typed(data, "model", str, "")
        # The request's own fields, checked by their rows (engine.api.request_fields), as a request checks them.
        sampler, steps, guidance = (
            _request_field(data, name) for name in ("sampler", "steps", "guidance_scale")
        )
        optimization = data.get("optimization", {})
        if not isinstance(optimization, Mapping):
            raise InvalidRequest("[optimization] must be a table of optimization settings")
        from engine.api import SamplingRequest
        from engine.api.optimization_config import OptimizationConfig

        try:
            config = OptimizationConfig.from_dict(optimization)
        except InvalidRequest:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"[optimization] is not valid: {exc}") from exc
        chosen = {k: data[k] for k in ("modality", "output_size", "voxel_spacing_mm") if k in data}
        request = SamplingRequest(  # InvalidRequest names what is wrong
            model=model,
            sampler=sampler,
            steps=steps,
            guidance_scale=None if guidance is None else float(guidance),
            optimization=config,
            **chosen,
        )
        seeds_raw = data.get("seeds", 1)
        if isinstance(seeds_raw, list):
            if not seeds_raw or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in seeds_raw
            ):
                raise InvalidRequest("seeds must be a count or a non-empty list of whole numbers >= 0")
            if len(set(seeds_raw)) != len(seeds_raw):
                raise InvalidRequest("seeds lists a seed twice; each seed would give the same volume")
            seeds: tuple[int, ...] | int = tuple(seeds_raw)
        else:
            seeds = _int(data, "seeds", 1, 1, MAX_ITEMS)
        conditioning = data.get("conditioning", {})
        if not isinstance(conditioning, Mapping):
            raise InvalidRequest("[conditioning] must be a table: condition name -> values or distribution")
        conditions = tuple(_condition(n, c) for n, c in conditioning.items())
        output = data.get("output", {})
        if not isinstance(output, Mapping):
            raise InvalidRequest("[output] must be a table with target = 'folder' or 'vault'")
        extra = set(output) - {"target", "vault"}
        if extra:
            raise InvalidRequest(
                f"unknown [output] setting(s) {', '.join(sorted(extra))}; known: target, vault"
            )
        target = output.get("target", "folder")
        if target not in TARGETS:
            raise InvalidRequest(f"output target must be 'folder' or 'vault', got {_shown(target)}")
        vault = output.get("vault", "")
        if not isinstance(vault, str) or (target == "vault" and not vault):
            raise InvalidRequest("an output target 'vault' needs vault = 'path to the vault folder'")
        spec = cls(
            name=name,
            request=request,
            seeds=seeds,
            seed_start=_int(data, "seed_start", 0, 0, 2**62),
            paired_seeds=_typed(data, "paired_seeds", bool, False),
            draws=_int(data, "draws", 1, 1, MAX_ITEMS),
            draw_seed=_int(data, "draw_seed", 0, 0, 2**62),
            conditions=conditions,
            target=target,
            vault=vault,
        )
        if spec.draws > 1 and not any(c.distribution for c in conditions):
            raise InvalidRequest("draws > 1 needs a condition with a distribution to draw from")
        if spec.count > MAX_ITEMS:
            raise InvalidRequest(f"the spec expands to {spec.count} volumes; at most {MAX_ITEMS} per cohort")
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as its file says it (TOML or JSON keys): the template's fields at the top, as written."""
        data: dict[str, Any] = {
            "name": self.name,
            **template_fields(self.request),
            "seeds": list(self.seeds) if isinstance(self.seeds, tuple) else self.seeds,
            "seed_start": self.seed_start,
            "paired_seeds": self.paired_seeds,
            "draws": self.draws,
            "draw_seed": self.draw_seed,
            "conditioning": {c.name: c.to_dict() for c in self.conditions},
            "output": {"target": self.target, **({"vault": self.vault} if self.vault else {})},
        }
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=2)

    @property
    def sha256(self) -> str:
        """Hash of what decides the volumes (not the output target): a resume checks it is the same."""
        data = self.to_dict()
        data.pop("output")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    @property
    def cohort_id(self) -> str:
        return f"{self.name}-{self.sha256[:8]}"

    # -- counting and expansion ------------------------------------------------------------------------
    @property
    def seed_count(self) -> int:
        return len(self.seeds) if isinstance(self.seeds, tuple) else int(self.seeds)

    @property
    def point_count(self) -> int:
        grid = math.prod(len(c.values) for c in self.conditions if not c.distribution)
        return grid * self.draws

    @property
    def count(self) -> int:
        """Number of volumes the spec asks for."""
        return self.point_count * self.seed_count

    def seeds_for(self, point: int) -> list[int]:
        if isinstance(self.seeds, tuple):
            return list(self.seeds)
        base = self.seed_start if self.paired_seeds else self.seed_start + point * self.seeds
        return [base + k for k in range(self.seeds)]

    def expand(self, model_spec) -> list[CohortItem]:
        """The work items, in a fixed order. Grid values are checked and draws clipped to the model's ranges."""
        names = set(model_spec.condition_names)
        for cond in self.conditions:
            if cond.name not in names:
                raise InvalidRequest(
                    f"model {_shown(model_spec.id)} has no condition {_shown(cond.name)}; its conditions are: "
                    f"{', '.join(model_spec.condition_names) or 'none'}"
                )
            lo, hi = _range(model_spec, cond.name)
            bad = [v for v in cond.values if not lo <= v <= hi]
            if bad:
                raise InvalidRequest(
                    f"condition {cond.name}: {', '.join(f'{v:g}' for v in bad)} outside the model's range "
                    f"[{lo:g}, {hi:g}]"
                )
        fixed = [c for c in self.conditions if not c.distribution]
        drawn = [c for c in self.conditions if c.distribution]
        rng = np.random.default_rng(self.draw_seed)
        width = max(4, len(str(self.count)))
        items: list[CohortItem] = []
        point = 0
        for combo in itertools.product(*(c.values for c in fixed)):
            for _ in range(self.draws):
                values = {c.name: float(v) for c, v in zip(fixed, combo, strict=True)}
                for cond in drawn:
                    lo, hi = _range(model_spec, cond.name)
                    values[cond.name] = round(float(np.clip(_draw(rng, cond), lo, hi)), 3)
                for seed in self.seeds_for(point):
                    items.append(CohortItem(len(items) + 1, seed, dict(values), width))
                point += 1
        return items


def _range(model_spec, name: str) -> tuple[float, float]:
    cond = model_spec.condition(name)
    return float(cond.min), float(cond.max)


def _draw(rng: np.random.Generator, cond: Condition) -> float:
    if cond.distribution == "normal":
        return float(rng.normal(cond.params["mean"], cond.params["sd"]))
    return float(rng.uniform(cond.params["min"], cond.params["max"]))


def _request_field(data: Mapping[str, Any], name: str) -> Any:
    """A request field the spec gives (its default when it gives none), checked by the field's row."""
    from engine.api.request_fields import request_field

    row = request_field(name)
    return row.checked(data.get(name, row.default))


def _typed(data: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = data.get(key, default)
    if not isinstance(value, kind):
        raise InvalidRequest(f"{key} must be a {kind.__name__}, got {_shown(value)}")
    return value


def _int(data: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidRequest(f"{key} must be a whole number from {lo} to {hi}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    from engine.api.request_fields import shown  # imported when needed: engine.api brings the samplers

    return shown(value)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{what} must be a finite number, got {_shown(value)}")
    if isinstance(value, int) and value.bit_length() > 1000:  # math.isfinite would raise OverflowError
        raise InvalidRequest(f"{what} must be a finite number, got {_shown(value)}")
    if not math.isfinite(value):
        raise InvalidRequest(f"{what} must be a finite number, got {_shown(value)}")
    return float(value)


def _condition(name: str, data: Any) -> Condition:
    where = f"condition {name}"
    if isinstance(data, int | float) and not isinstance(data, bool):
        return Condition(name, (_number(data, where),))
    if isinstance(data, list):
        data = {"values": data}
    if not isinstance(data, Mapping):
        raise InvalidRequest(
            f"{where}: give a number, a list, values = [...], grid = {{...}} or a distribution"
        )
    kinds = [k for k in ("values", "grid", "distribution") if k in data]
    if len(kinds) != 1:
        raise InvalidRequest(f"{where}: give exactly one of values = [...], grid = {{...}} or distribution")
    if "values" in data:
        if set(data) != {"values"}:
            raise InvalidRequest(f"{where}: values takes no other settings")
        values = data["values"]
        if not isinstance(values, list) or not values:
            raise InvalidRequest(f"{where}: values must be a non-empty list of numbers")
        return Condition(name, tuple(_number(v, where) for v in values))
    if "grid" in data:
        grid = data["grid"]
        if set(data) != {"grid"} or not isinstance(grid, Mapping) or set(grid) != {"start", "stop", "num"}:
            raise InvalidRequest(f"{where}: grid must be {{ start = ..., stop = ..., num = ... }}")
        num = grid["num"]
        if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= MAX_ITEMS:
            raise InvalidRequest(f"{where}: grid num must be a whole number from 1 to {MAX_ITEMS}")
        start, stop = _number(grid["start"], where), _number(grid["stop"], where)
        return Condition(name, tuple(round(float(v), 6) for v in np.linspace(start, stop, num)))
    dist = data["distribution"]
    if dist not in DISTRIBUTIONS:
        raise InvalidRequest(
            f"{where}: distribution must be one of {', '.join(DISTRIBUTIONS)}, got {_shown(dist)}"
        )
    needed = {"normal": {"mean", "sd"}, "uniform": {"min", "max"}}[dist]
    given = set(data) - {"distribution"}
    if given != needed:
        raise InvalidRequest(f"{where}: a {dist} distribution takes exactly {', '.join(sorted(needed))}")
    params = {k: _number(data[k], f"{where} {k}") for k in sorted(needed)}
    if dist == "normal" and params["sd"] < 0:
        raise InvalidRequest(f"{where}: sd must be >= 0")
    if dist == "uniform" and params["max"] < params["min"]:
        raise InvalidRequest(f"{where}: max must be >= min")
    return Condition(name, (), dist, params)


def load_spec(path: str | Path) -> CohortSpec:
    """Read a cohort spec from a .toml or .json file, with one-line errors that say what to fix."""
    from engine.nifti.checks import open_regular_file

    path = Path(path).expanduser()
    if not path.exists():
        raise InvalidRequest(f"no cohort spec at {path}; write one (see `volsynth cohort run --help`)")
    kind = path.suffix.lstrip(".").upper() or "TOML"
    with open_regular_file(path) as fh:  # a FIFO or device is refused, not waited on
        raw = fh.read(MAX_SPEC_BYTES + 1)  # the size is bounded before anything is parsed
    if len(raw) > MAX_SPEC_BYTES:
        raise InvalidRequest(
            f"{path.name} is over {MAX_SPEC_BYTES // 1024} KiB; a cohort spec is a few lines (see "
            "`volsynth cohort run --help`)"
        )
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InvalidRequest(f"{path.name} is not valid {kind}: {str(exc)[:200]}") from exc
    except UnicodeDecodeError:
        raise InvalidRequest(f"{path.name} is not UTF-8 text; save the spec as UTF-8") from None
    except RecursionError:
        raise InvalidRequest(f"{path.name} nests lists or tables too deeply to be a cohort spec") from None
    except ValueError as exc:  # e.g. a whole number of more than 4300 digits (int conversion limit)
        raise InvalidRequest(f"{path.name} is not a usable {kind} spec: {str(exc)[:120]}") from None
    try:
        return CohortSpec.from_dict(data)
    except RecursionError:
        raise InvalidRequest(f"{path.name} nests lists or tables too deeply to be a cohort spec") from None
