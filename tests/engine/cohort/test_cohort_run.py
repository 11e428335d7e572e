"""Cohorts on a real local Ray runtime: BIDS output, bit-identical re-runs, retries and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.cohort import CohortSpec, Manifest, resume_cohort, run_cohort, validate_layout, volume_path
from engine.cohort.dataset import read_participants
from engine.nifti.io import load_nifti

from .bids_validator import issues, validate
from .conftest import spec_dict

REPO = Path(__file__).resolve().parents[3]


def volumes(root: Path) -> dict[str, np.ndarray]:
    manifest = Manifest.load(root)
    return {p: load_nifti(root / e["file"]).data for p, e in manifest.items.items() if e["state"] == "done"}


@pytest.fixture(scope="module")
def reference(ray_runtime, cohort_model, tmp_path_factory):
    """The small cohort (8 volumes), generated once by 2 workers of 1 thread."""
    spec = CohortSpec.from_dict(spec_dict(cohort_model))
    root = tmp_path_factory.mktemp("cohort") / "reference"
    events = []
    summary = run_cohort(spec, root, workers=2, threads_per_worker=1, on_progress=events.append)
    return spec, root, summary, events, volumes(root)


@pytest.mark.slow
def test_small_cohort_is_a_valid_bids_derivative_dataset(reference, cohort_model):
    spec, root, summary, events, vols = reference
    assert (summary.total, summary.done, summary.failed, summary.retries) == (8, 8, 0, 0)
    assert summary.workers == 2
    assert [e.event for e in events][0] == "started" and events[-1].event == "finished"
    done_events = [e for e in events if e.event == "done"]
    assert [e.done for e in done_events] == list(range(1, 9))
    assert all(Path(e.path).is_file() for e in done_events)
    assert validate_layout(root) == []

    manifest = Manifest.load(root)
    rows = {r["participant_id"]: r for r in read_participants(root)}
    assert sorted(rows) == [f"sub-synth{i:04d}" for i in range(1, 9)]
    for participant, entry in manifest.items.items():
        assert float(rows[participant]["ventricle_volume"]) == entry["conditioning"]["ventricle_volume"]
        assert float(rows[participant]["brain_volume"]) == pytest.approx(
            entry["conditioning"]["brain_volume"]
        )
        assert int(rows[participant]["seed"]) == entry["seed"]
        loaded = load_nifti(volume_path(root, participant))
        assert loaded.synthetic and loaded.data.shape == (16, 24, 16)
        assert np.isfinite(loaded.data).all() and loaded.data.std() > 0
        side = loaded.provenance
        assert side["cohort"] == {
            "id": spec.cohort_id,
            "participant": participant,
            "index": entry["index"],
            "spec_sha256": spec.sha256,
        }
        assert (
            side["seed"] == entry["seed"]
            and side["conditioning"]["ventricle_volume"] == (entry["conditioning"]["ventricle_volume"])
        )
        assert "default_worker" not in side["command"] and side["worker"]["pid"] == entry["worker_pid"]
        assert side["volume_sha256"] == entry["volume_sha256"]
    assert len({e["volume_sha256"] for e in manifest.items.values()}) == 8  # 8 different volumes
    description = json.loads((root / "dataset_description.json").read_text())
    assert description["DatasetType"] == "derivative"
    from engine.models.registry import open_model_folder

    assert description["GeneratedBy"][0]["ModelSHA256"] == open_model_folder(cohort_model).weights_sha256()


def test_the_official_bids_validator_accepts_the_cohort(reference, tmp_path):
    _, root, *_ = reference
    report = validate(root, tmp_path / "validator")
    assert issues(report, "error") == [] and report["returncode"] == 0
    side = json.loads((root / "sub-synth0001" / "anat" / "sub-synth0001_T1w.json").read_text())
    assert side["SkullStripped"] is False  # a tiny random model says nothing of skull stripping
    assert "SYNTHETIC" in side["Description"]


def test_layout_check_catches_broken_datasets(reference, tmp_path):
    import shutil

    _, root, *_ = reference
    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    (broken / "sub-synth0002" / "anat" / "sub-synth0002_T1w.json").unlink()
    (broken / "notes.txt").write_text("x")
    (broken / "sub-synth0003" / "anat" / "sub-synth0003_T2w.nii.gz").write_bytes(b"")
    shutil.rmtree(broken / "sub-synth0004")
    problems = validate_layout(broken)
    assert "sub-synth0002: no JSON sidecar for sub-synth0002_T1w.nii.gz" in problems
    assert "notes.txt: not allowed at the top of a BIDS dataset" in problems
    assert any("sub-synth0003_T2w.nii.gz: name does not follow" in p for p in problems)
    assert "participants.tsv lists sub-synth0004, which has no folder" in problems


def test_pybids_reads_the_dataset(reference):
    bids = pytest.importorskip("bids", reason="pybids is optional")
    spec, root, *_ = reference
    layout = bids.BIDSLayout(root, validate=True, is_derivative=True)
    files = layout.get(suffix="T1w", extension=".nii.gz")
    assert len(files) == 8 and len(layout.get_subjects()) == 8
    meta = layout.get_metadata(files[0].path)
    assert meta["synthetic"] is True and meta["cohort"]["id"] == spec.cohort_id


@pytest.mark.slow
def test_report_png(reference, tmp_path):
    from engine.cohort.report import collect, write_report

    _, root, *_ = reference
    data = collect(root, montage=4)
    assert (data["done"], data["failed"], data["retries"]) == (8, 0, 0)
    assert len(data["slices"]) == 4 and len(data["requested"]["ventricle_volume"]) == 8
    assert len(data["measured"]["brain_volume"]) == 8
    png = write_report(root, tmp_path / "report.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = write_report(root, tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "8/8 volumes" in page


def test_the_driver_has_no_garbage_collecting_thread_of_ray(ray_runtime):
    """A cohort started from the desktop app makes the app's process Ray's driver: Ray's own thread for
    gc.collect() would collect Qt objects off the GUI thread (a crash, or a deadlock, after a cohort)."""
    import threading

    assert "PythonGCThread" not in [thread.name for thread in threading.enumerate()]


@pytest.mark.slow
def test_rerun_is_bit_identical_and_a_killed_worker_costs_only_its_item(reference, tmp_path):
    """The same spec again (other worker threads and order): the same volumes, bit for bit, including the
    item whose worker process was killed while it ran it (retried on the restarted worker)."""
    spec, _, _, _, ref = reference
    killed = []

    def kill_third(progress):
        if progress.event == "submitted" and progress.participant == "sub-synth0003" and not killed:
            os.kill(progress.worker_pid, signal.SIGKILL)  # the worker process dies with the item in flight
            killed.append(progress.worker_pid)

    events = []
    summary = run_cohort(
        spec,
        tmp_path / "killed",
        workers=1,
        threads_per_worker=2,
        on_progress=lambda p: (kill_third(p), events.append(p)),
    )
    assert killed
    assert (summary.done, summary.failed, summary.retries) == (8, 0, 1)
    entry = Manifest.load(tmp_path / "killed").items["sub-synth0003"]
    assert entry["attempts"] == 2 and len(entry["errors"]) == 1
    assert f"worker {killed[0]} died" in entry["errors"][0]["error"]
    retries = [e for e in events if e.event == "retry"]
    assert [e.participant for e in retries] == ["sub-synth0003"]
    others = Manifest.load(tmp_path / "killed").items
    assert all(e["attempts"] == 1 for p, e in others.items() if p != "sub-synth0003")
    got = volumes(tmp_path / "killed")
    for participant, volume in ref.items():
        assert np.array_equal(got[participant], volume), participant
    assert validate_layout(tmp_path / "killed") == []


@pytest.mark.slow
def test_stop_keeps_what_is_done_and_resume_finishes(reference, tmp_path):
    spec, _, _, _, ref = reference
    root = tmp_path / "stopped"
    seen = []
    summary = run_cohort(
        spec,
        root,
        workers=1,
        threads_per_worker=1,
        on_progress=seen.append,
        should_stop=lambda: any(e.event == "done" for e in seen),
    )
    assert summary.stopped and 1 <= summary.done < 8
    assert validate_layout(root) == []  # a partial cohort is still a valid dataset
    first = {p for p, e in Manifest.load(root).items.items() if e["state"] == "done"}
    stamps = {p: volume_path(root, p).stat().st_mtime_ns for p in first}
    # What a job killed while it rewrote participants.tsv leaves at the top: the resume clears it away.
    stale = root / ".participants.tsv.k1ll3d.partial.tsv"
    stale.write_text("participant_id\n")
    summary = resume_cohort(root, workers=1, threads_per_worker=1)
    assert not stale.exists()
    assert summary.done == 8 and summary.done_this_run == 8 - len(first)
    assert {p: volume_path(root, p).stat().st_mtime_ns for p in first} == stamps  # not made twice
    got = volumes(root)
    for participant, volume in ref.items():
        assert np.array_equal(got[participant], volume), participant
    assert len(Manifest.load(root).data["runs"]) == 2


def _cli_job(spec_or_dir, root, address, action="run"):
    args = [spec_or_dir, "--out", str(root)] if action == "run" else [str(root)]
    return subprocess.Popen(
        [sys.executable, "-m", "engine", "cohort", action, *args]
        + ["--address", address, "--workers", "1", "--threads", "1"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )


def _done(root: Path) -> int:
    try:
        items = json.loads((root / "code" / "volsynth" / "manifest.json").read_text())["items"]
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return sum(e["state"] == "done" for e in items.values())


def _wait_done(job, root: Path, count: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None and _done(root) < count:
        time.sleep(0.02)


@pytest.mark.slow
def test_ctrl_c_then_kill_then_resume(ray_runtime, cohort_model, tmp_path):
    """``volsynth cohort run`` stopped with Ctrl-C (exit 130), resumed and killed (SIGKILL), then resumed to
    the end: every volume made once, the dataset valid at every stage."""
    spec_path = tmp_path / "big.json"
    spec_path.write_text(json.dumps(spec_dict(cohort_model, name="killed-job", steps=12, seeds=3)))
    root = tmp_path / "job"

    job = _cli_job(str(spec_path), root, ray_runtime)
    try:
        _wait_done(job, root, 2)
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 130, err[-2000:]
    assert "volsynth: cancelled" in err
    first = Manifest.load(root)
    assert 2 <= first.count("done") < 12 and first.data["runs"][-1]["stopped"] is True
    assert validate_layout(root) == []

    job = _cli_job(str(spec_path), root, ray_runtime, action="resume")
    try:
        _wait_done(job, root, first.count("done") + 2)
    finally:
        job.kill()  # SIGKILL: no clean-up at all
        _, err = job.communicate(timeout=60)
    before = Manifest.load(root)
    done_before = {p for p, e in before.items.items() if e["state"] == "done"}
    assert first.count("done") + 2 <= len(done_before) < 12, err[-2000:]
    stamps = {p: volume_path(root, p).stat().st_mtime_ns for p in done_before}

    summary = resume_cohort(root, workers=1)  # threads: those the cohort started with (1), not 2 CPUs / 1
    assert summary.threads_per_worker == 1
    assert (summary.done, summary.failed) == (12, 0)
    assert summary.done_this_run == 12 - len(done_before)  # nothing done twice
    assert {p: volume_path(root, p).stat().st_mtime_ns for p in done_before} == stamps
    assert validate_layout(root) == []  # no partial files left by the killed job
    assert not list(root.rglob(".*partial*"))
    assert len(Manifest.load(root).data["runs"]) == 3


@pytest.mark.slow
def test_vault_target_keeps_no_plaintext_on_disk(ray_runtime, cohort_model, tmp_path):
    from engine.vault.crypto import KdfParams
    from engine.vault.store import Vault

    vault = Vault.create(
        tmp_path / "vault", "cohort passphrase", kdf=KdfParams(memory_kib=1024, iterations=1, lanes=1)
    )
    spec = CohortSpec.from_dict(
        spec_dict(cohort_model, name="vaulted", seeds=1, output={"target": "vault", "vault": str(vault.path)})
    )
    root = tmp_path / "state"
    summary = run_cohort(spec, root, workers=1, threads_per_worker=2, vault=vault)
    assert summary.done == 4
    items = vault.search(spec.cohort_id, kind="synthetic")
    assert sorted(i.label for i in items) == [f"{spec.cohort_id} sub-synth{i:04d}" for i in range(1, 5)]
    opened = vault.open_item(items[0].id)
    assert opened.data.std() > 0
    assert items[0].provenance["cohort"]["id"] == spec.cohort_id
    # A second run stores nothing twice.
    assert run_cohort(spec, root, workers=1, vault=vault).done_this_run == 0
    assert len(vault.search(spec.cohort_id)) == 4
    needle = np.ascontiguousarray(opened.data, dtype=np.float32).tobytes()[4096:4120]
    assert not list(root.rglob("*.nii*"))
    for path in [*root.rglob("*"), *vault.path.rglob("*")]:
        if path.is_file():
            assert needle not in path.read_bytes(), path
    vault.lock()


@pytest.mark.slow
def test_cli_run_plan_report_and_errors(ray_runtime, cohort_model, tmp_path, capsys):
    from engine.cli import main

    spec_path = tmp_path / "c.toml"
    spec_path.write_text(
        f'name = "cli"\nmodel = "{cohort_model}"\nsteps = 3\nseeds = 2\n'
        "[conditioning]\nventricle_volume = { values = [10, 30] }\n"
    )
    assert main(["cohort", "plan", str(spec_path)]) == 0
    out = capsys.readouterr()
    assert "sub-synth0004\t3\tdefault\t30" in out.out and ": 4 volumes of tiny-cohort" in out.err
    assert main(["cohort", "run", str(spec_path), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    out = capsys.readouterr()
    assert "cohort: 4/4 done, 0 failed, 0 retried" in out.err
    assert validate_layout(tmp_path / "out") == []
    assert main(["cohort", "resume", str(tmp_path / "out")]) == 0
    assert "this run 0 in" in capsys.readouterr().err
    assert main(["cohort", "report", str(tmp_path / "out")]) == 0
    assert Path(capsys.readouterr().out.strip()).is_file()
    spec_path.write_text('name = "cli"\nseeds = -1\n')
    assert main(["cohort", "run", str(spec_path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("volsynth: error: seeds must be") and err.count("\n") == 1
    assert main(["cohort", "resume", str(tmp_path)]) == 2
    assert "is not a cohort folder" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cohort_is_a_generator_of_progress_that_returns_its_summary(reference, tmp_path):
    """The same protocol as a backend's ``sample``: CohortProgress events, then the summary as the return."""
    from engine.api import drive
    from engine.cohort import CohortProgress, CohortSummary, cohort_events

    spec, _, _, _, ref = reference
    root = tmp_path / "generator"
    events = cohort_events(spec, root, workers=1, threads_per_worker=1)
    first = next(events)
    assert isinstance(first, CohortProgress) and first.event == "started"
    seen = []
    summary = drive(events, on_progress=seen.append)
    assert isinstance(summary, CohortSummary) and summary.done == 8 and not summary.stopped
    assert seen[-1].event == "finished" and all(isinstance(e, CohortProgress) for e in seen)
    assert [e.done for e in seen if e.event == "done"] == list(range(1, 9))
    for participant, volume in volumes(root).items():
        assert np.array_equal(volume, ref[participant]), participant


@pytest.mark.slow
def test_closing_a_cohort_generator_stops_the_run_and_keeps_what_is_done(reference, tmp_path):
    from engine.api import drive
    from engine.cohort import cohort_events

    spec, _, _, _, _ = reference
    root = tmp_path / "closed"
    seen = []
    stopped = drive(
        cohort_events(spec, root, workers=1, threads_per_worker=1),
        on_progress=seen.append,
        should_stop=lambda: any(e.event == "done" for e in seen),
    )
    assert stopped is None  # closed from outside: no summary
    runs = Manifest.load(root).data["runs"]
    assert runs[-1]["stopped"] is True and runs[-1]["ended_utc"]
    done = [p for p, e in Manifest.load(root).items.items() if e["state"] == "done"]
    assert 1 <= len(done) < 8 and all(volume_path(root, p).is_file() for p in done)
    assert validate_layout(root) == []
    assert resume_cohort(root, workers=1, threads_per_worker=1).done == 8
