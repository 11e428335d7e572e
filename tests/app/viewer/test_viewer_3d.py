"""The 3D view (pyvista on Xvfb + Mesa) in the viewer over ``AppServices`` (tests/app/viewer/rig.py), without the
main window: threshold control, a mode change that leaves the slice grid alone, the SYNTHETIC mark in its PNG,
screenshots of the viewer at two sizes, and what a run (the generation installed beside it) does to it."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication

from tests.app.viewer.rig import add_generation, add_tissue_volume
from tests.app.viewer_helpers import choose, type_into, write_volume

pytestmark = pytest.mark.render

SYNTHETIC_RGB = np.array([0xC6, 0x78, 0xDD])  # app/viewer/view3d.py SYNTHETIC_COLOUR


def _grid(rig) -> list:
    return [frame.geometry() for frame in rig.viewer.frames.values()]


@pytest.mark.slow
def test_threshold_in_intensity_units_and_modes_that_leave_the_grid_alone(qtbot, viewer_rig_3d, tmp_path):
    rig = viewer_rig_3d
    state, view3d = rig.state, rig.viewer.view3d
    ramp = np.arange(40 * 48 * 36, dtype=np.float32).reshape(40, 48, 36) % 1000  # integers 0..999
    entry = rig.open(qtbot, write_volume(tmp_path / "ramp.nii.gz", ramp))
    qtbot.waitUntil(lambda: view3d.render_count > 0, timeout=30_000)
    grid = _grid(rig)

    state.set_render_preset("Iso-surface")  # as View > 3D Rendering > Iso-surface sets it
    assert view3d.preset_box.currentText() == "Iso-surface"
    qtbot.waitUntil(view3d.iso_slider.isVisible, timeout=5_000)
    assert _grid(rig) == grid  # the slice views did not move
    assert view3d.iso_slider.width() >= 100 and view3d.iso_value.isVisible()
    low, high = entry.percentile(1.0), entry.percentile(99.9)
    assert (view3d.iso_value.minimum(), view3d.iso_value.maximum()) == pytest.approx((low, high), abs=0.5)
    assert 0 <= low < high <= 999 and view3d.iso_value.decimals() == 0  # integer data: whole numbers
    assert view3d.iso_value.value() == pytest.approx(state.iso_threshold(), abs=0.5)

    renders = view3d.render_count
    type_into(qtbot, view3d.iso_value, "600")
    assert state.iso_threshold() == pytest.approx(600.0)
    assert view3d.iso_slider.value() == pytest.approx((600 - low) / (high - low) * 1000, abs=1)
    qtbot.waitUntil(lambda: view3d.render_count > renders, timeout=30_000)
    assert "iso" in view3d.plotter.actors

    view3d.iso_slider.setFocus()
    qtbot.keyClick(view3d.iso_slider, Qt.Key.Key_PageDown)
    assert state.iso_threshold() < 600.0
    assert view3d.iso_value.value() == pytest.approx(state.iso_threshold(), abs=0.5)

    for preset in ("MIP", "Slices only", "MRI grey"):
        choose(qtbot, view3d.preset_box, preset)
        assert state.render_preset == preset and not view3d.iso_slider.isVisible()
        QApplication.processEvents()  # any layout request the mode change posted runs before comparing
        assert _grid(rig) == grid, preset
    choose(qtbot, view3d.preset_box, "Iso-surface")  # the box chooses it too
    assert state.render_preset == "Iso-surface"
    qtbot.waitUntil(view3d.iso_slider.isVisible, timeout=5_000)


def _synthetic_pixels(path) -> int:
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB32)
    raw = np.frombuffer(image.constBits(), dtype=np.uint8).reshape(
        image.height(), image.bytesPerLine() // 4, 4
    )
    rgb = raw[:, : image.width(), 2::-1].astype(int)
    corner = rgb[: image.height() // 4, image.width() // 2 :]
    return int((np.abs(corner - SYNTHETIC_RGB).max(axis=2) < 40).sum())


@pytest.mark.slow
def test_the_3d_png_of_a_synthetic_volume_carries_the_synthetic_mark(qtbot, viewer_rig_3d, tmp_path):
    rig = viewer_rig_3d
    view3d = rig.viewer.view3d
    blob = np.zeros((40, 48, 36), dtype=np.float32)
    blob[10:30, 12:36, 8:28] = 500.0

    rig.open(qtbot, write_volume(tmp_path / "synthetic.nii.gz", blob, synthetic=True))
    assert rig.state.shown.synthetic
    # What File > Save 3D Screenshot... writes where the user chose
    with qtbot.waitSignal(view3d.screenshot_saved, timeout=30_000) as saved:
        view3d.save_screenshot(tmp_path / "synthetic-3d.png")
    assert saved.args == [str(tmp_path / "synthetic-3d.png")]
    rig.open(qtbot, write_volume(tmp_path / "scan.nii.gz", blob, synthetic=False))
    with qtbot.waitSignal(view3d.screenshot_saved, timeout=30_000):
        view3d.save_screenshot(tmp_path / "scan-3d.png")

    assert _synthetic_pixels(tmp_path / "synthetic-3d.png") > 30
    assert _synthetic_pixels(tmp_path / "scan-3d.png") == 0


@pytest.mark.slow
def test_screenshots_of_the_viewer_at_1600x1000_and_1024x700(qtbot, viewer_rig_3d, mni_t1, screenshot):
    rig = viewer_rig_3d
    window, view3d = rig.host, rig.viewer.view3d
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: window.width() == 1600, timeout=10_000)
    rig.open(qtbot, mni_t1)
    qtbot.waitUntil(lambda: view3d.render_count > 0, timeout=60_000)
    axial = rig.viewer.axial
    qtbot.mouseClick(axial, Qt.MouseButton.LeftButton, pos=axial.rect().center())
    qtbot.wait(300)  # the picture settles (VTK repaints after a resize); nothing is asserted on time
    shots = [screenshot(window, "viewer-1600x1000")]

    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 700, timeout=10_000)
    qtbot.wait(300)
    shots.append(screenshot(window, "viewer-1024x700"))

    # zoomed in, nearest neighbour, iso-surface with its threshold row
    for _ in range(3):
        qtbot.keyClick(axial, Qt.Key.Key_Plus)
    choose(qtbot, rig.toolbar.interpolation_box, "Nearest")
    choose(qtbot, view3d.preset_box, "Iso-surface")
    qtbot.waitUntil(view3d.iso_slider.isVisible, timeout=5_000)
    qtbot.wait(300)
    shots.append(screenshot(window, "viewer-1024x700-zoomed-iso"))
    qtbot.mouseDClick(axial, Qt.MouseButton.LeftButton, pos=axial.rect().center())
    qtbot.waitUntil(lambda: not rig.viewer.coronal.isVisible(), timeout=5_000)
    qtbot.wait(300)
    shots.append(screenshot(window, "viewer-1024x700-axial-alone"))
    for path in shots:
        assert path.is_file() and path.stat().st_size > 10_000


@pytest.mark.slow
def test_the_denoising_note_wraps_in_a_narrow_3d_pane(qtbot, viewer_rig_3d, screenshot):
    """The 3D view's 'Denoising... the 3D view shows the finished volume' was text in the VTK scene, which does
    not wrap: a narrow pane (1024x700) cut it off. It is a wrapped line above the scene now. The view is fed
    what a run shows (a denoising preview, then the finished volume); that a real run shows the note is
    pinned by the test after this one."""
    rig = add_generation(qtbot, viewer_rig_3d)  # the Generate form beside the viewer, as in the window
    window, state = rig.host, rig.state
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024, timeout=10_000)
    view3d = rig.viewer.view3d
    note = view3d.note
    state.set_job_running(True)
    state.show_preview(np.random.default_rng(0).random((16, 20, 16)), np.eye(4), 1, 400)
    qtbot.waitUntil(lambda: note.isVisible(), timeout=10_000)
    assert view3d.width() < 360  # a narrow pane
    assert note.wordWrap() and note.width() <= view3d.width()
    qtbot.waitUntil(lambda: note.height() >= note.heightForWidth(note.width()), timeout=5_000)  # every line
    assert "finished volume" in note.text()
    screenshot(window, "3d-denoising-note-1024x700")
    state.set_job_running(False)
    add_tissue_volume(state)  # the run is over: its volume is shown, nothing is denoising
    assert not note.isVisible()


class _LayoutRequests(QObject):
    """Counts the layouts of ``window`` as a whole while a run of ``state`` goes on."""

    def __init__(self, window, state) -> None:
        super().__init__()
        self.state, self.count = state, 0
        window.installEventFilter(self)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.LayoutRequest and self.state.job_running:
            self.count += 1
        return False


@pytest.mark.slow
def test_a_run_neither_renders_the_3d_scene_nor_lays_out_the_window_at_every_step(qtbot, viewer_rig_3d):
    """While a run denoised, the 3D view rendered its empty scene when its 'Denoising...' note appeared (the
    note resized the OpenGL widget while it was still shown, and a shown one renders as soon as it is
    resized), and the progress line's text laid out the whole window at every step: a second paint of the
    window per step, which Qt composes through OpenGL (the software renderer's two threads, on a machine
    without a GPU) once the window holds the 3D view."""
    rig = add_generation(qtbot, viewer_rig_3d)
    window, view3d, state = rig.host, rig.viewer.view3d, rig.state
    denoising_renders: list[str] = []

    def on_render(render_window, event) -> None:
        shown = state.shown
        if state.job_running and (shown is None or shown.kind == "preview"):
            denoising_renders.append(shown.name if shown is not None else "nothing shown")

    observer = view3d.plotter.ren_win.AddObserver("StartEvent", on_render)
    layouts = _LayoutRequests(window, state)
    state.select_model(state.model_by_id("tiny-latent"))
    steps = 60
    rig.sampling_panel.steps_spin.setValue(steps)
    state.form.set(preview_interval=-4)  # 4 per run
    drawn: list[int] = []
    rig.generation.preview_drawn.connect(drawn.append)
    noted: list[bool] = []  # whether the 3D view said "Denoising..." as each preview was drawn
    rig.generation.preview_drawn.connect(lambda _step: noted.append(view3d.note.isVisible()))
    with qtbot.waitSignal(rig.generation.ended, timeout=180_000) as ended:
        qtbot.mouseClick(rig.sampling_panel.generate_button, Qt.MouseButton.LeftButton)
    view3d.plotter.ren_win.RemoveObserver(observer)
    window.removeEventFilter(layouts)
    assert ended.args == ["finished"] and drawn  # previews were shown, in the slice views
    assert noted and all(noted)  # ...and the 3D view said why it shows none
    assert denoising_renders == []
    assert layouts.count < steps / 4, layouts.count  # over one per step before; now a few (start, previews)
    # What the 3D view shows after the run is as before: the finished volume.
    qtbot.waitUntil(lambda: view3d.plotter.interactor.isVisible(), timeout=10_000)
    assert state.shown.kind == "generated" and "volume" in view3d.plotter.actors
    assert not view3d.note.isVisible()
