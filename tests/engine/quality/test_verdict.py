"""The quality report's verdict rule on synthetic phantoms: a shifted distribution is flagged, the same one is not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.quality import SHIFTS, WITHIN, measures, noise_floor, quality_report
from tests.engine.quality.phantoms import SHAPE, VOXEL_ML
from tests.engine.quality.phantoms import phantom_set as _set


@pytest.fixture(scope="module")
def floor():
    a, ta = _set(range(8))
    b, tb = _set(range(100, 108))
    return (
        noise_floor(a, b, tissue_a=ta, tissue_b=tb, voxel_ml=VOXEL_ML, tissue_source="model"),
        (a, ta),
        (b, tb),
    )


def _judge(floor, **kw):
    fl, (a, ta), _ = floor
    c, tc = _set(range(8), **kw)
    return quality_report(a, c, fl, reference_tissue=ta, candidate_tissue=tc, voxel_ml=VOXEL_ML, label="B")


def test_same_distribution_on_other_seeds_is_within_the_noise(floor):
    fl, (a, ta), (b, tb) = floor
    report = quality_report(a, b, fl, reference_tissue=ta, candidate_tissue=tb, voxel_ml=VOXEL_ML)
    assert report.within_noise and report.verdict == WITHIN
    assert set(report.statistics) == {"tissue", "features", "diversity"}
    assert all(not s["beyond_noise"] for s in report.statistics.values())
    assert set(report.measures) == {"frd", "volume_distance", "diversity"} and report.decided_by == []
    for measure in report.measures.values():  # each with its interval, the floor's, and how many volumes
        assert measure["interval"][0] <= measure["interval"][1] and not measure["flagged"]
        assert measure["floor_interval"][0] <= measure["floor_interval"][1]
        assert measure["n"] == 8 and measure["floor_n"] == [8, 8]


def test_a_tiny_perturbation_on_the_same_seeds_is_within_the_noise(floor):
    report = _judge(floor, noise=0.002)
    assert report.within_noise, report.verdict
    assert 30 < report.psnr_median_db < 60


def test_shifted_tissue_volumes_are_flagged_and_named(floor):
    report = _judge(floor, gm_ml=-20.0)  # 20 mL less GM in every seed, images unchanged
    assert not report.within_noise
    assert report.verdict.startswith(
        f"{SHIFTS}: tissue-volume distance "
    )  # the field's measure decides first
    assert "tissue volumes (GM " in report.verdict and report.decided_by[:2] == [
        "volume_distance",
        "permutation:tissue",
    ]
    assert report.statistics["tissue"]["beyond_noise"] and report.statistics["tissue"]["p_value"] < 0.01
    distance = report.measures["volume_distance"]
    assert distance["flagged"] and distance["interval"][0] > distance["floor"] and distance["n"] == 8
    assert report.psnr_median_db == float(
        "inf"
    )  # the images are identical: only the distribution measures see it


def test_brighter_or_noisier_images_are_flagged(floor):
    for kw in ({"brighter": 0.15}, {"noise": 0.15}):
        report = _judge(floor, **kw)
        assert not report.within_noise and report.verdict.startswith(SHIFTS), kw
        assert report.statistics["features"]["beyond_noise"] and "image features (" in report.verdict, kw
        assert report.measures["frd"]["flagged"] and "frd" in report.decided_by, kw  # FRD sees it too
        assert set(report.statistics["features"]["by_group"]) == {
            "tissue_ml",
            "intensity_quantiles",
            "texture",
            "downsampled",
        }
    assert "diversity" in _judge(floor, noise=0.3).verdict  # noise makes the seeds look less alike


def test_without_tissue_the_verdict_says_what_it_did_not_compare(floor):
    fl, (a, _), _ = floor
    a2, _ = _set(range(100, 108))
    bare = noise_floor(a, a2)
    report = quality_report(a, a2, bare)
    assert (
        report.within_noise
        and report.verdict.startswith(WITHIN)
        and "tissue volumes not compared" in report.verdict
    )
    assert "tissue" not in report.statistics and report.tissue_source is None


def test_too_few_seeds_is_never_within_the_noise():
    a, ta = _set(range(3))
    b, tb = _set(range(10, 13))
    report = quality_report(a, a, (a, b), reference_tissue=ta, candidate_tissue=ta, noise_tissue=(ta, tb))
    assert not report.within_noise and report.verdict.startswith("too few seeds")


def test_report_is_json_and_records_the_rule(floor):
    report = _judge(floor, noise=0.002)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["verdict"] == report.verdict and data["within_noise"] is True
    assert len(data["per_seed"]) == 8 and {"psnr_db", "ssim", "seed"} <= set(data["per_seed"][0])
    assert data["noise_floor"]["statistics"]["features"]["beyond_noise"] is False
    assert "quantile" in data["rule"] and data["ms_ssim"]["kernel_size"] == 3


def test_bad_input_is_one_clear_error(floor):
    fl, (a, ta), _ = floor
    with pytest.raises(ValueError, match="one per seed"):
        quality_report(a, a[:-1], fl)
    with pytest.raises(ValueError, match="NaN"):
        quality_report(a, [np.full(SHAPE, np.nan, np.float32)] * len(a), fl)
    with pytest.raises(ValueError, match="3D"):
        quality_report([np.zeros((4, 4))] * 8, a, fl)
    with pytest.raises(ValueError, match="CSF is missing"):
        quality_report(a, a, fl, reference_tissue=[{"GM": 1, "WM": 1}] * 8, candidate_tissue=ta)


def test_mmd_is_monais_and_the_permutation_form_agrees():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 5)), rng.standard_normal((6, 5)) + 0.5
    pool = np.concatenate([x, y])
    assert measures.mmd(x, y) == pytest.approx(
        measures.mmd_from_gram(pool @ pool.T, np.arange(6), np.arange(6, 12)), rel=1e-9
    )


@pytest.mark.parametrize(
    ("shape", "kernel", "scales"), [((80, 96, 80), 5, 5), ((16, 24, 16), 3, 3), ((160, 224, 160), 9, 5)]
)
def test_ms_ssim_config_fits_monais_size_check(shape, kernel, scales):
    got_kernel, weights = measures.ms_ssim_config(shape)
    assert (got_kernel, len(weights)) == (kernel, scales) and sum(weights) == pytest.approx(1.0)
    assert min(shape) // max(1, scales - 1) ** 2 > got_kernel - 1
