"""The smaller findings of issue 24 (point 10): an overflowing intensity scaling, zero padding after a
.nii.gz, ``vault ls --json | head``, UIDs in DICOM errors, a damaged audit.head slot healed silently."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.errors import InvalidRequest
from engine.nifti.checks import inspect_nifti
from engine.nifti.io import load_nifti
from engine.vault import Vault


def test_a_scaling_that_overflows_float32_is_refused(vault, tmp_path):
    data = np.arange(60, dtype=np.int16).reshape(3, 4, 5)
    image = nib.Nifti1Image(data, np.eye(4))
    image.header.set_slope_inter(3e38, 0)
    path = tmp_path / "scaled.nii"
    nib.save(image, path)
    with pytest.raises(InvalidRequest, match="beyond float32"):
        inspect_nifti(path)
    with pytest.raises(InvalidRequest, match="beyond float32"):
        vault.import_nifti(path)
    image.header.set_slope_inter(2.5, -10)  # an ordinary scaling still reads
    nib.save(image, path)
    assert np.allclose(load_nifti(path).data.max(), 59 * 2.5 - 10)


def test_a_nii_gz_with_trailing_zero_padding_reads_like_gzip_reads_it(vault, tmp_path):
    data = np.random.default_rng(0).standard_normal((6, 7, 5)).astype(np.float32)
    path = tmp_path / "padded.nii.gz"
    nib.save(nib.Nifti1Image(data, np.eye(4)), path)
    with open(path, "ab") as fh:
        fh.write(b"\x00" * 4096)  # what some tape/block tools leave
    assert len(gzip.decompress(path.read_bytes())) > 0  # gzip readers accept it
    assert np.array_equal(load_nifti(path).data.shape, data.shape)
    info = vault.import_nifti(path)
    stored = vault.open_item(info.id, as_float32=False).data
    assert np.array_equal(np.asarray(stored), np.asarray(nib.load(path).dataobj))
    with open(path, "ab") as fh:
        fh.write(b"\x00garbage")  # padding followed by something that is not gzip is still refused
    with pytest.raises(InvalidRequest):
        load_nifti(path)


def test_vault_ls_json_into_a_closed_pipe_ends_quietly(vault, make_nifti, tmp_path):
    for n in range(3):
        vault.import_nifti(make_nifti(f"s{n}.nii", seed=n)[0])
    vault.lock()
    pw = tmp_path / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    read_end, write_end = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine",
            "vault",
            "ls",
            "--json",
            "--vault",
            str(vault.path),
            "--passphrase-file",
            str(pw),
        ],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(write_end)
    os.close(read_end)  # like `| head` that has already exited: nothing will read
    _out, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == 141


def test_dicom_pixel_errors_name_the_slice_not_its_uids(make_series):
    import pydicom

    from engine.vault import dicom

    folder, files = make_series(n=3)
    ds = pydicom.dcmread(files[1])
    raw = files[1].read_bytes()
    rows, cols = int(ds.Rows), int(ds.Columns)
    with pytest.raises(InvalidRequest) as caught:
        dicom.slice_voxels(
            raw, expected_sop_uid=str(ds.SOPInstanceUID), shape=(cols + 1, rows), label="slice 2 of 3"
        )
    message = str(caught.value)
    assert "slice 2 of 3" in message and str(ds.SOPInstanceUID) not in message
    ds.file_meta.TransferSyntaxUID = pydicom.uid.JPEG2000Lossless  # claims a compression it does not have
    ds.PixelData = pydicom.encaps.encapsulate([b"\xff\x4f\xff\x51 not a codestream"])
    broken = folder.parent / "broken.dcm"
    ds.save_as(broken, enforce_file_format=True)
    with pytest.raises(InvalidRequest) as caught:
        dicom.slice_voxels(
            broken.read_bytes(),
            expected_sop_uid=str(ds.SOPInstanceUID),
            shape=(cols, rows),
            label="slice 2 of 3",
        )
    assert "slice 2 of 3" in str(caught.value) and str(ds.SOPInstanceUID) not in str(caught.value)


def test_a_damaged_audit_head_slot_heals_with_a_note(vault):
    vault.lock()
    head = vault.path / "audit.head"
    raw = bytearray(head.read_bytes())
    raw[256 + 10] ^= 0x55  # the second of the two slots
    head.write_bytes(bytes(raw))
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert any("audit.head" in n and "rewritten" in n for n in again.notices)
    assert again.verify().ok  # healed
    again.lock()


def test_bytes_added_to_the_end_of_the_audit_log_are_cut_off_with_a_note(vault):
    vault.lock()
    with open(vault.path / "audit.log", "ab") as fh:
        fh.write(b"\x00" * 17)  # what a torn write leaves, or someone appending to the file
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert any("audit.log" in n and "17 byte(s)" in n for n in again.notices)
    assert again.verify().ok
    again.lock()
