"""Tissue maps and template space in the Qt-free app core: from a result, to and from disk, and the colours."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.core.nifti_files import open_volume, tissue_files
from app.core.session import AppState
from app.core.tissue import (
    ALL_TISSUES,
    TISSUE_COLOURS,
    label_map,
    overlay_rgba,
    space_text,
    tissue_at,
)
from app.core.volumes import VolumeEntry
from engine.anatomy.partition import partition_error
from engine.nifti.io import save_volume
from engine.nifti.volume import Volume

NAMES = ("GM", "WM", "CSF", "ventricles")


def _result(batch=2, shape=(6, 7, 5), space="MNI152NLin2009aSym"):
    from engine.api import SamplingRequest, SamplingResult

    rng = np.random.default_rng(0)
    volumes = rng.random((batch, 1 + len(NAMES), *shape), dtype=np.float32) * 1.4 - 0.2
    return SamplingResult(
        volumes=volumes,
        affine=np.diag([2.0, 2.0, 2.0, 1.0]),
        request=SamplingRequest(seed=3),
        provenance={"model": {"id": "m"}, "seed": 3, "space": space, "label_channels": list(NAMES)},
    )


def test_add_result_keeps_each_images_tissue_maps_and_space():
    result = _result()
    state = AppState()
    entries = state.add_result(result)
    for index, entry in enumerate(entries):
        assert entry.data.shape == (6, 7, 5) and np.array_equal(entry.data, result.volumes[index, 0])
        assert entry.tissue_names == list(NAMES)
        # each image's own maps, made a partition (engine.anatomy.partition) from its decoded channels
        assert np.array_equal(entry.tissue["WM"], result.tissue_maps(index)["WM"])
        assert partition_error(entry.tissue) < 1e-6
        assert entry.space == "MNI152NLin2009aSym" and entry.space_name == "MNI152NLin2009aSym"
    text = entries[0].describe()
    assert "space MNI152NLin2009aSym" in text and "tissue maps: GM, WM, CSF, ventricles" in text


def test_a_volume_without_a_space_is_in_scanner_millimetres():
    entry = VolumeEntry(name="v", data=np.zeros((2, 2, 2), np.float32), affine=np.eye(4))
    assert entry.space is None and entry.space_name == "scanner" and not entry.tissue
    assert "space scanner" in entry.describe() and "tissue maps" not in entry.describe()
    named = VolumeEntry(name="v", data=entry.data, affine=np.eye(4), provenance={"space": "MNI152NLin6Asym"})
    assert named.space == "MNI152NLin6Asym"  # from the provenance when not given
    assert space_text(None, 4) == "MNI152 (sform code 4)" and space_text(None, 1) is None
    assert space_text("MNI152NLin2009aSym", 4) == "MNI152NLin2009aSym"


def test_overlay_state_falls_back_to_all_tissues_and_is_off_for_volumes_without_maps():
    state = AppState()
    events = []
    state.overlay_changed.connect(lambda: events.append(1))
    (entry,) = state.add_result(_result(batch=1))
    assert state.tissue_shown() is None  # off by default
    state.set_show_tissue(True)
    state.set_show_tissue(True)
    assert state.tissue_shown() == ALL_TISSUES and len(events) == 1
    state.set_tissue_choice("WM")
    assert state.tissue_shown() == "WM"
    state.set_tissue_choice("thalamus")  # a map this volume does not have
    assert state.tissue_shown() == ALL_TISSUES
    state.set_tissue_opacity(7)
    assert state.tissue_opacity == 1.0
    plain = VolumeEntry(name="plain", data=np.zeros((2, 2, 2), np.float32), affine=np.eye(4))
    state.add_volume(plain)
    assert state.tissue_shown() is None


def test_label_map_picks_the_most_likely_class_and_draws_the_ventricles_over_csf():
    planes = {
        "GM": np.array([[0.7, 0.1, 0.0, 0.1]]),
        "WM": np.array([[0.2, 0.8, 0.0, 0.1]]),
        "CSF": np.array([[0.1, 0.1, 0.9, 0.1]]),
        "ventricles": np.array([[0.0, 0.0, 0.8, 0.0]]),
    }
    # GM, WM, ventricles (inside CSF), background (the three classes leave 0.7 of the voxel)
    assert label_map(planes).tolist() == [[1, 2, 4, 0]]
    assert (
        tissue_at({k: v.reshape(1, 1, 4) for k, v in planes.items()}, (0, 0, 2), ALL_TISSUES)
        == "ventricles 0.80"
    )
    assert (
        tissue_at({k: v.reshape(1, 1, 4) for k, v in planes.items()}, (0, 0, 3), ALL_TISSUES) == "background"
    )
    assert tissue_at({k: v.reshape(1, 1, 4) for k, v in planes.items()}, (0, 0, 0), "WM") == "WM 0.20"

    rgba = overlay_rgba(planes, ALL_TISSUES, 1.0)
    assert tuple(rgba[0, 0, :3]) == TISSUE_COLOURS["GM"] and rgba[0, 0, 3] == 255
    assert tuple(rgba[0, 2, :3]) == TISSUE_COLOURS["ventricles"] and rgba[0, 3, 3] == 0
    half = overlay_rgba(planes, "WM", 0.5)  # one map: alpha = opacity x probability, premultiplied
    assert half[0, 1, 3] == round(0.8 * 0.5 * 255)
    assert np.allclose(half[0, 1, :3], np.array(TISSUE_COLOURS["WM"]) * 0.4, atol=1)
    assert not overlay_rgba(planes, "GM", 0.0).any()


def test_saved_maps_go_beside_the_image_and_open_with_it(tmp_path):
    import nibabel as nib

    result = _result(batch=1)
    (entry,) = AppState().add_result(result)
    path = save_volume(
        Volume(
            entry.data,
            entry.affine,
            tissue=entry.tissue,
            provenance={**entry.provenance, "tissue_maps": {"old": "stale.nii.gz"}},
            synthetic=True,
            space=entry.space,
        ),
        tmp_path / "sub-01_T1w.nii.gz",
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(
        ["sub-01_T1w.nii.gz", "sub-01_T1w.json", *(f"sub-01_label-{n}_probseg.nii.gz" for n in NAMES)]
    )
    record = json.loads((tmp_path / "sub-01_T1w.json").read_text())
    assert record["tissue_maps"] == {n: f"sub-01_label-{n}_probseg.nii.gz" for n in NAMES}
    for name in files:
        if name.endswith(".nii.gz"):
            assert int(nib.load(tmp_path / name).header["sform_code"]) == 4

    opened = open_volume(path)
    assert list(opened.tissue) == list(NAMES) and not opened.notes
    assert opened.space == "MNI152NLin2009aSym" and opened.synthetic
    assert all(np.allclose(opened.tissue[n], entry.tissue[n], atol=1e-6) for n in NAMES)
    # A map opened on its own is a volume without maps (its record lists its siblings, not its own maps).
    alone = open_volume(tmp_path / "sub-01_label-GM_probseg.nii.gz")
    assert not alone.tissue and alone.space == "MNI152NLin2009aSym"


def test_failed_save_leaves_no_file(tmp_path, monkeypatch):
    import engine.nifti.io
    from engine.errors import OutputError

    (entry,) = AppState().add_result(_result(batch=1))
    real, calls = engine.nifti.io.make_nifti, []

    def disk_full_at_the_third_map(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # the image, two maps, then the disk is full
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.nifti.io, "make_nifti", disk_full_at_the_third_map)
    with pytest.raises(OutputError, match="space"):
        save_volume(
            Volume(entry.data, entry.affine, tissue=entry.tissue, synthetic=True), tmp_path / "out.nii.gz"
        )
    assert list(tmp_path.iterdir()) == []


def test_tissue_files_come_from_the_provenance_and_never_from_another_folder(tmp_path):
    image = tmp_path / "a.nii.gz"
    image.write_bytes(b"")
    (tmp_path / "a_label-GM_probseg.nii.gz").write_bytes(b"")
    (tmp_path / "my-wm.nii.gz").write_bytes(b"")
    (tmp_path.parent / "outside.nii.gz").write_bytes(b"")
    listed = {"tissue_maps": {"WM": "my-wm.nii.gz", "CSF": "../outside.nii.gz", "GM": "/etc/passwd"}}
    assert tissue_files(image, listed) == {"WM": tmp_path / "my-wm.nii.gz"}
    # Without a list (or when none of it exists), the standard names beside the image.
    assert tissue_files(image, {}) == {"GM": tmp_path / "a_label-GM_probseg.nii.gz"}
    assert tissue_files(image, {"tissue_maps": {"GM": "gone.nii.gz"}}) == {
        "GM": tmp_path / "a_label-GM_probseg.nii.gz"
    }
    assert tissue_files(tmp_path / "notes.txt", {}) == {}
