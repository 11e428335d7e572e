"""No plaintext on disk: after imports, nothing in the vault folder or a temporary folder holds PHI."""

from __future__ import annotations

import os
import tempfile

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.errors import VaultLocked
from engine.nifti.volume import Volume
from engine.vault import Vault

NAME = "Quuxley^Zebediah"
MARKER = b"PLAINTEXT-MARKER-7F3A9C"


def _all_files(*folders):
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                yield os.path.join(root, name)


@pytest.mark.slow
def test_no_plaintext_in_vault_or_temporary_folders(tmp_path, monkeypatch, make_series):
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(systmp))
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))

    # A NIfTI whose voxel bytes spell the marker, with the name in its header and extensions.
    voxels = np.frombuffer(MARKER * 200, dtype=np.uint8)[: 8 * 9 * 60].reshape(8, 9, 60)
    img = nib.Nifti1Image(voxels.copy(), np.eye(4))
    img.header["descrip"] = NAME.encode()
    img.header.extensions.append(nib.nifti1.Nifti1Extension(6, MARKER + NAME.encode()))
    plain = tmp_path / "src" / "marker.nii"
    plain.parent.mkdir()
    nib.save(img, plain)
    gz = tmp_path / "src" / "marker.nii.gz"
    nib.save(img, gz)
    folder, _ = make_series(n=3, patient_name=NAME)

    vault = Vault.create(tmp_path / "vault", PASSPHRASE, kdf=FAST_KDF)
    vault.import_nifti(plain, patient={"name": NAME}, study={"description": MARKER.decode()})
    # The same voxels as .nii.gz: the same volume to the duplicate check, stored again on purpose here.
    vault.import_nifti(gz, patient={"name": NAME}, label=NAME, allow_duplicate=True)
    series = vault.import_dicom(folder)
    vault.add_synthetic(
        Volume(np.zeros((4, 4, 4)), np.eye(4), provenance={"note": MARKER.decode(), "operator": NAME})
    )
    opened = vault.open_item(series.id)  # a view decrypts into memory only
    vault.verify()
    vault.lock()
    with pytest.raises(VaultLocked):
        Vault(vault.path).unlock("wrong passphrase here")  # a failed unlock writes a record too
    assert MARKER in plain.read_bytes()  # the markers really are in the inputs
    assert opened.data.size > 0

    needles = [MARKER, NAME.encode(), NAME.encode("utf-16-le"), b"Quuxley", b"Zebediah"]
    checked = 0
    for path in _all_files(vault.path, systmp):
        assert "quuxley" not in path.lower() and "marker" not in os.path.relpath(path, tmp_path).lower()
        with open(path, "rb") as fh:
            data = fh.read()
        for needle in needles:
            assert needle not in data, f"{needle!r} in {path}"
        checked += 1
    assert checked >= 8  # header, index, audit files and one payload per volume and DICOM file
    assert not any(n.startswith(".tmp-") for n in os.listdir(vault.path))
    assert list(_all_files(systmp)) == []  # nothing was spilled to the temporary folder at all
