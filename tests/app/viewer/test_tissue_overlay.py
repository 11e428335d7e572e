"""Paired tissue maps and template space in the app: the slice views' tissue overlay, the space shown, Save As
writing the maps beside the image, and opening them again. Driven as a person does, in a real window."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog

from app.core.tissue import ALL_TISSUES, TISSUE_COLOURS, label_map
from tests.app.runs import generate
from tests.app.viewer_helpers import choose, open_volume, pixels, write_volume

pytestmark = pytest.mark.render

NAMES = ["GM", "WM", "CSF", "ventricles"]
MNI = "MNI152NLin2009aSym"


def _generate(qtbot, window):
    """A 3-step run to its end (Ctrl+G): the volume it made."""
    assert generate(qtbot, window, steps=3) == "finished"
    return window.state.shown


def _colour_at(view, ijk) -> tuple[int, int, int]:
    point = view.voxel_to_widget(ijk).toPoint()
    return tuple(int(v) for v in pixels(view)[point.y(), point.x()])


def _off_crosshair(window, view):
    """A voxel of the view's slice away from the crosshair lines and the overlay texts drawn over the image."""
    entry, ijk = window.state.shown, np.array(window.state.crosshair_voxel())
    for axis in (view.geometry_.col_axis, view.geometry_.row_axis):
        ijk[axis] = min(ijk[axis] + entry.shape[axis] // 4, entry.shape[axis] - 2)
    return tuple(int(v) for v in ijk)


def test_generated_volume_has_its_tissue_overlay_on_ctrl_t_and_names_its_space(qtbot, tissue_window):
    window, bar = tissue_window, tissue_window.tissue_toolbar
    entry = _generate(qtbot, window)
    assert entry.tissue_names == NAMES and entry.space == MNI
    assert all(m.shape == entry.shape and m.min() >= 0 and m.max() <= 1 for m in entry.tissue.values())
    # The space is on the status bar and, with the maps, in the session details.
    assert window.space_label.isVisible() and window.space_label.text() == f"Space: {MNI}"
    details = window.session_panel.details.text().replace("\u200b", "")  # less the breaks in long words
    assert f"space {MNI}" in details and "tissue maps: GM, WM, CSF, ventricles" in details
    assert "Ctrl+T overlays them" in window.statusBar().currentMessage()
    assert "MNI (" in window.readout_label.text()  # the readout's millimetres are MNI's

    # Off by default; the controls are there, with the model's maps to choose from.
    assert not window.state.show_tissue and not bar.tissue_action.isChecked()
    assert bar.tissue_action.isEnabled() and bar.tissue_box.isEnabled() and bar.opacity_slider.isEnabled()
    assert [bar.tissue_box.itemData(i) for i in range(bar.tissue_box.count())] == [ALL_TISSUES, *NAMES]
    assert bar.opacity_slider.value() == 40 and bar.opacity_label.text() == "40%"
    assert "Ctrl+T" in bar.tissue_action.toolTip()
    axial = window.viewer.axial
    plain = pixels(axial)

    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # Ctrl+T
    assert window.state.show_tissue and bar.tissue_action.isChecked()
    overlaid = pixels(axial)
    assert not np.array_equal(plain, overlaid)
    assert window.state.tissue_shown() == ALL_TISSUES
    label = window.readout_label.text().rsplit("   ", 1)[-1]
    assert label == "background" or label.split()[0] in NAMES  # the readout names the tissue under it

    # The opacity slider, moved with the keyboard (End: 100%), changes what is drawn.
    bar.opacity_slider.setFocus()
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_End)
    assert window.state.tissue_opacity == 1.0 and bar.opacity_label.text() == "100%"
    opaque = pixels(axial)
    assert not np.array_equal(opaque, overlaid)

    # At 100% the label map's colours are painted exactly where its voxels are, nearest-neighbour,
    # on the slice shown, after a slice step and after a zoom.
    choose(qtbot, window.viewer_toolbar.interpolation_box, "Nearest")

    def check_label_colours():
        ijk = _off_crosshair(window, axial)
        labels = label_map({n: axial.geometry_.extract(entry.tissue[n], ijk[2]) for n in NAMES})
        row, col = (int(v) for v in axial.geometry_.to_display(ijk, entry.shape))
        wanted = labels[row, col]
        colour = _colour_at(axial, ijk)
        if wanted:
            assert colour == TISSUE_COLOURS[NAMES[wanted - 1]]
        else:
            assert colour not in TISSUE_COLOURS.values()

    check_label_colours()
    axial.setFocus()
    qtbot.keyClick(axial, Qt.Key.Key_Up)  # next slice: the overlay follows
    check_label_colours()
    qtbot.keyClick(axial, Qt.Key.Key_Plus)  # zoom: the overlay scales with the image
    assert axial.zoom > 1
    check_label_colours()

    # One map: its colour, stronger where it is more likely; the choice turns the overlay on if it was off.
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert not window.state.show_tissue and window.state.tissue_shown() is None
    choose(qtbot, bar.tissue_box, "WM")
    assert window.state.tissue_choice == "WM" and window.state.show_tissue
    ijk = _off_crosshair(window, axial)
    probability = float(entry.tissue["WM"][ijk])
    grey = _colour_at(axial, ijk)
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_Home)  # 0%: the image alone again
    assert bar.opacity_label.text() == "0%"
    under = _colour_at(axial, ijk)
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_End)
    expected = np.array(TISSUE_COLOURS["WM"]) * probability + np.array(under) * (1 - probability)
    assert np.allclose(grey, expected, atol=3)

    # The View menu has the same switch, and Help > Keyboard Shortcuts lists it.
    assert bar.tissue_action in window.services.menus.view.actions()
    rows = {(row.keys, row.what) for row in window.help.show_shortcuts().rows}
    assert ("Ctrl+T", "Tissue Overlay") in rows
    window.help.shortcuts_dialog.close()


