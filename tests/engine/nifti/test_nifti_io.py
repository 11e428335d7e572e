"""Reading NIfTI into RAS+ and writing atomically."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from nibabel.testing import data_path

from engine.errors import InvalidRequest
from engine.nifti.io import load_nifti, save_volume
from engine.nifti.volume import Volume


def test_load_reorients_to_ras(tmp_path):
    data = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    las = np.diag([-2.0, 2.0, 2.0, 1.0])  # x runs to the left
    nib.Nifti1Image(data, las).to_filename(str(tmp_path / "las.nii"))
    loaded = load_nifti(tmp_path / "las.nii")
    assert nib.aff2axcodes(loaded.affine) == ("R", "A", "S")
    assert np.array_equal(loaded.data, data[::-1])
    assert loaded.spacing == pytest.approx((2, 2, 2))
    assert not loaded.synthetic


def test_load_nibabel_example_4d_takes_first_volume():
    loaded = load_nifti(f"{data_path}/example4d.nii.gz")
    assert loaded.data.ndim == 3


def test_corrupt_and_missing_files_give_clear_errors(tmp_path):
    bad = tmp_path / "bad.nii.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InvalidRequest, match="bad.nii.gz"):
        load_nifti(bad)
    with pytest.raises(InvalidRequest, match="no file at"):
        load_nifti(tmp_path / "missing.nii")


def test_save_volume_round_trip_with_sidecar(tmp_path):
    volume = np.random.default_rng(0).random((8, 9, 10), dtype=np.float32)
    affine = np.diag([1.5, 1.5, 1.5, 1.0])
    save_volume(
        Volume(volume, affine, provenance={"synthetic": True, "seed": 1}, synthetic=True),
        tmp_path / "v.nii.gz",
    )
    loaded = load_nifti(tmp_path / "v.nii.gz")
    assert np.array_equal(loaded.data, volume)
    assert loaded.synthetic and loaded.provenance["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json", "v.nii.gz"]


def test_written_files_get_ordinary_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    save_volume(
        Volume(np.zeros((2, 2, 2), np.float32), np.eye(4), provenance={"seed": 1}), tmp_path / "p.nii.gz"
    )
    for name in ("p.nii.gz", "p.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask


def test_is_nifti_is_the_one_name_test():
    from pathlib import Path

    from engine.nifti.io import is_nifti

    assert is_nifti("a.nii") and is_nifti("/x/B.NII.GZ") and is_nifti(Path("c.nii.gz"))
    assert not is_nifti("a.nii.json") and not is_nifti("a.gz") and not is_nifti("nii")


def test_one_sidecar_format_for_results_and_volumes(tmp_path):
    """save_volume writes the one flat record; load_nifti reads it back."""
    import json

    from engine.nifti.io import provenance_sidecar, read_provenance

    record = {"synthetic": True, "seed": 3, "model": {"id": "m"}}
    assert json.loads(provenance_sidecar(record, file="v.nii.gz")) == {**record, "file": "v.nii.gz"}
    save_volume(
        Volume(np.zeros((3, 3, 3), np.float32), np.eye(4), provenance=record, synthetic=True),
        tmp_path / "v.nii.gz",
    )
    assert (tmp_path / "v.json").read_bytes() == provenance_sidecar(record)
    assert read_provenance(tmp_path / "v.nii.gz") == record


def test_4d_file_reports_its_time_points_and_reads_only_the_chosen_one(tmp_path):
    data = np.arange(4 * 5 * 6 * 3, dtype=np.int16).reshape(4, 5, 6, 3)
    nib.Nifti1Image(data, np.eye(4)).to_filename(str(tmp_path / "s.nii.gz"))
    first = load_nifti(tmp_path / "s.nii.gz")
    last = load_nifti(tmp_path / "s.nii.gz", time_index=2)
    assert first.time_points == last.time_points == 3
    assert np.array_equal(first.data, data[..., 0]) and np.array_equal(last.data, data[..., 2])
