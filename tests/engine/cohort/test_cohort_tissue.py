"""Cohorts of a model with label channels: every volume's tissue maps are written beside it (BIDS
derivative ``_label-<name>_probseg``) or stored with its vault item, and resume makes an item again when
one of its maps is missing."""

from __future__ import annotations

import json
import shutil

import nibabel as nib
import numpy as np
import pytest

from engine.cohort import CohortSpec, Manifest, resume_cohort, run_cohort, validate_layout, volume_path
from engine.cohort.dataset import tissue_paths
from engine.nifti.io import load_nifti

from .bids_validator import issues, validate
from .conftest import spec_dict

NAMES = ("GM", "WM", "CSF", "ventricles")
SPACE = "MNI152NLin2009aSym"


@pytest.fixture(scope="module")
def tissue_model(tmp_path_factory):
    """The demo model's architecture trained for a few steps (TrainConfig.quick): noise, but 5 output
    channels (image + GM, WM, CSF, ventricles), in MNI152NLin2009aSym with its template affine."""
    from engine.training.train import TrainConfig, train

    folder = tmp_path_factory.mktemp("tissue-model")
    out = train(folder / "model", folder / "work", cfg=TrainConfig.quick(), log=lambda _: None)
    return out


def _spec(model, **changes) -> CohortSpec:
    return CohortSpec.from_dict(
        spec_dict(
            model,
            **{
                "name": "tissue",
                "steps": 2,
                "seeds": 2,
                "draws": 1,
                "conditioning": {"ventricle_volume": {"values": [30.0]}},
                **changes,
            },
        )
    )


@pytest.fixture(scope="module")
def tissue_cohort(ray_runtime, tissue_model, tmp_path_factory):
    spec = _spec(tissue_model)
    root = tmp_path_factory.mktemp("tissue-cohort") / "cohort"
    summary = run_cohort(spec, root, workers=1, threads_per_worker=1)
    return spec, root, summary


@pytest.mark.slow
def test_folder_cohort_writes_the_tissue_maps_as_bids_derivatives(tissue_cohort):
    spec, root, summary = tissue_cohort
    assert (summary.total, summary.done, summary.failed) == (2, 2, 0)
    assert validate_layout(root) == []
    description = json.loads((root / "dataset_description.json").read_text())
    assert description["VolSynthSpace"] == SPACE and description["VolSynthTissueMaps"] == list(NAMES)
    readme = (root / "README").read_text()
    assert "tissue maps" in readme and "GM, WM, CSF, ventricles" in readme and SPACE in readme
    manifest = Manifest.load(root)
    for participant in manifest.items:
        image_path = volume_path(root, participant, space=SPACE)
        assert image_path.name == f"{participant}_space-{SPACE}_T1w.nii.gz"
        image = load_nifti(image_path)
        assert image.synthetic and image.data.shape == (80, 96, 80)
        assert image.provenance["SkullStripped"] is True  # the demo architecture: skull-stripped T1w
        maps = tissue_paths(root, participant, NAMES, space=SPACE)
        assert maps[0].name == f"{participant}_space-{SPACE}_label-GM_probseg.nii.gz"
        assert image.provenance["tissue_maps"] == {n: p.name for n, p in zip(NAMES, maps, strict=True)}
        assert image.provenance["space"] == SPACE
        for path in [image_path, *maps]:
            img = nib.load(path)
            assert int(img.header["sform_code"]) == 4, path.name  # MNI152
            assert np.allclose(img.affine, nib.load(image_path).affine)
        for name, path in zip(NAMES, maps, strict=True):
            loaded = load_nifti(path)
            assert loaded.synthetic and loaded.provenance["tissue_map"] == name
            assert loaded.data.shape == (80, 96, 80)
            assert loaded.data.min() >= 0.0 and loaded.data.max() <= 1.0
            side = json.loads(path.with_name(path.name.replace(".nii.gz", ".json")).read_text())
            assert side["SpatialReference"] == f"bids::{participant}/anat/{image_path.name}"
            assert name in side["Description"] and side["synthetic"] is True and side["tissue_map"] == name


def test_the_official_bids_validator_accepts_the_cohort(tissue_cohort, tmp_path):
    _, root, _ = tissue_cohort
    report = validate(root, tmp_path / "validator")
    assert issues(report, "error") == [] and report["returncode"] == 0
    assert report["summary"]["schemaVersion"] and report["summary"]["totalFiles"] >= 21
    warnings = issues(report, "warning")
    # The recommended keys are there: a Description for every file, a SpatialReference for every map.
    assert not [
        w for w in warnings if w[1] == "Description" or (w[1] == "SpatialReference" and "probseg" in w[2])
    ]


