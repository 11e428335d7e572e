"""The session panel's details end with the volume's anatomy check: measured in the background for a volume with
tissue maps (a generated one, a file opened with its maps), read from the sidecar when it carries one. The panel
is fed its session directly, or the files the viewer's File > Open reads (tests/app/viewer/rig.py), without the
main window."""

from __future__ import annotations

import numpy as np
import pytest

from tests.app.viewer.rig import add_tissue_volume, build_viewer

pytestmark = pytest.mark.render


def test_a_generated_volume_of_random_weights_reads_not_brain_like(qtbot):
    from app.core.session import AppState
    from app.panels.session_panel import SessionPanel

    state = AppState()
    panel = SessionPanel(state)
    qtbot.addWidget(panel)
    panel.show()
    add_tissue_volume(state)  # as a model of random weights makes it: its maps are noise
    # The check says so, with the evidence that decided it.
    qtbot.waitUntil(lambda: "anatomy check: \u2717 not brain-like: " in panel.details.text(), timeout=60_000)
    assert "tissue maps: GM, WM, CSF, ventricles" in panel.details.text()


@pytest.mark.slow
def test_an_opened_brain_with_its_maps_reads_within_the_ranges(qtbot, app_services, tmp_path):
    from engine.api import SamplingRequest, SamplingResult
    from engine.nifti.io import generated_volumes, save_volume
    from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels

    rig = build_viewer(qtbot, app_services)
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
    entry = rig.open(qtbot, path)
    assert entry.tissue and rig.state.shown is entry
    details = rig.session_panel.details
    qtbot.waitUntil(lambda: "anatomy check: \u2713 within normative ranges" in details.text(), timeout=60_000)
    assert "brain " in details.text() and "ventricles " in details.text()
    assert rig.session_panel.anatomy_record(entry)["status"] == "within"
