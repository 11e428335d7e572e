"""The Generate panel's model picker against the model folders on disk: two models of one name read apart by
their folders, and a folder deleted outside the app leaves the picker at once."""

from __future__ import annotations

import shutil

from app.core.session import AppState
from app.models.model_folders import ModelFolderWatch
from app.panels.sampling_panel import SamplingPanel
from engine.models.registry import open_model_folder
from tests.app.keys import pick


def test_two_models_of_one_name_read_apart_and_a_deleted_folder_leaves_the_picker(
    qtbot, hub_content, tmp_path
):
    """Before: a random-weights MAISI folder and the catalogue install both read "NV-Generate-MR-Brain
    (rflow-mr-brain, MAISI v2) v1", and a deleted folder stayed in the picker until the app restarted."""
    installed = tmp_path / "models" / "nv-generate-mr-brain"
    random_weights = tmp_path / "scratch" / "maisi-random-weights"
    for folder in (installed, random_weights):
        shutil.copytree(hub_content["nv-generate-mr-brain"], folder)
    state = AppState()
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    watch = ModelFolderWatch(state, panel)
    state.set_models([open_model_folder(installed), open_model_folder(random_weights)])
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow, timeout=5_000)

    box = panel.model_box
    name = state.models[0].spec.name
    texts = [box.itemText(i) for i in range(box.count())]
    assert texts == [f"{name} \u00b7 nv-generate-mr-brain", f"{name} \u00b7 maisi-random-weights"]
    pick(qtbot, box, "maisi-random-weights")
    assert state.form.model.path == random_weights

    shutil.rmtree(random_weights)  # deleted in a file manager, say
    qtbot.waitUntil(lambda: box.count() == 1, timeout=10_000)
    assert box.itemText(0) == name  # alone again: its name needs no folder
    assert state.form.model.path == installed and box.currentData() == "nv-generate-mr-brain"
    assert watch.prune() == []
