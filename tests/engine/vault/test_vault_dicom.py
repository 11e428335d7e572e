"""DICOM series import: slice order, orientation, RAS affine, voxel values, original files kept."""

from __future__ import annotations

import hashlib
import warnings

import nibabel as nib
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from engine.errors import InvalidRequest
from engine.vault.dicom import scan_series


def _lps_position(ds, row: int, col: int) -> np.ndarray:
    """DICOM PS3.3 C.7.6.2.1.1, written out independently of the code under test."""
    iop = np.array([float(v) for v in ds.ImageOrientationPatient])
    ipp = np.array([float(v) for v in ds.ImagePositionPatient])
    row_spacing, col_spacing = (float(v) for v in ds.PixelSpacing)
    return ipp + col * col_spacing * iop[:3] + row * row_spacing * iop[3:]


def _check_geometry_and_voxels(opened, files):
    """Every slice sits where its ImagePositionPatient says, and holds its own pixels."""
    ras = np.diag([-1.0, -1.0, 1.0])
    for path in files:
        ds = pydicom.dcmread(path)
        pixels = ds.pixel_array.astype(np.float64) * float(ds.get("RescaleSlope", 1)) + float(
            ds.get("RescaleIntercept", 0)
        )
        # Which volume slice holds this file? The one whose (0, 0) voxel lies at its position.
        k_float = np.linalg.solve(
            opened.affine[:3, :3], ras @ _lps_position(ds, 0, 0) - opened.affine[:3, 3]
        )[2]
        k = int(round(k_float))
        assert abs(k_float - k) < 1e-4
        for row, col in [(0, 0), (5, 17), (ds.Rows - 1, 3), (ds.Rows - 1, ds.Columns - 1)]:
            voxel = opened.affine @ [col, row, k, 1]
            assert np.allclose(voxel[:3], ras @ _lps_position(ds, row, col), atol=1e-3)
        assert np.array_equal(opened.data[:, :, k], pixels.astype(np.float32).T)


@pytest.mark.parametrize(
    "angles, spacing, direction",
    [(None, 2.5, 1), ((0.3, -0.2, 0.5), 3.1, 1), ((0.0, 0.4, -0.7), 1.7, -1)],
    ids=["axial", "oblique", "oblique-reversed"],
)
def test_series_geometry_and_voxels(vault, make_series, angles, spacing, direction):
    folder, files = make_series(n=5, angles=angles, spacing=direction * spacing)
    info = vault.import_dicom(folder)
    assert info.shape == (64, 64, 5) and info.source == "dicom" and info.dicom_files == 5
    opened = vault.open_item(info.id)
    assert opened.data.dtype == np.float32
    _check_geometry_and_voxels(opened, files)
    # slices are ordered along the normal: the marker pixel (1000 + k) increases with k for a forward
    # series and decreases for a reversed one
    markers = opened.data[0, 0, :]
    assert list(markers) == sorted(markers, reverse=direction < 0)
    assert np.isclose(abs(np.linalg.det(opened.affine[:3, :3])), 0.3125 * 0.3125 * spacing, rtol=1e-4)


def test_axial_series_is_lps_on_disk_and_ras_in_nifti(vault, make_series, tmp_path):
    folder, _ = make_series(n=3)
    info = vault.import_dicom(folder)
    assert nib.aff2axcodes(np.array(info.affine)) == ("L", "P", "S")
    exported = nib.load(vault.export(info.id, tmp_path / "out", include_dicom=False).files[0])
    assert np.allclose(exported.affine, np.array(info.affine), atol=1e-4)
    assert np.array_equal(exported.get_fdata(dtype=np.float32), vault.open_item(info.id).data)


