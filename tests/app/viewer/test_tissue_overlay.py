"""Paired tissue maps and template space in the app: the slice views' tissue overlay, the space shown, Save As
writing the maps beside the image, and opening them again. Driven as a person does, on the viewer and its tool
bars over ``AppServices`` (tests/app/viewer/rig.py), fed a volume as a model with tissue channels makes it; the
window's own part (its keys, its layout at 1024x700) is in test_viewer.py, a real run's maps in
tests/app/generation/test_tissue_on_request.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QStatusBar

from app.core.tissue import ALL_TISSUES, TISSUE_COLOURS, label_map
from app.window.status_bar import WindowStatus
from tests.app.viewer.rig import MNI, TISSUE_NAMES, add_tissue_volume
from tests.app.viewer_helpers import choose, pixels, write_volume

pytestmark = pytest.mark.render

NAMES = TISSUE_NAMES


def _space_label(entry) -> str:
    """What the status bar's space field says for ``entry``."""
    status = WindowStatus(QStatusBar())
    status.show_volume(entry)
    return status.space_label.text()


def _colour_at(view, ijk) -> tuple[int, int, int]:
    point = view.voxel_to_widget(ijk).toPoint()
    return tuple(int(v) for v in pixels(view)[point.y(), point.x()])


def _off_crosshair(state, view):
    """A voxel of the view's slice away from the crosshair lines and the overlay texts drawn over the image."""
    entry, ijk = state.shown, np.array(state.crosshair_voxel())
    for axis in (view.geometry_.col_axis, view.geometry_.row_axis):
        ijk[axis] = min(ijk[axis] + entry.shape[axis] // 4, entry.shape[axis] - 2)
    return tuple(int(v) for v in ijk)


def _press_overlay(qtbot, rig) -> None:
    qtbot.keyClick(rig.host, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)  # Ctrl+T


def test_generated_volume_has_its_tissue_overlay_on_ctrl_t_and_names_its_space(qtbot, viewer_rig):
    rig, bar = viewer_rig, viewer_rig.tissue_toolbar
    state = rig.state
    entry = add_tissue_volume(state)
    assert entry.tissue_names == NAMES and entry.space == MNI
    assert all(m.shape == entry.shape and m.min() >= 0 and m.max() <= 1 for m in entry.tissue.values())
    # The space is on the status bar and, with the maps, in the session details.
    assert _space_label(entry) == f"Space: {MNI}"
    details = rig.session_panel.details.text().replace("\u200b", "")  # less the breaks in long words
    assert f"space {MNI}" in details and "tissue maps: GM, WM, CSF, ventricles" in details
    axial = rig.viewer.axial
    assert "MNI (" in axial.crosshair_readout()  # the readout's millimetres are MNI's

    # Off by default; the controls are there, with the model's maps to choose from.
    assert not state.show_tissue and not bar.tissue_action.isChecked()
    assert bar.tissue_action.isEnabled() and bar.tissue_box.isEnabled() and bar.opacity_slider.isEnabled()
    assert [bar.tissue_box.itemData(i) for i in range(bar.tissue_box.count())] == [ALL_TISSUES, *NAMES]
    assert bar.opacity_slider.value() == 40 and bar.opacity_label.text() == "40%"
    assert "Ctrl+T" in bar.tissue_action.toolTip()
    qtbot.waitUntil(lambda: axial.draw_count > 0, timeout=10_000)
    plain = pixels(axial)

    _press_overlay(qtbot, rig)
    assert state.show_tissue and bar.tissue_action.isChecked()
    overlaid = pixels(axial)
    assert not np.array_equal(plain, overlaid)
    assert state.tissue_shown() == ALL_TISSUES
    label = axial.crosshair_readout().rsplit("   ", 1)[-1]
    assert label == "background" or label.split()[0] in NAMES  # the readout names the tissue under it

    # The opacity slider, moved with the keyboard (End: 100%), changes what is drawn.
    bar.opacity_slider.setFocus()
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_End)
    assert state.tissue_opacity == 1.0 and bar.opacity_label.text() == "100%"
    opaque = pixels(axial)
    assert not np.array_equal(opaque, overlaid)

    # At 100% the label map's colours are painted exactly where its voxels are, nearest-neighbour,
    # on the slice shown, after a slice step and after a zoom.
    choose(qtbot, rig.toolbar.interpolation_box, "Nearest")

    def check_label_colours():
        ijk = _off_crosshair(state, axial)
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
    _press_overlay(qtbot, rig)
    assert not state.show_tissue and state.tissue_shown() is None
    choose(qtbot, bar.tissue_box, "WM")
    assert state.tissue_choice == "WM" and state.show_tissue
    ijk = _off_crosshair(state, axial)
    probability = float(entry.tissue["WM"][ijk])
    grey = _colour_at(axial, ijk)
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_Home)  # 0%: the image alone again
    assert bar.opacity_label.text() == "0%"
    under = _colour_at(axial, ijk)
    qtbot.keyClick(bar.opacity_slider, Qt.Key.Key_End)
    expected = np.array(TISSUE_COLOURS["WM"]) * probability + np.array(under) * (1 - probability)
    assert np.allclose(grey, expected, atol=3)

    # The View menu has the same switch (Help > Keyboard Shortcuts lists it: test_viewer.py).
    assert bar.tissue_action in rig.services.menus.view.actions()


