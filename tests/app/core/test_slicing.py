"""Slice geometry, windowing and array+affine -> ImageData: pure code, no Qt."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.slicing import apply_window, plane_geometry, window_from_drag
from app.viewer.geometry import affine_to_grid_params, to_image_data

SHAPE = (5, 6, 7)


@pytest.fixture
def volume():
    return np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)


def test_axial_radiological_puts_patient_right_on_screen_left(volume):
    geom = plane_geometry("axial", "radiological")
    image = geom.extract(volume, 3)
    assert image.shape == (6, 5)  # rows = y (A..P), cols = x
    assert geom.labels == ("R", "L", "A", "P")
    # top-left pixel: most anterior row (max y) and the patient's right-most column (+x is Right: max x)
    assert image[0, 0] == volume[4, 5, 3]
    assert image[-1, -1] == volume[0, 0, 3]


def test_axial_neurological_flips_left_right_only(volume):
    rad = plane_geometry("axial", "radiological").extract(volume, 2)
    neuro = plane_geometry("axial", "neurological").extract(volume, 2)
    assert np.array_equal(rad[:, ::-1], neuro)
    assert plane_geometry("axial", "neurological").labels == ("L", "R", "A", "P")


def test_coronal_and_sagittal_superior_at_top(volume):
    coronal = plane_geometry("coronal", "neurological")
    image = coronal.extract(volume, 1)
    assert image.shape == (7, 5) and image[0, 4] == volume[4, 1, 6]  # top row = max z; right = max x (R)
    sagittal = plane_geometry("sagittal", "radiological")
    image = sagittal.extract(volume, 2)
    assert image.shape == (7, 6) and image[0, 0] == volume[2, 5, 6]  # top-left: superior and anterior
    assert sagittal.labels == ("A", "P", "S", "I")


@pytest.mark.parametrize("plane", ["axial", "coronal", "sagittal"])
@pytest.mark.parametrize("convention", ["radiological", "neurological"])
def test_display_voxel_round_trip(plane, convention, volume):
    geom = plane_geometry(plane, convention)
    rng = np.random.default_rng(1)
    for _ in range(20):
        ijk = np.array([rng.integers(0, s) for s in SHAPE], dtype=float)
        row, col = geom.to_display(ijk, SHAPE)
        back = geom.to_voxel(row, col, ijk[geom.slice_axis], SHAPE)
        assert np.allclose(back, ijk)
        # and the display image really holds that voxel there
        assert (
            geom.extract(volume, int(ijk[geom.slice_axis]))[int(row), int(col)]
            == volume[tuple(ijk.astype(int))]
        )


def test_unknown_plane_is_refused():
    with pytest.raises(ValueError, match="plane"):
        plane_geometry("oblique")


def test_apply_window_maps_level_to_mid_grey():
    out = apply_window(np.array([[0.0, 50.0, 100.0, 200.0]]), window=100.0, level=50.0)
    assert out.dtype == np.uint8 and out.tolist() == [[0, 127, 255, 255]]


def test_window_from_drag_widens_right_and_raises_level_up():
    window, level = window_from_drag(100.0, 50.0, dx=50, dy=-50, span=1000.0)
    assert window == pytest.approx(200.0) and level == pytest.approx(150.0)
    assert window_from_drag(1.0, 0.0, dx=-1e6, dy=0, span=10.0)[0] > 0


def test_image_data_points_sit_at_ras_positions(volume):
    affine = np.diag([2.0, 3.0, 1.5, 1.0])
    affine[:3, 3] = [-10.0, 5.0, 7.0]
    grid = to_image_data(volume, affine)
    assert grid.dimensions == SHAPE
    for ijk in [(0, 0, 0), (1, 2, 3), (4, 5, 6)]:
        index = np.ravel_multi_index(ijk, SHAPE, order="F")
        assert np.allclose(grid.points[index], (affine @ [*ijk, 1])[:3])
        assert grid.point_data["intensity"][index] == volume[ijk]


def test_image_data_keeps_oblique_rotation(volume):
    angle = np.deg2rad(20)
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rotation @ np.diag([2.0, 2.0, 3.0])
    affine[:3, 3] = [1, 2, 3]
    grid = to_image_data(volume, affine)
    index = np.ravel_multi_index((2, 3, 4), SHAPE, order="F")
    assert np.allclose(grid.points[index], (affine @ [2, 3, 4, 1])[:3])


def test_shear_and_bad_shapes_are_refused(volume):
    sheared = np.eye(4)
    sheared[0, 1] = 0.5
    with pytest.raises(ValueError, match="shear"):
        affine_to_grid_params(sheared)
    with pytest.raises(ValueError, match="x, y, z"):
        to_image_data(volume[0], np.eye(4))


# -- numbers and zoom maths (app/core/slicing.py) ----------------------------------------------------


def test_format_intensity_plain_numbers_for_people():
    from app.core.slicing import format_intensity

    assert format_intensity(30393.0, integer=True) == "30393"  # not 3.04e+04
    assert format_intensity(112.5, integer=True) == "113"  # half away from zero, as Qt's spin boxes
    assert format_intensity(-0.2, integer=True) == "0"
    assert format_intensity(12345.6) == "12346"
    assert format_intensity(0.15342) == "0.153"
    assert format_intensity(12.5) == "12.5" and format_intensity(2.0) == "2"
    assert format_intensity(5e-5) == "5e-05"  # plain digits cannot show it


def test_format_fixed_rounds_as_qt_spin_boxes_do():
    from app.core.slicing import format_fixed

    assert format_fixed(112.5, 0) == "113" and format_fixed(-112.5, 0) == "-113"  # Python's round gives 112
    assert (
        format_fixed(0.125, 2) == "0.13" and format_fixed(2.675, 2) == "2.67"
    )  # 2.675 is 2.67499... in binary
    assert format_fixed(-0.001, 2) == "0.00"  # never -0.00


def test_intensity_decimals_follow_the_span():
    from app.core.slicing import intensity_decimals

    assert intensity_decimals(1000.0) == 0 and intensity_decimals(5.0, integer=True) == 0
    assert intensity_decimals(1.0) == 2 and intensity_decimals(0.01) == 4


def test_zoom_about_keeps_the_point_under_the_cursor():
    from app.core.slicing import MAX_ZOOM, fit_rect, zoom_about, zoomed_rect

    view_w, view_h = 400.0, 300.0
    fit = fit_rect(view_w, view_h, 200.0, 100.0)
    point = (120.0, 200.0)

    def image_fraction(zoom, pan):
        x, y, w, h = zoomed_rect(fit, view_w, view_h, zoom, pan)
        return (point[0] - x) / w, (point[1] - y) / h

    before = image_fraction(1.0, (0.0, 0.0))
    zoom, pan = zoom_about(1.0, (0.0, 0.0), 2.0, point, view_w, view_h)
    assert zoom == 2.0 and image_fraction(zoom, pan) == pytest.approx(before)
    zoom, pan = zoom_about(zoom, pan, 1000.0, point, view_w, view_h)
    assert zoom == MAX_ZOOM and image_fraction(zoom, pan) == pytest.approx(before)


def test_clamp_pan_keeps_some_of_the_image_on_screen():
    from app.core.slicing import clamp_pan

    pan = clamp_pan((10_000.0, -10_000.0), 100.0, 80.0, 400.0, 300.0, keep=32.0)
    # image centre at most (view/2 + image/2 - keep) away: 32 px of the image stay in view
    assert pan == (200.0 + 50.0 - 32.0, -(150.0 + 40.0 - 32.0))
    assert clamp_pan((5.0, -5.0), 100.0, 80.0, 400.0, 300.0) == (5.0, -5.0)
