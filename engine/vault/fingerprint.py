"""What makes two items the same volume (a fingerprint of voxels, affine and provenance), and finding an
item that already holds a volume about to be stored."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

# Provenance keys that describe one file of a volume (its sidecar's neighbours, its batch position in a
# folder), not the volume: two files of the same volume differ there.
_FILE_SPECIFIC_PROVENANCE = frozenset({"tissue_maps", "file", "batch_index", "recovery_name"})


def volume_fingerprint(slices: Iterator[np.ndarray], shape: Sequence[int], affine, provenance) -> str:
    """SHA-256 of what makes two items the same volume: the voxel values (as float64, slice by slice over
    the last axis, so a file and an array hash alike whatever their dtype or compression), the affine (at
    the float32 precision a NIfTI header keeps) and the provenance less its file-specific keys.

    File bytes are no test: saving one volume twice gives two gzip streams with different headers.
    """
    prov = provenance if isinstance(provenance, Mapping) else {}
    head = {
        "shape": [int(n) for n in shape],
        "affine": np.asarray(affine, dtype=np.float32).astype(np.float64).round(5).tolist(),
        "provenance": {k: v for k, v in prov.items() if k not in _FILE_SPECIFIC_PROVENANCE},
    }
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode("utf-8"))
    for plane in slices:
        digest.update(np.ascontiguousarray(plane, dtype="<f8").tobytes())
    return digest.hexdigest()


def array_slices(arr: np.ndarray) -> Iterator[np.ndarray]:
    """An array's slices over its last axis (what :func:`volume_fingerprint` hashes)."""
    for index in range(arr.shape[-1]):
        yield arr[..., index]


def file_slices(path: Path, shape: Sequence[int], chunk: int = 16) -> Iterator[np.ndarray]:
    """A NIfTI file's voxels (scaled as nibabel reads them), a few slices at a time: never all in memory."""
    import nibabel as nib
    from nibabel.dataobj_images import DataobjImage

    image = nib.load(str(path))
    if not isinstance(image, DataobjImage):
        raise TypeError(f"{path.name} is not an image with voxel data ({type(image).__name__})")
    proxy = image.dataobj
    for start in range(0, int(shape[-1]), chunk):
        block = np.asarray(proxy[..., start : start + chunk])
        for index in range(block.shape[-1]):
            yield block[..., index]


def same_volume(index: dict, record: dict) -> dict | None:
    """An item of ``index`` already holding this volume: the same voxels, affine and provenance
    (``volume_fingerprint``), or, for items stored before fingerprints, the same plaintext bytes."""
    fingerprint = record.get("volume", {}).get("fingerprint")
    if fingerprint:
        for rec in index["items"].values():
            if rec.get("volume", {}).get("fingerprint") == fingerprint:
                return rec
    volume = next(p for p in record["parts"] if p["name"] == "volume")
    for rec in index["items"].values():
        for part in rec["parts"]:
            if (
                part["name"] == "volume"
                and part["sha256"] == volume["sha256"]
                and part["size"] == volume["size"]
            ):
                return rec
    return None
