"""The Generate panel's Previews setting: how often a run decodes its current estimate, chosen with the mouse,
sent with the request (and remembered at the next start)."""

from __future__ import annotations

import pytest

from tests.app.generating import install_generating
from tests.app.keys import click_item
from tests.app.runs import generate


def _generate(qtbot, window) -> list[int]:
    """Run the panel's request to its end; the steps whose previews were drawn."""
    drawn: list[int] = []
    window.generation.preview_drawn.connect(drawn.append)
    outcome = generate(qtbot, window, click=True)
    window.generation.preview_drawn.disconnect(drawn.append)
    assert outcome == "finished"
    return drawn


@pytest.mark.slow
def test_previews_are_chosen_in_the_generate_panel_and_sent_with_the_request(qtbot, app_services):
    """(That the choice comes back at the next start: tests/app/panels/test_optimization_panel.py's
    test_the_form_comes_back_after_a_restart.)"""
    generating = install_generating(app_services)
    generating.select("tiny-latent")
    panel = generating.sampling_panel
    box = panel.previews_box
    assert box.currentText() == "Twice per run"  # the default: a CPU decode per preview costs steps
    panel.steps_spin.setValue(10)

    click_item(qtbot, box, "Final volume only")
    assert generating.state.form.to_request().preview_interval == 0

    click_item(qtbot, box, "4 per run")
    assert generating.state.form.to_request().preview_interval == 2
    assert _generate(qtbot, generating)  # each drawn: shown in the session as the run goes
    assert generating.generation.last_run["preview_steps"] == [2, 4, 6, 8]  # cheap previews are never skipped
    assert generating.generation.last_run["request"]["preview_interval"] == 2


def test_a_saved_interval_the_list_lacks_is_shown_as_it_is(qtbot, app_services):
    """A settings file from before the list (or edited by hand) with 'every 5 steps' keeps it, named."""
    generating = install_generating(app_services)
    panel = generating.sampling_panel
    generating.state.form.set(preview_interval=5)
    assert panel.previews_box.currentText() == "Every 5 steps"
    click_item(qtbot, panel.previews_box, "Once, halfway")
    assert generating.state.form.preview_interval == -1
