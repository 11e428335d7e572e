"""What a person does in the main window, done the way they do it: key presses, clicks, typed text.

Each test drives the real window under Xvfb through QActions, shortcuts and mouse events, never the methods
behind them (Save As once passed its tests while its menu item stayed disabled).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox

from tests.app.modal import answer_modal
from tests.app.runs import GENERATION_TIMEOUT_MS, generate

pytestmark = pytest.mark.render


def _volume_file(folder: Path) -> Path:
    data = np.random.default_rng(0).normal(100, 20, (12, 14, 10)).astype(np.float32)
    affine = np.diag([1.5, 1.5, 2.0, 1.0])
    affine[:3, 3] = [-9, -10, -10]
    path = folder / "scan.nii.gz"
    nib.save(nib.Nifti1Image(data, affine), path)
    return path


def _select(window, model_id: str) -> None:
    window.state.select_model(window.state.model_by_id(model_id))


def test_open_from_the_command_line_then_ctrl_s_writes_a_file_that_reads_back_equal(
    qtbot, themed_app, registry, qt_settings, error_dialogs, tmp_path
):
    from app.__main__ import open_window, parse_args

    source = _volume_file(tmp_path)
    window = open_window(
        parse_args([str(source), "--no-3d"]), registry=registry, settings=qt_settings, preload_torch=False
    )
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.volume_opened, timeout=60_000):
        pass
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    assert window.window_actions.save.isEnabled()  # the menu item a person would pick is on

    target = tmp_path / "saved" / "copy.nii.gz"
    target.parent.mkdir()
    qt_settings.setValue("files/last_save_dir", str(target.parent))  # where the dialog opens
    errors: list = []

    def type_name(dialog) -> None:
        assert isinstance(dialog, QFileDialog), type(dialog)
        name = dialog.findChild(QLineEdit, "fileNameEdit")
        name.selectAll()
        qtbot.keyClicks(name, "copy")  # the window adds .nii.gz
        qtbot.keyClick(name, Qt.Key.Key_Return)

    answer_modal(type_name, errors)
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)  # Ctrl+S
    assert not errors
    qtbot.waitUntil(
        lambda: target.is_file() and "Saved" in window.statusBar().currentMessage(), timeout=60_000
    )
    original, written = nib.load(source), nib.load(target)
    assert np.array_equal(np.asarray(original.dataobj), np.asarray(written.dataobj))
    assert np.allclose(original.affine, written.affine)
    assert target.with_name("copy.json").is_file()  # the provenance sidecar beside it
    assert not error_dialogs
    window.close()


def test_generate_then_delete_removes_the_volume_from_the_session(qtbot, main_window):
    window = main_window
    _select(window, "tiny-pixel")
    assert generate(qtbot, window, steps=2) == "finished"
    session = window.session_panel
    assert session.list.count() == 1 and window.state.volumes[0].kind == "generated"
    name = window.state.volumes[0].name
    assert "seed" in name and session.list.item(0).toolTip().startswith(name)

    session.list.setFocus()
    session.list.setCurrentRow(0)
    errors: list = []
    answer_modal(lambda box: box.button(QMessageBox.StandardButton.Yes).click(), errors)  # "never saved"
    qtbot.keyClick(session.list, Qt.Key.Key_Delete)
    assert not errors
    qtbot.waitUntil(lambda: not window.state.volumes, timeout=10_000)
    assert session.list.count() == 0 and window.state.shown is None


def test_f2_renames_a_session_volume(qtbot, main_window, tmp_path):
    window = main_window
    with qtbot.waitSignal(window.volume_opened, timeout=60_000):
        window.open_path(_volume_file(tmp_path))
    session = window.session_panel
    session.list.setFocus()
    session.list.setCurrentRow(0)
    qtbot.keyClick(session.list, Qt.Key.Key_F2)
    editor = session.list.findChild(QLineEdit)
    qtbot.waitUntil(lambda: editor is not None and editor.isVisible(), timeout=5_000)
    editor.selectAll()
    qtbot.keyClicks(editor, "baseline T1")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.state.volumes[0].name == "baseline T1", timeout=5_000)


def test_wheel_over_the_generate_panel_scrolls_it_and_leaves_the_sampler_alone(qtbot, main_window):
    window = main_window
    _select(window, "tiny-latent")
    window.resize(1024, 700)
    panel = window.sampling_panel
    qtbot.waitUntil(lambda: panel.scroll_area.verticalScrollBar().maximum() > 0, timeout=10_000)
    box = panel.sampler_box
    assert box.count() > 1
    before_sampler, before_seed = window.state.form.sampler, window.state.form.seed
    bar = panel.scroll_area.verticalScrollBar()
    bar.setValue(0)
    centre = QPointF(box.rect().center())
    for target in (box, panel.seed_spin):
        event = QWheelEvent(
            QPointF(target.rect().center()),
            QPointF(target.mapToGlobal(QPoint(*[int(v) for v in (centre.x(), centre.y())]))),
            QPoint(0, 0),
            QPoint(0, -120),  # one notch down
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(target, event)
    assert window.state.form.sampler == before_sampler and window.state.form.seed == before_seed
    assert bar.value() > 0  # the panel scrolled instead


def test_progress_stays_visible_with_the_vault_dock_open_at_1024x700(qtbot, main_window, screenshot):
    window = main_window
    window.resize(1024, 700)
    vault_dock = next(d for name, d in window.docks.items() if "vault" in name.lower())
    vault_dock.show()
    vault_dock.raise_()
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(40)
    seen = []

    def look(step: int) -> None:
        panel = window.sampling_panel
        seen.append(
            (
                window.generation.status_progress.isVisible(),
                panel.progress_bar.visibleRegion().isEmpty(),
                panel.generate_button.visibleRegion().isEmpty(),
            )
        )
        if len(seen) == 1:
            screenshot(window, "midrun-vault-1024x700")

    window.generation.preview_drawn.connect(look)
    with qtbot.waitSignal(window.generation.ended, timeout=GENERATION_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    assert seen, "no preview was drawn during the run"
    assert all(status and not bar_hidden and not button_hidden for status, bar_hidden, button_hidden in seen)
    qtbot.waitUntil(lambda: not window.state.job_running, timeout=10_000)
    assert not window.generation.status_progress.isVisible()  # gone once the run ended


def test_the_preview_says_which_step_its_image_is_from_in_step_with_the_bar(qtbot, main_window, screenshot):
    window = main_window
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(12)
    panel, axial = window.sampling_panel, window.viewer.axial
    seen = []

    def look(step: int) -> None:  # each preview as it is drawn, with the bar at that moment
        entry = window.state.shown
        bar = panel.progress_bar.text()
        seen.append(
            (step, entry.preview_step, axial.overlay_texts().get("tag"), bar, window.state.progress.stage)
        )
        if len(seen) == 1:
            screenshot(window, "14-preview-step-with-the-bar")

    window.generation.preview_drawn.connect(look)
    with qtbot.waitSignal(window.generation.ended, timeout=GENERATION_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    assert seen, "no preview was drawn during the run"
    for step, preview_step, tag, bar, stage in seen:
        assert preview_step == (step, 12)
        assert tag.startswith(f"PREVIEW step {step}/12")  # the label names its image's step (any width)
        if stage == "denoise":
            bar_step = int(bar.split("/")[0])
            assert bar_step >= step  # the bar never shows an older step than the preview
        else:  # the timer drew the last pending preview after denoising ended: the bar shows the later stage
            assert "/" not in bar and bar.endswith("%"), (stage, bar)
    # The first preview is drawn as its step arrives (no timer tick in between): label and bar agree.
    first_step, _, _, first_bar, _ = seen[0]
    assert first_bar == f"{first_step}/12"
    assert not any(e.kind == "preview" for e in window.state.volumes)


def test_choosing_a_volume_during_a_run_shows_it(qtbot, main_window, tmp_path):
    window = main_window
    with qtbot.waitSignal(window.volume_opened, timeout=60_000):
        window.open_path(_volume_file(tmp_path))
    opened = window.state.volumes[0]
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(60)
    chosen = []

    def choose(step: int) -> None:
        if not chosen:
            chosen.append(step)
            window.session_panel.list.setCurrentRow(0)  # the click, as the list reports it

    window.generation.preview_drawn.connect(choose)
    with qtbot.waitSignal(window.generation.ended, timeout=GENERATION_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    assert chosen
    assert window.state.shown is opened  # neither later previews nor the result took the view back
    assert len(window.state.volumes) == 2


def test_quitting_during_a_run_asks_and_no_keeps_the_run(
    qtbot, main_window, monkeypatch, quit_without_asking
):
    from app.window.main_window import MainWindow

    monkeypatch.setattr(MainWindow, "confirm_quit_during_run", quit_without_asking)  # the real question
    window = main_window
    _select(window, "tiny-latent")
    window.sampling_panel.steps_spin.setValue(200)
    asked, outcomes = [], []
    window.generation.ended.connect(outcomes.append)

    def answer(parent, title, text, *args, **kwargs):
        asked.append(text)
        return QMessageBox.StandardButton.No if len(asked) == 1 else QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(answer))
    with qtbot.waitSignal(window.generation.preview_drawn, timeout=GENERATION_TIMEOUT_MS):
        qtbot.keyClick(window, Qt.Key.Key_G, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)  # Ctrl+Q: "No"
    assert len(asked) == 1 and "generation is running" in asked[0]
    assert window.isVisible() and window.generation.running
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)  # Ctrl+Q again: "Yes"
    assert len(asked) == 2
    qtbot.waitUntil(lambda: not window.isVisible() and not window.runner.jobs, timeout=60_000)
    qtbot.waitUntil(lambda: bool(outcomes), timeout=30_000)
    assert outcomes == ["cancelled"]  # stopped at its next step, not run to the end


@pytest.mark.slow
def test_save_state_is_shown_and_ctrl_s_saves_to_the_same_file_once_saved(
    qtbot, main_window, tmp_path, screenshot, monkeypatch
):
    window = main_window
    _select(window, "tiny-pixel")
    window.state.form.set(batch_size=2)  # two volumes from one run
    assert generate(qtbot, window, steps=2) == "finished"
    qtbot.waitUntil(lambda: not window.state.job_running, timeout=10_000)
    first, second = window.state.volumes
    session = window.session_panel
    # Never saved: the title has the modified mark, the list draws the names in italics with "*".
    assert window.isWindowModified() and window.state.shown.name in window.windowTitle()
    assert all(session.list.item(row).data(Qt.ItemDataRole.UserRole + 1) for row in range(2))
    assert "not saved yet" in session.details.text()

    target = tmp_path / "first.nii.gz"
    qt_settings_dir = str(tmp_path)
    window.settings.setValue("files/last_save_dir", qt_settings_dir)
    session.list.setCurrentRow(0)  # show the first volume
    asked: list = []
    real_dialog = QFileDialog.getSaveFileName

    def count_dialogs(*args, **kwargs):
        asked.append(args)
        return real_dialog(*args, **kwargs)

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(count_dialogs))
    errors: list = []

    def type_name(dialog) -> None:
        name = dialog.findChild(QLineEdit, "fileNameEdit")
        name.selectAll()
        qtbot.keyClicks(name, "first")
        qtbot.keyClick(name, Qt.Key.Key_Return)

    answer_modal(type_name, errors)
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)  # Ctrl+S: asks the first time
    assert not errors and len(asked) == 1
    qtbot.waitUntil(lambda: first.saved_file == target and target.is_file(), timeout=60_000)
    assert not window.isWindowModified() and first.name in window.windowTitle()
    assert not session.list.item(0).data(Qt.ItemDataRole.UserRole + 1)  # the mark is gone...
    assert session.list.item(1).data(Qt.ItemDataRole.UserRole + 1)  # ...the other is still unsaved
    assert f"saved to {target}" in session.details.text().replace("\u200b", "").replace("&#8203;", "")
    assert f"saved to {target}" in session.list.item(0).toolTip()
    screenshot(window, "save-state-after-ctrl-s")

    target.unlink()
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)  # Ctrl+S again: same file
    qtbot.waitUntil(target.is_file, timeout=60_000)
    assert len(asked) == 1  # no dialog: Save wrote to the file it was saved to

    def cancel(dialog) -> None:
        dialog.reject()

    answer_modal(cancel, errors)
    qtbot.keyClick(
        window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )  # Ctrl+Shift+S: Save As always asks
    assert len(asked) == 2 and not errors
    assert window.window_actions.save_as.isEnabled() and window.window_actions.save.text() == "&Save"
