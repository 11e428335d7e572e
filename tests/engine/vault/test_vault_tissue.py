"""Tissue maps decoded with a generated image stay with it in the vault: stored encrypted as parts of the
same item, authenticated, read back, exported beside the image (BIDS ``_label-<name>_probseg``) and
deleted with it; items without maps are stored exactly as before."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.api import SamplingRequest, SamplingResult
from engine.errors import InvalidRequest, VaultCorrupted
from engine.nifti.io import (
    generated_volumes,
    load_nifti,
    read_provenance,
    save_volume,
    sidecar_path,
    tissue_path,
)
from engine.nifti.volume import Volume
from engine.vault import Vault, nifti
from engine.vault.item_index import find_record
from engine.vault.payload import iter_part

NAMES = ("GM", "WM", "CSF", "ventricles")
SPACE = "MNI152NLin2009aSym"
SHAPE = (6, 7, 5)
AFFINE = np.array([[2.0, 0, 0, -78], [0, 2.0, 0, -116], [0, 0, 2.0, -70], [0, 0, 0, 1]])


def _generated(seed: int = 0, *, space: str | None = SPACE):
    """An image and its tissue maps as SamplingResult gives them, and a provenance naming them."""
    rng = np.random.default_rng(seed)
    image = rng.random(SHAPE).astype(np.float32)
    maps = {name: rng.random(SHAPE).astype(np.float32) for name in NAMES}
    provenance = {"model_id": "brain-t1-demo", "seed": seed, "label_channels": list(NAMES), "synthetic": True}
    if space:
        provenance["space"] = space
    return image, maps, provenance


def _blob(vault: Vault, item_id: str, part_name: str):
    rec = find_record(vault.state, item_id)
    part = next(p for p in rec["parts"] if p["name"] == part_name)
    return vault.path / "blobs" / f"{part['blob']}.vsb"


def test_maps_round_trip_through_lock_unlock_and_export(vault, tmp_path):
    image, maps, provenance = _generated()
    info = vault.add_synthetic(Volume(image, AFFINE, provenance=provenance, tissue=maps))
    assert info.tissue_maps == NAMES and info.kind == "synthetic"
    assert info.size_bytes == 5 * (352 + 4 * image.size)
    vault.lock()

    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    try:
        assert again.get(info.id).tissue_maps == NAMES
        plain = again.open_item(info.id)
        assert plain.tissue == {} and np.array_equal(plain.data, image)
        opened = again.open_item(info.id, with_tissue=True)
        assert list(opened.tissue) == list(NAMES)
        for name in NAMES:
            assert opened.tissue[name].dtype == np.float32
            assert np.array_equal(opened.tissue[name], maps[name]), name
        assert list(again.open_tissue(info.id, ["CSF"])) == ["CSF"]
        views = [e for e in again.audit_trail().entries if e.event == "view"]
        assert views[-2].detail.get("tissue") == list(NAMES) and views[-1].detail.get("tissue") == ["CSF"]

        result = again.export(info.id, tmp_path / "out")
        stem = f"synthetic-{info.id[:12]}"
        image_path = tmp_path / "out" / f"{stem}.nii.gz"
        map_paths = [tissue_path(image_path, name) for name in NAMES]
        assert result.files == (image_path, *map_paths, sidecar_path(image_path))
        assert map_paths[0].name == f"{stem}_label-GM_probseg.nii.gz"
        side = json.loads(sidecar_path(image_path).read_text())
        assert side["tissue_maps"] == {name: p.name for name, p in zip(NAMES, map_paths, strict=True)}
        assert side["space"] == SPACE and side["synthetic"] is True
        for path, expected in [(image_path, image), *zip(map_paths, (maps[n] for n in NAMES), strict=True)]:
            img = nib.load(path)
            assert int(img.header["sform_code"]) == 4 and int(img.header["qform_code"]) == 1, path.name
            assert np.allclose(img.affine, AFFINE)
            assert np.array_equal(np.asarray(img.dataobj), expected), path.name
            assert load_nifti(path).synthetic
        record = read_provenance(map_paths[1], nib.load(map_paths[1]).header)
        assert record["tissue_map"] == "WM" and record["image"] == image_path.name
        report = again.verify()
        assert report.ok and report.bytes_checked == info.size_bytes
    finally:
        again.lock()


def test_items_without_maps_are_stored_exactly_as_before(vault, tmp_path):
    image, _, provenance = _generated(1, space=None)
    info = vault.add_synthetic(Volume(image, AFFINE, provenance=provenance))
    assert info.tissue_maps == ()
    rec = find_record(vault.state, info.id)
    assert [p["name"] for p in rec["parts"]] == ["volume"]
    stored = b"".join(iter_part(vault.state, rec, rec["parts"][0]))
    # the header every synthetic item gets (engine.nifti.io.float32_header), and nothing of tissue maps
    assert stored[:352] == nifti.stream_header(SHAPE, AFFINE, nifti.SYNTHETIC_DESCRIP, synthetic=True)
    assert vault.open_tissue(info.id) == {} and vault.open_item(info.id, with_tissue=True).tissue == {}
    with pytest.raises(InvalidRequest, match=r"has no tissue map 'GM' \(its tissue maps: none\)"):
        vault.open_tissue(info.id, ["GM"])
    result = vault.export(info.id, tmp_path / "out")
    assert [p.suffix for p in result.files] == [".gz", ".json"]
    assert int(nib.load(result.files[0]).header["sform_code"]) == 1  # no space named: scanner, as before
    assert "tissue_maps" not in json.loads(result.files[-1].read_text())


def test_the_sform_code_follows_the_space_without_maps(vault, tmp_path):
    image, _, provenance = _generated(2)
    info = vault.add_synthetic(Volume(image, AFFINE, provenance=provenance))
    header = nib.load(vault.export(info.id, tmp_path / "out").files[0]).header
    assert (int(header["sform_code"]), int(header["qform_code"])) == (4, 1)


def test_a_tampered_or_swapped_map_is_caught_and_delete_removes_the_maps(vault, tmp_path):
    image, maps, provenance = _generated(3)
    info = vault.add_synthetic(Volume(image, AFFINE, provenance=provenance, tissue=maps))
    other_image, other_maps, other_provenance = _generated(4)
    other = vault.add_synthetic(Volume(other_image, AFFINE, provenance=other_provenance, tissue=other_maps))
    gm = _blob(vault, info.id, "tissue/GM")
    raw = bytearray(gm.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    gm.write_bytes(bytes(raw))
    report = vault.verify()
    assert not report.ok
    assert report.problems == (
        f"item {info.id} is corrupted: its tissue map GM failed authentication "
        "(modified, damaged or swapped); no data was returned",
    )
    assert report.items_checked == 1  # the other item
    with pytest.raises(VaultCorrupted, match="tissue map GM"):
        vault.open_tissue(info.id)
    with pytest.raises(VaultCorrupted, match="tissue map GM"):
        vault.open_item(info.id, with_tissue=True)
    assert np.array_equal(vault.open_tissue(info.id, ["WM"])["WM"], maps["WM"])  # the others are intact
    with pytest.raises(VaultCorrupted):
        vault.export(info.id, tmp_path / "out")
    assert not any(p.name.endswith((".nii.gz", ".json")) for p in (tmp_path / "out").iterdir())

    # Two maps of one item swapped: each fails (a part's key context names the part).
    wm, csf = _blob(vault, other.id, "tissue/WM"), _blob(vault, other.id, "tissue/CSF")
    a, b = wm.read_bytes(), csf.read_bytes()
    wm.write_bytes(b)
    csf.write_bytes(a)
    problems = vault.verify([other.id]).problems
    assert len(problems) == 1 and "tissue map WM failed authentication" in problems[0]
    with pytest.raises(VaultCorrupted, match="tissue map CSF"):
        vault.open_tissue(other.id, ["CSF"])

    blobs = {p.name for p in (vault.path / "blobs").iterdir()}
    parts = {f"{p['blob']}.vsb" for p in find_record(vault.state, info.id)["parts"]}
    assert len(parts) == 5 and parts <= blobs
    vault.delete(info.id)
    assert not parts & {p.name for p in (vault.path / "blobs").iterdir()}
    assert [i.id for i in vault.items()] == [other.id]


def test_bad_maps_are_refused_and_nothing_is_stored(vault):
    image, maps, provenance = _generated(5)
    bad = [
        ({"GM": maps["GM"][:-1]}, "must be a real-valued array of the volume's grid"),
        ({"G M": maps["GM"]}, "letters and digits"),
        ({"../GM": maps["GM"]}, "letters and digits"),
        ({"GM": maps["GM"].astype(np.complex64)}, "real-valued"),
        ([maps["GM"]], "mapping of name -> array"),
    ]
    for tissue, message in bad:
        with pytest.raises(InvalidRequest, match=message):
            vault.add_synthetic(Volume(image, AFFINE, provenance=provenance, tissue=tissue))
    assert vault.items() == [] and not list((vault.path / "blobs").iterdir())


def _saved(tmp_path, seed: int = 6):
    """Files as ``volsynth generate`` writes them: image, sidecar and the four probseg maps (the decoded
    channels made a partition); returns the path, the image and the maps as written."""
    image, maps, provenance = _generated(seed)
    volumes = np.stack([image, *(maps[n] for n in NAMES)])[None]
    result = SamplingResult(volumes=volumes, affine=AFFINE, request=SamplingRequest(), provenance=provenance)
    volume = generated_volumes(result)[0]
    path = save_volume(volume, tmp_path / "gen_T1w.nii.gz")
    return path, image, volume.tissue


def test_a_generated_file_is_imported_with_its_maps(vault, tmp_path):
    path, image, maps = _saved(tmp_path)
    assert tissue_path(path, "GM").name == "gen_label-GM_probseg.nii.gz"
    info = vault.import_nifti(path)
    assert info.kind == "synthetic" and info.tissue_maps == NAMES
    assert vault.notices == []
    got = vault.open_tissue(info.id)
    for name in NAMES:
        assert np.array_equal(got[name], maps[name]), name
    assert vault.verify().ok
    out = vault.export(info.id, tmp_path / "out")
    side = json.loads(out.files[-1].read_text())
    stem = f"synthetic-{info.id[:12]}"
    assert side["tissue_maps"] == {n: f"{stem}_label-{n}_probseg.nii.gz" for n in NAMES}
    for name in NAMES:
        exported = nib.load(tmp_path / "out" / side["tissue_maps"][name])
        assert int(exported.header["sform_code"]) == 4
        assert np.array_equal(np.asarray(exported.dataobj), maps[name])


def test_a_missing_map_is_left_out_with_a_notice(vault, tmp_path, capsys):
    from engine.cli import main

    path, _, _ = _saved(tmp_path)
    tissue_path(path, "CSF").unlink()
    info = vault.import_nifti(path)
    assert info.tissue_maps == ("GM", "WM", "ventricles")
    assert vault.notices == [
        "tissue map CSF of gen_T1w.nii.gz was not imported: gen_label-CSF_probseg.nii.gz is not beside "
        "gen_T1w.nii.gz"
    ]
    vault.delete(info.id)
    vault.lock()
    pw = tmp_path / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    argv = ["vault", "import", str(path), "--vault", str(vault.path), "--passphrase-file", str(pw)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "tissue maps GM WM ventricles)" in out
    assert "volsynth: warning: tissue map CSF of gen_T1w.nii.gz was not imported" in err
    vault.unlock(PASSPHRASE)


def test_a_vault_made_before_maps_opens_and_reads(tmp_path):
    """Items stored with the format as it was (no tissue parts, no new index fields) open unchanged."""
    vault = Vault.create(tmp_path / "v", PASSPHRASE, kdf=FAST_KDF)
    image, _, provenance = _generated(7, space=None)
    item = vault.add_synthetic(Volume(image, AFFINE, provenance=provenance))
    rec = find_record(vault.state, item.id)
    assert set(rec) == {
        "id", "kind", "label", "source", "original_name", "patient", "study", "provenance", "volume",
        "created", "parts",
    }  # fmt: skip
    assert set(rec["parts"][0]) == {"name", "blob", "size", "ct_size", "sha256"}
    vault.lock()
    vault.unlock(PASSPHRASE)
    assert vault.get(item.id).tissue_maps == ()
    assert np.array_equal(vault.open_item(item.id).data, image)
    vault.lock()
