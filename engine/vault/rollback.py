"""Rollback detection at unlock: what in the vault folder is older than the audit chain, the index or this
computer's anchor recorded, and where a rollback could not have been seen (see :mod:`engine.vault.store`)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from engine.errors import VaultCorrupted
from engine.vault.audit import ChainScan
from engine.vault.header import sha256

if TYPE_CHECKING:
    from engine.vault.state import VaultState


def rollback_problems(state: VaultState, index: dict, header_bytes: bytes) -> list[str]:
    """What in the vault folder is older than what the vault itself (audit chain, index) or this
    computer's anchor recorded. Needs the audit keys attached. One line per rolled-back file."""
    problems: list[str] = []
    generation = int(index.get("generation", 0))
    bound_seq = int(index.get("audit_seq", 0))
    try:
        scan = state.audit.scan(after_seq=bound_seq)
    except VaultCorrupted:  # audit.log missing: audit_problem reports it; the head still counts below
        scan = ChainScan(macs={}, last_seq=0, after=[])
    anchor = state.anchor.read()

    # vault.json: the index records the header it was committed with; a passphrase change that was
    # interrupted before its index commit left an audit entry naming the new header.
    actual = sha256(header_bytes)
    recorded = index.get("header_sha256")
    if recorded and recorded != actual:
        pending = any(
            e.event == "passphrase_changed" and e.detail.get("header_sha256") == actual for e in scan.after
        )
        if not pending:
            problems.append(
                "vault.json is an older version than the one the index was committed with (as after "
                "restoring it from before a passphrase change: a passphrase that was changed opens it "
                "again)"
            )

    # index.vsi against the audit chain: later commits in the chain mean the index went back. One
    # commit of difference is also what a crash between the audit entry and the index leaves; the
    # anchor tells the two apart.
    later = [
        int(e.detail["generation"])
        for e in scan.after
        if isinstance(e.detail.get("generation"), int) and e.event != "create"
    ]
    chain_gen = max(later, default=generation)
    anchor_gen = anchor.generation if anchor is not None else 0
    if chain_gen >= generation + 2 or (chain_gen == generation + 1 and anchor_gen > generation):
        problems.append(
            f"index.vsi was rolled back: it is at generation {generation} but the audit trail records "
            f"changes up to generation {chain_gen}; items added or changed since are missing from it"
        )
    elif anchor is not None and anchor_gen > generation:
        problems.append(
            f"index.vsi was rolled back: it is at generation {generation} but this computer last saw "
            f"generation {anchor_gen} ({anchor.updated or 'date unknown'}); items added or changed since "
            "are missing from it"
        )

    # audit.log + audit.head: the index and the anchor name entries the chain must still hold. A log cut
    # short behind an intact head is truncation, which the head itself reports (see audit_problem).
    audit_what = "audit.log and audit.head were rolled back"
    last = max(scan.last_seq, state.audit.head_seq() or 0)
    if bound_seq and last < bound_seq:
        problems.append(
            f"{audit_what}: the audit trail ends at entry {last} but the index was committed "
            f"at entry {bound_seq}"
        )
    elif bound_seq and bound_seq in scan.macs and scan.macs[bound_seq].hex() != index.get("audit_mac"):
        problems.append(
            f"audit.log was replaced: entry {bound_seq} is not the one the index was committed with"
        )
    elif anchor is not None and anchor.audit_seq:
        if last < anchor.audit_seq:
            problems.append(
                f"{audit_what}: the audit trail ends at entry {last} but this computer last saw "
                f"entry {anchor.audit_seq} ({anchor.updated or 'date unknown'})"
            )
        elif anchor.audit_seq in scan.macs and scan.macs[anchor.audit_seq].hex() != anchor.audit_mac:
            problems.append(
                f"audit.log was replaced: entry {anchor.audit_seq} is not the one this computer last saw"
            )
    return problems


def detection_limits(state: VaultState, index: dict) -> list[str]:
    """Where this unlock could not have detected a rollback, said in words (see ``warnings``)."""
    out: list[str] = []
    anchor = state.anchor.read()
    if anchor is None and not state.anchor.problem:
        out.append(
            f"this computer has no record of this vault (first unlock here or under this account, or its "
            f"anchor {state.anchor.path} was removed): if the whole vault folder is an older copy, that "
            "cannot be detected now (from this unlock on it can)"
        )
    generation = int(index.get("generation", 0))
    if anchor is not None and anchor.generation >= generation:
        return out  # the anchor saw this index committed: one entry more in the chain is a crash
    with contextlib.suppress(VaultCorrupted):
        later = [
            int(e.detail["generation"])
            for e in state.audit.scan(after_seq=int(index.get("audit_seq", 0))).after
            if isinstance(e.detail.get("generation"), int) and e.event != "create"
        ]
        if later and max(later) == generation + 1:
            out.append(
                "index.vsi is one change behind the audit trail: either the last change was interrupted "
                "(a crash), or the index was put back by one change, which cannot be told apart without "
                "this computer's anchor; if an item added or changed last is missing, run "
                "`volsynth vault repair --dry-run`"
            )
    return out
