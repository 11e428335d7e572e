"""Rollbacks that cannot be detected are said at unlock; a broken anchor is a visible error (issue 24,
point 5). Before: a vault folder copied to another account (no anchor), a one-change index rollback with the
anchor gone, and an anchor folder that cannot be written all unlocked with exit 0 and no word."""

from __future__ import annotations

import shutil

from vault_testutil import PASSPHRASE

from engine.cli import main
from engine.vault import Vault


def _unlock_cli(capsys, path, *args):
    pw = path.parent / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    rc = main(["vault", *args, "--vault", str(path), "--passphrase-file", str(pw)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_a_vault_copied_where_this_computer_has_no_anchor_warns_at_unlock(
    vault, make_nifti, tmp_path, monkeypatch, capsys
):
    vault.import_nifti(make_nifti("a.nii")[0])
    vault.lock()
    copy = tmp_path / "copied-vault"
    shutil.copytree(vault.path, copy)
    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(tmp_path / "other-account-anchors"))
    again = Vault(copy)
    again.unlock(PASSPHRASE)
    assert any("no record of this vault" in w for w in again.warnings)
    again.lock()
    rc, _out, err = _unlock_cli(capsys, copy, "ls")  # the anchor exists now: no warning the second time
    assert rc == 0 and "warning" not in err


def test_an_index_one_change_behind_with_the_anchor_gone_warns(vault, make_nifti, private_anchors, capsys):
    vault.import_nifti(make_nifti("a.nii", seed=1)[0])
    old_index = (vault.path / "index.vsi").read_bytes()
    vault.import_nifti(make_nifti("b.nii", seed=2)[0])
    vault.lock()
    (vault.path / "index.vsi").write_bytes(old_index)
    shutil.rmtree(private_anchors)
    rc, _out, err = _unlock_cli(capsys, vault.path, "ls")
    assert rc == 0 and "warning: index.vsi is one change behind the audit trail" in err
    assert "no record of this vault" in err


def test_an_anchor_that_cannot_be_written_is_a_warning_at_unlock_and_a_verify_problem(
    vault, tmp_path, monkeypatch, capsys
):
    vault.lock()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the anchor folder should be\n")
    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(blocked))
    rc, _out, err = _unlock_cli(capsys, vault.path, "ls")
    assert rc == 0 and "warning: cannot update the vault's anchor" in err
    rc, out, _err = _unlock_cli(capsys, vault.path, "verify")
    assert rc != 0 and "rollback detection is weakened" in out
