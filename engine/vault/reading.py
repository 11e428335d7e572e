"""Reading items back: searching the index, and decrypting a volume or its tissue maps into memory (never
to disk), each view recorded in the audit trail."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import InvalidRequest
from engine.vault import guards, item_index, nifti, payload
from engine.vault.records import (
    KINDS,
    TISSUE_PART_PREFIX,
    ItemInfo,
    OpenedVolume,
    opened_volume,
    tissue_names,
)

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def search(state: VaultState, query: str = "", *, kind: str | None = None) -> list[ItemInfo]:
    """Items whose id, label, patient, study or provenance contains ``query`` (case-insensitive).

    Args:
        query: Text to look for; every whitespace-separated word must match somewhere.
        kind: ``"scan"`` or ``"synthetic"`` to filter.
    """
    if kind is not None and kind not in KINDS:
        raise InvalidRequest(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    words = query.lower().split()
    with guards.operation(state):
        assert state.index is not None
        out = []
        for rec in state.index["items"].values():
            if kind is not None and rec["kind"] != kind:
                continue
            haystack = " ".join(
                [
                    rec["id"],
                    rec.get("label", ""),
                    rec.get("original_name", ""),
                    rec["kind"],
                    json.dumps(rec.get("patient") or {}, ensure_ascii=False),
                    json.dumps(rec.get("study") or {}, ensure_ascii=False),
                    json.dumps(rec.get("provenance") or {}, ensure_ascii=False),
                ]
            ).lower()
            if all(w in haystack for w in words):
                out.append(ItemInfo.from_record(rec))
    return sorted(out, key=lambda i: (i.created, i.id))


def open_item(
    state: VaultState, item_id: str, *, as_float32: bool = True, with_tissue: bool = False
) -> OpenedVolume:
    """Decrypt an item's volume into memory (nothing is written to disk). Recorded as a view.

    Args:
        item_id: Item id or unique prefix.
        as_float32: Return float32 voxels (scaling applied); otherwise nibabel's view of the stored
            values (the stored dtype when the file has no scaling).
        with_tissue: Also decrypt its tissue maps into :attr:`OpenedVolume.tissue` (see
            :meth:`open_tissue`).

    Raises:
        VaultCorrupted: The item failed authentication (no data is returned).
    """
    with guards.operation(state):
        rec = item_index.find_record(state, item_id)
        names = tissue_names(rec) if with_tissue else ()
        state.record("view", rec["id"], {"tissue": list(names)} if names else {})
        volume = next(p for p in rec["parts"] if p["name"] == "volume")
        raw = payload.read_part(state, rec, volume)
        data, _ = nifti.load(raw, compressed=bool(rec["volume"].get("compressed")), as_float32=as_float32)
        del raw
        tissue = read_tissue(state, rec, names)
        # The index holds the affine at full precision (NIfTI-1 stores the sform as float32); for a NIfTI
        # import it is exactly what nibabel reads from the file.
        affine = np.array(rec["volume"]["affine"], dtype=np.float64)
        return opened_volume(data, affine, ItemInfo.from_record(rec), tissue)


def open_tissue(state: VaultState, item_id: str, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Decrypt a generated item's tissue maps into memory (nothing is written to disk). Recorded as a
    view.

    Args:
        item_id: Item id or unique prefix.
        names: The maps wanted (e.g. ``["GM"]``); None for all of them.

    Returns:
        Name -> float32 (x, y, z) on the grid of the item's volume (same affine), in stored order; empty
        for an item without maps.

    Raises:
        InvalidRequest: The item has no map of a name asked for.
        VaultCorrupted: A map failed authentication (no data is returned).
    """
    with guards.operation(state):
        rec = item_index.find_record(state, item_id)
        stored = tissue_names(rec)
        wanted = stored if names is None else tuple(str(n) for n in names)
        missing = [n for n in wanted if n not in stored]
        if missing:
            have = ", ".join(stored) if stored else "none"
            raise InvalidRequest(
                f"item {rec['id'][:12]} has no tissue map {missing[0]!r} (its tissue maps: {have})"
            )
        if not wanted:
            return {}
        state.record("view", rec["id"], {"tissue": list(wanted)})
        return read_tissue(state, rec, wanted)


def read_tissue(state: VaultState, rec: dict, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Decrypt and parse the named tissue parts of an item; all of them or none (raises)."""
    out = {}
    for name in names:
        part = next(p for p in rec["parts"] if p["name"] == TISSUE_PART_PREFIX + name)
        raw = payload.read_part(state, rec, part)
        out[name], _ = nifti.load(raw, compressed=bool(part.get("compressed")), as_float32=True)
        del raw
    return out
