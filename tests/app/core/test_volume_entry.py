"""The app's session entry wraps the engine's volume record (engine.nifti.volume.Volume) instead of copying it."""

import numpy as np

from engine.api import SamplingRequest, SamplingResult
from engine.nifti.volume import Volume


def test_the_session_entry_wraps_the_record_instead_of_copying_it():
    from app.core.volumes import VolumeEntry

    member = SamplingResult(
        np.ones((1, 2, 3, 4, 5), np.float32),
        np.eye(4),
        SamplingRequest(model="m"),
        {"label_channels": ["GM"], "space": "MNI152NLin2009aSym"},
    ).member(0)
    entry = VolumeEntry("brain", volume=member, kind="generated")
    assert entry.volume is member and entry.data is member.data and entry.tissue is member.tissue
    assert entry.space == "MNI152NLin2009aSym" and entry.synthetic and entry.needs_saving
    plain = VolumeEntry(
        name="v", data=np.zeros((2, 2, 2), np.float32), affine=np.eye(4), provenance={"space": "X"}
    )
    assert isinstance(plain.volume, Volume) and plain.space == "X" and plain.kind == "opened"
