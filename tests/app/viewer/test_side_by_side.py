"""View > Layout > Side by side: a real scan next to a synthetic volume, driven as a user drives it.

The shown volume (A) is above another of the session (B), plane by plane; one crosshair is linked in world
millimetres when both name one template space, centre to centre (and said so) when they do not; a slider
blends B over A's views (3D Slicer's foreground over background). The viewer and its tool bars on ``AppServices``
(tests/app/viewer/rig.py), with the Generate form docked beside them where the viewer's width matters.
"""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest

from app.core.compare_pair import linked_ras, resampled_plane
from app.core.slicing import plane_geometry
from app.services.shortcuts import keys
from app.viewer.viewer_area import SIDE_BY_SIDE
from app.window.status_bar import WindowStatus
from tests.app.viewer.rig import add_generation
from tests.app.viewer_helpers import pixels, write_volume

pytestmark = pytest.mark.render


def _write_mni(path, data, spacing, origin):
    """A NIfTI file whose sform says MNI152 (code 4), as template-space derivatives are written."""
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = origin
    image = nib.Nifti1Image(np.asarray(data, np.float32), affine)
    image.set_sform(affine, code=4)
    image.set_qform(affine, code=1)
    nib.save(image, str(path))
    return path


def _ball(shape, centre, radius):
    grid = np.indices(shape).astype(np.float32)
    dist = np.sqrt(sum((g - c) ** 2 for g, c in zip(grid, centre, strict=True)))
    return (dist < radius).astype(np.float32) * 100.0


def _side_by_side(qtbot, rig):
    window = rig.host
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    QTest.keySequence(window, keys("view.layout.5"))
    viewer = rig.viewer
    qtbot.waitUntil(lambda: viewer.side_by_side.bar.isVisible(), timeout=5_000)
    return viewer, viewer.side_by_side


def test_a_scan_beside_a_synthetic_volume_without_a_shared_space(qtbot, viewer_rig, tmp_path, screenshot):
    rig = viewer_rig
    window, state = rig.host, rig.state
    scan = rig.open(qtbot, write_volume(tmp_path / "scan.nii.gz", _ball((24, 28, 20), (8, 14, 10), 6)))
    synth = rig.open(
        qtbot,
        write_volume(
            tmp_path / "synth.nii.gz", _ball((16, 16, 16), (8, 8, 8), 5), synthetic=True, spacing=(2, 2, 2)
        ),
    )
    assert state.shown is synth
    viewer, side = _side_by_side(qtbot, rig)
    assert viewer.layout_name == SIDE_BY_SIDE
    b_views = side.views
    assert all(view.isVisible() for view in (*viewer.slice_views, *b_views.values()))
    assert not viewer.view3d.isVisible()
    # B is the volume shown before A; the views say which is which, and that the two share no space.
    assert side.other is scan and side.b_box.currentText() == scan.name
    assert viewer.axial.overlay_texts()["title"].startswith("A \u00b7 Axial")
    assert b_views["axial"].overlay_texts()["title"].startswith("B \u00b7 Axial")
    assert side.link_label.text().startswith("No shared space (A: no template space, B: scanner millimetres)")
    assert "centre to centre" in side.link_label.text()

    # A click in A's axial view moves B's crosshair by the same millimetres from its centre.
    view = viewer.axial
    rect = view.image_rect()
    qtbot.mouseClick(
        view,
        Qt.MouseButton.LeftButton,
        pos=QPoint(int(rect.left() + rect.width() * 0.3), int(rect.center().y())),
    )
    a_ras = state.crosshair_ras
    assert not np.allclose(a_ras, synth.center_ras())
    assert np.allclose(side.companion.crosshair_ras, linked_ras(synth, scan, a_ras))
    assert np.allclose(side.companion.crosshair_ras - scan.center_ras(), a_ras - synth.center_ras(), atol=1.0)
    # And a click in B's view moves A's.
    b_view = b_views["coronal"]
    b_rect = b_view.image_rect()
    qtbot.mouseClick(
        b_view, Qt.MouseButton.LeftButton, pos=QPoint(int(b_rect.center().x()), int(b_rect.top() + 5))
    )
    assert np.allclose(state.crosshair_ras, linked_ras(scan, synth, side.companion.crosshair_ras))

    # Blending by keyboard: Page Up twice on the slider puts B at 50% over A's views.
    before = pixels(view)
    side.opacity_slider.setFocus()
    qtbot.keyClick(side.opacity_slider, Qt.Key.Key_PageUp)
    qtbot.keyClick(side.opacity_slider, Qt.Key.Key_PageUp)
    assert side.opacity_slider.value() == 50 and side.opacity_label.text() == "50%"
    image, opacity = side.blend_image(view)
    assert opacity == 0.5 and image.width() == 16
    qtbot.waitUntil(lambda: not np.array_equal(pixels(view), before), timeout=5_000)
    screenshot(window, "side-by-side-scan-and-synthetic")

    # Another layout leaves the B views and the blend.
    QTest.keySequence(window, keys("view.layout.1"))
    assert not side.bar.isVisible() and not b_views["axial"].isVisible()
    assert side.blend_image(view) is None and viewer.axial.overlay_texts()["title"].startswith("Axial")


