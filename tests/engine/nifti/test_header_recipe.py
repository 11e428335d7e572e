"""One NIfTI header recipe (``engine.nifti.io.float32_header``) for the nibabel writer and the vault's streaming
writer, byte-compared with the headers each wrote before they shared it (``headers_before/``, written by the
two old recipes from the same volume and affine as below).

The nibabel writer's headers are unchanged to the byte. The vault's streamed header now has the same codes,
units and SYNTHETIC marks as the nibabel writer's: against its old bytes only the time unit (seconds) and a
synthetic volume's ``intent_name`` and ``aux_file`` marks differ; against the nibabel writer's header of the
same volume only what the caller gives (``descrip``: the vault keeps its longer text), the intensity range and
where the voxels start (the nibabel file carries extensions).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

from engine.nifti.io import make_nifti
from engine.vault import nifti as vault_nifti

BEFORE = Path(__file__).parent / "headers_before"
_T = np.deg2rad(10)  # a rotated grid: the qform keeps the rotation as a quaternion
AFFINE = np.array(
    [
        [1.5 * np.cos(_T), -1.5 * np.sin(_T), 0, -90.25],
        [1.5 * np.sin(_T), 1.5 * np.cos(_T), 0, -126.5],
        [0, 0, 2.0, -72.0],
        [0, 0, 0, 1],
    ]
)
DATA = np.linspace(-1.0, 3.0, 5 * 6 * 7, dtype=np.float32).reshape(5, 6, 7)
MNI = "MNI152NLin2009aSym"


def _written_header(image, tmp_path: Path, name: str) -> bytes:
    path = tmp_path / name
    image.to_filename(path)
    return path.read_bytes()[:348]


def _fields_that_differ(a: bytes, b: bytes) -> set[str]:
    """The header fields (NIfTI-1 names) whose bytes differ between two 348-byte header blocks."""
    dtype = nib.Nifti1Header().structarr.dtype
    return {
        name
        for name in dtype.names
        if a[dtype.fields[name][1] : dtype.fields[name][1] + dtype[name].itemsize]
        != b[dtype.fields[name][1] : dtype.fields[name][1] + dtype[name].itemsize]
    }


def test_the_nibabel_writer_writes_the_same_header_bytes_as_before(tmp_path):
    synthetic = make_nifti(DATA, AFFINE, synthetic=True, provenance={"seed": 7}, space=MNI)
    opened = make_nifti(DATA, AFFINE, synthetic=False, descrip="a scan's own words")
    assert (
        _written_header(synthetic, tmp_path, "s.nii") == (BEFORE / "nibabel_synthetic_mni.hdr").read_bytes()
    )
    assert _written_header(opened, tmp_path, "o.nii") == (BEFORE / "nibabel_opened.hdr").read_bytes()


def test_the_vault_streams_the_same_recipe_with_its_own_descrip(tmp_path):
    streamed = vault_nifti.stream_header(
        DATA.shape, AFFINE, vault_nifti.SYNTHETIC_DESCRIP, space=MNI, synthetic=True
    )
    before = (BEFORE / "vault_synthetic_mni.hdr").read_bytes()
    assert len(streamed) == len(before) == 352 and streamed[348:] == before[348:] == b"\0\0\0\0"
    # What changed: the time unit and the SYNTHETIC marks the nibabel writer always wrote.
    assert _fields_that_differ(streamed[:348], before[:348]) == {"xyzt_units", "intent_name", "aux_file"}
    header = nib.Nifti1Header(streamed[:348])
    assert header.get_xyzt_units() == ("mm", "sec")
    assert (header["intent_name"].item(), header["aux_file"].item()) == (b"SYNTHETIC", b"volsynth-synthetic")
    assert header["descrip"].item() == vault_nifti.SYNTHETIC_DESCRIP.encode()  # the vault's longer text, kept

    written = _written_header(make_nifti(DATA, AFFINE, synthetic=True, space=MNI), tmp_path, "s.nii")
    assert _fields_that_differ(streamed[:348], written) == {"descrip", "cal_min", "cal_max", "vox_offset"}

    dicom = vault_nifti.stream_header(DATA.shape, AFFINE, "VolSynth volume from a DICOM series")
    assert _fields_that_differ(dicom[:348], (BEFORE / "vault_dicom.hdr").read_bytes()[:348]) == {"xyzt_units"}
    assert _fields_that_differ(dicom[:348], streamed[:348]) == {
        "descrip",
        "intent_name",
        "aux_file",
        "sform_code",
    }
