"""``vault verify`` covers the per-item records (``blobs/<id>.vsr`` and their second copy ``.vsm``), and
``repair`` keeps an item whose record was deleted while the index was rolled back past it (issue 24,
point 4). Before: flipping, truncating, emptying, deleting or swapping a record left verify at "vault OK",
and after a deleted record plus a one-generation index rollback, repair re-indexed nothing."""

from __future__ import annotations

import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.errors import VaultRolledBack
from engine.vault import Vault


def _record(vault: Vault, item_id: str, suffix: str = ".vsr"):
    return vault.path / "blobs" / f"{item_id}{suffix}"


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


def _empty(path):
    path.write_bytes(b"")


def _delete(path):
    path.unlink()


@pytest.mark.parametrize("suffix", [".vsr", ".vsm"])
@pytest.mark.parametrize(
    "damage", [_flip, _truncate, _empty, _delete], ids=["flip", "truncate", "empty", "delete"]
)
def test_a_damaged_record_fails_verify_naming_the_item_and_repair_rewrites_it(
    vault, make_nifti, damage, suffix
):
    item = vault.import_nifti(make_nifti("a.nii")[0]).id
    assert vault.verify().ok
    damage(_record(vault, item, suffix))
    report = vault.verify()
    assert not report.ok and any(item in p and f"{item}{suffix}" in p for p in report.problems), report
    repaired = vault.repair()
    assert repaired.records_written == 1
    assert vault.verify().ok


def test_two_items_records_swapped_fail_verify(vault, make_nifti):
    a = vault.import_nifti(make_nifti("a.nii", seed=1)[0]).id
    b = vault.import_nifti(make_nifti("b.nii", seed=2)[0]).id
    ra, rb = _record(vault, a), _record(vault, b)
    data_a, data_b = ra.read_bytes(), rb.read_bytes()
    ra.write_bytes(data_b)
    rb.write_bytes(data_a)
    problems = vault.verify().problems
    assert any(a in p and "swapped" in p for p in problems) and any(
        b in p and "swapped" in p for p in problems
    )


def test_a_stale_record_put_back_fails_verify(vault, make_nifti):
    item = vault.import_nifti(make_nifti("a.nii")[0], label="first").id
    old = _record(vault, item).read_bytes()
    vault.update_item(item, label="renamed")
    _record(vault, item).write_bytes(old)
    assert any("differs from the index" in p for p in vault.verify().problems)


def test_a_deleted_record_and_an_index_rolled_back_past_its_item_lose_nothing(vault, make_nifti):
    vault.import_nifti(make_nifti("a.nii", seed=1)[0], label="kept")
    old_index = (vault.path / "index.vsi").read_bytes()
    path, data, _ = make_nifti("b.nii", seed=2)
    dropped = vault.import_nifti(path, label="dropped").id
    vault.lock()
    (vault.path / "index.vsi").write_bytes(old_index)  # one generation back
    _record(vault, dropped).unlink()  # and one of its record files gone

    again = Vault(vault.path)
    with pytest.raises(VaultRolledBack):
        again.unlock(PASSPHRASE)
    again.unlock(PASSPHRASE, allow_rollback=True)
    report = again.repair()
    assert [rid for rid, _ in report.reindexed] == [dropped]
    assert np.array_equal(again.open_item(dropped, as_float32=False).data, data)
    assert again.verify().ok  # the missing record file was written again from the index
    again.lock()
