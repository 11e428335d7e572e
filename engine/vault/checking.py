"""Checking and repairing a vault: ``verify`` authenticates every byte and the audit chain and lists every
problem; ``repair`` accepts the vault as it is and re-indexes the items whose files are still there."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import VaultCorrupted, VaultError
from engine.vault import cleanup, guards, item_index, payload, record_files, rollback
from engine.vault.anchor import AnchorState
from engine.vault.fsio import fsync_dir
from engine.vault.header import Header
from engine.vault.layout import BLOB_SUFFIX, RECORD_COPY_SUFFIX, RECORD_SUFFIX, blob_dir
from engine.vault.payload import Progress
from engine.vault.records import AuditTrail, RepairReport, VerifyReport

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def verify(
    state: VaultState,
    item_ids: Sequence[str] | None = None,
    *,
    check_audit: bool = True,
    progress: Progress | None = None,
) -> VerifyReport:
    """Authenticate every byte of every item (or of the given items) and check the audit chain.

    Never raises for tampering: every problem found is listed in the report, naming the item.

    Args:
        item_ids: Items to check (ids or prefixes); None for all.
        check_audit: Also check the audit trail's chain.
        progress: Called with (bytes done, bytes total).
    """
    with guards.operation(state):
        assert state.index is not None
        assert state.keys is not None
        problems: list[str] = []
        notes: list[str] = []
        rolled_back: list[str] = []
        try:
            header = Header.read(state.path)
            if header.vault_id != state.header.vault_id:
                problems.append("the vault header belongs to another vault")
            else:
                on_disk, _ = item_index.read_index(state.path, state.keys)
                rolled_back = rollback.rollback_problems(state, on_disk, header.to_bytes())
                problems.extend(rolled_back)
        except VaultError as exc:
            problems.append(str(exc))
        records = (
            list(state.index["items"].values())
            if item_ids is None
            else [item_index.find_record(state, i) for i in item_ids]
        )
        total = sum(int(p["size"]) for rec in records for p in rec["parts"])
        done = 0
        checked = 0
        without_copy = 0
        for rec in records:
            record_problems, copy_absent = record_files.record_problems(state, rec)
            problems.extend(record_problems)
            without_copy += copy_absent
            try:
                for part in rec["parts"]:
                    for piece in payload.iter_part(state, rec, part, check_hash=True):
                        done += len(piece)
                        if progress is not None:
                            progress(done, total)
                checked += 1
            except VaultCorrupted as exc:
                problems.append(str(exc))
        if state.anchor.problem:
            problems.append(f"rollback detection is weakened: {state.anchor.problem}")
        if without_copy:
            notes.append(
                f"{without_copy} item(s) lack one or both record files (a vault made by an older VolSynth); "
                "`volsynth vault repair` writes them, and from then on a missing one is a problem"
            )
        orphans = cleanup.orphan_blobs(state) if item_ids is None else []
        if orphans:
            notes.append(
                f"{len(orphans)} encrypted file(s) in {blob_dir(state.path)} are not in the index (left by an "
                "interrupted import, or items an older index forgot); they are kept: "
                "`volsynth vault repair` re-indexes those whose record still authenticates"
            )
        audit_entries = 0
        if check_audit:
            chk = state.audit.check()
            problems.extend(chk.problems)
            audit_entries = len(chk.entries)
        with contextlib.suppress(VaultError):
            state.record("verify", None, {"ok": not problems, "items": len(records)})
        return VerifyReport(
            ok=not problems,
            items_checked=checked,
            bytes_checked=done,
            audit_entries=audit_entries,
            problems=tuple(problems),
            notes=tuple(notes),
            unreferenced=tuple(p.name for p in orphans),
            rolled_back=tuple(rolled_back),
        )


def repair(state: VaultState, *, dry_run: bool = False, remove_leftovers: bool = False) -> RepairReport:
    """Accept the vault as it is now and put back into the index every item whose files are still there.

    The explicit answer to a rollback (or to unreferenced files): an unreferenced item record that
    authenticates, whose parts all exist and authenticate end to end, and which the audit trail does not
    show as deleted, is re-indexed. Nothing is deleted. The index gets a generation above every one seen,
    and the anchor is reset to the vault's present state, so the rollback is no longer reported (the
    repair itself is in the audit trail, naming what was accepted).

    Args:
        dry_run: Only report what would be done.
        remove_leftovers: Also delete the files nothing can bring back: those of items the audit trail
            shows deleted (a delete interrupted after its commit) and payloads that no record names (an
            import interrupted before its record, or items of a vault made before records existed). Not
            done while any record fails to authenticate: its payloads could come back with it.
    """
    with guards.operation(state), guards.writing(state, repairing=True):
        assert state.keys is not None and state.index is not None
        header_bytes = Header.read(state.path).to_bytes()
        accepted = rollback.rollback_problems(state, state.index, header_bytes)
        scan = state.audit.scan(after_seq=0)
        deleted = {e.item_id for e in scan.after if e.event == "delete" and e.item_id}
        index = copy.deepcopy(state.index)
        found = _salvage(state, index, deleted)
        leftovers = found.leftovers if remove_leftovers and not found.unreadable_record else []
        # Records of indexed items that are missing, damaged, swapped or stale are rewritten from the
        # index (the index is the commit point; the records are its copies for re-indexing).
        missing = [
            rid for rid, rec in index["items"].items() if record_files.records_need_writing(state, rec)
        ]
        if not missing and index.get("record_copies") != 2 and not dry_run:
            index["record_copies"] = 2  # (committed below only if something else changes)
        report = RepairReport(
            dry_run=dry_run,
            reindexed=tuple(found.reindexed),
            accepted=tuple(accepted),
            skipped=tuple(
                s for s in found.skipped if not leftovers or not any(s.startswith(p.name) for p in leftovers)
            ),
            records_written=len(missing),
            removed=tuple(p.name for p in leftovers if p.exists()),
        )
        if dry_run or not report.changed:
            return report
        _commit_repair(state, index, report, missing, scan.after)
        return report


@dataclass
class _Salvage:
    """What ``repair`` found among the files the index does not reference."""

    reindexed: list[tuple[str, str]] = field(default_factory=list)  # (item id, label) put back
    skipped: list[str] = field(default_factory=list)  # one line per file left as it is, saying why
    leftovers: list[Path] = field(default_factory=list)  # files nothing can bring back
    unreadable_record: bool = False  # a record failed to authenticate: its payloads may come back with it


def _salvage(state: VaultState, index: dict, deleted: set[str]) -> _Salvage:
    """Put into ``index`` every unreferenced item whose record and parts all authenticate and which the
    audit trail does not show deleted; list the rest."""
    found = _Salvage()
    claimed: set[str] = set()
    orphan_ids = sorted(
        {
            p.name[: -len(suffix)]
            for p in cleanup.orphan_blobs(state)
            for suffix in (RECORD_SUFFIX, RECORD_COPY_SUFFIX)
            if p.name.endswith(suffix)
        }
    )
    for item_id in orphan_ids:
        path = record_files.record_path(state, item_id)
        try:
            rec = record_files.read_record(state, item_id)
        except VaultCorrupted as exc:
            found.skipped.append(f"{path.name}: {exc}")
            found.unreadable_record = True
            continue
        blobs = [f"{p['blob']}{BLOB_SUFFIX}" for p in rec["parts"]]
        if item_id in deleted:
            found.skipped.append(
                f"{path.name} and its {len(blobs)} payload file(s): item {item_id} was deleted"
            )
            claimed.update(blobs)
            found.leftovers += [
                path,
                record_files.record_copy_path(state, item_id),
                *(blob_dir(state.path) / b for b in blobs),
            ]
            continue
        try:
            for part in rec["parts"]:
                for _piece in payload.iter_part(state, rec, part, check_hash=True):
                    pass
        except VaultCorrupted as exc:
            found.skipped.append(f"{path.name}: {exc}")
            continue
        claimed.update(blobs)
        index["items"][item_id] = rec
        found.reindexed.append((item_id, rec.get("label", "")))
    for path in cleanup.orphan_blobs(state):
        if path.name.endswith(BLOB_SUFFIX) and path.name not in claimed:
            found.skipped.append(f"{path.name}: no authentic record names it")
            found.leftovers.append(path)
    return found


def _commit_repair(
    state: VaultState, index: dict, report: RepairReport, missing: list[str], entries: Sequence
) -> None:
    """Write the missing records, commit the repaired index at a generation above every one seen, delete
    the leftovers asked for, and reset the anchor to the vault as it now is."""
    assert state.index is not None
    for rid in missing:
        record_files.write_record(state, index["items"][rid])
    index["record_copies"] = 2
    fsync_dir(blob_dir(state.path))
    seen = [int(e.detail["generation"]) for e in entries if isinstance(e.detail.get("generation"), int)]
    anchor = state.anchor.read()
    generation = 1 + max([int(state.index.get("generation", 0)), *seen, anchor.generation if anchor else 0])
    item_index.commit(
        state,
        "repair",
        None,
        {
            "reindexed": [rid for rid, _ in report.reindexed],
            "accepted": list(report.accepted),
            "removed": len(report.removed),
        },
        index,
        generation=generation,
    )
    for name in report.removed:  # asked for explicitly, and recorded in the audit entry above
        with contextlib.suppress(FileNotFoundError):
            (blob_dir(state.path) / name).unlink()
    if report.removed:
        fsync_dir(blob_dir(state.path))
    assert state.audit.last_appended is not None
    state.rolled_back = []
    seq, mac = state.audit.last_appended
    state.anchor.reset(AnchorState(generation, seq, mac.hex()))


def audit_trail(state: VaultState) -> AuditTrail:
    """The decrypted audit trail, with any tampering found in it."""
    with guards.operation(state):
        chk = state.audit.check()
        return AuditTrail(entries=tuple(chk.entries), problems=tuple(chk.problems))
