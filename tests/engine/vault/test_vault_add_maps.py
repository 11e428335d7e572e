"""Tissue maps computed for an item already in the vault (a scan, a generated volume without maps) are kept with
it, encrypted, as the maps stored with a generated volume are; a write that fails part-way leaves the item as it
was."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.anatomy.segment import METHOD, TissueMaps
from engine.errors import Cancelled, InvalidRequest
from engine.nifti.volume import Volume
from engine.vault import Vault, item_index
from engine.vault.payload import PartWriter

SHAPE = (6, 7, 5)
NAMES = ("CSF", "GM", "WM", "brain")


def _maps(seed: int = 1):
    rng = np.random.default_rng(seed)
    maps = {name: rng.random(SHAPE).astype(np.float32) for name in NAMES}
    return maps, TissueMaps(maps=maps, contrast="t1w", means={"CSF": 1.0, "GM": 2.0, "WM": 3.0}).sidecar()


def _files(vault):
    return sorted(p.name for p in (vault.path / "blobs").iterdir())


def _record_bytes(vault, item_id):
    return {p.name: p.read_bytes() for p in (vault.path / "blobs").iterdir() if p.name.startswith(item_id)}


def test_maps_added_to_a_scan_are_encrypted_parts_of_it_and_say_how_made(vault, make_nifti, tmp_path):
    path, data, _ = make_nifti(shape=SHAPE)
    scan = vault.import_nifti(path, kind="scan", patient={"name": "Doe^Jane"})
    assert scan.tissue_maps == ()
    maps, made = _maps()
    info = vault.add_tissue_maps(scan.id[:8], maps, made)
    assert info.id == scan.id and info.kind == "scan" and set(info.tissue_maps) == set(NAMES)
    assert info.provenance["tissue_maps_made"]["method"] == METHOD
    assert info.provenance["tissue_maps_made"]["contrast"] == "t1w"
    for name in NAMES:  # encrypted: no map's bytes lie in the vault's files in the clear
        plain = maps[name].tobytes(order="F")[:64]
        assert not any(plain in f.read_bytes() for f in vault.path.rglob("*") if f.is_file()), name
    trail = vault.audit_trail()
    assert trail.ok and trail.entries[-1].event == "edit" and trail.entries[-1].item_id == scan.id
    report = vault.verify()
    assert report.ok and report.unreferenced == (), report
    # The scan leaves with its maps beside it (BIDS probseg names the app's Open finds), each read back as
    # stored, with no sidecar (a sidecar would mark the scan as generated), and the audit entry names them.
    stem = f"scan-{scan.id[:12]}"
    exported = vault.export(scan.id, tmp_path / "out").files
    assert [f.name for f in exported] == [f"{stem}.nii", *(f"{stem}_label-{n}_probseg.nii" for n in NAMES)]
    for name, file in zip(NAMES, exported[1:], strict=True):
        assert np.array_equal(np.asarray(nib.load(file).dataobj), maps[name]), name
    entry = vault.audit_trail().entries[-1]
    assert entry.event == "export" and entry.detail["tissue_maps"] == list(NAMES), entry
    assert entry.detail["folder"] == str((tmp_path / "out").absolute())
    # asked without: the image alone, and the audit entry says no maps left
    alone = vault.export(scan.id, tmp_path / "alone", include_tissue=False).files
    assert [f.name for f in alone] == [f"{stem}.nii"]
    assert "tissue_maps" not in vault.audit_trail().entries[-1].detail
    # de-identified, a plain .nii scan leaves as .nii.gz and its maps with it
    deid = vault.export(scan.id, tmp_path / "deid", deidentify=True).files
    assert [f.name for f in deid] == [f"{stem}.nii.gz", *(f"{stem}_label-{n}_probseg.nii.gz" for n in NAMES)]
    assert np.array_equal(np.asarray(nib.load(deid[1]).dataobj), maps[NAMES[0]])

    # Another process opening the vault sees them with the scan, which is unchanged.
    vault.lock()
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    opened = again.open_item(scan.id, with_tissue=True, as_float32=False)
    assert np.array_equal(np.asarray(opened.data), data)
    assert set(opened.tissue) == set(NAMES)
    for name in NAMES:
        assert np.array_equal(opened.tissue[name], maps[name]), name
    assert again.get(scan.id).patient == {"name": "Doe^Jane"}
    again.lock()


def test_an_item_with_maps_keeps_them_unless_asked_to_replace_them(vault, tmp_path):
    image = np.random.default_rng(2).random(SHAPE).astype(np.float32)
    first, made = _maps(3)
    item = vault.add_synthetic(Volume(image, np.eye(4), provenance={"seed": 2}, tissue=first))
    before = _files(vault)
    second, made = _maps(4)
    with pytest.raises(InvalidRequest, match="already has tissue maps"):
        vault.add_tissue_maps(item.id, second, made)
    assert _files(vault) == before and np.array_equal(vault.open_tissue(item.id)["GM"], first["GM"])

    info = vault.add_tissue_maps(item.id, second, made, replace=True)
    assert set(info.tissue_maps) == set(NAMES)
    assert np.array_equal(vault.open_tissue(item.id)["GM"], second["GM"])
    report = vault.verify()  # the replaced parts are gone, nothing is left unreferenced
    assert report.ok and report.unreferenced == (), report
    assert len(_files(vault)) == len(before)
    # Exported, each map says how it was made (the segmentation's record, not the model's).
    side = json.loads(vault.export(item.id, tmp_path / "out").files[-1].read_text())
    assert side["tissue_maps_made"]["method"] == METHOD and set(side["tissue_maps"]) == set(NAMES)


def test_maps_off_the_grid_or_without_how_made_are_refused_in_one_line(vault, make_nifti):
    path, _, _ = make_nifti(shape=SHAPE)
    scan = vault.import_nifti(path, kind="scan")
    maps, made = _maps()
    with pytest.raises(InvalidRequest, match=r"grid \(6, 7, 5\)") as off:
        vault.add_tissue_maps(scan.id, {"GM": np.zeros((6, 7, 4), np.float32)}, made)
    assert "\n" not in str(off.value)
    with pytest.raises(InvalidRequest, match="how the tissue maps were made"):
        vault.add_tissue_maps(scan.id, maps, {})
    assert vault.get(scan.id).tissue_maps == () and vault.verify().ok


def _fail_in_second_map(monkeypatch):
    """PartWriter.write raises a full disk in the middle of the second map."""
    real = PartWriter.write
    calls = {"n": 0}

    def write(self, data):
        if self.name == "tissue/GM":
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(PartWriter, "write", write)


def _fail_at_index(monkeypatch):
    """The index write (the commit point) fails after the parts, record files and audit entry are written."""

    def write_index_file(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(item_index, "write_index_file", write_index_file)


@pytest.mark.parametrize("fail", ["disk full in a map", "index write", "cancelled"])
def test_a_write_failing_midway_leaves_the_item_as_it_was(vault, make_nifti, monkeypatch, fail):
    path, data, _ = make_nifti(shape=SHAPE)
    scan = vault.import_nifti(path, kind="scan")
    files, records = _files(vault), _record_bytes(vault, scan.id)
    maps, made = _maps()
    progress = None
    if fail == "disk full in a map":
        _fail_in_second_map(monkeypatch)
    elif fail == "index write":
        _fail_at_index(monkeypatch)
    else:

        def progress(done, total):
            if done > total / 2:
                raise Cancelled("cancelled by the user")

    with pytest.raises((OSError, Cancelled)):
        vault.add_tissue_maps(scan.id, maps, made, progress=progress)
    monkeypatch.undo()

    # Nothing of the failed write is left, and the item reads as before, here and in a fresh unlock.
    assert _files(vault) == files
    assert vault.get(scan.id).tissue_maps == ()
    vault.lock()
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert again.get(scan.id).tissue_maps == () and "tissue_maps_made" not in (
        again.get(scan.id).provenance or {}
    )
    assert np.array_equal(np.asarray(again.open_item(scan.id, as_float32=False).data), data)
    report = again.verify()
    assert report.ok and report.unreferenced == (), report
    if fail != "index write":  # the index write failed after the new record files were put in place
        assert _record_bytes(again, scan.id) == records
    # And the same maps can be added afterwards.
    assert set(again.add_tissue_maps(scan.id, maps, made).tissue_maps) == set(NAMES)
    again.lock()


def test_a_copy_written_outside_the_vault_is_audited_with_its_files(vault, make_nifti, tmp_path):
    path, _, _ = make_nifti(shape=SHAPE)
    scan = vault.import_nifti(path, kind="scan", patient={"name": "Doe^Jane"})
    out = tmp_path / "copy" / "scan.nii.gz"
    vault.record_copy_out(scan.id[:8], "copy_out", [out], tissue_maps=["GM"], deidentified=False)
    vault.record_copy_out(scan.id, "screenshot", [tmp_path / "shot.png"], marked="patient data")
    copy, shot = vault.audit_trail().entries[-2:]
    assert (copy.event, copy.item_id) == ("copy_out", scan.id)
    assert copy.detail == {"files": [str(out.absolute())], "tissue_maps": ["GM"], "deidentified": False}
    assert shot.event == "screenshot" and shot.detail["marked"] == "patient data"
    with pytest.raises(InvalidRequest, match="unknown copy event"):
        vault.record_copy_out(scan.id, "export", [out])
    with pytest.raises(InvalidRequest, match="name the files"):
        vault.record_copy_out(scan.id, "copy_out", [])
    assert vault.audit_trail().ok
