"""How a RAS+ volume maps onto the three slice views: pure numpy, no Qt.

Volumes are (x, y, z) arrays whose axes point to patient Right, Anterior and Superior (what
``engine.nifti.io.load_nifti`` and the engine produce). A display image is indexed [row, column] with row 0
at the top of the screen.

Conventions for the left/right axis of axial and coronal views:
  * radiological: the patient's right is on the screen's left (as if facing the patient);
  * neurological: the patient's right is on the screen's right (as if looking from behind).
Sagittal views show anterior on the left in both conventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

PLANES = ("axial", "coronal", "sagittal")


@dataclass(frozen=True)
class PlaneGeometry:
    """Which volume axes run along the screen's columns and rows, and whether they run backwards."""

    plane: str
    slice_axis: int
    col_axis: int
    row_axis: int
    col_flip: bool  # True: column 0 is the axis' highest index
    row_flip: bool
    labels: tuple[str, str, str, str]  # left, right, top, bottom edge of the screen

    def display_shape(self, shape: tuple[int, int, int]) -> tuple[int, int]:
        """(rows, columns) of the display image for a volume shape."""
        return shape[self.row_axis], shape[self.col_axis]

    def extract(self, volume: np.ndarray, index: int) -> np.ndarray:
        """The 2D display image [row, col] of slice ``index``."""
        index = int(np.clip(index, 0, volume.shape[self.slice_axis] - 1))
        plane = np.take(volume, index, axis=self.slice_axis)
        # ``plane`` keeps the remaining two axes in order; put rows first.
        remaining = [a for a in range(3) if a != self.slice_axis]
        if remaining.index(self.row_axis) != 0:
            plane = plane.T
        if self.row_flip:
            plane = plane[::-1, :]
        if self.col_flip:
            plane = plane[:, ::-1]
        return plane

    def to_voxel(self, row: float, col: float, index: float, shape: tuple[int, int, int]) -> np.ndarray:
        """Continuous display coordinates (row, col in pixels of the display image) -> voxel (i, j, k)."""
        rows, cols = self.display_shape(shape)
        ijk = np.zeros(3)
        ijk[self.slice_axis] = index
        ijk[self.col_axis] = (cols - 1 - col) if self.col_flip else col
        ijk[self.row_axis] = (rows - 1 - row) if self.row_flip else row
        return ijk

    def to_display(self, ijk, shape: tuple[int, int, int]) -> tuple[float, float]:
        """Voxel (i, j, k) -> (row, col) in display-image pixels."""
        rows, cols = self.display_shape(shape)
        col = float(ijk[self.col_axis])
        row = float(ijk[self.row_axis])
        return ((rows - 1 - row) if self.row_flip else row, (cols - 1 - col) if self.col_flip else col)

    def pixel_aspect(self, spacing: tuple[float, float, float]) -> tuple[float, float]:
        """(row height, column width) of one display pixel in mm."""
        return spacing[self.row_axis], spacing[self.col_axis]


def plane_geometry(plane: str, convention: str = "radiological") -> PlaneGeometry:
    radiological = convention == "radiological"
    if plane == "axial":  # z fixed; x across (R/L), y up (anterior at the top)
        return PlaneGeometry(
            plane,
            2,
            0,
            1,
            col_flip=radiological,
            row_flip=True,
            labels=("R", "L", "A", "P") if radiological else ("L", "R", "A", "P"),
        )
    if plane == "coronal":  # y fixed; x across, z up (superior at the top)
        return PlaneGeometry(
            plane,
            1,
            0,
            2,
            col_flip=radiological,
            row_flip=True,
            labels=("R", "L", "S", "I") if radiological else ("L", "R", "S", "I"),
        )
    if plane == "sagittal":  # x fixed; y across (anterior on the left), z up
        return PlaneGeometry(plane, 0, 1, 2, col_flip=True, row_flip=True, labels=("A", "P", "S", "I"))
    raise ValueError(f"plane must be one of {PLANES}, got {plane!r}")


def apply_window(image: np.ndarray, window: float, level: float) -> np.ndarray:
    """Map intensities to uint8 grey: level - window/2 -> 0, level + window/2 -> 255."""
    window = max(float(window), 1e-12)
    low = level - window / 2.0
    scaled = (np.asarray(image, dtype=np.float32) - low) * (255.0 / window)
    return np.ascontiguousarray(np.clip(scaled, 0, 255).astype(np.uint8))


def window_from_drag(window: float, level: float, dx: float, dy: float, span: float) -> tuple[float, float]:
    """Right-drag window/level like the big viewers: right widens the window, up raises the level.

    ``span`` is the intensity range a full 500-pixel drag covers (about the volume's range).
    """
    per_pixel = span / 500.0
    new_window = max(window + dx * per_pixel, span * 1e-4)
    new_level = level - dy * per_pixel
    return new_window, new_level


