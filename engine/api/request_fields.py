"""The request's fields, each described once: its kind, bounds or choices, help, CLI flag and wire rule.

``SamplingRequest`` validates its fields with these rows, the engine server builds its request body from them
(``engine.server.schemas.request_body``), the CLI its request flags (``engine.cli._request``) and the app its
controls' limits (:func:`control_ranges`), the way ``SETTING_ROWS`` describes the optimization settings. A new
request field is its dataclass field, its row here and the code that uses it.

Sampler names are the sampler registry's (``engine.samplers``), read when they are needed, so a registered
sampler is a choice everywhere at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from engine.errors import InvalidRequest
from engine.samplers import sampler_names

MAX_BATCH = 16
MAX_STEPS = 10_000
MAX_PROFILED_STEPS = 10  # profiler traces grow with every step; a few steps show the steady state
MAX_EDGE = 4096  # voxels along one axis of a requested output size (a model's own limits are tighter)
# ``best``, or a plan name as ``volsynth plan`` prints it: mesh axes dp/d/h with their sizes, and a variant.
XLA_PLAN_PATTERN = r"best|single|(dp|d|h)\d{1,3}(x(d|h)\d{1,3}){0,2}(/cut@\d{1,2})?"
MODALITY_PATTERN = r"[a-z0-9][a-z0-9-]{0,39}"

# What a field holds (``RequestField.kind``).
WHOLE = "whole"  # a whole number within bounds
NUMBER = "number"  # a finite number within bounds
TEXT = "text"  # text; empty, or matching ``pattern`` when there is one
CHOICE = "choice"  # empty, or one of ``choices()``
CONDITIONS = "conditions"  # condition name -> finite number
WHOLE_TRIPLE = "whole triple"  # three whole numbers within bounds (x, y, z)
NUMBER_TRIPLE = "number triple"  # three finite numbers within bounds (x, y, z)
SETTINGS = "settings"  # the optimization settings (``SETTING_ROWS`` describe them)


@dataclass(frozen=True)
class RequestField:
    """Everything said about one ``SamplingRequest`` field, once.

    Attributes:
        name: the ``SamplingRequest`` field.
        kind: ``WHOLE``, ``NUMBER``, ``TEXT``, ``CHOICE``, ``CONDITIONS``, ``WHOLE_TRIPLE``, ``NUMBER_TRIPLE``
            or ``SETTINGS``.
        help: the one explanation: the CLI flag's help and the server schema's description.
        default: the field's default.
        bounds: the smallest and largest value of a number (of each number of a triple); None as the largest:
            no upper bound.
        low_open: the smallest value is excluded (a spacing above 0).
        high_open: the largest value is excluded (a seed below 2^63).
        optional: None is a value too: the model's default.
        unset: the value that means "the model's default" (0 steps, no sampler): a CLI flag leaves it out rather
            than taking it, and a control starts above it.
        choices: the values of a ``CHOICE`` field, read when needed (the sampler registry's names).
        pattern: what a ``TEXT`` field matches (a regular expression; empty text is always allowed).
        shape: what a ``TEXT`` field must look like, for messages ("a name such as t1w").
        unit: a number's unit in messages ("mm").
        what: how messages name it; default: the name with spaces.
        flag: the CLI flag; default: ``--`` and the name with dashes; None: no request flag (the optimization
            settings have their own, one per row).
        metavar: the CLI's name for the flag's argument.
        flag_note: what the CLI help says besides ``help`` (the flag's default, its syntax).
        group: the CLI help's group of the flag ("" for the main list).
        control_max: the largest value a control offers where the field has no upper bound (guidance).
        wire_max_length: the longest text the engine server accepts (its model ids; a local request may name a
            folder of any length).
        wire_max_items: the most conditions the engine server accepts.
        wire_name_length: the shortest and longest condition name the engine server accepts.
    """

    name: str
    kind: str
    help: str
    default: Any = None
    bounds: tuple[float, float | None] | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    unset: Any = None
    choices: Callable[[], Sequence[str]] | None = None
    pattern: str = ""
    shape: str = ""
    unit: str = ""
    what: str = ""
    flag: str | None = ""
    metavar: str | None = None
    flag_note: str = ""
    group: str = ""
    control_max: float | None = None
    wire_max_length: int | None = None
    wire_max_items: int | None = None
    wire_name_length: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "what", self.what or self.name.replace("_", " "))
        if self.flag == "":
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))

    @property
    def values(self) -> tuple[str, ...]:
        """A ``CHOICE`` field's values as they are now (empty for the other kinds)."""
        return tuple(self.choices()) if self.choices is not None else ()

    @property
    def cli_help(self) -> str:
        """The CLI flag's help: the explanation, then what the command line's values mean."""
        return f"{self.help}{f' ({self.flag_note})' if self.flag_note else ''}".replace("%", "%%")

    def control_range(self) -> tuple[float, float]:
        """The smallest and largest value a control offers: the bounds, above the ``unset`` value, and up to
        ``control_max`` where there is no upper bound."""
        if self.bounds is None:
            raise ValueError(f"request field {self.name} has no bounds for a control")
        low, high = self.bounds
        if self.unset == low or self.low_open:
            low = low + 1 if self.kind in (WHOLE, WHOLE_TRIPLE) else low
        if high is None:
            if self.control_max is None:
                raise ValueError(f"request field {self.name} has no upper bound and no control_max")
            high = self.control_max
        elif self.high_open and self.kind in (WHOLE, WHOLE_TRIPLE):
            high -= 1
        return low, high

    # -- checking ------------------------------------------------------------------------------------

    def checked(self, value: Any) -> Any:
        """``value`` in its canonical form (tuples for triples, a dict of conditions); ``InvalidRequest`` saying
        what is wrong when it is not a value of this field. The optimization settings are checked by their own
        rows (``OptimizationConfig``)."""
        if value is None and self.optional:
            return None
        refusal = self.refusal(value)
        if refusal:
            raise InvalidRequest(refusal)
        if self.kind in (WHOLE_TRIPLE, NUMBER_TRIPLE):
            return tuple(value) if self.kind == WHOLE_TRIPLE else tuple(float(v) for v in value)
        if self.kind == CONDITIONS:
            return dict(value)
        return value

    def refusal(self, value: Any) -> str:
        """Why ``value`` is not a value of this field, or "" when it is."""
        if value is None and self.optional:
            return ""
        if self.kind in (WHOLE, NUMBER):
            return (
                ""
                if self._in_bounds(value)
                else f"{self.what} must be {self._number_rule()}, got {shown(value)}"
            )
        if self.kind in (WHOLE_TRIPLE, NUMBER_TRIPLE):
            if isinstance(value, list | tuple) and len(value) == 3 and all(self._in_bounds(v) for v in value):
                return ""
            return f"{self.what} must be three {self._number_rule(plural=True)}, got {shown(value)}"
        if self.kind == CHOICE:
            names = self.values
            if value == "" or (isinstance(value, str) and value in names):
                return ""
            return f"unknown {self.what} {shown(value)}; choose one of {', '.join(names)}"
        if self.kind == TEXT:
            if not isinstance(value, str):
                return f"{self.what} must be text, got {shown(value)}"
            if value and self.pattern and not re.fullmatch(self.pattern, value):
                return f"{self.what} must be {self.shape}, got {shown(value)}"
            return ""
        if self.kind == CONDITIONS:
            if not isinstance(value, Mapping):
                return f"{self.what} must map condition names to numbers, got {shown(value)}"
            for name, number in value.items():
                if not _is_number(number) or not _finite(number):
                    return f"condition {shown(name)} must be a finite number, got {shown(number)}"
            return ""
        return ""  # SETTINGS: the rows of the settings check them

    def _in_bounds(self, value: Any) -> bool:
        whole = self.kind in (WHOLE, WHOLE_TRIPLE)
        if not _is_number(value) or (whole and not isinstance(value, int)) or not _finite(value):
            return False
        if self.bounds is None:
            return True
        low, high = self.bounds
        above = value > low if self.low_open else value >= low
        below = high is None or (value < high if self.high_open else value <= high)
        return above and below

    def _number_rule(self, plural: bool = False) -> str:
        """ "a whole number from 0 to 16", "finite numbers > 0 (mm)"..."""
        whole = self.kind in (WHOLE, WHOLE_TRIPLE)
        noun = (
            ("whole numbers" if whole else "finite numbers")
            if plural
            else ("a whole number" if whole else "a finite number")
        )
        unit = f" ({self.unit})" if self.unit else ""
        if self.bounds is None:
            return noun + unit
        low, high = self.bounds
        default = " (0: the model's default)" if self.unset == low else ""
        if high is None:
            return f"{noun} {'>' if self.low_open else '>='} {_shown(low)}{unit}"
        if whole:
            low = low + 1 if self.low_open or self.unset == low else low
            high = high - 1 if self.high_open else high
            return f"{noun} from {_shown(low)} to {_shown(high)}{unit}{default}"
        return f"{noun} between {_shown(low)} and {_shown(high)}{unit}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(number: float) -> bool:
    """Whether a number is finite as a float: a whole number beyond the float range is not (every bound here is
    within it, and a guidance scale of 10^3000 would overflow the float it becomes)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def shown(value: Any) -> str:
    """A value for an error message: short, and never a conversion that fails (a 100,000-digit number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a whole number of about {int(value.bit_length() * 0.30103)} digits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(number: float) -> str:
    """A bound as people read it: 2^63-1 rather than nineteen digits."""
    if isinstance(number, int) and number >= 2**32 and (number + 1) & number == 0:
        return f"2^{(number + 1).bit_length() - 1}-1"
    return f"{number:g}" if isinstance(number, float) else str(number)


_OUTPUT = "output, for models that let a request choose (NV-Generate-MR-Brain)"
REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "model",
        TEXT,
        "model id (see `volsynth models`) or model/bundle folder",
        "",
        flag_note="default: the shipped demo model",
        wire_max_length=128,
    ),
    RequestField(
        "sampler",
        CHOICE,
        "sampler: how the noise is taken away step by step",
        "",
        unset="",
        choices=sampler_names,
        flag_note="default: the model's",
    ),
    RequestField(
        "steps",
        WHOLE,
        "denoising steps: more is slower and usually cleaner",
        0,
        bounds=(0, MAX_STEPS),
        unset=0,
        flag_note="default: the model's",
    ),
    RequestField(
        "seed",
        WHOLE,
        "random seed: the same seed, settings and device give the same volume",
        0,
        bounds=(0, 2**63),
        high_open=True,
        flag_note="default 0",
    ),
    RequestField(
        "conditioning",
        CONDITIONS,
        "conditioning value in the model's units",
        MappingProxyType({}),  # no conditions; read-only, as a shared default must be
        flag="--cond",
        metavar="NAME=VALUE",
        flag_note="repeat for several",
        wire_max_items=32,
        wire_name_length=(1, 64),
    ),
    RequestField(
        "guidance_scale",
        NUMBER,
        "classifier-free guidance scale: 1 is plain conditional sampling, higher follows the conditions more "
        "strictly",
        None,
        bounds=(0.0, None),
        optional=True,
        flag="--guidance",
        flag_note="default: the model's",
        control_max=20.0,
    ),
    RequestField(
        "batch_size",
        WHOLE,
        "number of volumes generated together",
        1,
        bounds=(1, MAX_BATCH),
        flag="--batch",
        flag_note="default 1",
    ),
    RequestField(
        "optimization", SETTINGS, "speed and precision settings; defaults are plain fp32", None, flag=None
    ),
    RequestField(
        "preview_interval",
        WHOLE,
        "yield a preview of the clean-volume estimate every this many steps (0: never)",
        0,
        bounds=(0, MAX_STEPS),
        flag=None,
    ),
    RequestField(
        "kernel_profile_steps",
        WHOLE,
        "denoising steps to run under the kernel profiler (from step 2)",
        0,
        bounds=(0, MAX_PROFILED_STEPS),
        flag=None,  # volsynth compare's --profile-steps, checked against these bounds
    ),
    RequestField(
        "modality",
        TEXT,
        "modality by name: t1w, t2w, flair, swi, or the same with -skullstripped",
        "",
        pattern=MODALITY_PATTERN,
        shape="a name such as t1w or flair-skullstripped",
        flag_note="default: the model's",
        group=_OUTPUT,
    ),
    RequestField(
        "output_size",
        WHOLE_TRIPLE,
        "output size in voxels, e.g. 256x256x128",
        None,
        bounds=(1, MAX_EDGE),
        optional=True,
        flag="--size",
        metavar="XxYxZ",
        group=_OUTPUT,
    ),
    RequestField(
        "voxel_spacing_mm",
        NUMBER_TRIPLE,
        "voxel spacing in mm, e.g. 0.94x0.94x1.36",
        None,
        bounds=(0.0, None),
        low_open=True,
        optional=True,
        unit="mm",
        what="voxel spacing",
        flag="--spacing",
        metavar="XxYxZ",
        group=_OUTPUT,
    ),
    RequestField(
        "xla_plan",
        TEXT,
        "on an XLA engine server (or --device xla): shard the run over its devices as this plan says: best (the "
        "planner's choice for the server's topology) or a name `volsynth plan` prints, e.g. dp2, d2xh2, "
        "dp2xd2/cut@2",
        "",
        pattern=XLA_PLAN_PATTERN,
        shape="empty, 'best' or a plan name such as dp2xd2 (see `volsynth plan`)",
        what="xla_plan",
        metavar="PLAN",
        flag_note="default: one device",
    ),
)


def all_fields() -> tuple[RequestField, ...]:
    """The rows as they are now: read at each use, so that a row a test adds is seen everywhere."""
    return REQUEST_FIELDS


def request_field(name: str) -> RequestField:
    """The row of the field ``name``; ``KeyError`` when there is none."""
    for row in all_fields():
        if row.name == name:
            return row
    raise KeyError(name)


def control_ranges(fields: Sequence[RequestField] | None = None) -> dict[str, tuple[float, float]]:
    """The smallest and largest value of each number field's control (the app's spin boxes)."""
    return {
        row.name: row.control_range()
        for row in (all_fields() if fields is None else fields)
        if row.kind in (WHOLE, NUMBER) and row.bounds is not None
    }
