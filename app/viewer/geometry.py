"""Array + affine -> pyvista ``ImageData`` (the 3D view's bridge to VTK; no Qt, tested without a display).

The NIfTI affine maps voxel (i, j, k) to RAS mm. ``ImageData`` stores the same mapping as origin, spacing
and a direction matrix (orthonormal columns), so an oblique affine is kept, not approximated. Shears are not
representable; they are rare in MRI and raise a clear error.
"""

from __future__ import annotations

import numpy as np

SCALARS = "intensity"


def affine_to_grid_params(affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a voxel->RAS affine into (origin, spacing, direction matrix)."""
    affine = np.asarray(affine, dtype=np.float64)
    if affine.shape != (4, 4):
        raise ValueError(f"affine must be 4x4, got {affine.shape}")
    linear = affine[:3, :3]
    spacing = np.sqrt((linear**2).sum(axis=0))
    if np.any(spacing <= 0):
        raise ValueError("affine has a zero-length voxel axis")
    direction = linear / spacing
    if not np.allclose(direction.T @ direction, np.eye(3), atol=1e-4):
        raise ValueError("affine has a shear; resample the volume before viewing it in 3D")
    return affine[:3, 3].copy(), spacing, direction


def to_image_data(volume: np.ndarray, affine: np.ndarray, name: str = SCALARS):
    """A pyvista ``ImageData`` whose points sit at the volume's RAS positions (mm)."""
    import pyvista as pv

    volume = np.asarray(volume)
    if volume.ndim != 3:
        raise ValueError(f"expected an (x, y, z) volume, got shape {volume.shape}")
    origin, spacing, direction = affine_to_grid_params(affine)
    grid = pv.ImageData(
        dimensions=volume.shape, spacing=tuple(spacing), origin=tuple(origin), direction_matrix=direction
    )
    # VTK runs x fastest: Fortran order matches (x, y, z) indexing.
    grid.point_data[name] = np.asarray(volume, dtype=np.float32).ravel(order="F")
    return grid
