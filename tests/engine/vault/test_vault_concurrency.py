"""Two processes on one vault: writes are serialised, the second writer gets a clear message."""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest
from vault_testutil import PASSPHRASE

from engine.cli import main
from engine.errors import VaultLocked
from engine.nifti.volume import Volume
from engine.vault import Vault

_FORK = multiprocessing.get_context("fork")


def _slow_importer(vault_path, nifti_path, started, release) -> None:
    """Child: import a file, pausing inside the write (holding the write lock) until released."""
    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    paused = []

    def progress(done, total):
        if not paused:
            paused.append(True)
            started.set()
            release.wait(60)

    vault.import_nifti(nifti_path, progress=progress)
    vault.lock()


@pytest.fixture
def writer_in_progress(vault, make_nifti):
    """Another process halfway through an import; yields (process, release event)."""
    path, _, _ = make_nifti("big.nii", shape=(64, 64, 64))
    started, release = _FORK.Event(), _FORK.Event()
    proc = _FORK.Process(target=_slow_importer, args=(vault.path, path, started, release))
    proc.start()
    assert started.wait(30), "the writer did not start"
    yield proc, release
    release.set()
    proc.join(30)


def test_second_writer_gets_a_clear_message_and_nothing_is_corrupted(vault, make_nifti, writer_in_progress):
    proc, release = writer_in_progress
    other = Vault(vault.path)
    other.unlock(PASSPHRASE)
    path, data, _ = make_nifti("small.nii")
    message = f"the vault is being written by another VolSynth process \\(pid {proc.pid}\\); try again when it finishes"
    with pytest.raises(VaultLocked, match=message):
        other.import_nifti(path)
    with pytest.raises(VaultLocked, match=message):
        other.add_synthetic(Volume(np.zeros((4, 4, 4)), np.eye(4), provenance={"seed": 2}))
    with pytest.raises(VaultLocked, match=message):
        other.change_passphrase(PASSPHRASE, "another fine passphrase")
    # reading is never blocked by a writer
    assert other.items() == [] and other.verify().ok
    release.set()
    proc.join(30)
    assert proc.exitcode == 0
    mine = other.import_nifti(path)  # now it goes through
    assert np.array_equal(other.open_item(mine.id, as_float32=False).data, data)
    report = other.verify()
    assert report.ok and report.items_checked == 2
    other.lock()


def test_writer_waits_when_asked_to(vault, make_nifti, writer_in_progress):
    proc, release = writer_in_progress
    other = Vault(vault.path, write_lock_wait_s=30)
    other.unlock(PASSPHRASE)
    path, _, _ = make_nifti("small.nii")
    timer = threading.Timer(0.3, release.set)
    timer.start()
    other.import_nifti(path)  # blocks until the other process finishes, then succeeds
    timer.join()
    proc.join(30)
    assert len(other.items()) == 2 and other.verify().ok
    other.lock()


def test_cli_reports_the_lock_in_one_line(vault, make_nifti, writer_in_progress, tmp_path, capsys):
    proc, _ = writer_in_progress
    path, _, _ = make_nifti("small.nii")
    pw = tmp_path / "pw"
    pw.write_text(PASSPHRASE + "\n")
    rc = main(["vault", "import", str(path), "--vault", str(vault.path), "--passphrase-file", str(pw)])
    err = capsys.readouterr().err
    assert rc == VaultLocked.exit_code == 11
    assert err == (
        f"volsynth: error: the vault is being written by another VolSynth process (pid {proc.pid}); "
        "try again when it finishes\n"
    )


def test_two_objects_in_one_process_exclude_each_other(vault, make_nifti):
    other = Vault(vault.path)
    other.unlock(PASSPHRASE)
    path, _, _ = make_nifti()
    blocked = []

    def progress(done, total):
        if not blocked:
            with pytest.raises(VaultLocked, match=f"pid {os.getpid()}"):
                other.import_nifti(path)
            blocked.append(True)

    vault.import_nifti(path, progress=progress)
    assert blocked and len(other.items()) == 1
    other.lock()
