"""The main window in a real window under Xvfb: generate, cancel, open, interact, errors, settings."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QTimer, QUrl
from PySide6.QtGui import QDropEvent

from engine.errors import InvalidRequest
from tests.app.conftest import SCREENSHOTS

pytestmark = pytest.mark.render


def _start(window, **changes) -> bool:
    """Start a run of the window's form with some fields changed (as if typed into the Generate panel)."""
    window.state.form.set(**changes)
    return window.generation.start()


def _wait_ended(qtbot, window, timeout=120_000) -> str:
    with qtbot.waitSignal(window.generation.ended, timeout=timeout) as blocker:
        pass
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=10_000)
    return blocker.args[0]


def _select(window, model_id):
    window.state.select_model(window.state.model_by_id(model_id))


def test_fresh_start_selects_a_model_and_notes_the_fallback(main_window):
    window = main_window
    assert window.state.selected_model is not None
    assert window.sampling_panel.model_box.count() == 3
    assert "not installed" in window.statusBar().currentMessage()  # no brain-t1-demo among the tiny models
    assert window.sampling_panel.generate_button.isEnabled()
    assert not window.sampling_panel.cancel_button.isEnabled()


def test_generate_with_tiny_model_shows_progress_and_result(qtbot, main_window):
    window = main_window
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(8)
    progressed = []
    window.state.progress_changed.connect(lambda tracker: progressed.append((tracker.stage, tracker.step)))
    qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)  # Ctrl+G
    assert window.generation.running
    assert _wait_ended(qtbot, window) == "finished"
    assert ("denoise", 8) in progressed and progressed[0][0] == "load"
    entry = window.state.shown
    assert entry.kind == "generated" and entry.shape == (16, 24, 16) and entry.synthetic
    assert entry.provenance["seed"] == window.sampling_panel.seed_spin.value()
    assert window.sampling_panel.progress_label.text().startswith("Done")
    assert "Auto" not in window.sampling_panel.progress_label.text()  # the device the engine chose: "cpu"
    assert "cpu" in window.device_label.text().lower()
    assert window.session_panel.list.count() == 1
    assert window.viewer.axial.current_pixels() is not None
    assert window.sampling_panel.generate_button.isEnabled()


@pytest.mark.slow
def test_cancel_mid_run_leaves_the_app_usable(qtbot, main_window):
    window = main_window
    _select(window, "tiny-pixel")
    window.sampling_panel.steps_spin.setValue(1000)
    window.sampling_panel.generate_button.click()
    thread = window.generation._job.worker_thread
    qtbot.waitUntil(lambda: window.state.progress.step >= 3, timeout=60_000)
    qtbot.keyClick(window, Qt.Key.Key_Escape)
    assert _wait_ended(qtbot, window) == "cancelled"
    assert thread.isFinished() and not window.runner.jobs and not window.generation.running
    assert window.state.progress.step < 1000
    assert window.sampling_panel.progress_label.text() == "Cancelled"
    assert (
        window.sampling_panel.generate_button.isEnabled()
        and not window.sampling_panel.cancel_button.isEnabled()
    )
    assert not any(v.kind == "preview" for v in window.state.volumes)
    # still usable: a short run afterwards finishes
    window.sampling_panel.steps_spin.setValue(3)
    window.sampling_panel.generate_button.click()
    assert _wait_ended(qtbot, window) == "finished"


def test_engine_errors_reach_a_dialog_with_the_engines_message(qtbot, main_window, error_dialogs):
    window = main_window
    seed = window.state.form.seed
    with pytest.raises(InvalidRequest, match="seed must be"):  # the form refuses it when it is set
        window.state.form.set(seed=-5)
    assert window.state.form.seed == seed
    assert _start(window, seed=0, device="cuda")  # fails in the worker: no GPU here
    assert _wait_ended(qtbot, window) == "failed"
    assert "cuda" in error_dialogs[-1][1] and "Traceback" not in error_dialogs[-1][1]
    assert not window.statusBar().currentMessage().startswith("Generating")  # the failed run is not "running"
    assert window.sampling_panel.generate_button.isEnabled()


@pytest.mark.slow
def test_open_nibabel_files_and_switch_between_them(qtbot, main_window, nibabel_data):
    window = main_window
    for name in ("example4d.nii.gz", "anatomical.nii"):
        with qtbot.waitSignal(window.volume_opened, timeout=20_000):
            window.open_path(nibabel_data / name)
    assert [v.name for v in window.state.volumes] == ["example4d.nii.gz", "anatomical.nii"]
    assert window.state.shown.shape == (33, 41, 25)
    assert window.state.volumes[0].shape == (128, 96, 24)  # first volume of the 4D file
    assert [a.text() for a in window.files.recent_menu.actions()] == ["anatomical.nii", "example4d.nii.gz"]
    window.session_panel.list.setCurrentRow(0)
    assert window.state.shown is window.state.volumes[0]
    qtbot.keyClick(window, Qt.Key.Key_BracketRight, Qt.KeyboardModifier.ControlModifier)
    assert window.state.shown is window.state.volumes[1]


