"""Anatomy checks reach every brain output of the CLI: ``volsynth generate`` (a model's own tissue channels and
``--tissue-maps``) and ``volsynth segment`` write the check into the sidecar and print one verdict line per volume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.anatomy.checks import WITHIN
from engine.cli import main
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels
from tests.engine.anatomy.test_generate_tissue_maps import _PhantomBackend, _use_backend


def _channels() -> np.ndarray:
    """Image + GM, WM, CSF channels of the phantom, as a model with label channels decodes them."""
    labels = phantom_labels()
    maps = [(labels == code).astype(np.float32) for code in (2, 3, 1)]
    return np.stack([phantom("t1w"), *maps])[None]


@pytest.mark.slow
def test_generate_writes_the_check_of_the_models_own_maps(model_path_env, tmp_path, capsys, monkeypatch):
    backend = _PhantomBackend(_channels(), {"label_channels": ["GM", "WM", "CSF"]})
    _use_backend(monkeypatch, backend)
    out = tmp_path / "x.nii.gz"
    assert main(["generate", "--model", "tiny-pixel", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("x.nii.gz: anatomy check: "))
    assert WITHIN in line and "brain " in line and "ventricles " in line
    check = json.loads((tmp_path / "x.json").read_text())["anatomy_check"]
    assert check["verdict"] == WITHIN and check["maps_from"] == "model channels"
    assert check["measures"]["brain_volume_ml"]["within"] is True


@pytest.mark.slow
def test_generate_checks_a_noisy_models_maps_as_not_brain_like(model_path_env, tmp_path, capsys, monkeypatch):
    volumes = _channels()
    rng = np.random.default_rng(1)
    volumes[0, 1:] = rng.random(volumes[0, 1:].shape) * (phantom_labels() > 0)  # channels of random weights
    _use_backend(monkeypatch, _PhantomBackend(volumes, {"label_channels": ["GM", "WM", "CSF"]}))
    out = tmp_path / "x.nii.gz"
    assert main(["generate", "--model", "tiny-pixel", "--out", str(out)]) == 0  # the volume is still written
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("x.nii.gz: anatomy check: "))
    assert "not brain-like: " in line and "neighbour correlation" in line
    check = json.loads((tmp_path / "x.json").read_text())["anatomy_check"]
    assert check["status"] == "not_brain_like" and check["measures"] == {}


@pytest.mark.slow
def test_generate_tissue_maps_checks_the_segmented_maps(model_path_env, tmp_path, capsys, monkeypatch):
    _use_backend(monkeypatch, _PhantomBackend(phantom("t1w")[None, None], {"output": {"modality": "t1w"}}))
    out = tmp_path / "sub-01_T1w.nii.gz"
    assert main(["generate", "--model", "tiny-pixel", "--tissue-maps", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert any(x.startswith(f"sub-01_T1w.nii.gz: anatomy check: {WITHIN}") for x in err.splitlines())
    check = json.loads((tmp_path / "sub-01_T1w.json").read_text())["anatomy_check"]
    assert (
        check["maps_from"] == "em-gmm-mni152-priors" and "CSF inside the MNI152" in check["ventricles_from"]
    )


@pytest.mark.slow
def test_segment_writes_the_check_beside_the_maps_and_prints_it(tmp_path, capsys):
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    source = save_volume(Volume(phantom("t1w"), phantom_affine()), tmp_path / "scan_T1w.nii.gz")
    assert main(["segment", str(source), "--out", str(tmp_path / "maps")]) == 0
    err = capsys.readouterr().err
    assert f"scan_T1w.nii.gz: anatomy check: {WITHIN}" in err
    sidecar = json.loads((tmp_path / "maps" / "scan_label-GM_probseg.json").read_text())
    assert sidecar["anatomy_check"]["verdict"] == WITHIN
    assert set(sidecar["anatomy_check"]["measures"]) >= {
        "brain_volume_ml",
        "ventricle_volume_ml",
        "asymmetry_pct",
    }
