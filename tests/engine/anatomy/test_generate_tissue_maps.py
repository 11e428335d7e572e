"""``volsynth generate --tissue-maps``: maps segmented for models without tissue channels, the model's own kept,
and SWI refused before sampling (random weights: tests/engine/models/test_maisi.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.api import SamplingResult
from engine.cli import main
from tests.engine.anatomy.phantoms import phantom, phantom_affine

MAPS = ("CSF", "GM", "WM", "brain")


class _PhantomBackend:
    """Answers every request with fixed volumes (a brain phantom), as a model of that modality would."""

    def __init__(self, volumes: np.ndarray, provenance: dict) -> None:
        self.volumes, self.provenance = volumes, provenance

    def sample(self, request):
        yield from ()
        return SamplingResult(
            volumes=self.volumes,
            affine=phantom_affine(),
            request=request,
            provenance={
                **self.provenance,
                "timings": {"total_s": 0.1, "denoise_s": 0.05, "decode_s": 0.05},
                "device_name": "test",
            },
        )


def _use_backend(monkeypatch, backend) -> None:
    import engine.cli.generate as generate

    monkeypatch.setattr(generate, "backend_from_args", lambda args: backend)


@pytest.mark.slow
def test_a_model_without_channels_gets_segmented_maps_saying_how_made(
    model_path_env, tmp_path, capsys, monkeypatch
):
    volume = phantom("t2w")[None, None]
    _use_backend(monkeypatch, _PhantomBackend(volume, {"output": {"modality": "t2w-skullstripped"}}))
    out = tmp_path / "sub-01_T2w.nii.gz"
    argv = ["generate", "--model", "tiny-pixel", "--tissue-maps", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(out)]  # stdout stays the list of images
    assert "made by em-gmm-mni152-priors (t2w)" in captured.err
    image = json.loads((tmp_path / "sub-01_T2w.json").read_text())
    assert image["tissue_maps"] == {n: f"sub-01_label-{n}_probseg.nii.gz" for n in MAPS}
    made = image["tissue_maps_made"]
    assert made["tissue_maps_source"] == "method" and made["method"] == "em-gmm-mni152-priors"
    assert made["contrast"] == "t2w" and {"numpy", "scipy"} <= set(made["library_versions"])
    assert made["template"].startswith("MNI152 ICBM 2009a")  # the shipped template files, not a package
    from engine.nifti.io import load_nifti

    for name in MAPS:  # each map's own record (its header extension) says the same
        loaded = load_nifti(tmp_path / f"sub-01_label-{name}_probseg.nii.gz")
        record = loaded.provenance
        assert record["tissue_maps_source"] == "method" and record["method"] == "em-gmm-mni152-priors"
        assert record["tissue_map"] == name and record["image"] == out.name and loaded.synthetic
        assert loaded.data.shape == volume.shape[2:]
    gm = load_nifti(tmp_path / "sub-01_label-GM_probseg.nii.gz").data
    assert 0.5 < gm.max() <= 1.0 + 1e-5


def test_a_model_with_tissue_channels_keeps_its_own(model_path_env, tmp_path, capsys, monkeypatch):
    image = phantom("t1w")
    own = np.full_like(image, 0.25)  # no segmentation gives a constant map: these are the model's
    volumes = np.stack([image, own])[None]
    _use_backend(monkeypatch, _PhantomBackend(volumes, {"label_channels": ["GM"]}))
    out = tmp_path / "x.nii.gz"
    assert main(["generate", "--model", "tiny-pixel", "--tissue-maps", "--out", str(out)]) == 0
    assert "the model's own (decoded channels)" in capsys.readouterr().err
    import nibabel as nib

    assert sorted(p.name for p in tmp_path.glob("*probseg*")) == ["x_label-GM_probseg.nii.gz"]
    assert np.allclose(np.asarray(nib.load(str(tmp_path / "x_label-GM_probseg.nii.gz")).dataobj), 0.25)
    side = json.loads((tmp_path / "x.json").read_text())
    from engine.anatomy.partition import PARTITION_RECORD

    assert side["tissue_maps_made"] == {"tissue_maps_source": "model channels", "partition": PARTITION_RECORD}


@pytest.mark.parametrize("modality", ["swi", "swi-skullstripped"])
def test_swi_is_refused_before_sampling(model_path_env, tmp_path, capsys, monkeypatch, modality):
    def never(args):
        raise AssertionError("the backend must not be reached")

    import engine.cli.generate as generate

    monkeypatch.setattr(generate, "backend_from_args", never)
    out = tmp_path / "x.nii.gz"
    argv = ["generate", "--model", "tiny-pixel", "--modality", modality, "--tissue-maps", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("volsynth: error: ") and "SWI shows susceptibility" in err[-1]
    assert not any(tmp_path.iterdir())


def test_a_re_save_keeps_how_the_maps_were_made(tmp_path):
    """The app writes a shown volume again (Save As) through save_volume with the provenance it read."""
    from engine.nifti.io import load_nifti, save_volume
    from engine.nifti.volume import Volume

    made = {"tissue_maps_source": "method", "method": "em-gmm-mni152-priors", "contrast": "t1w"}
    image = phantom("t1w")
    maps = {"GM": np.full_like(image, 0.5)}
    path = tmp_path / "again.nii.gz"
    provenance = {"seed": 1, "tissue_maps_made": made, "tissue_maps": {"GM": "old.nii.gz"}}
    save_volume(Volume(image, phantom_affine(), tissue=maps, provenance=provenance, synthetic=True), path)
    side = json.loads((tmp_path / "again.json").read_text())
    assert side["tissue_maps_made"] == made and side["tissue_maps"] == {"GM": "again_label-GM_probseg.nii.gz"}
    assert load_nifti(tmp_path / "again_label-GM_probseg.nii.gz").provenance["method"] == made["method"]