def test_drag_and_drop_opens_nifti(qtbot, main_window, nibabel_data):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(nibabel_data / "anatomical.nii"))])
    event = QDropEvent(
        QPointF(300, 300),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    with qtbot.waitSignal(main_window.volume_opened, timeout=20_000):
        main_window.dropEvent(event)
    assert main_window.state.shown.name == "anatomical.nii"


def test_corrupt_file_shows_an_error_and_the_app_goes_on(
    qtbot, main_window, tmp_path, error_dialogs, nibabel_data
):
    bad = tmp_path / "broken.nii.gz"
    bad.write_bytes((nibabel_data / "example4d.nii.gz").read_bytes()[:300])
    main_window.open_path(bad)
    qtbot.waitUntil(lambda: bool(error_dialogs), timeout=20_000)
    title, message = error_dialogs[-1]
    assert title == "Cannot open file" and "broken.nii.gz" in message and "Traceback" not in message
    assert main_window.state.volumes == []
    with qtbot.waitSignal(main_window.volume_opened, timeout=20_000):
        main_window.open_path(nibabel_data / "anatomical.nii")


def test_window_level_and_crosshair_interactions_change_the_drawing(qtbot, main_window, nibabel_data):
    window = main_window
    with qtbot.waitSignal(window.volume_opened, timeout=20_000):
        window.open_path(nibabel_data / "anatomical.nii")
    axial, coronal, sagittal = window.viewer.slice_views
    qtbot.waitUntil(lambda: axial.draw_count > 0)
    before = axial.current_pixels()
    window_before = window.state.window

    # right-drag: window/level
    start = axial.rect().center()
    qtbot.mousePress(axial, Qt.MouseButton.RightButton, pos=start)
    qtbot.mouseMove(axial, start + QPoint(80, -60))
    qtbot.mouseRelease(axial, Qt.MouseButton.RightButton, pos=start + QPoint(80, -60))
    assert window.state.window != window_before and window.state.window_preset == "Custom"
    assert window.viewer_toolbar.preset_box.currentText() == "Custom"
    assert not np.array_equal(axial.current_pixels(), before)

    # left click: the crosshair moves; the coronal and sagittal views show other slices
    coronal_before, sagittal_before = coronal.current_pixels(), sagittal.current_pixels()
    voxel_before = window.state.crosshair_voxel()
    rect = axial.image_rect()
    qtbot.mouseClick(
        axial,
        Qt.MouseButton.LeftButton,
        pos=QPoint(int(rect.left() + rect.width() * 0.2), int(rect.top() + rect.height() * 0.25)),
    )
    voxel_after = window.state.crosshair_voxel()
    assert voxel_after[2] == voxel_before[2]  # axial click keeps the axial slice
    assert voxel_after[0] != voxel_before[0] and voxel_after[1] != voxel_before[1]
    assert not np.array_equal(coronal.current_pixels(), coronal_before)
    assert not np.array_equal(sagittal.current_pixels(), sagittal_before)
    # radiological: the left part of the axial view is the patient's right (high x)
    assert voxel_after[0] > window.state.shown.shape[0] // 2
    assert "voxel (" in window.readout_label.text() and "RAS (" in window.readout_label.text()

    # wheel: next axial slice
    axial_pixels = axial.current_pixels()
    axial.step_slice(3)
    assert window.state.crosshair_voxel()[2] == voxel_after[2] + 3
    assert not np.array_equal(axial.current_pixels(), axial_pixels)

    # presets and convention
    window.state.apply_window_preset("Full range")
    assert window.viewer_toolbar.preset_box.currentText() == "Full range"
    rad = axial.current_pixels()
    window.state.set_convention("neurological")
    assert np.array_equal(axial.current_pixels(), rad[:, ::-1])


@pytest.mark.slow
def test_save_writes_nifti_with_provenance_sidecar(qtbot, main_window, tmp_path):
    from engine.nifti.io import load_nifti

    window = main_window
    _select(window, "tiny-pixel")
    window.sampling_panel.steps_spin.setValue(2)
    window.sampling_panel.generate_button.click()
    assert _wait_ended(qtbot, window) == "finished"
    target = tmp_path / "out.nii.gz"
    window.save_entry(window.state.shown, target)
    qtbot.waitUntil(lambda: not window.runner.jobs, timeout=20_000)
    assert not window.errors_shown and target.is_file()
    sidecar = json.loads((tmp_path / "out.json").read_text())
    assert sidecar["model"]["id"] == "tiny-pixel" and sidecar["synthetic"] is True
    loaded = load_nifti(target)
    assert loaded.synthetic and np.allclose(loaded.data, window.state.shown.data, atol=1e-5)
    assert str(target.resolve()) in window.state.recent.paths()


def test_settings_persist_between_runs(qtbot, themed_app, registry, qt_settings, error_dialogs, nibabel_data):
    from app.window.main_window import MainWindow

    first = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(first)
    first.show()
    first.resize(1234, 777)
    _select(first, "tiny-rflow")
    first.state.set_convention("neurological")
    first.state.apply_window_preset("Full range")
    first.state.recent.add(nibabel_data / "anatomical.nii")
    first.close()

    second = MainWindow(registry=registry, settings=qt_settings, enable_3d=False, preload_torch=False)
    qtbot.addWidget(second)
    assert second.state.selected_model.id == "tiny-rflow"
    assert (
        second.state.convention == "neurological"
        and second.viewer_toolbar.convention_box.currentText() == "Neurological"
    )
    assert second.state.window_preset == "Full range"
    assert second.size().width() == 1234
    assert [a.text() for a in second.files.recent_menu.actions()] == ["anatomical.nii"]
    second.close()


def test_open_model_folder_and_bad_folder(qtbot, main_window, tmp_path, error_dialogs):
    from engine.testing import make_tiny_model

    folder = make_tiny_model(tmp_path / "extra", model_id="tiny-extra", kind="pixel", conditioned=False)
    assert main_window.open_model_folder(folder)
    assert main_window.state.selected_model.id == "tiny-extra"
    assert main_window.sampling_panel.model_box.currentData() == "tiny-extra"
    assert not main_window.open_model_folder(tmp_path)
    assert "neither a VolSynth model folder" in error_dialogs[-1][1]


def test_open_model_folder_keeps_the_switch_note_in_the_status_bar(qtbot, main_window, tmp_path, monkeypatch):
    """Selecting the opened model says what the switch reset; the window's "Model ... opened from" replaced it."""
    from PySide6.QtWidgets import QFileDialog

    from engine.testing import make_tiny_model

    folder = make_tiny_model(tmp_path / "extra", model_id="tiny-extra", kind="pixel", conditioned=False)
    main_window.sampling_panel.steps_spin.setValue(7)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *args: str(folder))
    main_window.window_actions.open_model.trigger()  # Generate > Open Model Folder...
    assert main_window.state.selected_model.id == "tiny-extra"
    message = main_window.statusBar().currentMessage()
    assert message.startswith(f"Model {main_window.state.selected_model.spec.name} opened from {folder}. ")
    assert "steps 7 \u2192 " in message, message


