"""The model the app ships: present, valid, small enough, and what ``volsynth generate`` uses by default."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np

from engine.cli import main
from engine.models.registry import DEFAULT_MODEL_ID
from engine.resources import resource_path

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
