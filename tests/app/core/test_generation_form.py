"""The generation form (app/core/generation_form.py): Qt-free, the one owner of the next request."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.core.generation_form import REMOTE_PREFIX, GenerationForm, extrapolation_note


@pytest.fixture
def latent(registry):
    return next(m for m in registry.list() if m.id == "tiny-latent")


def _form(source) -> GenerationForm:
    form = GenerationForm()
    form.set_model(source)
    return form


def test_selecting_a_model_takes_its_defaults_and_says_so(latent):
    form = GenerationForm()
    seen = []
    form.changed.connect(seen.append)
    form.set_model(latent)
    spec = latent.spec
    assert seen == ["model"]
    assert (form.sampler, form.steps) == (spec.default_sampler, spec.default_steps)
    assert form.conditioning == {c.name: c.default for c in spec.conditioning}
    form.set(seed=7, steps=spec.default_steps)  # steps unchanged: only seed is reported
    assert seen[-1] == "seed" and seen.count("steps") == 0


def test_to_request_names_the_model_by_path_here_and_by_id_on_a_server(latent):
    form = _form(latent)
    form.set(seed=11, steps=20)
    request = form.to_request()
    assert request.model == str(latent.path) and request.seed == 11
    assert request.preview_interval == 7  # the default: two previews in 20 steps (at 7 and 14)
    assert form.to_request(batch_size=1, preview_interval=0).preview_interval == 0
    form.set(device=REMOTE_PREFIX + "http://127.0.0.1:9")
    assert form.to_request().model == latent.spec.id


def test_out_of_range_conditioning_is_refused_with_the_range(latent):
    form = _form(latent)
    before = dict(form.conditioning)
    with pytest.raises(ValueError, match=r"between 5 and 80 mL; got 200"):
        form.set_condition("ventricle_volume", 200)
    assert form.conditioning == before  # nothing changed: no silent clamp
    with pytest.raises(ValueError, match="no conditioning input"):
        form.set_condition("age", 50)


def test_engine_validation_errors_reach_the_caller_as_the_draft_is_edited(latent):
    from engine.errors import InvalidRequest

    form = _form(latent)
    form.set(seed=5)
    seen = []
    form.changed.connect(seen.append)
    with pytest.raises(InvalidRequest, match="seed"):
        form.set(seed=-1)  # the draft is a request: it refuses at once, not at Generate
    assert form.seed == 5 and form.to_request().seed == 5 and seen == []


def test_the_form_edits_one_request_draft(latent):
    from engine.api import SamplingRequest

    form = _form(latent)
    form.set(steps=12, seed=3, optimization={"tf32": True}, preview_interval=0)
    assert isinstance(form.draft, SamplingRequest) and (form.draft.steps, form.draft.seed) == (12, 3)
    assert form.steps is form.draft.steps and form.conditioning is form.draft.conditioning
    # to_request is the draft with the app state filled in: model reference, optimization, previews, plan
    assert form.to_request() == form.draft.replace(
        model=str(latent.path), optimization={"tf32": True}, preview_interval=0
    )


def test_a_models_values_come_back_when_it_is_chosen_again(registry, latent):
    pixel = next(m for m in registry.list() if m.id == "tiny-pixel")
    form = _form(latent)
    form.set(steps=7, guidance_scale=2.5, seed=9)
    form.set_condition("ventricle_volume", 60.0)
    form.set_model(pixel)
    assert form.steps == pixel.spec.default_steps  # the other model starts from its own defaults
    form.set(steps=4)
    form.set_model(latent)
    assert (form.steps, form.guidance_scale, form.seed) == (
        7,
        2.5,
        9,
    )  # the seed is the form's, not the model's
    assert form.conditioning["ventricle_volume"] == 60.0
    form.set_model(pixel)
    assert form.steps == 4
    # and across a restart: every model's values are saved, not only the chosen one's
    restored = GenerationForm()
    restored.restore(json.loads(json.dumps(form.to_dict())))
    restored.set_model(latent)
    assert restored.steps == 7 and restored.conditioning["ventricle_volume"] == 60.0
    restored.set_model(pixel)
    assert restored.steps == 4


def test_blocks_are_kept_per_source_and_reported_together(latent):
    form = _form(latent)
    events = []
    form.blocks_changed.connect(lambda: events.append(form.blocked_reason()))
    form.set_blocked("optimization", "refused settings")
    form.set_blocked("remote", "server lacks the model")
    assert form.blocked_reason() == "refused settings\nserver lacks the model"
    assert form.blocked_reason(ignore=("optimization",)) == "server lacks the model"
    form.set_blocked("optimization", None)
    form.set_blocked("optimization", None)  # lifting twice reports once
    assert events == [
        "refused settings",
        "refused settings\nserver lacks the model",
        "server lacks the model",
    ]


def test_saved_form_round_trips_through_json_and_waits_for_its_model(latent):
    form = _form(latent)
    form.set(seed=42, steps=9, batch_size=3, optimization={"autocast": "bf16"})
    form.set_condition("ventricle_volume", 60.0)
    saved = json.loads(json.dumps(form.to_dict()))

    restored = GenerationForm()
    assert restored.restore(saved) == latent.spec.id
    assert (restored.seed, restored.batch_size, restored.optimization) == (42, 3, {"autocast": "bf16"})
    assert restored.steps == 0  # model-specific values wait until that model is chosen
    restored.set_model(latent)
    assert restored.steps == 9 and restored.conditioning["ventricle_volume"] == 60.0


def test_restore_drops_values_a_model_no_longer_allows(latent):
    form = GenerationForm()
    form.restore(
        {
            "model": latent.spec.id,
            "sampler": "euler",  # not one of the model's samplers
            "steps": "many",  # wrong type
            "conditioning": {"ventricle_volume": 999.0},  # out of range
            "seed": -3,
            "batch_size": True,
        }
    )
    form.set_model(latent)
    spec = latent.spec
    assert form.sampler == spec.default_sampler and form.steps == spec.default_steps
    assert form.conditioning == {c.name: c.default for c in spec.conditioning}
    assert form.seed == 0 and form.batch_size == 1
    assert form.restore("not a dict") == ""


def test_values_outside_the_trained_range_are_marked_as_extrapolation(latent):
    condition = replace(latent.spec.conditioning[1], trained_min=10.0, trained_max=50.0)
    assert extrapolation_note(condition, 30.0) == ""
    assert extrapolation_note(condition, 70.0) == "extrapolation: trained on 10 to 50 mL"
    assert extrapolation_note(latent.spec.conditioning[1], 70.0) == ""  # no trained range: nothing to say
