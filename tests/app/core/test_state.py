"""Qt-free application state: runs without a QApplication (and must not import Qt)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.core.display import format_duration
from app.core.progress import ProgressTracker
from app.core.session import AppState, RecentFiles
from app.core.volumes import VolumeEntry, file_stem, preview_affine, voxel_to_ras, window_for_preset


def _entry(shape=(10, 12, 8), spacing=2.0, name="vol", kind="opened"):
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    affine = np.diag([spacing, spacing, spacing, 1.0])
    affine[:3, 3] = [-10, -12, -8]
    return VolumeEntry(name=name, data=data, affine=affine, kind=kind)


def test_core_modules_import_no_qt():
    # Every module of app/core, imported in a fresh interpreter, pulls in neither Qt, VTK nor torch.
    child = Path(__file__).with_name("child_import_app_core.py")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, cwd=root, env=env)
    assert done.returncode == 0, done.stdout + done.stderr


def test_set_models_falls_back_to_first_with_a_note(registry):
    state = AppState()
    selected = []
    state.model_selected.connect(selected.append)
    note = state.set_models(registry.list(), preferred="brain-t1-demo")
    assert "brain-t1-demo" in note and "not installed" in note
    assert state.selected_model is registry.list()[0] or state.selected_model.id == registry.list()[0].id
    assert selected and selected[-1] is state.selected_model
    assert state.set_models(registry.list(), preferred="tiny-pixel") == ""
    assert state.selected_model.id == "tiny-pixel"
    assert "No models" in AppState().set_models([], preferred="x")


def test_add_and_show_volumes_keeps_crosshair_inside():
    state = AppState()
    shown = []
    state.shown_changed.connect(shown.append)
    first = state.add_volume(_entry(name="a"))
    assert state.shown is first and shown[-1] is first
    assert np.allclose(state.crosshair_ras, first.center_ras())
    state.set_crosshair([1000.0, 0.0, 0.0])  # clamped to the volume's last voxel along x
    assert state.crosshair_voxel()[0] == first.shape[0] - 1
    state.add_volume(_entry(name="a2"))  # same geometry: the crosshair stays
    assert state.crosshair_voxel()[0] == first.shape[0] - 1
    second = state.add_volume(_entry(shape=(4, 4, 4), name="b"))  # other geometry: back to its centre
    assert state.shown is second and np.allclose(state.crosshair_ras, second.center_ras())
    assert [v.name for v in state.volumes] == ["a", "a2", "b"]
    state.remove_volume(second)
    assert state.shown is state.volumes[-1]


def test_window_presets_and_custom_window():
    state = AppState()
    entry = state.add_volume(_entry())
    full = window_for_preset(entry, "Full range")
    assert full == pytest.approx(
        (entry.data.max() - entry.data.min(), (entry.data.max() + entry.data.min()) / 2)
    )
    state.apply_window_preset("High contrast (10-90%)")
    assert state.window[0] < full[0]
    seen = []
    state.window_changed.connect(lambda w, lv: seen.append((w, lv)))
    state.set_window(-5, 3)
    assert state.window_preset == "Custom" and state.window[0] > 0 and seen[-1][1] == 3


def test_recent_files_most_recent_first_no_duplicates(tmp_path):
    recent = RecentFiles(limit=3)
    for name in ["a", "b", "c", "a", "d"]:
        recent.add(tmp_path / f"{name}.nii")
    assert [p.rsplit("/", 1)[-1] for p in recent.paths()] == ["d.nii", "a.nii", "c.nii"]


def test_progress_tracker_rate_and_eta():
    tracker = ProgressTracker()
    assert tracker.text() == "Ready"
    tracker.update("load", 0, 1, 0.0)
    assert tracker.steps_per_second is None and "Loading" in tracker.text()
    tracker.update("denoise", 0, 50, 2.0)
    tracker.update("denoise", 10, 50, 4.0)
    assert tracker.steps_per_second == pytest.approx(5.0)
    assert tracker.eta_s == pytest.approx(8.0)
    assert tracker.percent == 20
    assert "Step 10/50" in tracker.text() and "5.00 it/s" in tracker.text() and "ETA 0:08" in tracker.text()
    tracker.update("decode", 50, 50, 14.0)
    assert tracker.percent == 100 and "Decoding" in tracker.text()
    assert format_duration(3725) == "1:02:05"


def test_preview_affine_matches_strided_voxels():
    model_affine = np.diag([2.0, 2.0, 2.0, 1.0])
    model_affine[:3, 3] = [-79, -95, -79]
    affine = preview_affine(model_affine, (80, 96, 80), (40, 48, 40))
    # preview voxel (3, 4, 5) is output voxel (6, 8, 10)
    assert np.allclose(voxel_to_ras(affine, (3, 4, 5)), voxel_to_ras(model_affine, (6, 8, 10)))
    # A short axis is ambiguous from shapes alone (9 voxels at stride 4 keep 3, as at stride 3); the
    # engine's stride settles it.
    exact = preview_affine(model_affine, (80, 96, 9), (20, 24, 3), stride=4)
    assert np.allclose(voxel_to_ras(exact, (1, 1, 2)), voxel_to_ras(model_affine, (4, 4, 8)))
    guessed = preview_affine(model_affine, (80, 96, 9), (20, 24, 3))
    assert not np.allclose(voxel_to_ras(guessed, (1, 1, 2)), voxel_to_ras(model_affine, (4, 4, 8)))


def test_add_result_adds_each_batch_item():
    from engine.api import SamplingRequest, SamplingResult

    volumes = np.random.default_rng(0).random((2, 1, 4, 5, 6), dtype=np.float32)
    result = SamplingResult(
        volumes=volumes,
        affine=np.eye(4),
        request=SamplingRequest(seed=3),
        provenance={"model": {"id": "tiny"}, "seed": 3, "optimization": {"requested": {"autocast": "bf16"}}},
    )
    state = AppState()
    entries = state.add_result(result)
    # The seed and what set the run apart (its settings; the time for plain fp32); never two alike.
    assert [e.name for e in entries] == ["tiny seed 3 \u00b7 bf16 #1", "tiny seed 3 \u00b7 bf16 #2"]
    again = state.add_result(result, show=False)
    assert [e.name for e in again] == ["tiny seed 3 \u00b7 bf16 #1 (2)", "tiny seed 3 \u00b7 bf16 #2 (2)"]
    assert state.shown is entries[0]
    assert state.rename_volume(entries[0], "  my   brain ") == "my brain"
    assert state.rename_volume(entries[1], "my brain") == "my brain (2)"
    assert state.rename_volume(entries[1], "   ") == "my brain (2)"  # blank: the old name stays
    assert all(e.synthetic and e.kind == "generated" for e in entries)
    assert state.shown is entries[0] and entries[1].provenance["batch_index"] == 1
    assert "SYNTHETIC" in entries[0].describe()


def test_optimization_lines_list_what_applied_then_why_not():
    from app.core.display import optimization_lines

    report = {
        "tf32": {"requested": True, "applied": False, "reason": "TF32 needs an NVIDIA GPU"},
        "autocast": {"requested": "bf16", "applied": True, "reason": "bf16 autocast on the CPU"},
        "attention": {"requested": "default", "applied": False, "reason": ""},
        "compile_mode": {"requested": None, "applied": False, "reason": ""},
    }
    assert optimization_lines(report) == [
        "optimization:",
        "  \u2713 Autocast bf16",
        "  \u2013 TF32: TF32 needs an NVIDIA GPU",
    ]
    assert optimization_lines({"tf32": {"requested": False, "applied": False, "reason": ""}}) == [
        "optimization: none (exact fp32)"
    ]


def test_file_stem_is_safe_on_every_file_system():
    assert file_stem("brain-t1-demo seed 7 \u00b7 14:03:22 #2") == "brain-t1-demo_seed_7_14-03-22_2"
    assert file_stem("scan.nii.gz") == "scan" and file_stem("A.NII") == "A"
    assert file_stem("  / : ") == "-" and file_stem("...") == "volume"
