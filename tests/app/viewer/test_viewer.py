"""The slice views and the viewer tool bar, driven as a person does: typed values, keys, clicks, wheel, actions.

The viewer and its tool bars are built on ``AppServices`` (tests/app/viewer/rig.py), without the main window;
two tests build the window, for what is the window's: its View menu's keys and its status bar around the viewer,
and its layout at 1024x700. Under Xvfb (see tests/app/conftest.py), without the 3D view (test_viewer_3d.py
has those).
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt

from app.core.slicing import ZOOM_STEP
from app.core.tissue import ALL_TISSUES
from tests.app.viewer.rig import TISSUE_NAMES
from tests.app.viewer_helpers import choose, open_volume, pixels, type_into, wheel, write_volume

pytestmark = pytest.mark.render


@pytest.fixture
def anatomical(qtbot, viewer_rig, nibabel_data):
    """nibabel's int16 anatomical scan (-610 .. 30393) open in the viewer."""
    entry = viewer_rig.open(qtbot, nibabel_data / "anatomical.nii")
    qtbot.waitUntil(lambda: viewer_rig.viewer.axial.draw_count > 0, timeout=10_000)
    return entry


# -- window/level --------------------------------------------------------------------------------------


def test_typed_window_and_level_apply_and_custom_preset_brings_them_back(qtbot, viewer_rig, anatomical):
    rig, bar = viewer_rig, viewer_rig.toolbar
    state, axial = rig.state, rig.viewer.axial
    assert anatomical.integer_valued
    before = axial.current_pixels()

    type_into(qtbot, bar.window_spin, "3000")
    type_into(qtbot, bar.level_spin, "1500")
    assert state.window == (3000.0, 1500.0)
    assert state.window_preset == "Custom" and bar.preset_box.currentText() == "Custom"
    assert not np.array_equal(axial.current_pixels(), before)
    # integer data: plain whole numbers in the overlay, never 3e+03
    assert axial.overlay_texts()["window"] == "W 3000  L 1500"

    # a preset (Full range) on the tool bar, then Custom: the typed values return
    choose(qtbot, bar.preset_box, "Full range")
    assert state.window_preset == "Full range" and state.window != (3000.0, 1500.0)
    assert bar.window_spin.value() == pytest.approx(state.window[0], abs=0.5)
    choose(qtbot, bar.preset_box, "Custom")
    assert state.window == (3000.0, 1500.0) and state.window_preset == "Custom"
    assert bar.window_spin.hasFocus()  # ready to type another width


def test_right_drag_shows_in_the_typed_fields(qtbot, viewer_rig, anatomical):
    bar, axial = viewer_rig.toolbar, viewer_rig.viewer.axial
    start = axial.rect().center()
    qtbot.mousePress(axial, Qt.MouseButton.RightButton, pos=start)
    qtbot.mouseMove(axial, start + QPoint(60, -40))
    qtbot.mouseRelease(axial, Qt.MouseButton.RightButton, pos=start + QPoint(60, -40))
    width, level = viewer_rig.state.window
    assert bar.preset_box.currentText() == "Custom"
    assert bar.window_spin.value() == round(width) and bar.level_spin.value() == pytest.approx(level, abs=0.5)
    assert bar.window_spin.decimals() == 0  # integer data
    # the overlay says what the fields say, to the digit
    assert axial.overlay_texts()["window"] == f"{bar.window_spin.text()}  {bar.level_spin.text()}"


def test_float_data_window_reads_the_same_in_the_fields_and_the_overlay(qtbot, viewer_rig, tmp_path):
    rig, bar = viewer_rig, viewer_rig.toolbar
    data = np.random.default_rng(1).random((20, 24, 20))  # 0..1
    rig.open(qtbot, write_volume(tmp_path / "float.nii.gz", data))
    type_into(qtbot, bar.window_spin, "0.25")
    type_into(qtbot, bar.level_spin, "0.125")
    assert rig.state.window == pytest.approx((0.25, 0.125))  # a 0..1 volume: three decimals
    for view in rig.viewer.slice_views:
        text = view.overlay_texts()["window"]
        assert text == "W 0.250  L 0.125" == f"{bar.window_spin.text()}  {bar.level_spin.text()}"