def test_tissue_controls_are_disabled_with_the_reason_for_a_volume_without_maps(
    qtbot, tissue_window, tmp_path
):
    window, bar = tissue_window, tissue_window.tissue_toolbar
    path = write_volume(tmp_path / "plain.nii.gz", np.random.default_rng(0).random((20, 24, 18)) * 100)
    entry = open_volume(qtbot, window, path)
    assert not entry.tissue and entry.space is None
    for control in (bar.tissue_action, bar.tissue_box, bar.opacity_slider):
        assert not control.isEnabled()
        assert "no tissue maps" in control.toolTip()
    assert window.space_label.text() == "Space: scanner"
    before = pixels(window.viewer.axial)
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # nothing to show
    assert not window.state.show_tissue and np.array_equal(pixels(window.viewer.axial), before)

    # Turned on for a volume with maps, the overlay stays off on one without, and comes back after.
    generated = _generate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert window.state.tissue_shown() == ALL_TISSUES
    qtbot.keyClick(window, Qt.Key.Key_BracketLeft, Qt.KeyboardModifier.ControlModifier)  # previous volume
    assert window.state.shown is entry
    assert window.state.tissue_shown() is None and not bar.tissue_box.isEnabled()
    assert bar.tissue_box.count() == 1
    qtbot.keyClick(window, Qt.Key.Key_BracketRight, Qt.KeyboardModifier.ControlModifier)  # next volume
    assert window.state.shown is generated
    assert window.state.tissue_shown() == ALL_TISSUES and bar.tissue_box.count() == 5