# -- numbers for people ------------------------------------------------------------------------------

INDEX_BASE = 0  # voxel and slice numbers on screen count from 0, as NIfTI voxel indices (and nibabel) do
AXIS_LETTERS = ("i", "j", "k")  # the voxel readout's (i, j, k): a slice number names the axis it counts


def format_intensity(value: float, integer: bool = False) -> str:
    """An intensity as plain digits: ``1234`` for integer data, ``0.153`` or ``12.5`` otherwise.

    Scientific notation only for magnitudes plain digits cannot show (below 0.001 or at 1e7 and above).
    """
    value = float(value)
    if not np.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e7 or (0 < magnitude < 1e-3 and not integer):
        return f"{value:.3g}"
    if integer or magnitude >= 1000:
        # half away from zero, as Qt's spin boxes round: the overlay and the W/L fields agree
        return f"{int(np.copysign(np.floor(magnitude + 0.5), value)):d}"
    decimals = 1 if magnitude >= 100 else 2 if magnitude >= 10 else 3
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_fixed(value: float, decimals: int) -> str:
    """``value`` with exactly ``decimals`` decimals, rounded as Qt's spin boxes round (halves away from
    zero, on the exact binary value), never ``-0``."""
    if not np.isfinite(value):
        return str(float(value))
    step = Decimal(1).scaleb(-max(0, int(decimals)))
    text = f"{Decimal(float(value)).quantize(step, rounding=ROUND_HALF_UP):f}"
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def intensity_decimals(span: float, integer: bool = False) -> int:
    """How many decimals a field for intensities of this span needs (0 for integer data)."""
    if integer or span >= 100:
        return 0
    if span <= 0 or not np.isfinite(span):
        return 3
    return int(min(6, max(1, 2 - np.floor(np.log10(span)))))


# -- zoom and pan ------------------------------------------------------------------------------------

MIN_ZOOM, MAX_ZOOM = 0.5, 32.0  # relative to "fit the view"
# One +/- key press or one Ctrl+wheel notch: Slicer and napari zoom about 1.1-1.2x a notch; 1.25 felt coarse.
ZOOM_STEP = 1.15


def zoom_percent(zoom: float) -> str:
    """The zoom for people, relative to "fit the view": '100%', '152%', '50%'."""
    return f"{zoom * 100:.0f}%"


def fit_rect(
    view_w: float, view_h: float, width_mm: float, height_mm: float, margin: float = 6.0
) -> tuple[float, float, float, float]:
    """(x, y, w, h) of an image of that physical size, centred and scaled to fit the view."""
    avail_w, avail_h = max(1.0, view_w - 2 * margin), max(1.0, view_h - 2 * margin)
    scale = min(avail_w / width_mm, avail_h / height_mm)
    w, h = width_mm * scale, height_mm * scale
    return (view_w - w) / 2, (view_h - h) / 2, w, h


def zoomed_rect(
    fit: tuple[float, float, float, float],
    view_w: float,
    view_h: float,
    zoom: float,
    pan: tuple[float, float],
) -> tuple[float, float, float, float]:
    """The fitted rect scaled by ``zoom`` about the view centre, then moved by ``pan`` (view pixels)."""
    _, _, w, h = fit
    zw, zh = w * zoom, h * zoom
    cx, cy = view_w / 2 + pan[0], view_h / 2 + pan[1]
    return cx - zw / 2, cy - zh / 2, zw, zh


def clamp_pan(
    pan: tuple[float, float], image_w: float, image_h: float, view_w: float, view_h: float, keep: float = 32.0
) -> tuple[float, float]:
    """Keep at least ``keep`` pixels of the image on screen, so a pan never loses the image."""
    limit_x = max(0.0, view_w / 2 + image_w / 2 - min(keep, image_w))
    limit_y = max(0.0, view_h / 2 + image_h / 2 - min(keep, image_h))
    return float(np.clip(pan[0], -limit_x, limit_x)), float(np.clip(pan[1], -limit_y, limit_y))


def zoom_about(
    zoom: float,
    pan: tuple[float, float],
    factor: float,
    point: tuple[float, float],
    view_w: float,
    view_h: float,
) -> tuple[float, tuple[float, float]]:
    """Zoom by ``factor`` keeping the image point under ``point`` (view pixels) where it is.

    Returns the new (zoom, pan); the zoom stays within [MIN_ZOOM, MAX_ZOOM].
    """
    new_zoom = float(np.clip(zoom * factor, MIN_ZOOM, MAX_ZOOM))
    applied = new_zoom / zoom
    cx, cy = view_w / 2 + pan[0], view_h / 2 + pan[1]
    new_cx = point[0] - (point[0] - cx) * applied
    new_cy = point[1] - (point[1] - cy) * applied
    return new_zoom, (new_cx - view_w / 2, new_cy - view_h / 2)
