"""Tissue maps made by segmentation (``generate --tissue-maps``, segmented cohorts) stay with their image in the
vault as the shipped model's decoded maps do: encrypted parts of the same item, and exported with records that
say how they were made."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np

from engine.anatomy.segment import METHOD, TissueMaps
from engine.api import SamplingRequest, SamplingResult
from engine.nifti.io import generated_volumes, read_provenance, save_volume, tissue_path
from engine.nifti.volume import Volume

NAMES = ("CSF", "GM", "WM", "brain")
SHAPE = (6, 7, 5)
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def _made():
    """Maps and their how-made record as ``maps_or_reason`` gives them (the arrays themselves do not matter)."""
    rng = np.random.default_rng(3)
    maps = {name: rng.random(SHAPE).astype(np.float32) for name in NAMES}
    return maps, TissueMaps(maps=maps, contrast="t2w", means={}).sidecar()


def _exported_map_records(vault, item_id, out):
    side = json.loads(vault.export(item_id, out).files[-1].read_text())
    records = {}
    for name, file in side["tissue_maps"].items():
        path = out / file
        records[name] = read_provenance(path, nib.load(path).header)
    return side, records


def test_a_generated_file_with_segmented_maps_keeps_them_encrypted_and_says_how_made(vault, tmp_path):
    maps, record = _made()
    image = np.random.default_rng(4).random(SHAPE).astype(np.float32)
    result = SamplingResult(
        volumes=image[None, None], affine=AFFINE, request=SamplingRequest(), provenance={"seed": 4}
    )
    path = save_volume(generated_volumes(result, [(maps, record)])[0], tmp_path / "gen_T2w.nii.gz")
    info = vault.import_nifti(path)
    assert info.kind == "synthetic" and set(info.tissue_maps) == set(NAMES) and vault.notices == []
    assert info.provenance["tissue_maps_made"]["method"] == METHOD
    got = vault.open_tissue(info.id)
    for name in NAMES:
        assert np.array_equal(got[name], maps[name]), name
        # Encrypted: no map's bytes lie in the vault's files in the clear.
        plain = maps[name].tobytes(order="F")[:64]
        assert not any(plain in f.read_bytes() for f in vault.path.rglob("*") if f.is_file())
    side, records = _exported_map_records(vault, info.id, tmp_path / "out")
    assert side["tissue_maps_made"]["contrast"] == "t2w"
    for name, rec in records.items():
        assert rec["tissue_maps_source"] == "method" and rec["method"] == METHOD and rec["tissue_map"] == name
    assert tissue_path(path, "GM").is_file() and vault.verify().ok


def test_a_cohort_item_with_segmented_maps_exports_them_saying_how_made(vault, tmp_path):
    maps, record = _made()
    image = np.random.default_rng(5).random(SHAPE).astype(np.float32)
    # What the cohort writer stores: the image, its maps, and the how-made record in its provenance.
    info = vault.add_synthetic(
        Volume(image, AFFINE, provenance={"seed": 5, "tissue_maps_made": record}, tissue=maps)
    )
    assert set(info.tissue_maps) == set(NAMES)
    _, records = _exported_map_records(vault, info.id, tmp_path / "out")
    assert set(records) == set(NAMES)
    for rec in records.values():
        assert rec["tissue_maps_source"] == "method" and rec["library_versions"]["scipy"]
