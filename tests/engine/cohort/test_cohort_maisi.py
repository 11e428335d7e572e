"""A cohort of NV-Generate-MR-Brain volumes (a tiny MAISI-architecture folder): modality and spacing
reach every volume, folder and vault targets, no tissue-map columns; its volumes are segmented into tissue maps
(random weights: refused as not brain-like, saying why; a brain phantom written through the same writer gets
maps), and the report measures the brain on them for any contrast."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from engine.cohort import CohortSpec, Manifest, run_cohort, validate_layout, volume_path
from engine.cohort.report import collect, write_report
from engine.nifti.io import load_nifti
from engine.testing import write_maisi_folder
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels

from .bids_validator import issues, validate

SPACING = (7.52, 7.52, 5.44)


@pytest.fixture(scope="module")
def maisi_model(tmp_path_factory):
    return write_maisi_folder(
        tmp_path_factory.mktemp("cohort-maisi") / "NV-Generate-CTMR", dim=(32, 32, 32), spacing=SPACING
    )


def _spec(model, **changes) -> CohortSpec:
    data = {"name": "maisi", "model": str(model), "steps": 1, "seeds": 2, "modality": "t2w", **changes}
    return CohortSpec.from_dict(data)


@pytest.mark.slow
def test_a_t2w_cohort_in_a_folder(ray_runtime, maisi_model, tmp_path):
    spec = _spec(maisi_model)
    assert spec.to_dict()["modality"] == "t2w"
    root = tmp_path / "cohort"
    summary = run_cohort(spec, root, workers=1, threads_per_worker=2)
    assert summary.done == 2 and validate_layout(root) == []
    manifest = Manifest.load(root)
    assert manifest.data["model"]["modality"] == "t2w" and "label_channels" not in manifest.data["model"]
    # BIDS names say the modality: sub-X_T2w.nii.gz (+ .json), never _T1w
    names = sorted(p.name for p in root.glob("sub-*/anat/*"))
    assert names and all(n.endswith(("_T2w.nii.gz", "_T2w.json")) for n in names), names
    for participant in manifest.items:
        path = volume_path(root, participant, "t2w")
        assert path.name == f"{participant}_T2w.nii.gz"
        image = load_nifti(path)
        assert np.allclose(image.spacing, SPACING) and image.data.std() > 0
    # a T2w volume filed under the T1w suffix is a layout problem
    first = volume_path(root, next(iter(manifest.items)), "t2w")
    mislabelled = first.with_name(first.name.replace("_T2w", "_T1w"))
    first.rename(mislabelled)
    problems = validate_layout(root)
    assert any("_T1w.nii.gz: name does not follow sub-<label>_T2w.nii.gz" in p for p in problems), problems
    mislabelled.rename(first)
    assert validate_layout(root) == []
    with open(root / "participants.tsv", newline="") as handle:
        header = next(csv.reader(handle, delimiter="\t"))
    assert not any("label" in column.lower() or "probseg" in column.lower() for column in header)
    # Random weights make noise: no maps, and each image's sidecar says why.
    assert manifest.data["model"]["tissue_maps_method"] == "em-gmm-mni152-priors"
    for participant in manifest.items:
        side = json.loads(
            volume_path(root, participant, "t2w").with_name(f"{participant}_T2w.json").read_text()
        )
        assert "does not look like a brain MRI" in side["tissue_maps_not_made"]
    data = collect(root)
    assert data["measurements_skipped"] == "" and data["not_segmented"] == 2
    assert data["measured"]["brain_volume"] == [] and data["done"] == 2
    page = write_report(root, tmp_path / "report.html")
    assert "2 volume(s) not brain-like enough to segment" in page.read_text()
    # A brain through the same writer: maps beside it, sidecars saying how made, still a valid dataset.
    participant = sorted(manifest.items)[0]
    _write_phantom(spec, root, participant)
    image = volume_path(root, participant, "t2w")
    for name in ("CSF", "GM", "WM", "brain"):
        side = json.loads(image.with_name(f"{participant}_label-{name}_probseg.json").read_text())
        assert side["tissue_maps_source"] == "method" and side["contrast"] == "t2w"
        assert "made by segmenting the SYNTHETIC image" in side["Description"] and side["SpatialReference"]
    assert validate_layout(root) == []
    report = validate(root, tmp_path / "validator")  # the official validator: maps of one volume, none of one
    assert issues(report, "error") == [] and report["returncode"] == 0
    data = collect(root)
    labels = phantom_labels()
    truth_ml = float(np.isin(labels, (2, 3)).sum()) * 27 / 1000  # GM + WM voxels of 3 mm
    (measured,) = data["measured"]["brain_volume"]
    assert abs(measured - truth_ml) < 0.15 * truth_ml and data["not_segmented"] == 1


def _write_phantom(spec, root, participant) -> None:
    """Store a brain phantom (T2w) for ``participant`` with the cohort's own writer, as a worker's result."""
    from engine.api import SamplingRequest, SamplingResult
    from engine.cohort.runner import _Writer

    result = SamplingResult(
        volumes=phantom("t2w")[None, None],
        affine=phantom_affine(),
        request=SamplingRequest(model="m", seed=0),
        provenance={"output": {"modality": "t2w"}},
    )
    _Writer(spec, Manifest.load(root), units={}).write(participant, result, worker={})


def test_t1_like_cohorts_are_measured_and_specs_without_a_modality_keep_their_id(maisi_model):
    plain = CohortSpec.from_dict({"name": "x"})
    assert not {"modality", "output_size", "voxel_spacing_mm"} & set(plain.to_dict())  # same JSON, same id
    assert _spec(maisi_model, modality="t1w").request.modality == "t1w"
    from engine.cohort.report import measurements_skipped

    assert measurements_skipped({"modality": "t1w-skullstripped"}) == ""
    assert measurements_skipped({}) == ""  # models without modalities: measured as before
    with pytest.raises(Exception, match="modality must be a name"):
        _spec(maisi_model, modality="T 2")


@pytest.mark.slow
def test_a_flair_cohort_into_the_vault(ray_runtime, maisi_model, tmp_path):
    from engine.vault.crypto import KdfParams
    from engine.vault.store import Vault

    vault = Vault.create(
        tmp_path / "vault", "cohort passphrase", kdf=KdfParams(memory_kib=1024, iterations=1, lanes=1)
    )
    spec = _spec(
        maisi_model,
        name="maisi-vault",
        modality="flair",
        seeds=1,
        output={"target": "vault", "vault": str(vault.path)},
    )
    summary = run_cohort(spec, tmp_path / "state", workers=1, threads_per_worker=2, vault=vault)
    assert summary.done == 1
    (item,) = vault.search(spec.cohort_id, kind="synthetic")
    opened = vault.open_item(item.id)
    assert item.provenance["output"]["modality"] == "flair" and item.provenance["synthetic"] is True
    # Random weights: segmentation refused the volume, and the item says why; it has no maps.
    assert (
        "does not look like a brain MRI" in item.provenance["tissue_maps_not_made"] and not item.tissue_maps
    )
    assert np.allclose(np.sqrt((np.asarray(opened.affine)[:3, :3] ** 2).sum(axis=0)), SPACING)
    vault.lock()