def test_overlay_text_has_a_dark_backing_over_bright_anatomy(qtbot, viewer_rig, tmp_path):
    rig, bar = viewer_rig, viewer_rig.toolbar
    path = write_volume(tmp_path / "bright.nii.gz", np.full((40, 48, 36), 1000.0), synthetic=True)
    rig.open(qtbot, path)
    type_into(qtbot, bar.window_spin, "10")
    type_into(qtbot, bar.level_spin, "0")  # everything at 1000 is white
    qtbot.keyClick(
        rig.host, Qt.Key.Key_X, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert not rig.state.show_crosshair
    for view in rig.viewer.slice_views:
        shown = pixels(view)
        image = view.image_rect().toRect()
        assert shown[image.center().y(), image.center().x()].min() > 240  # the anatomy is white
        rects = view.overlay_rects()
        assert {"title", "tag", "slice", "window", "orientation-left", "orientation-top"} <= set(rects)
        for name, rect in rects.items():
            box = shown[
                int(rect.top()) + 1 : int(rect.bottom()) - 1, int(rect.left()) + 1 : int(rect.right()) - 1
            ]
            luminance = box.mean(axis=2)
            if rect.intersects(view.image_rect()):  # text over the image: a dark box, light letters
                assert np.mean(luminance < 90) > 0.4, (view.plane, name)
            assert np.mean(np.abs(box - box.mean(axis=(0, 1))).sum(axis=2) > 60) > 0.02, (view.plane, name)


# -- slice numbers, readout, keys ----------------------------------------------------------------------


def test_slice_numbers_and_readout_count_from_the_same_base(qtbot, viewer_rig, anatomical):
    state = viewer_rig.state
    axial, coronal, sagittal = viewer_rig.viewer.slice_views
    rect = axial.image_rect()
    qtbot.mouseClick(
        axial,
        Qt.MouseButton.LeftButton,
        pos=QPoint(int(rect.left() + rect.width() * 0.3), int(rect.center().y())),
    )
    i, j, k = state.crosshair_voxel()
    assert axial.crosshair_readout().startswith(f"voxel ({i}, {j}, {k}) ")  # what the status bar shows
    assert axial.overlay_texts()["slice"].startswith(f"slice k={k} (0\u2013{anatomical.shape[2] - 1})")
    assert coronal.overlay_texts()["slice"].startswith(f"slice j={j} ")
    assert sagittal.overlay_texts()["slice"].startswith(f"slice i={i} ")

    qtbot.keyClick(axial, Qt.Key.Key_Home)
    assert state.crosshair_voxel()[2] == 0
    assert axial.overlay_texts()["slice"].startswith("slice k=0 ") and axial.crosshair_readout().count(", 0)")
    qtbot.keyClick(axial, Qt.Key.Key_End)
    last = anatomical.shape[2] - 1
    assert state.crosshair_voxel()[2] == last
    assert f"k={last} " in axial.overlay_texts()["slice"] and f", {last})" in axial.crosshair_readout()
    qtbot.keyClick(coronal, Qt.Key.Key_Home)
    assert state.crosshair_voxel()[1] == 0
    # readout values: plain integers for integer data
    value = axial.crosshair_readout().rsplit("value ", 1)[1]
    assert value.lstrip("-").isdigit()


# -- zoom, pan, maximise, crosshair, interpolation -----------------------------------------------------


def test_zoom_with_ctrl_wheel_and_keys_pan_with_middle_drag_and_fit(qtbot, viewer_rig, anatomical):
    rig = viewer_rig
    axial = rig.viewer.axial
    fit = axial.image_rect()
    spot = QPoint(int(fit.left() + fit.width() * 0.3), int(fit.top() + fit.height() * 0.6))
    under = axial.widget_to_voxel(QPointF(spot))
    slice_before = rig.state.crosshair_voxel()[2]

    wheel(axial, spot, 2, Qt.KeyboardModifier.ControlModifier)  # zoom in about the cursor
    zoomed = axial.image_rect()
    assert zoomed.width() == pytest.approx(fit.width() * ZOOM_STEP**2, rel=1e-3)
    assert 1.1 <= ZOOM_STEP <= 1.2  # as Slicer and napari zoom a notch
    shown = {item.name: item.text for item in axial.overlay_layout()}
    assert shown["slice"].endswith(f"\u00b7  {ZOOM_STEP**2 * 100:.0f}%")  # the zoom level is on the view
    assert np.allclose(axial.widget_to_voxel(QPointF(spot)), under, atol=1e-6)  # the point stays put
    assert rig.state.crosshair_voxel()[2] == slice_before  # Ctrl+wheel does not change the slice

    wheel(axial, spot, 1)  # plain wheel: next slice, as before
    assert rig.state.crosshair_voxel()[2] == slice_before + 1

    qtbot.keyClick(axial, Qt.Key.Key_Plus)
    assert axial.image_rect().width() == pytest.approx(zoomed.width() * ZOOM_STEP, rel=1e-3)
    qtbot.keyClick(axial, Qt.Key.Key_Minus)
    assert axial.image_rect().width() == pytest.approx(zoomed.width(), rel=1e-3)

    start = axial.rect().center()
    before = axial.image_rect()
    qtbot.mousePress(axial, Qt.MouseButton.MiddleButton, pos=start)
    qtbot.mouseMove(axial, start + QPoint(30, 20))
    qtbot.mouseRelease(axial, Qt.MouseButton.MiddleButton, pos=start + QPoint(30, 20))
    moved = axial.image_rect()
    assert (moved.left() - before.left(), moved.top() - before.top()) == pytest.approx((30, 20))
    # Shift+left-drag pans too (for a mouse without a middle button), and does not move the crosshair
    crosshair = rig.state.crosshair_voxel()
    qtbot.mousePress(axial, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ShiftModifier, start)
    qtbot.mouseMove(axial, start + QPoint(-10, 0))
    qtbot.mouseRelease(
        axial, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ShiftModifier, start + QPoint(-10, 0)
    )
    assert axial.image_rect().left() == pytest.approx(moved.left() - 10)
    assert rig.state.crosshair_voxel() == crosshair

    qtbot.keyClick(axial, Qt.Key.Key_0)  # fit this view again
    assert axial.image_rect() == fit
    qtbot.keyClick(rig.viewer.coronal, Qt.Key.Key_Plus)
    rig.toolbar.fit_action.trigger()
    assert rig.viewer.coronal.zoom == 1.0 and rig.viewer.coronal.pan == (0.0, 0.0)


def test_zoom_stays_for_the_same_field_of_view_and_fits_another(qtbot, viewer_rig, tmp_path):
    rig = viewer_rig
    axial = rig.viewer.axial
    rig.open(qtbot, write_volume(tmp_path / "a.nii.gz", np.ones((20, 24, 20))))
    qtbot.keyClick(axial, Qt.Key.Key_Plus)
    zoom = axial.zoom
    assert zoom > 1.0
    # the same 20 x 24 x 20 mm at 2 mm voxels (as a denoising preview of its result): the zoom stays
    rig.open(qtbot, write_volume(tmp_path / "b.nii.gz", np.ones((10, 12, 10)), spacing=(2, 2, 2)))
    assert axial.zoom == zoom
    rig.open(qtbot, write_volume(tmp_path / "c.nii.gz", np.ones((60, 60, 60))))
    assert axial.zoom == 1.0 and axial.pan == (0.0, 0.0)


def test_double_click_shows_one_view_alone_and_back(qtbot, viewer_rig, anatomical):
    viewer, state = viewer_rig.viewer, viewer_rig.state
    area = viewer.rect()
    before = state.crosshair_ras.copy()
    off_centre = viewer.sagittal.rect().center() + QPoint(37, -29)  # not where the crosshair is
    # What a double-click delivers: press, release, then press + double-click + release.
    qtbot.mouseClick(viewer.sagittal, Qt.MouseButton.LeftButton, pos=off_centre)
    moved = state.crosshair_ras.copy()
    qtbot.mouseDClick(viewer.sagittal, Qt.MouseButton.LeftButton, pos=off_centre)
    assert not np.array_equal(moved, before)  # the first click alone does move it
    assert np.array_equal(state.crosshair_ras, before)  # maximised; the position stays (Slicer)
    qtbot.waitUntil(lambda: not viewer.axial.isVisible(), timeout=5_000)
    assert viewer.maximised == "sagittal" and viewer.sagittal.isVisible()
    assert not viewer.coronal.isVisible() and not viewer.view3d.isVisible()
    qtbot.waitUntil(lambda: viewer.sagittal.width() > area.width() * 0.9, timeout=5_000)
    qtbot.mouseDClick(viewer.sagittal, Qt.MouseButton.LeftButton, pos=viewer.sagittal.rect().center())
    qtbot.waitUntil(lambda: viewer.axial.isVisible(), timeout=5_000)
    assert viewer.maximised == "" and all(v.isVisible() for v in viewer.views().values())
    qtbot.waitUntil(lambda: viewer.sagittal.width() < area.width() * 0.6, timeout=5_000)
    # the 3D view has a button for it (a double-click there belongs to the camera)
    qtbot.mouseClick(viewer.view3d.maximise_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not viewer.axial.isVisible(), timeout=5_000)
    assert viewer.maximised == "3d" and viewer.view3d.maximise_button.isChecked()
    qtbot.mouseClick(viewer.view3d.maximise_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: viewer.axial.isVisible(), timeout=5_000)
    assert not viewer.view3d.maximise_button.isChecked()


def test_crosshair_toggle_hides_and_shows_the_lines(qtbot, viewer_rig, tmp_path):
    rig = viewer_rig
    rig.open(qtbot, write_volume(tmp_path / "dark.nii.gz", np.zeros((30, 30, 30))))
    axial = rig.viewer.axial
    centre = axial.voxel_to_widget(rig.state.crosshair_voxel())
    rect = axial.image_rect()
    x, y = int(round(centre.x())), int(rect.top() + rect.height() * 0.3)  # on the vertical line, off the gap

    def on_line() -> bool:
        return bool(pixels(axial)[y, x - 1 : x + 2].max(axis=1).max() > 80)

    assert rig.state.show_crosshair and on_line()
    action = rig.toolbar.crosshair_action
    button = rig.toolbar.widgetForAction(action)
    on_look = pixels(button)
    qtbot.keyClick(
        rig.host, Qt.Key.Key_X, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )
    assert not action.isChecked() and not rig.state.show_crosshair
    assert not on_line()
    assert np.abs(pixels(button) - on_look).max() > 40  # the button shows that it is off
    action.trigger()
    assert rig.state.show_crosshair and on_line()


def test_nearest_or_smooth_interpolation_is_a_choice(qtbot, viewer_rig, tmp_path):
    rig, bar = viewer_rig, viewer_rig.toolbar
    checker = (np.indices((12, 12, 12)).sum(axis=0) % 2) * 1000.0
    rig.open(qtbot, write_volume(tmp_path / "checker.nii.gz", checker))
    axial = rig.viewer.axial
    bar.crosshair_action.trigger()  # lines off: only the image in the middle of the view
    for _ in range(3):
        qtbot.keyClick(axial, Qt.Key.Key_Plus)

    def middle_greys() -> np.ndarray:
        shown = pixels(axial)
        h, w = shown.shape[:2]
        return shown[h // 2 - 30 : h // 2 + 30, w // 2 - 30 : w // 2 + 30, 0]

    choose(qtbot, bar.interpolation_box, "Nearest")
    assert not rig.state.smooth_display
    greys = middle_greys()
    assert set(np.unique(greys)) <= {0, 255}  # whole voxels, hard edges
    choose(qtbot, bar.interpolation_box, "Smooth")
    assert rig.state.smooth_display
    greys = middle_greys()
    assert np.mean((greys > 20) & (greys < 235)) > 0.1  # blended edges
    # the setting, changed elsewhere (the View menu's Smooth Slice Display), shows in the box
    rig.state.set_smooth_display(False)
    assert bar.interpolation_box.currentText() == "Nearest"


# -- 4D ------------------------------------------------------------------------------------------------


def test_a_4d_file_says_how_many_time_points_and_shows_the_one_picked(
    qtbot, viewer_rig, tmp_path, error_dialogs
):
    import nibabel as nib

    rig, bar = viewer_rig, viewer_rig.toolbar
    series = np.stack([np.full((10, 12, 8), 100.0 * t) + np.arange(8) for t in range(5)], axis=-1)
    path = tmp_path / "series.nii.gz"
    nib.save(nib.Nifti1Image(series.astype(np.float32), np.eye(4)), str(path))
    assert not bar.time_spin.isVisible()

    entry = rig.open(qtbot, path)
    assert entry.time_points == 5 and entry.time_index == 0
    assert "5 time points" in rig.message()
    qtbot.waitUntil(bar.time_spin.isVisible, timeout=5_000)
    assert "5 time points" in bar.time_label.text()
    assert (bar.time_spin.minimum(), bar.time_spin.maximum(), bar.time_spin.value()) == (0, 4, 0)

    type_into(qtbot, bar.time_spin, "3")
    qtbot.waitUntil(lambda: rig.state.shown.time_index == 3, timeout=30_000)
    shown = rig.state.shown
    assert np.array_equal(shown.data, series[..., 3].astype(np.float32))
    assert rig.state.volumes == [shown] and shown.path == path  # the same entry, another time point
    assert bar.time_spin.value() == 3 and "time point 3" in shown.describe()
    qtbot.waitUntil(lambda: not rig.runner.jobs, timeout=10_000)

    # the file went away meanwhile: one clear message, and the field shows what is still on screen
    path.unlink()
    type_into(qtbot, bar.time_spin, "1")
    qtbot.waitUntil(lambda: bool(error_dialogs), timeout=30_000)
    title, message = error_dialogs[-1]
    assert (
        title == "Cannot read that time point" and "series.nii.gz" in message and "Traceback" not in message
    )
    assert rig.state.shown is shown and bar.time_spin.value() == 3
    qtbot.waitUntil(lambda: not rig.runner.jobs, timeout=10_000)


def test_the_hover_readout_goes_back_to_the_crosshair_when_the_pointer_leaves(qtbot, viewer_rig, anatomical):
    axial = viewer_rig.viewer.axial
    said = []
    axial.hovered.connect(said.append)
    rect = axial.image_rect()
    crosshair_text = axial.crosshair_readout()
    corner = QPoint(int(rect.left() + rect.width() * 0.1), int(rect.top() + rect.height() * 0.1))
    qtbot.mouseMove(axial, corner)  # the real pointer moves: hover
    qtbot.waitUntil(lambda: bool(said) and said[-1] not in ("", crosshair_text), timeout=5_000)
    assert "voxel (" in said[-1] and crosshair_text not in said[-1]
    list_widget = viewer_rig.session_panel.list
    qtbot.mouseMove(list_widget, list_widget.rect().center())  # ...and leaves the view
    qtbot.waitUntil(lambda: said[-1] == "", timeout=5_000)  # nothing hovered: the crosshair's readout again


# -- the window around the viewer ----------------------------------------------------------------------


def _write_with_maps(folder, name="mni.nii.gz"):
    """A volume in MNI space (sform code 4) with its GM, WM, CSF and ventricles maps beside it."""
    from engine.nifti.io import make_nifti, tissue_path

    rng = np.random.default_rng(3)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    affine[:3, 3] = (-16.0, -30.0, -10.0)
    image = folder / name
    make_nifti(rng.random((16, 20, 16)) * 100, affine, synthetic=True, space="MNI152").to_filename(str(image))
    for tissue in TISSUE_NAMES:
        make_nifti(rng.random((16, 20, 16)), affine, synthetic=True).to_filename(
            str(tissue_path(image, tissue))
        )
    return image


def test_the_window_s_view_menu_keys_and_status_bar_follow_the_viewer(
    qtbot, main_window, nibabel_data, tmp_path
):
    """The window's own part of the viewer: View > Window/Level Preset (Ctrl+1, 2, 5), Smooth Slice Display
    (Ctrl+I), 3D Rendering, Previous and Next Volume (Ctrl+[ and Ctrl+]), and the status bar's readout (crosshair, hover,
    the tissue under it) and space; Help > Keyboard Shortcuts lists the overlay's key."""
    window, bar, tissue_bar = main_window, main_window.viewer_toolbar, main_window.tissue_toolbar
    state, axial = window.state, window.viewer.axial
    scan = open_volume(qtbot, window, nibabel_data / "anatomical.nii")
    qtbot.waitUntil(lambda: axial.draw_count > 0, timeout=10_000)
    assert window.space_label.isVisible() and window.space_label.text() == f"Space: {scan.space_name}"

    type_into(qtbot, bar.window_spin, "3000")
    type_into(qtbot, bar.level_spin, "1500")
    # a preset from the View menu (Ctrl+2: Full range), then Ctrl+5 (Custom): the typed values return
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert state.window_preset == "Full range" and state.window != (3000.0, 1500.0)
    assert bar.window_spin.value() == pytest.approx(state.window[0], abs=0.5)
    assert bar.preset_box.currentText() == "Full range"
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    assert state.window_preset == "Auto (1-99%)"
    qtbot.keyClick(window, Qt.Key.Key_5, Qt.KeyboardModifier.ControlModifier)
    assert state.window == (3000.0, 1500.0) and bar.preset_box.currentText() == "Custom"
    checked = [a.text() for a in window.window_actions.window_presets.actions() if a.isChecked()]
    assert checked == ["Custom"]

    # View > Smooth Slice Display (Ctrl+I) is the tool bar's interpolation
    choose(qtbot, bar.interpolation_box, "Smooth")
    assert state.smooth_display and window.window_actions.smooth.isChecked()
    qtbot.keyClick(window, Qt.Key.Key_I, Qt.KeyboardModifier.ControlModifier)
    assert not state.smooth_display and bar.interpolation_box.currentText() == "Nearest"
    # View > 3D Rendering sets the 3D view's mode, and shows the one the 3D view's box chose
    render = {action.data(): action for action in window.window_actions.render_presets.actions()}
    render["Iso-surface"].trigger()
    assert (
        state.render_preset == "Iso-surface"
        and window.viewer.view3d.preset_box.currentText() == "Iso-surface"
    )
    choose(qtbot, window.viewer.view3d.preset_box, "MIP")
    assert (
        state.render_preset == "MIP" and render["MIP"].isChecked() and not render["Iso-surface"].isChecked()
    )

    # The readout: the crosshair's voxel after a click and a key, plain integers for integer data.
    rect = axial.image_rect()
    qtbot.mouseClick(
        axial,
        Qt.MouseButton.LeftButton,
        pos=QPoint(int(rect.left() + rect.width() * 0.3), int(rect.center().y())),
    )
    i, j, k = state.crosshair_voxel()
    assert f"voxel ({i}, {j}, {k})" in window.readout_label.text()
    qtbot.keyClick(axial, Qt.Key.Key_Home)
    assert window.readout_label.text() == "\u271b " + axial.crosshair_readout()
    assert window.readout_label.text().count(", 0)")
    qtbot.keyClick(axial, Qt.Key.Key_End)
    assert f", {scan.shape[2] - 1})" in window.readout_label.text()
    assert window.readout_label.text().rsplit("value ", 1)[1].lstrip("-").isdigit()
    # ...what the pointer hovers, and the crosshair's again once it leaves the view
    crosshair_text = axial.crosshair_readout()
    corner = QPoint(int(rect.left() + rect.width() * 0.1), int(rect.top() + rect.height() * 0.1))
    qtbot.mouseMove(axial, corner)
    qtbot.waitUntil(
        lambda: window.readout_label.text() not in ("", "\u271b " + crosshair_text), timeout=5_000
    )
    hovered = window.readout_label.text()
    assert "voxel (" in hovered and crosshair_text not in hovered
    list_widget = window.session_panel.list
    qtbot.mouseMove(list_widget, list_widget.rect().center())
    qtbot.waitUntil(lambda: crosshair_text in window.readout_label.text(), timeout=5_000)

    # A volume in MNI space with its maps: the space on the status bar, MNI millimetres in the readout, the
    # tissue under the crosshair once the overlay is on (Ctrl+T); Ctrl+[ and Ctrl+] step through the session.
    maps = open_volume(qtbot, window, _write_with_maps(tmp_path))
    assert maps.tissue_names == TISSUE_NAMES
    assert window.space_label.isVisible() and window.space_label.text() == "Space: MNI152 (sform code 4)"
    assert "MNI (" in window.readout_label.text()
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert state.tissue_shown() == ALL_TISSUES
    label = window.readout_label.text().rsplit("   ", 1)[-1]
    assert label == "background" or label.split()[0] in TISSUE_NAMES
    qtbot.keyClick(window, Qt.Key.Key_BracketLeft, Qt.KeyboardModifier.ControlModifier)  # previous volume
    assert state.shown is scan and window.space_label.text() == f"Space: {scan.space_name}"
    assert state.tissue_shown() is None and not tissue_bar.tissue_box.isEnabled()
    assert tissue_bar.tissue_box.count() == 1
    qtbot.keyClick(window, Qt.Key.Key_BracketRight, Qt.KeyboardModifier.ControlModifier)  # next volume
    assert state.shown is maps
    assert state.tissue_shown() == ALL_TISSUES and tissue_bar.tissue_box.count() == 5

    # Help > Keyboard Shortcuts lists the overlay's key
    rows = {(row.keys, row.what) for row in window.help.show_shortcuts().rows}
    assert ("Ctrl+T", "Tissue Overlay") in rows
    window.help.shortcuts_dialog.close()


# -- small windows -------------------------------------------------------------------------------------


def _visible_in(widget, container) -> bool:
    top_left = widget.mapTo(container, QPoint(0, 0))
    return (
        widget.isVisible()
        and container.rect().contains(top_left)
        and container.rect().contains(top_left + QPoint(widget.width() - 1, widget.height() - 1))
    )


def test_at_1024x700_labels_do_not_overlap_and_the_tool_bars_keep_their_controls(
    qtbot, main_window, tmp_path, screenshot
):
    """The window's layout at 1024x700: the viewer's and the tissue overlay's tool bars keep every control on
    screen (three rows of tool bars), the slice views' labels do not overlap, and the status bar's cut
    message is whole in its tooltip."""
    window = main_window
    open_volume(qtbot, window, _write_with_maps(tmp_path))
    bar, tissue_bar = window.viewer_toolbar, window.tissue_toolbar
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 700, timeout=10_000)
    # The longest message (a run's, with its maps and the key that overlays them), cut at this width, is
    # whole in the status bar's tooltip; the readout leaves it more room than it did (420 px) and still
    # holds its own text whole.
    status = window.statusBar()
    message = (
        "Generated 1 volume with tissue maps GM, WM, CSF, ventricles (Ctrl+T overlays them) in 12.3 s on "
        "cpu (12 cores)"
    )
    window.show_status(message)
    assert status.currentMessage() == message and status.toolTip() == message
    readout = window.readout_label
    assert readout.width() < 420 and readout.width() >= readout.fontMetrics().horizontalAdvance(
        readout.text()
    )
    screenshot(window, "14-status-bar-1024x700")
    status.clearMessage()
    assert status.toolTip() == ""

    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert tissue_bar.legend_action.isVisible()  # the widest the tissue bar gets
    qtbot.waitUntil(lambda: _visible_in(bar.convention_box, bar), timeout=10_000)

    for widget in (
        bar.preset_box,
        bar.window_spin,
        bar.level_spin,
        bar.convention_box,
        bar.interpolation_box,
    ):
        assert _visible_in(widget, bar) and _visible_in(widget, window), widget.objectName()
    for action in (bar.crosshair_action, bar.fit_action):
        assert _visible_in(bar.widgetForAction(action), bar) and _visible_in(
            bar.widgetForAction(action), window
        )
    # No tissue control hides behind its tool bar's overflow arrow once the bars have found their rows.
    tissue_controls = (
        tissue_bar.widgetForAction(tissue_bar.tissue_action),
        tissue_bar.tissue_box,
        tissue_bar.opacity_slider,
        tissue_bar.legend_label,
    )
    qtbot.waitUntil(
        lambda: all(_visible_in(w, tissue_bar) and _visible_in(w, window) for w in tissue_controls),
        timeout=10_000,
    )
    assert window.toolBarBreak(bar) and window.toolBarBreak(tissue_bar)  # three rows at this width
    for view in window.viewer.slice_views:
        rects = list(view.overlay_rects().items())
        assert {"title", "tag", "slice"} <= {name for name, _ in rects}
        for index, (name, rect) in enumerate(rects):
            assert view.rect().toRectF().contains(rect), (view.plane, name)
            for other, other_rect in rects[index + 1 :]:
                assert not rect.intersects(other_rect), (view.plane, name, other)
        assert _visible_in(view, window)
    frames = [f.geometry() for f in window.viewer.frames.values()]
    assert not any(a.intersects(b) for i, a in enumerate(frames) for b in frames[i + 1 :])