def test_save_as_writes_the_tissue_maps_beside_the_image_in_mni_space_and_they_open_again(
    qtbot, tissue_window, tmp_path, monkeypatch
):
    import nibabel as nib

    window = tissue_window
    entry = _generate(qtbot, window)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "brain_T1w.nii.gz"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(target), ""))
    qtbot.keyClick(window, Qt.Key.Key_S, Qt.KeyboardModifier.ControlModifier)  # Ctrl+S: Save As NIfTI
    qtbot.waitUntil(lambda: "Saved" in window.statusBar().currentMessage(), timeout=60_000)
    assert "4 tissue maps" in window.statusBar().currentMessage()
    maps = {name: out / f"brain_label-{name}_probseg.nii.gz" for name in NAMES}
    assert not window.errors_shown
    assert sorted(p.name for p in out.iterdir()) == sorted(  # and no temporary file left
        ["brain_T1w.nii.gz", "brain_T1w.json", *(p.name for p in maps.values())]
    )
    for path in (target, *maps.values()):
        image = nib.load(path)
        assert int(image.header["sform_code"]) == 4, path.name  # MNI152
        assert np.allclose(image.affine, entry.affine)
        assert "SYNTHETIC" in str(image.header["descrip"])
    for name, path in maps.items():
        assert np.allclose(np.asarray(nib.load(path).dataobj), entry.tissue[name], atol=1e-6)
    sidecar = json.loads((out / "brain_T1w.json").read_text())
    assert sidecar["tissue_maps"] == {name: p.name for name, p in maps.items()}
    assert sidecar["space"] == MNI and sidecar["label_channels"] == NAMES

    # Opened again, the image comes with its maps and its space.
    again = open_volume(qtbot, window, target)
    assert again.tissue_names == NAMES and again.space == MNI
    assert all(np.allclose(again.tissue[n], entry.tissue[n], atol=1e-6) for n in NAMES)
    assert "with tissue maps GM, WM, CSF, ventricles" in window.statusBar().currentMessage()
    assert window.tissue_toolbar.tissue_box.isEnabled()


def test_an_unusable_tissue_map_is_left_out_with_a_message_and_sform_4_names_mni(
    qtbot, tissue_window, tmp_path, error_dialogs
):
    from engine.nifti.io import make_nifti, tissue_path

    window = tissue_window
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    image = tmp_path / "scan.nii.gz"
    # No provenance: the header's sform code (4) is all that says where the volume lies.
    make_nifti(
        np.random.default_rng(1).random((20, 24, 18)), affine, synthetic=False, space="MNI152"
    ).to_filename(str(image))
    wm = np.random.default_rng(2).random((20, 24, 18)).astype(np.float32)
    make_nifti(wm, affine, synthetic=False).to_filename(str(tissue_path(image, "WM")))
    make_nifti(np.zeros((10, 10, 10)), affine, synthetic=False).to_filename(str(tissue_path(image, "GM")))
    (tmp_path / "scan_label-CSF_probseg.nii.gz").write_bytes(b"not a NIfTI file")

    entry = open_volume(qtbot, window, image)
    assert entry.tissue_names == ["WM"] and np.allclose(entry.tissue["WM"], wm, atol=1e-6)
    assert entry.space == "MNI152 (sform code 4)"
    assert window.space_label.text() == "Space: MNI152 (sform code 4)"
    message = window.statusBar().currentMessage()
    assert "with tissue maps WM" in message and "tissue map GM" in message and "shape" in message
    assert "1 more" in message  # the unreadable CSF file
    assert not error_dialogs  # the image opened: nothing to stop for