def test_tissue_controls_are_disabled_with_the_reason_for_a_volume_without_maps(qtbot, viewer_rig, tmp_path):
    rig, bar = viewer_rig, viewer_rig.tissue_toolbar
    state = rig.state
    path = write_volume(tmp_path / "plain.nii.gz", np.random.default_rng(0).random((20, 24, 18)) * 100)
    entry = rig.open(qtbot, path)
    assert not entry.tissue and entry.space is None
    for control in (bar.tissue_action, bar.tissue_box, bar.opacity_slider):
        assert not control.isEnabled()
        assert "no tissue maps" in control.toolTip()
    assert _space_label(entry) == "Space: scanner"
    qtbot.waitUntil(lambda: rig.viewer.axial.draw_count > 0, timeout=10_000)
    before = pixels(rig.viewer.axial)
    _press_overlay(qtbot, rig)  # nothing to show
    assert not state.show_tissue and np.array_equal(pixels(rig.viewer.axial), before)

    # Turned on for a volume with maps, the overlay stays off on one without, and comes back after.
    generated = add_tissue_volume(state)
    _press_overlay(qtbot, rig)
    assert state.tissue_shown() == ALL_TISSUES
    state.show(entry)  # the previous volume (the window's Ctrl+[: test_viewer.py)
    assert state.tissue_shown() is None and not bar.tissue_box.isEnabled()
    assert bar.tissue_box.count() == 1
    state.show(generated)
    assert state.tissue_shown() == ALL_TISSUES and bar.tissue_box.count() == 5


def test_save_as_writes_the_tissue_maps_beside_the_image_in_mni_space_and_they_open_again(
    qtbot, viewer_rig, tmp_path, monkeypatch, error_dialogs
):
    import nibabel as nib

    rig = viewer_rig
    entry = add_tissue_volume(rig.state)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "brain_T1w.nii.gz"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *args, **kwargs: (str(target), ""))
    rig.files.save_file_dialog()  # File > Save As NIfTI (Ctrl+S for a volume never saved)
    qtbot.waitUntil(lambda: "Saved" in rig.message(), timeout=60_000)
    assert "4 tissue maps" in rig.message()
    maps = {name: out / f"brain_label-{name}_probseg.nii.gz" for name in NAMES}
    assert not error_dialogs
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
    again = rig.open(qtbot, target)
    assert again.tissue_names == NAMES and again.space == MNI
    assert all(np.allclose(again.tissue[n], entry.tissue[n], atol=1e-6) for n in NAMES)
    assert "with tissue maps GM, WM, CSF, ventricles" in rig.message()
    assert rig.tissue_toolbar.tissue_box.isEnabled()


def test_an_unusable_tissue_map_is_left_out_with_a_message_and_sform_4_names_mni(
    qtbot, viewer_rig, tmp_path, error_dialogs
):
    from engine.nifti.io import make_nifti, tissue_path

    rig = viewer_rig
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

    entry = rig.open(qtbot, image)
    assert entry.tissue_names == ["WM"] and np.allclose(entry.tissue["WM"], wm, atol=1e-6)
    assert entry.space == "MNI152 (sform code 4)"
    assert _space_label(entry) == "Space: MNI152 (sform code 4)"
    message = rig.message()
    assert "with tissue maps WM" in message and "tissue map GM" in message and "shape" in message
    assert "1 more" in message  # the unreadable CSF file
    assert not error_dialogs  # the image opened: nothing to stop for


def test_at_40_percent_the_overlay_lies_40_percent_of_the_way_from_the_grey_to_its_colour(
    qtbot, viewer_rig, screenshot
):
    """The composed pixel, read off the screen, is 40 % of the way from the grey to the tissue's colour (one
    alpha, applied once: opacity compounded per map or premultiplied twice would put it near the colour)."""
    rig, bar = viewer_rig, viewer_rig.tissue_toolbar
    state = rig.state
    entry = add_tissue_volume(state)
    axial = rig.viewer.axial
    choose(qtbot, rig.toolbar.interpolation_box, "Nearest")  # one voxel, one colour on screen
    assert bar.opacity_label.text() == "40%"
    qtbot.waitUntil(lambda: axial.draw_count > 0, timeout=10_000)
    # Voxels of the shown slice labelled as a tissue, in its middle half (clear of the corner texts) and
    # off the crosshair's lines, where the image alone is grey.
    centre = state.crosshair_voxel()
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

    _press_overlay(qtbot, rig)  # Ctrl+T: all tissues, 40%
    assert state.tissue_shown() == ALL_TISSUES
    for voxel, label in found[:12]:
        colour = np.array(TISSUE_COLOURS[NAMES[label - 1]])
        shown = np.array(_colour_at(axial, voxel))
        span = colour - under[voxel]
        big = np.abs(span) > 40  # channels where grey and colour differ enough to measure the fraction
        fraction = (shown - under[voxel])[big] / span[big]
        assert np.allclose(fraction, 0.4, atol=0.05), (voxel, under[voxel], shown, colour, fraction)
    screenshot(rig.host, "14-tissue-overlay-40-percent")
