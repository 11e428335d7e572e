"""Tissue maps of any brain volume (engine.anatomy.segment): contrast order, refusals, the maps' invariants."""

from __future__ import annotations

import numpy as np
import pytest

from engine.anatomy.segment import TISSUES, check_contrast, dice, segment
from engine.errors import InvalidRequest
from tests.engine.anatomy.phantoms import phantom, phantom_affine, phantom_labels


def _labels(result) -> np.ndarray:
    """0 outside the brain, else 1 + argmax over CSF, GM, WM (the phantom's label codes)."""
    stack = np.stack([result.maps[name] for name in TISSUES])
    return np.where(result.maps["brain"] > 0.5, stack.argmax(0) + 1, 0)


@pytest.fixture(scope="module")
def t1_result():
    return segment(phantom("t1w"), phantom_affine(), "t1w")


@pytest.mark.slow
def test_t1_phantom_tissues_found(t1_result):
    truth = phantom_labels()
    got = _labels(t1_result)
    inner = truth >= 2  # the CSF rind touches the mask edge, where the mask may trim it
    for code, name in ((2, "GM"), (3, "WM")):
        assert dice(got == code, truth == code) > 0.9, name
    assert dice(got[inner] == 2, truth[inner] == 2) > 0.9
    assert dice(t1_result.maps["brain"] > 0.5, truth > 0) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("contrast", ["t2w", "flair"])
def test_other_contrasts_give_the_t1_labels(t1_result, contrast):
    # The same anatomy drawn in another intensity order must get the same labels once the contrast is named.
    result = segment(phantom(contrast, seed=1), phantom_affine(), contrast)
    t1, other = _labels(t1_result), _labels(result)
    inside = (t1 > 0) & (other > 0)
    assert np.mean(t1[inside] == other[inside]) > 0.95
    means = result.means
    order = sorted(TISSUES, key=means.get)
    assert order == {"t2w": ["WM", "GM", "CSF"], "flair": ["CSF", "WM", "GM"]}[contrast]


def test_maps_are_probabilities_inside_the_mask(t1_result):
    maps = t1_result.maps
    total = maps["CSF"] + maps["GM"] + maps["WM"]
    assert all(m.shape == phantom_labels().shape and m.dtype == np.float32 for m in maps.values())
    assert np.all(total >= -1e-5) and np.all(total <= 1 + 1e-4)
    assert np.allclose(total[maps["brain"] == 0], 0, atol=0.5)  # outside the mask only interpolation spill
    assert set(np.unique(maps["brain"])) <= {0.0, 1.0}
    assert t1_result.sidecar()["contrast"] == "t1w" and t1_result.sidecar()["method"]


@pytest.mark.slow
def test_wrong_contrast_is_refused():
    # A T1w volume called T2w would otherwise come out with CSF and WM swapped and no sign of it.
    with pytest.raises(InvalidRequest, match="check --contrast") as info:
        segment(phantom("t1w"), phantom_affine(), "t2w")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name, reason", [("swi", "susceptibility"), ("MRA", "flowing blood"), ("tof", "flowing")]
)
def test_unsupported_contrasts_refused_with_reason(name, reason):
    with pytest.raises(InvalidRequest, match=reason):
        check_contrast(name)
    with pytest.raises(InvalidRequest, match="choose t1w, t2w or flair"):
        check_contrast("pd")
    assert check_contrast("T1") == "t1w" and check_contrast("FLAIR") == "flair"


def test_bad_arrays_refused():
    vol = phantom("t1w")
    with pytest.raises(InvalidRequest, match="2D"):
        segment(vol[:, :, 20], phantom_affine(), "t1w")
    nan = vol.copy()
    nan[3, 4, 5] = np.nan
    with pytest.raises(InvalidRequest, match="1 NaN or infinite"):
        segment(nan, phantom_affine(), "t1w")
    with pytest.raises(InvalidRequest, match="constant"):
        segment(np.ones_like(vol), phantom_affine(), "t1w")
    with pytest.raises(InvalidRequest, match="brain-sized"):
        small = np.zeros_like(vol)
        small[20:26, 20:26, 20:26] = 1.0
        segment(small, phantom_affine(), "t1w")
    with pytest.raises(InvalidRequest, match="nothing stands out from its background"):
        filled = np.ones_like(vol)  # under 1 % of the voxels darker: no background to find a head on
        filled[0, 0, :5] = 0.0
        segment(filled, phantom_affine(), "t1w")


@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_noise_is_not_a_brain(kind):
    # Random-weights models make noise; it must be refused as not brain-like, not blamed on the contrast.
    rng = np.random.default_rng(3)
    shape = phantom_labels().shape
    noise = rng.normal(0, 1, shape) if kind == "gaussian" else rng.random(shape)
    with pytest.raises(InvalidRequest, match="does not look like a brain MRI"):
        segment(noise.astype(np.float32), phantom_affine(), "t1w")


def test_maps_or_reason_gives_a_reason_not_an_error(monkeypatch):
    import engine.anatomy.segment as seg

    made, record = seg.maps_or_reason(np.ones((8, 9, 10), np.float32), phantom_affine(), "t1w")
    assert made == {} and "constant" in record["tissue_maps_not_made"]

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(seg, "segment", no_memory)
    volume = phantom("t1w")
    made, record = seg.maps_or_reason(volume, phantom_affine(), "t1w")
    shape = "x".join(map(str, volume.shape))
    assert made == {} and record == {
        "tissue_maps_not_made": f"not enough memory to make tissue maps of a {shape} volume"
    }


def test_contrast_from_a_generation_modality():
    from engine.anatomy.segment import contrast_from_modality

    assert contrast_from_modality("t1w-skullstripped") == "t1w" and contrast_from_modality("FLAIR") == "flair"
    assert contrast_from_modality("") == "t1w"  # a model that takes no modality (MONAI's brain bundles: T1)
    assert contrast_from_modality("", default="t2w") == "t2w"
    with pytest.raises(InvalidRequest, match="SWI shows susceptibility"):
        contrast_from_modality("swi-skullstripped")
