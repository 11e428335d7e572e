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


def test_save_writes_the_entrys_record_and_copies_it_only_to_add_what_it_lacks(tmp_path):
    from app.core.volumes import VolumeEntry, saved_volume

    member = SamplingResult(
        np.ones((1, 2, 3, 4, 5), np.float32),
        np.eye(4),
        SamplingRequest(model="m"),
        {"synthetic": True, "seed": 3},
    ).member(0)
    generated = VolumeEntry("brain", volume=member, kind="generated")
    assert saved_volume(generated) is member  # nothing rebuilt from fields: the record itself is written

    maps = {"CSF": np.zeros((2, 2, 2), np.float32), "GM": np.ones((2, 2, 2), np.float32)}
    opened = VolumeEntry(
        "scan",
        data=np.zeros((2, 2, 2), np.float32),
        affine=np.eye(4),
        path=tmp_path / "scan.nii",
        tissue=maps,
    )
    written = saved_volume(opened)
    assert written.data is opened.data and written.affine is opened.affine and written.path == opened.path
    assert written.provenance == {"source": str(tmp_path / "scan.nii"), "synthetic": False}
    assert (
        list(written.tissue) == ["GM", "CSF"] and opened.provenance == {}
    )  # display order; the entry unchanged
