"""Adding tissue maps to an item already in the vault (maps segmented after the item was stored: a scan, or a
generated volume whose model makes none).

The maps become encrypted parts of the same item (``tissue/<name>``, float32 NIfTI on the volume's grid), as
the maps stored with a generated volume are, and how they were made goes into the item's provenance
(``tissue_maps_made``). It is one commit under the write lock, in the order every change keeps: the new parts
and the item's record files first, then the audit entry and the index, which is the commit point. Until the
index is replaced the item is the old one; a failure before it removes the new parts and puts the old record
files back, a kill leaves them as unreferenced files that ``verify`` lists (never the item's own data).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import InvalidRequest
from engine.vault import crypto, guards, item_index, nifti, record_files
from engine.vault.fsio import fsync_dir
from engine.vault.header import now_iso
from engine.vault.layout import blob_dir, blob_path
from engine.vault.metadata import check_tissue, json_copy, template_space
from engine.vault.payload import PartWriter, Progress
from engine.vault.records import TISSUE_PART_PREFIX, ItemInfo, tissue_names

if TYPE_CHECKING:
    from engine.vault.state import VaultState

#: The ``descrip`` of a map computed for a scan: the scan's own header words are not copied into it.
SCAN_MAP_DESCRIP = "VolSynth tissue map"


def add_tissue_maps(
    state: VaultState,
    item_id: str,
    maps: Mapping[str, np.ndarray],
    made: dict,
    *,
    replace: bool = False,
    progress: Progress | None = None,
) -> ItemInfo:
    """Keep tissue maps with an existing item, encrypted, and record how they were made.

    Args:
        item_id: Item id or unique prefix.
        maps: Name -> (x, y, z) map on the grid of the item's volume (``TissueMaps.maps``).
        made: How they were made (``TissueMaps.sidecar()``), stored as the provenance's ``tissue_maps_made``.
        replace: Replace the maps the item has; without it an item with maps is refused.
        progress: Called with (bytes done, bytes total); it may raise (``Cancelled``) to stop, leaving the
            item as it was.

    Returns:
        The item's new metadata (``tissue_maps`` names the maps).

    Raises:
        InvalidRequest: No maps, a map off the volume's grid, bad ``made``, or maps there already.
    """
    made = json_copy(made, "how the tissue maps were made")
    if not isinstance(made, dict) or not made:
        raise InvalidRequest(
            "say how the tissue maps were made (a non-empty dict, as TissueMaps.sidecar() gives)"
        )
    with guards.operation(state), guards.writing(state):
        assert state.keys is not None and state.index is not None
        old_rec = item_index.find_record(state, item_id)
        rec = copy.deepcopy(old_rec)
        shape = tuple(rec["volume"]["shape"])
        checked = check_tissue(maps, shape)
        if not checked:
            raise InvalidRequest("no tissue maps to add")
        had = tissue_names(rec)
        if had and not replace:
            raise InvalidRequest(
                f"item {rec['id'][:12]} already has tissue maps ({', '.join(had)}); replace them to store new ones"
            )
        prov = dict(rec.get("provenance") or {})
        affine = np.asarray(rec["volume"]["affine"], dtype=np.float64)
        synthetic = rec["kind"] == "synthetic"
        descrip = nifti.SYNTHETIC_DESCRIP if synthetic else SCAN_MAP_DESCRIP
        header = nifti.stream_header(
            shape[:3], affine, descrip, space=template_space(prov), synthetic=synthetic
        )
        total = sum(len(header) + 4 * m.size for _, m in checked)
        key = state.keys.item(rec["id"])
        writers: list[PartWriter] = []
        committed = records_written = False
        try:
            done = 0
            new_parts = []
            for name, data in checked:
                part = TISSUE_PART_PREFIX + name
                writer = PartWriter(
                    blob_dir(state.path), key, crypto.context(state.keys.vault_id, rec["id"], part), part
                )
                writers.append(writer)
                writer.write(header)
                done += len(header)
                for slab in nifti.iter_volume_slabs(np.asarray(data, dtype=np.float32)):
                    writer.write(slab)
                    done += len(slab)
                    if progress is not None:
                        progress(done, total)
                new_parts.append(writer.close())
            old_maps = [p for p in rec["parts"] if p["name"].startswith(TISSUE_PART_PREFIX)]
            rec["parts"] = [p for p in rec["parts"] if p not in old_maps] + new_parts
            rec["provenance"] = {**prov, "tissue_maps_made": made}
            rec["modified"] = now_iso()
            records_written = True
            record_files.write_record(state, rec)
            fsync_dir(blob_dir(state.path))
            index = copy.deepcopy(state.index)
            index["items"][rec["id"]] = rec
            detail = {"fields": ["tissue_maps"], "maps": [n for n, _ in checked], "replaced": len(old_maps)}
            item_index.commit(state, "edit", rec["id"], detail, index)
            committed = True
        finally:
            if not committed and _index_on_disk_has(state, old_rec):
                # Not committed: the item is still the old one, so what this call wrote goes.
                for writer in writers:
                    writer.discard()
                if records_written:
                    with contextlib.suppress(OSError):
                        record_files.write_record(state, old_rec)
                        fsync_dir(blob_dir(state.path))
        if old_maps:  # replaced maps: the user asked for new ones, the old parts are no one's now
            for part in old_maps:
                with contextlib.suppress(FileNotFoundError):
                    blob_path(state.path, part["blob"]).unlink()
            fsync_dir(blob_dir(state.path))
        return ItemInfo.from_record(rec)


def _index_on_disk_has(state: VaultState, old_rec: dict) -> bool:
    """After a failure: does the index on disk still hold the item as it was (so the new parts are unused)?"""
    assert state.keys is not None
    try:
        index, _ = item_index.read_index(state.path, state.keys)
    except Exception:  # noqa: BLE001 - cannot tell: keep every file (verify lists the unused ones)
        return False
    return index["items"].get(old_rec["id"]) == old_rec