def test_two_volumes_in_mni_space_are_linked_in_millimetres(qtbot, viewer_rig, tmp_path):
    rig = viewer_rig
    state = rig.state
    # The same ball in two grids of one space: 1 mm and 2 mm voxels, different origins.
    fine = _write_mni(
        tmp_path / "fine.nii.gz", _ball((40, 40, 40), (20, 20, 20), 8), (1, 1, 1), (-20, -20, -20)
    )
    coarse = _write_mni(
        tmp_path / "coarse.nii.gz", _ball((24, 24, 24), (14, 14, 14), 4), (2, 2, 2), (-28, -28, -28)
    )
    b = rig.open(qtbot, fine)
    a = rig.open(qtbot, coarse)
    assert a.space and b.space
    viewer, side = _side_by_side(qtbot, rig)
    assert (
        side.link_label.text() == "Linked in MNI152 millimetres: the crosshair is at the same place in both."
    )
    view = viewer.sagittal
    rect = view.image_rect()
    qtbot.mouseClick(
        view, Qt.MouseButton.LeftButton, pos=QPoint(int(rect.center().x() + 7), int(rect.center().y() - 9))
    )
    assert np.allclose(side.companion.crosshair_ras, state.crosshair_ras, atol=0.5)
    # The blend puts B's ball where A's is: in the same millimetres, B's 1 mm ball lies on A's 2 mm one.
    index = viewer.axial.slice_index()
    plane = resampled_plane(a, b, plane_geometry("axial", state.convention), 14)
    ours = plane_geometry("axial", state.convention).extract(a.data, 14)
    assert index is not None and np.array_equal(plane > 50, ours > 50)

    # Choosing B with the keyboard: the B box lists the session's other volumes.
    side.b_box.setFocus()
    assert side.b_box.count() == 1 and side.b_box.currentText() == b.name


@pytest.mark.slow
def test_screenshots_of_a_real_brain_beside_a_synthetic_one(qtbot, viewer_rig, tmp_path, mni_t1, screenshot):
    """The MNI152 T1 template (a real brain in MNI space) as B, and a coarser copy of it written as a synthetic
    volume in the same space as A: linked in millimetres, blended at 40%, at 1600x1000 and 1024x700."""
    from engine.nifti.io import load_nifti

    rig = add_generation(qtbot, viewer_rig)
    window = rig.host
    real = load_nifti(mni_t1)
    coarse = np.asarray(real.data, np.float32)[::3, ::3, ::3]
    affine = np.asarray(real.affine, np.float64).copy()
    affine[:3, :3] *= 3
    image = nib.Nifti1Image(coarse, affine)
    image.set_sform(affine, code=4)
    image.header["descrip"] = b"SYNTHETIC"
    nib.save(image, str(tmp_path / "synthetic-mni.nii.gz"))
    # nilearn's file says sform code 2 (aligned to a template); it is MNI152 2009a, so say so (code 4).
    scan = nib.Nifti1Image(np.asarray(real.data, np.float32), real.affine)
    scan.set_sform(real.affine, code=4)
    nib.save(scan, str(tmp_path / "mni152-t1.nii.gz"))
    b = rig.open(qtbot, tmp_path / "mni152-t1.nii.gz")
    a = rig.open(qtbot, tmp_path / "synthetic-mni.nii.gz")
    viewer, side = _side_by_side(qtbot, rig)
    assert side.other is b and a.space
    assert side.link_label.text().startswith("Linked in MNI152 millimetres")
    for _ in range(8):  # 8 x 5% by the arrow key
        qtbot.keyClick(side.opacity_slider, Qt.Key.Key_Right)
    assert side.opacity_slider.value() == 40
    panel = rig.sampling_panel
    for size, name in (((1600, 1000), "side-by-side-1600x1000"), ((1024, 700), "side-by-side-1024x700")):
        window.resize(*size)
        qtbot.waitUntil(lambda size=size: (window.width(), window.height()) == size, timeout=30_000)
        qtbot.waitUntil(
            lambda: side.link_label.height() >= side.link_label.heightForWidth(side.link_label.width()),
            timeout=5_000,
        )
        # The bar above the views does not widen the viewer into the Generate form (it scrolled sideways).
        qtbot.waitUntil(lambda: panel.scroll_area.horizontalScrollBar().maximum() == 0, timeout=20_000)
        screenshot(window, name)
        # The statement is whole: wrapped in its label, never cut.
        assert side.link_label.isVisible() and side.link_label.height() >= side.link_label.heightForWidth(
            side.link_label.width()
        )


