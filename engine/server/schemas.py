"""The request and answer bodies as the OpenAPI schema describes them, and the refusal every error becomes.

Numbers are JSON Schema's (never ``true`` or ``"1.5"``); the request body (``JobRequest``) is made from the request
field rows (``REQUEST_FIELDS``) and its ``OptimizationBody`` from the optimization settings' rows (``SETTING_ROWS``),
so that a new field or setting is on the wire at once; and every refusal is an ``ErrorBody`` with an engine error
class (:class:`Refused`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import HTTPException
from fastapi import Path as PathParam
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    create_model,
)

from engine import wire
from engine.api import MAX_BATCH, optimization_config, request_fields
from engine.xla.planning import DEFAULT_COMPILE_TOP, DEFAULT_TIME_LIMIT_S, MAX_COMPILE_TOP, MAX_TIME_LIMIT_S


def _real_number(value: Any) -> Any:
    """JSON Schema's number: never true or "1.5" (pydantic's lax float would take both)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a number is needed")
    return value


def _finite(**constraints):
    return Annotated[float, Field(allow_inf_nan=False, **constraints), BeforeValidator(_real_number)]


def _whole_number(value: Any) -> int:
    """JSON Schema's integer: 4 and 4.0, never true, "4" or 4.5."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a whole number is needed")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("a whole number is needed")
        return int(value)
    return value


def _whole(**constraints):
    return Annotated[int, Field(**constraints), BeforeValidator(_whole_number)]


def _optimization_field(row: optimization_config.SettingRow) -> tuple[Any, Any]:
    """The pydantic type of one optimization setting, from its row: true/false, one of its values, a whole
    number (3 and 3.0, never 2.5) or a finite number within its bounds."""
    if row.is_switch:
        return StrictBool, row.default
    if row.values:
        named = tuple(value for value in row.values if value is not None)
        kind = Literal[named]  # type: ignore[valid-type]
        return (kind | None if None in row.values else kind), row.default
    low, high = row.bounds or (None, None)
    if row.whole:
        return _whole(ge=low, le=high), row.default
    return _finite(ge=low, le=high), row.default


def _incompatible(fields) -> dict[str, Any]:
    """The combinations OptimizationConfig refuses on every device, stated in the schema too."""
    quantized = {"enum": ["int8", "mixed"]}
    cases = [
        {
            "required": ["quantization", "autocast"],
            "properties": {"quantization": quantized, "autocast": {"const": "fp16"}},
        },
        {
            "required": ["quantization", "compile_mode"],
            "properties": {"quantization": quantized, "compile_mode": {"type": "string"}},
        },
        {
            "required": ["cuda_graphs", "compile_mode"],
            "properties": {
                "cuda_graphs": {"const": True},
                "compile_mode": {"enum": ["reduce-overhead", "max-autotune"]},
            },
        },
    ]
    if "step_cache_interval" in fields:  # step caching (an interval above 1) runs the U-Net's levels apart
        cached = {"type": "integer", "minimum": 2}
        cases += [
            {
                "required": ["step_cache_interval", "compile_mode"],
                "properties": {"step_cache_interval": cached, "compile_mode": {"type": "string"}},
            },
            {
                "required": ["step_cache_interval", "cuda_graphs"],
                "properties": {"step_cache_interval": cached, "cuda_graphs": {"const": True}},
            },
        ]
    if {"decoder_quantization", "decoder_autocast"} <= set(fields):
        cases += [
            {
                "required": ["decoder_quantization", "decoder_autocast"],
                "properties": {
                    "decoder_quantization": {"type": "string"},
                    "decoder_autocast": {"const": "fp16"},
                },
            },
            {
                "required": ["decoder_quantization", "autocast"],
                "properties": {
                    "decoder_quantization": {"type": "string"},
                    "autocast": {"const": "fp16"},
                    "decoder_autocast": {"type": "null"},
                },
            },
        ]
    return {"not": {"anyOf": cases}}


def optimization_body(rows=optimization_config.SETTING_ROWS) -> type[BaseModel]:
    """``OptimizationConfig`` on the wire, one field per setting row, so that a new setting is on the wire at
    once."""
    # Any: create_model's keyword arguments mix its options with the fields, so a typed dict of fields
    # cannot be spread into it.
    fields: dict[str, Any] = {row.name: _optimization_field(row) for row in rows}
    return create_model(
        "OptimizationBody",
        __config__=ConfigDict(extra="forbid", json_schema_extra=_incompatible(fields)),
        __doc__="``OptimizationConfig`` on the wire (engine.api.optimization_config).",
        **fields,
    )


OptimizationBody = optimization_body()


def _request_field(row: request_fields.RequestField) -> tuple[Any, Any]:
    """The pydantic type and default of one request field, from its row: JSON Schema's numbers (never true or
    "1.5") within the row's bounds, text matching its pattern, one of its choices (the sampler registry's names
    as they are when the app is made), three numbers, named conditions, or the optimization settings."""
    rules = request_fields
    low, high = row.bounds or (None, None)
    limits = {"gt" if row.low_open else "ge": low, "lt" if row.high_open else "le": high}
    limits = {key: value for key, value in limits.items() if value is not None}
    # The types below are built at run time from the row, for pydantic: a type checker cannot read types held
    # in variables (the valid-type ignores).
    kind: Any
    if row.kind == rules.SETTINGS:
        return Annotated[OptimizationBody, Field(description=row.help)], Field(
            default_factory=OptimizationBody
        )
    if row.kind == rules.CONDITIONS:
        shortest, longest = row.wire_name_length or (1, None)
        name = Annotated[str, StringConstraints(min_length=shortest, max_length=longest)]
        value = _finite()
        kind = Annotated[dict[name, value], Field(max_length=row.wire_max_items, description=row.help)]  # type: ignore[valid-type]
        return kind, Field(default_factory=dict)
    if row.kind == rules.CHOICE:
        kind = Literal[(row.unset, *row.values)]
    elif row.kind == rules.TEXT:
        pattern = f"^({row.pattern})?$" if row.pattern else None
        kind = Annotated[str, StringConstraints(max_length=row.wire_max_length, pattern=pattern)]
    elif row.kind in (rules.WHOLE, rules.NUMBER):
        kind = (_whole if row.kind == rules.WHOLE else _finite)(**limits)
    else:  # three numbers: x, y, z
        number = (_whole if row.kind == rules.WHOLE_TRIPLE else _finite)(**limits)
        kind = Annotated[list[number], Field(min_length=3, max_length=3)]  # type: ignore[valid-type]
    if row.optional:
        kind = kind | None
    return Annotated[kind, Field(description=row.help)], row.default


def request_body(fields: Sequence[request_fields.RequestField] | None = None) -> type[BaseModel]:
    """``SamplingRequest`` on the wire, one field per request field row (``engine.api.request_fields``), so
    that a new field, or a newly registered sampler, is on the wire when the app is made."""
    rows = request_fields.all_fields() if fields is None else fields
    body_fields: dict[str, Any] = {
        row.name: _request_field(row) for row in rows
    }  # Any: as in optimization_body
    return create_model(
        "JobRequest",
        __config__=ConfigDict(extra="forbid", protected_namespaces=()),
        __doc__="``SamplingRequest`` on the wire (engine.api); ``model`` is one of the server's model ids.",
        **body_fields,
    )


JobRequest = request_body()


class ErrorBody(BaseModel):
    detail: str
    error_class: str = "EngineError"


class PlanRequest(BaseModel):
    """``POST /plan``: plan one denoising step of a model on a topology (engine.xla.planning)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: Annotated[str, StringConstraints(max_length=128)] = ""
    topology: Annotated[
        str,
        StringConstraints(
            pattern=r"^(v5e:\d{1,2}x\d{1,2}|v5p:\d{1,2}x\d{1,2}x\d{1,2}|\dxH100-(nvlink|pcie))$"
        ),
    ]
    # What _whole and _finite make, written out: a type checker reads annotations without calling functions.
    batch: Annotated[int, Field(ge=1, le=MAX_BATCH), BeforeValidator(_whole_number)] = 1
    cfg: bool = True
    compile_top: Annotated[int, Field(ge=1, le=MAX_COMPILE_TOP), BeforeValidator(_whole_number)] = (
        DEFAULT_COMPILE_TOP
    )
    # Seconds after which the planner stops compiling and answers with the best plan so far (cut_short).
    time_limit_s: Annotated[
        float, Field(allow_inf_nan=False, ge=0, le=MAX_TIME_LIMIT_S), BeforeValidator(_real_number)
    ] = DEFAULT_TIME_LIMIT_S
    # Compile each surviving plan's whole step for the topology (minutes each) instead of its U-Net blocks.
    whole_compile: StrictBool = False


class InfoBody(BaseModel):
    name: str
    device: str
    device_name: str
    details: dict[str, Any]


class JobCreated(BaseModel):
    id: str


class CancelBody(BaseModel):
    status: str


JobId = Annotated[str, PathParam(pattern=r"^[0-9a-f]{32}$", description="a job id from POST /jobs")]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "the body is not parseable JSON"),
        (401, "missing or wrong token"),
        (413, "request body too large"),
        (422, "malformed request"),
        (429, "too many jobs or streams; see Retry-After"),
    )
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such job (it may have expired)"}
}


class Refused(HTTPException):
    """An HTTP refusal with an engine error class, answered as ``ErrorBody``."""

    def __init__(self, status: int, message: str, error_class: str = "EngineError", headers=None):
        super().__init__(status_code=status, detail=wire.short(message), headers=headers)
        self.error_class = error_class
