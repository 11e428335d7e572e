"""Fixtures for the vault tests: fast vaults, NIfTI files and DICOM series made on the fly."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.vault import Vault
from tests.core_dumps import record_core_dumps


@pytest.fixture(autouse=True)
def private_anchors(tmp_path, monkeypatch):
    """Each test its own anchor folder (what this computer last saw of each vault)."""
    folder = tmp_path / "anchors"
    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def core_dumps_recorded(monkeypatch):
    """In-process CLI runs record that they turned core dumps off instead of doing it to the test process
    (PR_SET_DUMPABLE and a hard RLIMIT_CORE of 0 cannot be undone); test_vault_privacy checks the real
    effect in a child process."""
    return record_core_dumps(monkeypatch)


@pytest.fixture
def vault(tmp_path) -> Vault:
    v = Vault.create(tmp_path / "vault", PASSPHRASE, kdf=FAST_KDF)
    yield v
    v.lock()


@pytest.fixture
def make_nifti(tmp_path):
    """Factory: write a NIfTI file and return (path, data, affine)."""

    def make(
        name: str = "scan.nii",
        shape=(6, 7, 5),
        dtype=np.int16,
        *,
        descrip: str = "",
        version: int = 1,
        extension: bytes | None = None,
        scale: tuple[float, float] | None = None,
        seed: int = 0,
        folder: Path | None = None,
    ):
        rng = np.random.default_rng(seed)
        data = (rng.random(shape) * 1000).astype(dtype)
        affine = np.array([[0.9, 0.1, 0, -40.5], [0, 1.1, 0.05, -60.25], [0.02, 0, 1.3, 12.0], [0, 0, 0, 1]])
        klass = nib.Nifti2Image if version == 2 else nib.Nifti1Image
        img = klass(data, affine)
        img.header["descrip"] = descrip.encode()
        if version == 1:
            img.header["aux_file"] = b"aux-Doe"
            img.header["intent_name"] = b"intentDoe"
            img.header["db_name"] = b"db-Doe"
        if extension is not None:
            img.header.extensions.append(nib.nifti1.Nifti1Extension(6, extension))  # 6 = comment
        if scale is not None:
            img.header.set_slope_inter(*scale)
        path = (folder or tmp_path) / name
        nib.save(img, path)
        return path, data, nib.load(path).affine  # as stored (float32 sform), not as given

    return make


def _rotation(a: float, b: float, c: float) -> np.ndarray:
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


@pytest.fixture
def make_series(tmp_path):
    """Factory: write a DICOM series derived from pydicom's bundled MR_small.dcm.

    Each slice k gets a marker pixel ``[row 0, col 0] = 1000 + k`` so tests can tell the slice order from
    the voxels. Returns (folder, files in slice order).
    """
    import pydicom
    from pydicom.data import get_testdata_file
    from pydicom.uid import generate_uid

    source = pydicom.dcmread(get_testdata_file("MR_small.dcm"))

    def make(
        folder_name: str = "series",
        n: int = 4,
        *,
        spacing: float = 2.5,
        angles: tuple[float, float, float] | None = None,
        positions: list | None = None,
        patient_name: str | None = None,
        series_uid: str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        edit=None,
    ):
        rng = random.Random(seed)
        folder = tmp_path / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        if angles is None:
            iop = [float(v) for v in source.ImageOrientationPatient]
        else:
            rot = _rotation(*angles)
            iop = [*rot[:, 0], *rot[:, 1]]
        iop = [float(f"{v:.6f}") for v in iop]
        normal = np.cross(iop[:3], iop[3:])
        ipp0 = np.array([float(v) for v in source.ImagePositionPatient])
        uid = series_uid or generate_uid()
        files = []
        for k in range(n):
            ds = copy.deepcopy(source)
            ds.ImageOrientationPatient = [f"{v:.6f}" for v in iop]
            pos = ipp0 + normal * spacing * k if positions is None else np.asarray(positions[k])
            ds.ImagePositionPatient = [f"{v:.4f}" for v in pos]
            ds.InstanceNumber = k + 1
            ds.SOPInstanceUID = generate_uid()
            ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
            ds.SeriesInstanceUID = uid
            if patient_name is not None:
                ds.PatientName = patient_name
            pixels = ds.pixel_array.copy()
            pixels[0, 0] = 1000 + k
            ds.PixelData = pixels.tobytes()
            if edit is not None:
                edit(ds, k)
            name = f"img{rng.random():.10f}.dcm" if shuffle else f"img{k:03d}.dcm"
            path = folder / name
            ds.save_as(path)
            files.append(path)
        return folder, files

    return make
