"""``volsynth segment``: the files it writes, their sidecars, and its one-line errors."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from engine.cli import main
from tests.engine.anatomy.phantoms import phantom, phantom_affine


def _write(path, data, affine=None):
    nib.Nifti1Image(np.asarray(data, np.float32), phantom_affine() if affine is None else affine).to_filename(
        str(path)
    )
    return path


@pytest.mark.slow
def test_segment_writes_probseg_maps_and_sidecars(tmp_path, capsys):
    source = _write(tmp_path / "sub-01_T2w.nii.gz", phantom("t2w"))
    out = tmp_path / "maps"
    assert main(["segment", str(source), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    names = sorted(p.name for p in out.iterdir())
    expected = [
        f"sub-01_label-{n}_probseg.{ext}" for n in ("CSF", "GM", "WM", "brain") for ext in ("json", "nii.gz")
    ]
    assert names == sorted(expected)
    assert captured.out.split() == [
        str(out / f"sub-01_label-{n}_probseg.nii.gz") for n in ("CSF", "GM", "WM", "brain")
    ]
    # The contrast came from the BIDS suffix, and the progress line says so.
    assert "T2w (from the file name)" in captured.err and "fit (55%)" in captured.err
    sidecar = json.loads((out / "sub-01_label-GM_probseg.json").read_text())
    assert sidecar["contrast"] == "t2w" and sidecar["tissue_map"] == "GM" and sidecar["image"] == source.name
    assert sidecar["method"] == "em-gmm-mni152-priors" and set(sidecar["library_versions"]) >= {
        "numpy",
        "scipy",
    }
    gm = nib.load(str(out / "sub-01_label-GM_probseg.nii.gz"))
    assert gm.shape == phantom("t2w").shape and np.allclose(gm.affine, phantom_affine())
    assert float(gm.get_fdata().min()) >= 0.0 and float(gm.get_fdata().max()) <= 1.0 + 1e-5


def _nan_volume():
    data = phantom("t1w")
    data[10, 10, 10] = np.nan
    return data


@pytest.mark.parametrize(
    "make, args, message",
    [
        (lambda p: p.write_text("not an image") and p, [], "is not a NIfTI file"),
        (lambda p: _write(p, np.ones((32, 32))), [], "is a 2D image"),
        (lambda p: _write(p, _nan_volume()), [], "1 NaN or infinite voxels"),
        (lambda p: _write(p, phantom("t1w")), ["--contrast", "swi"], "SWI shows susceptibility"),
        (lambda p: _write(p, phantom("t1w")), ["--contrast", "mra"], "flowing blood"),
        (lambda p: _write(p, phantom("t1w")), ["--contrast", "t2w"], "check --contrast"),
    ],
    ids=["text-file", "2d", "nan", "swi", "mra", "wrong-contrast"],
)
@pytest.mark.slow
def test_bad_input_is_one_line(tmp_path, capsys, make, args, message):
    name = "scan.txt" if message == "is not a NIfTI file" else "scan.nii.gz"
    source = make(tmp_path / name)
    out = tmp_path / "maps"
    assert main(["segment", str(source), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("volsynth: error: ") and message in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert not out.exists() or not any(out.iterdir())  # nothing written
