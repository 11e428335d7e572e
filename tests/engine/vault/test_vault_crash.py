"""Crash safety: a writer SIGKILLed at random points during imports, deletes and index updates."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter

import nibabel as nib
import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.vault import Vault, item_index

_FORK = multiprocessing.get_context("fork")  # a forked writer starts in milliseconds
RUNS = 50


def _writer(vault_path, sources, log_path, seed, live) -> None:
    """Child: import and delete forever, logging each change only after it returned (= committed)."""
    rng = random.Random(seed)
    vault = Vault(vault_path)
    vault.unlock(PASSPHRASE)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    live = list(live)
    commit = item_index.commit

    def traced_commit(vault, *args, **kwargs):  # (patched in the child only) to tell where the kill landed
        os.write(log, b"phase index-begin\n")
        commit(vault, *args, **kwargs)
        os.write(log, b"phase index-end\n")

    item_index.commit = traced_commit
    while True:
        if live and rng.random() < (0.6 if len(live) > 12 else 0.25):
            victim = live.pop(rng.randrange(len(live)))
            os.write(log, f"deleting {victim}\n".encode())
            vault.delete(victim)
            os.write(log, f"deleted {victim}\n".encode())
        else:
            info = vault.import_nifti(rng.choice(sources), allow_duplicate=True)
            os.write(log, f"committed {info.id}\n".encode())
            live.append(info.id)


def _blobs(vault, item_id):
    return [p["blob"] for p in vault.state.index["items"][item_id]["parts"]]


@pytest.mark.slow
def test_sigkill_at_random_points_never_damages_the_vault(tmp_path, make_nifti, record_property):
    vault = Vault.create(tmp_path / "vault", PASSPHRASE, kdf=FAST_KDF)
    vault.lock()
    sources = {}
    for n, (name, shape) in enumerate(
        [
            ("s0.nii", (8, 8, 8)),
            ("s1.nii", (24, 24, 24)),
            ("s2.nii.gz", (32, 32, 32)),
            ("s3.nii", (64, 64, 48)),
        ]
    ):
        path, _, _ = make_nifti(name, shape=shape, seed=n)
        sources[name] = (str(path), np.asanyarray(nib.load(path).dataobj))
    rng = random.Random(1234)
    committed: set[str] = set()
    deleted: set[str] = set()
    checked: set[str] = set()
    stats: Counter = Counter()
    for run in range(RUNS):
        log_path = tmp_path / f"run{run}.log"
        live = sorted(committed - deleted)
        proc = _FORK.Process(
            target=_writer, args=(vault.path, [s[0] for s in sources.values()], log_path, run, live)
        )
        proc.start()
        time.sleep(rng.uniform(0.005, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL

        lines = log_path.read_text().splitlines() if log_path.exists() else []
        events = [tuple(line.split()) for line in lines if not line.startswith("phase")]
        if lines and lines[-1] == "phase index-begin":
            stats["killed inside the index update"] += 1
        elif lines and lines[-1].startswith("deleting"):
            stats["killed inside a delete"] += 1
        else:
            stats["killed while writing payload/audit"] += 1
        committed |= {i for e, i in events if e == "committed"}
        deleted |= {i for e, i in events if e == "deleted"}
        in_flight_delete = {i for e, i in events if e == "deleting"} - deleted
        stats["changes"] += len(events) - len(in_flight_delete) - sum(e == "deleted" for e, _ in events)
        stats["leftover temp files"] += any(
            n.startswith(".tmp-") for d in (vault.path, vault.path / "blobs") for n in os.listdir(d)
        )

        # After the crash: the vault opens, verifies, and holds exactly the committed items, intact.
        after = Vault(vault.path)
        after.unlock(PASSPHRASE)
        assert after.audit_problem is None
        report = after.verify()
        assert report.ok, report.problems
        stats["orphan payloads"] += bool(report.unreferenced)
        present = {i.id: i for i in after.items()}
        expected = committed - deleted
        assert expected - in_flight_delete <= set(present), "a committed item was lost"
        assert not (deleted & set(present)), "a deleted item came back"
        interrupted = set(present) - expected
        assert len(interrupted) <= 1  # only the import that was killed can be there (and then whole)
        stats["interrupted import present (whole)"] += len(interrupted)
        for item_id in set(present) - checked:
            info = present[item_id]
            data = after.open_item(item_id, as_float32=False).data
            assert np.array_equal(data, sources[info.original_name][1])
            checked.add(item_id)
        committed |= interrupted  # it is committed now, as far as the next runs are concerned
        deleted |= in_flight_delete - set(present)  # a killed delete either happened or did not
        stats["interrupted delete done"] += len(in_flight_delete - set(present))
        after.lock()

    final = Vault(vault.path)
    final.unlock(PASSPHRASE)
    path, _, _ = make_nifti("after.nii")
    final.import_nifti(path)  # the next change clears every temporary file; payloads are never deleted
    assert not any(n.startswith(".tmp-") for d in (final.path, final.path / "blobs") for n in os.listdir(d))
    report = final.verify()
    assert report.ok and final.audit_trail().ok
    unreferenced = (
        {n for n in os.listdir(final.path / "blobs")}
        - {f"{p}.vsb" for i in final.items() for p in _blobs(final, i.id)}
        - {f"{i.id}.vsr" for i in final.items()}
        - {f"{i.id}.vsm" for i in final.items()}
    )
    assert set(report.unreferenced) == unreferenced  # listed, kept
    final.repair(remove_leftovers=True)  # explicit: interrupted imports come back whole or go
    assert not final.verify().unreferenced and final.verify().ok
    final.lock()
    record_property("sigkill_runs", RUNS)
    print(f"\n{RUNS} SIGKILL runs: " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.items())))
