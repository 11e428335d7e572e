"""One row per optimization setting: the CLI flags, the server's schema and the app's choices and tips are
made from ``SETTING_ROWS``, so a new setting appears in all of them from its row alone."""

from __future__ import annotations

import argparse
import dataclasses

import pydantic
import pytest

from app.core.display import setting_choices, setting_labels, setting_tips
from engine.api.optimization_config import DECODER, OVERRIDE, SETTING_ROWS, OptimizationConfig, SettingRow
from engine.cli._settings import add_setting_arguments, setting_fields
from engine.server.schemas import optimization_body

# Three new settings, one of each kind: a switch, a text setting with values, a whole number with bounds.
NEW_SWITCH = SettingRow(
    "decoder_fused_norm", "Fused GroupNorm", "Fuse the decoder's GroupNorm and SiLU", False, part=DECODER
)
NEW_TEXT = SettingRow(
    "conv_algorithm",
    "Convolution algorithm",
    "How cuDNN picks convolution kernels: heuristics or 100% benchmarked",
    None,
    choices=(("Heuristic", None), ("Benchmark", "benchmark"), ("Deterministic", "deterministic")),
    flag="--conv-algo",
)
NEW_NUMBER = SettingRow(
    "step_cache_warmup",
    "Step cache warm-up",
    "Full U-Net passes before step caching starts",
    0,
    choices=(("None", 0), ("Two steps", 2)),
    bounds=(0, 8),
    whole=True,
    metavar="N",
    omitted_at_default=True,
)
NEW_ROWS = (NEW_SWITCH, NEW_TEXT, NEW_NUMBER)
ROWS = (*SETTING_ROWS, *NEW_ROWS)


def _parser(rows=ROWS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="volsynth generate")
    add_setting_arguments(parser, rows)
    return parser


def test_every_config_field_has_one_row_with_its_default():
    fields = {f.name: f.default for f in dataclasses.fields(OptimizationConfig)}
    assert len(SETTING_ROWS) == len(fields)
    assert {row.name: row.default for row in SETTING_ROWS} == fields
    flags = [row.flag for row in SETTING_ROWS]
    assert len(set(flags)) == len(flags) == len(fields)  # every setting has a flag of its own


