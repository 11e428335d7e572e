"""Anatomy checks (engine.anatomy.checks) on the small three-tissue phantom: a brain passes, enlarged ventricles and
a lopsided brain are flagged outside their ranges, noise is not brain-like, and the verdict says which and why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.anatomy.checks import (
    BRAIN_LIKE,
    NOT_BRAIN_LIKE,
    OUTSIDE,
    WITHIN,
    check_from_record,
    check_maps,
)
from engine.anatomy.norms import NATIVE_RANGES, SOURCES, ranges_for, space_scale, template_brain_ml
from tests.engine.anatomy.phantoms import SCALE, SHAPE, SHIFT_MM, phantom_affine, phantom_labels


def _maps(labels: np.ndarray) -> dict[str, np.ndarray]:
    return {name: (labels == code).astype(np.float32) for code, name in ((1, "CSF"), (2, "GM"), (3, "WM"))}


def _template_ventricles_on_phantom() -> np.ndarray:
    """The template's ventricle label drawn on the phantom's grid, where the phantom's own anatomy puts it."""
    from scipy import ndimage

    from engine.anatomy.template import crop_affine, template_maps

    to_template = np.diag([1 / SCALE, 1 / SCALE, 1 / SCALE, 1.0])
    to_template[:3, 3] = -np.array(SHIFT_MM) / SCALE
    vox = np.linalg.inv(crop_affine()) @ to_template @ phantom_affine()
    vent = template_maps()["ventricles"]
    return ndimage.affine_transform(vent, vox, output_shape=SHAPE, order=1) >= 0.5


@pytest.fixture(scope="module")
def phantom_check():
    return check_maps(_maps(phantom_labels()), phantom_affine(), maps_from="phantom")


@pytest.mark.slow
def test_a_brain_phantom_is_within_every_range(phantom_check):
    check = phantom_check
    assert check.status == "within" and check.verdict == WITHIN and check.passed and not check.flags
    values = {m.name: m.value for m in check.measures}
    assert set(values) == {m.name for m in NATIVE_RANGES}
    # the phantom is the template shrunk by 8 % per axis: its brain is 0.92^3 of the template's GM + WM
    assert values["brain_volume_ml"] == pytest.approx(template_brain_ml() * SCALE**3, rel=0.08)
    assert values["asymmetry_pct"] < 2.0
    assert 3.0 < values["ventricle_volume_ml"] < 60.0
    for key, least in BRAIN_LIKE.items():
        assert check.evidence[key] > least, key
    assert check.summary().startswith("anatomy check: within normative ranges (brain ")


@pytest.mark.slow
def test_enlarged_ventricles_are_flagged_with_value_and_range(phantom_check):
    from engine.anatomy.segment import _dilate

    labels = phantom_labels().copy()
    grown = _dilate(_template_ventricles_on_phantom(), np.full(3, 3.0), 9.0) & (labels > 0)
    labels[grown] = 1  # CSF where tissue was: ventricles enlarged by hand
    check = check_maps(_maps(labels), phantom_affine())
    assert check.status == "outside" and "ventricle_volume_ml_high" in check.flags
    measure = next(m for m in check.measures if m.name == "ventricle_volume_ml")
    assert measure.within is False and measure.value > 60.0
    before = next(m for m in phantom_check.measures if m.name == "ventricle_volume_ml").value
    assert measure.value > 2 * before
    assert check.verdict.startswith(f"{OUTSIDE}: ")
    assert f"ventricle volume {measure.value:.0f} mL (range 3-60 mL)" in check.verdict


@pytest.mark.slow
def test_the_maps_own_ventricle_map_is_used_when_there_is_one(phantom_check):
    maps = _maps(phantom_labels())
    maps["ventricles"] = np.zeros(SHAPE, np.float32)
    maps["ventricles"][20:30, 20:30, 20:30] = 1.0  # 1000 voxels of 27 uL: 27 mL
    check = check_maps(maps, phantom_affine())
    assert check.extra["ventricles_ml"] == pytest.approx(27.0)
    assert "own ventricle map" in check.ventricles_from
    assert "csf_in_template_ventricles_ml" in check.extra


