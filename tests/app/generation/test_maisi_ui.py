"""NV-Generate-MR-Brain in the app, driven as a user drives it: the picker and its card, the modality and
size controls, T2w and FLAIR volumes in the viewer with their voxel size, the tissue overlay's reason.

The model is a tiny MAISI-architecture folder in NV-Generate's layout with random weights: the volumes are
noise, which is all these tests need.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from engine.testing import write_maisi_folder
from tests.app.keys import pick
from tests.app.modal import answer_modal
from tests.app.runs import generate

pytestmark = pytest.mark.render

SIZE = (32, 32, 32)
SPACING = (7.52, 7.52, 5.44)


@pytest.fixture(scope="module")
def maisi_models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("maisi-app-models")
    write_maisi_folder(root / "NV-Generate-CTMR", dim=SIZE, spacing=SPACING)
    # Twice the edges at half the spacing: a folder whose preview size (32^3 at the spacing above) exists.
    write_maisi_folder(root / "NV-Generate-64", dim=(64, 64, 64), spacing=(3.76, 3.76, 2.72))
    return root


@pytest.fixture
def maisi_window(qtbot, themed_app, tiny_models_dir, maisi_models_dir, qt_settings, error_dialogs):
    from engine.models.registry import ModelRegistry
    from tests.app.conftest import _make_window

    window = _make_window(qtbot, ModelRegistry([tiny_models_dir, maisi_models_dir]), qt_settings, False)
    yield window
    window.close()
    assert not window.runner.jobs


def test_the_model_in_the_picker_with_its_card(qtbot, maisi_window, screenshot):
    window, panel = maisi_window, maisi_window.sampling_panel
    assert not panel.output_group.isVisible()  # the tiny numeric-conditioned model takes no modality
    pick(qtbot, panel.model_box, "NV-Generate-CTMR")
    assert window.state.form.model.spec.name.startswith("NV-Generate-MR-Brain")
    assert panel.output_group.isVisible() and not panel.conditioning_group.isVisible()
    assert [panel.modality_box.itemText(i) for i in range(4)] == [
        "T1w",
        "T2w",
        "FLAIR",
        "SWI (not guaranteed)",
    ]
    assert (
        panel.modality_box.itemText(panel.modality_box.findData("t2w-skullstripped")) == "T2w, skull-stripped"
    )
    assert panel.size_box.itemText(0).startswith("Full 32\u00d732\u00d732 at 7.52\u00d77.52\u00d75.44 mm")
    assert "NVIDIA Open Model License" in panel.model_info.text()
    assert panel.steps_spin.value() == 30 and panel.guidance_spin.value() == 2.0
    screenshot(window, "maisi-picker-and-modality-control")

    cards, errors = [], []

    def read_card_and_close(dialog):
        from PySide6.QtWidgets import QTabWidget

        tabs = dialog.findChild(QTabWidget)
        tabs.setCurrentIndex(1)
        cards.append((tabs.tabText(1), tabs.currentWidget().toPlainText()))
        screenshot(dialog, "maisi-model-card")
        dialog.reject()

    answer_modal(read_card_and_close, errors)  # once the About dialog is up, not after 300 ms
    window.window_actions.about.trigger()
    assert not errors
    ((title, text),) = cards
    assert title.startswith("Model card: NV-Generate-MR-Brain")
    for part in (
        "Version v1",
        "NVIDIA Open Model License",
        "t2w — class label 10",
        "Recommended field of view",
    ):
        assert part in text


def test_t2w_and_flair_volumes_with_their_spacing_in_the_status_bar(qtbot, maisi_window, screenshot):
    window, panel = maisi_window, maisi_window.sampling_panel
    pick(qtbot, panel.model_box, "NV-Generate-CTMR")
    panel.steps_spin.setValue(2)
    for modality, shot in (("t2w", "maisi-t2w-volume"), ("flair", "maisi-flair-volume")):
        pick(qtbot, panel.modality_box, modality)
        assert window.state.form.modality == modality
        assert generate(qtbot, window) == "finished"
        entry = window.state.shown
        assert entry.kind == "generated" and entry.synthetic and entry.shape == SIZE
        assert entry.provenance["output"]["modality"] == modality
        # The contrast is in the volume's session name and its details, not only in the status bar.
        title = {"t2w": "T2w", "flair": "FLAIR"}[modality]
        assert f"NV-Generate-CTMR {title} seed" in entry.name
        assert f"modality {title}" in window.session_panel.details.text()
        assert window.voxel_label.isVisible()
        assert window.voxel_label.text() == f"7.52\u00d77.52\u00d75.44 mm \u00b7 {modality}"
        # No tissue maps: the overlay is off and says why.
        tissue = window.tissue_toolbar.tissue_action
        assert not tissue.isEnabled() and "makes images only" in tissue.toolTip()
        screenshot(window, shot)
    assert window.session_panel.list.count() == 2


def test_the_contrasts_the_owners_do_not_guarantee_are_marked_where_they_are_picked(
    qtbot, maisi_window, screenshot
):
    window, panel = maisi_window, maisi_window.sampling_panel
    pick(qtbot, panel.model_box, "NV-Generate-CTMR")
    pick(qtbot, panel.modality_box, "t2w")
    assert not panel.modality_note.isVisible()  # T2w is guaranteed: no note
    names = [panel.modality_box.itemData(i) for i in range(panel.modality_box.count())]
    marked = [n for i, n in enumerate(names) if "(not guaranteed)" in panel.modality_box.itemText(i)]
    # The catalogue's caveats for the contrasts this model offers: SWI (sagittal, coronal) and MRA (all planes).
    assert marked == [n for n in names if n.startswith(("swi", "mra"))] and "swi" in marked
    pick(qtbot, panel.modality_box, "swi")
    assert window.state.form.modality == "swi"
    assert panel.modality_note.isVisible()
    assert panel.modality_note.text().startswith(
        "Quality not guaranteed by the model's owners (sagittal and coronal)"
    )
    assert "sagittal and coronal" in panel.modality_box.itemData(
        panel.modality_box.currentIndex(), Qt.ItemDataRole.ToolTipRole
    )
    screenshot(window, "maisi-swi-not-guaranteed")
    pick(qtbot, panel.modality_box, "flair")
    assert not panel.modality_note.isVisible()


def test_the_preview_size_runs_smaller_at_the_same_field_of_view(qtbot, maisi_window):
    window, panel = maisi_window, maisi_window.sampling_panel
    pick(qtbot, panel.model_box, "NV-Generate-CTMR")
    assert panel.size_box.count() == 1  # 32^3 cannot be halved for these networks: no preview offered
    pick(qtbot, panel.model_box, "NV-Generate-64")
    panel.steps_spin.setValue(1)
    assert panel.size_box.itemText(1) == "Preview 32\u00d732\u00d732 at 7.52\u00d77.52\u00d75.44 mm"
    pick(qtbot, panel.size_box, 1)
    assert window.state.form.output_size == (32, 32, 32)
    assert generate(qtbot, window) == "finished"
    entry = window.state.shown
    assert entry.shape == SIZE and entry.spacing == pytest.approx(SPACING)
    assert entry.provenance["output"]["fov_mm"] == pytest.approx([240.64, 240.64, 174.08])
    assert "warnings" not in entry.provenance


@pytest.mark.slow
def test_a_cohort_makes_the_modality_and_size_chosen_in_the_generate_panel(qtbot, maisi_window, tmp_path):
    pytest.importorskip("ray", reason="cohorts need the 'cohort' extra (ray)")
    import json

    window, panel = maisi_window, maisi_window.sampling_panel
    pick(qtbot, panel.model_box, "NV-Generate-64")
    panel.steps_spin.setValue(1)
    pick(qtbot, panel.modality_box, "t2w")
    pick(qtbot, panel.size_box, 1)  # the 32^3 preview size
    window.cohort.action.trigger()
    dialog = window.cohort.dialog
    qtbot.waitExposed(dialog)
    assert (
        "T2w, 32\u00d732\u00d732 at 7.52\u00d77.52\u00d75.44 mm (from the Generate panel)"
        in dialog.sampler_label.text()
    )
    dialog.seeds_spin.setValue(1)
    out = tmp_path / "cohort"
    dialog.out_edit.setText(str(out))
    qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.job is None, timeout=600_000)
    assert dialog.summary is not None and dialog.summary.done == 1, dialog.status.text()

    images = sorted(out.glob("sub-*/anat/*.nii.gz"))
    assert [p.name.split("_")[-1] for p in images] == ["T2w.nii.gz"]
    assert json.loads((out / "code/volsynth/manifest.json").read_text())["model"]["modality"] == "t2w"
    assert json.loads((out / "dataset_description.json").read_text())["VolSynthModality"] == "t2w"
    from engine.nifti.io import load_nifti

    assert load_nifti(images[0]).data.shape == (32, 32, 32)
    dialog.close()
