"""The session panel's details end with the volume's anatomy check: measured in the background for a volume with
tissue maps (a generated one, a file opened with its maps), read from the sidecar when it carries one."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from tests.app.viewer_helpers import open_volume

pytestmark = pytest.mark.render


def _details(window) -> str:
    return window.session_panel.details.text()


def test_a_generated_volume_of_random_weights_reads_not_brain_like(qtbot, tissue_window):
    window = tissue_window
    window.sampling_panel.steps_spin.setValue(2)
    with qtbot.waitSignal(window.generation.ended, timeout=120_000) as ended:
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # Ctrl+G
    assert ended.args[0] == "finished"
    # The tiny model's maps are noise: the check says so, with the evidence that decided it.
    qtbot.waitUntil(lambda: "anatomy check: \u2717 not brain-like: " in _details(window), timeout=60_000)
    assert "tissue maps: GM, WM, CSF, ventricles" in _details(window)
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)


@pytest.mark.slow
def test_an_opened_brain_with_its_maps_reads_within_the_ranges(qtbot, tissue_window, tmp_path):
    from engine.api import SamplingRequest, SamplingResult
    from engine.nifti.io import generated_volumes, save_volume
    from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels

    labels = phantom_labels()
    maps = [(labels == code).astype(np.float32) for code in (2, 3, 1)]
    result = SamplingResult(
        volumes=np.stack([phantom("t1w"), *maps])[None],
        affine=phantom_affine(),
        request=SamplingRequest(model="tiny-pixel"),
        provenance={"label_channels": ["GM", "WM", "CSF"], "seed": 4},
    )
    path = save_volume(
        generated_volumes(result)[0], tmp_path / "brain.nii.gz"
    )  # no check in its sidecar: measured on opening
    entry = open_volume(qtbot, tissue_window, path)
    assert entry.tissue and tissue_window.state.shown is entry
    qtbot.waitUntil(
        lambda: "anatomy check: \u2713 within normative ranges" in _details(tissue_window), timeout=60_000
    )
    assert "brain " in _details(tissue_window) and "ventricles " in _details(tissue_window)
    assert tissue_window.session_panel.anatomy_record(entry)["status"] == "within"