def test_a_scan_aligned_to_a_template_declared_mni152_is_linked_by_millimetres_and_the_blend_is_marked(
    qtbot, viewer_rig, tmp_path, mni_t1, screenshot
):
    """nilearn's MNI152 T1 as a real scan says only "aligned to a template" (sform code 2): beside a synthetic
    volume in MNI152 it was linked centre to centre (A at z = 19 mm showed B at z = 6 mm). Declared MNI152, it is
    linked by millimetres; B blended over it puts SYNTHETIC and the blend in A's corner."""
    from app.core.tissue import ALIGNED_TO_TEMPLATE, DECLARED_MNI
    from engine.nifti.io import load_nifti

    rig = add_generation(qtbot, viewer_rig)
    window, state = rig.host, rig.state
    real = load_nifti(mni_t1)
    # The synthetic volume: a 3 mm copy of the template, on a grid that does not share the scan's centre.
    coarse = np.asarray(real.data, np.float32)[6:-12:3, 3::3, ::3]
    affine = np.asarray(real.affine, np.float64).copy()
    affine[:3, 3] = (affine @ [6, 3, 0, 1])[:3]
    affine[:3, :3] *= 3
    image = nib.Nifti1Image(coarse, affine)
    image.set_sform(affine, code=4)
    image.header["descrip"] = b"SYNTHETIC"
    nib.save(image, str(tmp_path / "synthetic-mni.nii.gz"))
    synth = rig.open(qtbot, tmp_path / "synthetic-mni.nii.gz")
    scan = rig.open(qtbot, mni_t1)
    assert scan.space == ALIGNED_TO_TEMPLATE and synth.synthetic and not scan.synthetic
    viewer, side = _side_by_side(qtbot, rig)
    assert state.shown is scan and side.other is synth
    assert side.link_label.text().startswith(f"No shared space (A: {ALIGNED_TO_TEMPLATE}, B: MNI152)")
    button = side.declare_button
    assert button.isVisible() and button.text() == "&Declare A MNI152"
    # At 1024x700 the button and the statement beside it fit the viewer: nothing widens it into the form.
    window.resize(1024, 700)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (1024, 700), timeout=30_000)
    panel = rig.sampling_panel
    qtbot.waitUntil(lambda: panel.scroll_area.horizontalScrollBar().maximum() == 0, timeout=20_000)
    assert button.width() >= button.minimumSizeHint().width() and button.isVisible()
    assert side.link_label.height() >= side.link_label.heightForWidth(side.link_label.width())
    screenshot(window, "side-by-side-declare-mni152-1024x700")
    window.resize(1500, 920)
    qtbot.waitUntil(lambda: window.width() == 1500, timeout=30_000)

    def click_a(plane: str) -> None:
        view = viewer.slice_views[("axial", "coronal", "sagittal").index(plane)]
        rect = view.image_rect()
        qtbot.mouseClick(
            view,
            Qt.MouseButton.LeftButton,
            pos=QPoint(int(rect.left() + rect.width() * 0.4), int(rect.top() + rect.height() * 0.35)),
        )

    click_a("coronal")
    a_ras = np.array(state.crosshair_ras)
    assert np.abs(side.companion.crosshair_ras - a_ras).max() > 3.0  # centre to centre: elsewhere in B

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert scan.space == DECLARED_MNI and not button.isVisible()
    assert (
        side.link_label.text() == "Linked in MNI152 millimetres: the crosshair is at the same place in both."
    )
    status = WindowStatus(window.statusBar())  # the status bar's space field, fed the shown volume
    status.show_volume(state.shown)
    assert status.space_label.text() == f"Space: {DECLARED_MNI}"
    click_a("sagittal")
    a_ras = np.array(state.crosshair_ras)
    # The same millimetres in both, to B's nearest 3 mm voxel.
    assert np.abs(side.companion.crosshair_ras - a_ras).max() <= 1.5 + 1e-6, (
        side.companion.crosshair_ras,
        a_ras,
    )

    # Blended by keyboard: 8 x 5% puts B at 40% over A's views, and A's corner says so, with the mark.
    assert "SYNTHETIC" not in viewer.axial.overlay_texts().get("tag", "")
    side.opacity_slider.setFocus()
    for _ in range(8):
        qtbot.keyClick(side.opacity_slider, Qt.Key.Key_Right)
    assert side.opacity_slider.value() == 40
    for view in viewer.slice_views:
        tag = view.overlay_texts()["tag"]
        assert tag.startswith("SYNTHETIC") and (tag.endswith("B over A 40%") or tag.endswith("B 40%")), tag
    screenshot(window, "side-by-side-declared-mni152-blend-40")
    # Back to 0%: A is the real scan alone again, unmarked.
    for _ in range(8):
        qtbot.keyClick(side.opacity_slider, Qt.Key.Key_Left)
    assert "tag" not in viewer.axial.overlay_texts()
