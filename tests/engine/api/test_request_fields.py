"""One row per request field: the request's validation, the server's body, the CLI's flags and the controls' limits
are made from ``REQUEST_FIELDS``, so a new field appears in all of them from its row alone, and a bound exists once."""

from __future__ import annotations

import dataclasses

import pydantic
import pytest

from engine.api import SamplingRequest, request_fields
from engine.api.request_fields import NUMBER, REQUEST_FIELDS, SETTINGS, WHOLE, RequestField, control_ranges
from engine.errors import InvalidRequest

# A field no part of the product knows, described once.
MADE_UP = RequestField(
    "denoise_strength",
    NUMBER,
    "how far the starting volume is noised before it is denoised (1: from pure noise)",
    1.0,
    bounds=(0.0, 1.0),
    flag="--strength",
    metavar="S",
)


@pytest.fixture
def made_up_field(monkeypatch):
    monkeypatch.setattr(request_fields, "REQUEST_FIELDS", (*REQUEST_FIELDS, MADE_UP))
    return MADE_UP


def test_every_request_field_has_one_row_with_its_default_in_its_order():
    fields = dataclasses.fields(SamplingRequest)
    assert [row.name for row in REQUEST_FIELDS] == [f.name for f in fields]
    for row, item in zip(REQUEST_FIELDS, fields, strict=True):
        default = item.default if item.default_factory is dataclasses.MISSING else item.default_factory()
        if row.kind != SETTINGS:
            assert (dict(row.default) if isinstance(default, dict) else row.default) == default, row.name
    flags = [row.flag for row in REQUEST_FIELDS if row.flag]
    assert len(set(flags)) == len(flags)


def test_a_made_up_field_is_a_cli_flag_in_the_server_schema_and_in_the_form_limits(made_up_field, capsys):
    from engine.cli import build_parser, main
    from engine.cli._request import request_fields_from_args
    from engine.server import create_app
    from engine.testing import InstantBackend

    parser = build_parser()
    args = parser.parse_args(["generate", "--strength", "0.4", "--out", "x.nii.gz"])
    assert request_fields_from_args(args)["denoise_strength"] == 0.4
    assert (
        request_fields_from_args(parser.parse_args(["generate", "--out", "x.nii.gz"]))["denoise_strength"]
        == 1.0
    )
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--strength S" in capsys.readouterr().out

    schema = create_app(InstantBackend(None)).openapi()["components"]["schemas"]["JobRequest"]
    assert schema["properties"]["denoise_strength"] == {
        "type": "number",
        "minimum": 0.0,
        "maximum": 1.0,
        "default": 1.0,
        "title": "Denoise Strength",
        "description": MADE_UP.help,
    }
    assert control_ranges()["denoise_strength"] == (0.0, 1.0)


def _bounded_rows():
    return [row for row in REQUEST_FIELDS if row.kind in (WHOLE, NUMBER) and row.bounds and row.bounds[1]]


@pytest.mark.parametrize("row", _bounded_rows(), ids=lambda row: row.name)
def test_a_bound_exists_once_the_request_and_the_server_keep_it(row):
    from engine.server.schemas import request_body

    body = request_body()
    low, high = row.control_range()
    past = high + 1
    for value, allowed in ((low, True), (high, True), (past, False)):
        if allowed:
            assert getattr(SamplingRequest(**{row.name: value}), row.name) == value
            assert getattr(body.model_validate({row.name: value}), row.name) == value
        else:
            with pytest.raises(InvalidRequest, match=f"{row.what} must be .*, got {past}"):
                SamplingRequest(**{row.name: value})
            with pytest.raises(pydantic.ValidationError):
                body.model_validate({row.name: value})


def test_the_cli_leaves_a_model_default_out_rather_than_taking_it():
    from engine.cli import build_parser
    from engine.cli._request import request_fields_from_args

    parser = build_parser()
    values = request_fields_from_args(parser.parse_args(["generate", "--out", "x.nii.gz"]))
    assert (values["steps"], values["sampler"], values["guidance_scale"]) == (0, "", None)
    with pytest.raises(InvalidRequest, match="--steps must be at least 1"):
        request_fields_from_args(parser.parse_args(["generate", "--steps", "0", "--out", "x.nii.gz"]))
    sized = parser.parse_args(["generate", "--size", "8x8x9", "--spacing", "1,2,1.5", "--out", "x.nii.gz"])
    assert request_fields_from_args(sized)["output_size"] == (8, 8, 9)
    assert request_fields_from_args(sized)["voxel_spacing_mm"] == (1.0, 2.0, 1.5)
