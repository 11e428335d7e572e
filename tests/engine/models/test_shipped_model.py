"""The model the app ships: present, valid, small enough, and what ``volsynth generate`` uses by default."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from engine.cli import main
from engine.files.shipped import resource_path
from engine.models.registry import DEFAULT_MODEL_ID

FOLDER = resource_path("models", DEFAULT_MODEL_ID)


def test_shipped_model_folder_is_complete_and_small():
    names = {p.name for p in FOLDER.iterdir()}
    assert {"spec.json", "weights.safetensors", "MODEL_CARD.md", "montage.png", "evaluation.json"} <= names
    assert (FOLDER / "weights.safetensors").stat().st_size <= 50 * 1024**2
    spec = json.loads((FOLDER / "spec.json").read_text())
    assert spec["output_shape"][1:] == [80, 96, 80] and max(spec["voxel_spacing_mm"]) <= 2.4
    assert {c["name"] for c in spec["conditioning"]} >= {"brain_volume", "ventricle_volume"}
    # It samples with classifier-free guidance unless asked otherwise, and its card says so.
    assert spec["guidance"] == {"null_value": -1.0, "default_scale": 3.0}
    card = (FOLDER / "MODEL_CARD.md").read_text()
    assert "Not for diagnosis" in card and "MNI152" in card
    assert "samples with guidance scale 3 unless" in card.replace("\n", " ")


@pytest.mark.slow
def test_generate_without_model_uses_the_shipped_model(tmp_path, monkeypatch):
    monkeypatch.delenv("VOLSYNTH_MODEL_PATH", raising=False)
    out = tmp_path / "default.nii.gz"
    assert main(["generate", "--steps", "2", "--seed", "3", "--device", "cpu", "--out", str(out)]) == 0
    image = nib.load(out)
    assert image.shape == (80, 96, 80)
    assert nib.aff2axcodes(image.affine) == ("R", "A", "S")
    assert np.allclose(image.header.get_zooms(), (2, 2, 2))
    assert np.isfinite(np.asarray(image.dataobj)).all()
    sidecar = json.loads((tmp_path / "default.json").read_text())
    assert sidecar["model"]["id"] == DEFAULT_MODEL_ID
    assert sidecar["request"]["guidance_scale"] == 3.0  # no --guidance: the model's default ran


@pytest.mark.slow
def test_default_generate_writes_an_mni_volume_inside_the_mni_brain_with_its_tissue_maps(
    tmp_path, monkeypatch
):
    """The default ``volsynth generate`` (the shipped model, 50 DDIM steps): the volume claims MNI152 space
    (sform code 4) and its brain lies inside the MNI152 brain mask where the affines put them, with no
    shifting; the four tissue maps lie beside it on the same grid."""
    from nibabel.processing import resample_from_to

    from engine.anatomy.measures import brain_mask
    from engine.anatomy.template import template_mask_image

    monkeypatch.delenv("VOLSYNTH_MODEL_PATH", raising=False)
    out = tmp_path / "sub-01_T1w.nii.gz"
    assert main(["generate", "--seed", "0", "--device", "cpu", "--out", str(out)]) == 0
    image = nib.load(out)
    assert int(image.header["sform_code"]) == 4 and int(image.header["qform_code"]) == 1
    sidecar = json.loads((tmp_path / "sub-01_T1w.json").read_text())
    assert sidecar["space"] == "MNI152NLin2009aSym"

    brain = brain_mask(np.asarray(image.dataobj))
    mni = resample_from_to(template_mask_image(), image, order=0).get_fdata() > 0.5
    inside = (brain & mni).sum() / brain.sum()
    assert inside > 0.95, f"only {inside:.1%} of the generated brain lies inside the MNI152 brain mask"

    names = ("GM", "WM", "CSF", "ventricles")
    assert sidecar["tissue_maps"] == {n: f"sub-01_label-{n}_probseg.nii.gz" for n in names}
    maps = {}
    for name in names:
        tissue = nib.load(tmp_path / f"sub-01_label-{name}_probseg.nii.gz")
        assert tissue.shape == image.shape and np.array_equal(tissue.affine, image.affine)
        assert int(tissue.header["sform_code"]) == 4
        maps[name] = np.asarray(tissue.dataobj)
        assert maps[name].min() >= 0 and maps[name].max() <= 1
    # The maps describe this brain: tissue where the image has brain, none far outside it.
    tissue_sum = maps["GM"] + maps["WM"] + maps["CSF"]
    assert tissue_sum[brain].mean() > 0.8 and tissue_sum[~mni].mean() < 0.05
    # ... and they are a partition: GM + WM + CSF + background = 1 in every voxel, ventricles inside CSF
    from engine.anatomy.partition import partition_error

    assert partition_error(maps) < 0.01 and np.all(maps["ventricles"] <= maps["CSF"])
    assert sidecar["tissue_maps_made"]["partition"].startswith("GM + WM + CSF + background = 1")