@pytest.mark.slow
def test_a_lopsided_brain_is_flagged_for_asymmetry():
    labels = phantom_labels().copy()
    ijk = np.indices(SHAPE).reshape(3, -1)
    x = (phantom_affine()[:3, :3] @ ijk + phantom_affine()[:3, 3:4])[0].reshape(SHAPE)
    left_tissue = (x < SHIFT_MM[0] - 12.0) & (labels >= 2)
    labels[left_tissue & (np.indices(SHAPE)[1] % 3 == 0)] = 1  # a third of the far-left tissue becomes CSF
    check = check_maps(_maps(labels), phantom_affine())
    assert "asymmetry_pct_high" in check.flags
    assert "hemispheric asymmetry" in check.verdict


@pytest.mark.slow
def test_noise_maps_are_not_brain_like_by_evidence_not_by_range():
    rng = np.random.default_rng(0)
    noise = rng.random((3, *SHAPE)).astype(np.float32)
    inside = (phantom_labels() > 0).astype(np.float32)
    noise = noise / noise.sum(0) * inside
    check = check_maps(dict(zip(("CSF", "GM", "WM"), noise, strict=True)), phantom_affine())
    assert check.status == "not_brain_like" and check.verdict.startswith(f"{NOT_BRAIN_LIKE}: ")
    assert not check.measures  # no range is compared for something that is not a brain
    assert "not_brain_like" in check.flags and "weak_neighbour_correlation" in check.flags
    assert check.evidence["neighbour_correlation"] < BRAIN_LIKE["neighbour_correlation"]
    assert check.summary() == f"anatomy check: {check.verdict}"


def test_empty_maps_are_not_brain_like_and_missing_maps_are_an_error():
    empty = {name: np.zeros(SHAPE, np.float32) for name in ("GM", "WM", "CSF")}
    check = check_maps(empty, phantom_affine())
    assert check.status == "not_brain_like" and "0 mL" in check.verdict
    with pytest.raises(ValueError, match="missing CSF"):
        check_maps({"GM": empty["GM"], "WM": empty["WM"]}, phantom_affine())


def test_mni_space_scales_the_volume_ranges_not_the_fractions():
    native, mni = ranges_for(None), ranges_for("MNI152NLin2009aSym")
    scale = space_scale("MNI152NLin2009aSym")
    assert scale == pytest.approx(template_brain_ml() / ((1302.0 + 1143.0) / 2))
    assert 1.2 < scale < 1.5  # the template's brain is larger than the native mean
    for name, norm in native.items():
        factor = scale if norm.unit == "mL" else 1.0
        assert mni[name].low == pytest.approx(norm.low * factor)
        assert mni[name].high == pytest.approx(norm.high * factor)
    assert "MNI152NLin2009aSym" in mni["brain_volume_ml"].derivation
    # every range names a source that exists, with a citation
    for norm in native.values():
        for key in norm.source.split("+"):
            assert SOURCES[key].citation


def test_the_record_is_json_with_verdict_measures_ranges_and_sources(phantom_check):
    record = json.loads(json.dumps(phantom_check.to_dict()))
    assert record["verdict"] == WITHIN and record["status"] == "within" and record["flags"] == []
    brain = record["measures"]["brain_volume_ml"]
    assert brain["unit"] == "mL" and brain["within"] is True and len(brain["range"]) == 2
    assert "Matsumae" in record["sources"]["matsumae1996"]
    assert record["space"] == "native" and record["space_scale"] == 1.0
    assert set(record["brain_like_evidence"]) == set(BRAIN_LIKE)


