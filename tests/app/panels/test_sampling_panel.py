"""The Generate panel alone: its sampler box offers the registered samplers of the model's family, and its number
boxes' limits are the request fields' (``engine.api.request_fields``)."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.session import AppState
from app.panels.sampling_panel import SamplingPanel
from engine.api import request_fields
from tests.app.keys import pick

pytestmark = pytest.mark.render


def _panel(qtbot, registry, model_id: str = "tiny-latent") -> SamplingPanel:
    state = AppState()
    state.set_models(registry.list(), preferred=model_id)
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.show()
    panel.activateWindow()  # the keyboard goes to the active window
    qtbot.waitActive(panel)
    return panel


def test_the_sampler_box_offers_a_sampler_registered_once_and_the_form_takes_it(
    qtbot, registry, made_up_sampler
):
    panel = _panel(qtbot, registry)
    offered = [panel.sampler_box.itemText(i) for i in range(panel.sampler_box.count())]
    assert offered == ["ddim", "ddpm", "pndm", made_up_sampler]  # the model's default first, then its family
    pick(qtbot, panel.sampler_box, offered.index(made_up_sampler))
    assert panel.state.form.sampler == made_up_sampler
    assert panel.state.form.to_request().sampler == made_up_sampler


def test_a_flow_model_offers_only_the_flow_samplers(qtbot, registry, made_up_sampler):
    panel = _panel(qtbot, registry, "tiny-rflow")
    assert [panel.sampler_box.itemText(i) for i in range(panel.sampler_box.count())] == ["rflow"]


def test_the_number_boxes_limits_are_the_request_fields(qtbot, registry, monkeypatch):
    rows = {row.name: row for row in request_fields.REQUEST_FIELDS}
    narrower = {
        "batch_size": dataclasses.replace(rows["batch_size"], bounds=(1, 6)),
        "guidance_scale": dataclasses.replace(rows["guidance_scale"], control_max=12.0),
        "steps": dataclasses.replace(rows["steps"], bounds=(0, 40)),
    }
    monkeypatch.setattr(
        request_fields, "REQUEST_FIELDS", tuple(narrower.get(row.name, row) for row in rows.values())
    )
    panel = _panel(qtbot, registry)
    assert (panel.batch_spin.minimum(), panel.batch_spin.maximum()) == (1, 6)
    assert (panel.guidance_spin.minimum(), panel.guidance_spin.maximum()) == (0.0, 12.0)
    assert (panel.steps_spin.minimum(), panel.steps_spin.maximum()) == (1, 40)
    assert (panel.seed_spin.minimum(), panel.seed_spin.maximum()) == (0, 2**31 - 1)  # a 32-bit box's end