def test_a_new_row_gets_a_cli_flag_of_its_kind():
    parser = _parser()
    defaults = setting_fields(parser.parse_args([]), ROWS)
    assert defaults == {
        **dataclasses.asdict(OptimizationConfig()),
        "decoder_fused_norm": False,
        "conv_algorithm": None,
        "step_cache_warmup": 0,
    }
    args = parser.parse_args(["--decoder-fused-norm", "--conv-algo", "benchmark", "--step-cache-warmup", "2"])
    fields = setting_fields(args, ROWS)
    assert (fields["decoder_fused_norm"], fields["conv_algorithm"], fields["step_cache_warmup"]) == (
        True,
        "benchmark",
        2,
    )
    for wrong in (["--conv-algo", "fast"], ["--step-cache-warmup", "9"], ["--step-cache-warmup", "1.5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(wrong)
    text = parser.format_help()
    assert "--step-cache-warmup N" in text and "100% benchmarked" in text  # the tip is the help ("%" kept)


def test_existing_flags_keep_their_spellings_and_values():
    args = _parser(SETTING_ROWS).parse_args(
        [
            "--tf32",
            "--channels-last",
            "--autocast",
            "bf16",
            "--sdpa",
            "--quantize",
            "mixed",
            "--psnr-budget",
            "35",
            "--streamed-decode",
            "--step-cache-interval",
            "3",
            "--step-cache-level",
            "2",
            "--allow-slower",
        ]
    )
    config = OptimizationConfig(**setting_fields(args))
    assert config == OptimizationConfig(
        tf32=True,
        channels_last_3d=True,
        autocast="bf16",
        attention="sdpa",
        quantization="mixed",
        psnr_budget_db=35.0,
        streamed_decode=True,
        step_cache_interval=3,
        step_cache_level=2,
        allow_slower=True,
    )
    compiled = _parser(SETTING_ROWS).parse_args(["--compile", "reduce-overhead", "--cuda-graphs"])
    assert (compiled.compile_mode, compiled.cuda_graphs) == ("reduce-overhead", True)
    decoder = _parser(SETTING_ROWS).parse_args(
        [
            "--decoder-autocast",
            "bf16",
            "--decoder-quantize",
            "mixed",
            "--decoder-channels-last",
            "--decoder-psnr-budget",
            "30",
            "--unet-subpixel",
        ]
    )
    assert OptimizationConfig(**setting_fields(decoder)).summary() == "subpixel+dec:bf16-mixed@30dB-cl"


def test_a_new_row_is_a_field_of_the_server_schema():
    body = optimization_body(ROWS)
    properties = body.model_json_schema()["properties"]
    assert properties["decoder_fused_norm"]["type"] == "boolean"
    assert {"enum": ["benchmark", "deterministic"], "type": "string"} in properties["conv_algorithm"]["anyOf"]
    assert (properties["step_cache_warmup"]["minimum"], properties["step_cache_warmup"]["maximum"]) == (0, 8)
    parsed = body(decoder_fused_norm=True, conv_algorithm="deterministic", step_cache_warmup=3.0)
    assert (parsed.decoder_fused_norm, parsed.conv_algorithm, parsed.step_cache_warmup) == (
        True,
        "deterministic",
        3,
    )
    for wrong in ({"decoder_fused_norm": 1}, {"conv_algorithm": "fast"}, {"step_cache_warmup": 9}):
        with pytest.raises(pydantic.ValidationError):
            body(**wrong)


def test_a_new_row_has_the_apps_choices_tip_and_label():
    assert setting_choices(ROWS)["step_cache_warmup"] == [("None", 0), ("Two steps", 2)]
    assert setting_choices(ROWS)["conv_algorithm"][1] == ("Benchmark", "benchmark")
    assert "decoder_fused_norm" not in setting_choices(ROWS)  # a check box
    tips, labels = setting_tips(ROWS), setting_labels(ROWS)
    for row in NEW_ROWS:
        assert (tips[row.name], labels[row.name]) == (row.tip, row.label)


def test_a_row_checks_values_and_decides_the_wire():
    assert NEW_TEXT.refusal("fast") == (
        "conv_algorithm must be one of benchmark, deterministic or none, got 'fast'"
    )
    assert NEW_NUMBER.refusal(9) == "step_cache_warmup must be a whole number from 0 to 8, got 9"
    assert NEW_SWITCH.refusal(1) == "decoder_fused_norm must be true or false, got 1"
    assert all(row.refusal(row.default) == "" for row in ROWS)
    # Left out of the wire at its default (older servers read the request as before), sent otherwise.
    assert not NEW_NUMBER.on_wire(_Config(step_cache_warmup=0))
    assert NEW_NUMBER.on_wire(_Config(step_cache_warmup=2)) and NEW_SWITCH.on_wire(
        _Config(decoder_fused_norm=False)
    )


@dataclasses.dataclass
class _Config:
    step_cache_warmup: int = 0
    decoder_fused_norm: bool = False


def test_generate_takes_a_flag_for_every_setting(model_path_env, tmp_path):
    """The flags that came with the rows reach the run: the sidecar records them and what applied."""
    import json

    from engine.cli import main

    out = tmp_path / "o.nii.gz"
    flags = ["--unet-subpixel", "--decoder-autocast", "fp32", "--decoder-channels-last"]
    assert main(["generate", "--model", "tiny-latent", "--steps", "1", *flags, "--out", str(out)]) == 0
    optimization = json.loads((tmp_path / "o.json").read_text())["optimization"]
    requested = optimization["requested"]
    assert requested["unet_subpixel"] is True and requested["decoder_autocast"] == "fp32"
    assert optimization["report"]["decoder_channels_last"]["applied"]


def _changed(row: SettingRow):
    """A value of ``row`` other than its default."""
    if row.is_switch:
        return not row.default
    if row.values:
        return next(value for value in row.values if value != row.default)
    assert row.bounds is not None, row.name
    return row.bounds[0] if row.bounds[0] != row.default else row.bounds[1]


def _where_it_means_something(row: SettingRow) -> dict:
    """The settings a row needs on to mean anything: a PSNR budget its mixed quantization, a refinement the
    setting it refines."""
    rows = {r.name: r for r in SETTING_ROWS}
    if row.budget_of:
        return {row.budget_of: "mixed"}
    if row.only_with:
        return {row.only_with: _changed(rows[row.only_with])}
    return {}


@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda row: row.name)
def test_every_setting_changes_the_summary_except_the_override(row):
    """``summary()`` names the settings a run changes; a new row it leaves out fails here, by name."""
    base = _where_it_means_something(row)
    before = OptimizationConfig(**base).summary()
    after = OptimizationConfig(**base, **{row.name: _changed(row)}).summary()
    if row.part == OVERRIDE:  # permission to run, not a change of the run
        assert after == before
    else:
        assert after != before, f"{row.name} is missing from OptimizationConfig.summary()"


@pytest.mark.parametrize("row", SETTING_ROWS, ids=lambda row: row.name)
def test_every_setting_has_a_decision(row):
    """A row's report entry is decided (``EXPECTED``) and a field of ``Decisions``; a row without an entry of its
    own is reported with the setting it bounds or refines, which has one."""
    from engine.optimization.decisions import EXPECTED, Decisions

    fields = {item.name for item in dataclasses.fields(Decisions)}
    rows = {r.name: r for r in SETTING_ROWS}
    entry = row.report_entry or rows[row.budget_of or row.only_with].report_entry
    assert entry is not None, f"{row.name} has no report entry and reports with no other setting"
    assert entry in fields, f"{row.name}: Decisions has no field {entry!r}"
    assert entry in EXPECTED or row.part == OVERRIDE, f"{row.name}: EXPECTED has no decision for {entry!r}"