def test_in_plane_axes_agree_with_nibabel_dicom_reader(vault):
    path = get_testdata_file("MR_small.dcm")
    info = vault.import_dicom(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nibabel calls its DICOM readers experimental
        from nibabel.nicom import dicomwrappers

        wrapper = dicomwrappers.wrapper_from_data(pydicom.dcmread(path))
        nib_lps = wrapper.affine  # nibabel indexes (row, column): its columns 0/1 are our 1/0
    ours_lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ np.array(info.affine)
    assert np.allclose(ours_lps[:3, 0], nib_lps[:3, 1])
    assert np.allclose(ours_lps[:3, 1], nib_lps[:3, 0])
    assert np.allclose(ours_lps[:3, 3], nib_lps[:3, 3])


def test_round_trip_keeps_original_files_and_metadata(vault, make_series, tmp_path):
    folder, files = make_series(n=4, patient_name="Quux^Zebulon")
    info = vault.import_dicom(folder, label="knee")
    first = pydicom.dcmread(files[0])
    assert info.patient == {"name": "Quux^Zebulon", "id": str(first.PatientID), "sex": str(first.PatientSex)}
    assert info.study["modality"] == "MR" and info.study["date"] == str(first.StudyDate)
    assert info.study["series_instance_uid"] == str(first.SeriesInstanceUID)
    assert info.label == "knee" and info.kind == "scan"
    result = vault.export(info.id, tmp_path / "out")
    nii, *dicoms = result.files
    assert nii.name.endswith(".nii") and len(dicoms) == 4
    by_slice = {
        int(pydicom.dcmread(p).InstanceNumber): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }
    exported = [hashlib.sha256(p.read_bytes()).hexdigest() for p in dicoms]
    assert exported == [by_slice[k] for k in (1, 2, 3, 4)]  # byte-identical, in slice order


def test_single_ct_slice_with_rescale(vault):
    path = get_testdata_file("CT_small.dcm")
    ds = pydicom.dcmread(path)
    info = vault.import_dicom(path)
    opened = vault.open_item(info.id)
    assert info.shape == (128, 128, 1)
    expected = (ds.pixel_array.astype(np.float64) * 1 - 1024).astype(np.float32).T
    assert np.array_equal(opened.data[:, :, 0], expected)
    assert np.isclose(opened.affine[2, 2], float(ds.SliceThickness))
    _check_geometry_and_voxels(opened, [path])


def test_list_of_files_and_series_choice(vault, make_series, tmp_path):
    folder, files = make_series("mixed", n=3, series_uid="1.2.3.4.5.1")
    make_series("mixed", n=2, series_uid="1.2.3.4.5.2", seed=1)
    (folder / "notes.txt").write_text("not dicom")
    with pytest.raises(InvalidRequest, match="2 series.*1.2.3.4.5.1.*1.2.3.4.5.2"):
        vault.import_dicom(folder)
    assert vault.import_dicom(folder, series_uid="1.2.3.4.5.2").shape[2] == 2
    assert vault.import_dicom(files).shape[2] == 3


def test_series_that_do_not_form_a_volume_are_refused(make_series, tmp_path):
    base = np.array([-83.9063, -91.2, 6.6406])
    folder, _ = make_series(
        "uneven", n=4, positions=[base, base + [0, 0, 2], base + [0, 0, 4], base + [0, 0, 9]]
    )
    with pytest.raises(InvalidRequest, match="unevenly spaced"):
        scan_series(folder)
    folder, _ = make_series("dup", n=3, positions=[base, base, base + [0, 0, 2]])
    with pytest.raises(InvalidRequest, match="same position"):
        scan_series(folder)

    def tilt_one(ds, k):
        if k == 1:
            ds.ImageOrientationPatient = ["1", "0", "0", "0", "0.9", "0.43589"]

    folder, _ = make_series("tilted", n=3, edit=tilt_one)
    with pytest.raises(InvalidRequest, match="different orientation"):
        scan_series(folder)

    def multiframe(ds, k):
        ds.NumberOfFrames = 2

    folder, _ = make_series("multi", n=1, edit=multiframe)
    with pytest.raises(InvalidRequest, match="multi-frame"):
        scan_series(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("x")
    with pytest.raises(InvalidRequest, match="no DICOM image"):
        scan_series(empty)
    with pytest.raises(InvalidRequest, match="no such"):
        scan_series(tmp_path / "missing")
