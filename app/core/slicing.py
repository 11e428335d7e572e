"""How a RAS+ volume maps onto the three slice views: pure numpy, no Qt.

Volumes are (x, y, z) arrays whose axes point to patient Right, Anterior and Superior (what
``engine.nifti_io.load_nifti`` and the engine produce). A display image is indexed [row, column] with row 0
at the top of the screen.

Conventions for the left/right axis of axial and coronal views:
  * radiological: the patient's right is on the screen's left (as if facing the patient);
  * neurological: the patient's right is on the screen's right (as if looking from behind).
Sagittal views show anterior on the left in both conventions.
"""

from __future__ import annotations

from dataclasses import dataclass

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
