"""The Cohort dialog shows and runs what the Generate panel holds, whatever it held when the dialog was first
opened: a user opens the dialog with the demo model, closes it, opens an NV-Generate-MR-Brain folder (a tiny
MAISI-architecture one with random weights), sets T2w, 4 steps and the Low memory preset, opens the dialog again
and runs it, all from the keyboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from engine.testing import write_maisi_folder
from tests.app.keys import pick, type_into

pytestmark = [pytest.mark.render, pytest.mark.filterwarnings("ignore::UserWarning")]

CTRL_SHIFT = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier


@pytest.fixture
def demo_window(qtbot, themed_app, qt_settings, error_dialogs):
    """The main window over the shipped models only, as a new user starts: the demo model chosen."""
    from engine.files.shipped import resource_path
    from engine.models.registry import ModelRegistry
    from tests.app.conftest import _make_window

    window = _make_window(qtbot, ModelRegistry([resource_path("models")]), qt_settings, False)
    yield window
    window.close()
    assert not window.runner.jobs


def _activate(qtbot, window) -> None:
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)


def _open_cohort(qtbot, window):
    _activate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_H, CTRL_SHIFT)  # Generate > Cohort...
    dialog = window.cohort.dialog
    qtbot.waitUntil(lambda: dialog is not None and dialog.isVisible(), timeout=10_000)
    qtbot.waitExposed(dialog)
    return dialog


def test_after_a_model_switch_the_dialog_shows_and_writes_the_generate_panels_cohort(
    qtbot, demo_window, tmp_path, monkeypatch, screenshot
):
    pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")
    window, panel = demo_window, demo_window.sampling_panel
    demo = window.state.form.model.spec.name
    assert demo == "Brain T1 demo (MNI152-derived, synthetic)"
    dialog = _open_cohort(qtbot, window)
    assert dialog.model_label.text() == demo and "50 steps" in dialog.sampler_label.text()
    conditions = [c.name for c in window.state.form.model.spec.conditioning]
    assert conditions and [row.condition.name for row in dialog.rows] == conditions
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5_000)

    folder = write_maisi_folder(
        tmp_path / "NV-Generate-MR-Brain", dim=(32, 32, 32), spacing=(7.52, 7.52, 5.44)
    )
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args: str(folder))
    _activate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_O, CTRL_SHIFT)  # Generate > Open Model Folder...
    qtbot.waitUntil(lambda: window.state.form.model.path == folder, timeout=30_000)
    maisi = window.state.form.model.spec.name
    assert maisi.startswith("NV-Generate-MR-Brain")
    pick(qtbot, panel.modality_box, "t2w")
    type_into(qtbot, panel.steps_spin, "4")
    pick(qtbot, window.optimization_panel.preset_box, "Low memory")
    assert window.state.form.optimization == {"streamed_decode": True}

    dialog = _open_cohort(qtbot, window)
    assert dialog.model_label.text() == maisi
    sampling = dialog.sampler_label.text()
    assert "4 steps" in sampling and "T2w" in sampling and "(from the Generate panel)" in sampling
    assert dialog.optimization_label.text() == "Streamed decode (from the Generate panel)"
    assert dialog.rows == []  # the demo's conditions went with it: this model takes a modality, no numbers
    assert dialog.name_edit.text() == f"{window.state.form.model.spec.id}-cohort"
    type_into(qtbot, dialog.seeds_spin, "1")
    dialog.out_edit.setFocus()
    dialog.out_edit.selectAll()
    out = tmp_path / "t2w-cohort"
    qtbot.keyClicks(dialog.out_edit, str(out))
    screenshot(dialog, "cohort-follows-the-generate-panel")

    qtbot.keyClick(dialog, Qt.Key.Key_R, Qt.KeyboardModifier.AltModifier)  # &Run Cohort
    qtbot.waitUntil(lambda: dialog.job is not None, timeout=10_000)
    qtbot.waitUntil(lambda: dialog.job is None, timeout=600_000)
    assert dialog.summary is not None and (dialog.summary.done, dialog.summary.total) == (1, 1), (
        dialog.status.text()
    )
    (image,) = sorted(out.glob("sub-*/anat/*_T2w.nii.gz"))
    sidecar = json.loads(Path(str(image).replace(".nii.gz", ".json")).read_text())
    assert sidecar["request"]["steps"] == 4 and sidecar["request"]["modality"] == "t2w"
    assert sidecar["request"]["optimization"]["streamed_decode"] is True
    assert sidecar["model"]["id"] == window.state.form.model.spec.id
    assert not list(out.glob("sub-*/anat/*_T1w.nii.gz"))
    dialog.close()
