"""One engine volume record (engine.nifti.volume.Volume): the NIfTI reader, the vault's open and a sampling
result's batch members all hand out the same type, and the app's session entry wraps it."""

import numpy as np

from engine.api import SamplingRequest, SamplingResult
from engine.nifti.io import load_nifti, save_volume
from engine.nifti.volume import Volume


def _result() -> SamplingResult:
    rng = np.random.default_rng(0)
    volumes = rng.random((2, 3, 4, 5, 6), dtype=np.float32) * 1.4 - 0.2  # image + GM + WM, maps off [0, 1]
    provenance = {"label_channels": ["GM", "WM"], "space": "MNI152NLin2009aSym", "seed": 7}
    return SamplingResult(volumes, np.diag([2.0, 2.0, 2.0, 1.0]), SamplingRequest(model="m"), provenance)


def test_a_result_hands_out_each_batch_member_as_the_record():
    result = _result()
    member = result.member(1)
    assert isinstance(member, Volume) and member.synthetic and member.space == "MNI152NLin2009aSym"
    assert np.array_equal(member.data, result.volume(1)) and member.data.shape == (4, 5, 6)
    assert list(member.tissue) == ["GM", "WM"]
    assert all(np.array_equal(member.tissue[n], result.tissue_maps(1)[n]) for n in member.tissue)
    assert member.provenance["batch_index"] == 1 and "batch_index" not in result.provenance
    assert member.spacing == (2.0, 2.0, 2.0) and np.array_equal(member.affine, result.affine)


def test_the_reader_returns_the_record(tmp_path):
    path = save_volume(
        Volume(np.ones((4, 5, 6), np.float32), np.eye(4), provenance={"seed": 1}), tmp_path / "a.nii.gz"
    )
    loaded = load_nifti(path)
    assert isinstance(loaded, Volume) and loaded.path == path and loaded.info is None
    assert loaded.provenance["seed"] == 1 and loaded.time_points == 1 and loaded.tissue == {}


def test_the_vault_open_returns_the_record_with_its_item_info(tmp_path):
    from engine.vault import OpenedVolume
    from engine.vault.records import ItemInfo, opened_volume

    assert OpenedVolume is Volume
    info = ItemInfo(
        id="0" * 32,
        kind="synthetic",
        label="brain",
        created="2026-01-01T00:00:00Z",
        source="array",
        patient={},
        study={},
        provenance={"space": "MNI152NLin2009aSym", "seed": 2},
        shape=(2, 2, 2),
        dtype="float32",
        affine=tuple(tuple(r) for r in np.eye(4).tolist()),
        compressed=True,
        size_bytes=32,
        dicom_files=0,
        original_name="",
    )
    opened = opened_volume(np.zeros((2, 2, 2), np.float32), np.eye(4), info, {})
    assert isinstance(opened, Volume) and opened.info is info and opened.synthetic
    assert opened.space == "MNI152NLin2009aSym" and opened.provenance == {
        "space": "MNI152NLin2009aSym",
        "seed": 2,
    }
    assert opened.description == "brain"
