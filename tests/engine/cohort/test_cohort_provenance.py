"""A cohort volume names the machine that made it (issue 37 point 10), and a model that makes NaN writes
no cohort file (point 7). On the real local Ray runtime of the other cohort tests."""

from __future__ import annotations

import json
import os
import shutil
import socket

import pytest

from engine.cohort import CohortSpec, Manifest, run_cohort
from engine.nifti.io import sidecar_path

from .conftest import spec_dict


def _small(model, **changes) -> CohortSpec:
    data = spec_dict(model, steps=2, seeds=1, **changes)
    data["conditioning"] = {"ventricle_volume": {"values": [20.0, 60.0]}}
    data.pop("draws", None)
    data.pop("draw_seed", None)
    return CohortSpec.from_dict(data)


@pytest.mark.slow
def test_each_volume_names_its_worker_node_host_and_pid(ray_runtime, cohort_model, tmp_path):
    import ray

    spec = _small(cohort_model, name="traced")
    root = tmp_path / "traced"
    summary = run_cohort(spec, root, workers=1, threads_per_worker=1)
    assert summary.done == 2
    alive = {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}
    for entry in Manifest.load(root).items.values():
        worker = json.loads(sidecar_path(root / entry["file"]).read_text())["worker"]
        assert worker["node_id"] in alive  # the Ray node id `ray list nodes` shows
        assert worker["node_ip"] == alive[worker["node_id"]]["NodeManagerAddress"]
        assert worker["hostname"] == socket.gethostname()
        assert worker["pid"] != os.getpid() and worker["pid"] == entry["worker_pid"]
        assert (entry["worker_node"], entry["worker_host"]) == (worker["node_id"], worker["hostname"])


@pytest.mark.slow
def test_a_model_that_overflows_fails_its_items_and_writes_no_volume(ray_runtime, cohort_model, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "overflows"
    shutil.copytree(cohort_model, model)
    tensors = load_file(model / "weights.safetensors")
    tensors["unet.out.2.conv.weight"] = tensors["unet.out.2.conv.weight"] * 1e38  # finite, overflows at once
    save_file(tensors, model / "weights.safetensors")
    root = tmp_path / "nan-cohort"
    summary = run_cohort(_small(model, name="nan"), root, workers=1, threads_per_worker=1)
    assert (summary.done, summary.failed) == (0, 2)
    for entry in Manifest.load(root).items.values():
        assert entry["state"] == "failed"
        assert (
            "NaN or infinite values at denoising step 1 of 2; nothing was written"
            in entry["errors"][-1]["error"]
        )
    assert not list(root.rglob("*.nii*")) and not list(root.rglob("sub-*/anat/*.json"))
