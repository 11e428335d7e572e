"""The cohort report shows each volume's anatomy check and counts them: a brain within the ranges, one with
enlarged ventricles, and the noise of random weights, written as generated volumes with their tissue maps."""

from __future__ import annotations

import numpy as np
import pytest

from engine.api import SamplingRequest, SamplingResult
from engine.cohort.manifest import FORMAT, Manifest
from engine.cohort.report import collect, write_report
from engine.metrics.colours import FAIL_COLOUR
from engine.nifti.io import generated_volumes, save_volume
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels
from tests.engine.anatomy.test_checks import _template_ventricles_on_phantom


def _write(root, participant: str, labels: np.ndarray, noise: bool = False) -> str:
    maps = [(labels == code).astype(np.float32) for code in (2, 3, 1)]
    if noise:
        rng = np.random.default_rng(3)
        maps = [rng.random(labels.shape).astype(np.float32) * (labels > 0) for _ in maps]
    result = SamplingResult(
        volumes=np.stack([phantom("t1w"), *maps])[None],
        affine=phantom_affine(),
        request=SamplingRequest(model="tiny-pixel"),
        provenance={"label_channels": ["GM", "WM", "CSF"], "seed": 0},
    )
    file = f"{participant}/anat/{participant}_T1w.nii.gz"
    (root / participant / "anat").mkdir(parents=True)
    save_volume(generated_volumes(result)[0], root / file)
    return file


@pytest.mark.slow
def test_the_report_counts_and_lists_the_anatomy_verdicts(tmp_path):
    from engine.anatomy.segment import _dilate

    root = tmp_path / "cohort"
    labels = phantom_labels()
    enlarged = labels.copy()
    enlarged[_dilate(_template_ventricles_on_phantom(), np.full(3, 3.0), 9.0) & (labels > 0)] = 1
    files = {
        "sub-synth0001": _write(root, "sub-synth0001", labels),
        "sub-synth0002": _write(root, "sub-synth0002", enlarged),
        "sub-synth0003": _write(root, "sub-synth0003", labels, noise=True),
    }
    items = {
        p: {"state": "done", "file": f, "conditioning": {}, "errors": [], "seed": 0, "attempts": 1}
        for p, f in files.items()
    }
    data = {"format": FORMAT, "cohort_id": "c1", "target": "folder", "model": {"id": "tiny"}, "items": items}
    Manifest(root, {**data, "runs": []}).save()

    report = collect(root, montage=0)
    assert report["anatomy_counts"] == {"within": 1, "outside": 1, "not_brain_like": 1, "not_checked": 0}
    assert report["anatomy"]["sub-synth0001"]["status"] == "within"
    assert "ventricle_volume_ml_high" in report["anatomy"]["sub-synth0002"]["flags"]
    assert report["anatomy"]["sub-synth0003"]["verdict"].startswith("not brain-like: ")
    page = write_report(root, tmp_path / "report.html").read_text()
    assert "1 within normative ranges, 1 outside a range, 1 not brain-like, 0 not checked" in page
    assert "<td>sub-synth0002</td><td>outside</td><td>outside range: " in page
    # the reliability share: 1 of the 3 checked volumes passed, with its interval, below 95 % (the fail colour)
    reliability = report["reliability"]
    assert (reliability["passed"], reliability["count"]) == (1, 3) and not reliability["reaches_95"]
    assert reliability["interval"][0] < 1 / 3 < reliability["interval"][1]
    assert f"color:{FAIL_COLOUR}'>reliability: 1/3 checked volumes pass the anatomy check (33 %" in page
