"""Peak memory of the gzip bombs (issue 18: a 2 MB bomb made the reader and the app use 4-4.5 GB).

Each bomb (a ~4 MiB .nii.gz that inflates to 4 GiB) is opened with ``load_nifti`` and imported into a
vault in a fresh interpreter, which reports its peak resident set (``VmHWM``; ``getrusage`` where there is
no /proc) next to the same interpreter's peak after importing the same modules and reading a small good
file: the difference is what the bomb cost. The bound is generous (64 MiB), and far below the 4 GiB it would take
to hold the inflated data.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.engine.hostile.corpus import build_nifti_corpus

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("case", ["gzip-bomb-claims-4gib", "gzip-bomb-trailing-4gib"])
def test_gzip_bomb_peak_memory_is_bounded(case, tmp_path):
    corpus = build_nifti_corpus(tmp_path / "corpus")
    bomb = corpus[case]
    assert bomb.stat().st_size < 5 * 2**20  # a few MiB on disk ...
    good = tmp_path / "good.nii.gz"
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.zeros((32, 32, 32), np.float32), np.eye(4)), good)
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("child_import_bombs.py")),
            str(bomb),
            str(good),
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["items"] == 1  # the good item is still there, the bomb was not stored
    assert all(e and "\n" not in e and bomb.name in e for e in report["errors"]), report["errors"]
    growth = report["peak"] - report["baseline"]
    print(f"\n{case}: peak RSS {report['peak'] / 2**20:.0f} MiB, +{growth / 2**20:.1f} MiB over the baseline")
    assert growth < 64 * 2**20, f"the bomb raised peak memory by {growth / 2**20:.0f} MiB"
