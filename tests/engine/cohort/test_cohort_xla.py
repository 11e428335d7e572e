"""Cohorts on XLA devices: one Ray worker per device group (fake host devices here), the same volumes as
one device, the devices and groups in the summary and the manifest, and a resume on another group count.

Three cohort runs in all (each starts Ray workers that start JAX): no plan on 2 groups of one device (the
one-device reference), a plan on 2 groups of 2 fake devices, and its resume on one group."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from engine.cohort import CohortSpec, Manifest, run_cohort
from engine.cohort.xla_groups import device_groups, plan_devices, tpu_process_env
from engine.errors import BackendUnavailable, InvalidRequest
from engine.nifti.io import load_nifti

from .conftest import spec_dict

pytest.importorskip("jax", reason="XLA cohorts need the 'xla' extra (jax)")
RUN_TOLERANCE = 1e-4  # the bar for a sharded run against one device (relative to the peak)


def _spec(model) -> CohortSpec:
    """Two volumes with guidance (the U-Net's batch is 2: a data-parallel plan of 2 divides it)."""
    return CohortSpec.from_dict(
        spec_dict(
            model,
            name="tiny-xla",
            steps=3,
            seeds=1,
            draws=1,
            guidance_scale=3.0,
            conditioning={"ventricle_volume": {"values": [20.0, 60.0]}},
        )
    )


def _volumes(root) -> dict[str, np.ndarray]:
    manifest = Manifest.load(root)
    return {p: load_nifti(root / e["file"]).data for p, e in manifest.items.items() if e["state"] == "done"}


def _relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def one_device(ray_runtime, cohort_model, tmp_path_factory):
    """The cohort with no plan on 2 XLA devices: 2 workers (groups) of one device, each volume on one."""
    root = tmp_path_factory.mktemp("xla-cohort") / "one-device"
    events = []
    summary = run_cohort(
        _spec(cohort_model),
        root,
        device="xla",
        xla_devices=2,
        threads_per_worker=1,
        on_progress=events.append,
    )
    return root, summary, events, _volumes(root)


@pytest.mark.slow
def test_a_cohort_without_a_plan_runs_one_worker_per_device(one_device, cohort_model):
    root, summary, events, volumes = one_device
    assert (summary.done, summary.failed, summary.device) == (2, 0, "xla")
    assert (summary.devices, summary.device_groups, summary.workers, summary.xla_plan) == (2, 2, 2, "")
    assert summary.devices_text() == "2 XLA devices in 2 groups of 1 (no plan)"
    assert "2 XLA devices (fake host CPU devices) in 2 groups of 1, no plan" in events[0].message
    manifest = Manifest.load(root)
    assert manifest.cohort_id == _spec(cohort_model).cohort_id  # the id does not depend on the groups
    assert manifest.data["runs"][-1]["xla"] == {
        "platform": "cpu",
        "plan": "",
        "groups": 2,
        "devices_per_group": 1,
        "devices": 2,
    }
    assert len({e["worker_pid"] for e in manifest.items.values()}) == 2  # both groups made a volume
    side = load_nifti(root / manifest.items["sub-synth0001"]["file"]).provenance
    assert side["backend"] == "xla" and side["xla"]["platform"] == "cpu" and "plan" not in side["xla"]
    assert len({v.tobytes() for v in volumes.values()}) == 2 and all(v.std() > 0 for v in volumes.values())


@pytest.mark.skipif(
    importlib.util.find_spec("engine.xla.execution") is None,
    reason="the XLA backend executes plans once engine.xla.execution (issue 28, xla-exec) is merged",
)
@pytest.mark.slow
def test_a_plan_per_group_of_two_fake_devices_and_a_resume_on_one_group(
    one_device, cohort_model, tmp_path, capsys
):
    from engine.cli import main

    _root, _summary, _events, reference = one_device
    root = tmp_path / "planned"
    summary = run_cohort(
        _spec(cohort_model), root, device="xla", xla_plan="dp2", xla_devices=4, threads_per_worker=1
    )
    assert (summary.done, summary.failed) == (2, 0), summary.errors
    assert (summary.devices, summary.device_groups, summary.xla_plan) == (4, 2, "dp2")
    assert summary.devices_text() == "4 XLA devices in 2 groups of 2 (plan dp2)"
    manifest = Manifest.load(root)
    for participant, volume in _volumes(root).items():
        assert _relative_error(volume, reference[participant]) <= RUN_TOLERANCE
        side = load_nifti(root / manifest.items[participant]["file"]).provenance
        plan = side["xla"]["plan"]
        assert plan["name"] == "dp2" and plan["devices_used"] == 2

    # A resume on one group (the CLI's) keeps the plan the cohort started with and makes the missing volume.
    first = manifest.items["sub-synth0002"]
    (root / first["file"]).unlink()
    assert main(["cohort", "resume", str(root), "--device", "xla", "--threads", "1"]) == 0
    assert f"cohort {manifest.cohort_id}: 2 XLA devices in 1 group of 2 (plan dp2)" in capsys.readouterr().err
    after = Manifest.load(root)
    assert after.data["runs"][-1]["xla"]["plan"] == "dp2" and after.data["runs"][-1]["done"] == 1
    assert after.items["sub-synth0002"]["volume_sha256"] == first["volume_sha256"]  # bit-identical


def test_groups_follow_the_plan_and_the_host():
    assert [plan_devices(p) for p in ("", "single", "dp2", "d2xh2", "dp2xd2/cut@2", "best")] == [
        1,
        1,
        2,
        4,
        4,
        None,
    ]
    # 8 TPU chips and a plan of 2 devices: 4 workers holding 2 chips each (Ray sets TPU_VISIBLE_CHIPS).
    groups = device_groups(8, plan="d2")
    assert (groups.platform, groups.groups, groups.devices_per_group, groups.devices) == ("tpu", 4, 2, 8)
    assert groups.actor_options() == {"num_cpus": 1, "resources": {"TPU": 2}}
    assert device_groups(8).groups == 8  # no plan: one chip per worker
    assert device_groups(8, plan="best", workers=2).devices_per_group == 4
    # No TPU: fake host devices, one group per worker unless told how many devices in all.
    assert device_groups(0, plan="dp2").devices == 2
    assert device_groups(0, plan="dp2", devices=8).groups == 4
    assert device_groups(0, plan="dp2", devices=8).actor_options() == {"num_cpus": 1}
    assert tpu_process_env(["3", "2"]) == {
        "TPU_VISIBLE_CHIPS": "2,3",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_CHIPS_PER_HOST_BOUNDS": "1,2,1",
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_MESH_CONTROLLER_ADDRESS": "localhost:8478",
        "TPU_MESH_CONTROLLER_PORT": "8478",
    }


@pytest.mark.parametrize(
    ("chips", "options", "error", "message"),
    [
        (0, {"plan": "best"}, InvalidRequest, "best is costed on a TPU slice's topology"),
        (8, {"plan": "d3"}, InvalidRequest, "Ray gives an actor 1, 2, 4, 8 chips"),
        (8, {"plan": "dp2", "devices": 16}, BackendUnavailable, "the Ray cluster has 8"),
        (0, {"plan": "dp2", "devices": 3}, InvalidRequest, "do not split into groups of 2"),
        (0, {"plan": "dp4", "workers": 3, "devices": 8}, InvalidRequest, "need 12 XLA devices; there are 8"),
        (0, {"plan": "dp2x"}, InvalidRequest, "is not a plan name"),
    ],
)
def test_groups_that_cannot_be_made_say_why(chips, options, error, message):
    with pytest.raises(error, match=message):
        device_groups(chips, **options)


def test_torch_settings_and_xla_options_on_other_devices_are_refused_before_any_worker(
    cohort_model, tmp_path
):
    spec = CohortSpec.from_dict({**spec_dict(cohort_model), "optimization": {"autocast": "bf16"}})
    with pytest.raises(InvalidRequest, match="torch settings; --device xla runs float32 XLA programs"):
        run_cohort(spec, tmp_path / "a", device="xla")
    with pytest.raises(InvalidRequest, match="--xla-plan and --xla-devices are for --device xla"):
        run_cohort(_spec(cohort_model), tmp_path / "b", device="cpu", xla_plan="dp2")
    with pytest.raises(InvalidRequest, match="'dp2x' is not a plan name"):
        run_cohort(_spec(cohort_model), tmp_path / "c", device="xla", xla_plan="dp2x")


def test_the_cli_refuses_a_plan_name_in_one_line(cohort_model, tmp_path, capsys):
    from engine.cli import main

    spec_path = tmp_path / "c.json"
    spec_path.write_text(_spec(cohort_model).to_json())
    out = str(tmp_path / "out")
    assert main(["cohort", "run", str(spec_path), "--out", out, "--device", "xla", "--xla-plan", "dp2x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("volsynth: error: --xla-plan 'dp2x' is not a plan name") and err.count("\n") == 1
