"""A NIfTI whose header extension sizes do not add up is refused at import (issue 37 point 9).

NIfTI-1 extensions are ``esize``-byte records, ``esize`` a multiple of 16, chained from byte 352 to the
data offset (``vox_offset``). nibabel reads a chain that stops short of the offset, or an esize of 20,
without complaint; VolSynth used to import such files.
"""

from __future__ import annotations

import gzip
import struct

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.cli import main
from engine.errors import InvalidRequest
from engine.nifti.checks import inspect_nifti
from engine.vault import Vault


def _nifti_bytes(extensions: bytes, vox_offset: int | None = None) -> bytes:
    volume = np.arange(6 * 7 * 5, dtype=np.float32).reshape(6, 7, 5)
    header = nib.Nifti1Image(volume, np.eye(4)).header.copy()
    offset = 352 + len(extensions) if vox_offset is None else vox_offset
    header["vox_offset"] = offset
    head = header.binaryblock + b"\x01\x00\x00\x00" + extensions  # extender byte 1: extensions follow
    head = head[:offset].ljust(offset, b"\x00")
    return head + volume.tobytes(order="F")


def _extension(esize: int, ecode: int = 6) -> bytes:
    return struct.pack("<ii", esize, ecode) + b"c" * (esize - 8)


# name -> (file bytes, what the one-line refusal says)
BOGUS = {
    "esize-not-a-multiple-of-16": (_nifti_bytes(_extension(20)), "bogus header extension size .esize 20 at"),
    "chain-stops-8-bytes-short": (
        _nifti_bytes(_extension(32), vox_offset=352 + 40),
        "bogus header extension chain: 8 bytes at byte 384 belong to no extension",
    ),
    "chain-stops-3-bytes-short": (
        _nifti_bytes(_extension(32), vox_offset=352 + 35),
        "3 bytes at byte 384 belong to no extension",
    ),
    "two-extensions-second-odd": (
        _nifti_bytes(_extension(32) + _extension(24)),
        "esize 24 at byte 384",
    ),
}


@pytest.mark.parametrize("case", sorted(BOGUS))
@pytest.mark.parametrize("compressed", [False, True], ids=["nii", "nii.gz"])
def test_bogus_extension_sizes_are_refused_before_reading(case, compressed, tmp_path):
    raw, message = BOGUS[case]
    path = tmp_path / f"{case}.nii{'.gz' if compressed else ''}"
    path.write_bytes(gzip.compress(raw) if compressed else raw)
    with pytest.raises(InvalidRequest, match=message) as refused:
        inspect_nifti(path)
    assert "\n" not in str(refused.value)


def test_a_well_formed_chain_still_imports(tmp_path):
    path = tmp_path / "good.nii"
    path.write_bytes(_nifti_bytes(_extension(32) + _extension(48)))
    assert inspect_nifti(path).vox_offset == 352 + 80
    assert nib.load(path).header.extensions[1].get_sizeondisk() == 48


def test_vault_import_refuses_it_in_one_line_and_stores_nothing(tmp_path, capsys):
    vault_path = tmp_path / "vault"
    Vault.create(vault_path, PASSPHRASE, kdf=FAST_KDF).lock()
    passphrase = tmp_path / "pw.txt"
    passphrase.write_text(PASSPHRASE + "\n")
    path = tmp_path / "scan.nii.gz"
    path.write_bytes(gzip.compress(BOGUS["esize-not-a-multiple-of-16"][0]))
    rc = main(
        ["vault", "import", str(path), "--vault", str(vault_path), "--passphrase-file", str(passphrase)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "bogus header extension size" in err
    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    try:
        assert vault.items() == []
    finally:
        vault.lock()
