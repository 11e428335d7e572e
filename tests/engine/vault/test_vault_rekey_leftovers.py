"""What an interrupted or refused re-key leaves behind (issue 37 point 9).

Before: a re-key SIGKILLed while an item was being copied left that item's finished payload files in the
staging vault; the resumed run copied the item again under new names and carried the old files into the
re-keyed vault, where ``verify`` listed them every time. A re-key refused for lack of space left an empty
``.vault.rekey`` folder and asked for 79 MiB for a 16 MB vault (the ciphertext plus a flat 64 MiB).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import namedtuple

import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.errors import OutputError
from engine.vault import Vault, importing
from engine.vault.cleanup import orphan_blobs
from engine.vault.rekey import space_needed, staging_path

NEW = "the passphrase after the re-key"
_FORK = multiprocessing.get_context("fork")  # a forked re-key starts in milliseconds


def _rekey_killed_inside_the_second_copy(vault_path) -> None:
    """Child: re-key, and die (SIGKILL, no clean-up) when the second item's parts are written but its
    record is not yet committed to the staging index."""
    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    commit = importing._commit_item
    calls = []

    def commit_or_die(target, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return commit(target, *args, **kwargs)

    importing._commit_item = commit_or_die
    vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)


def _volumes(vault: Vault) -> dict[str, np.ndarray]:
    return {i.id: np.asarray(vault.open_item(i.id).data) for i in vault.items()}


def test_a_resumed_rekey_leaves_no_unreferenced_files(vault, make_nifti):
    for n in range(3):
        vault.import_nifti(make_nifti(f"s{n}.nii", shape=(10 + n, 9, 8), seed=n)[0])
    before = _volumes(vault)
    vault.lock()
    child = _FORK.Process(target=_rekey_killed_inside_the_second_copy, args=(vault.path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL

    staged = Vault(staging_path(vault.path), idle_timeout_s=None)
    staged.unlock(NEW)
    assert len(staged.items()) == 1
    assert orphan_blobs(staged.state), "the kill should leave the second item's files unreferenced"
    staged.lock()

    vault.unlock(PASSPHRASE)
    report = vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    assert (report.kept, report.copied) == (1, 2)
    checked = vault.verify()
    assert checked.ok and checked.unreferenced == ()
    assert not any("not in the index" in note for note in checked.notes)
    assert orphan_blobs(vault.state) == []
    assert {k: v.tobytes() for k, v in _volumes(vault).items()} == {k: v.tobytes() for k, v in before.items()}


def _allocated(folder) -> int:
    return sum(
        -(-os.stat(os.path.join(root, name)).st_size // 4096) * 4096
        for root, _, names in os.walk(folder)
        for name in names
    )


def test_the_space_estimate_is_what_the_copy_takes_plus_the_stated_margin(vault, make_nifti):
    for n in range(3):
        vault.import_nifti(make_nifti(f"big{n}.nii", shape=(64, 64, 48), seed=n)[0])  # 768 KiB each
    needed, margin = space_needed(vault.state, list(vault.state.index["items"].values()))
    vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    written = _allocated(vault.path)  # the re-keyed vault is the staging copy, renamed
    assert margin == max(1 << 20, (needed - margin) // 10)
    assert written <= needed - margin + (64 << 10)  # the estimate itself, within a few blocks
    assert needed <= 1.25 * written + (1 << 20)  # not the flat 64 MiB on top that was asked before


def test_a_rekey_refused_for_space_leaves_nothing_and_says_how_much(vault, make_nifti, monkeypatch):
    import engine.vault.rekey as rekey_module

    item = vault.import_nifti(make_nifti("scan.nii", shape=(32, 32, 24))[0]).id
    needed, margin = space_needed(vault.state, list(vault.state.index["items"].values()))
    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as patched, pytest.raises(OutputError) as refused:
        patched.setattr(rekey_module.shutil, "disk_usage", lambda _path: usage(1 << 40, 0, needed - 1))
        vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    message = str(refused.value)
    assert (
        f"needs about {needed / 2**20:.1f} MiB free" in message
        and f"{margin / 2**20:.1f} MiB of that" in message
    )
    assert "\n" not in message
    assert not staging_path(vault.path).exists()
    assert [i.id for i in vault.items()] == [item] and vault.verify().ok
    # the disk as it is: the same re-key now runs
    assert vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF).copied == 1


def _rekey_killed_inside_the_audit_replay(vault_path) -> None:
    """Child: re-key, and die when the first batch of replayed audit entries is in the staging chain."""
    import engine.vault.rekey as rekey_module
    from engine.vault.audit import AuditLog

    rekey_module.REPLAY_BATCH = 4  # (in the child only) a few entries make several batches

    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    append_many = AuditLog.append_many
    batches = []

    def append_or_die(log, records):
        if records and isinstance(records[0][2].get("replayed"), dict):
            batches.append(1)
            if len(batches) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return append_many(log, records)

    AuditLog.append_many = append_or_die
    vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)


def test_a_rekey_killed_inside_the_audit_replay_replays_each_entry_once(vault, make_nifti):
    vault.import_nifti(make_nifti("scan.nii", shape=(6, 5, 4))[0])
    for _ in range(10):
        vault.verify()
    old = [(e.seq, e.event) for e in vault.audit_trail().entries]
    assert len(old) > 2 * 4  # more than two of the child's batches
    vault.lock()
    child = _FORK.Process(target=_rekey_killed_inside_the_audit_replay, args=(vault.path,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    vault.unlock(PASSPHRASE)
    report = vault.rekey(PASSPHRASE, NEW, kdf=FAST_KDF)
    replayed = [
        (e.detail["replayed"]["seq"], e.event)
        for e in vault.audit_trail().entries
        if isinstance(e.detail.get("replayed"), dict)
    ]
    seqs = sorted(seq for seq, _ in replayed)
    assert seqs == list(range(1, len(seqs) + 1))  # every entry of the old chain once, none twice
    assert set(old) <= set(replayed)
    assert report.audit_entries == len(replayed)