def test_pybids_reads_the_tissue_maps(tissue_cohort):
    bids = pytest.importorskip("bids", reason="pybids is optional")
    _, root, _ = tissue_cohort
    layout = bids.BIDSLayout(root, validate=True, is_derivative=True)
    assert len(layout.get(suffix="T1w", extension=".nii.gz")) == 2
    assert len(layout.get(suffix="T1w", space=SPACE, extension=".nii.gz")) == 2  # found by their space
    maps = layout.get(suffix="probseg", space=SPACE, extension=".nii.gz")
    assert len(maps) == 8
    assert sorted({f.entities["label"] for f in maps}) == sorted(NAMES)


def test_layout_check_reports_missing_and_unnamed_maps(tissue_cohort, tmp_path):
    _, root, _ = tissue_cohort
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    (broken / "sub-synth0001" / "anat" / f"sub-synth0001_space-{SPACE}_label-CSF_probseg.nii.gz").unlink()
    extra = broken / "sub-synth0002" / "anat" / f"sub-synth0002_space-{SPACE}_label-bone_probseg.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((2, 2, 2), np.float32), np.eye(4)), extra)
    spaceless = broken / "sub-synth0002" / "anat" / "sub-synth0002_label-GM_probseg.nii.gz"
    shutil.copy(tissue_paths(broken, "sub-synth0002", ["GM"], space=SPACE)[0], spaceless)
    problems = validate_layout(broken)
    assert problems == [
        f"sub-synth0001: no tissue map sub-synth0001_space-{SPACE}_label-CSF_probseg.nii.gz",
        f"sub-synth0002/anat/sub-synth0002_label-GM_probseg.nii.gz: the space entity does not say {SPACE}",
        f"sub-synth0002/anat/sub-synth0002_space-{SPACE}_label-bone_probseg.nii.gz: a tissue map "
        "dataset_description.json does not name",
        f"sub-synth0002_space-{SPACE}_label-bone_probseg.nii.gz: not marked SYNTHETIC in its header",
    ]


@pytest.mark.slow
def test_resume_makes_an_item_again_when_a_map_is_missing(tissue_cohort, tmp_path):
    spec, root, _ = tissue_cohort
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    lost = tissue_paths(copy, "sub-synth0002", NAMES, space=SPACE)[3]
    before = load_nifti(lost).data
    lost.unlink()
    kept = {p: p.stat().st_mtime_ns for p in (copy / "sub-synth0001" / "anat").iterdir()}
    summary = resume_cohort(copy, workers=1, threads_per_worker=1)
    assert (summary.done, summary.done_this_run) == (2, 1)
    assert lost.is_file() and np.array_equal(load_nifti(lost).data, before)  # the same seed: the same map
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # the complete item is not made again
    assert validate_layout(copy) == []
    assert resume_cohort(copy, workers=1).done_this_run == 0


@pytest.mark.slow
def test_vault_cohort_stores_the_maps_with_each_item(ray_runtime, tissue_model, tmp_path):
    from engine.vault.crypto import KdfParams
    from engine.vault.store import Vault

    vault = Vault.create(
        tmp_path / "vault", "cohort passphrase", kdf=KdfParams(memory_kib=1024, iterations=1, lanes=1)
    )
    try:
        spec = _spec(
            tissue_model, name="vaulted", seeds=1, output={"target": "vault", "vault": str(vault.path)}
        )
        summary = run_cohort(spec, tmp_path / "state", workers=1, threads_per_worker=1, vault=vault)
        assert summary.done == 1
        (item,) = vault.search(spec.cohort_id, kind="synthetic")
        assert item.tissue_maps == NAMES and item.provenance["space"] == SPACE
        maps = vault.open_tissue(item.id)
        assert list(maps) == list(NAMES)
        assert all(m.shape == (80, 96, 80) and m.min() >= 0.0 and m.max() <= 1.0 for m in maps.values())
        assert vault.verify().ok
        assert not list((tmp_path / "state").rglob("*.nii*"))
        exported = vault.export(item.id, tmp_path / "out")
        assert [p.name.split("_", 1)[-1] for p in exported.files[1:5]] == [
            f"label-{n}_probseg.nii.gz" for n in NAMES
        ]
        assert run_cohort(spec, tmp_path / "state", workers=1, vault=vault).done_this_run == 0
    finally:
        vault.lock()
