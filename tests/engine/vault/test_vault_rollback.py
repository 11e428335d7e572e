"""Rollback of vault files (issue 18, failure 1): an older index.vsi, audit.log + audit.head put back
together, an old vault.json after a passphrase change. Each is detected with a message naming the file,
never leads to deletion, and ``vault repair`` brings back what the encrypted files still hold. Also: stale
``.part`` files of interrupted imports and exports are removed at the next unlock and reported."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal

import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.cli import main
from engine.errors import VaultLocked, VaultRolledBack
from engine.vault import Vault, item_index, pending_exports

_FORK = multiprocessing.get_context("fork")


def _snapshot(vault: Vault, *names: str) -> dict[str, bytes]:
    return {name: (vault.path / name).read_bytes() for name in names}


def _restore(vault: Vault, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (vault.path / name).write_bytes(data)


def _vsb(vault: Vault) -> set[str]:
    return {p.name for p in (vault.path / "blobs").glob("*.vsb")}


def _cli(capsys, vault: Vault, *args: str) -> tuple[int, str, str]:
    pw = vault.path.parent / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    rc = main(["vault", *args, "--vault", str(vault.path), "--passphrase-file", str(pw)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_rolled_back_index_is_named_and_repair_brings_the_items_back(vault, make_nifti, capsys):
    a, _, _ = make_nifti("a.nii", seed=1)
    b, b_data, _ = make_nifti("b.nii", seed=2)
    kept = vault.import_nifti(a, label="kept")
    old_index = _snapshot(vault, "index.vsi")
    dropped = vault.import_nifti(b, label="dropped", patient={"name": "Doe^Jane"})
    dropped_blobs = _vsb(vault)
    vault.lock()
    _restore(vault, old_index)

    again = Vault(vault.path)
    with pytest.raises(VaultRolledBack, match="index.vsi was rolled back") as caught:
        again.unlock(PASSPHRASE)
    assert "Nothing was deleted" in str(caught.value) and "vault repair" in str(caught.value)
    assert not again.is_unlocked

    rc, out, _ = _cli(capsys, vault, "verify")  # lists what the index forgot; exit status says rollback
    assert rc == VaultRolledBack.exit_code == 13
    assert "index.vsi was rolled back" in out and "unreferenced: blobs/" in out
    assert _vsb(vault) == dropped_blobs  # nothing was deleted

    rc, out, _ = _cli(capsys, vault, "repair", "--dry-run")
    assert rc == 0 and f"would re-index: {dropped.id} dropped" in out and "nothing was changed" in out
    assert _vsb(vault) == dropped_blobs
    rc, out, _ = _cli(capsys, vault, "repair")
    assert rc == 0 and f"re-index: {dropped.id}" in out

    fixed = Vault(vault.path)
    fixed.unlock(PASSPHRASE)
    assert {i.id for i in fixed.items()} == {kept.id, dropped.id}
    assert fixed.get(dropped.id).patient == {"name": "Doe^Jane"}
    assert np.array_equal(fixed.open_item(dropped.id, as_float32=False).data, b_data)
    report = fixed.verify()
    assert report.ok and not report.unreferenced
    assert "repair" in [e.event for e in fixed.audit_trail().entries]
    fixed.lock()


def test_index_rolled_back_on_another_computer_is_still_caught_by_the_audit_chain(
    vault, make_nifti, private_anchors
):
    paths = [make_nifti(f"{n}.nii", seed=n)[0] for n in range(3)]
    vault.import_nifti(paths[0])
    old_index = _snapshot(vault, "index.vsi")
    vault.import_nifti(paths[1])
    vault.import_nifti(paths[2])
    vault.lock()
    _restore(vault, old_index)
    shutil.rmtree(
        private_anchors, ignore_errors=True
    )  # no anchor: the vault folder was carried to another computer
    with pytest.raises(VaultRolledBack, match="audit trail records changes up to generation 3"):
        Vault(vault.path).unlock(PASSPHRASE)


def test_no_change_deletes_the_blobs_of_items_an_older_index_dropped(vault, make_nifti, private_anchors):
    """One generation back and no anchor looks exactly like a crash between the audit entry and the
    index commit, so the vault opens; the next change must still not delete what the index forgot."""
    a, _, _ = make_nifti("a.nii", seed=1)
    b, b_data, _ = make_nifti("b.nii", seed=2)
    c, _, _ = make_nifti("c.nii", seed=3)
    vault.import_nifti(a)
    old_index = _snapshot(vault, "index.vsi")
    dropped = vault.import_nifti(b)
    blobs = _vsb(vault)
    vault.lock()
    _restore(vault, old_index)
    shutil.rmtree(private_anchors, ignore_errors=True)

    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    again.import_nifti(c)  # a change: before the fix, it deleted the dropped item's payload for good
    assert blobs <= _vsb(again)
    report = again.verify()
    assert report.unreferenced and all(
        name in blobs or name.endswith((".vsr", ".vsm")) for name in report.unreferenced
    )
    assert again.repair().reindexed == ((dropped.id, "b"),)
    assert np.array_equal(again.open_item(dropped.id, as_float32=False).data, b_data)
    again.lock()


def test_audit_log_and_head_rolled_back_together(vault, make_nifti, private_anchors, tmp_path):
    path, _, _ = make_nifti()
    info = vault.import_nifti(path)
    old_audit = _snapshot(vault, "audit.log", "audit.head")
    for _ in range(3):  # views and an export: what a rollback of the audit trail would hide
        vault.open_item(info.id)
    vault.export(info.id, tmp_path / "out")
    vault.lock()
    _restore(vault, old_audit)
    assert Vault(vault.path).audit_trail  # (both files are consistent with each other)
    with pytest.raises(VaultRolledBack, match="audit.log and audit.head were rolled back"):
        Vault(vault.path).unlock(PASSPHRASE)


def test_audit_rolled_back_past_a_commit_is_caught_without_the_anchor(make_nifti, private_anchors, tmp_path):
    vault = Vault.create(tmp_path / "v2", PASSPHRASE, kdf=FAST_KDF)
    before = _snapshot(vault, "audit.log", "audit.head")
    vault.import_nifti(make_nifti()[0])
    vault.lock()
    _restore(vault, before)
    shutil.rmtree(private_anchors, ignore_errors=True)
    with pytest.raises(VaultRolledBack, match="ends at entry 1 but the index was committed at entry 2"):
        Vault(vault.path).unlock(PASSPHRASE)


def test_old_vault_json_after_passwd_does_not_bring_the_old_passphrase_back(vault, private_anchors):
    old_header = _snapshot(vault, "vault.json")
    vault.change_passphrase(PASSPHRASE, "a brand new passphrase", kdf=FAST_KDF)
    vault.lock()
    _restore(vault, old_header)
    shutil.rmtree(private_anchors, ignore_errors=True)  # caught inside the folder alone
    with pytest.raises(VaultRolledBack, match="vault.json is an older version"):
        Vault(vault.path).unlock(PASSPHRASE)
    with pytest.raises(VaultLocked, match="wrong passphrase"):
        Vault(vault.path).unlock("a brand new passphrase")


def test_interrupted_commit_is_not_taken_for_a_rollback(vault, make_nifti, monkeypatch):
    path, _, _ = make_nifti()

    def crash(*args, **kwargs):
        raise OSError("power cut")

    monkeypatch.setattr(item_index, "write_index_file", crash)
    with pytest.raises(OSError):
        vault.import_nifti(path)  # the audit entry (write-ahead) is written, the index is not
    monkeypatch.undo()
    vault.lock()
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert again.items() == [] and again.verify().ok
    again.import_nifti(path)
    again.lock()
    Vault(vault.path).unlock(PASSPHRASE)


def test_missing_anchor_is_recreated(vault, make_nifti, private_anchors):
    vault.import_nifti(make_nifti()[0])
    vault.lock()
    shutil.rmtree(private_anchors, ignore_errors=True)
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert list(private_anchors.glob(f"{again.vault_id}.json"))
    again.lock()


# -- stale partial files ---------------------------------------------------------------------------------


def test_stale_import_part_files_are_removed_at_unlock_and_reported(vault, capsys):
    leftover = vault.path / "blobs" / ".tmp-w-0123456789abcdef.part"
    leftover.write_bytes(b"\x00" * 100)
    vault.lock()
    rc, _, err = _cli(capsys, vault, "ls")
    assert rc == 0 and "removed 1 partial file(s)" in err
    assert not leftover.exists()


def _killed_export(vault_path, item_id, dest) -> None:
    """Child: start an export and die (SIGKILL) in the middle of writing its first file."""
    from engine.vault import fsio

    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    original = fsio.AtomicWriter.write

    def write_then_die(self, data):
        original(self, data)
        self._fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    fsio.AtomicWriter.write = write_then_die
    vault.export(item_id, dest)


def test_killed_export_leaves_a_hidden_part_file_that_the_next_unlock_removes(vault, make_nifti, tmp_path):
    info = vault.import_nifti(make_nifti(shape=(32, 32, 32))[0], patient={"name": "Doe^Jane"})
    dest = tmp_path / "exports"
    dest.mkdir()
    proc = _FORK.Process(target=_killed_export, args=(vault.path, info.id, dest))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    parts = list(dest.glob(".volsynth-export-*-staging/.volsynth-export-*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size > 0  # plaintext patient data, hidden
    assert [p.name.startswith(".") for p in dest.iterdir()] == [True]  # nothing visible

    vault.lock()
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert not list(dest.iterdir())
    assert any("interrupted export" in n and str(dest) in n for n in again.notices)
    assert not list(again.path.glob(".export-*"))
    again.lock()


def test_a_running_export_is_not_cleaned_up_by_another_process(vault, make_nifti, tmp_path):
    info = vault.import_nifti(make_nifti()[0])
    dest = tmp_path / "exports"
    dest.mkdir()
    # An export in progress in this process:
    with pending_exports.pending_export(vault.state, [dest]) as prefix:
        part = dest / f"{prefix}running.part"
        part.write_bytes(b"x")
        other = Vault(vault.path)
        other.unlock(PASSPHRASE)
        assert part.exists() and not other.notices
        other.lock()
    vault.export(info.id, dest)


def test_repair_never_brings_back_a_deleted_item(vault, make_nifti):
    """Files of a deleted item that are still there (a delete killed after its commit) stay deleted."""
    info = vault.import_nifti(make_nifti()[0])
    blobs = {p: p.read_bytes() for p in (vault.path / "blobs").iterdir()}
    vault.delete(info.id)
    for path, data in blobs.items():  # as if the process died before removing them
        path.write_bytes(data)
    report = vault.repair(dry_run=True)
    assert not report.reindexed and any("was deleted" in line for line in report.skipped)
    assert vault.items() == [] and all(p.exists() for p in blobs)
    assert set(vault.repair(dry_run=True, remove_leftovers=True).removed) == {p.name for p in blobs}
    assert all(p.exists() for p in blobs)
    report = vault.repair(remove_leftovers=True)  # explicit: the files of a deleted item go
    assert set(report.removed) == {p.name for p in blobs} and not any(p.exists() for p in blobs)
    assert vault.verify().ok and not vault.verify().unreferenced


def test_a_vault_from_before_rollback_detection_opens_and_upgrades(vault, make_nifti, private_anchors):
    info = vault.import_nifti(make_nifti()[0])
    legacy = {
        k: v
        for k, v in vault.state.index.items()
        if k not in ("audit_seq", "audit_mac", "header_sha256", "record_copies")
    }
    item_index.write_index_file(vault.path, vault.state.keys, legacy)  # the index as older versions wrote it
    (vault.path / "blobs" / f"{info.id}.vsr").unlink()  # and no item records yet
    (vault.path / "blobs" / f"{info.id}.vsm").unlink()
    vault.lock()
    shutil.rmtree(private_anchors, ignore_errors=True)
    again = Vault(vault.path)
    again.unlock(PASSPHRASE)
    assert again.verify().ok
    assert again.repair().records_written == 1  # what repair needs later is written once
    again.lock()
    Vault(vault.path).unlock(PASSPHRASE)