def test_at_1024x700_the_tissue_controls_stay_on_screen(qtbot, tissue_window):
    window, bar = tissue_window, tissue_window.tissue_toolbar
    _generate(qtbot, window)
    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert bar.legend_action.isVisible()  # the widest the bar gets
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 700, timeout=10_000)

    def on_screen(widget, container=bar) -> bool:
        """Shown, inside the window, and inside its tool bar (not behind the tool bar's overflow arrow)."""
        corner = QPoint(widget.width() - 1, widget.height() - 1)
        return (
            widget.isVisible()
            and window.rect().contains(widget.mapTo(window, corner))
            and container.rect().contains(widget.mapTo(container, corner))
        )

    viewer_bar = window.viewer_toolbar
    controls = [
        (widget, bar)
        for widget in (
            bar.widgetForAction(bar.tissue_action),
            bar.tissue_box,
            bar.opacity_slider,
            bar.legend_label,
        )
    ] + [
        (viewer_bar.convention_box, viewer_bar),
        (viewer_bar.widgetForAction(viewer_bar.fit_action), viewer_bar),
    ]
    # No control hides behind a tool bar's overflow arrow once the bars have found their rows.
    qtbot.waitUntil(
        lambda: all(on_screen(widget, container) for widget, container in controls), timeout=10_000
    )
    assert window.toolBarBreak(viewer_bar) and window.toolBarBreak(bar)  # three rows at this width


def test_at_40_percent_the_overlay_lies_40_percent_of_the_way_from_the_grey_to_its_colour(
    qtbot, tissue_window, screenshot
):
    """The composed pixel, read off the screen, is 40 % of the way from the grey to the tissue's colour (one
    alpha, applied once: opacity compounded per map or premultiplied twice would put it near the colour)."""
    window, bar = tissue_window, tissue_window.tissue_toolbar
    entry = _generate(qtbot, window)
    axial = window.viewer.axial
    choose(qtbot, window.viewer_toolbar.interpolation_box, "Nearest")  # one voxel, one colour on screen
    assert bar.opacity_label.text() == "40%"
    # Voxels of the shown slice labelled as a tissue, in its middle half (clear of the corner texts) and
    # off the crosshair's lines, where the image alone is grey.
    centre = window.state.crosshair_voxel()
    k = int(centre[2])
    slice_labels = label_map({n: axial.geometry_.extract(entry.tissue[n], k) for n in NAMES})
    found = []
    for i in range(entry.shape[0] // 4, 3 * entry.shape[0] // 4):
        for j in range(entry.shape[1] // 4, 3 * entry.shape[1] // 4):
            row, col = (int(v) for v in axial.geometry_.to_display((i, j, k), entry.shape))
            if slice_labels[row, col] and abs(i - centre[0]) > 1 and abs(j - centre[1]) > 1:
                found.append(((i, j, k), int(slice_labels[row, col])))
    under = {voxel: np.array(_colour_at(axial, voxel)) for voxel, _ in found}
    found = [(voxel, label) for voxel, label in found if len(set(under[voxel])) == 1][:12]
    assert len(found) >= 4

    qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # Ctrl+T: all tissues, 40%
    assert window.state.tissue_shown() == ALL_TISSUES
    for voxel, label in found[:12]:
        colour = np.array(TISSUE_COLOURS[NAMES[label - 1]])
        shown = np.array(_colour_at(axial, voxel))
        span = colour - under[voxel]
        big = np.abs(span) > 40  # channels where grey and colour differ enough to measure the fraction
        fraction = (shown - under[voxel])[big] / span[big]
        assert np.allclose(fraction, 0.4, atol=0.05), (voxel, under[voxel], shown, colour, fraction)
    screenshot(window, "14-tissue-overlay-40-percent")


def test_at_1024x700_the_whole_status_message_is_its_tooltip(qtbot, tissue_window, screenshot):
    window = tissue_window
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: window.width() == 1024 and window.height() == 700, timeout=10_000)
    _generate(qtbot, window)  # the longest message: the maps, and the shortcut that overlays them
    status = window.statusBar()
    message = status.currentMessage()
    assert message.startswith("Generated 1 volume with tissue maps") and "Ctrl+T" in message
    assert status.toolTip() == message  # hovering the cut message shows all of it
    # The readout leaves the message more room than it did (420 px), and still holds its own text whole.
    readout = window.readout_label
    assert readout.width() < 420 and readout.width() >= readout.fontMetrics().horizontalAdvance(
        readout.text()
    )
    screenshot(window, "14-status-bar-1024x700")
    status.clearMessage()
    assert status.toolTip() == ""
