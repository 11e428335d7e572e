"""A FIFO (or other non-regular file) named like a scan is refused at once, never opened for a blocking
read (issue 24, point 6). Before: ``vault import fifo.nii`` waited forever for a writer.

Each case runs the real CLI in a child process with a time limit, so a hang fails the test instead of
hanging it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from vault_testutil import PASSPHRASE

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")


def _cli(vault, *args):
    pw = vault.path.parent / "pw.txt"
    pw.write_text(PASSPHRASE + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "vault",
            *args,
            "--vault",
            str(vault.path),
            "--passphrase-file",
            str(pw),
        ],
        capture_output=True,
        text=True,
        timeout=90,  # a blocking open of the FIFO would run into this
        env=env,
    )


@pytest.mark.parametrize("name", ["scan.nii", "scan.nii.gz"])
def test_vault_import_of_a_fifo_named_like_nifti_is_refused_at_once(vault, tmp_path, name):
    vault.lock()
    fifo = tmp_path / name
    os.mkfifo(fifo)
    result = _cli(vault, "import", str(fifo))
    assert result.returncode != 0
    assert "is a FIFO (named pipe), not a regular file" in result.stderr and "Traceback" not in result.stderr


def test_vault_import_of_a_fifo_named_like_dicom_is_refused_at_once(vault, tmp_path):
    vault.lock()
    fifo = tmp_path / "slice.dcm"
    os.mkfifo(fifo)
    result = _cli(vault, "import", str(fifo))
    assert result.returncode != 0
    assert "FIFO" in result.stderr and "Traceback" not in result.stderr


def test_a_fifo_in_a_dicom_folder_is_skipped_and_the_series_imports(vault, tmp_path, make_series):
    folder, _files = make_series()
    os.mkfifo(folder / "zz-fifo.dcm")
    vault.lock()
    result = _cli(vault, "import", str(folder))
    assert result.returncode == 0, result.stderr


def test_the_apps_open_refuses_a_fifo(tmp_path):
    from engine.errors import InvalidRequest
    from engine.nifti.io import load_nifti

    fifo = tmp_path / "scan.nii"
    os.mkfifo(fifo)
    with pytest.raises(InvalidRequest, match="FIFO"):
        load_nifti(fifo)
