"""Cohorts of a model without tissue channels (MAISI, bundles): each volume is segmented on the Ray worker that
made it, beside its generation, and the driver only writes what comes back."""

from __future__ import annotations

import json
import os

import pytest

from engine.cohort import CohortSpec, Manifest, run_cohort, validate_layout, volume_path
from engine.testing import write_maisi_folder
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels


@pytest.fixture(scope="module")
def maisi_model(tmp_path_factory):
    return write_maisi_folder(
        tmp_path_factory.mktemp("ray-segment") / "NV-Generate-CTMR", dim=(32, 32, 32), spacing=(4.0, 4.0, 4.0)
    )


@pytest.mark.slow
def test_a_maisi_cohorts_volumes_are_segmented_on_the_workers_not_the_driver(
    ray_runtime, maisi_model, tmp_path, monkeypatch
):
    import engine.anatomy.segment as segment
    from engine.cohort.report import collect

    def not_here(*args, **kwargs):
        raise AssertionError("the driver segmented a volume")

    monkeypatch.setattr(segment, "maps_or_reason", not_here)  # (this process only: the workers are others)
    spec = CohortSpec.from_dict(
        {"name": "ray-seg", "model": str(maisi_model), "steps": 1, "seeds": 1, "modality": "t2w"}
    )
    root = tmp_path / "cohort"
    summary = run_cohort(spec, root, workers=1, threads_per_worker=2)
    assert (summary.total, summary.done, summary.failed) == (1, 1, 0)
    manifest = Manifest.load(root)
    pids, not_made = set(), 0
    for participant, entry in manifest.items.items():
        side = json.loads(
            volume_path(root, participant, "t2w").with_name(f"{participant}_T2w.json").read_text()
        )
        # What the worker made of it: maps (beside the image, saying how made) or the reason it refused.
        made, why = side.get("tissue_maps_made"), side.get("tissue_maps_not_made")
        assert bool(made) != bool(why), side
        if made:
            assert made["contrast"] == "t2w" and set(side["tissue_maps"]) == {"CSF", "GM", "WM", "brain"}
            image = volume_path(root, participant, "t2w")
            assert all((image.parent / name).is_file() for name in side["tissue_maps"].values())
        else:
            not_made += 1
        assert side["worker"]["segmented_here"] is True and side["worker"]["pid"] != os.getpid()
        assert side["worker"]["pid"] == entry["worker_pid"]
        pids.add(entry["worker_pid"])
    assert os.getpid() not in pids
    assert validate_layout(root) == []
    data = collect(root)  # the report counts them as before
    assert data["done"] == 1 and data["not_segmented"] == not_made


@pytest.mark.slow
def test_what_a_worker_segments_is_the_maps_the_writer_stores():
    """``segment_member``, the function a worker runs, on a brain phantom: maps with how they were made."""
    from engine.api import SamplingRequest, SamplingResult
    from engine.cohort.runner import segment_member

    result = SamplingResult(
        volumes=phantom("t1w")[None, None],
        affine=phantom_affine(),
        request=SamplingRequest(model="m", seed=0),
        provenance={},
    )
    maps, made = segment_member(result.member(0), "t1w-skullstripped")
    assert set(maps) == {"CSF", "GM", "WM", "brain"} and made["contrast"] == "t1w"
    gm, truth = maps["GM"] > 0.5, phantom_labels() == 2
    assert 2 * (gm & truth).sum() / (gm.sum() + truth.sum()) > 0.75
    maps, why = segment_member(result.member(0), "swi")
    assert maps == {} and "SWI shows susceptibility" in why["tissue_maps_not_made"]
