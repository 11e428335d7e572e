"""Streaming: a 1 GB volume goes in and out of the vault without ever being held in memory."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from vault_testutil import FAST_KDF, PASSPHRASE

from engine.vault import Vault
from engine.vault.nifti import stream_header

SHAPE = (512, 512, 1024)  # float32: 1 GiB of voxels
MAX_RSS_DELTA = 150 * 1024 * 1024

# Runs in a fresh interpreter so that nothing of the test process is counted. Peak RSS is read from
# /proc/self/status (VmHWM) after resetting it with /proc/self/clear_refs just before the operation:
# getrusage's ru_maxrss would not do, because Linux carries it across execve, so a child started from a
# large pytest process starts with the parent's peak.


def _run(mode: str, vault_path: Path, arg: str, dest: Path | str = "-") -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_stream_volume.py")),
            mode,
            str(vault_path),
            PASSPHRASE,
            arg,
            str(dest),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.slow
def test_1gb_import_and_export_stream_with_bounded_memory(tmp_path, record_property):
    # Write a 1 GiB NIfTI slab by slab (the test never holds it either).
    source = tmp_path / "big.nii"
    digest = hashlib.sha256()
    with open(source, "wb") as fh:
        header = stream_header(SHAPE, np.eye(4), "streaming test")
        fh.write(header)
        digest.update(header)
        plane = np.arange(SHAPE[0] * SHAPE[1], dtype=np.float32).reshape(SHAPE[:2], order="F")
        for k in range(0, SHAPE[2], 4):
            slab = np.stack([plane + (k + j) for j in range(4)], axis=-1).tobytes(order="F")
            fh.write(slab)
            digest.update(slab)
    size = source.stat().st_size
    assert size == 352 + 4 * int(np.prod(SHAPE))
    vault = Vault.create(tmp_path / "vault", PASSPHRASE, kdf=FAST_KDF)
    vault.lock()
    try:
        imported = _run("import", vault.path, str(source))
        exported = _run("export", vault.path, imported["item"], tmp_path / "out")
        deid = _run("export-deid", vault.path, imported["item"], tmp_path / "out-deid")
        figures = {}
        for name, r in (("import", imported), ("export", exported), ("export de-identified", deid)):
            delta = r["peak"] - r["rss_before"]
            figures[name] = (delta / 2**20, size / 1e6 / r["seconds"])
            assert delta <= MAX_RSS_DELTA, f"{name} raised peak RSS by {delta / 2**20:.0f} MiB"
        (out,) = (tmp_path / "out").iterdir()
        assert _sha256(out) == digest.hexdigest()  # byte-identical
        out.unlink()
        (deid_out,) = (tmp_path / "out-deid").iterdir()
        assert deid_out.name.endswith(".nii.gz")  # a de-identified copy leaves compressed
        with gzip.open(deid_out, "rb") as fh:
            assert fh.read(352)[148 : 148 + 14] == b"\x00" * 14  # descrip cleared
            body = 352
            while chunk := fh.read(8 << 20):
                body += len(chunk)
        assert body == size
        deid_out.unlink()
        for name, (mib, mbps) in figures.items():
            record_property(f"{name} peak RSS delta MiB", round(mib, 1))
            record_property(f"{name} MB/s", round(mbps))
        print(
            "\n1 GiB volume: "
            + "; ".join(
                f"{n}: +{mib:.0f} MiB peak RSS, {mbps:.0f} MB/s" for n, (mib, mbps) in figures.items()
            )
        )
    finally:
        # 3 GiB of files: do not leave them for pytest's tmp_path retention
        for path in [source, *(tmp_path / "vault" / "blobs").glob("*")]:
            path.unlink(missing_ok=True)
