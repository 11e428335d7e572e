"""What each setting did is a typed decision of the prepared model; its report is written from the decisions,
and the settings are checked once per run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.api import SamplingRequest, run
from engine.api.optimization_config import SETTING_ROWS
from engine.backends.local import LocalBackend
from engine.optimization import decisions as decided
from engine.optimization.apply import OptimizationConfig, expected_report, prepare
from engine.optimization.decisions import EXPECTED, Decision, Decisions, SpeedVerdict
from tests.engine.optimization.conftest import run_loop

CPU = torch.device("cpu")


def test_every_report_entry_of_a_setting_is_decided_and_a_field_of_the_decisions():
    entries = {row.report_entry for row in SETTING_ROWS if row.report_entry}
    fields = [item.name for item in dataclasses.fields(Decisions)]
    assert entries == {*EXPECTED, "allow_slower"}
    assert fields == [*EXPECTED, "measured_here", "allow_slower"]  # the report's order


def test_the_report_is_written_from_the_decisions():
    decisions = Decisions(autocast=Decision("bf16", True, "bf16 autocast on the CPU"))
    verdict = SpeedVerdict(
        slower=(("autocast", "no native bf16 kernels"),), override=True, override_asked=True
    )
    report = decisions.with_speed(verdict).report()
    assert report["autocast"] == {
        "requested": "bf16",
        "applied": True,
        "reason": "bf16 autocast on the CPU",
        "expected_slower": "no native bf16 kernels",
    }
    assert report["allow_slower"]["applied"] and "no native bf16 kernels" in report["allow_slower"]["reason"]
    assert "measured_here" not in report and "expected_slower" not in report["tf32"]
    assert "expected_slower" not in decisions.autocast.entry()  # marking made a copy


def test_a_prepared_model_reads_its_decisions_not_its_report(tiny_loaded):
    prepared = prepare(tiny_loaded, OptimizationConfig(autocast="bf16", channels_last_3d=True), CPU)
    assert prepared.decisions.autocast.applied and prepared.decisions.channels_last_3d.applied
    assert prepared.report["autocast"] == prepared.decisions.autocast.entry()
    prepared.report["autocast"]["applied"] = False  # a copy: changing it changes nothing the model does
    assert prepared.autocast() is not None and prepared.decisions.autocast.applied
    assert prepared.report == expected_report(prepared.config, CPU)


def test_a_compilation_that_fails_at_its_first_call_is_reported_as_run_eager(tiny_loaded, monkeypatch):
    def failing_compile(module, **_kwargs):
        def call(*_args, **_kw):
            raise RuntimeError("no compiler backend\nmore lines")

        return call

    monkeypatch.setattr(torch, "compile", failing_compile)
    monkeypatch.setattr(decided, "_compile_support", lambda device: (True, ""))
    prepared = prepare(tiny_loaded, OptimizationConfig(compile_mode="default"), CPU, use_cache=False)
    assert prepared.report["compile_mode"]["applied"]
    run_loop(prepared, tiny_loaded.spec, steps=1)
    entry = prepared.report["compile_mode"]
    assert not entry["applied"] and entry["reason"] == "torch.compile failed, ran eager: no compiler backend"


@pytest.mark.parametrize("fields", [{}, {"autocast": "bf16", "decoder_autocast": "fp32"}])
def test_a_run_checks_its_settings_once(registry, monkeypatch, fields):
    calls = []
    real = decided.slower_here

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decided, "slower_here", counting)
    request = SamplingRequest(model="tiny-latent", steps=2, optimization=OptimizationConfig(**fields))
    result = run(LocalBackend("cpu", registry).sample(request))
    assert len(calls) == 1
    assert set(result.provenance["optimization"]["report"]) >= set(EXPECTED)
