"""The audit trail: what is recorded, that it holds no PHI in plaintext, and that edits are caught."""

from __future__ import annotations

import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.errors import VaultCorrupted, VaultLocked
from engine.nifti.volume import Volume
from engine.vault import Vault


def _lines(vault: Vault) -> list[bytes]:
    return (vault.path / "audit.log").read_bytes().splitlines(keepends=True)


def _write_lines(vault: Vault, lines: list[bytes]) -> None:
    (vault.path / "audit.log").write_bytes(b"".join(lines))


@pytest.fixture
def busy_vault(vault, make_nifti, tmp_path):
    """A vault with every kind of event recorded."""
    path, _, _ = make_nifti("Quux_Zebulon.nii", descrip="Quux^Zebulon")
    info = vault.import_nifti(path, patient={"name": "Quux^Zebulon", "id": "ZQ-991"})
    vault.open_item(info.id)
    vault.export(info.id, tmp_path / "Zebulon exports", deidentify=True)
    syn = vault.add_synthetic(Volume(np.zeros((4, 4, 4)), np.eye(4), provenance={"seed": 1}))
    vault.delete(syn.id)
    vault.lock()
    with pytest.raises(VaultLocked):
        vault.unlock("wrong passphrase, twice")
    vault.unlock(PASSPHRASE)
    vault.verify()
    return vault, info


def test_every_event_is_recorded_in_order(busy_vault, tmp_path):
    vault, info = busy_vault
    trail = vault.audit_trail()
    assert trail.ok
    events = [(e.event, e.item_id) for e in trail.entries]
    assert [e for e, _ in events] == [
        "create",
        "import",
        "view",
        "export",
        "import",
        "delete",
        "lock",
        "unlock_failed",
        "unlock",
        "verify",
    ]
    assert events[1][1] == events[2][1] == events[3][1] == info.id
    export = trail.entries[3]
    assert export.detail == {
        "folder": str(tmp_path / "Zebulon exports"),
        "deidentified": True,
        "dicom_files": 0,
    }
    assert [e.seq for e in trail.entries] == list(range(1, len(trail.entries) + 1))
    assert all(e.time.endswith("+00:00") and e.pid > 0 for e in trail.entries)


def test_audit_files_hold_no_phi_in_plaintext(busy_vault):
    vault, _ = busy_vault
    for name in ("audit.log", "audit.head"):
        data = (vault.path / name).read_bytes()
        for marker in (b"Zebulon", b"Quux", b"ZQ-991", b"exports"):
            assert marker not in data, (name, marker)


@pytest.mark.parametrize("victim", [2, 5])
def test_edited_entry_is_reported_precisely(busy_vault, victim):
    vault, _ = busy_vault
    lines = _lines(vault)
    seq, payload, mac = lines[victim - 1].split(b" ")
    payload = bytearray(payload)
    payload[20] = ord("A") if payload[20] != ord("A") else ord("B")
    lines[victim - 1] = b" ".join([seq, bytes(payload), mac])
    _write_lines(vault, lines)
    trail = vault.audit_trail()
    assert trail.problems == (f"audit entry {victim} was edited",)
    assert len(trail.entries) == len(lines) - 1  # the others still decrypt
    report = vault.verify()
    assert not report.ok and f"audit entry {victim} was edited" in report.problems


def test_removed_entries_are_reported(busy_vault):
    vault, _ = busy_vault
    lines = _lines(vault)
    _write_lines(vault, lines[:3] + lines[4:])
    assert vault.audit_trail().problems == ("audit entry 4 was removed",)
    _write_lines(vault, lines[:3] + lines[6:])
    assert vault.audit_trail().problems == ("audit entries 4..6 were removed",)


def test_reordered_entries_are_reported(busy_vault):
    vault, _ = busy_vault
    lines = _lines(vault)
    lines[3], lines[4] = lines[4], lines[3]
    _write_lines(vault, lines)
    assert not vault.audit_trail().ok


def test_truncated_tail_is_caught_and_blocks_further_audited_work(busy_vault):
    vault, info = busy_vault
    lines = _lines(vault)
    _write_lines(vault, lines[:-2])
    trail = vault.audit_trail()
    assert any("truncated" in p for p in trail.problems)
    with pytest.raises(VaultCorrupted, match="truncated"):
        vault.open_item(info.id)  # a view that cannot be audited is refused
    fresh = Vault(vault.path)
    fresh.unlock(PASSPHRASE)  # still possible, so that the damage can be inspected
    assert fresh.audit_problem and "truncated" in fresh.audit_problem
    report = fresh.verify()
    assert not report.ok and any("truncated" in p for p in report.problems)
    fresh.lock()


def test_edited_missing_or_forged_head_and_forged_lines_are_caught(busy_vault):
    vault, info = busy_vault
    head = vault.path / "audit.head"
    original = head.read_bytes()
    damaged = bytearray(original)
    damaged[10] ^= 0x01
    head.write_bytes(bytes(damaged))
    assert any("head" in p for p in vault.audit_trail().problems)
    head.write_bytes(original)
    assert vault.audit_trail().ok
    head.unlink()
    assert any("head" in p and "missing" in p for p in vault.audit_trail().problems)
    with pytest.raises(VaultCorrupted, match="head"):
        vault.open_item(info.id)
    head.write_bytes(original)
    lines = _lines(vault)
    n = len(lines) + 1
    forged = f"{n} {lines[-1].split(b' ')[1].decode()} {'ab' * 32}\n".encode()
    _write_lines(vault, [*lines, forged])
    assert f"audit entry {n} was edited" in vault.audit_trail().problems
    with pytest.raises(VaultCorrupted):
        vault.open_item(info.id)


def test_crash_leftovers_in_the_audit_trail_are_recovered(vault, make_nifti):
    path, _, _ = make_nifti()
    info = vault.import_nifti(path)
    # 1. an append cut short by a crash: an unterminated line after the last entry
    with open(vault.path / "audit.log", "ab") as fh:
        fh.write(b"17 c29tZSBwYXJ0aWFs")
    vault.open_item(info.id)
    assert vault.audit_trail().ok
    assert (vault.path / "audit.log").read_bytes().endswith(b"\n")
    # 2. the head lagging behind the log (its update never reached the disk), even by several entries
    stale_head = (vault.path / "audit.head").read_bytes()
    for _ in range(3):
        vault.open_item(info.id)
    (vault.path / "audit.head").write_bytes(stale_head)
    vault.open_item(info.id)
    trail = vault.audit_trail()
    assert trail.ok and [e.event for e in trail.entries].count("view") == 5
