"""The Cohort dialog under Xvfb, beside the Generate panel on app services: opened from the Generate menu, a
2-volume cohort run on a real local Ray runtime, a finished volume opened into the session, and a montage."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.cohort.draft import CohortDraft, ConditionDraft, estimate_seconds
from tests.app.keys import type_into

pytestmark = [pytest.mark.render, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_draft_counts_like_the_engine_spec():
    draft = CohortDraft(name="c", seeds=3, draws=4)
    draft.conditions = {
        "brain_volume": ConditionDraft("normal", 1200, 100),
        "ventricle_volume": ConditionDraft("grid", 10, 70, 5),
    }
    assert draft.count == 3 * 4 * 5
    assert estimate_seconds(draft.count, 10, 0.5, workers=2) == 60 * 10 * 0.5 / 2
    draft.conditions["brain_volume"].mode = "fixed"
    assert draft.count == 3 * 5  # draws only multiply when something is drawn
    assert draft.to_dict()["draws"] == 1


@pytest.mark.slow
def test_cohort_dialog_runs_a_two_volume_cohort(qtbot, generating, cohort, tmp_path, screenshot):
    pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")
    from engine.cohort import validate_layout

    state = generating.services.state
    state.select_model(state.model_by_id("tiny-latent"))
    generating.sampling_panel.steps_spin.setValue(3)
    action = cohort.action
    assert action in generating.services.menus.generate.actions() and action.isEnabled()
    action.trigger()
    dialog = cohort.dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitExposed(dialog)
    assert "3 steps" in dialog.sampler_label.text()  # read from the generation form

    ventricles = next(r for r in dialog.rows if r.condition.name == "ventricle_volume")
    ventricles.mode.setCurrentText("grid")
    type_into(qtbot, ventricles.n, "4")
    type_into(qtbot, dialog.seeds_spin, "3")
    assert dialog.count_label.text().startswith("12 volumes")
    ventricles.mode.setCurrentText("fixed")
    type_into(qtbot, ventricles.a, "30")
    type_into(qtbot, dialog.seeds_spin, "2")
    assert dialog.count_label.text().startswith("2 volumes")
    out = tmp_path / "cohort"
    dialog.out_edit.setText(str(out))

    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    assert not dialog.run_button.isEnabled() and dialog.stop_button.isEnabled()
    qtbot.waitUntil(lambda: dialog.job is None, timeout=600_000)  # the run ended, one way or another
    assert dialog.summary is not None, dialog.status.text()
    assert (dialog.summary.done, dialog.summary.total) == (2, 2)
    assert dialog.run_button.isEnabled() and dialog.progress.value() == dialog.progress.maximum()
    assert dialog.status.text().startswith("Finished: 2/2 volumes")
    assert dialog.done_list.count() == 2
    assert validate_layout(out) == []
    assert "s per step, last measured" in dialog.count_label.text()  # the estimate now has a step time

    item = dialog.done_list.item(1)
    dialog.done_list.setCurrentItem(item)
    path = Path(item.data(Qt.ItemDataRole.UserRole))
    qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(e.path == path for e in state.volumes), timeout=60_000)
    shown = next(e for e in state.volumes if e.path == path)
    assert shown.synthetic and shown.provenance["cohort"]["participant"] == "sub-synth0002"

    qtbot.mouseClick(dialog.montage_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dialog.montage_label.pixmap().isNull(), timeout=60_000)
    # Whole inside its room and labelled: which volumes, which slice (it was cut off and said nothing).
    label = dialog.montage_label
    qtbot.waitUntil(  # refitted once the caption's line is laid out under it
        lambda: label.pixmap().width() <= label.width() and label.pixmap().height() <= label.height(),
        timeout=10_000,
    )
    assert dialog.montage_caption.text().startswith("Axial mid-slices of 2 of 2 volumes (anterior up")
    assert "sub-synth0001, sub-synth0002" in dialog.montage_caption.text()
    screenshot(dialog, "cohort-montage")
    dialog.close()