@pytest.mark.slow
def test_event_loop_stays_responsive_during_generation(qtbot, main_window):
    """Longest gap between ticks of a 10 ms timer while a run (with previews) goes on. Reported, not asserted."""
    window = main_window
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(40)
    ticks: list[float] = []
    timer = QTimer(interval=10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start()
    previews = []
    window.generation.preview_drawn.connect(previews.append)
    window.sampling_panel.generate_button.click()
    assert _wait_ended(qtbot, window) == "finished"
    timer.stop()
    gaps = np.diff(ticks) * 1000
    assert len(gaps) > 10 and previews
    report = (
        f"event loop during generation: {len(ticks)} ticks, max gap {gaps.max():.1f} ms, "
        f"p99 {np.percentile(gaps, 99):.1f} ms, median {np.median(gaps):.1f} ms, {len(previews)} previews drawn"
    )
    print("\n" + report)


def test_a_preview_behind_the_bar_says_the_run_is_further_on(qtbot, themed_app):
    """Previews come every few steps (and late behind a slow decoder): the image stood still while the bar
    moved, with nothing to say the run was working. The tag now says where the run is. The slice view alone,
    fed the state a run gives it (a preview of step 8 of 400 shown, the run further on); a real run's
    previews and bar are checked in test_user_paths.py."""
    from app.core.session import AppState
    from app.viewer.slice_overlay import corner_texts
    from app.viewer.slice_view import SliceView

    state = AppState()
    view = SliceView(state, "axial")
    qtbot.addWidget(view)
    view.resize(640, 480)
    view.show()
    qtbot.waitExposed(view)
    state.set_job_running(True)
    state.report_progress("denoise", 8, 400, 1.0)
    data = np.random.default_rng(0).random((16, 24, 16), dtype=np.float32)
    state.show_preview(data, np.diag([2.0, 2.0, 2.0, 1.0]), 8, 400)
    # The image and the bar at the same step: the tag says the run goes on all the same (it keeps its length).
    assert corner_texts(view, 0)["tag"] == "PREVIEW step 8/400 (x\u2080 estimate) \u00b7 run at step 8\u2026"

    updates: list[bool] = []
    view.update = lambda *args: updates.append(True)  # the Python call the state's progress event makes
    state.report_progress("denoise", 11, 400, 1.5)  # the bar moves on, no new preview yet
    assert updates  # the view is repainted for the progress alone
    full, compact = corner_texts(view, 0)["tag"], corner_texts(view, 1)["tag"]
    assert full == "PREVIEW step 8/400 (x\u2080 estimate) \u00b7 run at step 11\u2026"
    assert compact == "PREVIEW step 8/400\u2026"  # a compact overlay keeps only the ellipsis
    del view.update
    view.grab().save(str(SCREENSHOTS / "preview-behind-the-bar.png"))

    state.set_job_running(False)  # the run is over: the tag no longer speaks of it
    assert corner_texts(view, 0)["tag"] == "PREVIEW step 8/400 (x\u2080 estimate)"
    view.close()