@pytest.mark.slow
def test_a_record_decides_what_is_checked():
    maps = _maps(phantom_labels())
    made = check_from_record(maps, phantom_affine(), {"tissue_maps_source": "model channels"}, space=None)
    assert made is not None and made.maps_from == "model channels"
    refused = check_from_record(
        {},
        phantom_affine(),
        {"tissue_maps_not_made": "it does not look like a brain MRI", "not_brain_like": True},
        space=None,
    )
    assert refused.status == "not_brain_like" and "does not look like a brain MRI" in refused.verdict
    # no maps for another reason (SWI, memory): nothing to judge, so no verdict
    assert (
        check_from_record({}, phantom_affine(), {"tissue_maps_not_made": "SWI shows veins"}, space=None)
        is None
    )
    assert check_from_record({"GM": maps["GM"]}, phantom_affine(), None, space=None) is None


def test_a_volume_in_a_template_space_names_the_space_and_says_it_natively():
    """The check said "brain volume (GM+WM) 1042 mL (range 1200-2157 mL)" for a volume on the MNI152 grid: mL
    of which space, and what natively? (The shipped model's Brain volume is in the same MNI152 mL.)"""
    from engine.anatomy.checks import Measure

    space = "MNI152NLin2009aSym"
    norm = ranges_for(space)["brain_volume_ml"]
    measure = Measure(norm.name, norm.label, 1042.0, norm.unit, norm.low, norm.high, norm.source, space)
    scale = space_scale(space)
    assert measure.text() == (
        f"brain volume (GM+WM) 1042 MNI152 mL (range {np.ceil(norm.low):.0f}-{np.floor(norm.high):.0f} MNI152 "
        f"mL; native {1042 / scale:.0f} mL, range 881-1582 mL)"
    )
    record = measure.to_dict()
    assert record["space"] == "MNI152" and record["native_range"] == [880.5, 1582.0]
    # A native volume is said as before, without a space.
    native = ranges_for(None)["ventricle_volume_ml"]
    plain = Measure(native.name, native.label, 70.0, native.unit, native.low, native.high, native.source)
    assert plain.text() == "ventricle volume 70 mL (range 3-60 mL)" and "space" not in plain.to_dict()


def test_every_value_the_shipped_sliders_offer_that_the_check_would_flag_is_said_beforehand():
    """The shipped model's Brain volume (850-1700 MNI152 mL) reaches below the adult range: a value the check
    flags is never offered without its reason, and a value it accepts gets none."""
    from engine.anatomy.norms import CONDITION_MEASURES, condition_against_norm
    from engine.files.shipped import resource_path
    from engine.models.spec import ModelSpec

    spec_file = resource_path("models", "brain-t1-demo", "spec.json")
    spec = ModelSpec.from_dict(json.loads(spec_file.read_text()))
    assert spec.space == "MNI152NLin2009aSym"
    ranges = ranges_for(spec.space)
    flagged = 0
    for condition in spec.conditioning:
        norm = ranges[CONDITION_MEASURES[condition.name]]
        for value in np.linspace(condition.min, condition.max, 41):
            note = condition_against_norm(condition.name, float(value), condition.unit, spec.space)
            if norm.low <= value <= norm.high:
                assert note == "", (condition.name, value, note)
            else:
                flagged += 1
                side = "below" if value < norm.low else "above"
                assert note.startswith(f"{side} the adult range (") and "MNI152 mL" in note
                assert "mL native" in note and note.endswith("the anatomy check flags such a brain")
    assert flagged  # the sliders do offer such values (850 MNI152 mL is about 623 mL natively)
    assert "Matsumae 1996" in condition_against_norm("brain_volume", 1000.0, "mL", spec.space)
    # An input the check does not measure, or not in mL (MONAI's normalised volumes), gets no note.
    assert condition_against_norm("brain_volume", 0.1, "", spec.space) == ""
    assert condition_against_norm("age", 200.0, "years", spec.space) == ""
