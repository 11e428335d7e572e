"""A process that keeps one volume (seed 3) in a recovery store under argv[1] and is then killed (SIGKILL);
with argv[2] "tissue", with the maps of ``tissue_maps(3)`` and the MNI space, as the tissue model's volumes
are kept."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from app.core.recovery import RecoveryStore
from engine.nifti.volume import Volume
from tests.app.recovery.samples import MNI, tissue_maps, volume_data

root, tissue = sys.argv[1], sys.argv[2:] == ["tissue"]
store = RecoveryStore(root)
store.open()
provenance = {"seed": 3, "synthetic": True, **({"space": MNI} if tissue else {})}
maps = {"tissue": tissue_maps(3), "space": MNI} if tissue else {}
store.keep(
    1,
    "seed 3 · crashed",
    Volume(volume_data(3), np.diag([2.0, 2.0, 2.0, 1.0]), provenance=provenance, **maps),
)
os.kill(os.getpid(), signal.SIGKILL)
