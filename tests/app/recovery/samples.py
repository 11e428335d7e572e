"""The volumes the recovery tests keep: small random images and tissue maps on their grid, the same for a
seed in every process (the child processes that are killed make them too)."""

from __future__ import annotations

import numpy as np

NAMES = ["GM", "WM", "CSF", "ventricles"]
MNI = "MNI152NLin2009aSym"


def volume_data(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((6, 7, 5), dtype=np.float32)


def tissue_maps(seed: int = 0) -> dict[str, np.ndarray]:
    """Tissue maps on ``volume_data``'s grid, as a generated volume has them (probabilities in [0, 1])."""
    rng = np.random.default_rng(100 + seed)
    return {name: rng.random((6, 7, 5), dtype=np.float32) for name in NAMES}
