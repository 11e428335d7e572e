"""``vault rekey``: after it, an old passphrase and an old copy of vault.json open nothing (issue 24, point 2).

Before: ``vault passwd`` re-wrapped the same master key, so the old passphrase plus a backup of
``vault.json`` decrypted items imported after the change.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.cli import main as cli_main
from engine.errors import InvalidRequest, VaultError, VaultLocked
from engine.vault import Vault, crypto
from engine.vault.crypto import DecryptionFailed
from engine.vault.rekey import COMPLETE_MARK, retired_path, staging_path
from engine.vault.store import BLOB_DIR, BLOB_SUFFIX, HEADER_NAME, INDEX_NAME, _Header

NEW = "a new passphrase, after a leak"


def _old_master(header_bytes: bytes, folder, passphrase: str) -> tuple[bytes, bytes]:
    """What an attacker gets from an old vault.json and the old passphrase: (vault id, master key)."""
    backup = folder.parent / "stolen"
    backup.mkdir(exist_ok=True)
    (backup / HEADER_NAME).write_bytes(header_bytes)
    header = _Header.read(backup)
    kek = crypto.derive_kek(crypto.encode_passphrase(passphrase), header.salt, header.kdf)
    return header.vault_id, crypto.unwrap_key(kek, header.wrap_nonce, header.wrapped_key, header.aad())


def _blob_bytes(vault: Vault, item_id: str) -> tuple[dict, bytes]:
    rec = vault.state.index["items"][item_id]
    part = next(p for p in rec["parts"] if p["name"] == "volume")
    return part, (vault.path / BLOB_DIR / f"{part['blob']}{BLOB_SUFFIX}").read_bytes()


def test_after_passwd_the_old_passphrase_and_an_old_header_still_read_new_items(vault, make_nifti):
    """What passwd does not do (kept as a statement of fact, and why rekey exists)."""
    old_header = (vault.path / HEADER_NAME).read_bytes()
    vault.change_passphrase(PASSPHRASE, NEW, kdf=FAST_KDF)
    item = vault.import_nifti(make_nifti("after.nii")[0]).id
    vault_id, master = _old_master(old_header, vault.path, PASSPHRASE)
    part, blob = _blob_bytes(vault, item)
    key = crypto.subkey(master, vault_id, "item", item)
    plain = crypto.decrypt_bytes(key, crypto.context(vault_id, item, "volume"), blob)
    assert len(plain) == part["size"]


def test_after_rekey_the_old_passphrase_and_an_old_header_read_nothing(vault, make_nifti):
    before_path, before_data, _ = make_nifti("before.nii")
    before = vault.import_nifti(before_path).id
    old_header = (vault.path / HEADER_NAME).read_bytes()
    old_index = (vault.path / INDEX_NAME).read_bytes()
    seen = []
    report = vault.rekey(
        PASSPHRASE, NEW, kdf=FAST_KDF, progress=lambda done, total: seen.append((done, total))
    )
    after = vault.import_nifti(make_nifti("after.nii", shape=(5, 5, 5))[0]).id
    assert report.items == 1 and report.copied == 1 and seen[-1][0] == seen[-1][1] > 0

    vault_id, master = _old_master(old_header, vault.path, PASSPHRASE)
    for item in (before, after):  # neither the re-encrypted old item nor the new one
        _part, blob = _blob_bytes(vault, item)
        with pytest.raises(DecryptionFailed):
            crypto.decrypt_bytes(
                crypto.subkey(master, vault_id, "item", item), crypto.context(vault_id, item, "volume"), blob
            )
    index_key = crypto.subkey(master, vault_id, "index")
    with pytest.raises(DecryptionFailed):
        crypto.decrypt_bytes(
            index_key, crypto.context(vault_id, "index"), (vault.path / INDEX_NAME).read_bytes()
        )
    assert crypto.decrypt_bytes(index_key, crypto.context(vault_id, "index"), old_index)  # the attacker's key

    # The old header put back, with the old passphrase and the rollback override: nothing opens.
    vault.lock()
    (vault.path / HEADER_NAME).write_bytes(old_header)
    with pytest.raises(VaultError):
        Vault(vault.path).unlock(PASSPHRASE, allow_rollback=True)
    assert not retired_path(vault.path).exists() and not staging_path(vault.path).exists()


def test_rekey_keeps_every_item_and_the_audit_history(vault, make_nifti):
    path, data, _ = make_nifti("scan.nii")
    item = vault.import_nifti(path, label="kept").id
    vault.open_item(item)  # a view, in the audit trail
    history = [(e.event, e.item_id) for e in vault.audit_trail().entries]
    vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    vault.lock()
    reopened = Vault(vault.path)
    with pytest.raises(VaultLocked):
        reopened.unlock(PASSPHRASE)
    reopened.unlock(NEW)
    assert [i.label for i in reopened.items()] == ["kept"]
    assert np.array_equal(reopened.open_item(item).data, data.astype(np.float32))
    assert reopened.verify().ok
    trail = reopened.audit_trail()
    assert trail.ok
    replayed = [(e.event, e.item_id) for e in trail.entries if "replayed" in e.detail]
    assert replayed[: len(history)] == history
    assert any(e.event == "rekey" for e in trail.entries)
    reopened.lock()


def test_an_interrupted_rekey_leaves_the_vault_whole_and_resumes(vault, make_nifti):
    items = [vault.import_nifti(make_nifti(f"s{n}.nii", shape=(6 + n, 5, 5))[0]).id for n in range(3)]

    class Killed(Exception):
        pass

    def stop_after_first(done, total):
        if done > 0:
            raise Killed

    with pytest.raises(Killed):
        vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF, progress=stop_after_first)
    # the vault is as it was, under the old passphrase
    assert sorted(i.id for i in vault.items()) == sorted(items)
    assert vault.verify().ok
    staged = Vault(staging_path(vault.path))
    staged.unlock(NEW)
    [copied] = [i.id for i in staged.items()]
    staged.lock()
    remaining = [i for i in items if i != copied]
    vault.delete(remaining[0])  # a change between the runs is carried over
    with pytest.raises(InvalidRequest, match="another new passphrase"):
        vault.rekey(PASSPHRASE, "yet another passphrase", kdf=FAST_KDF)
    report = vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    assert (report.kept, report.copied, report.items) == (1, 1, 2)
    assert sorted(i.id for i in vault.items()) == sorted([copied, remaining[1]])
    assert vault.verify().ok


def test_a_rekey_killed_between_the_folder_renames_is_finished_when_the_vault_is_opened(
    vault, make_nifti, monkeypatch
):
    item = vault.import_nifti(make_nifti("scan.nii")[0]).id
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the staging folder's rename into place
            raise KeyboardInterrupt  # the process dies here
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not vault.path.exists() and (staging_path(vault.path) / COMPLETE_MARK).exists()

    reopened = Vault(vault.path)
    reopened.unlock(NEW)
    assert [i.id for i in reopened.items()] == [item]
    assert any("interrupted while the vault folder was being swapped" in n for n in reopened.notices)
    assert any("pre-rekey" in n for n in reopened.notices)  # the old-key copy deleted, with a word
    assert not retired_path(vault.path).exists()
    reopened.lock()


def test_cli_passwd_says_what_it_does_not_do_and_rekey_reports_its_cost(vault, tmp_path, capsys):
    vault.lock()
    old_file, new_file = tmp_path / "old", tmp_path / "new"
    old_file.write_text(PASSPHRASE + "\n")
    new_file.write_text(NEW + "\n")
    common = ["--vault", str(vault.path), "--passphrase-file", str(old_file), "--new-passphrase-file"]
    assert cli_main(["vault", "passwd", *common, str(new_file)]) == 0
    out = capsys.readouterr().out
    assert "old passphrase" in out and "vault rekey" in out
    old_file.write_text(NEW + "\n")
    assert cli_main(["vault", "rekey", *common, str(new_file)]) == 0
    captured = capsys.readouterr()
    assert "re-keyed" in captured.out and "MiB/s" in captured.out
